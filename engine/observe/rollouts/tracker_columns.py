"""Which field of a tracker's sample means what: one declarative column map per source, like the framework key
maps (engine/observe/frameworks.py).

A map names, for each role a rollout has, the fields that fill it, the first one present winning (names are
compared case-insensitively). A name ending in "/" is a prefix: every field under it is one reward function
(`rewards/accuracy` -> `accuracy`); `rewards` may also be a dict of them. Fields no role takes go to the
sample's `extra`, under their own names; the policy version goes there too, as `policy_version`.

    prompt, completion   text, or a conversation (rollouts/common.py `chat_text`)
    reward               the sample's total reward
    rewards              per reward function
    advantage, group     the GRPO advantage and the prompt group
    step                 the training step (else the tracker's own step of the record)
    policy_version       the policy that sampled it (async RL: how many steps behind the learner it is)
    length               completion tokens

Where the names come from:
- Trackio traces: TRL's async GRPO `log_rollout_traces` (trl/experimental/async_grpo/async_grpo_trainer.py,
  TRL 1.16: the sample's metrics `reward`, `reward_std`, `rewards/<function>`, and `advantage`, `group_id`,
  `model_version`, `prompt_tokens`, `completion_tokens`); veRL's validation generations
  (`val/generations`: `sample_index`, `score`; verl/utils/tracking.py `log_generations_to_trackio`) and its
  rollout trace ops (`rollout_trace/<op>`: `step`, `sample_index`, `rollout_n`, `validate`;
  verl/utils/rollout_trace.py `_log_trackio_trace`), both at verl 1dda039b9.
- TensorBoard text: the column names of a table (markdown, or a 2-D string tensor with a header row), and
  OpenRLHF's `train/generated_samples` (openrlhf/utils/logging_utils.py, OpenRLHF 0.11.0: the decoded
  prompt and response together, and the reward), which rollouts/tensorboard_text.py parses itself.
"""

from __future__ import annotations

from typing import Any

from engine.limits import COUNT_MAX, int_within

from ..common import as_step
from .common import chat_text, finite

ColumnMap = dict[str, tuple[str, ...]]

TRACKIO_TRACES: ColumnMap = {
    "prompt": ("prompt",),  # else the trace's messages before its first assistant message
    "completion": ("completion", "response"),  # else the messages from the first assistant message on
    "reward": ("reward", "score", "total_reward"),
    "rewards": ("rewards/", "rewards"),
    "advantage": ("advantage",),
    "group": ("group_id", "group", "uid", "sample_index"),
    "step": ("step", "global_step", "training_step"),
    "policy_version": ("model_version", "policy_version", "weight_version"),
    "length": ("completion_tokens", "response_length"),
}

TENSORBOARD_TEXT: ColumnMap = {
    "prompt": ("prompt", "input", "query", "question"),
    "completion": ("completion", "response", "output", "generation", "generated", "sample", "text"),
    "reward": ("reward", "score", "total_reward"),
    "rewards": ("rewards/",),
    "advantage": ("advantage",),
    "group": ("group_id", "group", "uid"),
    "step": ("step", "global_step"),
    "policy_version": ("model_version", "policy_version"),
    "length": ("completion_tokens", "response_length", "length"),
}

COLUMN_MAPS: dict[str, ColumnMap] = {"trackio-traces": TRACKIO_TRACES, "tensorboard-text": TENSORBOARD_TEXT}
MISSING = object()


def has_completion(columns: ColumnMap, names: list[str]) -> bool:
    """Whether a table with these column names holds samples: one of them is a completion."""
    wanted = set(columns["completion"])
    return any(name.strip().lower() in wanted for name in names)


def mapped(columns: ColumnMap, fields: dict[str, Any]) -> dict[str, Any]:
    """A rollout row (without `idx`) from one sample's fields, as `columns` says; `step` is None when no field
    gives one. The prompt and completion are made text."""
    lower: dict[str, str] = {}
    for name in fields:
        lower.setdefault(str(name).strip().lower(), name)
    used: set[str] = set()

    def take(role: str) -> Any:
        for name in columns.get(role, ()):
            key = lower.get(name)
            if key is not None and key not in used:
                used.add(key)
                return fields[key]
        return MISSING

    prompt, completion = take("prompt"), take("completion")
    reward, advantage, group = take("reward"), take("advantage"), take("group")
    step, version, length = take("step"), take("policy_version"), take("length")
    rewards: dict[str, float | None] = {}
    for name in columns.get("rewards", ()):
        if name.endswith("/"):
            for key, value in fields.items():
                if key not in used and str(key).lower().startswith(name) and len(key) > len(name):
                    used.add(key)
                    rewards[str(key)[len(name) :]] = finite(value)
        elif (key := lower.get(name)) is not None and key not in used and isinstance(fields[key], dict):
            used.add(key)
            rewards.update({str(k): finite(v) for k, v in fields[key].items()})
    extra = {str(k): v for k, v in fields.items() if k not in used}
    policy_version = None if version is MISSING else as_step(version)
    if policy_version is not None:
        extra["policy_version"] = policy_version
    return {
        "prompt": None if prompt is MISSING else chat_text(prompt),
        "completion": None if completion is MISSING else chat_text(completion),
        "total": None if reward is MISSING else finite(reward),
        "rewards": rewards,
        "advantage": None if advantage is MISSING else finite(advantage),
        "group_id": "" if group is MISSING or group is None else _text(group),
        "step": None if step is MISSING else as_step(step),
        "length": None if length is MISSING else int_within(length, 0, COUNT_MAX),
        "extra": extra,
    }


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else str(value) if type(value) in (int, float, bool) else ""
    return text[:200]
