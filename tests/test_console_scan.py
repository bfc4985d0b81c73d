"""The engine's console job on a real store and real files: which files are a run's console (a training
process's log once its run appears, ranks included; the logs named for an observed source's runs, those to
come too), the scan a bounded batch at a time that resumes after a restart and starts over on truncation or
rotation, the `console_error` health rule (red or yellow, with the line), and the diagnosis digest and the
offline analyst answering "why did it crash?" with it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, end_all, wait_for

from engine.coherence.analysis import analyze_run
from engine.console.console_job import ConsoleJob, attach_logs
from engine.console.scan import scan_console
from engine.diagnosis.analyst import answer
from engine.diagnosis.digest import build_digest, digest_text
from engine.observe.ingest import import_source, register_source
from engine.store import Store, StoreReader
from engine.store.system_reads import SystemReads
from engine.system.box_health import CRASH_QUIET_S, box_flags

TRACEBACK = (
    b"Traceback (most recent call last):\n"
    b'  File "train.py", line 12, in <module>\n'
    b"    trainer.train()\n"
    b"RuntimeError: CUDA error: an illegal memory access was encountered\n"
)
OOM = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.1 GiB total)\n"


def steps(first: int, n: int) -> bytes:
    return b"".join(f"step {i} loss={1 / (i + 1):.4f}\n".encode() for i in range(first, first + n))


def console(store: Store, run_id: int) -> dict:
    (found,) = [c for c in store.system.consoles() if c["run_id"] == run_id]
    return found


def findings(store: Store, run_id: int) -> list[tuple[str, str, int]]:
    """(kind, line, line number) of the run's findings, oldest first."""
    reads = SystemReads(store.conn, store.conn.execute("PRAGMA user_version").fetchone()[0])
    return [(f["kind"], f["line"], f["line_no"]) for f in reversed(reads.findings(run_id))]


def flags(store: Store, run_id: int, status: str, now: float) -> list[tuple[str, str, str]]:
    version = store.conn.execute("PRAGMA user_version").fetchone()[0]
    return [tuple(f) for f in box_flags(SystemReads(store.conn, version), run_id, status, now)]


# -- the scan ---------------------------------------------------------------------------------------------


def test_a_console_is_scanned_in_batches_and_resumes_where_it_stopped(store: Store, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(steps(0, 3000) + TRACEBACK + steps(3000, 10) + OOM)  # the traceback at line 3001
    run_id = store.create_run("r", source_kind="carl")
    store.system.add_console(run_id, str(log), "train")
    batches = 0
    while (c := console(store, run_id))["scanned"] < log.stat().st_size:
        scan_console(store, c, budget=8 * 1024)  # a few KB a batch: the traceback is cut across batches
        batches += 1
    assert batches > 5
    assert findings(store, run_id) == [
        ("traceback", "RuntimeError: CUDA error: an illegal memory access was encountered", 3001),
        ("oom", OOM.decode().strip(), 3015),
    ]
    # A restart (a new job, the position from the store) reads nothing again and finds nothing twice.
    job = ConsoleJob(store)
    assert job.tick() == set() and len(findings(store, run_id)) == 2
    with open(log, "ab") as f:
        f.write(steps(3010, 5) + TRACEBACK)
    job.next_scan = 0.0
    assert job.tick() == {run_id}  # the runs to analyse again
    assert findings(store, run_id)[-1] == ("traceback", TRACEBACK.decode().splitlines()[-1], 3021)


def test_a_traceback_being_written_is_found_whole_once_it_ends(store: Store, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(steps(0, 5) + TRACEBACK[:70])  # the frames, not the exception line yet
    run_id = store.create_run("r", source_kind="carl")
    store.system.add_console(run_id, str(log), "user")
    scan_console(store, console(store, run_id))
    assert findings(store, run_id) == [] and console(store, run_id)["scanned"] == len(steps(0, 5))
    with open(log, "ab") as f:
        f.write(TRACEBACK[70:])
    scan_console(store, console(store, run_id))
    assert findings(store, run_id) == [
        ("traceback", "RuntimeError: CUDA error: an illegal memory access was encountered", 6)
    ]

    # A file that stopped growing with a traceback whose exception line never came: taken as it is.
    with open(log, "ab") as f:
        f.write(TRACEBACK[:40])
    scan_console(store, console(store, run_id))
    assert len(findings(store, run_id)) == 1
    scan_console(store, console(store, run_id), final=True)
    assert findings(store, run_id)[-1] == (
        "traceback",
        "Traceback (its exception line is not in the file)",
        10,
    )


def test_truncation_and_rotation_start_the_scan_over(store: Store, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(steps(0, 100) + TRACEBACK)
    run_id = store.create_run("r", source_kind="carl")
    store.system.add_console(run_id, str(log), "train")
    scan_console(store, console(store, run_id))
    log.write_bytes(steps(0, 2) + OOM)  # truncated, then written again
    result = scan_console(store, console(store, run_id))
    assert result.restarted == "truncated" and findings(store, run_id)[-1] == ("oom", OOM.decode().strip(), 3)
    log.rename(tmp_path / "train.log.1")
    log.write_bytes(TRACEBACK.replace(b"RuntimeError", b"ValueError"))  # a new file: another inode
    result = scan_console(store, console(store, run_id))
    assert result.restarted == "replaced (rotated)"
    assert findings(store, run_id)[-1][:2] == (
        "traceback",
        "ValueError: CUDA error: an illegal memory access was encountered",
    )


def test_a_console_that_is_a_fifo_or_missing_is_one_line_in_the_log_and_nothing_else(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    run_id = store.create_run("r", source_kind="carl")
    store.system.add_console(run_id, str(fifo), "user")
    store.system.add_console(run_id, str(tmp_path / "later.log"), "user")
    job = ConsoleJob(store)
    with caplog.at_level("INFO", logger="carl.engine.console"):
        for _ in range(3):
            job.next_scan = 0.0
            assert job.tick() == set()  # never a hang on the FIFO
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"console of run {run_id}: {fifo}: a FIFO (named pipe), not a log file",
        f"console of run {run_id}: {tmp_path / 'later.log'}: not there (yet)",
    ]


# -- which files are a run's console ------------------------------------------------------------------------

# A training process as far as the console job cares: it opens a run with its pid (the runner does), or, as
# `carl train --processes N` does, starts a process that does (rank 0 stands for the run).
OPENS_A_RUN = """
import os, subprocess, sys
from engine.store import Store
db, ranks = sys.argv[1], sys.argv[2] == "ranks"
if ranks:
    rank0 = subprocess.Popen([sys.executable, "-c", sys.argv[3], db])
    sys.stdin.readline()
    rank0.kill()
else:
    with Store(db) as store:
        store.update_run(store.create_run("ours", source_kind="carl"), pid=os.getpid())
    print("opened", flush=True)
    sys.stdin.readline()
"""
RANK0 = """
import os, sys, time
from engine.store import Store
with Store(sys.argv[1]) as store:
    store.update_run(store.create_run("ranked", source_kind="carl"), pid=os.getpid())
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [False, True])
def test_a_training_process_s_log_becomes_its_run_s_console(tmp_path: Path, ranks: bool) -> None:
    db = tmp_path / "carl.db"
    log = tmp_path / "logs" / "train-1.log"
    log.parent.mkdir()
    log.write_bytes(steps(0, 3) + TRACEBACK)
    with Store(db) as store:
        job = ConsoleJob(store)
        argv = [sys.executable, "-c", OPENS_A_RUN, str(db), "ranks" if ranks else "runner", RANK0]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            job.expect_train(proc.pid, log)
            run_id = wait_for(lambda: store.conn.execute("SELECT max(id) FROM runs").fetchone()[0], proc=proc)
            wait_for(lambda: (job.tick(), not job.expected)[1], what="the run's console linked", proc=proc)
            assert [(c["path"], c["kind"]) for c in store.system.consoles()] == [(str(log), "train")]
            assert console(store, run_id)["run_id"] == run_id
            job.next_scan = 0.0
            job.tick()
            assert findings(store, run_id)[0][0] == "traceback"
        finally:
            end_all([proc])


def test_logs_named_for_a_source_are_the_console_of_its_runs_to_come(store: Store, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    log = tmp_path / "train.log"
    source_id = register_source(store, metrics, follow=True)
    assert attach_logs(store, [source_id], [str(log)]) == []  # no run yet
    job = ConsoleJob(store)
    job.tick()
    assert store.system.consoles() == []
    metrics.write_text('{"step": 1, "loss": 0.5}\n')
    run_ids = import_source(store, source_id, finish=False).run_ids
    job.next_link = 0.0
    job.tick()
    assert [(c["run_id"], c["path"], c["kind"]) for c in store.system.consoles()] == [
        (run_ids[0], str(log), "user")
    ]


# -- health and diagnosis -----------------------------------------------------------------------------------


def test_console_error_is_red_or_yellow_with_the_line_that_says_why(store: Store, tmp_path: Path) -> None:
    log = tmp_path / "train-20250101-120000-7.log"
    log.write_bytes(steps(0, 811) + TRACEBACK)
    run_id = store.create_run("grpo", source_kind="jsonl")
    store.system.add_console(run_id, str(log), "user")
    scan_console(store, console(store, run_id))
    reason = (
        "traceback in the console: RuntimeError: CUDA error: an illegal memory access was encountered "
        "(train-20250101-120000-7.log line 812)"
    )
    found_at = store.conn.execute("SELECT t FROM console_findings").fetchone()[0]
    store.conn.execute("UPDATE runs SET last_update=? WHERE id=?", (found_at - 5, run_id))
    # Running, and the run wrote nothing since: yellow at first, red once it has been quiet for a while.
    assert flags(store, run_id, "running", found_at + 1) == [("yellow", "console_error", reason)]
    assert flags(store, run_id, "running", found_at + CRASH_QUIET_S) == [("red", "console_error", reason)]
    # Rows after it: the run goes on, the traceback did not end it.
    store.conn.execute("UPDATE runs SET last_update=? WHERE id=?", (found_at + 3, run_id))
    assert flags(store, run_id, "running", found_at + 600)[0][0] == "yellow"
    assert flags(store, run_id, "failed", found_at)[0][0] == "red"
    assert flags(store, run_id, "finished", found_at + 600)[0][0] == "yellow"
    with open(log, "ab") as f:
        f.write(OOM)
    scan_console(store, console(store, run_id))
    assert flags(store, run_id, "finished", found_at)[0][:2] == ("red", "console_error")  # OOM: always red
    # Through the run's analysis: a reason of its health.
    with store.transaction():
        health = analyze_run(store, run_id)
    assert health is not None and "console_error" in health.alerting()
    assert any(
        r.startswith("CUDA out of memory in the console: torch.OutOfMemoryError") for r in health.reasons
    )


def test_the_digest_carries_the_newest_finding_and_the_analyst_answers_why_it_crashed(
    store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(steps(0, 40) + TRACEBACK)
    run_id = store.create_run("grpo", source_kind="carl")
    store.update_run(run_id, status="failed", error="exit status 1", last_step=40)
    store.system.add_console(run_id, str(log), "train")
    scan_console(store, console(store, run_id))
    with store.transaction():
        analyze_run(store, run_id)
    reader = StoreReader(tmp_path / "carl.db")
    try:
        digest = build_digest(reader, run_id)
    finally:
        reader.close()
    assert digest["console"]["files"] == [{"file": "train.log", "kind": "train"}]
    (newest,) = digest["console"]["findings"]
    assert newest["kind"] == "traceback" and newest["line_no"] == 41
    text = digest_text(digest)
    assert "CONSOLE (the run's stdout/stderr: train.log [train])" in text
    assert "traceback in train.log line 41" in text and "an illegal memory access" in text
    reply = answer(digest, "why did it crash?")
    first = reply.split("\n\n")[1]  # the status topic's direct answer leads
    assert (
        "Its console's last error: `RuntimeError: CUDA error: an illegal memory access was encountered`"
        in first
    )
    assert "(train.log line 41)" in first
    assert "🔴 **A traceback in the console**" in reply and "t jumps to the traceback" in reply


def test_a_console_error_is_alerted_once(tmp_path: Path, store: Store) -> None:
    """Through [alerts] (a command, the JSON on its stdin): once for the run, though it is judged again and
    the console gets another traceback."""
    import json

    from test_alerts import judge, pump

    from engine.alerts import Alerts

    home = Path(store.path).parent
    out = tmp_path / "alerts.jsonl"
    script = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')"
    (home / "engine.toml").write_text(
        f"[alerts]\ncommand = {json.dumps([sys.executable, '-c', script, str(out)])}\n"
    )
    log = tmp_path / "train.log"
    log.write_bytes(steps(0, 3) + TRACEBACK)
    run_id = store.create_run("grpo", source_kind="carl")
    store.update_run(run_id, status="failed")
    store.system.add_console(run_id, str(log), "train")
    scan_console(store, console(store, run_id))
    alerts = Alerts(store, home)
    try:
        alerts.runs_judged(judge(store, run_id))
        sent = pump(alerts, lambda: out.exists() and out.read_text(), "the alert")
        with open(log, "ab") as f:
            f.write(OOM)
        scan_console(store, console(store, run_id))
        alerts.runs_judged(judge(store, run_id))
        for _ in range(20):
            alerts.tick()
    finally:
        alerts.close()
    (alert,) = [json.loads(line) for line in out.read_text().splitlines() if line]
    assert (alert["cause"], alert["level"]) == ("console_error", "red") and alert["run"] == "grpo"
    assert alert["reason"].startswith("traceback in the console: RuntimeError: CUDA error") and sent
