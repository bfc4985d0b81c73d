"""Why the store writes rows with its own statements and keeps sqlite-utils for the schema (libraries.md).

Inserts 200,000 metric rows (50 keys x 4,000 steps) into the `metrics` table of a real carl.db (the store's
schema, indexes and WAL) in batches of 1,000, each batch one transaction, two ways:
  (a) the statement `Store.add_metrics` runs: `executemany("INSERT OR IGNORE ...")` over tuples;
  (b) baseline: sqlite-utils' `Table.insert_all(rows, ignore=True)` over dicts, the library's way.
Each figure is the best of 3 runs on a fresh store. Rollups are left out of both: only the insert differs.
Run: python bench/bench_store_inserts.py
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from engine.store import Store

KEYS, STEPS, BATCH = 50, 4_000, 1_000
STATEMENT = "INSERT OR IGNORE INTO metrics (run_id, step, key, value, wall_time) VALUES (?,?,?,?,?)"


def fresh_store(folder: Path, name: str) -> tuple[Store, int]:
    store = Store(folder / f"{name}.db")
    return store, store.create_run(name=name, source_kind="bench")


def rows(run_id: int) -> list[dict[str, object]]:
    return [
        {"run_id": run_id, "step": step, "key": f"k{k}", "value": step * 0.5 + k, "wall_time": 1.0e9 + step}
        for step in range(STEPS)
        for k in range(KEYS)
    ]


def ours(folder: Path, rep: int) -> float:
    store, run_id = fresh_store(folder, f"ours{rep}")
    tuples = [tuple(r.values()) for r in rows(run_id)]
    batches = [tuples[i : i + BATCH] for i in range(0, len(tuples), BATCH)]
    start = time.perf_counter()
    for batch in batches:
        with store.transaction():
            store.conn.executemany(STATEMENT, batch)
    return time.perf_counter() - start


def library(folder: Path, rep: int) -> float:
    store, run_id = fresh_store(folder, f"lib{rep}")
    all_rows = rows(run_id)
    batches = [all_rows[i : i + BATCH] for i in range(0, len(all_rows), BATCH)]
    table = store.db.table("metrics")
    start = time.perf_counter()
    for batch in batches:
        with store.transaction():
            table.insert_all(batch, ignore=True, batch_size=BATCH)
    return time.perf_counter() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        a = min(ours(folder, rep) for rep in range(3))
        b = min(library(folder, rep) for rep in range(3))
    n = KEYS * STEPS
    print(f"executemany (the store's):      {a:.3f} s  ({n / a:,.0f} rows/s)")
    print(f"sqlite-utils insert_all (base): {b:.3f} s  ({n / b:,.0f} rows/s)")
    print(f"ratio: {a / b:.2f}x the baseline's time ({b / a:.1f}x faster)")


if __name__ == "__main__":
    main()
