"""A training run as its own process: `carl train` (or `python -m engine.training`) in one process, or
one rank of several when a launcher started it. The lifecycle itself (opening the run, training it,
exit codes, failures) is engine/training/lifecycle.py."""

from __future__ import annotations

from pathlib import Path

from engine import paths
from engine.store import Store, StoreError

from .backend import BadInput
from .config import TrainConfig
from .distributed import run_rank
from .lifecycle import EXIT_BAD_INPUT, open_run, say_error, train_run
from .rank_processes import end_self, note_self
from .ranks import launched_world


def run_training(
    config: TrainConfig,
    *,
    home: Path | None = None,
    run_name: str | None = None,
    resume: str | None = None,
    attach: int | None = None,
) -> int:
    """Train `config` as a run in the store at `home` (or resume run `resume`); returns the exit code.

    Started by a launcher (accelerate / torchrun: several ranks), this process is one rank of the run;
    `attach` is then the run the launching `carl train` opened (engine/training/distributed.py)."""
    home = paths.carl_home() if home is None else Path(home)
    if launched_world() > 1:
        return run_rank(config, home=home, run_name=run_name, resume=resume, attach=attach)
    try:
        store = Store(paths.db_path(home))
    except StoreError as exc:
        say_error(str(exc))
        return EXIT_BAD_INPUT
    with store:
        try:
            run_id, output_dir = open_run(store, config, home, run_name, resume)
        except BadInput as exc:
            say_error(str(exc))
            return EXIT_BAD_INPUT
        note_self(store, run_id, "runner")  # the run's process, and its end (engine/system/run_processes.py)
        code = train_run(store, run_id, config, home, output_dir, resuming=resume is not None)
        end_self(store, run_id, code)
        return code
