"""A process's place in a data-parallel run: its rank and world, the collectives between ranks, the
command pump every rank shares, and how a collective fails when another rank died.

Used by the lifecycle (engine/training/lifecycle.py), the launcher (distributed.py) and the torch backend;
it imports none of them. torch is imported only inside a collective, so this module is light.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .backend import BadInput, CommandPump, Reporter, TrainingFailed, first_signal, one_line
from .config import OPD_ON_TORCH, TrainConfig

if TYPE_CHECKING:
    from engine.store import Store

T = TypeVar("T")

# A collective that waits longer than this fails (the run with it) instead of hanging: a rank that
# stopped answering. Rank 0's longest lone work (loading or saving a large model) must fit in it.
COLLECTIVE_TIMEOUT_S = 1800.0
TIMEOUT_ENV = "CARL_COLLECTIVE_TIMEOUT"
_noted: list[str] = []  # a stop signal that reached this rank outside the training loop


def launched_world() -> int:
    """How many ranks the launcher (accelerate / torchrun) started; 1 outside a launch."""
    return int(os.environ.get("WORLD_SIZE") or 1)


def launched_rank() -> int:
    return int(os.environ.get("RANK") or 0)


def collective_timeout() -> float:
    value = os.environ.get(TIMEOUT_ENV)
    return float(value) if value else COLLECTIVE_TIMEOUT_S


class Ranks:
    """This process's place in a data-parallel run (rank 0 of 1 when there is no launch)."""

    def __init__(self, rank: int = 0, world: int = 1) -> None:
        self.rank = rank
        self.world = world

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box: list[Any] = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def together(self, fn: Callable[[], T]) -> T:
        """Run `fn` on every rank; a failure on any rank is raised on every rank (none goes on alone
        into a collective the failed one will never join)."""
        if self.world == 1:
            return fn()
        failure: tuple[str, str] | None = None
        result: Any = None
        try:
            result = fn()
        except BadInput as exc:
            failure = ("bad input", str(exc))
        except Exception as exc:
            failure = ("failed", f"rank {self.rank}: {one_line(exc)}")
        failures = [f for f in self.all_gather(failure) if f is not None]
        if failures:
            kind, message = failures[0]
            raise BadInput(message) if kind == "bad input" else TrainingFailed(message)
        return result


def start_ranks() -> Ranks:
    """Join the process group the launcher set up (accelerate picks gloo on CPU, NCCL on CUDA), with
    a timeout on every collective."""
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=collective_timeout()))
    return Ranks(state.process_index, state.num_processes)


class RankedCommandPump(CommandPump):
    """The command pump of one rank: rank 0 claims the commands, every rank applies the same ones at
    the same step boundary, and only rank 0 records their outcomes (its reporter has the store)."""

    def __init__(self, store: Store | None, run_id: int, reporter: Reporter, ranks: Ranks) -> None:
        # While paused only rank 0 waits between polls; the others wait for it in the exchange.
        super().__init__(store, run_id, reporter, sleep=time.sleep if ranks.is_main else _no_sleep)
        self.ranks = ranks

    def _take(self) -> tuple[str | None, list[dict[str, Any]]]:
        claimed = self.store.claim_commands("run", self.run_id) if self.store is not None else []
        own = self.stop_reason or (_noted[0] if _noted else None)
        shared = self.ranks.all_gather((own, claimed))
        stop = next((reason for reason, _ in shared if reason is not None), None)
        return stop, shared[0][1]


def _no_sleep(seconds: float) -> None:
    return None


# How a collective fails when its peer died (gloo reports the closed socket) or hung (the timeout).
LOST_RANK_MARKS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Connection refused",
    "Broken pipe",
    "Timed out waiting",
    "gloo/transport",
    "NCCL communicator",
)
LOST_RANK_ERRORS = ("DistBackendError", "DistNetworkError", "DistStoreError")
LOST_RANK_REASON = (
    "another training process died or stopped answering"  # how rank 0 says so (and rank_processes.py)
)


def rank_lost(exc: BaseException, step: int | None) -> str | None:
    """The reason, when `exc` is a collective that failed because another rank died or hung."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        text = str(current)
        if type(current).__name__ in LOST_RANK_ERRORS or any(mark in text for mark in LOST_RANK_MARKS):
            detail = " ".join(text.split("] ", 1)[-1].split()).split(". ")[0][:160]  # gloo's first sentence
            after = f" after step {step}" if step else ""
            return f"{LOST_RANK_REASON}{after} ({detail})"
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def signals_deferred() -> AbstractContextManager[None]:
    """Outside the training loop a first SIGTERM/SIGINT is noted: a stop at the first step boundary
    when it comes before training, and no interruption when rank 0 is recording how the run ended.
    A second one ends the process."""
    return first_signal(_noted.append)


def training_backend(config: TrainConfig) -> str:
    """Several processes train on torch: `auto` means torch here, `mlx` is refused."""
    if config.backend == "mlx":
        raise BadInput(f"--processes {config.processes}: several processes train on the torch backend only")
    if config.opd:
        raise BadInput(OPD_ON_TORCH)
    return "torch"
