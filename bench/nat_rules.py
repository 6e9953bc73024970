"""The rules an emulated NAT router runs (:mod:`bench.netns`), as text: pure functions, so the
kinds can be read and unit-tested without root.

Two kinds of router, both with address-and-port-dependent *filtering* (conntrack lets in only
packets that belong to a connection a host behind the router opened; that is also what lets a
simultaneous TCP open through, since the peer's SYN matches the reply direction of the
router's own entry). Anything else arriving on the WAN side is dropped silently, as home
routers do: a router that answered an early SYN with a reset would abort the peer's half of
a simultaneous open before its own host's SYN had made the mapping.

- ``"eim"``: endpoint-independent *mapping*, the usual home router. Linux masquerade keeps a
  connection's source port whenever that leaves its tuple unique, so one private
  ``address:port`` appears as the same public ``address:port`` to every peer (two hosts behind
  one router that use the same source port towards the same peer are the exception: the second
  gets another port). Hole punching works through it.
- ``"symmetric"``: endpoint-dependent mapping with randomised ports (masquerade
  ``fully-random``): every new connection gets a random public port, so the address a peer
  observes says nothing about the port the next peer will see. Hole punching does not work.
"""

from __future__ import annotations

#: Router kinds :func:`nft_rules` knows.
KINDS = ("eim", "symmetric")

_MASQUERADE = {"eim": "masquerade", "symmetric": "masquerade fully-random"}
_IPTABLES_MASQUERADE = {"eim": [], "symmetric": ["--random-fully"]}


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"router kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def nft_rules(kind: str, wan: str = "wan", lan: str = "lan") -> str:
    """An nftables ruleset (``nft -f -``) for a router of ``kind`` between ``lan`` and ``wan``."""
    masq = _MASQUERADE[check_kind(kind)]
    return ("table ip nat {\n chain postrouting_nat {\n  type nat hook postrouting priority srcnat; policy accept;\n"
            f"  oifname \"{wan}\" {masq}\n }}\n}}\n"
            "table ip filter {\n chain forward_nat {\n  type filter hook forward priority 0; policy drop;\n"
            f"  iifname \"{lan}\" accept\n  ct state established,related accept\n }}\n"
            " chain input_nat {\n  type filter hook input priority 0; policy accept;\n"
            f"  iifname \"{wan}\" ct state established,related accept\n  iifname \"{wan}\" drop\n }}\n}}\n")


def iptables_rules(kind: str, wan: str = "wan", lan: str = "lan") -> list[list[str]]:
    """The same router as iptables argument lists (each run as ``iptables *args``)."""
    extra = _IPTABLES_MASQUERADE[check_kind(kind)]
    return [["-t", "nat", "-A", "POSTROUTING", "-o", wan, "-j", "MASQUERADE", *extra],
            ["-P", "FORWARD", "DROP"],
            ["-A", "FORWARD", "-i", lan, "-j", "ACCEPT"],
            ["-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
            ["-A", "INPUT", "-i", wan, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
            ["-A", "INPUT", "-i", wan, "-j", "DROP"]]


def nft_forward_rules(port: int, dst: str, wan: str = "wan") -> str:
    """nftables rules that forward TCP ``port`` arriving on ``wan`` to ``dst`` (``ip:port``)."""
    return (f"table ip nat {{\n chain prerouting_nat {{\n  type nat hook prerouting priority dstnat; "
            f"policy accept;\n  iifname \"{wan}\" tcp dport {port} dnat to {dst}\n }}\n}}\n"
            f"add rule ip filter forward_nat iifname \"{wan}\" ct status dnat accept\n")
