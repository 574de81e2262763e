"""The command line of the benchmark and study scripts: Hydra's `key=value` form, one parser for all of them.

A script declares its own options with their defaults; every other `key=value` argument is passed on as a
train.py override (`env=...`, `trainer.lr=...`), which Hydra's compose then checks.

    options, overrides = script_options(sys.argv[1:], {"iterations": 3, "threads": 2, "before": ""})
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def script_options(
    argv: list[str], defaults: dict[str, Any], overrides: bool = True, **checks: Any
) -> tuple[DictConfig, list[str]]:
    """(the script's options: `defaults` updated from `argv`, the remaining arguments as overrides); `checks` are
    `parse_options`' required= and choices=.

    As argparse does, a bad argument ends the script with one `error:` line (exit 2), and `-h` / `--help` prints the
    script's docstring (its usage text) and exits.
    """
    if any(argument in ("-h", "--help") for argument in argv):
        print((sys.modules["__main__"].__doc__ or "").strip() or f"options: {', '.join(defaults)}")
        raise SystemExit(0)
    try:
        return parse_options(argv, defaults, overrides, **checks)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def parse_options(
    argv: list[str],
    defaults: dict[str, Any],
    overrides: bool = True,
    required: dict[str, str] | None = None,
    choices: dict[str, tuple[str, ...]] | None = None,
) -> tuple[DictConfig, list[str]]:
    """`script_options` without the exit: a bad argument raises ValueError. overrides=False: a script that takes no
    train.py overrides refuses any other key. required: keys that must be given, each with an example value.
    choices: keys whose value (each item of a comma list) must be one of the given texts.

    A value is read as its default's type: true/false, an integer, a number, or text kept exactly as typed (a
    commit like 8363e24 stays text, comma lists such as seeds=0,1,2 stay text for the script to split; a default of
    None takes text). An argument without `=`, or a value of the wrong type, is an error that says what is expected.
    """
    options, passed_on = OmegaConf.create(dict(defaults)), []
    accepted = f"options are {', '.join(defaults)}" + (" and train.py overrides" if overrides else "")
    for argument in argv:
        key, equals, text = argument.partition("=")
        if not equals:
            raise ValueError(f"{argument!r} is not key=value; {accepted}.")
        if key not in defaults:
            if not overrides:
                raise ValueError(f"Unknown option {key!r}; this script's {accepted}.")
            passed_on.append(argument)
            continue
        expected = type(defaults[key]) if defaults[key] is not None else str
        try:
            options[key] = PARSERS[expected](text)
        except (KeyError, ValueError):
            raise ValueError(f"{key}={text!r} must be {TYPE_NAMES.get(expected, expected.__name__)}.") from None
    for key, example in (required or {}).items():
        if not options[key]:
            raise ValueError(f"{key}= is required, e.g. {key}={example}.")
    for key, allowed in (choices or {}).items():
        given = [item for item in str(options[key]).split(",") if item]
        if any(item not in allowed for item in given):
            raise ValueError(f"{key}={options[key]!r}: each value must be one of {', '.join(allowed)}.")
    return options, passed_on


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError(text)
    return text.lower() == "true"


PARSERS = {bool: _boolean, int: int, float: float, str: str}
