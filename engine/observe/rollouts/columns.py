"""Which columns of a tracker's table of samples mean what: one declarative map per source, like the framework
key maps of engine/observe/frameworks.py.

A table of samples logged through a tracker (a W&B Table, Trackio's traces, TensorBoard text) has columns
named by whoever logged it. A `ColumnMap` names, for one source, the columns that hold the prompt, the
completion, each reward function's score, the total reward, the advantage, the group and the step; every other
column is kept in the sample's `extra`. `match(columns)` picks the first map of `COLUMN_MAPS` a table fits
(the order is the preference), and `Layout.samples(row)` turns one row (a list of cells in column order) into
the samples of the store's rollouts table (engine/store/rollouts.py), without `idx`: the reader gives each its
place.

Two shapes are known: one sample a row (TRL's completions table: `step, prompt, completion, <one column per
reward function>, advantage`), and several samples side by side in one row (veRL's validation table: `step,
input_1, output_1, score_1, input_2, output_2, score_2, ...`, `wide`). A table of neither shape is not samples
(a user's own table of numbers): it is left alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.limits import int_within

from .common import MAX_TEXT, chat_text, finite

WIDE = re.compile(r"(.+)_(\d{1,6})$")  # `input_3`: the name and the sample's number in a wide row


@dataclass(frozen=True)
class ColumnMap:
    """The columns of one source's tables of samples. Each field lists the names that mean it, the first one
    present wins; `rewards` are all taken (each the score of one reward function, named after its column)."""

    source: str  # who writes tables of this shape, and where (cited)
    prompt: tuple[str, ...]
    completion: tuple[str, ...]
    rewards: tuple[str, ...] = ()
    total: tuple[str, ...] = ()  # the total reward; without it the rewards' sum is the total
    advantage: tuple[str, ...] = ()
    group: tuple[str, ...] = ()  # without it, the samples of one prompt form a group
    step: tuple[
        str, ...
    ] = ()  # without it (or in a cell that is not a step), the step the table was logged at
    requires: tuple[str, ...] = ()  # columns a table must have to be of this source
    # Numeric columns after the completion, up to the first one that is not numeric or is another field's,
    # are reward functions' scores (TRL names one column after each of its reward functions).
    rewards_after_completion: bool = False
    wide: bool = False  # several samples a row: `<name>_<n>` columns, n from 1 (veRL)
    # A dump that holds the same samples in full (engine/observe/rollouts/READERS' kinds): where a run has it,
    # its tables of this shape are left out, so no sample shows twice.
    same_as: str = ""


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


def _row_layout(
    name: str, cm: ColumnMap, names: list[str], step: int, rows: Sequence[Sequence[Any]]
) -> Layout | None:
    """One sample a row."""
    prompt, completion = _first(names, cm.prompt), _first(names, cm.completion)
    if prompt < 0 or completion < 0:
        return None
    total, advantage, group = _first(names, cm.total), _first(names, cm.advantage), _first(names, cm.group)
    used = {prompt, completion, step, total, advantage, group}
    rewards = [(names[i], i) for i in range(len(names)) if names[i] in cm.rewards and i not in used]
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
