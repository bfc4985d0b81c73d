"""How many growing TensorBoard event files the engine keeps up with (issue 30 item 2).

N runs in one folder (a sweep), each written at 2 steps/s with 20 scalars a step, one record each (as
`add_scalar` writes them), followed by a real engine (`carl engine`, its own $CARL_HOME) for DURATION seconds.
At the end of the writing, the lag is what was written and not yet stored, in seconds of writing; then the
time to catch up. The engine keeps up when the lag stays under KEPT_UP seconds. Baseline, in the same run: one
file at the same rate (the engine's own delay: its tick and a batch's write).

    python bench/bench_tb_follow.py            # N = 1 (baseline), 50, 100, 200, 400
    python bench/bench_tb_follow.py 200 300    # those N only (and the baseline)
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import paths  # noqa: E402
from engine.control import start_engine, stop_engine  # noqa: E402
from engine.observe import register_source  # noqa: E402
from engine.observe.tfrecord import masked  # noqa: E402
from engine.store import Store  # noqa: E402

RATE = 2.0  # steps a second, each run
KEYS = 20  # scalars a step
DURATION = float(os.environ.get("CARL_BENCH_SECONDS", "60"))  # seconds of writing
KEPT_UP = 5.0  # seconds of lag at most
CATCH_UP_LIMIT = 120.0


def framed(data: bytes) -> bytes:
    import google_crc32c

    length = struct.pack("<Q", len(data))
    return (
        length
        + struct.pack("<I", masked(google_crc32c.value(length)))
        + data
        + struct.pack("<I", masked(google_crc32c.value(data)))
    )


def step_records(step: int) -> bytes:
    """The records of one step: KEYS scalars, one event each."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    wall = time.time()
    out = []
    for k in range(KEYS):
        event = Event(step=step, wall_time=wall, summary=Summary(value=[Summary.Value(tag=f"train/m{k}")]))
        event.summary.value[0].simple_value = step / 100 + k
        out.append(framed(event.SerializeToString()))
    return b"".join(out)


def stored_rows(home: Path, source_id: int) -> int:
    with Store(paths.db_path(home)) as store:
        return int(store.source(source_id)["rows"])


def follow(n: int) -> dict[str, float]:
    from tensorboard.compat.proto.event_pb2 import Event

    with tempfile.TemporaryDirectory(prefix="carl-tbf-") as tmp:
        home, root = Path(tmp) / "home", Path(tmp) / "sweep"
        files = []
        for run in range(n):
            folder = root / f"run{run:04}"
            folder.mkdir(parents=True)
            file = folder / f"events.out.tfevents.{int(time.time())}.bench.{run}"
            version = Event(wall_time=time.time(), file_version="brain.Event:2")
            file.write_bytes(framed(version.SerializeToString()))
            files.append(open(file, "ab"))  # noqa: SIM115 (closed below)
        home.mkdir()
        with Store(paths.db_path(home)) as store:
            source_id = register_source(store, root, follow=True)
        start_engine(home)
        try:
            started = time.monotonic()
            step = 0
            while (now := time.monotonic()) < started + DURATION:
                due = started + step / RATE
                if now < due:
                    time.sleep(due - now)
                records = step_records(step)
                for f in files:
                    f.write(records)
                    f.flush()
                step += 1
            written = step * KEYS * n
            behind = written - stored_rows(home, source_id)
            lag = behind / (KEYS * n * RATE)
            end = time.monotonic()
            while stored_rows(home, source_id) < written and time.monotonic() < end + CATCH_UP_LIMIT:
                time.sleep(0.2)
            caught_up = time.monotonic() - end
            final = stored_rows(home, source_id)
        finally:
            stop_engine(home, timeout=30)
            for f in files:
                f.close()
    return {"n": n, "rows": written, "stored": final, "lag_s": lag, "catch_up_s": caught_up}


def main() -> None:
    counts = [int(a) for a in sys.argv[1:]] or [50, 100, 200, 400]
    print(f"TensorBoard follow: N runs at {RATE:g} steps/s, {KEYS} scalars a step, {DURATION:g} s of writing")
    base = follow(1)
    print(f"  baseline N=1: lag {base['lag_s']:.2f} s, caught up {base['catch_up_s']:.2f} s after writing")
    largest = 1
    for n in counts:
        row = follow(n)
        kept = row["lag_s"] <= KEPT_UP and row["stored"] == row["rows"]
        largest = max(largest, n) if kept else largest
        print(
            f"  N={n}: {row['rows']:,} rows ({n * KEYS * RATE:,.0f}/s), lag {row['lag_s']:.2f} s"
            f" ({row['lag_s'] / max(base['lag_s'], 0.01):.1f}x baseline), caught up {row['catch_up_s']:.2f} s"
            f" after; {'kept up' if kept else 'fell behind'}"
        )
    print(f"largest N kept up with (lag <= {KEPT_UP:g} s): {largest}")


if __name__ == "__main__":
    main()
