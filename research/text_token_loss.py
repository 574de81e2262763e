"""Where does a text model's SFT loss sit? Per-token-class NLL on unseen demonstrations of the text games.

    python research/text_token_loss.py [model=DIR] [episodes=48] [list_positions=false] [threads=1]

`model` is a tiny_text-style folder (default: the text default, `build_warm_tiny_text()`). The demonstrations are
TINY_TEXT_RECIPE's noisy solver play on seeds 70,000 + k (neither training nor held-out levels), with
`env.kwargs.list_positions` as given. Every supervised response token is put in one class: the answer's moves
(`answer:act`), the think text's direction words (`think:dir`, up / down / left / right) and digits (`think:digit`),
the rest of the think and answer text, and the template around them. Prints, per game, each class's token count,
mean NLL in nats and share of the loss: a class at ln(choices) is guessed, not read (findings: docs/warm_starts.md).
"""

import sys

import numpy as np
import torch

from vagen.bootstrap.demos import demonstrations, sft_batch
from vagen.bootstrap.tiny import load_tiny_text_lm
from vagen.bootstrap.tiny_text import TEXT_GAMES, TINY_TEXT_RECIPE, build_warm_tiny_text, make_text_game
from vagen.cli import script_options
from vagen.forward import policy_forward
from vagen.rollout import DialogueFormatter

DEFAULTS = {"model": "", "episodes": 48, "list_positions": False, "threads": 1}
DIRECTIONS, MOVES = {"up", "down", "left", "right"}, {"Up", "Down", "Left", "Right"}


def token_classes(tokens: list[str], mask: np.ndarray) -> list[tuple[int, str]]:
    """(position, class) of every supervised token; the tags <think>, <answer> and their ends split the segments."""
    segment, classes = "template", []
    for j, token in enumerate(tokens):
        before = tokens[j - 1] if j else ""
        if token in ("think", "answer"):
            segment = "template" if before == "</" else token
            continue
        if not mask[j]:
            continue
        word = token.replace("Ġ", "")
        if segment == "think" and word in DIRECTIONS:
            classes.append((j, "think:dir"))
        elif segment == "think" and word.isdigit():
            classes.append((j, "think:digit"))
        elif segment == "answer" and word in MOVES:
            classes.append((j, "answer:act"))
        else:
            classes.append((j, segment))
    return classes


def main() -> None:
    options, _ = script_options(sys.argv[1:], DEFAULTS, overrides=False)
    torch.set_num_threads(int(options.threads))
    model, tokenizer = load_tiny_text_lm(options.model or build_warm_tiny_text())
    model.eval()
    formatter = DialogueFormatter(tokenizer, None)
    for name in TEXT_GAMES:
        make = lambda name=name: make_text_game(name, list_positions=bool(options.list_positions))
        seeds = range(70_000, 70_000 + int(options.episodes))
        demos = demonstrations(make, formatter, seeds, TINY_TEXT_RECIPE.noise_eps, 5, name)
        losses: dict[str, list[float]] = {}
        for start in range(0, len(demos), 8):
            batch = sft_batch(demos[start : start + 8], tokenizer.pad_token_id)
            with torch.no_grad():
                logprobs, _ = policy_forward(model, batch, tokenizer)
            for row in range(logprobs.shape[0]):
                tokens = tokenizer.convert_ids_to_tokens(batch.input_ids[row].tolist())
                for j, kind in token_classes(tokens, batch.response_mask[row].numpy() > 0):
                    losses.setdefault(kind, []).append(-float(logprobs[row, j]))
        total = sum(sum(values) for values in losses.values())
        count = sum(len(values) for values in losses.values())
        print(f"{name}: {count} tokens, mean NLL {total / count:.3f}")
        for kind, values in sorted(losses.items()):
            share = sum(values) / total
            print(f"  {kind:12s} {len(values):5d} tokens  NLL {np.mean(values):.3f}  {share:4.0%} of the loss")


if __name__ == "__main__":
    main()
