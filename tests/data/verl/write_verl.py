"""Writes what veRL 0.9.1 writes for a run logged with `Tracking(project, experiment,
default_backend=["file", "tensorboard"])` and a rollout dump (`trainer.rollout_data_dir`), with veRL's own
code: `verl/utils/tracking.py` loaded from the installed package (its FileLogger and _TensorboardAdapter,
which uses torch's SummaryWriter), and `RayPPOTrainer._write_generations` (verl/trainer/ppo/ray_trainer.py)
taken from the installed file's source. `import verl` itself is not run: it pulls in ray, which the writers do
not need.

Run in a venv with `pip install torch==2.13.0 tensorboard orjson packaging` and `pip install verl==0.9.1
--no-deps`, from the folder the run starts in (veRL writes relative to it):
    python write_verl.py OUTPUT_DIR [--steps N] [--slow SECONDS]
It writes OUTPUT_DIR/my_project/grpo_run.jsonl, OUTPUT_DIR/tensorboard_log/my_project/grpo_run/ and
OUTPUT_DIR/rollouts/<step>.jsonl; tests/data/verl/ holds what it wrote (3 steps).
"""

import ast
import importlib.util
import json
import os
import site
import sys
import time

KEYS = (  # keys veRL logs each step (verl/trainer/ppo/metric_utils.py, dp_actor.py)
    "actor/entropy",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "critic/score/mean",
    "critic/rewards/mean",
    "response_length/mean",
    "timing_s/gen",
    "timing_s/step",
)


def verl_file(relative: str) -> str:
    for folder in site.getsitepackages():
        path = os.path.join(folder, "verl", relative)
        if os.path.exists(path):
            return path
    raise SystemExit(f"verl is not installed here ({relative})")


def load_tracking():
    spec = importlib.util.spec_from_file_location("verl_tracking", verl_file("utils/tracking.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_write_generations():
    with open(verl_file("trainer/ppo/ray_trainer.py")) as f:
        tree = ast.parse(f.read())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_write_generations")
    fn.decorator_list = []  # a staticmethod of RayPPOTrainer
    namespace = {"os": os, "json": json}
    exec(compile(ast.Module([fn], []), "ray_trainer.py", "exec"), namespace)
    return namespace["_write_generations"]


def main() -> None:
    os.chdir(sys.argv[1])
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
    slow = float(sys.argv[sys.argv.index("--slow") + 1]) if "--slow" in sys.argv else 0.0
    tracking = load_tracking().Tracking("my_project", "grpo_run", default_backend=["file", "tensorboard"])
    write_generations = load_write_generations()
    for step in range(1, steps + 1):
        data = {key: 0.25 + i / 1000 + step / 10 for i, key in enumerate(KEYS)}
        tracking.log(data, step)
        inputs, outputs = ["2+2=", "2+2=", "3*3=", "3*3="], ["4", "5", "9", "6"]
        scores = [1.0, 0.0, 1.0, 0.0]
        extras = {"acc": [1.0, 0.0, 1.0, 0.0], "pred": outputs}
        write_generations(inputs, outputs, ["4", "4", "9", "9"], scores, extras, "rollouts", step)
        time.sleep(slow)
    tracking.finish()


if __name__ == "__main__":
    main()
