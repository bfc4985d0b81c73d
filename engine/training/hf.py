"""The command pump inside a transformers `Trainer`: shared by the torch backend and `CarlCallback`.

transformers runs, per optimizer step: `on_step_end` → (log → `on_log`) → (save → `on_save`).
Commands are claimed at `on_step_end`, where setting `control.should_save` still takes effect this
step; a pause holds at the last hook of the step, so the step is fully recorded (and any
checkpoint written) before the run sits still.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from engine.errors import CarlError

from .backend import CommandPump


class HFControls:
    """`Controls` for a transformers loop, built at each hook from what the hook receives."""

    def __init__(
        self,
        control: Any,
        optimizer: Any,
        lr_scheduler: Any,
        set_weight: Callable[[str, float], str] | None = None,
    ) -> None:
        self.control = control
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self._set_weight = set_weight

    def request_save(self) -> None:
        self.control.should_save = True

    def request_stop(self) -> None:
        self.control.should_training_stop = True

    def set_lr(self, lr: float) -> None:
        if self.optimizer is None:
            raise CarlError("set_lr: this trainer exposes no optimizer")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # The scheduler recomputes lr from its base lrs at its next step: change those too.
        if self.lr_scheduler is not None and hasattr(self.lr_scheduler, "base_lrs"):
            self.lr_scheduler.base_lrs = [lr] * len(self.lr_scheduler.base_lrs)
            if hasattr(self.lr_scheduler, "_last_lr"):
                self.lr_scheduler._last_lr = [lr] * len(self.optimizer.param_groups)

    def set_weight(self, reward: str, weight: float) -> str:
        if self._set_weight is None:
            raise CarlError("set_weight: this training script owns its reward weights (use `carl train`)")
        return self._set_weight(reward, weight)


def checkpoint_dir(args: Any, state: Any) -> Path:
    return Path(args.output_dir) / f"checkpoint-{state.global_step}"


class CommandCallback(TrainerCallback):
    """Applies the run's commands at step boundaries (add it after the callback that writes the
    step's record, so a pause holds after the record is in the store)."""

    def __init__(
        self,
        pump: CommandPump,
        *,
        step_offset: int = 0,
        set_weight: Callable[[str, float], str] | None = None,
        on_checkpoint: Callable[[Path, int], None] | None = None,
    ) -> None:
        self.pump = pump
        self.step_offset = step_offset
        self.set_weight = set_weight
        self.on_checkpoint = on_checkpoint  # writes sidecar state into the checkpoint directory

    def _controls(self, control: Any, kwargs: dict[str, Any]) -> HFControls:
        return HFControls(control, kwargs.get("optimizer"), kwargs.get("lr_scheduler"), self.set_weight)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = self.step_offset + state.global_step
        controls = self._controls(control, kwargs)
        self.pump.poll(step, controls)
        if not control.should_log and not control.should_save:
            self.pump.hold("step_end", step, controls)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not control.should_save and not state.global_step >= state.max_steps:
            self.pump.hold("log", self.step_offset + state.global_step, self._controls(control, kwargs))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = self.step_offset + state.global_step
        path = checkpoint_dir(args, state)
        if self.on_checkpoint is not None:
            self.on_checkpoint(path, step)
        self.pump.saved(step, path)
        self.pump.hold("save", step, self._controls(control, kwargs))


def entropy_to_phi(entropy: float, vocab_size: int) -> float:
    """Phi = 1 - H / ln|V| for a mean entropy in nats."""
    return 1.0 - entropy / math.log(vocab_size)
