"""``--wan PROFILE`` for ``swarm-bench`` commands that run on emulated hosts: the argument, and
the per-host links a testbed gets from it (host 0 the learner's link, the others nodes').

``PROFILE`` is a profile's name (``home``), a TOML path, or an inline uniform profile
``rtt=MS[,loss=P][,jitter=MS][,up=MBIT][,down=MBIT]`` whose figures hold between any two hosts
(:func:`bench.wan.profile.uniform_links`; rates default to the command's ``--rate-mbit``).
Commands that compare conditions take ``--wan`` several times and run each one against zero
latency on the same hosts.
"""

from __future__ import annotations

import argparse

from bench.wan.profile import Link, load_profile, parse_inline, profile_names, uniform_links


def add_wan_arguments(p: argparse.ArgumentParser, several: bool = False) -> None:
    p.add_argument("--wan", default=[] if several else None, action="append" if several else "store",
                   metavar="PROFILE",
                   help=f"emulate wide-area links: a profile ({', '.join(profile_names())}, or a .toml path) or an "
                        "inline rtt=MS[,loss=P][,jitter=MS][,up=MBIT][,down=MBIT] between any two hosts; round "
                        "trips, jitter, loss and rates per host (bench/wan/)"
                        + ("; give it several times to compare several conditions" if several else ""))
    p.add_argument("--wan-seed", type=int, default=0, help="seed of the profile's per-host draw and of the loss")


def links_of(profile: str, n_hosts: int, seed: int = 0, rate_mbit: float = 0.0) -> dict[int, Link]:
    """Host ``i``'s link under ``profile`` (host 0 the learner's)."""
    if "=" in profile:
        figures = {"up_mbit": rate_mbit, "down_mbit": rate_mbit, **parse_inline(profile)}
        return dict(enumerate(uniform_links(n_hosts, **figures)))
    return dict(enumerate(load_profile(profile).links(n_hosts - 1, seed=seed)))


def wan_links(args: argparse.Namespace, n_hosts: int, rate_mbit: float = 0.0) -> dict[int, Link]:
    """The links of the (first) ``--wan`` profile; empty without ``--wan``."""
    profiles = args.wan if isinstance(args.wan, list) else [args.wan] if args.wan else []
    if not profiles:
        return {}
    return links_of(profiles[0], n_hosts, args.wan_seed, rate_mbit)


def describe(links: dict[int, Link]) -> str:
    """One line: the spread of the nodes' links (hosts 1..), for a benchmark's header."""
    nodes = [link for i, link in links.items() if i]
    if not nodes:
        return "no emulated latency"
    rtt = sorted(n.rtt_ms + links[0].rtt_ms for n in nodes)
    up = sorted(n.up_mbit for n in nodes)
    return (f"RTT to host 0 {rtt[0]:.0f}-{rtt[-1]:.0f} ms, up {up[0]:g}-{up[-1]:g} Mbit/s, "
            f"{sum(1 for n in nodes if n.loss)} of {len(nodes)} links lossy")
