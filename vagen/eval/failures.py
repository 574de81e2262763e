"""Why evaluated episodes fail: each stored episode is replayed in its game, next to the game's solver.

`scripts/evaluate.py` stores every episode (seed, settings, the model's responses). Replaying those responses
from `env.reset(seed)` gives back every state the model saw, and there the solver says how far the goal was
(`solver_actions()`: its plan length) and what a demonstration would have reasoned (`demo_reasoning()`). So a
failure can be told apart as a dead end (a state the solver can no longer solve: in Sokoban a box pushed where
it cannot come back from) or running out of turns with the goal still reachable, and each turn as optimal (its
executed actions shortened the plan by their number) or not. RL that fixes planning moves the first; a model
that does not see the board writes reasoning that differs from the demonstration's.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vagen.env import make_env


@dataclass(frozen=True)
class TurnReplay:
    """One replayed turn. Distances are solver plan lengths: 0 once solved, None where the solver finds no plan
    (a dead end, or a state too big for its search)."""

    distance_before: int | None
    distance_after: int | None
    executed_actions: int
    reasoning_matches: bool  # the response's <think> text is the demonstration's for the state it saw
    facts_right: float | None = None  # the share of the demonstration reading's facts it states rightly (games with
    # `reading_facts`, as reasoning_credit=facts pays; None elsewhere)
    moved: bool = True  # some executed action changed the state (the game's `action_is_effective`): False for a
    # turn of moves into walls, or one whose answer did not parse

    @property
    def optimal(self) -> bool:
        """Every executed action was a step of a shortest plan (unit-cost games)."""
        return (
            self.distance_before is not None
            and self.distance_after is not None
            and self.distance_after == self.distance_before - self.executed_actions
        )

    @property
    def entered_dead_end(self) -> bool:
        return self.distance_before is not None and self.distance_after is None


@dataclass(frozen=True)
class EpisodeReplay:
    seed: int
    success: bool
    initial_distance: int | None
    turns: list[TurnReplay]

    @property
    def outcome(self) -> str:
        """solved | dead end (the solver finds no plan from where it ended) | out of turns (goal still reachable)."""
        if self.success:
            return "solved"
        final = self.turns[-1].distance_after if self.turns else self.initial_distance
        return "dead end" if final is None else "out of turns"


def _distance(env: Any, solved: bool) -> int | None:
    if solved:
        return 0
    plan = env.solver_actions()
    return len(plan) if plan else None


def replay_episode(env: Any, record: dict[str, Any]) -> EpisodeReplay:
    """Play the record's responses again in `env` from `reset(seed)`; raises if the replay does not end as the
    record did (other env settings, or a game whose levels changed since)."""
    env.reset(seed=record["seed"])
    game = env.unwrapped
    responses = [message["content"] for message in record["messages"] if message["role"] == "assistant"]
    before = initial = _distance(game, solved=False)
    turns, success = [], False
    for response in responses:
        think = game.parse(response).think
        reasoning_matches = game.reasoning_matches(think)
        facts_right = game.reading_facts(think) if game.supports_reading_facts else None
        _, _, _, _, info = env.step(response)
        success = bool(info.get("success", False))
        after = _distance(game, success)
        moved = bool(info.get("action_is_effective", True))
        turns.append(TurnReplay(before, after, len(info.get("actions", [])), reasoning_matches, facts_right, moved))
        before = after
    if success != bool(record["success"]):
        raise ValueError(
            f"episode seed {record['seed']}: the replay {'solved' if success else 'failed'} it but the record says "
            f"{'solved' if record['success'] else 'failed'}; replay with the settings.json they were played with."
        )
    return EpisodeReplay(record["seed"], success, initial, turns)


def _share(hits: int, total: int) -> str:
    return f"{hits}/{total} ({hits / total:.0%})" if total else "0/0"


def failure_report(replays: Sequence[EpisodeReplay]) -> dict[str, Any]:
    """Counts over replayed episodes: outcomes, overall and by the level's initial solver distance, per turn index
    the optimal turns and the dead ends entered, the reasoning that matches the demonstration's, the dead ends entered
    after a reading that matched and after one that did not, and the turns that changed nothing in solved and in
    failed episodes."""
    names = ("solved", "dead end", "out of turns")
    outcomes = Counter(replay.outcome for replay in replays)
    levels = Counter(replay.initial_distance for replay in replays)
    by_distance = Counter((replay.initial_distance, replay.outcome) for replay in replays)
    turn_indices = range(max((len(replay.turns) for replay in replays), default=0))

    def per_turn(test: str) -> dict[int, str]:
        shares = {}
        for index in turn_indices:
            turns = [replay.turns[index] for replay in replays if len(replay.turns) > index]
            shares[index] = _share(sum(getattr(turn, test) for turn in turns), len(turns))
        return shares

    all_turns = [turn for replay in replays for turn in replay.turns]
    solvable = [turn for turn in all_turns if turn.distance_before is not None]
    facts = [turn.facts_right for turn in solvable if turn.facts_right is not None]
    report = {
        "episodes": len(replays),
        "outcomes": {name: _share(outcomes[name], len(replays)) for name in names},
        "outcomes_by_initial_distance": {  # str keys: the report is written as JSON; None (no plan) last
            str(distance): {name: _share(by_distance[distance, name], levels[distance]) for name in names}
            for distance in sorted(levels, key=lambda distance: (distance is None, distance or 0))
        },
        "optimal_turns_by_turn": per_turn("optimal"),
        "dead_ends_entered_by_turn": per_turn("entered_dead_end"),
        # Apart, because a dead end is off the demonstrations' states: a misreading there is not why it failed.
        "reasoning_matches_demo": {
            where: _share(sum(turn.reasoning_matches for turn in turns), len(turns))
            for where, turns in (
                ("solvable states", solvable),
                ("dead ends", [turn for turn in all_turns if turn.distance_before is None]),
            )
        },
        # Does the policy act on its reading? A turn that read the state as the demonstration does and then entered
        # a dead end (a FrozenLake hole it had named) did not; a gap between the two shares says the reading decides.
        "dead_ends_entered_by_reading": {
            where: _share(sum(turn.entered_dead_end for turn in turns), len(turns))
            for where, turns in (
                ("reading equal to the demonstration's", [turn for turn in solvable if turn.reasoning_matches]),
                ("reading not equal", [turn for turn in solvable if not turn.reasoning_matches]),
            )
        },
        "turns_that_changed_nothing": {
            where: _share(sum(not turn.moved for turn in turns), len(turns))
            for where, turns in (
                ("solved episodes", [turn for replay in replays if replay.success for turn in replay.turns]),
                ("failed episodes", [turn for replay in replays if not replay.success for turn in replay.turns]),
            )
        },
    }
    if facts:
        report["reading_facts_right"] = f"{sum(facts) / len(facts):.1%} of the facts in {len(facts)} solvable states"
    return report


def replay_cell(settings: dict[str, Any], records: Iterable[dict[str, Any]]) -> list[EpisodeReplay]:
    """Replays of one (model, env) cell's records in one env (errored episodes, which did not end in the game,
    left out)."""
    env = make_env(settings["env"]["id"], **settings["env"]["kwargs"])
    try:
        return [replay_episode(env, record) for record in records if record.get("error") is None]
    finally:
        env.close()


def cell_failure_report(cell: Path) -> dict[str, Any]:
    """The failure report of one evaluated (model, env) folder, `<out_dir>/<model>/<env>` (settings.json and
    episodes/*.json); a ValueError names a folder that is not one, NotImplementedError a game without a solver."""
    settings_path = cell / "settings.json"
    if not settings_path.is_file():
        raise ValueError(f"{cell} has no settings.json: pass a folder of scripts/evaluate.py, <out_dir>/<model>/<env>.")
    records = [json.loads(path.read_text()) for path in sorted((cell / "episodes").glob("*.json"))]
    if not records:
        raise ValueError(f"{cell}/episodes holds no episodes: run scripts/evaluate.py first.")
    return failure_report(replay_cell(json.loads(settings_path.read_text()), records))


def report_lines(name: str, report: dict[str, Any]) -> list[str]:
    """`report` as the lines scripts/evaluate.py mode=failures prints."""
    lines = [f"{name}: {report['episodes']} episodes"]
    lines.append("  outcome: " + ", ".join(f"{outcome} {share}" for outcome, share in report["outcomes"].items()))
    lines.append("  outcome by the level's solver distance at the start:")
    for distance, shares in report["outcomes_by_initial_distance"].items():
        lines.append(f"    {distance:>4s}: " + ", ".join(f"{outcome} {share}" for outcome, share in shares.items()))
    for key, title in (
        ("optimal_turns_by_turn", "turns whose executed actions were all optimal"),
        ("dead_ends_entered_by_turn", "turns that entered a dead end"),
    ):
        lines.append(f"  {title}, by turn: " + ", ".join(f"{turn}: {share}" for turn, share in report[key].items()))
    for key, title in (
        ("reasoning_matches_demo", "reasoning equal to the demonstration's for the state seen"),
        ("dead_ends_entered_by_reading", "solvable turns that entered a dead end"),
        ("turns_that_changed_nothing", "turns that changed nothing"),
    ):
        lines.append(f"  {title}: " + ", ".join(f"in {where} {share}" for where, share in report[key].items()))
    if "reading_facts_right" in report:
        lines.append(f"  reading's facts stated rightly: {report['reading_facts_right']}")
    return lines


def failure_reports(out_dir: Path, rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The failure report of every evaluated cell of `rows` (evaluate's summary rows), written to
    out_dir/failures.json, and the lines to print; a cell that cannot be analysed gets a line saying why."""
    reports, lines = {}, []
    for row in rows:
        cell = out_dir / row["model"] / row["env"]
        name = f"{row['model']} on {row['env']}"
        if not (cell / "settings.json").is_file():
            lines.append(f"{name}: not played ({row.get('note') or 'no episodes'})")
            continue
        try:
            reports[name] = cell_failure_report(cell)
        except NotImplementedError:
            lines.append(f"{name}: cannot be analysed: the game has no solver or no demonstration reasoning")
            continue
        lines += report_lines(name, reports[name])
    (out_dir / "failures.json").write_text(json.dumps(reports, indent=1))
    return reports, lines
