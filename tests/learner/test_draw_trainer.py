"""The draw check on the trainer's own forward (``learner/draw_check.py`` through
``Trainer.token_stats``): a tiny random model's completions drawn by the nodes' own sampler from the
lease's seed sit inside their intervals; greedy text and another seed do not; an older version's
groups are scored under that version's adapter (async mode) and the current weights come back."""

from __future__ import annotations

import numpy as np
import torch

from learner.draw_check import completion_uniforms
from learner.verify import GroupToCheck, Verifier, VerifyConfig
from node_agents.backends.sampling import completion_rngs, sample_rows
from swarm.proto.rollouts import Completion, GroupResult
from swarm.proto.work import group_seed
from tests.learner.test_verify import tiny_trainer

PROMPT = [3, 17, 42, 9, 100]


def draw(trainer, seed: int, n: int = 3, tokens: int = 12, greedy: bool = False) -> list[list[int]]:
    """Completions drawn as a node draws them (``sample_rows``, one uniform per token from
    ``default_rng([seed, j])``), from the trainer's model in float32 at its temperature."""
    t = trainer.train.temperature
    out = []
    for rng in completion_rngs(seed, 0, n):
        ids: list[int] = []
        for _ in range(tokens):
            with torch.no_grad():
                row = trainer.model(input_ids=torch.tensor([PROMPT + ids])).logits[0, -1:].float().numpy()
            tok, _lp = sample_rows(row, [rng], 0.0 if greedy else t, 1.0)
            ids.append(int(tok[0]))
        out.append(ids)
    return out


def distances(trainer, comps, seed: int, autocast=False):
    us = completion_uniforms(seed, [len(c) for c in comps])
    return [row[3] for row in trainer.token_stats(PROMPT, comps, trainer.train.temperature, autocast=autocast,
                                                  uniforms=us)]


def test_the_nodes_draws_sit_in_their_intervals_on_the_trainers_forward_and_other_text_does_not(tmp_path):
    trainer = tiny_trainer(tmp_path, precision="fp32", torch_threads=1)
    trainer.model.eval()
    comps = draw(trainer, 11)
    assert max(float(d.max()) for d in distances(trainer, comps, 11)) < 1e-5  # float32 learner, float32 node
    assert max(float(d.max()) for d in distances(trainer, comps, 11, autocast=True)) < 0.2  # bf16: a margin
    assert max(float(d.max()) for d in distances(trainer, comps, 12)) > 0.05  # another seed's uniforms
    assert max(float(d.max()) for d in distances(trainer, draw(trainer, 11, greedy=True), 11)) > 0.05


def test_a_group_of_an_older_version_is_checked_under_that_versions_adapter(tmp_path):
    """Async mode: the weights moved on (v1) while a group of v0 waited; the verifier scores it
    under v0's published adapter (``adapter_of``), judges its draw against v0, and the trainer's
    weights are v1's again afterwards."""
    from learner.trainer import TrainSample

    trainer = tiny_trainer(tmp_path, precision="fp32", torch_threads=1, lr=5e-2)
    v0 = trainer.export_adapter(0)
    seed = group_seed(5, "g1")
    comps = draw(trainer, seed)
    before = trainer.token_stats(PROMPT, comps, trainer.train.temperature)
    batch = [TrainSample(PROMPT, c, [-1.0] * len(c), 1.0 if i % 2 else -1.0) for i, c in enumerate(comps)]
    for _ in range(3):
        trainer.train_step(batch)
    after = trainer.token_stats(PROMPT, comps, trainer.train.temperature)
    assert not np.allclose(after[0][0], before[0][0], atol=1e-3)  # the policy moved
    cfg = VerifyConfig(precision="fp32", torch_threads=1)
    v = Verifier(trainer, cfg, trainer.train.temperature, 1.0, weights_version=1, sampling_seed=5,
                 train_precision="fp32", adapter_of=lambda version: v0.tensors if version == 0 else None)
    result = GroupResult("g1", 0, [Completion(c, [float(x) for x in lp], "length")
                                   for c, (lp, *_rest) in zip(comps, before)])
    assert v.check_groups([GroupToCheck("p", "torch", "torch-fp32", PROMPT, result)]) == [None]
    assert v.draw_summary["torch-fp32@fp32"]["max_stat"] < 1e-5
    np.testing.assert_allclose(trainer.token_stats(PROMPT, comps, trainer.train.temperature)[0][0], after[0][0])
    stale = GroupResult("g1", 0, result.completions)
    assert v.check_groups([GroupToCheck("p", "torch", "torch-fp32", PROMPT, stale)]) == [None]
    gone = Verifier(trainer, cfg, trainer.train.temperature, 1.0, weights_version=1, sampling_seed=5,
                    train_precision="fp32")  # v0 no longer kept: not checkable, so not trained
    assert gone.check_groups([GroupToCheck("p", "torch", "torch-fp32", PROMPT, result)])[0].startswith("skipped")


def test_a_version_nodes_hold_through_a_lossy_codec_is_checked_under_what_they_decoded(tmp_path):
    """Nodes generate with the adapter as they decoded it (an int3 delta is a few percent off the
    trainer's weights): an honest node's group passes the float32 check under those tensors, where
    the trainer's own weights would flag it; such a version's groups are not checked on the
    training step's forward (``holds_nodes_weights``)."""
    from learner.trainer import TrainSample

    trainer = tiny_trainer(tmp_path, precision="fp32", torch_threads=1, lr=5e-2)
    warm = draw(trainer, 3)
    for _ in range(3):  # a trained adapter: its LoRA B is not zero
        trainer.train_step([TrainSample(PROMPT, c, [-1.0] * len(c), 1.0 if i % 2 else -1.0) for i, c in enumerate(warm)])
    exact = trainer.export_adapter(1).tensors
    held = {k: (v * 1.5 if "lora_B" in k else v) for k, v in exact.items()}  # far coarser than any codec
    seed = group_seed(5, "g2")
    with trainer.swapped_adapter(held):
        comps = draw(trainer, seed)
        stats = trainer.token_stats(PROMPT, comps, trainer.train.temperature)
    result = GroupResult("g2", 1, [Completion(c, [float(x) for x in lp], "length") for c, (lp, *_r) in zip(comps, stats)])
    group = GroupToCheck("p", "torch", "torch-fp32", PROMPT, result)
    cfg = VerifyConfig(precision="fp32", torch_threads=1)

    def verifier(err: float) -> Verifier:
        return Verifier(trainer, cfg, trainer.train.temperature, 1.0, weights_version=1, sampling_seed=5,
                        train_precision="fp32", adapter_of=lambda version: held if version == 1 else None,
                        held_error=lambda version: err)

    assert verifier(0.0).check_groups([group])[0].startswith("draw check")  # the trainer's own weights
    decoded = verifier(0.05)
    assert decoded.check_groups([group]) == [None] and decoded.draw_summary["torch-fp32@fp32"]["max_stat"] < 1e-5
    assert not decoded.holds_nodes_weights(1) and verifier(4e-4).holds_nodes_weights(1)
    np.testing.assert_allclose(trainer.export_adapter(1).tensors[next(iter(exact))], exact[next(iter(exact))])
