"""`carl diagnose RUN ["question"]`: the control room's diagnosis, streamed to stdout.

Claude when a key is there, else the offline analyst (labelled). The answer is Markdown: drawn by Rich on a
terminal, the Markdown as written into a pipe (render.py). Tool calls and retries go to stderr so stdout is
the answer alone; `--json` prints one object instead, with the answer's Markdown as it is. The exchange is
kept as a conversation of the run, so the control room can resume it."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from engine import paths
from engine.errors import CarlError
from engine.store.reader import StoreReader
from engine.text import VisibleStream, visible

from .analyst import analyze
from .chat import Diagnoser
from .conversations import Conversations
from .digest import build_digest
from .render import PIPE_WIDTH, AnswerPrinter

DEFAULT_QUESTION = "How is this run doing? Is anything wrong, and what should I change?"


class DiagnoseError(CarlError):
    """A one-line problem with the request (unknown run, empty question)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run name or id")
    parser.add_argument("question", nargs="?", default=None, help="what to ask (default: how is it doing?)")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object: answer, tool calls, findings"
    )
    parser.add_argument("--offline", action="store_true", help="use the offline analyst even with a key")
    parser.add_argument(
        "--model", default=None, help="Claude model (default: $CARL_CLAUDE_MODEL or tui.toml)"
    )
    parser.add_argument("--api-key", default=None, help="Anthropic API key (default: $ANTHROPIC_API_KEY)")


def run(args: argparse.Namespace, home: Path) -> int:
    return diagnose(
        home,
        args.run,
        args.question,
        as_json=args.json,
        offline=args.offline,
        model=args.model or configured_model(home),
        api_key=args.api_key,
    )


def configured_model(home: Path) -> str | None:
    """The control room's `claude_model` in $CARL_HOME/tui.toml, the one setting of that file that
    diagnosis reads (the rest, theme and charts, belong to the control room, which checks them)."""
    import tomllib

    path = home / "tui.toml"
    if not path.exists():
        return None
    try:
        model = tomllib.loads(path.read_text(encoding="utf-8")).get("claude_model")
    except tomllib.TOMLDecodeError as exc:
        raise DiagnoseError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DiagnoseError(f"{path}: cannot read ({exc})") from None
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise DiagnoseError(
            f"{path}: claude_model: must be a model name such as 'claude-sonnet-5-5', not {model!r}"
        )
    return model


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
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Ask about a run and stream the answer to `out` (stdout), tool calls and notes to `err` (stderr);
    what is printed is made `visible` (the answer quotes stored names, keys and prompts)."""
    out, err = out or sys.stdout, err or sys.stderr
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
    # The printer makes the answer's text visible before it draws it; the escapes it writes are its own
    # styles, which the command's visible stdout (engine/cli.py) would write out as text.
    raw = out.stream if isinstance(out, VisibleStream) else out
    width = shutil.get_terminal_size((PIPE_WIDTH, 24)).columns
    printer = AnswerPrinter(raw, terminal=_isatty(raw), width=width)
    for event in diagnoser.ask(question):
        if event.kind == "text" and not as_json:
            printer.feed(event.text)
        elif event.kind == "tool_call" and not as_json:
            print(visible(f"⚙ {event.text}({json.dumps(event.data['input'])})"), file=err, flush=True)
        elif event.kind == "status" and not as_json:
            print(visible(f"… {event.text}"), file=err, flush=True)
        elif event.kind in ("done", "error"):
            final = event.data
            if event.kind == "error" and not as_json:
                printer.close()
                print(f"\ncarl diagnose: {visible(event.text)}", file=err, flush=True)
    printer.close()
    _save(db, run_id, question, final, diagnoser)
    if as_json:
        print(
            json.dumps({"run": ref, "run_id": run_id, "question": question, **final, "findings": findings}),
            file=out,
        )
    return 1 if final.get("error") else 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or a bare stream
        return False


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
