"""What `model=` can name, and how each kind becomes an agent that plays episodes.

An entry of `model=` is, tried in this order:

1. a built-in policy (`solver`, `random`): played through the env, no engine (reference rows);
2. with `engine=api`: the served model's name (`engine.model=` adds one more);
3. an existing folder: a training run folder (its latest complete checkpoint) or one checkpoint folder
   (`run_dir/checkpoints/iter_XXXXXX`); the model is built from the run's `config.yaml` and the
   checkpoint's `modules/policy.safetensors` is loaded into it; or a `scripts/sft.py` output folder (the model
   it saved, as the model config the script writes would load it);
4. a model config name in configs/model/ (tiny_vl, smollm2_135m, ...).
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from vagen.env.policies import POLICIES
from vagen.models.lora import add_lora, lora_kwargs

ANY_MODALITY = "any"  # policies read the env's state and API models are assumed to read images


@dataclass(frozen=True)
class ModelSpec:
    """One row of the benchmark.

    label: the row's name in tables and its folder name.
    kind: "policy" | "api" | "local" (hf or vllm engine).
    model_config: the configs/model entry to build (local).
    checkpoint: a checkpoint folder whose policy weights replace the built model's (local).
    lora: the run's LoRA settings when its checkpoint holds adapter weights (local), and `exclude_vision`.
    identity: what produced the episodes, recorded beside them so a re-run cannot mix models.
    """

    label: str
    kind: str
    modality: str = ANY_MODALITY
    model_config: dict[str, Any] | None = None
    checkpoint: str | None = None
    lora: dict[str, Any] | None = None
    identity: dict[str, Any] = field(default_factory=dict)


def safe_label(text: str) -> str:
    """A folder-safe row name: characters other than letters, digits and `_.@+-` become `_`."""
    return re.sub(r"[^A-Za-z0-9_.@+-]", "_", text).strip("._") or "model"


def sft_model_config(sft_config: Any, folder: Path, name: str) -> dict[str, Any]:
    """The configs/model entry that loads what `scripts/sft.py`, run with `sft_config`, saved in `folder`:
    source=pretrained, or source=lora_adapter for an adapter (folded into its base on first load)."""
    return {
        "name": name,
        "source": "lora_adapter" if OmegaConf.select(sft_config, "lora.enabled", default=False) else "pretrained",
        "path": str(folder),
        "size": None,
        "modality": sft_config.model.modality,
        "dtype": sft_config.model.dtype,
    }


def _checkpoint_spec(entry: str, folder: Path, config_overrides: dict[str, Any]) -> ModelSpec:
    from vagen.trainer.checkpoint import MARKER_FILENAME, latest_checkpoint

    folder_config = OmegaConf.load(folder / "config.yaml") if (folder / "config.yaml").exists() else None
    if folder_config is not None and "sft" in folder_config:  # a scripts/sft.py output: the model it saved
        model_config = {**sft_model_config(folder_config, folder.resolve(), folder.name), **config_overrides}
        modality = model_config["modality"]
        return ModelSpec(safe_label(entry), "local", modality, model_config, identity={"model": model_config})
    if (folder / MARKER_FILENAME).exists():
        checkpoint, run_dir = folder, folder.parent.parent
    elif folder_config is not None:
        run_dir, checkpoint = folder, latest_checkpoint(folder)
        if checkpoint is None:
            raise ValueError(f"model={entry!r} is a run folder without a complete checkpoint; train it first.")
    else:
        raise ValueError(
            f"model={entry!r} is a folder but neither a run folder (with config.yaml), a checkpoint folder "
            "(with complete.json) nor a scripts/sft.py output; pass outputs/runs/<run>, "
            "outputs/runs/<run>/checkpoints/iter_XXXXXX or outputs/sft/<name>."
        )
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        raise ValueError(
            f"Checkpoint {checkpoint} has no run config at {config_path}; it is needed to build the model."
        )
    run_config = OmegaConf.load(config_path)
    model_config = {**OmegaConf.to_container(run_config.model, resolve=True), **config_overrides}
    lora = OmegaConf.select(run_config, "trainer.lora", default=None)
    if lora is not None and lora.enabled:  # with freeze_vision the run put no adapters into the vision tower
        lora = {**OmegaConf.to_container(lora), "exclude_vision": bool(run_config.trainer.get("freeze_vision", False))}
    else:
        lora = None
    iteration = int(checkpoint.name.rsplit("_", 1)[-1]) if checkpoint.name.startswith("iter_") else checkpoint.name
    return ModelSpec(
        label=safe_label(f"{run_dir.name}@iter{iteration}"),
        kind="local",
        modality=model_config["modality"],
        model_config=model_config,
        checkpoint=str(checkpoint.resolve()),
        lora=lora,
        identity={"checkpoint": str(checkpoint.resolve()), "model": model_config},
    )


def resolve_model(entry: str, engine_cfg: Any, config_dir: Path, config_overrides: dict[str, Any]) -> ModelSpec:
    """The `ModelSpec` of one `model=` entry (see the module docstring for the order)."""
    entry = str(entry)
    if entry in POLICIES:
        return ModelSpec(label=entry, kind="policy", identity={"policy": entry})
    if engine_cfg.name == "api":
        return ModelSpec(label=safe_label(entry), kind="api", identity={"api_model": entry})
    if Path(entry).is_dir():
        return _checkpoint_spec(entry, Path(entry), config_overrides)
    config_path = Path(config_dir) / "model" / f"{entry}.yaml"
    if not config_path.exists():
        names = sorted(p.stem for p in (Path(config_dir) / "model").glob("*.yaml"))
        raise ValueError(
            f"model={entry!r} is not a policy ({POLICIES.names()}), a folder, or a model config ({names}). "
            "Fix: use one of those names, or a run / checkpoint folder that exists."
        )
    model_config = {**OmegaConf.to_container(OmegaConf.load(config_path), resolve=True), **config_overrides}
    modality = model_config["modality"]
    return ModelSpec(safe_label(entry), "local", modality, model_config, identity={"model": model_config})


def resolve_models(
    entries: Any, engine_cfg: Any, config_dir: Path, config_overrides: dict[str, Any]
) -> list[ModelSpec]:
    """All rows of `model=` (a name, a path, or a list of them); null means the engine's default model:
    `engine.model` for the API engine, tiny_vl otherwise. `engine.model` is always a row with engine=api."""
    if entries is None:
        entries = []
    elif isinstance(entries, str):
        entries = [entries]
    entries = [str(e) for e in entries]
    if engine_cfg.name == "api":
        served = engine_cfg.get("model")
        if served and served not in entries:
            entries.append(str(served))
        if not entries:
            raise ValueError("engine=api needs a served model: set engine.model=<name> (or model=<name>).")
    elif not entries:
        entries = ["tiny_vl"]
    specs = [resolve_model(entry, engine_cfg, config_dir, config_overrides) for entry in entries]
    labels = [spec.label for spec in specs]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise ValueError(f"model= lists {duplicates} more than once (or two entries share a name); list each once.")
    return specs


def _checkpoint_gone(checkpoint: str) -> ValueError:
    return ValueError(
        f"Checkpoint {checkpoint} is gone: a training still running in that folder keeps only its last "
        "trainer.keep_checkpoints checkpoints. Evaluate a copy of the checkpoint folder, or the finished run."
    )


def load_local_policy(spec: ModelSpec, device: str) -> Any:
    """Build the spec's model (and load its checkpoint's policy weights); returns a `vagen.models.registry.Policy`."""
    from safetensors.torch import load_model

    from vagen.models.registry import load_policy

    config = spec.model_config
    assert config is not None, "local specs carry a model config"
    weights = None if spec.checkpoint is None else Path(spec.checkpoint) / "modules" / "policy.safetensors"
    if weights is not None and not weights.exists():  # it was there when the models were resolved
        raise _checkpoint_gone(spec.checkpoint)
    if spec.checkpoint is not None:
        from vagen.trainer.checkpoint import verify_checkpoint

        verify_checkpoint(Path(spec.checkpoint))  # the integrity check resume runs too: sizes, sha256, unlisted files
    policy = load_policy(
        config["name"],
        config["source"],
        config["modality"],
        path=config.get("path"),
        size=config.get("size"),
        dtype=config.get("dtype", "auto"),
        device=device,
    )
    if spec.checkpoint is not None:
        if spec.lora is not None:
            add_lora(policy.model, **lora_kwargs(spec.lora), exclude_vision=spec.lora["exclude_vision"])
        try:
            load_model(policy.model, str(weights), strict=True)
        except FileNotFoundError:  # rotated out while the model was being built
            raise _checkpoint_gone(spec.checkpoint) from None
    policy.model.eval()
    return policy


def export_for_vllm(spec: ModelSpec, policy: Any, folder: Path) -> Path:
    """A `save_pretrained` folder of a checkpoint's weights, for engines that load from disk (vLLM)."""
    if spec.lora is not None:
        raise ValueError(
            f"{spec.label} was trained with LoRA adapters, which cannot be exported for vLLM here; use engine=hf."
        )
    folder = Path(folder)
    if not (folder / "config.json").exists():
        shutil.copytree(policy.folder, folder, dirs_exist_ok=True)  # tokenizer, processor, chat template
        policy.model.save_pretrained(folder)
    return folder
