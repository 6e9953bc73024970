"""A torch stage: layers ``[start, end)`` of an HF causal LM (transformers 5), CPU or CUDA.

Loading holds only the stage's own weights: the model is built on the ``meta`` device from
its config, then the modules this stage runs (its decoder layers; the embedding on the first
stage; the final norm and LM head on the last) are materialised on the device and filled
from the safetensors files, reading only their tensors (a tied LM head reads the embedding
matrix). The rotary embedding is rebuilt on the device.

Per session (one GRPO group) the stage keeps a ``DynamicCache`` (only its layers' slots are
used) and the 2-D attention mask; the causal mask is built with ``layer_idx=start``, because
the cache's layer 0 is empty on any stage but the first and the mask would otherwise see no
past. The last stage also holds each completion's sampler state and samples with
:func:`node_agents.backends.sampling.sample_rows`, exactly as the torch backend does, so a
pipeline and a whole model give the same tokens and log-probs for the same seed.

LoRA: peft wraps the meta skeleton with ``layers_to_transform=[start, end)``, so only this
stage's layers get LoRA modules; :meth:`set_adapter` takes the slices of a full adapter that
belong to those layers (:func:`swarm.pipeline.layers.slice_for_range`) and copies them in.
The CUDA path is written against the same APIs but has only been run on CPU here.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.lora import LoraAdapter
from node_agents.backends.torch_backend import pick_device_dtype
from node_agents.stages.sessions import Session, SessionTable, last_stage_result
from node_agents.stages.tensors import from_blob, to_blob
from swarm.pipeline.layers import slice_for_range
from swarm.pipeline.proto import StageForward, StageOpen, StageResult
from swarm.pipeline.server import StageRefused


@dataclass(kw_only=True)
class _Session(Session):
    cache: object
    batch: int
    max_len: int = 0  # tokens per row the session reserved KV for
    mask: object = None  # [rows, seen] long


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no safetensors weights")
    return files


class TorchStage:
    """Serves layers ``[start, end)`` of the HF model in ``model_dir`` (a ``StageExecutor``).

    ``kv_budget_bytes`` (0: unlimited) caps the KV cache reserved by open sessions: a session
    reserves ``batch * max_len * kv_bytes_per_token`` for its layers at open and is refused
    when that would pass the budget."""

    def __init__(self, model_dir: str | Path, start: int, end: int, *, device: str | None = None,
                 dtype: str | None = None, threads: int = 0, max_batch: int = 256, kv_budget_bytes: int = 0):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self._torch = torch
        self.model_dir = Path(model_dir)
        if threads:
            torch.set_num_threads(int(threads))
        config = AutoConfig.from_pretrained(str(self.model_dir))
        self.n_layers = int(config.num_hidden_layers)
        if not 0 <= start < end <= self.n_layers:
            raise ValueError(f"layer range [{start}, {end}) is not inside [0, {self.n_layers})")
        self.start, self.end = int(start), int(end)
        self.first, self.last = self.start == 0, self.end == self.n_layers
        from common.precision_probe import cuda_bf16_native

        cuda = torch.cuda.is_available()
        self.device, self.dtype = pick_device_dtype(cuda, cuda and cuda_bf16_native(device or "cuda"), device, dtype)
        self.max_batch = int(max_batch)
        tdtype = getattr(torch, self.dtype)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config, dtype=tdtype)
        self.config = skeleton.config
        inner = skeleton.model
        self._load(skeleton, tdtype)
        inner.rotary_emb = type(inner.rotary_emb)(config=self.config).to(self.device)
        self._skeleton = skeleton.eval()
        self._model = self._skeleton  # the peft wrapper once an adapter is installed
        self._layers = [inner.layers[i] for i in range(self.start, self.end)]
        self._embed = inner.embed_tokens if self.first else None
        self._norm = inner.norm if self.last else None
        self._head = skeleton.lm_head if self.last else None
        self.hidden_size = int(self.config.hidden_size)
        self.n_vocab = int(self.config.vocab_size)
        self._lora_key: tuple | None = None
        self._lora_name = ""
        self._lora_on = False
        self._version = -1
        self._lock = threading.RLock()
        heads = int(getattr(self.config, "num_key_value_heads", None) or self.config.num_attention_heads)
        head_dim = int(getattr(self.config, "head_dim", None) or self.hidden_size // self.config.num_attention_heads)
        #: KV bytes per token for this stage's layers (keys and values, compute dtype).
        self.kv_bytes_per_token = 2 * heads * head_dim * torch.tensor([], dtype=tdtype).element_size() * (end - start)
        #: Open sessions (``node_agents/stages/sessions.py``: batch limit, KV budget, refusals).
        self.sessions: SessionTable[_Session] = SessionTable(self._lock, self.max_batch, self.kv_bytes_per_token,
                                                             int(kv_budget_bytes))

    # ------------------------------------------------------------------ loading

    def _kept_modules(self, skeleton) -> dict[str, object]:
        inner = skeleton.model
        mods = {f"model.layers.{i}.": inner.layers[i] for i in range(self.start, self.end)}
        if self.first:
            mods["model.embed_tokens."] = inner.embed_tokens
        if self.last:
            mods["model.norm."] = inner.norm
            mods["lm_head."] = skeleton.lm_head
        return mods

    def _load(self, skeleton, tdtype) -> None:
        """Fill the kept modules tensor by tensor: each tensor is read (its file opened for it
        alone, so no mapping of the file outlives it), copied into its parameter in place and
        dropped, so the peak is the stage's weights plus one tensor, not a second copy."""
        from safetensors import safe_open

        torch = self._torch
        mods = self._kept_modules(skeleton)
        for mod in mods.values():
            mod.to_empty(device=self.device)
        tied = self.last and "lm_head.weight" not in self._all_keys()
        filled: dict[str, set[str]] = {prefix: set() for prefix in mods}
        with torch.no_grad():
            for path in _weight_files(self.model_dir):
                with safe_open(str(path), framework="pt", device="cpu") as f:
                    keys = list(f.keys())
                for key in keys:
                    targets = [(prefix, key[len(prefix):]) for prefix in mods if key.startswith(prefix)]
                    if tied and key == "model.embed_tokens.weight":
                        targets.append(("lm_head.", "weight"))
                    if not targets:
                        continue
                    with safe_open(str(path), framework="pt", device="cpu") as f:
                        tensor = f.get_tensor(key)
                    for prefix, name in targets:
                        try:
                            dest = mods[prefix].get_parameter(name)
                        except AttributeError:
                            try:
                                dest = mods[prefix].get_buffer(name)
                            except AttributeError:
                                raise ValueError(f"weights for {prefix} do not fit: unexpected {name}") from None
                        if tuple(dest.shape) != tuple(tensor.shape):
                            raise ValueError(f"weights for {prefix} do not fit: {name} is {tuple(tensor.shape)}, "
                                             f"the model wants {tuple(dest.shape)}")
                        dest.copy_(tensor)
                        filled[prefix].add(name)
                    del tensor
        for prefix, mod in mods.items():
            persistent = {n for n, _ in mod.named_parameters()} | {n for n, b in mod.named_buffers()
                                                                   if not n.endswith("inv_freq")}
            missing = sorted(persistent - filled[prefix])
            if missing:
                raise ValueError(f"weights for {prefix} do not fit: missing {missing[:3]}")
        self.weight_bytes = sum(p.numel() * p.element_size() for m in {id(m): m for m in mods.values()}.values()
                                for p in m.parameters())

    def _all_keys(self) -> set[str]:
        from safetensors import safe_open

        keys: set[str] = set()
        for path in _weight_files(self.model_dir):
            with safe_open(str(path), framework="pt", device="cpu") as f:
                keys.update(f.keys())
        return keys

    # ------------------------------------------------------------------ adapters

    @property
    def adapter_version(self) -> int:
        return self._version

    def set_adapter(self, adapter: LoraAdapter | None) -> None:
        """Install the slices of ``adapter`` for this stage's layers (``None``: the base model,
        version -1; no tensors: the base model under ``adapter.version``)."""
        with self._lock:
            if adapter is None or not adapter.tensors:
                self._lora_on = False
                self._version = -1 if adapter is None else int(adapter.version)
                return
            self._install(adapter)
            self._lora_on = True
            self._version = int(adapter.version)

    def _install(self, adapter: LoraAdapter) -> None:
        import peft

        torch = self._torch
        key = (int(adapter.rank), float(adapter.alpha), tuple(sorted(adapter.target_modules)))
        if key != self._lora_key:
            cfg = peft.LoraConfig(r=key[0], lora_alpha=key[1], lora_dropout=0.0, target_modules=list(key[2]),
                                  layers_to_transform=list(range(self.start, self.end)), layers_pattern="layers")
            name = f"v{adapter.version}"
            if self._lora_key is None:
                self._model = peft.get_peft_model(self._skeleton, cfg, adapter_name=name).eval()
            else:
                self._model.add_adapter(name, cfg)
                self._model.set_adapter(name)
                self._model.delete_adapter(self._lora_name)
            self._lora_key, self._lora_name = key, name
        tag = f".{self._lora_name}."
        params = {n.replace(tag, "."): p for n, p in self._model.named_parameters()
                  if tag in n and (".lora_A." in n or ".lora_B." in n)}
        mine = slice_for_range(adapter.tensors, self.start, self.end)
        if set(mine) != set(params):
            missing, extra = sorted(set(params) - set(mine)), sorted(set(mine) - set(params))
            raise ValueError(f"adapter v{adapter.version} does not fit layers [{self.start}, {self.end}): "
                             f"missing {missing[:3]}, unexpected {extra[:3]}")
        with torch.no_grad():
            for name, param in params.items():
                value = torch.from_numpy(np.ascontiguousarray(mine[name], dtype=np.float32))
                if tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"{name}: shape {tuple(value.shape)}, model has {tuple(param.shape)}")
                param.copy_(value)

    def _adapter_context(self):
        if self._lora_key is not None and not self._lora_on:
            return self._model.disable_adapter()
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ sessions

    def open_session(self, session_id: str, req: StageOpen) -> None:
        from transformers import DynamicCache

        self.sessions.open(session_id, req, self.last, lambda: _Session(
            cache=DynamicCache(config=self.config), batch=req.batch, wire_dtype=req.wire_dtype, max_len=req.max_len,
            temperature=req.temperature, top_p=req.top_p))

    def close_session(self, session_id: str) -> None:
        self.sessions.close(session_id)

    def forward(self, session_id: str, req: StageForward) -> StageResult:
        torch = self._torch
        with self._lock:  # the adapter may have changed since the open: get() refuses then
            s = self.sessions.get(session_id, req.adapter_version, self._version)
            with torch.inference_mode(), self._adapter_context():
                return self._forward(s, req)

    def _forward(self, s: _Session, req: StageForward) -> StageResult:
        torch = self._torch
        from transformers.masking_utils import create_causal_mask

        rows_before = 1 if req.step == 0 else (s.mask.shape[0] if s.mask is not None else 1)
        if req.keep_rows is not None and req.step > 0:
            keep = list(req.keep_rows)
            if not keep or min(keep) < 0 or max(keep) >= rows_before or len(set(keep)) != len(keep):
                raise StageRefused(f"keep_rows {keep[:8]} do not fit a batch of {rows_before}")
            if len(keep) < rows_before:
                idx = torch.tensor(keep, device=self.device)
                s.cache.batch_select_indices(idx)
                s.mask = s.mask[idx]
                if self.last:
                    s.active = [s.active[i] for i in keep]
        if self.first:
            ids = torch.tensor(req.token_ids, dtype=torch.long, device=self.device)  # [rows, T]
            if ids.dim() != 2 or (ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.n_vocab)):
                raise StageRefused("token_ids must be equal-length rows of ids inside the vocabulary")
            h = self._embed(ids)
        else:
            h = from_blob(req.hidden, torch, self.device, getattr(torch, self.dtype))
            if h.dim() != 3 or h.shape[-1] != self.hidden_size:
                raise StageRefused(f"hidden states of shape {tuple(h.shape)}; expected [rows, tokens, "
                                   f"{self.hidden_size}]")
        rows, T = int(h.shape[0]), int(h.shape[1])
        if req.step > 0 and rows != int(s.mask.shape[0]):
            raise StageRefused(f"batch of {rows} rows; the session holds {s.mask.shape[0]}")
        if len(req.position_ids) != T:
            raise StageRefused(f"{len(req.position_ids)} position ids for {T} tokens")
        seen = 0 if req.step == 0 else int(s.mask.shape[1])
        if seen + T > s.max_len:
            raise StageRefused(f"the session would hold {seen + T} tokens per row; it opened with max_len {s.max_len}")
        step_mask = torch.ones((rows, T), dtype=torch.long, device=self.device)
        if req.step == 0:
            if req.attention_mask is not None:
                m = from_blob(req.attention_mask, torch, self.device, torch.long)
                if tuple(m.shape) != (rows, T):
                    raise StageRefused(f"attention_mask of shape {tuple(m.shape)}; expected {(rows, T)}")
                step_mask = m
            s.mask = step_mask
        else:
            s.mask = torch.cat([s.mask, step_mask], dim=1)
        pos = torch.tensor([list(req.position_ids)], dtype=torch.long, device=self.device)  # [1, T]
        mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=s.mask,
                                  past_key_values=s.cache, position_ids=pos, layer_idx=self.start)
        pe = self._skeleton.model.rotary_emb(h, position_ids=pos)
        for layer in self._layers:
            h = layer(h, attention_mask=mask, position_ids=pos, past_key_values=s.cache, use_cache=True,
                      position_embeddings=pe)
        if req.step == 0 and req.expand > 1:
            s.cache.batch_repeat_interleave(req.expand)
            s.mask = s.mask.repeat_interleave(req.expand, dim=0)
        if not self.last:
            return StageResult(step=req.step, hidden=to_blob(h, s.wire_dtype, torch))
        logits = self._head(self._norm(h[:, -1:, :]))  # [rows, 1, vocab]
        rows_np = logits[:, -1, :].float().cpu().numpy()
        return last_stage_result(s, req, rows_np)

