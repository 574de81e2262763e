"""Supervised warm start of any model on any env's solver demonstrations: `python scripts/sft.py env=... model=...`.

Options: configs/sft.yaml (the `sft:` block is `vagen.bootstrap.warmstart.WarmStartRecipe`), plus the env/ and model/
groups of training. Writes `out` (a model folder usable as `model.path=`), its `report.json` with held-out success
before and after SFT, and `configs/model/<sft.config_name>.yaml`, so `python scripts/train.py model=<name>`
starts RL from it. With the defaults and `model=tiny_vl_random` it is the recipe of the shipped `tiny_vl` (on a CPU with
native bf16; elsewhere `sft.bf16=auto` trains in float32).
"""

import sys
from dataclasses import fields
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from vagen.bootstrap.warmstart import WarmStartRecipe, warm_start
from vagen.env import make_env
from vagen.eval.models import sft_model_config
from vagen.eval.runner import load_env_config
from vagen.models.lora import add_lora, lora_kwargs, require_peft, save_adapter
from vagen.models.precision import native_bf16
from vagen.models.processor import load_processor
from vagen.models.registry import load_policy
from vagen.trainer.config import check_model_reads_env, check_overrides

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def recipe_of(cfg: DictConfig) -> WarmStartRecipe:
    """The recipe the `sft:` block describes (size and base seed come from the model config; `sft.bf16=auto` is bf16
    where the CPU that SFT runs on computes it natively, see `vagen.models.precision`)."""
    names = {field.name for field in fields(WarmStartRecipe)} - {"size", "base_seed"}
    values = {name: value for name, value in OmegaConf.to_container(cfg.sft).items() if name in names}
    if values["bf16"] == "auto":
        values["bf16"] = native_bf16("cpu")
    elif not isinstance(values["bf16"], bool):
        raise ValueError(f"sft.bf16={values['bf16']!r} must be true, false or auto.")
    return WarmStartRecipe(size=str(cfg.model.size or "default"), **values)


def other_envs(cfg: DictConfig) -> dict[str, DictConfig]:
    """The `also_envs` configs (configs/env/<name>.yaml), each checked against the model like `env`."""
    configs = {}
    for name in cfg.also_envs:
        if name == cfg.env.name or name in configs:
            raise ValueError(f"also_envs names {name!r} twice (with env=...); name each game once.")
        try:
            configs[name] = OmegaConf.create(load_env_config(name, CONFIG_DIR, overrides={}))
        except ValueError as error:
            raise ValueError(f"also_envs: {error}") from None
        check_model_reads_env(OmegaConf.create({"env": configs[name], "model": cfg.model}))
    return configs


def env_factory(env_cfg: DictConfig):
    """A function making the env that `env_cfg` (a configs/env entry) describes."""
    kwargs = OmegaConf.to_container(env_cfg.kwargs, resolve=True)
    return lambda: make_env(env_cfg.id, **kwargs)


def check_lora(cfg: DictConfig) -> None:
    """LoRA SFT trains adapters only: the full-weight vision pre-training cannot go into an adapter."""
    if not cfg.lora.enabled:
        return
    if cfg.model.modality == "vision" and cfg.sft.vision_steps > 0:
        raise ValueError(
            f"lora.enabled=true trains adapters only, but sft.vision_steps={cfg.sft.vision_steps} pre-trains the whole "
            "vision tower, which an adapter cannot hold. Fix: sft.vision_steps=0, or lora.enabled=false."
        )
    require_peft("lora.enabled")


def adapter_saver(cfg: DictConfig):
    """`warm_start`'s save for a LoRA warm start: the adapter alone, with the base model config it adapts."""
    base = {key: cfg.model[key] for key in ("source", "path", "size", "modality")}
    if base["path"] and Path(base["path"]).exists():
        base["path"] = str(Path(base["path"]).resolve())  # a local base stays found from any working directory
    lora = OmegaConf.to_container(cfg.lora)
    return lambda model, folder: save_adapter(model, folder, lora, base)


def model_config(cfg: DictConfig, folder: Path) -> str:
    """The configs/model entry that loads the SFT result (`sft_model_config`), as yaml."""
    games = " + ".join([cfg.env.name, *cfg.also_envs])
    comment = f"# Written by scripts/sft.py: {cfg.model.name} warm-started on {games} demonstrations.\n"
    return comment + OmegaConf.to_yaml(sft_model_config(cfg, folder, cfg.sft.config_name))


@hydra.main(config_path=str(CONFIG_DIR), config_name="sft", version_base=None)
def main(cfg: DictConfig) -> None:
    try:
        recipe = recipe_of(cfg)
        check_model_reads_env(cfg)
        check_lora(cfg)
        others = other_envs(cfg)
        folder = Path(cfg.out).resolve()
        if (folder / "report.json").exists():
            raise ValueError(f"{folder} already holds an SFT result; choose another out=... or move it away.")
        policy = load_policy(cfg.model.name, cfg.model.source, cfg.model.modality, path=cfg.model.path,
                             size=cfg.model.size, dtype="float32")  # fmt: skip
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    processor = load_processor(policy.folder) if policy.image_processor is not None else policy.tokenizer
    folder.mkdir(parents=True, exist_ok=True)
    # The whole config next to the model: the env kwargs (grid text, turns, ...) it learned to read are not in the
    # recipe, and a model trained on one observation format plays another badly.
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if cfg.lora.enabled:
        add_lora(policy.model, **lora_kwargs(cfg.lora))
    report = warm_start(
        policy.model,
        processor,
        recipe,
        folder,
        make=env_factory(cfg.env),
        env_name=cfg.env.name,
        evaluate_before=True,
        other_games={name: env_factory(env_cfg) for name, env_cfg in others.items()},
        save=adapter_saver(cfg) if cfg.lora.enabled else None,
        micro_batch_size=cfg.sft.micro_batch_size,
    )
    temperature = f"temperature_{recipe.eval_temperature:g}"
    for name, game in {cfg.env.name: report, **report.get("other_games", {})}.items():
        for when, block in (("before SFT", game["eval_before"]), ("after SFT", game["eval"])):
            print(f"{name} held-out {when}: success {block[temperature]['success']:.1%} "
                  f"(T={recipe.eval_temperature:g}), greedy {block['greedy']['success']:.1%}, "
                  f"format-ok {block[temperature]['format_ok']:.1%} ({recipe.eval_episodes} episodes)")  # fmt: skip
        print(f"{name}: random {game['eval']['random']['success']:.1%}, solver {game['eval']['solver']['success']:.1%}")
    print(f"Model folder: {folder}")
    if cfg.sft.config_name:
        entry = CONFIG_DIR / "model" / f"{cfg.sft.config_name}.yaml"
        entry.write_text(model_config(cfg, folder))
        print(f"Model config: {entry} (python scripts/train.py env={cfg.env.name} model={cfg.sft.config_name})")


if __name__ == "__main__":
    try:
        check_overrides(str(CONFIG_DIR), "sft", sys.argv[1:])
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    main()
