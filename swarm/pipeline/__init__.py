"""Pipeline-sharded generation: the layer allocator (pure), the stage protocol
(``/echo-swarm/pipeline/1.0.0``) and its client and server. Imports no torch."""
