"""Writes a TensorBoard run with tensorboardX's own SummaryWriter: per-step scalars with `add_scalar`, and the
parts of a reward with `add_scalars("reward_parts", {"format": ..., "accuracy": ...})`, which tensorboardX
writes as sub-runs, one folder per part (`<logdir>/reward_parts_format/`, `<logdir>/reward_parts_accuracy/`,
each holding the tag `reward_parts`: tensorboardX/writer.py `add_scalars`).

Run with tensorboardX 2.6.5 installed (a venv of its own: `pip install tensorboardX==2.6.5`):
    python write_tbx.py LOGDIR [--steps N] [--slow SECONDS]
tests/data/tensorboardx/ holds what it wrote into `run/` (3 steps).
"""

import sys
import time

import tensorboardX
from tensorboardX import SummaryWriter


def main() -> None:
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
    slow = float(sys.argv[sys.argv.index("--slow") + 1]) if "--slow" in sys.argv else 0.0
    writer = SummaryWriter(sys.argv[1], flush_secs=1)
    for step in range(1, steps + 1):
        writer.add_scalar("train/reward", 0.5 + step / 10, step)
        writer.add_scalar("train/entropy", 2.0 - step / 10, step)
        writer.add_scalar("train/loss", 1.0 / step, step)
        writer.add_scalars("reward_parts", {"format": 1.0, "accuracy": step / 4}, step)
        writer.flush()
        time.sleep(slow)
    writer.close()
    print(f"tensorboardX {tensorboardX.__version__}: {sys.argv[1]}")


if __name__ == "__main__":
    main()
