"""Games with text observations: Sokoban, FrozenLake, Bandit, Countdown.

Each game is a `vagen.env.LanguageEnv`; its visual variant in `envs_visual` adds an image renderer
and registers the Gymnasium ids (`vagen/Sokoban-v0`, ...).
"""
