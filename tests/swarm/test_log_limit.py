"""Log lines a peer can provoke (``swarm/log_limit.py``): once per interval per key, the lines held
back counted on the next one, the oldest keys forgotten first."""

from swarm.log_limit import LogLimit


def test_one_line_per_key_per_interval_with_the_count_of_those_held_back():
    limit = LogLimit(every_s=60.0, max_keys=2)
    assert limit.allow("a", now=0.0) == (True, 0)
    assert [limit.allow("a", now=t) for t in (1.0, 2.0, 59.0)] == [(False, 0)] * 3
    assert limit.allow("b", now=3.0) == (True, 0)  # another peer is not held back
    assert limit.allow("a", now=60.0) == (True, 3)
    limit.allow("c", now=61.0)  # a third key: the oldest ("b") is forgotten
    assert limit.allow("b", now=62.0) == (True, 0)
