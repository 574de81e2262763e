"""Does tiny_vl's warm start play Sokoban better when its `<think>` names the walls next to the box?
(findings: docs/warm_starts.md, "A Sokoban reading that names the walls next to the box")

    python research/wall_reading_sft.py [reading_walls=true] [wall_labels=true] [seed=0] [vision_steps=400]
                                        [eval_episodes=128] [threads=2] [out=DIR]

Runs the shipped tiny_vl recipe (`WarmStartRecipe()`, sokoban_visual + frozenlake_visual, from the same untrained base)
with sokoban_visual's demonstrations written by `SokobanTextEnv(reading_walls=...)`: "box is left of me, target is
up of box, walls down of box." instead of "box is left of me, target is up of box.", and the vision pre-training
(`vision_steps`) also labelling every tile with its wall neighbours (`SokobanTextEnv.tile_facts`; not with
`wall_labels=false`). `seed` is the recipe's seed (data order, noise). Writes out/<label> as a model folder with its
report.json (held-out success at T=0.5 and greedy). Train or evaluate from it with `model=tiny_vl
model.source=pretrained model.path=out/<label> env.kwargs.reading_walls=true`, so that the probe and the reading
counts use the same reading.
"""

import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from vagen.bootstrap.tiny import build_tiny_vl, load_tiny_vl
from vagen.bootstrap.warmstart import WarmStartRecipe, make_frozenlake_visual, make_sokoban_visual, warm_start
from vagen.cli import script_options

DEFAULTS = {
    "reading_walls": True,
    "wall_labels": True,
    "seed": 0,
    "vision_steps": WarmStartRecipe.vision_steps,
    "eval_episodes": 128,
    "threads": 2,
    "out": "outputs/wall_reading_sft",
}


def main() -> None:
    options, _ = script_options(sys.argv[1:], DEFAULTS, overrides=False)
    torch.set_num_threads(int(options.threads))
    recipe = replace(WarmStartRecipe(), vision_steps=int(options.vision_steps), seed=int(options.seed))
    recipe = replace(recipe, eval_episodes=int(options.eval_episodes))
    walls, labels = bool(options.reading_walls), bool(options.wall_labels)
    out = Path(options.out) / f"walls{int(walls)}_labels{int(labels)}_vision{recipe.vision_steps}_seed{recipe.seed}"
    out.mkdir(parents=True, exist_ok=True)
    model, processor = load_tiny_vl(build_tiny_vl(size=recipe.size, seed=recipe.base_seed))
    make = partial(make_sokoban_visual, reading_walls=walls, wall_labels=labels)
    report = warm_start(model, processor, recipe, out, make, other_games={"frozenlake_visual": make_frozenlake_visual})
    print(f"{out}: sokoban_visual {report['eval']}")


if __name__ == "__main__":
    main()
