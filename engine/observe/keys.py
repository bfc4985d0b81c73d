"""One vocabulary for metric keys, whatever tool wrote them.

transformers prefixes what it sends to Trackio with `train/`; the published CARL code logs Phi
as `phi`, `phi_mean`, `trace/phi_mean` or `coherence/phi_mean` and reward channels as
`reward_<name>`. Everything is mapped onto the keys TRL and carl's own runner write, so a chart
reads one series per quantity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from engine.text import storable

MAX_KEY_LENGTH = 200

ALIASES = {
    "phi": "phi/mean",
    "phi_mean": "phi/mean",
    "trace/phi_mean": "phi/mean",
    "coherence/phi_mean": "phi/mean",
    "phi_std": "phi/std",
    "trace/phi_std": "phi/std",
    "entropy_mean": "phi/entropy",
    "trace/entropy_mean": "phi/entropy",
    "reward_mean": "reward",
    "mean_reward": "reward",
}
STEP_KEYS = frozenset({"step", "global_step"})  # the x axis, never a metric
KEEP_AS_IS = frozenset({"reward_std"})  # TRL's spread of the total reward, not a channel


def normalize_key(key: str, *, jsonl: bool = False) -> str | None:
    """The carl key for a source key, or None to drop it.

    `jsonl` turns on the one mapping that depends on the format: in a user's JSONL log
    `train_loss` is the per-step loss, while in trainer_state.json it is the end-of-run mean
    and keeps its name.
    """
    if not key or len(key) > MAX_KEY_LENGTH:
        return None
    key = storable(key)  # a JSON escape can smuggle in a lone surrogate: kept, as U+FFFD
    if key.startswith("train/"):
        key = key[6:]
    if not key or key in STEP_KEYS or key.startswith("profiling/"):
        return None
    alias = ALIASES.get(key)
    if alias is not None:
        return alias
    if jsonl and key == "train_loss":
        return "loss"
    if key.startswith("reward_") and len(key) > 7 and key not in KEEP_AS_IS:
        return f"rewards/{key[7:]}/mean"
    return key


class KeyMap(dict[str, str | None]):
    """A memo of `normalize_key`: the hot loops look keys up at C speed.

    `origin` remembers the source's own spelling of a key normalization changed (`train/x` for `x`), so a
    framework's rename can be recorded under the name the source used. Bounded, so a source with endless
    distinct keys cannot grow it without limit.
    """

    LIMIT = 10_000

    def __init__(self, *, jsonl: bool = False, extra: Mapping[str, str | None] | None = None) -> None:
        super().__init__(extra or {})
        self.jsonl = jsonl
        self.origin: dict[str, str] = {}

    def __missing__(self, key: str) -> str | None:
        value = normalize_key(key, jsonl=self.jsonl)
        if len(self) < self.LIMIT:
            self[key] = value
            if value is not None and value != key:
                self.origin.setdefault(value, key)
        return value


def derived_phi(values: Mapping[str, float | None], vocab_size: int | None) -> list[tuple[str, float]]:
    """Phi or its entropy, derived for one step when only the other is known; never a key
    that `values` already has.

    Phi = 1 - H/ln|V| is affine in H, so the Phi of a token-weighted mean entropy is exactly
    the token-weighted mean Phi; TRL's `entropy` therefore yields `phi/mean` with no loss.
    """
    if not vocab_size or vocab_size < 2:
        return []
    ln_v = math.log(vocab_size)
    entropy = values.get("entropy")
    if "phi/mean" not in values:
        if entropy is None:
            return []
        derived = [("phi/mean", 1.0 - entropy / ln_v)]
        if "phi/entropy" not in values:
            derived.append(("phi/entropy", entropy))
        return derived
    phi = values["phi/mean"]
    if phi is None or "phi/entropy" in values or "entropy" in values:
        return []
    return [("phi/entropy", (1.0 - phi) * ln_v)]
