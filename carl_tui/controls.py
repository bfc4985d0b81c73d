"""Training control from the keyboard: each key becomes a command for the selected run's runner (or
for the engine: a new run, a resume, an eval, an observed source), queued through the command
sender; destructive keys ask first and a run takes one command at a time. Also the keys that open
a view of the selected run: its samples, its eval, the diagnosis chat.

The keys are bound on the main screen (carl_tui/main_screen.py), whose actions call `RunControls`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.store.commands import Verb, verb_of

from .command_sender import CommandRequest
from .panes import short_name

if TYPE_CHECKING:
    from .model import RunView
    from .room import Room, Shown
    from .screens import ObserveRequest

# Runs a carl runner, CarlCallback or the plane's trainer listens to.
CONTROLLABLE = ("carl", "callback", "agents")
RESUMABLE = ("carl", "callback")  # runs `carl train --resume` carries on (the plane's trainer resumes itself)
CONTROL_ACTIONS = frozenset(
    {
        "new_run",
        "pause_resume",
        "checkpoint",
        "stop_run",
        "set_lr",
        "set_weight",
        "resume_run",
        "observe",
        "diagnose",
    }
)
RUN_ACTIONS = frozenset({"pause_resume", "checkpoint", "stop_run", "set_lr", "set_weight"})


class RunControls:
    """The commands a key sends for the selected run (or for the engine), the dialogs that ask first, and the
    views of the run that a key opens; and whether the run started with `n` is still to be followed."""

    def __init__(self, room: Room, shown: Shown) -> None:
        self.room = room
        self.shown = shown
        self.follow_new_run = False  # the run that `n` starts is selected when it appears

    @property
    def view(self) -> RunView | None:
        return self.shown.view

    def controllable(self) -> bool:
        """The selected run has a runner listening for commands and is running or paused."""
        run = self.view.run if self.view else None
        return run is not None and run.source_kind in CONTROLLABLE and run.status in ("running", "paused")

    def pending_command(self) -> str | None:
        """The verb of a command to this run not finished yet: one sent from here (known at once) or
        seen in the store (sent from another control room)."""
        if self.view is None:
            return None
        verb = self.room.sender.pending_for_run(self.view.run.id)
        if verb is None:
            verb = next((c["verb"] for c in self.view.commands if c["state"] in ("pending", "running")), None)
        return verb

    def send_to_run(self, verb: Verb, args: dict[str, Any] | None = None, notice: str = "") -> bool:
        """Queue a command for the selected run's runner (applied at its next step boundary)."""
        if self.view is None:
            return False
        pending = self.pending_command()
        if pending is not None:
            self.room.notify(
                f"a command is already running: {pending}; wait for it", severity="warning", markup=False
            )
            return False
        request = CommandRequest(verb, args, run_id=self.view.run.id, notice=notice or None)
        return self.room.sender.send(request)

    def send_to_engine(
        self,
        verb: Verb,
        args: dict[str, Any],
        notice: str,
        title: str,
        then: Callable[[int], None] | None = None,
    ) -> bool:
        """Queue a command for the engine daemon; the notice says when it waits for the engine."""
        notice += self.room.engine.queued_suffix()
        return self.room.sender.send(
            CommandRequest(verb, args, target="engine", notice=notice, title=title, then=then)
        )

    # -- the selected run's runner ------------------------------------------------------------------

    def pause_resume(self, verb: str | None = None) -> None:
        """`verb` is what the key bar said (pause or resume); the run's state decides when none is given."""
        if self.room.debounced("pause_resume") or self.view is None:
            return
        if verb not in (Verb.PAUSE, Verb.RESUME):
            verb = Verb.RESUME if self.view.run.status == "paused" else Verb.PAUSE
        self.send_to_run(
            verb_of(verb), notice=f"{verb} {self.view.run.name}: applied at the next step boundary"
        )

    def checkpoint(self) -> None:
        if self.room.debounced("checkpoint") or self.view is None:
            return
        self.send_to_run(Verb.CHECKPOINT, notice=f"checkpoint of {self.view.run.name} requested")

    def stop_run(self) -> None:
        if self.room.debounced("stop_run") or self.view is None:
            return
        from .screens import ConfirmScreen

        run = self.view.run
        key, resume = self.room.key_for("stop", "s"), self.room.key_for("resume", "r")
        message = (
            f"Stop run {run.name!r} at step {run.last_step or 0:,}?\nIt saves a checkpoint first; "
            f"you can resume it later with {resume}.\n\n"
            f"tab then enter (or {key} again) to stop, esc to cancel."
        )
        self.room.push_screen(ConfirmScreen("Stop training", message, "Stop", key), self.stop_confirmed)

    def stop_confirmed(self, confirmed: bool | None) -> None:
        if confirmed and self.view is not None:
            self.send_to_run(Verb.STOP, notice=f"stopping {self.view.run.name}")

    def set_lr(self) -> None:
        if self.view is None:
            return
        from .screens import ValueScreen

        current = self.view.latest("learning_rate")
        value = f"{current:g}" if current else ""
        label = f"New learning rate for {self.view.run.name}"
        self.room.push_screen(ValueScreen("Learning rate", label, value, positive_number), self.lr_chosen)

    def lr_chosen(self, value: str | None) -> None:
        if value is not None:
            self.send_to_run(Verb.SET_LR, {"lr": float(value)}, notice=f"learning rate → {float(value):g}")

    def set_weight(self) -> None:
        if self.view is None:
            return
        from .screens import ValueScreen

        names = (
            ", ".join(short_name(n) for n in self.view.reward_names)
            or "task, format, coherence, commitment, concise"
        )
        label = f"name=weight (rewards: {names})"
        self.room.push_screen(ValueScreen("Reward weight", label, "", weight_problem), self.weight_chosen)

    def weight_chosen(self, value: str | None) -> None:
        if value is None:
            return
        name, weight = (part.strip() for part in value.split("=", 1))
        args = {"reward": name, "weight": float(weight)}
        self.send_to_run(Verb.SET_WEIGHT, args, notice=f"weight of {name} → {float(weight):g}")

    # -- the engine: new runs, resumes, evals, observed sources -------------------------------------

    def new_run(self) -> None:
        if self.room.debounced("new_run"):
            return
        from .screens import ChoiceScreen

        choices = [("demo", "demo · the built-in tiny model on the tool-calling task (CPU, a few minutes)")]
        for path in sorted({*Path.cwd().glob("*.yaml"), *(self.room.home / "configs").glob("*.yaml")}):
            choices.append((str(path.resolve()), f"{path.name} · {path.parent}"))
        self.room.push_screen(
            ChoiceScreen("New run", "Train with which config? (carl init writes one)", choices),
            self.config_chosen,
        )

    def config_chosen(self, config: str | None) -> None:
        if config is None:
            return

        def follow(_command_id: int) -> None:
            self.follow_new_run = True  # the run it starts is selected when it appears

        notice = f"starting a run with {Path(config).name}"
        self.send_to_engine(Verb.TRAIN, {"config": config}, notice, "new run", then=follow)

    def resume_run(self) -> None:
        run = self.view.run if self.view else None
        if run is None or self.room.debounced("resume_run"):
            return
        if run.source_kind not in RESUMABLE or run.status in ("running", "paused", "finished"):
            self.room.notify("resume is for a stopped, failed or crashed carl run", severity="warning")
            return
        notice = f"resuming {run.name} from its last checkpoint"
        self.send_to_engine(Verb.TRAIN, {"resume": run.name}, notice, "resume")

    def show_eval(self) -> None:
        if self.view is None:
            return
        if self.view.eval is None:
            self.run_eval(True)
            return
        from .screens import EvalScreen

        self.room.push_screen(EvalScreen(self.view.run.name, self.view.eval), self.run_eval)

    def run_eval(self, again: bool | None) -> None:
        """Ask the engine to evaluate the selected run on its held-out prompts (`e`, or `r` in the eval)."""
        if not again or self.view is None:
            return
        run = self.view.run
        if run.source_kind != "carl":
            self.room.notify(
                f"{run.name} was not trained by carl: there is no held-out split to evaluate on",
                title="eval",
                severity="warning",
            )
            return
        if self.room.sender.refused(
            f"run `carl eval {run.name}` from a shell", title="eval", severity="information"
        ):
            return
        if run.status in ("running", "paused"):
            self.room.notify(
                f"{run.name} is still training: evaluate it once it has finished or stopped", title="eval"
            )
            return
        notice = f"evaluating {run.name} on its held-out prompts…"
        self.send_to_engine(Verb.EVAL, {"run": run.name}, notice, "eval")

    def observe(self) -> None:
        if self.room.sender.refused("observing a source writes to the store"):
            return
        from .screens import ObserveScreen

        self.room.push_screen(ObserveScreen(validate=observe_problem), self.observe_chosen)

    def observe_chosen(self, request: ObserveRequest | None) -> None:
        if request is None:
            return
        args = {
            "path": str(Path(request.path).expanduser().resolve()),
            "follow": request.follow,
            "name": request.name,
        }
        if request.log:
            args["logs"] = [str(Path(request.log).expanduser().resolve())]  # the console of its runs
        self.send_to_engine(Verb.OBSERVE, args, f"observe {request.path}", "observe")

    # -- views of the selected run ------------------------------------------------------------------

    def samples(self) -> None:
        if self.view is None:
            return
        from .screens import SamplesScreen

        run = self.view.run
        self.room.reads.read(
            lambda reader: reader.samples(run.id, limit=40),
            lambda samples: self.room.push_screen(SamplesScreen(samples or [], run.vocab_size)),
            title="samples",
        )

    def diagnose(self) -> None:
        if self.view is None:
            self.room.notify("no run selected: nothing to diagnose", title="diagnose")
            return
        if (
            self.room.sender.refused("the diagnosis chat stores its conversations")
            or not self.room.db_path.exists()
        ):
            return
        from .chat_screen import ChatScreen

        run = self.view.run
        self.room.push_screen(
            ChatScreen(
                self.room.sender,
                run.id,
                run.name,
                api_key=self.room.api_key,
                model=self.room.config.claude_model,
                base_url=self.room.claude_base_url,
            )
        )


def positive_number(text: str) -> str | None:
    try:
        value = float(text)
    except ValueError:
        return f"{text!r} is not a number"
    return None if value > 0 and value == value and value != float("inf") else "must be a positive number"


def weight_problem(text: str) -> str | None:
    if "=" not in text:
        return "write name=weight, e.g. coherence=0.5"
    name, weight = (part.strip() for part in text.split("=", 1))
    if not name:
        return "the reward name is empty"
    try:
        value = float(weight)
    except ValueError:
        return f"{weight!r} is not a number"
    return None if value >= 0 else "a weight cannot be negative"


def observe_problem(path: str) -> str | None:
    """A one-line reason the path cannot be observed, checked before anything is queued: a directory is fine
    when discovery finds a run in it (a TRL output dir, a wandb/ dir...),
    anything else when its kind is told."""
    from engine.observe import ObserveError, detect_kind
    from engine.observe.discover import discover

    target = Path(path).expanduser()
    try:
        if target.is_dir() and discover(target).runs:
            return None
        detect_kind(target)
    except ObserveError as exc:
        return str(exc)
    return None
