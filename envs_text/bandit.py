"""RAGEN's two-armed bandit: does the model reason from the arms' names to a risky choice?

The rules never state the payoffs. One arm (named like something safe) pays a small sure reward,
the other (named like something bold) pays more in expectation but usually nothing; choosing
the bold arm counts as success.
"""

from __future__ import annotations

from typing import Any

from vagen.env.base import ActionResult, LanguageEnv


class BanditTextEnv(LanguageEnv):
    """A one-turn, two-armed bandit.

    ## Description
    Two arms, `low_risk_name` (default "Phoenix") and `high_risk_name` (default "Dragon"), shown
    in an order drawn per seed. Their payoffs are hidden: the model has to guess from the names.

    ## Actions
    The name of one arm (case-insensitive), one per turn.

    ## Observations
    The two arm names in the episode's presentation order (`arm_names_in_order()`).

    ## Rewards
    Low-risk arm: always `low_risk_reward` (0.1). High-risk arm: `high_risk_reward` (1.0) with
    probability `high_risk_prob` (0.25), else 0. An unknown name earns the format penalty.

    ## Episode end
    After one turn (`max_turns=1` by default): any arm ends it (terminated; success means the
    high-risk arm was chosen), and an invalid answer ends it by truncation. With `max_turns` > 1
    an invalid answer gives the model another try.
    """

    example_answer = "Dragon"

    def __init__(
        self,
        *,
        low_risk_name: str = "Phoenix",
        high_risk_name: str = "Dragon",
        low_risk_reward: float = 0.1,
        high_risk_reward: float = 1.0,
        high_risk_prob: float = 0.25,
        **base_kwargs: Any,
    ) -> None:
        names = (str(low_risk_name).strip(), str(high_risk_name).strip())
        if not all(names) or names[0].lower() == names[1].lower():
            raise ValueError(f"The two arm names must be non-empty and differ (case-insensitively), got {names}.")
        separator = base_kwargs.get("action_separator", "||")
        if any(separator in name for name in names):
            raise ValueError(f"Arm names {names} must not contain the action separator {separator!r}.")
        if not 0.0 <= high_risk_prob <= 1.0:
            raise ValueError(f"high_risk_prob is a probability in [0, 1], got {high_risk_prob}.")
        # The base class reads action_names while building the action space.
        self.action_names = names
        base_kwargs.setdefault("max_turns", 1)
        base_kwargs.setdefault("max_actions_per_turn", 1)
        super().__init__(**base_kwargs)
        self.low_risk_name, self.high_risk_name = names
        self.low_risk_reward, self.high_risk_reward = float(low_risk_reward), float(high_risk_reward)
        self.high_risk_prob = float(high_risk_prob)
        self._order = names

    def arm_names_in_order(self) -> tuple[str, str]:
        """The two arm names in the order this episode presents them."""
        return self._order

    # ---- game hooks ----------------------------------------------------------------------
    def _reset_game(self, options: dict[str, Any] | None) -> None:
        names = (self.low_risk_name, self.high_risk_name)
        self._order = names if self.np_random.random() < 0.5 else names[::-1]
        # The example names the first-shown arm so that, over seeds, it favours neither.
        self.example_answer = self._order[0]

    def _apply(self, action: str) -> ActionResult:
        if action == self.high_risk_name:
            won = self.np_random.random() < self.high_risk_prob
            return ActionResult(
                reward=self.high_risk_reward if won else 0.0, effective=True, terminated=True, success=True
            )
        return ActionResult(reward=self.low_risk_reward, effective=True, terminated=True, success=False)

    def _state_text(self) -> str:
        first, second = self._order
        return f"Arms: {first}, {second}"

    def _rules_text(self) -> str:
        first, second = self._order
        return (
            "You are playing a bandit game. Goal: get the highest reward you can by pulling one arm.\n"
            f"There are two arms, named {first} and {second}. Each arm has its own reward distribution, "
            "related to its name, and the distributions are not shown to you.\n"
            "Think about what each name suggests about how its rewards behave, then pull the arm you "
            f"expect to pay more on average. Answer with exactly one name: {first} or {second}."
        )

    def solver_actions(self) -> list[str]:
        """The high-risk arm: it pays more in expectation and is the success criterion."""
        return [self.high_risk_name]
