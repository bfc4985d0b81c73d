"""`carl diagnose RUN ["question"]`: the control room's diagnosis, streamed to stdout.

Claude when a key is there, else the offline analyst (labelled). Tool calls and retries go to
stderr so stdout is the answer alone; `--json` prints one object instead. The exchange is kept
as a conversation of the run, so the control room can resume it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from engine import paths
from engine.errors import CarlError
from engine.store.reader import StoreReader

from .analyst import analyze
from .chat import Diagnoser
from .conversations import Conversations
from .digest import build_digest

DEFAULT_QUESTION = "How is this run doing? Is anything wrong, and what should I change?"


class DiagnoseError(CarlError):
    """A one-line problem with the request (unknown run, empty question)."""


def find_run_id(reader: StoreReader, ref: str) -> int:
    runs = reader.runs()
    for run in reversed(runs):
        if run.name == ref:
            return run.id
    if ref.isdigit() and any(r.id == int(ref) for r in runs):
        return int(ref)
    names = ", ".join(r.name for r in runs[-5:]) or "none yet"
    raise DiagnoseError(f"{ref}: no such run (newest: {names})")


def diagnose(
    home: Path,
    ref: str,
    question: str | None,
    *,
    as_json: bool = False,
    offline: bool = False,
    model: str | None = None,
    api_key: str | None = None,
    base_url: str | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    db = paths.db_path(home)
    reader = StoreReader(db)
    try:
        run_id = find_run_id(reader, ref)
        findings = [asdict(f) for f in analyze(build_digest(reader, run_id))] if as_json else []
    finally:
        reader.close()
    question = (question or DEFAULT_QUESTION).strip()
    if not question:
        raise DiagnoseError("the question is empty")
    diagnoser = Diagnoser(db, run_id, api_key=api_key, model=model, base_url=base_url, offline=offline)
    final: dict[str, Any] = {}
    for event in diagnoser.ask(question):
        if event.kind == "text" and not as_json:
            out.write(event.text)
            out.flush()
        elif event.kind == "tool_call" and not as_json:
            print(f"⚙ {event.text}({json.dumps(event.data['input'])})", file=err, flush=True)
        elif event.kind == "status" and not as_json:
            print(f"… {event.text}", file=err, flush=True)
        elif event.kind in ("done", "error"):
            final = event.data
            if event.kind == "error" and not as_json:
                print(f"\ncarl diagnose: {event.text}", file=err, flush=True)
    _save(db, run_id, question, final, diagnoser)
    if as_json:
        print(
            json.dumps({"run": ref, "run_id": run_id, "question": question, **final, "findings": findings}),
            file=out,
        )
    elif final.get("answer") and not final["answer"].endswith("\n"):
        out.write("\n")
    return 1 if final.get("error") else 0


def _save(db: Path, run_id: int, question: str, final: dict[str, Any], diagnoser: Diagnoser) -> None:
    conversations = Conversations(db)
    try:
        conversation, _ = conversations.add(None, run_id, "user", question)
        if final.get("answer"):
            meta = {
                "offline": final.get("offline", False),
                "model": None if final.get("offline") else diagnoser.model,
                "usage": final.get("usage"),
                "tool_calls": final.get("tool_calls"),
            }
            conversations.add(conversation, run_id, "assistant", final["answer"], meta)
        if final.get("error"):
            conversations.add(conversation, run_id, "error", final["error"])
    finally:
        conversations.close()
