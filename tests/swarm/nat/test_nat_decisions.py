"""The pure parts of NAT traversal: mapping kind from observations, backoff, the doctor's
role, the per-pair punch book, the settings' checks."""

from __future__ import annotations

import pytest

from swarm.nat.config import NatConfig
from swarm.nat.kinds import (
    EIM,
    PUBLIC,
    SYMMETRIC,
    UNKNOWN,
    Observation,
    admit_probe,
    backoff_s,
    circuit_peer,
    classify_mapping,
    doctor_role,
    parse_ip_tcp,
    punch_budget_s,
)
from swarm.nat.records import ALREADY, FAILED, PUNCHED, PunchBook, PunchOutcome


def obs(*views: tuple[str, str, int]) -> list[Observation]:
    return [Observation(o, ip, port) for o, ip, port in views]


def test_public_when_every_observer_sees_our_own_address():
    v = classify_mapping(["10.0.0.5", "127.0.0.1"], 4001, obs(("a", "10.0.0.5", 4001), ("b", "10.0.0.5", 4001)))
    assert v.kind == PUBLIC and "no NAT" in v.reason


def test_eim_when_two_observers_agree_on_a_foreign_address():
    v = classify_mapping(["192.168.1.2"], 4001, obs(("a", "203.0.113.7", 4001), ("b", "203.0.113.7", 4001)))
    assert v.kind == EIM and "same port" in v.reason
    v = classify_mapping(["192.168.1.2"], 4001, obs(("a", "203.0.113.7", 5555), ("b", "203.0.113.7", 5555)))
    assert v.kind == EIM and "port 5555 for our 4001" in v.reason
    assert "another --listen port" in v.reason  # hole punches announce the listening port


def test_symmetric_when_observers_see_different_ports_or_addresses():
    v = classify_mapping(["192.168.1.2"], 4001, obs(("a", "203.0.113.7", 31000), ("b", "203.0.113.7", 47123)))
    assert v.kind == SYMMETRIC and "2 different" in v.reason
    v = classify_mapping(["192.168.1.2"], 4001, obs(("a", "203.0.113.7", 4001), ("b", "198.51.100.1", 4001)))
    assert v.kind == SYMMETRIC


def test_unknown_below_two_observers_and_one_observer_counts_once():
    assert classify_mapping(["10.0.0.5"], 1, []).kind == UNKNOWN
    same = obs(("a", "203.0.113.7", 1), ("a", "203.0.113.7", 2))
    assert classify_mapping(["10.0.0.5"], 1, same).kind == UNKNOWN


def test_a_public_address_at_another_port_is_a_nat():
    # our own IP but a rewritten port: something in between maps ports (a firewall doing NAT)
    v = classify_mapping(["10.0.0.5"], 4001, obs(("a", "10.0.0.5", 6000), ("b", "10.0.0.5", 6001)))
    assert v.kind == SYMMETRIC


def test_parse_ip_tcp():
    assert parse_ip_tcp("/ip4/1.2.3.4/tcp/4001/p2p/12D3") == ("1.2.3.4", 4001)
    assert parse_ip_tcp("/ip6/::1/tcp/80") == ("::1", 80)
    for bad in ("/ip4/1.2.3.4/udp/4001", "/ip4/1.2.3.4/tcp/x", "/ip4/1.2.3.4/tcp/0", "garbage", "/dns/a/tcp/1"):
        assert parse_ip_tcp(bad) is None


def test_circuit_peer_is_the_last_peer_id():
    assert circuit_peer("/ip4/1.2.3.4/tcp/1/p2p/RELAY/p2p-circuit/p2p/TARGET") == "TARGET"
    assert circuit_peer("/ip4/1.2.3.4/tcp/1/p2p/RELAY") is None
    assert circuit_peer("/ip4/1.2.3.4/tcp/1/p2p/RELAY/p2p-circuit/p2p/") is None


def test_backoff_doubles_to_its_cap():
    assert [backoff_s(i, 1.0, 5.0) for i in range(5)] == [0.0, 1.0, 2.0, 4.0, 5.0]
    assert backoff_s(3, 0.0, 0.0) == 0.0


def test_a_punch_budget_is_its_attempts_deadlines_and_backoffs():
    assert punch_budget_s(1, 6.5, 1.0, 8.0) == 6.5
    assert punch_budget_s(3, 6.5, 1.0, 8.0) == 6.5 * 3 + 1.0 + 2.0
    assert punch_budget_s(5, 2.0, 1.0, 3.0) == 2.0 * 5 + 1.0 + 2.0 + 3.0 + 3.0


def test_a_nodes_default_punch_with_all_its_retries_answers_the_learner_in_time():
    """The node's plain dial and then every attempt of a default punch fit the window it gives
    a punch request, which ends before the host's handler deadline: a punch that keeps failing
    still uses its last attempt, and the learner still hears the outcome."""
    from node_agents.links import LAN_DIAL_TIMEOUT_S, PUNCH_TIMEOUT_S
    from swarm.host_config import HostConfig

    cfg = NatConfig()
    budget = punch_budget_s(cfg.punch_attempts, cfg.punch_timeout_s, cfg.punch_backoff_s, cfg.punch_backoff_max_s)
    assert cfg.punch_attempts >= 3
    assert LAN_DIAL_TIMEOUT_S + budget <= PUNCH_TIMEOUT_S < HostConfig().handler_timeout_s


def test_doctor_roles_and_exit_codes():
    r = doctor_role(PUBLIC, True, None)
    assert (r.role, r.stage, r.exit_code) == ("interior relay", True, 0)
    r = doctor_role(EIM, False, True)
    assert (r.role, r.stage, r.exit_code) == ("interior relay", True, 0) and "hole punch worked" in r.why
    r = doctor_role(SYMMETRIC, False, False)
    assert (r.role, r.exit_code) == ("leaf", 1) and "symmetric" in r.why and "forward" in r.why
    r = doctor_role(EIM, False, False)
    assert (r.role, r.exit_code) == ("leaf", 1) and "punch failed" in r.why
    r = doctor_role(EIM, False, None)  # the mapping says punchable, no punch could be tried
    assert (r.role, r.exit_code) == ("interior relay", 0) and "should work" in r.why and "none could be tried" in r.why
    r = doctor_role(UNKNOWN, False, None)
    assert (r.role, r.exit_code) == ("leaf", 1) and "no hole punch" in r.why
    assert doctor_role(UNKNOWN, None, None).exit_code == 2


def test_punch_book_keeps_the_latest_outcome_per_unordered_pair():
    book = PunchBook(keep=3)
    book.record(PunchOutcome("a", "b", False, FAILED, 3, 20.0, "timeout"))
    assert not book.can_link("b", "a")
    book.record(PunchOutcome("b", "a", True, PUNCHED, 1, 0.4))
    assert book.can_link("a", "b") and book.latest("a", "b").how == PUNCHED
    book.record(PunchOutcome("a", "c", True, ALREADY, 0, 0.0))
    book.record(PunchOutcome("c", "d", False, FAILED, 1, 8.0, "x"))
    assert [r[:3] for r in book.results()] == [("b", "a", True), ("a", "c", True), ("c", "d", False)]
    assert book.results()[-1] == ("c", "d", False, "x")


@pytest.mark.parametrize("bad", [dict(relay_max_circuits=0), dict(punch_attempts=0), dict(punch_timeout_s=0),
                                 dict(punch_backoff_s=5.0, punch_backoff_max_s=1.0)])
def test_nat_config_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        NatConfig(**bad)


def test_admit_probe_keeps_a_sliding_window():
    times: list[float] = []
    assert [admit_probe(times, t, 60.0, 2) for t in (0.0, 1.0, 2.0)] == [True, True, False]
    assert admit_probe(times, 60.5, 60.0, 2) and times == [1.0, 60.5]
