"""`carl`: the headless commands, as a parser and a dispatch.

Each capability owns its commands in its own cli.py: a function that adds a command's arguments to
its parser, and one that runs it as `run(args, home) -> int`. Only the module of the command named
on the line is imported, so `carl engine status` pays for the daemon alone; heavy libraries load
inside the commands that need them. Every user-facing failure is one line on stderr and exit status 2.
What a command prints goes through `engine.text.visible`: a stored name cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Literal, NamedTuple

from engine import paths
from engine.errors import CliError, guard
from engine.text import visible_streams


class Command(NamedTuple):
    module: str  # the capability's cli module
    help: str
    add: str = "add_arguments"  # the module's function that adds the command's arguments
    run: str = "run"  # the module's `run(args, home) -> int`
    # Whether the command gets the home (created when missing): "never" for a command that keeps
    # nothing there, "given" for one that uses it only when `carl --home H` names one.
    home: Literal["always", "never", "given"] = "always"


# In the order `carl --help` lists them.
COMMANDS = {
    "engine": Command("engine.daemon.carl_engine", "the engine daemon"),
    "observe": Command(
        "engine.observe.carl_observe",
        "import or follow runs: TensorBoard, W&B, MLflow, Trackio, trainer_state.json, JSONL, rollout dumps",
    ),
    "train": Command(
        "engine.training.carl_train",
        "train a model with the CARL reward cascade (its own process)",
        "add_train_arguments",
        "run_train",
    ),
    "init": Command(
        "engine.training.carl_train",
        "write a commented carl.yaml to start from",
        "add_init_arguments",
        "run_init",
        "never",
    ),
    "runs": Command("engine.report.carl_report", "list runs in the store", "add_runs_arguments", "list_runs"),
    "experiments": Command(
        "engine.report.carl_report",
        "list experiments in the store (arms x seeds, results)",
        "add_experiments_arguments",
        "list_experiments",
    ),
    "report": Command(
        "engine.report.carl_report",
        "write one self-contained HTML report of a run, several runs or an experiment (charts and tables)",
        "add_report_arguments",
        "run_report",
    ),
    "eval": Command(
        "engine.training.carl_train",
        "evaluate a run's model on the prompts it held out of training",
        "add_eval_arguments",
        "run_eval",
    ),
    "push": Command(
        "engine.training.carl_train",
        "upload a run's model and a generated model card to the Hugging Face Hub",
        "add_push_arguments",
        "run_push",
    ),
    "diagnose": Command("engine.diagnosis.carl_diagnose", "ask Claude (or the offline analyst) about a run"),
    "hook": Command(
        "engine.trajectories.carl_trajectories",
        "record one Claude Code hook payload from stdin (what installed hooks run)",
        "add_hook_arguments",
        "run_hook",
    ),
    "hooks": Command(
        "engine.trajectories.carl_trajectories",
        "install or remove the Claude Code hooks that record trajectories",
        "add_hooks_arguments",
        "run_hooks",
        "given",  # `carl --home H hooks install`: the hooks feed that home's engine
    ),
    "trajectories": Command(
        "engine.trajectories.carl_trajectories",
        "agent trajectories: import, list, status, ablate, export, train, eval",
    ),
    "agents": Command(
        "engine.agents.carl_agents",
        "the agents plane: manager and workers over NATS (up, down, status, run, worker, events)",
    ),
    "experiment": Command(
        "engine.experiments.carl_experiment",
        "run arms x seeds (sft-only, task-only, cascade, always-on) "
        "through the engine, evaluate each run, print the table",
    ),
    "demo": Command("engine.demo.carl_demo", "start the built-in demo training run (through the engine)"),
    "node": Command(
        "engine.nodes.carl_node",
        "join this machine to an engine's store as a node: samples and consoles over NATS (--join URL)",
    ),
}

TRAIN = ("torch", "trl", "transformers")

# What a command needs beyond the base install, and the line that says so. Checked before the
# command's module runs: on the base install engine.training does not even import (no yaml).
EXTRAS = {
    "train": (TRAIN, "training needs the train extra: pip install 'carl-tui[train]'"),
    "eval": (TRAIN, "this command needs the train extra: pip install 'carl-tui[train]'"),
    "push": (("huggingface_hub",), "push needs huggingface_hub: pip install 'carl-tui[train]'"),
    "agents": (("nats", "yaml"), "the agents plane needs the nats extra: pip install 'carl-tui[nats]'"),
    "node": (
        ("nats", "yaml", "psutil"),
        "carl node needs the nats extra and psutil: pip install 'carl-tui[nats]' psutil",
    ),
    "experiment": (
        (*TRAIN, "scipy"),
        "experiments train models: install the train extra (pip install 'carl-tui[train]')",
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hook"] and not {"-h", "--help"} & set(argv[1:]):
        # An agent's hook: no parser, no imports, no output, always 0 (help is for people, below).
        from engine.trajectories.capture.recorder import main as record_hook

        return record_hook(argv[1:])
    # What a command prints holds stored names, keys, prompts and paths: none may drive the terminal
    # (argparse's own errors quote the line, so they go through it too).
    with visible_streams("stdout", "stderr"):
        args = build_parser(named_command(argv)).parse_args(argv)
    with visible_streams("stdout"):
        return guard(dispatch, args)


def named_command(argv: list[str]) -> str | None:
    """The command the line names, read with the top-level options alone (nothing is imported for it)."""
    scout = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    scout.add_argument("--home")
    scout.add_argument("command", nargs="?")
    try:
        known, _ = scout.parse_known_args(argv)
    except argparse.ArgumentError:  # `carl --home` with no value: the real parser says so
        return None
    return known.command


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `carl` parser; the arguments of `command` alone, whose module is the only one imported."""
    parser = argparse.ArgumentParser(prog="carl", description="carl headless commands.")
    parser.add_argument("--home", dest="top_home", help="state directory (default $CARL_HOME or ~/.carl)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, spec in COMMANDS.items():
        command_parser = sub.add_parser(name, help=spec.help)
        if name == command:
            _add_arguments(command_parser, spec)
    return parser


def _add_arguments(parser: argparse.ArgumentParser, spec: Command) -> None:
    try:
        getattr(importlib.import_module(spec.module), spec.add)(parser)
    except ImportError:  # the base install lacks the command's dependencies: the dispatch explains
        parser.add_argument("rest", nargs=argparse.REMAINDER)


def dispatch(args: argparse.Namespace) -> int:
    spec = COMMANDS[args.command]
    _check_extras(args)
    module = importlib.import_module(spec.module)  # a broken install raises here, with its traceback
    wants_home = spec.home == "always" or (spec.home == "given" and args.top_home)
    home = home_of(args) if wants_home else None
    return getattr(module, spec.run)(args, home)


def _check_extras(args: argparse.Namespace) -> None:
    if args.command not in EXTRAS or getattr(args, "show", False):  # `carl experiment --show` trains nothing
        return
    modules, message = EXTRAS[args.command]
    if any(importlib.util.find_spec(m) is None for m in modules):
        raise CliError(message)


def home_of(args: argparse.Namespace) -> Path:
    """`carl --home H cmd` or `carl cmd --home H` (train, push): set for this process and what it
    starts; created (mode 0700) when missing."""
    home = getattr(args, "top_home", None) or getattr(args, "home", None)
    if home:
        os.environ["CARL_HOME"] = str(Path(home).expanduser())
    return paths.carl_home()


if __name__ == "__main__":
    sys.exit(main())
