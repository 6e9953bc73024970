"""Several learner ranks: pure sharding, and real torchrun processes (gloo on CPU) that must end
with the single-rank adapter, resume across rank counts, and keep the swarm side on rank 0."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from learner.config import TrainConfig
from learner.distributed import env_context, resolve_device, shard_groups
from learner.launch_gpus import torchrun_command

WORKER = Path(__file__).with_name("dist_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def S(prompt, n_comp):
    return SimpleNamespace(prompt_ids=list(prompt), completion_ids=[1] * n_comp)


def test_shards_are_whole_groups_balanced_by_tokens_and_cover_the_batch():
    batch = [S([1], 10), S([2, 2], 3), S([1], 10), S([3], 1), S([2, 2], 3), S([4] * 8, 8)]
    shards = [shard_groups(batch, r, 2) for r in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(len(batch)))
    for sh in shards:  # a prompt group never straddles ranks
        prompts = {tuple(batch[i].prompt_ids) for i in sh}
        assert all(tuple(batch[j].prompt_ids) not in prompts for other in shards if other is not sh for j in other)
    # groups by tokens: [1] 22, [4]*8 16, [2,2] 10, [3] 2 -> r0 22, r1 16, r1 26, r0 24
    assert shards == [[0, 2, 3], [1, 4, 5]]
    assert shard_groups(batch, 0, 1) == list(range(len(batch)))
    assert shard_groups(batch[:1], 1, 2) == []  # fewer groups than ranks: an empty shard
    with pytest.raises(ValueError):
        shard_groups(batch, 2, 2)


def test_env_context_and_device_resolution():
    ctx = env_context({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (ctx.rank, ctx.world, ctx.local_rank, ctx.active, ctx.is_main) == (1, 2, 1, True, False)
    assert not env_context({}).active
    with pytest.raises(ValueError):
        env_context({"RANK": "2", "WORLD_SIZE": "2"})
    assert resolve_device("auto", 1, cuda_available=True) == "cuda:1"
    assert resolve_device("auto", 1, cuda_available=False) == "cpu"
    assert resolve_device("cuda", 3, cuda_available=True) == "cuda:3"
    assert resolve_device("cuda:0", 3, cuda_available=True) == "cuda:0"
    with pytest.raises(ValueError, match="no CUDA"):
        resolve_device("cuda", 0, cuda_available=False)
    with pytest.raises(ValueError):
        resolve_device("tpu", 0, cuda_available=False)


def test_config_check_and_torchrun_command(tmp_path):
    ok = TrainConfig(device="cuda:1", precision="bf16", dist_timeout_s=60.0)  # built = checked
    for bad in (dict(device="gpu"), dict(precision="fp8"), dict(dist_timeout_s=0)):
        with pytest.raises(ValueError):
            replace(ok, **bad)
    cmd = torchrun_command(4, ["-v", "launch", "--config", "c.toml", "--gpus", "4", "--run-dir", "old"],
                           tmp_path, python="py")
    assert cmd[:5] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
    assert cmd[5:] == ["-m", "learner.cli", "-v", "launch", "--config", "c.toml", "--run-dir", str(tmp_path)]


# -- real torchrun ranks ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    d = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ranks: int, *args: str, cwd: Path) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", str(WORKER), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def adapter(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_two_gloo_ranks_match_one_rank_and_resume_with_another_rank_count(tiny_dir, tmp_path):
    m = ["--model", str(tiny_dir)]
    torchrun(1, *m, "--out", str(tmp_path / "one"), "--steps", "3", "--save-at", "2", cwd=tmp_path)
    out = torchrun(2, *m, "--out", str(tmp_path / "two"), "--steps", "3", cwd=tmp_path)
    assert "rank 1: trained 3 steps" in out
    one = adapter(tmp_path / "one" / "adapter_rank0.pt")
    two0, two1 = adapter(tmp_path / "two" / "adapter_rank0.pt"), adapter(tmp_path / "two" / "adapter_rank1.pt")
    assert max(float(v.abs().max()) for k, v in one.items() if "lora_B" in k) > 1e-3  # it did train
    assert max_diff(two0, two1) == 0.0  # every rank holds the same adapter
    assert max_diff(one, two0) < 1e-5

    # a 1-rank checkpoint after step 2, resumed on 2 ranks for step 3 = the uninterrupted run
    torchrun(2, *m, "--out", str(tmp_path / "resumed"), "--steps", "3",
             "--resume", str(tmp_path / "one" / "step2.pt"), cwd=tmp_path)
    assert max_diff(one, adapter(tmp_path / "resumed" / "adapter_rank0.pt")) < 1e-5
    assert max_diff(one, adapter(tmp_path / "resumed" / "adapter_rank1.pt")) < 1e-5


@pytest.mark.slow
def test_fsdp_and_grad_checkpointing_match_one_rank_and_the_check_fails_without_all_reduce(tiny_dir, tmp_path):
    """FSDP-sharded base (+ gradient checkpointing) on 2 gloo ranks ends with the 1-rank adapter;
    negative control: ranks that skip the all-reduce end elsewhere."""
    m = ["--model", str(tiny_dir), "--steps", "2"]
    torchrun(1, *m, "--out", str(tmp_path / "one"), cwd=tmp_path)
    one = adapter(tmp_path / "one" / "adapter_rank0.pt")
    torchrun(2, *m, "--out", str(tmp_path / "fsdp"), "--fsdp", "--grad-ckpt", cwd=tmp_path)
    assert max_diff(one, adapter(tmp_path / "fsdp" / "adapter_rank0.pt")) < 1e-5
    assert max_diff(one, adapter(tmp_path / "fsdp" / "adapter_rank1.pt")) < 1e-5
    torchrun(2, *m, "--out", str(tmp_path / "noreduce"), "--skip-allreduce", cwd=tmp_path)
    assert max_diff(one, adapter(tmp_path / "noreduce" / "adapter_rank0.pt")) > 1e-3


@pytest.mark.integration
def test_launch_gpus_2_on_cpu_rank0_alone_runs_the_swarm_side(tmp_path):
    """``swarm-learner launch --gpus 2`` on a CPU-only machine: torchrun starts 2 gloo ranks; only
    rank 0 opens a libp2p host (one 'listening' line) and a real node trains the run through it
    while rank 1 trains its shard of every step."""
    import re
    import threading

    from learner.demo import node_command

    cfg = tmp_path / "c.toml"
    cfg.write_text('[train]\nsteps = 2\nprompts_per_step = 2\ngroup_size = 2\nmax_tokens = 8\nmicro_batch = 4\n'
                   'checkpoint_every = 1\ndevice = "cpu"\ntorch_threads = 1\n[sync]\nlong_poll_s = 1.0\n'
                   '[network]\nlisten = "/ip4/127.0.0.1/tcp/0"\n[dashboard]\nenabled = false\n')
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "learner.cli", "launch", "--config", str(cfg), "--run-dir", str(run_dir), "--gpus", "2"]
    from learner.cli import build_parser

    if hasattr(build_parser().parse_args(["launch", "--config", str(cfg)]), "data_dir"):  # learner key dir
        cmd += ["--data-dir", str(tmp_path / "key")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    learner = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    listening = threading.Event()

    def read() -> None:
        for line in learner.stdout:
            lines.append(line)
            if "listening on" in line:
                listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    node = None
    try:
        assert listening.wait(240), "".join(lines)[-3000:]
        line = next(x for x in lines if "listening on" in x)
        toks = line.split("listening on", 1)[1].split()
        addr = next(t for t in toks if t.startswith("/ip4/127.0.0.1/"))
        if "/p2p/" not in addr:
            addr += "/p2p/" + next(t for t in toks if not t.startswith("/"))
        node_log = open(tmp_path / "node.log", "w")
        node = subprocess.Popen(node_command(addr, tmp_path / "node", 1, "n0", "default") + ["--no-probe"],
                                stdout=node_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            rc = learner.wait(300)
        except subprocess.TimeoutExpired:
            rc = None
        node_tail = (tmp_path / "node.log").read_text()[-2000:]
        assert rc == 0, f"learner exit {rc}:\n" + "".join(lines)[-4000:] + "\nnode log:\n" + node_tail
    finally:
        for p in (learner, node):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    reader.join(5)
    out = "".join(lines)
    assert sum("listening on" in x for x in lines) == 1, out[-3000:]
    assert re.search(r"learner rank 1/2: following rank 0 \(no libp2p host\)", out), out[-3000:]
    assert "learner rank 1/2: done after 2 steps" in out, out[-3000:]
    assert "rank 0 of 2 (gloo)" in out
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert len([x for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]) == 2
