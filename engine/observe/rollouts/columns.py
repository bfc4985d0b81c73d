"""Which column (or field) of a tracker's samples means what: one declarative map per source, like the
framework key maps of engine/observe/frameworks.py.

Samples logged through a tracker (a W&B Table, Trackio's traces, TensorBoard text) have columns named by
whoever logged them. A `ColumnMap` names, for one source, the columns that hold the prompt, the completion,
each reward function's score, the total reward, the advantage, the group, the step, the policy version and the
length; every other column is kept in the sample's `extra`. Two readers apply a map:

- `Layout`, to a table's rows of cells (W&B Tables, engine/observe/wandb_tables.py): `match(columns)` picks
  the first map of `COLUMN_MAPS` a table fits (the order is the preference), and `Layout.samples(row)` turns
  one row (a list of cells in column order) into samples. Two shapes are known: one sample a row (TRL's
  completions table: `step, prompt, completion, <one column per reward function>, advantage`), and several
  samples side by side in one row (veRL's validation table: `step, input_1, output_1, score_1, input_2,
  output_2, score_2, ...`, `wide`). A table of neither shape is not samples (a user's own table of numbers):
  it is left alone.
- `mapped(column_map, fields)`, to one record of named fields (a Trackio trace's metadata,
  engine/observe/trackio_traces.py, with `TRACKIO_TRACES`; a row or JSON object of a TensorBoard text,
  rollouts/tensorboard_text.py, with `TENSORBOARD_TEXT`): the names are compared case-insensitively, and the
  policy version goes to `extra` as `policy_version`.

Either makes the samples of the store's rollouts table (engine/store/rollouts.py), without `idx`: the reader
gives each its place.

Where the names come from (each map's `source` cites its own):
- W&B Tables: veRL's validation generations (`val/generations`, verl/utils/tracking.py, veRL 0.9.1), TRL's
  completions table (trl/trainer/grpo_trainer.py, TRL 1.16), any user's table of prompts and completions.
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

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.limits import COUNT_MAX, int_within

from ..reader_base import as_step
from .rollout_base import MAX_TEXT, chat_text, finite

WIDE = re.compile(r"(.+)_(\d{1,6})$")  # `input_3`: the name and the sample's number in a wide row
MISSING = object()


@dataclass(frozen=True)
class ColumnMap:
    """The columns of one source's samples. Each field lists the names that mean it, the first one present
    wins (`mapped` compares them case-insensitively: name them in lower case). `rewards` are all taken, each
    the score of one reward function named after its column; a name ending in "/" is a prefix: every column
    under it is one reward function, named after the rest (`rewards/accuracy` -> `accuracy`; not in a wide
    row). `reward_dicts`, `policy_version` and `length` are read by `mapped` only: no table map names them."""

    source: str  # who writes samples of this shape, and where (cited)
    prompt: tuple[str, ...]
    completion: tuple[str, ...]
    rewards: tuple[str, ...] = ()
    reward_dicts: tuple[str, ...] = ()  # a field holding {reward function: score}
    total: tuple[str, ...] = ()  # the total reward; without it the rewards' sum is the total
    advantage: tuple[str, ...] = ()
    group: tuple[str, ...] = ()  # without it, the samples of one prompt form a group (in a table)
    # Without it (or in a cell that is not a step), the step the samples were logged at.
    step: tuple[str, ...] = ()
    # The policy that sampled it (async RL: how many steps behind the learner it is), in `extra`.
    policy_version: tuple[str, ...] = ()
    length: tuple[str, ...] = ()  # completion tokens
    requires: tuple[str, ...] = ()  # columns a table must have to be of this source
    # Numeric columns after the completion, up to the first one that is not numeric or is another field's,
    # are reward functions' scores (TRL names one column after each of its reward functions).
    rewards_after_completion: bool = False
    wide: bool = False  # several samples a row: `<name>_<n>` columns, n from 1 (veRL)
    # A dump that holds the same samples in full (engine/observe/rollouts/READERS' kinds): where a run has it,
    # its tables of this shape are left out, so no sample shows twice.
    same_as: str = ""


# The maps of W&B Tables, tried by `match` in this order.
COLUMN_MAPS: dict[str, ColumnMap] = {
    "verl": ColumnMap(
        "veRL's validation generations, logged to W&B as `val/generations` (ValidationGenerationsLogger,"
        " verl/utils/tracking.py, veRL 0.9.1): step, input_1, output_1, score_1, input_2, ...",
        prompt=("input",),
        completion=("output",),
        rewards=("score",),
        step=("step",),
        wide=True,
    ),
    "trl": ColumnMap(
        "TRL's completions table (GRPOTrainer `log_completions`, trl/trainer/grpo_trainer.py, TRL 1.16):"
        " step, prompt, completion, one column per reward function, extra columns, advantage",
        prompt=("prompt",),
        completion=("completion",),
        advantage=("advantage",),
        step=("step",),
        requires=("step", "advantage"),
        rewards_after_completion=True,
        same_as="rollouts-trl",
    ),
    "samples": ColumnMap(
        "any other table of prompts and completions (a user's own `wandb.Table`)",
        prompt=("prompt", "input", "question", "query", "instruction"),
        completion=("completion", "response", "output", "generation", "prediction"),
        total=("reward", "score", "total_reward"),
        advantage=("advantage", "advantages"),
        group=("group_id", "group", "uid", "prompt_id", "example_id"),
        step=("step", "global_step", "_step"),
    ),
}


# The maps of records, each applied by its reader with `mapped`.
TRACKIO_TRACES = ColumnMap(
    "Trackio traces' metadata: TRL's async GRPO `log_rollout_traces`"
    " (trl/experimental/async_grpo/async_grpo_trainer.py, TRL 1.16), veRL's `val/generations` and"
    " `rollout_trace/<op>` (verl/utils/tracking.py, verl/utils/rollout_trace.py, verl 1dda039b9)",
    prompt=("prompt",),  # else the trace's messages before its first assistant message
    completion=("completion", "response"),  # else the messages from the first assistant message on
    rewards=("rewards/",),
    reward_dicts=("rewards",),
    total=("reward", "score", "total_reward"),
    advantage=("advantage",),
    group=("group_id", "group", "uid", "sample_index"),
    step=("step", "global_step", "training_step"),
    policy_version=("model_version", "policy_version", "weight_version"),
    length=("completion_tokens", "response_length"),
)

TENSORBOARD_TEXT = ColumnMap(
    "a TensorBoard text's table (markdown, or a 2-D string tensor with a header row) or JSON objects,"
    " by their column names (rollouts/tensorboard_text.py)",
    prompt=("prompt", "input", "query", "question"),
    completion=("completion", "response", "output", "generation", "generated", "sample", "text"),
    rewards=("rewards/",),
    total=("reward", "score", "total_reward"),
    advantage=("advantage",),
    group=("group_id", "group", "uid"),
    step=("step", "global_step"),
    policy_version=("model_version", "policy_version"),
    length=("completion_tokens", "response_length", "length"),
)


@dataclass(frozen=True)
class Fields:
    """Where one sample's fields are in a row: column indexes (-1: absent)."""

    prompt: int
    completion: int
    total: int = -1
    advantage: int = -1
    group: int = -1
    rewards: tuple[tuple[str, int], ...] = ()
    extra: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Layout:
    """A ColumnMap applied to one table's columns."""

    source: str  # the name of the ColumnMap in COLUMN_MAPS
    same_as: str
    step: int
    shared: tuple[tuple[str, int], ...]  # columns every sample of a row gets in its `extra` (wide rows)
    samples_of_row: tuple[Fields, ...] = field(default_factory=tuple)
    width: int = 0  # the table's columns: a shorter row is read as if its missing cells were empty

    def samples(self, row: Sequence[Any]) -> list[dict[str, Any]]:
        """The samples of one row (in order): prompt, completion, rewards, total, advantage, group_id, extra
        and `step` (None when the row does not say it)."""
        if len(row) < self.width:
            row = [*row, *([None] * (self.width - len(row)))]
        step = int_within(row[self.step], 0) if self.step >= 0 else None
        shared = {name: _kept(row[i]) for name, i in self.shared}
        out = []
        for f in self.samples_of_row:
            prompt, completion = row[f.prompt], row[f.completion]
            if prompt is None and completion is None:
                continue  # a wide row with fewer samples than columns
            prompt_text = chat_text(prompt)
            rewards = {name: finite(row[i]) for name, i in f.rewards}
            group = row[f.group] if f.group >= 0 else None
            out.append(
                {
                    "step": step,
                    "prompt": prompt_text,
                    "completion": chat_text(completion),
                    "rewards": rewards,
                    "total": finite(row[f.total]) if f.total >= 0 else None,
                    "advantage": finite(row[f.advantage]) if f.advantage >= 0 else None,
                    "group_id": _group_id(group, prompt_text),
                    "extra": {**shared, **{name: _kept(row[i]) for name, i in f.extra}},
                }
            )
        return out


def match(
    columns: Sequence[Any], rows: Sequence[Sequence[Any]] = (), maps: dict[str, ColumnMap] | None = None
) -> Layout | None:
    """The layout of the first map (of `maps`, else COLUMN_MAPS) that a table with these columns fits; None
    when it is not a table of samples. `rows` (the table's, or some of them) tell which columns hold numbers,
    for a map with `rewards_after_completion`."""
    names = [c if isinstance(c, str) else str(c) for c in columns]
    for name, column_map in (maps or COLUMN_MAPS).items():
        if any(r not in names for r in column_map.requires):
            continue
        step = _first(names, column_map.step)
        if column_map.wide:
            layout = _wide_layout(name, column_map, names, step)
        else:
            layout = _row_layout(name, column_map, names, step, rows)
        if layout is not None:
            return layout
    return None


def has_completion(column_map: ColumnMap, names: list[str]) -> bool:
    """Whether a record (or table) with these field names holds samples: one of them is a completion."""
    wanted = set(column_map.completion)
    return any(name.strip().lower() in wanted for name in names)


def mapped(column_map: ColumnMap, fields: dict[str, Any]) -> dict[str, Any]:
    """A rollout row (without `idx`) from one sample's fields, as `column_map` says; `step` is None when no
    field gives one, `group_id` empty when none names the group. The prompt and completion are made text."""
    lower: dict[str, str] = {}
    for name in fields:
        lower.setdefault(str(name).strip().lower(), name)
    used: set[str] = set()

    def take(names: tuple[str, ...]) -> Any:
        for name in names:
            key = lower.get(name)
            if key is not None and key not in used:
                used.add(key)
                return fields[key]
        return MISSING

    cm = column_map
    prompt, completion = take(cm.prompt), take(cm.completion)
    reward, advantage, group = take(cm.total), take(cm.advantage), take(cm.group)
    step, version, length = take(cm.step), take(cm.policy_version), take(cm.length)
    rewards: dict[str, float | None] = {}
    for name in cm.rewards:
        if name.endswith("/"):
            for key, value in fields.items():
                if key not in used and str(key).lower().startswith(name) and len(key) > len(name):
                    used.add(key)
                    rewards[str(key)[len(name) :]] = finite(value)
        elif (found := lower.get(name)) is not None and found not in used:
            used.add(found)
            rewards[str(found)] = finite(fields[found])
    for name in cm.reward_dicts:
        if (found := lower.get(name)) is not None and found not in used and isinstance(fields[found], dict):
            used.add(found)
            rewards.update({str(k): finite(v) for k, v in fields[found].items()})
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


def _row_layout(
    name: str, cm: ColumnMap, names: list[str], step: int, rows: Sequence[Sequence[Any]]
) -> Layout | None:
    """One sample a row."""
    prompt, completion = _first(names, cm.prompt), _first(names, cm.completion)
    if prompt < 0 or completion < 0:
        return None
    total, advantage, group = _first(names, cm.total), _first(names, cm.advantage), _first(names, cm.group)
    used = {prompt, completion, step, total, advantage, group}
    rewards = [
        (reward, i)
        for i in range(len(names))
        if i not in used and (reward := _reward_name(names[i], cm.rewards)) is not None
    ]
    if cm.rewards_after_completion:
        for i in range(completion + 1, len(names)):
            if i in used or not all(_number_or_empty(row[i]) for row in rows if len(row) > i):
                break
            rewards.append((names[i], i))
    used |= {i for _, i in rewards}
    extra = tuple((names[i], i) for i in range(len(names)) if i not in used)
    fields = Fields(prompt, completion, total, advantage, group, tuple(rewards), extra)
    return Layout(name, cm.same_as, step, (), (fields,), len(names))


def _wide_layout(name: str, cm: ColumnMap, names: list[str], step: int) -> Layout | None:
    numbered: dict[int, dict[str, int]] = {}
    plain: list[tuple[str, int]] = []
    for i, column in enumerate(names):
        m = WIDE.match(column)
        if m and i != step:
            numbered.setdefault(int(m[2]), {})[m[1]] = i
        elif i != step:
            plain.append((column, i))
    samples = []
    for n in sorted(numbered):
        cols = numbered[n]
        prompt, completion = _first_of(cols, cm.prompt), _first_of(cols, cm.completion)
        if prompt < 0 or completion < 0:
            continue
        used = {prompt, completion}
        total, advantage = _first_of(cols, cm.total), _first_of(cols, cm.advantage)
        group = _first_of(cols, cm.group)
        used |= {total, advantage, group}
        rewards = tuple((r, cols[r]) for r in cm.rewards if r in cols and cols[r] not in used)
        used |= {i for _, i in rewards}
        extra = tuple((key, i) for key, i in cols.items() if i not in used)
        samples.append(Fields(prompt, completion, total, advantage, group, rewards, extra))
    if not samples:
        return None
    return Layout(name, cm.same_as, step, tuple(plain), tuple(samples), len(names))


def _first(names: list[str], wanted: tuple[str, ...]) -> int:
    for name in wanted:
        if name in names:
            return names.index(name)
    return -1


def _first_of(columns: dict[str, int], wanted: tuple[str, ...]) -> int:
    for name in wanted:
        if name in columns:
            return columns[name]
    return -1


def _reward_name(column: str, wanted: tuple[str, ...]) -> str | None:
    """The reward function a column scores, as `wanted` names them (a name ending in "/" a prefix); None when
    it is not a reward's."""
    for name in wanted:
        if not name.endswith("/"):
            if column == name:
                return column
        elif column.startswith(name) and len(column) > len(name):
            return column[len(name) :]
    return None


def _number_or_empty(value: Any) -> bool:
    return value is None or (type(value) in (int, float))


def _group_id(group: Any, prompt: str | None) -> str:
    """The group column's value as text, else a short hash of the prompt (the samples of one prompt)."""
    if group is not None and not isinstance(group, dict | list):
        return str(group)[:200]
    return hashlib.sha1((prompt or "").encode("utf-8", "surrogatepass")).hexdigest()[:12]


def _kept(value: Any) -> Any:
    """A cell kept in `extra`: text cut at MAX_TEXT characters; anything else as it is."""
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + " [cut]"
    return value


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else str(value) if type(value) in (int, float, bool) else ""
    return text[:200]
