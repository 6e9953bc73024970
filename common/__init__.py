"""Types both roles share, below swarm/, tasks/, node_agents/ and learner/: a LoRA adapter
(``common.lora``), the embedded default model (``common.default_model``), the model
conversion cache (``common.model_cache``), and the machine's facts (``common.machine``), its
start-up precision probe (``common.precision_probe``) and the hardware choices made from them
(``common.choosers``). Imports nothing of the project."""
