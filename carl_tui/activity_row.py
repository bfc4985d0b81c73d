"""The activity row of the main screen: the Trajectories pane and the Agents pane side by side, what they
show, and what their messages ask for: the Agents pane's title, its task view and its keys (`p`, `+`, `x`:
engine commands the plane itself answers), and the Trajectories pane's trajectory view. Each view is a short
read of the store, made off the UI thread; the panes' messages bubble up to the row, which handles them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal

from engine.store.commands import Verb
from engine.text import visible_line
from widgets.activity import TrajectoriesPane
from widgets.agents import AgentsPane

from .command_sender import CommandRequest
from .model import Starting, plane_starting

if TYPE_CHECKING:
    from .room import Room


class ActivityRow(Horizontal):
    """The Trajectories and Agents panes, fed from the watcher's snapshots: the trajectories with their
    domains' baselines and any retraining trigger; the agents plane's events, workers and overview."""

    def __init__(self, room: Room, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.room = room
        self.domains: list[dict[str, Any]] = []  # trajectory domain baselines, with the trajectories
        self.plasticity: dict[str, Any] | None = None
        self.overview: dict[str, Any] = {}  # the agents plane: server, plane, manager, model (see the reader)
        self.agent_events: list[dict[str, Any]] = []
        self.agent_workers: list[dict[str, Any]] = []
        self.count: int | None = None  # the plane's events in the store (more than those shown)

    def compose(self) -> ComposeResult:
        trajectories = TrajectoriesPane(id="trajectories", classes="pane")
        trajectories.border_title = "Trajectories"
        yield trajectories
        agents = AgentsPane(readonly=self.room.readonly, id="agents", classes="pane")
        agents.border_title = "Agents"
        yield agents

    def show_trajectories(
        self,
        rows: list[dict[str, Any]],
        count: int,
        domains: list[dict[str, Any]],
        plasticity: dict[str, Any] | None,
    ) -> None:
        self.query_one(TrajectoriesPane).set_rows(rows, count)
        self.domains, self.plasticity = domains, plasticity
        self.query_one("#trajectories").border_subtitle = trajectory_summary(domains, plasticity)

    def take_agents(
        self,
        events: list[dict[str, Any]],
        workers: list[dict[str, Any]],
        count: int | None,
        overview: dict[str, Any],
    ) -> None:
        """The plane's newest events and workers (drawn by `show_agents`)."""
        self.agent_events, self.agent_workers, self.count, self.overview = events, workers, count, overview

    def show_agents(self, starting: Starting, engine_state: str) -> None:
        """The Agents pane: the plane's events and workers, and whether the plane is on its way."""
        overview = dict(self.overview)
        if plane_starting(overview, starting, engine_state):
            overview["starting"] = True
        self.query_one(AgentsPane).set_data(self.agent_events, self.agent_workers, overview, self.count)

    def plane_wanted(self) -> bool:
        return bool((self.overview.get("plane") or {}).get("wanted"))

    # -- the panes' messages ----------------------------------------------------------------------------

    @on(AgentsPane.TitleChanged)
    def agents_title_changed(self, event: AgentsPane.TitleChanged) -> None:
        pane = self.query_one("#agents")
        pane.border_title, pane.border_subtitle = event.title, event.subtitle or None

    @on(AgentsPane.OpenTask)
    def open_task(self, event: AgentsPane.OpenTask) -> None:
        task_id = event.task_id
        self.room.reads.read(
            lambda reader: reader.agent_task(task_id),
            lambda task: self.show_agent_task(task_id, task),
            title="agents",
        )

    def show_agent_task(self, task_id: str, task: dict[str, Any] | None) -> None:
        if task is None:
            self.notify(
                f"task {task_id[:8]} is not in the store (yet)",
                title="agents",
                severity="warning",
                markup=False,
            )
            return
        from .agent_task_screen import AgentTaskScreen

        # The card follows the task: the watcher reads it again whenever its row or its events move.
        watcher = self.room.watcher
        watcher.watch_task(task_id)
        self.app.push_screen(AgentTaskScreen(task), lambda _: watcher.watch_task(None))

    def agent_task_updated(self, task: dict[str, Any]) -> None:
        """The open card's task moved (a result, its scores, feedback): the card shows it now."""
        from .agent_task_screen import AgentTaskScreen

        for screen in self.app.screen_stack:
            if isinstance(screen, AgentTaskScreen) and screen.agent_task["task_id"] == task["task_id"]:
                screen.show_task(task)

    @on(TrajectoriesPane.Selected)
    def open_trajectory(self, event: TrajectoriesPane.Selected) -> None:
        trajectory_id = int(event.row["id"])
        self.room.reads.read(
            lambda reader: reader.trajectory(trajectory_id), self.show_trajectory, title="trajectory"
        )

    def show_trajectory(self, trajectory: dict[str, Any] | None) -> None:
        if trajectory is None:
            self.notify("that trajectory is gone from the store", severity="warning")
            return
        from .trajectory_screen import TrajectoryScreen

        self.app.push_screen(TrajectoryScreen(trajectory, self.domains, self.plasticity))

    # -- the agents plane's keys ------------------------------------------------------------------------

    @on(AgentsPane.Control)
    def control(self, event: AgentsPane.Control) -> None:
        """`p`, `+` and `x` on the Agents pane: engine commands, answered by the plane itself."""
        if self.room.debounced(f"agents_{event.verb}"):
            return  # (a read-only session: the pane hides these keys, and the sender refuses them)
        if not self.plane_wanted():
            self.notify(
                "the agents plane is not up: start it with `carl agents up`",
                title="agents",
                severity="warning",
            )
            return
        if event.verb == "pause_resume":
            self.agents_pause_resume()
        elif event.verb == "add_worker":
            self.send_agents(Verb.AGENTS_ADD_WORKER, "adding a worker")
        elif event.verb == "stop_worker":
            self.agents_stop_worker(event.worker_id)

    def agents_pause_resume(self) -> None:
        state = (self.overview.get("manager") or {}).get("state")
        if state in ("done", "stopped"):
            self.notify(
                f"the manager is {state}: there is no assignment to pause", title="agents", severity="warning"
            )
            return
        pending = self.room.sender.pending_verb(Verb.AGENTS_PAUSE, Verb.AGENTS_RESUME)
        if pending:
            self.notify(
                f"a command is already running: {pending}; wait for it", severity="warning", markup=False
            )
            return
        if state == "paused":
            self.send_agents(Verb.AGENTS_RESUME, "resuming task assignment")
        else:
            self.send_agents(Verb.AGENTS_PAUSE, "pausing task assignment")

    def agents_stop_worker(self, worker_id: str | None) -> None:
        if worker_id is None:
            self.notify(
                "highlight a worker (or one of its events) to stop it", title="agents", severity="warning"
            )
            return
        workers = self.query_one(AgentsPane).agent_workers
        worker = next((w for w in workers if w["worker_id"] == worker_id), {})
        if worker.get("state") in ("stopped", "stopping"):
            self.notify(f"worker {worker_id} is {worker['state']} already", title="agents", markup=False)
            return
        from .screens import ConfirmScreen

        busy = " It finishes the task in hand first." if worker.get("state") == "busy" else ""
        key, add = self.room.key_for("agents.stop-worker", "x"), self.room.key_for("agents.add-worker", "+")
        message = (
            f"Stop worker {worker_id!r}?{busy}\nThe {add} key adds a new one.\n\n"
            f"tab then enter (or {key} again) to stop, esc to cancel."
        )

        def confirmed(ok: bool | None) -> None:
            if ok:
                self.send_agents(Verb.AGENTS_STOP_WORKER, f"stopping worker {worker_id}", worker_id)

        self.app.push_screen(ConfirmScreen("Stop worker", message, "Stop", key), confirmed)

    def send_agents(self, verb: Verb, notice: str, worker_id: str | None = None) -> None:
        args = {"worker_id": worker_id} if worker_id is not None else None
        notice += self.room.engine.queued_suffix()
        self.room.sender.send(CommandRequest(verb, args, target="engine", notice=notice, title="agents"))


def trajectory_summary(domains: list[dict[str, Any]], plasticity: dict[str, Any] | None) -> Text | None:
    """The Trajectories pane's subtitle: domains and any retraining trigger that fired (as text: a
    border title given a str is markup)."""
    if not domains:
        return None
    fired = [t["kind"] for t in (plasticity or {}).get("triggers") or []]
    return Text(
        f"{len(domains)} domain{'s' if len(domains) != 1 else ''}"
        + (f" · ⚑ {visible_line(', '.join(fired))}" if fired else "")
    )
