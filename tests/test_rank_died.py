"""The done-when of a rank's death, for real: the engine starts a run of two ranks (`processes: 2`, the tiny
model on CPU, gloo), records every process of it, and `kill -9` on rank 1 turns the run red with "rank 1
(pid N) killed by SIGKILL at step S", still shown once rank 0 has failed the run, with one alert to a local
webhook."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from support import kill_runs
from test_alerts import Hook
from test_training_distributed import write_config

from engine import paths
from engine.control import start_engine, stop_engine
from engine.store import SCHEMA_VERSION, Store
from engine.store.system_reads import SystemReads

pytestmark = pytest.mark.slow
T = TypeVar("T")


def wait_for(check: Callable[[], T], *, timeout: float = 300.0, what: str = "condition") -> T:
    """Poll a read of the store until it holds (two ranks on a shared CPU take their time)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def test_kill_9_on_rank_1_turns_the_run_red_with_the_rank_the_signal_and_the_step_and_alerts_once(
    tmp_path: Path, tiny_model: Path
) -> None:
    home = tmp_path / "carl"
    home.mkdir()
    hook = Hook()
    (home / "engine.toml").write_text(f'[alerts]\nwebhook = "{hook.url}"\n\n[system]\ninterval_s = 0.5\n')
    config = write_config(
        tmp_path / "carl.yaml", tiny_model, name="dp", max_steps=2000, save_steps=1000, processes=2
    )
    store = Store(paths.db_path(home))
    try:
        start_engine(home)
        store.enqueue_command("train", {"config": str(config)})
        run_id = wait_for(lambda: store.run_id_by_name("dp"), what="the run")
        reads = SystemReads(store.conn, SCHEMA_VERSION)

        def ranks() -> dict[int, dict[str, Any]]:
            return {p["rank"]: p for p in reads.run_processes(run_id) if p["role"] == "rank"}

        wait_for(lambda: (store.run(run_id)["last_step"] or 0) >= 2 and len(ranks()) == 2, what="step 2")
        rank1 = ranks()[1]
        victim = psutil.Process(rank1["pid"])
        assert abs(victim.create_time() - rank1["started"]) < 1.0 and "engine.training" in victim.cmdline()
        roles = sorted(p["role"] for p in reads.run_processes(run_id))
        assert roles == ["launcher", "launcher", "rank", "rank"]  # carl train, accelerate's launcher, 2 ranks
        # The engine follows them: memory and CPU of each, sampled.
        wait_for(lambda: all(p["rss"] for p in reads.run_processes(run_id)), what="the processes sampled")
        victim.send_signal(signal.SIGKILL)

        pattern = rf"rank 1 \(pid {rank1['pid']}\) killed by SIGKILL at step (\d+)"

        def red_reason() -> str | None:
            run = store.run(run_id)
            reasons = json.loads(run["health_reasons"] or "[]")
            found = [r for r in reasons if re.fullmatch(pattern, r)]
            return found[0] if run["health"] == "red" and found else None

        reason = wait_for(red_reason, what="the run red with the rank's death")
        step = int(re.fullmatch(pattern, reason).group(1))  # type: ignore[union-attr]
        assert 2 <= step <= (store.run(run_id)["last_step"] or 0)
        # Rank 0 fails the run for it; every process ends; the rank's death still shows.
        wait_for(lambda: store.run(run_id)["status"] == "failed", what="the run failed")
        wait_for(lambda: not store.system.open_processes(run_id=run_id), what="every process ended")
        ends = {(p["role"], p["rank"]): p for p in reads.run_processes(run_id)}
        assert ends[("rank", 1)]["signal"] == signal.SIGKILL and ends[("rank", 1)]["died"]
        assert sum(p["died"] for p in ends.values()) == 1  # rank 0 and the launchers ended, not died
        assert store.run(run_id)["error"].startswith("another training process died or stopped answering")
        # The engine looks again after the last end (two samples later, and one analysis after that).
        last_end = max(p["seen_at"] for p in reads.run_processes(run_id))
        wait_for(
            lambda: reads.now() and max(s["t"] for s in reads.now().values()) > last_end + 2.5, what="samples"
        )
        assert red_reason() == reason
        wait_for(lambda: hook.bodies("rank_died"), what="the alert")
        assert [b["reason"] for b in hook.bodies("rank_died")] == [reason]  # once
        assert hook.bodies("rank_died")[0]["level"] == "red"
        # The launcher's own report went on to the run's log, as before.
        logs = "".join(p.read_text() for p in paths.logs_dir(home).glob("train-*.log"))
        assert f"failed (exitcode: -9) local_rank: 1 (pid: {rank1['pid']})" in logs
    finally:
        stop_engine(home, timeout=10.0)
        kill_runs(home)
        for p in psutil.process_iter(["cmdline"]):
            if str(home) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                p.kill()
        store.close()
        hook.close()
