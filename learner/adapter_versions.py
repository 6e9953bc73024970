"""The adapter versions the learner serves: the newest few published replies, kept for nodes that
are a little behind. The learner service adds each new version; the dissemination service
replaces a version's reply by the decoded tensors every pushed node holds, so a direct fetch
and a push give bit-identical adapters."""

from __future__ import annotations

from swarm.proto.adapter import AdapterReply

#: How many published adapter versions are kept for nodes that are a little behind.
KEEP_ADAPTER_VERSIONS = 4


class AdapterVersions:
    def __init__(self, keep: int = KEEP_ADAPTER_VERSIONS) -> None:
        if keep < 1:
            raise ValueError("keep at least one adapter version")
        self.keep = keep
        self.replies: dict[int, AdapterReply] = {}
        #: Replaced replies, per version still kept (see :meth:`replace`).
        self.published: dict[int, AdapterReply] = {}
        #: :meth:`held_error` per version, once computed.
        self._held_error: dict[int, float] = {}

    def __contains__(self, version: int) -> bool:
        return version in self.replies

    def add(self, reply: AdapterReply) -> None:
        """Publish ``reply``; the oldest versions beyond ``keep`` are dropped."""
        self.replies[reply.version] = reply
        for v in sorted(self.replies)[:-self.keep]:
            del self.replies[v]
            self.published.pop(v, None)
            self._held_error.pop(v, None)

    def replace(self, reply: AdapterReply) -> None:
        """Serve ``reply`` for its version from now on, if that version is still kept. The reply
        it replaces stays known (:meth:`as_published`): a node that fetched that version directly
        before the replacement holds it."""
        old = self.replies.get(reply.version)
        if old is not None:
            self.replies[reply.version] = reply
            self.published.setdefault(reply.version, old)
            self._held_error.pop(reply.version, None)

    def held_error(self, version: int) -> float:
        """How far the tensors nodes hold for ``version`` (the served reply) are from the ones the
        learner published first (its trainer's own): the relative L2 distance over all tensors; 0.0
        when the reply was never replaced, or the version is not kept. A lossy codec makes it
        nonzero (whole fp16 about 4e-4, an int3 delta a few percent: ``docs/benchmarks.md``)."""
        served, published = self.replies.get(version), self.published.get(version)  # read by the verify worker
        if served is None or published is None:
            return 0.0
        if version not in self._held_error:
            import numpy as np

            held, first = served.to_adapter().tensors, published.to_adapter().tensors
            diff = sum(float(np.sum((held[k].astype(np.float64) - first[k]) ** 2)) for k in first if k in held)
            norm = sum(float(np.sum(first[k].astype(np.float64) ** 2)) for k in first)
            missing = set(first) ^ set(held)
            self._held_error[version] = float("inf") if missing else (diff / norm) ** 0.5 if norm else (diff ** 0.5)
        return self._held_error[version]

    def as_published(self, version: int) -> AdapterReply | None:
        """The reply first published for ``version`` if another one replaced it, else ``None``."""
        return self.published.get(version)

    def newest(self) -> int:
        """The newest version kept (0 before the first)."""
        return max(self.replies, default=0)

    def get(self, version: int) -> AdapterReply:
        """Version ``version`` (-1: the newest); ``LookupError`` saying what is kept otherwise."""
        if not self.replies:
            raise LookupError("no adapter published yet")
        version = max(self.replies) if version < 0 else version
        reply = self.replies.get(version)
        if reply is None:
            raise LookupError(f"adapter version {version} is not available (have {sorted(self.replies)})")
        return reply
