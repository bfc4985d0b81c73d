"""`carl experiment`: arms x seeds of real runs through the engine, evaluated, tabled and stored."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engine.limits import int_flag
from engine.names import name_arg
from engine.text import visible

from .arms import ARMS, ExperimentError, parse_arms, parse_seeds

if TYPE_CHECKING:  # pydantic and yaml load when the command runs, not when `carl` builds its parser
    from engine.training.config import TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--name", type=name_arg, default=None, help="experiment name (default: exp-<the config's name>)"
    )
    parser.add_argument(
        "--config", default="demo", help="the base carl.yaml every arm derives from, or 'demo'"
    )
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated (default: {','.join(ARMS)})")
    parser.add_argument("--seeds", default="3", help="a count (3: seeds 0,1,2) or a list (0,4,7); default 3")
    parser.add_argument(
        "--steps", type=int_flag(1), default=None, help="GRPO steps of each GRPO arm (default: max_steps)"
    )
    parser.add_argument(
        "--backend", choices=("auto", "torch", "mlx"), default=None, help="default: the config's"
    )
    parser.add_argument(
        "--show", action="store_true", help="print the stored results of --name; train nothing"
    )
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")


def run(args: argparse.Namespace, home: Path) -> int:
    from engine import paths
    from engine.store import Store

    from .experiment_runner import Runner, open_experiment, stored_experiment
    from .results import summarize, table

    with Store(paths.db_path(home)) as store:
        if args.show:
            if not args.name:
                raise ExperimentError("--show needs --name (carl experiments lists them)")
            summary = summarize(store, stored_experiment(store, args.name))
            print(json.dumps(summary) if args.json else table(summary))
            return 0
        base, source = _base_config(args)
        arms, seeds = parse_arms(args.arms), parse_seeds(args.seeds)
        if args.steps is not None and args.steps < 1:
            raise ExperimentError(f"--steps: at least 1 GRPO step is needed (got {args.steps})")
        name = args.name or f"exp-{base.name}"
        experiment = open_experiment(store, name, base, arms, seeds, args.steps or base.max_steps, source)
        _engine_up(home)

        def say(line: str) -> None:
            print(visible(f"[{name}] {line}"), file=sys.stderr, flush=True)

        try:
            status = Runner(store, home, experiment, say).run()
        except KeyboardInterrupt:
            say("interrupted: a run in progress carries on in the engine; the same command picks it up")
            return 130
        summary = summarize(store, experiment)
        print(json.dumps(summary) if args.json else table(summary))
        return 0 if status == "finished" else 1


def _base_config(args: argparse.Namespace) -> tuple[TrainConfig, str]:
    from engine.training.config import ConfigError, load_config, training_config_path

    path = training_config_path(args.config)
    source = "demo.yaml" if args.config == "demo" else str(args.config)
    try:
        return load_config(path, {"backend": args.backend}), source
    except ConfigError as exc:
        raise ExperimentError(str(exc)) from None


def _engine_up(home: Path) -> None:
    from engine.control import ensure_engine

    ensure_engine(home)  # says so on stderr when it starts one: the engine outlives this command
