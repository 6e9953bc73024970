"""What the run, the steps and verification ask of the trainer: :class:`TrainerAPI`, a Protocol that
:class:`learner.trainer.Trainer` (one rank) and :class:`learner.trainer_build.RankZeroTrainer`
(rank 0 of several) both satisfy. The loop types its trainer by it, so this module imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from common.lora import LoraAdapter
    from learner.step_check import StepChecks


class RankView(Protocol):
    """The trainer's ranks, as the loop sees them."""

    @property
    def active(self) -> bool:
        """Several ranks train together (torchrun)."""


class TrainerAPI(Protocol):
    @property
    def ranks(self) -> RankView: ...

    @property
    def step(self) -> int:
        """Optimizer steps taken."""

    def describe(self) -> str:
        """One line for the start of a run: device, dtypes, memory, ranks."""

    def train_step(self, batch: Sequence[Any], checks: StepChecks | None = None) -> dict[str, float]:
        """One GRPO update; ``checks``: the verification it makes on its first forward."""

    def logprobs(self, batch: Sequence[Any], autocast: bool | None = None) -> list[np.ndarray]:
        """Per-token log-probs of each sample's completion under the current policy."""

    def token_stats(self, prompt_ids: Sequence[int], completions: Sequence[Sequence[int]], temperature: float,
                    autocast: bool | None = None, uniforms: Sequence[np.ndarray] | None = None,
                    top_p: float = 1.0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Per completion and token: log-prob, entropy, surprisal variance and (with ``uniforms``)
        the draw distance (verification)."""

    def swapped_adapter(self, tensors: dict[str, np.ndarray]) -> AbstractContextManager[None]:
        """Within: the LoRA weights are ``tensors`` (an older version's, to verify its groups)."""

    @property
    def bf16_autocast(self) -> bool:
        """The forward runs under bf16 autocast."""

    @property
    def base_dtype(self) -> str:
        """Storage dtype of the frozen base (``float32`` or ``bfloat16``)."""

    def export_adapter(self, version: int) -> LoraAdapter:
        """The LoRA weights as version ``version``."""

    def save_adapter(self, directory: str | os.PathLike[str]) -> Path: ...

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path: ...

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """LoRA weights, optimizer state and step (what rank 0 sends the other ranks)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
