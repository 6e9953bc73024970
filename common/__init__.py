"""Types both roles share, below swarm/, tasks/, node_agents/ and learner/: a LoRA adapter
(``common.lora``), the embedded default model (``common.default_model``) and the model
conversion cache (``common.model_cache``). Imports nothing of the project."""
