"""The training lifecycle shared by every way a run is trained: open (or reopen) the run, train it,
settle its status, and turn every failure into an exit code and one line.

Exit codes: 0 finished or stopped; 1 training failed (a reward raised, the loss became NaN, a
crash); 2 bad input (config, model path, dataset columns, a reward that cannot be imported).
A failure leaves the run 'failed' with a one-line reason and prints that line on stderr; nothing
else in the store is touched.

runner.py (one process) and distributed.py (one rank of several) call `open_run` and `train_run`; the
backend is imported here, lazily, once it is chosen (the backends do not import this module).
"""

from __future__ import annotations

import os
import sys
import traceback
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from engine import paths
from engine.files import kind_of, resolved
from engine.store import Store, StoreError
from engine.text import visible

from .artifacts import lookup_run, process_alive
from .backend import BadInput, CommandPump, Reporter, TrainingBackend, TrainingFailed, first_signal, one_line
from .config import OPD_ON_TORCH, ConfigError, TrainConfig
from .ranks import RankedCommandPump, Ranks, rank_lost, training_backend

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def say_error(message: str) -> None:
    print(f"carl train: {visible(message)}", file=sys.stderr, flush=True)


def select_backend(config: TrainConfig) -> str:
    """`auto`: MLX on Apple silicon when mlx is installed, else torch (on CUDA when there is one)."""
    import importlib.util
    import platform

    has_mlx = importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None
    if config.backend == "mlx":
        if not has_mlx:
            raise BadInput("backend mlx: mlx and mlx-lm are not installed (pip install 'carl-tui[mlx]')")
        return "mlx"
    if (
        config.backend == "auto"
        and has_mlx
        and platform.system() == "Darwin"
        and platform.machine() == "arm64"
    ):
        return "mlx"
    if config.opd:  # carl's torch path trains with TRL's GRPOTrainer, which has no per-token advantage
        raise BadInput(OPD_ON_TORCH)
    if importlib.util.find_spec("torch") is None:
        raise BadInput(f"backend {config.backend}: torch is not installed (pip install 'carl-tui[train]')")
    return "torch"


def make_backend(name: str, config: TrainConfig, **kwargs: Any) -> TrainingBackend:
    # The framework is imported only when training starts.
    if name == "mlx":
        from .mlx_backend import MLXBackend

        return MLXBackend(config, **kwargs)
    from .torch_backend import TorchBackend

    return TorchBackend(config, **kwargs)


def find_run(store: Store, ref: str) -> dict[str, Any]:
    """A carl run by name, or by id."""
    run = lookup_run(store, ref)
    if run is None:
        raise BadInput(f"--resume {ref}: no such run")
    if run["source_kind"] != "carl":
        raise BadInput(
            f"--resume {ref}: run {run['name']!r} was not trained by carl (it is {run['source_kind']})"
        )
    if run["status"] in ("running", "paused") and run["pid"] != os.getpid() and process_alive(run["pid"]):
        raise BadInput(f"--resume {ref}: run {run['name']!r} is still running (pid {run['pid']})")
    if not run["output_dir"]:
        raise BadInput(f"--resume {ref}: run {run['name']!r} has no output directory")
    return run


def stored_config(store: Store, ref: str) -> dict[str, Any]:
    """The configuration a run was started with (for `--resume` without `--config`)."""
    import json

    return json.loads(find_run(store, ref)["config"] or "{}")


def record_failed_run(
    home: Path | None, name: str, reason: str, config: dict[str, Any] | None = None
) -> None:
    """A run that could not even start (invalid config) still shows in the control room, failed."""
    try:
        with Store(paths.db_path(home or paths.carl_home())) as store:
            run_id = store.create_run(name, source_kind="carl", status="failed", config=config or {})
            store.update_run(run_id, error=reason, pid=os.getpid(), ended_at=_now())
    except StoreError as exc:
        say_error(str(exc))


def _now() -> float:
    import time

    return time.time()


def graceful_signals(pump: CommandPump) -> AbstractContextManager[None]:
    """SIGTERM / SIGINT stop at the next step boundary, with a checkpoint (like the stop command);
    a second one ends the process at once."""
    return first_signal(pump.request_stop)


def open_run(
    store: Store, config: TrainConfig, home: Path, run_name: str | None, resume: str | None
) -> tuple[int, Path]:
    fields = {
        "pid": os.getpid(),
        "temperature": config.temperature,
        "backend": config.backend,
        "model": config.model,
        "max_steps": config.total_steps,
    }
    if resume is not None:
        run = find_run(store, resume)
        store.update_run(
            run["id"], status="running", error=None, ended_at=None, config=config.model_dump(), **fields
        )
        return run["id"], Path(run["output_dir"])
    run_id = store.create_run(
        run_name or config.name,
        source_kind="carl",
        config=config.model_dump(),
        backend=config.backend,
        model=config.model,
        max_steps=config.total_steps,
    )
    created = store.run(run_id)
    assert created is not None  # made just above
    name = created["name"]  # the name as stored (create_run may have made it unique)
    # The run's own directory comes from its id, never from its name alone (engine/names.py).
    output_dir = (
        resolved(config.output_dir, BadInput) if config.output_dir else paths.run_dir(run_id, name, home)
    )
    store.update_run(run_id, output_dir=str(output_dir), **fields)
    return run_id, output_dir


# What a run says while it imports its framework (Reporter.stage): on a busy machine, tens of seconds.
FRAMEWORK_STAGE = {"torch": "importing torch, transformers and TRL", "mlx": "importing MLX and mlx-lm"}


def loading_stage(config: TrainConfig, home: Path) -> str:
    """The stage while the backend loads its inputs: the tiny model is built first on first use."""
    from engine.models.tiny import default_model_dir, is_built

    from .data import TINY_MODEL

    if config.model == TINY_MODEL and not is_built(default_model_dir(home)):
        return "building the tiny model (first use: a BPE tokenizer and a small Llama), then loading it"
    return f"loading the model ({config.model}) and the dataset"


def make_output_dir(output_dir: Path) -> None:
    """Create the run's directory; BadInput (one line) when it cannot be: a file is in the way,
    no permission."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        what = kind_of(os.stat(output_dir).st_mode) if output_dir.exists() else "a file in its path"
        raise BadInput(f"output_dir {output_dir}: {what}, not a directory") from None
    except OSError as exc:
        raise BadInput(f"output_dir {output_dir}: cannot create it ({exc.strerror or exc})") from None


def train_run(
    store: Store | None,
    run_id: int,
    config: TrainConfig,
    home: Path,
    output_dir: Path,
    *,
    resuming: bool,
    ranks: Ranks | None = None,
) -> int:
    """Train the opened run. With `ranks` (several processes) every rank runs this; only rank 0 has
    the store, and the ranks prepare, decide and stop together."""
    reporter = Reporter(store, run_id)
    if ranks is None:
        pump = CommandPump(store, run_id, reporter)
    else:
        pump = RankedCommandPump(store, run_id, reporter, ranks)
    try:
        backend_name = select_backend(config) if ranks is None else training_backend(config)
        reporter.update_run(backend=backend_name)
        make_output_dir(output_dir)
        reporter.stage(FRAMEWORK_STAGE[backend_name])  # the longest wait of a first minute
        backend = make_backend(
            backend_name,
            config,
            home=home,
            output_dir=output_dir,
            reporter=reporter,
            pump=pump,
            resuming=resuming,
            **({} if ranks is None else {"ranks": ranks}),
        )
        reporter.stage(loading_stage(config, home))
        if ranks is None:
            backend.prepare()
        else:
            ranks.together(backend.prepare)
        if not resuming:
            warmup = config.sft_warmup_steps if config.method == "grpo" else 0
            reporter.stage(
                f"preparing the SFT warm-up's first step (of {warmup:,})"
                if warmup
                else "preparing the first step"
            )
        resume_from = None
        if resuming:
            resume_from, keep_step = backend.resume_point()
            reporter.truncate_after(keep_step)  # those steps are replayed from the checkpoint
            reporter.event(keep_step, "resume", str(resume_from or "from the start"))
        with graceful_signals(pump):
            status = backend.train(resume_from)
            final = backend.save_final()
        if final is not None:
            reporter.event(reporter.last_step(), "final", str(final))
    except BadInput as exc:
        return _failed(reporter, pump, str(exc), EXIT_BAD_INPUT, ranks)
    except (TrainingFailed, ConfigError) as exc:
        # A collective inside a reward (the pooled calibration) meets a dead rank first: say that,
        # not the reward.
        return _failed(reporter, pump, _rank_lost(exc, reporter, ranks) or str(exc), EXIT_FAILED, ranks)
    except KeyboardInterrupt:
        return _failed(reporter, pump, "interrupted", EXIT_FAILED, ranks)
    except Exception as exc:
        lost = _rank_lost(exc, reporter, ranks)
        if lost is not None:
            return _failed(reporter, pump, lost, EXIT_FAILED, ranks)
        cause = _training_failure(exc)
        if cause is not None:
            return _failed(reporter, pump, str(cause), EXIT_FAILED, ranks)
        if _diverged(exc):
            step = reporter.last_step() or 0
            reason = f"training diverged at step {step + 1}: the model's probabilities became NaN or inf"
            return _failed(reporter, pump, reason + " (is the learning rate too high?)", EXIT_FAILED, ranks)
        traceback.print_exc()  # a bug: the log keeps the traceback, the run keeps one line
        return _failed(reporter, pump, one_line(exc), EXIT_FAILED, ranks)
    pump.abandon(f"the run was {status} before this command could be applied")
    reporter.set_status(status)
    if status == "finished" and config.eval.at_end and final is not None and store is not None:
        _evaluate_at_end(store, run_id, home)
    return EXIT_OK


def _rank_lost(exc: BaseException, reporter: Reporter, ranks: Ranks | None) -> str | None:
    """With several processes: the reason when `exc` is a collective that another rank's death broke."""
    if ranks is None:
        return None
    return rank_lost(exc, reporter.last_step())


def _evaluate_at_end(store: Store, run_id: int, home: Path) -> None:
    """The configured end-of-run eval; its failure is reported but does not fail the finished run."""
    from .evaluate import evaluate_run, print_result

    try:
        print_result(evaluate_run(store, str(run_id), home=home))
    except Exception as exc:  # the run itself finished: keep that, say why the eval did not
        say_error(f"eval at the end of the run failed: {one_line(exc)}")


def _training_failure(exc: BaseException) -> TrainingFailed | None:
    """A TrainingFailed raised in a reward may reach us wrapped by a library; find it."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if isinstance(current, TrainingFailed):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _diverged(exc: BaseException) -> bool:
    """Sampling from NaN/inf logits: the weights blew up in an earlier optimizer step."""
    return isinstance(exc, RuntimeError) and "probability tensor contains either" in str(exc)


def _failed(reporter: Reporter, pump: CommandPump, reason: str, code: int, ranks: Ranks | None = None) -> int:
    reason = " ".join(reason.split())
    pump.abandon(f"the run failed: {reason}")
    reporter.set_status("failed", error=reason)
    if ranks is None or ranks.is_main:
        say_error(reason)
    elif code != EXIT_BAD_INPUT:  # bad input is every rank's, and rank 0 says it
        say_error(f"rank {ranks.rank}: {reason}")
    return code
