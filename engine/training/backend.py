"""What every training backend shares: the interface, the reporter and the command pump.

A backend (torch today, MLX later) trains; it reports each optimizer step through one `Reporter`
and applies the control room's commands at step boundaries through one `CommandPump`. Neither
class knows about torch or transformers: a backend adapts its own loop to them with a small
`Controls` object, so every backend writes the same records and obeys the same commands.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from engine.errors import CarlError
from engine.store.commands import Obeyer, Verb, check, verb_of

if TYPE_CHECKING:
    from engine.store import Store

    from .perf import StepPerf

# Keys of the end-of-training summary transformers logs; not per-step metrics.
SUMMARY_KEYS = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}
)
POLL_SECONDS = 0.2  # how often a paused run looks at its command queue
CPU_THREADS = 1  # tiny matrices: extra intra-op threads only add synchronisation (measured 2-10x slower)
SAVE_TOTAL_LIMIT = 2  # checkpoints kept on disk per run (the newest ones)
ROLLOUT_SECONDS = "timing/rollouts_s"  # a GRPO step's cost of building and storing its rollouts


def paused_polls_key(run_id: int) -> str:
    """The kv entry where a paused run counts its looks at the queue: {"step": N, "polls": K}."""
    return f"run.{run_id}.paused_polls"


class TrainingFailed(CarlError):
    """Training itself went wrong (a reward raised, the loss became NaN): exit code 1."""


class BadInput(CarlError):
    """The run cannot start with this input (model path, dataset columns, reward import): exit code 2."""


class TrainingBackend(Protocol):
    """One way to train. `prepare` loads and checks everything (raising BadInput), `train` runs."""

    name: str

    def prepare(self) -> None: ...

    def resume_point(self) -> tuple[Path | None, int]:
        """The newest complete checkpoint to resume from (None: none), and the last store step it keeps: the
        run's steps after it are trained again."""
        ...

    def train(self, resume_from: Path | None) -> str:
        """Train until done or stopped; returns the final status ('finished' or 'stopped')."""
        ...

    def save_final(self) -> Path | None:
        """Save the trained model into the run's `final/` directory; its path (None: nothing trained)."""
        ...


class Controls(Protocol):
    """What the command pump asks of a backend's loop, at a step boundary."""

    def request_save(self) -> None: ...

    def request_stop(self) -> None: ...

    def set_lr(self, lr: float) -> None: ...

    def set_weight(self, reward: str, weight: float) -> str:
        """Change a reward weight; returns the outcome as one line (e.g. that it was capped)."""
        ...


def one_line(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, CarlError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:300] or type(exc).__name__


def numeric_logs(logs: Mapping[str, Any]) -> dict[str, float | None]:
    """The per-step scalars of a log dict: numbers only (tables and strings are left out), NaN as None."""
    out: dict[str, float | None] = {}
    for key, value in logs.items():
        if key in SUMMARY_KEYS or isinstance(value, bool):
            continue
        if value is None:
            out[key] = None
        elif isinstance(value, int | float):
            out[key] = None if math.isnan(value) else float(value)
        elif hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # a 0-d tensor or numpy scalar
            number = float(value.item())
            out[key] = None if math.isnan(number) else number
    return out


@dataclass
class StepRecord:
    """Everything one optimizer step leaves in the store; written in one transaction."""

    step: int
    metrics: dict[str, float | None] = field(default_factory=dict)
    gate: dict[str, Any] | None = None
    phi: dict[str, Any] | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    rollouts: list[dict[str, Any]] = field(
        default_factory=list
    )  # engine/training/step_rollouts.py, without the step
    events: list[tuple[str, str]] = field(default_factory=list)  # (kind, detail)
    perf: StepPerf | None = (
        None  # the step's time, tokens and MFU: written as perf/* (engine/training/perf.py)
    )


class Reporter:
    """Writes a run's steps, status and checkpoints to the store.

    Without a store it writes nothing: that is a data-parallel rank other than 0, which trains and
    decides exactly as rank 0 does while rank 0 alone records (engine/training/distributed.py).
    """

    def __init__(self, store: Store | None, run_id: int) -> None:
        self.store = store
        self.run_id = run_id
        self.status = "running"

    def write(self, record: StepRecord) -> None:
        if self.store is None:
            return
        if record.perf is not None:  # one place names them, whichever backend measured the step
            record.metrics.update(record.perf.metrics())
        now = time.time()
        with self.store.transaction():
            if record.rollouts:
                # Its time joins what building them took (timing/rollouts_s; bench/bench_rollouts.py).
                started = time.perf_counter()
                self.store.add_rollouts(
                    self.run_id, [{**r, "step": record.step, "wall_time": now} for r in record.rollouts]
                )
                spent = record.metrics.get(ROLLOUT_SECONDS) or 0.0
                record.metrics[ROLLOUT_SECONDS] = spent + time.perf_counter() - started
            rows = [(record.step, key, value, now) for key, value in record.metrics.items()]
            self.store.add_metrics(self.run_id, rows)
            if record.gate is not None:
                self.store.add_gate_states(self.run_id, [record.gate])
            if record.phi is not None:
                self.store.add_phi_stats(self.run_id, [{**record.phi, "step": record.step, "wall_time": now}])
            if record.samples:
                self.store.add_samples(
                    self.run_id, [{**s, "step": record.step, "wall_time": now} for s in record.samples]
                )
            for kind, detail in record.events:
                self.store.add_event(self.run_id, record.step, kind, detail)

    def event(self, step: int | None, kind: str, detail: str = "") -> None:
        if self.store is not None:
            self.store.add_event(self.run_id, step, kind, detail)

    def update_run(self, **fields: Any) -> None:
        if self.store is not None:
            self.store.update_run(self.run_id, **fields)

    def stage(self, text: str) -> None:
        """What the run is doing before its first step, for the control room's status line (and the log)."""
        if self.store is not None:  # rank 0 only: one line in the log
            print(f"[carl] {text}", flush=True)
            self.store.set_run_stage(self.run_id, text)

    def truncate_after(self, step: int) -> None:
        """Forget what was logged after `step` (a resumed run replays those steps)."""
        if self.store is not None:
            self.store.truncate_run_after(self.run_id, step)

    def last_step(self) -> int | None:
        run = self.store.run(self.run_id) if self.store is not None else None
        return None if run is None else run["last_step"]

    def set_status(self, status: str, *, error: str | None = None) -> None:
        """running | paused | finished | stopped | failed; the last three end the run."""
        self.status = status
        if self.store is None:
            return
        fields: dict[str, Any] = {"status": status}
        if status in ("finished", "stopped", "failed"):
            fields["ended_at"] = time.time()
        if error is not None:
            fields["error"] = error
        self.store.update_run(self.run_id, **fields)

    def paused_polls(self, step: int, polls: int) -> None:
        """A paused run has looked at its queue `polls` times since the pause, holding at `step`. It
        writes nothing else while paused, so this is the sign that it holds rather than hangs (and
        what a test waits for before it checks that no step was trained)."""
        if self.store is not None:
            self.store.set_kv(paused_polls_key(self.run_id), {"step": step, "polls": polls})

    def checkpoint_saved(self, step: int, path: Path) -> None:
        if self.store is None:
            return
        with self.store.transaction():
            self.store.update_run(self.run_id, last_checkpoint=str(path), last_checkpoint_step=step)
            self.store.add_event(self.run_id, step, "checkpoint", str(path))


class CommandPump:
    """Applies the run's queued commands at step boundaries and records each outcome.

    A backend calls `poll(step, controls)` once per optimizer step, as soon as the step is done,
    and `hold(hook, step, controls)` at the last point of the step (after its record was written
    and any checkpoint saved): a paused run blocks there, polling the queue, until resumed or
    stopped. A checkpoint asked for while paused before the save point lets the loop go on to
    save it, and it holds again at the save point.
    """

    def __init__(
        self,
        store: Store | None,
        run_id: int,
        reporter: Reporter,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.reporter = reporter
        self.sleep = sleep
        self.paused = False
        self.polls_while_paused = 0
        self.stopping = False
        self.awaiting_save: list[int] = []  # checkpoint commands answered once the save is done
        self.last_saved: tuple[int, Path] | None = None
        self.stop_reason: str | None = None  # a stop asked for from outside the queue (a signal)

    # -- at every step boundary ----------------------------------------------------------------

    def poll(self, step: int, controls: Controls) -> None:
        stop_reason, commands = self._take()
        if stop_reason is not None and not self.stopping:
            self._stop(controls)
        for command in commands:
            self._apply(command, step, controls)

    def _take(self) -> tuple[str | None, list[dict[str, Any]]]:
        """What this step boundary brings: a stop asked for from outside the queue, and the commands."""
        assert self.store is not None
        return self.stop_reason, self.store.claim_commands("run", self.run_id)

    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary, as the stop command does (safe from a signal handler)."""
        self.stop_reason = reason

    def _stop(self, controls: Controls) -> None:
        self.stopping = True
        self.paused = False
        controls.request_save()
        controls.request_stop()

    def _apply(self, command: dict[str, Any], step: int, controls: Controls) -> None:
        """One claimed command: checked against the vocabulary (engine/store/commands.py), then carried out by
        its verb's handler. An unknown verb or a bad argument fails the command with the vocabulary's line."""
        command_id = command["id"]
        try:
            verb = verb_of(command["verb"], Obeyer.RUN)
            args = check(verb, command["args"])
            result = self._handlers()[verb](command_id, args, step, controls)
        except Exception as exc:  # a bad argument fails the command, never the run
            self._finish(command_id, False, one_line(exc))
            return
        if result is not None:
            self._finish(command_id, True, result)

    def _handlers(self) -> dict[Verb, Callable[[int, dict[str, Any], int, Controls], str | None]]:
        """The handler of each verb a run obeys (`Obeyer.RUN`); a handler's None: answered later (a
        checkpoint, once saved)."""
        return {
            Verb.PAUSE: self._do_pause,
            Verb.RESUME: self._do_resume,
            Verb.STOP: self._do_stop,
            Verb.CHECKPOINT: self._do_checkpoint,
            Verb.SET_LR: self._do_set_lr,
            Verb.SET_WEIGHT: self._do_set_weight,
        }

    def _finish(self, command_id: int, ok: bool, result: str) -> None:
        if self.store is not None:
            self.store.finish_command(command_id, ok, result)

    def _do_pause(self, command_id: int, args: dict[str, Any], step: int, controls: Controls) -> str:
        if self.paused:
            return f"already paused at step {step}"
        self.paused = True
        self.polls_while_paused = 0
        self.reporter.set_status("paused")
        self.reporter.paused_polls(step, 0)
        return f"paused at step {step}"

    def _do_resume(self, command_id: int, args: dict[str, Any], step: int, controls: Controls) -> str:
        if not self.paused:
            return f"not paused (step {step})"
        self.paused = False
        self.reporter.set_status("running")
        return f"resumed at step {step}"

    def _do_stop(self, command_id: int, args: dict[str, Any], step: int, controls: Controls) -> str:
        self._stop(controls)
        return f"stopping after step {step}, with a checkpoint"

    def _do_checkpoint(self, command_id: int, args: dict[str, Any], step: int, controls: Controls) -> None:
        controls.request_save()
        self.awaiting_save.append(command_id)
        return None  # answered by `saved`

    def _do_set_lr(self, command_id: int, args: dict[str, Any], step: int, controls: Controls) -> str:
        lr = float(args["lr"])  # a number > 0 (the vocabulary checked it)
        controls.set_lr(lr)
        return f"learning rate {lr:g} from step {step + 1}"

    def _do_set_weight(self, command_id: int, args: dict[str, Any], step: int, controls: Controls) -> str:
        return controls.set_weight(args["reward"], float(args["weight"]))  # a name, a number >= 0

    # -- checkpoints and the pause point ---------------------------------------------------------

    def saved(self, step: int, path: Path) -> None:
        """A checkpoint was written: record it on the run and answer the commands that asked for it."""
        self.last_saved = (step, path)
        self.reporter.checkpoint_saved(step, path)
        self._answer_saves()

    def _answer_saves(self) -> None:
        assert self.last_saved is not None
        step, path = self.last_saved
        for command_id in self.awaiting_save:
            self._finish(command_id, True, f"checkpoint at step {step}: {path}")
        self.awaiting_save.clear()

    def hold(self, hook: str, step: int, controls: Controls) -> None:
        """Block while paused, at the last hook of a step: 'step_end' (no log or save follows),
        'log' (no save follows) or 'save' (the step's checkpoint was just written)."""
        while self.paused and not self.stopping:
            self.sleep(POLL_SECONDS)
            self.poll(step, controls)
            self.polls_while_paused += 1
            self.reporter.paused_polls(step, self.polls_while_paused)
            if self.awaiting_save:
                if hook == "save" and self.last_saved is not None and self.last_saved[0] == step:
                    self._answer_saves()  # this boundary's checkpoint is the one asked for
                else:
                    return  # let the loop save it; it holds again at the save point

    def abandon(self, reason: str) -> None:
        """The run ended before answering some commands (a crash, or the end came first)."""
        for command_id in self.awaiting_save:
            self._finish(command_id, False, reason)
        self.awaiting_save.clear()


def unique(names: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for name in names:
        seen.setdefault(name, None)
    return list(seen)


@contextmanager
def first_signal(on_first: Callable[[str], None]) -> Iterator[None]:
    """A first SIGTERM/SIGINT calls `on_first` with "stopped by SIGTERM" (or SIGINT); a second one ends the
    process at once. The previous handlers come back on exit."""

    def handle(signum: int, frame: FrameType | None) -> None:
        on_first(f"stopped by {signal.Signals(signum).name}")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
