"""Which RL framework wrote a run, and its key names mapped onto the control room's concepts.

One declarative table per framework (docs/reference/frameworks.md §2): a source key, or a pattern, and the key
the control room charts it under. The vocabulary is TRL's (what transformers logs for GRPOTrainer, without
`train/`), since TRL runs and our own runs already write it, plus the concepts TRL has no key for.

    entropy                  mean token entropy, nats (gives Φ once |V| is known)
    entropy/p10, entropy/p50, entropy/p90   percentiles of the per-token entropy (carl's own trainers)
    cov/logp_adv             Cov(log π, A) over the completion tokens (carl's own trainers; collapse signal)
    reward, reward_std       the total reward's mean and spread;  rewards/<fn>/mean  each reward function
    kl                       KL to the reference model
    policy_kl                PPO's approx KL between the policy the batch's old log-probs came from and
                             the one being updated: how far an update moved (not sampler against learner)
    clip_ratio/low_mean      share of tokens clipped below (r < 1 - ε_low, A < 0)
    clip_ratio/high_mean     share clipped above (r > 1 + ε_high, A > 0);  clip_ratio/region_mean  either side
    completions/mean_length, completions/min_length, completions/max_length, completions/clipped_ratio
    completions/aborted_ratio   share of the step's samples the sampler aborted (no response at all)
    grad_norm, learning_rate, loss, frac_reward_zero_std

Async RL: the sampler (vLLM, SGLang) against the learner on the same tokens, and how old the samples are
(docs/reference/frameworks.md §2.3 says what each framework's key measures):

    mismatch/kl              KL(sampler ‖ learner), nats per token: the k3 estimator where the framework
                             logs it (never below 0), else its k1 estimate
    mismatch/logprob_abs_diff/mean, /max, /std   |log π_learner − log π_sampler| per token, nats
    mismatch/prob_abs_diff/mean, /max, /std      |π_learner − π_sampler| per token, a probability (veRL)
    mismatch/prob_corr       Pearson correlation of the two per-token probabilities (veRL)
    mismatch/is_ratio/mean, /min, /max   the importance ratio π_learner / π_sampler per token (1: none)
    staleness/mean, staleness/max   policy versions between the policy that sampled and the one trained
                             on the samples (0: on-policy)
    staleness/violations     samples trained in the step past the run's configured bound (SkyRL's count)
    off_policy/share         share of the step's samples an older policy sampled (staleness above 0)
    off_policy/dropped       samples dropped in the step for being too stale
    off_policy/dropped_total, off_policy/stale_total   since the run began: dropped; stale ones trained on

Throughput and MFU take the names our own runs write (engine/training/perf.py; docs/reference/frameworks.md
§2.2 says what each framework's key measures, which is not always the same span of time):

    perf/step_time_s         a step's seconds
    perf/time/generation_s, perf/time/scoring_s, perf/time/update_s   its phases
    perf/tokens_per_s        tokens per second, every GPU's;  perf/tokens_per_s_per_gpu  the same per GPU
    perf/completion_tokens_per_s   completion tokens per second
    perf/mfu                 model FLOPs utilisation, a fraction (a framework's percent is divided by 100)
    perf/trainer_wait_share  share of the trainer's step spent waiting for samples (async RL)

Keys are matched as `keys.normalize_key` leaves them, so with transformers' (and OpenRLHF's, slime's,
prime-rl's) `train/` prefix already stripped. A framework is told from the keys a run logs (`detect`), and
only its own table is applied: `entropy_loss` is OpenRLHF's and slime's entropy, but nothing says the same of
a key of that name in another tool's log.
A key no table names is kept as it is, and can be charted like any other.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache

# framework -> {source key (or "re:" + a pattern matched whole): canonical key}. Each table was read in the
# framework's own source at the commit named; when two of a table's keys name the same concept, the one listed
# first wins (`KeyMapping.renames`).
TABLES: dict[str, dict[str, str]] = {
    "carl": {},  # our own runs write the vocabulary itself (they train through TRL)
    # trl/trainer/grpo_trainer.py (TRL 1.16): the vocabulary itself, but for its step time (training_step's
    # seconds, the mean of the steps since the last log). Its async GRPO (trl/experimental/async_grpo/
    # async_grpo_trainer.py, _log_step_metrics): perf/step_s between step ends, tokens through the model
    # (prompt and completion) and trained (completion) per second of it, perf/mfu_wall_clock in percent, and
    # perf/fwd_bwd_s (forward and backward, the optimizer step apart); before 1.16 it logged training_tok/s,
    # completion tokens per second. `num_tokens` (cumulative) gives perf/tokens_per_s in runkeys.py.
    "trl": {
        "step_time": "perf/step_time_s",
        "perf/step_s": "perf/step_time_s",
        "perf/forwarded_tok_s_wall_clock": "perf/tokens_per_s",
        "perf/trained_tok_s_wall_clock": "perf/completion_tokens_per_s",
        "training_tok/s": "perf/completion_tokens_per_s",
        "perf/fwd_bwd_s": "perf/time/update_s",
        "perf/mfu_wall_clock": "perf/mfu",
        # The sampler against the learner (grpo_trainer.py, _generate_and_score_completions, with vLLM and
        # vllm_importance_sampling_correction): |old_per_token_logps - sampling_per_token_logps| over the
        # completion tokens, and the importance ratio exp(old - sampling) as applied (truncated or masked at
        # vllm_importance_sampling_clip_min/max). Async GRPO (async_grpo_trainer.py, the rollout queue's
        # iterator): each sample's staleness (model versions behind), the mean and the max over the log, and
        # the samples dropped past max_staleness, summed over the log (`_reduce_metric`: a "total" is a sum).
        "sampling/sampling_logp_difference/mean": "mismatch/logprob_abs_diff/mean",
        "sampling/sampling_logp_difference/max": "mismatch/logprob_abs_diff/max",
        "sampling/importance_sampling_ratio/mean": "mismatch/is_ratio/mean",
        "sampling/importance_sampling_ratio/min": "mismatch/is_ratio/min",
        "sampling/importance_sampling_ratio/max": "mismatch/is_ratio/max",
        "sample/staleness_mean": "staleness/mean",
        "sample/staleness_max": "staleness/max",
        "sample/dropped_stale_total": "off_policy/dropped",
    },
    # volcengine/verl b178a3cd: verl/trainer/ppo/metric_utils.py (compute_data_metrics: critic/score/*,
    # response_length/*), verl/trainer/ppo/core_algos.py (compute_policy_loss: actor/pg_clipfrac is either
    # side, actor/pg_clipfrac_lower is the dual clip and stays), verl/workers/actor/dp_actor.py
    # (actor/entropy, actor/kl_loss, actor/pg_loss, actor/grad_norm), verl/workers/fsdp_workers.py (actor/lr).
    "verl": {
        "actor/entropy": "entropy",
        "critic/score/mean": "reward",
        "actor/kl_loss": "kl",
        "actor/ppo_kl": "policy_kl",
        "actor/pg_clipfrac": "clip_ratio/region_mean",
        "response_length/mean": "completions/mean_length",
        "response_length/min": "completions/min_length",
        "response_length/max": "completions/max_length",
        "response_length/clip_ratio": "completions/clipped_ratio",
        "actor/grad_norm": "grad_norm",
        "actor/lr": "learning_rate",
        "actor/pg_loss": "loss",
        # verl/trainer/ppo/ray_trainer.py (marked_timer: step, gen, reward, update_actor), metric_utils.py
        # (compute_timing_metrics: timing_s/<name>; compute_throughout_metrics: perf/time_per_step, the same
        # step time, and perf/throughput = every token of the batch / (step time x GPUs): per GPU),
        # workers/fsdp_workers.py (perf/mfu/actor: the actor update's, a fraction).
        "timing_s/step": "perf/step_time_s",
        "perf/time_per_step": "perf/step_time_s",
        "timing_s/gen": "perf/time/generation_s",
        "timing_s/reward": "perf/time/scoring_s",
        "timing_s/update_actor": "perf/time/update_s",
        "perf/throughput": "perf/tokens_per_s_per_gpu",
        "perf/mfu/actor": "perf/mfu",
        # verl-project/verl 1dda039b (where volcengine/verl moved): verl/trainer/ppo/rollout_corr_helper.py
        # compute_offpolicy_metrics, logged as rollout_corr/<name>: k3_kl = mean(ρ - log ρ - 1) with
        # ρ = π_old / π_rollout, kl = mean(log π_rollout - log π_old), both KL(rollout ‖ old) per token
        # (π_old: the learner's recompute in decoupled mode; in bypass mode the policy being updated);
        # compute_is_metrics: rollout_is_* are the IS weights as applied (truncated).
        # verl/utils/debug/metrics.py calculate_debug_metrics: training/rollout_probs_diff_* are |p_old -
        # p_rollout| on probabilities (it exponentiates first, whatever calculate_log_prob_diff's name says),
        # and the probabilities' Pearson correlation. verl/trainer/ppo/v1/trainer_base.py:
        # training/off_policy/trajectory_staleness/* = (global_steps - 1) - the newest model version a
        # trajectory used; v1/replay_buffer.py: training/off_policy/evicted_samples, the groups dropped past
        # max_off_policy_threshold in the step. metric_utils.py: response/aborted_ratio, the share of
        # responses of length 0. experimental/fully_async_policy/ (detach_utils.py, fully_async_trainer.py,
        # fully_async_rollouter.py): fully_async/count/* are running totals; stale_samples_processed
        # (b178a3cd) became stale_trajectory_processed (x rollout.n); fully_async/trainer/idle_ratio =
        # timing_s/gen / timing_s/step, trainer/idle_ratio at b178a3cd.
        "rollout_corr/k3_kl": "mismatch/kl",
        "rollout_corr/kl": "mismatch/kl",
        "training/rollout_probs_diff_mean": "mismatch/prob_abs_diff/mean",
        "training/rollout_probs_diff_max": "mismatch/prob_abs_diff/max",
        "training/rollout_probs_diff_std": "mismatch/prob_abs_diff/std",
        "training/rollout_actor_probs_pearson_corr": "mismatch/prob_corr",
        "rollout_corr/rollout_is_mean": "mismatch/is_ratio/mean",
        "rollout_corr/rollout_is_min": "mismatch/is_ratio/min",
        "rollout_corr/rollout_is_max": "mismatch/is_ratio/max",
        "training/off_policy/trajectory_staleness/mean": "staleness/mean",
        "training/off_policy/trajectory_staleness/max": "staleness/max",
        "training/off_policy/evicted_samples": "off_policy/dropped",
        "fully_async/count/dropped_stale_samples": "off_policy/dropped_total",
        "fully_async/count/stale_samples_processed": "off_policy/stale_total",
        "fully_async/count/stale_trajectory_processed": "off_policy/stale_total",
        "response/aborted_ratio": "completions/aborted_ratio",
        "fully_async/trainer/idle_ratio": "perf/trainer_wait_share",
        "trainer/idle_ratio": "perf/trainer_wait_share",
    },
    # OpenRLHF/OpenRLHF 3c3be623: openrlhf/trainer/ray/ppo_actor.py (training_step: entropy_loss is the
    # token-mean entropy, not a loss; policy_loss, actor_grad_norm, actor_lr, ppo_kl, ppo_clip_ratio),
    # openrlhf/models/loss.py (PolicyLoss: the clip ratio counts either side), openrlhf/trainer/ppo_utils/
    # experience.py (response_length, truncated), experience_maker.py (reward, kl, return).
    # Logged as train/<key>.
    "openrlhf": {
        "entropy_loss": "entropy",
        "ppo_kl": "policy_kl",
        "ppo_clip_ratio": "clip_ratio/region_mean",
        "response_length": "completions/mean_length",
        "truncated": "completions/clipped_ratio",
        "actor_grad_norm": "grad_norm",
        "actor_lr": "learning_rate",
        "policy_loss": "loss",
        # openrlhf/models/loss.py PolicyLoss (with vLLM IS correction): vllm_kl = mean(log π_rollout - log
        # π_old), the k1 estimate of KL(rollout ‖ old). Not logprobs_diff: ppo_actor.py and
        # experience_maker.py compute it as log π_actor - log π_ref, against the reference model, so it keeps
        # its name.
        "vllm_kl": "mismatch/kl",
    },
    # PrimeIntellect-ai/prime-rl 559b4477: src/prime_rl/trainer/rl/train.py (entropy/all, mismatch_kl/all,
    # loss, optim/*), src/prime_rl/trainer/rl/loss.py (is_masked_{low,high}: DPPO's masked tokens, its clip),
    # src/prime_rl/orchestrator/metrics.py and orchestrator.py (train/agg/{all,effective}/<agent>/...).
    "prime-rl": {
        "entropy/all/mean": "entropy",
        r"re:agg/effective/[^/]+/reward/mean": "reward",
        # trainer/rl/loss.py compute_importance_ratio_and_mismatch_kl(trainer_logprobs, inference_logprobs):
        # ρ - log ρ - 1 with ρ = π_trainer / π_inference, the k3 estimate of KL(inference ‖ trainer) on the
        # tokens the inference server sampled: the sampler against the learner, not PPO's step.
        "mismatch_kl/all/mean": "mismatch/kl",
        "is_masked_low/mean": "clip_ratio/low_mean",
        "is_masked_high/mean": "clip_ratio/high_mean",
        "is_masked/mean": "clip_ratio/region_mean",
        "agg/effective/num_output_tokens/mean": "completions/mean_length",
        "agg/effective/num_output_tokens/min": "completions/min_length",
        "agg/effective/num_output_tokens/max": "completions/max_length",
        r"re:agg/effective/[^/]+/is_truncated/mean": "completions/clipped_ratio",
        "optim/grad_norm": "grad_norm",
        "optim/lr": "learning_rate",
        "loss/mean": "loss",
        # src/prime_rl/trainer/rl/train.py: the trainer's tokens (every data-parallel rank's) per second of
        # its forward and backward, the same per GPU, MFU in percent (trainer/perf.py), time/step and
        # time/forward_backward; the orchestrator (orchestrator/orchestrator.py) logs a time/step of its own.
        "perf/throughput": "perf/tokens_per_s",
        "perf/throughput_per_gpu": "perf/tokens_per_s_per_gpu",
        "perf/mfu": "perf/mfu",
        "time/step": "perf/step_time_s",
        "time/forward_backward": "perf/time/update_s",
        # orchestrator/orchestrator.py (the shipped batch): off_policy/mean and /max are staleness in steps
        # (orchestrator/utils.py episode_staleness: the version the batch trains on minus the one that
        # generated the episode); off_policy/dropped, the queued traces voided past max_off_policy_steps since
        # the last batch, is already the canonical name.
        "off_policy/mean": "staleness/mean",
        "off_policy/max": "staleness/max",
    },
    # NovaSky-AI/SkyRL a9564572: skyrl/train/trainer.py (policy/<worker status>, reward/avg_raw_reward,
    # loss/avg_kl: the KL in the reward), skyrl/backends/skyrl_train/workers/worker.py (policy_entropy,
    # policy_kl: the KL loss, policy_lr, policy_loss), skyrl/backends/skyrl_train/utils/ppo_utils.py (the clip
    # ratio counts either side), skyrl/train/generators/utils.py (generate/*_num_tokens).
    "skyrl": {
        "policy/policy_entropy": "entropy",
        "reward/avg_raw_reward": "reward",
        "policy/policy_kl": "kl",
        "loss/avg_kl": "kl",
        "policy/loss_metrics/clip_ratio": "clip_ratio/region_mean",
        "generate/avg_num_tokens": "completions/mean_length",
        "generate/min_num_tokens": "completions/min_length",
        "generate/max_num_tokens": "completions/max_length",
        "policy/grad_norm": "grad_norm",
        "policy/policy_lr": "learning_rate",
        "policy/policy_loss": "loss",
        # skyrl/train/trainer.py (Timer: step, generate, train_critic_and_policy, logged as timing/<name>;
        # trainer/tokens_per_second_per_gpu = the training batch's tokens / (its training time x GPUs)).
        "timing/step": "perf/step_time_s",
        "timing/generate": "perf/time/generation_s",
        "timing/train_critic_and_policy": "perf/time/update_s",
        "trainer/tokens_per_second_per_gpu": "perf/tokens_per_s_per_gpu",
        # skyrl/train/trainer.py: |rollout_logprobs - action_log_probs| over the response tokens;
        # skyrl/train/fully_async_trainer.py: each group's staleness = global_step - the step it was scheduled
        # at, its share above 0, and the groups past max_staleness_steps (logged, not dropped).
        "policy/rollout_train_logprobs_abs_diff_mean": "mismatch/logprob_abs_diff/mean",
        "policy/rollout_train_logprobs_abs_diff_max": "mismatch/logprob_abs_diff/max",
        "policy/rollout_train_logprobs_abs_diff_std": "mismatch/logprob_abs_diff/std",
        "async/staleness_mean": "staleness/mean",
        "async/staleness_max": "staleness/max",
        "async/staleness_ratio": "off_policy/share",
        "async/staleness_violation_count": "staleness/violations",
    },
    # inclusionAI/AReaL 4aef98d8: areal/trainer/ppo/actor.py (ppo_update under the ppo_actor scope, its loss
    # stats under update/), areal/utils/stats_tracker.py (export adds /avg /min /max), areal/utils/functional/
    # functional.py (clip_mask counts either side), areal/engine/fsdp_engine.py (train_batch: grad_norm, lr).
    "areal": {
        "ppo_actor/update/entropy/avg": "entropy",
        "ppo_actor/task_reward/avg": "reward",
        "ppo_actor/update/approx_kl/avg": "policy_kl",
        "ppo_actor/update/clip_ratio/avg": "clip_ratio/region_mean",
        "ppo_actor/no_eos_ratios/avg": "completions/clipped_ratio",
        "ppo_actor/update/grad_norm": "grad_norm",
        "ppo_actor/update/lr": "learning_rate",
        "ppo_actor/update/actor_loss/avg": "loss",
        # areal/utils/functional/functional.py (with rejection_sampling): behave_approx_kl = log π_prox -
        # log π_behave, whose mean under the behaviour policy is -KL(behave ‖ prox): its sign is turned where
        # it takes the canonical name (SCALES); behave_imp_weight = π_prox / π_behave.
        # areal/trainer/ppo/actor.py _log_version_staleness_stats: (current version - 1) - the token's
        # behaviour version, the lag behind the last weights broadcast (0 when synchronous).
        "ppo_actor/update/behave_approx_kl/avg": "mismatch/kl",
        "ppo_actor/update/behave_imp_weight/avg": "mismatch/is_ratio/mean",
        "ppo_actor/update/behave_imp_weight/min": "mismatch/is_ratio/min",
        "ppo_actor/update/behave_imp_weight/max": "mismatch/is_ratio/max",
        "ppo_actor/update/version_stats/sample_staleness_proximal_avg": "staleness/mean",
        "ppo_actor/update/version_stats/sample_staleness_proximal_max": "staleness/max",
    },
    # THUDM/slime 624b824a: slime/backends/megatron_utils/loss.py (reported_loss: entropy_loss is the entropy,
    # pg_clipfrac either side, ppo_kl, kl_loss), slime/backends/megatron_utils/model.py (train/<key>,
    # train/grad_norm, train/lr-pg_<group>; it logs train/loss too, so pg_loss keeps its name), slime/ray/
    # rollout.py and slime/observability/train_metric_utils.py (rollout/<field>: raw_reward, response_lengths,
    # truncated).
    "slime": {
        "entropy_loss": "entropy",
        "rollout/raw_reward": "reward",
        "kl_loss": "kl",
        "ppo_kl": "policy_kl",
        "pg_clipfrac": "clip_ratio/region_mean",
        "rollout/response_lengths": "completions/mean_length",
        "rollout/truncated": "completions/clipped_ratio",
        "lr-pg_0": "learning_rate",
        # slime/observability/train_metric_utils.py (log_perf_data: perf/<timer>_time; perf/step_time = the
        # trainer's wait + train; perf/actor_train_tok_per_s = the rollout batch's tokens / the train time)
        # and rollout_metrics.py (perf/rollout_time: generating the rollout, its rewards included).
        "perf/step_time": "perf/step_time_s",
        "perf/rollout_time": "perf/time/generation_s",
        "perf/actor_train_time": "perf/time/update_s",
        "perf/actor_train_tok_per_s": "perf/tokens_per_s",
        "perf/wait_time_ratio": "perf/trainer_wait_share",  # train_metric_utils.py: wait / (wait + train)
        # slime/backends/megatron_utils/loss.py: train_rollout_logprob_abs_diff, the mean |log π - log
        # π_rollout| (π: the recomputed old policy, or the current one with use_rollout_logprobs); tis = π_old
        # / π_rollout before its clamp (with use_tis or get_mismatch_metrics).
        "train_rollout_logprob_abs_diff": "mismatch/logprob_abs_diff/mean",
        "tis": "mismatch/is_ratio/mean",
    },
}
# framework -> {source key: factor}: a value whose unit is not the canonical one, converted where it takes the
# canonical name (MFU in percent becomes a fraction; a KL logged with the other sign is turned).
SCALES: dict[str, dict[str, float]] = {
    "trl": {"perf/mfu_wall_clock": 0.01},  # trl/trainer/utils.py compute_mfu: "MFU as a percentage"
    "prime-rl": {"perf/mfu": 0.01},  # src/prime_rl/trainer/perf.py _mfu_from_tps: 100 * ...
    # areal/utils/functional/functional.py: behave_approx_kl = log π_prox - log π_behave estimates -KL
    "areal": {"ppo_actor/update/behave_approx_kl/avg": -1.0},
}

# Keys (or prefixes, ending in "/") that tell a framework: a run is told by the most of them it has. `carl`
# wins on any one of its own, since our runs also log TRL's keys.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "carl": ("cascade/multiplier", "phi/p10", "phi/p90"),
    "trl": (
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "completions/mean_terminated_length",
        "frac_reward_zero_std",
        "num_tokens",
    ),
    "verl": (
        "actor/",
        "critic/",
        "timing_s/",
        "response_length/",
        "perf/time_per_step",
        "rollout_corr/",
        "fully_async/",
    ),
    "openrlhf": ("actor_grad_norm", "actor_lr", "ppo_clip_ratio", "return", "logprobs_diff"),
    "prime-rl": ("entropy/all/", "mismatch_kl/all/", "optim/", "agg/", "time/wait_for_batch"),
    "skyrl": (
        "policy/policy_entropy",
        "policy/policy_loss",
        "reward/avg_raw_reward",
        "loss/avg_kl",
        "generate/avg_num_tokens",
        "async/staleness_mean",
    ),
    "areal": ("ppo_actor/", "ppo_actor/update/approx_kl/avg", "ppo_actor/update/dual_clip_ratio/avg"),
    "slime": (
        "pg_clipfrac",
        "pg_loss",
        "train_rollout_logprob_abs_diff",
        "rollout/raw_reward",
        "rollout/response_lengths",
    ),
}
DECISIVE = frozenset({"carl"})
NAMES = {
    "carl": "carl",
    "trl": "TRL",
    "verl": "veRL",
    "openrlhf": "OpenRLHF",
    "prime-rl": "prime-rl",
    "skyrl": "SkyRL",
    "areal": "AReaL",
    "slime": "slime",
}
MEMO_LIMIT = 10_000  # a source with endless distinct keys cannot grow a memo without bound


def detect(keys: Iterable[str]) -> str | None:
    """The framework whose signature the keys match best (at least one match; ties go to the earlier one in
    SIGNATURES; a decisive framework wins on one match), or None."""
    keys = set(keys)
    prefixes = {k[: i + 1] for k in keys for i, c in enumerate(k) if c == "/"}
    best, best_hits = None, 0
    for framework, marks in SIGNATURES.items():
        hits = sum(1 for mark in marks if mark in (prefixes if mark.endswith("/") else keys))
        if hits and framework in DECISIVE:
            return framework
        if hits > best_hits:
            best, best_hits = framework, hits
    return best


@dataclass(frozen=True)
class Table:
    """A framework's table, compiled: exact names, then patterns, each with its rank
    (its place in the table)."""

    exact: dict[str, tuple[int, str]]
    patterns: list[tuple[int, re.Pattern[str], str]]

    def lookup(self, key: str) -> tuple[int, str] | None:
        found = self.exact.get(key)
        if found is not None:
            return found
        return next(((rank, name) for rank, pattern, name in self.patterns if pattern.fullmatch(key)), None)


@cache
def compiled(framework: str | None) -> Table:
    exact: dict[str, tuple[int, str]] = {}
    patterns: list[tuple[int, re.Pattern[str], str]] = []
    for rank, (key, name) in enumerate(TABLES.get(framework or "", {}).items()):
        if key.startswith("re:"):
            patterns.append((rank, re.compile(key[3:]), name))
        else:
            exact[key] = (rank, name)
    return Table(exact, patterns)


@dataclass
class KeyMapping:
    """One run's key map: `canonical(key)` renames what its framework's table names and keeps the rest.

    A canonical name goes to one source key only: the one the run already renamed to it (`claimed`, as stored
    in run_keys), else the first met. Another key of the same concept keeps its own name, so nothing is lost.
    """

    framework: str | None
    claimed: dict[str, str] = field(default_factory=dict)  # canonical -> source key, from earlier batches
    renamed: dict[str, str] = field(default_factory=dict)  # canonical -> source key, as met
    _memo: dict[str, str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.table = compiled(self.framework)
        self.claimed = dict(self.claimed)

    def canonical(self, key: str) -> str:
        found = self._memo.get(key)
        if found is not None:
            return found
        hit = self.table.lookup(key)
        name = key
        if hit is not None and self.claimed.setdefault(hit[1], key) == key:
            name = hit[1]
            self.renamed[name] = key
        if len(self._memo) < MEMO_LIMIT:
            self._memo[key] = name
        return name

    def renames(self, names: Iterable[str]) -> dict[str, str]:
        """{name: canonical} for those of a batch's distinct names that this run renames.

        Decided in the table's order, so of two keys for one concept the one listed first wins whatever order
        they come in; a canonical name the batch logs itself under that name is left to it."""
        names = set(names)
        hits = []
        for key in names:
            if key not in self._memo:
                hit = self.table.lookup(key)
                if hit is None:
                    continue
                if hit[1] in names:
                    self.claimed.setdefault(hit[1], hit[1])  # the run logs it under that name itself
                hits.append((hit[0], key))
        for _, key in sorted(hits):
            self.canonical(key)
        return {key: name for key in names if (name := self._memo.get(key, key)) != key}

    def take_renamed(self) -> dict[str, str]:
        """The renames met since the last call (for Store.set_key_names)."""
        taken, self.renamed = self.renamed, {}
        return taken


def scale_factors(framework: str | None, renames: dict[str, str], names: Iterable[str]) -> dict[str, float]:
    """{stored name: factor} for a batch's `names` (before `renames`) whose values change unit: those of
    SCALES that take their canonical name (renamed, or logged under it), never a key left under its own."""
    table = TABLES.get(framework or "", {})
    out = {}
    for key in names:
        factor = SCALES.get(framework or "", {}).get(key)
        if factor is not None and renames.get(key, key) == table[key]:
            out[table[key]] = factor
    return out


def mapping_for(keys: Iterable[str], framework: str | None = None) -> KeyMapping:
    """A run's key map: for its stored framework when it has one, else for the one its keys tell."""
    return KeyMapping(framework if framework is not None else detect(keys))
