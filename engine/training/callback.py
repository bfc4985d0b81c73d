"""`CarlCallback`: stream any transformers / TRL training script into the carl store, live.

    from engine.training.callback import CarlCallback
    trainer = GRPOTrainer(..., callbacks=[CarlCallback(run_name="my-run")])

It creates a run (source kind 'callback') when training begins, writes every log dict as metrics
at the trainer's global step (one transaction per log), derives per-step Phi from the logged
`entropy` (or a logged `phi/mean`), and, unless `obey_commands=False`, applies the control
room's commands (pause, resume, stop, checkpoint, set_lr) at step boundaries. The run ends
'finished', 'stopped', or 'failed' when the script dies before training ends.

Each log also gets `perf/step_time_s` (the mean seconds from the trainer's step begin to its end, over the
steps since the previous log) and, where TRL logs its running `num_tokens`, `perf/tokens_per_s` over those
steps (engine/training/perf.py has the names; the first log has no earlier total to take from).
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from engine import paths

from .backend import CommandPump, Reporter, StepRecord, numeric_logs, one_line
from .hf import CommandCallback, entropy_to_phi
from .perf import STEP_TIME, TOKENS_PER_S
from .rank_processes import note_self

PHI_KEYS = ("phi/mean", "phi_mean", "phi", "train/phi/mean")
ENTROPY_KEYS = ("entropy", "train/entropy")


def model_vocab_size(model: Any) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return int(size) if isinstance(size, int) and size >= 2 else None


def phi_from_logs(metrics: dict[str, float | None], vocab_size: int | None) -> dict[str, Any] | None:
    """A phi_stats row from a step's logs: the logged Phi, or Phi derived from the mean entropy."""
    phi = next((metrics[k] for k in PHI_KEYS if metrics.get(k) is not None), None)
    entropy = next((metrics[k] for k in ENTROPY_KEYS if metrics.get(k) is not None), None)
    if vocab_size is not None:
        if phi is None and entropy is not None:
            phi = entropy_to_phi(entropy, vocab_size)
        elif entropy is None and phi is not None:
            entropy = (1.0 - phi) * math.log(vocab_size)
    if phi is None:
        return None
    return {"phi_mean": phi, "entropy_mean": entropy, "weighting": "token", "vocab_size": vocab_size}


class CarlCallback(TrainerCallback):
    def __init__(
        self, run_name: str | None = None, home: Path | None = None, obey_commands: bool = True
    ) -> None:
        self.run_name = run_name
        self.home = home
        self.obey_commands = obey_commands
        self.store: Any = None
        self.run_id: int | None = None
        self.reporter: Reporter | None = None
        self.commands: CommandCallback | None = None
        self.vocab_size: int | None = None
        self.step_began: float | None = None
        self.seconds, self.steps = 0.0, 0  # the steps since the previous log
        self.tokens: float | None = None  # TRL's num_tokens at the previous log

    # -- lifecycle ---------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from engine.store import Store

        self._close()  # a second train() with the same callback starts a new run
        self.step_began, self.seconds, self.steps, self.tokens = None, 0.0, 0, None
        home = Path(self.home) if self.home is not None else paths.carl_home()
        self.store = Store(paths.db_path(home))
        self.vocab_size = model_vocab_size(model)
        name = self.run_name or getattr(args, "run_name", None) or Path(args.output_dir).name or "script"
        model_name = getattr(getattr(model, "config", None), "_name_or_path", None) or type(model).__name__
        self.run_id = self.store.create_run(
            name,
            source_kind="callback",
            max_steps=state.max_steps or None,
            model=str(model_name),
            vocab_size=self.vocab_size,
            backend="transformers",
            config={"output_dir": str(args.output_dir)},
        )
        self.store.update_run(self.run_id, pid=os.getpid(), output_dir=str(args.output_dir))
        note_self(self.store, self.run_id, "runner")  # the engine follows it, and sees its end
        self.reporter = Reporter(self.store, self.run_id)
        if self.obey_commands:
            self.commands = CommandCallback(CommandPump(self.store, self.run_id, self.reporter))
        atexit.register(self._at_exit)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.reporter is not None:
            stopped = self.commands is not None and self.commands.pump.stopping
            if self.commands is not None:
                self.commands.pump.abandon("training ended before this command could be applied")
            self.reporter.set_status("stopped" if stopped else "finished")
        self._close()

    def _at_exit(self) -> None:
        """The script ended with training unfinished (an exception, most likely): mark it failed."""
        if self.reporter is None:
            return
        error = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
        reason = (
            one_line(error) if error is not None else "the training script ended before training finished"
        )
        try:
            self.reporter.set_status("failed", error=reason)
        finally:
            self._close()

    def _close(self) -> None:
        if self.store is not None:
            self.store.close()
        self.store = self.reporter = self.commands = None
        atexit.unregister(self._at_exit)

    # -- per step ----------------------------------------------------------------------------

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.reporter is None or not logs:
            return
        if "train_runtime" in logs:  # the end-of-training summary, not a step
            return
        metrics = numeric_logs(logs)
        if metrics and not any(key.startswith("eval_") for key in metrics):
            metrics.update(self.throughput(metrics))
        if metrics:
            record = StepRecord(state.global_step, metrics, phi=phi_from_logs(metrics, self.vocab_size))
            self.reporter.write(record)
        if self.commands is not None:
            self.commands.on_log(args, state, control, logs=logs, **kwargs)

    def throughput(self, metrics: dict[str, float | None]) -> dict[str, float]:
        """The steps since the previous log: their mean time, and tokens per second from TRL's running
        total."""
        out: dict[str, float] = {}
        if self.steps and self.seconds > 0:
            out[STEP_TIME] = self.seconds / self.steps
            tokens = metrics.get("num_tokens")
            if tokens is not None:
                if self.tokens is not None and tokens > self.tokens:
                    out[TOKENS_PER_S] = (tokens - self.tokens) / self.seconds
                self.tokens = tokens
        self.seconds, self.steps = 0.0, 0
        return out

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.step_began is not None:
            self.seconds += time.perf_counter() - self.step_began
            self.steps += 1
            self.step_began = None
        if self.commands is not None:
            self.commands.on_step_end(args, state, control, **kwargs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.commands is not None:
            self.commands.on_save(args, state, control, **kwargs)
        elif self.reporter is not None:
            self.reporter.checkpoint_saved(
                state.global_step, Path(args.output_dir) / f"checkpoint-{state.global_step}"
            )
