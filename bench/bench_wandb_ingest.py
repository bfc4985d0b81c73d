"""W&B ingest: rows/s of our framing reader + protobuf parse + the store, against the same records parsed by
wandb's own protobufs with no store, in one run, on a run of 1,000,000 values (50 keys x 20,000 steps) written
by the installed wandb offline.

Goals (issue 29): the store's writes dominate the import; the reader itself (our framing + Record.FromString)
at most 1.5x the bare parse (Record.FromString over the record bytes already in memory, framing not counted).
Printed, each the best of --repeat runs:

- bare_parse: Record.FromString over every record's bytes (split beforehand), the baseline;
- framing_and_parse: engine/observe/wandb_log.RecordLog over the file, each record parsed (ratio to baseline);
- reader_alone: the W&B reader's scan making the metric rows (history values decoded, keys mapped), no store;
- observe: `observe` into a fresh store (rows/s, and the share of its time that is not the reader: the store).

Run: python bench/bench_wandb_ingest.py [--values N] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.observe import observe, wandb_run  # noqa: E402
from engine.observe.reader_base import Budget, IngestResult  # noqa: E402
from engine.observe.wandb_log import RecordLog  # noqa: E402
from engine.store import Store  # noqa: E402

GOAL = 1.5
KEYS = 50
WRITER = """
import sys, wandb
steps, keys = int(sys.argv[1]), int(sys.argv[2])
names = [f"train/k{i}" for i in range(keys)]
run = wandb.init(project="bench", name="bench", settings=wandb.Settings(console="off"))
for step in range(steps):
    wandb.log({name: step * 1e-3 + i for i, name in enumerate(names)}, step=step)
run.finish()
"""


def write_run(folder: Path, values: int) -> Path:
    folder.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(folder)}
    env.update({name: str(folder / name.lower()) for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR")})
    subprocess.run(
        [sys.executable, "-c", WRITER, str(values // KEYS), str(KEYS)], env=env, cwd=folder, check=True
    )
    [run_dir] = [p for p in (folder / "wandb").glob("offline-run-*") if not p.is_symlink()]
    return run_dir


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return min(times), out


def payloads(file: Path) -> list[bytes]:
    with open(file, "rb") as f:
        items = RecordLog(f, file.stat().st_size, 0)
        return [bytes(item) for _, item in items if isinstance(item, bytes | memoryview)]


def bare_parse(records: list[bytes]) -> int:
    from wandb.proto.wandb_internal_pb2 import Record

    parse = Record.FromString
    for data in records:
        parse(data)
    return len(records)


def framing_and_parse(file: Path) -> int:
    from wandb.proto.wandb_internal_pb2 import Record

    parse = Record.FromString
    count = 0
    with open(file, "rb") as f:
        for _, item in RecordLog(f, file.stat().st_size, 0):
            parse(item)
            count += 1
    return count


def reader_alone(file: Path) -> int:
    scan = wandb_run.RunScan(file, file.name, {}, IngestResult(), set())
    scan.run(Budget(10**12, 3600), 0)
    return len(scan.read.rows)


def observe_fresh(run_dir: Path, tmp: Path) -> int:
    with Store(tmp / f"carl-{time.monotonic_ns()}.db") as store:
        _, result = observe(store, run_dir)
    return result.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import wandb

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        run_dir = write_run(tmp / "wb", args.values)
        [file] = run_dir.glob("run-*.wandb")
        records = payloads(file)
        bare_parse(records)  # imports the protobufs outside the timings
        bare_s, count = best(lambda: bare_parse(records), args.repeat)
        framed_s, framed = best(lambda: framing_and_parse(file), args.repeat)
        alone_s, rows = best(lambda: reader_alone(file), args.repeat)
        observe_s, stored = best(lambda: observe_fresh(run_dir, tmp), 1)
        assert framed == count and rows == stored == args.values // KEYS * KEYS, (framed, count, rows, stored)
        ratio = framed_s / bare_s
        store_share = (observe_s - alone_s) / observe_s
        print(
            f"wandb {wandb.__version__}, {file.stat().st_size:,} bytes, {count:,} records, {stored:,} values"
        )
        print(
            f"bare_parse (Record.FromString, no framing, no store): {bare_s:.2f} s,"
            f" {count / bare_s:,.0f} records/s"
        )
        print(
            f"framing_and_parse (ours): {framed_s:.2f} s, {count / framed_s:,.0f} records/s,"
            f" ratio {ratio:.2f} to bare_parse (goal <= {GOAL}: {'OK' if ratio <= GOAL else 'MISSED'})"
        )
        print(f"reader_alone (rows made, no store): {alone_s:.2f} s, {rows / alone_s:,.0f} rows/s")
        print(
            f"observe (reader + store): {observe_s:.2f} s, {stored / observe_s:,.0f} rows/s, the store"
            f" {store_share:.0%} of it ({'dominates' if store_share > 0.5 else 'does NOT dominate'})"
        )
        print(
            json.dumps(
                {
                    "wandb": wandb.__version__,
                    "values": stored,
                    "records": count,
                    "bare_parse_s": round(bare_s, 3),
                    "framing_and_parse_s": round(framed_s, 3),
                    "ratio": round(ratio, 2),
                    "reader_alone_s": round(alone_s, 3),
                    "observe_s": round(observe_s, 3),
                    "rows_per_s": round(stored / observe_s),
                    "store_share": round(store_share, 2),
                }
            )
        )


if __name__ == "__main__":
    main()
