"""The reward functions of a run, from its config: built-in or imported, guarded, gated, weighted.

Every function TRL calls is wrapped in a `GuardedReward`, so a user's reward that raises ends the
run with one line naming that reward. The coherence rewards are gated by the cascade (not called
at all while the gate is closed) and their weights ramp in through `CascadeWeights`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.rewards import (
    CachedPhiProvider,
    CascadeGate,
    CascadeWeights,
    CoherenceReward,
    CommitmentReward,
    PhiReward,
    RewardError,
    concise_reward,
    gated,
    load_reward,
    make_format_reward,
    make_task_reward,
)
from engine.rewards.functions import TRL_KEYWORDS
from engine.tasks import Task

from .backend import BadInput, TrainingFailed, one_line
from .config import COHERENCE_REWARDS, TrainConfig


class GuardedReward:
    """Calls a reward function; an exception from it ends the run, naming the reward."""

    def __init__(self, fn: Callable[..., list[float | None]], name: str) -> None:
        self.fn = fn
        self.__name__ = name

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        try:
            return self.fn(prompts=prompts, completions=completions, **kwargs)
        except Exception as exc:
            raise TrainingFailed(f"reward {self.__name__!r} raised {one_line(exc)}") from exc


def required_columns(fn: Callable[..., Any]) -> set[str]:
    """Dataset columns a reward function names as parameters without a default."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {
        p.name
        for p in params
        if p.kind in kinds and p.default is inspect.Parameter.empty and p.name not in TRL_KEYWORDS
    }


@dataclass
class RewardSet:
    funcs: list[GuardedReward]  # in config order: what TRL gets
    names: list[str]  # TRL's names for them (`rewards/<name>/mean`)
    task_names: list[str]
    columns: dict[str, set[str]]  # dataset columns each reward needs
    gate: CascadeGate | None = None
    weights: CascadeWeights | None = None
    base: dict[str, float] = field(default_factory=dict)
    phi_rewards: list[PhiReward] = field(default_factory=list)
    task: Task | None = None  # what `task` and `format` check

    @property
    def multiplier(self) -> float:
        return self.gate.multiplier if self.gate is not None else 0.0

    @property
    def needs_phi(self) -> bool:
        """True when a coherence reward will be called this step (the gate is open or ramping)."""
        return bool(self.phi_rewards) and self.multiplier > 0

    def current_weights(self) -> list[float]:
        if self.weights is None:
            return [self.base[name] for name in self.names]
        return self.weights.ordered(self.names, self.multiplier)

    def set_weight(self, name: str, value: float) -> str:
        if name not in self.names:
            raise RewardError(f"unknown reward {name!r} (this run has: {', '.join(self.names)})")
        if self.weights is None:
            self.base[name] = value
            return f"weight of {name} = {value:g}"
        effective = self.weights.set_weight(name, value)
        if self.weights.is_capped(name):
            return (
                f"weight of {name} = {value:g}, capped at {effective:g} "
                f"(task weight x {self.weights.cap_ratio:g})"
            )
        return f"weight of {name} = {value:g}"

    def set_phi_provider(self, provider: Callable[..., Sequence[Any]]) -> None:
        shared = CachedPhiProvider(provider)  # coherence and commitment share one forward per step
        for reward in self.phi_rewards:
            reward.phi_provider = shared

    def set_calibration_pool(self, pool: Callable[[list[float]], list[float]]) -> None:
        """Several ranks: the coherence reward calibrates on every rank's answers, not its own share."""
        for reward in self.phi_rewards:
            if isinstance(reward, CoherenceReward):
                reward.pool = pool

    def check_columns(self, columns: set[str], dataset: str) -> None:
        for name in self.names:
            missing = sorted(self.columns[name] - columns)
            if missing:
                have = ", ".join(sorted(columns))
                hint = ""
                if name == "task" and self.task is not None:
                    hint = f"; {self.task.name} task, set `task:` for another"
                raise BadInput(
                    f"dataset {dataset}: no {', '.join(map(repr, missing))} column, which the {name} reward"
                    f" needs (columns: {have}{hint})"
                )

    def state_dict(self) -> dict[str, Any]:
        return {
            "gate": self.gate.to_dict() if self.gate is not None else None,
            "weights": self.weights.to_dict() if self.weights is not None else None,
            "base": dict(self.base),
            "coherence": [r.state_dict() for r in self.phi_rewards if isinstance(r, CoherenceReward)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("gate") and self.gate is not None:
            self.gate = CascadeGate.from_dict(state["gate"])
        if state.get("weights") and self.weights is not None:
            self.weights = CascadeWeights.from_dict(state["weights"])
        self.base.update(state.get("base") or {})
        saved = iter(state.get("coherence") or [])
        for reward in self.phi_rewards:
            if isinstance(reward, CoherenceReward) and (calibration := next(saved, None)) is not None:
                reward.load_state_dict(calibration)


def _builtin(name: str, task: Task) -> Callable[..., list[float | None]]:
    if name == "task":
        return make_task_reward(task)
    if name == "format":
        return make_format_reward(task)
    return concise_reward


def build_rewards(config: TrainConfig, task: Task) -> RewardSet:
    """The reward functions of `config.rewards` for `task`; an import that fails is BadInput."""
    built: list[RewardSet] = []  # the gated wrappers read the live gate (a resume replaces it)

    def multiplier() -> float:
        return built[0].multiplier if built else 0.0

    funcs: list[GuardedReward] = []
    names: list[str] = []
    task_names: list[str] = []
    phi_rewards: list[PhiReward] = []
    columns: dict[str, set[str]] = {}
    for spec in config.rewards:
        if spec.name in COHERENCE_REWARDS:
            reward = CoherenceReward() if spec.name == "coherence" else CommitmentReward()
            phi_rewards.append(reward)
            fn: Callable[..., Any] = gated(reward, multiplier)
            name, needs = spec.name, set()
        elif ":" in spec.name:
            try:
                fn = load_reward(spec.name)
            except RewardError as exc:
                raise BadInput(f"rewards: {exc}") from None
            name, needs = getattr(fn, "__name__", spec.name.rpartition(":")[2]), required_columns(fn)
            task_names.append(name)  # a user's reward is a task reward: it drives the gate
        else:
            fn, name = _builtin(spec.name, task), spec.name
            needs = set(task.required_columns) if name == "task" else set()
            if name == "task":
                task_names.append(name)
        if name in names:
            raise BadInput(f"rewards: two rewards are named {name!r}")
        funcs.append(GuardedReward(fn, name))
        names.append(name)
        columns[name] = needs
    base = {name: spec.weight for name, spec in zip(names, config.rewards, strict=True)}
    rewards = RewardSet(funcs, names, task_names, columns, base=base, phi_rewards=phi_rewards, task=task)
    if task_names:
        c = config.cascade
        try:
            rewards.gate = CascadeGate(
                c.min_points,
                c.percentile,
                c.window,
                c.min_above,
                c.ramp_steps,
                always_open=c.mode == "always",
            )
            rewards.weights = CascadeWeights(base, COHERENCE_REWARDS, c.cap_ratio, task_names)
        except RewardError as exc:
            raise BadInput(f"cascade: {exc}") from None
    built.append(rewards)
    return rewards
