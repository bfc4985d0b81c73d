"""Which of the sources found in a directory logged the same training run (docs/guide/observe.md, "How a
directory becomes runs").

A training run often logs to two or three trackers at once: veRL's file logger and TensorBoard
(`Tracking(default_backend=["file", "tensorboard"])`), TRL's TensorBoard, W&B and Trackio (`report_to`),
MLflow and TensorBoard. Each source is peeked at: its first batch is imported, by its own reader, into a
scratch store in a temporary folder (never the user's carl.db), and the values of its first PEEK_STEPS steps
are kept. Two sources of different kinds logged the same run when they started (or, when a start is not known,
were last written) within PAIR_SECONDS of each other and hold the same keys at the same steps with the same
values: at least MIN_SHARED of them, and at least AGREE of those they share. Matching the values, not just the
names, is what tells a run from a second run of the same script started beside it. A store of many runs
(MLflow, Trackio) is peeked run by run; one of its runs joins the run it matches.

Each peek is bounded (PEEK_ROWS rows, PEEK_SECONDS) like any batch; a source that cannot be peeked (its
package missing, damaged) is paired by the older rules in discover.py only.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.store import Store, metric_keys
from engine.store.sources import source_runs

from .ingest import ingest_source, register_source
from .reader_base import MULTI_RUN_KINDS, ObserveError

if TYPE_CHECKING:
    from .discover import Found

PAIR_SECONDS = 120.0  # one script starts a run's trackers within seconds; two minutes for slow inits
# Last writes of one run's trackers: TensorBoard's writer flushes every 120 s (SummaryWriter flush_secs), so
# its file's time lags a live run by up to that; five minutes leaves room.
END_SECONDS = 300.0
STARTS_KNOWN = frozenset({"tensorboard", "wandb"})  # a start in the file or folder name
PEEK_ROWS = 4_000  # rows imported per source to compare: tens of steps of a run logging ~100 keys
PEEK_SECONDS = 0.5
PEEK_STEPS = 20  # the first steps of each source compared
MIN_SHARED = 3  # values in common before two sources are called one run
AGREE = 0.9  # the share of common (key, step) pairs whose values agree (float32 TensorBoard against JSON)
REL_TOLERANCE = 1e-5  # TensorBoard keeps float32: 6e-8 relative error, far inside this
# Which source of a run is its main one (it names and creates the carl run; the others join it): exact values
# first (veRL's JSON log), then TensorBoard, W&B, trainer_state.json.
MAIN_ORDER = ("jsonl", "tensorboard", "wandb", "trainer_state")


@dataclass
class Unit:
    """One run as a source holds it: a single-run source, or one run of a store of many."""

    found: Found
    external_id: str | None = None  # the run inside a store of many runs
    values: dict[tuple[str, int], float | None] = field(default_factory=dict)
    started: float | None = None
    ended: float | None = None

    @property
    def kind(self) -> str:
        return self.found.kind


def peek(sources: Iterable[Found]) -> list[Unit]:
    """The runs of each readable source with the values of their first steps; a source that cannot be read
    gives none."""
    units: list[Unit] = []
    with (
        tempfile.TemporaryDirectory(prefix="carl-peek-") as folder,
        Store(Path(folder) / "peek.db") as scratch,
    ):
        for found in sources:
            if not found.readable:
                continue
            try:
                source_id = register_source(scratch, found.path, follow=False, kind=found.kind)
                ingest_source(scratch, source_id, max_rows=PEEK_ROWS, max_seconds=PEEK_SECONDS)
            except ObserveError:
                continue
            except Exception:  # noqa: BLE001 (a reader's library failing on a file: no pairing, not a failure)
                continue
            units += _units(scratch, source_id, found)
    return units


def worth_peeking(sources: list[Found]) -> list[Found]:
    """The sources that may have logged a run with another one: a source of another kind near it in time
    (`near`, on what their names and files tell), or any source when a store of many runs is there (its runs'
    times are known only once it is read). A folder of fifty TensorBoard runs peeks at none."""
    if any(f.kind in MULTI_RUN_KINDS for f in sources):
        return sources
    units = [
        Unit(f, started=f.started if f.kind in STARTS_KNOWN else None, ended=f.ended or None) for f in sources
    ]
    return [a.found for a in units if any(a.kind != b.kind and near(a, b) for b in units)]


def _units(scratch: Store, source_id: int, found: Found) -> list[Unit]:
    multi = found.kind in MULTI_RUN_KINDS
    units = []
    for run in source_runs(scratch, source_id):
        steps = metric_keys.first_steps(scratch, run.id, PEEK_STEPS)
        if not steps:
            continue
        values = metric_keys.values_between(scratch, run.id, steps[0], steps[-1])
        unit = Unit(found, run.external_id if multi else None, values)
        if multi:  # the time its last value was logged (a store's start may be when it was first read)
            unit.ended = run.last_update
        else:  # TensorBoard and W&B name their start in their file names; a log's time is its last write
            unit.started = found.started if found.kind in STARTS_KNOWN else None
            unit.ended = found.ended or None
        units.append(unit)
    return units if multi else units[:1]


def agreement(a: Unit, b: Unit) -> tuple[int, int]:
    """(values that agree, values that differ) over the (key, step) pairs both hold."""
    agree = differ = 0
    for pair, value in a.values.items():
        if pair not in b.values:
            continue
        other = b.values[pair]
        if value is None or other is None:  # NaN is stored as NULL
            same = value is None and other is None
        else:
            same = math.isclose(value, other, rel_tol=REL_TOLERANCE, abs_tol=1e-9)
        agree += same
        differ += not same
    return agree, differ


def near(a: Unit, b: Unit) -> bool:
    """Started within PAIR_SECONDS of each other; when a start is not known (a JSONL log says none), last
    written within END_SECONDS (the trackers of one run are written at each step, and closed together)."""
    if a.started and b.started:
        return abs(a.started - b.started) <= PAIR_SECONDS
    if a.ended and b.ended:
        return abs(a.ended - b.ended) <= END_SECONDS
    return False


def same_run(a: Unit, b: Unit) -> int:
    """How many values show that `a` and `b` logged one run (0: they did not)."""
    if a.kind == b.kind or (a.kind in MULTI_RUN_KINDS and b.kind in MULTI_RUN_KINDS) or not near(a, b):
        return 0
    agree, differ = agreement(a, b)
    return agree if agree >= MIN_SHARED and agree >= AGREE * (agree + differ) else 0


def groups(units: list[Unit]) -> list[list[Unit]]:
    """Units that logged one run, grouped: the strongest matches first, at most one unit of a kind in a
    group, and a group holding a single-run source (a store's run joins one, it never leads). Groups of two
    or more only, each ordered main first (MAIN_ORDER)."""
    scored = sorted(
        (
            (score, i, j)
            for i in range(len(units))
            for j in range(i + 1, len(units))
            if (score := same_run(units[i], units[j])) > 0
        ),
        reverse=True,
    )
    group_of: dict[int, set[int]] = {}
    for _, i, j in scored:
        gi, gj = group_of.get(i, {i}), group_of.get(j, {j})
        if gi is gj:
            continue
        kinds = [units[k].kind for k in gi | gj]
        if len(kinds) != len(set(kinds)):
            continue
        merged = gi | gj
        for k in merged:
            group_of[k] = merged
    out: list[list[Unit]] = []
    seen: set[int] = set()
    for members in group_of.values():
        if id(members) in seen:
            continue
        seen.add(id(members))
        group = sorted((units[k] for k in members), key=main_rank)
        if group[0].kind not in MULTI_RUN_KINDS:
            out.append(group)
    return out


def main_rank(unit: Unit) -> tuple[int, int]:
    """Readable before not, then MAIN_ORDER; a store's run last."""
    order = MAIN_ORDER.index(unit.kind) if unit.kind in MAIN_ORDER else len(MAIN_ORDER)
    return (0 if unit.found.readable else 1, order)
