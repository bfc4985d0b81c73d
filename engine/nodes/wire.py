"""What a node says over NATS, and how the engine checks it: subjects, node names, the four messages.

A `carl node` publishes into its own JetStream stream, `CARL_NODES`, on `carl.nodes.<node>.<kind>`:

- `hello`: once at start, what does not change (cores, memory, platform, GPUs, the NVML note);
- `sample`: every interval, one `engine.system.Sample` as JSON;
- `console`: new lines of a log file the node follows, at most MAX_CONSOLE_LINES and MAX_CONSOLE_BYTES a
  message, with the follow state they come from (`epoch`, the message's number `n`, the byte `offset`);
- `bye`: on SIGTERM or SIGINT, its last word.

Every message is one JSON object that names its `type` and its `node` (docs/reference/agents-plane.md §12,
rule 1: a payload names itself), so the engine checks it against the subject. What a node sends is hostile
input: `parse` checks the subject, the size, the JSON, the node's name and every field, and raises `Rejected`
with one line naming what is wrong; the engine stores that as a row of `node_rejected`, never a traceback.
This module imports no NATS: the engine's writer and the tests use it on bytes.
"""

from __future__ import annotations

import json
import math
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from engine.system.readings import MAX_GPUS, BadSample, Sample, from_json
from engine.text import loads_storable, one_line

STREAM = "CARL_NODES"
PREFIX = "carl.nodes"
SUBJECTS = [f"{PREFIX}.>"]
KINDS = ("hello", "sample", "console", "bye")

MAX_MESSAGE_BYTES = 256 * 1024  # the engine refuses a message above this (a sample of 4,096 cores is ~40 KiB)
STREAM_MAX_MSG_BYTES = 1024 * 1024  # the stream refuses one above this (NATS's default max_payload)
# A console message carries at most this many bytes of lines (JSON writes a control byte as 6: \u001b, so the
# message stays under MAX_MESSAGE_BYTES whatever the log holds) ...
MAX_CONSOLE_BYTES = 32 * 1024
MAX_CONSOLE_LINES = 2000  # ... and at most this many lines
MAX_LINE_BYTES = 16 * 1024  # a longer line is sent in pieces of this size (a 10 MB line is 640 messages)
MAX_LINE_CHARS = MAX_LINE_BYTES  # what the engine takes: a piece decodes to at most as many characters
MAX_TEXT = 500  # characters of a host, a platform, a source path, a reason
MAX_NODES = 256  # nodes a store keeps: past this, a new name is refused (a token holder cannot fill the disk)
MAX_CONSOLES = 16  # consoles per node
MAX_NAME = 64

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")  # one subject token, and nothing a shell or path reads
CONSOLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
RUN_NAME_CHARS = 128


class Rejected(Exception):
    """A message that cannot be stored: one line saying why, and the node it named (as text) when known."""

    def __init__(self, reason: str, node: str | None = None) -> None:
        super().__init__(one_line(reason, MAX_TEXT))
        self.node = node


def node_name_problem(name: Any) -> str | None:
    """Why `name` is not a node's name, or None: 1 to 64 letters, digits, `_` or `-`, starting with a letter
    or digit (one NATS subject token; never a path: the node's files are named by its id)."""
    if not isinstance(name, str):
        return f"expected text, not {type(name).__name__}"
    if not name:
        return "empty"
    if len(name) > MAX_NAME:
        return f"{len(name):,} characters long (at most {MAX_NAME})"
    if not NODE_NAME.match(name):
        return "only letters, digits, '_' and '-' (starting with a letter or digit)"
    return None


def default_node_name() -> str:
    """This machine's host name up to its first dot, with anything a node name cannot hold made '-'."""
    label = socket.gethostname().split(".")[0]
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "-", label)[:MAX_NAME].lstrip("-_")
    return cleaned or "node"


def console_name(path_name: str, taken: set[str]) -> str:
    """A console's name from its file's name: what a name cannot hold made '-', cut, unique among `taken`."""
    base = re.sub(r"[^A-Za-z0-9._+-]", "-", path_name)[:48].lstrip("-._+") or "console"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    return name


def subject(node: str, kind: str) -> str:
    return f"{PREFIX}.{node}.{kind}"


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


# -- the engine's side: every message checked -----------------------------------------------------------


@dataclass
class Hello:
    host: str
    info: dict[str, Any]
    note: str | None


@dataclass
class Console:
    name: str
    source: str
    run: str | None
    epoch: str
    n: int
    offset: int
    lines: list[str] = field(default_factory=list)


@dataclass
class Message:
    kind: str
    node: str
    host: str
    hello: Hello | None = None
    sample: Sample | None = None
    console: Console | None = None
    reason: str | None = None  # a bye's


def parse(subj: str, data: bytes) -> Message:
    """A node's message, checked; Rejected (naming the field) when anything is wrong."""
    parts = subj.split(".")
    token = parts[2] if len(parts) > 2 else None
    if len(parts) != 4 or ".".join(parts[:2]) != PREFIX or parts[3] not in KINDS:
        raise Rejected(f"unknown subject (expected {PREFIX}.<node>.<{'|'.join(KINDS)}>)", token)
    kind = parts[3]
    if len(data) > MAX_MESSAGE_BYTES:
        raise Rejected(f"too large: {len(data):,} bytes (at most {MAX_MESSAGE_BYTES:,})", token)
    try:
        body = loads_storable(data)
    except RecursionError:
        raise Rejected("not JSON: nested too deeply", token) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise Rejected(f"not JSON: {exc}", token) from None
    if not isinstance(body, dict):
        raise Rejected(f"expected a JSON object, not {type(body).__name__}", token)
    node = body.get("node")
    problem = node_name_problem(node)
    if problem is not None:
        raise Rejected(f"node: {problem}", node if isinstance(node, str) else token)
    if not isinstance(node, str) or node != token:  # a str already, when it has no problem
        raise Rejected(f"node: {node!r}, but the subject names {token!r}", node)
    if body.get("type") != kind:
        raise Rejected(f"type: {one_line(repr(body.get('type')), 40)}, but the subject says {kind!r}", node)
    message = Message(kind, node, _text(body, "host", node, default=""))
    if kind == "hello":
        message.hello = _hello(body, node, message.host)
    elif kind == "sample":
        try:
            message.sample = from_json(body.get("sample"))
        except BadSample as exc:
            raise Rejected(f"sample: {exc}", node) from None
    elif kind == "console":
        message.console = _console(body, node)
    else:
        message.reason = _text(body, "reason", node, default="") or None
    return message


def _hello(body: dict[str, Any], node: str, host: str) -> Hello:
    raw = body.get("info", {})
    if not isinstance(raw, dict):
        raise Rejected("info: expected an object", node)
    info: dict[str, Any] = {
        "cores": _count(raw, "info.cores", node, "cores"),
        "memory": _count(raw, "info.memory", node, "memory"),
        "platform": _text(raw, "platform", node, default="", label="info.platform"),
        "version": _text(body, "version", node, default=""),
        "interval_s": _seconds(body, node),
    }
    gpus = raw.get("gpus", [])
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise Rejected(f"info.gpus: expected a list of at most {MAX_GPUS}", node)
    info["gpus"] = [_gpu(g, f"info.gpus[{i}]", node) for i, g in enumerate(gpus)]
    note = _text(body, "note", node, default="") or None
    info["note"] = note
    return Hello(host, info, note)


def _gpu(data: Any, where: str, node: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise Rejected(f"{where}: expected an object", node)
    index = data.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_GPUS:
        raise Rejected(f"{where}.index: expected a whole number from 0 to {MAX_GPUS - 1}", node)
    return {
        "index": index,
        "name": _text(data, "name", node, default="", label=f"{where}.name"),
        "uuid": _text(data, "uuid", node, default="", label=f"{where}.uuid"),
    }


def _console(body: dict[str, Any], node: str) -> Console:
    name = body.get("console")
    if not isinstance(name, str) or len(name) > MAX_NAME or not CONSOLE_NAME.match(name):
        raise Rejected("console: expected a name of letters, digits, '.', '_', '+' or '-'", node)
    run = body.get("run")
    if run is not None and (not isinstance(run, str) or not run.strip() or len(run) > RUN_NAME_CHARS):
        raise Rejected(f"run: expected a run's name (1 to {RUN_NAME_CHARS} characters) or null", node)
    if run is not None and not run.isprintable():
        raise Rejected("run: contains a control or unprintable character", node)
    epoch = body.get("epoch")
    if not isinstance(epoch, str) or not 1 <= len(epoch) <= MAX_NAME or not epoch.isprintable():
        raise Rejected("epoch: expected a short printable text", node)
    lines = body.get("lines")
    if not isinstance(lines, list) or not lines or len(lines) > MAX_CONSOLE_LINES:
        raise Rejected(f"lines: expected a list of 1 to {MAX_CONSOLE_LINES} lines", node)
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise Rejected(f"lines[{i}]: expected text", node)
        if len(line) > MAX_LINE_CHARS:
            raise Rejected(f"lines[{i}]: {len(line):,} characters (at most {MAX_LINE_CHARS:,})", node)
        if "\n" in line:
            raise Rejected(f"lines[{i}]: holds a line break", node)
    return Console(
        name,
        _text(body, "source", node, default=""),
        run,
        epoch,
        _count(body, "n", node, "n", low=1),
        _count(body, "offset", node, "offset"),
        lines,
    )


def _text(data: dict[str, Any], key: str, node: str, *, default: str, label: str | None = None) -> str:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise Rejected(f"{label or key}: expected text", node)
    if len(value) > MAX_TEXT:
        raise Rejected(f"{label or key}: {len(value):,} characters (at most {MAX_TEXT})", node)
    return value


def _count(data: dict[str, Any], label: str, node: str, key: str, *, low: int = 0) -> int:
    value = data.get(key, low)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**63:
        raise Rejected(f"{label}: expected a whole number from {low}", node)
    return value


def _seconds(body: dict[str, Any], node: str) -> float | None:
    value = body.get("interval_s")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise Rejected("interval_s: expected seconds above 0", node)
    return float(value)
