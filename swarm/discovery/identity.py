"""A run's identity: its learner's peer id together with its name, and the node's pins.

A peer id (``12D3KooW...``) is self-certifying: it is the identity multihash of the peer's
Ed25519 public key, and a Noise handshake proves that the remote side holds that key. So a
node that knows the learner's peer id can tell the learner from anyone else on every
connection, and check every manifest the learner signs, without trusting whoever relayed it.

- :class:`RunIdentity` ``(run_name, learner)``: the text form ``<run name>@<peer id>`` is what
  the learner prints in its join line (:func:`join_command`) and what ``swarm-node join --run``
  takes; :meth:`RunIdentity.parse` explains what is wrong with a bad one.
- :class:`LearnerPins`: the node's ``learner_pins.json`` in its data dir, run name -> learner
  peer id, written atomically. A node told only a run name (or nothing, and a bootstrap
  address) learns the learner's id once and pins it (trust on first use); from then on it
  accepts no other learner for that run name.
- :class:`LearnerRefused`: the node must not serve this learner and retrying cannot help
  (a plain ``Exception``, not a ``SwarmError``, so retry loops do not swallow it).

Pure apart from the pin file's I/O.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from swarm.discovery.keys import check_run_name

log = logging.getLogger(__name__)

#: The pin file in a node's data dir.
PINS_FILE = "learner_pins.json"
#: Longest peer id accepted (an Ed25519 one is 52 characters).
MAX_PEER_ID = 128
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class LearnerRefused(Exception):
    """This learner is not the one the node was told (or has pinned) for the run: fatal."""


class PinError(Exception):
    """The pin file cannot be read or written (the message names the file)."""


def _b58decode(text: str) -> bytes:
    n = 0
    for ch in text:
        i = _B58.find(ch)
        if i < 0:
            raise ValueError(f"{ch!r} is not a base58 character")
        n = n * 58 + i
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    return b"\0" * (len(text) - len(text.lstrip("1"))) + body


def check_peer_id(peer_id: str) -> str:
    """``peer_id`` if it is a base58 peer id that embeds its public key (identity multihash, as
    every echo-swarm peer's Ed25519 id does); else ``ValueError`` saying why."""
    if not isinstance(peer_id, str) or not peer_id or len(peer_id) > MAX_PEER_ID:
        raise ValueError(f"peer id {peer_id!r}: expected a base58 peer id such as 12D3KooW...")
    try:
        raw = _b58decode(peer_id)
    except ValueError as e:
        raise ValueError(f"peer id {peer_id!r}: {e}") from None
    # identity multihash: code 0x00, then the length of the protobuf-encoded public key
    if len(raw) < 3 or raw[0] != 0x00 or raw[1] != len(raw) - 2:
        raise ValueError(f"peer id {peer_id!r} does not embed its public key (expected an Ed25519 id, 12D3KooW...)")
    return peer_id


@dataclass(frozen=True)
class RunIdentity:
    """A run: the learner's peer id and the run's name. ``str()`` gives ``<name>@<peer id>``."""

    run_name: str
    learner: str

    def __post_init__(self) -> None:
        check_run_name(self.run_name)
        check_peer_id(self.learner)

    def __str__(self) -> str:
        return f"{self.run_name}@{self.learner}"

    @classmethod
    def parse(cls, text: str) -> RunIdentity:
        """``NAME@PEERID`` -> a :class:`RunIdentity`; ``ValueError`` with the reason otherwise."""
        name, sep, peer = str(text).strip().rpartition("@")
        if not sep or not name or not peer:
            raise ValueError(f"run {text!r}: expected NAME@PEERID, the form the learner prints "
                             f"(e.g. arith-1@12D3KooW...)")
        try:
            return cls(name, peer)
        except ValueError as e:
            raise ValueError(f"run {text!r}: {e}") from None


def split_run(text: str) -> tuple[str, str]:
    """``--run``'s value -> (run name, learner peer id or ""): ``NAME@PEERID`` or a bare
    ``NAME`` (the learner then comes from ``--learner`` or is learnt once and pinned)."""
    if "@" in str(text):
        ident = RunIdentity.parse(text)
        return ident.run_name, ident.learner
    return check_run_name(text), ""


def join_command(identity: RunIdentity, bootstrap: str) -> str:
    """The command a node is started with, as the learner prints it."""
    return f"swarm-node join --run {identity} --bootstrap {bootstrap}"


class LearnerPins:
    """Run name -> learner peer id, kept in ``<data dir>/learner_pins.json``.

    A file that exists but cannot be read as such a map raises :class:`PinError`: guessing
    would silently drop a pin, so the node stops and says which file to fix or delete."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._pins = self._load()

    @classmethod
    def in_dir(cls, data_dir: Path) -> LearnerPins:
        return cls(Path(data_dir) / PINS_FILE)

    def _load(self) -> dict[str, str]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise PinError(f"cannot read the learner pins {self.path}: {e}; fix or delete the file") from e
        if not isinstance(data, dict):
            raise PinError(f"{self.path} is not a map of run name -> learner peer id; fix or delete the file")
        try:
            return {check_run_name(k): check_peer_id(v) for k, v in data.items()}
        except (ValueError, TypeError) as e:
            raise PinError(f"{self.path}: {e}; fix or delete the file") from e

    def get(self, run_name: str) -> str:
        """The pinned learner of ``run_name`` ("" when none)."""
        return self._pins.get(run_name, "")

    def pin(self, identity: RunIdentity) -> str:
        """Pin ``identity.learner`` for ``identity.run_name`` (replacing another pin); returns
        the id it replaced ("" if none, or the same). Written atomically (temp file + rename)."""
        old = self._pins.get(identity.run_name, "")
        if old == identity.learner:
            return old
        pins = {**self._pins, identity.run_name: identity.learner}
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
        except OSError as e:
            raise PinError(f"cannot write the learner pins {self.path}: {e}") from e
        self._pins = pins
        return old

    def items(self) -> dict[str, str]:
        return dict(self._pins)


def refusal(run_name: str, pinned: str, other: str, where: str, pins_path: Path | None) -> str:
    """The message of a node that refuses learner ``other`` for ``run_name`` because it
    accepts only ``pinned`` (``where``: how the node came to know ``pinned``)."""
    fix = (f"if {other} really is the run's learner now (its operator changed its key), start the node with "
           f"--run {run_name}@{other}" + (f" or delete {run_name!r} from {pins_path}" if pins_path else ""))
    return (f"refusing learner {other} for run {run_name!r}: this node accepts only {pinned} ({where}); "
            f"{fix}")


class LearnerTrust:
    """Which learner a node accepts, and when it pins one (the rules of ``docs/security.md``,
    "The learner's identity").

    - ``--run NAME@ID``: only ID, for NAME; pinned at once (replacing another pin, said aloud).
    - ``--learner .../p2p/ID``: only ID; pinned for the run it names, unless that run name is
      pinned to another learner (then :class:`LearnerRefused`).
    - neither (``--bootstrap``, maybe ``--run NAME``): the pinned learner of the run, once its
      name is known; without a pin, the learner the bootstrap peer names (or the only DHT
      provider of the run's learner key) is taken *tentatively*: only it is dialled (the Noise
      handshake proves its key), it is pinned when it accepts the node's hello, and it is
      forgotten if it cannot be reached before it ever answered.

    Claims naming another learner (run-info, DHT provider records) are ignored and said once.
    """

    def __init__(self, pins: LearnerPins | None, run: str = "", learner: str = "", how: str = "",
                 say=print) -> None:
        self.pins = pins
        self.say = say
        #: The run's name ("" until known).
        self.run = check_run_name(run) if run else ""
        #: The only learner accepted ("" until known).
        self.learner = check_peer_id(learner) if learner else ""
        #: How :attr:`learner` came to be known: ``--run``, ``--learner``, ``pinned`` or ``learnt ...``.
        self.how = how if learner else ""
        self._said: set[tuple[str, str]] = set()
        if self.learner and self.how == "--run" and self.pins is not None:
            old = self.pins.pin(RunIdentity(self.run, self.learner))
            if old and old != self.learner:
                say(f"run {self.run!r}: the learner given by --run, {self.learner}, replaces the pinned {old} "
                    f"in {self.pins.path}")
        elif self.run and not self.learner:
            self.learn_run(self.run)

    @property
    def tentative(self) -> bool:
        """Whether :attr:`learner` was learnt from the network and not yet confirmed."""
        return self.how.startswith("learnt")

    @property
    def pins_path(self) -> Path | None:
        return self.pins.path if self.pins is not None else None

    def pinned(self, run: str) -> str:
        return self.pins.get(run) if self.pins is not None and run else ""

    def learn_run(self, run: str) -> None:
        """The run's name became known (``--run`` or a bootstrap peer): take its pin if any."""
        self.run = check_run_name(run)
        pin = self.pinned(run)
        if pin and (not self.learner or self.tentative):
            self.learner, self.how = pin, "pinned"
            self.say(f"run {run!r}: accepting only learner {pin} (pinned in {self.pins_path})")

    def claim(self, learner: str, source: str) -> bool:
        """Whether a claim by ``source`` that ``learner`` is the run's learner may be used (its
        addresses dialled). Without a known learner the first claim is taken tentatively."""
        if not learner:
            return False
        if not self.learner:
            try:
                self.learner, self.how = check_peer_id(learner), f"learnt from {source}"
            except ValueError:
                return False
            self.say(f"{source} names {learner} as the learner of run {self.run!r}; "
                     f"it is pinned once it answers (trust on first use)")
            return True
        if learner == self.learner:
            return True
        self.ignored(learner, source)
        return False

    def ignored(self, learner: str, source: str) -> None:
        """Say (once per source and id) that a claim naming another learner is ignored."""
        text = (f"ignoring {source}: it names {learner} as the learner of run {self.run!r}, "
                f"but this node accepts only {self.learner} ({self.where()})")
        if (source, learner) in self._said:
            log.info("%s", text)
            return
        self._said.add((source, learner))
        self.say(text)

    def where(self) -> str:
        if self.how == "pinned":
            return f"pinned in {self.pins_path}"
        if self.how in ("--run", "--learner"):
            return f"given by {self.how}"
        return self.how or "unknown"

    def forget_tentative(self) -> None:
        """A tentative learner could not be reached: the next claim may name another."""
        if self.tentative:
            log.info("forgetting the tentative learner %s of run %r", self.learner, self.run)
            self.learner, self.how = "", ""

    def check(self, run: str, peer: str) -> None:
        """``peer`` answered a connection (the Noise handshake proved its key) and says it is the
        learner of ``run`` ("": not known yet). Raise :class:`LearnerRefused` if this node must not
        serve it: another peer than the accepted learner, or a run pinned to another learner."""
        if self.learner and peer != self.learner:
            raise LearnerRefused(refusal(run or self.run or "?", self.learner, peer, self.where(), self.pins_path))
        pin = self.pinned(run)
        if pin and pin != peer and self.how != "--run":
            raise LearnerRefused(refusal(run, pin, peer, f"pinned in {self.pins_path}", self.pins_path))
        if not self.learner:
            self.learner, self.how = check_peer_id(peer), "first answered"
        elif self.tentative:
            self.how = "first " + self.how  # it answered: no longer forgotten on a failed lookup

    def confirm(self, run: str, peer: str) -> None:
        """``peer``, the learner, accepted this node into ``run`` (its hello ack): :meth:`check`
        it, then pin it if the run has no pin yet (trust on first use, or ``--learner``)."""
        self.check(run, peer)
        if run != self.run:  # the learner moved to another run (no --run): follow it
            self.run = check_run_name(run)
        if self.pins is None or self.pinned(run) == peer:
            return
        how = "given by --learner" if self.how == "--learner" else "trust on first use"
        self.pins.pin(RunIdentity(run, peer))
        if self.how != "--run":
            self.how = "pinned"
        self.say(f"pinned learner {peer} for run {run!r} in {self.pins_path} ({how}); "
                 f"this node will accept no other learner for this run")
