"""The read side of carl.db, for the control room and anything else that only watches.

Opens the database read-only (`mode=ro`), notices change with `PRAGMA data_version` (which
moves only when another connection commits) and fetches rows past cursors, so a reader's
cost grows with new rows only.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .base import (
    RUN_STAGE_KEY,
    STARTING_VERBS,
    StoreError,
    check_schema,
    connect,
    existing_store,
    read_experiment,
    read_experiment_runs,
    read_experiments,
)
from .histograms import HistogramReads
from .rollouts import ROLLOUT_COLUMNS, rollout_dict, unpack_half
from .schema import ROLLUP_LEVELS
from .system_reads import SystemReads

if TYPE_CHECKING:  # the rollouts viewer's reads are imported when it first reads (not by the first frame)
    from .rollout_reads import EntropyHistogram, Key, RolloutQuery, RolloutRow


def reads() -> Any:
    """engine/store/rollout_reads.py, imported at the first read of the rollouts viewer: its filter grammar
    and queries are ~10 ms of the control room's first frame, which reads no rollout."""
    from . import rollout_reads

    return rollout_reads


NAN = math.nan
JUDGED_WINDOW = 200  # the manager's judged quality: the mean of its newest this many judgements of a kind
# A rollup row as `_rollup_series` takes it (vsum / n: the bucket mean, NULL when it holds no finite value).
_ROLLUP_COLUMNS = "first_step, last_step, vmin, vmax, vsum / n, last_value"


@dataclass
class Series:
    """A metric series as buckets: raw points have lo == hi and n == 1.

    Sequences are aligned; `first`/`last` are the step span of each bucket, `vmin`/`vmax`
    its extremes (NaN when all its values were non-finite) and `mean` the bucket mean.
    The reader builds plain lists (reading needs no numpy; a raw series shares one list for
    its steps and one for its values: treat them as read-only); `np.asarray` turns them into
    arrays. Charts also take numpy arrays (see widgets/raster.py).
    """

    first: Sequence[int]
    last: Sequence[int]
    vmin: Sequence[float]
    vmax: Sequence[float]
    mean: Sequence[float]
    level: int = 1  # steps per bucket; 1 = raw points
    latest: float | None = None
    latest_step: int | None = None

    @classmethod
    def empty(cls) -> Series:
        return cls([], [], [], [], [])

    def __len__(self) -> int:
        return len(self.first)


@dataclass
class RunRow:
    id: int
    name: str
    source_kind: str
    source_path: str | None
    status: str
    max_steps: int | None
    vocab_size: int | None
    last_step: int | None
    last_update: float | None
    started_at: float | None
    ended_at: float | None
    phase: str | None
    health: str | None
    health_reasons: list[str] = field(default_factory=list)
    model: str | None = None
    backend: str | None = None
    error: str | None = None
    temperature: float | None = None
    framework: str | None = None  # the RL framework that wrote an observed run (told from its keys)


RUN_COLUMNS = (
    "id, name, source_kind, source_path, status, max_steps, vocab_size, last_step, last_update,"
    " started_at, ended_at, phase, health, health_reasons, model, backend, error, temperature, framework"
)
# A store not migrated to schema 6 yet (only writers migrate) has no framework column.
RUN_COLUMNS_V5 = RUN_COLUMNS.replace(", framework", ", NULL")


class StoreReader:
    """Read-only view of carl.db. Each method is one short read transaction."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not existing_store(self.path):  # a FIFO or a device is refused before SQLite opens it
            raise StoreError(f"{self.path}: no carl database here")
        try:
            self.conn = connect(self.path, readonly=True)
            self.conn.execute("PRAGMA query_only=1")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: cannot open read-only ({exc})") from None
        self.version = check_schema(self.conn, self.path)
        if self.version == 0:  # a 0-byte file, or one no carl process has set up yet: nothing to read
            self.conn.close()
            raise StoreError(f"{self.path}: an empty database, with nothing stored yet (not set up by carl)")
        self._run_columns = RUN_COLUMNS if self.version >= 6 else RUN_COLUMNS_V5
        self.system = SystemReads(self.conn, self.version)  # the box: nodes, samples, processes, consoles
        self.histograms = HistogramReads(self.conn, self.version)  # observed runs' histograms

    def close(self) -> None:
        self.conn.close()

    def data_version(self) -> int:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    # -- runs ------------------------------------------------------------------------------

    def runs(self) -> list[RunRow]:
        rows = self.conn.execute(f"SELECT {self._run_columns} FROM runs ORDER BY id").fetchall()
        return [self._run(r) for r in rows]

    def run(self, run_id: int) -> RunRow | None:
        row = self.conn.execute(f"SELECT {self._run_columns} FROM runs WHERE id=?", (run_id,)).fetchone()
        return None if row is None else self._run(row)

    @staticmethod
    def _run(r: tuple[Any, ...]) -> RunRow:
        """A row of RUN_COLUMNS as a RunRow, its health reasons' JSON list decoded."""
        (
            id_,
            name,
            source_kind,
            source_path,
            status,
            max_steps,
            vocab_size,
            last_step,
            last_update,
            started_at,
            ended_at,
            phase,
            health,
            reasons,
            model,
            backend,
            error,
            temperature,
            framework,
        ) = r
        return RunRow(
            id_,
            name,
            source_kind,
            source_path,
            status,
            max_steps,
            vocab_size,
            last_step,
            last_update,
            started_at,
            ended_at,
            phase,
            health,
            health_reasons=json.loads(reasons) if reasons else [],
            model=model,
            backend=backend,
            error=error,
            temperature=temperature,
            framework=framework,
        )

    def metric_keys(self, run_id: int) -> list[str]:
        """Distinct keys of a run: one primary-key seek per key (a skip scan), so the cost does
        not grow with the number of rows."""
        keys: list[str] = []
        key = ""
        while True:
            row = self.conn.execute(
                "SELECT min(key) FROM rollups WHERE run_id=? AND key>?", (run_id, key)
            ).fetchone()
            if row[0] is None:
                return keys
            key = row[0]
            keys.append(key)

    def count_points(self, run_id: int, key: str) -> int:
        row = self.conn.execute(
            "SELECT coalesce(sum(n), 0) FROM rollups WHERE run_id=? AND key=? AND level=?",
            (run_id, key, ROLLUP_LEVELS[-1]),
        ).fetchone()
        return int(row[0])

    # -- series ----------------------------------------------------------------------------

    def series(self, run_id: int, key: str, *, max_points: int = 2048) -> Series:
        """A series with at most about `max_points` buckets, from raw rows or a rollup level."""
        n = self.count_points(run_id, key)
        if n == 0:
            return Series.empty()
        if n <= max_points:
            rows = self.conn.execute(
                "SELECT step, value FROM metrics WHERE run_id=? AND key=? ORDER BY step", (run_id, key)
            ).fetchall()
            return _raw_series(rows)
        level = next((lv for lv in ROLLUP_LEVELS if n / lv <= max_points), ROLLUP_LEVELS[-1])
        rows = self.conn.execute(
            f"SELECT {_ROLLUP_COLUMNS} FROM rollups WHERE run_id=? AND key=? AND level=? ORDER BY bucket",
            (run_id, key, level),
        ).fetchall()
        return _rollup_series(rows, level)

    def metric_range(self, run_id: int, key: str, start: int, end: int, *, max_points: int = 200) -> Series:
        """`key` between steps `start` and `end`: raw points when the range holds few enough,
        else the rollup level that brings it under `max_points` buckets."""
        raw = self.conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM metrics WHERE run_id=? AND key=? AND step BETWEEN ? AND ? "
            "LIMIT ?)",
            (run_id, key, start, end, max_points + 1),
        ).fetchone()[0]
        if raw <= max_points:
            rows = self.conn.execute(
                "SELECT step, value FROM metrics WHERE run_id=? AND key=? AND step BETWEEN ? AND ? "
                "ORDER BY step",
                (run_id, key, start, end),
            ).fetchall()
            if not rows:
                return Series.empty()
            return _raw_series(rows)
        span = end - start + 1
        level = next((lv for lv in ROLLUP_LEVELS if span / lv <= max_points), ROLLUP_LEVELS[-1])
        rows = self.conn.execute(
            f"SELECT {_ROLLUP_COLUMNS} FROM rollups"
            " WHERE run_id=? AND key=? AND level=? AND bucket BETWEEN ? AND ? ORDER BY bucket",
            (run_id, key, level, start // level, end // level),
        ).fetchall()
        return _rollup_series(rows, level)

    def extend_series(self, run_id: int, key: str, series: Series, *, max_points: int = 2048) -> Series:
        """`series` with the rows that arrived since it was read (its last bucket re-read).

        Costs an index range scan over the new rows only; when the series has outgrown
        `max_points` it is re-read at a coarser level instead.
        """
        if len(series) == 0:
            return self.series(run_id, key, max_points=max_points)
        if len(series) > 2 * max_points:
            return self.series(run_id, key, max_points=max_points)
        if series.level == 1:
            rows = self.conn.execute(
                "SELECT step, value FROM metrics WHERE run_id=? AND key=? AND step>? ORDER BY step",
                (run_id, key, int(series.last[-1])),
            ).fetchall()
            if not rows:
                return series
            tail = _raw_series(rows)
            steps, values = [*series.first, *tail.first], [*series.vmin, *tail.vmin]
            return Series(
                steps,
                steps,
                values,
                values,
                values,
                1,
                series.latest if tail.latest is None else tail.latest,
                tail.latest_step,
            )
        level = series.level
        last_bucket = int(series.first[-1]) // level
        rows = self.conn.execute(
            f"SELECT {_ROLLUP_COLUMNS} FROM rollups"
            " WHERE run_id=? AND key=? AND level=? AND bucket>=? ORDER BY bucket",
            (run_id, key, level, last_bucket),
        ).fetchall()
        if not rows:
            return series
        tail = _rollup_series(rows, level)
        keep = len(series) - 1
        return Series(
            [*series.first[:keep], *tail.first],
            [*series.last[:keep], *tail.last],
            [*series.vmin[:keep], *tail.vmin],
            [*series.vmax[:keep], *tail.vmax],
            [*series.mean[:keep], *tail.mean],
            level,
            tail.latest if tail.latest is not None else series.latest,
            tail.latest_step,
        )

    def metrics_after(
        self, run_id: int, after_id: int, keys: list[str] | None = None, limit: int = 50_000
    ) -> list[tuple[int, int, str, float | None]]:
        """New metric rows of a run: (id, step, key, value) with id > after_id, oldest first."""
        if keys:
            marks = ",".join("?" * len(keys))
            return self.conn.execute(
                f"SELECT id, step, key, value FROM metrics WHERE run_id=? AND id>? AND key IN ({marks})"
                " ORDER BY id LIMIT ?",
                (run_id, after_id, *keys, limit),
            ).fetchall()
        return self.conn.execute(
            "SELECT id, step, key, value FROM metrics WHERE run_id=? AND id>? ORDER BY id LIMIT ?",
            (run_id, after_id, limit),
        ).fetchall()

    def max_metric_id(self, run_id: int) -> int:
        row = self.conn.execute("SELECT max(id) FROM metrics WHERE run_id=?", (run_id,)).fetchone()
        return int(row[0] or 0)

    def latest_values(self, run_id: int, keys: list[str]) -> dict[str, tuple[int, float | None]]:
        """The newest (step, value) of each key."""
        out: dict[str, tuple[int, float | None]] = {}
        for key in keys:
            row = self.conn.execute(
                "SELECT step, value FROM metrics WHERE run_id=? AND key=? ORDER BY step DESC LIMIT 1",
                (run_id, key),
            ).fetchone()
            if row:
                out[key] = (int(row[0]), row[1])
        return out

    def wall_times(self, run_id: int, last: int = 50) -> list[tuple[int, float]]:
        """(step, wall_time) of the newest steps, for progress and ETA."""
        rows = self.conn.execute(
            "SELECT step, max(wall_time) FROM metrics WHERE run_id=? AND step >= coalesce("
            "(SELECT last_step FROM runs WHERE id=?), 0) - ? GROUP BY step ORDER BY step",
            (run_id, run_id, last),
        ).fetchall()
        return [(int(s), float(w)) for s, w in rows]

    def gate_state(self, run_id: int) -> dict[str, Any] | None:
        cur = self.conn.execute(
            "SELECT step, state, threshold, history, above, window, multiplier, reason FROM gate_states"
            " WHERE run_id=? ORDER BY step DESC LIMIT 1",
            (run_id,),
        )
        row = cur.fetchone()
        return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))

    def events(self, run_id: int) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT step, kind, detail, wall_time FROM events WHERE run_id=? ORDER BY step, id", (run_id,)
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def samples(self, run_id: int, limit: int = 40) -> list[dict[str, Any]]:
        """The newest samples of a run (per-token Phi and entropy decoded), newest first."""
        return self._samples_where("run_id=? ORDER BY id DESC LIMIT ?", (run_id, limit))

    def _samples_where(self, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT id, run_id, step, idx, kind, prompt, completion, tokens, phi, entropy, rewards "
            f"FROM samples WHERE {where}",
            params,
        )
        cols = [d[0] for d in cur.description]
        out = []
        for r in cur.fetchall():
            row = dict(zip(cols, r, strict=True))
            for key in ("tokens", "phi", "entropy", "rewards"):
                row[key] = json.loads(row[key]) if row[key] else None
            out.append(row)
        return out

    # -- rollouts --------------------------------------------------------------------------

    def rollout_steps(self, run_id: int) -> list[tuple[int, int]]:
        """(step, samples) for each step of a run that has rollouts, oldest first."""
        if self.version < 6:
            return []
        return self.conn.execute(
            "SELECT step, count(*) FROM rollouts WHERE run_id=? GROUP BY step ORDER BY step", (run_id,)
        ).fetchall()

    def rollouts(
        self, run_id: int, step: int | None = None, *, limit: int = 200, offset: int = 0
    ) -> list[dict[str, Any]]:
        """A run's rollouts (of one step, or all), in step then source order."""
        if self.version < 6:
            return []
        where, params = (
            ("run_id=? AND step=?", (run_id, step)) if step is not None else ("run_id=?", (run_id,))
        )
        rows = self.conn.execute(
            f"SELECT id, {ROLLOUT_COLUMNS} FROM rollouts WHERE {where} ORDER BY step, idx LIMIT ? OFFSET ?",
            (*params, limit, offset),
        ).fetchall()
        return [rollout_dict(r) for r in rows]

    def rollout(self, rollout_id: int) -> dict[str, Any] | None:
        if self.version < 6:
            return None
        row = self.conn.execute(
            f"SELECT id, {ROLLOUT_COLUMNS} FROM rollouts WHERE id=?", (rollout_id,)
        ).fetchone()
        return None if row is None else rollout_dict(row)

    def rollout_count(self, run_id: int) -> int:
        if self.version < 6:
            return 0
        return int(self.conn.execute("SELECT count(*) FROM rollouts WHERE run_id=?", (run_id,)).fetchone()[0])

    # The rollouts viewer's reads (engine/store/rollout_reads.py): pages by keyset, in any order, filtered.

    def rollout_page(
        self,
        query: RolloutQuery,
        *,
        after: Key | None = None,
        limit: int = 100,
        backward: bool = False,
        inclusive: bool = False,
    ) -> list[RolloutRow]:
        """Up to `limit` list rows of `query` after the row keyed `after` (see rollout_reads.rollout_page)."""
        if self.version < 6:
            return []
        return reads().rollout_page(
            self.conn, query, after=after, limit=limit, backward=backward, inclusive=inclusive
        )

    def rollout_total(self, query: RolloutQuery) -> int:
        return reads().rollout_total(self.conn, query) if self.version >= 6 else 0

    def rollout_key_at(self, query: RolloutQuery, position: int, total: int) -> Key | None:
        return reads().rollout_key_at(self.conn, query, position, total) if self.version >= 6 else None

    def rollout_step_list(self, run_id: int, after: int | None = None) -> list[int]:
        """The steps of a run that have rollouts (after `after`), oldest first."""
        return reads().rollout_step_list(self.conn, run_id, after) if self.version >= 6 else []

    def rollout_group(
        self, run_id: int, step: int, group_id: str, prompt: str | None = None
    ) -> list[dict[str, Any]]:
        """The samples of one GRPO group (its group id's, or the step's with the same prompt), in order."""
        if self.version < 6:
            return []
        return reads().rollout_group(self.conn, run_id, step, group_id, prompt)

    def rollouts_signature(self, run_id: int) -> tuple[int, int | None]:
        """Moves when rollouts are added anywhere or a run's newest step changes (two index reads)."""
        if self.version < 6:
            return 0, None
        newest = self.conn.execute("SELECT coalesce(max(id), 0) FROM rollouts").fetchone()[0]
        last_step = self.conn.execute("SELECT max(step) FROM rollouts WHERE run_id=?", (run_id,)).fetchone()[
            0
        ]
        return int(newest), last_step

    def rollout_steps_since(self, run_id: int, after_id: int) -> list[int]:
        """The steps of the run's rollouts stored after row `after_id` (a range of the new rows only)."""
        if self.version < 6:
            return []
        rows = self.conn.execute(  # `+`: along the new ids, not the run's index (a walk of all its rows)
            "SELECT DISTINCT step FROM rollouts WHERE id>? AND +run_id=? ORDER BY step", (after_id, run_id)
        ).fetchall()
        return [int(s) for (s,) in rows]

    def entropy_histogram(
        self, run_id: int, step: int, *, bins: int = 24, top: float | None = None
    ) -> EntropyHistogram | None:
        """A step's token entropies as a histogram (None: the step has no per-token values)."""
        if self.version < 6:
            return None
        return reads().entropy_histogram(self.conn, run_id, step, bins=bins, top=top)

    def entropy_band(self, run_id: int, steps: Sequence[int]) -> list[tuple[int, float, float, float]]:
        """(step, p10, p50, p90) of token entropy for each of `steps` with per-token values."""
        return reads().entropy_band(self.conn, run_id, steps) if self.version >= 6 else []

    def key_names(self, run_id: int) -> dict[str, str]:
        """For each key a framework's key map renamed, the name the source used."""
        if self.version < 6:
            return {}
        rows = self.conn.execute("SELECT key, source_key FROM run_keys WHERE run_id=?", (run_id,))
        return dict(rows.fetchall())

    def run_commands(self, run_id: int, limit: int = 50) -> list[dict[str, Any]]:
        """The newest commands sent to a run (the audit log), newest first."""
        cur = self.conn.execute(
            "SELECT id, verb, args, state, result, origin, created_at, finished_at FROM commands"
            " WHERE run_id=? ORDER BY id DESC LIMIT ?",
            (run_id, limit),
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def run_config(self, run_id: int) -> dict[str, Any]:
        """The settings a run was started with (carl runs), or what its source recorded."""
        row = self.conn.execute("SELECT config FROM runs WHERE id=?", (run_id,)).fetchone()
        try:
            data = json.loads(row[0]) if row and row[0] else {}
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def gate_history(self, run_id: int, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
        """The gate's states from step `start` to `end`, oldest first."""
        cur = self.conn.execute(
            "SELECT step, state, threshold, history, above, window, multiplier, reason FROM gate_states"
            " WHERE run_id=? AND step>=? AND step<=? ORDER BY step",
            (run_id, start, end if end is not None else 2**62),
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def sample(self, sample_id: int) -> dict[str, Any] | None:
        """One sample with its per-token Phi and entropy."""
        rows = self._samples_where("id=?", (sample_id,))
        return rows[0] if rows else None

    def samples_at(self, run_id: int, step: int, limit: int = 8) -> list[dict[str, Any]]:
        """The samples kept at the step nearest `step` (best, worst, median, random)."""
        row = self.conn.execute(
            "SELECT step FROM samples WHERE run_id=? ORDER BY abs(step - ?) LIMIT 1", (run_id, step)
        ).fetchone()
        if row is None:
            return []
        return self._samples_where("run_id=? AND step=? ORDER BY idx LIMIT ?", (run_id, row[0], limit))

    def latest_eval(self, run_id: int) -> dict[str, Any] | None:
        cur = self.conn.execute(
            "SELECT id, passed, metrics, reasons, created_at FROM evals WHERE run_id=? ORDER BY id DESC "
            "LIMIT 1",
            (run_id,),
        )
        row = cur.fetchone()
        if row is None:
            return None
        return {
            "id": row[0],
            "passed": bool(row[1]),
            "metrics": json.loads(row[2]),
            "reasons": json.loads(row[3]),
            "created_at": row[4],
        }

    # -- experiments -------------------------------------------------------------------------

    def experiment(self, ref: str | int) -> dict[str, Any] | None:
        """An experiment by id (int) or name (str), its JSON columns decoded (None: no such experiment)."""
        return read_experiment(self.conn, ref) if self.version >= 5 else None

    def experiments(self) -> list[dict[str, Any]]:
        """Every experiment, oldest first (none on a store older than schema v5)."""
        return read_experiments(self.conn) if self.version >= 5 else []

    def experiment_runs(self, experiment_id: int) -> list[dict[str, Any]]:
        """An experiment's arm x seed cells, in insertion order; `run_id` is NULL until a cell starts."""
        return read_experiment_runs(self.conn, experiment_id) if self.version >= 5 else []

    # -- other tables ----------------------------------------------------------------------

    def table_count(self, table: str) -> int:
        if table not in {"trajectories", "agent_events", "samples", "commands", "sources"}:
            raise ValueError(table)
        return int(self.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def trajectories_after(self, after_id: int, limit: int = 500) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT id, session_id, agent, domain, tool_count, success_rate, reward, advantage, prompt,"
            " created_at FROM trajectories WHERE id>? ORDER BY id DESC LIMIT ?",
            (after_id, limit),
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def trajectories_signature(self) -> tuple[int, float]:
        """Changes when a trajectory is added, re-scored or its advantage moves (cheap: two index reads)."""
        if self.version < 3:  # the engine migrates the store on its next start
            return int(self.conn.execute("SELECT count(*) FROM trajectories").fetchone()[0]), 0.0
        row = self.conn.execute("SELECT count(*), coalesce(max(updated_at), 0) FROM trajectories").fetchone()
        return int(row[0]), float(row[1])

    def trajectory(self, trajectory_id: int) -> dict[str, Any] | None:
        cur = self.conn.execute("SELECT * FROM trajectories WHERE id=?", (trajectory_id,))
        row = cur.fetchone()
        if row is None:
            return None
        out = dict(zip([d[0] for d in cur.description], row, strict=True))
        for key in ("signals", "components", "outcome", "fingerprint"):
            out[key] = json.loads(out[key]) if out.get(key) else {}
        cur = self.conn.execute(
            "SELECT seq, tool, ok, params, ts, exit_code, duration_ms FROM trajectory_events"
            " WHERE trajectory_id=? ORDER BY seq",
            (trajectory_id,),
        )
        cols = [d[0] for d in cur.description]
        out["events"] = [dict(zip(cols, r, strict=True)) | {"params": json.loads(r[3] or "{}")} for r in cur]
        return out

    def domain_baselines(self) -> list[dict[str, Any]]:
        if self.version < 3:
            return []
        cur = self.conn.execute(
            "SELECT domain, n, mean, baseline, sigma FROM trajectory_domains ORDER BY n DESC"
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def kv(self, key: str) -> Any:
        if self.version < 3:
            return None
        row = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def run_stage(self, run_id: int) -> dict[str, Any] | None:
        """What a starting run last said it is doing, `{"text", "at"}` (Store.set_run_stage), or None."""
        value = self.kv(RUN_STAGE_KEY.format(run_id))
        if not isinstance(value, dict) or not isinstance(value.get("text"), str):
            return None
        return {"text": value["text"], "at": value.get("at") if isinstance(value.get("at"), float) else None}

    def starting_commands(self, finished_since: float) -> list[dict[str, Any]]:
        """The engine's commands that start a run or the agents plane (STARTING_VERBS), oldest first:
        those not yet done, and those finished since `finished_since` (the process they started may not
        have opened its run yet). Each with its verb, args, state, result and times."""
        verbs = ",".join("?" * len(STARTING_VERBS))
        cur = self.conn.execute(
            "SELECT id, verb, args, state, result, created_at, started_at, finished_at FROM commands"
            f" WHERE target='engine' AND verb IN ({verbs})"
            " AND (state IN ('pending', 'running') OR finished_at >= ?) ORDER BY id",
            (*STARTING_VERBS, finished_since),
        )
        cols = [d[0] for d in cur.description]
        rows = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        for row in rows:
            try:
                row["args"] = json.loads(row["args"] or "{}")
            except ValueError:
                row["args"] = {}
        return rows

    def agent_events_after(self, after_id: int, limit: int = 500) -> list[dict[str, Any]]:
        """The newest agent events (newest first), without their payloads."""
        extra = ", status, reason, environment, model_version, received_at" if self.version >= 4 else ""
        cur = self.conn.execute(
            "SELECT id, subject, kind, task_id, manager_id, worker_id, score, created_at"
            + extra
            + " FROM agent_events WHERE id>? ORDER BY id DESC LIMIT ?",
            (after_id, limit),
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    # -- the agents plane --------------------------------------------------------------------

    def agents_signature(self) -> tuple[int, float]:
        """Changes when an agent event arrives or the plane's state moves (two index reads)."""
        if self.version < 4:
            return int(self.conn.execute("SELECT coalesce(max(id), 0) FROM agent_events").fetchone()[0]), 0.0
        events = self.conn.execute("SELECT coalesce(max(id), 0) FROM agent_events").fetchone()[0]
        state = self.conn.execute(
            "SELECT coalesce(max(updated_at), 0) FROM kv WHERE key IN ('agents.server', 'agents.plane')"
        ).fetchone()[0]
        return int(events), float(state)

    def agent_workers(self) -> list[dict[str, Any]]:
        if self.version < 4:
            return []
        cur = self.conn.execute(
            "SELECT worker_id, kind, task_types, model, model_version, state, task_id, tasks_done, failures,"
            " score_n, score_sum, host, pid, detail, first_seen, last_seen FROM agent_workers "
            "ORDER BY worker_id"
        )
        cols = [d[0] for d in cur.description]
        out = []
        for row in cur.fetchall():
            worker = dict(zip(cols, row, strict=True))
            handled = (worker["tasks_done"] or 0) + (worker["failures"] or 0)
            worker["success_rate"] = worker["tasks_done"] / handled if handled else None
            worker["mean_score"] = worker["score_sum"] / worker["score_n"] if worker["score_n"] else None
            worker["task_types"] = json.loads(worker["task_types"]) if worker["task_types"] else []
            out.append(worker)
        return out

    def agent_alarms(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest alarms, newest first: kind, reason, worker, task."""
        rows = self.conn.execute(
            "SELECT id, payload, worker_id, task_id, received_at FROM agent_events WHERE kind='alarm'"
            " AND coalesce(status, 'ok')='ok' ORDER BY id DESC LIMIT ?",
            (limit,),
        ).fetchall()
        out = []
        for event_id, payload, worker_id, task_id, received in rows:
            body = json.loads(payload)
            out.append(
                {
                    "id": event_id,
                    "kind": body.get("kind"),
                    "reason": body.get("reason"),
                    "worker_id": worker_id,
                    "task_id": task_id,
                    "received_at": received,
                }
            )
        return out

    def agents_overview(self) -> dict[str, Any]:
        """The plane at a glance: server, processes, manager counts, workers, newest alarms."""
        return {
            "server": self.kv("agents.server"),
            "plane": self.kv("agents.plane"),
            "manager": self.kv("agents.manager"),
            "model": self.kv("agents.model"),
            "workers": self.agent_workers(),
            "events": int(self.conn.execute("SELECT count(*) FROM agent_events").fetchone()[0]),
            "alarms": self.agent_alarms(5) if self.version >= 4 else [],
        }

    def manager_quality(self, window: int = JUDGED_WINDOW) -> dict[str, tuple[float, int]]:
        """The manager judged (engine/agents/manager_judge.py): per kind (agreement, hint_help) the mean of
        its newest `window` judgements and how many there are of them (at most `window`); a kind never
        judged is absent. Two bounded reads along the kind index."""
        if self.version < 11:
            return {}
        out = {}
        for kind in ("agreement", "hint_help"):
            mean, count = self.conn.execute(
                "SELECT avg(value), count(*) FROM (SELECT value FROM agent_judgements WHERE kind=?"
                " ORDER BY id DESC LIMIT ?)",
                (kind, window),
            ).fetchone()
            if count:
                out[kind] = (float(mean), int(count))
        return out

    def agent_task_signature(self, task_id: str) -> tuple[float | None, int, int]:
        """Moves when the task's row or one of its events does (two index reads): its row's `updated_at`, and
        its events' newest id and count."""
        if self.version < 4:
            return None, 0, 0
        row = self.conn.execute("SELECT updated_at FROM agent_tasks WHERE task_id=?", (task_id,)).fetchone()
        newest, count = self.conn.execute(
            "SELECT coalesce(max(id), 0), count(*) FROM agent_events WHERE task_id=?", (task_id,)
        ).fetchone()
        return (row[0] if row else None), int(newest), int(count)

    def agent_task(self, task_id: str) -> dict[str, Any] | None:
        """One task with its result, step scores, feedback and the rollout it gave (None: unknown)."""
        if self.version < 4:
            return None
        cur = self.conn.execute("SELECT * FROM agent_tasks WHERE task_id=?", (task_id,))
        row = cur.fetchone()
        if row is None:
            return None
        task = dict(zip([d[0] for d in cur.description], row, strict=True))
        for key in ("steps", "step_scores"):
            task[key] = json.loads(task[key]) if task[key] else []
        if "opd_advantage" in task:  # a store of schema 11 on: the hint's OPD advantages, per answer token
            task["opd_tokens"] = json.loads(task["opd_tokens"]) if task["opd_tokens"] else []
            task["opd_advantage"] = unpack_half(task["opd_advantage"]) if task["opd_advantage"] else []
        rollout = self.conn.execute(
            "SELECT payload FROM agent_events WHERE task_id=? AND kind='rollout' AND status='ok' ORDER BY id "
            "LIMIT 1",
            (task_id,),
        ).fetchone()
        task["rollout"] = json.loads(rollout[0]) if rollout else None
        cur = self.conn.execute(
            "SELECT id, kind, subject, worker_id, score, received_at FROM agent_events WHERE task_id=? "
            "ORDER BY id",
            (task_id,),
        )
        cols = [d[0] for d in cur.description]
        task["events"] = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
        return task

    def agent_audit(
        self,
        *,
        kind: str | None = None,
        worker: str | None = None,
        task: str | None = None,
        rejected: bool = False,
        limit: int | None = 50,
    ) -> list[dict[str, Any]]:
        """Audit rows (payload included), oldest first, the newest `limit` of those that match."""
        where, params = ["1=1"], []
        if kind:
            where.append("kind=?")
            params.append(kind)
        if worker:
            where.append("worker_id=?")
            params.append(worker)
        if task:
            where.append("task_id LIKE ?")
            params.append(task.replace("%", "").replace("_", "") + "%")
        if rejected:
            where.append("status='rejected'")
        sql = (
            "SELECT id, subject, kind, task_id, manager_id, worker_id, score, payload, created_at, "
            "environment, model_version, stream_seq, received_at, coalesce(status, 'ok') AS status, reason "
            f"FROM agent_events WHERE {' AND '.join(where)} ORDER BY id DESC"
        )
        if limit:
            sql += f" LIMIT {int(limit)}"
        cur = self.conn.execute(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in reversed(cur.fetchall())]

    def commands_after(self, after_id: int, limit: int = 200) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT id, target, run_id, verb, args, state, result, origin, created_at, finished_at"
            " FROM commands WHERE id>? ORDER BY id LIMIT ?",
            (after_id, limit),
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def commands_changed_since(self, since: float) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT id, target, run_id, verb, args, state, result, origin, created_at, finished_at"
            " FROM commands WHERE coalesce(finished_at, started_at, created_at) >= ? ORDER BY id",
            (since,),
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def sources(self) -> list[dict[str, Any]]:
        cur = self.conn.execute(
            "SELECT id, kind, path, name, follow, state, rows, bad_lines, last_error, updated_at FROM sources"
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def engine_row(self) -> dict[str, Any] | None:
        cur = self.conn.execute(
            "SELECT pid, host, state, started_at, heartbeat_at, stopped_at, version FROM engine WHERE id=1"
        )
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cur.description], row, strict=True))


def _floats(values: Sequence[float | None]) -> list[float]:
    """A REAL column as floats: NULL (a non-finite value, or an all-NaN bucket) becomes NaN."""
    out = list(values)
    if None in out:
        return [NAN if v is None else v for v in out]
    return cast(list[float], out)  # no None in it


def _last_finite(values: Sequence[float]) -> float | None:
    return next((v for v in reversed(values) if math.isfinite(v)), None)


def _raw_series(rows: list[tuple[Any, ...]]) -> Series:
    """Rows of (step, value), as raw points."""
    step_column, value_column = zip(*rows, strict=True)
    steps, values = list(step_column), _floats(value_column)
    return Series(steps, steps, values, values, values, 1, _last_finite(values), steps[-1])


def _rollup_series(rows: list[tuple[Any, ...]], level: int) -> Series:
    """Rows of `_ROLLUP_COLUMNS`, one per bucket."""
    if not rows:
        return Series.empty()
    first, last, vmin, vmax, mean, last_value = zip(*rows, strict=True)
    latest = last_value[-1]
    return Series(
        list(first), list(last), _floats(vmin), _floats(vmax), _floats(mean), level, latest, last[-1]
    )
