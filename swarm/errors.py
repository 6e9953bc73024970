"""Errors raised by the swarm's network layer.

Everything that can go wrong on the wire maps to one of these (plus
:class:`swarm.wire.WireError` for messages that decode but break their schema), so callers
never need to know py-libp2p's own exception classes.

    SwarmError
    ├── FrameError           bytes that are not a valid frame (garbage, bad flags, bad msgpack)
    │   ├── FrameTooLarge    length header (or decompressed size) above the cap
    │   └── TruncatedFrame   the stream ended or was reset in the middle of a frame
    ├── EndOfStream          the stream ended cleanly *between* frames (not a failure)
    ├── RemoteError          the peer answered with an error envelope
    ├── PeerUnreachable      no connection / no stream could be opened to the peer
    └── SwarmTimeout         a network wait ran past its deadline (also a trio.TooSlowError)
"""

from __future__ import annotations

#: Longest error text put in an error envelope or read from one.
MAX_ERROR_CHARS = 500

import trio

from swarm.wire import WireError

__all__ = [
    "EndOfStream",
    "FrameError",
    "FrameTooLarge",
    "PeerUnreachable",
    "RemoteError",
    "SwarmError",
    "SwarmTimeout",
    "TruncatedFrame",
    "WireError",
]


class SwarmError(Exception):
    """Base class of the swarm's network errors."""


class FrameError(SwarmError):
    """The bytes on a stream do not form a valid frame."""


class FrameTooLarge(FrameError):
    """A frame's announced length, or its decompressed body, exceeds the configured cap."""


class TruncatedFrame(FrameError):
    """The stream ended (EOF or reset) after some but not all bytes of a frame.

    py-libp2p reports a killed peer exactly like a clean close (``StreamEOF``), so a frame
    cut short is the only sign of a crash and must be treated as a failure.
    """


class EndOfStream(SwarmError):
    """The stream ended cleanly before the first byte of a frame (no more frames)."""


class RemoteError(SwarmError):
    """The remote handler rejected the request; ``str(err)`` is the peer's reason."""

    def __init__(self, message: str, *, peer_id: str = "", protocol: str = "") -> None:
        super().__init__(message)
        self.peer_id = peer_id
        self.protocol = protocol


class PeerUnreachable(SwarmError):
    """No stream could be opened to the peer (not connected, dial failed, protocol refused)."""


class SwarmTimeout(SwarmError, trio.TooSlowError):
    """A network wait ran past its deadline.

    Subclasses :class:`trio.TooSlowError` so code written against plain
    ``trio.fail_after`` catches it too.
    """
