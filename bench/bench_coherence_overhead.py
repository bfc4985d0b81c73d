"""Coherence-reward overhead on a GRPO step: goal <= 10% more step time than plain TRL GRPO.

Two real runs of the built-in tiny model with the demo config and the same seed, measured in
the same invocation:
- baseline: the task, format and concise rewards only (what plain TRL GRPO would compute);
- carl: the same plus the gated coherence and commitment rewards, with the gate made to open
  after 5 points so most steps pay the reward-time Phi forward.
Per-step wall time comes from TRL's own `step_time` metric in the store; the coherence rewards' Phi
is also reported on its own (`timing/phi_generate` when measured while sampling, `timing/phi_forward`
for the forward path; logged by the runner).

    python bench/bench_coherence_overhead.py      # about 1-2 minutes on 2 cores
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.store import StoreReader  # noqa: E402

STEPS = 120
DEMO = ROOT / "engine" / "training" / "demo.yaml"


def run(home: Path, name: str, rewards: list[dict], gate: dict) -> Path:
    config = yaml.safe_load(DEMO.read_text())
    config.update(name=name, max_steps=STEPS, sft_warmup_steps=30, rewards=rewards, save_steps=10_000)
    config["cascade"] = {**config.get("cascade", {}), **gate}
    path = home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run(
        [sys.executable, "-m", "engine.training", "--config", str(path), "--home", str(home)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return home / "carl.db"


def step_times(db: Path, name: str, key: str) -> list[float]:
    reader = StoreReader(db)
    run = next(r for r in reader.runs() if r.name == name)
    rows = reader.conn.execute(
        "SELECT value FROM metrics WHERE run_id=? AND key=? AND value IS NOT NULL ORDER BY step",
        (run.id, key),
    ).fetchall()
    reader.close()
    return [r[0] for r in rows]


def main() -> None:
    plain = [
        {"name": "task", "weight": 1.0},
        {"name": "format", "weight": 0.5},
        {"name": "concise", "weight": 0.25},
    ]
    carl = plain + [{"name": "coherence", "weight": 0.25}, {"name": "commitment", "weight": 0.25}]
    early_gate = {"min_points": 5, "window": 5, "min_above": 3}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        db = run(home, "baseline", plain, early_gate)
        run(home, "carl", carl, early_gate)
        # Skip the first GRPO steps (warm-up of the allocator and, for carl, the closed gate).
        base = step_times(db, "baseline", "step_time")[40:]
        ours = step_times(db, "carl", "step_time")[40:]
        phi = (
            step_times(db, "carl", "timing/phi_generate")[40:]
            or step_times(db, "carl", "timing/phi_forward")[40:]
        )
    base_s, ours_s = statistics.median(base), statistics.median(ours)
    overhead = ours_s / base_s - 1
    phi_share = statistics.median(phi) / ours_s if phi else float("nan")
    print(
        f"grpo_step_s_plain={base_s:.4f} grpo_step_s_with_coherence={ours_s:.4f} ratio={ours_s / base_s:.3f} "
        f"overhead={overhead:+.1%} goal<=+10% {'OK' if overhead <= 0.10 else 'MISSED'}"
    )
    print(
        f"phi_median_s={statistics.median(phi) if phi else float('nan'):.4f} "
        f"share_of_step={phi_share:.1%} steps_measured={len(ours)}"
    )


if __name__ == "__main__":
    main()
