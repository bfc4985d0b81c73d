"""The five reward functions, in TRL's form `f(prompts, completions, **kwargs) -> list[float | None]`.

| `__name__`   | what it scores                                              | needs                        |
|--------------|-------------------------------------------------------------|------------------------------|
| `task`       | the task's verifier against the row's answer columns        | the task's columns            |
| `format`     | the task's answer format (a JSON call, an `<answer>` block) | -                            |
| `coherence`  | high Phi at the answer tokens, relative to the run's baseline | per-token Phi               |
| `commitment` | upward Phi jumps that hold; melting after them is penalised | per-token Phi                |
| `concise`    | length against a target (characters or tokens)              | (`completion_ids` for tokens) |

Completions may be strings (standard datasets) or message lists (conversational ones). `task` and
`format` are made for a task (`make_task_reward(task)`, `make_format_reward(task)`, see `engine.tasks`):
the rewards themselves know no particular task.

**Per-token Phi for `coherence` and `commitment`.** TRL gives reward functions no logits, so the
runner supplies Phi in one of two ways, looked up in this order for every call:

1. a keyword `phi_traces`: a list with one entry per completion, each a 1-D float array of Phi for
   that completion's generated tokens (token t scored with the logits at t-1 of prompt + completion,
   docs/reference/carl.md §2), or None where Phi is unknown;
2. the instance attribute `phi_provider`: any callable `provider(prompts=..., completions=...,
   completion_ids=..., **kwargs) -> list[array | None]`, called with the same keywords TRL passes.
   Wrap an expensive provider in `CachedPhiProvider` so both coherence rewards share one forward.

A completion whose trace is None, empty or entirely non-finite gets None (TRL treats it as NaN, which
leaves that function out for that sample); with no `phi_traces` and no provider, every sample gets None.
Optional keyword `answer_masks`: per completion, a boolean array over its tokens marking the answer
(e.g. the tool-call span); without it the answer is the last `answer_tail` fraction of the tokens.
"""

from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.errors import CarlError
from engine.tasks import Task, completion_text

RewardFn = Callable[..., list[float | None]]
PhiProvider = Callable[..., Sequence[Any]]

# Keywords TRL passes to every reward function besides the dataset's columns.
TRL_KEYWORDS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
JUMP = 0.03  # docs/reference/carl.md §5: a per-token |dPhi| above this is a crystallization / melting event


class RewardError(CarlError):
    """A reward cannot be loaded, configured or fed; the message is one line."""


def _named(name: str) -> Callable[[RewardFn], RewardFn]:
    """Give a function the short, stable name TRL logs it under (`rewards/<name>/mean`)."""

    def rename(fn: RewardFn) -> RewardFn:
        fn.__name__ = name
        fn.__qualname__ = name
        return fn

    return rename


# --- task and format: the run's task checks the answer ------------------------------------------


def make_task_reward(task: Task) -> RewardFn:
    """The `task` reward: the task's verifier on each completion against its row's answer columns."""

    @_named("task")
    def task_reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        missing = task.missing(set(kwargs))
        if missing:
            columns = ", ".join(sorted(k for k in kwargs if k not in TRL_KEYWORDS)) or "none"
            raise RewardError(
                f"the task reward needs a {missing[0]!r} dataset column ({task.name} task; columns: "
                f"{columns})"
            )
        answers = task.answers(kwargs, len(completions))
        return [task.score(completion_text(c), a) for c, a in zip(completions, answers, strict=True)]

    task_reward.__doc__ = f"Verifiable correctness: the {task.name} task's check, in [0, 1]."
    return task_reward


def make_format_reward(task: Task) -> RewardFn:
    """The `format` reward: how well each completion follows the task's answer format."""

    @_named("format")
    def format_reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return [task.format_score(completion_text(c)) for c in completions]

    format_reward.__doc__ = f"Structure compliance: the {task.name} task's format check, in [0, 1]."
    return format_reward


# --- concise ------------------------------------------------------------------------------------


def concise_score(length: int, target: int, slack: float) -> float:
    """1.0 up to `target`, falling linearly to 0 at `target * (1 + slack)`; 0 for empty
    (silence is not concision)."""
    if length <= 0:
        return 0.0
    if length <= target:
        return 1.0
    return max(0.0, 1.0 - (length - target) / (slack * target))


def make_concise_reward(target: int = 60, unit: str = "chars", slack: float = 2.0) -> RewardFn:
    """A `concise` reward measuring characters of the stripped text, or generated tokens.

    `unit="tokens"` counts the `completion_ids` TRL passes (None for every sample when it is absent).
    The default (60 characters, zero at 180) matches the demo's tool calls of 45-55 characters.
    """
    if unit not in ("chars", "tokens"):
        raise RewardError(f"concise reward unit must be 'chars' or 'tokens', not {unit!r}")
    if target < 1 or not slack > 0:
        raise RewardError(f"concise reward needs target >= 1 and slack > 0 (got {target}, {slack})")

    @_named("concise")
    def concise_reward(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        if unit == "chars":
            return [concise_score(len(completion_text(c).strip()), target, slack) for c in completions]
        ids = kwargs.get("completion_ids")
        if ids is None:
            return [None] * len(completions)
        return [concise_score(len(i), target, slack) for i in ids]

    concise_reward.__doc__ = f"1.0 up to {target} {unit}, 0 from {target * (1 + slack):g}; 0 when empty."
    return concise_reward


concise_reward = make_concise_reward()


# --- per-token Phi ------------------------------------------------------------------------------


def _as_trace(trace: Any) -> np.ndarray | None:
    """A float array (non-finite tokens kept, so answer masks stay aligned), or None with no finite value."""
    if trace is None:
        return None
    phi = np.asarray(trace, dtype=np.float64).ravel()
    return phi if np.isfinite(phi).any() else None


class CachedPhiProvider:
    """Memoises a Phi provider for the last batch, so `coherence` and `commitment` pay one forward.

    The batch is recognised by its `completion_ids` (TRL passes the same ids to every reward function
    of a step), or by the completion texts when ids are absent.
    """

    def __init__(self, compute: PhiProvider) -> None:
        self.compute = compute
        self.calls = 0
        self._key: Any = None
        self._value: list[Any] = []

    @staticmethod
    def _fingerprint(completions: list, kwargs: dict[str, Any]) -> Any:
        ids = kwargs.get("completion_ids")
        if ids is not None:
            return tuple(tuple(int(t) for t in row) for row in ids)
        return tuple(completion_text(c) for c in completions)

    def __call__(self, *, prompts: list, completions: list, **kwargs: Any) -> list[Any]:
        key = self._fingerprint(completions, kwargs)
        if key != self._key:
            self.calls += 1
            self._value = list(self.compute(prompts=prompts, completions=completions, **kwargs))
            self._key = key
        return self._value


class PhiReward(ABC):
    """Base of the rewards computed from per-token Phi: finds the traces and maps None through."""

    name = "phi"

    def __init__(self, phi_provider: PhiProvider | None = None) -> None:
        self.phi_provider = phi_provider
        self.__name__ = self.name  # TRL names a callable instance by its `__name__`

    def traces(self, prompts: list, completions: list, kwargs: dict[str, Any]) -> list[np.ndarray | None]:
        raw = kwargs.get("phi_traces")
        if raw is None and self.phi_provider is not None:
            raw = self.phi_provider(prompts=prompts, completions=completions, **kwargs)
        if raw is None:
            return [None] * len(completions)
        raw = list(raw)
        if len(raw) != len(completions):
            raise RewardError(
                f"{self.name} reward got {len(raw)} Phi traces for {len(completions)} completions"
            )
        return [_as_trace(t) for t in raw]

    @abstractmethod
    def batch(self, traces: list[np.ndarray | None], masks: list[Any]) -> list[float | None]:
        """One reward per completion from its Phi trace and answer mask (None where no trace)."""

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        traces = self.traces(prompts, completions, kwargs)
        masks = kwargs.get("answer_masks")
        masks = [None] * len(traces) if masks is None else list(masks)
        if len(masks) != len(traces):
            raise RewardError(
                f"{self.name} reward got {len(masks)} answer masks for {len(traces)} completions"
            )
        return self.batch(traces, masks)


def _sigmoid(z: float) -> float:
    # Two branches so a large |z| never overflows exp.
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class CoherenceReward(PhiReward):
    """`coherence`: how much more certain the answer tokens are than the run is used to. In (0, 1).

        a_i = mean of Phi over completion i's answer tokens
              (the `answer_masks` entry if given, else its last ceil(answer_tail * T) tokens)
        b   = median of a over the calibration set, s = max(1.4826 * MAD of a over that set, scale_floor)
        r_i = sigmoid((a_i - b) / s)

    The calibration set is every a seen in this reward's first `calibration_batches` batches with Phi
    (the current batch included, so the first batch is centred on 0.5); after that b and s freeze.
    Why this shape and not the published multiscale score (docs/reference/carl.md §4, the coherence trap):
      - it scores the *level* of Phi where the answer is, not its uniformity, so noise that is
        uniformly uncertain scores low, not 0.6;
      - the run's own b and s make it meaningful at any vocabulary (Phi is squeezed near 1 at
        |V| = 151,936, where 0.01 of Phi is ~0.12 nats);
      - the frozen baseline makes it saturate: once every answer in a group sits several s above b,
        the group's spread of r, and with it this reward's share of the advantage, goes to zero, so
        it stops pushing entropy down (a Phi-only reward is otherwise RENT, docs/reference/carl.md §10.3).
    Under `gated`, calibration starts when the task-reward gate opens, i.e. at the model's state then.
    """

    name = "coherence"

    def __init__(
        self,
        phi_provider: PhiProvider | None = None,
        answer_tail: float = 0.5,
        calibration_batches: int = 4,
        scale_floor: float = 0.01,
    ) -> None:
        super().__init__(phi_provider)
        if not 0 < answer_tail <= 1:
            raise RewardError(f"coherence answer_tail must be in (0, 1], not {answer_tail}")
        if calibration_batches < 1 or not scale_floor > 0:
            raise RewardError("coherence needs calibration_batches >= 1 and scale_floor > 0")
        self.answer_tail = answer_tail
        self.calibration_batches = calibration_batches
        self.scale_floor = scale_floor
        self.calibration: list[float] = []
        self.batches_seen = 0
        # Data-parallel training: gathers every rank's answer values (each rank calls it at the same
        # batch), so all ranks calibrate on the whole batch and score alike.
        self.pool: Callable[[list[float]], list[float]] | None = None

    def answer_phi(self, phi: np.ndarray, mask: Any) -> float | None:
        """Mean Phi of the answer tokens (non-finite ones skipped); None when none is finite."""
        region = phi[-max(1, math.ceil(self.answer_tail * len(phi))) :]
        if mask is not None:
            m = np.asarray(mask, dtype=bool).ravel()
            if len(m) == len(phi) and m.any():
                region = phi[m]
        region = region[np.isfinite(region)]
        return float(region.mean()) if len(region) else None

    @property
    def baseline(self) -> tuple[float, float] | None:
        """(b, s) as currently calibrated, or None before any Phi was seen."""
        if not self.calibration:
            return None
        values = np.asarray(self.calibration)
        b = float(np.median(values))
        s = max(1.4826 * float(np.median(np.abs(values - b))), self.scale_floor)
        return b, s

    def batch(self, traces: list[np.ndarray | None], masks: list[Any]) -> list[float | None]:
        answer = [
            None if phi is None else self.answer_phi(phi, mask)
            for phi, mask in zip(traces, masks, strict=True)
        ]
        seen = [a for a in answer if a is not None]
        if self.batches_seen < self.calibration_batches:
            if self.pool is not None:
                seen = self.pool(seen)
            if seen:
                self.calibration.extend(seen)
                self.batches_seen += 1
        base = self.baseline
        if base is None:
            return [None] * len(answer)
        b, s = base
        return [None if a is None else _sigmoid((a - b) / s) for a in answer]

    def state_dict(self) -> dict[str, Any]:
        """The calibration, so a resumed run scores against the same baseline."""
        return {"calibration": list(self.calibration), "batches_seen": self.batches_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.calibration = [float(v) for v in state["calibration"]]
        self.batches_seen = int(state["batches_seen"])


class CommitmentReward(PhiReward):
    """`commitment`: do the Phi jumps at decision points hold? In [0, 1], 0.5 when there are none.

    With dPhi_k = Phi_{k+1} - Phi_k and theta = `jump` (0.03, docs/reference/carl.md §5):
      - each upward jump k (dPhi_k > theta) commits to the level L_k = Phi_{k+1}; its hold is the
        fraction of the next `hold` tokens (Phi_{k+2} ...) with Phi >= L_k - theta, 1.0 when the
        jump is on the last token;
      - each melting (dPhi_k < -theta) after the first upward jump is a penalty of 1;
      - Q = (sum of holds - meltings after commitment) / (upward jumps + meltings after commitment),
        in [-1, 1], and r = (1 + Q) / 2.
    A clean commitment (low, one jump, stays high) scores 1; a jump that melts back scores ~0.25; noise
    (many jumps that do not hold, many meltings) scores below 0.5; a flat trace, high or low, scores
    0.5, so uniformity alone earns nothing over the group (the coherence trap, docs/reference/carl.md §4).
    """

    name = "commitment"

    def __init__(self, phi_provider: PhiProvider | None = None, jump: float = JUMP, hold: int = 8) -> None:
        super().__init__(phi_provider)
        if not jump > 0 or hold < 1:
            raise RewardError(f"commitment needs jump > 0 and hold >= 1 (got {jump}, {hold})")
        self.jump = jump
        self.hold = hold

    def score(self, phi: np.ndarray) -> float:
        phi = phi[np.isfinite(phi)]  # a lost token joins its neighbours rather than faking a jump
        delta = np.diff(phi)
        ups = np.flatnonzero(delta > self.jump)
        if len(ups) == 0:
            return 0.5
        holds = 0.0
        for k in ups:
            level = phi[k + 1]
            after = phi[k + 2 : k + 2 + self.hold]
            holds += float(np.mean(after >= level - self.jump)) if len(after) else 1.0
        melts = int(np.count_nonzero(delta[ups[0] + 1 :] < -self.jump))
        quality = (holds - melts) / (len(ups) + melts)
        return 0.5 * (1.0 + quality)

    def batch(self, traces: list[np.ndarray | None], masks: list[Any]) -> list[float | None]:
        return [None if phi is None else self.score(phi) for phi in traces]


# --- user-supplied rewards ----------------------------------------------------------------------


def load_reward(path: str) -> RewardFn:
    """The callable at `package.module:function` (the attribute may be dotted: `module:Class.method`)."""
    module_name, sep, attr = path.strip().partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"reward {path!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only a missing module on the path itself is "not found"; a missing dependency inside it is not.
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise RewardError(f"reward module {module_name!r} not found") from None
        raise RewardError(f"importing reward module {module_name!r} failed: {exc}") from None
    except Exception as exc:
        raise RewardError(
            f"importing reward module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardError(f"reward module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise RewardError(f"reward {path!r} is not callable (it is a {type(obj).__name__})")
    return obj
