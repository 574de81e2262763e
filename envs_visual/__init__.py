"""Visual variants of the text games: the same game, observed as an image (or text + image).

Importing this package registers the Gymnasium ids below; `vagen.env.make_env` imports it on
first use, so `make_env("vagen/Sokoban-v0", observation="image")` needs no import by the caller.
Entry points are strings, so a game module is only imported when its env is made.
"""

from vagen.env.registry import register_env

ENTRY_POINTS = {
    "vagen/Sokoban-v0": "envs_visual.sokoban:SokobanEnv",
    "vagen/FrozenLake-v0": "envs_visual.frozenlake:FrozenLakeEnv",
    "vagen/Bandit-v0": "envs_visual.bandit:BanditEnv",
    "vagen/Countdown-v0": "envs_visual.countdown:CountdownEnv",
    "vagen/Navigation-v0": "envs_visual.navigation:NavigationEnv",
    "vagen/Sudoku-v0": "envs_visual.sudoku:SudokuEnv",
    "vagen/Cards-v0": "envs_visual.cards:CardsEnv",
}

for _env_id, _entry_point in ENTRY_POINTS.items():
    register_env(_env_id, _entry_point)
