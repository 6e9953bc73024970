"""The pure parts of exact verification (``learner/replay.py``): declared numerics, whether the
learner reproduces them, the comparison and the budget; and the work ledger (``learner/ledger.py``)."""

from __future__ import annotations

import math

import pytest
import trio

from learner.coordinator import Coordinator, Limits
from learner.ledger import WorkLedger
from learner.config import ReplayConfig
from learner.replay import ReplayBudget, compare_group, numerics_of, replay_numerics
from learner.service import LearnerService, SamplingDefaults, ServiceSettings
from swarm.config import ConfigError
from swarm.proto.hello import Hello

SHA = "ab" * 32
EXTRA = {"llama_build": "llama-cpp-python 0.3.36 | CPU : AVX2 = 1", "gguf_sha256": SHA, "max_group": "8",
         "n_batch": "512", "n_ctx": "2048", "kv_type": "f16", "flash_attn": "auto", "kv_unified": "0",
         "n_threads": "2", "cores": "2"}


def test_numerics_are_read_from_a_llamacpp_hello():
    n = numerics_of("llamacpp", EXTRA)
    assert n is not None and n.max_group == 8 and n.n_ctx == 2048 and n.kv_unified is False
    assert n.layout() == (2, 8, 512, 2048, "f16", "auto", False)


def replay_as(extra: dict, cfg: ReplayConfig = ReplayConfig(), build: str = EXTRA["llama_build"], sha: str = SHA,
              group: int = 8, prompt: int = 120, max_tokens: int = 64):
    return replay_numerics(numerics_of("llamacpp", extra), build, sha, cfg, group, prompt, max_tokens)


def test_the_learner_replays_within_its_own_bounds_whatever_a_node_declares():
    r = replay_as(EXTRA)
    assert r is not None and r.n_threads == 2 and r.max_group == 8 and r.n_batch == 512 and r.n_ctx == 1024
    assert replay_as(EXTRA, build="llama-cpp-python 0.3.36 | CPU : AVX512 = 1") is None  # another build
    assert replay_as(EXTRA, sha="cd" * 32) is None  # another GGUF (quantisation)
    assert replay_numerics(None, EXTRA["llama_build"], SHA, ReplayConfig(), 8, 120, 64) is None
    # the most expensive layout a hello can declare costs what the learner's own settings allow:
    # 64 x 131072 cells and 8192-token chunks decode a group of 8 with a 120-token prompt exactly as
    # 8 x 1024 cells and one 2048-token chunk do (measured: docs/benchmarks.md, "Exact replay")
    big = replay_as({**EXTRA, "n_ctx": "131072", "max_group": "64", "n_batch": "8192"})
    assert big is not None and (big.n_ctx, big.max_group, big.n_batch) == (1024, 8, 2048)
    assert big.n_ctx * big.max_group <= ReplayConfig().max_kv_cells
    # ... unless the node decoded a prompt in chunks the learner will not allocate, or had room it lacks
    assert replay_as({**EXTRA, "n_batch": "8192"}, prompt=4000, max_tokens=64) is None
    assert replay_as(EXTRA, prompt=1000, max_tokens=64) is None
    small = replay_as({**EXTRA, "n_ctx": "256"}, prompt=200, max_tokens=64)  # it cut completions short
    assert small is not None and small.n_ctx == 256
    # a group decoded in chunks smaller than the group keeps its chunks (rows decoded together)
    assert replay_as({**EXTRA, "max_group": "4"}).max_group == 4
    assert replay_as({**EXTRA, "max_group": "16", "n_batch": "4"}).n_batch == 16  # the node's prompt chunk
    # threads: the node's own count, up to the learner's bound
    assert replay_as({**EXTRA, "n_threads": "65"}) is None
    assert replay_as({**EXTRA, "n_threads": "65"}, ReplayConfig(max_threads=128)).n_threads == 65


@pytest.mark.parametrize("change", [
    {"max_group": "0"}, {"max_group": "65"}, {"max_group": "-1"}, {"max_group": "8.0"}, {"max_group": "1e3"},
    {"n_batch": "99999999"}, {"n_ctx": "8"}, {"gguf_sha256": "AB" * 32}, {"gguf_sha256": "ab"},
    {"kv_type": "q8_0"}, {"flash_attn": "yes"}, {"kv_unified": "true"}, {"llama_build": ""},
    {"llama_build": "x" * 600}, {"max_group": 8}, {"n_threads": "0"}, {"n_threads": "257"},
])
def test_odd_declarations_make_a_node_not_replayable_never_an_error(change):
    assert numerics_of("llamacpp", {**EXTRA, **change}) is None


def test_only_llamacpp_nodes_with_every_field_are_replayable():
    assert numerics_of("torch", EXTRA) is None and numerics_of("mlx", EXTRA) is None
    for key in ("llama_build", "gguf_sha256", "kv_type", "n_threads"):
        assert numerics_of("llamacpp", {k: v for k, v in EXTRA.items() if k != key}) is None
    assert numerics_of("llamacpp", "not a dict") is None


def group(*tokens):
    return [(list(t), [-0.5] * len(t)) for t in tokens]


def test_identical_groups_pass_and_any_token_difference_fails():
    g = group([1, 2, 3], [4, 5])
    assert compare_group(g, group([1, 2, 3], [4, 5]), 1e-4) is None
    why = compare_group(group([1, 2, 3], [4, 9, 9, 9, 5]), g, 1e-4)
    assert why is not None and "completion 1 leaves the replay at token 1" in why and "pushed 9" in why
    assert "token 3" in compare_group(group([1, 2, 3, 4]), group([1, 2, 3]), 1e-4)  # one token too many
    assert "pushed end" in compare_group(group([1, 2]), group([1, 2, 3]), 1e-4)  # cut short
    assert "2 completions pushed" in compare_group(g, group([1, 2, 3]), 1e-4)


def test_log_probs_must_agree_within_the_bound_nan_included():
    g = group([1, 2, 3])
    assert compare_group([([1, 2, 3], [-0.5, -0.50005, -0.5])], g, 1e-4) is None
    assert "log-probs differ" in compare_group([([1, 2, 3], [-0.5, -0.4, -0.5])], g, 1e-4)
    assert "log-probs differ" in compare_group([([1, 2, 3], [-0.5, math.nan, -0.5])], g, 1e-4)
    assert "log-probs differ" in compare_group([([1, 2, 3], [-0.5, -0.5])], g, 1e-4)


def test_the_budget_charges_every_check_new_peers_included_and_keeps_a_burst():
    b = ReplayBudget(budget_s_per_step=10.0, keep_steps=2)  # starts with 20 s of credit
    b.group_s = 4.0  # one check costs 4 s
    assert b.allow("new") and b.allow("new") and b.charged == 2  # first groups are charged too
    allowed = sum(b.allow(f"stranger{i}") for i in range(20))
    assert allowed == 3 and not b.allow("old")  # 20 s pays for 5 checks, whoever asks
    b.new_step()  # +10 s of credit
    assert b.allow("old") and b.allow("old") and b.allow("old") and not b.allow("old")
    for _ in range(5):
        b.new_step()
    assert b.credit == 20.0  # never more than keep_steps steps' worth
    small = ReplayBudget(budget_s_per_step=2.0, group_s=8.0, credit=0.0)  # less than one replay: one every 4 steps
    allowed_per_step = []
    for _ in range(12):
        small.new_step()
        allowed_per_step.append(sum(small.allow("old") for _ in range(3)))
    assert allowed_per_step == [1, 0, 0, 0] * 3
    b = ReplayBudget(budget_s_per_step=5.0)
    assert b.allow("p") and b.credit == 5.0
    b.measured(7.0)  # the check took 7 s: charged after the fact, a debt
    assert b.credit == -2.0 and not b.allow("p")
    unlimited = ReplayBudget(0.0)
    unlimited.measured(100.0)
    assert all(unlimited.allow("p") for _ in range(50))


def test_replay_config_is_checked():
    ReplayConfig()
    for bad in (dict(budget_s_per_step=-1), dict(max_logprob_diff=-1.0), dict(contexts=0), dict(max_kv_cells=0),
                dict(budget_s_per_step=math.inf)):
        with pytest.raises(ConfigError):
            ReplayConfig(**bad)


def test_the_ledger_counts_each_nodes_work_and_keeps_untrusted_nodes():
    led = WorkLedger()
    led.pushed("a", "llamacpp", accepted=3, rejected=1, tokens=400)
    led.pushed("b", "torch", accepted=2, rejected=0, tokens=100)
    led.checked("a", "replay", True, "g1")
    led.checked("a", "replay", True, "g2")
    led.checked("a", "draw", True, "g1")
    led.checked("a", "draw", True, "g3")
    led.checked("b", "stats", False)
    led.checked("b", "skipped", True)
    led.untrusted("b", "unverified: group g1: claims")
    led.trained({"a": 3}, {"a": ["g1", "g2", "g3"]})
    s = led.summary()
    assert s["a"]["groups_pushed"] == 4 and s["a"]["groups_rejected"] == 1 and s["a"]["groups_trained"] == 3
    assert s["a"]["verified"] == {"replay": 2, "draw": 2} and s["a"]["verified_groups"] == 4
    assert s["a"]["tokens_generated"] == 400 and not led.group_checks
    assert s["a"]["trained_by"] == {"draw+replay": 1, "replay": 1, "draw": 1}  # which checks each trained group passed
    assert s["b"]["failed"] == {"stats": 1} and s["b"]["verified_groups"] == 0 and s["b"]["untrusted"].startswith("unverified")
    assert led.totals() == {"trained": 3, "verified_replay": 2, "verified_draw": 2, "failed_stats": 1, "verified_skipped": 1}
    with pytest.raises(ValueError):
        led.checked("a", "vibes", True)


def test_the_ledger_is_bounded_and_forgets_refused_strangers_first():
    led = WorkLedger(max_peers=3)
    led.pushed("worker", "llamacpp", 5, 0, 10)
    for i in range(10):
        led.pushed(f"stranger{i}", "llamacpp", 0, 1, 0)
    assert len(led.nodes) == 3 and "worker" in led.nodes


def test_the_report_and_the_dashboard_show_each_nodes_checked_work(tmp_path):
    """``swarm-learner report`` reads the ledger from ``swarm.json`` (an untrusted node, gone from
    the nodes, keeps its row) and the dashboard's node rows carry the same columns."""
    from types import SimpleNamespace

    from learner.report import report_nodes
    from learner.web.page import nodes_html
    from learner.web.state import nodes_view

    led = WorkLedger()
    led.pushed("honest-peer-aaaaaa", "llamacpp", 4, 0, 900)
    for _ in range(3):
        led.checked("honest-peer-aaaaaa", "replay", True)
    led.checked("honest-peer-aaaaaa", "stats", True)
    led.checked("honest-peer-aaaaaa", "draw", True, "g1")
    led.trained({"honest-peer-aaaaaa": 4}, {"honest-peer-aaaaaa": ["g1"]})
    led.pushed("cheat-peer-bbbbbb", "llamacpp", 1, 0, 200)
    led.checked("cheat-peer-bbbbbb", "replay", False)
    led.untrusted("cheat-peer-bbbbbb", "unverified: group g7: replay: completion 0 leaves the replay at token 1")
    swarm = {"nodes": {"honest-peer-aaaaaa": {"backend": "llamacpp", "device": "cpu", "groups": 4}}, "work": led.summary()}
    rows = {r["peer_id"]: r for r in report_nodes(swarm)}
    assert rows["honest-peer-aaaaaa"]["verified"] == "draw 1, replay 3, stats 1" and rows["honest-peer-aaaaaa"]["trained_groups"] == 4
    assert rows["honest-peer-aaaaaa"]["trained_by"] == "draw 1"  # which checks its trained groups passed
    cheat = rows["cheat-peer-bbbbbb"]
    assert cheat["failed_checks"] == "replay 1" and cheat["trusted"].startswith("no: unverified") and cheat["trained_groups"] == 0
    html = nodes_html(list(rows.values()))
    assert "verified by" in html and "replay 3, stats 1" in html and "failed checks" in html and "trained after" in html

    coord = Coordinator(Limits(group_size=2, max_tokens=8, vocab_size=100), lease_timeout_s=60.0, groups_per_lease=1)
    service = LearnerService(coord, ServiceSettings(SamplingDefaults(1.0, 1.0, 8, 0), group_size=2, run_id="r",
                                                    model_name="m", long_poll_s=1.0), ledger=led)
    hello = Hello(backend="llamacpp", device="cpu", memory_bytes=0, tokens_per_s=0.0)
    trio.run(service.on_hello, hello, "honest-peer-aaaaaa")
    service.roster.record_push("honest-peer-aaaaaa", 4, 8, 0, 900, 1.0)
    (row,) = nodes_view(service.statistics(), now=1.0)
    assert row["tokens_per_s"] == 900.0 and row["rollouts"] == 8
    assert row["verified"] == "draw 1, replay 3, stats 1" and row["trained_groups"] == 4 and row["failed_checks"] == ""


def test_a_chosen_group_is_replayed_with_the_numerics_declared_when_it_was_picked():
    """A node that says hello again with other settings before its check is replayed as it was."""
    from types import SimpleNamespace

    from learner.replay_llamacpp import LlamaCppReplay
    from learner.work_desk import SamplingDefaults

    declared = {"p": numerics_of("llamacpp", EXTRA)}
    replay = LlamaCppReplay(ReplayConfig(), "unused.gguf", SamplingDefaults(1.0, 1.0, 8, 0),
                            numerics_of=declared.get, adapter_of=lambda v: None,
                            build=EXTRA["llama_build"], gguf_sha256=SHA)
    result = SimpleNamespace(group_id="g1", version=0, completions=[SimpleNamespace(token_ids=[1], logprobs=[-1.0], mask=[])])
    assert replay.choose("p", result)
    multi = SimpleNamespace(group_id="g2", version=0, completions=[SimpleNamespace(token_ids=[1], logprobs=[0.0], mask=[1])])
    assert not replay.choose("p", multi)  # multi-turn: not the model's alone to replay
    assert not replay.choose("stranger", result)
    declared["p"] = numerics_of("llamacpp", {**EXTRA, "n_threads": "4"})  # a new hello
    seen = []
    replay.replay = lambda n, gid, prompt, size, version: seen.append(n.n_threads) or [([1], [-1.0])]
    assert replay.check_groups([("p", "g1", [1, 2], result)]) == [None]
    assert seen == [2]  # as declared when picked, not as now
    declared["p"] = numerics_of("llamacpp", {**EXTRA, "n_threads": "65"})  # beyond the learner's bound
    assert not replay.choose("p", result) and replay.can_replay("p", result, 2) is None
