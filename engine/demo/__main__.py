"""`python -m engine.demo OUT_DIR [--max-steps N]`: run the observed demo as its own process."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

from .trl_run import run_observed_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.demo", description=__doc__)
    parser.add_argument("out_dir", type=Path, help="run directory: trackio/, sft/ and grpo/ go here")
    parser.add_argument("--max-steps", type=int, default=120, help="GRPO steps (default 120)")
    parser.add_argument("--warmup-sft-steps", type=int, default=30, help="SFT warm-up steps; 0 skips it")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="tiny model directory (built if missing)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # Library deprecation notices (transformers 5 renames) are noise in a demo's log.
    warnings.filterwarnings("ignore", category=FutureWarning)
    out_dir = run_observed_demo(
        args.out_dir,
        max_steps=args.max_steps,
        model_dir=args.model_dir,
        seed=args.seed,
        warmup_sft_steps=args.warmup_sft_steps,
    )
    print(f"[carl-demo] done: {out_dir}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
