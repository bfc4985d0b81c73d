"""A poison input never stops the engine (issue 22 §1): one bad hook spool file is moved aside with its
reason and the others are stored; each job of the engine's tick is isolated, so one that raises (a
real fault, not a stand-in) still lets the tick reap children and ingest the other sources."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine import paths
from engine.control.pidfile import PidRecord
from engine.daemon.loop import Engine
from engine.observe import register_source
from engine.store import Store
from engine.trajectories.capture import recorder
from engine.trajectories.capture.hooks import spool_dir
from engine.trajectories.capture.live import ingest_spool
from engine.trajectories.trajectory_settings import load as load_trajectory_config


def _payloads(session: str, prompt: bytes) -> list[bytes]:
    """A turn's payloads as the recorder gets them on stdin (bytes: a lone surrogate's escape stays)."""
    base = f'"session_id": "{session}", "cwd": "/w/app", "transcript_path": "/w/t.jsonl"'.encode()
    return [
        b'{"hook_event_name": "SessionStart", "source": "startup", "model": "claude-sonnet-4-5", '
        + base
        + b"}",
        b'{"hook_event_name": "UserPromptSubmit", "prompt": "' + prompt + b'", ' + base + b"}",
        b'{"hook_event_name": "PostToolUse", "tool_name": "Read", "tool_use_id": "toolu_1", '
        b'"tool_input": {"file_path": "/w/app/a.py"}, "tool_response": {"type": "text"}, ' + base + b"}",
        b'{"hook_event_name": "Stop", "stop_hook_active": false, ' + base + b"}",
    ]


def test_a_poison_spool_file_is_quarantined_and_the_others_are_stored(tmp_path: Path) -> None:
    """§1: a hook payload with a lone surrogate in `session_id` failed every engine tick until the file
    was removed by hand. Now it, a payload nested too deep to read and a FIFO in the spool each go to
    spool/bad with their reason, a lone surrogate in a prompt is stored as U+FFFD, and the rest is
    stored and assembled in the same pass."""
    home = tmp_path / "carl"
    for raw in _payloads("good", b"fix the failing test"):
        recorder.record(raw, home)
    recorder.record(_payloads("bad\\ud800", b"x")[1], home)  # the recorder keeps it as it came
    for raw in _payloads("other", b"half \\udcff of a pair"):
        recorder.record(raw, home)
    folder = spool_dir(home)
    deep = b'{"session_id": "deep", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (folder / "99999999999999999990-1-1-dddddd.json").write_bytes(
        b'{"received_at": 5.0, "payload": ' + deep + b"}"
    )
    os.mkfifo(folder / "99999999999999999991-1-1-eeeeee.json")  # read, it would wait for a writer for ever

    with Store(paths.db_path(home)) as store:
        result = ingest_spool(store, home, load_trajectory_config(home))
        assert result.payloads == 8 and result.sessions == 2
        assert sorted(os.listdir(folder)) == []
        prompts = dict(store.conn.execute("SELECT session_id, prompt FROM trajectories"))
    assert prompts == {"good": "fix the failing test", "other": "half \ufffd of a pair"}
    assert len(os.listdir(home / "spool" / "bad")) == 3
    log = (home / "logs" / "hook-errors.log").read_text()
    for why in ("session_id holds a lone surrogate", "nested too deeply", "not a regular file"):
        assert why in log, log


def _jsonl(path: Path, steps: range) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps({"step": s, "loss": 1 / (s + 1), "reward": 0.5}) + "\n" for s in steps)


def test_a_job_that_raises_costs_only_itself(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """§1: one job of the tick raising (here the hook spool, which is a file where its folder should be,
    and a followed source that became a directory) used to end the whole tick: no children reaped, no
    eval finished, the sources after it never read. Now the other jobs run in the same tick, the failure
    is logged once while it repeats, retried with backoff, and the job works again once it is fixed."""
    home = tmp_path / "carl"
    (home / "spool").mkdir(parents=True)
    (home / "spool" / "hooks").write_text("a file where the spool folder should be")
    good, corrupt = tmp_path / "good.jsonl", tmp_path / "corrupt.jsonl"
    _jsonl(good, range(5))
    _jsonl(corrupt, range(5))
    caplog.set_level(logging.INFO, logger="carl.engine")
    with Store(paths.db_path(home)) as store:
        register_source(store, str(corrupt), follow=True)
        register_source(store, str(good), follow=True)
        corrupt.unlink()
        corrupt.mkdir()  # reading it fails on every try
        engine = Engine(store, home, PidRecord(os.getpid(), time.time(), None))

        trained = subprocess.Popen([sys.executable, "-c", "pass"])  # a training run that has ended
        verdict = json.dumps({"passed": True, "reasons": ["held-out reward up"]})
        eval_id = store.enqueue_command("eval", {"run": "x"})
        assert [c["id"] for c in store.claim_commands("engine")] == [eval_id]
        eval_log = tmp_path / "eval.log"
        with eval_log.open("w") as out:
            evaluation = subprocess.Popen([sys.executable, "-c", f"print({verdict!r})"], stdout=out)
        trained.wait()
        evaluation.wait()
        engine.children.append(trained)
        engine.evals.append((evaluation, eval_id, eval_log))

        engine.tick()
        assert engine.children == [] and engine.evals == []  # reaped, in the tick the spool job failed
        state, result = store.conn.execute(
            "SELECT state, result FROM commands WHERE id=?", (eval_id,)
        ).fetchone()
        assert (state, result) == ("done", "eval passed: held-out reward up")
        assert (
            store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 10
        )  # the good source: 5 steps, 2 keys
        for _ in range(3):
            engine.tick()
        failures = [
            r.getMessage() for r in caplog.records if r.getMessage().startswith("trajectories failed")
        ]
        assert len(failures) == 1 and "NotADirectoryError" in failures[0], failures  # once, not per tick
        assert engine.jobs.backoff.get("trajectories") is not None

        (home / "spool" / "hooks").unlink()
        spool_dir(home).mkdir()
        for raw in _payloads("after", b"now it works"):
            recorder.record(raw, home)
        deadline = time.monotonic() + 10
        while engine.jobs.backoff.get("trajectories") is not None:
            assert time.monotonic() < deadline, "the spool job was never tried again"
            engine.tick()
            time.sleep(0.05)
        assert "trajectories works again" in caplog.text
        assert store.conn.execute("SELECT count(*) FROM trajectories").fetchone()[0] == 1
