"""A raw llama.cpp baseline for ``swarm-bench throughput``: GRPO groups through llama.cpp's
own batch API and sampler chain, with no swarm code.

This is what a user of llama.cpp would write to generate ``n`` completions of one prompt:

1. clear the KV cache, decode the prompt once into sequence 0 (logits for its last token only);
2. ``llama_memory_seq_cp`` shares that prompt with sequences ``1 .. n-1``;
3. each step fills one ``llama_batch`` with one token per live sequence, calls
   ``llama_decode`` once, and samples every row with that sequence's own llama.cpp sampler
   chain (``temp`` -> ``top_p`` -> ``dist(seed + j)``, or ``greedy`` at temperature 0), which
   reads the row straight from the context's output buffer (``llama_sampler_sample``);
4. a completion ends at an end-of-generation token (kept, as the node keeps it) or at
   ``max_tokens``.

The model and context are the node backend's own (``node_agents/backends/llama_handles.py``:
``n_seq_max`` = group size, per sequence ``n_ctx``, the same batch size, threads and
flash-attention setting, one KV stream per sequence unless ``kv_unified``), so the two sides
differ only in the code around ``llama_decode``: the node also returns every token's behaviour log-prob and samples in numpy
with a per-completion generator; the raw side returns tokens only.
"""

from __future__ import annotations

import os
from pathlib import Path


class RawBatchGenerator:
    """GRPO groups through llama-cpp-python's low-level bindings only (see the module docstring)."""

    def __init__(self, gguf_path: str | Path, n_ctx: int = 1024, n_threads: int | None = None,
                 max_group: int = 8, n_batch: int = 512, flash_attn: bool | None = None,
                 kv_unified: bool = False):
        from node_agents.backends.llama_handles import LlamaHandles
        from node_agents.backends.llamacpp import init_llama_cpp

        self._lc = lc = init_llama_cpp()
        self.n_ctx, self.max_group = int(n_ctx), int(max_group)
        self._h = LlamaHandles(lc, gguf_path)
        self._h.open_context(n_ctx=self.n_ctx, n_seq=self.max_group, n_batch=n_batch,
                             n_threads=int(n_threads or os.cpu_count() or 1), kv_unified=kv_unified,
                             flash_attn=flash_attn)
        self._ctx, self._mem, self._vocab = self._h.ctx, self._h.mem, self._h.vocab
        self._batch, self._cap = self._h.batch, self._h.cap

    def tokenize(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        buf = (self._lc.llama_token * (len(data) + 8))()
        got = self._lc.llama_tokenize(self._vocab, data, len(data), buf, len(buf), True, True)
        if got < 0:
            raise ValueError("prompt too long to tokenize")
        return list(buf[:got])

    def _sampler(self, temperature: float, top_p: float, seed: int):
        lc = self._lc
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        if temperature <= 0.0:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        else:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(float(temperature)))
            if top_p < 1.0:
                lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_top_p(float(top_p), 1))
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(int(seed) % (1 << 32)))
        return chain

    def _add(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        b = self._batch
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = seq
        b.logits[i] = logits

    def _decode(self, n_tokens: int) -> None:
        self._h.decode(n_tokens)

    def generate_group(self, prompt: list[int], n: int, temperature: float, top_p: float,
                       max_tokens: int, seed: int) -> list[list[int]]:
        """``n`` completions (token ids, end-of-generation token kept) of ``prompt``; completion
        ``j`` samples with its own chain seeded ``seed + j``. Groups larger than ``max_group``
        run in chunks (each re-decodes the prompt), as on the node."""
        out: list[list[int]] = []
        for first in range(0, n, self.max_group):
            out += self._chunk(prompt, min(self.max_group, n - first), temperature, top_p, max_tokens, seed + first)
        return out

    def _chunk(self, prompt, m, temperature, top_p, max_tokens, seed) -> list[list[int]]:
        lc = self._lc
        lc.llama_memory_clear(self._mem, False)
        for start in range(0, len(prompt), self._cap):
            part = prompt[start:start + self._cap]
            last = start + len(part) == len(prompt)
            for i, tok in enumerate(part):
                self._add(i, tok, start + i, 0, last and i == len(part) - 1)
            self._decode(len(part))
        for j in range(1, m):
            lc.llama_memory_seq_cp(self._mem, 0, j, -1, -1)
        samplers = [self._sampler(temperature, top_p, seed + j) for j in range(m)]
        limit = min(int(max_tokens), self.n_ctx - len(prompt))
        tokens: list[list[int]] = [[] for _ in range(m)]
        try:
            rows = {j: -1 for j in range(m)}  # every sequence samples the prompt's last output row
            pos = len(prompt)
            while rows and limit > 0:
                live = []
                for j, idx in rows.items():
                    tok = lc.llama_sampler_sample(samplers[j], self._ctx, idx)
                    tokens[j].append(tok)
                    if not lc.llama_vocab_is_eog(self._vocab, tok) and len(tokens[j]) < limit:
                        live.append(j)
                if not live:
                    break
                for i, j in enumerate(live):
                    self._add(i, tokens[j][-1], pos, j, True)
                self._decode(len(live))
                pos += 1
                rows = {j: i for i, j in enumerate(live)}
        finally:
            for s in samplers:
                lc.llama_sampler_free(s)
        return tokens

    def close(self) -> None:
        self._h.close()
        self._ctx = self._mem = self._batch = None

    def __enter__(self) -> "RawBatchGenerator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
