"""KARL `trajectories.jsonl` records (docs/reference/karl.md §2) -> trajectories.

A record already is one trajectory; this maps its fields back. Privacy is applied again (prompt cut
and redacted, key parameters filtered) because a record file may come from another recorder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.trajectories.importers.common import (
    Line,
    Parsed,
    as_bool,
    as_dict,
    as_float,
    as_int,
    params_of,
    prompt_of,
    unix_ts,
)
from engine.trajectories.importers.detect import DEFAULT_DETECTOR, Detector
from engine.trajectories.model import Event, Trajectory, make_uid, normalize_tool

AGENT = "karl"


def looks_like(obj: dict[str, Any]) -> bool:
    """A record: a `trajectory` object, or `context` and `outcome` objects together."""
    if isinstance(obj.get("trajectory"), dict):
        return True
    return isinstance(obj.get("context"), dict) and isinstance(obj.get("outcome"), dict)


def parse(path: Path, lines: list[Line], detector: Detector = DEFAULT_DETECTOR) -> Parsed:
    """Records carry their own cross-turn flags, so the detector is not used here."""
    parsed = Parsed()
    sessions: dict[str, bool] = {}  # session id -> gave a trajectory
    for number, obj in lines:
        if not looks_like(obj):
            parsed.skipped.append(f"{path}:{number}: not a KARL trajectory record")
            continue
        traj = record_to_trajectory(path, obj)
        sid = traj.session_id
        sessions[sid] = sessions.get(sid, False) or bool(traj.events)
        if traj.events:  # tap C writes nothing for a turn without tool events
            parsed.trajectories.append(traj)
    parsed.sessions = len(sessions)
    parsed.empty_sessions = sum(1 for gave in sessions.values() if not gave)
    return parsed


def record_to_trajectory(path: Path, record: dict[str, Any]) -> Trajectory:
    context, outcome, timing = (as_dict(record.get(k)) for k in ("context", "outcome", "timing"))
    skill, body = as_dict(record.get("skill")), as_dict(record.get("trajectory"))
    session_id = _str(record.get("session_id")) or ""
    started = unix_ts(timing.get("started_at"))
    record_id = (
        _str(record.get("id")) or f"{session_id}:{timing.get('started_at')}:{context.get('prompt_text')}"
    )
    return Trajectory(
        uid=make_uid(AGENT, record_id),
        session_id=session_id,
        agent=AGENT,
        source=str(path),
        prompt=prompt_of(_str(context.get("prompt_text"))),
        cwd=_str(context.get("cwd")),
        git_repo=_str(context.get("git_repo")),
        started_at=started,
        ended_at=unix_ts(timing.get("ended_at") or record.get("recorded_at")),
        events=_events(body),
        correction=as_bool(outcome.get("correction_detected")),
        redo=as_bool(outcome.get("redo_detected")),
        build_success=as_bool(outcome.get("build_success")),
        session_continued=as_bool(outcome.get("session_continued")),
        skill=_str(skill.get("name")),
        domain=_str(skill.get("domain")),
    )


def _events(body: dict[str, Any]) -> list[Event]:
    raw = body.get("events")
    events = [_event(e) for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []
    # The store keeps only the first 50 events; the sequence names them all. Unstored ones come back
    # as bare events of unknown outcome, so the total and the tool counts survive the round trip.
    sequence = body.get("tool_sequence")
    if isinstance(sequence, list) and len(sequence) > len(events):
        events += [Event(tool=normalize_tool(str(name))) for name in sequence[len(events) :]]
    return events


def _event(raw: dict[str, Any]) -> Event:
    return Event(
        tool=normalize_tool(_str(raw.get("tool_name"))),
        success=as_bool(raw.get("success")),
        exit_code=as_int(raw.get("exit_code")),
        duration_ms=as_float(raw.get("duration_ms")),
        ts=unix_ts(raw.get("ts")),
        params=params_of(raw.get("key_params")),
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
