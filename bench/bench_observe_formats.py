"""`carl observe` of a TensorBoard event file and of a W&B run file of about 1M scalars each, against the
tracker's own reader alone on the same file in the same run. Goal: our overhead at most 25% (ratio <= 1.25).

- TensorBoard: 1M scalars written by torch's SummaryWriter (5 tags x 200,000 steps). Baseline: iterating
  tensorboard's EventFileLoader over the file (what a script reading every scalar without TensorFlow uses);
  RawEventFileLoader (records only, no protobuf parsing, no compat pass) is printed as the floor.
- W&B: 1M scalars written by wandb 0.29 offline (50 keys x 20,000 steps). Baseline: wandb's DataStore scanning
  every record plus Record.FromString on each (no values decoded). Printed beside it: the same, reading each
  history item's key and value text, the least any reader of the values does.
- Ours: `observe` into a fresh store (reading, key maps, SQLite writes with rollups, the cursor), and the
  reader alone (rows made, nothing written) to show where the time goes.

Run: python bench/bench_observe_formats.py [--scalars N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.observe import observe, wandb_run  # noqa: E402
from engine.observe import tensorboard as tb  # noqa: E402
from engine.observe.reader_base import Budget, IngestResult  # noqa: E402
from engine.store import Store  # noqa: E402

GOAL = 1.25
TB_TAGS = ("train/loss", "train/reward", "train/entropy", "train/kl", "train/grad_norm")
WANDB_KEYS = 50

WANDB_WRITER = """
import sys, wandb
steps, keys = int(sys.argv[1]), int(sys.argv[2])
names = [f"train/metric_{i}" for i in range(keys)]
run = wandb.init(project="bench", name="bench", settings=wandb.Settings(console="off"))
for step in range(steps):
    wandb.log({name: step * 1e-3 + i for i, name in enumerate(names)}, step=step)
run.finish()
"""


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def write_event_file(logdir: Path, scalars: int) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(logdir), max_queue=10_000, flush_secs=3600)
    for step in range(scalars // len(TB_TAGS)):
        for i, tag in enumerate(TB_TAGS):
            writer.add_scalar(tag, step * 1e-3 + i, step)
    writer.close()
    [file] = [p for p in logdir.iterdir() if "tfevents" in p.name]
    return file


def write_wandb_run(wandb_dir: Path, scalars: int) -> Path:
    wandb_dir.mkdir()
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(wandb_dir)}
    env.update({name: str(wandb_dir / name.lower()) for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR")})
    steps = str(scalars // WANDB_KEYS)
    subprocess.run(
        [sys.executable, "-c", WANDB_WRITER, steps, str(WANDB_KEYS)], env=env, cwd=wandb_dir, check=True
    )
    [run_dir] = [p for p in (wandb_dir / "wandb").glob("offline-run-*") if not p.is_symlink()]
    return run_dir


# -- TensorBoard ---------------------------------------------------------------------------------------------


def tb_loader(file: Path) -> int:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return sum(len(event.summary.value) for event in EventFileLoader(str(file)).Load())


def tb_raw_loader(file: Path) -> int:
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

    return sum(1 for _ in RawEventFileLoader(str(file)).Load())


def tb_reader_alone(file: Path) -> int:
    read = tb.read_events(file, {}, file.stat().st_size, Budget(10**12, 3600), 0)
    return len(read.rows)


# -- W&B -----------------------------------------------------------------------------------------------------


def wandb_datastore(file: Path) -> int:
    from wandb.proto.wandb_internal_pb2 import Record
    from wandb.sdk.internal.datastore import DataStore

    data_store = DataStore()
    data_store.open_for_scan(str(file))  # the bench's own copy: DataStore opens it "r+b"
    records = 0
    parse = Record.FromString
    while (data := data_store.scan_data()) is not None:
        parse(data)
        records += 1
    data_store.close()
    return records


def wandb_datastore_and_values(file: Path) -> int:
    """The baseline, plus touching what any reader of the values must: each history item's key and JSON text
    (upb builds the Python objects of a parsed record only when they are first read)."""
    from wandb.proto.wandb_internal_pb2 import Record
    from wandb.sdk.internal.datastore import DataStore

    data_store = DataStore()
    data_store.open_for_scan(str(file))
    items = 0
    parse = Record.FromString
    while (data := data_store.scan_data()) is not None:
        record = parse(data)
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                item.nested_key[0], item.value_json  # noqa: B018 (read, as a reader must)
                items += 1
    data_store.close()
    return items


def wandb_reader_alone(file: Path) -> int:
    scan = wandb_run.RunScan(file, file.name, {}, IngestResult(), set())
    scan.run(Budget(10**12, 3600), 0)
    return len(scan.read.rows)


def observe_into_fresh_store(path: Path, tmp: Path) -> int:
    db = tmp / f"carl-{time.monotonic_ns()}.db"
    with Store(db) as store:
        _, result = observe(store, path)
    return result.rows


def report(
    name: str, ours: float, rows: int, baseline: float, baseline_name: str, extra: dict[str, float]
) -> None:
    ratio = ours / baseline
    figures = " ".join(f"{key}_s={value:.2f}" for key, value in extra.items())
    print(
        f"{name}: rows={rows:,} observe_s={ours:.2f} rows_per_s={rows / ours:,.0f} "
        f"baseline={baseline_name} baseline_s={baseline:.2f} ratio={ratio:.2f} goal<={GOAL} "
        f"{'OK' if ratio <= GOAL else 'MISSED'} {figures}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scalars", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        event_file = write_event_file(tmp / "tb", args.scalars)
        run_dir = write_wandb_run(tmp / "wb", args.scalars)
        wandb_copy = tmp / "baseline.wandb"
        shutil.copy(next(run_dir.glob("run-*.wandb")), wandb_copy)
        try:
            wandb_datastore(wandb_copy)  # imports wandb once, outside the timings
        except (
            ImportError
        ):  # wandb 0.30 removed DataStore: bench_wandb_ingest.py measures W&B against the parse
            wandb_copy = None
        tb_raw_loader(event_file)

        loader_s, _ = timed(lambda: tb_loader(event_file))
        raw_s, _ = timed(lambda: tb_raw_loader(event_file))
        alone_s, _ = timed(lambda: tb_reader_alone(event_file))
        ours_s, rows = timed(lambda: observe_into_fresh_store(event_file, tmp))
        report(
            "tensorboard",
            ours_s,
            int(rows),  # type: ignore[call-overload]
            loader_s,
            "EventFileLoader",
            {"raw_loader": raw_s, "our_reader_alone": alone_s},
        )

        if wandb_copy is None:
            print("wandb: this wandb has no DataStore (removed in 0.30); see bench/bench_wandb_ingest.py")
            return
        datastore_s, _ = timed(lambda: wandb_datastore(wandb_copy))
        values_s, _ = timed(lambda: wandb_datastore_and_values(wandb_copy))
        alone_s, _ = timed(lambda: wandb_reader_alone(wandb_copy))
        ours_s, rows = timed(lambda: observe_into_fresh_store(run_dir, tmp))
        report(
            "wandb",
            ours_s,
            int(rows),  # type: ignore[call-overload]
            datastore_s,
            "DataStore+Record.FromString",
            {"datastore_reading_values": values_s, "our_reader_alone": alone_s},
        )
        print(
            json.dumps(
                {"event_file_bytes": event_file.stat().st_size, "wandb_bytes": wandb_copy.stat().st_size}
            )
        )


if __name__ == "__main__":
    main()
