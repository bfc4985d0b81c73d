"""The writer side of carl.db: one `Store` per process that writes.

SQLite in WAL mode, written through sqlite-utils. Every public write is one transaction
(a step, or an ingest batch); callers that need several writes to land together (rows and the
source cursor that covers them) use `transaction()`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

from engine.names import MAX_NAME, as_name
from engine.text import storable

from .base import (
    RUN_STAGE_KEY,
    MetricRow,
    StoreError,
    check_schema,
    connect,
    existing_store,
    in_chunks,
    insert_chat_message,
    insert_command,
    inserted_id,
    read_experiment,
    read_experiment_runs,
    read_experiments,
    unreadable,
)
from .rollouts import ROLLOUT_CAP, ROLLOUT_COLUMNS, ROLLOUT_WIDTH, rollout_record
from .schema import APPLICATION_ID, MIGRATIONS, ROLLUP_LEVELS, SCHEMA_VERSION
from .system import SystemTables


def _finite(value: float | None) -> float | None:
    """NaN is stored as NULL (SQLite has no NaN); +-inf are stored as REAL infinities."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


class Store:
    """Read-write access to carl.db. Safe to use from one thread at a time."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not existing_store(self.path):
            if not create:
                raise StoreError(f"{self.path}: no carl database here")
            self.path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
            self.path.touch(mode=0o600)
        os.chmod(self.path, 0o600)
        try:
            self.conn = connect(self.path, readonly=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA busy_timeout=30000")
        except sqlite3.DatabaseError as exc:
            raise StoreError(unreadable(self.path, exc)) from None
        self.db = sqlite_utils.Database(self.conn)
        self._in_txn = False
        self._migrate()
        self.system = SystemTables(self)  # the box: nodes, samples, processes, consoles (store/system.py)

    # -- lifecycle -------------------------------------------------------------------------

    def _migrate(self) -> None:
        version = check_schema(self.conn, self.path)
        for number in range(version, SCHEMA_VERSION):
            with self.transaction():
                # Another process opening a fresh store at the same moment may have migrated it since we
                # looked: under the write lock, the version read now is the one that counts.
                if self.conn.execute("PRAGMA user_version").fetchone()[0] > number:
                    continue
                MIGRATIONS[number](self.db)
                self.conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                self.conn.execute(f"PRAGMA user_version={number + 1}")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT; nested uses join the outer transaction."""
        if self._in_txn:
            yield self.conn
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self._in_txn = True
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        else:
            self.conn.execute("COMMIT")
        finally:
            self._in_txn = False

    # -- runs ------------------------------------------------------------------------------

    def create_run(
        self,
        name: str,
        *,
        source_kind: str,
        source_path: str | None = None,
        source_id: int | None = None,
        external_id: str = "",
        status: str = "running",
        config: dict[str, Any] | None = None,
        backend: str | None = None,
        model: str | None = None,
        max_steps: int | None = None,
        vocab_size: int | None = None,
        started_at: float | None = None,
    ) -> int:
        """Create a run; a taken name gets a numeric suffix (name-2, name-3, ...). Whatever the name's origin,
        it is stored as a name (`names.as_name`: storable, printable, at most MAX_NAME characters)."""
        now = time.time()
        name, external_id = as_name(name), storable(external_id)
        source_path, model = source_path and storable(source_path), model and storable(model)
        with self.transaction():
            unique = name
            n = 1
            while self.conn.execute("SELECT 1 FROM runs WHERE name=?", (unique,)).fetchone():
                n += 1
                suffix = f"-{n}"
                unique = name[: MAX_NAME - len(suffix)] + suffix
            cur = self.conn.execute(
                "INSERT INTO runs (name, source_kind, source_path, source_id, external_id, status, config,"
                " backend, model, max_steps, vocab_size, started_at, created_at, updated_at, health,"
                " health_reasons) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    unique,
                    source_kind,
                    source_path,
                    source_id,
                    external_id,
                    status,
                    json.dumps(config or {}),
                    backend,
                    model,
                    max_steps,
                    vocab_size,
                    started_at if started_at is not None else now,
                    now,
                    now,
                    None,
                    "[]",
                ),
            )
            return inserted_id(cur)

    _RUN_FIELDS = frozenset(
        {
            "name",
            "status",
            "config",
            "backend",
            "model",
            "max_steps",
            "vocab_size",
            "framework",
            "last_step",
            "last_update",
            "started_at",
            "ended_at",
            "phase",
            "health",
            "health_reasons",
            "pid",
            "output_dir",
            "error",
            "last_checkpoint",
            "last_checkpoint_step",
            "temperature",
        }
    )

    def update_run(self, run_id: int, **fields: Any) -> None:
        unknown = set(fields) - self._RUN_FIELDS
        if unknown:
            raise ValueError(f"unknown run fields: {sorted(unknown)}")
        for key in ("config", "health_reasons"):
            if key in fields and not isinstance(fields[key], str):
                fields[key] = json.dumps(fields[key])
        fields = {k: storable(v) if isinstance(v, str) else v for k, v in fields.items()}
        fields["updated_at"] = time.time()
        columns = ", ".join(f"{k}=?" for k in fields)
        with self.transaction():
            self.conn.execute(f"UPDATE runs SET {columns} WHERE id=?", (*fields.values(), run_id))

    def run(self, run_id: int) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            return None
        cols = [d[0] for d in self.conn.execute("SELECT * FROM runs LIMIT 0").description]
        return dict(zip(cols, row, strict=True))

    def run_id_by_name(self, name: str) -> int | None:
        row = self.conn.execute("SELECT id FROM runs WHERE name=?", (name,)).fetchone()
        return None if row is None else int(row[0])

    def metric_before(self, run_id: int, key: str, step: int) -> tuple[int, float] | None:
        """The run's newest (step, value) of `key` before `step` with a value (one index seek), or None."""
        row = self.conn.execute(
            "SELECT step, value FROM metrics WHERE run_id=? AND key=? AND step<? AND value IS NOT NULL"
            " ORDER BY step DESC LIMIT 1",
            (run_id, key, step),
        ).fetchone()
        return None if row is None else (int(row[0]), float(row[1]))

    # -- metrics ---------------------------------------------------------------------------

    def add_metrics(self, run_id: int, rows: Iterable[MetricRow]) -> int:
        """Insert metric rows (duplicates of (run, key, step) are ignored); returns rows added.

        Also brings the rollups of the touched buckets and the run's last step up to date, all
        in one transaction. NaN is stored as NULL (SQLite does that on binding).
        """
        batch = [
            (run_id, int(step), key, float(value) if value is not None else None, float(wall))
            for step, key, value, wall in rows
        ]
        if not batch:
            return 0
        with self.transaction():
            before = self.conn.total_changes
            self.conn.executemany(
                "INSERT OR IGNORE INTO metrics (run_id, step, key, value, wall_time) VALUES (?,?,?,?,?)",
                batch,
            )
            added = self.conn.total_changes - before
            if added == len(batch):
                self._merge_rollups(run_id, batch)  # every row is new: fold the batch in
            elif added:
                spans: dict[str, tuple[int, int]] = {}
                for _, step, key, _, _ in batch:
                    lo, hi = spans.get(key, (step, step))
                    spans[key] = (min(lo, step), max(hi, step))
                for key, (lo, hi) in spans.items():
                    self._refresh_rollups(run_id, key, lo, hi)  # some were duplicates: rebuild
            if added:
                last_step = max(r[1] for r in batch)
                last_wall = max(r[4] for r in batch)
                self.conn.execute(
                    "UPDATE runs SET last_step=max(coalesce(last_step, ?), ?),"
                    " last_update=max(coalesce(last_update, 0), ?), updated_at=? WHERE id=?",
                    (last_step, last_step, last_wall, time.time(), run_id),
                )
            return added

    def _merge_rollups(self, run_id: int, batch: list[tuple[int, int, str, float | None, float]]) -> None:
        """Fold a batch of rows that were all newly inserted into the rollups.

        Exact because no row of the batch was in the store before: each bucket's aggregate is
        combined with the batch's aggregate for that bucket (counts add, extremes extend, the
        value at the newest step wins).
        """
        by_key: dict[str, tuple[list[int], list[float]]] = {}
        for _, step, key, value, _ in batch:
            entry = by_key.get(key)
            if entry is None:
                entry = by_key[key] = ([], [])
            entry[0].append(step)
            entry[1].append(math.nan if value is None else value)
        upserts: list[tuple[Any, ...]] = []
        for key, (step_list, value_list) in by_key.items():
            if len(step_list) <= SMALL_FOLD:  # a few steps of a key (many runs followed): numpy costs more
                upserts += _fold_small(run_id, key, step_list, value_list)
                continue
            steps = np.asarray(step_list, dtype=np.int64)
            values = np.asarray(value_list, dtype=np.float64)
            order = np.argsort(steps, kind="stable")
            steps, values = steps[order], values[order]
            valid = ~np.isnan(values)
            zeroed = np.where(valid, values, 0.0)
            for level in ROLLUP_LEVELS:
                buckets = steps // level
                starts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1]])
                ends = np.r_[starts[1:], len(steps)] - 1
                n = np.add.reduceat(valid.astype(np.int64), starts)
                vsum = np.add.reduceat(zeroed, starts)
                vsum[n == 0] = math.nan  # SQL's sum() of no values is NULL
                count = len(starts)
                upserts += zip(
                    itertools.repeat(run_id, count),
                    itertools.repeat(key, count),
                    itertools.repeat(level, count),
                    buckets[starts].tolist(),
                    n.tolist(),
                    np.fmin.reduceat(values, starts).tolist(),
                    np.fmax.reduceat(values, starts).tolist(),
                    vsum.tolist(),
                    steps[starts].tolist(),
                    steps[ends].tolist(),
                    values[ends].tolist(),
                    strict=True,
                )
        self.conn.executemany(
            """
            INSERT INTO rollups
                (run_id, key, level, bucket, n, vmin, vmax, vsum, first_step, last_step, last_value)
            VALUES (?,?,?,?,?,?,?,?,?,?,?)
            ON CONFLICT (run_id, key, level, bucket) DO UPDATE SET
                n = n + excluded.n,
                vmin = coalesce(min(vmin, excluded.vmin), vmin, excluded.vmin),
                vmax = coalesce(max(vmax, excluded.vmax), vmax, excluded.vmax),
                vsum = CASE WHEN vsum IS NULL THEN excluded.vsum
                            WHEN excluded.vsum IS NULL THEN vsum ELSE vsum + excluded.vsum END,
                first_step = min(first_step, excluded.first_step),
                last_value = CASE WHEN excluded.last_step > last_step THEN excluded.last_value
                                  ELSE last_value END,
                last_step = max(last_step, excluded.last_step)
            """,
            upserts,
        )

    def _refresh_rollups(self, run_id: int, key: str, lo: int, hi: int) -> None:
        """Recompute, from the level below, every rollup bucket that overlaps steps [lo, hi].

        Exact and idempotent: a bucket is always rebuilt from its source rows, so a retried
        or partially duplicated batch cannot skew it.
        """
        finer = None
        for level in ROLLUP_LEVELS:
            b_lo, b_hi = lo // level, hi // level
            if finer is None:
                self.conn.execute(
                    """
                    INSERT OR REPLACE INTO rollups
                      (run_id, key, level, bucket, n, vmin, vmax, vsum, first_step, last_step, last_value)
                    SELECT run_id, key, ?, step / ?, count(value), min(value), max(value), sum(value),
                           min(step), max(step), NULL
                    FROM metrics
                    WHERE run_id=? AND key=? AND step BETWEEN ? AND ?
                    GROUP BY step / ?
                    """,
                    (level, level, run_id, key, b_lo * level, (b_hi + 1) * level - 1, level),
                )
            else:
                ratio = level // finer
                self.conn.execute(
                    """
                    INSERT OR REPLACE INTO rollups
                      (run_id, key, level, bucket, n, vmin, vmax, vsum, first_step, last_step, last_value)
                    SELECT run_id, key, ?, bucket / ?, sum(n), min(vmin), max(vmax), sum(vsum),
                           min(first_step), max(last_step), NULL
                    FROM rollups
                    WHERE run_id=? AND key=? AND level=? AND bucket BETWEEN ? AND ?
                    GROUP BY bucket / ?
                    """,
                    (level, ratio, run_id, key, finer, b_lo * ratio, (b_hi + 1) * ratio - 1, ratio),
                )
            finer = level
        # The newest value of each rebuilt bucket, looked up through the (run, key, step) index.
        self.conn.execute(
            "UPDATE rollups SET last_value = (SELECT value FROM metrics m WHERE m.run_id=rollups.run_id"
            " AND m.key=rollups.key AND m.step=rollups.last_step)"
            " WHERE run_id=? AND key=? AND last_value IS NULL AND last_step >= ?",
            (run_id, key, lo),
        )

    def add_phi_stats(self, run_id: int, rows: Sequence[dict[str, Any]]) -> int:
        """Insert per-step Phi statistics and mirror their scalars into metrics.

        Each row: step, phi_mean, and optionally phi_p10/p50/p90, entropy_mean (nats), tokens,
        weighting, vocab_size, hist (list of counts), wall_time. The scalars also go to the
        metrics table under `phi/mean`, `phi/p10`, `phi/p50`, `phi/p90` and `phi/entropy`, so
        every chart reads one kind of series.
        """
        if not rows:
            return 0
        mirrored: list[MetricRow] = []
        records = []
        for row in rows:
            wall = float(row.get("wall_time") or time.time())
            hist = row.get("hist")
            records.append(
                (
                    run_id,
                    int(row["step"]),
                    _finite(row.get("phi_mean")),
                    _finite(row.get("phi_p10")),
                    _finite(row.get("phi_p50")),
                    _finite(row.get("phi_p90")),
                    _finite(row.get("entropy_mean")),
                    row.get("tokens"),
                    row.get("weighting"),
                    row.get("vocab_size"),
                    json.dumps(hist) if hist is not None else None,
                    wall,
                )
            )
            for column, key in PHI_METRIC_KEYS.items():
                if column in row and row[column] is not None:
                    mirrored.append((int(row["step"]), key, row[column], wall))
        with self.transaction():
            before = self.conn.total_changes
            self.conn.executemany(
                "INSERT OR IGNORE INTO phi_stats (run_id, step, phi_mean, phi_p10, phi_p50, phi_p90,"
                " entropy_mean, tokens, weighting, vocab_size, hist, wall_time)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                records,
            )
            added = self.conn.total_changes - before
            self.add_metrics(run_id, mirrored)
        return added

    def add_samples(self, run_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """Full traces kept for a step: prompt, completion, its tokens with per-token Phi and
        entropy (nats), per-function rewards and which trace it is (best/worst/median/random)."""

        def as_json(value: Any) -> str | None:
            return None if value is None else json.dumps(value)

        with self.transaction():
            self.conn.executemany(
                "INSERT INTO samples"
                " (run_id, step, idx, kind, prompt, completion, tokens, phi, entropy, rewards, wall_time)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        run_id,
                        int(r["step"]),
                        r.get("idx"),
                        r.get("kind"),
                        r.get("prompt"),
                        r.get("completion"),
                        as_json(r.get("tokens")),
                        as_json(r.get("phi")),
                        as_json(r.get("entropy")),
                        json.dumps(r.get("rewards") or {}),
                        float(r.get("wall_time") or time.time()),
                    )
                    for r in rows
                ],
            )

    # -- rollouts --------------------------------------------------------------------------

    def add_rollouts(self, run_id: int, rows: Sequence[dict[str, Any]]) -> int:
        """Insert a run's samples (see `rollout_record`); a (step, idx) already stored is ignored, so a
        source read again after a crash adds nothing twice. Returns rows added. Past ROLLOUT_CAP rows
        the run's oldest steps are thinned (every other sample), never its newest step."""
        batch = [rollout_record(run_id, r) for r in rows]
        if not batch:
            return 0
        with self.transaction():
            before = self.conn.total_changes
            self.conn.executemany(
                f"INSERT OR IGNORE INTO rollouts ({ROLLOUT_COLUMNS})"
                f" VALUES ({', '.join('?' * ROLLOUT_WIDTH)})",
                batch,
            )
            added = self.conn.total_changes - before
            if added:
                self._thin_rollouts(run_id)
            return added

    def _thin_rollouts(self, run_id: int, cap: int | None = None) -> int:
        """Bring a run over the cap back to 90% of it: every other sample of its oldest steps goes, oldest
        step first; a step left with one sample keeps it until every older step is down to one, and only
        then do whole oldest steps go. The newest step is never touched. Returns rows removed."""
        cap = ROLLOUT_CAP if cap is None else cap
        total = self.conn.execute("SELECT count(*) FROM rollouts WHERE run_id=?", (run_id,)).fetchone()[0]
        if total <= cap:
            return 0
        excess = total - int(cap * 0.9)
        steps = self.conn.execute(
            "SELECT step, count(*) FROM rollouts WHERE run_id=? GROUP BY step ORDER BY step", (run_id,)
        ).fetchall()[:-1]  # never the newest step
        removed = 0
        for step, n in steps:  # pass 1: halve the oldest steps
            if removed >= excess:
                return removed
            if n > 1:
                removed += self.conn.execute(
                    "DELETE FROM rollouts WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER"
                    " (ORDER BY idx) AS r FROM rollouts WHERE run_id=? AND step=?) WHERE r % 2 = 0)",
                    (run_id, step),
                ).rowcount
        for step, _ in steps:  # pass 2: still over: the oldest steps go whole
            if removed >= excess:
                break
            removed += self.conn.execute(
                "DELETE FROM rollouts WHERE run_id=? AND step=?", (run_id, step)
            ).rowcount
        return removed

    def set_key_names(self, run_id: int, names: dict[str, str]) -> None:
        """Remember the source's own name of each key a framework's key map renamed (key -> source key)."""
        if names:
            with self.transaction():
                self.conn.executemany(
                    "INSERT OR REPLACE INTO run_keys (run_id, key, source_key) VALUES (?,?,?)",
                    [(run_id, key, source_key) for key, source_key in names.items()],
                )

    def add_gate_states(self, run_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """The cascade gate's state per step (state, threshold, history, above, window,
        multiplier, reason); also mirrored as `cascade/*` metrics so it charts like the rest."""
        if not rows:
            return
        now = time.time()
        codes = {"closed": 0.0, "ramping": 1.0, "open": 2.0}
        mirrored: list[MetricRow] = []
        for r in rows:
            mirrored += [
                (int(r["step"]), "cascade/multiplier", r.get("multiplier"), now),
                (int(r["step"]), "cascade/threshold", r.get("threshold"), now),
                (int(r["step"]), "cascade/state", codes.get(r["state"]), now),
            ]
        with self.transaction():
            self.conn.executemany(
                "INSERT OR IGNORE INTO gate_states (run_id, step, state, threshold, history, above, window,"
                " multiplier, reason, wall_time) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        run_id,
                        int(r["step"]),
                        r["state"],
                        r.get("threshold"),
                        r.get("history"),
                        r.get("above"),
                        r.get("window"),
                        r.get("multiplier"),
                        r.get("reason"),
                        now,
                    )
                    for r in rows
                ],
            )
            self.add_metrics(run_id, mirrored)

    def add_event(self, run_id: int, step: int | None, kind: str, detail: str = "") -> None:
        """A marker for the charts and the log (gate opened, crystallization, checkpoint, ...);
        one per (run, kind, step)."""
        with self.transaction():
            self.conn.execute(
                "INSERT OR IGNORE INTO events (run_id, step, kind, detail, wall_time) VALUES (?,?,?,?,?)",
                (run_id, step, kind, storable(detail), time.time()),
            )

    def add_eval(self, run_id: int, passed: bool, metrics: dict[str, Any], reasons: list[str]) -> int:
        with self.transaction():
            cur = self.conn.execute(
                "INSERT INTO evals (run_id, passed, metrics, reasons, created_at) VALUES (?,?,?,?,?)",
                (run_id, int(passed), json.dumps(metrics), json.dumps(reasons), time.time()),
            )
            return inserted_id(cur)

    # -- what the engine's loop asks of runs and commands ----------------------------------------

    def running_run_ids(self) -> list[int]:
        return [int(r[0]) for r in self.conn.execute("SELECT id FROM runs WHERE status='running'")]

    def run_names(self, source_id: int) -> list[str]:
        """The names of a source's runs, oldest first."""
        rows = self.conn.execute("SELECT name FROM runs WHERE source_id=? ORDER BY id", (source_id,))
        return [r[0] for r in rows]

    def running_commands(self, target: str) -> list[dict[str, Any]]:
        """Commands for `target` left 'running' (their args decoded), oldest first."""
        rows = self.conn.execute(
            "SELECT id, verb, args, run_id FROM commands WHERE target=? AND state='running' ORDER BY id",
            (target,),
        ).fetchall()
        return [{"id": r[0], "verb": r[1], "args": json.loads(r[2] or "{}"), "run_id": r[3]} for r in rows]

    def command_states(self, command_ids: Iterable[int]) -> dict[int, tuple[str, str | None]]:
        """id -> (state, result) of each of these commands there is."""
        states: dict[int, tuple[str, str | None]] = {}
        for chunk, marks in in_chunks(command_ids):
            rows = self.conn.execute(f"SELECT id, state, result FROM commands WHERE id IN ({marks})", chunk)
            states.update((int(r[0]), (r[1], r[2])) for r in rows)
        return states

    # -- key/value state (the agents plane, trajectory training, the engine's children) ----------

    def kv(self, key: str) -> Any:
        """The JSON value stored under `key`, or None."""
        row = self.conn.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def has_kv(self, key: str) -> bool:
        return self.conn.execute("SELECT 1 FROM kv WHERE key=?", (key,)).fetchone() is not None

    def kv_texts(self, low: str, high: str) -> list[tuple[str, str]]:
        """(key, its JSON text) of every key in [low, high), in key order: the caller decodes each, so one
        damaged value costs only itself."""
        return self.conn.execute(
            "SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key", (low, high)
        ).fetchall()

    def set_kv(self, key: str, value: Any) -> None:
        with self.transaction():
            self.conn.execute(
                "INSERT INTO kv (key, value, updated_at) VALUES (?,?,?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value, updated_at=excluded.updated_at",
                (key, json.dumps(value), time.time()),
            )

    def set_run_stage(self, run_id: int, text: str) -> None:
        """What a starting run is doing before its first step (importing torch, building the model, the
        warm-up's first step): the control room's status line says it, so a run's first minute is not
        silent. A run's first step supersedes it."""
        self.set_kv(RUN_STAGE_KEY.format(run_id), {"text": storable(text)[:200], "at": time.time()})

    # -- experiments ---------------------------------------------------------------------------

    def create_experiment(
        self,
        name: str,
        config: dict[str, Any],
        arms: Sequence[str],
        seeds: Sequence[int],
        steps: int,
        warmup_steps: int,
    ) -> int:
        """A new experiment with one pending cell per arm and seed."""
        now = time.time()
        with self.transaction():
            cur = self.conn.execute(
                "INSERT INTO experiments (name, config, arms, seeds, steps, warmup_steps, status, created_at,"
                " updated_at) VALUES (?,?,?,?,?,?,'running',?,?)",
                (
                    name,
                    json.dumps(config),
                    json.dumps(list(arms)),
                    json.dumps(list(seeds)),
                    steps,
                    warmup_steps,
                    now,
                    now,
                ),
            )
            experiment_id = inserted_id(cur)
            self.conn.executemany(
                "INSERT INTO experiment_runs (experiment_id, arm, seed, status, updated_at)"
                " VALUES (?,?,?,?,?)",
                [(experiment_id, arm, seed, "pending", now) for arm in arms for seed in seeds],
            )
        return experiment_id

    def extend_experiment(self, experiment_id: int, arms: Sequence[str], seeds: Sequence[int]) -> None:
        """The experiment's arms and seeds become these (a superset); each new cell starts pending."""
        now = time.time()
        with self.transaction():
            self.conn.execute(
                "UPDATE experiments SET arms=?, seeds=?, status='running', updated_at=? WHERE id=?",
                (json.dumps(list(arms)), json.dumps(list(seeds)), now, experiment_id),
            )
            self.conn.executemany(
                "INSERT OR IGNORE INTO experiment_runs (experiment_id, arm, seed, status, updated_at)"
                " VALUES (?,?,?,?,?)",
                [(experiment_id, arm, seed, "pending", now) for arm in arms for seed in seeds],
            )

    def experiment(self, ref: str | int) -> dict[str, Any] | None:
        """An experiment by id (int) or name (str), its JSON columns decoded."""
        return read_experiment(self.conn, ref)

    def experiments(self) -> list[dict[str, Any]]:
        return read_experiments(self.conn)

    def experiment_runs(self, experiment_id: int) -> list[dict[str, Any]]:
        """The experiment's cells, in arm then seed order of insertion."""
        return read_experiment_runs(self.conn, experiment_id)

    def update_experiment(self, experiment_id: int, **fields: Any) -> None:
        self._update("experiments", "id=?", (experiment_id,), fields)

    def update_experiment_run(self, experiment_id: int, arm: str, seed: int, **fields: Any) -> None:
        self._update(
            "experiment_runs", "experiment_id=? AND arm=? AND seed=?", (experiment_id, arm, seed), fields
        )

    def _update(self, table: str, where: str, key: tuple[Any, ...], fields: dict[str, Any]) -> None:
        fields = {**fields, "updated_at": time.time()}
        assignments = ", ".join(f"{name}=?" for name in fields)
        with self.transaction():
            self.conn.execute(f"UPDATE {table} SET {assignments} WHERE {where}", (*fields.values(), *key))

    def truncate_run_after(self, run_id: int, step: int) -> int:
        """Forget what a run logged after `step` (a resume from the checkpoint at `step` replays
        those steps); rollups of the touched buckets are rebuilt. Returns metric rows removed."""
        with self.transaction():
            keys = [
                r[0]
                for r in self.conn.execute(
                    "SELECT DISTINCT key FROM metrics WHERE run_id=? AND step>?", (run_id, step)
                )
            ]
            removed = self.conn.execute(
                "DELETE FROM metrics WHERE run_id=? AND step>?", (run_id, step)
            ).rowcount
            for table in ("phi_stats", "samples", "gate_states", "events", "rollouts"):
                self.conn.execute(f"DELETE FROM {table} WHERE run_id=? AND step>?", (run_id, step))
            for key in keys:
                for level in ROLLUP_LEVELS:
                    self.conn.execute(
                        "DELETE FROM rollups WHERE run_id=? AND key=? AND level=? AND bucket>=?",
                        (run_id, key, level, (step + 1) // level),
                    )
                coarsest = ROLLUP_LEVELS[-1]
                self._refresh_rollups(run_id, key, (step // coarsest) * coarsest, step)
            self.conn.execute("UPDATE runs SET last_step=? WHERE id=?", (step, run_id))
            return removed

    # -- commands --------------------------------------------------------------------------

    def enqueue_command(
        self,
        verb: str,
        args: dict[str, Any] | None = None,
        *,
        target: str = "engine",
        run_id: int | None = None,
        origin: str = "cli",
    ) -> int:
        with self.transaction():
            return insert_command(self.conn, verb, args, target=target, run_id=run_id, origin=origin)

    def claim_commands(self, target: str, run_id: int | None = None) -> list[dict[str, Any]]:
        """Mark this target's pending commands running and return them, oldest first."""
        with self.transaction():
            if run_id is None:
                rows = self.conn.execute(
                    "SELECT id, verb, args, run_id FROM commands WHERE target=? AND state='pending'"
                    " ORDER BY id",
                    (target,),
                ).fetchall()
            else:
                rows = self.conn.execute(
                    "SELECT id, verb, args, run_id FROM commands WHERE target=? AND run_id=?"
                    " AND state='pending' ORDER BY id",
                    (target, run_id),
                ).fetchall()
            now = time.time()
            self.conn.executemany(
                "UPDATE commands SET state='running', started_at=? WHERE id=?", [(now, r[0]) for r in rows]
            )
        return [{"id": r[0], "verb": r[1], "args": json.loads(r[2] or "{}"), "run_id": r[3]} for r in rows]

    def finish_command(self, command_id: int, ok: bool, result: str) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE commands SET state=?, result=?, finished_at=? WHERE id=?",
                ("done" if ok else "failed", result, time.time(), command_id),
            )

    # -- chat ------------------------------------------------------------------------------

    def add_chat_message(
        self,
        conversation_id: int | None,
        run_id: int | None,
        role: str,
        content: str,
        meta: dict[str, Any] | None = None,
    ) -> tuple[int, int]:
        """Append a message, creating the conversation when none is given; returns (conv, msg)."""
        with self.transaction():
            return insert_chat_message(self.conn, conversation_id, run_id, role, content, meta)

    # -- sources ---------------------------------------------------------------------------

    def upsert_source(self, kind: str, path: str, *, name: str | None, follow: bool) -> int:
        now = time.time()
        with self.transaction():
            row = self.conn.execute("SELECT id FROM sources WHERE path=?", (path,)).fetchone()
            if row:
                self.conn.execute(
                    "UPDATE sources SET follow=?, name=coalesce(?, name), state=CASE WHEN ? THEN"
                    " 'following' ELSE state END, last_error=NULL, updated_at=? WHERE id=?",
                    (int(follow), name, int(follow), now, row[0]),
                )
                return int(row[0])
            cur = self.conn.execute(
                "INSERT INTO sources (kind, path, name, follow, state, cursor, created_at, updated_at)"
                " VALUES (?,?,?,?,?, '{}', ?, ?)",
                (kind, path, name, int(follow), "following" if follow else "done", now, now),
            )
            return inserted_id(cur)

    def source(self, source_id: int) -> dict[str, Any]:
        cur = self.conn.execute("SELECT * FROM sources WHERE id=?", (source_id,))
        cols = [d[0] for d in cur.description]
        row = cur.fetchone()
        if row is None:
            raise StoreError(f"no source with id {source_id}")
        record = dict(zip(cols, row, strict=True))
        record["cursor"] = json.loads(record["cursor"] or "{}")
        return record

    def followed_sources(self) -> list[dict[str, Any]]:
        ids = [r[0] for r in self.conn.execute("SELECT id FROM sources WHERE follow=1 AND state='following'")]
        return [self.source(i) for i in ids]

    def save_source_progress(
        self,
        source_id: int,
        cursor: dict[str, Any],
        *,
        rows: int = 0,
        bad_lines: int = 0,
        state: str | None = None,
        error: str | None = None,
    ) -> None:
        """Record a source's cursor; call inside the transaction that wrote the rows it covers."""
        with self.transaction():
            self.conn.execute(
                "UPDATE sources SET cursor=?, rows=rows+?, bad_lines=bad_lines+?,"
                " state=coalesce(?, state), last_error=?, updated_at=? WHERE id=?",
                (json.dumps(cursor), rows, bad_lines, state, error, time.time(), source_id),
            )

    # -- engine heartbeat ------------------------------------------------------------------

    def engine_heartbeat(self, pid: int, host: str, version: str, *, started: bool = False) -> None:
        now = time.time()
        with self.transaction():
            if started:
                self.conn.execute(
                    "INSERT OR REPLACE INTO engine"
                    " (id, pid, host, state, started_at, heartbeat_at, stopped_at, version)"
                    " VALUES (1, ?, ?, 'up', ?, ?, NULL, ?)",
                    (pid, host, now, now, version),
                )
            else:
                self.conn.execute("UPDATE engine SET heartbeat_at=? WHERE id=1 AND pid=?", (now, pid))

    def engine_stopped(self, pid: int) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE engine SET state='stopped', stopped_at=? WHERE id=1 AND pid=?", (time.time(), pid)
            )


PHI_METRIC_KEYS = {
    "phi_mean": "phi/mean",
    "phi_p10": "phi/p10",
    "phi_p50": "phi/p50",
    "phi_p90": "phi/p90",
    "entropy_mean": "phi/entropy",
}


SMALL_FOLD = 32  # rows of one key folded in plain Python; numpy's fixed cost per call is larger below this


def _fold_small(
    run_id: int, key: str, step_list: list[int], value_list: list[float]
) -> list[tuple[Any, ...]]:
    """The rollup upserts of one key's few new rows, as `Store._merge_rollups` computes them with numpy: per
    bucket the count of values, their min, max and sum (NaN when none), the first and last step, and the value
    at the last step."""
    pairs = sorted(zip(step_list, value_list, strict=True))
    out: list[tuple[Any, ...]] = []
    for level in ROLLUP_LEVELS:
        bucket: int | None = None
        chunk: list[tuple[int, float]] = []
        for step, value in pairs:
            b = step // level
            if b != bucket:
                if bucket is not None:
                    out.append(_bucket_row(run_id, key, level, bucket, chunk))
                bucket, chunk = b, []
            chunk.append((step, value))
        if bucket is not None:
            out.append(_bucket_row(run_id, key, level, bucket, chunk))
    return out


def _bucket_row(
    run_id: int, key: str, level: int, bucket: int, chunk: list[tuple[int, float]]
) -> tuple[Any, ...]:
    valid = [v for _, v in chunk if v == v]
    if not valid:
        low = high = total = math.nan
    else:  # as numpy's reduceat: the sum runs over every value, a NaN counted as 0.0
        zeroed = [v if v == v else 0.0 for _, v in chunk]
        low, high, total = min(valid), max(valid), sum(zeroed[1:], zeroed[0])
    return (run_id, key, level, bucket, len(valid), low, high, total, chunk[0][0], chunk[-1][0], chunk[-1][1])
