"""The `carl-tui` entry point: the control room, or the same served to a browser.

Heavy modules are imported inside the paths that need them, so `carl-tui` starts fast. Every
user-facing failure is one line on stderr and exit status 2 (engine.errors.guard, shared with the
headless `carl`, which is engine/cli.py).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
from pathlib import Path

from engine import paths
from engine.errors import CliError, guard
from engine.limits import PORT_MAX, int_flag


def _home(args: argparse.Namespace, *, create: bool = True) -> Path:
    if args.home:  # set for this process and the engine it starts
        os.environ["CARL_HOME"] = str(Path(args.home).expanduser())
    return paths.carl_home(create=create)


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
        "--demo-steps",
        type=int_flag(1),
        default=None,
        help="GRPO steps of the demo run (default: demo.yaml's)",
    )
    parser.add_argument(
        "--demo-stay", action="store_true", help="keep the demo's agents plane up after the demo run ends"
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
    web.add_argument(
        "--port",
        type=int_flag(0, PORT_MAX),
        default=None,
        help="port for --serve (default, or 0: a free one)",
    )
    web.add_argument(
        "--allow-control",
        action="store_true",
        help="with --serve: keys that write to the store (training control); read-only without it",
    )
    args = parser.parse_args(argv)
    return guard(_run_tui, args)


def _run_tui(args: argparse.Namespace) -> int:
    home = _home(args, create=not args.readonly)  # watch-only: writes nothing, not even an empty home
    if not args.serve and (args.host is not None or args.port is not None or args.allow_control):
        raise CliError("--host, --port and --allow-control go with --serve")
    if args.demo_stay and not args.demo:
        raise CliError("--demo-stay goes with --demo")
    if args.readonly and args.demo:
        raise CliError("--demo starts a training run; a --readonly session starts nothing (leave one out)")
    if args.serve and importlib.util.find_spec("textual_serve") is None:
        raise CliError("--serve needs textual-serve: pip install 'carl-tui[serve]'")
    if args.experiment is not None:
        _check_experiment(home, args.experiment)
    follow_run = None
    if args.demo:
        from engine.demo.start import start_demo

        # The control room starts the engine itself after its first frame, which shows the demo on its way
        # from the first second; only a session that starts no engine waits for one here.
        follow_run = start_demo(
            home, args.demo_steps, args.backend, stay=args.demo_stay, engine=args.no_engine or args.serve
        )
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
        follow_run=follow_run,
    )
    app.run()
    _say_engine_left_running(home, app.engine.started_pid)
    return app.return_code or 0  # an app that died of an error says so (Textual sets 1)


def _say_engine_left_running(home: Path, pid: int | None) -> None:
    """Back at the shell: if this control room started the engine and it is still up, say so in the
    line the user sees next (the app's own notice went with its screen)."""
    if pid is None:
        return
    from engine.control import engine_status, started_line

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
