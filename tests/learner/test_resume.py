"""Resume parts that need no model: metrics cut back to the checkpoint, the run id kept, the
in-flight problems saved with a checkpoint and issued again."""

import json

import pytest

from learner.checkpoint import load_open_problems, open_problem_refs, run_identity, save_state
from learner.coordinator import Coordinator, GroupSpec, Limits
from learner.metrics import MetricsWriter, read_metrics
from swarm.proto.rollouts import Completion, GroupResult


class FakeTrainer:
    def save_checkpoint(self, path):
        path.write_bytes(b"state")


def State(step):
    from learner.checkpoint import LoopState

    return LoopState(step=step, version=step)


def test_resume_cuts_metrics_rows_written_after_the_checkpoint(tmp_path):
    m = MetricsWriter(tmp_path)
    for step in (1, 2, 3):
        m.write({"step": step, "reward_mean": 0.1 * step})
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "rew')  # torn by a crash mid-write
    again = MetricsWriter(tmp_path, resume=True, resume_step=2)
    assert [r["step"] for r in again.rows] == [1, 2]
    again.write({"step": 3, "reward_mean": 0.5})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_a_torn_line_in_the_middle_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"st\n{"step": 2}\n')
    with pytest.raises(json.JSONDecodeError):
        read_metrics(tmp_path / "metrics.jsonl")


def test_run_id_is_kept_and_restarts_are_announced(tmp_path):
    assert run_identity(tmp_path, False, "abc") == ("abc", "abc")
    assert run_identity(tmp_path, True, "zzz") == ("abc", "abc~1")
    assert run_identity(tmp_path, True, "yyy") == ("abc", "abc~2")
    assert run_identity(tmp_path, False, "new") == ("new", "new")  # a fresh run in the same dir


def test_open_groups_are_saved_with_the_checkpoint(tmp_path):
    c = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=10, groups_per_lease=1)
    c.add_groups([GroupSpec(f"g{i}", [1], str(i)) for i in range(4)])
    c.lease("A", 1, now=0.0)
    c.refused_by.update({"g1": {"B"}, "g2": {"B"}})  # B's lease skips them: it takes g3
    lease = c.lease("B", 1, now=0.0)
    assert lease is not None and lease.group_ids == ["g3"]
    c.submit("B", lease.lease_id, [GroupResult("g3", 0, [Completion([5], [-0.1], "stop")] * 2)], now=1.0)
    c.take(["g3"])  # trained
    c.drop("g2", "stale")
    save_state(tmp_path, FakeTrainer(), State(3), open_problem_refs(c))
    assert load_open_problems(tmp_path) == ["0", "1"]  # leased and pending, in order
    save_state(tmp_path, FakeTrainer(), State(4))
    assert load_open_problems(tmp_path) == []
