"""A deeper copy of a trained policy that plays exactly as it does: block expansion (Wu et al. 2024, "LLaMA Pro").
`python research/deepen.py model=tiny_vl out=<folder> [every=1]`

After every `every` decoder layers of the language model a copy of the last one is inserted, with its attention's
output projection and its MLP's down projection set to zero: each new block adds nothing to the residual stream, so
the deeper model's logits equal the original's, and training (`scripts/sft.py` or `scripts/train.py` with
`model.source=pretrained model.path=<folder>`) starts from the same policy with more layers to learn in. The vision
tower, embeddings and head are unchanged. This asks whether the policy's depth is what limits a decision it has not
learned (the long Sokoban levels' first move, docs/learning.md), with the start held fixed.

Options:
  model=NAME|DIR  a configs/model name or model / run folder (as scripts/evaluate.py's model=)
  out=DIR         where the deeper model's folder is written (a `save_pretrained` folder with its processor)
  every=N         a new block after every N layers (1: twice the layers)
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from vagen.cli import script_options
from vagen.eval.models import load_local_policy, resolve_models
from vagen.models.processor import load_processor, save_processor

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = {"model": "", "out": "", "every": 1}
ZEROED = ("self_attn.o_proj.", "mlp.down_proj.")  # a block's two writes into the residual stream


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The language model's decoder layers of a Qwen2.5-VL or a causal LM."""
    inner = model.model
    return getattr(inner, "language_model", inner).layers


def expanded_order(layers: int, every: int) -> list[tuple[int, bool]]:
    """Each new layer's (source layer, is a zeroed copy): the originals in order, a copy after every `every`."""
    if every < 1 or every > layers:
        raise ValueError(f"every={every} must be between 1 and the model's {layers} layers.")
    order = []
    for index in range(layers):
        order.append((index, False))
        if (index + 1) % every == 0:
            order.append((index, True))
    return order


def deepen(model: torch.nn.Module, every: int = 1) -> torch.nn.Module:
    """A new model with a zeroed copy of a layer after every `every` decoder layers; its outputs equal `model`'s."""
    config = copy.deepcopy(model.config)
    text = getattr(config, "text_config", config)
    order = expanded_order(text.num_hidden_layers, every)
    text.num_hidden_layers = len(order)
    if getattr(text, "layer_types", None):
        text.layer_types = [text.layer_types[source] for source, _ in order]
    deeper = type(model)(config).to(next(model.parameters()).dtype)
    layers = decoder_layers(model)
    prefix = next(name for name, module in model.named_modules() if module is layers) + "."
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(prefix)}
    for target, (source, zeroed) in enumerate(order):
        for name, value in layers[source].state_dict().items():
            zero = zeroed and name.startswith(ZEROED)
            state[f"{prefix}{target}.{name}"] = torch.zeros_like(value) if zero else value
    deeper.load_state_dict(state, strict=True)
    return deeper.eval()


def main(argv: list[str]) -> None:
    options, _ = script_options(argv, DEFAULTS, overrides=False, required={"model": "tiny_vl", "out": "<folder>"})
    engine = OmegaConf.load(ROOT / "configs" / "engine" / "hf.yaml")
    (spec,) = resolve_models(str(options.model), engine, ROOT / "configs", {})
    policy = load_local_policy(spec, "cpu")
    try:
        deeper = deepen(policy.model, int(options.every))
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    out = Path(options.out)
    deeper.save_pretrained(out)
    if policy.image_processor is not None:
        save_processor(load_processor(policy.folder), out)
    else:
        policy.tokenizer.save_pretrained(out)
    before = sum(p.numel() for p in policy.model.parameters())
    after = sum(p.numel() for p in deeper.parameters())
    print(
        f"{len(decoder_layers(policy.model))} -> {len(decoder_layers(deeper))} layers, "
        f"{before / 1e6:.2f}M -> {after / 1e6:.2f}M parameters: {out}"
    )
    print(f"train it with: model.source=pretrained model.path={out} model.name={out.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
