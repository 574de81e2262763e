"""The environment protocol: Gymnasium envs whose actions are model responses.

A game subclasses `LanguageEnv` and implements five small hooks (`_reset_game`, `_apply`,
`_state_text`, `_rules_text`, and `_render_image` for visual variants). The base class owns what
every game shares and what must not differ between games: seeding, response parsing, the format
penalty, turn counting, the `info` schema and how observations are composed.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium
import numpy as np
from PIL import Image

from vagen.env.grading import grade_description
from vagen.env.observation import IMAGE_PLACEHOLDER, OBSERVATION_MODES, Observation
from vagen.env.parsing import RESPONSE_FORMATS, ParsedResponse, format_instructions, match_actions, parse_response

INFO_KEYS = (
    "success",
    "format_ok",
    "action_is_valid",
    "action_is_effective",
    "actions",
    "dropped_actions",
    "error",
    "grounding_score",  # grade of the <observation> in [0, 1]; None when the format or the game has none
    "prediction_score",  # grade of the <prediction> against the state after the turn; None likewise
    "reasoning_match",  # the turn's reading credit (reasoning_credit): exact: <think> equals demo_reasoning() (bool);
    # facts: the share of its facts right (float); False / 0.0 for a turn with an error; None unless reasoning_coef > 0
)
REASONING_CREDITS = ("exact", "facts")


@dataclass(frozen=True)
class ActionResult:
    """The outcome of one environment action: its reward, whether it changed the state, whether the
    episode is over (`terminated`: a terminal state; `truncated`: a budget such as Sokoban's
    `max_steps` ran out), and whether the task is now solved. A game sets `error` (why) when the
    action is invalid in a way only the game can judge, e.g. an unparsable Countdown expression:
    the base class then treats it like an unknown action name (format penalty, not executed)."""

    reward: float
    effective: bool
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    error: str | None = None


@dataclass
class _TurnOutcome:
    """What executing one turn's actions did (internal to `LanguageEnv.step`)."""

    reward: float = 0.0
    effective: bool = False
    terminated: bool = False
    budget_out: bool = False
    executed: list[str] = field(default_factory=list)
    moved: list[bool] = field(default_factory=list)  # per executed action: whether it changed the state
    invalid: list[str] = field(default_factory=list)
    error: str | None = None


class ResponseSpace(gymnasium.spaces.Space[str]):
    """Any string is a valid action (the parser judges it); `sample` writes a well-formed random turn."""

    def __init__(self, action_names: tuple[str, ...] | None, action_separator: str, max_actions: int, seed=None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.action_names, self.action_separator, self.max_actions = action_names, action_separator, max_actions

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if not self.action_names:
            return "<think>random</think><answer>0</answer>"
        count = int(self.np_random.integers(1, self.max_actions + 1))
        picks = self.np_random.choice(len(self.action_names), size=count)
        answer = f" {self.action_separator} ".join(self.action_names[i] for i in picks)
        return f"<think>random</think><answer>{answer}</answer>"


class ObservationSpace(gymnasium.spaces.Space[Observation]):
    """Observations are `Observation` objects; their own constructor checks placeholders."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, Observation)

    def sample(self, mask: Any = None, probability: Any = None) -> Observation:
        raise NotImplementedError("Observations come from reset/step; they cannot be sampled.")


def valid_names_text(names: tuple[str, ...], shown: int = 12) -> str:
    """The valid action names for an error message; a long list (Sudoku 9x9 has 729) is cut after `shown`."""
    more = f" … ({len(names)} in all, see the rules)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


MAX_ECHO_CHARS = 200  # model text quoted back in feedback: enough to see the mistake, never a 100 kB echo


def echo_safe(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """Model text made safe to quote in an observation: cut to `limit` characters, no image placeholder,
    and no `<|...|>` special-token spelling (a chat template would turn it into a real control token)."""
    if len(text) > limit:
        text = text[:limit] + "…"
    return text.replace(IMAGE_PLACEHOLDER, "<img>").replace("<|", "< |").replace("|>", "| >")


def check_reasoning_rewards(
    env: LanguageEnv,
    response_format: str,
    grounding_coef: float,
    worldmodel_coef: float,
    reasoning_coef: float = 0.0,
    reasoning_credit: str = "exact",
):
    """Refuse reasoning-reward settings that could never pay: a clear error before any model loads."""
    if reasoning_credit not in REASONING_CREDITS:
        raise ValueError(f"Unknown reasoning_credit {reasoning_credit!r}; choose one of {REASONING_CREDITS}.")
    if reasoning_credit == "facts" and not env.supports_reading_facts:
        raise ValueError(
            f"{type(env).__name__} does not split its demonstration reasoning into facts; set "
            "reasoning_credit=exact for this game."
        )
    if grounding_coef < 0 or worldmodel_coef < 0 or reasoning_coef < 0:
        raise ValueError(
            "grounding_coef, worldmodel_coef and reasoning_coef are >= 0, got "
            f"{grounding_coef}, {worldmodel_coef} and {reasoning_coef}."
        )
    if reasoning_coef > 0 and response_format == "no_think":
        raise ValueError(
            f"reasoning_coef={reasoning_coef} rewards the <think> block, which response_format='no_think' has none "
            "of; set response_format=free_think, or reasoning_coef=0."
        )
    if reasoning_coef > 0 and type(env).demo_reasoning is LanguageEnv.demo_reasoning:
        raise ValueError(
            f"{type(env).__name__} writes no demonstration reasoning to compare <think> with; set reasoning_coef=0 "
            "for this game."
        )
    if grounding_coef > 0 and response_format not in ("grounding", "worldmodeling"):
        raise ValueError(
            f"grounding_coef={grounding_coef} rewards the <observation> block, which response_format="
            f"{response_format!r} has none of; set response_format=grounding (or worldmodeling), or grounding_coef=0."
        )
    if worldmodel_coef > 0 and response_format != "worldmodeling":
        raise ValueError(
            f"worldmodel_coef={worldmodel_coef} rewards the <prediction> block, which only response_format="
            f"worldmodeling has (got {response_format!r}); set response_format=worldmodeling, or worldmodel_coef=0."
        )
    if (grounding_coef > 0 or worldmodel_coef > 0) and not env.supports_grading:
        raise ValueError(
            f"{type(env).__name__} does not list its state_objects(), so its descriptions cannot be graded; "
            "set grounding_coef=0 and worldmodel_coef=0 for this game."
        )


class LanguageEnv(gymnasium.Env[Observation, str]):
    """A multi-turn game played by writing `<think>…</think><answer>…</answer>` responses.

    Contract:
    - `reset(seed)` → `(Observation, info)`; the first observation holds the rules, the response
      format and the initial state. Same seed ⇒ same episode in any process: all randomness comes
      from `self.np_random`, which Gymnasium seeds in `reset`.
    - `step(response)` → `(Observation, reward, terminated, truncated, info)`. Never raises on model
      output: a malformed response or an invalid action adds `format_penalty` to the reward and the
      turn still counts. `info` always has the keys of `INFO_KEYS`.
    - `truncated` is True when `max_turns` turns were played without the episode ending.

    Subclasses set `action_names` (None means the whole answer is one free-form action) and
    `example_answer`, and implement the hooks below.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array", "ansi"]}
    action_names: ClassVar[tuple[str, ...] | None] = None
    example_answer: ClassVar[str] = ""
    graded_nearby_only: ClassVar[tuple[str, ...]] = ()  # kinds a description needs to name only next to the player

    def __init__(
        self,
        *,
        observation: str = "text",
        response_format: str = "free_think",
        action_separator: str = "||",
        max_actions_per_turn: int = 3,
        format_penalty: float = -0.1,
        max_turns: int = 5,
        render_mode: str | None = None,
        grounding_coef: float = 0.0,
        worldmodel_coef: float = 0.0,
        reasoning_coef: float = 0.0,
        reasoning_credit: str = "exact",
        mark_no_effect: bool = False,
    ) -> None:
        if observation not in OBSERVATION_MODES:
            raise ValueError(f"Unknown observation mode {observation!r}; choose one of {OBSERVATION_MODES}.")
        if observation != "text" and not self.supports_images:
            raise ValueError(
                f"{type(self).__name__} renders text only; observation={observation!r} needs the visual "
                "variant (gymnasium.make('vagen/...-v0') or the class in envs_visual)."
            )
        if response_format not in RESPONSE_FORMATS:
            raise ValueError(f"Unknown response_format {response_format!r}; choose one of {RESPONSE_FORMATS}.")
        if max_actions_per_turn < 1 or max_turns < 1:
            raise ValueError("max_actions_per_turn and max_turns must both be >= 1.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"Unknown render_mode {render_mode!r}; choose one of {self.metadata['render_modes']}.")
        check_reasoning_rewards(
            self, response_format, grounding_coef, worldmodel_coef, reasoning_coef, reasoning_credit
        )
        if not isinstance(mark_no_effect, bool):
            raise ValueError(f"mark_no_effect must be true or false, got {mark_no_effect!r}.")
        self.mark_no_effect = mark_no_effect
        self.grounding_coef, self.worldmodel_coef = float(grounding_coef), float(worldmodel_coef)
        self.reasoning_coef, self.reasoning_credit = float(reasoning_coef), reasoning_credit
        self.observation_mode = observation
        self.response_format = response_format
        self.action_separator = action_separator
        self.max_actions_per_turn = max_actions_per_turn if self.action_names else 1
        self.format_penalty = float(format_penalty)
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = ObservationSpace()
        self.action_space = ResponseSpace(self.action_names, action_separator, self.max_actions_per_turn)
        self._turn = 0
        self._success = False
        self._done = False

    # ---- hooks for games -------------------------------------------------------------------
    def _reset_game(self, options: dict[str, Any] | None) -> None:
        """Start a new episode, drawing any randomness from `self.np_random`."""
        raise NotImplementedError

    def _apply(self, action: str) -> ActionResult:
        """Execute one canonical action (or the whole answer when `action_names` is None)."""
        raise NotImplementedError

    def _state_text(self) -> str:
        """The current state as text (e.g. the grid)."""
        raise NotImplementedError

    def _rules_text(self) -> str:
        """What the game is, what the symbols mean, which actions exist."""
        raise NotImplementedError

    def solver_actions(self) -> list[str]:
        """The oracle's next actions from the current state (an optimal plan where the game has one).
        Used by the built-in `solver` policy for demos, GIFs and the ceiling row of benchmarks."""
        raise NotImplementedError(f"{type(self).__name__} has no solver.")

    def demo_reasoning(self) -> str:
        """The `<think>` text a demonstration writes for the current state (supervised warm starts,
        `scripts/sft.py`): what a player needs to see before choosing `solver_actions()`. Games
        override it with words a small model can ground in the observation."""
        raise NotImplementedError(f"{type(self).__name__} has no demonstration reasoning.")

    def reasoning_matches(self, think: str) -> bool:
        """Whether `think` is `demo_reasoning()` for the current state, surrounding whitespace aside: what
        `reasoning_coef` pays for and what `scripts/evaluate.py mode=failures` counts."""
        return think.strip() == self.demo_reasoning().strip()

    def reading_facts(self, think: str) -> float:
        """The share of `demo_reasoning()`'s facts about the current state that `think` states rightly, in [0, 1]
        (`reasoning_credit=facts`): partial credit for a reading with one fact wrong, where `reasoning_matches`
        gives none. Games override it with a parser of their own reasoning's words."""
        raise NotImplementedError(f"{type(self).__name__} does not split its reasoning into facts.")

    def parse(self, response: str) -> ParsedResponse:
        """`response` parsed as `step()` parses it, with this game's format settings (replays use it)."""
        return parse_response(
            response,
            response_format=self.response_format,
            action_separator=self.action_separator,
            max_actions=self.max_actions_per_turn,
        )

    def reading_credit(self, think: str) -> bool | float:
        """What `reasoning_coef` pays a turn for, judged on the state the turn starts from."""
        return self.reading_facts(think) if self.reasoning_credit == "facts" else self.reasoning_matches(think)

    def key_cells(self) -> list[tuple[int, int]]:
        """(row, col) of the things the demonstration reasoning is about, player first: the labels of the
        vision pre-training in supervised warm starts (each image tile learns their direction from it)."""
        raise NotImplementedError(f"{type(self).__name__} names no key cells.")

    def tile_facts(self) -> np.ndarray | None:
        """Further labels of the vision pre-training, beside `key_cells`' directions: (H·W, F) small class indices
        (< len(RELATIVE_DIRECTIONS)) for every tile of the board, row-major, that a game's reasoning reads off one
        tile (Sokoban with `reading_walls`: which neighbours are walls); None when the game has none."""
        return None

    def state_key(self) -> Hashable | None:
        """An exact, hashable identity of the current game state, equal exactly when two states of the same level
        are the same (Sokoban: player and boxes); None when the game provides none. GiGPO's step-level credit
        (`algorithm.advantage=gigpo`) groups the turns of one group that start from equal keys; it never compares
        rendered text or pixels. Within one level (one reset seed) the key need not repeat the fixed layout."""
        return None

    def state_objects(self) -> list[tuple[str, tuple[int, int]]]:
        """What is where on the board, as `(kind, (row, col))` pairs with the player first as
        `("player", cell)`; kinds are lower-case words such as "box", "target", "hole", "green ball".
        Grid games implement it; it is the ground truth that `vagen.env.grading` scores the
        `<observation>` and `<prediction>` of the grounding and worldmodeling formats against."""
        raise NotImplementedError(f"{type(self).__name__} does not list its state objects, so it cannot be graded.")

    def objects_after(self, actions: list[str]) -> list[tuple[str, tuple[int, int]]]:
        """`state_objects()` after `actions` from the current state, leaving this env untouched (a copy
        plays them): what a worldmodeling demonstration predicts. Random dynamics (slippery ice) draw
        from the copy's generator, so the prediction is one possible outcome."""
        future = copy.deepcopy(self)
        future._execute(list(actions))
        return future.state_objects()

    def _render_image(self) -> Image.Image:
        """The current state as an RGB image; implemented by the visual variants."""
        raise NotImplementedError(f"{type(self).__name__} has no image renderer.")

    @property
    def supports_images(self) -> bool:
        return type(self)._render_image is not LanguageEnv._render_image

    @property
    def supports_grading(self) -> bool:
        """Whether `<observation>`/`<prediction>` can be graded: the game lists its `state_objects()`."""
        return type(self).state_objects is not LanguageEnv.state_objects

    @property
    def supports_solver(self) -> bool:
        """Whether the game has an oracle plan (`solver_actions`): the solver policy, the first-move probe and the
        frontier level sampler need it."""
        return type(self).solver_actions is not LanguageEnv.solver_actions

    @property
    def supports_demo_reasoning(self) -> bool:
        """Whether the game writes a demonstration's `<think>` reading (`demo_reasoning`): supervised warm starts and
        validation's reading metrics need it."""
        return type(self).demo_reasoning is not LanguageEnv.demo_reasoning

    @property
    def supports_reading_facts(self) -> bool:
        """Whether a `<think>` reading can be credited per fact (`reasoning_credit=facts`): the game overrides
        `reading_facts`."""
        return type(self).reading_facts is not LanguageEnv.reading_facts

    # ---- the protocol ----------------------------------------------------------------------
    @property
    def instructions(self) -> str:
        """Rules plus the response format, as the first observation states them."""
        fmt = format_instructions(
            self.response_format, self.example_answer, self.max_actions_per_turn, self.action_separator
        )
        return f"{self._rules_text()}\n{fmt}"

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        super().reset(seed=seed)
        self._turn, self._success, self._done = 0, False, False
        self._right_readings = 0
        self._reset_game(options)
        info = {
            "success": False,
            "format_ok": True,
            "action_is_valid": True,
            "action_is_effective": False,
            "actions": [],
            "dropped_actions": 0,
            "error": None,
            "grounding_score": None,
            "prediction_score": None,
            "reasoning_match": None,
        }
        return self._observation(f"{self.instructions}\n"), info

    def step(self, response: str) -> tuple[Observation, float, bool, bool, dict]:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first.")
        self._turn += 1
        parsed = self.parse(response)
        if self.action_names is None:
            executable, invalid = ([parsed.answer] if parsed.format_ok else []), []
        else:
            executable, invalid = match_actions(parsed.actions, self.action_names)
        grounding_score = self._grade(parsed.observation, "grounding", "worldmodeling")
        # judged on the state the turn starts from, as `scripts/evaluate.py mode=failures` judges it
        reasoning_match = self.reading_credit(parsed.think) if self.reasoning_coef > 0 else None
        turn = self._execute(executable)
        prediction_score = self._grade(parsed.prediction, "worldmodeling")
        error = parsed.error or turn.error
        if (invalid or turn.invalid) and error is None:
            error = f"invalid action(s) {invalid!r}; valid: {valid_names_text(self.action_names or ())}"
        if parsed.dropped_actions and error is None:  # never silently: counted, and priced like a format error
            error = (
                f"{parsed.dropped_actions} action(s) beyond max_actions_per_turn={self.max_actions_per_turn} ignored"
            )
        reward = turn.reward + (self.format_penalty if error else 0.0)
        reward += self.grounding_coef * (grounding_score or 0.0) + self.worldmodel_coef * (prediction_score or 0.0)
        truncated = not turn.terminated and (turn.budget_out or self._turn >= self.max_turns)
        self._done = turn.terminated or truncated
        if reasoning_match is not None:
            if error is not None:  # a malformed or invalid turn reads nothing right
                reasoning_match = False if isinstance(reasoning_match, bool) else 0.0
            self._right_readings += reasoning_match
            if self._done:  # once per episode, the share of its turns: more turns or stalling earn no more
                reward += self.reasoning_coef * self._right_readings / self._turn
        info = {
            "success": self._success,
            "format_ok": parsed.format_ok,
            "action_is_valid": parsed.format_ok and not (invalid or turn.invalid),
            "action_is_effective": turn.effective,
            "actions": turn.executed,
            "dropped_actions": parsed.dropped_actions,
            "error": error,
            "grounding_score": grounding_score,
            "prediction_score": prediction_score,
            "reasoning_match": reasoning_match,
        }
        feedback = f"Executed: {self._executed_text(turn)}. Reward: {reward:g}."
        if error:
            feedback += f" Problem: {echo_safe(error)}."
        return self._observation(feedback + "\n"), float(reward), turn.terminated, truncated, info

    def _executed_text(self, turn: _TurnOutcome) -> str:
        """The turn's executed actions for the feedback; with `mark_no_effect`, each one that changed nothing (a move
        into a wall) says so: "Down (no effect), Left"."""
        if not turn.executed:
            return "nothing"
        marks = [" (no effect)" if self.mark_no_effect and not moved else "" for moved in turn.moved]
        return ", ".join(action + mark for action, mark in zip(turn.executed, marks, strict=True))

    def _grade(self, description: str | None, *formats: str) -> float | None:
        """The grade of a description against the current state, or None when the response format
        has no such block or the game cannot be graded. A missing or malformed block grades 0."""
        if self.response_format not in formats or not self.supports_grading:
            return None
        return grade_description(description, self.state_objects(), self.graded_nearby_only)

    def _execute(self, actions: list[str]) -> _TurnOutcome:
        """Apply actions in order until one is invalid, ends the episode, or exhausts a budget."""
        turn = _TurnOutcome()
        for index, action in enumerate(actions):
            result = self._apply(action)
            if result.error:
                turn.invalid, turn.error = actions[index:], result.error
                break
            turn.executed.append(action)
            turn.moved.append(result.effective)
            turn.reward += result.reward
            turn.effective |= result.effective
            self._success |= result.success
            if result.terminated or result.success:
                turn.terminated = True
                break
            if result.truncated:
                turn.budget_out = True
                break
        return turn

    def _observation(self, prefix: str) -> Observation:
        state = "Current state:"
        if self.observation_mode == "text":
            return Observation(f"{prefix}{state}\n{self._state_text()}")
        image = self._render_image()
        if self.observation_mode == "image":
            return Observation(f"{prefix}{state} {IMAGE_PLACEHOLDER}", [image])
        return Observation(f"{prefix}{state} {IMAGE_PLACEHOLDER}\n{self._state_text()}", [image])

    def render(self) -> np.ndarray | str | None:
        if self.render_mode == "rgb_array":
            return np.asarray(self._render_image().convert("RGB"))
        if self.render_mode == "ansi":
            return self._state_text()
        return None
