"""The cascade: coherence rewards stay off until the task reward works, then ramp in, capped.

`CascadeGate` is the percentile gate of docs/reference/carl.md §7, driven only by the live task-reward signal
(the task reward function's mean for each step, fed by the runner once per optimizer step), never by a step
count and never by the coherence signal. Its `GateState` is the per-step record the project rules ask
for (state, threshold, history length, count above, multiplier, reason).

`CascadeWeights` turns the gate multiplier into TRL `reward_weights`, with the coherence weights capped
below the task weight. `gated` wraps a coherence reward so that it is not even called while the gate is
closed (no extra Phi forward is paid before the gate opens).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .functions import RewardError, RewardFn

STATES = ("closed", "ramping", "open")


def _finite(value: Any) -> float:
    """The value as a float; NaN, +-inf, None and non-numbers count as 0 (no evidence the task works)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) else 0.0


@dataclass(frozen=True)
class GateState:
    """The gate after one step. `window` is how many values the `above` count looked at."""

    step: int
    state: str
    threshold: float
    history_len: int
    above: int
    window: int
    multiplier: float
    opened_at: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def row(self) -> dict[str, Any]:
        """The store's `gate_states` row for this step (`Store.add_gate_states`)."""
        return {
            "step": self.step,
            "state": self.state,
            "threshold": self.threshold,
            "history": self.history_len,
            "above": self.above,
            "window": self.window,
            "multiplier": self.multiplier,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateState:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


class CascadeGate:
    """Fires when >= `min_above` of the last `window` task-reward means are >= the running percentile and > 0.

    threshold = sorted(history)[min(floor(percentile * n), n - 1)], over the whole run's history of n
    values; nothing fires below `min_points` values or while threshold <= 0. Once fired at step S it is
    latched, and the multiplier is coherence_cap * min(1, (step - S + 1) / ramp_steps). `coherence_cap`
    (default 1.0) is the multiplier the ramp ends at, for a run that wants coherence at part strength.
    The decision depends only on the values fed; the step numbers only time the ramp and the record.
    `always_open` is the ablation without a gate: open at the first step, at `coherence_cap`, no ramp.
    """

    def __init__(
        self,
        min_points: int = 5,
        percentile: float = 0.6,
        window: int = 5,
        min_above: int = 3,
        ramp_steps: int = 10,
        coherence_cap: float = 1.0,
        always_open: bool = False,
    ) -> None:
        if min_points < 1 or window < 1 or ramp_steps < 1:
            raise RewardError("cascade gate needs min_points, window and ramp_steps >= 1")
        if not 0.0 <= percentile <= 1.0:
            raise RewardError(f"cascade gate percentile must be in [0, 1], not {percentile}")
        if not 1 <= min_above <= window:
            raise RewardError(f"cascade gate min_above must be in [1, window={window}], not {min_above}")
        if not 0.0 < coherence_cap <= 1.0:
            raise RewardError(f"cascade gate coherence_cap must be in (0, 1], not {coherence_cap}")
        self.min_points = min_points
        self.percentile = percentile
        self.window = window
        self.min_above = min_above
        self.ramp_steps = ramp_steps
        self.coherence_cap = coherence_cap
        self.always_open = (
            always_open  # the always-on ablation: no gate, coherence at full weight from step one
        )
        self.history: list[float] = []
        self._sorted: list[float] = []  # kept sorted on insert: the percentile is one index away
        self.opened_at: int | None = None
        self.last: GateState | None = None

    @property
    def multiplier(self) -> float:
        """The multiplier of the last update (0.0 before any); what `gated` reads."""
        return self.last.multiplier if self.last else 0.0

    @property
    def label(self) -> str:
        return f"p{round(self.percentile * 100)}"

    def threshold(self) -> float:
        n = len(self._sorted)
        # The epsilon keeps e.g. 0.29 * 100 = 28.999999999999996 on index 29.
        return self._sorted[min(math.floor(self.percentile * n + 1e-9), n - 1)] if n else 0.0

    def update(self, step: int, task_reward_mean: float) -> GateState:
        """Record one step's task-reward mean (non-finite counts as 0) and return the gate's state."""
        value = _finite(task_reward_mean)
        self.history.append(value)
        bisect.insort(self._sorted, value)
        n = len(self.history)
        threshold = self.threshold()
        recent = self.history[-self.window :]
        above = sum(1 for v in recent if v >= threshold and v > 0)
        if self.opened_at is None and n >= self.min_points and threshold > 0 and above >= self.min_above:
            self.opened_at = step
        if self.always_open:
            if self.opened_at is None:
                self.opened_at = step
            state, multiplier, reason = "open", self.coherence_cap, "open: always on (cascade.mode always)"
        elif self.opened_at is None:
            if n < self.min_points:
                reason = f"closed: {n}/{self.min_points} points"
            else:
                reason = f"closed: {above}/{len(recent)} above {self.label}={threshold:.2f} (n={n})"
            state, multiplier = "closed", 0.0
        else:
            done = min(1.0, max(0.0, (step - self.opened_at + 1) / self.ramp_steps))
            multiplier = self.coherence_cap * done
            if done < 1.0:
                state = "ramping"
                reason = f"ramping {step - self.opened_at + 1}/{self.ramp_steps} since step {self.opened_at}"
            else:
                state, reason = "open", f"open since step {self.opened_at}"
        self.last = GateState(
            step=int(step),
            state=state,
            threshold=threshold,
            history_len=n,
            above=above,
            window=len(recent),
            multiplier=multiplier,
            opened_at=self.opened_at,
            reason=reason,
        )
        return self.last

    def config(self) -> dict[str, Any]:
        return {
            "min_points": self.min_points,
            "percentile": self.percentile,
            "window": self.window,
            "min_above": self.min_above,
            "ramp_steps": self.ramp_steps,
            "coherence_cap": self.coherence_cap,
            "always_open": self.always_open,
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs (JSON-safe: the history holds finite floats only)."""
        return {
            "config": self.config(),
            "history": list(self.history),
            "opened_at": self.opened_at,
            "last": self.last.to_dict() if self.last else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CascadeGate:
        gate = cls(**data["config"])
        gate.history = [float(v) for v in data["history"]]
        gate._sorted = sorted(gate.history)
        gate.opened_at = data["opened_at"]
        gate.last = GateState.from_dict(data["last"]) if data.get("last") else None
        return gate


class CascadeWeights:
    """Per-reward weights for TRL, with the coherence weights gated and capped below the task weight.

    weights(m)[c] = min(base[c], cap_ratio * W_task) * m   for each coherence name c
    weights(m)[r] = base[r]                                for every other reward
    where W_task is the sum of the task rewards' weights and m the gate multiplier in [0, 1]. The cap
    is applied before the ramp, so the ramp always spans its full length. cap_ratio < 1 keeps every
    coherence weight strictly below the task weight. Note the weight means "share of the advantage"
    only under `multi_objective_aggregation="normalize_then_sum"`; under the default
    `sum_then_normalize` it multiplies the raw reward, whose within-group spread also counts
    (docs/reference/training.md §1.3).
    """

    def __init__(
        self,
        base: Mapping[str, float],
        coherence_names: Iterable[str] = ("coherence", "commitment"),
        cap_ratio: float = 0.5,
        task_names: Iterable[str] = ("task",),
    ) -> None:
        if not 0.0 <= cap_ratio < 1.0:
            raise RewardError(
                f"coherence cap_ratio must be in [0, 1) so the task reward stays dominant, not {cap_ratio}"
            )
        self.base: dict[str, float] = {}
        for name, value in base.items():
            self.base[name] = self._valid(name, value)
        self.coherence_names = tuple(coherence_names)
        self.task_names = tuple(task_names)
        self.cap_ratio = cap_ratio
        missing = [name for name in self.task_names if name not in self.base]
        if missing or not self.task_names:
            raise RewardError(
                f"cascade weights need the task reward {missing or ['task']} (known: {self._known()})"
            )
        if overlap := set(self.task_names) & set(self.coherence_names):
            raise RewardError(f"{sorted(overlap)} cannot be both a task and a coherence reward")

    def _known(self) -> str:
        return ", ".join(self.base)

    @staticmethod
    def _valid(name: str, value: float) -> float:
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise RewardError(f"weight of {name!r} must be a finite number >= 0, not {value}")
        return value

    @property
    def task_weight(self) -> float:
        return sum(self.base[name] for name in self.task_names)

    def cap(self) -> float:
        """The largest weight a coherence reward may have now."""
        return self.cap_ratio * self.task_weight

    def weights(self, multiplier: float = 1.0) -> dict[str, float]:
        """The weights to use at this gate multiplier (clamped to [0, 1]), in `base` order."""
        m = min(1.0, max(0.0, _finite(multiplier)))
        cap = self.cap()
        return {
            name: min(value, cap) * m if name in self.coherence_names else value
            for name, value in self.base.items()
        }

    def ordered(self, names: Iterable[str], multiplier: float = 1.0) -> list[float]:
        """The weights for TRL's `reward_weights`, in the order of its reward functions."""
        weights = self.weights(multiplier)
        return [weights[name] for name in names]

    def set_weight(self, name: str, value: float) -> float:
        """Change one base weight at run time; returns its effective weight with the gate fully open."""
        if name not in self.base:
            raise RewardError(f"unknown reward {name!r} (known: {self._known()})")
        self.base[name] = self._valid(name, value)
        return self.weights(1.0)[name]

    def is_capped(self, name: str) -> bool:
        return name in self.coherence_names and self.base[name] > self.cap()

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": dict(self.base),
            "coherence_names": list(self.coherence_names),
            "cap_ratio": self.cap_ratio,
            "task_names": list(self.task_names),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CascadeWeights:
        return cls(data["base"], data["coherence_names"], data["cap_ratio"], data["task_names"])


class GatedReward:
    """A reward that answers 0.0 for every sample, without calling `fn`, while the multiplier is 0.

    Above 0 it returns `fn`'s values unchanged (the multiplier belongs in the weights, see
    `CascadeWeights`), or scaled by the multiplier with `scale=True` for a runner that cannot change
    TRL's `reward_weights` during training (None stays None). Settings such as `phi_provider` belong
    on the wrapped function: `gated.fn.phi_provider = ...`.
    """

    def __init__(self, fn: RewardFn, multiplier: Callable[[], float], scale: bool = False) -> None:
        self.fn = fn
        self.multiplier = multiplier
        self.scale = scale
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)
        self.__wrapped__ = fn

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        m = float(self.multiplier())
        if not m > 0:  # also catches NaN
            return [0.0] * len(completions)
        values = self.fn(prompts=prompts, completions=completions, **kwargs)
        if not self.scale:
            return values
        return [None if v is None else v * m for v in values]


def gated(fn: RewardFn, gate_multiplier_getter: Callable[[], float], scale: bool = False) -> GatedReward:
    """Wrap `fn` so it costs nothing while the gate is closed, e.g.
    `gated(coherence, lambda: gate.multiplier)`."""
    return GatedReward(fn, gate_multiplier_getter, scale)
