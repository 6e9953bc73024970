"""llama.cpp generation backend (through llama-cpp-python's low-level ctypes API).

A node's hot path. One model and one context are created once; a GRPO group of ``n``
completions of one prompt is generated as a single batch:

1. the KV cache is cleared (``llama_memory_clear``) and the prompt is decoded once, into
   sequence 0, with logits only for its last token;
2. ``llama_memory_seq_cp`` shares that prompt with sequences 1..n-1 (metadata only when the
   KV cache is unified, a buffer copy between streams otherwise);
3. every step decodes one token per live sequence in one ``llama_decode`` call and samples
   all rows at once in numpy from a zero-copy view of the output logits.

Sampling (``node_agents.backends.sampling``): completion ``j`` owns
``numpy.random.default_rng([seed, j])`` and draws exactly one uniform per token, so a group is
reproducible. The reported log-prob is ``log_softmax(logits / T)[token]`` (T = 0: greedy,
and T = 1 for the log-prob), before any top-p truncation, as ``SampledCompletion`` says. An
end-of-generation token (``llama_vocab_is_eog``) ends a completion and is kept as its last
token (with its log-prob), so the learner can train the stop decision.

LoRA hot swap: the adapter is written as a GGUF LoRA (``node_agents.lora_gguf``), loaded
with ``llama_adapter_lora_init``, attached with ``llama_set_adapters_lora`` (scale 1.0:
the file carries alpha), and only then is the previous adapter freed, so llama.cpp's
pointer-based "same adapters?" check can never mistake a new adapter for a freed one.
The KV cache is cleared on every swap: cached prompt cells were computed with the old
adapter.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter
from node_agents.backends.base import Capabilities, SampledCompletion, SamplingParams, generate_in_chunks
from node_agents.backends.llama_handles import LlamaHandles
from node_agents.backends.sampling import completion_rngs, sample_rows

_GGML_TYPE_F32 = 0
_LOG_LEVEL_ERROR = 3
_INITIALISED = False
_LOG_CALLBACK = None  # keep the ctypes callback alive for the process lifetime


def init_llama_cpp():
    """Import llama_cpp, initialise the backend once and route its log to errors only."""
    global _INITIALISED, _LOG_CALLBACK
    import llama_cpp

    if not _INITIALISED:
        llama_cpp.llama_backend_init()

        def _log(level, text, _user):
            if level == _LOG_LEVEL_ERROR and text:
                os.write(2, text)

        _LOG_CALLBACK = llama_cpp.llama_log_callback(_log)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        _INITIALISED = True
    return llama_cpp


def llama_build() -> str:
    """This process's llama.cpp: the llama-cpp-python release and ggml's CPU feature line (two
    builds agree on a token only when both match)."""
    lc = init_llama_cpp()
    info = lc.llama_print_system_info().decode("utf-8", "replace").strip()
    return f"llama-cpp-python {getattr(lc, '__version__', '?')} | {info}"[:512]


class LlamaCppBackend:
    """``Backend`` on llama.cpp. ``n_ctx`` is per sequence (prompt + completion).

    ``max_group`` sequences are decoded together; larger groups run in chunks of that size
    (each chunk re-decodes the prompt). ``kv_unified`` selects llama.cpp's single shared KV
    buffer instead of one stream per sequence. ``flash_attn`` ``None`` leaves llama.cpp's
    automatic choice (on for CPU). For tight comparisons with torch use an F32 base with
    ``kv_f32=True`` *and* ``flash_attn=False``: the CPU flash-attention kernel rounds to
    float16 internally (measured: 0.018 max log-prob error instead of 6e-5). ``kv_f32``
    ``None`` does exactly that for an all-F32 GGUF (``general.file_type`` 0, e.g. an HF
    directory converted for the learner's fp32 weights): whoever serves F32 weights wants the
    learner's numbers; any other GGUF keeps llama.cpp's defaults.

    ``n_threads`` defaults to every core, best on an otherwise idle machine. ggml's worker
    threads spin at barriers, so when other processes compete for the cores one descheduled
    thread stalls the others: measured on 2 cores beside one busy process, 2 threads were up
    to 100x slower than 1. Use fewer threads than cores on a shared machine.
    """

    name = "llamacpp"

    def __init__(
        self,
        gguf_path: str | Path,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        n_batch: int = 512,
        max_group: int = 8,
        *,
        kv_f32: bool | None = False,
        kv_unified: bool = False,
        flash_attn: bool | None = None,
    ):
        lc = init_llama_cpp()
        self._lc = lc
        self.gguf_path = Path(gguf_path)
        if not self.gguf_path.is_file():
            raise FileNotFoundError(f"GGUF model not found: {self.gguf_path}")
        self.n_ctx = int(n_ctx)
        self.n_threads = int(n_threads or os.cpu_count() or 1)
        self.n_batch = int(n_batch)
        self.max_group = int(max_group)
        self._adapter = None
        self._adapter_version = -1
        # callers run set_adapter / generate_group in worker threads (trio.to_thread);
        # one llama_context must never be used by two of them at once
        self._lock = threading.RLock()

        #: The model, its context, KV memory and batch (``llama_handles.py``, shared with the bench).
        self._h = LlamaHandles(lc, self.gguf_path)
        self._model, self._vocab = self._h.model, self._h.vocab
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self.n_head = int(lc.llama_model_n_head(self._model))
        self.n_head_kv = int(lc.llama_model_n_head_kv(self._model))
        #: ``general.architecture`` (llama, qwen2, qwen3): picks the LoRA layout (``lora_gguf``)
        self.arch = self._meta_str(b"general.architecture") or "llama"

        if kv_f32 is None and self._meta_str(b"general.file_type") == "0":  # all F32
            kv_f32, flash_attn = True, False if flash_attn is None else flash_attn
        self.kv_f32 = bool(kv_f32)
        #: ``auto`` (llama.cpp's choice), ``on`` or ``off``: part of the numerics (``numerics``)
        self.flash_attn = "auto" if flash_attn is None else ("on" if flash_attn else "off")
        self.kv_unified = bool(kv_unified)
        self._h.open_context(n_ctx=self.n_ctx, n_seq=self.max_group, n_batch=self.n_batch, n_threads=self.n_threads,
                             kv_unified=self.kv_unified, flash_attn=flash_attn,
                             kv_type=_GGML_TYPE_F32 if kv_f32 else None)
        self._ctx, self._mem, self._batch, self._cap = self._h.ctx, self._h.mem, self._h.batch, self._h.cap
        b = self._batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(self._cap,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(self._cap,))
        self._b_nseq = np.ctypeslib.as_array(b.n_seq_id, shape=(self._cap,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(self._cap,))
        self._b_nseq[:] = 1
        self._slot_seq = [-1] * self._cap  # seq id currently written in each batch slot
        self._eog_cache: dict[int, bool] = {}

    def _meta_str(self, key: bytes) -> str | None:
        """A string metadata value of the loaded model, ``None`` when absent."""
        return self._h.meta_str(key)

    # ----------------------------------------------------------------- Backend API

    def capabilities(self) -> Capabilities:
        from node_agents.hardware import detect

        hw = detect()
        return Capabilities(
            backend=self.name,
            device=f"cpu ({hw.cores} cores)",
            memory_bytes=int(hw.ram_bytes),
            # set by node_agents.probe.probe_throughput at join (0 until measured)
            tokens_per_s=float(getattr(self, "measured_tokens_per_s", 0.0)),
            extra={**hw.extra(), "model": self.gguf_path.name, **self.numerics()},
        )

    def numerics(self) -> dict[str, str]:
        """What fixes this context's logits, for a replay of its groups (``learner.replay``): the
        llama.cpp build and CPU features, the GGUF's SHA-256, the thread count (ggml splits its
        sums by thread: 2 threads changed 6 of 32 completions against 1, ``swarm-bench
        replay-exactness``) and the decoding layout. A node keeps them for its whole life."""
        if getattr(self, "_gguf_sha256", None) is None:
            from swarm.content.model_id import file_sha256

            self._gguf_sha256 = file_sha256(self.gguf_path)
        return {"llama_build": llama_build(), "gguf_sha256": self._gguf_sha256, "max_group": str(self.max_group),
                "n_batch": str(self.n_batch), "n_ctx": str(self.n_ctx), "n_threads": str(self.n_threads), "kv_type": "f32" if self.kv_f32 else "f16",
                "flash_attn": self.flash_attn, "kv_unified": "1" if self.kv_unified else "0"}

    @property
    def adapter_version(self) -> int:
        return self._adapter_version

    def set_adapter(self, adapter: LoraAdapter | None) -> None:
        with self._lock:
            self._set_adapter(adapter)

    def _set_adapter(self, adapter: LoraAdapter | None) -> None:
        if adapter is None or not adapter.tensors:
            self._install(None)
            self._adapter_version = -1 if adapter is None else adapter.version
            return
        from node_agents.lora_gguf import write_lora_gguf

        with tempfile.TemporaryDirectory(prefix="echo-lora-") as tmp:
            path = Path(tmp) / f"adapter-v{adapter.version}.gguf"
            write_lora_gguf(adapter, path, n_head=self.n_head, n_head_kv=self.n_head_kv, arch=self.arch)
            self.set_adapter_file(path, adapter.version)

    def set_adapter_file(self, path: str | Path, version: int) -> None:
        """Install a GGUF LoRA file already in llama.cpp's layout (its data is copied in)."""
        with self._lock:
            handle = self._lc.llama_adapter_lora_init(self._model, str(path).encode())
            if not handle:
                raise RuntimeError(f"llama.cpp rejected the LoRA adapter {path}")
            self._install(handle)
            self._adapter_version = int(version)

    def generate_group(self, prompt_ids: list[int], n: int, params: SamplingParams) -> list[SampledCompletion]:
        return generate_in_chunks(self, prompt_ids, n, params)

    def measure_throughput(self, prompt_ids: list[int], n: int = 8, max_tokens: int = 64) -> float:
        """Generated tokens per second of one group (temperature 1, EOG still ends a completion)."""
        t0 = time.perf_counter()
        group = self.generate_group(prompt_ids, n, SamplingParams(temperature=1.0, max_tokens=max_tokens))
        elapsed = time.perf_counter() - t0
        return sum(len(c.token_ids) for c in group) / elapsed

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        h = getattr(self, "_h", None)  # None: __init__ failed before the model loaded
        if h is None:
            return
        h.close_context()
        self._batch = self._ctx = self._mem = None
        if self._adapter:  # freed between the context and the model it belongs to
            self._lc.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        h.close()
        self._model = None

    def __enter__(self) -> "LlamaCppBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ----------------------------------------------------------------- helpers

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        size = len(data) + 8
        buf = (self._lc.llama_token * size)()
        got = self._lc.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, parse_special)
        if got < 0:
            size = -got
            buf = (self._lc.llama_token * size)()
            got = self._lc.llama_tokenize(self._vocab, data, len(data), buf, size, add_special, parse_special)
        return list(buf[:got])

    def detokenize(self, token_ids: list[int]) -> str:
        pieces = []
        buf = ctypes.create_string_buffer(256)
        for tok in token_ids:
            got = self._lc.llama_token_to_piece(self._vocab, int(tok), buf, len(buf), 0, False)
            pieces.append(buf.raw[:max(got, 0)])
        return b"".join(pieces).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        hit = self._eog_cache.get(token)
        if hit is None:
            hit = self._eog_cache[token] = bool(self._lc.llama_vocab_is_eog(self._vocab, token))
        return hit

    def token_logprobs(self, token_ids: list[int]) -> np.ndarray:
        """``[len, vocab]`` log-softmax of the logits after each token (seq 0, KV cache cleared)."""
        with self._lock:
            self._lc.llama_memory_clear(self._mem, False)
            rows = self._decode_prompt([int(t) for t in token_ids], all_logits=True)
        x = rows.astype(np.float64)
        x -= x.max(axis=1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=1, keepdims=True))

    def _install(self, handle) -> None:
        lc = self._lc
        if handle:
            arr = (lc.llama_adapter_lora_p_ctypes * 1)(handle)
            scales = (ctypes.c_float * 1)(1.0)
            lc.llama_set_adapters_lora(self._ctx, arr, 1, scales)
        else:
            lc.llama_set_adapters_lora(self._ctx, None, 0, None)
        if self._adapter:
            lc.llama_adapter_lora_free(self._adapter)
        self._adapter = handle or None
        lc.llama_memory_clear(self._mem, False)

    def _fill(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        self._b_token[i] = token
        self._b_pos[i] = pos
        self._b_logits[i] = logits
        if self._slot_seq[i] != seq:
            self._batch.seq_id[i][0] = seq
            self._slot_seq[i] = seq

    def _decode(self, n_tokens: int) -> None:
        self._h.decode(n_tokens)

    def _logit_rows(self, k: int) -> np.ndarray:
        """Zero-copy ``[k, vocab]`` view of the last decode's outputs, in batch order.

        ``llama_get_logits_ith(ctx, i)`` takes a *batch* index for ``i >= 0`` (NULL if that
        token was not marked for output) but a plain output-row index counted from the end for
        ``i < 0``. Output rows are stored contiguously in batch order, so the pointer of row
        ``-k`` starts the last ``k`` outputs.
        """
        ptr = self._lc.llama_get_logits_ith(self._ctx, -k)
        return np.ctypeslib.as_array(ptr, shape=(k, self.n_vocab))

    def _decode_prompt(self, prompt: list[int], all_logits: bool = False) -> np.ndarray:
        """Decode ``prompt`` into sequence 0; the logits rows (last only unless ``all_logits``)."""
        rows = []
        for start in range(0, len(prompt), self._cap):
            chunk = prompt[start:start + self._cap]
            last_chunk = start + len(chunk) == len(prompt)
            for i, tok in enumerate(chunk):
                want = all_logits or (last_chunk and i == len(chunk) - 1)
                self._fill(i, tok, start + i, 0, want)
            self._decode(len(chunk))
            if all_logits:
                rows.append(self._logit_rows(len(chunk)).copy())
        if all_logits:
            return np.concatenate(rows, axis=0)
        return self._logit_rows(1)

    def _generate_chunk(self, prompt: list[int], first: int, m: int, params: SamplingParams) -> list[SampledCompletion]:
        lc = self._lc
        lc.llama_memory_clear(self._mem, False)
        rows = self._decode_prompt(prompt)
        for j in range(1, m):
            lc.llama_memory_seq_cp(self._mem, 0, j, -1, -1)
        rngs = completion_rngs(params.seed, first, m)
        limit = min(int(params.max_tokens), self.n_ctx - len(prompt))
        tokens: list[list[int]] = [[] for _ in range(m)]
        logprobs: list[list[float]] = [[] for _ in range(m)]
        finish = ["length"] * m
        if limit <= 0:
            return [SampledCompletion([], [], "length") for _ in range(m)]
        # every sequence starts from the same prompt row
        toks, lps = sample_rows(np.broadcast_to(rows[0], (m, self.n_vocab)), rngs, params.temperature, params.top_p)
        active = list(range(m))
        pos = len(prompt)
        while True:
            still = []
            for i, j in enumerate(active):
                tok = int(toks[i])
                tokens[j].append(tok)
                logprobs[j].append(float(lps[i]))
                if self.is_eog(tok):
                    finish[j] = "stop"
                elif len(tokens[j]) < limit:
                    still.append(j)
            active = still
            if not active:
                break
            for i, j in enumerate(active):
                self._fill(i, tokens[j][-1], pos, j, True)
            self._decode(len(active))
            pos += 1
            rows = self._logit_rows(len(active))
            toks, lps = sample_rows(rows, [rngs[j] for j in active], params.temperature, params.top_p)
        return [SampledCompletion(tokens[j], logprobs[j], finish[j]) for j in range(m)]
