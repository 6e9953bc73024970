"""``swarm-node doctor [--bootstrap ADDR]``: what this machine's network lets a node do.

It opens a throwaway libp2p host (a fresh key; ``--listen`` picks the port) and, through the
bootstrap peer (best: the learner, which serves the checks, ``swarm.nat``):

1. dials the bootstrap, and up to two more peers it names, *from its listening port*, and asks
   each at which address and port it sees us: one address for all (and our own) means no NAT;
   one foreign address for all, an endpoint-independent mapping (a usual home router: hole
   punching works); different ports, an endpoint-dependent (symmetric) NAT;
2. asks the bootstrap to dial it back from a fresh host (can peers dial this machine?);
3. when they cannot, tries a hole punch with a NAT'd peer that holds a slot at the bootstrap's
   relay (if there is one);
4. measures upload and download to the bootstrap (1 MiB each way);
5. says the role a node here would take: an *interior relay* (relays adapter chunks, serves
   model chunks, can be any pipeline stage) or a *leaf* (only fed; as a stage it follows only a
   stage it can dial), and why.

Exit status: 0 a node here relays and serves, 1 it would be a leaf only, 2 the checks could not
run (no bootstrap reachable). ``--json`` prints the report as one JSON object instead.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, dataclass, field

import trio

from swarm.addrs import interface_ips, split_peer_id, with_peer_id
from swarm.nat.kinds import (UNKNOWN, DoctorRole, NatVerdict, Observation, circuit_peer, classify_mapping, doctor_role,
                             parse_ip_tcp)

KIND_WORDS = {"public": "no NAT", "eim": "endpoint-independent mapping (a usual home router)",
              "symmetric": "endpoint-dependent (symmetric) mapping", UNKNOWN: "unknown"}


@dataclass
class DoctorReport:
    peer_id: str = ""
    listen_port: int = 0
    observations: list[Observation] = field(default_factory=list)
    verdict: NatVerdict = NatVerdict(UNKNOWN, "not checked")
    #: The dial-back: None when it could not be asked.
    dialable: bool | None = None
    dialback_detail: str = ""
    #: The hole punch: None when not tried.
    punched: bool | None = None
    punch_detail: str = ""
    #: Mbit/s to the bootstrap peer (None: not measured).
    up_mbit: float | None = None
    down_mbit: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def role(self) -> DoctorRole:
        if self.verdict.kind == UNKNOWN and self.dialable is None and not self.observations:
            return doctor_role(UNKNOWN, None, None)
        return doctor_role(self.verdict.kind, self.dialable, self.punched)

    def to_json(self) -> dict:
        out = asdict(self)
        out["role"] = asdict(self.role)
        return out


def render(r: DoctorReport) -> str:
    """The report in plain words (pure)."""
    lines = [f"swarm-node doctor: checked as peer {r.peer_id or '?'} from port {r.listen_port}"]
    if r.observations:
        seen = ", ".join(f"{o.ip}:{o.port} (by ...{o.observer[-6:]})" for o in r.observations)
        lines.append(f"  seen by {len(r.observations)} peer(s) at: {seen}")
    lines.append(f"  NAT: {KIND_WORDS.get(r.verdict.kind, r.verdict.kind)}: {r.verdict.reason}")
    if r.dialable is None:
        lines.append("  dial-back: not checked" + (f" ({r.dialback_detail})" if r.dialback_detail else ""))
    else:
        lines.append(f"  dial-back: {'peers can dial this machine' if r.dialable else 'peers cannot dial this machine'}"
                     f" ({r.dialback_detail})")
    if r.punched is None:
        lines.append("  hole punch: not tried" + (f" ({r.punch_detail})" if r.punch_detail else ""))
    else:
        lines.append(f"  hole punch: {'worked' if r.punched else 'failed'} ({r.punch_detail})")
    if r.up_mbit is not None:
        lines.append(f"  bandwidth to the bootstrap peer: upload {r.up_mbit:.1f} Mbit/s, download {r.down_mbit:.1f} Mbit/s")
    for p in r.problems:
        lines.append(f"  problem: {p}")
    role = r.role
    stage = ("it can be a pipeline stage anywhere in a pipeline" if role.stage else
             "as a pipeline stage it can only follow a stage it can dial (it opens the connection itself)")
    lines.append(f"  role: {role.role.upper()}: {role.why}" + (f"; {stage}" if role.exit_code < 2 else ""))
    return "\n".join(lines)


async def diagnose(bootstrap: list[str], listen: str, timeout_s: float, announce: list[str] = ()) -> DoctorReport:
    from swarm.host import HostConfig, open_host
    from swarm.nat.config import NatConfig
    from swarm.nat.service import nat_running

    rep = DoctorReport()
    cfg = NatConfig(punch_attempts=2, punch_timeout_s=max(timeout_s, 5.0), relay_timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="es-doctor-") as tmp:
        async with open_host(tmp, listen_addr=listen, config=HostConfig(dial_timeout_s=timeout_s)) as host, \
                nat_running(host, cfg) as nat:
            rep.peer_id, rep.listen_port = host.peer_id, nat.listen_port()
            boot, first = await _first_observer(nat, bootstrap, timeout_s, rep)
            if boot is None:
                return rep
            await _more_observers(nat, [a for a in bootstrap if split_peer_id(a)[1] != boot] + first.peers,
                                  timeout_s, rep)
            rep.verdict = classify_mapping(interface_ips(), rep.listen_port, rep.observations)
            await _dial_back(nat, host, boot, rep, list(announce))
            if not rep.dialable:
                await _punch(nat, host.peer_id, first.relayed, rep)
            else:
                rep.punch_detail = "not needed: peers can dial this machine"
            try:
                with trio.fail_after(60):
                    rep.up_mbit, rep.down_mbit = await nat.bandwidth(boot)
            except Exception as e:
                rep.problems.append(f"bandwidth test failed: {type(e).__name__}: {str(e)[:160]}")
    return rep


async def _observe(nat, addr: str, timeout_s: float, rep: DoctorReport):
    peer = await nat.dial_from_listen_port(addr)
    with trio.fail_after(timeout_s):
        seen = await nat.observe(peer)
    for a in seen.addrs[:1]:
        got = parse_ip_tcp(a)
        if got:
            rep.observations.append(Observation(peer, *got))
    return peer, seen


async def _first_observer(nat, bootstrap: list[str], timeout_s: float, rep: DoctorReport):
    for addr in bootstrap:
        try:
            return await _observe(nat, addr, timeout_s, rep)
        except Exception as e:
            rep.problems.append(f"bootstrap {addr}: {type(e).__name__}: {str(e)[:160]}")
    return None, None


async def _more_observers(nat, candidates: list[str], timeout_s: float, rep: DoctorReport) -> None:
    tried = 0
    for addr in candidates:
        if len({o.observer for o in rep.observations}) >= 3 or tried >= 6:
            return
        if split_peer_id(addr)[1] in {o.observer for o in rep.observations}:
            continue
        tried += 1
        try:
            await _observe(nat, addr, min(timeout_s, 5.0), rep)
        except Exception:
            continue  # a peer we cannot dial (behind NAT itself) or that does not serve the check


async def _dial_back(nat, host, boot: str, rep: DoctorReport, announce: list[str]) -> None:
    """Asks the bootstrap to dial: the announced addresses, our own, each address peers saw us
    at, and each seen IP at our listening port (a port forwarded to the same number)."""
    def tcp(ip: str, port: int) -> str:
        return f"/{'ip6' if ':' in ip else 'ip4'}/{ip}/tcp/{port}"

    mine = [split_peer_id(a)[0] for a in [*announce, *host.addrs]]
    mine += [tcp(o.ip, rep.listen_port) for o in rep.observations]
    mine += [tcp(o.ip, o.port) for o in rep.observations]
    addrs = list(dict.fromkeys(with_peer_id(a, host.peer_id) for a in mine))
    try:
        got = await nat.dial_back(boot, addrs)
    except Exception as e:
        rep.dialback_detail = f"the bootstrap peer could not be asked: {type(e).__name__}: {str(e)[:160]}"
        return
    rep.dialable = got.reachable
    rep.dialback_detail = f"reached at {got.addr}" if got.reachable else "; ".join(got.errors)[:300] or "no answer"


async def _punch(nat, me: str, relayed: list[str], rep: DoctorReport) -> None:
    partners = [c for c in relayed if circuit_peer(c) not in (None, me)][:2]
    if not partners:
        rep.punch_detail = "no NAT'd peer holds a slot at the bootstrap's relay to try with"
        return
    for circuit in partners:
        peer = circuit_peer(circuit)
        out = await nat.punch(peer, circuit)
        rep.punched = out.ok
        rep.punch_detail = (f"direct connection to ...{peer[-6:]} at {out.addr} after {out.seconds:.2f} s" if out.ok
                            else f"with ...{peer[-6:]}: {out.reason}")
        if out.ok:
            return


def main(args) -> int:
    if not args.bootstrap:
        print("swarm-node doctor: give --bootstrap MULTIADDR (best: the learner's address)", file=sys.stderr)
        return 2
    rep = trio.run(diagnose, list(args.bootstrap), args.listen, float(args.timeout), list(args.announce))
    print(json.dumps(rep.to_json()) if args.json else render(rep), flush=True)
    return rep.role.exit_code
