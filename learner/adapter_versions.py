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

    def __contains__(self, version: int) -> bool:
        return version in self.replies

    def add(self, reply: AdapterReply) -> None:
        """Publish ``reply``; the oldest versions beyond ``keep`` are dropped."""
        self.replies[reply.version] = reply
        for v in sorted(self.replies)[:-self.keep]:
            del self.replies[v]
            self.published.pop(v, None)

    def replace(self, reply: AdapterReply) -> None:
        """Serve ``reply`` for its version from now on, if that version is still kept. The reply
        it replaces stays known (:meth:`as_published`): a node that fetched that version directly
        before the replacement holds it."""
        old = self.replies.get(reply.version)
        if old is not None:
            self.replies[reply.version] = reply
            self.published.setdefault(reply.version, old)

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
