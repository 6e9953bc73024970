"""Helpers of the pipeline tests: a tiny random Llama, a random adapter for it, and stage
executors served on real libp2p hosts inside one trio run."""

from __future__ import annotations

from contextlib import AsyncExitStack

import numpy as np
import trio

N_LAYERS = 6
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = [1, 17, 42, 99, 123, 250, 7, 8, 9, 10]


def make_tiny_llama(out_dir):
    """A random 6-layer Llama (width 64, vocab 300, tied embeddings) saved as an HF directory,
    with the top-level ``rope_theta`` mlx-lm needs."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from common.model_cache import add_rope_theta

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=N_LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=2, bos_token_id=1)
    LlamaForCausalLM(cfg).eval().save_pretrained(out_dir)
    add_rope_theta(out_dir / "config.json")
    return out_dir


def tiny_adapter(version: int, seed: int = 3):
    from common.lora import LoraAdapter

    rng = np.random.default_rng(seed)
    shapes = {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (64, 32), "self_attn.v_proj": (64, 32),
              "self_attn.o_proj": (64, 64), "mlp.gate_proj": (64, 128), "mlp.up_proj": (64, 128),
              "mlp.down_proj": (128, 64)}
    tensors = {}
    for layer in range(N_LAYERS):
        for mod, (fi, fo) in shapes.items():
            stem = f"base_model.model.model.layers.{layer}.{mod}"
            tensors[f"{stem}.lora_A.weight"] = (rng.standard_normal((4, fi)) / 8).astype(np.float32)
            tensors[f"{stem}.lora_B.weight"] = (rng.standard_normal((fo, 4)) * 0.2).astype(np.float32)
    return LoraAdapter(version=version, rank=4, alpha=8.0, target_modules=list(TARGETS), tensors=tensors)


async def _serve_and_run(tmp_path, executors, body):
    from node_agents.stages.head import RouteStage
    from swarm.host import open_host
    from swarm.pipeline.server import serve_stage

    async with AsyncExitStack() as stack:
        route = []
        for i, ex in enumerate(executors):
            host = await stack.enter_async_context(open_host(tmp_path / f"stage{i}"))
            serve_stage(host, ex)
            route.append((host, RouteStage(host.peer_id, ex.start, ex.end)))
        head = await stack.enter_async_context(open_host(tmp_path / "head"))
        for host, _ in route:
            await head.connect(host.addrs[0])
        return await body(head, [r for _, r in route])


def run_hosts(tmp_path, executors, body):
    """Serve each executor on its own host, start a head host connected to all of them and
    return ``await body(head, route)``; the head's error surfaces as itself, not as a group."""
    try:
        return trio.run(_serve_and_run, tmp_path, executors, body)
    except BaseExceptionGroup as eg:
        leaves = list(_leaves(eg))
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(eg):
    for e in eg.exceptions:
        yield from (_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
