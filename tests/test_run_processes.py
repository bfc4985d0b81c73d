"""Every process of a run, for real: rows followed by pid and start time, their ends (a signal read from a
zombie, the engine's own child's exit status, "unknown" after the grace, an exact report replacing an
unknown end), a reused pid never taken for the old process, an observed run's process found by its
directory, and the end that turns the run red (rank_died) in its health and in the analyst's answer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engine.coherence.analysis import analyze_run
from engine.diagnosis.analyst import answer
from engine.diagnosis.digest import build_digest, digest_text
from engine.store import SCHEMA_VERSION, ProcessRow, Store, StoreReader
from engine.store.system_reads import SystemReads
from engine.system import GpuProcess, GpuReading, Sample
from engine.system.run_processes import ProcessTracker, end_reason, this_process, zombie_status

NODE = "this-node"


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts: every one is killed and reaped at its end, passed or failed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def spawn(children: list[subprocess.Popen[bytes]], code: str, **kwargs: object) -> subprocess.Popen[bytes]:
    """A Python child that prints "ready" once it has done `code`, then waits for its stdin to close."""
    script = f"{code}\nimport sys\nprint('ready', flush=True)\nsys.stdin.read()\n"
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kwargs
    )
    children.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # a known point, not a sleep
    return proc


def dead_unreaped(proc: subprocess.Popen[bytes]) -> None:
    """Wait until `proc` has ended, leaving it a zombie (its exit status still in /proc)."""
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)


def row_of(proc: subprocess.Popen[bytes], role: str, rank: int | None = None) -> ProcessRow:
    p = psutil.Process(proc.pid)
    return ProcessRow(proc.pid, p.create_time(), role, "running", " ".join(p.cmdline()), rank=rank)


def running_run(
    store: Store, name: str = "r", step: int = 7, *, source_kind: str = "carl", source_path: str | None = None
) -> int:
    run_id = store.create_run(name, source_kind=source_kind, source_path=source_path, status="running")
    store.update_run(run_id, last_step=step, last_update=time.time())
    return run_id


def processes(store: Store, run_id: int) -> list[dict]:
    return SystemReads(store.conn, SCHEMA_VERSION).run_processes(run_id)


def health(store: Store, run_id: int) -> tuple[str, list[str]]:
    with store.transaction():
        analyze_run(store, run_id)
    row = store.run(run_id)
    assert row is not None
    return row["health"], json.loads(row["health_reasons"])


def sample(*gpus: GpuReading) -> Sample:
    return Sample(t=time.time(), gpus=list(gpus))


# -- live processes ---------------------------------------------------------------------------------------


def test_a_runs_process_is_followed_with_its_memory_and_gpu_memory_from_nvmls_list(
    store: Store, children: list
) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store)
    proc = spawn(children, "x = bytearray(32 * 1024 * 1024)")
    store.system.note_processes(run_id, node, [row_of(proc, "rank", 1)])
    tracker = ProcessTracker(store)
    gpu = GpuReading(index=0, processes=[GpuProcess(proc.pid, 3 * 2**30), GpuProcess(1, 5)])
    tracker.tick(sample(gpu, GpuReading(index=1, processes=[GpuProcess(proc.pid, None)])), node)
    tracker.tick(sample(gpu), node)
    (row,) = processes(store, run_id)
    assert (row["role"], row["rank"], row["ended_at"]) == ("rank", 1, None)
    assert row["state"] in (psutil.STATUS_SLEEPING, psutil.STATUS_RUNNING)  # psutil's word for it
    assert row["rss"] > 32 * 1024 * 1024 and row["cpu"] is not None  # the second look measures the CPU
    assert (row["gpu_mem"], row["gpus"]) == (3 * 2**30, [0])
    tracker.tick(sample(), node)  # no GPU read in this sample: its GPU memory is unknown, not zero
    assert processes(store, run_id)[0]["gpu_mem"] is None
    tracker.tick(sample(GpuReading(index=0)), node)  # a GPU it holds no memory on
    assert (processes(store, run_id)[0]["gpu_mem"], processes(store, run_id)[0]["gpus"]) == (0, [])


# -- ends ---------------------------------------------------------------------------------------------------


def test_a_killed_rank_ends_with_its_signal_and_step_and_turns_the_run_red(
    store: Store, children: list
) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store, step=812)
    rank0, rank1 = spawn(children, "pass"), spawn(children, "pass")
    store.system.note_processes(run_id, node, [row_of(rank0, "rank", 0), row_of(rank1, "rank", 1)])
    tracker = ProcessTracker(store)
    tracker.tick(sample(), node)
    assert health(store, run_id)[0] == "green"
    rank1.kill()
    dead_unreaped(rank1)  # a zombie: its exit status is read from /proc
    assert zombie_status(rank1.pid) == (None, signal.SIGKILL)
    tracker.tick(sample(), node)
    reason = f"rank 1 (pid {rank1.pid}) killed by SIGKILL at step 812"
    ended = {p["rank"]: p for p in processes(store, run_id)}
    assert ended[1]["signal"] == 9 and ended[1]["end_step"] == 812 and ended[1]["end_reason"] == reason
    assert ended[1]["died"] and ended[0]["ended_at"] is None
    assert tracker.take_changed_runs() == {run_id}  # the engine analyses the run again
    level, reasons = health(store, run_id)
    assert level == "red" and reason in reasons
    # Rank 0 then fails the run for it, and exits: its own end is no death, the rank's still shows.
    store.update_run(run_id, status="failed", error="another training process died", ended_at=time.time())
    rank0.stdin.close()  # type: ignore[union-attr]
    dead_unreaped(rank0)
    tracker.tick(sample(), node)
    ended = {p["rank"]: p for p in processes(store, run_id)}
    assert (ended[0]["exit_code"], ended[0]["died"]) == (0, 0)
    level, reasons = health(store, run_id)
    assert level == "red" and reason in reasons


def test_the_engines_own_child_ends_with_its_exit_status_once_reaped(store: Store, children: list) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store, step=3)
    runner = spawn(children, "pass")
    store.system.note_processes(run_id, node, [row_of(runner, "runner")])
    tracker = ProcessTracker(store)
    runner.send_signal(signal.SIGTERM)
    runner.wait()  # reaped, as the engine's reap_children does: no zombie left to read
    tracker.child_ended(runner.pid, runner.returncode)
    tracker.tick(sample(), node)
    (row,) = processes(store, run_id)
    assert row["end_reason"] == f"the runner (pid {runner.pid}) killed by SIGTERM at step 3" and row["died"]


def test_an_end_not_known_waits_the_grace_then_is_unknown_and_an_exact_report_replaces_it(
    store: Store, children: list
) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store, step=5)
    rank = spawn(children, "pass")
    store.system.note_processes(run_id, node, [row_of(rank, "rank", 1)])
    rank.kill()
    rank.wait()  # reaped by someone else (the launcher): not a zombie, not the engine's child
    waiting = ProcessTracker(store)  # the real grace
    waiting.tick(sample(), node)
    assert processes(store, run_id)[0]["ended_at"] is None  # the launcher's report may still come
    ProcessTracker(store, grace_s=0.0).tick(sample(), node)
    (row,) = processes(store, run_id)
    assert row["end_reason"] == f"rank 1 (pid {rank.pid}) ended (exit status unknown) at step 5"
    assert row["died"]  # the run was still live when its rank vanished
    first_seen = row["ended_at"]
    # The launcher's report comes late: the exact status replaces the unknown one, the time stays.
    reason = end_reason(f"rank 1 (pid {rank.pid})", None, 9, 5)
    assert store.system.process_ended(
        row["id"], exit_code=None, signal=9, end_step=5, reason=reason, died=True
    )
    (row,) = processes(store, run_id)
    assert (row["signal"], row["end_reason"], row["ended_at"]) == (9, reason, first_seen)
    # An exact end is never overwritten.
    assert not store.system.process_ended(row["id"], exit_code=0, signal=None, end_step=5, reason="x")


def test_a_reused_pid_is_not_taken_for_the_process_that_had_it(store: Store, children: list) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store, step=2)
    other = spawn(children, "x = bytearray(16 * 1024 * 1024)")
    # The row's process had this pid before: it started well before the process holding the pid now.
    before = row_of(other, "rank", 1)
    before.started -= 100.0
    store.system.note_processes(run_id, node, [before])
    ProcessTracker(store, grace_s=0.0).tick(sample(GpuReading(0, processes=[GpuProcess(other.pid, 7)])), node)
    (row,) = processes(store, run_id)
    assert row["rss"] is None and row["gpu_mem"] is None  # nothing of the new process was taken for it
    assert row["end_reason"].endswith("ended (exit status unknown) at step 2")
    assert other.poll() is None  # the new process is untouched


def test_a_process_ending_cleanly_or_after_its_run_ended_is_no_death(store: Store, children: list) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store)
    clean, late = spawn(children, "pass"), spawn(children, "pass")
    store.system.note_processes(run_id, node, [row_of(clean, "rank", 0), row_of(late, "rank", 1)])
    tracker = ProcessTracker(store)
    clean.stdin.close()  # type: ignore[union-attr]
    dead_unreaped(clean)
    tracker.tick(sample(), node)
    store.update_run(run_id, status="finished", ended_at=time.time())
    late.kill()
    dead_unreaped(late)
    tracker.tick(sample(), node)
    ends = {p["rank"]: (p["exit_code"], p["signal"], p["died"]) for p in processes(store, run_id)}
    assert ends == {0: (0, None, 0), 1: (None, 9, 0)}
    assert health(store, run_id)[0] == "green"


def test_a_death_before_a_resume_is_an_earlier_lifes(store: Store, children: list) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store)
    old = spawn(children, "pass")
    store.system.note_processes(run_id, node, [row_of(old, "runner")])
    old.kill()
    dead_unreaped(old)
    ProcessTracker(store).tick(sample(), node)
    assert health(store, run_id)[0] == "red"
    resumed = spawn(children, "pass")  # started after the death: the run's current life
    store.system.note_processes(run_id, node, [row_of(resumed, "runner")])
    assert health(store, run_id)[0] == "green"


def test_a_process_writes_its_own_row_and_end(store: Store) -> None:
    from engine.system.run_processes import end_own, note_own

    run_id = running_run(store, step=4)
    note_own(store, run_id, [this_process("runner")])
    store.update_run(run_id, status="finished", ended_at=time.time())
    end_own(store, run_id, 0)
    (row,) = processes(store, run_id)
    assert row["pid"] == os.getpid() and row["node"] and row["role"] == "runner"
    assert (row["exit_code"], row["died"]) == (0, 0)
    assert row["end_reason"] == f"the runner (pid {os.getpid()}) exited with code 0 at step 4"


# -- observed runs ------------------------------------------------------------------------------------------


def test_an_observed_runs_process_is_found_by_its_directory_and_its_end_recorded(
    tmp_path: Path, store: Store, children: list
) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_dir = tmp_path / "runs" / "trl-run"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("")
    run_id = running_run(store, "observed", source_kind="jsonl", source_path=str(run_dir / "metrics.jsonl"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The training script: started elsewhere, writing its log inside the run's directory.
    script = spawn(children, f"log = open({str(run_dir / 'train.log')!r}, 'a')", cwd=elsewhere)
    # A reader of the run's files, and a process merely working in the directory, are not the run's.
    reader = spawn(children, f"f = open({str(run_dir / 'metrics.jsonl')!r})", cwd=elsewhere)
    in_dir = spawn(children, "pass", cwd=run_dir)
    pager = subprocess.Popen(["tail", "-f", str(run_dir / "metrics.jsonl")], cwd=run_dir)
    children.append(pager)  # type: ignore[arg-type]
    tracker = ProcessTracker(store)
    tracker.tick(sample(), node)
    found = {p["pid"]: p for p in processes(store, run_id)}
    assert set(found) == {script.pid, in_dir.pid}, found
    assert found[script.pid]["role"] == "observed" and "python" in found[script.pid]["cmdline"]
    assert reader.pid not in found and pager.pid not in found
    script.kill()
    dead_unreaped(script)
    in_dir.stdin.close()  # type: ignore[union-attr]
    dead_unreaped(in_dir)
    tracker.tick(sample(), node)
    ends = {p["pid"]: p for p in processes(store, run_id)}
    name = Path(sys.executable).name
    assert ends[script.pid]["end_reason"] == f"{name} (pid {script.pid}) killed by SIGKILL at step 7"
    assert ends[script.pid]["died"] and not ends[in_dir.pid]["died"]
    assert health(store, run_id)[0] == "red"


# -- the analyst's answer ---------------------------------------------------------------------------------


def test_the_analyst_names_the_dead_rank_and_the_digest_lists_the_processes(
    store: Store, children: list
) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store, step=12)
    rank0, rank1 = spawn(children, "pass"), spawn(children, "pass")
    store.system.note_processes(run_id, node, [row_of(rank0, "rank", 0), row_of(rank1, "rank", 1)])
    tracker = ProcessTracker(store)
    tracker.tick(sample(), node)
    rank1.kill()
    dead_unreaped(rank1)
    tracker.tick(sample(), node)
    health(store, run_id)
    reason = f"rank 1 (pid {rank1.pid}) killed by SIGKILL at step 12"
    reader = StoreReader(store.path)
    try:
        digest = build_digest(reader, run_id)
    finally:
        reader.close()
    text = digest_text(digest)
    assert "PROCESSES (1 live, 1 ended)" in text
    assert f"rank 1 pid {rank1.pid} on {NODE}: ended: {reason} (died while the run was live)" in text
    assert re.search(rf"rank 0 pid {rank0.pid} on {NODE}: (sleeping|running), cpu \d+%, rss \d", text)
    assert f"BOX rank_died (red): {reason}" in text
    said = answer(digest, "what is wrong?")
    assert f"**A process of the run died** — {reason}." in said
    assert "1 problem: A process of the run died" in said and f"health red: {reason}" in said
    assert "The engine's health check" not in said  # the same reason is not a second finding


# -- the launcher's report of its ranks ---------------------------------------------------------------------

# What torch's elastic agent printed when rank 1 of two was killed (carl train --processes 2 on this machine,
# torch 2.13): its warning and error lines, then accelerate's traceback with the agent's summary.
AGENT_REPORT = """\
[rank0]:[W1202 01:21:38.266794486 reducer.cpp:1529] Warning: find_unused_parameters=True was specified
carl train: another training process died or stopped answering after step 2 (Connection reset by peer)
W1202 01:21:38.550000 17665 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process {rank0} \
closing signal SIGTERM
E1202 01:21:38.616000 17665 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) \
local_rank: 1 (pid: {rank1}) of binary: /usr/bin/python3
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
engine.training FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-02_01:21:38
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: {rank0})  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID {rank0}
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_01:21:38
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: {rank1})  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID {rank1}
=======================================================
"""


def test_the_launchers_report_is_copied_on_and_records_each_ranks_end(tmp_path: Path) -> None:
    from engine.training.rank_processes import LauncherReport

    home = tmp_path / "home"
    home.mkdir()
    with Store(home / "carl.db") as store:
        node = store.system.node(NODE, host=NODE, via="local")
        run_id = running_run(store, step=812)
        rows = [
            ProcessRow(4241, 1000.0, "rank", "running", rank=0),
            ProcessRow(4242, 1000.0, "rank", "running", rank=1),
        ]
        store.system.note_processes(run_id, node, rows)
    report_text = AGENT_REPORT.format(rank0=4241, rank1=4242).encode()
    read_end, write_end = os.pipe()
    copied = tmp_path / "copied"
    with open(read_end, "rb") as stream, copied.open("wb") as out:
        report = LauncherReport(stream, home, run_id, out=out).start()
        with open(write_end, "wb") as pipe:
            for i in range(0, len(report_text), 97):  # in pieces that split lines, as a pipe delivers them
                pipe.write(report_text[i : i + 97])
                pipe.flush()
        report.join(30.0)
    assert copied.read_bytes() == report_text  # every byte on to our stderr
    with Store(home / "carl.db") as store:
        ends = {p["rank"]: p for p in processes(store, run_id)}
        assert ends[1]["end_reason"] == "rank 1 (pid 4242) killed by SIGKILL at step 812" and ends[1]["died"]
        assert (
            ends[0]["end_reason"]
            == "rank 0 (pid 4241) stopped by the launcher (SIGTERM) after rank 1 failed at step 812"
        )
        assert (ends[0]["signal"], ends[0]["died"]) == (15, 0)
        level, reasons = health(store, run_id)
        assert level == "red" and "rank 1 (pid 4242) killed by SIGKILL at step 812" in reasons


def test_a_command_line_is_stored_without_the_secrets_it_names(store: Store) -> None:
    node = store.system.node(NODE, host=NODE, via="local")
    run_id = running_run(store)
    argv = "python train.py --wandb-key sk-ant-api03-abcdefghijklmnopqrstuvwx --lr 1e-5"
    store.system.note_processes(run_id, node, [ProcessRow(4242, 1.0, "observed", "running", argv)])
    (row,) = processes(store, run_id)
    assert "sk-ant-api03-abcdefghijklmnopqrstuvwx" not in row["cmdline"] and "--lr 1e-5" in row["cmdline"]
