"""No class of node escapes the learner's own checks, with real processes: a dishonest ``swarm-node``
(``tests/integration/cheat_node.py``) declares in turn a llama.cpp CPU node of the learner's build
(replayed), a torch CPU node with no other torch node in the swarm (no validator), and an MLX node
(no validator), beside one honest llama.cpp node, against an in-process learner; the cheats are
greedy text, the lease's adapter with LoRA B + N(0, 0.02), 3 inserted tokens in one completion per
group and a short payload in one completion per group (true log-probs every time). Each cheater is
caught at its first checked group and none of its groups is trained; the honest node is never
flagged. Slow (a run per class and cheat, 3-14 min each on a loaded 2-core machine);
``test_a_payload_on_a_tiny_model`` is the default suite's representative (a tiny random Qwen3, a
torch cheater beside an honest MLX node: the same checks in a minute)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from learner.config import LearnerConfig
from swarm.config import load_config
from tests.integration.learner_nodes import Node
from tests.integration.learner_nodes import run as run_with_nodes

pytestmark = pytest.mark.integration

CHEATS = ("greedy", "adapter_off", "insert3", "payload")
#: The test that catches each declared class's first group: the draw check (it runs first) or else
#: the exact replay (llama.cpp of the learner's build), the draw check on a float32 forward (torch
#: and MLX float32 nodes under a bf16 learner), or the draw check at the training precision (an fp32
#: learner).
CATCHERS = {"llamacpp": ("draw", "replay"), "torch": ("fp32", "draw"), "mlx": ("fp32", "draw")}
#: Steps per run: enough for a slow cheater's first result to come back before the run ends.
STEPS = {"mlx": 6}
#: What catches the honest node's first groups (a replay, a float32 pass) or any later one.
PASSES = {"replay", "fp32", "draw"}


def config(*extra: str) -> LearnerConfig:
    return load_config(LearnerConfig, None, [
        'network.listen="/ip4/127.0.0.1/tcp/0"', "train.checkpoint_every=0", "sync.long_poll_s=1.0",
        "sync.lease_timeout_s=900", "dissem.mode=direct", "train.micro_batch=4", "train.steps=1",
        "train.prompts_per_step=3", "train.group_size=4", "train.max_tokens=24", "sync.min_waiting_nodes=2", *extra])


def run_cheater(tmp_path: Path, backend: str, mode: str, *extra: str, seconds: float = 1500,
                honest_backend: str = "llamacpp", model: str = "default", steps: int = 1) -> dict:
    """One cheater of ``backend`` and one honest node (llama.cpp) over ``steps`` steps; checks and
    returns the run."""
    t0 = time.monotonic()
    nodes = [Node("cheat", mode, backend=backend, model=model, passive_omp=True),
             Node("honest", None, backend=honest_backend, model=model, passive_omp=True)]
    out = run_with_nodes(tmp_path, config(f"train.steps={steps}", *extra), nodes, seconds)
    svc, work, peer_of = out["svc"], out["work"], out["peer_of"]
    cheat, honest = peer_of["cheat"], peer_of["honest"]
    untrusted = svc.admission.untrusted
    line = work[cheat]
    assert cheat in untrusted and "unverified" in untrusted[cheat], (backend, mode, line, out["logs"]["cheat"][-3000:])
    # caught at its first checked group: one failed check, none passed, nothing of it trained
    assert sum(line["failed"].values()) == 1 and set(line["failed"]) <= set(CATCHERS[backend]), line
    assert not {k: v for k, v in line["verified"].items() if k != "skipped"}, line
    assert line["groups_trained"] == 0 and cheat not in {p for r in out["rows"] for p in r["nodes"]}
    assert honest not in untrusted and work[honest]["failed"] == {}, work[honest]
    assert set(work[honest]["verified"]) <= PASSES and work[honest]["groups_trained"] == 3 * steps, work[honest]
    assert [r["step"] for r in out["rows"]] == list(range(1, steps + 1))
    assert sum(r["samples"] for r in out["rows"]) == 12 * steps
    print(f"{backend} {mode}: caught by {line['failed']} in {time.monotonic() - t0:.0f}s ({untrusted[cheat][:160]}); "
          f"honest trained_by {work[honest].get('trained_by')}")
    return out


@pytest.mark.timeout(900)
def test_a_payload_on_a_tiny_model(tmp_path):
    """The default suite's representative: on a tiny random Qwen3 (an HF model: the learner has no
    GGUF to replay anything), a torch CPU node (no other torch node in the swarm, so no validator)
    puts a short payload before one completion's answer in every group, beside an honest MLX node;
    the learner's own draw check on its first group (a float32 pass under a bf16 learner) catches
    it, and the MLX node's groups pass theirs."""
    from bench.make_model import make_model

    model = str(make_model("qwen3", tmp_path / "qwen3-tiny", "tiny", seed=2))
    run_cheater(tmp_path, "torch", "payload", f'model.name="{model}"', honest_backend="mlx", model=model)


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("backend, mode", [(b, m) for b in ("llamacpp", "torch", "mlx") for m in CHEATS])
def test_each_cheat_of_each_declared_class_is_caught_at_its_first_group(tmp_path, backend, mode):
    # the MLX CPU build generates a few times slower than the honest llama.cpp node, whose backup
    # lease returns the cheater's first group first: its late result is checked all the same
    # (``VerifyQueue.check_late``) while the next steps run
    run_cheater(tmp_path, backend, mode, seconds=2200, steps=STEPS.get(backend, 1))


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_an_off_adapter_is_caught_by_an_fp32_learners_own_training_forward(tmp_path, backend):
    """With ``train.precision = "fp32"`` (AVX2-only CPUs) the draw check at the training precision is
    already the strict one for torch and MLX float32 nodes: no extra pass."""
    run_cheater(tmp_path, backend, "adapter_off", "train.precision=\"fp32\"", seconds=2200)
