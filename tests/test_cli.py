"""The scripts' shared key=value command line (vagen/cli.py)."""

import pytest

from vagen.cli import parse_options, script_options

DEFAULTS = {"iterations": 3, "lr": 0.5, "profile": False, "before": "", "seeds": "0,1,2", "out": None}


def test_own_options_take_their_defaults_types_and_the_rest_pass_on_as_overrides():
    options, overrides = parse_options(
        ["iterations=7", "env=sokoban_visual", "lr=2", "profile=true", "before=8363e24", "trainer.lr=1e-4"], DEFAULTS
    )
    assert (options.iterations, options.lr, options.profile) == (7, 2.0, True)
    assert options.before == "8363e24"  # a commit that YAML would read as a number stays as typed
    assert options.seeds == "0,1,2" and options.out is None
    assert overrides == ["env=sokoban_visual", "trainer.lr=1e-4"]
    options, _ = parse_options(["seeds=4,5", "out=/tmp/x"], DEFAULTS)
    assert options.seeds == "4,5" and options.out == "/tmp/x"
    with pytest.raises(ValueError, match="Unknown option 'env'; this script's options are iterations, lr"):
        parse_options(["env=sokoban_visual"], DEFAULTS, overrides=False)  # a script that takes no overrides


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
def test_a_wrong_value_names_the_option_and_what_it_takes(argument, message, capsys):
    with pytest.raises(ValueError, match=message):
        parse_options([argument], DEFAULTS)
    with pytest.raises(SystemExit) as exit_info:  # the scripts' form: one error line, exit 2, no traceback
        script_options([argument], DEFAULTS)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


def test_required_keys_and_choices_are_checked_with_an_example(capsys):
    required, choices = {"out": "outputs/runs/x"}, {"before": ("main", "dev")}
    with pytest.raises(ValueError, match=r"out= is required, e.g. out=outputs/runs/x\."):
        parse_options(["before=main"], DEFAULTS, required=required)
    options, _ = parse_options(["out=y", "before=dev"], DEFAULTS, required=required, choices=choices)
    assert (options.out, options.before) == ("y", "dev")
    with pytest.raises(ValueError, match=r"seeds='0,9': each value must be one of 0, 1, 2\."):
        parse_options(["seeds=0,9"], DEFAULTS, choices={"seeds": ("0", "1", "2")})  # every item of a comma list
    with pytest.raises(ValueError, match=r"not key=value; options are iterations, lr, profile, before, seeds, out\.$"):
        parse_options(["-x"], DEFAULTS, overrides=False)  # no mention of train.py overrides where none are taken


def test_help_prints_the_scripts_usage_and_exits_zero(capsys, monkeypatch):
    import sys
    import types

    script = types.ModuleType("__main__", "Measure a run.\n\n    python research/grad_noise.py run=DIR [out=DIR]\n")
    monkeypatch.setitem(sys.modules, "__main__", script)
    for flag in ("-h", "--help"):
        with pytest.raises(SystemExit) as exit_info:
            script_options(["lr=1", flag], DEFAULTS)
        assert exit_info.value.code == 0
        assert capsys.readouterr().out == "Measure a run.\n\n    python research/grad_noise.py run=DIR [out=DIR]\n"
