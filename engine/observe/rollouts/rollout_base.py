"""What the rollout readers share: the run their samples join, conversations as text, a batch's write.

A rollout source's samples join the run of the source named in `sources.attach_to` (the metrics of the same
training run: its TensorBoard events, W&B run or trainer_state.json), or, when it names none, a run of its own
named after the directory that holds the dump.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from engine.files import kind_of, reason
from engine.store import Store, sources
from engine.store.rollout_reads import next_rollout_idx

from ..reader_base import Budget, IngestResult, ObserveError, RunInfo, ensure_run, find_run

# A rollout (texts, rewards, per-token values) costs the store about as much as ten metric rows: the batch's
# time box counts it so.
ROW_WEIGHT = 10
MAX_TEXT = 1 << 20  # characters of one prompt or completion kept; the rest is cut
FRAMEWORKS = {"rollouts-trl": "trl", "rollouts-verl": "verl", "rollouts-prime": "prime-rl"}


def spent(budget: Budget, rows: int) -> bool:
    return budget.spent(rows * ROW_WEIGHT)


def attached_run(store: Store, source: dict[str, Any]) -> RunInfo | None:
    """The run this source's samples join when it is attached to another source (that source's first run),
    else None. Raises a transient ObserveError while that source has not made its run yet: the samples
    wait."""
    other = source.get("attach_to")
    if not other:
        return None
    run = find_any_run(store, int(other))
    if run is None:
        raise ObserveError(
            f"{source['path']}: waiting for the run of source {other}, which these rollouts belong to",
            transient=True,
        )
    return run


def find_any_run(store: Store, source_id: int) -> RunInfo | None:
    """The source's first run, or None."""
    run = sources.first_run(store, source_id)
    return None if run is None else RunInfo(*run)


def write_batch(
    store: Store,
    source: dict[str, Any],
    run: RunInfo | None,
    name: str,
    rows: list[dict[str, Any]],
    cursor: dict[str, Any],
    result: IngestResult,
) -> None:
    """Store a batch's samples and the cursor just past them in one transaction, creating the source's own run
    (named `name`) on its first samples when it joins no other run."""
    with store.transaction():
        if rows:
            if run is None:
                run = find_run(store, source["id"])
                if run is None:
                    run = ensure_run(store, source, source["name"] or name)
                    framework = FRAMEWORKS.get(source["kind"])
                    if framework:
                        store.update_run(run.id, framework=framework)
            result.rows = store.add_rollouts(run.id, rows)
            result.run_ids.append(run.id)
        store.save_source_progress(source["id"], cursor, rows=result.rows, bad_lines=result.bad_lines)


def store_at_next_places(store: Store, run_id: int, samples: list[dict[str, Any]]) -> int:
    """Store a run's samples that carry no place of their own (a tracker's traces, TensorBoard texts), each
    at the next free place (`idx`) of its step. Inside the batch's transaction: the cursor that covers them
    commits with them, so a place is never taken twice. Returns rows added."""
    if not samples:
        return 0
    places: dict[int, int] = {}
    for sample in samples:
        step = sample["step"]
        if step not in places:
            places[step] = next_rollout_idx(store.conn, run_id, step)
        sample["idx"] = places[step]
        places[step] += 1
    return store.add_rollouts(run_id, samples)


def not_a_file(path: Path) -> str | None:
    """Why `path` cannot be read as a dump file (a FIFO, device or socket would block), or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None  # gone: the caller's open says so
    except OSError as exc:
        return reason(exc)
    return None if stat.S_ISREG(mode) else f"{kind_of(mode)}, not a regular file"


# -- text ----------------------------------------------------------------------------------------------------


def chat_text(value: Any) -> str | None:
    """A prompt or completion as text: a string as it is; a conversation as 'role: content' lines, except a
    lone assistant message, which is its content; anything else as JSON. Cut at MAX_TEXT characters."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and not value:
        text = ""
    elif isinstance(value, list) and all(isinstance(m, dict) for m in value):
        if len(value) == 1 and value[0].get("role") == "assistant":
            text = message_text(value[0])
        else:
            text = "\n".join(f"{m.get('role', '?')}: {message_text(m)}" for m in value)
    elif isinstance(value, dict) and "role" in value:
        text = message_text(value)
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + " [cut]"


def split_messages(messages: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """A conversation as (prompt, completion): the messages before the first assistant message, and the rest
    (the policy's turns and the tool results between them), each as text; a conversation with no assistant
    message is all prompt."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    prompt = chat_text(messages[:first]) if first else None
    completion = chat_text(messages[first:]) if first < len(messages) else None
    return prompt, completion


def message_text(message: dict[str, Any]) -> str:
    """A chat message's text: its content (text parts joined, other parts as [type]) and its tool calls."""
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(
            str(part.get("text", "")) if part.get("type") == "text" else f"[{part.get('type', '?')}]"
            for part in content
            if isinstance(part, dict)
        )
    else:
        text = "" if content is None else str(content)
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function = found if isinstance(found := call.get("function"), dict) else call
            text += f" [call {function.get('name', '?')}({function.get('arguments', '')})]"
    return text


def finite(value: Any) -> float | None:
    """A finite number as a float; None for anything else: bool, text, NaN, inf, an int past a float's
    range."""
    if type(value) not in (int, float):
        return None
    try:
        number = float(value)
    except OverflowError:  # 10**400 is an int JSON can hold
        return None
    return number if math.isfinite(number) else None
