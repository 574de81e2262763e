"""Does a FrozenLake policy know which neighbours of the player are holes? (findings: docs/learning.md,
"What the policy cannot see: holes next to the player")

    python research/hole_probe.py [model=tiny_vl | <run, checkpoint or scripts/sft.py folder>] [states=1000]
                                  [threads=1]
    python research/hole_probe.py env=frozenlake_text model=tiny_text [path=<a bare model folder of that kind>]

At `states` first-turn states of `env` (frozenlake_visual or frozenlake_text: configs/env/<env>.yaml; reset seeds 0,
1, ...; the player's start cell is random), the prompt and the demonstration's `<think>` up to its hole part ("goal is
down-right of me,") are run through the model once. Two measurements of the same states:
- the model's own reading: its greedy continuation from there ("no hole next to me." / "holes up left."), per side
  of the player: how often right, and the share of the holes that are there it names (recall);
- linear probes (logistic regression on 70% of the states, scored on the other 30%) for "a hole is up / down / left /
  right of the player", from each layer's hidden state at two positions: the last one (where the model decides what
  to write next) and the player's own token: from images, its merged image token (one per 28-px tile; what the vision
  tower gives the language model about that tile); from text, the player's cell of the board (tiny_text keeps each
  cell one token). A probe at the majority class's accuracy with no recall finds no such feature there.

The truth comes from the game (`state_objects`: the player and every hole), never from the model's text.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from vagen.cli import script_options
from vagen.env.policies import SIDES, described_response
from vagen.env.registry import make_env
from vagen.eval.models import load_local_policy, resolve_model
from vagen.models.inputs import image_model_inputs, prompt_position_ids
from vagen.rollout import DialogueFormatter

# path: weights saved without a run's or scripts/sft.py's config (research/text_hole_reading.py out=), loaded as `model`
DEFAULTS = {"model": "tiny_vl", "env": "frozenlake_visual", "states": 1000, "threads": 1, "path": None}
GAMES = ("frozenlake_visual", "frozenlake_text")
CLAIMED = re.compile(r"holes ((?:(?:up|down|left|right)\s*)+)")


def holes_beside(env) -> list[bool]:
    """For each of `SIDES` (up, down, left, right): is that neighbour of the player a hole?"""
    objects = env.unwrapped.state_objects()
    player = objects[0][1]
    holes = {cell for kind, cell in objects if kind == "hole"}
    return [(player[0] + dr, player[1] + dc) in holes for dr, dc in SIDES.values()]


def greedy_text(model, tokenizer, ids: list[int], vision: dict, logits: torch.Tensor, max_tokens: int = 8) -> str:
    """The model's greedy continuation of `ids` (whose last logits are `logits`) up to the first '.'."""
    ids, said = list(ids), []
    for _ in range(max_tokens):
        said.append(int(logits.argmax()))
        if "." in tokenizer.decode(said):
            break
        ids.append(said[-1])
        batch = torch.tensor([ids])
        positions, _ = prompt_position_ids(model, batch, torch.ones_like(batch), vision.get("image_grid_thw"))
        logits = model(input_ids=batch, position_ids=positions, **vision).logits[0, -1]
    return tokenizer.decode(said)


def player_token(model, batch: torch.Tensor, board: list[str], player: tuple[int, int]) -> int:
    """The index in `batch` [1, T] of the token that shows the player's cell: its merged image token (one per tile)
    from images, its board cell from text (a board model's cell positions, `BoardEmbedding.positions`)."""
    image_token = getattr(model.config, "image_token_id", None)
    if image_token is not None:
        tiles = (batch[0] == image_token).nonzero().flatten()
        if len(tiles) != len(board) * len(board[0]):
            raise ValueError(
                f"{len(tiles)} image tokens for a {len(board)}x{len(board[0])} board: the "
                "probe needs one merged image token per tile (tile_px=28, as tiny_vl's processor)."
            )
        return int(tiles[player[0] * len(board[0]) + player[1]])
    positions = getattr(model.get_input_embeddings(), "positions", None)
    if positions is None:
        raise ValueError("from text, the probe needs a board model that knows its cells' positions (tiny_text).")
    rows, cols = positions(batch)
    cell = ((rows[0] == player[0] + 1) & (cols[0] == player[1] + 1)).nonzero().flatten()
    if len(cell) != 1:
        raise ValueError(f"found the player's cell {len(cell)} times in the prompt, expected once.")
    return int(cell[0])


def fit_probe(features: np.ndarray, labels: np.ndarray, train: int) -> tuple[np.ndarray, np.ndarray]:
    """Logistic regression (L2 1e-3, standardised features) per label column; (test accuracy, test recall) each."""
    x = torch.tensor(features, dtype=torch.float32)
    x = (x - x[:train].mean(0)) / (x[:train].std(0) + 1e-6)
    y = torch.tensor(labels, dtype=torch.float32)
    weight = torch.zeros(x.shape[1], y.shape[1], requires_grad=True)
    bias = torch.zeros(y.shape[1], requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=200)

    def closure():
        optimizer.zero_grad()
        logits = x[:train] @ weight + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[:train]) + 1e-3 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        predicted = ((x[train:] @ weight + bias) > 0).float()
    truth = y[train:]
    return (predicted == truth).float().mean(0).numpy(), ((predicted * truth).sum(0) / truth.sum(0)).numpy()


def fmt(values) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def main() -> None:
    options, _ = script_options(sys.argv[1:], DEFAULTS, overrides=False)
    torch.set_num_threads(int(options.threads))
    if options.env not in GAMES:
        raise SystemExit(f"error: env={options.env}: the probe reads FrozenLake's holes; use {' or '.join(GAMES)}.")
    env_config = OmegaConf.load(f"configs/env/{options.env}.yaml")
    overrides = {"source": "pretrained", "path": options.path} if options.path else {}
    spec = resolve_model(str(options.model), OmegaConf.create({"name": "hf"}), Path("configs"), overrides)
    policy = load_local_policy(spec, "cpu")
    model, tokenizer = policy.model, policy.tokenizer
    formatter = DialogueFormatter(tokenizer, policy.image_processor)
    env = make_env(env_config.id, **OmegaConf.to_container(env_config.kwargs))
    last, tile, truth, said = [], [], [], []
    with torch.inference_mode():
        for seed in range(int(options.states)):
            observation, _ = env.reset(seed=seed)
            reasoning = env.unwrapped.demo_reasoning()  # "goal is <dir> of me, <holes>."
            response = described_response(env, [env.unwrapped.action_names[0]], reasoning)
            prefix = response[: response.index(reasoning) + reasoning.index(",") + 1]
            ids = formatter.first_prompt(observation) + tokenizer(prefix, add_special_tokens=False)["input_ids"]
            vision = image_model_inputs(model, policy.processor, list(observation.images))
            batch = torch.tensor([ids])
            positions, _ = prompt_position_ids(model, batch, torch.ones_like(batch), vision.get("image_grid_thw"))
            out = model(input_ids=batch, position_ids=positions, output_hidden_states=True, **vision)
            player = player_token(model, batch, env.unwrapped.desc, env.unwrapped.state_objects()[0][1])
            last.append(torch.stack([h[0, -1] for h in out.hidden_states]).numpy())
            tile.append(torch.stack([h[0, player] for h in out.hidden_states]).numpy())
            truth.append(holes_beside(env))
            text = greedy_text(model, tokenizer, ids, vision, out.logits[0, -1])
            named = CLAIMED.search(text)
            said.append([side in (named.group(1).split() if named else []) for side in SIDES])
    truth, said = np.array(truth, dtype=float), np.array(said, dtype=float)
    last, tile, train = np.array(last), np.array(tile), int(0.7 * len(truth))
    sides = " / ".join(SIDES)
    print(f"{spec.label}: {len(truth)} first-turn states; a hole {sides} of the player in "
          f"{' / '.join(f'{v:.1%}' for v in truth.mean(0))}")  # fmt: skip
    majority = np.maximum(truth[train:].mean(0), 1 - truth[train:].mean(0))
    print(f"| what | accuracy ({sides}), test states | recall of the holes there |")
    print("|---|---|---|")
    print(f"| majority class | {fmt(majority)} | |")
    print(f"| the model's own reading | {fmt((said[train:] == truth[train:]).mean(0))} | "
          f"{fmt((said[train:] * truth[train:]).sum(0) / truth[train:].sum(0))} |")  # fmt: skip
    for name, features in (("last position", last), ("player's token", tile)):
        for layer in range(features.shape[1]):
            accuracy, recall = fit_probe(features[:, layer], truth, train)
            print(f"| probe, {name}, hidden state {layer} | {fmt(accuracy)} | {fmt(recall)} |")


if __name__ == "__main__":
    main()
