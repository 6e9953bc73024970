"""Content that travels through the swarm besides adapters: the run's base model, on the chunk
layer (``swarm.chunks``: signing, stores, the chunk server and the multi-peer puller).

``model_id``: what "the same model" means (a content hash, cached per path+size+mtime);
``manifest``: the learner-signed model manifest (files, chunk hashes) and its builder;
``store``: a model's chunks on disk (resumable), finished into the model's files;
``fetch``: the model's puller. Nothing here imports torch.
"""
