"""``--wan PROFILE`` for ``swarm-bench`` commands that run on emulated hosts: the argument, and
the per-host links a testbed gets from it (host 0 the learner's link, the others nodes')."""

from __future__ import annotations

import argparse

from bench.wan.profile import Link, load_profile, profile_names


def add_wan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wan", default=None, metavar="PROFILE",
                   help=f"emulate wide-area links from this profile ({', '.join(profile_names())}, or a .toml path): "
                        "round trips, jitter, loss and up/down rates per host (bench/wan/profile.py)")
    p.add_argument("--wan-seed", type=int, default=0, help="seed of the profile's per-host draw and of the loss")


def wan_links(args: argparse.Namespace, n_hosts: int) -> dict[int, Link]:
    """Host ``i``'s link under ``--wan`` (host 0 the learner's); empty without ``--wan``."""
    if not args.wan:
        return {}
    return dict(enumerate(load_profile(args.wan).links(n_hosts - 1, seed=args.wan_seed)))


def describe(links: dict[int, Link]) -> str:
    """One line: the spread of the nodes' links (hosts 1..), for a benchmark's header."""
    nodes = [link for i, link in links.items() if i]
    if not nodes:
        return "no emulated latency"
    rtt = sorted(n.rtt_ms + links[0].rtt_ms for n in nodes)
    up = sorted(n.up_mbit for n in nodes)
    return (f"RTT to host 0 {rtt[0]:.0f}-{rtt[-1]:.0f} ms, up {up[0]:g}-{up[-1]:g} Mbit/s, "
            f"{sum(1 for n in nodes if n.loss)} of {len(nodes)} links lossy")
