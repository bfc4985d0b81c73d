"""Health's async-RL and throughput rules (engine/coherence/health.py): the sampler/learner mismatch rising,
staleness past the run's configured bound, the truncated share rising, a sudden throughput drop.

Each on constructed series, then on series stored in a real store (a trainer's log with no reward is judged
too), and the done-when through real files: a veRL file-logger log whose `rollout_corr/*` KL rises turns the
run yellow with the reason, followed batch by batch and imported with `carl observe`; and a veRL run in an
MLflow store whose params hold its bound.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from test_observe_frameworks import VERL
from test_observe_jsonl_frameworks import VerlFileLogger

from engine.cli import main as carl_main
from engine.coherence.analysis import analyze_run, analyze_runs
from engine.coherence.health import (
    CAUSES,
    MISMATCH_ABS_DIFF_FLOOR,
    MISMATCH_KL_FLOOR,
    MISMATCH_KL_RED,
    MISMATCH_KL_YELLOW,
    THROUGHPUT_BASELINE,
    THROUGHPUT_DROP,
    TRUNCATION_YELLOW,
    RunSignals,
    assess_health,
)
from engine.coherence.staleness import Bound
from engine.observe import ingest_source, observe, register_source
from engine.store import Store

RNG = np.random.default_rng(0)


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


def judged(**overrides: object) -> tuple[str, list[str], set[str]]:
    health = assess_health(signals(**overrides))
    return health.level, health.reasons, {flag.cause for flag in health.flags}


def noisy(level: float, n: int, spread: float = 0.1) -> np.ndarray:
    return level * (1 + spread * RNG.standard_normal(n))


# -- each rule on constructed series ----------------------------------------------------------------------


def test_mismatch_kl_rising_level_and_blow_up() -> None:
    steps = np.arange(1, 101)
    kernel_noise = noisy(5e-4, 100)  # a synchronous bf16 run: vLLM against FSDP, same weights
    assert judged(mismatch=kernel_noise, mismatch_steps=steps)[0] == "green"
    rising = np.r_[noisy(5e-4, 60), np.linspace(5e-4, 6e-3, 40)]
    level, reasons, causes = judged(mismatch=rising, mismatch_steps=steps)
    assert (level, causes) == ("yellow", {"mismatch"})
    pattern = r"sampler/learner mismatch KL rising: 0\.000\d+ nats per token at steps 1–10, 0\.00\d+ at steps"
    pattern += " 91–100"
    assert re.fullmatch(pattern, reasons[0]), reasons
    # a rise that stays under the floor is kernel noise, however many times larger
    tiny = np.r_[noisy(1e-5, 60), np.linspace(1e-5, 5e-4, 40)]
    assert MISMATCH_KL_FLOOR > 5e-4 and judged(mismatch=tiny, mismatch_steps=steps)[0] == "green"
    flat_high = noisy(MISMATCH_KL_YELLOW * 2, 100, 0.02)
    level, reasons, _ = judged(mismatch=flat_high, mismatch_steps=steps)
    assert level == "yellow" and reasons == ["sampler/learner mismatch KL at 0.02 nats per token"]
    blown = np.r_[noisy(1e-3, 90), np.full(10, MISMATCH_KL_RED * 3)]
    level, reasons, _ = judged(mismatch=blown, mismatch_steps=steps)
    assert level == "red" and reasons == ["sampler/learner mismatch KL 0.3 nats per token: far off-policy"]
    nan = np.r_[noisy(1e-3, 99), np.nan]
    assert judged(mismatch=nan, mismatch_steps=steps)[1] == [
        "sampler/learner mismatch KL is not finite at step 100"
    ]
    # k1 estimates wander around 0, below it too: no rise in that
    k1 = 2e-4 * RNG.standard_normal(100)
    assert judged(mismatch=k1, mismatch_steps=steps)[0] == "green"


def test_mismatch_as_an_absolute_log_prob_difference_is_judged_on_its_rise() -> None:
    steps = np.arange(1, 81)
    key = "mismatch/logprob_abs_diff/mean"
    rising = np.r_[noisy(0.02, 40), np.linspace(0.02, 0.12, 40)]
    level, reasons, _ = judged(mismatch=rising, mismatch_steps=steps, mismatch_key=key)
    assert level == "yellow" and reasons[0].startswith("sampler/learner mismatch |Δ log p| rising: 0.0")
    below = np.r_[noisy(0.005, 40), np.linspace(0.005, MISMATCH_ABS_DIFF_FLOOR * 0.8, 40)]
    assert judged(mismatch=below, mismatch_steps=steps, mismatch_key=key)[0] == "green"
    high_flat = noisy(0.5, 80, 0.02)  # no level of it is judged: its link to a KL is only approximate
    assert judged(mismatch=high_flat, mismatch_steps=steps, mismatch_key=key)[0] == "green"


def test_staleness_past_the_runs_bound() -> None:
    steps = np.arange(1, 41)
    bound = Bound("max_staleness_steps", 4)
    within = {
        "staleness_max": np.full(40, 4.0),
        "staleness_max_steps": steps,
        "staleness_mean": np.full(40, 2.0),
    }
    assert judged(**within, staleness_bound=bound)[0] == "green"
    assert judged(**{**within, "staleness_max": np.full(40, 9.0)})[0] == "green"  # no bound known: not judged
    spiked = np.full(40, 3.0)
    spiked[-2] = 7
    level, reasons, causes = judged(**{**within, "staleness_max": spiked}, staleness_bound=bound)
    assert (level, causes) == ("yellow", {"staleness"})
    assert reasons == [
        "samples 7 policy versions stale at step 39, past the run's bound of 4 (max_staleness_steps)"
    ]
    typical = {**within, "staleness_max": np.full(40, 8.0), "staleness_mean": np.full(40, 5.5)}
    level, reasons, _ = judged(**typical, staleness_bound=bound)
    assert level == "red" and reasons == [
        "samples 5.5 policy versions stale on average, past the run's bound of 4 (max_staleness_steps)"
    ]
    old_spike = np.r_[np.full(5, 9.0), np.full(95, 2.0)]  # long past the trailing window
    assert judged(staleness_max=old_spike, staleness_bound=bound)[0] == "green"
    # SkyRL counts the groups it trained past max_staleness_steps itself: no config needed
    violations = np.r_[np.zeros(35), [0, 2, 0, 1, 0]]
    level, reasons, _ = judged(staleness_violations=violations)
    assert level == "yellow" and reasons == ["3 samples trained past the staleness bound in the last 5 logs"]


def test_truncated_share_rising() -> None:
    steps = np.arange(101, 161)
    calm = 0.03 + 0.01 * RNG.random(60)
    assert judged(truncation=calm, truncation_steps=steps)[0] == "green"
    rising = np.r_[calm[:30], np.linspace(0.03, 0.35, 30)]
    level, reasons, causes = judged(truncation=rising, truncation_steps=steps)
    assert (level, causes) == ("yellow", {"truncation"})
    pattern = (
        r"truncated completions rising: [34]% hit the length limit at steps 101–106, 3\d% at steps 155–160"
    )
    assert re.fullmatch(pattern, reasons[0]), reasons
    flat_high = np.full(60, TRUNCATION_YELLOW + 0.1)
    assert judged(truncation=flat_high, truncation_steps=steps)[1] == [
        "60% of completions hit the length limit"
    ]


def test_a_sudden_throughput_drop() -> None:
    steps = np.arange(1, 61)
    steady = noisy(12_000, 60, 0.15)  # tokens vary with the completions' lengths
    assert judged(throughput=steady, throughput_steps=steps)[0] == "green"
    one_slow_log = steady.copy()
    one_slow_log[-2] = 2_000  # a checkpoint, an eval
    assert judged(throughput=one_slow_log, throughput_steps=steps)[0] == "green"
    dropped = np.r_[noisy(12_000, 57, 0.05), np.full(3, 12_000 * (1 - THROUGHPUT_DROP) * 0.6)]
    level, reasons, causes = judged(
        throughput=dropped, throughput_steps=steps, throughput_key="perf/tokens_per_s"
    )
    assert (level, causes) == ("yellow", {"throughput"})
    assert re.fullmatch(r"throughput fell 70%: 1[12],\d{3} → 3,600 tokens/s since step 58", reasons[0]), (
        reasons
    )
    per_gpu = judged(throughput=dropped, throughput_steps=steps, throughput_key="perf/tokens_per_s_per_gpu")
    assert "tokens/s per GPU since step 58" in per_gpu[1][0]
    slow_decline = np.linspace(12_000, 7_000, 60)  # over the run, not sudden
    assert judged(throughput=slow_decline, throughput_steps=steps)[0] == "green"
    assert THROUGHPUT_BASELINE >= 5 and judged(throughput=np.array([9e3, 9e3, 1e3, 1e3, 1e3]))[0] == "green"


def test_the_new_causes_are_known() -> None:
    assert {"mismatch", "staleness", "truncation", "throughput"} <= set(CAUSES)


# -- series stored in a real store -------------------------------------------------------------------------


def add_series(store: Store, run_id: int, series: dict[str, np.ndarray], first: int = 1) -> None:
    now = time.time()
    store.add_metrics(
        run_id,
        [(first + i, key, float(v), now) for key, values in series.items() for i, v in enumerate(values)],
    )


def test_stored_series_a_trainer_log_without_reward_is_judged_too(store: Store) -> None:
    """prime-rl's trainer writes no reward (its orchestrator does): the async rules still read its series."""
    run_id = store.create_run("prime-trainer", source_kind="jsonl", status="finished")
    add_series(store, run_id, {"mismatch/kl": np.r_[noisy(6e-4, 40), np.linspace(6e-4, 9e-3, 20)]})
    health = analyze_run(store, run_id)
    assert health is not None and health.level == "yellow"
    assert health.reasons[0].startswith("sampler/learner mismatch KL rising")
    assert json.loads(store.run(run_id)["health_reasons"]) == health.reasons


def test_stored_series_staleness_bound_from_the_config_truncation_and_throughput(store: Store) -> None:
    config = {"trainer": {"fully_async": {"enabled": True, "max_staleness_steps": 2}}}  # as W&B stores it
    run_id = store.create_run("skyrl-async", source_kind="wandb", status="finished", config=config)
    store.update_run(run_id, framework="skyrl")
    worst = np.full(60, 2.0)
    worst[-3] = 5
    add_series(
        store,
        run_id,
        {
            "reward": np.linspace(0.1, 0.6, 60),
            "staleness/max": worst,
            "staleness/mean": np.full(60, 1.0),
            "completions/clipped_ratio": np.r_[np.full(30, 0.02), np.linspace(0.02, 0.4, 30)],
            "perf/tokens_per_s_per_gpu": np.r_[noisy(3_000, 57, 0.05), np.full(3, 800.0)],
        },
    )
    health = analyze_run(store, run_id)
    assert health is not None and health.level == "yellow"
    assert {f.cause for f in health.flags} == {"staleness", "truncation", "throughput"}
    assert "past the run's bound of 2 (max_staleness_steps)" in health.reasons[0]


def test_the_slower_sampling_of_rl_after_an_sft_warm_up_is_no_throughput_drop(store: Store) -> None:
    """Our own runs' SFT warm-up runs far more tokens a second than GRPO, which samples: throughput is judged
    within RL once the run is there."""
    run_id = store.create_run("grpo", source_kind="carl", status="finished", config={"method": "grpo"})
    add_series(store, run_id, {"perf/tokens_per_s": noisy(20_000, 20, 0.05)})
    add_series(store, run_id, {"perf/tokens_per_s": noisy(3_000, 10, 0.05), "reward": np.full(10, 0.5)}, 21)
    health = analyze_run(store, run_id)
    assert health is not None and health.level == "green", health.reasons


# -- the done-when, through real files -----------------------------------------------------------------


def verl_step(step: int, k3: float) -> dict[str, float]:
    """veRL's metrics of a step (the key set of tests/test_observe_frameworks.py, at a calm run's values) and
    its rollout_corr/* and training/off_policy/* keys (verl-project/verl 1dda039b)."""
    data = dict.fromkeys(VERL, 0.5)
    data.update(
        {
            "actor/entropy": 1.0,
            "critic/score/mean": 0.3 + step / 500,
            "actor/pg_clipfrac": 0.01,
            "actor/ppo_kl": 1e-4,
            "actor/kl_loss": 0.001,
            "response_length/clip_ratio": 0.02,
            "rollout_corr/k3_kl": k3,
            "rollout_corr/kl": k3 * 1.1,
            "rollout_corr/chi2_token": 2 * k3,
            "training/off_policy/trajectory_staleness/mean": 0.8,
            "training/off_policy/trajectory_staleness/max": 1.0,
        }
    )
    return data


def rising_k3(steps: range) -> list[float]:
    """A vLLM-sampled run: kernel noise at 5e-4 for 60 steps, then a mismatch growing ten-fold."""
    rng = np.random.default_rng(1)
    return [5e-4 * (1 + 0.1 * rng.random()) * (1 + 9 * max(0, s - 60) / 40) for s in steps]


def test_a_followed_verl_run_turns_yellow_when_its_mismatch_rises(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "proj" / "fully_async.jsonl"
    path.parent.mkdir()
    logger = VerlFileLogger(path)
    k3 = rising_k3(range(1, 101))
    for step in range(1, 61):
        logger.log(verl_step(step, k3[step - 1]), step)
    source_id = register_source(store, path, follow=True)
    result = ingest_source(store, source_id)
    (run_id,) = result.run_ids
    assert analyze_runs(store, [run_id])[run_id].level == "green"  # the sampler agrees, to kernel noise
    for step in range(61, 101):  # the writer goes on; the engine reads the new lines
        logger.log(verl_step(step, k3[step - 1]), step)
    logger.finish()
    ingest_source(store, source_id)
    health = analyze_runs(store, [run_id])[run_id]
    assert health.level == "yellow" and [f.cause for f in health.flags] == ["mismatch"]
    assert health.reasons[0].startswith("sampler/learner mismatch KL rising: 0.000")
    row = store.run(run_id)
    assert row["health"] == "yellow" and json.loads(row["health_reasons"]) == health.reasons


def test_carl_observe_of_a_verl_log_stores_the_yellow_and_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "proj" / "exp.jsonl"
    path.parent.mkdir()
    logger = VerlFileLogger(path)
    for step, k3 in zip(range(1, 101), rising_k3(range(1, 101)), strict=True):
        logger.log(verl_step(step, k3), step)
    logger.finish()
    home = tmp_path / "home"
    assert carl_main(["--home", str(home), "observe", str(path)]) == 0
    with Store(home / "carl.db") as store:
        run = store.conn.execute("SELECT framework, health, health_reasons FROM runs").fetchone()
    assert run[:2] == ("verl", "yellow")
    assert json.loads(run[2])[0].startswith("sampler/learner mismatch KL rising")


def test_a_verl_run_in_mlflow_past_the_bound_its_params_hold(tmp_path: Path, store: Store) -> None:
    """veRL's MLflow adapter flattens its config into params joined with "/" (verl/utils/tracking.py); the
    MLflow reader keeps them as the run's config, where the bound is found."""
    mlflow = pytest.importorskip("mlflow")
    from mlflow.entities import Metric, Param

    db = tmp_path / "mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    run = client.create_run(client.create_experiment("grpo"), run_name="verl-v1-async").info.run_id
    params = [
        Param("trainer/v1/sampler/max_off_policy_threshold", "2"),
        Param("async_training/staleness_threshold", "0.5"),  # a share of samples, not versions
    ]
    calm = {"actor/entropy": 1.0, "critic/score/mean": 0.4, "actor/pg_clipfrac": 0.01, "timing_s/gen": 12.0}
    metrics = [
        Metric(key, value, 0, step)
        for step in range(1, 31)
        for key, value in {
            **calm,
            "training/off_policy/trajectory_staleness/max": 4.0 if step == 29 else 1.0,
            "training/off_policy/trajectory_staleness/mean": 0.6,
        }.items()
    ]
    client.log_batch(run, metrics=metrics, params=params)
    _, result = observe(store, db)
    (run_id,) = result.run_ids
    health = analyze_runs(store, [run_id])[run_id]
    assert health.reasons == [
        "samples 4 policy versions stale at step 29, past the run's bound of 2 (max_off_policy_threshold)"
    ]
    assert health.level == "yellow"


def test_opd_on_hints_the_policy_cannot_follow() -> None:
    """The teacher/student KL of OPD's hinted samples, as the plane's trainer logs it (opd/kl): where it
    stayed in the demo's healthy runs, then climbing as it did before two runs' answers degenerated."""
    steps = np.arange(1, 41)
    healthy = 0.05 + 0.08 * RNG.random(40)  # 0.05-0.13 nats
    assert judged(opd_kl=healthy, opd_kl_steps=steps)[0] == "green"
    drifting = np.r_[healthy[:30], np.linspace(0.2, 0.4, 10)]
    level, reasons, causes = judged(opd_kl=drifting, opd_kl_steps=steps)
    assert (level, causes) == ("yellow", {"opd"}) and "teacher/student KL 0.3" in reasons[0]
    assert "lower train.w_opd" in reasons[0]
    gone = np.r_[healthy[:30], np.linspace(0.5, 0.95, 10)]
    assert judged(opd_kl=gone, opd_kl_steps=steps)[:3:2] == ("red", {"opd"})


def test_stored_opd_kl_is_read_from_rl_steps(store: Store) -> None:
    run_id = store.create_run("agents-train", source_kind="agents", status="finished")
    add_series(store, run_id, {"reward": np.full(30, 0.3), "opd/kl": np.linspace(0.3, 0.9, 30)})
    health = analyze_run(store, run_id)
    assert health is not None and health.level == "red" and {f.cause for f in health.flags} == {"opd"}
