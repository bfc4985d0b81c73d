"""How long `carl eval` of a tiny-model run takes, the whole process: answered through transformers (as before
engine/models/tiny_numpy.py) against answered in numpy (now), side by side in one invocation.

Each figure is a fresh process, as a user's `carl eval RUN` is: interpreter start, imports, loading the model,
greedy answers to the held-out prompts, Phi, scoring. The two paths alternate, `--repeat` times each, and
the medians are printed with their ratio; then the real command, `carl eval RUN`, once. Without `--home`, a
short run of the demo task is trained first in a temporary home (about a minute on 2 cores).

    python bench/bench_eval.py
    python bench/bench_eval.py --home ~/.carl --run demo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
# One eval's work without storing it, through the named path (what `carl eval` ran before, and runs now).
PROBE = """
import sys, time
from pathlib import Path
from engine.store import Store
import engine.training.evaluate as ev
home, name, path_name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with Store(home / "carl.db") as store:
    run = ev.find_carl_run(store, name)
config = ev.run_config(run)
held = ev.held_out_prompts(config)[: config.eval.max_prompts]
answer = ev._answer if path_name == "transformers" else ev._answer_numpy
started = time.perf_counter()
metrics = ev._score(config, held, *answer(config, ev.model_dir(run), held, home))[0]
print(round(time.perf_counter() - started, 3), metrics["task"], metrics["phi"], "torch" in sys.modules)
"""


def train_short_run(home: Path) -> str:
    config = home / "carl.yaml"
    config.write_text(
        json.dumps(
            {
                "name": "ev",
                "max_steps": 8,
                "sft_warmup_steps": 60,
                "rewards": [{"name": "task"}, {"name": "format", "weight": 0.5}],
                "eval": {"holdout": 0.1, "at_end": False},
            }
        )
    )
    argv = [sys.executable, "-m", "engine.cli", "--home", str(home), "train", "--config", str(config)]
    subprocess.run(argv, cwd=ROOT, env=ENV, check=True, capture_output=True, timeout=900)
    return "ev"


def timed(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr)
    return wall, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--run", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="carl-bench-eval-"))
    name = args.run or train_short_run(home)
    print(
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; run {name!r} in {home}", flush=True
    )
    walls: dict[str, list[float]] = {"transformers": [], "numpy": []}
    for _ in range(args.repeat):
        for path_name in walls:
            wall, said = timed([sys.executable, "-c", PROBE, str(home), name, path_name])
            answer_s, task, phi, torch_loaded = said.split()
            walls[path_name].append(wall)
            print(
                f"  {path_name:<12} process {wall:6.2f} s (answering {float(answer_s):.2f} s; task {task}, "
                f"Φ {phi}; torch imported: {torch_loaded})",
                flush=True,
            )
    before, after = (statistics.median(walls[k]) for k in ("transformers", "numpy"))
    print(f"median: transformers {before:.2f} s, numpy {after:.2f} s: {before / after:.1f}x faster")
    wall, _ = timed([sys.executable, "-m", "engine.cli", "--home", str(home), "eval", name, "--json"])
    print(f"carl eval {name}: {wall:.2f} s (the whole command, storing the eval)")


if __name__ == "__main__":
    main()
