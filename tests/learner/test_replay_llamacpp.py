"""The learner's llama.cpp replayer on the real packaged GGUF: an honest node's group (a node
backend's own context) replays exactly; greedy text, a slightly-off adapter and 3 inserted tokens
do not. (Other thread counts: ``swarm-bench replay-exactness`` and the slow process test.)"""

from __future__ import annotations

import numpy as np
import pytest

from learner.config import ReplayConfig
from learner.replay import numerics_of
from learner.replay_llamacpp import LlamaCppReplay
from learner.work_desk import SamplingDefaults
from swarm.proto.rollouts import Completion, GroupResult
from swarm.proto.work import group_seed

pytestmark = pytest.mark.integration

MAX_TOKENS, SIZE, SEED = 24, 4, 11


@pytest.fixture(scope="module")
def setup():
    from bench.replay_exactness import bench_adapter
    from common.default_model import default_gguf_path
    from node_agents.backends.llamacpp import LlamaCppBackend

    gguf = default_gguf_path()
    node = LlamaCppBackend(gguf, n_ctx=512, n_threads=1, max_group=SIZE)
    adapter = bench_adapter()
    node.set_adapter(adapter)
    numerics = numerics_of("llamacpp", node.numerics())
    replay = LlamaCppReplay(ReplayConfig(), gguf, SamplingDefaults(1.0, 1.0, MAX_TOKENS, SEED),
                            numerics_of=lambda peer: numerics, adapter_of=lambda v: adapter).open()
    yield node, replay, adapter
    replay.close()
    node.close()


def generate(node, prompt, gid, temperature=1.0):
    from node_agents.backends.base import SamplingParams

    comps = node.generate_group(prompt, SIZE, SamplingParams(temperature, 1.0, MAX_TOKENS, group_seed(SEED, gid)))
    return GroupResult(gid, 1, [Completion(c.token_ids, c.logprobs, c.finish_reason) for c in comps])


def test_honest_groups_replay_exactly_and_cheats_are_caught(setup):
    node, replay, adapter = setup
    prompt = node.tokenize("<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n")
    honest = [generate(node, prompt, f"g{i}") for i in range(2)]
    assert replay.check_groups([("p", g.group_id, prompt, g) for g in honest]) == [None, None]

    greedy = generate(node, prompt, "g2", temperature=0.0)
    inserted = generate(node, prompt, "g3")
    c = inserted.completions[0]
    c.token_ids = c.token_ids[:1] + node.tokenize(" so we have", False, False)[:3] + c.token_ids[1:-3]
    rng = np.random.default_rng(0)
    node.set_adapter(type(adapter)(1, adapter.rank, adapter.alpha, list(adapter.target_modules), {
        k: (v + rng.normal(0, 0.02, v.shape)).astype(np.float32) if "lora_B" in k else v
        for k, v in adapter.tensors.items()}))
    off = generate(node, prompt, "g4")
    node.set_adapter(adapter)
    reasons = replay.check_groups([("p", g.group_id, prompt, g) for g in (greedy, inserted, off)])
    assert all(r is not None and r.startswith("replay: completion") for r in reasons), reasons
    assert "completion 0 leaves the replay at token 1" in reasons[1], reasons[1]
    m = replay.take_metrics()
    assert m["replay_groups"] == 5 and m["replay_failed"] == 3 and m["replay_s_per_group"] > 0
    assert replay.take_metrics()["replay_groups"] == 0


def test_a_node_holding_the_first_published_adapter_of_a_version_is_not_flagged(setup):
    """A node that fetched a version directly before the dissemination codec's decoded tensors
    replaced it holds the first-published adapter: its honest group matches that one's replay
    (tried only after a mismatch with the served one), and a cheat matches neither."""
    from learner.replay_llamacpp import LlamaCppReplay

    node, _replay, adapter = setup
    rng = np.random.default_rng(1)
    served = type(adapter)(1, adapter.rank, adapter.alpha, list(adapter.target_modules), {
        k: (v + rng.normal(0, 0.02, v.shape)).astype(np.float32) if "lora_B" in k else v
        for k, v in adapter.tensors.items()})  # stands for the codec's decoded tensors
    numerics = numerics_of("llamacpp", node.numerics())
    replay = LlamaCppReplay(ReplayConfig(), _replay.gguf_path, SamplingDefaults(1.0, 1.0, MAX_TOKENS, SEED),
                            numerics_of=lambda peer: numerics, adapter_of=lambda v: served,
                            first_published=lambda v: adapter).open()
    try:
        prompt = node.tokenize("<|im_start|>user\nWhat is 9 + 14?<|im_end|>\n<|im_start|>assistant\n")
        node.set_adapter(adapter)
        honest = generate(node, prompt, "h0")
        inserted = generate(node, prompt, "h1")
        c = inserted.completions[0]
        c.token_ids = c.token_ids[:1] + node.tokenize(" so we have", False, False)[:3] + c.token_ids[1:-3]
        assert replay.check_groups([("p", g.group_id, prompt, g) for g in (honest, inserted)])[0] is None
        reasons = replay.check_groups([("p", "h1", prompt, inserted)])
        assert reasons[0] is not None and "leaves the replay" in reasons[0]
        node.set_adapter(served)  # a node holding the served adapter still replays on the first try
        assert replay.check_groups([("p", "h2", prompt, generate(node, prompt, "h2"))]) == [None]
    finally:
        node.set_adapter(adapter)
        replay.close()
