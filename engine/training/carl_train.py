"""`carl train`, `carl init`, `carl eval` and `carl push` (engine/cli.py wires them in), and
`python -m engine.training`, which is `carl train` as its own process."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.errors import CliError
from engine.limits import INT64_MAX, int_flag
from engine.names import name_arg

from .config import ConfigError, load_config, write_default_config

# Flags that override a carl.yaml field of the same name.
OVERRIDES = ("model", "dataset", "method", "backend", "max_steps", "processes", "opd")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", "-c", type=Path, default=None, help="carl.yaml (default: built-in defaults)"
    )
    parser.add_argument("--name", type=name_arg, default=None, help="run name (default: the config's name)")
    parser.add_argument("--model", "-m", default=None, help="'carl-tiny', a model directory or a hub id")
    parser.add_argument(
        "--dataset", "-d", default=None, help="'demo' or a .jsonl/.json file with a prompt column"
    )
    parser.add_argument("--method", choices=("grpo", "sft"), default=None)
    parser.add_argument("--backend", choices=("auto", "torch", "mlx"), default=None)
    parser.add_argument("--max-steps", type=int_flag(1), default=None, help="steps of the main phase")
    parser.add_argument(
        "--processes",
        type=int_flag(1),
        default=None,
        metavar="N",
        help=(
            "train data-parallel in N processes through accelerate (torch; at most the GPUs, "
            "or the CPU cores)"
        ),
    )
    parser.add_argument(
        "--opd",
        action="store_true",
        default=None,  # not given: the config's `opd`
        help="GRPO on MLX: on-policy distillation from the dataset's 'hint' column (opd: true)",
    )
    parser.add_argument(
        "--resume", default=None, metavar="RUN", help="continue RUN (name or id) from its last checkpoint"
    )
    parser.add_argument("--home", type=Path, default=None, help="carl home (default: $CARL_HOME or ~/.carl)")
    # Internal: a rank started by `carl train --processes N` joins the run that process opened.
    parser.add_argument("--attach", type=int_flag(1, INT64_MAX), default=None, help=argparse.SUPPRESS)


def run_train(args: argparse.Namespace, home: Path) -> int:
    args.home = home  # `carl --home H train` and `carl train --home H` both work
    return train_from_args(args)


def train_from_args(args: argparse.Namespace) -> int:
    """Run `carl train` with parsed arguments; returns the exit code."""
    from engine import paths

    from .backend import BadInput
    from .lifecycle import EXIT_BAD_INPUT, record_failed_run, say_error
    from .ranks import launched_rank, launched_world
    from .runner import run_training

    overrides: dict[str, Any] = {key: getattr(args, key, None) for key in OVERRIDES}
    home = args.home.expanduser() if args.home else paths.carl_home()
    attach = getattr(args, "attach", None)
    try:
        if attach is not None:  # a rank: the config the launching carl train stored with the run
            config = _attached_config(home, attach)
        elif args.resume and args.config is None:
            config = _resumed_config(home, args.resume, overrides)
        else:
            config = load_config(args.config, overrides)
    except BadInput as exc:
        say_error(str(exc))
        return EXIT_BAD_INPUT
    except ConfigError as exc:
        say_error(str(exc))
        name = args.name or (args.config.stem if args.config else "run")
        if not args.resume and attach is None and launched_rank() == 0:
            record_failed_run(home, name, str(exc))
        return EXIT_BAD_INPUT
    if config.processes > 1 and launched_world() == 1:
        from .distributed import launch

        return launch(config, home=home, run_name=args.name, resume=args.resume)
    return run_training(config, home=home, run_name=args.name, resume=args.resume, attach=attach)


def _resumed_config(home: Path, ref: str, overrides: dict[str, Any]) -> Any:
    """The run's own config, with the flags given now on top (e.g. a larger --max-steps)."""
    from engine import paths
    from engine.store import Store

    from .config import config_from_data
    from .lifecycle import stored_config

    with Store(paths.db_path(home)) as store:
        data = stored_config(store, ref)
    return config_from_data(data, f"run {ref}", overrides)


def _attached_config(home: Path, run_id: int) -> Any:
    import json

    from engine import paths
    from engine.store import Store

    from .backend import BadInput
    from .config import config_from_data

    with Store(paths.db_path(home)) as store:
        run = store.run(run_id)
    if run is None:
        raise BadInput(f"--attach {run_id}: no such run")
    return config_from_data(json.loads(run["config"] or "{}"), f"run {run_id}")


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", nargs="?", default="carl.yaml")


def run_init(args: argparse.Namespace, home: Path | None) -> int:
    init_config(args.path)
    print(f"wrote {args.path}: edit it, then `carl train --config {args.path}` (or press n in carl-tui)")
    return 0


def init_config(path: str | Path) -> None:
    """Write the commented default carl.yaml (`carl init`); ConfigError if it exists."""
    write_default_config(path)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run name or id")
    parser.add_argument(
        "--max-prompts", type=int_flag(1), default=None, help="held-out prompts to use at most"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run_eval(args: argparse.Namespace, home: Path) -> int:
    from .evaluate import eval_from_args

    if args.max_prompts is not None and args.max_prompts <= 0:
        raise CliError(f"--max-prompts {args.max_prompts}: must be a positive number")
    return eval_from_args(home, args.run, args.max_prompts, args.json)


def add_push_arguments(parser: argparse.ArgumentParser) -> None:
    from . import push  # its imports (numpy, the artifact readers) only for `carl push`

    push.add_push_arguments(parser)


def run_push(args: argparse.Namespace, home: Path) -> int:
    from .push import push_from_args

    args.home = home
    return push_from_args(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.training", description="Train a model, reporting to carl."
    )
    add_train_arguments(parser)
    return train_from_args(parser.parse_args(argv))
