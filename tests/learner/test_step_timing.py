"""The learner step's time breakdown (``time_*`` fields): the clock, a whole step through
``learner.steps`` with a real trainer on a tiny model, the dissemination watch, the report table."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
import trio

from learner.roster import NodeRoster
from swarm.proto.hello import Hello
from learner.coordinator import CompletedGroup, GroupSpec
from learner.models import ResolvedModel
from learner.report import breakdown_markdown, step_breakdown
from learner.step_timing import CRITICAL_PARTS, DissemWatch, StepClock, critical_fields, gen_fields
from swarm.proto.rollouts import Completion, GroupResult

VOCAB = 128


def _parts_sum(row: dict) -> float:
    return sum(row[f] for f in critical_fields())


def test_clock_parts_are_non_negative_and_sum_to_the_step_time():
    t0 = time.perf_counter()
    time.sleep(0.02)
    clock = StepClock(t0, time.perf_counter() - t0)
    with clock.part("reward"):
        time.sleep(0.01)
    time.sleep(0.05)  # the training call, as the trainer times it
    clock.add_train(0.05, {"time_fwd_bwd_s": 0.03, "time_optim_s": 0.01})
    time.sleep(0.01)  # between parts: lands in time_other_s
    with clock.part("export"):
        pass
    step = time.perf_counter() - t0
    row = clock.fields(step, {"a": 5.0, "b": 3.0}, {"a": 1.0})
    assert set(critical_fields()) <= set(row)
    assert all(row[f] >= 0 for f in critical_fields())
    assert row["time_wait_s"] >= 0.02 and row["time_reward_s"] >= 0.01 and row["time_other_s"] >= 0.005
    assert row["time_fwd_bwd_s"] == 0.03 and row["time_optim_s"] == 0.01
    assert row["time_train_other_s"] == pytest.approx(0.01)
    assert _parts_sum(row) == pytest.approx(step, abs=2e-3)
    assert row["time_gen_s"] == 4.0 and row["time_gen_total_s"] == 7.0  # b joined after the step began


def test_gen_fields_ignore_counters_that_went_backwards():
    assert gen_fields({"a": 1.0}, {"a": 2.0}) == {"time_gen_s": 0.0, "time_gen_total_s": 0.0}
    assert gen_fields({}, {}) == {"time_gen_s": 0.0, "time_gen_total_s": 0.0}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> ResolvedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    d = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return ResolvedModel(name="tiny", gguf_path=None, hf_dir=d)


class _Task:
    def problem(self, split, idx):
        return idx

    def reward(self, problem, text):
        return float(len(text) % 2)


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


class _Service:
    def __init__(self):
        self.roster = NodeRoster()
        self.roster.admit("peerA", Hello(backend="llamacpp", device="cpu", memory_bytes=1, tokens_per_s=1.0), 0.0)
        self.published = []
        self.dissem = None
        self.checks = None

    def publish(self, reply):
        self.published.append(reply.version)

    def take_contributions(self):
        return {"peerA": 4}

    def node_backends(self):
        return {"peerA": "llamacpp"}


def _groups(version=0) -> list[CompletedGroup]:
    g = torch.Generator().manual_seed(3)
    out = []
    for k in range(2):
        prompt = torch.randint(3, VOCAB, (5,), generator=g).tolist()
        comps = [Completion(torch.randint(3, VOCAB, (2 + j,), generator=g).tolist(), [-1.0] * (2 + j), "length")
                 for j in range(3)]
        out.append(CompletedGroup(GroupSpec(f"g{k}", prompt, str(k)), GroupResult(f"g{k}", version, comps), "peerA", 0.0))
    return out


def test_a_learner_step_row_has_the_breakdown(tiny_model):
    from learner.steps import _train_and_publish
    from learner.config import LoraSettings, TrainConfig
    from learner.trainer import Trainer

    trainer = Trainer(tiny_model, TrainConfig(lr=1e-2, loss="decoupled", is_cap=2.0, minibatches=1, micro_batch=2,
                                              precision="autocast", device="cpu", torch_threads=1),
                      LoraSettings(rank=4, alpha=8))
    service = _Service()
    ctx = SimpleNamespace(state=SimpleNamespace(step=0, version=0), cfg=SimpleNamespace(train=SimpleNamespace(
        behaviour_check=False, scale_rewards="group"), report=SimpleNamespace(completions_every=0, completions=8)), coord=SimpleNamespace(take_drop_counts=dict, completed={}), service=service,
        trainer=trainer, train=trainer.train_step, task=_Task(), tokenizer=_Tokenizer(), dissem_watch=None)

    async def step():
        t0 = time.perf_counter()
        gen0 = {"peerA": 0.0}
        await trio.sleep(0.05)  # the wait for the batch; a node reports 0.04 s of generation
        service.roster.record_push("peerA", 0, 0, 0, 0, 0.04)
        return await _train_and_publish(ctx, _groups(), t0, time.perf_counter() - t0, gen0)

    row = trio.run(step)
    assert service.published == [1]
    assert all(row[f] >= 0 for f in critical_fields())
    assert _parts_sum(row) <= row["step_time_s"] + 2e-3
    assert row["time_wait_s"] >= 0.05 and row["time_fwd_bwd_s"] > 0 and row["time_optim_s"] > 0
    assert row["time_fwd_bwd_s"] + row["time_optim_s"] <= row["train_s"] + 1e-3
    assert row["time_gen_s"] == pytest.approx(0.04) and "time_dissem_s" not in row  # no dissemination service
    assert row["time_export_s"] > 0 and row["time_encode_s"] >= 0  # a tiny adapter encodes in under 1 ms


class _Dissem:
    cfg = SimpleNamespace(mode="tree")

    def __init__(self):
        self.members = {"p1": 1, "p2": 2}
        self.started_at = {}
        self.have = {}
        self.event = trio.Event()

    async def wait_have(self, version, peers, timeout_s):
        with trio.move_on_after(timeout_s):
            while not set(peers) <= set(self.have.get(version, {})):
                await self.event.wait()
                self.event = trio.Event()
            return True
        return False


def test_dissem_watch_times_a_version_until_every_member_holds_it():
    dissem = _Dissem()
    watch = DissemWatch.start(dissem, 3)
    assert watch.peers == ["p1", "p2"]

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            await trio.sleep(0.02)
            dissem.started_at[3] = time.time()
            dissem.have[3] = {"p1": 1}
            dissem.event.set()
            await trio.sleep(0.03)
            assert watch.latency_s is None  # p2 does not hold it yet
            dissem.have[3]["p2"] = 1
            dissem.event.set()

    trio.run(main)
    f = watch.fields()
    assert f["time_dissem_s"] >= 0.05 and 0.01 <= f["time_dissem_encode_s"] <= f["time_dissem_s"]
    assert DissemWatch.start(None, 1) is None
    direct = _Dissem()
    direct.cfg = SimpleNamespace(mode="direct")
    assert DissemWatch.start(direct, 1) is None


def test_report_breakdown_is_mean_seconds_and_share():
    def row(step, wait, fwd, gen):
        r = {f"time_{p}_s": 0.0 for p in CRITICAL_PARTS}
        r.update(step_time_s=step, time_wait_s=wait, time_fwd_bwd_s=fwd, time_other_s=step - wait - fwd,
                 time_gen_s=gen)
        return r

    table = step_breakdown([row(10.0, 4.0, 5.0, 3.0), row(20.0, 8.0, 11.0, 7.0), {"step": 0}])
    by = {r["part"]: r for r in table}
    assert by["step"]["mean_s"] == 15.0
    assert by["wait"]["mean_s"] == 6.0 and by["wait"]["share"] == pytest.approx(0.4)
    assert by["fwd_bwd"]["share"] == pytest.approx(8.0 / 15.0, abs=1e-4)
    assert by["gen"]["kind"] == "inside wait" and "dissem" not in by
    assert sum(r["share"] for r in table if r["kind"] == "critical") == pytest.approx(1.0, abs=1e-3)
    md = breakdown_markdown(table)
    assert md.count("\n") == len(table) + 1 and "| waiting for the batch (`time_wait_s`) | critical | 6.000 | 40.0% |" in md
    assert step_breakdown([{"step": 1, "step_time_s": 2.0}]) == []
