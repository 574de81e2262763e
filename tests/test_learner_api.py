"""The loop drives one API: a `Learner` in this process, or `RayLearners` over Ray replicas (no model loaded here)."""

import ast
import inspect
from pathlib import Path

from vagen.trainer.learner import Learner
from vagen.trainer.workers import RayLearners

STARPO = Path(__file__).resolve().parent.parent / "vagen" / "trainer" / "starpo.py"


def public_methods(cls) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_")
    }


def test_the_ray_group_offers_the_learner_api_with_the_same_parameters():
    learner, group = public_methods(Learner), public_methods(RayLearners)
    shared = (learner.keys() & group.keys()) - {"worker_parameters"}
    assert {"collect", "play_held_out", "move_probe", "cross_score", "image_probe", "learning_rate", "update"} <= shared
    assert {"sync", "save", "restore", "close"} <= shared
    assert set(group) - set(learner) == {"worker_parameters"}  # the group adds only a test accessor
    for name in shared - {"collect"}:  # collect: a replica also takes the first group id of its share
        assert list(learner[name].parameters) == list(group[name].parameters), name
    assert list(group["collect"].parameters) == list(learner["collect"].parameters)[:3]


def test_the_loop_calls_only_that_api():
    """Every `self.learner.<name>` in the loop is a method both kinds of learner have (or the tokenizer)."""
    called = {
        node.attr
        for node in ast.walk(ast.parse(STARPO.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "learner"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }
    assert {"collect", "update", "sync", "save", "restore"} <= called
    assert called - {"tokenizer"} <= public_methods(Learner).keys() & public_methods(RayLearners).keys()
