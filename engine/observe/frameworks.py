"""Which RL framework wrote a run, and its key names mapped onto the control room's concepts.

One declarative table per framework (docs/reference/frameworks.md §2): a source key, or a pattern, and the key the
control room charts it under. The vocabulary is TRL's (what transformers logs for GRPOTrainer, without `train/`),
since TRL runs and our own runs already write it, plus one concept TRL has no key for: `policy_kl`, the KL between
the policy that sampled and the one being trained (PPO's approx KL, prime-rl's mismatch KL).

    entropy                  mean token entropy, nats (gives Φ once |V| is known)
    reward, reward_std       the total reward's mean and spread;  rewards/<fn>/mean  each reward function
    kl                       KL to the reference model;  policy_kl  KL between sampler and learner
    clip_ratio/low_mean      share of tokens clipped below (r < 1 - ε_low, A < 0)
    clip_ratio/high_mean     share clipped above (r > 1 + ε_high, A > 0);  clip_ratio/region_mean  either side
    completions/mean_length, completions/max_length, completions/clipped_ratio
    grad_norm, learning_rate, loss, frac_reward_zero_std

A framework is told from the keys a run logs (`detect`), and only its own table is applied: `entropy_loss` is
OpenRLHF's entropy, but nothing says the same of a key of that name in another tool's log. A key no table names is
kept as it is, and can be charted like any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# framework -> {source key (or "re:" + a pattern matched whole): canonical key}
TABLES: dict[str, dict[str, str]] = {
    "trl": {},  # the vocabulary itself
    "verl": {
        "actor/entropy": "entropy",
        "actor/kl_loss": "kl",
        "actor/ppo_kl": "policy_kl",
        "actor/pg_clipfrac": "clip_ratio/region_mean",
        "critic/score/mean": "reward",
        "critic/score/std": "reward_std",
        "response_length/mean": "completions/mean_length",
        "response_length/max": "completions/max_length",
        "response_length/clip_ratio": "completions/clipped_ratio",
        "actor/grad_norm": "grad_norm",
        "actor/lr": "learning_rate",
        "actor/pg_loss": "loss",
    },
    "openrlhf": {
        "entropy_loss": "entropy",
        "kl": "kl",
        "reward": "reward",
        "response_length": "completions/mean_length",
        "actor_grad_norm": "grad_norm",
        "policy_loss": "loss",
    },
    "prime-rl": {
        "entropy/all/mean": "entropy",
        "mismatch_kl/mean": "policy_kl",
        "optim/grad_norm": "grad_norm",
        "optim/lr": "learning_rate",
        r"re:train/agg/effective/[^/]+/reward/mean": "reward",
    },
    "skyrl": {
        "policy_entropy": "entropy",
        "loss/avg_kl": "kl",
        "clip_ratio": "clip_ratio/region_mean",
        "reward/avg_raw_reward": "reward",
    },
    "areal": {
        "approx_kl": "policy_kl",
        "clip_ratio": "clip_ratio/region_mean",
    },
    "slime": {
        "entropy_loss": "entropy",
        "ppo_kl": "policy_kl",
        "pg_clipfrac": "clip_ratio/region_mean",
        "pg_loss": "loss",
    },
}

# Keys (or prefixes, ending in "/") only one framework logs: a run is told by the most of them it has.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "carl": ("phi/mean", "cascade/multiplier", "phi/p10"),
    "trl": (
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "frac_reward_zero_std",
        "num_tokens",
    ),
    "verl": ("actor/", "critic/", "timing_s/", "response_length/", "perf/"),
    "openrlhf": ("policy_loss", "actor_grad_norm", "return", "entropy_loss"),
    "prime-rl": ("entropy/all/", "mismatch_kl/", "optim/", "train/agg/", "time/"),
    "skyrl": ("policy_entropy", "loss/avg_kl", "reward/avg_raw_reward", "policy/"),
    "areal": ("approx_kl", "dual_clip_ratio", "behave_imp_weight", "importance_weight"),
    "slime": ("pg_clipfrac", "ppo_kl", "train_rollout_logprob_abs_diff", "pg_loss"),
}
NAMES = {
    "carl": "carl",
    "trl": "TRL",
    "verl": "veRL",
    "openrlhf": "OpenRLHF",
    "prime-rl": "prime-rl",
    "skyrl": "SkyRL",
    "areal": "AReaL",
    "slime": "slime",
}


def detect(keys: Iterable[str]) -> str | None:
    """The framework whose signature the keys match best (at least one match; ties go to the earlier one in
    SIGNATURES), or None."""
    keys = set(keys)
    best, best_hits = None, 0
    for framework, marks in SIGNATURES.items():
        hits = sum(
            1
            for mark in marks
            if (any(k.startswith(mark) for k in keys) if mark.endswith("/") else mark in keys)
        )
        if hits > best_hits:
            best, best_hits = framework, hits
    return best


@dataclass
class KeyMapping:
    """One run's key map: `canonical(key)` renames what its framework's table names and keeps the rest."""

    framework: str | None
    renamed: dict[str, str] = field(default_factory=dict)  # canonical -> source key, as met
    _memo: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        table = TABLES.get(self.framework or "", {})
        self._exact = {k: v for k, v in table.items() if not k.startswith("re:")}
        self._patterns = [(re.compile(k[3:]), v) for k, v in table.items() if k.startswith("re:")]

    def canonical(self, key: str) -> str:
        found = self._memo.get(key)
        if found is not None:
            return found
        name = self._exact.get(key)
        if name is None:
            name = next((v for pattern, v in self._patterns if pattern.fullmatch(key)), key)
        if name != key:
            self.renamed.setdefault(name, key)
        if len(self._memo) < 10_000:  # a source with endless distinct keys cannot grow it without bound
            self._memo[key] = name
        return name

    def take_renamed(self) -> dict[str, str]:
        """The renames met since the last call (for Store.set_key_names)."""
        taken, self.renamed = self.renamed, {}
        return taken


def mapping_for(keys: Iterable[str], framework: str | None = None) -> KeyMapping:
    """A run's key map: for its stored framework when it has one, else for the one its keys tell."""
    return KeyMapping(framework if framework is not None else detect(keys))
