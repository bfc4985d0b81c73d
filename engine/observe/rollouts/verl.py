"""veRL's rollout dumps: `trainer.rollout_data_dir/{step}.jsonl` (and `validation_data_dir`, the same shape).

`RayPPOTrainer._dump_generations` (verl/trainer/ppo/ray_trainer.py) writes each step's file in one go, one
JSON object per sample: `input` (the decoded prompt), `output` (the decoded response), `gts` (the ground
truth), `score` (the sequence's summed token-level score; older versions call it `reward`), `step`, and every
`reward_extra_info` list as a field of its own. The dump has no advantages and no group ids: samples of one
prompt (veRL's `uid` group) are told by their identical input, which becomes the group id (a short hash).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from engine.limits import int_text
from engine.store import Store

from ..reader_base import Budget, IngestResult, as_step
from . import dumps
from .rollout_base import chat_text, finite

FILE = re.compile(r"(\d+)\.jsonl$")
OWN = frozenset({"input", "output", "score", "reward", "step"})


def files(root: Path, since: int) -> tuple[Path, list[tuple[int, str]]]:
    if root.is_file():
        match = FILE.fullmatch(root.name)
        return root.parent, [((int_text(match[1]) or 0) if match else 0, root.name)]
    try:
        names = [entry.name for entry in os.scandir(root)]
    except OSError:
        names = []
    steps = ((int_text(m[1]), m[0]) for m in map(FILE.fullmatch, names) if m)
    return root, sorted((step, name) for step, name in steps if step is not None and step >= since)


def samples(record: Any, step: int) -> list[dict[str, Any]]:
    if not isinstance(record, dict):
        raise dumps.BadRecord("not an object")
    if "input" not in record or "output" not in record:
        raise dumps.BadRecord("no input or output field (not a veRL rollout dump)")
    name = "score" if "score" in record else "reward"
    score = finite(record.get(name))
    prompt = chat_text(record["input"])
    own_step = as_step(record.get("step"))
    return [
        {
            "step": step if own_step is None else own_step,
            "group_id": hashlib.sha1((prompt or "").encode("utf-8", "surrogatepass")).hexdigest()[:12],
            "prompt": prompt,
            "completion": chat_text(record["output"]),
            "rewards": {name: score} if score is not None else {},
            "total": score,
            "extra": {k: v for k, v in record.items() if k not in OWN},
        }
    ]


def run_name(root: Path) -> str:
    return (root.parent if root.is_file() else root).name


FORMAT = dumps.DumpFormat("rollouts-verl", files, samples, run_name)


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    return dumps.ingest(FORMAT, store, source, budget)
