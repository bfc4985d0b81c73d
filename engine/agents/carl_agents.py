"""`carl agents ...`: up, down, status, run, worker, events.

`up` and `down` hand the plane to the engine (it supervises the server and the processes);
`run` is headless: it runs a plane of its own until every task is done and prints a summary;
`worker` joins a plane from this machine (another machine than the engine's, typically);
`events` prints the audit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import paths
from engine.errors import CarlError
from engine.limits import int_flag
from engine.text import visible, visible_line

if TYPE_CHECKING:  # pydantic and yaml load when a command runs, not when `carl` builds its parser
    from .launcher import Child
    from .plane_settings import AgentsSettings

EVENT_TYPES = (
    "task",
    "result",
    "feedback",
    "rollout",
    "model_update",
    "alarm",
    "control",
    "worker_status",
    "manager_status",
    "hint",
    "judged",
    "manager_rollout",
)


class AgentsCliError(CarlError):
    """One line for the user."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start the plane under the engine: nats-server, a manager, K workers")
    _plane_arguments(up)
    up.add_argument(
        "--limit", type=int_flag(1), default=None, help="tasks to assign (default: round and round)"
    )
    up.add_argument(
        "--serve-run",
        default=None,
        metavar="RUN",
        help="the workers serve this run's model: each checkpoint as it is saved, or its final/",
    )
    sub.add_parser("down", help="stop the plane the engine runs")
    status = sub.add_parser("status", help="the plane's server, manager, workers and trainer")
    status.add_argument("--json", action="store_true", help="one JSON object")
    run = sub.add_parser("run", help="run a plane until every task is done, then print a summary")
    _plane_arguments(run)
    run.add_argument(
        "--limit", type=int_flag(1), default=None, help="tasks to assign (default: every task once)"
    )
    run.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    worker = sub.add_parser("worker", help="join a plane (on another machine) as one worker")
    _address_arguments(worker)
    worker.add_argument("--kind", choices=("model", "http"), default=None, help="default: agents.worker_kind")
    worker.add_argument("--id", default=None, help="worker id (default: KIND-HOST-PID)")
    worker.add_argument("--model", default=None, help="model directory or hub id (model workers)")
    worker.add_argument(
        "--endpoint", default=None, help="OpenAI-compatible base URL, e.g. http://host:8000/v1"
    )
    worker.add_argument("--endpoint-model", default=None, help="the model name to request from the endpoint")
    worker.add_argument("--task-type", default=None, help="the queue to take tasks from (default: demo)")
    worker.add_argument("--config", default=None, help="an agents.yaml")
    events = sub.add_parser("events", help="the audit: every event the plane carried, newest last")
    events.add_argument("--type", choices=EVENT_TYPES, default=None)
    events.add_argument("--worker", default=None)
    events.add_argument("--task", default=None, help="a task id (or its first characters)")
    events.add_argument("--rejected", action="store_true", help="only payloads that were rejected")
    events.add_argument("--limit", type=int_flag(0), default=50, help="the newest N (0: all)")
    events.add_argument("--json", action="store_true", help="one JSON object a line")


def _address_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=None, help="nats:// URL of the plane (default: $CARL_NATS_URL, agents.url)"
    )
    parser.add_argument("--token-file", default=None, help="file holding the server's token")
    parser.add_argument("--creds", default=None, help="NATS .creds file")


def _plane_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tasks", default="demo", help="'demo' or a JSONL file of tasks")
    parser.add_argument(
        "--workers", type=int_flag(0), default=None, help="workers to start (default: agents.workers)"
    )
    parser.add_argument("--train", action="store_true", help="train the served model from the rollouts")
    parser.add_argument(
        "--opd",
        action="store_true",
        help="with --train: a hinted rollout also learns by on-policy distillation (agents.train.opd)",
    )
    parser.add_argument(
        "--manager-model",
        default=None,
        help="a local model that writes the manager's hints; with --train it is trained on their judged help",
    )
    parser.add_argument("--kind", choices=("model", "http"), default=None, help="the workers' kind")
    parser.add_argument("--config", default=None, help="an agents.yaml (default: $CARL_HOME/agents.yaml)")
    _address_arguments(parser)


def run(args: argparse.Namespace, home: Path) -> int:
    handler = {
        "up": _up,
        "down": _down,
        "status": _status,
        "run": _run,
        "worker": _worker,
        "events": _events,
    }[args.action]
    return handler(args, home)


def _settings(args: argparse.Namespace, home: Path, **extra: Any) -> AgentsSettings:
    from .plane_settings import default_settings_path, load_settings

    overrides = {
        "workers": getattr(args, "workers", None),
        "worker_kind": getattr(args, "kind", None),
        "url": getattr(args, "url", None),
        "token_file": getattr(args, "token_file", None),
        "creds_file": getattr(args, "creds", None),
        **extra,
    }
    if getattr(args, "train", False):
        overrides["train.enabled"] = True
    overrides.update(_learning_overrides(args))
    return load_settings(args.config or default_settings_path(home), overrides)


def _learning_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--opd and --manager-model as settings; --opd without --train is one line (nothing would learn)."""
    out: dict[str, Any] = {}
    if getattr(args, "opd", False):
        if not getattr(args, "train", False):
            raise AgentsCliError("--opd needs --train: on-policy distillation is part of training")
        out["train.opd"] = True
    if getattr(args, "manager_model", None):
        out["manager_model"] = args.manager_model
    return out


def _positive(value: int | None, flag: str) -> None:
    if value is not None and value <= 0:
        raise AgentsCliError(f"{flag} {value}: must be a positive number")


# -- up / down / status -----------------------------------------------------------------------


def _engine_command(home: Path, verb: str, args: dict[str, Any], wait: float = 120.0) -> str:
    from engine.control import ensure_engine
    from engine.store import Store
    from engine.store.agent_plane import command_state

    status = ensure_engine(home)  # says so on stderr when it starts one: the engine outlives this command
    with Store(paths.db_path(home)) as store:
        command_id = store.enqueue_command(verb, args, target="engine", origin="cli")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            state, result = command_state(store, command_id) or (None, None)
            if state in ("done", "failed"):
                if state == "failed":
                    raise AgentsCliError(result or f"{verb} failed")
                return str(result)
            time.sleep(0.1)
    raise AgentsCliError(f"the engine did not answer {verb} in {wait:.0f}s; see {status.log_path}")


def _up(args: argparse.Namespace, home: Path) -> int:
    from engine.store.commands import Verb

    _positive(args.limit, "--limit")
    settings = _settings(args, home)  # a bad config fails here, before the engine is asked
    if args.tasks != "demo":
        from .tasks import load_tasks

        load_tasks(Path(args.tasks))
    tasks = args.tasks if args.tasks == "demo" else str(Path(args.tasks).expanduser().resolve())
    overrides = {
        k: v
        for k, v in {
            "url": args.url,
            "token_file": args.token_file,
            "creds_file": args.creds,
            "worker_kind": args.kind,
        }.items()
        if v is not None
    } | _learning_overrides(args)
    spec = {
        "workers": settings.workers,
        "tasks": tasks,
        "train": settings.train.enabled,
        "limit": args.limit,
        "config": str(Path(args.config).resolve()) if args.config else None,
        "overrides": overrides,
        **({"serve_run": _served_run(home, args.serve_run, settings)} if args.serve_run else {}),
    }
    print(_engine_command(home, Verb.AGENTS_UP, spec))
    return 0


def _served_run(home: Path, ref: str, settings: AgentsSettings) -> str:
    """The name of the run `--serve-run` names, checked before the engine is asked (one line if not)."""
    from engine.store import Store
    from engine.training.artifacts import carl_run

    if settings.train.enabled:
        raise AgentsCliError(
            f"--serve-run {ref} with --train: the workers serve that run's weights, "
            "so the plane cannot also train"
        )
    with Store(paths.db_path(home)) as store:
        try:
            run = carl_run(store, ref, for_what="it has no checkpoints to serve")
        except CarlError as exc:
            raise AgentsCliError(f"--serve-run {exc}") from None
    return str(run["name"])


def _down(args: argparse.Namespace, home: Path) -> int:
    from engine.control import engine_status
    from engine.store.commands import Verb

    if engine_status(home).state == "up":
        print(_engine_command(home, Verb.AGENTS_DOWN, {}))
        return 0
    if not paths.db_path(home).exists():
        print("the engine is not running, and with it no agents plane")
        return 0
    from engine.store import Store

    from .plane import not_wanted

    with Store(paths.db_path(home)) as store:  # recorded, so that `carl engine start` leaves it down
        print(not_wanted(store, home))
    return 0


def plane_status(home: Path) -> dict[str, Any]:
    """What `carl agents status` shows, read from the store, with every process the store says is up
    checked: one whose pid is gone is shown `dead`, never `running` (an engine killed with SIGKILL
    leaves its last word in the store)."""
    from engine.control import engine_status
    from engine.store import StoreReader

    from .audit import AUDIT_KEY

    db = paths.db_path(home)
    if not db.exists():
        return {
            "server": None,
            "plane": None,
            "manager": None,
            "workers": [],
            "events": 0,
            "alarms": [],
            "audit": None,
            "engine": "down",
        }
    reader = StoreReader(db)
    try:
        status = {**reader.agents_overview(), "audit": reader.kv(AUDIT_KEY)}
    finally:
        reader.close()
    status["engine"] = engine_status(home, recover=False).state
    return checked_pids(status)


LIVE_STATES = {"starting", "running", "restarting", "up", "idle", "busy", "stopping"}


def checked_pids(status: dict[str, Any]) -> dict[str, Any]:
    """`status` with each process the store calls live but whose pid is not alive marked `dead`: the
    server, the plane's processes, and the workers on this host (another host's pids are not ours)."""
    from engine.processes import alive

    def dead(entry: dict[str, Any], key: str) -> bool:
        pid = entry.get("pid")
        return entry.get(key) in LIVE_STATES and isinstance(pid, int) and not alive(pid, others_count=False)

    server = status.get("server")
    if server and dead(server, "state"):
        status["server"] = {**server, "state": "dead"}
    plane = status.get("plane")
    if plane and plane.get("processes"):
        processes = [{**p, "state": "dead"} if dead(p, "state") else p for p in plane["processes"]]
        status["plane"] = {**plane, "processes": processes}
        manager = status.get("manager")
        if manager and any(p["role"] == "manager" and p["state"] == "dead" for p in processes):
            status["manager"] = {**manager, "state": "dead", "last_state": manager.get("state")}
    host = socket.gethostname()
    status["workers"] = [
        {**w, "state": "dead"} if w.get("host") == host and dead(w, "state") else w
        for w in status.get("workers") or []
    ]
    return status


def _status(args: argparse.Namespace, home: Path) -> int:
    status = plane_status(home)
    if args.json:
        print(json.dumps(status))
        return 0
    server = status.get("server") or {}
    plane = status.get("plane") or {}
    wanted = "up" if plane.get("wanted") else "down"
    if plane.get("wanted") and status.get("engine") != "up":
        wanted = "up when the engine starts (the engine is down; carl agents down keeps it down)"
    print(
        f"plane {wanted}; server {server.get('state', 'down')} {server.get('url') or ''}"
        f"{' (restarts ' + str(server['restarts']) + ')' if server.get('restarts') else ''}".rstrip()
    )
    manager = status.get("manager")
    if manager:
        total = f"/{manager['total']}" if manager.get("total") else ""
        state = manager["state"] + (
            f" (last said {manager['last_state']})" if manager.get("last_state") else ""
        )
        print(
            f"manager {state}: {manager['assigned']}{total} assigned, {manager['in_flight']} in flight, "
            f"{manager['done']} done, {manager['failed']} failed, {manager['timed_out']} timed out; "
            f"feedback {manager['feedback']}"
        )
    for proc in plane.get("processes") or []:
        if proc["role"] != "worker":
            print(f"{proc['role']} {proc['state']} (pid {proc['pid']}; log {proc['log']})")
    workers = status.get("workers") or []
    if workers:
        print(
            f"{'worker':<16} {'kind':<6} {'state':<8} {'version':<20} {'done':>5} {'ok':>5} {'score':>6}  "
            "last seen"
        )
        for w in workers:
            ok = f"{w['success_rate']:.0%}" if w["success_rate"] is not None else "—"
            score = f"{w['mean_score']:.3f}" if w["mean_score"] is not None else "—"
            seen = f"{time.time() - w['last_seen']:.0f}s ago" if w.get("last_seen") else "—"
            worker, kind, state = (visible_line(w[field] or "?") for field in ("worker_id", "kind", "state"))
            version = visible_line(w["model_version"] or "—")[:20]
            print(
                f"{worker:<16} {kind:<6} {state:<8} {version:<20} {w['tasks_done']:>5} {ok:>5} {score:>6}  "
                f"{seen}"
            )
    else:
        print("no workers seen")
    for alarm in status.get("alarms") or []:
        print(f"alarm {alarm['kind']}: {alarm['reason']}")
    print(f"{status.get('events', 0):,} events in the audit{_refused(status.get('audit'))}")
    if server.get("audit") not in (None, "storing"):  # the store refuses the audit's batches
        print(f"audit stalled: {visible(server['audit'])}")
    return 0


def _refused(totals: dict[str, Any] | None) -> str:
    """What the audit refused: messages stored as rejected (with their reasons: `carl agents events
    --rejected`) and those dead-lettered (not even that could be stored); the newest reason."""
    if not totals or not (totals.get("rejected") or totals.get("dead_letters")):
        return ""
    last = f"; newest: {visible(totals['last'])}" if totals.get("last") else ""
    return (
        f", {totals.get('rejected') or 0:,} rejected, {totals.get('dead_letters') or 0:,} dead-lettered{last}"
    )


# -- run ------------------------------------------------------------------------------------


def _run(args: argparse.Namespace, home: Path) -> int:
    from .roles import task_specs

    _positive(args.limit, "--limit")
    if args.workers is not None and args.workers < 0:
        raise AgentsCliError(f"--workers {args.workers}: must be 0 or more")
    settings = _settings(args, home)
    specs = task_specs(args.tasks)
    summary = asyncio.run(headless(home, settings, specs, limit=args.limit))
    if args.json:
        print(json.dumps(summary))
    else:
        from .manager import summary_line

        print(summary_line(summary))
    return 0 if summary["done"] > 0 or summary["assigned"] == 0 else 1


async def headless(
    home: Path,
    settings: AgentsSettings,
    specs: list[Any],
    *,
    limit: int | None,
    api_key: str | None = None,
    base_url: str | None = None,
) -> dict[str, Any]:
    """A plane of its own, until every task is done: the server (unless one is given or up), the audit
    into the store, the manager here, the workers and trainer as processes (started by the plane's one
    launcher, launcher.py). Returns the summary."""
    from engine.store import Store
    from engine.store.agent_audit import AgentAudit

    from .audit import AUDIT_CONSUMER, AuditWriter, audit_bound, run_audit
    from .backends import check_trainable_endpoint
    from .bus import (
        MANAGER_TRAINER_DURABLE,
        TRAINER_DURABLE,
        connect,
        ensure_stream,
        manager_trainer_subscription,
        trainer_subscription,
    )
    from .bus import close as bus_close
    from .launcher import Launcher, engine_server, given_address, start_server, write_settings
    from .manager import Manager, TaskFeed
    from .roles import build_feedback, build_hints, build_scorer, group_size
    from .server import LocalServer, free_port

    await asyncio.to_thread(check_trainable_endpoint, settings)  # before anything starts: one line
    store = Store(paths.db_path(home))
    # The given URL, else the engine's local server when it is up, else a server of this run's own.
    server: LocalServer | None = None
    address = given_address(settings) or engine_server(home, store)
    if address is None:
        server, address = start_server(home, free_port())
    launcher: Launcher | None = None
    try:
        nc = await connect(address, "carl-agents-run")
        js = nc.jetstream()
        await ensure_stream(js, settings.stream, settings.replicas)
        stop_audit = asyncio.Event()
        # The engine's bridge may be storing this plane's events already (the same store): then it does.
        audit = (
            None
            if await audit_bound(js)
            else asyncio.create_task(run_audit(js, AuditWriter(store), stop_audit))
        )
        # On a server of its own it is the plane of this home; on another's, one run beside that plane.
        settings_file = write_settings(
            home, settings, "plane.json" if server is not None else f"run-{os.getpid()}.json"
        )
        launcher = Launcher(home, settings_file, address, one_thread=False)
        prefix = "w" if server is not None else f"run{os.getpid()}-w"
        workers = [launcher.start("worker", f"{prefix}{i + 1}") for i in range(settings.workers)]
        trainer = None
        if settings.train.enabled:
            await (
                await trainer_subscription(js)
            ).unsubscribe()  # rollouts wait for the trainer in the stream
            trainer = launcher.start("trainer", "trainer")
        manager_trainer = None
        if settings.trains_manager:
            await (await manager_trainer_subscription(js)).unsubscribe()
            manager_trainer = launcher.start("manager-trainer", "manager-trainer")
        manager = Manager(
            address,
            settings,
            TaskFeed(specs, limit=limit, cycle=False),
            build_scorer(settings, api_key=api_key, base_url=base_url),
            build_feedback(settings, api_key=api_key, base_url=base_url),
            group_size=group_size(settings),
            store_path=paths.db_path(home),
            manager_id="manager" if server is not None else f"run-{os.getpid()}",
            transient=server is None,
            hints=build_hints(settings, home, api_key=api_key, base_url=base_url),
        )
        watch = asyncio.create_task(_watch_workers(workers, manager))
        summary = await manager.run()
        watch.cancel()
        if trainer is not None:
            await _drained(js, TRAINER_DURABLE)  # every rollout reached the trainer before it is told to stop
            await asyncio.to_thread(launcher.stop, [trainer], wait=120.0)  # it finishes the step in hand
            await _serving_latest(home, workers)
        if manager_trainer is not None:
            await _drained(js, MANAGER_TRAINER_DURABLE)
            await asyncio.to_thread(launcher.stop, [manager_trainer], wait=120.0)
        await asyncio.to_thread(launcher.stop, workers)
        await _drained(js, AUDIT_CONSUMER)
        stop_audit.set()
        if audit is not None:
            await audit
        await bus_close(nc)
        result = summary.as_dict()
        if watch.done() and not watch.cancelled() and watch.exception() is None and watch.result():
            raise AgentsCliError(watch.result())
        result["stored"] = AgentAudit(store).counts()
        return result
    finally:
        if launcher is not None:
            await asyncio.to_thread(launcher.stop, wait=5.0)
        if server is not None:
            server.stop()
        store.close()


async def _watch_workers(workers: list[Child], manager: Any) -> str | None:
    """Stop the run when every worker has died: nothing would ever answer its tasks."""
    if not workers:
        return None
    while True:
        await asyncio.sleep(0.5)
        if all(w.exit_code() not in (None, 0) for w in workers):
            manager.stop.set()
            last = _last_line(workers[0].log_path)
            return f"every worker exited (status {workers[0].exit_code()}){': ' + last if last else ''}"


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


async def _drained(js: Any, consumer: str, timeout: float = 60.0) -> None:
    """Wait until `consumer` has been delivered, and has acknowledged, everything in its filter.

    Only "no such consumer" ends the wait early. Any other error (a timeout, or no leader while a
    cluster re-elects one after losing a node) is asked again: giving up then stopped the audit with
    events still in the stream, missing from the store."""
    import nats.errors
    import nats.js.errors

    from .bus import STREAM

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = await js.consumer_info(STREAM, consumer)
        except nats.js.errors.NotFoundError:
            return  # no such consumer: nothing waits on it
        except nats.errors.Error:
            info = None  # the cluster could not say just now: ask again
        if info is not None and info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.05)


async def _serving_latest(home: Path, workers: list[Child], timeout: float = 30.0) -> None:
    """Until every live worker says it serves the newest adapter the trainer published (each swaps it in
    between two tasks), so a run that trained ends with its workers on the trained model."""
    from engine.store import StoreReader

    deadline = time.monotonic() + timeout
    reader = StoreReader(paths.db_path(home))
    try:
        while time.monotonic() < deadline:
            latest = (reader.kv("agents.model") or {}).get("model_version")
            if latest is None:
                return
            pids = {w.pid for w in workers if w.alive()}
            behind = [w for w in reader.agent_workers() if w["pid"] in pids and w["model_version"] != latest]
            if not behind:
                return
            await asyncio.sleep(0.1)
    finally:
        reader.close()


# -- worker ---------------------------------------------------------------------------------


def _worker(args: argparse.Namespace, home: Path) -> int:
    import logging

    from .bus import resolve_address
    from .worker import run_worker

    extra = {
        "model": args.model,
        "endpoint": args.endpoint,
        "endpoint_model": args.endpoint_model,
        "task_type": args.task_type,
    }
    settings = _settings(args, home, **extra)
    address = resolve_address(settings, home=home, local_port=_local_port(home))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    return asyncio.run(
        run_worker(address, settings, kind=args.kind or settings.worker_kind, home=home, worker_id=args.id)
    )


def _local_port(home: Path) -> int | None:
    """The engine's local server on this machine, when it is up."""
    from engine.store import StoreReader

    db = paths.db_path(home)
    if not db.exists():
        return None
    reader = StoreReader(db)
    try:
        server = reader.kv("agents.server") or {}
    finally:
        reader.close()
    return server.get("port") if server.get("local") else None


# -- events ---------------------------------------------------------------------------------


def event_record(row: dict[str, Any]) -> dict[str, Any]:
    """One audit row as `--json` prints it: the columns, plus what the payload says of steps and scores."""
    try:
        payload: Any = json.loads(row["payload"]) if row["status"] == "ok" else row["payload"]
    except (TypeError, ValueError):
        payload = row["payload"]
    body = payload if isinstance(payload, dict) else {}
    record = {
        "id": row["id"],
        "type": row["kind"],
        "subject": row["subject"],
        "status": row["status"],
        "task_id": row["task_id"],
        "worker_id": row["worker_id"],
        "manager_id": row["manager_id"],
        "environment": row["environment"],
        "model_version": row["model_version"],
        "score": row["score"],
        "step_scores": body.get("step_scores"),
        "received_at": row["received_at"],
        "created_at": row["created_at"],
        "stream_seq": row["stream_seq"],
    }
    for key in (
        "prm_score",
        "outcome_score",
        "profile",
        "dimensions",
        "verifier_score",
        "reward",
        "status",
        "kind",
        "reason",
        "action",
        "state",
    ):
        if key in body and key not in record:
            record[key] = body[key]
    if row["status"] == "rejected":
        record["reason"] = row["reason"]
    record["payload"] = payload
    return record


def _events(args: argparse.Namespace, home: Path) -> int:
    from engine.store import StoreReader

    if args.limit < 0:
        raise AgentsCliError(f"--limit {args.limit}: must be 0 (all) or more")
    db = paths.db_path(home)
    if not db.exists():
        print(visible(f"no events yet (no store at {db})"), file=sys.stderr)
        return 0
    reader = StoreReader(db)
    try:
        rows = reader.agent_audit(
            kind=args.type,
            worker=args.worker,
            task=args.task,
            rejected=args.rejected,
            limit=args.limit or None,
        )
    finally:
        reader.close()
    for row in rows:
        if args.json:
            print(json.dumps(event_record(row)))
        else:
            print(_event_line(row))
    return 0


def _event_line(row: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["received_at"] or row["created_at"] or 0))
    # A rejected payload's columns hold whatever it said: written out before the columns are padded.
    kind, subject = visible_line(row["kind"]), visible_line(row["subject"])
    who = visible_line(row["worker_id"] or row["manager_id"] or "-")
    task = visible_line(row["task_id"] or "-")[:8]
    return f"{when} {kind:<14} {subject:<24} {who:<14} {task:<8} {_event_says(row)}".rstrip()


def _event_says(row: dict[str, Any]) -> str:
    """What an event says, in a few words: its score, a status, an alarm's reason, an adapter's name."""
    if row["status"] == "rejected":
        return f"REJECTED: {row['reason']}"
    try:
        body = json.loads(row["payload"])
    except (TypeError, ValueError):
        body = {}
    kind = row["kind"]
    if kind == "alarm":
        return f"{body.get('kind')}: {body.get('reason')}"
    if kind == "model_update":
        return f"{body.get('model_version')} (step {body.get('step')})"
    if kind == "control":
        return f"{body.get('action')} -> {body.get('target')}"
    if kind in ("worker_status", "manager_status"):
        return " ".join(str(part) for part in (body.get("state"), body.get("detail")) if part)
    if kind == "result" and body.get("status") == "failed":
        return f"failed: {body.get('error') or body.get('result')}"
    if kind == "hint":
        return visible_line(f"({body.get('source')}) {body.get('hint')}")
    if kind == "judged" and isinstance(body.get("value"), int | float):
        if body.get("kind") == "hint_help":  # a difference of two scores
            return f"hint help {body['value']:+.3f}"
        return f"agreement {body['value']:.3f}"
    return f"score {row['score']:.3f}" if row["score"] is not None else ""
