"""`python -m engine.daemon run|start|stop|status [--home H]`: what start_engine spawns."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.control import engine_status, start_engine, stop_engine

from .loop import run_engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.daemon", description="the carl engine daemon")
    parser.add_argument("action", choices=["run", "start", "stop", "status"])
    parser.add_argument("--home", type=Path, default=None, help="$CARL_HOME to serve (default: $CARL_HOME)")
    args = parser.parse_args(argv)
    if args.action == "run":
        return run_engine(args.home)
    if args.action == "start":
        status, started = start_engine(args.home)
        print(f"engine {status.state} (pid {status.pid}{', started now' if started else ''})")
        return 0 if status.state == "up" else 1
    if args.action == "stop":
        print("engine stopped" if stop_engine(args.home) else "engine was not running")
        return 0
    status = engine_status(args.home)
    print(f"engine {status.state} (pid {status.pid}); log: {status.log_path}")
    return 0 if status.state == "up" else 3


if __name__ == "__main__":
    sys.exit(main())
