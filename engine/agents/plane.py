"""The plane as the engine runs it: a nats-server, the audit bridge, a manager, workers, a trainer.

Everything here is supervised like a training run: each part is its own process (the bridge is a
thread of the engine, since it writes the engine's store), a part that dies is restarted with
backoff, and what each part is doing goes to the store's `kv` table for the control room:
`agents.server` (the NATS server: state, URL without secrets, port, restarts) and `agents.plane`
(whether the plane should be up, its processes, and the run it serves). The engine calls `tick()`
every loop. Each process is started, and stopped, by the one launcher of the plane (launcher.py), which
`carl agents run` uses too.

A plane may serve one of our runs (`serve_run`, `carl agents up --serve-run RUN`, the demo's plane):
its workers serve that run's model, and each checkpoint the run saves goes out as a model update
(serving.py), put in the plane's object store by the bridge.

A plane that should be up comes back up when the engine restarts; `carl agents down` records that it
should not, whether the engine is running or not. Stopping the engine stops the plane's processes
(workers that are in the middle of a task finish it first). A plane bound to a run (`until_run`: the
demo's) stops, and is no longer wanted, when that run ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import paths
from engine.store.agent_plane import command_state, queued_engine_commands, run_status
from engine.store.commands import Verb

from .bus import Address, connect, ensure_stream, publish
from .bus import close as bus_close
from .events import PlaneEvent
from .launcher import Child, Launcher, given_address, start_server, stop_leftovers, write_settings
from .plane_settings import AgentsSettings
from .server import AgentsError, LocalServer, free_port, listening, port_is_free

if TYPE_CHECKING:
    from engine.store import Store

    from .serving import RunFollower

log = logging.getLogger("carl.engine")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 60.0
STABLE_S = 30.0  # a process that lived this long resets its backoff
GIVE_UP_AFTER = 8  # crashes in a row (each within STABLE_S) before a part is left down
ANSWER_WAIT_S = 30.0  # a command the plane must answer fails after this long without an answer
RUN_CHECK_S = 2.0  # how often a plane bound to a run looks at the run
RUN_START_GRACE_S = 600.0  # a plane bound to a run that has not appeared by then stops
LIVE_RUN = ("running", "paused")


# -- the bridge ----------------------------------------------------------------------------------


class Bridge:
    """The audit, in a thread with its own event loop and its own store connection; it also
    publishes the engine's control events."""

    def __init__(self, home: Path, address: Address, settings: AgentsSettings) -> None:
        self.home = home
        self.address = address
        self.settings = settings
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.js: Any = None
        self.connected = threading.Event()
        self.error: str | None = None
        self.audit_trouble: str | None = None  # the store refusing the audit's batches, while it lasts
        self.stored = 0
        self.thread = threading.Thread(target=self._thread, name="carl-agents-bridge", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def _thread(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # reported in the store by the engine; it restarts the bridge
            self.error = " ".join(str(exc).split())[:300]
            log.exception("agents bridge stopped")

    async def _main(self) -> None:
        from engine.store import Store

        from .audit import AuditWriter, run_audit

        self.loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        nc = None
        delay = 0.5
        while nc is None and not self.stop_event.is_set():
            try:
                nc = await connect(self.address, "carl-engine-bridge")
            except AgentsError as exc:
                self.error = str(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        if nc is None:
            return
        self.error = None
        store = Store(paths.db_path(self.home))
        try:
            self.js = nc.jetstream()
            await ensure_stream(self.js, self.settings.stream, self.settings.replicas)
            self.connected.set()

            def stored(counts: Any) -> None:
                self.stored += counts.stored + counts.rejected
                if counts.reasons:
                    log.warning(
                        "agents: %d rejected payload(s), %d dead-lettered; first: %s",
                        counts.rejected,
                        counts.dead_letters,
                        counts.reasons[0],
                    )

            def trouble(line: str | None) -> None:
                self.audit_trouble = line

            await run_audit(self.js, AuditWriter(store), self.stop_event, on_batch=stored, on_trouble=trouble)
        finally:
            store.close()
            with contextlib.suppress(Exception):
                await bus_close(nc)

    def publish(self, event: PlaneEvent, timeout: float = 5.0) -> None:
        """Publish from the engine's thread; raises AgentsError when the plane cannot take it."""
        if self.loop is None or not self.connected.is_set():
            raise AgentsError("the agents plane is not connected yet")
        future = asyncio.run_coroutine_threadsafe(publish(self.js, event, timeout=timeout), self.loop)
        try:
            future.result(timeout + 1)
        except Exception as exc:
            raise AgentsError(
                f"cannot publish {event.TYPE}: {' '.join(str(exc).split()) or type(exc).__name__}"
            ) from None

    def submit(self, work: Callable[[Any], Coroutine[Any, Any, Any]]) -> concurrent.futures.Future[Any]:
        """Run `work(js)` on the bridge's loop, without waiting for it (the engine's loop goes on)."""
        if self.loop is None or not self.connected.is_set():
            raise AgentsError("the agents plane is not connected yet")
        return asyncio.run_coroutine_threadsafe(work(self.js), self.loop)

    def stop(self, wait: float = 10.0) -> None:
        if self.loop is not None and self.stop_event is not None:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(wait)


# -- the plane -------------------------------------------------------------------------------------


@dataclass
class PlaneSpec:
    """What `carl agents up` asked for (kept in the store, so a restarted engine brings it back)."""

    workers: int = 2
    tasks: str = "demo"  # "demo" or a JSONL path
    train: bool = False
    limit: int | None = None
    config: str | None = None  # an agents.yaml path
    overrides: dict[str, Any] = field(default_factory=dict)
    until_run: str | None = None  # a run's name: the plane stops when that run ends (the demo's plane)
    serve_run: str | None = None  # a run (name or id) whose checkpoints the workers serve

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> PlaneSpec:
        names = ("workers", "tasks", "train", "limit", "config", "overrides", "until_run", "serve_run")
        spec = cls(**{k: args[k] for k in names if k in args})
        if not isinstance(spec.workers, int) or isinstance(spec.workers, bool) or not 0 <= spec.workers <= 64:
            raise AgentsError(f"workers: expected a number from 0 to 64, got {spec.workers!r}")
        if spec.until_run is not None and not isinstance(spec.until_run, str):
            raise AgentsError(f"until_run: expected a run's name, got {spec.until_run!r}")
        if spec.serve_run is not None and (not isinstance(spec.serve_run, str) or not spec.serve_run):
            raise AgentsError(f"serve_run: expected a run's name or id, got {spec.serve_run!r}")
        return spec


class Plane:
    """The engine's agents plane. Not thread-safe: the engine's loop calls it."""

    def __init__(self, store: Store, home: Path) -> None:
        self.store = store
        self.home = home
        self.spec: PlaneSpec | None = None
        self.settings: AgentsSettings | None = None
        self.address: Address | None = None
        self.server: LocalServer | None = None
        self.server_restarts = 0
        self.server_retry_at: float | None = None
        self.server_state = "down"
        self.bridge: Bridge | None = None
        self.launcher: Launcher | None = None  # the manager, workers and trainer, while the plane is up
        self.awaiting: dict[int, float] = {}  # command id -> when it fails without an answer
        self.next_worker = 1
        self.said: dict[str, str] = {}
        self.started_at = 0.0  # monotonic, when the plane came up
        self.next_run_check = 0.0
        self.follower: RunFollower | None = None  # the run the plane serves, if it serves one
        self.serving: concurrent.futures.Future[Any] | None = None  # an announcement on its way

    @property
    def up(self) -> bool:
        return self.spec is not None

    @property
    def children(self) -> dict[str, Child]:
        """The plane's processes by id (none while it is down)."""
        return self.launcher.children if self.launcher is not None else {}

    # -- up and down -------------------------------------------------------------------------------

    def restore(self) -> None:
        """A plane the previous engine had up comes back up, unless the run it was bound to has ended."""
        wanted = self.store.kv("agents.plane") or {}
        if not (wanted.get("wanted") and wanted.get("spec")):
            return
        try:
            spec = PlaneSpec.from_args(wanted["spec"])
            status = run_status(self.store, spec.until_run) if spec.until_run else None
            if status is not None and status not in LIVE_RUN:
                self.store.set_kv("agents.plane", {"wanted": False})
                log.info(
                    "agents: run %r %s while the engine was down: the plane stays down",
                    spec.until_run,
                    status,
                )
                return
            log.info("agents: bringing the plane back up")
            self.start(spec)
        except Exception as exc:
            log.warning("agents: the plane did not come back up: %s", exc)

    def start(self, spec: PlaneSpec) -> str:
        from .plane_settings import default_settings_path, load_settings
        from .tasks import demo_tasks, load_tasks

        if self.up:
            raise AgentsError("the agents plane is already up (carl agents down first)")
        self._reap_leftovers()
        config = spec.config or default_settings_path(self.home)
        overrides = {
            **spec.overrides,
            "workers": spec.workers,
            **({"train.enabled": True} if spec.train else {}),
            **self._served_model(spec),
        }
        settings = load_settings(config, overrides)
        if spec.serve_run is not None and settings.train.enabled:
            raise AgentsError(
                f"--serve-run {spec.serve_run} with --train: the workers serve that run's weights, "
                "so the plane cannot also train its own"
            )
        from .backends import check_trainable_endpoint

        check_trainable_endpoint(settings)  # --train with http workers that could never feed it: one line
        if spec.tasks != "demo":
            load_tasks(Path(spec.tasks))  # a bad file fails here, in one line, before anything starts
        else:
            demo_tasks()
        settings_file = write_settings(self.home, settings)
        self.address = self._address(settings)  # the server is up (or the URL given) before the plane is
        self.launcher = Launcher(self.home, settings_file, self.address, one_thread=True)
        self.settings, self.spec = settings, spec
        self.started_at, self.next_run_check = time.monotonic(), 0.0
        self.follower = self._follower(spec, settings)
        self.bridge = Bridge(self.home, self.address, settings)
        self.bridge.start()
        self._spawn("manager", "manager", *self._manager_args(spec))
        for _ in range(spec.workers):
            self._add_worker()
        if settings.train.enabled:
            self._spawn("trainer", "trainer")
        if settings.trains_manager:
            self._spawn("manager-trainer", "manager-trainer")
        self.store.set_kv(
            "agents.plane",
            {"wanted": True, "spec": spec.__dict__, "settings": str(settings_file)},
        )
        self.publish_state()
        what = f"manager, {spec.workers} worker{'s' if spec.workers != 1 else ''}" + (
            ", trainer" if settings.train.enabled else ""
        )
        if settings.trains_manager:
            what += ", manager trainer"
        until = f" until run {spec.until_run!r} ends" if spec.until_run else ""
        serving = f", serving run {spec.serve_run}" if spec.serve_run else ""
        return f"agents plane up on {self.address.url}: {what} on {spec.tasks} tasks{serving}{until}"

    def _served_model(self, spec: PlaneSpec) -> dict[str, Any]:
        """The model the workers load when the plane serves a run: the one that run trains."""
        from engine.training.artifacts import lookup_run

        if spec.serve_run is None:
            return {}
        run = lookup_run(self.store, spec.serve_run)
        return {"model": run["model"]} if run is not None and run.get("model") else {}

    def _follower(self, spec: PlaneSpec, settings: AgentsSettings) -> RunFollower | None:
        from .serving import RunFollower

        if spec.serve_run is None:
            return None
        follower = RunFollower(spec.serve_run, self.home, served_model=settings.model)
        follower.resume_from(self.store.kv("agents.model"))  # what a previous engine announced
        return follower

    def _reap_leftovers(self) -> None:
        """Stop what an engine that was killed left running: the plane starts anew rather than beside it."""
        stopped = stop_leftovers(self.store, self.home)
        if stopped:
            log.info("agents: stopped %d process(es) the previous engine left running", stopped)

    def _address(self, settings: AgentsSettings) -> Address:
        address = given_address(settings)
        if address is not None:
            self.server_state = "external"
            return address
        self.server, address = start_server(self.home, self._server_port())
        self.server_state = "up"
        return address

    def _server_port(self) -> int:
        """The port of the last local server when it is still free (clients find it again), else a new one."""
        previous = (self.store.kv("agents.server") or {}).get("port")
        if isinstance(previous, int) and port_is_free(previous):
            return previous
        return free_port()

    def _manager_args(self, spec: PlaneSpec) -> list[str]:
        args = ["--tasks", spec.tasks]
        if spec.limit is not None:
            args += ["--limit", str(spec.limit)]
        else:
            args += ["--cycle"]
        return args

    def stop(self) -> str:
        if not self.up:
            self.store.set_kv("agents.plane", {"wanted": False})
            return "the agents plane was not up"
        if self.launcher is not None:
            self.launcher.stop()
        if self.bridge is not None:
            self.bridge.stop()
        if self.server is not None:
            self.server.stop()
        self.server_state = "stopped" if self.server is not None else "down"
        self.follower, self.serving = None, None
        self.publish_state()
        self.spec, self.settings, self.bridge, self.server, self.launcher = None, None, None, None, None
        self.store.set_kv("agents.plane", {"wanted": False})
        return "agents plane stopped"

    def shutdown(self) -> None:
        """The engine is stopping: stop the processes but remember that the plane should be up."""
        if not self.up:
            return
        wanted = self.store.kv("agents.plane")
        self.stop()
        if wanted:
            self.store.set_kv("agents.plane", wanted)

    # -- children ------------------------------------------------------------------------------------

    def _spawn(self, role: str, ident: str, *extra: str) -> Child:
        assert self.launcher is not None
        child = self.launcher.start(role, ident, *extra)
        log.info("agents: started %s %s (pid %s)", role, ident, child.pid or "?")
        return child

    def _add_worker(self, command_id: int | None = None) -> str:
        assert self.settings is not None
        while f"w{self.next_worker}" in self.children:
            self.next_worker += 1
        ident = f"w{self.next_worker}"
        extra = ["--kind", self.settings.worker_kind]
        if command_id is not None:
            extra += ["--command-id", str(command_id)]
        self._spawn("worker", ident, *extra)
        return ident

    def tick(self) -> None:
        if not self.up:
            return
        now = time.monotonic()
        if self._bound_run_over(now):
            return
        self._supervise_server(now)
        self._supervise_bridge()
        for child in list(self.children.values()):
            self._supervise(child, now)
        self._serve_run()
        self._expire_answers()
        self.publish_state()

    def _serve_run(self) -> None:
        """Announce the served run's newest weights when it saved newer ones (one announcement at a time)."""
        from .serving import serve_weights

        follower, bridge = self.follower, self.bridge
        if follower is None or bridge is None or not bridge.connected.is_set():
            return
        if self.serving is not None:
            if not self.serving.done():
                return
            job, self.serving = self.serving, None
            try:
                update = job.result()
            except Exception as exc:  # tried again at the next tick that finds them newest
                self.say(
                    "serving", f"could not serve run {follower.run_name}: {' '.join(str(exc).split())[:300]}"
                )
            else:
                follower.announced(update)
                log.info("agents: serving %s (%s weights)", update.model_version, update.weights)
        weights, replicas = follower.next_weights(self.store), self.settings.replicas if self.settings else 1
        if weights is not None:
            self.serving = bridge.submit(lambda js: serve_weights(js, weights, self.home, replicas=replicas))

    def _bound_run_over(self, now: float) -> bool:
        """A plane bound to a run stops, and is no longer wanted, once that run has ended (or when it
        never appeared): the demo's workers do not go on answering after the demo."""
        name = self.spec.until_run if self.spec is not None else None
        if name is None or now < self.next_run_check:
            return False
        self.next_run_check = now + RUN_CHECK_S
        status = run_status(self.store, name)
        if status in LIVE_RUN or (status is None and now - self.started_at < RUN_START_GRACE_S):
            return False
        log.info("agents: run %r %s: stopping the plane that served it", name, status or "never started")
        self.stop()
        return True

    def _supervise(self, child: Child, now: float) -> None:
        if child.state in ("stopped", "failed"):
            return
        if child.proc is not None and child.proc.poll() is not None and child.state == "running":
            code = child.proc.returncode
            child.last_exit = code
            if child.stopping or code == 0:
                child.state = "stopped"  # it was asked to stop (or finished its work): leave it down
                log.info("agents: %s %s exited (%s)", child.role, child.ident, code)
                return
            child.crashes = 0 if now - child.started_at > STABLE_S else child.crashes + 1
            if child.crashes >= GIVE_UP_AFTER:
                child.state = "failed"
                log.error(
                    "agents: %s %s keeps crashing (exit %s); left down, see %s",
                    child.role,
                    child.ident,
                    code,
                    child.log_path,
                )
                return
            delay = min(BACKOFF_START_S * 2**child.crashes, BACKOFF_MAX_S)
            child.restart_at = now + delay
            child.state = "restarting"
            log.warning(
                "agents: %s %s exited with status %s; restarting in %.0fs (log %s)",
                child.role,
                child.ident,
                code,
                delay,
                child.log_path,
            )
        if child.state == "restarting" and child.restart_at is not None and now >= child.restart_at:
            if child.role in ("trainer", "manager-trainer") and "--resume" not in child.argv:
                child.argv.append("--resume")  # a restarted trainer carries on its run from its checkpoint
            child.spawn()

    def _supervise_server(self, now: float) -> None:
        server = self.server
        if server is None:
            return
        if server.proc is not None and server.proc.poll() is None:
            return
        if self.server_retry_at is None:
            self.server_restarts += 1
            delay = min(BACKOFF_START_S * 2 ** min(self.server_restarts - 1, 6), BACKOFF_MAX_S)
            self.server_retry_at = now + delay
            self.server_state = "restarting"
            log.warning("agents: nats-server exited; restarting in %.0fs", delay)
            return
        if now < self.server_retry_at:
            return
        self.server_retry_at = None
        try:
            if not port_is_free(server.port) and not listening(server.port):
                raise AgentsError(f"port {server.port} is taken")
            server.start()
            self.server_state = "up"
            log.info("agents: nats-server back on 127.0.0.1:%d", server.port)
        except AgentsError as exc:
            self.server_state = "down"
            self.say("server", str(exc))

    def _supervise_bridge(self) -> None:
        if self.bridge is None or self.bridge.alive() or self.address is None or self.settings is None:
            return
        log.warning("agents: the audit bridge stopped (%s); restarting it", self.bridge.error or "no reason")
        self.bridge = Bridge(self.home, self.address, self.settings)
        self.bridge.start()

    def say(self, topic: str, message: str) -> None:
        if self.said.get(topic) != message:
            self.said[topic] = message
            log.warning("agents: %s", message)

    def publish_state(self) -> None:
        server = {
            "state": self.server_state,
            "url": self.address.url if self.address else None,
            "port": self.server.port if self.server else None,
            "pid": self.server.proc.pid if self.server and self.server.proc else None,
            "restarts": self.server_restarts,
            "local": self.server is not None,
            "bridge": (
                "connected"
                if self.bridge and self.bridge.connected.is_set()
                else (self.bridge.error or "connecting")
                if self.bridge
                else "down"
            ),
            "audit": (self.bridge.audit_trouble or "storing") if self.bridge else None,
        }
        processes = [c.describe() for c in self.children.values()]
        serving = self.follower.describe() if self.follower is not None else None
        plane = self.store.kv("agents.plane") or {}
        if (self.store.kv("agents.server"), plane.get("processes"), plane.get("serving")) != (
            server,
            processes,
            serving,
        ):
            self.store.set_kv("agents.server", server)
            wanted = self.store.kv("agents.plane") or {}
            self.store.set_kv("agents.plane", {**wanted, "processes": processes, "serving": serving})

    # -- commands from the control room ---------------------------------------------------------------

    def command(self, command_id: int, verb: str, args: dict[str, Any]) -> str | None:
        """Apply an `agents_*` engine command; returns its result, or None when the plane answers it later
        (the status event that carries the command id finishes it)."""
        from .events import ControlEvent

        if verb == Verb.AGENTS_UP:
            return self.start(PlaneSpec.from_args(args))
        if verb == Verb.AGENTS_DOWN:
            return self.stop()
        if not self.up or self.bridge is None:
            raise AgentsError("the agents plane is not up (carl agents up)")
        if verb in (Verb.AGENTS_PAUSE, Verb.AGENTS_RESUME):
            action = "pause_assignment" if verb == Verb.AGENTS_PAUSE else "resume_assignment"
            manager = self.children.get("manager")
            if manager is None or not manager.alive():
                raise AgentsError("no manager is running")
            self.bridge.publish(
                ControlEvent(
                    action=action,
                    target="manager",
                    origin=str(args.get("origin", "tui")),
                    command_id=command_id,
                )
            )
        elif verb == Verb.AGENTS_ADD_WORKER:
            self._add_worker(command_id)
        elif verb == Verb.AGENTS_STOP_WORKER:
            worker = str(args.get("worker_id") or "")
            if not worker:
                raise AgentsError("agents_stop_worker needs a 'worker_id'")
            child = self.children.get(worker)
            if child is not None:
                child.stopping = True
            self.bridge.publish(
                ControlEvent(
                    action="stop_worker",
                    target=worker,
                    command_id=command_id,
                    origin=str(args.get("origin", "tui")),
                )
            )
        else:
            raise AgentsError(f"unknown agents command {verb!r}")
        self.awaiting[command_id] = time.monotonic() + ANSWER_WAIT_S
        return None

    def _expire_answers(self) -> None:
        now = time.monotonic()
        for command_id, deadline in list(self.awaiting.items()):
            found = command_state(self.store, command_id)
            if found is None or found[0] in ("done", "failed"):
                del self.awaiting[command_id]
            elif now >= deadline:
                del self.awaiting[command_id]
                self.store.finish_command(
                    command_id, False, f"no answer from the plane in {ANSWER_WAIT_S:.0f}s"
                )


def not_wanted(store: Store, home: Path) -> str:
    """`carl agents down` while no engine runs: the plane is recorded as not wanted (an engine that
    starts leaves it down), an `agents_up` still queued is cancelled, and what a killed engine left
    running of it is stopped. Returns what was done, in one line."""
    stopped = stop_leftovers(store, home)
    store.set_kv("agents.plane", {"wanted": False})
    cancelled = queued_engine_commands(store, Verb.AGENTS_UP)
    for command_id in cancelled:
        store.finish_command(command_id, False, "cancelled: carl agents down")
    said = "the engine is not running: the agents plane is marked down (it stays down when the engine starts)"
    if stopped:
        said += f"; stopped {stopped} of its processes that a killed engine had left running"
    if cancelled:
        said += f"; cancelled {len(cancelled)} queued 'agents up'"
    return said
