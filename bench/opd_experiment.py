"""Does on-policy distillation from the manager's hints help the plane's workers? Arms x seeds, measured.

Three arms on the demo's tool-calling tasks, each a real headless plane (engine.agents.carl_agents.headless: a
nats-server, the audit, the manager, one model worker and the trainer processes), every arm with the same
tasks and seeds:
- rl: GRPO from the rollouts' rewards (the manager still hints, and its hints are judged, but nothing trains
  on them: the baseline of "hints help", which a poor attempt's regression to the mean inflates);
- rl_opd: the same, plus OPD from the hints (agents.train.opd);
- rl_opd_manager: the same, with the manager's own model writing the hints and trained on their judged help.

The workers serve a warmed-up tiny model (an SFT run on the demo's weaker teacher, made here once unless
--model names one): it answers in the right shape and often with the wrong tool, so the verifier fails it
often enough for hints and passes it often enough for GRPO. Per run: the verifier's mean score over the first
and the last quarter of the tasks (in the order assigned), the answer's length in tokens over the last
quarter, the teacher/student KL (opd/kl), the manager's agreement and hint help, and the trainer's seconds
per rollout with the teacher's forward and without it (timing/teacher_s taken out of the same steps). Over
seeds: the mean with its 95% t interval, and each arm against rl paired by seed (engine.experiments.stats).

    python bench/opd_experiment.py --seeds 5 --tasks 384 --learning-rate 2e-3 --out /tmp/opd.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.agents.carl_agents import headless  # noqa: E402
from engine.agents.plane_settings import AgentsSettings, TrainerSettings  # noqa: E402
from engine.agents.tasks import demo_tasks  # noqa: E402
from engine.experiments.stats import mean_ci, paired_delta  # noqa: E402
from engine.store import StoreReader  # noqa: E402

ARMS = ("rl", "rl_opd", "rl_opd_manager")


def warm_model(home: Path, steps: int) -> Path:
    """The SFT warm-up of the tiny model on the demo's teacher answers, trained once in `home`."""
    made = sorted((home / "runs").glob("*warm/final/config.json"))
    if made:
        return made[-1].parent
    command = [sys.executable, "-m", "engine.cli", "train", "--home", str(home), "--method", "sft"]
    command += ["--dataset", "demo", "--max-steps", str(steps), "--name", "warm", "--backend", "torch"]
    subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return sorted((home / "runs").glob("*warm/final/config.json"))[-1].parent


def settings_of(arm: str, seed: int, model: Path, learning_rate: float) -> AgentsSettings:
    train = TrainerSettings(
        enabled=True,
        group_size=4,
        groups_per_update=2,
        publish_every=1,
        learning_rate=learning_rate,
        opd=arm != "rl",
    )
    return AgentsSettings(
        workers=1,
        worker_kind="model",
        model=str(model),
        max_new_tokens=24,
        concurrency=8,
        ack_wait_s=120,
        task_timeout_s=600,
        seed=seed,
        system_prompt="",  # the warm-up trained without one: served as trained
        manager_model=str(model) if arm == "rl_opd_manager" else None,
        train=train,
    )


def one_run(root: Path, arm: str, seed: int, tasks: int, model: Path, learning_rate: float) -> dict[str, Any]:
    home = root / f"{arm}-s{seed}"
    done = home / "figures.json"
    if done.is_file():  # an interrupted experiment carries on where it stopped
        return dict(json.loads(done.read_text()))
    specs = demo_tasks(seed)[:tasks]
    started = time.perf_counter()
    summary = asyncio.run(headless(home, settings_of(arm, seed, model, learning_rate), specs, limit=tasks))
    figures = {"arm": arm, "seed": seed, "wall_s": time.perf_counter() - started, **read_figures(home)}
    figures["summary"] = {k: summary.get(k) for k in ("done", "failed", "hints", "hint_help")}
    done.write_text(json.dumps(figures))
    return figures


def read_figures(home: Path) -> dict[str, Any]:
    reader = StoreReader(home / "carl.db")
    try:
        rollouts = [json.loads(r["payload"]) for r in reader.agent_audit(kind="rollout", limit=None)]
        rollouts.sort(key=lambda r: r["created_at"])
        quarter = max(1, len(rollouts) // 4)
        scores = [r["verifier_score"] for r in rollouts]
        lengths = [len(r["response_token_ids"]) for r in rollouts[-quarter:]]
        run = next(r for r in reader.runs() if r.name == "agents-train")

        def series(key: str) -> list[float]:
            return [float(v) for v in reader.series(run.id, key, max_points=1_000_000).mean]

        step_s, teacher_s, samples = series("timing/step_s"), series("timing/teacher_s"), series("samples")
        kl = series("opd/kl")
        quality = reader.manager_quality(window=10_000)
    finally:
        reader.close()
    total = sum(samples) or 1.0
    return {
        "tasks": len(rollouts),
        "verifier_first": _mean(scores[:quarter]),
        "verifier_last": _mean(scores[-quarter:]),
        "answer_tokens": _mean(lengths),
        "opd_kl": _mean(kl),
        "agreement": quality.get("agreement", (None, 0))[0],
        "hint_help": quality.get("hint_help", (None, 0))[0],
        "hints_judged": quality.get("hint_help", (None, 0))[1],
        "steps": len(step_s),
        "s_per_rollout": sum(step_s) / total,
        "s_per_rollout_without_teacher": (sum(step_s) - sum(teacher_s)) / total,
    }


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def table(runs: list[dict[str, Any]], seeds: list[int]) -> str:
    by = {(r["arm"], r["seed"]): r for r in runs}

    def column(arm: str, key: str) -> list[float | None]:
        return [by.get((arm, s), {}).get(key) for s in seeds]

    def ci(figure: dict[str, Any], digits: int = 3) -> str:
        if figure["mean"] is None:
            return "–"
        if figure["ci95"] is None:
            return f"{figure['mean']:.{digits}f}"
        lo, hi = figure["ci95"]
        return f"{figure['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"

    lines = [
        "| arm | seeds | verifier, last quarter (95% CI) | Δ vs rl, paired (95% CI), p "
        "| verifier, first quarter | answer tokens | teacher/student KL | manager agreement | hint help "
        "| trainer s/rollout |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        if not any(v is not None for v in column(arm, "verifier_last")):
            continue
        delta = "–"
        if arm != "rl" and any(v is not None for v in column("rl", "verifier_last")):
            d = paired_delta(column(arm, "verifier_last"), column("rl", "verifier_last"))
            delta = ci(d) + (f", p = {d['p']:.2f}" if d["p"] is not None else "")
        seeded = sum(v is not None for v in column(arm, "verifier_last"))
        lines.append(
            f"| {arm} | {seeded} | {ci(mean_ci(column(arm, 'verifier_last')))} | "
            f"{delta} | {ci(mean_ci(column(arm, 'verifier_first')))} | "
            f"{ci(mean_ci(column(arm, 'answer_tokens')), 1)} | {ci(mean_ci(column(arm, 'opd_kl')))} | "
            f"{ci(mean_ci(column(arm, 'agreement')))} | {ci(mean_ci(column(arm, 'hint_help')))} | "
            f"{ci(mean_ci(column(arm, 's_per_rollout')))} |"
        )
    return "\n".join(lines)


def cost_line(runs: list[dict[str, Any]]) -> str:
    opd_runs = [r for r in runs if r["arm"] == "rl_opd"]
    if not opd_runs:
        return ""
    run = opd_runs[0]
    with_teacher, without = run["s_per_rollout"], run["s_per_rollout_without_teacher"]
    return (
        f"Cost, measured in one run (rl_opd, seed {run['seed']}, {run['steps']} steps): the trainer took "
        f"{with_teacher * 1000:.1f} ms a rollout with the teacher's forward and {without * 1000:.1f} ms "
        f"without it ({with_teacher / without:.2f}×)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=96, help="tasks per run (groups of 4)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/carl-opd-experiment"))
    parser.add_argument("--model", type=Path, default=None, help="the workers' model (default: warmed here)")
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument(
        "--learning-rate", type=float, default=5e-4, help="the LoRA adapters' (the plane's default)"
    )
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=None, help="write the table (markdown) here")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    model = args.model or warm_model(args.root / "warm-home", args.warmup_steps)
    seeds = list(range(args.seeds))
    runs = []
    for seed in seeds:
        for arm in args.arms.split(","):
            figures = one_run(args.root, arm, seed, args.tasks, model, args.learning_rate)
            print(json.dumps({k: v for k, v in figures.items() if k != "summary"}), flush=True)
            runs.append(figures)
    text = table(runs, seeds) + "\n\n" + cost_line(runs) + "\n"
    print(text)
    if args.out is not None:  # the table, and every run's figures beside it
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
