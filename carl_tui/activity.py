"""The activity panes' messages: the Agents pane's title, its task view and its keys (`p`, `+`,
`x`: engine commands the plane itself answers), and the Trajectories pane's trajectory view. Each
view is a short read of the store, made off the UI thread.

A mixin of the control room (its message handlers are the app's, found by their names: Textual's
`@on` registers handlers of message pumps only); `self` is the ControlRoom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.store.commands import Verb
from widgets.activity import TrajectoriesPane
from widgets.agents import AgentsPane

from .commands import CommandRequest

if TYPE_CHECKING:
    from .app import ControlRoom


class ActivityPanes:
    def on_agents_pane_title_changed(self: ControlRoom, event: AgentsPane.TitleChanged) -> None:
        if self.widgets_gone():
            return
        pane = self.main.query_one("#agents")
        pane.border_title, pane.border_subtitle = event.title, event.subtitle or None

    def on_agents_pane_open_task(self: ControlRoom, event: AgentsPane.OpenTask) -> None:
        task_id = event.task_id
        self.reads.read(
            lambda reader: reader.agent_task(task_id),
            lambda task: self.show_agent_task(task_id, task),
            title="agents",
        )

    def show_agent_task(self: ControlRoom, task_id: str, task: dict | None) -> None:
        if task is None:
            self.notify(
                f"task {task_id[:8]} is not in the store (yet)",
                title="agents",
                severity="warning",
                markup=False,
            )
            return
        from .agents import AgentTaskScreen

        # The card follows the task: the watcher reads it again whenever its row or its events move.
        self.watcher.watch_task(task_id)
        self.push_screen(AgentTaskScreen(task), lambda _: self.watcher.watch_task(None))

    def agent_task_updated(self: ControlRoom, task: dict) -> None:
        """The open card's task moved (a result, its scores, feedback): the card shows it now."""
        from .agents import AgentTaskScreen

        for screen in self.screen_stack:
            if isinstance(screen, AgentTaskScreen) and screen.agent_task["task_id"] == task["task_id"]:
                screen.show_task(task)

    def on_trajectories_pane_selected(self: ControlRoom, event: TrajectoriesPane.Selected) -> None:
        trajectory_id = int(event.row["id"])
        self.reads.read(
            lambda reader: reader.trajectory(trajectory_id), self.show_trajectory, title="trajectory"
        )

    def show_trajectory(self: ControlRoom, trajectory: dict | None) -> None:
        if trajectory is None:
            self.notify("that trajectory is gone from the store", severity="warning")
            return
        from .trajectories import TrajectoryScreen

        self.push_screen(TrajectoryScreen(trajectory, self.domains, self.plasticity))

    # -- the agents plane's keys ----------------------------------------------------------------------

    def on_agents_pane_control(self: ControlRoom, event: AgentsPane.Control) -> None:
        """`p`, `+` and `x` on the Agents pane: engine commands, answered by the plane itself."""
        if self.debounced(f"agents_{event.verb}"):
            return  # (a read-only session: the pane hides these keys, and the sender refuses them)
        plane = self.agents_overview.get("plane") or {}
        if not plane.get("wanted"):
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

    def agents_pause_resume(self: ControlRoom) -> None:
        state = (self.agents_overview.get("manager") or {}).get("state")
        if state in ("done", "stopped"):
            self.notify(
                f"the manager is {state}: there is no assignment to pause", title="agents", severity="warning"
            )
            return
        pending = self.sender.pending_verb(Verb.AGENTS_PAUSE, Verb.AGENTS_RESUME)
        if pending:
            self.notify(
                f"a command is already running: {pending}; wait for it", severity="warning", markup=False
            )
            return
        if state == "paused":
            self.send_agents(Verb.AGENTS_RESUME, "resuming task assignment")
        else:
            self.send_agents(Verb.AGENTS_PAUSE, "pausing task assignment")

    def agents_stop_worker(self: ControlRoom, worker_id: str | None) -> None:
        if worker_id is None:
            self.notify(
                "highlight a worker (or one of its events) to stop it", title="agents", severity="warning"
            )
            return
        workers = self.main.query_one(AgentsPane).agent_workers
        worker = next((w for w in workers if w["worker_id"] == worker_id), {})
        if worker.get("state") in ("stopped", "stopping"):
            self.notify(f"worker {worker_id} is {worker['state']} already", title="agents", markup=False)
            return
        from .screens import ConfirmScreen

        busy = " It finishes the task in hand first." if worker.get("state") == "busy" else ""
        key, add = self.key_for("agents.stop-worker", "x"), self.key_for("agents.add-worker", "+")
        message = (
            f"Stop worker {worker_id!r}?{busy}\nThe {add} key adds a new one.\n\n"
            f"tab then enter (or {key} again) to stop, esc to cancel."
        )
        self.push_screen(
            ConfirmScreen("Stop worker", message, "Stop", key),
            lambda ok: (
                self.send_agents(Verb.AGENTS_STOP_WORKER, f"stopping worker {worker_id}", worker_id)
                if ok
                else None
            ),
        )

    def send_agents(self: ControlRoom, verb: Verb, notice: str, worker_id: str | None = None) -> None:
        args = {"worker_id": worker_id} if worker_id is not None else None
        notice += self.queued_suffix()
        self.sender.send(CommandRequest(verb, args, target="engine", notice=notice, title="agents"))
