"""Quick generation-throughput probe run at join; the figure goes into the hello."""

from __future__ import annotations

import time

from node_agents.backends.base import Backend, SamplingParams

#: Tokens generated per sequence by the probe, and sequences in its batch.
PROBE_TOKENS = 16
PROBE_SEQUENCES = 4


def probe_throughput(backend: Backend) -> float:
    """Generate a short batch from a fixed prompt; store tokens/s in the backend's capabilities."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    t0 = time.perf_counter()
    comps = backend.generate_group(prompt, PROBE_SEQUENCES, SamplingParams(1.0, 1.0, PROBE_TOKENS, seed=0))
    elapsed = time.perf_counter() - t0
    rate = sum(len(c.token_ids) for c in comps) / max(elapsed, 1e-9)
    backend.measured_tokens_per_s = rate  # type: ignore[attr-defined]
    return rate
