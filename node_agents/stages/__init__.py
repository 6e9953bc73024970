"""Layer-range stages of pipeline-sharded generation, one module per backend, plus the head
that drives a route of stages (:mod:`node_agents.stages.head`)."""
