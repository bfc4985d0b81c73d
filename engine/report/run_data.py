"""What the report draws of one run, read through `StoreReader`: series (raw points, or rollup
buckets for long runs), the cascade gate's transitions and the newest eval."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.store.reader import RunRow, StoreReader

XY = tuple[list[int], list[float | None]]  # steps, values (None where the store holds no finite value)

MAX_POINTS = 1500  # per series: finer than a chart's pixels, small enough for a file of many runs
PHI_KEYS = ("phi/mean", "phi/p10", "phi/p90", "phi/entropy")
GATE_KEYS = ("cascade/multiplier", "cascade/threshold", "cascade/state")


@dataclass
class RunData:
    run: RunRow
    label: str  # its name in legends
    series: dict[str, XY] = field(default_factory=dict)
    reward_keys: list[str] = field(default_factory=list)  # rewards/<name>/mean, sorted
    gate: list[dict[str, Any]] = field(default_factory=list)  # the gate's state changes, oldest first
    gate_opened: int | None = None  # the first step the gate was not closed
    eval: dict[str, Any] | None = None  # the newest eval: passed, metrics, reasons, created_at
    arm: str | None = None
    seed: int | None = None

    @property
    def has_metrics(self) -> bool:
        return bool(self.series)


def _xy(reader: StoreReader, run_id: int, key: str) -> XY | None:
    series = reader.series(run_id, key, max_points=MAX_POINTS)
    if len(series) == 0:
        return None
    return [int(step) for step in series.last], [float(v) if math.isfinite(v) else None for v in series.mean]


def run_data(
    reader: StoreReader,
    run: RunRow,
    *,
    label: str | None = None,
    arm: str | None = None,
    seed: int | None = None,
) -> RunData:
    keys = reader.metric_keys(run.id)
    rewards = sorted(k for k in keys if k.startswith("rewards/") and k.endswith("/mean"))
    data = RunData(run, label or run.name, reward_keys=rewards, arm=arm, seed=seed)
    for key in (*PHI_KEYS, "reward", *rewards, *GATE_KEYS):
        if key in keys and (xy := _xy(reader, run.id, key)) is not None:
            data.series[key] = xy
    for row in reader.gate_history(run.id):
        if not data.gate or row["state"] != data.gate[-1]["state"]:
            data.gate.append(row)
    data.gate_opened = next((g["step"] for g in data.gate if g["state"] != "closed"), None)
    data.eval = reader.latest_eval(run.id)
    return data
