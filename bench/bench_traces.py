"""Rollouts from a 100,000-row Trackio traces table: import rows/s, and the rollouts viewer's scroll p95.

The project is written once by Trackio itself (`trackio.log({"rollouts": [trackio.Trace(...)]}, step=...)`,
1,000 steps of 100 traces shaped as TRL's async GRPO logs them: a system and a user message, the completion,
the sample's rewards, advantage, group and policy version) and cached in bench/out/traces-100k/. Then, in one
run:

- import: `carl observe` of the project into a fresh store, every trace a rollout (engine/observe/
  trackio_traces.py): rows/s, against two baselines measured in the same run: the bare read of the same
  table (SQLite and the JSON of each trace's messages and metadata, nothing stored), and our veRL dump
  reader importing the same 100,000 samples written as veRL's `{step}.jsonl` files (another rollouts source,
  the same store path);
- scroll: `carl-tui` on a real pty at 160×50 (bench/bench_rollouts_view.py's timing: a key's event to the end
  of the refresh that shows its move), the viewer (`R`) listing every step (`a`), 200 keys; against the same
  viewer on 100,000 rollouts of the shape bench_rollouts_view.py builds (synthetic rows, no tracker). Goal:
  p95 <= 50 ms in the app, as for the million.

    python bench/bench_traces.py      # builds the project once (about four minutes)
"""

from __future__ import annotations

import compileall
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_rollouts_view as view  # noqa: E402
from harness import OUT, ROOT, PtyApp, percentile  # noqa: E402

ROWS = 100_000
PER_STEP = 100
RUN = "grpo-100k"
KEYS = 200
WRITER = """
import os, random, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import trackio
WORDS = %r
rng = random.Random(0)
trackio.init(project="traces", name=%r, auto_log_cpu=False, auto_log_gpu=False)
for step in range(%d):
    traces = []
    for i in range(%d):
        prompt = "prompt " + str(i // 8) + ": " + " ".join(rng.choices(WORDS, k=24))
        completion = " ".join(rng.choices(WORDS, k=40))
        reward = rng.random()
        traces.append(trackio.Trace(
            messages=[{"role": "system", "content": "Answer."}, {"role": "user", "content": prompt},
                      {"role": "assistant", "content": completion}],
            metadata={"reward": reward, "reward_std": 0.3, "rewards/task": reward, "rewards/format": 1.0,
                      "advantage": rng.gauss(0, 1), "group_id": step * 100 + i // 8, "model_version": step,
                      "prompt_tokens": 30, "completion_tokens": rng.randrange(1, 512)},
        ))
    trackio.log({"rollouts": traces}, step=step)
trackio.finish()
"""


def build_project(folder: Path) -> Path:
    """The Trackio project of ROWS traces, written by trackio in its own process; built once, cached."""
    db = folder / "traces.db"
    marker = folder / f"built-{ROWS}"
    if marker.exists() and db.exists():
        return db
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.perf_counter()
    code = WRITER % (view.WORDS, RUN, ROWS // PER_STEP, PER_STEP)
    env = {**os.environ, "TRACKIO_DIR": str(folder)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=3600, stdout=subprocess.DEVNULL)
    shutil.rmtree(folder / "traces", ignore_errors=True)  # Trackio's session files for the Hub: not read
    conn = sqlite3.connect(db)
    try:
        written = conn.execute("SELECT count(*) FROM traces").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    if written != ROWS:
        raise RuntimeError(f"trackio wrote {written:,} traces, {ROWS:,} logged")
    marker.touch()
    print(f"  wrote {ROWS:,} traces with trackio in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return db


def bare_read(db: Path) -> float:
    """Rows/s of reading the traces table and parsing each trace's JSON, storing nothing."""
    started = time.perf_counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    count = 0
    for messages, metadata in conn.execute("SELECT messages, metadata FROM traces ORDER BY rowid"):
        json.loads(messages)
        json.loads(metadata)
        count += 1
    conn.close()
    assert count == ROWS
    return count / (time.perf_counter() - started)


def import_traces(db: Path, home: Path) -> float:
    """Rows/s of `carl observe` on the project into a fresh store."""
    from engine.observe import observe
    from engine.store import Store

    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    with Store(home / "carl.db") as store:
        started = time.perf_counter()
        _, result = observe(store, db)
        seconds = time.perf_counter() - started
        count = store.conn.execute("SELECT count(*) FROM rollouts").fetchone()[0]
    if count != ROWS or result.bad_lines:
        raise RuntimeError(f"{count:,} rollouts imported, {result.bad_lines} bad lines; {ROWS:,} expected")
    return ROWS / seconds


def import_verl_dump(db: Path, work: Path) -> float:
    """Rows/s of our veRL dump reader on the same samples, written as veRL's `{step}.jsonl` files."""
    from engine.observe import ingest_source, register_source
    from engine.store import Store

    dump = work / "verl_dump"
    dump.mkdir()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    files: dict[int, list[str]] = {}
    for step, messages, metadata in conn.execute(
        "SELECT step, messages, metadata FROM traces ORDER BY rowid"
    ):
        chat, meta = json.loads(messages), json.loads(metadata)
        line = {
            "input": chat[1]["content"],
            "output": chat[2]["content"],
            "score": meta["reward"],
            "step": step,
        }
        files.setdefault(step, []).append(json.dumps(line))
    conn.close()
    for step, lines in files.items():
        (dump / f"{step}.jsonl").write_text("\n".join(lines) + "\n")
    with Store(work / "verl.db") as store:
        started = time.perf_counter()
        source_id = register_source(store, dump, follow=False, kind="rollouts-verl")
        while not ingest_source(store, source_id, max_rows=1_000_000, max_seconds=60).caught_up:
            pass
        seconds = time.perf_counter() - started
        assert store.conn.execute("SELECT count(*) FROM rollouts").fetchone()[0] == ROWS
    return ROWS / seconds


def scroll_p95(home: Path, run: str, label: str) -> list[float]:
    """The in-app key-to-screen times of 200 keys in the viewer listing every step of `run`."""
    log = OUT / f"traces-view-{label}.log"
    argv = [sys.executable, "-c", view.TIMED_APP, str(log), "--home", str(home), "--no-engine"]
    app = PtyApp(argv, env={"TEXTUAL_ANIMATIONS": "none", "PYTHONPATH": str(ROOT)}).start()
    keys = view.key_sequence(KEYS)
    try:
        app.wait_for(lambda t: run in t and "Quit" in t, timeout=60)
        app.send(b"R")
        app.wait_for(lambda t: f"row 1 of {PER_STEP}" in t and "loading…" not in t, timeout=60)
        app.send(b"a")  # every step
        app.wait_for(lambda t: f"row 1 of {ROWS:,}" in t and "loading…" not in t, timeout=60)
        app.pump(0.5)
        view.scroll(app, keys)
        app.pump(0.5)
    finally:
        app.stop()
    times = [float(line) / 1000 for line in log.read_text().split()]
    if len(times) != KEYS:
        raise RuntimeError(f"{len(times)} keys timed in the app, {KEYS} sent")
    return times


def main() -> None:
    db = build_project(OUT / "traces-100k")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bare = bare_read(db)
        rate = import_traces(db, OUT / "traces-100k-home")
        verl = import_verl_dump(db, work)
    print(
        f"traces_import_rows_per_s={rate:,.0f} baseline_bare_read_rows_per_s={bare:,.0f}"
        f" ratio={rate / bare:.3f} baseline_verl_dump_import_rows_per_s={verl:,.0f}"
        f" ratio={rate / verl:.2f} rows={ROWS:,}"
    )
    # the viewer's baseline: bench_rollouts_view's rows, 100,000 of them (its cursor read from "of 100,000")
    view.ROWS, view.PER_STEP = ROWS, PER_STEP
    view.ROW = re.compile(r"row ([\d,]+) of 100,000")
    baseline_home = OUT / "rollouts-100k"
    view.build_store(baseline_home)
    for package in ("carl_tui", "engine", "widgets", "themes"):  # as installed (bench/bench_tui.py says why)
        compileall.compile_dir(ROOT / package, quiet=1)
    traces = scroll_p95(OUT / "traces-100k-home", RUN, "traces")
    baseline = scroll_p95(baseline_home, "bench-rollouts", "synthetic")
    p95, base95 = percentile(traces, 95) * 1000, percentile(baseline, 95) * 1000
    print(
        f"traces_viewer_scroll_100k_in_app_p50_ms={percentile(traces, 50) * 1000:.1f} p95_ms={p95:.1f}"
        f" baseline_synthetic_100k_p50_ms={percentile(baseline, 50) * 1000:.1f} p95_ms={base95:.1f}"
        f" ratio={p95 / base95:.2f} goal_p95<={view.GOAL_MS:.0f} {'OK' if p95 <= view.GOAL_MS else 'MISSED'}"
    )


if __name__ == "__main__":
    random.seed(0)
    main()
