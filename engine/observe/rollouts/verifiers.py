"""verifiers' evaluation results: `results.jsonl` as `vf-eval` writes it.

`save_outputs` (verifiers/legacy/utils/save_utils.py) appends one rollout a line, `json.dumps(output) + "\n"`,
where `state_to_output` makes the output: `example_id`, `prompt` and `completion` (messages, or text),
`reward` (the rubric's weighted total), `metrics` (each rubric function's score, also copied to the top
level), `answer`, `info`, `error`, `timing`, `is_completed`, `is_truncated`, `stop_condition`, `token_usage`.
An evaluation has no training step: every sample is step 0, and the rollouts of one example form a group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.store import Store

from ..common import Budget, IngestResult
from . import dumps
from .common import chat_text, finite

FILE_NAME = "results.jsonl"
LEFT_OUT = frozenset(
    {"example_id", "prompt", "completion", "reward", "metrics", "timing", "tool_defs", "trajectory"}
)


def files(root: Path, since: int) -> tuple[Path, list[tuple[int, str]]]:
    if root.is_file():
        return root.parent, [(0, root.name)]
    return root, [(0, FILE_NAME)] if (root / FILE_NAME).is_file() else []


def samples(record: Any, step: int) -> list[dict[str, Any]]:
    if not isinstance(record, dict):
        raise dumps.BadRecord("not an object")
    if "prompt" not in record and "completion" not in record:
        raise dumps.BadRecord("no prompt or completion (not a verifiers result)")
    metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
    usage = record.get("token_usage")
    length = finite(usage.get("output_tokens")) if isinstance(usage, dict) else None
    return [
        {
            "step": step,
            "group_id": str(record.get("example_id", "")),
            "prompt": chat_text(record.get("prompt")),
            "completion": chat_text(record.get("completion")),
            "rewards": {str(k): finite(v) for k, v in metrics.items()},
            "total": finite(record.get("reward")),
            "length": length,
            "extra": {k: v for k, v in record.items() if k not in LEFT_OUT and k not in metrics},
        }
    ]


def run_name(root: Path) -> str:
    """`<env>--<model>-<run id>`, from the folder vf-eval made (outputs/evals/<env>--<model>/<run id>/)."""
    folder = root.parent if root.is_file() else root
    return f"{folder.parent.name}-{folder.name}" if folder.parent.name else folder.name


FORMAT = dumps.DumpFormat("rollouts-verifiers", files, samples, run_name)


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    return dumps.ingest(FORMAT, store, source, budget)
