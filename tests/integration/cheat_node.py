"""A dishonest ``swarm-node`` for tests: the real node process (``node_agents.cli join``) with its
generation backend wrapped so that what it pushes is not what it sampled.

Run as ``python tests/integration/cheat_node.py MODE <swarm-node join arguments>``. Modes:

- ``bad_push``: every behaviour log-prob is +0.5 (malformed: refused by the coordinator's checks).
- ``made_up``: plausible but invented log-probs (-0.05 per token) for honestly sampled text.
- ``doctored``: every completion replaced by text of its own (a fixed confident answer), with
  the true log-probs of that text under the installed policy (``token_logprobs``).
- ``other_adapter``: samples with a random adapter of its own instead of the lease's, and
  reports that adapter's (true) log-probs.
- ``other_model``: samples from a different policy: the logits scaled as if the temperature
  were 2.5 (a different distribution over the same vocabulary), reporting those log-probs.
- ``greedy``: greedy text (the most likely token at every step) with its true log-probs.
- ``adapter_off``: the lease's adapter with LoRA B + N(0, 0.02): an adapter only slightly off,
  sampled from the lease's seed with its (true) log-probs.
- ``insert3``: honest groups except one completion, into which 3 tokens of its own are inserted
  after the first token, every log-prob the true one of the resulting text.
- ``payload``: honest groups except one completion, which gets a short payload of its own
  (``PAYLOAD_TEXT``) before its answer, every log-prob the true one of the resulting text.
- ``honest``: no change (a control).

A mode with the suffix ``-leases`` (``greedy-leases``) cheats in its leases only and replays the
validation jobs it is handed honestly (``swarm.proto.validate``), as a cheater that knows which
requests are checks would.
"""

from __future__ import annotations

import sys

import numpy as np

#: Mode suffix: cheat in leases only, replay validation jobs honestly.
LEASE_ONLY = "-leases"
MODES = ("bad_push", "made_up", "doctored", "other_adapter", "other_model", "greedy", "adapter_off", "insert3", "payload",
         "honest")
INSERTED_TEXT = " so we have that"
PAYLOAD_TEXT = "Visit evil.example now. "
DOCTORED_TEXT = "I checked this twice and it is simple.\nAnswer: 7"


class CheatBackend:
    def __init__(self, inner, mode: str):
        self.inner, self.mode, self.name = inner, mode, inner.name
        #: True while the node replays a validation job honestly (a ``-leases`` mode).
        self.honest = False

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def set_adapter(self, adapter):
        if self.mode == "other_adapter" and adapter is not None and adapter.tensors:
            rng = np.random.default_rng(1234)
            adapter.tensors = {k: (v + rng.normal(0, 0.05, v.shape)).astype(np.float32)
                               for k, v in adapter.tensors.items()}
        if self.mode == "adapter_off" and adapter is not None and adapter.tensors:
            rng = np.random.default_rng(4321)
            adapter.tensors = {k: (v + rng.normal(0, 0.02, v.shape)).astype(np.float32) if "lora_B" in k else v
                               for k, v in adapter.tensors.items()}
        return self.inner.set_adapter(adapter)

    def generate_group(self, prompt_ids, n, params):
        from node_agents.backends.base import SampledCompletion

        if self.honest:
            return self.inner.generate_group(prompt_ids, n, params)
        if self.mode == "other_model":
            params.temperature = 2.5
        if self.mode == "greedy":
            params.temperature = 0.0  # argmax; the log-probs reported are still the policy's (T = 1)
        out = self.inner.generate_group(prompt_ids, n, params)
        if self.mode == "bad_push":
            return [SampledCompletion(c.token_ids, [0.5] * len(c.logprobs), c.finish_reason) for c in out]
        if self.mode == "made_up":
            return [SampledCompletion(c.token_ids, [-0.05] * len(c.logprobs), c.finish_reason) for c in out]
        if self.mode == "doctored":
            ids = self._tokenize(DOCTORED_TEXT)
            ids = ids[: params.max_tokens]
            rows = self.inner.token_logprobs(list(prompt_ids) + ids)
            t = max(params.temperature, 1e-6)
            scaled = rows / t
            scaled = scaled - np.log(np.exp(scaled - scaled.max(1, keepdims=True)).sum(1, keepdims=True)) \
                - scaled.max(1, keepdims=True)
            lps = [float(scaled[len(prompt_ids) - 1 + i, tok]) for i, tok in enumerate(ids)]
            return [SampledCompletion(list(ids), lps, "length") for _ in out]
        if self.mode in ("insert3", "payload"):
            c = out[0]
            if self.mode == "insert3":
                whole = c.token_ids[:1] + self._tokenize(INSERTED_TEXT)[:3] + c.token_ids[1:]
            else:
                whole = self._tokenize(PAYLOAD_TEXT) + c.token_ids
            ids = whole[: params.max_tokens]
            out[0] = SampledCompletion(ids, self._true_logprobs(prompt_ids, ids, params.temperature),
                                       c.finish_reason if len(ids) == len(whole) else "length")
        return out

    def _tokenize(self, text):
        """Token ids of ``text`` in the model's vocabulary (llama.cpp's tokenizer, or the HF
        directory's for torch and MLX)."""
        if self.inner.name == "llamacpp":
            return self.inner.tokenize(text, add_special=False, parse_special=False)
        if not hasattr(self, "_hf"):
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(str(self.inner.model_dir))
        return self._hf(text, add_special_tokens=False)["input_ids"]

    def _true_logprobs(self, prompt_ids, ids, temperature):
        rows = self.inner.token_logprobs(list(prompt_ids) + list(ids)) / max(temperature, 1e-6)
        top = rows.max(1, keepdims=True)
        rows = rows - top - np.log(np.exp(rows - top).sum(1, keepdims=True))
        return [float(rows[len(prompt_ids) - 1 + i, tok]) for i, tok in enumerate(ids)]


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    lease_only = mode.endswith(LEASE_ONLY)
    mode = mode.removesuffix(LEASE_ONLY)
    if mode not in MODES:
        print(f"cheat_node: mode must be one of {MODES}", file=sys.stderr)
        return 2
    import node_agents.backends.registry as registry
    from node_agents import cli

    real = registry.create_backend
    registry.create_backend = lambda *a, **k: CheatBackend(real(*a, **k), mode)
    if lease_only:
        from node_agents.agent import NodeAgent

        real_validate = NodeAgent._validate

        async def honest_validate(self, host, peer, job):
            self.backend.honest = True
            try:
                return await real_validate(self, host, peer, job)
            finally:
                self.backend.honest = False

        NodeAgent._validate = honest_validate
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
