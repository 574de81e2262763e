"""The scripts' shared key=value command line (vagen/cli.py)."""

import pytest

from vagen.cli import script_options

DEFAULTS = {"iterations": 3, "lr": 0.5, "profile": False, "before": "", "seeds": "0,1,2", "out": None}


def test_own_options_take_their_defaults_types_and_the_rest_pass_on_as_overrides():
    options, overrides = script_options(
        ["iterations=7", "env=sokoban_visual", "lr=2", "profile=true", "before=8363e24", "trainer.lr=1e-4"], DEFAULTS
    )
    assert (options.iterations, options.lr, options.profile) == (7, 2.0, True)
    assert options.before == "8363e24"  # a commit that YAML would read as a number stays as typed
    assert options.seeds == "0,1,2" and options.out is None
    assert overrides == ["env=sokoban_visual", "trainer.lr=1e-4"]
    options, _ = script_options(["seeds=4,5", "out=/tmp/x"], DEFAULTS)
    assert options.seeds == "4,5" and options.out == "/tmp/x"


@pytest.mark.parametrize(
    "argument, message",
    [
        ("iterations=three", "iterations='three' must be an integer"),
        ("iterations=2.5", "must be an integer"),
        ("lr=fast", "lr='fast' must be a number"),
        ("profile=yes", "profile='yes' must be true or false"),
        ("iterations", "'iterations' is not key=value; options are iterations, lr"),
    ],
)
def test_a_wrong_value_names_the_option_and_what_it_takes(argument, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        script_options([argument], DEFAULTS)
