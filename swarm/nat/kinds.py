"""Pure decisions of NAT traversal: the kind of NAT from what peers observe, the wait between
hole-punch attempts, and the role a node can take in plain words (``swarm-node doctor``).

Mapping kinds (RFC 4787's terms):

- ``"public"``: every observer sees one of our own interface addresses at our own port: no NAT
  between us and them (a firewall may still block inbound dials: the dial-back tells);
- ``"eim"``: endpoint-independent mapping: one local port appears as the same public address
  and port to every observer. The usual home router; hole punching works;
- ``"symmetric"``: endpoint-dependent mapping: observers see different public ports (or
  addresses) for one local port. A hole punch cannot predict the port; the node is reached
  through connections it opens itself, or a relay;
- ``"unknown"``: fewer than two observers answered.
"""

from __future__ import annotations

from dataclasses import dataclass

PUBLIC, EIM, SYMMETRIC, UNKNOWN = "public", "eim", "symmetric", "unknown"


@dataclass(frozen=True)
class Observation:
    """What one observer saw of one local port."""

    observer: str
    ip: str
    port: int


@dataclass(frozen=True)
class NatVerdict:
    kind: str
    #: Plain words: what was seen.
    reason: str


def parse_ip_tcp(addr: str) -> tuple[str, int] | None:
    """``(ip, port)`` of an ``/ip4|ip6/<ip>/tcp/<port>[/...]`` multiaddr, else None."""
    parts = addr.split("/")
    if len(parts) < 5 or parts[0] != "" or parts[1] not in ("ip4", "ip6") or parts[3] != "tcp":
        return None
    try:
        port = int(parts[4])
    except ValueError:
        return None
    return (parts[2], port) if 0 < port < 65536 else None


def circuit_peer(addr: str) -> str | None:
    """The peer a circuit address leads to (``<relay addr>/p2p/<relay>/p2p-circuit/p2p/<peer>``),
    or None when ``addr`` is not one."""
    _, sep, tail = addr.rpartition("/p2p-circuit/p2p/")
    peer = tail.split("/", 1)[0] if sep else ""
    return peer or None


def classify_mapping(local_ips: list[str], local_port: int, observations: list[Observation]) -> NatVerdict:
    """The mapping kind from ``observations`` of one local port (``local_port``) by different
    observers (the first observation of each observer counts)."""
    first: dict[str, Observation] = {}
    for o in observations:
        first.setdefault(o.observer, o)
    seen = list(first.values())
    if len(seen) < 2:
        return NatVerdict(UNKNOWN, f"{len(seen)} peer(s) reported our address; two are needed")
    views = sorted({(o.ip, o.port) for o in seen})
    shown = ", ".join(f"{ip}:{port}" for ip, port in views)
    if all(o.ip in local_ips and o.port == local_port for o in seen):
        return NatVerdict(PUBLIC, f"{len(seen)} peers see our own address {shown}: no NAT in between")
    if len(views) == 1:
        ip, port = views[0]
        if port == local_port:
            return NatVerdict(EIM, f"{len(seen)} peers see us at {ip}:{port} (the same port): endpoint-independent "
                                   "mapping, hole punching can work")
        # DCUtR advertises (router address : our listening port); a router that keeps ports maps
        # ours elsewhere when another machine behind it holds that port towards the same peers.
        return NatVerdict(EIM, f"{len(seen)} peers see us at {ip}:{port} (port {port} for our {local_port}): "
                               "endpoint-independent mapping, but hole punches announce our own port, so they "
                               f"can fail; if another machine behind this router listens on {local_port}, give "
                               "this one another --listen port")
    return NatVerdict(SYMMETRIC, f"{len(seen)} peers see one local port at {len(views)} different public "
                                 f"addresses ({shown}): endpoint-dependent (symmetric) mapping, hole punching "
                                 "cannot predict the port")


def admit_probe(times: list[float], now: float, window_s: float, limit: int) -> bool:
    """Whether one more costly check (a dial-back, a bandwidth probe) fits ``limit`` per
    ``window_s`` seconds, given the times of the earlier ones (``times``, oldest first; trimmed
    in place to the window, and ``now`` appended when admitted)."""
    while times and times[0] <= now - window_s:
        times.pop(0)
    if len(times) >= limit:
        return False
    times.append(now)
    return True


def backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """Wait before attempt ``attempt`` (0-based): none before the first, then ``base_s``,
    doubling, at most ``max_s``."""
    if attempt <= 0:
        return 0.0
    return min(max_s, base_s * 2 ** (attempt - 1))


def punch_budget_s(attempts: int, timeout_s: float, base_s: float, max_s: float) -> float:
    """The longest a punch of ``attempts`` attempts takes: each attempt's deadline plus the
    backoff before each (:func:`backoff_s`)."""
    return sum(timeout_s + backoff_s(a, base_s, max_s) for a in range(attempts))


@dataclass(frozen=True)
class DoctorRole:
    #: ``"interior relay"`` (dialable, or reached by hole punches) or ``"leaf"``.
    role: str
    #: Whether a pipeline stage here can be reached by the previous stage.
    stage: bool
    #: Plain words for the operator.
    why: str
    #: Exit status for scripts: 0 relays and serves, 1 a leaf only, 2 could not check.
    exit_code: int


def doctor_role(kind: str, dialable: bool | None, punched: bool | None) -> DoctorRole:
    """The role a node takes from its NAT kind, the dial-back (None: not tried) and a hole
    punch with a NAT'd peer (None: not tried)."""
    if dialable:
        return DoctorRole("interior relay", True, "other peers can dial this machine: it can relay adapter chunks "
                          "and serve model chunks", 0)
    if punched:
        return DoctorRole("interior relay", True, "behind NAT, but a hole punch worked: it relays to peers it "
                          "punches through to and is reached by dialable peers through connection reversal", 0)
    if kind == EIM and punched is None:
        return DoctorRole("interior relay", True, "behind an endpoint-independent NAT (a usual home router): hole "
                          "punches should work, though none could be tried now; it likely relays to peers it punches "
                          "through to and is reached by dialable peers through connection reversal", 0)
    if kind == UNKNOWN and dialable is None:
        return DoctorRole("unknown", False, "the checks could not run: is the bootstrap address right?", 2)
    if kind == SYMMETRIC:
        why = ("behind a symmetric NAT: hole punching cannot work, so it is a leaf (fed over connections it opens "
               "itself); forward a TCP port and pass --listen/--announce to make it a relay")
    elif punched is False:
        why = ("behind NAT and the hole punch failed: a leaf (fed over connections it opens itself); forward a TCP "
               "port and pass --listen/--announce to make it a relay")
    else:
        why = ("not dialable and no hole punch could be tried: a leaf unless a punch with another node works "
               "once it joins; forwarding a TCP port makes it a relay for sure")
    return DoctorRole("leaf", False, why, 1)
