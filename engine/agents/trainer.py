"""Training the served model from the plane's rollouts: GRPO through a LoRA adapter on the same base.

The published loop (docs/reference/agents-plane.md §7) took one log-prob per batch and a ratio against the
frozen reference, so the reward had no gradient. Here (docs/reference/agents-plane.md §12 rule 5) every sample
keeps its own per-token log-probs; the importance ratio compares the current policy with the behaviour policy,
the one that sampled the tokens (the log-probs the worker sent with the rollout), so rollouts from an
older adapter are still trained, importance-corrected; the reference (the base, adapter
disabled) appears only in the KL term. The adapter trains on the model the workers serve, with
the same target modules (docs/reference/agents-plane.md §12 rule 6), and every `publish_every` steps it is
written to disk and described by a `ModelUpdateEvent` carrying the base's fingerprint; the caller puts it in
the plane's object store and publishes the update (weights.publish_update), so workers on any machine load it.

A rollout with a hint (the manager's, engine/agents/hints.py) also learns by on-policy distillation when
`train.opd` is on (engine/training/opd.py, as OpenClaw-RL publishes it): one more no-grad forward scores its
own sampled tokens with the hint in the policy's context (the teacher), and each token's advantage gains
w_opd · clip(teacher − student). A rollout without a hint, or a run without OPD, trains exactly as before.

Rollouts are grouped by `group_id`. A group trains once it has `group_size` members, or, after
waiting `group_timeout_s`, with the two or more it has; a lone straggler is dropped and counted.
(The published trainer waited forever for groups that could never fill.)

The run reports like any training run: metrics, Phi per step and samples through `Reporter`, and
the control room's commands through `CommandPump` at every step boundary. Nothing here knows
about NATS; the caller feeds `add` and publishes what `step` returns.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine import paths
from engine.coherence.phi import completion_token_stats
from engine.coherence.summary import pick_traces, step_phi_stats
from engine.errors import CarlError
from engine.store import Store
from engine.store.agent_audit import record_task_opd
from engine.store.rollouts import pack_half
from engine.training import grpo, opd
from engine.training.backend import SAVE_TOTAL_LIMIT, CommandPump, Reporter, StepRecord, TrainingFailed
from engine.training.step_rollouts import TokenTexts

from .events import ModelUpdateEvent, TrainingRolloutEvent
from .plane_settings import TrainerSettings
from .policy import BASE_VERSION, LocalPolicy, PackedBatch, forward, response_logprobs
from .spool import RolloutSpool

ROLLOUTS_PER_STEP = 64  # a step's samples kept as rollout rows (the rollouts viewer's)
GROUP_TIMEOUT_S = 600.0  # a group still incomplete after this trains with what it has (>= 2) or is dropped
MAX_GRAD_NORM = 1.0
REMEMBERED = 100_000  # task and group ids kept to refuse duplicates (oldest forgotten first)
STATE_FILE = "trainer_state.json"  # written last: a checkpoint without it is incomplete
ADAPTER_DIR = "adapter"
OPTIMIZER_FILE = "optimizer.pt"
log = logging.getLogger("carl.agents")


def adapters_dir(home: Path) -> Path:
    """Where published adapters live, one directory per version: what workers load."""
    path = home / "agents" / "adapters"
    path.mkdir(parents=True, exist_ok=True)
    return path


class TrainerError(CarlError):
    """The trainer cannot do what was asked: one line."""


@dataclass
class _Group:
    group_id: str
    size: int
    first_seen: float
    rollouts: list[TrainingRolloutEvent] = field(default_factory=list)
    timed_out: bool = False

    @property
    def complete(self) -> bool:
        return len(self.rollouts) >= self.size


@dataclass(frozen=True)
class _Prepared:
    """What `PlaneTrainer.prepare` made and the steps use: the served model's policy, and the run's
    reporter, command pump and rollout spool."""

    policy: LocalPolicy
    reporter: Reporter
    pump: CommandPump
    spool: RolloutSpool


class _Controls:
    """What the command pump may ask of the trainer at a step boundary."""

    def __init__(self, trainer: PlaneTrainer) -> None:
        self.trainer = trainer

    def request_save(self) -> None:
        self.trainer._save_requested = True

    def request_stop(self) -> None:
        self.trainer._stop_requested = True

    def set_lr(self, lr: float) -> None:
        for group in self.trainer.optimizer.param_groups:
            group["lr"] = lr

    def set_weight(self, reward: str, weight: float) -> str:
        raise TrainerError(
            "set_weight: the agents trainer has no reward weights (each rollout brings its reward)"
        )


class _Remembered:
    """A bounded set: the newest REMEMBERED ids."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self.limit = limit
        self.ids: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> None:
        self.ids[key] = None
        if len(self.ids) > self.limit:
            self.ids.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self.ids


class PlaneTrainer:
    """GRPO on the plane's rollouts, one optimizer step per `groups_per_update` ready groups."""

    def __init__(
        self,
        settings: TrainerSettings,
        *,
        model: str,
        home: Path,
        store: Store,
        run_name: str = "agents-train",
        temperature: float,
        group_timeout_s: float = GROUP_TIMEOUT_S,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        system_prompt: str | None = None,
        publish_target: str | None = None,
    ) -> None:
        if not temperature > 0:
            raise TrainerError(f"temperature must be > 0, got {temperature}")
        self.settings = settings
        self.model_name = model
        self.home = Path(home)
        self.store = store
        self.run_name = run_name
        self.temperature = float(temperature)
        self.group_timeout_s = group_timeout_s
        self.seed = seed
        self.publish_target = publish_target  # the updates' target_worker_id (the manager's model: "manager")
        self.system_prompt = system_prompt  # the workers' instruction: the teacher's context is built with it
        self.clock = clock  # group ages
        self.sleep = sleep  # how a paused run waits between looks at its command queue
        self.rng = np.random.default_rng(seed)  # which sample is the step's "random" trace
        self.global_step = 0
        self.versions = [BASE_VERSION]  # published so far, oldest first: staleness counts positions here
        self.groups: dict[str, _Group] = {}
        self.dropped = 0  # groups given up with fewer than 2 rollouts
        self.refused = 0
        self.finished = False
        self._dropped_since_step = 0
        self._seen_tasks = _Remembered()
        self._closed_groups = _Remembered()  # trained or dropped: a late member is refused
        self._save_requested = False
        self._stop_requested = False
        self._last_checkpoint: tuple[int, Path] | None = None
        self.policy: LocalPolicy | None = None
        self.model: Any = None
        self.optimizer: Any = None
        self.reporter: Reporter | None = None
        self.pump: CommandPump | None = None
        self.spool: RolloutSpool | None = None  # the rollouts taken, stored until a checkpoint holds them
        self.run_id = 0
        self.output_dir = Path()
        self.fingerprint = ""
        self.vocab_size = 0
        self._token_texts = TokenTexts(self._decode)  # each token id decoded once, for every step's rows

    # -- prepare and resume ----------------------------------------------------------------------

    def prepare(self, *, reopen: bool = False) -> None:
        """Load the served model with a fresh LoRA adapter, the optimizer, and the run in the store.

        reopen: carry on the newest agents run called `run_name` (a restarted trainer process, then
        `resume()`); otherwise a new run is created (a taken name gets a numeric suffix).
        """
        import torch

        settings = self.settings
        self.policy = LocalPolicy.load(self.model_name, self.home, seed=self.seed)
        self.fingerprint = self.policy.fingerprint
        self.vocab_size = self.policy.vocab_size
        self.model = self.policy.attach_trainable_lora(
            r=settings.lora_r,
            alpha=settings.lora_alpha,
            target_modules=settings.target_modules,
            seed=self.seed,
        )
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate)
        self.run_id = self._open_run(reopen)
        self.spool = RolloutSpool(self.store, self.run_id)
        self.reporter = Reporter(self.store, self.run_id)
        self.pump = CommandPump(self.store, self.run_id, self.reporter, sleep=self.sleep)

    def _open_run(self, reopen: bool) -> int:
        config = {
            **self.settings.model_dump(),
            "temperature": self.temperature,
            "group_timeout_s": self.group_timeout_s,
            "seed": self.seed,
        }
        existing = self.store.run_id_by_name(self.run_name) if reopen else None
        if existing is not None and (self.store.run(existing) or {}).get("source_kind") == "agents":
            run_id = existing
            self.store.update_run(
                run_id,
                status="running",
                error=None,
                ended_at=None,
                config=config,
                model=self.model_name,
                max_steps=self.settings.max_updates,
            )
        else:
            run_id = self.store.create_run(
                self.run_name,
                source_kind="agents",
                backend="torch",
                model=self.model_name,
                vocab_size=self.vocab_size,
                max_steps=self.settings.max_updates,
                config=config,
            )
        # The store may have suffixed the name; versions and directories follow the run's real name,
        # so two runs never write the same adapter.
        self.run_name = str((self.store.run(run_id) or {})["name"])
        self.output_dir = paths.runs_dir(self.home) / self.run_name
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.store.update_run(
            run_id,
            output_dir=str(self.output_dir),
            temperature=self.temperature,
            pid=os.getpid(),
            vocab_size=self.vocab_size,
        )
        return run_id

    def resume(self) -> int:
        """Load adapter, optimizer and step from the run's newest complete checkpoint; the step (0: none).

        What the run logged after that step is forgotten in the store: those steps happen again.
        """
        import torch
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        prepared = self._require_prepared()
        found = newest_checkpoint(self.output_dir)
        if found is None:
            self.store.truncate_run_after(self.run_id, 0)  # every step it logged happens again
            self._restore_rollouts(0)
            return 0
        step, path = found
        state = json.loads((path / STATE_FILE).read_text())
        weights = load_file(
            str(path / ADAPTER_DIR / "adapter_model.safetensors"), device=prepared.policy.device
        )
        result = set_peft_model_state_dict(self.model, weights)
        if getattr(result, "unexpected_keys", None):
            raise TrainerError(f"{path}: the checkpoint's adapter does not fit this model")
        self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
        self.global_step = int(state["step"])
        self.versions = list(state["versions"])
        self._last_checkpoint = (step, path)
        self.store.truncate_run_after(self.run_id, step)
        prepared.reporter.event(step, "resume", str(path))
        self._restore_rollouts(step)
        return step

    # -- rollouts in -----------------------------------------------------------------------------

    def add(self, rollout: TrainingRolloutEvent) -> str | None:
        """Buffer a rollout in its group; or, when it cannot train the served model, the reason (one line)."""
        reason = self._refusal(rollout)
        if reason is not None:
            self.refused += 1
            return reason
        group_id = str(rollout.group_id)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = _Group(group_id, rollout.group_size, self.clock())
        group.rollouts.append(rollout)
        self._seen_tasks.add(rollout.task_id)
        return None

    def keep(self, rollouts: Sequence[TrainingRolloutEvent]) -> None:
        """Store rollouts `add` took (the spool) before the caller acknowledges them on the stream: from
        then on a killed trainer loses none of them (its restart reads them back, `resume`)."""
        self._require_prepared().spool.keep(rollouts)

    def _restore_rollouts(self, step: int) -> None:
        """After a resume from the checkpoint at `step`: the rollouts stored and not trained by a step that
        checkpoint holds are buffered again, in their groups (a group's age counts from its first rollout's
        arrival); those trained or given up are remembered, so a redelivered one is refused."""
        spool = self._require_prepared().spool
        rewound = spool.rewind(step)
        for task_id, group_id in spool.closed():
            self._seen_tasks.add(task_id)
            self._closed_groups.add(group_id)
        waiting = spool.waiting()
        now, refused = time.time(), []
        for rollout, received in waiting:
            if self.add(rollout) is not None:  # it cannot train this run any more (its settings changed)
                refused.append(rollout.task_id)
                continue
            group = self.groups[str(rollout.group_id)]
            group.first_seen = min(group.first_seen, self.clock() - max(0.0, now - received))
        if refused:
            spool.dropped(refused)
        if waiting or rewound:
            log.info(
                "trainer: %d stored rollouts back in their groups (%d to train again), %d refused",
                len(waiting) - len(refused),
                rewound,
                len(refused),
            )

    def _record_used(self, step: int, groups: list[_Group]) -> None:
        """The step's rollouts, marked with it (before the step's checkpoint is written)."""
        checkpointed = self._last_checkpoint[0] if self._last_checkpoint is not None else None
        self._require_prepared().spool.used(
            step, [r.task_id for g in groups for r in g.rollouts], checkpointed=checkpointed
        )

    def _refusal(self, r: TrainingRolloutEvent) -> str | None:
        task = f"task {r.task_id}"
        if r.task_id in self._seen_tasks:
            return f"{task}: a duplicate (its rollout is already in)"
        if r.group_id is None or r.group_size < 2:
            return f"{task}: a group of size 1 has no advantage to learn from"
        if not r.prompt_token_ids or not r.response_token_ids or not r.token_logprobs:
            return f"{task}: no token ids or log-probs (not sampled by a local model)"
        if len(r.response_token_ids) != len(r.token_logprobs):
            return (
                f"{task}: {len(r.response_token_ids)} response tokens but {len(r.token_logprobs)} log-probs"
            )
        if r.temperature is None or not math.isclose(r.temperature, self.temperature, rel_tol=1e-6):
            return (
                f"{task}: sampled at temperature {r.temperature}, the trainer trains at {self.temperature:g}"
            )
        if not all(math.isfinite(lp) and lp <= 1e-6 for lp in r.token_logprobs):
            return f"{task}: log-probs must be finite and <= 0"
        ids = [*r.prompt_token_ids, *r.response_token_ids]
        if self.vocab_size and not all(0 <= i < self.vocab_size for i in ids):
            return f"{task}: token ids outside the model's vocabulary of {self.vocab_size}"
        context = self.policy.context if self.policy is not None else 0
        if context and len(ids) > context:
            return f"{task}: {len(ids)} tokens, more than the model's context of {context}"
        if r.group_id in self._closed_groups:
            return f"{task}: group {r.group_id} was already trained or dropped"
        group = self.groups.get(r.group_id)
        if group is not None and group.complete:
            return f"{task}: group {r.group_id} already has its {group.size} rollouts"
        return None

    def ready(self) -> int:
        """Groups ready to train now (complete, or timed out with >= 2); lone stragglers are dropped."""
        now = self.clock()
        for group_id, group in list(self.groups.items()):
            if group.complete or now - group.first_seen <= self.group_timeout_s:
                continue
            if len(group.rollouts) >= 2:
                group.timed_out = True
            else:
                del self.groups[group_id]
                self._closed_groups.add(group_id)
                self.dropped += 1
                self._dropped_since_step += 1
                if self.spool is not None:
                    self.spool.dropped(r.task_id for r in group.rollouts)
        return sum(1 for g in self.groups.values() if g.complete or g.timed_out)

    def _take_ready(self) -> list[_Group]:
        if self.ready() < self.settings.groups_per_update:
            return []
        ready = sorted(
            (g for g in self.groups.values() if g.complete or g.timed_out), key=lambda g: g.first_seen
        )
        taken = ready[: self.settings.groups_per_update]
        for group in taken:
            del self.groups[group.group_id]
            self._closed_groups.add(group.group_id)
        return taken

    # -- the step --------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Stopped by a command, or `max_updates` reached: `step` trains no more."""
        return self.finished or self._stop_requested

    @property
    def paused(self) -> bool:
        return self.pump is not None and self.pump.paused

    def poll(self) -> None:
        """Apply queued commands now, without training (for a trainer waiting on rollouts); never blocks."""
        self._require_prepared()
        self._boundary(hold=False)

    def step(self) -> ModelUpdateEvent | None:
        """One optimizer step when enough groups are ready; the model update when this step publishes.

        Commands queued since the last step are applied first, and a paused run waits here (after
        the previous step's record and checkpoint, and after its update was returned).
        """
        self._require_prepared()
        self._boundary(hold=True)
        if self.done:
            return None
        groups = self._take_ready()
        if not groups:
            return None
        record = self._optimize(groups)
        self._record_used(self.global_step, groups)
        update = None
        max_updates = self.settings.max_updates
        if max_updates is not None and self.global_step >= max_updates:
            self.finished = True
        if self.global_step % self.settings.publish_every == 0 or self.finished:
            update = self._publish(record.metrics)
            self._save_requested = True  # a published version always has a checkpoint to resume from
        self._boundary(hold=False)
        return update

    def _optimize(self, groups: list[_Group]) -> StepRecord:
        import torch

        started = time.perf_counter()
        prepared = self._require_prepared()
        settings, temperature = self.settings, self.temperature
        samples = [r for g in groups for r in g.rollouts]
        advantages, zero_variance = rollout_advantages([[r.reward for r in g.rollouts] for g in groups])
        batch = PackedBatch.of(
            [(r.prompt_token_ids, r.response_token_ids) for r in samples],
            prepared.policy.tokenizer.pad_token_id or 0,
            prepared.policy.device,
        )

        logits = forward(self.model, batch)
        current = response_logprobs(logits, batch, temperature)
        reference = self._reference_logprobs(batch)
        teacher_started = time.perf_counter()
        distilled = self.opd_advantages(samples, [c.detach() for c in current]) if settings.opd else None
        teacher_s = time.perf_counter() - teacher_started
        token_advantages = self.token_advantages(advantages, distilled, current)
        terms = [
            sample_terms(
                cur, torch.tensor(r.token_logprobs, device=cur.device), ref, advantage, settings.clip
            )
            for cur, ref, r, advantage in zip(current, reference, samples, token_advantages, strict=True)
        ]
        surrogate = torch.stack([t.surrogate for t in terms]).mean()
        kl = torch.stack([t.kl for t in terms]).mean()
        loss = -surrogate + settings.beta * kl

        self.global_step += 1
        step = self.global_step
        record = StepRecord(step)
        if not torch.isfinite(loss):  # before the optimizer step: the weights stay as they were
            record.metrics = {"loss": None}
            prepared.reporter.write(record)
            raise TrainingFailed(f"the loss became NaN at step {step} (is the learning rate too high?)")
        # Phi of the response tokens from this same forward, at the sampling temperature
        # (docs/reference/carl.md §2).
        stats = completion_token_stats(
            logits.detach(),
            batch.input_ids,
            completion_mask=batch.completion_mask,
            vocab_size=self.vocab_size,
            temperature=temperature,
        )
        record.phi, phi_metrics = step_phi_stats(step, stats.phi, stats.entropy, self.vocab_size)
        record.samples = self._samples(samples, stats)
        record.rollouts = self._rollouts(samples, advantages, current, stats, distilled)

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for group in self.optimizer.param_groups for p in group["params"]], MAX_GRAD_NORM
        )
        self.optimizer.step()

        tokens = sum(batch.lengths)
        rewards = [r.reward for r in samples]
        verifier = [r.verifier_score for r in samples if r.verifier_score is not None]
        staleness = [s for s in (self._versions_behind(r.model_version) for r in samples) if s is not None]
        record.metrics = {
            "loss": float(loss.detach()),
            "kl": float(kl.detach()),
            "clip_ratio/region_mean": sum(float(t.clipped) for t in terms) / tokens,
            "ratio_mean": sum(float(t.ratio_sum) for t in terms) / tokens,
            "advantage_std": float(np.std(advantages)),
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            "grad_norm": float(grad_norm),
            "reward": float(np.mean(rewards)),
            "rewards/prm/mean": float(np.mean([r.prm_score for r in samples])),
            "rewards/outcome/mean": float(np.mean([r.outcome_score for r in samples])),
            **({"rewards/verifier/mean": float(np.mean(verifier))} if verifier else {}),
            **({"staleness/mean": float(np.mean(staleness))} if staleness else {}),
            "staleness/unknown": float(len(samples) - len(staleness)),
            "groups": float(len(groups)),
            "groups/zero_variance": float(zero_variance),
            "groups/incomplete": float(sum(1 for g in groups if not g.complete)),
            "groups/dropped": float(self._dropped_since_step),
            "samples": float(len(samples)),
            "tokens": float(tokens),
            **phi_metrics,
            "timing/step_s": time.perf_counter() - started,
        }
        if distilled is not None:
            record.metrics.update(distilled.summary.metrics())
            record.metrics["opd/unmatched"] = float(distilled.unmatched)
            record.metrics["timing/teacher_s"] = teacher_s
        self._dropped_since_step = 0
        prepared.reporter.write(record)
        if distilled is not None and distilled.stored:
            rows = [(task, step, tokens, blob, kl) for task, tokens, blob, kl in distilled.stored]
            record_task_opd(self.store, rows)
        return record

    # -- on-policy distillation --------------------------------------------------------------------

    def token_advantages(
        self, advantages: Sequence[float], distilled: Distillation | None, like: Sequence[Any]
    ) -> list[Any]:
        """Per sample, what its surrogate multiplies: the GRPO advantage as one float (every token, exactly as
        without OPD), or for a hinted sample a tensor of GRPO + w_opd · its OPD advantage per token (on the
        device and in the dtype of `like`, its log-probs)."""
        import torch

        out: list[Any] = list(advantages)
        if distilled is None:
            return out
        for i, gain in enumerate(distilled.advantages):
            if gain is not None:
                per_token = opd.combined(advantages[i], gain, len(gain), self.settings.w_opd)
                out[i] = torch.tensor(per_token, dtype=like[i].dtype, device=like[i].device)
        return out

    def teacher_context(self, rollout: TrainingRolloutEvent) -> list[int] | None:
        """The hinted rollout's prompt ids with its hint in the context (engine/training/opd.py), built as the
        worker built its prompt; None when the rollout has no hint, or its prompt ids are not what this
        model and the workers' instruction make of its prompt (another template or instruction: the
        teacher's context cannot be rebuilt, and the rollout trains by its reward alone)."""
        if not rollout.hint.strip():
            return None
        policy = self._require_prepared().policy
        if policy.prompt_ids(rollout.prompt, self.system_prompt) != list(rollout.prompt_token_ids):
            return None
        return policy.prompt_ids(opd.hinted_text(rollout.prompt, rollout.hint), self.system_prompt)

    def opd_advantages(self, samples: Sequence[TrainingRolloutEvent], student: Sequence[Any]) -> Distillation:
        """Each hinted sample's per-token OPD advantage: clip(teacher − student) on its own sampled tokens,
        the teacher being this policy (adapter as trained so far) with the hint in its context, scored in one
        no-grad forward of the hinted samples; `student` is the same policy's log-probs of those tokens
        without the hint (the training forward's, detached). None for a sample without a hint."""
        import torch

        policy = self._require_prepared().policy
        contexts = [self.teacher_context(r) for r in samples]
        hinted = [i for i, ids in enumerate(contexts) if ids is not None]
        unmatched = sum(1 for r, ids in zip(samples, contexts, strict=True) if r.hint.strip() and ids is None)
        gains: list[np.ndarray | None] = [None] * len(samples)
        pairs, stored = [], []
        if hinted:
            batch = PackedBatch.of(
                [(contexts[i] or [], samples[i].response_token_ids) for i in hinted],
                policy.tokenizer.pad_token_id or 0,
                policy.device,
            )
            with torch.no_grad():
                teacher = response_logprobs(forward(self.model, batch), batch, self.temperature)
            for i, lp in zip(hinted, teacher, strict=True):
                t = lp.double().cpu().numpy()
                s = student[i].double().cpu().numpy()
                gain = gains[i] = opd.token_advantages(t, s, self.settings.opd_clip)
                pairs.append((t, s))
                texts = self._token_texts(samples[i].response_token_ids)
                kl = float(np.mean(s - t)) if len(t) else 0.0
                stored.append((samples[i].task_id, json.dumps(texts), pack_half(gain.tolist()), kl))
        return Distillation(gains, opd.summary(pairs, self.settings.opd_clip), unmatched, stored)

    def _rollouts(
        self,
        samples: list[TrainingRolloutEvent],
        advantages: list[float],
        current: list[Any],
        stats: Any,
        distilled: Distillation | None,
    ) -> list[dict[str, Any]]:
        """The step's samples as rollout rows (the rollouts viewer's), each with its task, and a hinted one
        with its hint and per-token OPD advantages (drawn over its tokens like entropy)."""
        rows = []
        for i, r in enumerate(samples[:ROLLOUTS_PER_STEP]):
            rewards = {"prm": r.prm_score, "outcome": r.outcome_score}
            if r.verifier_score is not None:
                rewards["verifier"] = r.verifier_score
            extra: dict[str, Any] = {"task_id": r.task_id, "worker_id": r.worker_id}
            gain = distilled.advantages[i] if distilled is not None else None
            if r.hint:
                extra["hint"] = r.hint
            if gain is not None:
                extra["opd_advantage"] = [round(float(x), 5) for x in gain]
            rows.append(
                {
                    "idx": i,
                    "group_id": str(r.group_id or ""),
                    "prompt": r.prompt,
                    "completion": r.response,
                    "rewards": rewards,
                    "total": r.reward,
                    "advantage": advantages[i],
                    "length": len(r.response_token_ids),
                    "tokens": self._token_texts(r.response_token_ids),
                    "entropy": [float(h) for h in stats.entropy[i]],
                    "logprob": current[i].detach().double().cpu().tolist(),
                    "extra": extra,
                }
            )
        return rows

    def _reference_logprobs(self, batch: Any) -> list[Any]:
        """The base's log-probs (adapter disabled: the same weights, no second copy), for the KL only."""
        import torch

        if self.settings.beta == 0:
            return [None] * len(batch.lengths)
        with torch.no_grad(), self.model.disable_adapter():
            return response_logprobs(forward(self.model, batch), batch, self.temperature)

    def _decode(self, ids: list[int]) -> str:
        return str(self._require_prepared().policy.tokenizer.decode(ids))

    def _versions_behind(self, version: str | None) -> int | None:
        """How many published adapters came after the one that sampled (None: a version not ours)."""
        if version is None or version not in self.versions:
            return None
        return len(self.versions) - 1 - self.versions.index(version)

    def _samples(self, samples: list[TrainingRolloutEvent], stats: Any) -> list[dict[str, Any]]:
        out = []
        for kind, index in pick_traces([r.reward for r in samples], self.rng).items():
            r = samples[index]
            rewards = {"prm": r.prm_score, "outcome": r.outcome_score, "total": r.reward}
            if r.verifier_score is not None:
                rewards["verifier"] = r.verifier_score
            out.append(
                {
                    "idx": index,
                    "kind": kind,
                    "prompt": r.prompt,
                    "completion": r.response,
                    "tokens": self._token_texts(r.response_token_ids),
                    "entropy": [round(float(h), 5) for h in stats.entropy[index]],
                    "phi": [round(float(p), 6) for p in stats.phi[index]],
                    "rewards": rewards,
                }
            )
        return out

    # -- step boundaries: commands and checkpoints ---------------------------------------------------

    def _boundary(self, *, hold: bool) -> None:
        """Apply the queued commands at this step boundary, save when asked, and (hold) wait while paused."""
        controls, pump = _Controls(self), self._require_prepared().pump
        pump.poll(self.global_step, controls)
        hook = "step_end"
        while True:
            if self._save_requested:
                self._save_requested = False
                path = self._checkpoint()
                pump.saved(self.global_step, path)
                hook = "save"
            if not hold:
                return
            pump.hold(hook, self.global_step, controls)
            if not self._save_requested:  # a checkpoint asked for while paused: save it, then hold again
                return

    def _checkpoint(self) -> Path:
        """Adapter, optimizer and step in checkpoint-<step>/, swapped in whole (a reader never sees half)."""
        import torch

        step = self.global_step
        if self._last_checkpoint is not None and self._last_checkpoint[0] == step:
            return self._last_checkpoint[1]  # nothing trained since
        final = self.output_dir / f"checkpoint-{step}"
        staging = Path(tempfile.mkdtemp(prefix=f".checkpoint-{step}.", dir=self.output_dir))
        try:
            self.model.save_pretrained(str(staging / ADAPTER_DIR), save_embedding_layers=False)
            torch.save(self.optimizer.state_dict(), staging / OPTIMIZER_FILE)
            state = {
                "step": step,
                "versions": self.versions,
                "run": self.run_name,
                "base_fingerprint": self.fingerprint,
                "learning_rate": self.optimizer.param_groups[0]["lr"],
            }
            (staging / STATE_FILE).write_text(json.dumps(state) + "\n")
            _replace_dir(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        for _, old in sorted(list_checkpoints(self.output_dir))[:-SAVE_TOTAL_LIMIT]:
            shutil.rmtree(old, ignore_errors=True)
        self._last_checkpoint = (step, final)
        return final

    def _publish(self, metrics: dict[str, float | None]) -> ModelUpdateEvent:
        """Write the adapter where workers load it, as `<run>-v<step>`, and describe it."""
        version = f"{self.run_name}-v{self.global_step:04d}"
        target = adapters_dir(self.home) / version
        staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=target.parent))
        try:
            self.model.save_pretrained(str(staging), save_embedding_layers=False)
            _replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if version not in self.versions:
            self.versions.append(version)
        self._require_prepared().reporter.event(self.global_step, "model_update", version)
        shown = {
            key: float(value) for key in ("loss", "reward", "kl") if (value := metrics.get(key)) is not None
        }
        return ModelUpdateEvent(
            model_version=version,
            checkpoint_path=str(target),
            base_model=self.model_name,
            base_fingerprint=self.fingerprint,
            step=self.global_step,
            metrics=shown,
            run=self.run_name,
            target_worker_id=self.publish_target,
        )

    # -- helpers for callers and tests -----------------------------------------------------------------

    def score(self, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> list[float]:
        """Log-probs of `token_ids` after `prompt_ids` under the adapter policy as trained so far."""
        return self._require_prepared().policy.score(prompt_ids, token_ids, temperature=self.temperature)

    def close(self, status: str = "finished", *, error: str | None = None) -> None:
        """End the run with `status` (finished, stopped or failed) and free the model."""
        if self.pump is not None:
            self.pump.abandon(f"the run was {status} before this command could be applied")
        if self.reporter is not None:
            self.reporter.set_status(status, error=error)
        self.policy = self.model = self.optimizer = None
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass

    def _require_prepared(self) -> _Prepared:
        """The parts `prepare` made; TrainerError before it, or after `close`."""
        policy, reporter, pump, spool = self.policy, self.reporter, self.pump, self.spool
        if self.model is None or policy is None or reporter is None or pump is None or spool is None:
            raise TrainerError("the trainer is not prepared (call prepare() first) or was closed")
        return _Prepared(policy, reporter, pump, spool)


# -- the math ----------------------------------------------------------------------------------------


def rollout_advantages(groups: Sequence[Sequence[float]]) -> tuple[list[float], int]:
    """(advantages in sample order, groups with zero spread): TRL's GRPO advantages (engine/training/grpo.py),
    one reward per rollout, each group normalised on its own (a group that timed out may be short)."""
    values = np.asarray([r for rewards in groups for r in rewards], dtype=np.float64)[:, None]
    sizes = [len(rewards) for rewards in groups]
    result = grpo.group_advantages(values, np.ones(1), sizes)
    firsts = np.cumsum([0, *sizes[:-1]])
    return result.advantages.tolist(), int(result.zero_std[firsts].sum())


@dataclass(frozen=True)
class Distillation:
    """One step's OPD: per sample its per-token OPD advantages (None: no hint), the step's figures, the
    hinted samples whose teacher context could not be rebuilt, and the rows for the tasks' store."""

    advantages: list[np.ndarray | None]
    summary: opd.Distilled
    unmatched: int
    stored: list[tuple[str, str, bytes | None, float]]  # (task_id, token texts JSON, advantages, KL)


@dataclass
class SampleTerms:
    surrogate: Any  # scalar tensor: the clipped surrogate averaged over the sample's tokens
    kl: Any  # scalar tensor: k3 KL to the reference, averaged over the sample's tokens
    ratio_sum: Any  # sum of the importance ratios (for the token-weighted mean)
    clipped: Any  # tokens where the clipped term was the one taken (no gradient from them)


def sample_terms(
    current: Any, behaviour: Any, reference: Any | None, advantage: float | Any, clip: float
) -> SampleTerms:
    """One sample's PPO-clip surrogate against the behaviour policy and its k3 KL to the reference.

    advantage: one number for every token (GRPO), or a tensor of one per token (GRPO + OPD).

    rho = exp(logp_current - logp_behaviour); surrogate = min(rho A, clip(rho, 1-c, 1+c) A);
    KL per token = exp(ref - cur) - (ref - cur) - 1 (k3: unbiased, always >= 0).
    """
    import torch

    ratio = torch.exp(current - behaviour)
    unclipped = ratio * advantage
    clipped = ratio.clamp(1 - clip, 1 + clip) * advantage
    surrogate = torch.minimum(unclipped, clipped).mean()
    if reference is None:
        kl = torch.zeros((), device=current.device)
    else:
        delta = reference - current
        kl = (torch.exp(delta) - delta - 1).mean()
    ratio = ratio.detach()
    was_clipped = ((ratio < 1 - clip) & (advantage < 0)) | ((ratio > 1 + clip) & (advantage > 0))
    return SampleTerms(surrogate, kl, ratio.sum(), was_clipped.sum())


# -- checkpoints on disk -------------------------------------------------------------------------------


def list_checkpoints(output_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints (their state file written) as (step, path)."""
    found = []
    for path in output_dir.glob("checkpoint-*"):
        number = path.name.removeprefix("checkpoint-")
        if number.isdigit() and (path / STATE_FILE).is_file():
            found.append((int(number), path))
    return found


def newest_checkpoint(output_dir: Path) -> tuple[int, Path] | None:
    found = list_checkpoints(output_dir)
    return max(found) if found else None


def _replace_dir(staging: Path, target: Path) -> None:
    """Put `staging` at `target` by renames only: a reader sees the old directory or the new one."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
    os.replace(target, retired / target.name)
    os.replace(staging, target)
    shutil.rmtree(retired, ignore_errors=True)
