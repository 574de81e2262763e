"""Every numeric and boolean option of configs/train.yaml and its groups is type- and range-checked before any model
loads, from one schema (`vagen.trainer.config.OPTIONS`): non-finite numbers, strings where numbers or booleans
belong, values that make training inert or silently wrong, misspelt keys added with `+`, and sizes that cannot fit
in memory all end in one `error:` line naming the option and what it must be."""

import copy
import math
import re
import resource
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from test_trainer import CONFIG_DIR, FAST, TEXT

from vagen.trainer import learner as learner_module
from vagen.trainer.config import validate_config
from vagen.trainer.starpo import StarPOTrainer

ROOT = Path(__file__).resolve().parent.parent
VISUAL = ["env=sokoban_visual", "model=tiny_vl_test", *FAST]  # without test_trainer's max_turns=2


def compose_train(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("train", overrides=list(overrides))


def group_choices(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIG_DIR / group).glob("*.yaml"))


@cache
def variants() -> dict[str, DictConfig]:
    """The training config with each choice of every group (the option values each group file sets)."""
    out = {"default": compose_train(TEXT)}
    for group in ("algorithm", "filter", "rollout"):
        for choice in group_choices(group):
            out[f"{group}={choice}"] = compose_train([*TEXT, f"{group}={choice}"])
    for env in group_choices("env"):
        visual = OmegaConf.load(CONFIG_DIR / "env" / f"{env}.yaml").kwargs.get("observation", "text") != "text"
        out[f"env={env}"] = compose_train([*(VISUAL if visual else TEXT), f"env={env}"])
    return out


def leaves(node, prefix=""):
    if isinstance(node, dict):
        for name, value in node.items():
            yield from leaves(value, f"{prefix}{name}.")
    else:
        yield prefix[:-1], node


@cache
def option_leaves() -> dict[str, tuple[str, object]]:
    """Every numeric and boolean option set by some config file: key -> (variant that sets it, its value)."""
    found = {}
    for name, cfg in variants().items():
        for key, value in leaves(OmegaConf.to_container(cfg, resolve=True)):
            if isinstance(value, (bool, int, float)) and key not in found:
                found[key] = (name, value)
    return found


NULL_BY_DEFAULT = ["algorithm.advantage_min", "algorithm.dual_clip_c", "diagnostics.h_threshold", "ray.cpus_per_worker"]


def non_finite_and_wrong_type_cases() -> list[tuple[str, str, object]]:
    cases = []
    for key, (variant, value) in sorted(option_leaves().items()):
        bad = ["maybe", 1] if isinstance(value, bool) else [math.inf, -math.inf, math.nan, "abc"]
        cases += [(variant, key, value) for value in bad]
    cases += [("default", key, value) for key in NULL_BY_DEFAULT for value in (math.inf, math.nan, "abc")]
    return cases


@pytest.mark.parametrize(("variant", "key", "value"), non_finite_and_wrong_type_cases())
def test_every_numeric_and_boolean_option_refuses_non_finite_values_and_wrong_types(variant, key, value):
    cfg = copy.deepcopy(variants()[variant])
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ValueError, match=rf"(^|\W){re.escape(key)}\W"):
        validate_config(cfg)


def test_every_option_of_every_config_file_is_in_the_schema_with_a_meaning():
    from vagen.trainer.config import OPTIONS

    missing = {key for cfg in variants().values() for key, _ in leaves(OmegaConf.to_container(cfg))} - set(OPTIONS)
    assert not missing, f"options without a schema entry: {sorted(missing)}"
    assert all(option.doc for option in OPTIONS.values())


def test_the_default_config_of_every_group_passes():
    for cfg in variants().values():
        validate_config(cfg)  # raises on a false refusal


NO_GPU = not torch.cuda.is_available()
# Each value passed validation before and went on to load the model: training that is silently inert or wrong, a
# crash minutes later, or an error only after the model loaded.
REFUSED_BEFORE_LOAD = [
    (["trainer.lr=inf"], r"trainer\.lr=inf"),
    (["trainer.max_grad_norm=nan"], r"trainer\.max_grad_norm=nan"),
    (["trainer.max_grad_norm=0"], r"trainer\.max_grad_norm=0 must be > 0"),
    (["trainer.max_grad_norm=1e-12"], r"trainer\.max_grad_norm=1e-12 .*adam_eps"),  # clipped below eps: no update
    (["trainer.adam_eps=inf"], r"trainer\.adam_eps=inf"),
    (["trainer.adam_eps=1e6"], r"trainer\.adam_eps=1000000\.0 must be > 0 and <= 1"),
    (["algorithm.kl_coef=-0.001"], r"algorithm\.kl_coef=-0\.001 must be >= 0"),
    (["algorithm.kl_coef=nan"], r"algorithm\.kl_coef=nan"),
    (["trainer.lora.enabled=maybe"], r"trainer\.lora\.enabled='maybe' must be true or false"),
    (["trainer.freeze_vision=1"], r"trainer\.freeze_vision=1 must be true or false"),
    (["trainer.lr=abc"], r"trainer\.lr='abc'"),
    (["trainer.lr=2"], r"trainer\.lr=2 must be > 0 and <= 1"),
    (["trainer.weight_decay=-0.1"], r"trainer\.weight_decay=-0\.1"),
    (["seed=-1"], r"seed=-1 must be a whole number >= 0"),
    (["seed=10000"], r"seed=10000 .*held-out"),  # its training levels would be the evaluation's
    (["trainer.warmup_iterations=-3"], r"trainer\.warmup_iterations=-3"),
    (["algorithm.gamma=2"], r"algorithm\.gamma=2"),
    (["algorithm.entropy_coef=-1"], r"algorithm\.entropy_coef=-1"),
    (["algorithm.dual_clip_c=0.5"], r"algorithm\.dual_clip_c=0\.5 must be > 1"),
    (["algorithm.value_clip=0"], r"algorithm\.value_clip=0"),
    (["rollout.temperature=1e-40"], r"rollout\.temperature=1e-40"),
    (["trainer.eval_temperature=nan"], r"trainer\.eval_temperature=nan"),
    (["filter.max_rerolls=-1"], r"filter\.max_rerolls=-1"),
    (["diagnostics.max_prompts=1"], r"diagnostics\.max_prompts=1 must be a whole number >= 2"),  # MI never computed
    (["diagnostics.scopes=[foo]"], r"Unknown diagnostics\.scopes"),
    (["diagnostics.echo_window=3"], r"diagnostics\.echo_window=3"),
    (["diagnostics.echo_spike_factor=0.5"], r"diagnostics\.echo_spike_factor=0\.5"),
    (["trainer.viz_episodes=-1"], r"trainer\.viz_episodes=-1"),
    (["trainer.level_sampler=plr", "trainer.plr.buffer_size=1"], r"trainer\.plr\.buffer_size=1 .*trainer\.groups"),
    (["logger.progress=maybe"], r"logger\.progress='maybe'"),
    (["ray.address=5"], r"ray\.address=5"),
    (["model.dtype=float64"], r"Unknown model\.dtype"),
    (["model.modality=audio"], r"Unknown model\.modality"),
    (["env.kwargs.format_penalty=0.5"], r"env\.kwargs\.format_penalty=0\.5 must be .*<= 0"),  # rewards garbage
    (["env.kwargs.format_penalty=inf"], r"env\.kwargs\.format_penalty=inf"),
    (["env.kwargs.max_turns=abc"], r"env\.kwargs\.max_turns='abc'"),
    (["+env.kwargs.foo=1"], r"env\.kwargs\.foo is not an option of env=bandit_text"),
    (["+rollout.engine_kwargs.foo=1"], r"rollout\.engine_kwargs\.foo is not an option of rollout\.engine=hf"),
    (["+trainer.iteratons=3"], r"Unknown option 'trainer\.iteratons'.*Did you mean trainer\.iterations\?"),
    (["trainer.resume=/nonexistent/run"], r"trainer\.resume='/nonexistent/run' is not a folder"),
    (
        ["rollout.max_new_tokens=100000000", "rollout.max_context_tokens=200000000", "trainer.memory_check=false"],
        r"rollout\.max_context_tokens=200000000: .*GiB",
    ),
    pytest.param(["device=cuda"], r"device=cuda .*no CUDA", marks=pytest.mark.skipif(not NO_GPU, reason="has a GPU")),
]


def _case_id(value) -> str:
    return " ".join(value) if isinstance(value, list) else ""


@pytest.mark.parametrize(("overrides", "message"), REFUSED_BEFORE_LOAD, ids=_case_id)
def test_values_that_train_inert_wrong_or_fail_late_are_refused_before_any_model_loads(overrides, message, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was refused")

    monkeypatch.setattr(learner_module, "load_policy", no_model)
    with pytest.raises(ValueError, match=message):
        StarPOTrainer(compose_train([*TEXT, *overrides]))


def _limit_memory() -> None:  # a regression must fail the test, not take the machine's memory
    limit = 10 * 2**30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_the_train_script_refuses_bad_values_in_one_line_before_anything_allocates(tmp_path):
    script = str(ROOT / "scripts" / "train.py")
    cases = {  # (seed=-1, device=cuda and the rest take the same path: test_values_that_train_inert_wrong_or_...)
        "lr": ([*TEXT, "trainer.lr=abc"], "error: trainer.lr='abc' is not a number"),
        "typo": ([*TEXT, "+trainer.iteratons=3"], "Did you mean trainer.iterations?"),
        # Was OOM-killed at ~21 GB: the 600000x600000 image is refused from the memory the machine has.
        "tile_px": ([*VISUAL, "env.kwargs.tile_px=100000"], "tile_px=100000 draws a 600000x600000 image"),
    }
    runs = {
        name: subprocess.Popen(
            [sys.executable, script, *overrides, "trainer.iterations=1", f"run_dir={tmp_path / name}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            preexec_fn=_limit_memory,
        )
        for name, (overrides, _) in cases.items()
    }
    try:
        for name, process in runs.items():
            out, err = process.communicate(timeout=300)
            expected = cases[name][1]
            assert process.returncode == 2 and expected in err, (name, err[-3000:])
            assert "Traceback" not in out + err and len([line for line in err.splitlines() if line.strip()]) == 1, err
    finally:
        for process in runs.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def test_the_options_page_is_generated_from_the_schema():
    """docs/options.md is `options_reference()`: the docs read the same table that validation reads."""
    from vagen.trainer.config import options_reference

    page = Path(__file__).resolve().parent.parent / "docs" / "options.md"
    assert page.read_text() == options_reference(), (
        'docs/options.md is stale; regenerate it: .venv/bin/python -c "from vagen.trainer.config import '
        "options_reference; open('docs/options.md', 'w').write(options_reference())\""
    )


def test_an_option_the_env_yaml_does_not_set_is_refused_with_the_plus_that_adds_it():
    """`env.kwargs.mark_no_effect` is an option (docs/options.md) that no env yaml sets: Hydra cannot override it, and
    the error says to add it with `+` rather than calling it unknown; with the `+` it composes."""
    from vagen.trainer.config import check_overrides

    with pytest.raises(ValueError, match=r"write \+env\.kwargs\.mark_no_effect=\.\.\."):
        check_overrides(str(CONFIG_DIR), "train", ["env=sokoban_text", "env.kwargs.mark_no_effect=true"])
    check_overrides(str(CONFIG_DIR), "train", ["env=sokoban_text", "+env.kwargs.mark_no_effect=true"])
    with pytest.raises(ValueError, match=r"Unknown option 'env\.kwargs\.mark_no_efect'.*Did you mean"):
        check_overrides(str(CONFIG_DIR), "train", ["env=sokoban_text", "env.kwargs.mark_no_efect=true"])
