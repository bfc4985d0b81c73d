"""Store ingest of metric rows in batches: goal >= 100,000 rows/s.

Baseline, measured in the same run: the same rows through plain `executemany` into a bare
table with no indexes and no rollups, the ceiling SQLite gives this machine. The ratio says
what the store's dedupe index, cursor index and rollups cost.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.store import Store  # noqa: E402

STEPS = 100_000
KEYS = ("loss", "reward", "phi/mean", "phi/entropy", "rewards/task/mean")
BATCH_STEPS = 2_000  # one transaction per batch, as an observer's time-boxed read produces


def rows(lo: int, hi: int) -> list[tuple[int, str, float, float]]:
    return [(s, k, s * 1e-3 + i, 1.0) for s in range(lo, hi) for i, k in enumerate(KEYS)]


def bench_store(path: Path) -> float:
    with Store(path) as store:
        run_id = store.create_run("bench", source_kind="jsonl")
        started = time.perf_counter()
        for lo in range(0, STEPS, BATCH_STEPS):
            store.add_metrics(run_id, rows(lo, lo + BATCH_STEPS))
        elapsed = time.perf_counter() - started
        count = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
    assert count == STEPS * len(KEYS), count
    return count / elapsed


def bench_bare(path: Path) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE m (run_id INTEGER, step INTEGER, key TEXT, value REAL, wall_time REAL)")
    started = time.perf_counter()
    for lo in range(0, STEPS, BATCH_STEPS):
        batch = [(1, *r) for r in rows(lo, lo + BATCH_STEPS)]
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO m VALUES (?,?,?,?,?)", batch)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return STEPS * len(KEYS) / elapsed


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store_rate = bench_store(Path(tmp) / "carl.db")
        bare_rate = bench_bare(Path(tmp) / "bare.db")
    print(
        f"store_ingest_rows_per_s={store_rate:,.0f} goal>=100,000 "
        f"baseline_bare_executemany_rows_per_s={bare_rate:,.0f} ratio={store_rate / bare_rate:.2f} "
        f"{'OK' if store_rate >= 100_000 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
