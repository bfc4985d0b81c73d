"""What the control room shows, read from the store: no Textual here, so tests and benches use it.

`StoreWatcher.poll()` is cheap when nothing changed (one `PRAGMA data_version`); when the
store moved it re-reads the run list and extends the selected run's series with the rows
that arrived since the last poll. What the control room wants read (the selected run, the
compared runs, the followed experiment, the commands to watch) reaches it through a request
queue that each poll drains first, so the polling thread alone owns the watcher's state
(Toolong's LineReader, fed by a request queue).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import queue
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.durations import compact_duration
from engine.store import RunRow, Series, StoreError, StoreReader
from engine.store.commands import Verb

from .shown_errors import ONE_LINE

PHI_KEYS = ("phi/mean", "phi/p10", "phi/p90", "phi/entropy", "entropy")
REWARD_KEY = re.compile(r"^rewards/(?P<name>.+)/mean$")
TOTAL_REWARD_KEYS = ("reward",)
# What a comparison of runs draws of each run: its Φ mean, its total reward and its task reward.
COMPARE_KEYS = ("phi/mean", "reward", "rewards/task/mean")
# A run's throughput, shown in the System pane when the run logs it (canonical names: docs/guide/system.md).
PERF_KEYS = (
    "perf/tokens_per_s",
    "perf/tokens_per_s_per_gpu",
    "perf/samples_per_s",
    "perf/step_time_s",
    "perf/mfu",
)
# Async RL, shown in the Rewards pane's title when the run logs it (canonical names:
# engine/observe/frameworks.py): the sampler/learner mismatch as a KL, else as a mean |Δ log p|, and the
# samples' staleness.
ASYNC_KEYS = ("mismatch/kl", "mismatch/logprob_abs_diff/mean", "staleness/mean")
# What the Agents pane shows of an event beyond its row: payload field -> key in the event dict.
PAYLOAD_FIELDS = {
    "alarm": {"kind": "alarm_kind", "reason": "alarm_reason"},
    "worker_status": {"state": "state", "detail": "detail"},
    "manager_status": {"state": "state", "done": "done", "total": "total"},
    "hint": {"hint": "hint", "source": "hint_source"},
    "judged": {"kind": "judged_kind", "value": "judged_value"},
}


@dataclass
class RunView:
    """Everything the panes draw for the selected run."""

    run: RunRow
    series: dict[str, Series] = field(default_factory=dict)
    reward_names: list[str] = field(default_factory=list)  # reward functions, in key order
    steps_per_s: float | None = None
    eta_s: float | None = None
    eta_label: str | None = None  # what the ETA is of when not the whole run ("warm-up")
    warmup_steps: int = 0  # SFT steps before GRPO: rewards start after them
    commands: list[dict[str, Any]] = field(default_factory=list)  # newest first: the audit log
    events: list[dict[str, Any]] = field(default_factory=list)  # gate opened, crystallization, ...
    gate: dict[str, Any] | None = None  # the cascade gate's newest state
    eval: dict[str, Any] | None = None  # the newest held-out evaluation (`carl eval`)
    perf: dict[str, float] = field(default_factory=dict)  # the newest of each PERF_KEYS the run logs
    async_rl: dict[str, float] = field(default_factory=dict)  # the newest of each ASYNC_KEYS the run logs

    def markers(self, *kinds: str) -> list[int]:
        return [e["step"] for e in self.events if e["kind"] in kinds and e["step"] is not None]

    def get(self, key: str) -> Series:
        return self.series.get(key) or Series.empty()

    def latest(self, key: str) -> float | None:
        s = self.series.get(key)
        return None if s is None else s.latest


@dataclass
class CompareRun:
    """One run of a comparison: the few series the overlaid charts draw (see COMPARE_KEYS)."""

    run: RunRow
    series: dict[str, Series] = field(default_factory=dict)

    def latest(self, key: str) -> float | None:
        s = self.series.get(key)
        return None if s is None else s.latest


@dataclass
class ExperimentView:
    """An experiment followed by the control room: its arms, seeds and the cells started so far."""

    id: int
    name: str
    arms: list[str]
    seeds: list[int]
    status: str
    cells: list[dict[str, Any]]  # arm, seed, run_id (None until the cell starts), status


@dataclass
class BoxView:
    """The machines, for the System pane: every node (its row), each one's newest whole sample and sampling
    interval by node id, and of the selected run its directory and its processes (live ones first)."""

    nodes: list[dict[str, Any]]
    samples: dict[int, dict[str, Any]]
    intervals: dict[int, float | None]
    run_id: int | None = None
    run_dir: str | None = None
    processes: list[dict[str, Any]] = field(default_factory=list)


# A train command done this long ago whose run has not opened yet is still starting (its process imports).
STARTED_RECENTLY_S = 120.0


@dataclass(frozen=True)
class Starting:
    """What is on its way before it shows: the selected run's stage while it has no step yet (what it said
    it is doing, `{"text", "at"}`), and the engine's commands that start a run or the agents plane (pending,
    running, or just done: engine/store/reader.py `starting_commands`)."""

    stage: dict[str, Any] | None = None
    commands: tuple[dict[str, Any], ...] = ()

    def queued_run(self, runs: list[RunRow]) -> dict[str, Any] | None:
        """The newest train command whose run is not in `runs` yet (by the name it asked for)."""
        names = {r.name for r in runs}
        for command in self.commands[::-1]:  # newest first
            name = command["args"].get("name") if isinstance(command["args"], dict) else None
            if command["verb"] == Verb.TRAIN and command["state"] != "failed" and name not in names:
                return command
        return None

    def plane_queued(self) -> bool:
        """An `agents_up` the engine has not carried out yet."""
        waiting = ("pending", "running")
        return any(c["verb"] == Verb.AGENTS_UP and c["state"] in waiting for c in self.commands)


@dataclass
class Snapshot:
    """One poll's news. `None` fields did not change since the previous snapshot."""

    version: int
    selected: int | None = None  # the run the watcher reads in full (it picks the newest when asked none)
    runs: list[RunRow] | None = None
    view: RunView | None = None
    trajectories: list[dict[str, Any]] | None = None
    trajectory_count: int | None = None
    domains: list[dict[str, Any]] | None = None  # per-domain reward baselines (with trajectories)
    plasticity: dict[str, Any] | None = None  # the retraining triggers the engine computed
    # The agents plane, read together when its signature moved: the newest events (newest first; an
    # alarm carries its kind and reason), how many there are, the workers, and the plane's state
    # (server, plane, manager, model: the kv rows engine/agents writes; judged: the manager's quality).
    agent_events: list[dict[str, Any]] | None = None
    agent_count: int | None = None
    agent_workers: list[dict[str, Any]] | None = None
    agent_overview: dict[str, Any] | None = None
    agent_task: dict[str, Any] | None = None  # the task whose card is open, when its rows moved
    # The compared runs by id, in the order asked for (None: unchanged), and the followed experiment.
    compare: dict[int, CompareRun] | None = None
    experiment: ExperimentView | None = None
    box: BoxView | None = None  # the machines and the selected run's processes (None: unchanged)
    commands: list[dict[str, Any]] = field(default_factory=list)  # commands that finished
    starting: Starting | None = None  # what is on its way (None: unchanged)
    source_errors: dict[str, str] | None = None  # path -> last error
    error: str | None = None  # the store itself could not be read

    def news(self) -> bool:
        """Whether the control room draws something new from it (the machine's samples alone often change no
        cell: the System pane redraws only the lines that moved)."""
        return any(
            value is not None
            for value in (
                self.runs,
                self.view,
                self.trajectories,
                self.agent_events,
                self.agent_task,
                self.compare,
                self.experiment,
                self.source_errors,
                self.error,
            )
        ) or bool(self.commands)


class FirstRead:
    """The watcher's first poll, made as soon as the store's path is known: `carl-tui` makes it
    before it imports Textual, so the first frame has the data without waiting for it.

    Inline, not on a thread: a thread reading while the main thread imports is starved of the
    GIL between its SQLite calls (measured on a 1,000,000-step run: 56 ms of wall time for a
    9 ms read, and the first frame waited ~10 ms for it)."""

    def __init__(self, watcher: StoreWatcher) -> None:
        self.watcher = watcher
        self.snapshot: Snapshot | None = watcher.poll()
        # The engine as the first frame should show it (the supervisor looks again after the first paint).
        self.engine_up, self.engine_stopped = engine_found(watcher)

    def take(self) -> Snapshot | None:
        """The snapshot, once: whoever applies it takes it."""
        snapshot, self.snapshot = self.snapshot, None
        return snapshot


def engine_found(watcher: StoreWatcher) -> tuple[bool, bool]:
    """Whether this home's engine is up, and whether the user stopped it: from its pidfile and its row, as
    `carl engine status` tells (engine/control/process.py), without starting or removing anything."""
    from engine.control.pidfile import is_our_engine, read_pidfile

    row = (watcher.reader.engine_row() if watcher.reader is not None else None) or {}
    record = read_pidfile(watcher.db_path.parent)
    up = record is not None and is_our_engine(record, row.get("heartbeat_at"), row.get("pid"))
    return up, not up and row.get("state") == "stopped"


class StoreWatcher:
    """Follows carl.db for one reader thread. Its state belongs to the thread that polls; any
    thread may ask for a change (select, compare, follow_experiment, watch_command): the request
    is queued and applied at the start of the next poll."""

    def __init__(self, db_path: Path, *, max_points: int = 2048) -> None:
        self.db_path = db_path
        self.max_points = max_points
        self.reader: StoreReader | None = None
        self.requests: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.selected: int | None = None
        self._version = -1
        self._runs: list[RunRow] = []
        self._view: RunView | None = None
        self._traj_count: tuple[int, float] | None = None
        self._agents_signature: tuple[int, float] | None = None
        self._box_signature: tuple[Any, ...] | None = None
        self._box_run: int | None = None  # the run whose processes the last box read has
        self._watched_commands: set[int] = set()
        self._source_errors: dict[str, str] = {}
        self._starting = Starting()
        # A poll reads the store again while what was asked differs from what it last read.
        self._compare_wanted: tuple[int, ...] = ()
        self._compare_have: tuple[int, ...] = ()
        self._compared: dict[int, CompareRun] = {}
        self._experiment_wanted: int | None = None
        self._experiment_have: int | None = None
        self._experiment: ExperimentView | None = None
        self._task_wanted: str | None = None  # the agents task whose card is open
        self._task_have: str | None = None
        self._task_signature: tuple[Any, ...] | None = None

    # -- requests, from any thread ---------------------------------------------------------------

    def watch_command(self, command_id: int) -> None:
        """Report this command once it is done or failed."""
        self.requests.put(("watch_command", command_id))

    def select(self, run_id: int | None) -> None:
        """Read this run in full (its series, commands, events, gate and eval)."""
        self.requests.put(("select", run_id))

    def compare(self, run_ids: list[int]) -> None:
        """Read these runs' COMPARE_KEYS series too (an empty list: none)."""
        self.requests.put(("compare", tuple(run_ids)))

    def follow_experiment(self, experiment_id: int | None) -> None:
        """Report the experiment's cells whenever they change (a cell starting gets its run)."""
        self.requests.put(("follow_experiment", experiment_id))

    def watch_task(self, task_id: str | None) -> None:
        """Report this agents task again whenever its row or its events move (None: no task)."""
        self.requests.put(("watch_task", task_id))

    def _drain(self) -> None:
        """Apply the queued requests, in the order they were made."""
        while True:
            try:
                kind, value = self.requests.get_nowait()
            except queue.Empty:
                return
            if kind == "watch_command":
                self._watched_commands.add(value)
            elif kind == "select" and value != self.selected:
                self.selected = value
                self._view = None
                self._version = -1  # this poll reads the new run in full
            elif kind == "compare":
                self._compare_wanted = value
            elif kind == "follow_experiment":
                self._experiment_wanted = value
            elif kind == "watch_task":
                self._task_wanted = value

    # -- the polling thread ----------------------------------------------------------------------

    def _open(self) -> StoreReader | None:
        if self.reader is None and self.db_path.exists():
            self.reader = StoreReader(self.db_path)
        return self.reader

    def poll(self) -> Snapshot | None:
        """News since the last poll, or None when the store did not change."""
        self._drain()
        try:
            reader = self._open()
            if reader is None:
                return None
            version = reader.data_version()
            asked = (self._compare_wanted, self._experiment_wanted, self._task_wanted)
            have = (self._compare_have, self._experiment_have, self._task_have)
            if version == self._version and asked == have:
                return None
            self._version = version
            return self._read(reader, version)
        except StoreError as exc:
            return Snapshot(version=self._version, error=str(exc))
        except ONE_LINE as exc:  # a locked or damaged file must not take the UI down
            return Snapshot(version=self._version, error=f"{self.db_path}: {exc}")

    def _read(self, reader: StoreReader, version: int) -> Snapshot:
        snap = Snapshot(version=version)
        runs = reader.runs()
        if runs != self._runs:
            self._runs = runs
            snap.runs = runs
        if self.selected is None and runs:
            self.selected = runs[-1].id
        snap.selected = self.selected
        run = next((r for r in runs if r.id == self.selected), None)
        if run is not None:
            view = self._read_view(reader, run)
            if view is not None:
                snap.view = view
        traj_signature = reader.trajectories_signature()
        if traj_signature != self._traj_count:
            self._traj_count = traj_signature
            snap.trajectory_count = traj_signature[0]
            snap.trajectories = reader.trajectories_after(0, limit=200)
            snap.domains = reader.domain_baselines()
            snap.plasticity = reader.kv("plasticity")
        agents_signature = reader.agents_signature()
        agents_moved = agents_signature != self._agents_signature
        if agents_moved:
            self._agents_signature = agents_signature
            self._read_agents(reader, snap)
        # An open card's task is checked on every change of the store (its signature: two index reads), not
        # only when an event arrived: the plane's trainer writes what it distilled into the task's row alone.
        if agents_moved or self._task_wanted is not None or self._task_wanted != self._task_have:
            self._read_task(reader, snap)
        box_signature = reader.system.signature()
        if box_signature != self._box_signature or self.selected != self._box_run:
            self._box_signature, self._box_run = box_signature, self.selected
            snap.box = self._read_box(reader, self.selected)
        self._read_comparison(reader, runs, snap)
        if self._watched_commands:
            done = [
                c
                for c in reader.commands_after(min(self._watched_commands) - 1)
                if c["id"] in self._watched_commands and c["state"] in ("done", "failed")
            ]
            self._watched_commands -= {c["id"] for c in done}
            snap.commands = done
        starting = self._read_starting(reader, run)
        if starting != self._starting:
            self._starting = snap.starting = starting
        errors = {s["path"]: s["last_error"] for s in reader.sources() if s["last_error"]}
        if errors != self._source_errors:
            self._source_errors = errors
            snap.source_errors = errors
        return snap

    @staticmethod
    def _read_starting(reader: StoreReader, run: RunRow | None) -> Starting:
        """The selected run's stage while it is starting, and the engine's starting commands."""
        stage = None
        if run is not None and run.status == "running" and not run.last_update:
            stage = reader.run_stage(run.id)
        commands = reader.starting_commands(time.time() - STARTED_RECENTLY_S)
        return Starting(stage, tuple(commands))

    def _read_comparison(self, reader: StoreReader, runs: list[RunRow], snap: Snapshot) -> None:
        """The compared runs' series (a run whose row did not move keeps its object, so its chart
        lines are not redrawn) and the followed experiment's cells, each posted only when changed."""
        wanted, experiment_id = self._compare_wanted, self._experiment_wanted
        by_id = {r.id: r for r in runs}
        fresh: dict[int, CompareRun] = {}
        for run_id in wanted:
            run = by_id.get(run_id)
            if run is None:
                continue
            previous = self._compared.get(run_id)
            if previous is not None and previous.run == run:
                fresh[run_id] = previous
                continue
            # A run that went back (a resume truncates what came after its checkpoint) is read anew.
            grown = previous is not None and (run.last_step or 0) >= (previous.run.last_step or 0)
            series = {}
            for key in COMPARE_KEYS:
                old = previous.series.get(key) if grown and previous is not None else None
                if old is None:
                    new = reader.series(run_id, key, max_points=self.max_points)
                else:
                    new = reader.extend_series(run_id, key, old, max_points=self.max_points)
                if len(new):
                    series[key] = new
            fresh[run_id] = CompareRun(run, series)
        if list(fresh) != list(self._compared) or any(fresh[i] is not self._compared[i] for i in fresh):
            snap.compare = dict(fresh)
        self._compared = fresh
        self._compare_have = wanted
        experiment = self._read_experiment(reader, experiment_id) if experiment_id is not None else None
        if experiment != self._experiment or experiment_id != self._experiment_have:
            snap.experiment = experiment
        self._experiment, self._experiment_have = experiment, experiment_id

    @staticmethod
    def _read_box(reader: StoreReader, run_id: int | None) -> BoxView:
        """Read when a sample, a node or a process moved (engine/store/system_reads.py `signature`): a few
        short rows, however long the box has been sampled."""
        system = reader.system
        nodes = system.nodes()
        return BoxView(
            nodes=nodes,
            samples=system.now(),
            intervals={node["id"]: system.sample_interval(node["id"]) for node in nodes},
            run_id=run_id,
            run_dir=system.run_dir(run_id) if run_id is not None and system.ready else None,
            processes=system.run_processes(run_id) if run_id is not None else [],
        )

    @staticmethod
    def _read_experiment(reader: StoreReader, experiment_id: int) -> ExperimentView | None:
        record = reader.experiment(experiment_id)
        if record is None:
            return None
        cells = reader.experiment_runs(experiment_id)
        return ExperimentView(
            record["id"], record["name"], list(record["arms"]), list(record["seeds"]), record["status"], cells
        )

    @staticmethod
    def _read_agents(reader: StoreReader, snap: Snapshot) -> None:
        """The plane's newest events, its workers, its state and the manager's judged quality (a judgement
        is an event too); read only when an event arrived or the plane's state moved. The event rows come
        without payloads: an alarm's kind and reason and a status event's state are lifted from the payloads
        of just those rows."""
        overview = reader.agents_overview()
        events = reader.agent_events_after(0, limit=200)
        if reader.version >= 4:
            by_id = {e["id"]: e for e in events}
            for kind, fields in PAYLOAD_FIELDS.items():
                count = sum(1 for e in events if e["kind"] == kind)
                for row in reader.agent_audit(kind=kind, limit=count) if count else []:
                    event = by_id.get(row["id"])
                    if event is None or row["status"] != "ok":
                        continue
                    payload = json.loads(row["payload"])
                    event.update({name: payload.get(field) for field, name in fields.items()})
        snap.agent_events = events
        snap.agent_count = overview.pop("events")
        snap.agent_workers = overview.pop("workers")
        overview.pop("alarms", None)
        overview["judged"] = reader.manager_quality()  # {} when never judged: the pane draws no line
        snap.agent_overview = overview

    def _read_task(self, reader: StoreReader, snap: Snapshot) -> None:
        """The open task card's task, read again only when its own row or events moved (its signature: two
        index reads), or when another card opened."""
        wanted = self._task_wanted
        signature = reader.agent_task_signature(wanted) if wanted is not None else None
        if wanted is not None and (wanted != self._task_have or signature != self._task_signature):
            snap.agent_task = reader.agent_task(wanted)
        self._task_have, self._task_signature = wanted, signature

    def _read_view(self, reader: StoreReader, run: RunRow) -> RunView | None:
        previous = self._view if self._view is not None and self._view.run.id == run.id else None
        commands = reader.run_commands(run.id, limit=30)
        latest_eval = reader.latest_eval(run.id)
        if previous is not None and previous.run == run:
            if previous.commands == commands and previous.eval == latest_eval:
                return None  # nothing about this run moved (the change was elsewhere)
            # only the command log or the eval moved
            self._view = dataclasses.replace(previous, commands=commands, eval=latest_eval)
            return self._view
        keys = reader.metric_keys(run.id)
        reward_names = [m.group("name") for k in keys if (m := REWARD_KEY.match(k))]
        wanted = [k for k in (*PHI_KEYS, *TOTAL_REWARD_KEYS) if k in keys]
        wanted += [f"rewards/{name}/mean" for name in reward_names]
        view = RunView(run=run, reward_names=reward_names)
        for key in wanted:
            old = previous.series.get(key) if previous else None
            if old is None:
                view.series[key] = reader.series(run.id, key, max_points=self.max_points)
            else:
                view.series[key] = reader.extend_series(run.id, key, old, max_points=self.max_points)
        view.steps_per_s, view.eta_s, view.eta_label = _progress(reader, run)
        view.warmup_steps = warmup_steps(reader.run_config(run.id))
        view.commands = commands
        view.events = reader.events(run.id)
        view.gate = reader.gate_state(run.id)
        view.eval = latest_eval
        view.perf = _latest(reader, run.id, [k for k in PERF_KEYS if k in keys])
        view.async_rl = _latest(reader, run.id, [k for k in ASYNC_KEYS if k in keys])
        self._view = view
        return view


def _latest(reader: StoreReader, run_id: int, keys: list[str]) -> dict[str, float]:
    """The newest finite value of each of `keys` (one index seek each)."""
    latest = reader.latest_values(run_id, keys) if keys else {}
    return {k: float(v) for k, (_, v) in latest.items() if v is not None and math.isfinite(v)}


def find_experiment(reader: StoreReader, ref: str | int) -> ExperimentView | None:
    """An experiment by name, or by id when `ref` is a number no experiment is named; None: unknown."""
    record = reader.experiment(ref)
    if record is None and isinstance(ref, str) and ref.isdigit():
        record = reader.experiment(int(ref))
    if record is None:
        return None
    return StoreWatcher._read_experiment(reader, int(record["id"]))


PAUSE_FACTOR = 20.0  # a gap this many typical steps long is a pause (or a stall), not a step


def step_seconds(points: list[tuple[int, float]]) -> float | None:
    """Seconds a step takes over (step, wall time) points: the span over the steps, less the gaps longer than
    PAUSE_FACTOR typical steps (a pause leaves its time out). Rows written in bursts (an import, a batch of
    steps in one transaction) share a wall time: only the positive gaps tell what a step typically takes."""
    gaps = [(s1 - s0, t1 - t0) for (s0, t0), (s1, t1) in itertools.pairwise(points) if s1 > s0 and t1 >= t0]
    per_step = sorted(dt / ds for ds, dt in gaps if dt > 0)
    if not per_step:
        return None
    typical = per_step[len(per_step) // 2]
    kept = [(ds, dt) for ds, dt in gaps if dt <= PAUSE_FACTOR * typical * ds]
    steps = sum(ds for ds, _ in kept)
    return sum(dt for _, dt in kept) / steps if steps else None


def warmup_steps(config: dict[str, Any]) -> int:
    """The SFT warm-up steps a GRPO run takes before GRPO (0: none, or not a run of ours)."""
    steps = config.get("sft_warmup_steps") if config.get("method", "grpo") == "grpo" else 0
    return steps if type(steps) is int and steps > 0 else 0


def _progress(reader: StoreReader, run: RunRow) -> tuple[float | None, float | None, str | None]:
    """Steps per second, the ETA and what it is of, measured within the run's current phase.

    A GRPO run with an SFT warm-up has two phases whose steps take very different times (the demo's
    GRPO steps take ~2x its SFT steps), so a rate measured on one is never applied to the other: during
    the warm-up the ETA is the warm-up's ("ETA warm-up 40s"), afterwards the run's. A step's time is measured
    over the newest steps of the phase, leaving pauses out (step_seconds).
    """
    if run.status != "running":
        return None, None, None
    times = reader.wall_times(run.id, last=50)
    if len(times) < 2:
        return None, None, None
    warmup = warmup_steps(reader.run_config(run.id))
    step = times[-1][0]
    in_warmup = step <= warmup
    phase = [(s, t) for s, t in times if (s <= warmup) == in_warmup]
    seconds = step_seconds(phase)
    if seconds is None:
        return None, None, None
    end = warmup if in_warmup and run.max_steps and run.max_steps > warmup else run.max_steps
    eta = (end - step) * seconds if end and end > step else None
    return 1.0 / seconds, eta, "warm-up" if end == warmup and warmup else None


def state_line(run: RunRow) -> str:
    """The run's state as the status line shows it: a run stopped short says why (an observed run whose
    writer went quiet before its planned steps, engine/observe/ending.py)."""
    state = run_state(run)
    return f"{state}: {run.error}" if state == "stopped" and run.error else state


def run_state(run: RunRow, now: float | None = None) -> str:
    """live / silent / presumed crashed for running runs (seeded from the last write, as LEET)."""
    if run.status != "running":
        return run.status
    if not run.last_update:
        return "starting"
    quiet = (time.time() if now is None else now) - run.last_update
    if quiet >= 600:
        return "presumed crashed"
    if quiet >= 120:
        return "silent"
    return "live"


# -- what is on its way: the status line and the Agents pane before a run or the plane shows --------


def starting_state(stage: dict[str, Any] | None, since: float | None, now: float) -> str:
    """A starting run's state in the status line, with how long it has been starting and what it said it
    is doing: `starting 14s: importing torch, transformers and TRL`."""
    clock = f" {compact_duration(now - since)}" if since else ""
    return f"starting{clock}: {stage['text']}" if stage else f"starting{clock}"


def queued_state(command: dict[str, Any], engine: str, now: float) -> str:
    """The state of a run the engine was asked to start and has not opened yet (the command's progress)."""
    if command["state"] == "pending":
        what = "queued for the engine" if engine == "up" else "waiting for the engine to start"
    elif command["state"] == "running":
        what = "the engine is starting it"
    else:
        what = "starting its process"
    return f"starting {compact_duration(now - command['created_at'])}: {what}"


def command_of_run(starting: Starting, run: RunRow) -> dict[str, Any] | None:
    """The train command that started `run` (by the name it asked for), while it is recent."""
    for command in starting.commands:
        if command["verb"] == Verb.TRAIN and command["args"].get("name") == run.name:
            return command
    return None


def plane_starting(overview: dict[str, Any], starting: Starting, engine: str) -> bool:
    """The agents plane is on its way: an `agents up` not carried out yet, or a plane that is wanted while
    its server is not up (or the engine that runs it is not)."""
    if starting.plane_queued():
        return True
    server, plane = overview.get("server") or {}, overview.get("plane") or {}
    state = server.get("state")
    return bool(plane.get("wanted")) and (state not in ("up", "external") or engine != "up")


def nats_state(overview: dict[str, Any], starting: Starting, engine: str) -> str | None:
    """The plane's NATS server for the status line, while the plane is wanted or on its way (None: no
    plane). A local server is the engine's child: while the engine is starting, a stored "up" is from before
    and the server is starting with it. Otherwise the stored state, as the Agents pane's title says it."""
    server, plane = overview.get("server") or {}, overview.get("plane") or {}
    if not (server and plane.get("wanted")):
        return "starting" if starting.plane_queued() else None
    state = server.get("state") or "?"
    if state == "up" and engine in ("starting", "restarting"):
        return "starting"
    return state
