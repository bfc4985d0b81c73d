"""KARL record files -> trajectories, in both shapes KARL wrote (told apart per record):

- the recorder's per-turn records, `trajectories.jsonl` (docs/reference/karl.md §2): the five signals as
  `outcome.<signal>_score`, the times as `timing.started_at` / `timing.ended_at`, the cross-turn flags and the
  prompt kept;
- the published 290-record file behind the paper's ablation (docs/reference/karl.md §11): one whole session a
  line, the signals in `outcome.signals.<signal>`, the times as `timing.first` / `timing.last` with
  `timing.num_prompts`, no prompt and no cross-turn flags.

A record already is one trajectory; this maps its fields back. What the file stored about its own score
(reward, signals, advantage) is kept beside, in `Trajectory.recorded`; our scorer never reads it. Privacy is
applied again (prompt cut and redacted, key parameters filtered) because a record file may come from another
recorder. A record with a malformed field raises `RecordError`, whose message names the field; the caller
turns it into one `file:line: ...` line and reads on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.trajectories.importers.human_prompts import DEFAULT_DETECTOR, Detector
from engine.trajectories.importers.trace_lines import (
    Line,
    Parsed,
    as_bool,
    as_float,
    as_int,
    exit_code,
    params_of,
    prompt_of,
    unix_ts,
)
from engine.trajectories.scoring.signals import SIGNALS
from engine.trajectories.trajectory import Event, Trajectory, make_uid, normalize_tool

AGENT = "karl"
PUBLISHED = "published"  # the paper's 290-record file (§11)
RECORDER = "recorder"  # the recorder's own per-turn records (§2)
MAX_PROMPTS = 1_000_000  # timing.num_prompts is a count of a session's prompts: bounded where it enters


class RecordError(ValueError):
    """One malformed field of a record; the message names it (`outcome.signals.process is not a number`)."""


@dataclass(frozen=True)
class StoredScores:
    """What a record says about its own score, as the file stored it (None or absent: not stored)."""

    shape: str  # PUBLISHED or RECORDER
    signals: dict[str, float]  # the signals present, in SIGNALS order
    reward: float | None  # outcome.reward_score
    advantage: float | None  # outcome.advantage
    num_prompts: int | None  # timing.num_prompts (published shape)

    def signal_field(self, name: str) -> str:
        return signal_field(self.shape, name)

    def to_json(self) -> dict[str, Any]:
        """The `recorded` object kept beside our own scoring: only what the file had ({} for nothing)."""
        out: dict[str, Any] = {}
        if self.reward is not None:
            out["reward_score"] = self.reward
        if self.signals:
            out["signals"] = dict(self.signals)
        if self.advantage is not None:
            out["advantage"] = self.advantage
        if self.num_prompts is not None:
            out["num_prompts"] = self.num_prompts
        return ({"shape": self.shape} | out) if out else {}


def looks_like(obj: dict[str, Any]) -> bool:
    """A record: a `trajectory` object, or `context` and `outcome` objects together."""
    if isinstance(obj.get("trajectory"), dict):
        return True
    return isinstance(obj.get("context"), dict) and isinstance(obj.get("outcome"), dict)


def shape_of(record: dict[str, Any]) -> str:
    """PUBLISHED when the record's outcome has a `signals` key (the §11 file), else RECORDER (§2)."""
    outcome = record.get("outcome")
    return PUBLISHED if isinstance(outcome, dict) and "signals" in outcome else RECORDER


def signal_field(shape: str, name: str) -> str:
    """Where a record of that shape keeps a signal, as a dotted path."""
    return f"outcome.signals.{name}" if shape == PUBLISHED else f"outcome.{name}_score"


def parse(path: Path, lines: list[Line], detector: Detector = DEFAULT_DETECTOR) -> Parsed:
    """Records carry their own cross-turn flags, so the detector is not used here."""
    parsed = Parsed()
    sessions: dict[str, bool] = {}  # session id -> gave a trajectory
    for number, obj in lines:
        if not looks_like(obj):
            parsed.skipped.append(f"{path}:{number}: not a KARL trajectory record")
            continue
        try:
            traj = record_to_trajectory(path, obj)
        except RecordError as err:
            parsed.skipped.append(f"{path}:{number}: {err}")
            continue
        sid = traj.session_id
        sessions[sid] = sessions.get(sid, False) or bool(traj.events)
        if traj.events:  # tap C writes nothing for a turn without tool events
            parsed.trajectories.append(traj)
    parsed.sessions = len(sessions)
    parsed.empty_sessions = sum(1 for gave in sessions.values() if not gave)
    return parsed


def record_to_trajectory(path: Path, record: dict[str, Any]) -> Trajectory:
    """One record (either shape) as a trajectory; RecordError names the first malformed field."""
    context, outcome, timing, skill = (_block(record, k) for k in ("context", "outcome", "timing", "skill"))
    body = _block(record, "trajectory")
    scores = stored_scores(record)
    session_id = _str(record.get("session_id")) or ""
    # Recorder: started_at / ended_at (or recorded_at) of one turn. Published: first / last of the session.
    start_field = timing.get("started_at") or timing.get("first")
    end_field = timing.get("ended_at") or record.get("recorded_at") or timing.get("last")
    record_id = _str(record.get("id")) or f"{session_id}:{start_field}:{context.get('prompt_text')}"
    return Trajectory(
        uid=make_uid(AGENT, record_id),
        session_id=session_id,
        agent=AGENT,
        source=str(path),
        prompt=prompt_of(_str(context.get("prompt_text"))),
        cwd=_str(context.get("cwd")),
        git_repo=_str(context.get("git_repo")),
        started_at=unix_ts(start_field),
        ended_at=unix_ts(end_field),
        events=_events(body),
        correction=as_bool(outcome.get("correction_detected")),
        redo=as_bool(outcome.get("redo_detected")),
        build_success=as_bool(outcome.get("build_success")),
        session_continued=as_bool(outcome.get("session_continued")),
        skill=_str(skill.get("name")),
        domain=_str(skill.get("domain")),
        recorded=scores.to_json(),
    )


def stored_scores(record: dict[str, Any]) -> StoredScores:
    """The record's own reward, signals and advantage, read where its shape keeps them.

    A signal or reward must be a number in [0, 1], an advantage a finite number; a missing or null one is
    simply absent. Anything else raises RecordError naming the field."""
    shape = shape_of(record)
    outcome, timing = _block(record, "outcome"), _block(record, "timing")
    if shape == PUBLISHED:
        held = outcome["signals"]
        if not isinstance(held, dict):
            raise RecordError("outcome.signals is not an object")
        raw = {name: held.get(name) for name in SIGNALS}
    else:
        raw = {name: outcome.get(f"{name}_score") for name in SIGNALS}
    signals = {}
    for name, value in raw.items():
        number = _unit(signal_field(shape, name), value)
        if number is not None:
            signals[name] = number
    return StoredScores(
        shape,
        signals,
        _unit("outcome.reward_score", outcome.get("reward_score")),
        _finite("outcome.advantage", outcome.get("advantage")),
        _count("timing.num_prompts", timing.get("num_prompts")),
    )


def _block(record: dict[str, Any], key: str) -> dict[str, Any]:
    """record[key] as an object; {} when absent or null."""
    value = record.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RecordError(f"{key} is not an object")
    return value


def _finite(where: str, value: Any) -> float | None:
    """A finite number, or None when absent or null."""
    if value is None:
        return None
    number = as_float(value)
    if number is None or not math.isfinite(number):
        raise RecordError(f"{where} is not a number ({_show(value)})")
    return number


def _unit(where: str, value: Any) -> float | None:
    """A stored score: a number in [0, 1], or None when absent or null."""
    number = _finite(where, value)
    if number is not None and not 0.0 <= number <= 1.0:
        raise RecordError(f"{where} = {number} is outside [0, 1]")
    return number


def _count(where: str, value: Any) -> int | None:
    if value is None:
        return None
    count = as_int(value) if not isinstance(value, str) else None
    if count is None or not 0 <= count <= MAX_PROMPTS:
        raise RecordError(f"{where} is not a count of prompts ({_show(value)})")
    return count


def _show(value: Any) -> str:
    return repr(str(value)[:40])


def _events(body: dict[str, Any]) -> list[Event]:
    raw = body.get("events")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise RecordError("trajectory.events is not a list")
    events = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise RecordError(f"trajectory.events[{i}] is not an object")
        events.append(_event(item))
    # The recorder keeps only the first 50 events; the sequence names them all. Unstored ones come back
    # as bare events of unknown outcome, so the total and the tool counts survive the round trip.
    sequence = body.get("tool_sequence")
    if sequence is not None and not isinstance(sequence, list):
        raise RecordError("trajectory.tool_sequence is not a list")
    if sequence and len(sequence) > len(events):
        events += [Event(tool=normalize_tool(str(name))) for name in sequence[len(events) :]]
    return events


def _event(raw: dict[str, Any]) -> Event:
    return Event(
        tool=normalize_tool(_str(raw.get("tool_name"))),
        success=as_bool(raw.get("success")),
        exit_code=exit_code(raw.get("exit_code")),
        duration_ms=as_float(raw.get("duration_ms")),
        ts=unix_ts(raw.get("ts")),
        params=params_of(raw.get("key_params")),
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
