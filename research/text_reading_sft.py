"""Does a dense board-reading loss unlock tiny_text's SFT? (findings: docs/warm_starts.md, the text default)

    python research/text_reading_sft.py [lam=1] [steps=150] [layer=2] [episodes=2400] [eval_episodes=32] [threads=2]
                                        [out=DIR]

SFT of the untrained tiny_text on TINY_TEXT_RECIPE's demonstrations (sokoban_text + frozenlake_text), with an
auxiliary loss of weight `lam`: a linear probe on the hidden state after layer `layer` at every board cell token of
every turn predicts the RELATIVE_DIRECTIONS word of each key cell (player, box, target / player, goal) seen from that
cell, where the key cell comes at or before the cell in the token stream (a causal model cannot see later cells).
lam=0 is the plain recipe. Writes out/log.json (per step: SFT loss, probe loss and accuracy) and out/result.json
(held-out success, greedy and T=0.5, on the evaluator's first `eval_episodes` seeds of each game).
"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vagen.bootstrap.demos import demonstrations, sft_batch
from vagen.bootstrap.tiny import load_tiny_text_lm
from vagen.bootstrap.tiny_text import TEXT_GAMES, TINY_TEXT_RECIPE, build_tiny_text, make_text_game
from vagen.bootstrap.warmstart import evaluate_model, lr_factor, probe_columns, sft_parameter_groups
from vagen.cli import script_options
from vagen.env.policies import RELATIVE_DIRECTIONS, relative_direction
from vagen.forward import policy_forward
from vagen.models.cache import cache_root
from vagen.rollout import DialogueFormatter

DEFAULTS = {
    "lam": 1.0,
    "steps": 150,
    "layer": 2,
    "episodes": 2400,
    "eval_episodes": 32,
    "threads": 2,
    "out": "outputs/text_reading_sft",
}
options, _ = script_options(sys.argv[1:], DEFAULTS, overrides=False)
lam, steps, layer, episodes = float(options.lam), int(options.steps), int(options.layer), int(options.episodes)
out = Path(options.out) / f"lam{lam:g}_steps{steps}_layer{layer}"
out.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(int(options.threads))
recipe = TINY_TEXT_RECIPE
base = build_tiny_text(cache_root(), size=recipe.size, seed=recipe.base_seed)
model, tokenizer = load_tiny_text_lm(base)
formatter = DialogueFormatter(tokenizer, None)
started = time.perf_counter()
demos = [
    d
    for name in TEXT_GAMES
    for d in demonstrations(
        lambda name=name: make_text_game(name), formatter, range(episodes), recipe.noise_eps, recipe.seed, name
    )
]
columns = probe_columns(demos)
width = max(stop for _, stop in columns.values())
MARKER = ["Current", "Ġstate", ":", "Ċ"]


def board_labels(demo, ids):
    """(positions, labels[width]) of every board cell token of every turn of one dialogue row."""
    tokens = tokenizer.convert_ids_to_tokens(ids)
    starts = [i + len(MARKER) for i in range(len(tokens)) if tokens[i : i + len(MARKER)] == MARKER]
    assert len(starts) == len(demo.trajectory.turns), (len(starts), len(demo.trajectory.turns))
    positions, labels = [], []
    lo = columns[demo.trajectory.env_name][0]
    for start, (h, w), keys in zip(starts, demo.grid_shapes, demo.key_cells, strict=True):
        cells, i = {}, start
        for r in range(h):
            for c in range(w):
                assert len(tokens[i]) == 1 and tokens[i] != "Ċ", tokens[start : start + 60]
                cells[(r, c)] = i
                i += 1
            if r < h - 1:
                assert tokens[i] == "Ċ", tokens[i]
                i += 1
        for (r, c), pos in cells.items():
            row = np.full(width, -100, dtype=np.int64)
            for k, key in enumerate(keys):
                if cells[tuple(key)] <= pos:
                    row[lo + k] = RELATIVE_DIRECTIONS.index(relative_direction(key[0] - r, key[1] - c))
            positions.append(pos)
            labels.append(row)
    return positions, np.stack(labels)


hidden = {}
model.model.layers[layer - 1].register_forward_hook(
    lambda m, i, o: hidden.__setitem__("h", o[0] if isinstance(o, tuple) else o)
)
probe = torch.nn.Linear(model.config.hidden_size, width * len(RELATIVE_DIRECTIONS))
groups = [*sft_parameter_groups(model, recipe), {"params": list(probe.parameters())}]
optimizer = torch.optim.AdamW(groups, lr=recipe.lr, weight_decay=recipe.weight_decay)
schedule = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: lr_factor(s, steps, recipe.warmup_steps, recipe.lr_floor)
)
generator, order, log = np.random.default_rng(recipe.seed), [], []
model.train()
torch.manual_seed(recipe.seed)
for step in range(steps):
    if len(order) < recipe.batch_size:
        order += generator.permutation(len(demos)).tolist()
    rows, order = order[: recipe.batch_size], order[recipe.batch_size :]
    batch = sft_batch([demos[i] for i in rows], tokenizer.pad_token_id)
    logprobs, _ = policy_forward(model, batch, tokenizer)
    mask = batch.response_mask
    sft = -(logprobs * mask).sum() / mask.sum()
    b_idx, p_idx, labs = [], [], []
    for r, i in enumerate(rows):
        ids = batch.input_ids[r][batch.attention_mask[r].bool()].tolist()
        pos, lab = board_labels(demos[i], ids)
        b_idx += [r] * len(pos)
        p_idx += pos
        labs.append(lab)
    feats = hidden["h"][torch.tensor(b_idx), torch.tensor(p_idx)]
    logits = probe(feats).view(-1, len(RELATIVE_DIRECTIONS))
    target = torch.as_tensor(np.concatenate(labs)).view(-1)
    read = torch.nn.functional.cross_entropy(logits, target)
    accuracy = float((logits.argmax(-1) == target)[target >= 0].float().mean())
    loss = sft + lam * read
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
    optimizer.step()
    schedule.step()
    log.append(
        {
            "step": step + 1,
            "sft": sft.item(),
            "read": read.item(),
            "read_acc": accuracy,
            "s": time.perf_counter() - started,
        }
    )
    if (step + 1) % 10 == 0:
        print(json.dumps(log[-1]), flush=True)
model.eval()
result = {
    "lam": lam,
    "steps": steps,
    "layer": layer,
    "sft_last10pct": float(np.mean([r["sft"] for r in log[-max(1, steps // 10) :]])),
    "read_acc_last10pct": float(np.mean([r["read_acc"] for r in log[-max(1, steps // 10) :]])),
}
for name in TEXT_GAMES:
    for temperature in (0.0, 0.5):
        result[f"{name}_T{temperature:g}"] = evaluate_model(
            model,
            tokenizer,
            int(options.eval_episodes),
            temperature,
            recipe.max_new_tokens,
            lambda name=name: make_text_game(name),
            name,
        )
        print(name, temperature, result[f"{name}_T{temperature:g}"], flush=True)
result["seconds"] = time.perf_counter() - started
(out / "result.json").write_text(json.dumps(result, indent=1))
(out / "log.json").write_text(json.dumps(log))
print(json.dumps(result))
