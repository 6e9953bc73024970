"""Sokoban: level generator (reverse play), BFS solver, renderer, environment, parser, rewards."""

from tasks.sokoban.task import SokobanConfig, SokobanTask

__all__ = ["SokobanConfig", "SokobanTask"]
