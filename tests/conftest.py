"""Fakes shared by the fast multi-turn episode tests (tasks, learner, node_agents).

``chatml_tokenizer``: a character-level tokenizer with a ChatML chat template whose two markers
are single special tokens. ``scripted_backend``: a factory of generation backends that answer
from a list of assistant texts, chosen by each completion's seed (so episodes are reproducible
and differ between completions), with made-up negative log-probs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from netns_hosts import netns_hosts  # noqa: E402,F401  (emulated hosts in network namespaces)

SPECIALS = ("<|im_start|>", "<|im_end|>")
SPECIAL_BASE = 1_000_000


class ChatMLTokenizer:
    all_special_ids = [SPECIAL_BASE, SPECIAL_BASE + 1]

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids = []
        for piece in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text):
            if piece in SPECIALS:
                ids.append(SPECIAL_BASE + SPECIALS.index(piece))
            else:
                ids += [ord(c) for c in piece]
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=False):
        out = []
        for i in ids:
            if i >= SPECIAL_BASE:
                if not skip_special_tokens:
                    out.append(SPECIALS[i - SPECIAL_BASE])
            else:
                out.append(chr(i))
        return "".join(out)

    def __len__(self):
        return SPECIAL_BASE + len(SPECIALS)


class ScriptedBackend:
    """``generate_group`` answers with one of ``replies`` per completion (index from its seed),
    ended by ``<|im_end|>`` unless it is cut at ``max_tokens``; records every call."""

    def __init__(self, tokenizer, replies, n_ctx=None):
        self.tok, self.replies, self.calls = tokenizer, list(replies), []
        if n_ctx is not None:
            self.n_ctx = n_ctx

    def generate_group(self, prompt_ids, n, params):
        from node_agents.backends.base import SampledCompletion

        self.calls.append((list(prompt_ids), n, params))
        out = []
        for j in range(n):
            rng = np.random.default_rng([params.seed, j])
            text = self.replies[int(rng.integers(len(self.replies)))]
            ids = self.tok(text)["input_ids"] + [SPECIAL_BASE + 1]
            finish = "stop"
            if len(ids) > params.max_tokens:
                ids, finish = ids[:params.max_tokens], "length"
            out.append(SampledCompletion(ids, [-0.5] * len(ids), finish))
        return out


@pytest.fixture
def chatml_tokenizer():
    return ChatMLTokenizer()


@pytest.fixture
def scripted_backend():
    return ScriptedBackend
