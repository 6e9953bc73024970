"""Content that travels through the swarm besides adapters: the run's base model.

``model_id``: what "the same model" means (a content hash, cached per path+size+mtime);
``manifest``: the learner-signed model manifest (files, chunk hashes); ``store``: a model's
chunks on disk (resumable); ``fetch``: getting the chunks from several peers at once;
``serve``: answering other peers' chunk requests. Nothing here imports torch.
"""
