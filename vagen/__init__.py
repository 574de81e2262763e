"""VAGEN: multi-turn RL for vision-language and text agents, with training diagnostics."""

__version__ = "0.1.0"
