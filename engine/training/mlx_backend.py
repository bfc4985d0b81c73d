"""The MLX backend: SFT (LoRA or every weight) and GRPO on mlx-lm, reporting every step like torch.

mlx-lm loads the model and tokenizer, makes the LoRA layers and holds the KV cache; the training
loop is our own (mlx-lm-lora's GRPO takes its ratio against the policy being updated, gives no
hook per step for our commands and hides the logits, so it cannot give the Φ or the cascade this
project needs). One loop, both phases, on the store's step numbering: the SFT warm-up's steps
first, then GRPO's.

GRPO, as the torch backend's TRL does it: each step samples `num_generations` completions for each
of its prompts at the run's temperature (with no other warping), keeping the log-prob and the
entropy of every sampled token (the behaviour policy: the fused kernel of engine/coherence/phi_mlx.py
on each decoding step's logits, so the coherence rewards take Φ from the generating pass, with no
forward of their own); the rewards are the run's own functions,
called as TRL calls them; advantages are TRL's, normalised within each group (grpo.py);
the loss is the clipped surrogate of the per-token ratio against the behaviour policy, plus
`beta` times the k3 KL to the starting model, over every completion token of the batch (TRL's
default "dapo" normalisation). Φ per token comes from the logits of that same training forward,
in one fused pass (log-sum-exp and Σp·z at the temperature); the step's rollouts take their per-token
entropy and log-probability from it too (engine/training/step_rollouts.py). Each step records the RL health
keys under TRL's names (kl when beta > 0, clip_ratio/*, completions/*, frac_reward_zero_std), and the entropy
percentiles and Cov(log π, A) of engine/coherence/tokens.py, from that same forward.

Each step's randomness (which prompts, which samples) derives from the seed and the step number,
so a run resumed from a checkpoint replays the lost steps exactly as they would have gone.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from engine.coherence import phi_mlx
from engine.coherence.phi import phi_from_entropy
from engine.coherence.summary import PHI_FROM_GENERATE, pick_traces, step_phi_stats
from engine.coherence.tokens import step_token_metrics
from engine.errors import CarlError
from engine.tasks import completion_text

from . import opd
from .artifacts import FINAL_DIR
from .backend import (
    ROLLOUT_SECONDS,
    SAVE_TOTAL_LIMIT,
    BadInput,
    CommandPump,
    Reporter,
    StepRecord,
    TrainingFailed,
)
from .config import TrainConfig
from .data import checked_inputs, dataset_columns, offline_if_local, prompt_text, row_hint
from .grpo import group_advantages
from .holdout import holdout_line
from .mlx_losses import Batch, grpo_loss, per_row, per_token_advantages, sft_loss, teacher_pairs, token_stats
from .perf import GENERATION, GIB, MLX_ACTIVE_MEMORY, MLX_PEAK_MEMORY, SCORING, UPDATE, StepClock, StepPerf
from .reward_set import RewardSet
from .step_rollouts import TokenTexts, step_rollouts

CARL_STATE = "carl_state.json"  # written last into a checkpoint: one without it is incomplete
OPTIMIZER_FILE = "optimizer.safetensors"
ADAPTER_FILE = "adapters.safetensors"  # mlx-lm's adapter layout (adapter_config.json beside it)
MODEL_FILE = "model.safetensors"
MAX_GRAD_NORM = 1.0  # as transformers' Trainer clips
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
LLAMA_LINEAR = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def local_model_dir(where: str) -> Path:
    """The directory holding the model: as given, or the Hugging Face hub's cached snapshot of it."""
    if Path(where).is_dir():
        return Path(where)
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(
                where,
                allow_patterns=[
                    "*.json",
                    "*.safetensors",
                    "*.py",
                    "tokenizer.model",
                    "*.tiktoken",
                    "*.txt",
                    "*.jinja",
                ],
            )
        )
    except Exception as exc:
        raise BadInput(
            f"model {where}: cannot get it from the Hugging Face hub ({' '.join(str(exc).split())[:200]})"
        ) from None


def _say(message: str) -> None:
    print(f"[carl] {message}", flush=True)


@dataclass
class Sample:
    """One sampled completion: its tokens, and per token the behaviour policy's log-prob and entropy."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    entropies: list[float]


class MLXControls:
    """What the command pump asks of this loop, at a step boundary."""

    def __init__(self, backend: MLXBackend) -> None:
        self.backend = backend

    def request_save(self) -> None:
        self.backend.save_requested = True

    def request_stop(self) -> None:
        self.backend.stop_requested = True

    def set_lr(self, lr: float) -> None:
        self.backend.lr = lr
        self.backend.optimizer.learning_rate = lr

    def set_weight(self, reward: str, weight: float) -> str:
        if self.backend.rewards is None:
            raise CarlError("set_weight: an SFT run has no reward weights")
        return self.backend.rewards.set_weight(reward, weight)


class MLXBackend:
    name = "mlx"

    def __init__(
        self,
        config: TrainConfig,
        *,
        home: Path,
        output_dir: Path,
        reporter: Reporter,
        pump: CommandPump,
        resuming: bool = False,
    ) -> None:
        self.config = config
        self.home = home
        self.output_dir = output_dir
        self.reporter = reporter
        self.pump = pump
        self.resuming = resuming
        self.controls = MLXControls(self)
        self.rewards: RewardSet | None = None
        self.rows: list[dict[str, Any]] = []
        self.model_path = ""
        self.model: Any = None
        self.reference: Any = None  # the starting model, for the KL (beta > 0)
        self.tokenizer: Any = None
        self.vocab_size = 0
        self.optimizer: Any = None
        self.phase = ""
        self.save_requested = False
        self.stop_requested = False
        self.last_step = 0
        self.lr = config.learning_rate
        self.has_completions = False
        self.lora_parameters: dict[str, Any] = {}
        self.sft_data: list[tuple[list[int], list[int]]] = []
        self.token_texts: TokenTexts | None = None
        self.sampling_phi_seconds = 0.0  # this step's Φ kernel time in the sampler
        self.clock = StepClock()  # the step's phases (engine/training/perf.py)

    # -- prepare -------------------------------------------------------------------------------

    def prepare(self) -> None:
        config = self.config
        offline_if_local(config.model)
        mx.random.seed(config.seed)
        self.rows, held, self.rewards, model = checked_inputs(config, self.home)
        if held:
            _say(holdout_line(self.rows, held))
        self.has_completions = "completion" in dataset_columns(self.rows)
        self.model_path = str(local_model_dir(model))
        self.model, self.tokenizer, model_config = self._load(self.model_path)
        text_config = model_config.get("text_config") or model_config
        self.vocab_size = int(text_config.get("vocab_size") or len(self.tokenizer.vocab))
        self.token_texts = TokenTexts(self.tokenizer.decode)
        if config.lora.enabled:
            self._add_lora()
        if config.method == "grpo" and config.beta > 0:
            self.reference = self._reference()

    def _load(self, where: str) -> tuple[Any, Any, dict[str, Any]]:
        from mlx_lm import load

        try:
            # mlx-lm types load's result as a 2- or a 3-tuple: with return_config, the three
            loaded = cast(tuple[Any, Any, dict[str, Any]], load(where, return_config=True))
            model, tokenizer, model_config = loaded
        except Exception as exc:  # mlx-lm raises many kinds for a directory it cannot read
            raise BadInput(
                f"model {self.config.model}: cannot load it with mlx-lm ({' '.join(str(exc).split())[:200]})"
            ) from None
        return model, tokenizer, model_config

    def _lora_keys(self) -> list[str] | None:
        """mlx-lm's LoRA keys for `lora.target_modules`: None means every linear layer of the blocks."""
        targets = self.config.lora.target_modules
        if targets == "all-linear":
            return None
        wanted = [targets] if isinstance(targets, str) else list(targets)
        present = {
            name for name, module in self.model.layers[0].named_modules() if isinstance(module, nn.Linear)
        }
        keys = sorted(name for name in present if name.rsplit(".", 1)[-1] in wanted or name in wanted)
        missing = [w for w in wanted if not any(k == w or k.endswith("." + w) for k in keys)]
        if missing:
            raise BadInput(
                f"lora.target_modules: {', '.join(missing)} is not a linear layer of this model's blocks "
                f"(they have: {', '.join(sorted(present))})"
            )
        return keys

    def _add_lora(self) -> None:
        from mlx_lm.tuner.utils import linear_to_lora_layers

        lora = self.config.lora
        # mlx-lm's scale multiplies the low-rank product as peft's alpha / r does.
        self.lora_parameters = {
            "rank": lora.r,
            "scale": lora.alpha / lora.r,
            "dropout": lora.dropout,
            "keys": self._lora_keys(),
        }
        self.model.freeze()
        linear_to_lora_layers(self.model, len(self.model.layers), self.lora_parameters)

    def base_model(self) -> str:
        """What the run trained on, as a user names it: the directory, or the hub id (not the hub's cache)."""
        return (
            self.model_path
            if Path(self.config.model).expanduser().is_dir() or self.config.model == "carl-tiny"
            else self.config.model
        )

    def _reference(self) -> Any:
        """The model the run starts from, frozen: the KL term's reference."""
        reference, _, _ = self._load(self.model_path)
        reference.freeze()
        return reference

    # -- steps, resume -------------------------------------------------------------------------

    def warmup_steps(self) -> int:
        return self.config.sft_warmup_steps if self.config.method == "grpo" else 0

    def resume_point(self) -> tuple[Path | None, int]:
        """The newest complete checkpoint and the store step it stands for."""
        found = []
        for path in self.output_dir.glob("checkpoint-*"):
            number = path.name.removeprefix("checkpoint-")
            if number.isdigit() and (path / CARL_STATE).is_file():
                found.append((int(number), path))
        if not found:
            return None, 0
        _, path = max(found)
        return path, int(json.loads((path / CARL_STATE).read_text())["store_step"])

    # -- train ---------------------------------------------------------------------------------

    def train(self, resume_from: Path | None) -> str:
        config = self.config
        self.reporter.update_run(
            vocab_size=self.vocab_size,
            backend="mlx",
            temperature=config.temperature,
            model=config.model,
        )
        self.sft_data = self._tokenized_sft() if self.has_completions else []
        first = 1
        if resume_from is not None:
            first = self._restore(resume_from) + 1
        if self.warmup_steps() and not self.has_completions and first <= self.warmup_steps():
            _say(f"no 'completion' column in {config.dataset}: skipping the SFT warm-up")
            first = self.warmup_steps() + 1
        total = config.total_steps
        started = time.monotonic()
        for step in range(first, total + 1):
            phase = (
                "sft warm-up"
                if step <= self.warmup_steps()
                else ("sft" if config.method == "sft" else "grpo")
            )
            if phase != self.phase:
                self._begin_phase(phase)
            mx.reset_peak_memory()  # the step's own peak
            record = self._sft_step(step) if phase.startswith("sft") else self._grpo_step(step)
            # MLX's allocator, which only this process sees (the engine samples the machine, not MLX).
            record.metrics[MLX_ACTIVE_MEMORY] = mx.get_active_memory() / GIB
            record.metrics[MLX_PEAK_MEMORY] = mx.get_peak_memory() / GIB
            self.reporter.write(record)  # before the commands: a pause answered at step N finds N stored
            self.last_step = step
            self.pump.poll(step, self.controls)
            loss = record.metrics.get("loss")
            if loss is None or not math.isfinite(loss):
                raise TrainingFailed(f"the loss became NaN at step {step}")
            self._say_step(phase, step, record)
            due = step % config.save_steps == 0 or step == total or step == self.warmup_steps()
            self._boundary(step, save=due)
            if self.stop_requested:
                break
        _say(f"{self.phase}: steps {first}-{self.last_step} in {time.monotonic() - started:.1f}s")
        return "stopped" if self.pump.stopping else "finished"

    def _boundary(self, step: int, *, save: bool) -> None:
        """The end of a step: a checkpoint when due or asked for; a paused run holds here."""
        while True:
            saved = save or self.save_requested
            if saved:
                self._save(step)
            self.pump.hold("save" if saved else "log", step, self.controls)
            save = False
            if not self.save_requested:
                return  # (a checkpoint asked for while paused: saved on the next turn, then held again)

    def _begin_phase(self, phase: str) -> None:
        """A new optimizer for each phase (as the torch backend's two trainers have); the warm-up runs
        at the warm-up's learning rate and batch (config.warmup_lr, config.warmup_batch)."""
        self.phase = phase
        lr = self.lr = self.config.warmup_lr if phase == "sft warm-up" else self.config.learning_rate
        # As torch's AdamW, which the torch backend's trainers use: with bias correction (MLX's default is
        # without, which makes the first steps of a fresh optimizer ~3x larger and threw GRPO off its
        # warm-up), and no weight decay.
        self.optimizer = optim.AdamW(
            learning_rate=lr, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0, bias_correction=True
        )

    def _say_step(self, phase: str, step: int, record: StepRecord) -> None:
        shown = ("loss", "reward", "rewards/task/mean", "entropy", "mean_token_accuracy")
        numbers = " ".join(
            f"{k.split('/')[-2] if '/' in k else k}={record.metrics[k]:.4g}"
            for k in shown
            if isinstance(record.metrics.get(k), float)
        )
        phi = (
            f" phi={record.phi['phi_mean']:.4f}"
            if record.phi and record.phi.get("phi_mean") is not None
            else ""
        )
        gate = f" gate={record.gate['state']}" if record.gate else ""
        _say(f"{phase} step {step}/{self.config.total_steps} {numbers}{phi}{gate}")

    def _update(self, loss_fn: Any, *args: Any) -> tuple[Any, float]:
        """One optimizer step: gradients of the loss, clipped at norm 1, applied; (aux, grad norm)."""
        self.model.train()
        (loss, aux), grads = nn.value_and_grad(self.model, loss_fn)(self.model, *args)
        grads, norm = optim.clip_grad_norm(grads, MAX_GRAD_NORM)
        self.optimizer.update(self.model, grads)
        mx.eval(self.model.parameters(), self.optimizer.state, loss, aux)
        return (loss, *aux), float(norm)

    # -- SFT -----------------------------------------------------------------------------------

    def _tokenized_sft(self) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, completion ids) per row, as TRL's SFTTrainer tokenizes a prompt-completion
        dataset: the chat template for conversations (completion = what the template adds after the
        prompt's generation prompt), else the texts with eos after the completion."""
        out = []
        for row in self.rows:
            prompt, completion = row["prompt"], row.get("completion")
            if completion is None:
                continue
            prompt_ids = self._prompt_ids(prompt)
            if isinstance(prompt, list):
                full = self.tokenizer.apply_chat_template([*prompt, *completion], tokenize=True)
                completion_ids = list(full[len(prompt_ids) :])
            else:
                completion_ids = [*self.tokenizer.encode(str(completion)), self.tokenizer.eos_token_id]
            out.append((prompt_ids, completion_ids))
        return out

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list):
            return list(self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True))
        return list(self.tokenizer.encode(str(prompt)))

    def _order(self, n: int, index: int) -> int:
        """The row used at position `index` of the run's data stream: a permutation per epoch,
        from the seed."""
        epoch, within = divmod(index, n)
        return int(np.random.default_rng([self.config.seed, epoch]).permutation(n)[within])

    def _sft_step(self, step: int) -> StepRecord:
        self.clock.start()
        warmup = step <= self.warmup_steps()
        size = self.config.warmup_batch if warmup else self.config.per_device_train_batch_size
        phase_step = step - (0 if warmup else self.warmup_steps())
        n = len(self.sft_data)
        pairs = [self.sft_data[self._order(n, (phase_step - 1) * size + i)] for i in range(size)]
        batch = Batch.of(pairs, self.tokenizer.pad_token_id or 0)
        started = time.perf_counter()
        with self.clock.phase(UPDATE):
            (loss, entropy, correct), norm = self._update(sft_loss, batch)
        times = self.clock.stop()
        tokens = float(batch.mask.sum())
        metrics: dict[str, float | None] = {
            "loss": float(loss),
            "entropy": float(entropy),
            "mean_token_accuracy": float(correct),
            "num_tokens": tokens,
            "grad_norm": norm,
            "learning_rate": self.lr,
            "timing/step_s": time.perf_counter() - started,
        }
        record = StepRecord(step, metrics, perf=StepPerf.of(times, [len(p) + len(c) for p, c in pairs]))
        vocab = self.vocab_size
        record.phi = {
            "phi_mean": 1.0 - float(entropy) / math.log(vocab),
            "entropy_mean": float(entropy),
            "weighting": "token",
            "vocab_size": vocab,
        }
        return record

    # -- GRPO ----------------------------------------------------------------------------------

    def _grpo_step(self, step: int) -> StepRecord:
        self.clock.start()
        config, rewards = self.config, self.rewards
        assert rewards is not None
        g = config.num_generations
        per_step = config.per_device_train_batch_size // g
        grpo_step = step - self.warmup_steps()
        rows = [
            self.rows[self._order(len(self.rows), (grpo_step - 1) * per_step + i)] for i in range(per_step)
        ]
        started = time.perf_counter()
        key = mx.random.key(config.seed * 1_000_003 + step)  # this step's samples, the same after a resume
        samples: list[Sample] = []
        with self.clock.phase(GENERATION):  # as TRL's: the prompts tokenized, sampled, decoded
            for i, row in enumerate(rows):
                prompt_ids = self._prompt_ids(row["prompt"])
                samples += self._sample(prompt_ids, g, mx.random.split(key, len(rows))[i])
            sampled = time.perf_counter()
            texts = [self.tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
        prompts = [row["prompt"] for row in rows for _ in range(g)]
        completions = [
            [{"role": "assistant", "content": t}] if isinstance(p, list) else t
            for p, t in zip(prompts, texts, strict=True)
        ]
        asked: list[bool] = []  # whether a coherence reward took Φ this step (the gate is open)

        def sampled_phi(**_: Any) -> list[np.ndarray]:
            asked.append(True)
            return [phi_from_entropy(np.asarray(s.entropies), self.vocab_size) for s in samples]

        rewards.set_phi_provider(sampled_phi)
        with self.clock.phase(SCORING):  # every reward function, the coherence rewards' Φ included
            values = self._rewards(rows, prompts, completions, samples)
        weights = np.asarray(rewards.current_weights())
        scored = group_advantages(values, weights, [g] * len(rows), aggregation=config.aggregation)
        advantages, totals, zero_std = scored.advantages, scored.totals, scored.frac_zero_std
        batch = Batch.of([(s.prompt_ids, s.token_ids) for s in samples], self.tokenizer.pad_token_id or 0)
        behaviour = np.zeros(np.array(batch.mask).shape, dtype=np.float32)
        mask = np.array(batch.mask).astype(bool)
        for i, sample in enumerate(samples):
            behaviour[i][mask[i]] = sample.logprobs
        step_advantages = mx.array(advantages.astype(np.float32))  # [B]: a step without hints, as ever
        distilled: dict[int, np.ndarray] = {}  # sample -> its OPD advantage per token (hinted samples only)
        distillation: opd.Distilled | None = None
        teacher_seconds = 0.0
        with self.clock.phase(UPDATE):  # the teacher's and the reference's forwards, and the update
            if config.opd and any(row_hint(row) is not None for row in rows):
                taught = time.perf_counter()
                distilled, distillation = self._distil(rows, samples)
                step_advantages = mx.array(
                    per_token_advantages(advantages, distilled, np.array(batch.mask), config.w_opd)
                )
                teacher_seconds = time.perf_counter() - taught
            reference = self._reference_logps(batch) if self.reference is not None else None  # lazy
            (loss, entropy, logp, clip_low, clip_high, kl), norm = self._update(
                grpo_loss,
                batch,
                mx.array(behaviour),
                reference,
                step_advantages,
                config.temperature,
                config.epsilon,
                config.beta,
            )
        record = StepRecord(
            step,
            perf=StepPerf.of(
                self.clock.stop(), [len(s.prompt_ids) for s in samples], [len(s.token_ids) for s in samples]
            ),
        )
        entropies, logprobs = per_row(entropy, batch), per_row(logp, batch)
        record.metrics = self._grpo_metrics(
            values, totals, zero_std, samples, loss, (float(clip_low), float(clip_high)), kl, norm, entropies
        )
        record.metrics.update(step_token_metrics(entropies, logprobs, advantages))
        if distillation is not None:  # OPD on and hints in this step; else no opd/* keys (as without OPD)
            record.metrics.update(distillation.metrics())
            record.metrics["timing/teacher_s"] = teacher_seconds
        record.metrics["timing/sampling_s"] = sampled - started
        if asked:  # the coherence rewards' Φ came from the sampler, as on torch's generating pass
            record.metrics[PHI_FROM_GENERATE] = 1.0
            record.metrics["timing/phi_generate"] = self.sampling_phi_seconds
        self.sampling_phi_seconds = 0.0
        record.metrics["timing/step_s"] = time.perf_counter() - started
        phis = [phi_from_entropy(h, self.vocab_size) for h in entropies]
        record.phi, phi_metrics = step_phi_stats(step, phis, entropies, self.vocab_size)
        record.metrics.update(phi_metrics)
        record.samples = self._traces(
            step, prompts, texts, samples, values, totals, entropies, phis, distilled
        )
        rolled = time.perf_counter()
        assert self.token_texts is not None
        record.rollouts = step_rollouts(
            prompts=[prompt_text(p) for p in prompts],
            completions=texts,
            token_ids=[s.token_ids for s in samples],
            token_texts=self.token_texts,
            names=rewards.names,
            rewards=values,
            totals=totals,
            advantages=advantages,
            entropies=entropies,
            logprobs=logprobs,
            group=g,
            cap=config.rollouts_per_step,
            extras={
                i: {
                    "hint": str(rows[i // g].get("hint") or ""),
                    "opd_advantage": [round(float(x), 5) for x in gain],
                }
                for i, gain in distilled.items()
            },
        )
        record.metrics[ROLLOUT_SECONDS] = time.perf_counter() - rolled
        self._gate(step, values, record)
        return record

    def _distil(
        self, rows: list[dict[str, Any]], samples: list[Sample]
    ) -> tuple[dict[int, np.ndarray], opd.Distilled]:
        """On-policy distillation of the step's hinted samples (engine/training/opd.py): the teacher is this
        same model with the row's hint in its context, scoring each sample's own tokens in one no-grad
        forward; the student's log-probs are those kept while sampling. This loop samples with the weights it
        then trains (one update per step, after the sampling), so those are the student's own, with no
        second forward. Returns each hinted sample's clipped per-token advantage, and the step's figures."""
        config, g = self.config, self.config.num_generations
        pairs: list[tuple[list[int], list[int]]] = []
        students: list[np.ndarray] = []
        which: list[int] = []
        for i, row in enumerate(rows):
            hint = row_hint(row)
            if hint is None:
                continue
            prompt = row["prompt"]
            # The teacher's prompt, tokenized exactly as the student's (the chat template for conversations).
            taught = (
                opd.hinted_messages(prompt, hint)
                if isinstance(prompt, list)
                else opd.hinted_text(str(prompt), hint)
            )
            teacher_ids = self._prompt_ids(taught)
            for k in range(i * g, (i + 1) * g):
                pairs.append((teacher_ids, samples[k].token_ids))
                students.append(np.asarray(samples[k].logprobs, dtype=np.float64))
                which.append(k)
        self.model.eval()  # no dropout in the teacher (LoRA's), as in the sampling
        scored = teacher_pairs(
            self.model, Batch.of(pairs, self.tokenizer.pad_token_id or 0), students, config.temperature
        )
        advantages = [opd.token_advantages(t, s, config.opd_clip) for t, s in scored]
        return dict(zip(which, advantages, strict=True)), opd.summary(scored, config.opd_clip)

    def _sample(self, prompt_ids: list[int], n: int, key: mx.array) -> list[Sample]:
        """`n` completions of one prompt at the run's temperature, sampled together with a KV cache."""
        from mlx_lm.models.cache import make_prompt_cache

        self.model.eval()
        config, eos = self.config, self._eos_ids()
        cache = make_prompt_cache(self.model)
        logits = self.model(mx.array([prompt_ids] * n), cache=cache)[:, -1, :]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        ents: list[list[float]] = [[] for _ in range(n)]
        done = [False] * n
        keys = mx.random.split(key, config.max_completion_length)
        for t in range(config.max_completion_length):
            token = mx.random.categorical(logits.astype(mx.float32) / config.temperature, key=keys[t])
            mx.eval(token)  # the step's forward and draw, so that the time below is the kernel's alone
            # The distribution this token is drawn from, reduced by the fused kernel: [n] floats a step.
            measured = time.perf_counter()
            entropy, lse = phi_mlx.token_entropy(logits, temperature=config.temperature)
            _, surprisal = phi_mlx.selected_token_stats(logits, token, lse, temperature=config.temperature)
            chosen = -surprisal
            mx.eval(token, chosen, entropy)
            self.sampling_phi_seconds += time.perf_counter() - measured
            # [n] arrays: a token, its log-probability and its entropy a row (mlx types tolist() as a scalar
            # or a nested list)
            drawn = cast(list[int], token.tolist())
            logps_now, ents_now = cast(list[float], chosen.tolist()), cast(list[float], entropy.tolist())
            for row, (tok, lp, h) in enumerate(zip(drawn, logps_now, ents_now, strict=True)):
                if not done[row]:
                    tokens[row].append(tok)
                    logps[row].append(lp)
                    ents[row].append(h)
                    done[row] = tok in eos
            if all(done):
                break
            logits = self.model(token[:, None], cache=cache)[:, -1, :]
        return [Sample(list(prompt_ids), tokens[r], logps[r], ents[r]) for r in range(n)]

    def _eos_ids(self) -> set[int]:
        ids = self.tokenizer.eos_token_ids if hasattr(self.tokenizer, "eos_token_ids") else None
        return set(ids) if ids else {self.tokenizer.eos_token_id}

    def _rewards(
        self, rows: list[dict[str, Any]], prompts: list[Any], completions: list[Any], samples: list[Sample]
    ) -> np.ndarray:
        """(completions, functions) rewards as TRL computes them: each function called once, dataset
        columns as keyword lists; None (not applicable) becomes NaN."""
        assert self.rewards is not None
        g = self.config.num_generations
        columns = {
            key: [row[key] for row in rows for _ in range(g)]
            for key in rows[0]
            if key not in ("prompt", "completion")
        }
        ids = [s.token_ids for s in samples]
        out = np.full((len(samples), len(self.rewards.funcs)), np.nan)
        for j, fn in enumerate(self.rewards.funcs):
            values = fn(prompts=prompts, completions=completions, completion_ids=ids, **columns)
            out[:, j] = [np.nan if v is None else float(v) for v in values]
        return out

    def _reference_logps(self, batch: Batch) -> mx.array:
        logits = self.reference(batch.inputs)[:, :-1, :]
        logp, _ = token_stats(logits, batch.targets, self.config.temperature)
        return mx.stop_gradient(logp)

    def _grpo_metrics(
        self,
        values: np.ndarray,
        totals: np.ndarray,
        zero_std: float,
        samples: list[Sample],
        loss: Any,
        clipped: tuple[float, float],
        kl: Any,
        norm: float,
        entropies: list[np.ndarray],
    ) -> dict[str, float | None]:
        assert self.rewards is not None
        lengths = np.array([len(s.token_ids) for s in samples], dtype=np.float64)
        ends = self._eos_ids() | {self.tokenizer.pad_token_id}
        tokens = np.concatenate(entropies) if entropies else np.zeros(0)
        metrics: dict[str, float | None] = {
            "loss": float(loss),
            "reward": _mean(totals),
            "reward_std": _std(totals),
            "frac_reward_zero_std": zero_std,
            "entropy": float(tokens.mean()) if tokens.size else None,
            "grad_norm": norm,
            "learning_rate": self.lr,
            # As TRL logs them: below, above, and either side (the two never overlap).
            "clip_ratio/low_mean": clipped[0],
            "clip_ratio/high_mean": clipped[1],
            "clip_ratio/region_mean": clipped[0] + clipped[1],
            "completions/mean_length": float(lengths.mean()),
            "completions/max_length": float(lengths.max()),
            # As TRL counts it: a completion is clipped when it did not end on an end-of-sequence token.
            "completions/clipped_ratio": float(
                np.mean([not s.token_ids or s.token_ids[-1] not in ends for s in samples])
            ),
            "num_tokens": float(lengths.sum()),
        }
        if self.config.beta > 0:  # as TRL: no KL term, no kl key (rather than a 0 that was never measured)
            metrics["kl"] = float(kl)
        for j, name in enumerate(self.rewards.names):
            metrics[f"rewards/{name}/mean"] = _mean(values[:, j])
            metrics[f"rewards/{name}/std"] = _std(values[:, j])
        return metrics

    def _traces(
        self,
        step: int,
        prompts: list[Any],
        texts: list[str],
        samples: list[Sample],
        values: np.ndarray,
        totals: np.ndarray,
        entropies: list[np.ndarray],
        phis: list[np.ndarray],
        distilled: dict[int, np.ndarray],
    ) -> list[dict[str, Any]]:
        """The step's best, worst, median and one random completion, per token; a hinted one (OPD) with its
        OPD advantage per token too."""
        assert self.rewards is not None
        rng = np.random.default_rng(
            [self.config.seed, step, 7]
        )  # which completion is the step's "random" one
        out = []
        for kind, index in pick_traces(totals, rng).items():
            sample = samples[index]
            trace: dict[str, Any] = {
                "idx": int(index),
                "kind": kind,
                "prompt": prompt_text(prompts[index]),
                "completion": completion_text(texts[index]),
                "tokens": [self.tokenizer.decode([t]) for t in sample.token_ids],
                "entropy": [round(float(h), 5) for h in entropies[index]],
                "phi": [round(float(p), 6) for p in phis[index]],
                "rewards": {
                    **{n: _finite(values[index, j]) for j, n in enumerate(self.rewards.names)},
                    "total": _finite(totals[index]),
                },
            }
            if int(index) in distilled:
                trace["opd_advantage"] = [round(float(a), 6) for a in distilled[int(index)]]
            out.append(trace)
        return out

    def _gate(self, step: int, values: np.ndarray, record: StepRecord) -> None:
        rewards = self.rewards
        assert rewards is not None
        gate = rewards.gate
        if gate is None:
            return
        columns = [rewards.names.index(n) for n in rewards.task_names]
        task = values[:, columns]
        task_mean = round(float(np.nanmean(task)), 6) if np.isfinite(task).any() else math.nan
        was_open = gate.opened_at is not None
        state = gate.update(step, task_mean)
        record.gate = state.row()
        if not was_open and state.opened_at is not None:
            record.events.append(("gate_open", state.reason))

    # -- checkpoints -----------------------------------------------------------------------------

    def _save(self, step: int) -> None:
        """checkpoint-<step>/: the weights (the adapter, or every weight), the optimizer, the rewards' gate
        and calibration, and the step; written beside and renamed, with carl_state.json last."""
        path = self.output_dir / f"checkpoint-{step}"
        tmp = self.output_dir / f"checkpoint-{step}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._save_weights(tmp)
        mx.save_safetensors(str(tmp / OPTIMIZER_FILE), dict(tree_flatten(self.optimizer.state)))
        state = {
            "store_step": step,
            "phase": self.phase,
            "seed": self.config.seed,
            "rng": "per step: mx.random.key(seed * 1000003 + step), numpy default_rng([seed, ...])",
            "rewards": self.rewards.state_dict() if self.rewards is not None else None,
        }
        (tmp / CARL_STATE).write_text(json.dumps(state) + "\n")
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        self.save_requested = False
        for old in sorted(self._checkpoints())[:-SAVE_TOTAL_LIMIT]:
            shutil.rmtree(old[1], ignore_errors=True)
        self.pump.saved(step, path)

    def _checkpoints(self) -> list[tuple[int, Path]]:
        return [
            (int(p.name.removeprefix("checkpoint-")), p)
            for p in self.output_dir.glob("checkpoint-*")
            if p.name.removeprefix("checkpoint-").isdigit()
        ]

    def _save_weights(self, directory: Path) -> None:
        """mlx-lm's layouts: a LoRA adapter (adapters.safetensors + adapter_config.json), or the whole
        model in the Hugging Face layout (model.safetensors + config.json), which transformers loads too."""
        if self.config.lora.enabled:
            weights = dict(tree_flatten(self.model.trainable_parameters()))
            mx.save_safetensors(str(directory / ADAPTER_FILE), weights)
            adapter = {
                "fine_tune_type": "lora",
                "num_layers": len(self.model.layers),
                "lora_parameters": self.lora_parameters,
                "base_model_name_or_path": self.base_model(),
            }
            (directory / "adapter_config.json").write_text(json.dumps(adapter, indent=2) + "\n")
        else:
            weights = dict(tree_flatten(self.model.parameters()))
            mx.save_safetensors(str(directory / MODEL_FILE), weights, metadata={"format": "pt"})
            shutil.copy2(Path(self.model_path) / "config.json", directory / "config.json")
        for name in TOKENIZER_FILES:
            source = Path(self.model_path) / name
            if source.is_file():
                shutil.copy2(source, directory / name)

    def _restore(self, path: Path) -> int:
        """Weights, optimizer and the rewards' state of a checkpoint; returns its store step."""
        state = json.loads((path / CARL_STATE).read_text())
        if self.config.lora.enabled:
            self.model.load_weights(str(path / ADAPTER_FILE), strict=False)
        else:
            self.model.load_weights(str(path / MODEL_FILE))
        self._begin_phase(state["phase"])
        # a .safetensors file loads as a dict of arrays (mlx types load's result for every format)
        saved = cast(dict[str, mx.array], mx.load(str(path / OPTIMIZER_FILE)))
        self.optimizer.state = tree_unflatten(list(saved.items()))
        self.lr = float(self.optimizer.learning_rate.item())  # a set_lr before the checkpoint still holds
        if self.rewards is not None and state.get("rewards"):
            self.rewards.load_state_dict(state["rewards"])
        mx.eval(self.model.parameters(), self.optimizer.state)
        step = int(state["store_step"])
        _say(f"resumed from {path.name} (step {step})")
        return step

    def save_final(self) -> Path | None:
        """The trained model (or adapter) and its tokenizer in final/, for eval and push."""
        if not self.last_step:
            return None
        path = self.output_dir / FINAL_DIR
        tmp = self.output_dir / (FINAL_DIR + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self._save_weights(tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        return path


def _mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


def _std(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.std(ddof=1)) if finite.size > 1 else 0.0 if finite.size else None


def _finite(value: Any) -> float | None:
    value = float(value)
    return round(value, 6) if math.isfinite(value) else None
