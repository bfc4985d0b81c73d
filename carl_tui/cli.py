"""Entry points: `carl-tui` (the control room) and `carl` (headless).

Heavy modules are imported inside the commands that need them, so `carl engine status` and
`carl-tui` start fast. Every user-facing failure is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import paths
from engine.durations import compact_duration
from engine.errors import CarlError

if TYPE_CHECKING:
    from engine.store import StoreReader


class CliError(CarlError):
    """A one-line message for the user."""


def _home(args: argparse.Namespace, *, create: bool = True) -> Path:
    home = getattr(args, "top_home", None) or getattr(args, "home", None)
    if home:
        os.environ["CARL_HOME"] = str(Path(home).expanduser())
    return paths.carl_home(create=create)


def _fail(message: str) -> int:
    print(f"carl: {message}", file=sys.stderr)
    return 2


def _guard(fn: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Errors meant for the user become one line; anything else is a bug and keeps its traceback."""
    try:
        return fn(args)
    except (CarlError, FileNotFoundError) as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `carl ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush does not raise
        return 0


# -- carl-tui -----------------------------------------------------------------------------


def tui_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="carl-tui", description="The carl control room.")
    parser.add_argument("--home", help="state directory (default $CARL_HOME or ~/.carl)")
    parser.add_argument(
        "--readonly",
        action="store_true",
        help="watch only: no keys that write to the store, and the engine is not started",
    )
    parser.add_argument("--no-engine", action="store_true", help="do not start the engine daemon")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="start the built-in demo training run (if none is live) and watch it",
    )
    parser.add_argument(
        "--demo-steps", type=int, default=None, help="GRPO steps of the demo run (default: demo.yaml's)"
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "torch", "mlx"),
        default=None,
        help="what the demo trains on (default: auto, MLX on Apple silicon)",
    )
    parser.add_argument(
        "--api-key", default=None, help="Anthropic API key for `d` (default: $ANTHROPIC_API_KEY)"
    )
    parser.add_argument(
        "--experiment",
        metavar="NAME",
        default=None,
        help="open with the experiment's runs marked: Φ and rewards overlaid, one colour per arm",
    )
    web = parser.add_argument_group("in a browser (the serve extra)")
    web.add_argument(
        "--serve",
        action="store_true",
        help="serve the control room to a browser (textual-serve), behind a token printed once",
    )
    web.add_argument("--host", default=None, help="address to listen on with --serve (default: 127.0.0.1)")
    web.add_argument("--port", type=int, default=None, help="port for --serve (default, or 0: a free one)")
    web.add_argument(
        "--allow-control",
        action="store_true",
        help="with --serve: keys that write to the store (training control); read-only without it",
    )
    args = parser.parse_args(argv)
    return _guard(_run_tui, args)


def _run_tui(args: argparse.Namespace) -> int:
    home = _home(args, create=not args.readonly)  # watch-only: writes nothing, not even an empty home
    if not args.serve and (args.host is not None or args.port is not None or args.allow_control):
        raise CliError("--host, --port and --allow-control go with --serve")
    if args.readonly and args.demo:
        raise CliError("--demo starts a training run; a --readonly session starts nothing (leave one out)")
    if args.serve and importlib.util.find_spec("textual_serve") is None:
        raise CliError("--serve needs textual-serve: pip install 'carl-tui[serve]'")
    if args.experiment is not None:
        _check_experiment(home, args.experiment)
    if args.demo:
        _start_demo(home, args.demo_steps, args.backend)
    os.environ.setdefault("TEXTUAL_ANIMATIONS", "none")  # nothing moves unless data does
    if args.serve:
        return _serve(home, args)
    # No cyclic garbage collection until the first frame is on screen (the app turns it back on):
    # start-up allocates a great deal and keeps nearly all of it, so a collection then (one took
    # 15-20 ms, in the middle of drawing the first chart) frees next to nothing.
    gc.disable()
    from .model import FirstRead, StoreWatcher

    first_read = FirstRead(StoreWatcher(paths.db_path(home)))  # the store, read before Textual loads
    from .app import ControlRoom

    app = ControlRoom(
        home,
        readonly=args.readonly,
        start_engine=not args.no_engine,
        api_key=args.api_key,
        experiment=args.experiment,
        first_read=first_read,
    )
    app.run()
    _say_engine_left_running(home, app.engine_started_pid)
    return 0


def _say_engine_left_running(home: Path, pid: int | None) -> None:
    """Back at the shell: if this control room started the engine and it is still up, say so in the
    line the user sees next (the app's own notice went with its screen)."""
    if pid is None:
        return
    from engine.daemon import engine_status, started_line

    if engine_status(home).pid == pid:
        print(started_line(pid, after="carl-tui"), file=sys.stderr)


def _serve(home: Path, args: argparse.Namespace) -> int:
    """The same control room, one process per browser session, read-only unless --allow-control."""
    from .serve import serve

    if args.api_key:  # the sessions inherit it; a command line would show it in `ps`
        os.environ["ANTHROPIC_API_KEY"] = args.api_key
    return serve(
        home,
        host=args.host or "127.0.0.1",
        port=args.port or 0,
        readonly=args.readonly or not args.allow_control,
        start_engine=not args.no_engine,
        experiment=args.experiment,
    )


def _check_experiment(home: Path, name: str) -> None:
    """`--experiment NAME` names one the store holds; else one line, before the screen opens."""
    from engine.store import StoreReader

    from .model import find_experiment

    db = paths.db_path(home)
    if not db.exists():
        raise CliError(f"no store at {db}, so no experiment {name!r}")
    reader = StoreReader(db)
    try:
        if find_experiment(reader, name) is not None:
            return
        known = [e["name"] for e in reader.experiments()]
    finally:
        reader.close()
    there = f" (there are: {', '.join(known)})" if known else ""
    raise CliError(f"no experiment named {name!r} in {db}{there}")


# -- carl ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hook"]:  # an agent's hook: no parser, no imports, no output, always 0
        from engine.trajectories.capture.recorder import main as record_hook

        return record_hook(argv[1:])
    parser = argparse.ArgumentParser(prog="carl", description="carl headless commands.")
    parser.add_argument("--home", dest="top_home", help="state directory (default $CARL_HOME or ~/.carl)")
    sub = parser.add_subparsers(dest="command", required=True)

    engine = sub.add_parser("engine", help="the engine daemon")
    engine.add_argument("action", choices=["start", "stop", "status", "run"])
    engine.add_argument("--json", action="store_true", help="status: print one JSON object")
    engine.set_defaults(fn=_engine)

    observe = sub.add_parser("observe", help="import a run from a Trackio db, trainer_state.json or JSONL")
    observe.add_argument("path")
    observe.add_argument("--follow", "-f", action="store_true", help="keep tailing it (through the engine)")
    observe.add_argument("--name", help="run name (default: from the source)")
    observe.set_defaults(fn=_observe)

    train = sub.add_parser("train", help="train a model with the CARL reward cascade (its own process)")
    train.set_defaults(fn=_train)
    _add_train_arguments(train)

    init = sub.add_parser("init", help="write a commented carl.yaml to start from")
    init.add_argument("path", nargs="?", default="carl.yaml")
    init.set_defaults(fn=_init)

    runs = sub.add_parser("runs", help="list runs in the store")
    runs.add_argument("--json", action="store_true", help="one JSON object a line")
    runs.set_defaults(fn=_runs)

    experiments = sub.add_parser("experiments", help="list experiments in the store (arms x seeds, results)")
    experiments.add_argument("--json", action="store_true", help="one JSON object a line")
    experiments.set_defaults(fn=_experiments)

    report = sub.add_parser(
        "report",
        help="write one self-contained HTML report of a run, several runs or an "
        "experiment (charts and tables)",
    )
    report.add_argument(
        "refs", nargs="+", metavar="RUN|EXPERIMENT", help="run names or ids, or one experiment"
    )
    report.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="the HTML file, or a folder for it (default: ./carl-report-<name>.html)",
    )
    report.set_defaults(fn=_report)

    evaluate = sub.add_parser("eval", help="evaluate a run's model on the prompts it held out of training")
    evaluate.add_argument("run", help="run name or id")
    evaluate.add_argument("--max-prompts", type=int, default=None, help="held-out prompts to use at most")
    evaluate.add_argument("--json", action="store_true", help="print the result as one JSON object")
    evaluate.set_defaults(fn=_eval)

    push = sub.add_parser(
        "push", help="upload a run's model and a generated model card to the Hugging Face Hub"
    )
    push.set_defaults(fn=_push)
    _add_push_arguments(push)

    diagnose = sub.add_parser("diagnose", help="ask Claude (or the offline analyst) about a run")
    diagnose.add_argument("run", help="run name or id")
    diagnose.add_argument("question", nargs="?", default=None, help="what to ask (default: how is it doing?)")
    diagnose.add_argument(
        "--json", action="store_true", help="print one JSON object: answer, tool calls, findings"
    )
    diagnose.add_argument("--offline", action="store_true", help="use the offline analyst even with a key")
    diagnose.add_argument(
        "--model", default=None, help="Claude model (default: $CARL_CLAUDE_MODEL or tui.toml)"
    )
    diagnose.add_argument("--api-key", default=None, help="Anthropic API key (default: $ANTHROPIC_API_KEY)")
    diagnose.set_defaults(fn=_diagnose)

    hook = sub.add_parser(
        "hook", help="record one Claude Code hook payload from stdin (what installed hooks run)"
    )
    hook.set_defaults(fn=_hook)
    hooks = sub.add_parser("hooks", help="install or remove the Claude Code hooks that record trajectories")
    hooks.add_argument(
        "rest", nargs=argparse.REMAINDER, help="install|uninstall|status [--user|--project|--local]"
    )
    hooks.set_defaults(fn=_hooks)

    trajectories = sub.add_parser(
        "trajectories", help="agent trajectories: import, list, status, ablate, export, train, eval"
    )
    from engine.trajectories.cli import add_arguments as add_trajectory_arguments

    add_trajectory_arguments(trajectories)
    trajectories.set_defaults(fn=_trajectories)

    agents = sub.add_parser(
        "agents",
        help="the agents plane: manager and workers over NATS (up, down, status, run, worker, events)",
    )
    from engine.agents.cli import add_arguments as add_agents_arguments

    add_agents_arguments(agents)
    agents.set_defaults(fn=_agents)

    experiment = sub.add_parser(
        "experiment",
        help="run arms x seeds (sft-only, task-only, cascade, always-on) "
        "through the engine, evaluate each run, print the table",
    )
    from engine.experiments.cli import add_arguments as add_experiment_arguments

    add_experiment_arguments(experiment)
    experiment.set_defaults(fn=_experiment)

    demo = sub.add_parser("demo", help="start the built-in demo training run (through the engine)")
    demo.add_argument("--steps", type=int, default=None)
    demo.add_argument("--backend", choices=("auto", "torch", "mlx"), default=None, help="default: auto")
    demo.set_defaults(fn=lambda a: _start_demo(_home(a), a.steps, a.backend) or 0)

    args = parser.parse_args(argv)
    return _guard(args.fn, args)


def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from engine.training.cli import add_train_arguments
    except ImportError:  # the base install has no training code's dependencies: explain at run time
        parser.add_argument("rest", nargs=argparse.REMAINDER)
        return
    add_train_arguments(parser)


def _train(args: argparse.Namespace) -> int:
    if any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "transformers")):
        raise CliError("training needs the train extra: pip install 'carl-tui[train]'")
    from engine.training.cli import train_from_args

    args.home = _home(args)  # `carl --home H train` and `carl train --home H` both work
    return train_from_args(args)


def _hook(args: argparse.Namespace) -> int:
    from engine.trajectories.capture.recorder import main as record_hook

    _home(args)  # `carl --home H hook` sets CARL_HOME for the recorder
    return record_hook([])


def _hooks(args: argparse.Namespace) -> int:
    from engine.trajectories.capture.hooks import hooks_cli_main

    if getattr(args, "top_home", None):
        _home(args)  # `carl --home H hooks install`: the hooks feed that home's engine
    return hooks_cli_main(args.rest)


def _trajectories(args: argparse.Namespace) -> int:
    from engine.trajectories.cli import run

    return run(args, _home(args))


def _experiment(args: argparse.Namespace) -> int:
    if not args.show and any(
        importlib.util.find_spec(m) is None for m in ("torch", "trl", "transformers", "scipy")
    ):
        raise CliError("experiments train models: install the train extra (pip install 'carl-tui[train]')")
    from engine.experiments.cli import run

    return run(args, _home(args))


def _agents(args: argparse.Namespace) -> int:
    if any(importlib.util.find_spec(m) is None for m in ("nats", "yaml")):
        raise CliError("the agents plane needs the nats extra: pip install 'carl-tui[nats]'")
    from engine.agents.cli import run

    return run(args, _home(args))


def _diagnose(args: argparse.Namespace) -> int:
    from engine.diagnosis.cli import diagnose

    home = _home(args)
    model = args.model or _configured_model(home)
    return diagnose(
        home,
        args.run,
        args.question,
        as_json=args.json,
        offline=args.offline,
        model=model,
        api_key=args.api_key,
    )


def _configured_model(home: Path) -> str | None:
    from .config import load_config

    return load_config(home).claude_model


def _need_training_extra() -> None:
    if any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "transformers")):
        raise CliError("this command needs the train extra: pip install 'carl-tui[train]'")


def _eval(args: argparse.Namespace) -> int:
    _need_training_extra()
    from engine.training.evaluate import eval_from_args

    if args.max_prompts is not None and args.max_prompts <= 0:
        raise CliError(f"--max-prompts {args.max_prompts}: must be a positive number")
    return eval_from_args(_home(args), args.run, args.max_prompts, args.json)


def _add_push_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from engine.training.push import add_push_arguments
    except ImportError:
        parser.add_argument("rest", nargs=argparse.REMAINDER)
        return
    add_push_arguments(parser)


def _push(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("huggingface_hub") is None:
        raise CliError("push needs huggingface_hub: pip install 'carl-tui[train]'")
    from engine.training.push import push_from_args

    args.home = _home(args)
    return push_from_args(args)


def _init(args: argparse.Namespace) -> int:
    from engine.training.cli import init_config

    init_config(args.path)
    print(f"wrote {args.path}: edit it, then `carl train --config {args.path}` (or press n in carl-tui)")
    return 0


def _engine(args: argparse.Namespace) -> int:
    from engine.daemon import engine_report, run_engine, start_engine, stop_engine

    home = _home(args)
    if args.action == "run":
        return run_engine(home)
    if args.action == "start":
        status, started = start_engine(home)
        if status.state != "up":
            raise CliError(f"engine did not start; see {status.log_path}")
        if started:
            print(
                f"engine started (pid {status.pid}) in the background; log {status.log_path}; "
                "`carl engine stop` stops it"
            )
        else:
            print(f"engine already running (pid {status.pid}); log {status.log_path}")
        return 0
    if args.action == "stop":
        training = engine_report(home)["training"]
        if not stop_engine(home):
            print("engine was not running")
            return 0
        print("engine stopped")
        if training:  # what it started and leaves running
            runs = ", ".join(f"{r['run'] or r['what']} (pid {r['pid']})" for r in training)
            print(f"still training: {runs} — {CARRY_ON}")
        return 0
    report = engine_report(home)
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join(engine_lines(report)))
    return 0 if report["state"] == "up" else 3


def engine_lines(report: dict[str, Any]) -> list[str]:
    """`carl engine status` for a person: the engine, then what it is running, then how to stop it."""
    if report["state"] != "up":
        why = " (stopped with `carl engine stop`)" if report["stopped_by_user"] else ""
        why += " (stale pidfile recovered)" if report["stale_pidfile_recovered"] else ""
        lines = [
            f"engine down{why}; `carl engine start` starts it",
            f"  home      {report['home']}",
            f"  log       {report['log_path']}",
        ]
        if report["agents"]["wanted"]:
            lines.append("  agents    the plane was up: it comes back up with the engine")
        return lines
    beat = (
        report["heartbeat_at"] and f", heartbeat {compact_duration(time.time() - report['heartbeat_at'])} ago"
    )
    uptime = f", up {compact_duration(report['uptime_s'])}" if report["uptime_s"] is not None else ""
    lines = [
        f"engine up (pid {report['pid']}{uptime}{beat or ''})",
        f"  home      {report['home']}",
        f"  log       {report['log_path']}",
    ]
    training = report["training"]
    if not training:
        lines.append("  training  nothing (n in carl-tui, `carl demo`, `carl experiment` start runs)")
    for i, run in enumerate(training):
        head = "  training  " if i == 0 else " " * 12
        if run["run"] is None:
            lines.append(f"{head}{run['what']}: starting (pid {run['pid']}; log {run['log']})")
            continue
        step = "-" if run["step"] is None else f"{run['step']:,}"
        total = f"/{run['max_steps']:,}" if run["max_steps"] else ""
        lines.append(f"{head}{run['run']}: {run['state']}, step {step}{total} (pid {run['pid']})")
    for i, ev in enumerate(report["evals"]):
        head = "  evals     " if i == 0 else " " * 12
        lines.append(f"{head}{ev['run']} (pid {ev['pid']}; log {ev['log']})")
    lines.append(f"  agents    {_agents_line(report['agents'])}")
    lines.append(f"`carl engine stop` stops it{' and its agents plane' if report['agents']['up'] else ''}")
    if training:
        lines.append(f"({CARRY_ON})")
    return lines


CARRY_ON = "a training run is a process of its own: it carries on to its end; s in carl-tui stops it"


def _agents_line(agents: dict[str, Any]) -> str:
    if not agents["up"]:
        return "plane not up (`carl agents up` starts one)"
    server = agents["server"] or {}
    if server.get("local"):
        where = f"nats-server {server.get('state') or '?'} at {server.get('url')} (pid {server.get('pid')})"
    else:
        where = f"external NATS at {server.get('url') or '?'}"
    counts: dict[str, int] = {}
    for proc in agents["processes"]:
        if proc["state"] in ("running", "starting", "restarting"):
            counts[proc["role"]] = counts.get(proc["role"], 0) + 1
    parts = [f"{n} {role}{'s' if n != 1 and role == 'worker' else ''}" for role, n in counts.items()]
    return f"plane up: {where}; " + (", ".join(parts) if parts else "no process running")


def _observe(args: argparse.Namespace) -> int:
    from engine.observe import detect_kind

    home = _home(args)
    path = Path(args.path).expanduser().resolve()
    kind = detect_kind(path)  # a bad path fails here, before anything is stored
    if args.follow:
        return _observe_via_engine(home, path, args.name)
    from engine.coherence.analysis import analyze_runs
    from engine.observe import observe
    from engine.store import Store

    with Store(paths.db_path(home)) as store, _LazyProgress(f"importing {path.name}") as progress:
        _, result = observe(store, path, follow=False, name=args.name, progress=progress.update)
        with store.transaction():
            analyze_runs(store.conn, result.run_ids)
    _print_result(kind, path, result)
    return 0


def _print_result(kind: str, path: Path, result: object) -> None:
    rows = getattr(result, "rows", 0)
    bad = getattr(result, "bad_lines", 0)
    runs = getattr(result, "run_ids", [])
    print(
        f"{kind}: {path}: {rows:,} metric rows into {len(runs)} run(s)"
        + (f"; {bad:,} malformed lines skipped" if bad else "")
    )
    for problem in getattr(result, "problems", [])[:10]:
        print(f"  {problem}", file=sys.stderr)


def _observe_via_engine(home: Path, path: Path, name: str | None) -> int:
    """Hand a followed source to the engine (its one writer) and wait until it has caught up."""
    from engine.daemon import ensure_engine
    from engine.store import Store

    ensure_engine(home)  # says so on stderr when it starts one: the engine outlives this command
    with Store(paths.db_path(home)) as store:
        command_id = store.enqueue_command("observe", {"path": str(path), "follow": True, "name": name})
        with _LazyProgress(f"engine importing {path.name}") as progress:
            while True:
                state, result = store.conn.execute(
                    "SELECT state, result FROM commands WHERE id=?", (command_id,)
                ).fetchone()
                row = store.conn.execute("SELECT rows FROM sources WHERE path=?", (str(path),)).fetchone()
                progress.update(row[0] if row else 0, None)
                if state in ("done", "failed"):
                    break
                time.sleep(0.2)
    if state == "failed":
        raise CliError(result or "observe failed")
    print(f"{result}; the engine keeps following it")
    return 0


def _listing_reader(args: argparse.Namespace, what: str) -> StoreReader | None:
    """The store, read-only, for a listing; None (and a line saying so: on stderr with --json, whose
    stdout stays JSON Lines) when there is no store yet."""
    from engine.store import StoreReader

    db = paths.db_path(_home(args))
    if not db.exists():
        print(f"no {what} yet (no store at {db})", file=sys.stderr if args.json else sys.stdout)
        return None
    return StoreReader(db)


def _runs(args: argparse.Namespace) -> int:
    reader = _listing_reader(args, "runs")
    if reader is None:
        return 0
    try:
        if args.json:  # one object a line: `jq`, `pandas.read_json(..., lines=True)`
            from engine.report import run_record

            for run in reader.runs():
                print(json.dumps(run_record(reader, run)))
            return 0
        for run in reader.runs():
            steps = f"{run.last_step:,}" if run.last_step is not None else "-"
            print(
                f"{run.id:>4}  {run.name:<28} {run.status:<9} step {steps:>9}  {run.source_kind:<13}"
                f" {run.health or '-':<6} {run.phase or '-'}"
            )
    finally:
        reader.close()
    return 0


def _experiments(args: argparse.Namespace) -> int:
    from engine.report import experiment_record

    reader = _listing_reader(args, "experiments")
    if reader is None:
        return 0
    try:
        records = [experiment_record(reader, e) for e in reader.experiments()]
    finally:
        reader.close()
    if args.json:
        for record in records:
            print(json.dumps(record))
        return 0
    if not records:
        print("no experiments yet: `carl experiment` runs one")
        return 0
    for e in records:
        done = e["cell_status"].get("finished", 0)
        print(
            f"{e['id']:>4}  {e['name']:<28} {e['status']:<9} {len(e['arms'])} arms x {len(e['seeds'])} seeds, "
            f"{e['steps']} steps; {done}/{len(e['cells'])} cells finished"
        )
        for arm in e["summary"]:
            print(
                f"        {arm['arm']:<12} task {_mean_ci(arm['task'])}  solved {_mean_ci(arm['solved'])}"
                f"  ({arm['finished']}/{arm['seeds']} seeds)"
            )
    return 0


def _mean_ci(figure: dict[str, object]) -> str:
    mean, ci = figure["mean"], figure["ci95"]
    if mean is None:
        return f"{'—':<22}"
    text = f"{mean:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")  # type: ignore[index]
    return f"{text:<22}"


def _report(args: argparse.Namespace) -> int:
    from engine.report import write_report

    db = paths.db_path(_home(args))
    if not db.exists():
        raise CliError(f"no store at {db}: nothing to report")
    print(write_report(db, args.refs, args.output))
    return 0


class _LazyProgress:
    """A rich progress bar that appears only once work has taken more than a second."""

    def __init__(self, label: str, delay: float = 1.0) -> None:
        self.label, self.delay = label, delay
        self.started = time.monotonic()
        self.progress = None
        self.task = None

    def __enter__(self) -> _LazyProgress:
        return self

    def update(self, done: int, total: int | None) -> None:
        if self.progress is None:
            if time.monotonic() - self.started < self.delay or not sys.stderr.isatty():
                return
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=total)
        self.progress.update(self.task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


# -- the demo -----------------------------------------------------------------------------


def _start_demo(home: Path, steps: int | None, backend: str | None = None) -> None:
    """Have the engine start the built-in demo (SFT warm-up, then GRPO with the reward cascade
    on the tiny model) unless a demo run is already live; the control room then watches it."""
    if any(importlib.util.find_spec(m) is None for m in ("torch", "trl", "transformers")):
        raise CliError("the demo trains a model: install the train extra (pip install 'carl-tui[train]')")
    if backend == "mlx" and any(importlib.util.find_spec(m) is None for m in ("mlx", "mlx_lm")):
        raise CliError("--backend mlx: install the mlx extra (pip install 'carl-tui[mlx]')")
    from engine.daemon import ensure_engine
    from engine.store import Store

    ensure_engine(home)  # says so on stderr when it starts one: the engine outlives this command
    with Store(paths.db_path(home)) as store:
        live = store.conn.execute(
            "SELECT name FROM runs WHERE source_kind='carl' AND name LIKE 'demo%' AND status IN ('running','paused')"
        ).fetchone()
        if live:
            print(f"demo run {live[0]!r} is live; opening the control room on it")
            return
        args = {
            "config": "demo",
            "name": "demo",
            **({"max_steps": steps} if steps else {}),
            **({"backend": backend} if backend else {}),
        }
        store.enqueue_command("train", args, target="engine", origin="cli")
        plane = _demo_plane(store)
    print("demo training queued: the engine starts it (logs in ~/.carl/logs/train-*.log)")
    if plane:
        print(plane)


DEMO_PLANE = {
    "workers": 2,
    "tasks": "demo",
    "overrides": {"rate": 1.0},
}  # a task a second: light beside training


def _demo_plane(store: object) -> str | None:
    """A small agents plane on the demo task beside the demo run, so the Agents pane is live too
    (only with the nats extra, and only when no plane is up)."""
    import json

    if any(importlib.util.find_spec(m) is None for m in ("nats", "yaml")):
        return "(the Agents pane stays empty: install the nats extra for a live agents plane)"
    conn = store.conn  # type: ignore[attr-defined]
    row = conn.execute("SELECT value FROM kv WHERE key='agents.plane'").fetchone()
    if row is not None and json.loads(row[0]).get("wanted"):
        return None
    store.enqueue_command("agents_up", DEMO_PLANE, target="engine", origin="cli")  # type: ignore[attr-defined]
    return "agents plane queued: a manager and 2 workers on the demo task (carl agents down stops it)"
