"""The engine's foreground loop (`carl engine run`): follow sources, run engine commands.

Every tick (about 0.25 s, less while a source has a backlog) the engine beats its heartbeat,
claims the engine commands queued in the store, and gives each followed source one bounded,
time-boxed ingest batch; then the hook spool, run analysis, alerts, child processes and the agents
plane each get their turn. Each of those jobs is isolated (jobs.py): one that raises is logged once
per distinct failure and retried with backoff, and the others still run in the same tick. A failure
in one source or command is logged and recorded where the TUI can see it; it never ends the loop.
SIGTERM/SIGINT/SIGHUP set a flag: the current batch finishes, then the engine cleans up and exits 0.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from logging.handlers import RotatingFileHandler
from pathlib import Path
from types import FrameType
from typing import Any

from engine import __version__, paths
from engine.alerts import Alerts
from engine.coherence.analysis import analyze_runs
from engine.console.console_job import ConsoleJob, attach_logs
from engine.control.pidfile import (
    PidRecord,
    ensure_home,
    log_path,
    proc_start_time,
    read_pidfile,
    remove_pidfile_if,
    take_lock,
    write_pidfile,
)
from engine.control.process import CHILDREN_KEY
from engine.faults import store_trouble
from engine.nodes import NodesJob
from engine.observe import IngestResult, ObserveError, finish_import, ingest_source, register_source
from engine.store import Store, StoreError
from engine.store.commands import CommandError, Obeyer, Verb, check, verb_of
from engine.system import SystemJob
from engine.text import visible
from engine.training.config import training_config_path

from .jobs import RETRY_MOST_S, Backoff, Jobs, describe

TICK = 0.25  # seconds between ticks when every source is caught up
BACKLOG_TICK = 0.005  # between ticks while a source still has rows waiting
HEARTBEAT_EVERY = 2.0
INGEST_SECONDS = 0.2  # time box of one source's batch
RETRY_FAILED_SOURCE = 5.0  # a source that raised is retried this much later, then twice as late each time
TROUBLE_PAUSE = 1.0  # after a tick that failed as a whole
SETTLE_EVERY = 5.0  # how often followed runs are checked for an end (engine/observe/ending.py)
ANALYZE_EVERY = 1.0  # phase/health of runs that received rows, at most this often
RECHECK_RUNNING_EVERY = (
    5.0  # running runs are re-analysed this often (runners write directly, not via ingest)
)

log = logging.getLogger("carl.engine")

RowHook = Callable[[Store, list[int]], None]
# Called with the ids of runs that just received rows (for example a phase/health analyser).
ROW_HOOKS: list[RowHook] = []


def on_run_rows(store: Store, run_ids: list[int]) -> list[str]:
    """Run every row hook; returns one line per hook that raised (hooks never stop the engine)."""
    errors = []
    for hook in list(ROW_HOOKS):
        try:
            hook(store, run_ids)
        except Exception as exc:
            errors.append(f"row hook {getattr(hook, '__name__', hook)!s}: {describe(exc)}")
    return errors


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


# -- engine commands -----------------------------------------------------------------------


@dataclass
class Observe:
    """An `observe` command still catching up with its sources (one file,
    or every run found in a directory)."""

    command_id: int
    paths: dict[int, str]  # source id -> path, for every source the command registered
    path: str  # what the command named
    follow: bool
    pending: set[int] = field(default_factory=set)  # sources not caught up yet
    errors: list[str] = field(default_factory=list)
    rows: int = 0
    bad_lines: int = 0

    def __post_init__(self) -> None:
        self.pending = set(self.paths)


RESUMABLE_VERBS = {Verb.OBSERVE, Verb.EVAL}  # safe to run again after an engine died mid-way


def orphaned_commands(store: Store) -> list[dict[str, Any]]:
    """Engine commands left 'running' by an engine that died (we hold the lock: none is alive)."""
    return store.running_commands("engine")


# -- the loop ------------------------------------------------------------------------------


def eval_outcome(code: int, log_path: Path) -> tuple[bool, str]:
    """The command's outcome from an eval process: its verdict, or its one-line error."""
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except ValueError:
                break
            verdict = "passed" if result.get("passed") else "failed"
            return True, f"eval {verdict}: " + "; ".join(result.get("reasons") or [])
    last = lines[-1] if lines else f"exit status {code}"
    return False, last.removeprefix("carl eval: ")


class Engine:
    def __init__(self, store: Store, home: Path, record: PidRecord) -> None:
        self.store = store
        self.home = home
        self.record = record
        self.host = socket.gethostname()
        self.stop_signal: int | None = None  # set by the signal handler, read by the loop
        self.observing: dict[int, Observe] = {}  # by command id
        self.failing = Backoff(RETRY_FAILED_SOURCE, RETRY_MOST_S)  # sources that raised, by id
        self.jobs = Jobs(log)  # every other job of the tick, isolated
        self.said: dict[str, str] = {}  # last message logged per topic, to log changes only
        self.next_heartbeat = 0.0
        self.dirty_runs: set[int] = set()  # runs with rows not yet analysed
        self.next_analysis = 0.0
        self.next_recheck = 0.0
        self.next_settle = 0.0
        self.children: list[subprocess.Popen[bytes]] = []  # training processes this engine started
        self.evals: list[tuple[subprocess.Popen[bytes], int, Path]] = []  # (process, command id, log)
        self.child_info: dict[int, dict[str, Any]] = {}  # pid -> what `carl engine status` shows of it
        self.published_children: list[dict[str, Any]] | None = None  # as last written to the store
        self.next_sweep = 0.0  # re-assembly of recent hook sessions (turns that ended without Stop)
        self.plane: Any = None  # the agents plane (engine.agents.plane.Plane), made on first use
        self.alerts = Alerts(store, home)  # red runs and agents alarms to the user's webhook or command
        self.system = SystemJob(store, home)  # this machine sampled into the store (engine/system/)
        self.nodes = NodesJob(store, home, self.plane_address)  # other machines, over NATS (engine/nodes/)
        self.consoles = ConsoleJob(store)  # runs' log files, scanned for tracebacks (engine/console/)

    @property
    def stopping(self) -> bool:
        return self.stop_signal is not None

    def announce(self) -> None:
        """Mark the engine row up; done before the pidfile appears, so a status check finds both."""
        self.store.engine_heartbeat(self.record.pid, self.host, __version__, started=True)
        self.next_heartbeat = time.monotonic() + HEARTBEAT_EVERY
        self.publish_children()  # none yet: a previous engine's list is not this one's

    def run(self) -> None:
        self.resume_orphans()
        self.restore_plane()
        self.repoint_hooks()
        try:
            while self.stop_signal is None:
                backlog = self.tick()
                time.sleep(BACKLOG_TICK if backlog else min(TICK, self.system.seconds_to_next()))
            log.info("received %s; stopping", signal.Signals(self.stop_signal).name)
            self.interrupt_observes()
        finally:
            self.alerts.close()  # tries still due resume with the next engine (their state is in the store)
            self.system.close()
            self.nodes.close()
            if self.plane is not None:
                self.plane.shutdown()  # it comes back up with the next engine

    def repoint_hooks(self) -> None:
        """Installed Claude Code hooks whose recorder moved (an upgrade) are pointed at it again."""
        from engine.trajectories.capture.hooks import repoint_moved_recorder

        try:
            changed = repoint_moved_recorder("user")
        except Exception as exc:  # the user's settings file is theirs: never a reason to stop
            log.warning("could not check the Claude Code hooks: %s", describe(exc))
            return
        if changed is not None:
            log.info("hooks: %s pointed at the recorder's new place", changed)

    def tick(self) -> bool:
        """One round of work; True when some source still has a backlog. Each job is isolated: one
        that raises costs only itself (logged once, retried with backoff)."""
        run = self.jobs.run
        try:
            run("heartbeat", self.heartbeat, default=None, retry_later=False)
            run("commands", self.claim_commands, default=None)
            backlog = run("ingest", self.ingest_due, default=False)  # each source isolated inside
            run("run ends", self.settle_runs, default=None)
            backlog = run("trajectories", self.trajectories_due, default=False) or backlog
            run("analysis", self.analyze_due, default=None)
            run("alerts", self.alerts_due, default=None)
            run("system", self.system.tick, default=None)
            run("nodes", self.nodes.tick, default=None)
            self.dirty_runs.update(run("consoles", self.consoles.tick, default=set()))
            run("children", self.reap_children, default=None)
            run("children list", self.publish_children, default=None)
            if self.plane is not None:
                run("agents plane", self.plane.tick, default=None)
            return backlog
        except Exception as exc:  # a bug outside the jobs: go on
            message = f"engine tick failed: {describe(exc)}"
            if self.said.get("tick") != message:
                self.said["tick"] = message
                log.exception("%s", message)  # with the traceback, once per distinct failure
            time.sleep(TROUBLE_PAUSE)
            return False

    def say(self, topic: str, level: int, message: str) -> None:
        """Log a message unless it repeats the last one on this topic (never one line per tick)."""
        if self.said.get(topic) != message:
            self.said[topic] = message
            log.log(level, "%s", message)

    def heartbeat(self) -> None:
        if time.monotonic() < self.next_heartbeat:
            return
        self.next_heartbeat = time.monotonic() + HEARTBEAT_EVERY
        self.store.engine_heartbeat(self.record.pid, self.host, __version__)
        if read_pidfile(self.home) != self.record:
            # Someone removed or overwrote it (a status check racing a restart): put it back,
            # the lock says this process is the engine.
            write_pidfile(self.home, self.record)
            log.warning("pidfile was missing or wrong; rewrote it")

    def claim_commands(self) -> None:
        for command in self.store.claim_commands("engine"):
            self.start_command(command)  # a command that fails fails alone

    def analyze_due(self) -> None:
        """Phase and health of runs that received rows, and of running runs gone quiet."""
        now = time.monotonic()
        self.dirty_runs.update(self.system.take_changed_runs())  # a process of theirs ended
        if now >= self.next_recheck:
            self.next_recheck = now + RECHECK_RUNNING_EVERY
            self.dirty_runs.update(self.store.running_run_ids())
        if not self.dirty_runs or now < self.next_analysis:
            return
        self.next_analysis = now + ANALYZE_EVERY
        runs = sorted(self.dirty_runs)
        try:
            with self.store.transaction():
                judged = analyze_runs(self.store, runs)
        except Exception as exc:  # one run's analysis failing must not hold back the others
            if store_trouble(exc):
                raise  # the runs stay dirty: analysed when the job is retried
            judged = self.analyze_each(runs)
        self.dirty_runs.difference_update(runs)
        self.jobs.run("alerts", self.alerts.runs_judged, judged, default=None, retry_later=False)

    def analyze_each(self, runs: list[int]) -> Any:
        """Runs analysed one by one, after a batch failed: a run whose analysis raises is logged and
        left out (until it gets rows again), so it cannot hold back the analysis of the others."""
        judged: dict[int, Any] = {}
        for run_id in runs:
            try:
                with self.store.transaction():
                    judged.update(analyze_runs(self.store, [run_id]))
            except Exception as exc:
                if store_trouble(exc):
                    raise
                self.say(f"analysis {run_id}", logging.ERROR, f"analysis of run {run_id}: {describe(exc)}")
        return judged

    def settle_runs(self) -> None:
        """Followed runs gone quiet end, and those ended so that grew again run again
        (engine/observe/ending.py), every SETTLE_EVERY seconds."""
        from engine.observe.ending import settle

        now = time.monotonic()
        if now < self.next_settle:
            return
        self.next_settle = now + SETTLE_EVERY
        changed = settle(self.store)
        self.dirty_runs.update(changed)
        for run_id in changed:
            run = self.store.run(run_id)
            if run is not None:  # not deleted since
                log.info("run %d: %s", run_id, run["status"])

    def alerts_due(self) -> None:
        """New agents alarms, and the alert tries now due."""
        self.alerts.tick()

    def trajectories_due(self) -> bool:
        """Hook payloads from the spool into scored turns; now and then, close turns whose Stop never
        came. True while the spool still holds a backlog."""
        from engine.trajectories.capture.live import (
            SPOOL_BATCH,
            SWEEP_EVERY_S,
            ingest_spool,
            sweep_open_turns,
        )
        from engine.trajectories.trajectory_settings import TrajectoryConfigError
        from engine.trajectories.trajectory_settings import load as load_trajectory_config

        if not self.spool_waiting() and time.monotonic() < self.next_sweep:
            return False
        try:
            config = load_trajectory_config(self.home)
        except TrajectoryConfigError as exc:  # payloads stay in the spool until the file is fixed
            self.say("trajectories", logging.WARNING, str(exc))
            return False
        if time.monotonic() >= self.next_sweep:
            self.next_sweep = time.monotonic() + SWEEP_EVERY_S
            self.jobs.run("trajectories sweep", sweep_open_turns, self.store, config, default=None)
        result = ingest_spool(self.store, self.home, config)
        if result.payloads:
            saved = result.saved
            log.info(
                "hooks: %d payload(s) from %d session(s)%s",
                result.payloads,
                result.sessions,
                f"; {saved.new} new, {saved.updated} updated trajectories" if saved else "",
            )
        return result.payloads >= SPOOL_BATCH

    def spool_waiting(self) -> bool:
        try:
            return any(name.endswith(".json") for name in os.listdir(self.home / "spool" / "hooks"))
        except OSError:
            return False

    # -- commands ----------------------------------------------------------------------------

    def resume_orphans(self) -> None:
        for command in orphaned_commands(self.store):
            if command["verb"] in RESUMABLE_VERBS:
                log.info("resuming command %d (%s) of the previous engine", command["id"], command["verb"])
                self.start_command(command)
            else:
                self.finish(command["id"], False, "interrupted: the engine stopped before finishing it")

    def start_command(self, command: dict[str, Any]) -> None:
        """One claimed command: checked against the vocabulary (engine/store/commands.py), then started by its
        verb's handler; the plane's verbs go to the agents plane. An unknown verb or a bad argument fails the
        command with the vocabulary's line."""
        command_id = command["id"]
        try:
            verb = verb_of(command["verb"], Obeyer.ENGINE, Obeyer.PLANE, what="engine command")
            args = check(verb, command["args"])
        except CommandError as exc:
            self.finish(command_id, False, str(exc))
            return
        try:
            if verb.obeyer is Obeyer.PLANE:
                self.agents_command(command_id, verb, args)
            else:
                self.engine_handlers()[verb](command_id, args)
        except Exception as exc:  # a failing start fails the command, not the engine
            self.finish(command_id, False, describe(exc))

    def engine_handlers(self) -> dict[Verb, Callable[[int, dict[str, Any]], None]]:
        """The handler of each verb the engine obeys itself (`Obeyer.ENGINE`)."""
        return {Verb.OBSERVE: self.start_observe, Verb.TRAIN: self.start_training, Verb.EVAL: self.start_eval}

    def finish(self, command_id: int, ok: bool, result: str) -> None:
        self.store.finish_command(command_id, ok, result)
        log.log(
            logging.INFO if ok else logging.WARNING,
            "command %d %s: %s",
            command_id,
            "done" if ok else "failed",
            result,
        )

    # -- the agents plane -----------------------------------------------------------------------

    def agents_plane(self) -> Any:
        """The plane (nats-server, bridge, manager, workers), made on first use: it needs the nats extra."""
        if self.plane is None:
            from engine.agents.plane import Plane

            self.plane = Plane(self.store, self.home)
        return self.plane

    def plane_address(self) -> Any:
        """The agents plane's NATS address while it is up (the nodes job reads nodes there without [nodes]
        url)."""
        return self.plane.address if self.plane is not None and self.plane.up else None

    def restore_plane(self) -> None:
        plane = self.store.kv("agents.plane")
        if not isinstance(plane, dict) or not plane.get("wanted"):
            return
        try:
            self.agents_plane().restore()
        except ImportError as exc:
            log.warning("agents: the plane should be up but cannot start (%s); install the nats extra", exc)

    def agents_command(self, command_id: int, verb: Verb, args: dict[str, Any]) -> None:
        """`agents_up`/`agents_down` are done here; a control waits for the plane's answer (the audit
        finishes the command when the status event carrying its id arrives)."""
        try:
            plane = self.agents_plane()
        except ImportError as exc:
            self.finish(command_id, False, f"the agents plane needs the nats extra ({exc})")
            return
        result = plane.command(command_id, verb, args)
        if result is not None:
            self.finish(command_id, True, result)
        else:
            log.info("command %d (%s) sent to the plane", command_id, verb)

    def start_training(self, command_id: int, args: dict[str, Any]) -> None:
        """Start a training run as its own process (a crash or an out-of-memory there never takes
        the engine down); the runner records the run, its progress and its failures itself."""
        config, name, resume = args.get("config"), args.get("name"), args.get("resume")
        argv = [sys.executable, "-m", "engine.training", "--home", str(self.home)]
        if resume:  # the vocabulary (Verb.TRAIN) checked there is a config or a resume, and their kinds
            argv += ["--resume", str(resume)]
        else:
            argv += ["--config", str(training_config_path(str(config)))]
        if name:
            argv += ["--name", str(name)]
        if args.get("max_steps"):
            argv += ["--max-steps", str(int(args["max_steps"]))]
        if args.get("backend"):
            argv += ["--backend", str(args["backend"])]
        log_path = paths.logs_dir(self.home) / time.strftime(f"train-%Y%m%d-%H%M%S-{command_id}.log")
        with log_path.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                close_fds=True,
                start_new_session=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
        self.children.append(proc)
        self.consoles.expect_train(proc.pid, log_path)  # the run it opens gets this log as its console
        what = f"resuming {resume}" if resume else f"training with {config}"
        self.child_info[proc.pid] = {
            "kind": "train",
            "pid": proc.pid,
            "command_id": command_id,
            "what": what,
            "log": str(log_path),
            "started_at": time.time(),
        }
        self.finish(command_id, True, f"{what} (pid {proc.pid}); log {log_path}")

    def start_eval(self, command_id: int, args: dict[str, Any]) -> None:
        """Evaluate a run on its held-out prompts in a process of its own; the command finishes
        with the verdict when that process does."""
        run = args["run"]  # a run's name or id (the vocabulary checked it)
        argv = [
            sys.executable,
            "-m",
            "engine.training.evaluate",
            str(run),
            "--home",
            str(self.home),
            "--json",
        ]
        eval_log = paths.logs_dir(self.home) / time.strftime(f"eval-%Y%m%d-%H%M%S-{command_id}.log")
        with eval_log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                close_fds=True,
                start_new_session=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
        self.evals.append((proc, command_id, eval_log))
        self.child_info[proc.pid] = {
            "kind": "eval",
            "pid": proc.pid,
            "command_id": command_id,
            "what": str(run),
            "log": str(eval_log),
            "started_at": time.time(),
        }

    def reap_children(self) -> None:
        """Collect finished training processes so none lingers as a zombie (the exit status of each is its
        process's end: engine/system/run_processes.py); finish eval commands."""
        for proc in self.children:
            if proc.poll() is not None:
                self.system.child_ended(proc.pid, proc.returncode)
        self.children = [p for p in self.children if p.returncode is None]
        running = []
        for proc, command_id, eval_log in self.evals:
            if proc.poll() is None:
                running.append((proc, command_id, eval_log))
                continue
            try:
                ok, result = eval_outcome(proc.returncode, eval_log)
            except OSError as exc:  # its log is gone or unreadable: the exit status must do
                ok, result = False, f"exit status {proc.returncode}; its log {eval_log} is unreadable: {exc}"
            self.finish(command_id, ok, result)
        self.evals = running

    def publish_children(self) -> None:
        """Put the training and eval processes still running in the store (`carl engine status`
        reads them), when that list changed."""
        live = {p.pid for p in self.children} | {p.pid for p, _, _ in self.evals}
        self.child_info = {pid: info for pid, info in self.child_info.items() if pid in live}
        children = list(self.child_info.values())
        if children == self.published_children:
            return
        self.store.set_kv(CHILDREN_KEY, {"pid": self.record.pid, "children": children})
        self.published_children = children

    def start_observe(self, command_id: int, args: dict[str, Any]) -> None:
        path, name = args["path"], args.get("name")  # checked by the vocabulary (Verb.OBSERVE)
        follow = bool(args.get("follow", False))
        logs = args.get("logs") or []
        pairing = args.get("pairing") or "auto"
        try:
            paths = self.register_observed(path, follow=follow, name=name, pairing=pairing)
            attach_logs(self.store, list(paths), logs)  # the consoles of its runs (--log)
        except Exception as exc:
            self.finish(command_id, False, describe(exc))
            return
        for source_id in paths:
            self.failing.recovered(source_id)  # asked for again: retry it now
        self.observing[command_id] = Observe(command_id, paths, path, follow)
        verb = "following" if follow else "importing"
        log.info("command %d: %s %s as source(s) %s", command_id, verb, path, ", ".join(map(str, paths)))

    def register_observed(
        self, path: str, *, follow: bool, name: str | None, pairing: str = "auto"
    ) -> dict[int, str]:
        """The sources of what an observe command names: a file, a run's folder, or a directory of runs found
        by discovery (a TRL output dir, a wandb/ dir...), metrics first and rollouts attached."""
        from engine.observe import ObserveError
        from engine.observe.discover import discover, register

        root = Path(path).expanduser()
        if root.is_dir():
            found = discover(root, pairing)
            kinds = [
                f.kind for run in found.runs for f in {id(x): x for x in (run.main, *run.rollouts)}.values()
            ]
            # A folder holding one trainer_state.json (and nothing else found) stays one source,
            # as it always was.
            if len(kinds) > 1 or kinds[:1] not in ([], ["trainer_state"]):
                registered = register(self.store, found, follow=follow, name=name, pairing=pairing)
                paths = {sid: str(f.path) for r in registered for sid, f in r.sources}
                if not paths:
                    errors = [e for r in registered for e in r.errors]
                    raise ObserveError(errors[0] if errors else f"{root}: nothing could be registered")
                return paths
        source_id = register_source(self.store, path, follow=follow, name=name)
        return {source_id: path}

    def observe_progress(self, source_id: int, result: IngestResult) -> None:
        for obs in [o for o in self.observing.values() if source_id in o.pending]:
            obs.rows += result.rows
            obs.bad_lines += result.bad_lines
            if result.caught_up:  # settled before it is forgotten, so a store error retries it
                if not obs.follow:  # a one-off import: the source is done, its runs 'imported'
                    finish_import(self.store, source_id)
                obs.pending.discard(source_id)
                self.observe_settled(obs)

    def observe_failed(self, source_id: int, error: str) -> None:
        for obs in [o for o in self.observing.values() if source_id in o.pending]:
            obs.pending.discard(source_id)
            obs.errors.append(error)
            self.observe_settled(obs)

    def observe_settled(self, obs: Observe) -> None:
        """A command is done when every one of its sources caught up or failed; it failed when all failed."""
        if obs.pending:
            return
        ok = len(obs.errors) < len(obs.paths)
        failed = f"; {plural(len(obs.errors), 'source')} failed: {obs.errors[0]}" if obs.errors and ok else ""
        self.finish(obs.command_id, ok, self.describe(obs) + failed if ok else obs.errors[0])
        del self.observing[obs.command_id]

    def describe(self, obs: Observe, *, so_far: str = "") -> str:
        """e.g. "observing metrics.jsonl as run 'x' (1,234 rows)"."""
        names = [name for source_id in obs.paths for name in self.run_names(source_id)]
        names = list(dict.fromkeys(names))  # rollouts attached to a run name it again
        runs = ""
        if names:
            runs = f" as run {names[0]!r}" if len(names) == 1 else " as runs " + ", ".join(map(repr, names))
        bad = f", {plural(obs.bad_lines, 'bad line')} skipped" if obs.bad_lines else ""
        verb = "observing" if obs.follow else "imported"
        return f"{verb} {Path(obs.path).name}{runs} ({plural(obs.rows, 'row')}{so_far}{bad})"

    def run_names(self, source_id: int) -> list[str]:
        """All runs of the source, also those an earlier import created (no new rows this time)."""
        return self.store.run_names(source_id)

    def interrupt_observes(self) -> None:
        """Settle the commands still catching up when the engine stops."""
        for obs in list(self.observing.values()):
            if obs.follow:  # a followed source resumes from its cursor on the next start
                result = self.describe(obs, so_far=" so far; resumes with the engine")
                self.finish(obs.command_id, True, result)
            else:
                done = f"{plural(obs.rows, 'row')} of {Path(obs.path).name}"
                result = f"interrupted after {done}: the engine stopped; observe it again"
                self.finish(obs.command_id, False, result)
        self.observing.clear()

    # -- sources -----------------------------------------------------------------------------

    def due_sources(self) -> dict[int, str]:
        """Source id -> path: sources of running observe commands, then followed sources."""
        due = {sid: obs.paths[sid] for obs in self.observing.values() for sid in obs.pending}
        for source in self.store.followed_sources():
            if source["id"] not in due and self.failing.due(source["id"]):
                due[source["id"]] = source["path"]
        return due

    def ingest_due(self) -> bool:
        backlog = False
        for source_id, path in self.due_sources().items():
            if self.stopping:
                break
            try:
                result = self.ingest(source_id, path)
                if result is not None:
                    backlog |= not result.caught_up
                    self.observe_progress(source_id, result)
            except Exception as exc:  # settling its command failed: this source alone waits
                self.source_failed(source_id, path, exc)
        return backlog

    def ingest(self, source_id: int, path: str) -> IngestResult | None:
        try:
            result = ingest_source(self.store, source_id, max_seconds=INGEST_SECONDS)
        except Exception as exc:
            self.source_failed(source_id, path, exc)
            return None
        if self.failing.recovered(source_id):
            log.info("source %d (%s) recovered", source_id, path)
        if result.bad_lines:  # one line per batch, not one per bad line
            first = f" (first: {result.problems[0]})" if result.problems else ""
            log.warning(
                "source %d (%s): skipped %s%s", source_id, path, plural(result.bad_lines, "bad line"), first
            )
        if result.rows and result.run_ids:
            self.dirty_runs.update(result.run_ids)
            for error in on_run_rows(self.store, list(result.run_ids)):
                self.say(f"hook {error.split(':')[0]}", logging.ERROR, error)
        return result

    def source_failed(self, source_id: int, path: str, exc: Exception) -> None:
        error = describe(exc)
        new, _ = self.failing.failed(source_id, error)
        if new:
            log.warning("source %d (%s): %s", source_id, path, error)
            if not isinstance(exc, ObserveError):  # observe records its own errors (and the state)
                cursor = self.store.source(source_id)["cursor"]  # unchanged: the batch rolled back
                self.store.save_source_progress(source_id, cursor, error=error)
        self.observe_failed(source_id, error)


# -- process lifecycle ---------------------------------------------------------------------


def run_engine(home: Path | None = None) -> int:
    """Run the engine in the foreground until signalled; returns the process exit code.

    0: stopped cleanly, or another engine already holds this $CARL_HOME; 2: the store cannot
    be opened (corrupt, foreign or too new); 1: an unexpected crash (logged with its traceback).
    """
    home = ensure_home(home)
    paths.logs_dir(home)  # creates it
    with _logging_to(log_path(home)):
        try:
            return _run(home)
        except Exception:
            log.exception("engine crashed")
            return 1


def _run(home: Path) -> int:
    lock = take_lock(home)
    if lock is None:
        other = read_pidfile(home)
        log.info("engine already running (pid %s)", other.pid if other else "unknown")
        return 0
    try:
        try:
            store = Store(paths.db_path(home))
        except (StoreError, sqlite3.DatabaseError) as exc:
            log.error("cannot open the store: %s", " ".join(str(exc).split()))
            return 2
        pid = os.getpid()
        record = PidRecord(pid, time.time(), proc_start_time(pid))
        engine = Engine(store, home, record)
        with _stop_on_signals(engine):
            try:
                engine.announce()
                write_pidfile(home, record)
                log.info("engine started (pid %d, version %s, home %s)", pid, __version__, home)
                engine.run()
                # Only a clean stop says 'stopped'; a crash leaves 'up' with a heartbeat going stale.
                store.engine_stopped(pid)
            finally:
                remove_pidfile_if(home, record)
                store.close()
        log.info("engine stopped (pid %d)", pid)
        return 0
    finally:
        os.close(lock)  # released last, so a new engine never sees our leftovers


@contextmanager
def _stop_on_signals(engine: Engine) -> Iterator[None]:
    """SIGTERM/SIGINT/SIGHUP only set a flag: never raise inside a store transaction."""

    def request_stop(signum: int, frame: FrameType | None) -> None:
        engine.stop_signal = signum

    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {sig: signal.signal(sig, request_stop) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# -- logging -------------------------------------------------------------------------------


class EngineLogFile(RotatingFileHandler):
    """engine.log, rotated at 5 MB x 3. A detached engine's stdout/stderr point at the log
    (start_engine sets that up); after a rollover they follow it, so a stray traceback lands
    in the current file rather than in engine.log.1."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, maxBytes=5 * 1024 * 1024, backupCount=3, encoding="utf-8")

    def format(self, record: logging.LogRecord) -> str:
        """The line as written: control characters of the names and keys it quotes written out (`visible`), so
        `tail -f engine.log` cannot be driven by a hostile settings key or file name."""
        return visible(super().format(record))

    def doRollover(self) -> None:
        follow = [fd for fd in (1, 2) if _same_file(fd, self.baseFilename)]
        super().doRollover()
        if self.stream is not None:
            for fd in follow:
                os.dup2(self.stream.fileno(), fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextmanager
def _logging_to(path: Path) -> Iterator[None]:
    handlers: list[logging.Handler] = [EngineLogFile(path)]
    if sys.stderr is not None and sys.stderr.isatty():  # `carl engine run` in a terminal: show it too
        handlers.append(logging.StreamHandler(sys.stderr))
    formatter = logging.Formatter("%(asctime)s %(levelname)s [engine %(process)d] %(message)s")
    for handler in handlers:
        handler.setFormatter(formatter)
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        for handler in handlers:
            log.removeHandler(handler)
            handler.close()
