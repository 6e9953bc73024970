"""The puller's decisions, pure: which chunks to ask a peer for, how many, and its settings.

Every peer is asked for chunks that are missing, not asked of another peer at the moment and
named by the peer's have-map; each scan starts at a random offset, so pullers soon hold
different chunks to trade. A peer's batch follows its measured rate. The anchor, when asked
last, gets only what no live holder's have-map names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PullSettings:
    #: Most chunks asked for in one request (each peer's batch adapts below it).
    batch: int = 8
    #: Aimed-for duration (s) of one request (slow links: small requests, so one slow reply
    #: never holds many chunks hostage and never runs into the timeout).
    target_request_s: float = 3.0
    #: Deadline (s) of one chunk request (opening the stream, writing, the whole reply).
    request_timeout_s: float = 30.0
    #: Deadline (s) of dialling one holder (all its addresses).
    dial_timeout_s: float = 30.0
    #: How often (s) holders are asked for again and progress is reported.
    holder_refresh_s: float = 2.0
    #: Pause (s) before asking a peer again that had nothing this peer needs.
    empty_backoff_s: float = 0.5
    #: Failed requests in a row after which a peer is dropped (until the next refresh).
    max_failures: int = 3
    #: Give up after this long (s) without a new chunk.
    give_up_s: float = 120.0
    #: Most holders pulled from at once (the anchor not counted).
    max_peers: int = 64
    #: With ``anchor_last``: longest wait (s) for the holders' first have-maps before the anchor
    #: is asked for what none of them holds.
    probe_wait_s: float = 2.0


#: A request should last at least this many round trips of its link: the pause of one round
#: trip between a reply and the next request then costs at most about 1/20 of the link's rate.
RTTS_PER_REQUEST = 20


def next_batch(rate_bps: float, chunk_bytes: int, target_s: float, most: int, rtt_s: float = 0.0) -> int:
    """Chunks to ask for next from a peer that delivered ``rate_bps`` (bytes/s) so far:
    about ``target_s`` worth, at least 1 and at most ``most``; on a long link (round trip
    ``rtt_s``) at least ``RTTS_PER_REQUEST`` round trips' worth, past ``most`` if need be (the
    caller still caps a request at the protocol's largest)."""
    if rate_bps <= 0:
        return 1
    chunk = max(1, chunk_bytes)
    n = min(most, int(rate_bps * target_s / chunk))
    if rtt_s > 0:
        n = max(n, int(rate_bps * RTTS_PER_REQUEST * rtt_s / chunk))
    return max(1, n)


def pick_chunks(missing: list[int], in_flight: set[int], peer_has: set[int] | None, batch: int,
                start: int = 0) -> list[int]:
    """The next chunks to ask one peer for: missing ones not asked of anyone else and held by
    the peer (``None``: it holds everything), scanning from ``start`` (wrapping around), so
    pullers that start at different offsets soon hold different chunks to trade."""
    if batch < 1:
        return []
    pivot = next((k for k, i in enumerate(missing) if i >= start), len(missing))
    out = []
    for i in missing[pivot:] + missing[:pivot]:
        if i in in_flight or (peer_has is not None and i not in peer_has):
            continue
        out.append(i)
        if len(out) == batch:
            break
    return out


def for_anchor(wanted: list[int], holder_haves: list[set[int]]) -> list[int]:
    """What the anchor may be asked for when it is asked last: the ``wanted`` chunks that none
    of the live holders (their have-maps ``holder_haves``) holds."""
    held = set().union(*holder_haves)
    return [i for i in wanted if i not in held]
