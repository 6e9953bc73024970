"""The head's own stage runs in its process (``LocalLink``, a host cannot dial itself): the
route still matches the whole model, and the local hop checks range and adapter version like
a remote stage. Tiny random Llama, one process, real libp2p for the remote hops."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import N_LAYERS, PROMPT, run_hosts, tiny_adapter

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def test_local_first_stage_matches_whole_model_and_refuses_a_stale_version(tiny_dir, tmp_path):
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.backends.torch_backend import TorchBackend
    from node_agents.stages.head import HeadStats, RouteStage, generate_over_route
    from node_agents.stages.torch_stage import TorchStage
    from swarm.pipeline.client import StageError

    adapter = tiny_adapter(4)
    own = TorchStage(tiny_dir, 0, 2, threads=1)
    remote = TorchStage(tiny_dir, 2, N_LAYERS, threads=1)
    for s in (own, remote):
        s.set_adapter(adapter)
    whole = TorchBackend(tiny_dir, n_ctx=128, threads=1)
    whole.set_adapter(adapter)
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=10, seed=3)
    eog = eog_token_ids(tiny_dir)

    async def body(head, route):
        full = [RouteStage(head.peer_id, 0, 2)] + route
        stats = HeadStats()
        got = await generate_over_route(head, full, N_LAYERS, PROMPT, 4, params, 4, eog=eog, n_ctx=128,
                                        stats=stats, local={head.peer_id: own})
        assert len(own.sessions) == 0  # the local session is closed with the generation
        errors = []
        own.set_adapter(tiny_adapter(5))  # the head's own stage moved on: its hop refuses v4
        try:
            await generate_over_route(head, full, N_LAYERS, PROMPT, 4, params, 4, eog=eog, n_ctx=128,
                                      local={head.peer_id: own})
        except StageError as e:
            errors.append(e)
        bad = [RouteStage(head.peer_id, 0, 3), RouteStage(route[0].peer_id, 3, N_LAYERS)]
        try:  # a wrong range at the local hop
            await generate_over_route(head, bad, N_LAYERS, PROMPT, 4, params, 5, eog=eog, n_ctx=128,
                                      local={head.peer_id: own})
        except StageError as e:
            errors.append(e)
        return got, stats, errors

    got, stats, errors = run_hosts(tmp_path, [remote], body)
    ref = whole.generate_group(PROMPT, 4, params)
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    assert max(float(np.max(np.abs(np.subtract(a.logprobs, b.logprobs)))) for a, b in zip(got, ref)) < 1e-4
    assert stats.tokens > 0 and len(stats.busy_s) == 2
    assert len(errors) == 2 and not any(e.lost for e in errors)
    assert "stale adapter version: asked for 4, this stage holds 5" in str(errors[0])
    assert "wrong layer range" in str(errors[1])


def test_a_stage_gone_before_the_first_step_is_taken_over_by_a_spare(tiny_dir, tmp_path):
    from node_agents.backends.base import SamplingParams
    from node_agents.backends.eog import eog_token_ids
    from node_agents.stages.head import HeadStats, RouteStage, generate_over_route
    from node_agents.stages.torch_stage import TorchStage
    from swarm.pipeline.client import LinkConfig, StageError

    own = TorchStage(tiny_dir, 0, 2, threads=1)
    spare = TorchStage(tiny_dir, 2, N_LAYERS, threads=1)
    params = SamplingParams(temperature=0.0, max_tokens=6, seed=1)
    eog = eog_token_ids(tiny_dir)
    gone = "12D3KooWKgAw6iPyzty22P3zECxDRnmrrQJAoYkTFWUhMktPY4gA"  # a peer nobody can dial
    fast = LinkConfig(open_timeout_s=5.0)

    async def body(head, route):
        full = [RouteStage(head.peer_id, 0, 2), RouteStage(gone, 2, N_LAYERS)]
        stats = HeadStats()
        got = await generate_over_route(head, full, N_LAYERS, PROMPT, 3, params, -1, eog=eog, n_ctx=128,
                                        stats=stats, spares=route, local={head.peer_id: own}, config=fast)
        ref = await generate_over_route(head, [full[0]] + route, N_LAYERS, PROMPT, 3, params, -1, eog=eog,
                                        n_ctx=128, local={head.peer_id: own})
        with pytest.raises(StageError) as no_spare:
            await generate_over_route(head, full, N_LAYERS, PROMPT, 3, params, -1, eog=eog, n_ctx=128,
                                      local={head.peer_id: own}, config=fast)
        return got, ref, stats, no_spare.value

    got, ref, stats, err = run_hosts(tmp_path, [spare], body)
    assert [c.token_ids for c in got] == [c.token_ids for c in ref]
    assert stats.replays == [(1, 0, gone)]
    assert err.lost
