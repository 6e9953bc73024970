"""Link profiles as data: what each emulated host's access link does (rates, round trip,
jitter, loss), drawn per host from a stated distribution. Profiles are TOML files beside this
module (``home.toml``, ``zero.toml``) or any path; ``swarm-bench ... --wan PROFILE`` and the
netns tests take them by name.

Model (a star): every host has one access link; a packet from host ``i`` to host ``j`` crosses
``i``'s link up and ``j``'s link down, so the round trip between them is ``rtt_i + rtt_j`` (each
link adds half its ``rtt_ms`` each way) and the learner's own link is counted in every node's
RTT to it. Loss is per direction of a link: a lossy link drops that share of the packets that
cross it either way. Rates are shaped by ``tc tbf``; delay, jitter and loss by the user-space
emulator (:mod:`bench.wan.linkemu`).

Profile fields (all optional but ``[node]``)::

    description = "..."
    [learner]                 # the learner's link: fixed values
    up_mbit = 100.0
    down_mbit = 100.0
    rtt_ms = 2.0
    [node]                    # every other host's link
    rtt_to_learner_ms = [30, 150]   # spread over this range: evenly (dist "even", shuffled by
    dist = "even"                   # the seed) or uniform at random ("uniform")
    jitter_ms = 2.0
    up_mbit = [10, 20]        # one value, or [low, high] spread like the RTTs
    down_mbit = [50, 100]
    loss = 0.01               # on the links of a share of the nodes:
    lossy_share = 0.25        # every 1/share-th host by rank of RTT, the slowest first
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.wan.linkemu import Shape

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Link:
    """One emulated host's access link."""

    #: Upload rate (Mbit/s); 0 leaves it unshaped.
    up_mbit: float = 0.0
    #: Download rate (Mbit/s); 0 leaves it unshaped.
    down_mbit: float = 0.0
    #: Round trip the link adds (ms): half of it on the way out, half on the way in.
    rtt_ms: float = 0.0
    #: Jitter of each direction (ms): uniform in [-jitter, +jitter] per packet, order kept.
    jitter_ms: float = 0.0
    #: Share of packets dropped in each direction.
    loss: float = 0.0

    def __post_init__(self) -> None:
        if min(self.up_mbit, self.down_mbit, self.rtt_ms, self.jitter_ms) < 0 or not 0 <= self.loss < 1:
            raise ValueError(f"rates, rtt and jitter >= 0 and loss in [0, 1), got {self}")

    def shape(self) -> Shape:
        """What the emulator adds in each direction."""
        return Shape(self.rtt_ms / 2, min(self.jitter_ms, self.rtt_ms / 2), self.loss)

    def without_latency(self) -> "Link":
        """The same rates with no delay, jitter or loss: the zero-latency twin of a link."""
        return replace(self, rtt_ms=0.0, jitter_ms=0.0, loss=0.0)


def _spread(value: float | list, n: int, dist: str, rng: random.Random) -> list[float]:
    """``n`` values: ``value`` itself, or over ``[low, high]`` evenly (shuffled) or uniformly."""
    if isinstance(value, (int, float)):
        return [float(value)] * n
    if not (isinstance(value, list) and len(value) == 2 and value[0] <= value[1]):
        raise ValueError(f"want a number or [low, high], got {value!r}")
    low, high = float(value[0]), float(value[1])
    if dist == "uniform":
        return [rng.uniform(low, high) for _ in range(n)]
    if dist != "even":
        raise ValueError(f"dist must be 'even' or 'uniform', got {dist!r}")
    out = [low + (high - low) * (k / (n - 1) if n > 1 else 0.5) for k in range(n)]
    rng.shuffle(out)
    return out


@dataclass(frozen=True)
class Profile:
    """A named link profile (see the module docstring for the fields)."""

    name: str
    description: str = ""
    learner: Link = Link()
    node: dict = field(default_factory=dict)

    def links(self, n_nodes: int, seed: int = 0) -> list[Link]:
        """The learner's link, then ``n_nodes`` nodes' links drawn with ``seed`` (pure)."""
        rng = random.Random(seed)
        spec = dict(self.node)
        dist = str(spec.pop("dist", "even"))
        to_learner = _spread(spec.pop("rtt_to_learner_ms", 0.0), n_nodes, dist, rng)
        ups = _spread(spec.pop("up_mbit", 0.0), n_nodes, dist, rng)
        downs = _spread(spec.pop("down_mbit", 0.0), n_nodes, dist, rng)
        jitter = float(spec.pop("jitter_ms", 0.0))
        loss = float(spec.pop("loss", 0.0))
        share = float(spec.pop("lossy_share", 1.0 if loss else 0.0))
        if spec:
            raise ValueError(f"profile {self.name!r}: unknown [node] field(s) {sorted(spec)}")
        if not 0 <= share <= 1:
            raise ValueError(f"profile {self.name!r}: lossy_share must be in [0, 1], got {share}")
        # the lossy links: every 1/share-th node by RTT rank, the farthest first
        by_rtt = sorted(range(n_nodes), key=lambda k: -to_learner[k])
        lossy = {by_rtt[int(r / share)] for r in range(round(share * n_nodes))} if share else set()
        nodes = [Link(up_mbit=round(ups[k], 3), down_mbit=round(downs[k], 3),
                      rtt_ms=round(max(0.0, to_learner[k] - self.learner.rtt_ms), 3), jitter_ms=jitter,
                      loss=loss if k in lossy else 0.0) for k in range(n_nodes)]
        return [self.learner] + nodes


#: Keys of an inline profile (``"rtt=100,loss=0.01"``): path figures between any two hosts.
INLINE_KEYS = {"rtt": "rtt_ms", "loss": "loss", "jitter": "jitter_ms", "up": "up_mbit", "down": "down_mbit"}


def uniform_links(n_hosts: int, rtt_ms: float = 0.0, loss: float = 0.0, jitter_ms: float = 0.0,
                  up_mbit: float = 0.0, down_mbit: float = 0.0) -> list[Link]:
    """Every host the same link, so that any two hosts are ``rtt_ms`` apart and a packet between
    them is lost with probability ``loss`` (it crosses two links: each drops
    ``1 - sqrt(1 - loss)``; each adds half the jitter)."""
    per_link = 1.0 - (1.0 - loss) ** 0.5
    return [Link(up_mbit, down_mbit, rtt_ms / 2, jitter_ms / 2, per_link)] * n_hosts


def parse_inline(text: str) -> dict[str, float]:
    """``"rtt=100,loss=0.01"`` -> ``{"rtt_ms": 100.0, "loss": 0.01}`` (keys: :data:`INLINE_KEYS`)."""
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in INLINE_KEYS:
            raise ValueError(f"inline WAN profile {text!r}: want KEY=VALUE pairs with keys {', '.join(INLINE_KEYS)}")
        try:
            out[INLINE_KEYS[key.strip()]] = float(value)
        except ValueError:
            raise ValueError(f"inline WAN profile {text!r}: {key}={value!r} is not a number") from None
    return out


def profile_names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.toml"))


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (``home``, ``zero``: files beside this module) or by TOML path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = HERE / f"{name_or_path}.toml"
        if not path.exists():
            raise ValueError(f"no WAN profile {name_or_path!r}; known: {', '.join(profile_names())}, or a .toml path")
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"description", "learner", "node"}
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {sorted(unknown)}")
    try:
        learner = Link(**data.get("learner", {}))
    except TypeError as e:
        raise ValueError(f"{path}: [learner]: {e}") from None
    profile = Profile(path.stem, str(data.get("description", "")), learner, dict(data.get("node", {})))
    profile.links(4)  # fail now on a bad [node] table
    return profile
