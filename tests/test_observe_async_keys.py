"""Async RL keys: the sampler against the learner, staleness and off-policy samples under canonical names
for every framework (engine/observe/frameworks.py), and a run's configured staleness bound from its config
(engine/coherence/staleness.py).

Each key set below is what the framework's code logs, read in its source at the commit named (file named per
set); docs/reference/frameworks.md §2.3 says what each key measures. The writers through readers are veRL's
FileLogger and prime-rl's FileMonitor (copied in tests/test_observe_jsonl_frameworks.py), and torch's
SummaryWriter for the frameworks that log to TensorBoard (SkyRL, OpenRLHF, TRL through transformers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import series
from test_observe_frameworks import KEY_SETS, TRL_ASYNC, normalized
from test_observe_jsonl_frameworks import VerlFileLogger, prime_rl_log_metrics

from engine.coherence.staleness import MAX_BOUND, MAX_DEPTH, Bound, staleness_bound
from engine.observe import normalize_key, observe
from engine.observe.frameworks import mapping_for
from engine.store import Store, StoreReader

KL, ABS_DIFF = "mismatch/kl", "mismatch/logprob_abs_diff"
STALE_MEAN, STALE_MAX = "staleness/mean", "staleness/max"

# Source key -> the canonical name it takes (None: it keeps its own name), with the framework's other keys.
ASYNC_KEYS: dict[str, dict[str, str | None]] = {
    # verl-project/verl 1dda039b: verl/trainer/ppo/rollout_corr_helper.py (compute_offpolicy_metrics,
    # compute_is_metrics, prefixed rollout_corr/), verl/utils/debug/metrics.py (calculate_debug_metrics),
    # verl/trainer/ppo/v1/trainer_base.py and v1/replay_buffer.py (training/off_policy/*),
    # verl/trainer/ppo/metric_utils.py (response/aborted_ratio), verl/experimental/fully_async_policy/
    # detach_utils.py and fully_async_rollouter.py (fully_async/*).
    "verl": {
        "rollout_corr/kl": None,  # the k1 estimate: k3 takes the name when both are logged (always, in veRL)
        "rollout_corr/k3_kl": KL,
        "rollout_corr/training_ppl": None,
        "rollout_corr/rollout_ppl": None,
        "rollout_corr/log_ppl_abs_diff": None,
        "rollout_corr/chi2_token": None,
        "rollout_corr/rollout_is_mean": "mismatch/is_ratio/mean",
        "rollout_corr/rollout_is_min": "mismatch/is_ratio/min",
        "rollout_corr/rollout_is_max": "mismatch/is_ratio/max",
        "rollout_corr/rollout_is_eff_sample_size": None,
        "training/rollout_probs_diff_valid": None,
        "training/rollout_probs_diff_mean": "mismatch/prob_abs_diff/mean",
        "training/rollout_probs_diff_max": "mismatch/prob_abs_diff/max",
        "training/rollout_probs_diff_std": "mismatch/prob_abs_diff/std",
        "training/rollout_actor_probs_pearson_corr": "mismatch/prob_corr",
        "training/off_policy/trajectory_spans/mean": None,
        "training/off_policy/trajectory_staleness/mean": STALE_MEAN,
        "training/off_policy/trajectory_staleness/max": STALE_MAX,
        "training/off_policy/trajectory_staleness/min": None,
        "training/off_policy/trajectory_staleness_worst/max": None,
        "training/off_policy/evicted_samples": "off_policy/dropped",
        "response/aborted_ratio": "completions/aborted_ratio",
        "fully_async/count/total_generated_samples": None,
        "fully_async/count/dropped_stale_samples": "off_policy/dropped_total",
        "fully_async/count/stale_trajectory_processed": "off_policy/stale_total",
        "fully_async/static/staleness_threshold": None,
        "fully_async/partial/partial_ratio": None,
        "fully_async/trainer/idle_ratio": "perf/trainer_wait_share",
    },
    # PrimeIntellect-ai/prime-rl 559b4477: src/prime_rl/trainer/rl/train.py (mismatch_kl/<env>/<stat>),
    # src/prime_rl/orchestrator/orchestrator.py (off_policy/*, the shipped batch).
    "prime-rl": {
        "mismatch_kl/all/mean": KL,
        "mismatch_kl/all/max": None,
        "off_policy/mean": STALE_MEAN,
        "off_policy/max": STALE_MAX,
        "off_policy/in_flight/mean": None,
        "off_policy/in_queue/max": None,
        "off_policy/dropped": None,  # already the canonical name
    },
    # NovaSky-AI/SkyRL a9564572: skyrl/train/trainer.py, skyrl/train/fully_async_trainer.py.
    "skyrl": {
        "policy/rollout_train_logprobs_abs_diff_mean": f"{ABS_DIFF}/mean",
        "policy/rollout_train_logprobs_abs_diff_max": f"{ABS_DIFF}/max",
        "policy/rollout_train_logprobs_abs_diff_min": None,
        "policy/rollout_train_logprobs_abs_diff_std": f"{ABS_DIFF}/std",
        "async/staleness_mean": STALE_MEAN,
        "async/staleness_max": STALE_MAX,
        "async/staleness_min": None,
        "async/staleness_ratio": "off_policy/share",
        "async/staleness_violation_count": "staleness/violations",
        "async/num_groups_dropped": None,  # zero-variance groups (DAPO), not stale ones
    },
    # OpenRLHF/OpenRLHF 3c3be623: openrlhf/models/loss.py (vllm_kl), openrlhf/trainer/ray/ppo_actor.py.
    "openrlhf": {"train/vllm_kl": KL, "train/logprobs_diff": None},  # logprobs_diff is against the reference
    # THUDM/slime 624b824a: slime/backends/megatron_utils/loss.py, slime/observability/train_metric_utils.py.
    "slime": {
        "train/train_rollout_logprob_abs_diff": f"{ABS_DIFF}/mean",
        "train/tis": "mismatch/is_ratio/mean",
        "train/tis_clipfrac": None,
        "train/ois": None,
        "perf/wait_time_ratio": "perf/trainer_wait_share",
    },
    # trl/trainer/grpo_trainer.py (TRL 1.16, installed), as transformers logs it.
    "trl": {
        "train/sampling/sampling_logp_difference/mean": f"{ABS_DIFF}/mean",
        "train/sampling/sampling_logp_difference/max": f"{ABS_DIFF}/max",
        "train/sampling/importance_sampling_ratio/min": "mismatch/is_ratio/min",
        "train/sampling/importance_sampling_ratio/mean": "mismatch/is_ratio/mean",
        "train/sampling/importance_sampling_ratio/max": "mismatch/is_ratio/max",
    },
    # trl/experimental/async_grpo/async_grpo_trainer.py (TRL 1.16): the rollout queue's iterator.
    "trl-async": {
        "train/sample/staleness_mean": STALE_MEAN,
        "train/sample/staleness_max": STALE_MAX,
        "train/sample/dropped_stale_total": "off_policy/dropped",
        "train/sample/time_in_queue_s": None,
    },
    # inclusionAI/AReaL 4aef98d8: areal/utils/functional/functional.py, areal/trainer/ppo/actor.py
    # (_log_version_staleness_stats), areal/utils/stats_tracker.py (/avg /min /max).
    "areal": {
        "ppo_actor/update/behave_approx_kl/avg": KL,
        "ppo_actor/update/behave_approx_kl/max": None,
        "ppo_actor/update/behave_imp_weight/avg": "mismatch/is_ratio/mean",
        "ppo_actor/update/behave_imp_weight/min": "mismatch/is_ratio/min",
        "ppo_actor/update/behave_imp_weight/max": "mismatch/is_ratio/max",
        "ppo_actor/update/version_stats/sample_staleness_proximal_avg": STALE_MEAN,
        "ppo_actor/update/version_stats/sample_staleness_proximal_max": STALE_MAX,
        "ppo_actor/update/version_stats/sample_staleness_theta_avg": None,
    },
}


def framework_keys(framework: str) -> list[str]:
    base = TRL_ASYNC if framework == "trl-async" else KEY_SETS[framework]
    return base + list(ASYNC_KEYS[framework])


@pytest.mark.parametrize("framework", list(ASYNC_KEYS))
def test_async_keys_take_the_canonical_names(framework: str) -> None:
    names = normalized(framework_keys(framework))
    mapping = mapping_for(names)
    assert mapping.framework == framework.removesuffix("-async")  # the async keys do not confuse detection
    renames = mapping.renames(names)
    for source, canonical in ASYNC_KEYS[framework].items():
        assert renames.get(normalize_key(source)) == canonical, source
    assert len({renames.get(n, n) for n in names}) == len(set(names))  # nothing lost


def test_ppo_step_and_sampler_mismatch_are_two_concepts() -> None:
    """policy_kl is PPO's step (the old policy against the updated one); the sampler against the learner is
    mismatch/kl. prime-rl's mismatch_kl is the second, so it no longer fills policy_kl."""
    cases = {
        "verl": ("actor/ppo_kl", "rollout_corr/k3_kl"),
        "openrlhf": ("ppo_kl", "vllm_kl"),
        "areal": ("ppo_actor/update/approx_kl/avg", "ppo_actor/update/behave_approx_kl/avg"),
    }
    for framework, (step, sampler) in cases.items():
        names = normalized(framework_keys(framework))
        renames = mapping_for(names).renames(names)
        assert (renames[step], renames[sampler]) == ("policy_kl", KL), framework
    prime = mapping_for(normalized(KEY_SETS["prime-rl"])).renames(normalized(KEY_SETS["prime-rl"]))
    assert prime["mismatch_kl/all/mean"] == KL and "policy_kl" not in prime.values()


def test_a_verl_run_with_only_the_k1_estimate_gives_it_the_name() -> None:
    names = normalized(KEY_SETS["verl"]) + ["rollout_corr/kl"]
    assert mapping_for(names).renames(names)["rollout_corr/kl"] == KL


# -- through the readers: the done-when's frameworks ------------------------------------------------------


def step_values(keys: list[str], step: int) -> dict[str, float]:
    return {key: 0.25 + i / 1000 + step / 10 for i, key in enumerate(keys)}


def canonical_series(store: Store, run_id: int) -> set[str]:
    return {r[0] for r in store.conn.execute("SELECT DISTINCT key FROM metrics WHERE run_id=?", (run_id,))}


def test_verl_and_prime_rl_logs_show_the_canonical_names(store: Store, tmp_path: Path) -> None:
    verl = tmp_path / "proj" / "fully_async.jsonl"
    verl.parent.mkdir()
    logger = VerlFileLogger(verl)
    keys = framework_keys("verl")
    for step in (1, 2, 3):
        logger.log(step_values(keys, step), step)
    logger.finish()
    prime = tmp_path / "prime" / "metrics.jsonl"
    prime.parent.mkdir()
    with prime.open("w") as f:
        for step in (1, 2, 3):
            prime_rl_log_metrics(f, step_values(framework_keys("prime-rl"), step), step)
    throughput = {"verl": "perf/tokens_per_s_per_gpu", "prime-rl": "perf/tokens_per_s"}
    for path, framework in ((verl, "verl"), (prime, "prime-rl")):
        _, result = observe(store, path)
        run_id = result.run_ids[0]
        assert store.run(run_id)["framework"] == framework
        stored = canonical_series(store, run_id)
        assert {KL, STALE_MEAN, STALE_MAX, throughput[framework]} <= stored, framework
        names = StoreReader(store.path).key_names(run_id)
        expected = {c: s for s, c in ASYNC_KEYS[framework].items() if c is not None}
        assert expected.items() <= names.items()  # each chart says where its series came from
    source = framework_keys("verl").index("rollout_corr/k3_kl")
    assert series(store, 1, KL) == pytest.approx({s: 0.25 + source / 1000 + s / 10 for s in (1, 2, 3)})


def test_tensorboard_runs_of_skyrl_openrlhf_and_trl(store: Store, tmp_path: Path) -> None:
    """SkyRL, OpenRLHF and TRL (through transformers, `train/` prefixed) log to TensorBoard."""
    from torch.utils.tensorboard import SummaryWriter

    expected = {
        "skyrl": {f"{ABS_DIFF}/mean", STALE_MEAN, "off_policy/share", "perf/tokens_per_s_per_gpu"},
        "openrlhf": {KL},
        "trl": {f"{ABS_DIFF}/mean", "mismatch/is_ratio/mean"},
        "trl-async": {STALE_MEAN, STALE_MAX, "off_policy/dropped", "perf/tokens_per_s"},
    }
    extra = {"skyrl": ["trainer/tokens_per_second_per_gpu"]}
    for framework, canonical in expected.items():
        logdir = tmp_path / framework
        writer = SummaryWriter(str(logdir))
        keys = framework_keys(framework) + extra.get(framework, [])
        for step in (1, 2, 3):
            for key, value in step_values(keys, step).items():
                writer.add_scalar(key, value, step)
        writer.close()
        _, result = observe(store, logdir)
        run_id = result.run_ids[0]
        assert store.run(run_id)["framework"] == framework.removesuffix("-async")
        assert canonical <= canonical_series(store, run_id), framework


def test_areals_behaviour_kl_is_stored_with_its_sign_turned(store: Store, tmp_path: Path) -> None:
    """AReaL logs log π_prox − log π_behave, whose mean is −KL(behave ‖ prox): stored as the KL."""
    path = tmp_path / "areal.jsonl"
    base = {k: 0.5 for k in KEY_SETS["areal"] if normalize_key(k, jsonl=True) is not None}
    path.write_text(
        "".join(
            json.dumps({"step": s, **base, "ppo_actor/update/behave_approx_kl/avg": -0.002 * s}) + "\n"
            for s in (1, 2)
        )
    )
    _, result = observe(store, path)
    assert series(store, result.run_ids[0], KL) == pytest.approx({1: 0.002, 2: 0.004})


# -- the run's configured staleness bound ---------------------------------------------------------------


def test_the_bound_from_each_frameworks_config() -> None:
    # as the W&B reader stores a run's config: nested
    assert staleness_bound({"trainer": {"fully_async": {"max_staleness_steps": 4}}}, "skyrl") == Bound(
        "max_staleness_steps", 4
    )
    assert staleness_bound({"orchestrator": {"max_off_policy_steps": 2}}, "prime-rl") == Bound(
        "max_off_policy_steps", 2
    )
    assert staleness_bound({"max_async_level": 1}, "prime-rl") == Bound(
        "max_async_level", 1
    )  # before 2026-05
    assert staleness_bound({"max_staleness": 3.0, "beta": 0.0}, "trl") == Bound("max_staleness", 3)
    assert staleness_bound({"rollout": {"max_head_offpolicyness": 0}}, "areal") == Bound(
        "max_head_offpolicyness", 0
    )
    # as veRL's MLflow adapter flattens it into params, strings
    flat = {"trainer/v1/sampler/max_off_policy_threshold": "8", "async_training/staleness_threshold": "0.5"}
    assert staleness_bound(flat, "verl") == Bound("max_off_policy_threshold", 8)
    # veRL's staleness_threshold is a share of stale samples, not versions: no bound from it
    assert staleness_bound({"async_training": {"staleness_threshold": 1}}, "verl") is None
    # a run of no known framework: any framework's name; the newest name of a framework wins over its older
    assert staleness_bound({"a": {"max_staleness_steps": 5}}, None) == Bound("max_staleness_steps", 5)
    both = {"max_async_level": 1, "orchestrator": {"max_off_policy_steps": 6}}
    assert staleness_bound(both, "prime-rl") == Bound("max_off_policy_steps", 6)


def test_a_hostile_config_gives_no_bound_and_costs_little() -> None:
    for value in (True, "²", "-1", -1, 2.5, MAX_BOUND + 1, "99999999", None, [4], {"x": 4}):
        assert staleness_bound({"max_staleness_steps": value}, "skyrl") is None, value
    assert staleness_bound("not a dict", "skyrl") is None
    assert staleness_bound({1: 4, ("x",): 4}, "skyrl") is None
    deep: dict = {"max_staleness_steps": 4}
    for _ in range(MAX_DEPTH + 5):
        deep = {"x": deep}
    assert staleness_bound(deep, "skyrl") is None  # past the depth searched
    wide = {f"k{i}": {"v": i} for i in range(100_000)}
    wide["z"] = {"max_staleness_steps": 4}
    assert staleness_bound(wide, "skyrl") is None  # past the values looked at
