"""A run's identity (``NAME@PEERID``), the node's learner pins and the rules of which learner a
node accepts (pure, apart from the pin file)."""

from __future__ import annotations

import json

import pytest

from swarm.discovery.identity import (
    PINS_FILE, LearnerPins, LearnerRefused, LearnerTrust, PinError, RunIdentity, check_peer_id, join_command,
    split_run,
)

L = "12D3KooWKgAw6iPyzty22P3zECxDRnmrrQJAoYkTFWUhMktPY4gA"  # the learner
X = "12D3KooWKb4GXf8nXb2sW7yhQ6tCfqQreomcwLKZr9MhvGhrVR7c"  # an impostor


def test_text_form_round_trips_and_is_what_the_join_line_carries():
    ident = RunIdentity("arith-1", L)
    assert str(ident) == f"arith-1@{L}"
    assert RunIdentity.parse(str(ident)) == ident
    assert RunIdentity.parse(f"  arith-1@{L}\n") == ident  # pasted with whitespace
    assert join_command(ident, f"/ip4/192.0.2.1/tcp/4001/p2p/{L}") == \
        f"swarm-node join --run arith-1@{L} --bootstrap /ip4/192.0.2.1/tcp/4001/p2p/{L}"
    assert split_run(f"arith-1@{L}") == ("arith-1", L)
    assert split_run("arith-1") == ("arith-1", "")


@pytest.mark.parametrize("text, match", [
    ("arith-1", "expected NAME@PEERID"),
    (f"@{L}", "expected NAME@PEERID"),
    ("arith-1@", "expected NAME@PEERID"),
    (f"a b@{L}", "run name"),
    ("arith-1@12D3KooW0OIl", "base58"),  # 0, O, I, l are not base58
    ("arith-1@QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "does not embed its public key"),  # a sha256 id
    (f"arith-1@{L[:-3]}", "does not embed its public key"),  # truncated
])
def test_bad_identities_are_refused_with_the_reason(text, match):
    with pytest.raises(ValueError, match=match):
        RunIdentity.parse(text)


def test_peer_ids_of_real_hosts_pass():
    assert check_peer_id(L) == L and check_peer_id(X) == X


def test_pins_are_written_atomically_and_read_back(tmp_path):
    pins = LearnerPins.in_dir(tmp_path)
    assert pins.get("r") == ""
    assert pins.pin(RunIdentity("r", L)) == ""
    assert pins.pin(RunIdentity("r", L)) == L
    assert json.loads((tmp_path / PINS_FILE).read_text()) == {"r": L}
    assert LearnerPins.in_dir(tmp_path).get("r") == L
    assert pins.pin(RunIdentity("r", X)) == L  # replaced (what --run NAME@PEERID does)
    assert LearnerPins.in_dir(tmp_path).items() == {"r": X}
    assert [p.name for p in tmp_path.iterdir()] == [PINS_FILE]  # no temp file left


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", json.dumps({"r": "nope"}), json.dumps({"a b": L})])
def test_a_broken_pin_file_stops_the_node_and_names_the_file(tmp_path, content):
    (tmp_path / PINS_FILE).write_text(content)
    with pytest.raises(PinError, match=f"{PINS_FILE}.*fix or delete"):
        LearnerPins.in_dir(tmp_path)


# ------------------------------------------------------------------ which learner a node accepts


def trust(tmp_path, **kw):
    said: list[str] = []
    return LearnerTrust(LearnerPins.in_dir(tmp_path), say=said.append, **kw), said


def test_run_with_an_id_accepts_only_that_id_and_pins_it(tmp_path):
    LearnerPins.in_dir(tmp_path).pin(RunIdentity("r", X))
    t, said = trust(tmp_path, run="r", learner=L, how="--run")
    assert LearnerPins.in_dir(tmp_path).get("r") == L  # the command line re-pins, and says so
    assert any(f"replaces the pinned {X}" in s for s in said)
    assert not t.claim(X, "bootstrap peer P's run-info")
    assert t.claim(L, "the DHT provider record of L")
    with pytest.raises(LearnerRefused, match=f"refusing learner {X} for run 'r': this node accepts only {L}"):
        t.check("r", X)
    t.confirm("r", L)


def test_trust_on_first_use_pins_at_the_first_accepted_hello_and_refuses_others_later(tmp_path):
    t, said = trust(tmp_path, run="r")
    assert t.learner == "" and t.claim(L, "bootstrap peer B's run-info") and t.tentative
    assert not t.claim(X, "the DHT provider record of X")  # the first claim holds
    t.check("r", L)  # it answered a connection: no longer forgotten on a failed lookup
    t.forget_tentative()
    assert t.learner == L
    t.confirm("r", L)
    assert LearnerPins.in_dir(tmp_path).get("r") == L
    assert any("pinned learner" in s and "trust on first use" in s for s in said)
    # The next start of the node: only the pinned learner, whatever the network says.
    t2, said2 = trust(tmp_path, run="r")
    assert t2.learner == L and t2.how == "pinned"
    assert not t2.claim(X, "bootstrap peer B's run-info")
    assert not t2.claim(X, "bootstrap peer B's run-info")
    ignored = [s for s in said2 if s.startswith("ignoring")]
    assert len(ignored) == 1 and X in ignored[0] and f"accepts only {L} (pinned in" in ignored[0]  # said once


def test_an_unreached_tentative_learner_is_forgotten(tmp_path):
    t, _ = trust(tmp_path, run="r")
    assert t.claim(X, "bootstrap peer B's run-info")
    t.forget_tentative()
    assert t.learner == "" and t.claim(L, "bootstrap peer C's run-info") and t.learner == L


def test_a_learner_address_for_a_run_pinned_to_another_learner_is_refused(tmp_path):
    LearnerPins.in_dir(tmp_path).pin(RunIdentity("r", L))
    t, _ = trust(tmp_path, learner=X, how="--learner")  # --learner .../p2p/X, no --run
    t.learn_run("r")  # X says it is in run r
    with pytest.raises(LearnerRefused) as e:
        t.check("r", X)
    text = str(e.value)
    assert f"refusing learner {X} for run 'r'" in text and f"accepts only {L}" in text
    assert f"--run r@{X}" in text and PINS_FILE in text  # what to do
    assert LearnerPins.in_dir(tmp_path).get("r") == L


def test_a_learner_address_is_pinned_for_the_run_its_ack_names(tmp_path):
    t, said = trust(tmp_path, learner=L, how="--learner")
    t.check("", L)
    t.confirm("r", L)
    assert LearnerPins.in_dir(tmp_path).get("r") == L and any("given by --learner" in s for s in said)
    t.confirm("r2", L)  # the learner restarted into another run (no --run): followed and pinned
    assert LearnerPins.in_dir(tmp_path).items() == {"r": L, "r2": L}
