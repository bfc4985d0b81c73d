"""A run's health: green, yellow or red, with the reasons that made it so (docs/reference/carl.md §6.1).

Every rule reads the run's own stored series, and every threshold below is a named constant with its reason.
The RL rules (entropy collapse, zero-std groups, clip fractions, KL, reward hacking, truncation) look at the
steps of RL only, from the first step with a reward: an SFT warm-up is meant to make the policy certain, so
its entropy drop is learning, not a collapse. The caller (engine/coherence/analysis.py) cuts the series there.
The async-RL rules (sampler/learner mismatch, staleness) and the throughput rule read every step: a trainer's
log may hold no reward at all (prime-rl's).

Each flag has a stable cause (`CAUSES`), so that an alert about a cause is sent once per run
(engine/alerts/), however its reason's numbers change.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .phases import K_NOISE, MIN_POINTS, robust_noise, trailing_window
from .staleness import Bound

LEVELS = {"green": 0, "yellow": 1, "red": 2}

# A running run that writes nothing for this long is silent (yellow), then presumed crashed (red): a GRPO step
# of a large model takes tens of seconds, a checkpoint or an eval a few minutes;
# LEET's RunCrashTimeout is 10 min.
SILENT_AFTER_S = 120.0
CRASHED_AFTER_S = 600.0

# Share of GRPO groups whose completions all got one reward, over the trailing window. Such a group has no
# advantage and so no gradient: above half, most of each step's samples teach nothing (yellow); above 0.9
# the run has all but stopped learning (red).
ZERO_STD_YELLOW = 0.5
ZERO_STD_RED = 0.9

# Steps whose total reward is exactly 0: more than half means the rewards almost never fire, and GRPO has
# nothing to rank (red).
STARVED_SHARE = 0.5

# Entropy collapse, judged over RL only: the trailing window's mean token entropy below this share of the
# entropy at the start of RL ...
ENTROPY_COLLAPSE_RATIO = 0.5
# ... and lower by at least this many nats per token. A policy that enters RL already nearly certain (the
# demo's tool calls: 0.06 nats, about 1% of each token's probability off its top choice) halves its entropy by
# moving a fraction of a percent of probability; a ratio alone calls that a collapse. What a lost exploration
# costs shows in the groups themselves, which the zero-std rule watches.
ENTROPY_COLLAPSE_MIN_DROP = 0.1

# Clip fractions (share of completion tokens whose ratio the PPO clip held, either side). With one policy
# update per batch of samples (GRPO's default, and ours) the ratio starts at 1 and the fraction stays near 0;
# PPO practice reads a fraction above about 0.2 as updates too large for the trust region. One step above it
# is a spike (yellow); the trailing window's mean above half means most of each update is being clipped away
# (red).
CLIP_SPIKE = 0.2
CLIP_RED = 0.5

# KL to the reference model, nats per token (TRL's k3 estimate), trailing-window mean. GRPO runs with the
# usual beta (0.001-0.04) stay well below 1 nat per token for hundreds of steps; at 1 the policy has moved far
# from its reference (yellow), at 5 it has left it and the KL term usually blows up next (red).
# A non-finite KL is red.
KL_YELLOW = 1.0
KL_RED = 5.0

# Possible reward hacking: the reward trained on rose by at least HACKING_MIN_RISE (rewards in 0..1) and
# beyond its noise, while the independent score (the held-out eval's task reward, or the agents plane's
# verifier) gained less than HACKING_CARRY of that rise. A real gain carries over to prompts never trained on
# and to the verifier; a quarter leaves room for an eval of a few dozen prompts,
# whose own noise is about 0.05.
HACKING_MIN_RISE = 0.1
HACKING_CARRY = 0.25

# Sampler/learner mismatch (`mismatch/kl`: KL(sampler ‖ learner), nats per token; docs/reference/frameworks.md
# §2.3). A vLLM or SGLang sampler and an FSDP or Megatron learner disagree a little on the same weights, and
# that is harmless; a mismatch that grows is what precedes collapse in async and vLLM-sampled runs (Liu, Li et
# al. 2025, "When Speed Kills Stability": gradient norms exploded after it grew). Over the trailing window's
# mean: at 0.01 the average sequence sits at the top of veRL's typical per-sequence K3 rejection threshold
# (0.001 to 0.01, verl docs/algo/rollout_corr_math.md), where many samples would be rejected as off-policy
# (yellow); at 0.1 veRL's own health check calls the gap significant (docs/algo/rollout_corr.md; red). At any
# level, a rise to MISMATCH_RISE_RATIO times the run's first window, beyond K_NOISE noise widths and above
# MISMATCH_KL_FLOOR (the bottom of veRL's range: below it the two engines agree to kernel noise), is yellow:
# the trend is the warning.
MISMATCH_KL_YELLOW = 0.01
MISMATCH_KL_RED = 0.1
MISMATCH_KL_FLOOR = 1e-3
MISMATCH_RISE_RATIO = 3.0
# A run that logs only the mean |log π_learner − log π_sampler| (TRL, SkyRL, slime) is judged on its rise
# alone, above 0.035 nats: the mean |Δ| of a Gaussian log-ratio whose K3 (about Var/2) is MISMATCH_KL_FLOOR.
# The link between the two is only approximate, so no level of it is called yellow or red.
MISMATCH_ABS_DIFF_FLOOR = 0.035

# Share of completions cut at the length limit (`completions/clipped_ratio`), over RL. Answers growing past
# the limit is the length blow-up that comes with collapse (docs/reference/carl.md §10.5; DAPO's overlong
# filtering, arXiv 2503.14476), and a truncated answer is scored unfinished. Yellow when the trailing mean
# rose by TRUNCATION_RISE (a share, from the run's first window) beyond K_NOISE noise widths, or stands above
# TRUNCATION_YELLOW, where the limit shapes most answers (the offline analyst's line,
# engine/diagnosis/rl_health.py).
TRUNCATION_RISE = 0.1
TRUNCATION_YELLOW = 0.5

# On-policy distillation from hints (engine/training/opd.py): the teacher/student KL on the hinted samples'
# own tokens (`opd/kl`), trailing-window mean. A policy that can use its hints stays close to its hinted self:
# on the demo's plane at the default learning rate it stayed at 0.05-0.13 nats a token, and the verifier held.
# Where the hints are out of the model's reach the hinted teacher scores what the policy samples lower and
# lower, distillation pushes those tokens down, and the answers degenerate: at 2e-3, in 4 of 5 seeds the
# trailing mean passed 0.25 nats 12-24 steps before the verifier fell below 0.02, and reached 0.43-0.95; the
# fifth peaked at 0.24 and degenerated all the same (docs/results/opd.md). An early warning, not a guarantee.
OPD_KL_YELLOW = 0.25
OPD_KL_RED = 0.5

# A sudden throughput drop: the median of the last THROUGHPUT_RECENT logs of `perf/tokens_per_s` (else per
# GPU) below (1 − THROUGHPUT_DROP) of the median of the THROUGHPUT_BASELINE logs before them. A GRPO step's
# tokens move by tens of percent with its completions' lengths, and a checkpoint or an eval slows one log; a
# median of three that halves takes more: a GPU or node lost, throttling, a sampler restarted, swapping
# (yellow).
THROUGHPUT_DROP = 0.5
THROUGHPUT_RECENT = 3
THROUGHPUT_BASELINE = 20

# What the box says of a run (engine/system/box_health.py judges these from the store: samples, processes, the
# console). Each is alerted on once per run whatever its level: a GPU idle for minutes, a disk filling or a
# rank gone is what someone away from the screen wants to hear of.
BOX_CAUSES = ("rank_died", "console_error", "gpu_idle", "gpu_memory", "disk_full", "xid")

CAUSES = (
    "silent",
    "crashed",
    "loss",
    "zero_std",
    "starvation",
    "entropy_collapse",
    "coherence_trap",
    "clip",
    "kl",
    "hacking_eval",
    "hacking_verifier",
    "mismatch",
    "staleness",
    "truncation",
    "opd",
    "throughput",
    *BOX_CAUSES,
)


@dataclass
class Flag:
    level: str  # yellow | red
    cause: str  # one of CAUSES
    reason: str


@dataclass
class Health:
    level: str = "green"
    reasons: list[str] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)

    def flag(self, level: str, reason: str, cause: str) -> None:
        if LEVELS[level] > LEVELS[self.level]:
            self.level = level
        self.reasons.append(reason)
        self.flags.append(Flag(level, cause, reason))

    def red(self) -> dict[str, str]:
        """Cause -> reason of every red flag."""
        return {f.cause: f.reason for f in self.flags if f.level == "red"}

    def alerting(self) -> dict[str, Flag]:
        """Cause -> flag, for every flag an alert is sent for: the red ones, and every flag of the box."""
        return {f.cause: f for f in self.flags if f.level == "red" or f.cause in BOX_CAUSES}


@dataclass
class RunSignals:
    """The recent signals of a run that health looks at; any may be empty. The RL series (reward onwards) hold
    the RL steps only; `rl_start` is the first of them (None: the run has not reached RL)."""

    status: str
    last_update: float | None
    phi: np.ndarray
    loss: np.ndarray
    loss_steps: np.ndarray
    reward: np.ndarray
    entropy: np.ndarray
    zero_std: np.ndarray
    entropy_steps: np.ndarray = field(default_factory=lambda: np.empty(0))  # when known
    phase: str | None = None
    phi_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    rl_start: int | None = None
    reward_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    task: np.ndarray = field(default_factory=lambda: np.empty(0))  # the task reward, what an eval scores
    task_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    clip: np.ndarray = field(default_factory=lambda: np.empty(0))
    clip_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    kl: np.ndarray = field(default_factory=lambda: np.empty(0))
    kl_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out task reward)
    verifier: np.ndarray = field(default_factory=lambda: np.empty(0))
    verifier_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    box: list[Flag] = field(
        default_factory=list
    )  # what the box says of the run (engine/system/box_health.py)
    # async RL and throughput, over every step (not only RL's)
    mismatch: np.ndarray = field(default_factory=lambda: np.empty(0))
    mismatch_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    mismatch_key: str = "mismatch/kl"  # or mismatch/logprob_abs_diff/mean, judged on its rise alone
    staleness_max: np.ndarray = field(default_factory=lambda: np.empty(0))
    staleness_max_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    staleness_mean: np.ndarray = field(default_factory=lambda: np.empty(0))
    staleness_violations: np.ndarray = field(default_factory=lambda: np.empty(0))
    staleness_bound: Bound | None = None  # the run's configured bound (engine/coherence/staleness.py)
    truncation: np.ndarray = field(default_factory=lambda: np.empty(0))  # RL steps only
    truncation_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    throughput: np.ndarray = field(default_factory=lambda: np.empty(0))
    throughput_steps: np.ndarray = field(default_factory=lambda: np.empty(0))
    throughput_key: str = "perf/tokens_per_s"
    opd_kl: np.ndarray = field(default_factory=lambda: np.empty(0))  # RL steps only
    opd_kl_steps: np.ndarray = field(default_factory=lambda: np.empty(0))


def assess_health(sig: RunSignals, now: float | None = None) -> Health:
    health = Health()
    for rule in RULES:
        rule(sig, health, time.time() if now is None else now)
    if not health.reasons:
        health.reasons.append("training dynamics healthy")
    return health


def _finite(values: np.ndarray, steps: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    values = np.asarray(values, dtype=np.float64)
    steps = np.arange(len(values)) if steps is None or len(steps) != len(values) else np.asarray(steps)
    keep = np.isfinite(values)
    return values[keep], steps[keep]


def _silence(sig: RunSignals, health: Health, now: float) -> None:
    if sig.status != "running" or not sig.last_update:
        return
    quiet = now - sig.last_update
    if quiet >= CRASHED_AFTER_S:
        health.flag("red", f"no new step for {quiet / 60:.0f} min: presumed crashed", "crashed")
    elif quiet >= SILENT_AFTER_S:
        health.flag("yellow", f"silent for {quiet / 60:.0f} min", "silent")


def _loss(sig: RunSignals, health: Health, now: float) -> None:
    bad = ~np.isfinite(sig.loss)
    if bad.any():
        health.flag("red", f"loss is not finite at step {int(sig.loss_steps[np.argmax(bad)])}", "loss")


def _zero_std(sig: RunSignals, health: Health, now: float) -> None:
    zero_std, _ = _finite(sig.zero_std)
    if not len(zero_std):
        return
    frac = float(zero_std[-trailing_window(len(zero_std)) :].mean())
    if frac >= ZERO_STD_RED:
        health.flag("red", f"no learning signal: {frac:.0%} of groups have zero reward std", "zero_std")
    elif frac > ZERO_STD_YELLOW:
        health.flag("yellow", f"{frac:.0%} of groups have zero reward std", "zero_std")


def _starvation(sig: RunSignals, health: Health, now: float) -> None:
    reward, _ = _finite(sig.reward)
    if len(reward) >= MIN_POINTS:
        starved = float(np.mean(np.abs(reward) < 1e-6))
        if starved > STARVED_SHARE:
            health.flag("red", f"reward starvation: {starved:.0%} of steps have zero reward", "starvation")


class EntropyJudgement(NamedTuple):
    """Entropy over RL as the collapse rule reads it: its start (the mean of the first tenth of the RL steps
    read, MIN_POINTS at least) and where it is now (the trailing window's mean), with the steps of each."""

    start: float
    start_steps: tuple[int, int]
    now: float
    now_steps: tuple[int, int]
    collapsed: bool


def judge_entropy(entropy: np.ndarray, steps: np.ndarray | None = None) -> EntropyJudgement | None:
    """The collapse rule on RL's entropy (its steps, when given, name the windows); None below 2 * MIN_POINTS
    finite values. The one place the start of RL's entropy is defined: health's reason and the offline
    analyst (engine/diagnosis/entropy.py) both say this number."""
    values, at = _finite(entropy, steps)
    if len(values) < 2 * MIN_POINTS:
        return None
    head, tail = max(MIN_POINTS, len(values) // 10), trailing_window(len(values))
    start, now = float(values[:head].mean()), float(values[-tail:].mean())
    return EntropyJudgement(
        start,
        (int(at[0]), int(at[head - 1])),
        now,
        (int(at[-tail]), int(at[-1])),
        entropy_collapsed(start, now),
    )


def _entropy_collapse(sig: RunSignals, health: Health, now: float) -> None:
    judged = judge_entropy(sig.entropy, sig.entropy_steps)
    if judged is not None and judged.collapsed:
        since = f" since RL began at step {sig.rl_start}" if sig.rl_start is not None else ""
        health.flag(
            "yellow",
            f"entropy collapsed from {judged.start:.3g} to {judged.now:.3g} nats{since}",
            "entropy_collapse",
        )


def entropy_collapsed(early: float, late: float) -> bool:
    """Below ENTROPY_COLLAPSE_RATIO of where it started, and ENTROPY_COLLAPSE_MIN_DROP nats lower."""
    return early > 0 and late < early * ENTROPY_COLLAPSE_RATIO and early - late >= ENTROPY_COLLAPSE_MIN_DROP


def _coherence_trap(sig: RunSignals, health: Health, now: float) -> None:
    reward, _ = _finite(sig.reward)
    if sig.phase != "crystallizing" or len(reward) < 2 * MIN_POINTS:
        return
    w = trailing_window(len(reward))
    noise = max(robust_noise(reward), 1e-9) * math.sqrt(w)
    rise = float(reward[-w:].mean() - reward[-2 * w : -w].mean()) if len(reward) >= 2 * w else 0.0
    if abs(rise) <= K_NOISE * noise:
        health.flag("yellow", "coherence trap: Phi rising while task reward is flat", "coherence_trap")


def _clip(sig: RunSignals, health: Health, now: float) -> None:
    clip, steps = _finite(sig.clip, sig.clip_steps)
    if not len(clip):
        return
    w = trailing_window(len(clip))
    recent, recent_steps = clip[-w:], steps[-w:]
    if float(recent.mean()) >= CLIP_RED:
        health.flag("red", f"clip fraction {recent.mean():.0%} over the last {len(recent)} steps", "clip")
    elif float(recent.max()) >= CLIP_SPIKE:
        at = int(recent_steps[int(np.argmax(recent))])
        health.flag("yellow", f"clip fraction spiked to {recent.max():.0%} at step {at}", "clip")


def _kl(sig: RunSignals, health: Health, now: float) -> None:
    kl = np.asarray(sig.kl, dtype=np.float64)
    if not len(kl):
        return
    w = trailing_window(len(kl))
    recent = kl[-w:]
    steps = np.asarray(sig.kl_steps)[-w:] if len(sig.kl_steps) == len(kl) else None
    bad = ~np.isfinite(recent)
    if bad.any():
        at = f" at step {int(steps[np.argmax(bad)])}" if steps is not None else ""
        health.flag("red", f"KL to the reference is not finite{at}", "kl")
        return
    mean = float(recent.mean())
    if mean >= KL_RED:
        health.flag("red", f"KL blow-up: {mean:.3g} nats per token to the reference", "kl")
    elif mean >= KL_YELLOW:
        health.flag("yellow", f"KL to the reference at {mean:.3g} nats per token", "kl")


def _opd(sig: RunSignals, health: Health, now: float) -> None:
    values, _ = _finite(sig.opd_kl)
    if not len(values):
        return
    mean = float(values[-trailing_window(len(values)) :].mean())
    if mean < OPD_KL_YELLOW:
        return
    level = "red" if mean >= OPD_KL_RED else "yellow"
    health.flag(
        level,
        f"OPD: teacher/student KL {mean:.2f} nats a token on the hinted samples: the policy cannot follow "
        "its hints, and distilling from them pushes down what it samples (lower train.w_opd, or no --opd)",
        "opd",
    )


def _window_mean(values: np.ndarray, steps: np.ndarray, end: int, width: int) -> float | None:
    """Mean of the `width` finite values at or before step `end`."""
    part = values[steps <= end][-width:]
    return float(part.mean()) if len(part) else None


def _hacking(sig: RunSignals, health: Health, now: float) -> None:
    """Reward rising while the held-out eval, or the verifier, stays flat."""
    task, task_steps = _finite(sig.task, sig.task_steps)
    evals = sorted({step: score for step, score in sig.evals if math.isfinite(score)}.items())
    if len(task) >= MIN_POINTS and len(evals) >= 2 and evals[-1][0] > evals[0][0]:
        w = trailing_window(len(task))
        (first_step, first), (last_step, last) = evals[0], evals[-1]
        before = _window_mean(task, task_steps, first_step, w)
        after = _window_mean(task, task_steps, last_step, w)
        if before is not None and after is not None and _flat_beside(after - before, last - first, task, w):
            health.flag(
                "yellow",
                f"possible reward hacking: the task reward rose {after - before:+.2f} from step {first_step} "
                f"to {last_step} while the held-out eval moved {last - first:+.2f}",
                "hacking_eval",
            )
    reward, reward_steps = _finite(sig.reward, sig.reward_steps)
    verifier, verifier_steps = _finite(sig.verifier, sig.verifier_steps)
    if len(reward) >= 2 * MIN_POINTS and len(verifier) >= 2 * MIN_POINTS:
        w = trailing_window(len(reward))
        lo, hi = max(reward_steps[0], verifier_steps[0]), min(reward_steps[-1], verifier_steps[-1])
        early = [
            _window_mean(v, s, lo + (hi - lo) // 4, w)
            for v, s in ((reward, reward_steps), (verifier, verifier_steps))
        ]
        late = [_window_mean(v, s, hi, w) for v, s in ((reward, reward_steps), (verifier, verifier_steps))]
        known = [m for m in early + late if m is not None]
        if len(known) == 4:
            early_reward, early_verifier, late_reward, late_verifier = known
            rise, carried = late_reward - early_reward, late_verifier - early_verifier
            if _flat_beside(rise, carried, reward, w):
                health.flag(
                    "yellow",
                    f"possible reward hacking: the reward rose {rise:+.2f} while the verifier moved "
                    f"{carried:+.2f}",
                    "hacking_verifier",
                )


def _flat_beside(rise: float, carried: float, trained: np.ndarray, window: int) -> bool:
    """The trained-on reward rose (by HACKING_MIN_RISE, and beyond its noise) and the independent score did
    not follow (less than HACKING_CARRY of the rise)."""
    noise = robust_noise(trained) * math.sqrt(2.0 / window)  # of a difference of two window means
    return rise >= HACKING_MIN_RISE and rise > K_NOISE * noise and carried < HACKING_CARRY * rise


def risen(values: np.ndarray, ratio: float | None, least: float, floor: float) -> tuple[float, float] | None:
    """(first window's mean, trailing window's mean) when the series rose: by `least` at least, to `ratio`
    times where given, beyond K_NOISE noise widths of a difference of two window means, and to `floor` at
    least."""
    if len(values) < 2 * MIN_POINTS:
        return None
    w = trailing_window(len(values))
    early, late = float(values[:w].mean()), float(values[-w:].mean())
    noise = robust_noise(values) * math.sqrt(2.0 / w)
    rose = late - early >= least and late - early > K_NOISE * noise and late >= floor
    return (early, late) if rose and (ratio is None or late >= ratio * max(early, 0.0)) else None


def _span(steps: np.ndarray, first: bool) -> str:
    """`steps 1–12`: the steps of a series' first window (`risen`'s early one), or of its trailing one."""
    w = trailing_window(len(steps))
    part = steps[:w] if first else steps[-w:]
    return f"steps {int(part[0]):,}–{int(part[-1]):,}"


def _mismatch(sig: RunSignals, health: Health, now: float) -> None:
    values = np.asarray(sig.mismatch, dtype=np.float64)
    if not len(values):
        return
    steps = (
        np.asarray(sig.mismatch_steps) if len(sig.mismatch_steps) == len(values) else np.arange(len(values))
    )
    is_kl = sig.mismatch_key == "mismatch/kl"
    what = "mismatch KL" if is_kl else "mismatch |Δ log p|"
    bad = ~np.isfinite(values[-trailing_window(len(values)) :])
    if bad.any():
        at = int(steps[-trailing_window(len(values)) :][np.argmax(bad)])
        health.flag("red", f"sampler/learner {what} is not finite at step {at}", "mismatch")
        return
    values, steps = _finite(values, steps)
    if not len(values):
        return
    late = float(values[-trailing_window(len(values)) :].mean())
    if is_kl and late >= MISMATCH_KL_RED:
        health.flag(
            "red", f"sampler/learner mismatch KL {late:.3g} nats per token: far off-policy", "mismatch"
        )
        return
    rise = risen(values, MISMATCH_RISE_RATIO, 0.0, MISMATCH_KL_FLOOR if is_kl else MISMATCH_ABS_DIFF_FLOOR)
    if rise is not None:
        health.flag(
            "yellow",
            f"sampler/learner {what} rising: {rise[0]:.3g} nats per token at {_span(steps, True)},"
            f" {rise[1]:.3g} at {_span(steps, False)}",
            "mismatch",
        )
    elif is_kl and late >= MISMATCH_KL_YELLOW:
        health.flag("yellow", f"sampler/learner mismatch KL at {late:.3g} nats per token", "mismatch")


def _staleness(sig: RunSignals, health: Health, now: float) -> None:
    violations, _ = _finite(sig.staleness_violations)
    if len(violations):
        w = min(trailing_window(len(violations)), len(violations))
        count = float(violations[-w:].sum())
        if count > 0:
            health.flag(
                "yellow",
                f"{count:,.0f} samples trained past the staleness bound in the last {w} logs",
                "staleness",
            )
            return
    bound = sig.staleness_bound
    worst, steps = _finite(sig.staleness_max, sig.staleness_max_steps)
    if bound is None or not len(worst):
        return
    w = trailing_window(len(worst))
    recent, recent_steps = worst[-w:], steps[-w:]
    if float(recent.max()) <= bound.versions:
        return
    mean, _ = _finite(sig.staleness_mean)
    typical = float(mean[-trailing_window(len(mean)) :].mean()) if len(mean) else None
    if typical is not None and typical > bound.versions:
        health.flag(
            "red",
            f"samples {typical:.3g} policy versions stale on average, past the run's bound of"
            f" {bound.versions} ({bound.setting})",
            "staleness",
        )
        return
    at = int(recent_steps[int(np.argmax(recent))])
    health.flag(
        "yellow",
        f"samples {float(recent.max()):g} policy versions stale at step {at}, past the run's bound of"
        f" {bound.versions} ({bound.setting})",
        "staleness",
    )


def _truncation(sig: RunSignals, health: Health, now: float) -> None:
    share, steps = _finite(sig.truncation, sig.truncation_steps)
    if not len(share):
        return
    rise = risen(share, None, TRUNCATION_RISE, 0.0)
    late = float(share[-trailing_window(len(share)) :].mean())
    if rise is not None:
        health.flag(
            "yellow",
            f"truncated completions rising: {rise[0]:.0%} hit the length limit at {_span(steps, True)},"
            f" {rise[1]:.0%} at {_span(steps, False)}",
            "truncation",
        )
    elif late >= TRUNCATION_YELLOW:
        health.flag("yellow", f"{late:.0%} of completions hit the length limit", "truncation")


def _throughput(sig: RunSignals, health: Health, now: float) -> None:
    rate, steps = _finite(sig.throughput, sig.throughput_steps)
    if len(rate) < THROUGHPUT_RECENT + MIN_POINTS:
        return
    recent = float(np.median(rate[-THROUGHPUT_RECENT:]))
    before = float(np.median(rate[-THROUGHPUT_RECENT - THROUGHPUT_BASELINE : -THROUGHPUT_RECENT]))
    if before > 0 and recent < (1 - THROUGHPUT_DROP) * before:
        unit = "tokens/s per GPU" if sig.throughput_key.endswith("per_gpu") else "tokens/s"
        health.flag(
            "yellow",
            f"throughput fell {1 - recent / before:.0%}: {before:,.0f} → {recent:,.0f} {unit} since step "
            f"{int(steps[-THROUGHPUT_RECENT])}",
            "throughput",
        )


def _box(sig: RunSignals, health: Health, now: float) -> None:
    for flag in sig.box:
        health.flag(flag.level, flag.reason, flag.cause)


RULES = (
    _silence,
    _loss,
    _zero_std,
    _starvation,
    _entropy_collapse,
    _coherence_trap,
    _clip,
    _kl,
    _hacking,
    _mismatch,
    _staleness,
    _truncation,
    _opd,
    _throughput,
    _box,
)
