"""`carl demo [--steps N] [--backend B] [--stay]`: have the engine start the built-in demo run."""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.limits import int_flag

from .start import start_demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int_flag(1), default=None)
    parser.add_argument("--backend", choices=("auto", "torch", "mlx"), default=None, help="default: auto")
    parser.add_argument(
        "--stay", action="store_true", help="keep the demo's agents plane up after the demo run ends"
    )


def run(args: argparse.Namespace, home: Path) -> int:
    start_demo(home, args.steps, args.backend, stay=args.stay)
    return 0
