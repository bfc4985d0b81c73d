"""Schema of carl.db and its forward migrations.

The version lives in `PRAGMA user_version`; `PRAGMA application_id` marks the file as ours so
that pointing carl at somebody else's SQLite file is refused instead of "migrated".
Each migration runs once, in its own transaction, and never rewrites data it does not own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # sqlite-utils is only needed by writers; keep this module light
    import sqlite_utils

APPLICATION_ID = 0x4341524C  # "CARL"

# Rollup levels: bucket widths in steps, 4x apart. A chart reads the finest level that keeps a
# series under about 2,000 buckets (a few per braille dot column), so drawing a 1,000,000-step
# series costs about a thousand rows instead of a million.
ROLLUP_LEVELS = (4, 16, 64, 256, 1024, 4096)


def _v1(db: sqlite_utils.Database) -> None:
    db.table("runs").create(
        {
            "id": int,
            "name": str,
            "source_kind": str,  # carl | trackio | trainer_state | jsonl | callback
            "source_path": str,
            "source_id": int,
            "external_id": str,  # the source's own run id (Trackio run_id), "" when it has none
            "status": str,  # running | paused | finished | failed | stopped | imported
            "config": str,  # JSON
            "backend": str,
            "model": str,
            "max_steps": int,
            "vocab_size": int,
            "last_step": int,
            "last_update": float,  # wall time of the newest row written for this run
            "started_at": float,
            "ended_at": float,
            "phase": str,
            "health": str,  # green | yellow | red
            "health_reasons": str,  # JSON list of strings
            "created_at": float,
            "updated_at": float,
        },
        pk="id",
        not_null={"name", "source_kind", "status", "created_at"},
        defaults={"status": "running", "external_id": "", "config": "{}", "health_reasons": "[]"},
    )
    db.table("runs").create_index(["name"], unique=True)
    db.table("runs").create_index(["source_id", "external_id"])

    db.table("metrics").create(
        {"id": int, "run_id": int, "step": int, "key": str, "value": float, "wall_time": float},
        pk="id",
        not_null={"run_id", "step", "key"},
        foreign_keys=[("run_id", "runs", "id")],
    )
    # One value per (run, key, step): re-importing a source never duplicates a row.
    db.table("metrics").create_index(["run_id", "key", "step"], unique=True)
    db.table("metrics").create_index(["run_id", "id"])

    db.execute(
        """
        CREATE TABLE rollups (
            run_id INTEGER NOT NULL,
            key TEXT NOT NULL,
            level INTEGER NOT NULL,
            bucket INTEGER NOT NULL,
            n INTEGER NOT NULL,
            vmin REAL,
            vmax REAL,
            vsum REAL,
            first_step INTEGER NOT NULL,
            last_step INTEGER NOT NULL,
            last_value REAL,
            PRIMARY KEY (run_id, key, level, bucket)
        ) WITHOUT ROWID
        """
    )

    db.table("phi_stats").create(
        {
            "id": int,
            "run_id": int,
            "step": int,
            "phi_mean": float,
            "phi_p10": float,
            "phi_p50": float,
            "phi_p90": float,
            "entropy_mean": float,  # nats
            "tokens": int,
            "weighting": str,  # token | completion
            "vocab_size": int,
            "hist": str,  # JSON list of counts over [0, 1] in equal bins
            "wall_time": float,
        },
        pk="id",
        not_null={"run_id", "step"},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("phi_stats").create_index(["run_id", "step"], unique=True)

    db.table("samples").create(
        {
            "id": int,
            "run_id": int,
            "step": int,
            "idx": int,
            "kind": str,  # best | worst | median | random
            "prompt": str,
            "completion": str,
            "phi": str,  # JSON per-token Phi
            "entropy": str,  # JSON per-token entropy, nats
            "rewards": str,  # JSON {function: value}
            "wall_time": float,
        },
        pk="id",
        not_null={"run_id", "step"},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("samples").create_index(["run_id", "step"])

    db.table("commands").create(
        {
            "id": int,
            "target": str,  # "engine" or "run"
            "run_id": int,
            "verb": str,
            "args": str,  # JSON
            "state": str,  # pending | running | done | failed
            "result": str,
            "origin": str,  # tui | cli | engine
            "created_at": float,
            "started_at": float,
            "finished_at": float,
        },
        pk="id",
        not_null={"target", "verb", "state", "created_at"},
        defaults={"state": "pending", "args": "{}"},
    )
    db.table("commands").create_index(["target", "state", "id"])

    db.table("conversations").create(
        {"id": int, "run_id": int, "title": str, "created_at": float, "updated_at": float},
        pk="id",
    )
    db.table("chat_messages").create(
        {
            "id": int,
            "conversation_id": int,
            "run_id": int,
            "role": str,
            "content": str,
            "meta": str,
            "created_at": float,
        },
        pk="id",
        foreign_keys=[("conversation_id", "conversations", "id")],
    )
    db.table("chat_messages").create_index(["conversation_id", "id"])

    db.table("trajectories").create(
        {
            "id": int,
            "uid": str,  # stable identity from the source, for idempotent re-import
            "session_id": str,
            "agent": str,  # claude-code | codex | karl | worker
            "source": str,
            "domain": str,
            "prompt": str,
            "tool_count": int,
            "success_rate": float,
            "reward": float,
            "advantage": float,
            "signals": str,  # JSON
            "started_at": float,
            "ended_at": float,
            "created_at": float,
        },
        pk="id",
    )
    db.table("trajectories").create_index(["uid"], unique=True)
    db.table("trajectory_events").create(
        {
            "id": int,
            "trajectory_id": int,
            "seq": int,
            "tool": str,
            "ok": int,
            "params": str,
            "ts": float,
        },
        pk="id",
        foreign_keys=[("trajectory_id", "trajectories", "id")],
    )
    db.table("trajectory_events").create_index(["trajectory_id", "seq"])

    db.table("agent_events").create(
        {
            "id": int,
            "subject": str,
            "kind": str,
            "task_id": str,
            "manager_id": str,
            "worker_id": str,
            "score": float,
            "payload": str,
            "created_at": float,
        },
        pk="id",
    )

    db.table("sources").create(
        {
            "id": int,
            "kind": str,  # trackio | trainer_state | jsonl
            "path": str,
            "name": str,  # requested run name, if any
            "follow": int,
            "state": str,  # following | done | error
            "cursor": str,  # JSON, format specific; committed with the rows it covers
            "rows": int,
            "bad_lines": int,
            "last_error": str,
            "created_at": float,
            "updated_at": float,
        },
        pk="id",
        not_null={"kind", "path", "state", "created_at"},
        defaults={"cursor": "{}", "rows": 0, "bad_lines": 0, "follow": 0},
    )
    db.table("sources").create_index(["path"], unique=True)

    db.table("engine").create(
        {
            "id": int,
            "pid": int,
            "host": str,
            "state": str,  # up | stopped
            "started_at": float,
            "heartbeat_at": float,
            "stopped_at": float,
            "version": str,
        },
        pk="id",
    )


def _v2(db: sqlite_utils.Database) -> None:
    """Training runs of our own: runner process, checkpoints, failure reason; the cascade gate's
    state per step; chart events (gate opened, crystallization, checkpoints); eval results."""
    for column, kind in (
        ("pid", int),
        ("output_dir", str),
        ("error", str),
        ("last_checkpoint", str),
        ("last_checkpoint_step", int),
        ("temperature", float),
    ):
        db.table("runs").add_column(column, kind)
    db.table("samples").add_column("tokens", str)  # JSON list of the completion's decoded tokens
    db.table("gate_states").create(
        {
            "id": int,
            "run_id": int,
            "step": int,
            "state": str,  # closed | ramping | open
            "threshold": float,
            "history": int,
            "above": int,
            "window": int,
            "multiplier": float,
            "reason": str,
            "wall_time": float,
        },
        pk="id",
        not_null={"run_id", "step", "state"},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("gate_states").create_index(["run_id", "step"], unique=True)
    db.table("events").create(
        {"id": int, "run_id": int, "step": int, "kind": str, "detail": str, "wall_time": float},
        pk="id",
        not_null={"run_id", "kind"},
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("events").create_index(["run_id", "kind", "step"], unique=True)
    db.table("evals").create(
        {"id": int, "run_id": int, "passed": int, "metrics": str, "reasons": str, "created_at": float},
        pk="id",
        foreign_keys=[("run_id", "runs", "id")],
    )
    db.table("evals").create_index(["run_id", "id"])


def _v3(db: sqlite_utils.Database) -> None:
    """Trajectory intelligence: what a scored turn needs beyond v1's columns, raw hook payloads
    (durable before they are assembled into turns), per-domain baselines, and small engine state."""
    for column, kind in (
        ("cwd", str),
        ("repo", str),
        ("skill", str),
        ("turn_index", int),
        ("duration_s", float),
        ("total_tools", int),
        ("failures", int),
        ("components", str),
        ("outcome", str),
        ("fingerprint", str),
        ("grade", str),
        ("holdout", int),
        ("updated_at", float),
    ):
        db.table("trajectories").add_column(column, kind)
    db.table("trajectories").create_index(["domain"])
    db.table("trajectories").create_index(["session_id", "started_at"])
    for column, kind in (("exit_code", int), ("duration_ms", float)):
        db.table("trajectory_events").add_column(column, kind)
    db.table("hook_events").create(
        {"id": int, "session_id": str, "event": str, "received_at": float, "payload": str, "assembled": int},
        pk="id",
    )
    db.table("hook_events").create_index(["session_id", "id"])
    db.table("hook_events").create_index(["assembled"])
    db.table("trajectory_domains").create(
        {"domain": str, "n": int, "mean": float, "baseline": float, "sigma": float, "updated_at": float},
        pk="domain",
    )
    db.table("kv").create({"key": str, "value": str, "updated_at": float}, pk="key")


def _v4(db: sqlite_utils.Database) -> None:
    """The agents plane: the audit of every event (idempotent per stream sequence, rejected payloads
    kept with their reason), one row per task with its result and scores, one row per worker."""
    for column, kind in (
        ("environment", str),
        ("model_version", str),
        ("stream_seq", int),
        ("stream_key", str),
        ("msg_id", str),
        ("received_at", float),
        ("status", str),
        ("reason", str),
    ):
        db.table("agent_events").add_column(column, kind)
    # `stream_key` is "<the stream's creation time>:<sequence>": a stream made anew restarts its
    # sequence at 1, and those events must not pass for ones already stored.
    db.execute(
        "CREATE UNIQUE INDEX idx_agent_events_stream_key ON agent_events (stream_key)"
        " WHERE stream_key IS NOT NULL"
    )
    db.table("agent_events").create_index(["kind", "id"])
    db.table("agent_events").create_index(["task_id"])
    db.table("agent_events").create_index(["worker_id", "id"])
    db.table("agent_tasks").create(
        {
            "task_id": str,
            "task_type": str,
            "environment": str,
            "prompt": str,
            "reference": str,
            "verifier": str,
            "group_id": str,
            "manager_id": str,
            "state": str,  # assigned | done | failed | timed_out
            "worker_id": str,
            "assigned_at": float,
            "done_at": float,
            "status": str,  # the result's: success | failed
            "result": str,  # the whole reply (or the failure's reason)
            "answer": str,
            "steps": str,  # JSON list
            "step_scores": str,  # JSON list, PRM per step in [0, 1]
            "prm_score": float,
            "outcome_score": float,
            "verifier_score": float,
            "reward": float,
            "feedback_score": float,
            "feedback_text": str,
            "feedback_source": str,
            "model_version": str,
            "elapsed_s": float,
            "phi_mean": float,
            "tokens": int,  # generated tokens the rollout carries (0: it cannot train the local model)
            "updated_at": float,
        },
        pk="task_id",
    )
    db.table("agent_tasks").create_index(["state"])
    db.table("agent_tasks").create_index(["worker_id"])
    db.table("agent_workers").create(
        {
            "worker_id": str,
            "kind": str,
            "task_types": str,  # JSON list
            "model": str,
            "model_version": str,
            "state": str,  # starting | idle | busy | stopping | stopped | error
            "task_id": str,
            "tasks_done": int,
            "failures": int,
            "score_n": int,
            "score_sum": float,
            "host": str,
            "pid": int,
            "detail": str,
            "first_seen": float,
            "last_seen": float,
        },
        pk="worker_id",
        defaults={"tasks_done": 0, "failures": 0, "score_n": 0, "score_sum": 0.0},
    )


def _v5(db: sqlite_utils.Database) -> None:
    """Experiments: arms x seeds of real runs, each arm-seed cell with its run and its held-out result."""
    db.table("experiments").create(
        {
            "id": int,
            "name": str,
            "config": str,  # JSON: the base TrainConfig every arm derives from
            "arms": str,  # JSON list, in the order given
            "seeds": str,  # JSON list of ints
            "steps": int,  # GRPO steps of each GRPO arm
            "warmup_steps": int,  # SFT steps of the shared warm-up (the sft-only arm)
            "status": str,  # running | finished | partial (some cell failed, crashed or was stopped)
            "created_at": float,
            "updated_at": float,
        },
        pk="id",
        not_null={"name", "config", "arms", "seeds", "status"},
    )
    db.table("experiments").create_index(["name"], unique=True)
    db.table("experiment_runs").create(
        {
            "experiment_id": int,
            "arm": str,  # sft-only | task-only | cascade | always-on
            "seed": int,
            "run_id": int,  # the run of this cell's newest attempt (NULL until it starts)
            "status": str,  # pending | running | finished | failed | stopped | crashed
            "error": str,
            "eval_id": int,  # the held-out eval of the run, once done
            "task": float,  # held-out mean task reward
            "solved": float,  # held-out share solved
            "gate_step": int,  # the step the cascade gate opened (NULL: never, or no gate)
            "final_phi": float,  # mean Phi of the run's last step
            "updated_at": float,
        },
        pk=("experiment_id", "arm", "seed"),
        foreign_keys=[("experiment_id", "experiments", "id")],
        defaults={"status": "pending"},
    )


def _v6(db: sqlite_utils.Database) -> None:
    """Runs of any RL framework, and the rollouts of every source in one table.

    A run says which framework wrote it (told from its keys); `run_keys` keeps, for each key a framework's
    key map renamed, the name the source used. `rollouts` holds the samples of every source: our own GRPO
    runs, TRL's completions parquet, veRL's and prime-rl's dumps, verifiers' results. A rollout source row
    names the source whose run its samples join (`sources.attach_to`)."""
    db.table("runs").add_column("framework", str)
    db.table("sources").add_column("attach_to", int)
    db.execute(
        """
        CREATE TABLE run_keys (
            run_id INTEGER NOT NULL,
            key TEXT NOT NULL,
            source_key TEXT NOT NULL,
            PRIMARY KEY (run_id, key)
        ) WITHOUT ROWID
        """
    )
    db.execute(
        """
        CREATE TABLE rollouts (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            step INTEGER NOT NULL,
            idx INTEGER NOT NULL,  -- the sample's place in its step, in the source's order
            group_id TEXT NOT NULL DEFAULT '',  -- the prompt group (GRPO); '' when the source has none
            prompt TEXT,
            completion TEXT,
            rewards TEXT,  -- JSON {reward function: value}
            total REAL,
            advantage REAL,
            length INTEGER,  -- completion tokens (characters when the source has no tokens)
            extra TEXT,  -- JSON: the source's other fields
            tokens TEXT,  -- JSON list of the completion's tokens, as text (our own runs)
            entropy BLOB,  -- per token, nats, float16 little-endian (our own runs)
            logprob BLOB,  -- the chosen token's log-probability, float16 little-endian (our own runs)
            wall_time REAL
        )
        """
    )
    # One row per (run, step, idx): a source read again after a crash adds nothing twice.
    db.execute("CREATE UNIQUE INDEX idx_rollouts_run_step_idx ON rollouts (run_id, step, idx)")


def _v7(db: sqlite_utils.Database) -> None:
    """The orders the rollouts viewer lists a run's samples in: by total reward, advantage or length. A page
    of the best (or worst, longest...) samples is read along one of these indexes from the last row shown
    (keyset paging, engine/store/rollout_reads.py), never by sorting the run's rows. Within one step the
    unique (run_id, step, idx) index finds the step's rows and they are sorted there: a step holds at most a
    few thousand. Each index adds about a tenth to a rollout's insert (bench/bench_rollouts_view.py)."""
    for column in ("total", "advantage", "length"):
        db.execute(f"CREATE INDEX idx_rollouts_run_{column} ON rollouts (run_id, {column})")


def _v8(db: sqlite_utils.Database) -> None:
    """The agents plane keeps up, and its trainer loses nothing.

    The hot tables keep only the indexes something reads. The audit maintains every index of agent_events
    and agent_tasks for each event it stores (the plane's rate is bounded by that writer); these three
    cost about 2 us an event, 7% of the writer (bench/bench_agents.py), and no query needs them:
    agent_tasks is read by its task_id only, and agent_events by worker only in `carl agents audit
    --worker`, which reads the newest events backwards until it has enough.

    `trainer_rollouts` holds each rollout the plane's trainer took, stored before it is acknowledged on the
    stream, with the step that trained it (engine/agents/spool.py): a trainer killed at any moment loses
    none, and trains each exactly once."""
    for name in ("idx_agent_tasks_state", "idx_agent_tasks_worker_id", "idx_agent_events_worker_id_id"):
        db.execute(f"DROP INDEX IF EXISTS {name}")
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS trainer_rollouts (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            task_id TEXT NOT NULL,
            group_id TEXT NOT NULL,
            payload TEXT,  -- the rollout event as it came; cleared once a checkpoint holds its step
            received_at REAL NOT NULL,
            state TEXT NOT NULL,  -- waiting | used | dropped
            step INTEGER,  -- the optimizer step that trained it
            PRIMARY KEY (run_id, task_id)
        ) WITHOUT ROWID
        """
    )


def _v9(db: sqlite_utils.Database) -> None:
    """The box: every node's system samples, the processes of each run, and its console.

    `nodes` holds each machine the engine hears from (this one, and those joined over NATS: `carl node`).
    `system_samples` are the raw time series of a node (one row per key and sample time; the newest RAW_KEEP_S
    per series, engine/store/system.py), `system_rollups` their minute and quarter-hour aggregates for longer
    windows, `system_now` the newest whole sample of each node (per core, per GPU with its processes, the
    notes: what the System pane draws). `run_processes` has one row per process of a run (a runner, a rank, a
    launcher, a process found working in an observed run's directory), with its end. `run_consoles` names a
    run's log files (what the log view opens and what is scanned for tracebacks), `console_findings` what the
    scan found: a traceback, CUDA out of memory, an NCCL error. `node_rejected` keeps what a node sent that
    could not be stored, with the reason (as the agents audit does); `node_consoles` the log files a node
    follows, appended to files of the engine's home, with how far each got (engine/nodes/writer.py)."""
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS nodes (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,  -- the host name, or what `carl node --name` gave
            host TEXT,
            via TEXT NOT NULL,  -- local (this engine samples it) | nats (a `carl node` publishes it)
            state TEXT NOT NULL,  -- live | lost | stopped
            info TEXT NOT NULL DEFAULT '{}',  -- JSON: cores, memory, GPUs by index (name, uuid, memory)
            note TEXT,  -- one line: "no NVIDIA GPU: NVML not found", the reason it was lost
            first_seen REAL NOT NULL,
            last_seen REAL NOT NULL,
            lost_at REAL
        )
        """
    )
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS node_consoles (
            id INTEGER PRIMARY KEY,
            node_id INTEGER NOT NULL,
            name TEXT NOT NULL,  -- the console's name as the node gave it (its log file's name)
            source TEXT,  -- the log's path on the node, as text: shown, never opened here
            path TEXT NOT NULL,  -- the file under $CARL_HOME/nodes/<node id>/ its lines are appended to
            run_id INTEGER,  -- the run it belongs to (`carl node --run`), once that run is in the store
            epoch TEXT,  -- the node's follow state the lines come from ...
            n INTEGER NOT NULL DEFAULT 0,  -- ... and the last of its messages appended: a repeat is skipped
            length INTEGER NOT NULL DEFAULT 0,  -- bytes of `path` committed (more after a crash: cut back)
            lines INTEGER NOT NULL DEFAULT 0,  -- lines appended since the node first sent it
            updated_at REAL NOT NULL
        )
        """
    )
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS idx_node_consoles_name ON node_consoles (node_id, name)")
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS system_samples (
            node_id INTEGER NOT NULL,
            key TEXT NOT NULL,
            t REAL NOT NULL,  -- wall time of the sample
            value REAL,
            PRIMARY KEY (node_id, key, t)
        ) WITHOUT ROWID
        """
    )
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS system_rollups (
            node_id INTEGER NOT NULL,
            key TEXT NOT NULL,
            width INTEGER NOT NULL,  -- seconds per bucket
            bucket INTEGER NOT NULL,  -- floor(t / width)
            n INTEGER NOT NULL,
            vmin REAL,
            vmax REAL,
            vsum REAL,
            last_t REAL NOT NULL,
            last_value REAL,
            PRIMARY KEY (node_id, key, width, bucket)
        ) WITHOUT ROWID
        """
    )
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS system_now (
            node_id INTEGER PRIMARY KEY,
            t REAL NOT NULL,
            sample TEXT NOT NULL  -- JSON: the newest whole sample (engine/system/readings.py)
        )
        """
    )
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS run_processes (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            node_id INTEGER NOT NULL,
            pid INTEGER NOT NULL,
            started REAL NOT NULL,  -- the process's start time: with the pid it names one process
            role TEXT NOT NULL,  -- runner | launcher | rank | observed
            rank INTEGER,
            cmdline TEXT,
            state TEXT NOT NULL,  -- running | sleeping | stopped | zombie | ended
            cpu REAL,  -- percent of one core over the last interval
            rss INTEGER,  -- bytes
            gpu_mem INTEGER,  -- bytes on every GPU together (NVML), NULL when unknown
            gpus TEXT,  -- JSON list of the GPU indexes it holds memory on
            seen_at REAL NOT NULL,  -- when the row was last written: seen alive, or its end recorded
            ended_at REAL,
            exit_code INTEGER,  -- when it exited
            signal INTEGER,  -- when a signal ended it
            end_step INTEGER,  -- the run's last step when its end was seen
            end_reason TEXT,  -- one line, e.g. "rank 1 (pid 4242) killed by SIGKILL at step 812"
            died INTEGER NOT NULL DEFAULT 0  -- 1: it died while its run was live (health's rank_died)
        )
        """
    )
    db.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_run_processes_one"
        " ON run_processes (run_id, node_id, pid, started)"
    )
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS run_consoles (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            node_id INTEGER,
            path TEXT NOT NULL,
            kind TEXT NOT NULL,  -- train (our runs' log) | wandb (files/output.log) | user (--log) | node
            scanned INTEGER NOT NULL DEFAULT 0,  -- bytes of it scanned for findings
            identity TEXT,  -- JSON: device, inode, size when scanned (rotated or truncated: starts over)
            added_at REAL NOT NULL
        )
        """
    )
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS idx_run_consoles_path ON run_consoles (run_id, path)")
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS console_findings (
            id INTEGER PRIMARY KEY,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            console_id INTEGER NOT NULL,
            kind TEXT NOT NULL,  -- traceback | oom | nccl
            offset INTEGER NOT NULL,  -- byte offset of its first line in the file
            line TEXT NOT NULL,  -- the line that says what went wrong (the exception, the error)
            line_no INTEGER,  -- the file's line number (from 1) of its first line
            t REAL NOT NULL
        )
        """
    )
    db.execute(
        "CREATE UNIQUE INDEX IF NOT EXISTS idx_console_findings_at ON console_findings (console_id, offset)"
    )
    db.execute("CREATE INDEX IF NOT EXISTS idx_console_findings_run ON console_findings (run_id, id)")
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS node_rejected (
            id INTEGER PRIMARY KEY,
            node TEXT,  -- the name the message gave, as text
            subject TEXT NOT NULL,
            reason TEXT NOT NULL,  -- one line: what was wrong, and where (the field)
            payload TEXT,  -- its first characters, as text
            received_at REAL NOT NULL
        )
        """
    )


def _v10(db: sqlite_utils.Database) -> None:
    """Issue 29: what today's trackers write beside metrics. Each part of the issue keeps its own block."""
    _v10_histograms(db)


def _v10_histograms(db: sqlite_utils.Database) -> None:
    """Histograms of observed runs (i29-traces): TensorBoard's `add_histogram`, Trackio's and W&B's
    `Histogram`.

    One row per run, key and step: the bucket edges (n + 1) and counts (n), each packed as float64
    little-endian (engine/store/histograms.py); a run keeps a bounded number of keys and of steps per key,
    thinned like rollouts. The explorer draws a key as a heat strip over steps."""
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS histograms (
            run_id INTEGER NOT NULL REFERENCES runs(id),
            key TEXT NOT NULL,
            step INTEGER NOT NULL,
            edges BLOB NOT NULL,  -- n + 1 increasing bucket edges, float64 little-endian
            counts BLOB NOT NULL,  -- n counts, float64 little-endian
            wall_time REAL,
            PRIMARY KEY (run_id, key, step)
        ) WITHOUT ROWID
        """
    )


def _v11(db: sqlite_utils.Database) -> None:
    """Issue 32: the agents plane learns from the manager's words, and the manager is judged.

    agent_tasks keeps each task's hint (its text and where it came from: verifier, error, feedback, claude,
    manager_model) as the audit reads it from `opd.hints`, and, once the plane's trainer distilled from it,
    the step, the answer's token texts and their OPD advantages (float16 little-endian, as rollouts keep
    per-token values) and the sample's teacher/student KL. `agent_judgements` is the manager's judged
    quality as a series: one row per `opd.judged` event (agreement with the verifier, or a hint's help),
    read newest first by kind along its index."""
    have = {row[1] for row in db.execute("PRAGMA table_info(agent_tasks)").fetchall()}
    for column, kind in (
        ("hint", "TEXT"),
        ("hint_source", "TEXT"),
        ("opd_step", "INTEGER"),
        ("opd_tokens", "TEXT"),  # JSON list of the answer's token texts
        ("opd_advantage", "BLOB"),  # per token, float16 little-endian
        ("opd_kl", "REAL"),
    ):
        if column not in have:  # a store whose version was set back runs this again: what exists is kept
            db.execute(f"ALTER TABLE agent_tasks ADD COLUMN {column} {kind}")
    db.execute(
        """
        CREATE TABLE IF NOT EXISTS agent_judgements (
            id INTEGER PRIMARY KEY,
            task_id TEXT NOT NULL,
            manager_id TEXT,
            worker_id TEXT,
            kind TEXT NOT NULL,  -- agreement | hint_help
            value REAL NOT NULL,
            next_task_id TEXT,
            created_at REAL,
            received_at REAL NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX IF NOT EXISTS idx_agent_judgements_kind ON agent_judgements (kind, id)")


MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [
    _v1,
    _v2,
    _v3,
    _v4,
    _v5,
    _v6,
    _v7,
    _v8,
    _v9,
    _v10,
    _v11,
]
SCHEMA_VERSION = len(MIGRATIONS)
