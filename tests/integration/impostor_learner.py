"""A peer that claims to be a run's learner, for tests: a real libp2p host (its own key) that
joins the swarm's DHT through the given members, provides the run's learner key there, answers
``run-info`` naming itself as the run's learner (with its own addresses) and accepts every
hello, like a learner would. Every learner request it gets (hello, model manifest, work,
adapter, dissemination join) is logged, so a test can tell whether any node took it for its
learner.

    python tests/integration/impostor_learner.py --data-dir D --run NAME --bootstrap ADDR [--bootstrap ADDR ...]

Prints ``impostor: listening on <peer id> <addr> ...`` once, then ``impostor: got <what> from
<peer id>`` per request; runs until killed or stdin closes. It re-joins the DHT through the
bootstrap addresses every few seconds (so it stays in the swarm while the learner restarts).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from swarm.discovery.bootstrap import serve_run_info  # noqa: E402
from swarm.discovery.dht import open_discovery  # noqa: E402
from swarm.discovery.keys import run_key  # noqa: E402
from swarm.errors import SwarmError  # noqa: E402
from swarm.host import HostConfig, open_host  # noqa: E402
from swarm.proto import ADAPTER, DISSEM_JOIN, HELLO, MODEL_MANIFEST, WORK  # noqa: E402
from swarm.proto.adapter import AdapterReply, AdapterRequest  # noqa: E402
from swarm.proto.discovery import RunInfo  # noqa: E402
from swarm.proto.dissem import DissemJoin, DissemJoinAck  # noqa: E402
from swarm.proto.hello import Hello, HelloAck  # noqa: E402
from swarm.proto.model import ModelManifestReply, ModelManifestRequest  # noqa: E402
from swarm.proto.work import WorkReply, WorkRequest  # noqa: E402

#: How often (s) it re-dials its bootstrap members and re-provides the key.
REJOIN_S = 3.0


def say(text: str) -> None:
    print(f"impostor: {text}", flush=True)


async def main(args) -> None:
    async with open_host(Path(args.data_dir), listen_addr=args.listen,
                         config=HostConfig(dial_timeout_s=3.0, request_timeout_s=10.0)) as host, \
            open_discovery(host) as disc:
        serve_run_info(host, lambda peer: RunInfo(run_name=args.run, role="learner", learner=host.peer_id,
                                                  learner_addrs=host.advertised_addrs(peer)))

        def logged(what: str, reply):
            async def handler(msg, peer: str):
                say(f"got {what} from {peer}")
                return reply()
            return handler

        host.set_handler(HELLO, Hello, logged("hello", lambda: HelloAck(
            accepted=True, run_id="impostor-run", model="impostor-model", current_version=0, run_name=args.run)))
        host.set_handler(MODEL_MANIFEST, ModelManifestRequest, logged("model-manifest", lambda: ModelManifestReply(
            manifest=None, reason="impostor")))
        host.set_handler(WORK, WorkRequest, logged("work", lambda: WorkReply(lease=None, retry_after_s=1.0)))
        host.set_handler(ADAPTER, AdapterRequest, logged("adapter", lambda: AdapterReply(
            version=0, rank=1, alpha=1.0, target_modules=[], tensors={})))
        host.set_handler(DISSEM_JOIN, DissemJoin, logged("dissem-join", lambda: DissemJoinAck(mode="direct")))
        say(f"listening on {host.peer_id} {' '.join(host.addrs)}")

        async def stay_in_the_swarm() -> None:
            while True:
                for addr in args.bootstrap:
                    try:
                        with trio.fail_after(REJOIN_S):
                            await disc.add_peer(await host.connect(addr))
                    except (SwarmError, trio.TooSlowError, OSError):
                        pass
                await disc.provide(run_key(args.run, "learner"))
                await trio.sleep(REJOIN_S)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stay_in_the_swarm)
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)  # until stdin closes
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--bootstrap", action="append", default=[])
    p.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    trio.run(main, p.parse_args())
