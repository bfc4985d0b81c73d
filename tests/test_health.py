"""A run's health: each rule on constructed signals, the RL rules read from the start of RL in a real store,
and the demo's own run ending green (a real short run of the demo's config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.coherence.analysis import analyze_run, rl_start
from engine.coherence.health import (
    CAUSES,
    CLIP_RED,
    CLIP_SPIKE,
    ENTROPY_COLLAPSE_MIN_DROP,
    HACKING_MIN_RISE,
    KL_RED,
    KL_YELLOW,
    RunSignals,
    assess_health,
)
from engine.store import Store

ROOT = Path(__file__).resolve().parent.parent


def signals(**overrides: object) -> RunSignals:
    empty = np.array([])
    base: dict = {
        "status": "finished",
        "last_update": None,
        "phi": empty,
        "loss": empty,
        "loss_steps": empty,
        "reward": empty,
        "entropy": empty,
        "zero_std": empty,
    }
    return RunSignals(**{**base, **overrides})


def test_health_flags() -> None:
    assert assess_health(signals()).level == "green"
    assert assess_health(signals()).reasons == ["training dynamics healthy"]
    crashed = assess_health(signals(status="running", last_update=1000.0), now=1700.0)
    assert crashed.level == "red" and "presumed crashed" in crashed.reasons[0]
    assert crashed.red() == {"crashed": crashed.reasons[0]}
    assert assess_health(signals(status="running", last_update=1000.0), now=1200.0).level == "yellow"
    bad = assess_health(signals(loss=np.array([1.0, np.nan]), loss_steps=np.array([10, 20])))
    assert bad.level == "red" and bad.reasons == ["loss is not finite at step 20"]
    assert assess_health(signals(zero_std=np.full(10, 0.95))).level == "red"
    assert assess_health(signals(zero_std=np.full(10, 0.6))).level == "yellow"
    assert "starvation" in assess_health(signals(reward=np.zeros(10))).reasons[0]
    collapse = assess_health(signals(entropy=np.r_[np.full(10, 2.0), np.full(10, 0.5)]))
    assert collapse.level == "yellow" and "entropy collapsed" in collapse.reasons[0]
    flat_reward = 0.5 + np.random.default_rng(0).normal(0, 0.01, 40)
    trap = assess_health(signals(reward=flat_reward, phase="crystallizing"))
    assert trap.level == "yellow" and "coherence trap" in trap.reasons[0]
    rising = assess_health(signals(reward=np.linspace(0.1, 0.9, 40), phase="crystallizing"))
    assert rising.level == "green"


def test_every_flag_names_a_known_cause() -> None:
    health = assess_health(
        signals(
            status="running",
            last_update=1.0,
            loss=np.array([np.nan]),
            loss_steps=np.array([3]),
            zero_std=np.full(10, 0.95),
            clip=np.full(10, 0.9),
            kl=np.full(10, 9.0),
        ),
        now=10_000.0,
    )
    assert {f.cause for f in health.flags} == {"crashed", "loss", "zero_std", "clip", "kl"} <= set(CAUSES)
    assert [f.reason for f in health.flags] == health.reasons and health.level == "red"


def test_a_halving_of_an_already_certain_policy_is_not_a_collapse() -> None:
    # The demo's own RL phase: 0.06 nats per token at the start, 0.024 at the end (measured).
    rng = np.random.default_rng(0)
    demo = np.r_[np.full(40, 0.06), np.full(360, 0.024)] + rng.normal(0, 0.005, 400)
    assert ENTROPY_COLLAPSE_MIN_DROP > 0.06 - 0.024
    assert assess_health(signals(entropy=demo)).level == "green"
    collapsed = assess_health(signals(entropy=np.r_[np.full(40, 0.6), np.full(360, 0.1)], rl_start=601))
    assert collapsed.reasons == ["entropy collapsed from 0.6 to 0.1 nats since RL began at step 601"]


def test_clip_fraction_spikes_and_sustained_clipping() -> None:
    steps = np.arange(101, 141)
    calm = np.full(40, 0.01)
    assert assess_health(signals(clip=calm, clip_steps=steps)).level == "green"
    spike = calm.copy()
    spike[-3] = CLIP_SPIKE + 0.1
    spiked = assess_health(signals(clip=spike, clip_steps=steps))
    assert spiked.level == "yellow" and spiked.reasons == ["clip fraction spiked to 30% at step 138"]
    sustained = assess_health(signals(clip=np.full(40, CLIP_RED + 0.1), clip_steps=steps))
    assert sustained.level == "red" and sustained.red() == {"clip": "clip fraction 60% over the last 5 steps"}
    old_spike = np.r_[np.full(5, 0.9), np.full(95, 0.01)]  # long past the trailing window
    assert assess_health(signals(clip=old_spike, clip_steps=np.arange(100))).level == "green"


def test_kl_blow_up() -> None:
    steps = np.arange(1, 61)
    assert assess_health(signals(kl=np.linspace(0.0, 0.3, 60), kl_steps=steps)).level == "green"
    drifting = assess_health(signals(kl=np.full(60, KL_YELLOW * 1.5), kl_steps=steps))
    assert drifting.level == "yellow" and "1.5 nats per token" in drifting.reasons[0]
    blown = assess_health(signals(kl=np.r_[np.full(50, 0.1), np.full(10, KL_RED * 2)], kl_steps=steps))
    assert blown.level == "red" and blown.reasons == ["KL blow-up: 10 nats per token to the reference"]
    nan = assess_health(signals(kl=np.r_[np.full(59, 0.1), np.nan], kl_steps=steps))
    assert nan.red() == {"kl": "KL to the reference is not finite at step 60"}


def rising_task(n: int = 200, start: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return np.arange(start, start + n), np.linspace(0.3, 0.8, n) + rng.normal(0, 0.02, n)


def test_reward_rising_while_the_held_out_eval_stays_flat() -> None:
    steps, task = rising_task()
    flat = [(50, 0.41), (120, 0.43), (200, 0.42)]
    hacked = assess_health(signals(task=task, task_steps=steps, evals=flat))
    assert hacked.level == "yellow" and [f.cause for f in hacked.flags] == ["hacking_eval"]
    assert hacked.reasons[0].startswith("possible reward hacking: the task reward rose +0.3")
    assert "from step 50 to 200 while the held-out eval moved +0.01" in hacked.reasons[0]
    followed = [(50, 0.40), (200, 0.62)]
    assert assess_health(signals(task=task, task_steps=steps, evals=followed)).level == "green"
    one = [(200, 0.42)]  # one eval has no "stays flat"
    assert assess_health(signals(task=task, task_steps=steps, evals=one)).level == "green"
    flat_task = np.full(200, 0.5)
    assert assess_health(signals(task=flat_task, task_steps=steps, evals=flat)).level == "green"


def test_reward_rising_while_the_verifier_stays_flat() -> None:
    steps, reward = rising_task(120)
    rng = np.random.default_rng(4)
    verifier = 0.5 + rng.normal(0, 0.02, 120)
    common = {"reward": reward, "reward_steps": steps, "verifier_steps": steps}
    hacked = assess_health(signals(**common, verifier=verifier))
    assert [f.cause for f in hacked.flags] == ["hacking_verifier"] and hacked.level == "yellow"
    assert "while the verifier moved" in hacked.reasons[0]
    honest = assess_health(signals(**common, verifier=reward - 0.1))
    assert honest.level == "green"
    assert HACKING_MIN_RISE <= 0.5  # the rise above (0.3 -> 0.8) is well past the threshold


# -- from the store: the RL rules start where RL starts -------------------------------------------------


def carl_run(
    store: Store, name: str, *, warmup: int, steps: int, entropy: object, status: str = "finished"
) -> int:
    """A carl GRPO run with an SFT warm-up: entropy every step, rewards from the first GRPO step."""
    config = {"method": "grpo", "sft_warmup_steps": warmup, "num_generations": 8}
    run_id = store.create_run(
        name, source_kind="carl", status=status, config=config, max_steps=warmup + steps
    )
    rng = np.random.default_rng(0)
    now = time.time()
    rows = []
    last = 0
    for s in range(1, warmup + steps + 1):
        if s > warmup + steps:
            break
        rows.append((s, "entropy", float(entropy(s)), now))  # type: ignore[operator]
        rows.append((s, "loss", 0.5, now))
        if s > warmup:
            rows.append((s, "reward", float(0.5 + 0.3 * (s - warmup) / steps + rng.normal(0, 0.02)), now))
            rows.append((s, "frac_reward_zero_std", 0.05, now))
        last = s
    store.add_metrics(run_id, rows)
    store.update_run(run_id, last_step=last, last_update=now)
    return run_id


def health_of(store: Store, run_id: int) -> tuple[str, list[str]]:
    with store.transaction():
        analyze_run(store, run_id)
    row = store.run(run_id)
    assert row is not None
    return row["health"], json.loads(row["health_reasons"])


def test_the_warm_ups_entropy_drop_is_not_judged(store: Store) -> None:
    # SFT takes the entropy from 6 nats to 0.06; RL then holds it.
    warm = carl_run(store, "warm", warmup=100, steps=100, entropy=lambda s: max(0.06, 6.0 - 0.06 * s))
    assert rl_start(store, warm) == 101
    assert health_of(store, warm) == ("green", ["training dynamics healthy"])
    # The same warm-up, then a real collapse during RL.
    collapsing = carl_run(
        store,
        "collapsing",
        warmup=100,
        steps=100,
        entropy=lambda s: 6.0 - 0.05 * s if s <= 100 else 1.0 / (s - 99),
    )
    level, reasons = health_of(store, collapsing)
    assert (
        level == "yellow" and reasons[0].startswith("entropy collapsed from 0.") and "step 101" in reasons[0]
    )


def test_a_run_still_in_its_warm_up_has_not_reached_rl(store: Store) -> None:
    config = {"method": "grpo", "sft_warmup_steps": 600}
    run_id = store.create_run("early", source_kind="carl", status="running", config=config, max_steps=1000)
    now = time.time()
    store.add_metrics(run_id, [(s, "entropy", 6.0 - 0.05 * s, now) for s in range(1, 101)])
    store.update_run(run_id, last_step=100, last_update=now)
    assert rl_start(store, run_id) == 601
    assert health_of(store, run_id) == ("green", ["training dynamics healthy"])
    sft = store.create_run("sft", source_kind="carl", status="finished", config={"method": "sft"})
    store.add_metrics(sft, [(s, "entropy", 6.0 - 0.05 * s, now) for s in range(1, 101)])
    assert rl_start(store, sft) is None and health_of(store, sft)[0] == "green"


def test_an_observed_runs_kl_clip_and_evals_are_read_from_the_store(store: Store) -> None:
    run_id = store.create_run("observed", source_kind="jsonl", status="finished")
    now = time.time()
    rows = []
    for s in range(1, 201):
        rows += [(s, "reward", 0.3 + 0.5 * s / 200, now), (s, "rewards/task/mean", 0.3 + 0.5 * s / 200, now)]
        rows += [
            (s, "clip_ratio/low_mean", 0.01, now),
            (s, "clip_ratio/high_mean", 0.6 if s > 180 else 0.01, now),
        ]
        rows.append((s, "kl", 0.05, now))
    store.add_metrics(run_id, rows)
    store.update_run(run_id, last_step=200, last_update=now)
    store.add_eval(run_id, False, {"step": 60, "task": 0.4}, [])
    store.add_eval(run_id, False, {"step": 200, "task": 0.41}, [])
    level, reasons = health_of(store, run_id)
    assert level == "red"
    assert reasons[0] == "clip fraction 61% over the last 20 steps"  # low + high: no region key here
    assert reasons[1].startswith("possible reward hacking: the task reward rose +0.")


# -- the demo ends green ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)  # minutes of training: far from its limit on a busy machine
def test_the_demo_run_ends_green(tmp_path: Path) -> None:
    """The demo's config, warm-up and all, with a quarter of its GRPO steps, as the engine starts it."""
    home = tmp_path / "home"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    demo = ROOT / "engine" / "training" / "demo.yaml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.cli",
            "--home",
            str(home),
            "train",
            "--config",
            str(demo),
            "--max-steps",
            "100",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with Store(home / "carl.db") as store:
        run_id = store.run_id_by_name("demo")
        assert run_id is not None
        assert rl_start(store, run_id) == 601
        level, reasons = health_of(store, run_id)
        assert (level, reasons) == ("green", ["training dynamics healthy"])
        # The warm-up took the entropy from ~ln(512) to a few hundredths of a nat: judged across it, the
        # run would be "collapsed"; judged over RL, it is not.
        entropy = dict(
            store.conn.execute("SELECT step, value FROM metrics WHERE run_id=? AND key='entropy'", (run_id,))
        )
        assert entropy[1] > 5.0 and entropy[700] < 0.5
