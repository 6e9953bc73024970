"""Adapter dissemination: encode a LoRA version, sign its manifest, and spread its chunks
through a pipelined, peer-assisted broadcast tree (or a star, for comparison)."""
