"""A light dissemination-only process: the real dissemination code on a real libp2p host,
without a generation backend. ``swarm-bench broadcast`` runs one per emulated host (a
``swarm-node`` would also load llama.cpp, which the broadcast never touches), and the
relay-failure tests kill them.

    python -m bench.relay_node node --learner ADDR --run-id R --data-dir D [--listen A]
    python -m bench.relay_node learner --nodes N --trials T.json --out R.jsonl [...]

A node prints ``peer <id>`` once registered and serves until killed or until its stdin
closes. The learner waits for ``--nodes`` registrations, then runs each trial of the
trials file (``{"mode", "n", "rank", "codec", ...}``): it publishes a fresh random
adapter of the SmolLM2-135M LoRA shape at that rank to the first ``n`` registered nodes
and writes one JSON line per trial: time from the start of the push until the last of
them verified the last chunk (``completed_at`` is wall-clock time on the same machine).

Both run a :class:`swarm.nat.service.NatService` (the learner serves the circuit relay), so
nodes behind emulated NAT routers reserve at the learner's relay and hole-punch to each other
when the learner asks (``learner/links.py``). With ``--sets FILE`` the learner waits for that
JSON file (``{"name": [peer ids]}``, written once the nodes are up) and for the hole-punch
rounds to end; a trial's ``"set"`` then names the nodes it publishes to, and its ``"links"``
whether the plan follows links (false: NAT'd nodes are learner-fed leaves).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

#: SmolLM2-135M dimensions (the embedded default model): layers, hidden, ffn, kv width.
DEFAULT_DIMS = (30, 576, 1536, 192)
#: Codecs only deltas use (``dissem.delta_codec``; ``dissem.codec`` refuses them for whole
#: versions): a trial of one is sent as a delta to the previous trial's version, which every
#: node holds (a random adapter of another seed: a change as large as the adapter itself).
DELTA_ONLY_CODECS = ("int3",)


def lora_tensors(rank: int, dims=DEFAULT_DIMS, seed: int = 0, b_std: float = 2e-3) -> dict:
    """Random LoRA tensors of the real shapes (A ~ N(0, 1/fan_in), B ~ N(0, b_std))."""
    import numpy as np

    layers, hidden, ffn, kv = dims
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (hidden, kv),
              "self_attn.v_proj": (hidden, kv), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (hidden, ffn), "mlp.up_proj": (hidden, ffn), "mlp.down_proj": (ffn, hidden)}
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(layers):
        for module, (fan_in, fan_out) in shapes.items():
            stem = f"base_model.model.model.layers.{i}.{module}"
            out[f"{stem}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            out[f"{stem}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * b_std).astype(np.float32)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relay_node", description=__doc__.strip().splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    n = sub.add_parser("node")
    n.add_argument("--learner", required=True)
    n.add_argument("--run-id", required=True)
    n.add_argument("--data-dir", type=Path, required=True)
    n.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    n.add_argument("--upload-mbps", type=float, default=0.0)
    n.add_argument("--send-delay-ms", type=float, default=0.0, help="pause before each relayed chunk")
    lr = sub.add_parser("learner")
    lr.add_argument("--nodes", type=int, required=True, help="registrations to wait for")
    lr.add_argument("--trials", type=Path, required=True)
    lr.add_argument("--out", type=Path, required=True)
    lr.add_argument("--run-id", default="bench")
    lr.add_argument("--data-dir", type=Path, required=True)
    lr.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    lr.add_argument("--addr-file", type=Path, help="write the learner's multiaddr here")
    lr.add_argument("--join-timeout", type=float, default=120.0)
    lr.add_argument("--trial-timeout", type=float, default=300.0)
    lr.add_argument("--sets", type=Path, help="wait for this JSON file of named node sets")
    lr.add_argument("--punch-wait", type=float, default=300.0, help="longest wait (s) for hole-punch rounds")
    lr.add_argument("--summary", type=Path, help="write the dissemination summary (dissem.json's) here at the end")
    lr.add_argument("--conditions", type=Path,
                    help="before a trial with a \"wan\" key, write '<n> <cond>' here and wait for the same line in "
                         "<this>.ack (the bench sets the emulated links in between)")
    for q in (n, lr):
        q.add_argument("-v", "--verbose", action="store_true")
    return p


async def run_node(args) -> None:
    import trio

    from node_agents.adapter_sync import AdapterSync
    from swarm.host import open_host
    from swarm.nat.service import nat_running

    async with open_host(args.data_dir, listen_addr=args.listen) as host, nat_running(host) as nat:
        learner = await host.connect(args.learner)
        sync = AdapterSync(host, learner, upload_bps=args.upload_mbps * 125_000, nat=nat)
        sync.dis.settings.send_delay_s = args.send_delay_ms / 1000
        await sync.join(args.run_id)
        print(f"peer {host.peer_id}", flush=True)
        # Serve until stdin closes (the parent went away) or we are killed.
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)  # type: ignore[call-arg]  # old trio stubs


async def run_learner(args) -> None:
    import trio

    from learner.config import DissemConfig
    from learner.dissem import LearnerDissem
    from common.lora import LoraAdapter
    from swarm.host import open_host
    from swarm.nat.config import NatConfig
    from swarm.nat.service import nat_running

    trials = json.loads(args.trials.read_text())
    relay = NatConfig(serve_relay=True, relay_max_circuits=32, relay_max_reservations=256)
    async with open_host(args.data_dir, listen_addr=args.listen) as host, nat_running(host, relay):
        dissem = LearnerDissem(host, DissemConfig(), args.run_id)
        dissem.register()
        if args.addr_file:
            args.addr_file.write_text(host.addrs[0])
        print(f"learner {host.addrs[0]}", flush=True)
        if not await dissem.wait_members(args.nodes, args.join_timeout):
            raise SystemExit(f"only {len(dissem.members)} of {args.nodes} nodes registered")
        order = sorted(dissem.members)
        async with trio.open_nursery() as nursery:
            await nursery.start(dissem.run)
            sets = await wait_sets(args, dissem) if args.sets else {}
            with open(args.out, "a") as out:
                for version, trial in enumerate(trials, start=1):
                    if args.conditions and "wan" in trial:
                        await ask_condition(args.conditions, f"{version} {trial['wan']}")  # the bench sets them
                    members = sets.get(trial["set"], order) if "set" in trial else order
                    row = await one_trial(dissem, members, version, trial, args.trial_timeout, LoraAdapter, DissemConfig)
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps(row), flush=True)
            if args.summary:
                args.summary.write_text(json.dumps(dissem.summary(), indent=1))
            nursery.cancel_scope.cancel()


async def ask_condition(path: Path, line: str, timeout_s: float = 60.0) -> None:
    """Ask the bench for a link condition and wait until it says the links are set."""
    import trio

    path.write_text(line)
    ack = path.with_name(path.name + ".ack")
    with trio.fail_after(timeout_s):
        while not (ack.exists() and ack.read_text().strip() == line):
            await trio.sleep(0.1)
    await trio.sleep(1.0)  # packets of the old condition drain


async def wait_sets(args, dissem) -> dict[str, list[str]]:
    """The named node sets of ``--sets`` (waited for), once the hole-punch rounds are over."""
    import trio

    while not args.sets.exists():
        await trio.sleep(0.2)
    sets = json.loads(args.sets.read_text())
    await trio.sleep(1.0)  # the rounds of the last registrations start
    t0 = time.perf_counter()
    idle = await dissem.links.wait_idle(args.punch_wait)
    punched = len(dissem.link_snapshot().punched)
    print(f"hole-punch rounds {'done' if idle else 'NOT done'} after {time.perf_counter() - t0:.1f} s: "
          f"{punched} pair(s) punched, {len(dissem.links.punches)} attempt(s) recorded", flush=True)
    return sets


def link_figures(dissem, members: list[str], version: int) -> dict:
    """Of ``members``: how many cannot be dialled, how many of those relayed chunks to another
    node in ``version`` (by the nodes' reports) and how many are leaves by their role."""
    from swarm.discovery.links import relay_role

    nat = [p for p in members if p in dissem.members and not dissem.members[p].reachable]
    senders = {s for r in dissem.have.get(version, {}).values() for s, n in r.sources.items() if n > 0}
    links = dissem.link_snapshot()
    leaves = [p for p in nat if links is None or not relay_role(links, p).relay]
    return {"nat_nodes": len(nat), "nat_relayed": len([p for p in nat if p in senders]), "nat_leaves": len(leaves)}


async def one_trial(dissem, order, version, trial, timeout, LoraAdapter, DissemConfig) -> dict:
    import trio

    settings = {k: v for k, v in trial.items() if k in DissemConfig.__dataclass_fields__}
    if settings.get("codec") in DELTA_ONLY_CODECS:  # sent as a delta to the previous trial's version
        settings.update(codec="fp16", delta=True, delta_codec=settings["codec"])
    dissem.reconfigure(DissemConfig(**settings))
    rank = int(trial.get("rank", 8))
    dims = tuple(trial.get("dims") or DEFAULT_DIMS)
    tensors = await trio.to_thread.run_sync(lambda: lora_tensors(rank, dims=dims, seed=version))
    adapter = LoraAdapter(version=version, rank=rank, alpha=2.0 * rank, target_modules=[], tensors=tensors)
    members = order[: int(trial["n"])]
    t_enc = time.perf_counter()
    await dissem.publish(adapter, members)
    encode_s = time.perf_counter() - t_enc
    ok = await dissem.wait_have(version, members, timeout)
    reports = dissem.have.get(version, {})
    asm = dissem.store.get(version)
    done = [reports[p].completed_at for p in members if p in reports]
    start = dissem.started_at[version]
    return {
        **trial, "version": version, "ok": ok, "nodes_done": len(done), "encode_s": round(encode_s, 3),
        "params": sum(t.size for t in tensors.values()), "wire_bytes": asm.manifest.total_bytes,
        "delta_of": asm.manifest.base_version,  # -1: sent whole
        "raw_bytes": asm.manifest.raw_bytes, "chunks": len(asm.chunks),
        "depth": dissem.plan([dissem.members[p] for p in members if p in dissem.members], None,
                             dissem.link_snapshot()).depth(),
        "dropped": len([p for p in members if p not in dissem.members]),  # the learner could not reach them
        **link_figures(dissem, members, version),
        "time_s": round(max(done) - start, 4) if done else None,
        "first_s": round(min(done) - start, 4) if done else None,
        "repaired": sum(r.repaired for r in reports.values()),
        "rejected": sum(r.rejected for r in reports.values()),
    }


def main(argv: list[str] | None = None) -> int:
    import trio

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        trio.run(run_node if args.role == "node" else run_learner, args)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
