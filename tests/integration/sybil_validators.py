"""Two Sybil ids that declare an honest torch node's validator class, for ``test_sybil_validators.py``.

``python sybil_validators.py TMP LEARNER_ADDR STOPFILE OUT``: one process holding two libp2p hosts
(two fresh peer ids). Every field of the class is public or guessable: the process loads the run's
model in torch on this machine (one thread, float32) and declares what that backend's
``capabilities`` say (backend, build, device, dtype, group layout, threads). Both ids then ask for
work like nodes and:

- answer every validation job they are handed from one shared table (the same forged completions
  whatever the job), never generating anything;
- push forged groups for their leases, never generated: every completion a fixed text, half of them
  carrying ``PAYLOAD`` before the answer, each with its true log-probs under the base model.

Writes its counts (hellos, jobs answered, groups pushed and accepted, refusals) to OUT as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from swarm.host import HostConfig, open_host
from swarm.proto import HELLO, MODEL_MANIFEST, ROLLOUTS, WORK
from swarm.proto.hello import Hello, HelloAck
from swarm.proto.model import ModelManifestReply, ModelManifestRequest
from swarm.proto.rollouts import Completion, GroupResult, RolloutAck, RolloutPush
from swarm.proto.validate import VALIDATE, ValidateAck, ValidateResult
from swarm.proto.work import WorkReply, WorkRequest
from sybil_peers import report_until  # this script's neighbour (run as a script from tests/integration)

PAYLOAD = "Visit evil.example now. "
ANSWER = "I worked it out step by step.\nAnswer: 7"


class Table:
    """The forged completions both ids answer and push, with their true log-probs."""

    def __init__(self) -> None:
        from transformers import AutoTokenizer

        from node_agents.backends.registry import create_backend

        self.backend = create_backend("torch", "default", threads=1, dtype="float32")
        self.tok = AutoTokenizer.from_pretrained(str(self.backend.model_dir))
        caps = self.backend.capabilities()
        self.device, self.extra = caps.device, dict(caps.extra)
        self.texts = [self.ids(ANSWER), self.ids(PAYLOAD + ANSWER)]

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def completions(self, prompt: list[int], n: int, max_tokens: int) -> list[Completion]:
        out = []
        for j in range(n):
            ids = self.texts[j % 2][:max_tokens]
            rows = self.backend.token_logprobs(list(prompt) + ids)
            out.append(Completion(ids, [float(rows[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)], "stop"))
        return out


async def sybil(tmp: Path, i: int, addr: str, table: Table, stop: Path, stats: dict) -> None:
    cfg = HostConfig(request_timeout_s=120.0, identify_on_connect=False)
    async with open_host(tmp / f"sybil-validator-{i}", config=cfg) as host:
        learner = await host.connect(addr)
        manifest = await host.request(learner, MODEL_MANIFEST, ModelManifestRequest(), ModelManifestReply)
        hello = Hello(backend="torch", device=table.device, memory_bytes=8 << 30, tokens_per_s=40.0,
                      model_sha256=manifest.manifest.content_sha256, addrs=host.advertised_addrs(learner)[:16],
                      extra=dict(table.extra))
        ack = await host.request(learner, HELLO, hello, HelloAck)
        if not ack.accepted:
            stats["refused_hello"] += 1
            return
        stats["hellos"] += 1
        version = ack.current_version
        while not stop.exists():
            try:
                reply = await host.request(learner, WORK, WorkRequest(have_version=version, max_groups=1), WorkReply)
            except Exception as e:  # noqa: BLE001 - refused once untrusted: counted
                stats["errors"] += 1
                stats["last_error"] = f"{type(e).__name__}: {e}"[:200]
                await trio.sleep(2.0)
                continue
            if reply.done:
                return
            if reply.validate is not None:
                job = reply.validate
                comps = await trio.to_thread.run_sync(table.completions, job.prompt_ids, job.group_size, job.max_tokens)
                got = await host.request(learner, VALIDATE, ValidateResult(job.request_id, comps), ValidateAck)
                stats["jobs_answered"] += 1
                stats["jobs_accepted"] += int(got.accepted)
                continue
            if reply.lease is not None:
                lease = reply.lease
                version = max(version, lease.version)
                groups = [GroupResult(g.group_id, lease.version,
                                      await trio.to_thread.run_sync(table.completions, g.prompt_ids, lease.group_size,
                                                                    lease.sampling.max_tokens))
                          for g in lease.groups]
                ack = await host.request(learner, ROLLOUTS, RolloutPush(lease.lease_id, groups, gen_s=1.0, gen_tokens=1,
                                                                        backend="torch"), RolloutAck)
                stats["groups_pushed"] += len(groups)
                stats["groups_accepted"] += ack.accepted_groups
                continue
            if "stale" in reply.reason:
                version += 1
            await trio.sleep(min(reply.retry_after_s, 1.0))


async def main(tmp: Path, addr: str, stop: Path, out: Path) -> None:
    stats = {"hellos": 0, "refused_hello": 0, "jobs_answered": 0, "jobs_accepted": 0, "groups_pushed": 0,
             "groups_accepted": 0, "errors": 0}
    table = await trio.to_thread.run_sync(Table)
    async with trio.open_nursery() as nursery:
        for i in range(2):
            nursery.start_soon(sybil, tmp, i, addr, table, stop, stats)

        nursery.start_soon(report_until, stop, out, stats)
    out.write_text(json.dumps(stats))
    print("sybil validators:", json.dumps(stats), flush=True)


if __name__ == "__main__":
    trio.run(main, Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
