"""The hole-punch benchmark's pure parts: its cases and its table row."""

from __future__ import annotations

import pytest

from bench.holepunch import parse_cases, summarise


def test_cases_are_puncher_listener_pairs_of_known_kinds():
    assert parse_cases("eim:eim, public:symmetric") == [("eim", "eim"), ("public", "symmetric")]
    for bad in ("eim", "eim:cone", "full:eim"):
        with pytest.raises(ValueError, match="PUNCHER:LISTENER"):
            parse_cases(bad)


def test_a_row_counts_successes_and_times_only_successes():
    results = [{"ok": True, "seconds": s} for s in (0.3, 0.5, 0.4)]
    results += [{"ok": False, "seconds": 8.0, "reason": "no direct connection"},
                {"ok": False, "seconds": None, "reason": "PeerUnreachable: circuit"}]
    row = summarise("eim:eim", results)
    assert (row["attempts"], row["succeeded"], row["success_rate"]) == (5, 3, 0.6)
    assert (row["median_s"], row["max_s"], row["failed_after_s"]) == (0.4, 0.5, 8.0)
    assert row["failures"] == {"no direct connection": 1, "PeerUnreachable: circuit": 1}
    empty = summarise("x:y", [])
    assert empty["success_rate"] == 0.0 and empty["median_s"] is None
