"""The chunk layer: how any signed, chunked content travels between peers. Adapter versions
(``swarm.dissem``: push tree, relay instructions, codec) and the base model (``swarm.content``:
identity, manifest builder) both ride on it.

- ``manifest``: the manifest base (chunk geometry and checks, signing and verification by the
  learner's libp2p key under a per-kind domain tag, the content id chunk requests name);
- ``store``: the :class:`~swarm.chunks.store.ChunkStore` interface, have-maps, in-memory and
  file-backed stores; ``disk``: the resumable, hash-checked on-disk store;
- ``serve``: one chunk server per host (``CHUNKS``: request/reply pairs with a have-map,
  ``swarm.proto.chunks``) for all the content it holds;
- ``pull``: the multi-peer puller (several holders at once, every chunk hash-checked, lying or
  stalled holders dropped, the anchor optionally last); ``choice``: its pure decisions and settings;
- ``streams``: closing a raw stream from any state.
"""
