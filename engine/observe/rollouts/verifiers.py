"""verifiers' evaluations: `traces.jsonl` (verifiers 0.4, `verifiers.v1`) and the older `results.jsonl`.

verifiers 0.4's `vf-eval` writes a run into `<output_dir>/<run dir>/` (verifiers/v1/cli/output.py: the
resolved config under `configs/`, and a fresh `traces.jsonl`), then appends each finished episode with
`utils/trace_store.write_episode`: one line, pydantic's `dump_json(episode, exclude_none=True)` of a
`verifiers.v1.episode.Episode` — `id`, `env` (`id`, `name`), `task` (`type`, `data`, `key`, `hash`), `group`,
`run` (`{"type": "eval", "id", "name"}`, or a training run's with `work.step`), `ok`, `errors` and `traces`,
one per agent (verifiers/v1/trace.py: the message graph `nodes`, named weighted `rewards`, `metrics`). Each
trace is one sample, read as prime-rl's episodes are (prime.py); its step is the training step the episode was
dispatched at (`run.work.step`), else 0 for an evaluation, and its group the consumer's `group.id`, else the
task (`task.key`, else `task.hash`): the rollouts of one example.

The legacy `results.jsonl` (verifiers/legacy/utils/save_utils.py `save_outputs`) holds one rollout a line,
from `state_to_output`: `example_id`, `prompt` and `completion` (messages, or text), `reward` (the rubric's
weighted total), `metrics` (each rubric function's score, also copied to the top level), `answer`, `info`,
`error`, `timing`, `is_completed`, `is_truncated`, `stop_condition`, `token_usage`. Every sample is step 0,
and the rollouts of one example form a group.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.limits import int_within
from engine.store import Store

from ..reader_base import Budget, IngestResult
from . import dumps
from .prime import _sample as trace_sample
from .rollout_base import chat_text, finite

TRACES_FILE = "traces.jsonl"  # verifiers 0.4 (verifiers/v1/utils/trace_store.py TRACES_FILE)
FILE_NAME = "results.jsonl"  # the legacy path
FILE_NAMES = (TRACES_FILE, FILE_NAME)
LEFT_OUT = frozenset(
    {"example_id", "prompt", "completion", "reward", "metrics", "timing", "tool_defs", "trajectory"}
)


def files(root: Path, since: int) -> tuple[Path, list[tuple[int, str]]]:
    if root.is_file():
        return root.parent, [(0, root.name)]
    return root, [(0, name) for name in FILE_NAMES if (root / name).is_file()][:1]


def is_episode(record: Any) -> bool:
    """A verifiers 0.4 episode (a line of traces.jsonl): a list of traces and the task they solved."""
    return isinstance(record, dict) and isinstance(record.get("traces"), list) and "task" in record


def object_at(record: dict[str, Any], key: str) -> dict[str, Any]:
    """The record's value at `key` when it is an object, else {} (a part missing or of another type)."""
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def samples(record: Any, step: int) -> list[dict[str, Any]]:
    if not isinstance(record, dict):
        raise dumps.BadRecord("not an object")
    if is_episode(record):
        return episode_samples(record, step)
    if "prompt" not in record and "completion" not in record:
        raise dumps.BadRecord("no prompt or completion, nor traces (not a verifiers result or episode)")
    metrics = object_at(record, "metrics")
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


def episode_samples(episode: dict[str, Any], step: int) -> list[dict[str, Any]]:
    """One sample per trace of a verifiers 0.4 episode."""
    run = object_at(episode, "run")
    work = object_at(run, "work")
    own_step = int_within(work.get("step"))
    step = step if own_step is None else own_step
    group = episode.get("group")
    task = object_at(episode, "task")
    group_id = group.get("id") if isinstance(group, dict) else task.get("key") or task.get("hash")
    out = []
    for trace in episode["traces"]:
        if isinstance(trace, dict):
            sample = trace_sample(trace, step, group_id, episode.get("env"), episode)
            sample["extra"]["episode_ok"] = episode.get("ok")
            if run.get("id") is not None:
                sample["extra"]["run"] = run.get("id")
            out.append(sample)
    return out


def run_name(root: Path) -> str:
    """verifiers 0.4: the run dir's name (`<env>--<model>--<harness>--<short id>` by default); the legacy
    layout: `<env>--<model>-<run id>`, from outputs/evals/<env>--<model>/<run id>/."""
    folder = root.parent if root.is_file() else root
    if root.name == TRACES_FILE or (folder / TRACES_FILE).is_file():
        return folder.name
    return f"{folder.parent.name}-{folder.name}" if folder.parent.name else folder.name


FORMAT = dumps.DumpFormat("rollouts-verifiers", files, samples, run_name)


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    return dumps.ingest(FORMAT, store, source, budget)
