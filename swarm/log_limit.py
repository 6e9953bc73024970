"""Log lines a peer can provoke, at most once per interval per peer and kind: a stranger or an
untrusted node that asks again every second must not fill the log (what it costs is bounded like
any other per-peer state: the oldest keys are forgotten first)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Hashable

#: Seconds between two lines of one kind about one peer.
EVERY_S = 60.0
#: Keys remembered (the oldest forgotten first).
MAX_KEYS = 4096


class LogLimit:
    """``allow(key)``: whether to log a line for ``key`` now; the lines held back meanwhile are
    counted and returned by the next allowed call (``suppressed``)."""

    def __init__(self, every_s: float = EVERY_S, max_keys: int = MAX_KEYS) -> None:
        self.every_s = every_s
        self.max_keys = max_keys
        self._last: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()

    def allow(self, key: Hashable, now: float | None = None) -> tuple[bool, int]:
        """(log it now, lines held back for ``key`` since the last one logged)."""
        now = time.monotonic() if now is None else now
        last = self._last.get(key)
        if last is not None and now - last[0] < self.every_s:
            self._last[key] = (last[0], last[1] + 1)
            return False, 0
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        return True, last[1] if last is not None else 0
