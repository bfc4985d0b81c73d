"""How long command 1's demo takes, from `carl demo` to its stored eval, idle and busy.

Each round starts the whole demo headless in a fresh `$CARL_HOME` (the engine, the tiny model built from
scratch, the SFT warm-up, GRPO with the cascade, the end-of-run eval, the agents plane beside it), exactly as
`carl-tui --demo` does without the screen, and reads its store every half second for the milestones a user
sees: the run's first stage, its first step, the warm-up's end, the gate opening, `demo finished`, the eval.
A busy round runs `--hog` processes that spin on the CPU beside it (what a shared box is: other jobs on the
same cores). Both rounds run in one invocation, so their figures share the machine's state; the load average
is printed with each.

    python bench/bench_demo.py                     # an idle round, then a busy one (2 spinning processes)
    python bench/bench_demo.py --rounds busy --hog 2
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 3600.0


def spin() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def query(db: Path, sql: str) -> list[tuple]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the schema is being made
        return []
    finally:
        conn.close()


def one_round(hog: int) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(prefix="carl-bench-demo-"))
    env = {**os.environ, "CARL_HOME": str(home), "PYTHONPATH": str(ROOT)}
    db = home / "carl.db"
    hogs = [spin() for _ in range(hog)]
    marks: dict[str, float] = {}
    stages: list[tuple[float, str]] = []
    loads: list[float] = []
    started = time.monotonic()
    try:
        subprocess.run(
            [sys.executable, "-m", "engine.cli", "demo"],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        marks["queued"] = time.monotonic() - started
        while time.monotonic() - started < LIMIT_S:
            now = time.monotonic() - started
            loads.append(os.getloadavg()[0])
            run = query(db, "SELECT id, status, last_step, config FROM runs WHERE name='demo'")
            if run:
                run_id, status, last_step, config = run[0]
                marks.setdefault("run opened", now)
                stage = query(db, f"SELECT value FROM kv WHERE key='run.{run_id}.stage'")
                if stage:
                    text = json.loads(stage[0][0]).get("text", "")
                    if not stages or stages[-1][1] != text:
                        stages.append((now, text))
                warmup = json.loads(config or "{}").get("sft_warmup_steps") or 0
                if last_step is not None:
                    marks.setdefault("first step", now)
                    if last_step >= warmup:
                        marks.setdefault("warm-up done", now)
                if query(db, f"SELECT 1 FROM events WHERE run_id={run_id} AND kind='gate_open'"):
                    marks.setdefault("gate open", now)
                if status == "finished":
                    marks.setdefault("demo finished", now)
                if status in ("failed", "stopped"):
                    raise SystemExit(f"the demo run ended {status}: see {home}/logs")
                if query(db, f"SELECT 1 FROM evals WHERE run_id={run_id}"):
                    marks["eval stored"] = now
                    break
            time.sleep(0.5)
        gate = query(db, "SELECT min(step) FROM events WHERE kind='gate_open'")
        evals = query(db, "SELECT metrics FROM evals ORDER BY id LIMIT 1")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        subprocess.run(
            [sys.executable, "-m", "engine.cli", "engine", "stop"], env=env, capture_output=True, timeout=120
        )
    task = json.loads(evals[0][0])["task"] if evals else None
    return {
        "hog": hog,
        "home": str(home),
        "marks": marks,
        "stages": stages,
        "load": sum(loads) / len(loads) if loads else None,
        "gate": gate[0][0] if gate else None,
        "eval_task": task,
    }


def minutes(seconds: float | None) -> str:
    return "—" if seconds is None else f"{int(seconds // 60)} min {seconds % 60:04.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", default="idle,busy", help="idle, busy, or both (comma-separated)")
    parser.add_argument("--hog", type=int, default=2, help="spinning processes beside a busy round")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; load average now {os.getloadavg()[0]:.2f}", flush=True)
    results = []
    for name in args.rounds.split(","):
        result = one_round(args.hog if name == "busy" else 0)
        results.append((name, result))
        marks = result["marks"]
        assert isinstance(marks, dict)
        print(
            f"\n{name} round ({result['hog']} spinning processes beside it, mean load {result['load']:.2f}):"
        )
        for mark, at in marks.items():
            print(f"  {mark:<14} {minutes(at)}")
        for at, text in result["stages"]:  # type: ignore[attr-defined]
            print(f"    stage at {at:6.1f} s: {text}")
        print(f"  gate opened at step {result['gate']}, eval task {result['eval_task']}", flush=True)
    print("\nround  spinning  load   demo finished      eval stored       gate  eval")
    for name, r in results:
        marks = r["marks"]
        assert isinstance(marks, dict)
        print(
            f"{name:<6} {r['hog']:>8}  {r['load']:>4.1f}   {minutes(marks.get('demo finished')):<17}  "
            f"{minutes(marks.get('eval stored')):<17} {r['gate']}  {r['eval_task']}"
        )


if __name__ == "__main__":
    main()
