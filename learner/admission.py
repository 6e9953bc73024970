"""Who may join the run and how much each peer may ask: pure decisions plus a little state.

- ``open`` admission: anyone may join, with per-peer caps on leases held at once and on pushes
  per minute (``network.max_leases_per_peer``, ``network.max_pushes_per_min``).
- ``allowlist`` admission: peers listed in ``network.allowlist_file`` (one peer id a line, ``#``
  comments), or holders of a join token the operator minted with ``swarm-learner token``. The
  caps apply as well.

A join token is ``<payload>.<mac>`` (both base64url): the payload is JSON ``{"exp": unix
seconds, "peer": peer id or "", "n": nonce}`` and the MAC is HMAC-SHA256 over the payload with
a 32-byte secret kept beside the learner's identity key (``join_token.key``, created on first
use, mode 0600). A token bound to a peer id admits only that peer; an unbound one admits any
holder until it expires. Tokens are checked against the wall clock.

A peer that failed rollout verification (:mod:`learner.verify`) is marked untrusted and refused
for the rest of the run, whatever its token says.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from swarm.membership import TicketIssuer
from swarm.proto.membership import MembershipTicket

#: File name of the join-token secret inside the learner's key directory.
SECRET_FILE = "join_token.key"
#: Retry hint (s) sent to a peer refused for good (untrusted): effectively "do not come back".
UNTRUSTED_RETRY_S = 3600.0
#: Longest join token accepted, characters (a token is about 150).
MAX_TOKEN_CHARS = 1024
#: Most peers remembered for a join token shown before their hello (private runs).
MAX_TOKENED = 10_000


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_or_create_secret(key_dir: Path) -> bytes:
    """The join-token secret of the learner whose keys live in ``key_dir`` (created if missing)."""
    path = Path(key_dir) / SECRET_FILE
    if path.exists():
        secret = path.read_bytes()
        if len(secret) != 32:
            raise ValueError(f"{path}: a join-token secret is 32 bytes, found {len(secret)}")
        return secret
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path.read_bytes()


def mint_token(secret: bytes, expires_at: float, peer_id: str = "") -> str:
    """A join token valid until ``expires_at`` (unix seconds), for ``peer_id`` only if given."""
    payload = json.dumps({"exp": int(expires_at), "peer": peer_id, "n": secrets.token_hex(4)},
                         separators=(",", ":")).encode()
    mac = hmac.new(secret, payload, hashlib.sha256).digest()
    return f"{_b64(payload)}.{_b64(mac)}"


def check_token(token: str, secret: bytes, peer_id: str, now: float) -> str | None:
    """Why ``token`` does not admit ``peer_id`` at wall time ``now``; ``None`` if it does."""
    if not token:
        return "no join token"
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        return "malformed join token"
    body, mac = token.split(".")
    try:
        payload, given = _unb64(body), _unb64(mac)
    except ValueError:
        return "malformed join token"
    if not hmac.compare_digest(hmac.new(secret, payload, hashlib.sha256).digest(), given):
        return "join token not signed by this learner"
    try:
        claims = json.loads(payload)
        exp, peer = float(claims["exp"]), str(claims.get("peer", ""))
    except (ValueError, KeyError, TypeError):
        return "malformed join token"
    if now >= exp:
        return "join token expired"
    if peer and peer != peer_id:
        return "join token was minted for another peer"
    return None


def token_expiry(token: str) -> float:
    """The expiry (unix s) of a token :func:`check_token` accepted."""
    return float(json.loads(_unb64(token.split(".")[0]))["exp"])


def read_allowlist(path: Path) -> frozenset[str]:
    """Peer ids of an allowlist file: one a line; blank lines and ``#`` comments ignored."""
    ids = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            ids.add(line)
    return frozenset(ids)


@dataclass
class Decision:
    accepted: bool
    reason: str = ""
    retry_after_s: float = 0.0


@dataclass
class AdmissionPolicy:
    #: ``open`` or ``allowlist``.
    mode: str = "open"
    #: Allowlist mode: peer ids admitted without a token.
    allowlist: frozenset[str] = frozenset()
    #: Allowlist mode: secret that join tokens are checked with (``None``: tokens are refused).
    secret: bytes | None = None
    #: Most leases one peer may hold at once (0 = no cap).
    max_leases_per_peer: int = 0
    #: Most rollout pushes one peer may make in any 60 s (0 = no cap).
    max_pushes_per_min: int = 0
    #: Retry hint (s) for a peer refused at join (not on the list, bad token).
    refused_retry_s: float = 60.0
    #: Allowlist mode: serve the model, adapters, manifests and member addresses only to
    #: admitted peers (``network.private``; see :meth:`Admission.read_refusal`).
    private: bool = False


@dataclass
class Admission:
    """The policy plus what it needs to remember: untrusted peers and recent pushes."""

    policy: AdmissionPolicy
    #: Peer id -> why it is refused for the rest of the run.
    untrusted: dict[str, str] = field(default_factory=dict)
    #: Private runs: peers that showed a valid join token before their hello (with their model
    #: manifest request), by when the token expires; they may read until then.
    tokened: dict[str, float] = field(default_factory=dict)
    _pushes: dict[str, deque] = field(default_factory=dict)

    def read_refusal(self, peer_id: str, said_hello: bool, wall_now: float) -> str | None:
        """Why ``peer_id`` may not read the run's model, adapters, manifests or member addresses
        (None: it may). Only private runs refuse: a peer that said hello and was accepted, is on
        the allowlist, or showed a valid join token may read; an untrusted peer may not."""
        p = self.policy
        if not p.private:
            return None
        if peer_id in self.untrusted:
            return f"private run: untrusted for the rest of this run: {self.untrusted[peer_id]}"
        if said_hello or peer_id in p.allowlist or self.tokened.get(peer_id, 0.0) > wall_now:
            return None
        return ("private run: only admitted peers may read its model, adapters, manifests and member "
                "addresses (be on its allowlist or show a join token: swarm-node join --token)")

    def show_token(self, peer_id: str, token: str, wall_now: float) -> None:
        """A peer of a private run showed ``token`` before its hello: remember it if valid."""
        p = self.policy
        if not (p.private and token and p.secret is not None) or check_token(token, p.secret, peer_id, wall_now):
            return
        self.tokened[peer_id] = token_expiry(token)
        if len(self.tokened) > MAX_TOKENED:  # expired first, then the oldest shown
            for peer in [q for q, exp in self.tokened.items() if exp <= wall_now] or list(self.tokened)[:1]:
                self.tokened.pop(peer, None)

    def on_hello(self, peer_id: str, token: str, wall_now: float) -> Decision:
        if peer_id in self.untrusted:
            return Decision(False, f"untrusted for the rest of this run: {self.untrusted[peer_id]}", UNTRUSTED_RETRY_S)
        p = self.policy
        if p.mode == "open" or peer_id in p.allowlist:
            return Decision(True)
        if p.secret is None:
            return Decision(False, "not on this run's allowlist", p.refused_retry_s)
        reason = check_token(token, p.secret, peer_id, wall_now)
        if reason is not None:
            return Decision(False, f"not on this run's allowlist and {reason}", p.refused_retry_s)
        return Decision(True)

    def lease_refusal(self, peer_id: str, leases_held: int) -> str | None:
        """Why ``peer_id`` may not take another lease now, or ``None``."""
        if peer_id in self.untrusted:
            return "untrusted"
        cap = self.policy.max_leases_per_peer
        if cap and leases_held >= cap:
            return f"lease cap: {leases_held} lease(s) held, at most {cap}"
        return None

    def push_refusal(self, peer_id: str, now: float) -> str | None:
        """Record a push at ``now`` (monotonic s); why it is refused, or ``None``."""
        if peer_id in self.untrusted:
            return "untrusted"
        cap = self.policy.max_pushes_per_min
        if not cap:
            return None
        recent = self._pushes.setdefault(peer_id, deque())
        while recent and recent[0] <= now - 60.0:
            recent.popleft()
        if len(recent) >= cap:
            return f"push rate cap: at most {cap} pushes per minute"
        recent.append(now)
        return None

    def mark_untrusted(self, peer_id: str, reason: str) -> None:
        self.untrusted.setdefault(peer_id, reason)


def build_admission(network_cfg, key_dir: Path) -> Admission:
    """The admission state of a run from ``[network]`` settings (see ``learner/config.py``)."""
    n = network_cfg
    if n.admission not in ("open", "allowlist"):
        raise ValueError(f"network.admission must be 'open' or 'allowlist', not {n.admission!r}")
    allow = read_allowlist(Path(n.allowlist_file)) if n.allowlist_file else frozenset()
    secret = load_or_create_secret(key_dir) if n.admission == "allowlist" else None
    return Admission(AdmissionPolicy(mode=n.admission, allowlist=allow, secret=secret,
                                     max_leases_per_peer=n.max_leases_per_peer,
                                     max_pushes_per_min=n.max_pushes_per_min,
                                     refused_retry_s=n.refused_retry_s,
                                     private=bool(getattr(n, "private", False))))


class ReadAccess:
    """Who may read the run's model, adapters, manifests and member addresses, asked by the model
    server and the dissemination before they answer: :meth:`Admission.read_refusal` over the peers
    that said hello (``said_hello``). Without an admission (harnesses) everyone may. In a private
    run it also issues the membership tickets (:meth:`ticket`) that admitted peers show to nodes."""

    def __init__(self, admission: Admission | None, said_hello: Callable[[str], bool],
                 wall_clock: Callable[[], float] = time.time, issuer: TicketIssuer | None = None) -> None:
        self.admission = admission
        self.said_hello = said_hello
        self.wall_clock = wall_clock
        #: Signs membership tickets of the run (``swarm.membership``; None: none are issued).
        self.issuer = issuer

    @property
    def private(self) -> bool:
        return self.admission is not None and self.admission.policy.private

    def refusal(self, peer_id: str) -> str | None:
        """Why ``peer_id`` may not read (None: it may)."""
        if self.admission is None:
            return None
        return self.admission.read_refusal(peer_id, self.said_hello(peer_id), self.wall_clock())

    def allows(self, peer_id: str) -> bool:
        return self.refusal(peer_id) is None

    def show_token(self, peer_id: str, token: str) -> None:
        if self.admission is not None and token:
            self.admission.show_token(peer_id, token, self.wall_clock())

    def ticket(self, peer_id: str) -> MembershipTicket | None:
        """A fresh membership ticket for ``peer_id`` if the run is private and it may read (None:
        an open run, no issuer, or a refused peer)."""
        if not self.private or self.issuer is None or self.refusal(peer_id) is not None:
            return None
        return self.issuer.issue(peer_id, self.wall_clock())
