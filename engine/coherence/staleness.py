"""A run's configured staleness bound: how many policy versions behind a sample may be and still be trained
on, read from the run's stored config (docs/reference/frameworks.md §2.3).

One declarative table: per framework, the names of the setting, newest first, each read in the framework's
source. A setting is found by its last name at any depth of the config, so a nested W&B config
(`trainer.fully_async.max_staleness_steps`) and a flattened MLflow one (`trainer/fully_async/...`, its values
strings) both give it. A run of no known framework is searched for every name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# framework -> setting names. Each bounds the versions between the policy that sampled and the one trained on.
BOUND_SETTINGS: dict[str, tuple[str, ...]] = {
    # prime-rl 559b4477 packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py: max_off_policy_steps
    # (default 8: episodes past it are dropped); max_async_level before e792f9cf (May 2026), async_level
    # before that.
    "prime-rl": ("max_off_policy_steps", "max_async_level", "async_level"),
    # SkyRL a9564572 skyrl/train/config/config.py FullyAsyncConfig.max_staleness_steps (default 4).
    "skyrl": ("max_staleness_steps",),
    # TRL 1.16 trl/experimental/async_grpo/async_grpo_config.py max_staleness (default 4: older samples
    # dropped).
    "trl": ("max_staleness",),
    # AReaL 4aef98d8 areal/api/cli_args.py InferenceEngineConfig.max_head_offpolicyness (default 0).
    "areal": ("max_head_offpolicyness",),
    # verl-project/verl 1dda039b verl/trainer/config/ppo_trainer.yaml
    # trainer.v1.sampler.max_off_policy_threshold (default 8): the model versions a trajectory may span; its
    # staleness is below it. Not async_training.staleness_threshold: that is a share of stale samples a sync
    # may buffer (docs/advance/fully_async.md), not a count of versions.
    "verl": ("max_off_policy_threshold",),
}
MAX_DEPTH = 8  # how deep a config is searched: real ones nest 3 or 4 levels
MAX_NODES = 20_000  # values looked at, so a hostile config costs bounded time
MAX_BOUND = 1_000_000  # a bound past this is not a version count
DIGITS = re.compile(r"[0-9]{1,7}")  # an MLflow param's text (ASCII digits only: int() takes others too)
SEPARATORS = re.compile(r"[./]")  # a flattened key's parts: MLflow's veRL adapter joins with "/", others "."


@dataclass(frozen=True)
class Bound:
    setting: str  # the setting's name, as the reason says it
    versions: int


def staleness_bound(config: Any, framework: str | None) -> Bound | None:
    """The run's bound from its config (a dict, as stored on the run), or None when it names none."""
    if not isinstance(config, dict):
        return None
    names = BOUND_SETTINGS.get(framework or "") or tuple(n for ns in BOUND_SETTINGS.values() for n in ns)
    found = _settings(config, set(names))
    for name in names:
        if name in found:
            return Bound(name, found[name])
    return None


def _settings(config: dict[str, Any], names: set[str]) -> dict[str, int]:
    """{name: value} of the first valid setting of each name, breadth first (the shallowest wins)."""
    found: dict[str, int] = {}
    level: list[dict[str, Any]] = [config]
    seen = 0
    for _ in range(MAX_DEPTH):
        deeper: list[dict[str, Any]] = []
        for node in level:
            for key, value in node.items():
                seen += 1
                if seen > MAX_NODES:
                    return found
                if isinstance(value, dict):
                    deeper.append(value)
                    continue
                leaf = SEPARATORS.split(key)[-1] if isinstance(key, str) else None
                versions = _versions(value)
                if leaf in names and leaf not in found and versions is not None:
                    found[leaf] = versions
        level = deeper
        if not level:
            break
    return found


def _versions(value: Any) -> int | None:
    """A count of versions: an int, an integral float, or the digits MLflow stores a param as."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and DIGITS.fullmatch(value.strip()):
        value = int(value.strip())
    return value if isinstance(value, int) and 0 <= value <= MAX_BOUND else None
