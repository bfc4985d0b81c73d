"""Reward functions in TRL's form, and the cascade that gates the coherence ones behind the task reward.

Wiring, for a runner: build one `CascadeGate` and pass TRL the functions `make_task_reward(task)`,
`make_format_reward(task)`, `concise_reward`, `gated(CoherenceReward(provider), lambda: gate.multiplier)` and
`gated(CommitmentReward(provider), lambda: gate.multiplier)`; `provider` supplies per-token Phi (see
`functions.py`; share one `CachedPhiProvider`). Once per optimizer step call
`gate.update(step, mean of the task reward)` and record the returned `GateState`; set TRL's
`reward_weights` to `CascadeWeights(...).ordered(names, state.multiplier)`.
"""

from .cascade_gate import CascadeGate, CascadeWeights, GatedReward, GateState, gated
from .functions import (
    CachedPhiProvider,
    CoherenceReward,
    CommitmentReward,
    PhiReward,
    RewardError,
    concise_reward,
    load_reward,
    make_concise_reward,
    make_format_reward,
    make_task_reward,
)

__all__ = [
    "CachedPhiProvider",
    "CascadeGate",
    "CascadeWeights",
    "CoherenceReward",
    "CommitmentReward",
    "GateState",
    "GatedReward",
    "PhiReward",
    "RewardError",
    "concise_reward",
    "gated",
    "load_reward",
    "make_concise_reward",
    "make_format_reward",
    "make_task_reward",
]
