"""Framework key maps: each framework told from the keys it logs, its keys mapped onto the control room's
concepts, the renames remembered per run, and Φ derived from every framework's entropy once |V| is known.

The key sets are the ones each framework's trainer logs, read in its source (commit and file named per set);
tests/test_observe_jsonl_frameworks.py has the veRL and prime-rl log files themselves.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from support import series

from engine.observe import normalize_key, observe
from engine.observe.frameworks import KeyMapping, detect, mapping_for
from engine.store import Store, StoreReader

# volcengine/verl b178a3cd: verl/trainer/ppo/metric_utils.py (compute_data_metrics, compute_timing_metrics,
# compute_throughout_metrics), verl/workers/actor/dp_actor.py,
# verl/trainer/ppo/core_algos.py, fsdp_workers.py.
VERL = [
    "actor/entropy",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/pg_clipfrac_lower",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/grad_norm",
    "actor/lr",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "critic/returns/mean",
    "response_length/mean",
    "response_length/max",
    "response_length/min",
    "response_length/clip_ratio",
    "prompt_length/mean",
    "timing_s/gen",
    "timing_s/step",
    "perf/total_num_tokens",
    "perf/time_per_step",
    "perf/throughput",
    "training/global_step",
    "training/epoch",
]
# OpenRLHF/OpenRLHF 3c3be623: openrlhf/trainer/ray/ppo_actor.py (training_step's metrics and experience.info),
# openrlhf/trainer/ppo_utils/experience.py, openrlhf/utils/logging_utils.py (logged as train/<key>).
OPENRLHF = [
    f"train/{k}"
    for k in (
        "policy_loss",
        "entropy_loss",
        "actor_lr",
        "actor_grad_norm",
        "ppo_clip_ratio",
        "ppo_kl",
        "kl",
        "logprobs_diff",
        "reward",
        "return",
        "response_length",
        "total_length",
        "truncated",
        "group_reward_std",
        "global_step",
    )
]
# PrimeIntellect-ai/prime-rl 559b4477: src/prime_rl/trainer/rl/train.py (trainer), src/prime_rl/orchestrator/
# orchestrator.py and metrics.py (orchestrator; "default" is the agent's name).
PRIME_RL = [
    "perf/throughput",
    "perf/mfu",
    "optim/lr",
    "optim/grad_norm",
    "entropy/all/mean",
    "entropy/all/std",
    "entropy/all/max",
    "mismatch_kl/all/mean",
    "loss/mean",
    "is_masked/mean",
    "is_masked_low/mean",
    "is_masked_high/mean",
    "kl_ent_ratio/mean",
    "time/step",
    "time/wait_for_batch",
    "train/agg/effective/default/reward/mean",
    "train/agg/effective/default/reward/max",
    "train/agg/effective/num_output_tokens/mean",
    "train/agg/effective/num_output_tokens/max",
    "train/agg/effective/default/is_truncated/mean",
    "train/agg/all/has_error/mean",
    "time/wait_for_policy",
]
# NovaSky-AI/SkyRL a9564572: skyrl/train/trainer.py, skyrl/backends/skyrl_train/workers/worker.py,
# skyrl/train/generators/utils.py.
SKYRL = [
    "policy/policy_entropy",
    "policy/policy_loss",
    "policy/final_loss",
    "policy/policy_lr",
    "policy/grad_norm",
    "policy/response_length",
    "policy/loss_metrics/clip_ratio",
    "policy/policy_kl",
    "reward/avg_raw_reward",
    "reward/avg_pass_at_4",
    "reward/mean_positive_reward",
    "loss/avg_kl",
    "loss/avg_kl_max",
    "loss/avg_final_rewards",
    "generate/avg_num_tokens",
    "generate/max_num_tokens",
    "generate/min_num_tokens",
    "trainer/global_step",
    "trainer/epoch",
]
# inclusionAI/AReaL 4aef98d8: areal/trainer/ppo/actor.py,
# areal/utils/stats_tracker.py, areal/engine/fsdp_engine.py.
AREAL = [
    "ppo_actor/update/entropy/avg",
    "ppo_actor/update/entropy/min",
    "ppo_actor/update/entropy/max",
    "ppo_actor/update/approx_kl/avg",
    "ppo_actor/update/clip_ratio/avg",
    "ppo_actor/update/dual_clip_ratio/avg",
    "ppo_actor/update/importance_weight/avg",
    "ppo_actor/update/actor_loss/avg",
    "ppo_actor/update/grad_norm",
    "ppo_actor/update/lr",
    "ppo_actor/update/update_successful",
    "ppo_actor/task_reward/avg",
    "ppo_actor/no_eos_ratios/avg",
    "ppo_actor/seq_len/avg",
    "ppo_actor/advantages/avg",
    "timeperf/train_step",
]
# THUDM/slime 624b824a: slime/backends/megatron_utils/model.py and loss.py (train/<key>), slime/ray/rollout.py
# and slime/observability/train_metric_utils.py (rollout/<field>).
SLIME = [
    "train/loss",
    "train/pg_loss",
    "train/entropy_loss",
    "train/pg_clipfrac",
    "train/ppo_kl",
    "train/kl_loss",
    "train/train_rollout_logprob_abs_diff",
    "train/grad_norm",
    "train/lr-pg_0",
    "train/step",
    "rollout/raw_reward",
    "rollout/rewards",
    "rollout/response_lengths",
    "rollout/truncated",
    "rollout/advantages",
    "rollout/step",
    "perf/rollout_time",
]
# trl/trainer/grpo_trainer.py (TRL 1.16), as transformers sends it to a tracker (train/<key>).
TRL = [
    f"train/{k}"
    for k in (
        "loss",
        "grad_norm",
        "learning_rate",
        "num_tokens",
        "completions/mean_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "completions/mean_terminated_length",
        "rewards/accuracy/mean",
        "rewards/accuracy/std",
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "epoch",
        "global_step",
    )
]
CARL = ["phi/mean", "phi/p10", "phi/p90", "cascade/multiplier", "entropy", "reward", "kl", "num_tokens"]

KEY_SETS = {
    "verl": VERL,
    "openrlhf": OPENRLHF,
    "prime-rl": PRIME_RL,
    "skyrl": SKYRL,
    "areal": AREAL,
    "slime": SLIME,
    "trl": TRL,
    "carl": CARL,
}
# What each framework's run fills, and the source key of each renamed concept.
CONCEPTS = {
    "verl": {
        "entropy": "actor/entropy",
        "reward": "critic/score/mean",
        "kl": "actor/kl_loss",
        "policy_kl": "actor/ppo_kl",
        "clip_ratio/region_mean": "actor/pg_clipfrac",
        "completions/mean_length": "response_length/mean",
        "completions/clipped_ratio": "response_length/clip_ratio",
        "grad_norm": "actor/grad_norm",
        "learning_rate": "actor/lr",
    },
    "openrlhf": {
        "entropy": "train/entropy_loss",
        "reward": None,
        "kl": None,
        "policy_kl": "train/ppo_kl",
        "clip_ratio/region_mean": "train/ppo_clip_ratio",
        "completions/mean_length": "train/response_length",
        "completions/clipped_ratio": "train/truncated",
        "grad_norm": "train/actor_grad_norm",
        "learning_rate": "train/actor_lr",
    },
    "prime-rl": {
        "entropy": "entropy/all/mean",
        "reward": "train/agg/effective/default/reward/mean",
        "mismatch/kl": "mismatch_kl/all/mean",  # the sampler against the learner, not PPO's step
        "clip_ratio/low_mean": "is_masked_low/mean",
        "clip_ratio/high_mean": "is_masked_high/mean",
        "clip_ratio/region_mean": "is_masked/mean",
        "completions/mean_length": "train/agg/effective/num_output_tokens/mean",
        "completions/clipped_ratio": "train/agg/effective/default/is_truncated/mean",
        "grad_norm": "optim/grad_norm",
        "learning_rate": "optim/lr",
    },
    "skyrl": {
        "entropy": "policy/policy_entropy",
        "reward": "reward/avg_raw_reward",
        "kl": "policy/policy_kl",
        "clip_ratio/region_mean": "policy/loss_metrics/clip_ratio",
        "completions/mean_length": "generate/avg_num_tokens",
        "grad_norm": "policy/grad_norm",
        "learning_rate": "policy/policy_lr",
    },
    "areal": {
        "entropy": "ppo_actor/update/entropy/avg",
        "reward": "ppo_actor/task_reward/avg",
        "policy_kl": "ppo_actor/update/approx_kl/avg",
        "clip_ratio/region_mean": "ppo_actor/update/clip_ratio/avg",
        "completions/clipped_ratio": "ppo_actor/no_eos_ratios/avg",
        "grad_norm": "ppo_actor/update/grad_norm",
        "learning_rate": "ppo_actor/update/lr",
    },
    "slime": {
        "entropy": "train/entropy_loss",
        "reward": "rollout/raw_reward",
        "kl": "train/kl_loss",
        "policy_kl": "train/ppo_kl",
        "clip_ratio/region_mean": "train/pg_clipfrac",
        "completions/mean_length": "rollout/response_lengths",
        "completions/clipped_ratio": "rollout/truncated",
        "grad_norm": None,
        "learning_rate": "train/lr-pg_0",
    },
    "trl": {
        "entropy": None,
        "reward": None,
        "kl": None,
        "clip_ratio/low_mean": None,
        "clip_ratio/high_mean": None,
        "completions/clipped_ratio": None,
        "grad_norm": None,
        "learning_rate": None,
        "frac_reward_zero_std": None,
    },
}


def normalized(keys: list[str]) -> list[str]:
    return [k for k in (normalize_key(key) for key in keys) if k is not None]


@pytest.mark.parametrize("framework", list(KEY_SETS))
def test_each_framework_is_told_from_its_keys(framework: str) -> None:
    assert detect(normalized(KEY_SETS[framework])) == framework


def test_keys_of_no_framework_tell_none() -> None:
    assert detect(["loss", "reward", "my/metric"]) is None
    assert detect([]) is None


@pytest.mark.parametrize("framework", list(CONCEPTS))
def test_each_framework_fills_the_concepts(framework: str) -> None:
    names = normalized(KEY_SETS[framework])
    mapping = mapping_for(names)
    assert mapping.framework == framework
    renames = mapping.renames(names)
    mapped = {renames.get(name, name) for name in names}
    for concept, source in CONCEPTS[framework].items():
        assert concept in mapped, concept
        if source is not None:
            assert renames[normalize_key(source)] == concept
    # Nothing is lost: every key is still there, renamed or as it was.
    assert len(mapped) == len(set(names))


def test_two_keys_for_one_concept_the_table_order_decides() -> None:
    # SkyRL logs the KL loss (policy/policy_kl) and, with the KL in the reward, loss/avg_kl: the table lists
    # policy/policy_kl first, so it is `kl` whatever order the keys come in, and loss/avg_kl keeps its name.
    for keys in (["loss/avg_kl", "policy/policy_kl"], ["policy/policy_kl", "loss/avg_kl"]):
        assert KeyMapping("skyrl").renames(keys) == {"policy/policy_kl": "kl"}
    # A run that renamed loss/avg_kl before (stored in run_keys) keeps it so.
    assert KeyMapping("skyrl", {"kl": "loss/avg_kl"}).renames(["policy/policy_kl", "loss/avg_kl"]) == {
        "loss/avg_kl": "kl"
    }


def test_a_concept_the_run_logs_itself_is_not_taken() -> None:
    assert KeyMapping("verl").renames(["actor/entropy", "entropy"]) == {}
    mapping = KeyMapping("verl")
    mapping.renames(["actor/entropy", "entropy"])
    assert mapping.renames(["actor/entropy"]) == {}  # not later either


def test_canonical_and_take_renamed() -> None:
    mapping = KeyMapping("prime-rl")
    assert mapping.canonical("entropy/all/mean") == "entropy"
    assert mapping.canonical("agg/effective/solver/reward/mean") == "reward"
    assert mapping.canonical("agg/effective/judge/reward/mean") == "agg/effective/judge/reward/mean"
    assert mapping.canonical("my/metric") == "my/metric"
    assert mapping.take_renamed() == {
        "entropy": "entropy/all/mean",
        "reward": "agg/effective/solver/reward/mean",
    }
    assert mapping.take_renamed() == {}
    assert KeyMapping(None).canonical("actor/entropy") == "actor/entropy"


# -- through a reader ----------------------------------------------------------------------------------------


def write_flat_log(path: Path, keys: list[str], steps: int = 3, vocab_size: int | None = None) -> None:
    """One JSON line a step with every key (a value from the key's place and the step)."""
    with path.open("w") as f:
        if vocab_size is not None:
            f.write(json.dumps({"step": 0, "vocab_size": vocab_size}) + "\n")
        for step in range(1, steps + 1):
            f.write(
                json.dumps({"step": step, **{k: 0.5 + i / 100 + step for i, k in enumerate(keys)}}) + "\n"
            )


@pytest.mark.parametrize("framework", ["verl", "openrlhf", "prime-rl", "skyrl", "areal", "slime", "trl"])
def test_phi_from_every_frameworks_entropy(store: Store, tmp_path: Path, framework: str) -> None:
    keys = [k for k in KEY_SETS[framework] if normalize_key(k, jsonl=True) is not None]
    path = tmp_path / f"{framework}.jsonl"
    write_flat_log(path, keys, vocab_size=32_000)
    _, result = observe(store, path)
    assert result.bad_lines == 0
    run_id = result.run_ids[0]
    assert store.run(run_id)["framework"] == framework
    entropy_key = CONCEPTS[framework]["entropy"] or "train/entropy"
    entropy = {s: 0.5 + keys.index(entropy_key) / 100 + s for s in (1, 2, 3)}
    assert series(store, run_id, "entropy") == pytest.approx(entropy)
    phi = {s: 1 - h / math.log(32_000) for s, h in entropy.items()}
    assert series(store, run_id, "phi/mean") == pytest.approx(phi)
    reader = StoreReader(store.path)
    try:
        names = reader.key_names(run_id)
        expected = {c: s for c, s in CONCEPTS[framework].items() if s is not None}
        assert expected.items() <= names.items()
        assert all(source in keys for source in names.values())  # the source's own spelling
        assert reader.runs()[0].framework == framework
    finally:
        reader.close()
    # Unknown keys are kept, and can be charted like any other; a renamed one under its concept.
    stored = {r[0] for r in store.conn.execute("SELECT DISTINCT key FROM metrics WHERE run_id=?", (run_id,))}
    for key in keys:
        name = normalize_key(key, jsonl=True)
        assert name in stored or name in {normalize_key(s) for s in names.values()}


def test_the_stored_framework_wins_over_later_keys(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"step": 1, "actor/entropy": 1.0, "critic/score/mean": 0.5}) + "\n")
    source_id, result = observe(store, path, follow=True)
    run_id = result.run_ids[0]
    assert store.run(run_id)["framework"] == "verl"
    with path.open("a") as f:  # later lines that alone would look like another framework
        f.write(json.dumps({"step": 2, "actor/entropy": 2.0, "policy/policy_entropy": 3.0}) + "\n")
    observe(store, path, follow=True)
    assert store.run(run_id)["framework"] == "verl"
    assert series(store, run_id, "entropy") == {1: 1.0, 2: 2.0}
    assert series(store, run_id, "policy/policy_entropy") == {2: 3.0}


def test_vocab_size_arriving_later_and_the_users_override(store: Store, tmp_path: Path) -> None:
    from engine.observe.runkeys import backfill_phi, set_vocab_override

    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"step": 1, "actor/entropy": 2.0, "critic/score/mean": 0.5}) + "\n")
    source_id, result = observe(store, path, follow=True)
    run_id = result.run_ids[0]
    assert series(store, run_id, "phi/mean") == {}  # no |V| yet
    assert backfill_phi(store, run_id, 1000) == 2
    assert series(store, run_id, "phi/mean") == pytest.approx({1: 1 - 2.0 / math.log(1000)})
    set_vocab_override(store, source_id, 5000)
    with path.open("a") as f:  # the log's own vocab_size is not the user's
        f.write(json.dumps({"step": 2, "actor/entropy": 1.0, "vocab_size": 7}) + "\n")
    observe(store, path, follow=True)
    assert store.run(run_id)["vocab_size"] == 5000
    assert series(store, run_id, "phi/mean")[2] == pytest.approx(1 - 1.0 / math.log(5000))


# -- throughput, timing and MFU (docs/reference/frameworks.md §2.2) ------------------------------------------

# Each framework's throughput keys, read in its source at the commit of its key set above (TRL: 1.16,
# installed).
PERF_KEY_SETS = {
    # verl/trainer/ppo/ray_trainer.py (marked_timer names), metric_utils.py (compute_timing_metrics,
    # compute_throughout_metrics), workers/fsdp_workers.py (perf/mfu/actor, perf/max_memory_*).
    "verl": [
        "timing_s/step",
        "timing_s/gen",
        "timing_s/reward",
        "timing_s/old_log_prob",
        "timing_s/ref",
        "timing_s/adv",
        "timing_s/update_actor",
        "timing_per_token_ms/gen",
        "perf/total_num_tokens",
        "perf/time_per_step",
        "perf/throughput",
        "perf/mfu/actor",
        "perf/max_memory_allocated_gb",
    ],
    # src/prime_rl/trainer/rl/train.py (perf_metrics, time/*).
    "prime-rl": [
        "perf/throughput",
        "perf/throughput_per_gpu",
        "perf/mfu",
        "perf/peak_memory",
        "time/step",
        "time/wait_for_batch",
        "time/load_data",
        "time/broadcast_weights",
        "time/save_ckpt",
        "time/forward_backward",
    ],
    # skyrl/train/trainer.py (Timer names as timing/<name>, trainer/tokens_per_second_per_gpu).
    "skyrl": [
        "timing/step",
        "timing/generate",
        "timing/postprocess_generator_output",
        "timing/fwd_logprobs_values_reward",
        "timing/compute_advantages_and_returns",
        "timing/train_critic_and_policy",
        "timing/sync_weights",
        "trainer/tokens_per_second_per_gpu",
    ],
    # slime/observability/train_metric_utils.py (log_perf_data) and rollout_metrics.py.
    "slime": [
        "perf/rollout_time",
        "perf/tokens_per_gpu_per_sec",
        "perf/log_probs_time",
        "perf/actor_train_time",
        "perf/actor_train_tflops",
        "perf/actor_train_tok_per_s",
        "perf/train_wait_time",
        "perf/train_time",
        "perf/step_time",
        "perf/wait_time_ratio",
    ],
    "trl": ["train/step_time", "train/num_tokens"],  # trl/trainer/grpo_trainer.py
}
# trl/experimental/async_grpo/async_grpo_trainer.py (_log_step_metrics, compute_loss), as transformers logs
# it.
TRL_ASYNC = [
    f"train/{k}"
    for k in (
        "loss",
        "entropy",
        "kl",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "perf/step_s",
        "perf/fwd_bwd_s",
        "perf/fwd_s",
        "perf/optimizer_s",
        "perf/forwarded_tok_s_fwd_bwd",
        "perf/forwarded_tok_s_wall_clock",
        "perf/trained_tok_s_wall_clock",
        "perf/mfu_fwd_bwd",
        "perf/mfu_wall_clock",
        "perf/rollout_wait_s",
        "batch/forwarded_tokens_per_step",
    )
]
STEP, GEN, SCORE, UPDATE = (
    "perf/step_time_s",
    "perf/time/generation_s",
    "perf/time/scoring_s",
    "perf/time/update_s",
)
PER_S, PER_GPU, COMPLETION_PER_S = (
    "perf/tokens_per_s",
    "perf/tokens_per_s_per_gpu",
    "perf/completion_tokens_per_s",
)
# Source key -> the canonical name it takes; None: the key keeps its name (another key of its framework took
# it).
PERF_RENAMES: dict[str, dict[str, str | None]] = {
    "verl": {
        "timing_s/step": STEP,
        "perf/time_per_step": None,
        "timing_s/gen": GEN,
        "timing_s/reward": SCORE,
        "timing_s/update_actor": UPDATE,
        "perf/throughput": PER_GPU,
        "perf/mfu/actor": "perf/mfu",
    },
    "prime-rl": {
        "perf/throughput": PER_S,
        "perf/throughput_per_gpu": PER_GPU,
        "perf/mfu": None,  # already the canonical name; its percent still becomes a fraction
        "time/step": STEP,
        "time/forward_backward": UPDATE,
    },
    "skyrl": {
        "timing/step": STEP,
        "timing/generate": GEN,
        "timing/train_critic_and_policy": UPDATE,
        "trainer/tokens_per_second_per_gpu": PER_GPU,
    },
    "slime": {
        "perf/step_time": STEP,
        "perf/rollout_time": GEN,
        "perf/actor_train_time": UPDATE,
        "perf/actor_train_tok_per_s": PER_S,
    },
    "trl": {"train/step_time": STEP},
    "trl-async": {
        "train/perf/step_s": STEP,
        "train/perf/fwd_bwd_s": UPDATE,
        "train/perf/forwarded_tok_s_wall_clock": PER_S,
        "train/perf/trained_tok_s_wall_clock": COMPLETION_PER_S,
        "train/perf/mfu_wall_clock": "perf/mfu",
        "train/perf/mfu_fwd_bwd": None,
    },
}


def perf_keys(framework: str) -> list[str]:
    if framework == "trl-async":
        return TRL_ASYNC
    return KEY_SETS[framework] + PERF_KEY_SETS[framework]


@pytest.mark.parametrize("framework", list(PERF_RENAMES))
def test_throughput_keys_take_the_canonical_names(framework: str) -> None:
    names = normalized(perf_keys(framework))
    mapping = mapping_for(names)
    assert mapping.framework == framework.removesuffix("-async")
    renames = mapping.renames(names)
    for source, canonical in PERF_RENAMES[framework].items():
        assert renames.get(normalize_key(source)) == canonical, source
    assert len({renames.get(n, n) for n in names}) == len(set(names))  # nothing lost


def test_mfu_in_percent_is_stored_as_a_fraction(store: Store, tmp_path: Path) -> None:
    """prime-rl's perf/mfu and TRL's async perf/mfu_wall_clock are percents; veRL's perf/mfu/actor is already
    a fraction. A percent key left under its own name keeps its unit."""
    cases = {
        "prime-rl": (perf_keys("prime-rl"), "perf/mfu", 42.0, 0.42),
        "verl": (perf_keys("verl"), "perf/mfu/actor", 0.42, 0.42),
        "trl-async": ([k.removeprefix("train/") for k in TRL_ASYNC], "perf/mfu_wall_clock", 42.0, 0.42),
    }
    for framework, (keys, source, value, stored) in cases.items():
        path = tmp_path / f"{framework}.jsonl"
        values = {k: 1.0 for k in keys if normalize_key(k, jsonl=True) is not None}
        with path.open("w") as f:
            for step in (1, 2):
                f.write(json.dumps({"step": step, **values, source: value * step}) + "\n")
        _, result = observe(store, path)
        run_id = result.run_ids[0]
        assert series(store, run_id, "perf/mfu") == pytest.approx({1: stored, 2: 2 * stored}), framework
        if framework == "trl-async":
            assert series(store, run_id, "perf/mfu_fwd_bwd") == {1: 1.0, 2: 1.0}


def test_trls_tokens_per_second_from_its_running_total(store: Store, tmp_path: Path) -> None:
    """TRL logs num_tokens (every rank's prompt and completion tokens so far) and step_time (the mean seconds
    of the steps since its last log): tokens/s is the total's difference over those steps' time, across the
    batches of a followed file too."""
    path = tmp_path / "trl.jsonl"
    base = {"clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "frac_reward_zero_std": 0.0}
    lines = [  # logging every 2 steps: 1,000 tokens a step, 0.5 s a step, then 0.25 s
        {"step": 2, "num_tokens": 2000.0, "step_time": 0.5},
        {"step": 4, "num_tokens": 4000.0, "step_time": 0.5},
        {"step": 6, "num_tokens": 6000.0, "step_time": 0.25},
    ]
    path.write_text("".join(json.dumps({**base, **line}) + "\n" for line in lines[:2]))
    _, result = observe(store, path, follow=True)
    run_id = result.run_ids[0]
    assert store.run(run_id)["framework"] == "trl"
    assert series(store, run_id, "perf/tokens_per_s") == {4: 2000.0}  # the first log has nothing before it
    with path.open("a") as f:  # the next batch finds step 4's total in the store
        f.write(json.dumps({**base, **lines[2]}) + "\n")
        f.write(json.dumps({**base, "step": 8, "num_tokens": 6000.0, "step_time": 0.5}) + "\n")  # no progress
        f.write(json.dumps({**base, "step": 10, "num_tokens": 7000.0}) + "\n")  # no step time
    observe(store, path, follow=True)
    assert series(store, run_id, "perf/tokens_per_s") == {4: 2000.0, 6: 4000.0}
    assert series(store, run_id, "num_tokens")[10] == 7000.0  # kept as it is
    assert series(store, run_id, "perf/step_time_s") == {2: 0.5, 4: 0.5, 6: 0.25, 8: 0.5}
