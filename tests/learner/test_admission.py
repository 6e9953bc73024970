"""Admission decisions: join tokens, allowlist, per-peer caps, untrusted peers."""

import pytest

from learner.admission import (Admission, AdmissionPolicy, build_admission, check_token, load_or_create_secret,
                               mint_token, read_allowlist)
from learner.config import NetworkConfig

SECRET = bytes(range(32))


def test_token_admits_its_peer_until_it_expires():
    tok = mint_token(SECRET, expires_at=1000.0, peer_id="peerA")
    assert check_token(tok, SECRET, "peerA", now=999.0) is None
    assert check_token(tok, SECRET, "peerA", now=1000.0) == "join token expired"
    assert check_token(tok, SECRET, "peerB", now=10.0) == "join token was minted for another peer"
    unbound = mint_token(SECRET, expires_at=1000.0)
    assert check_token(unbound, SECRET, "anyone", now=10.0) is None


@pytest.mark.parametrize("bad", ["", "x", "a.b.c", "!!!.???", "e30.AAAA", "A" * 5000])
def test_malformed_tokens_are_refused_with_a_reason(bad):
    assert check_token(bad, SECRET, "p", now=0.0) is not None


def test_a_forged_or_altered_token_is_refused():
    other = mint_token(bytes(32), expires_at=1e12, peer_id="p")
    assert check_token(other, SECRET, "p", now=0.0) == "join token not signed by this learner"
    body, mac = mint_token(SECRET, expires_at=10.0, peer_id="p").split(".")
    import base64
    import json

    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims["exp"] = 1e12  # extend it
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    assert check_token(f"{forged}.{mac}", SECRET, "p", now=0.0) == "join token not signed by this learner"


def test_allowlist_mode_admits_listed_peers_and_token_holders(tmp_path):
    a = Admission(AdmissionPolicy(mode="allowlist", allowlist=frozenset({"listed"}), secret=SECRET,
                                  refused_retry_s=30.0))
    assert a.on_hello("listed", "", 0.0).accepted
    refused = a.on_hello("stranger", "", 0.0)
    assert not refused.accepted and "allowlist" in refused.reason and refused.retry_after_s == 30.0
    assert a.on_hello("stranger", mint_token(SECRET, 100.0, "stranger"), 0.0).accepted
    assert not Admission(AdmissionPolicy(mode="allowlist")).on_hello("x", "tok", 0.0).accepted


def test_open_mode_caps_leases_and_pushes_per_peer():
    a = Admission(AdmissionPolicy(mode="open", max_leases_per_peer=2, max_pushes_per_min=3))
    assert a.on_hello("p", "", 0.0).accepted
    assert a.lease_refusal("p", 1) is None and "lease cap" in a.lease_refusal("p", 2)
    assert [a.push_refusal("p", t) for t in (0.0, 1.0, 2.0)] == [None] * 3
    assert "push rate cap" in a.push_refusal("p", 3.0)
    assert a.push_refusal("q", 3.0) is None  # per peer
    assert a.push_refusal("p", 60.5) is None  # the window slides


def test_an_untrusted_peer_is_refused_for_the_rest_of_the_run():
    a = Admission(AdmissionPolicy(mode="open"))
    a.mark_untrusted("p", "unverified rollouts")
    d = a.on_hello("p", "", 0.0)
    assert not d.accepted and "unverified rollouts" in d.reason and d.retry_after_s >= 3600
    assert a.lease_refusal("p", 0) == "untrusted" and a.push_refusal("p", 0.0) == "untrusted"


def test_build_from_config(tmp_path):
    (tmp_path / "allow.txt").write_text("# operators\npeerA\n\npeerB  # laptop\n")
    assert read_allowlist(tmp_path / "allow.txt") == {"peerA", "peerB"}
    cfg = NetworkConfig(admission="allowlist", allowlist_file=str(tmp_path / "allow.txt"))
    a = build_admission(cfg, tmp_path / "keys")
    assert a.policy.secret == load_or_create_secret(tmp_path / "keys")  # created once, then read
    assert (tmp_path / "keys" / "join_token.key").stat().st_mode & 0o777 == 0o600
    assert a.on_hello("peerB", "", 0.0).accepted
    with pytest.raises(ValueError):
        build_admission(NetworkConfig(admission="closed"), tmp_path)
