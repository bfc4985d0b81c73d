"""The torch backend: TRL's GRPOTrainer (and SFTTrainer), reporting every step to the store.

Phi comes from the forward the training already does: `CarlGRPOTrainer` keeps the per-token
entropies TRL computes in its loss forward (`_get_per_token_logps_and_entropies` with
`compute_entropy=True`, at the sampling temperature), so per-step Phi costs no extra model call.
Only the gated coherence rewards need Phi *before* that forward, at reward time, and only once the
cascade gate has opened. They get it from the generating pass (engine/training/phi_sampling.py: a
logits processor measures each decoding step while transformers samples), or, where that cannot be
hooked (vLLM, `phi_source: forward`), from one no-grad forward of prompt + completion ids. Each such
step logs which (`phi/from_generate`: 1 or 0).

The step's rollouts (engine/training/step_rollouts.py) take their per-token entropy and log-probability from
that same loss forward, and their advantages from TRL's own computation: storing them costs no model call. So
do the entropy percentiles and Cov(log π, A) of engine/coherence/tokens.py; TRL logs the other RL health keys
itself (kl only when beta > 0, clip_ratio/*, completions/*, frac_reward_zero_std).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PrinterCallback, TrainerCallback

from engine.coherence.phi import phi_from_entropy, phi_from_model
from engine.coherence.summary import PHI_FROM_GENERATE, pick_traces, step_phi_stats
from engine.coherence.tokens import step_token_metrics
from engine.errors import CarlError
from engine.tasks import completion_text

from .artifacts import FINAL_DIR
from .backend import (
    CPU_THREADS,
    ROLLOUT_SECONDS,
    SAVE_TOTAL_LIMIT,
    BadInput,
    CommandPump,
    Reporter,
    StepRecord,
    TrainingFailed,
    numeric_logs,
)
from .config import TrainConfig
from .data import checked_inputs, dataset_columns, offline_if_local, prompt_text
from .flops import ModelFlops, gpu_peak
from .hf import CommandCallback, entropy_to_phi
from .holdout import holdout_line
from .perf import GENERATION, SCORING, UPDATE, StepClock, StepPerf
from .phi_sampling import GenerationPhi
from .ranks import Ranks, collective_timeout
from .reward_set import RewardSet
from .step_capture import StepCapture
from .step_rollouts import TokenTexts, step_rollouts

CARL_STATE = "carl_gate.json"  # gate, weights and calibration, saved into every checkpoint
WARMUP_DIR = "sft-warmup"  # the model after the SFT warm-up, the base of the GRPO phase
WARMUP_DONE = "carl_warmup.json"


def _training(model: torch.nn.Module | None) -> bool:
    """Whether a trainer's model is in training mode: TRL runs the hooks below in evaluation too."""
    return model is not None and model.training


def make_trainer_class() -> type:
    """GRPOTrainer, keeping what each step generates, scores and measures (built lazily:
    trl is slow to import)."""
    from trl import GRPOTrainer

    class CarlGRPOTrainer(GRPOTrainer):
        capture: StepCapture
        clock: StepClock  # the step's phases, where TRL runs them (engine/training/perf.py)
        generation_phi: GenerationPhi | None = (
            None  # set when the coherence rewards may measure while sampling
        )

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.clock = StepClock()  # started and ended by StepTimer, stopped by the reporter
            super().__init__(*args, **kwargs)

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            call = super()._generate_single_turn
            if self.generation_phi is None:
                return call(*args, **kwargs)
            return self.generation_phi.wrap(self, lambda: call(*args, **kwargs))

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            out = super()._generate_and_score_completions(inputs)
            if _training(self.model):  # this process's completions' advantages, in generation order
                self.capture.advantages = out["advantages"].detach().float().cpu().numpy().astype(np.float64)
            return out

        def _generate(self, prompts: list) -> Any:
            with self.clock.phase(GENERATION):  # tokenizing the prompts, sampling, decoding
                out = super()._generate(prompts)
            if _training(self.model):
                self.capture = StepCapture(
                    prompt_ids=[list(p) for p in out[0]], completion_ids=[list(c) for c in out[1]]
                )
                if self.generation_phi is not None:
                    sampled, width, seconds = self.generation_phi.take()
                    self.capture.sampled, self.capture.sampled_width = sampled, width
                    self.capture.phi_seconds += seconds
            return out

        def _calculate_rewards(
            self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any
        ) -> Any:
            with self.clock.phase(SCORING):  # every reward function, the coherence rewards' Φ included
                rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            if _training(self.model):
                self.capture.prompts, self.capture.completions = list(prompts), list(completions)
                self.capture.rewards = rewards.detach().float().cpu().numpy()
                self.capture.weights = self.reward_weights.tolist()
            return rewards

        def _get_per_token_logps_and_entropies(
            self,
            model: Any,
            input_ids: Any,
            attention_mask: Any,
            logits_to_keep: int,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            if _training(self.model) and not torch.is_grad_enabled():
                self.capture.forward_passes += 1  # a reference or old-policy forward (its FLOPs)
            with self.clock.phase(UPDATE):  # inside the loss already, or the forwards the loss needs
                logps, entropies, aux = super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
                )
            # compute_entropy=True only in the loss forward: the policy that sampled these tokens.
            if entropies is not None and _training(self.model):
                self.capture.add_forward(input_ids, attention_mask, logits_to_keep, entropies, logps)
            return logps, entropies, aux

        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            self.clock.begin(UPDATE)  # through the backward to the optimizer step (StepTimer ends it)
            return super().compute_loss(model, inputs, *args, **kwargs)

    return CarlGRPOTrainer


def make_sft_trainer_class() -> type:
    """SFTTrainer, timing the update and counting each step's tokens (built lazily, as the GRPO one)."""
    from trl import SFTTrainer

    class CarlSFTTrainer(SFTTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.clock = StepClock()
            self.lengths: list[int] = []  # this rank's sequence lengths in the current step
            super().__init__(*args, **kwargs)

        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if _training(self.model) and self.clock.running:
                self.clock.begin(UPDATE)
                mask = inputs.get("attention_mask")
                if mask is not None:
                    self.lengths += [int(n) for n in mask.sum(-1).tolist()]
                else:  # padding-free batches: one packed row
                    self.lengths.append(int(inputs["input_ids"].numel()))
            return super().compute_loss(model, inputs, *args, **kwargs)

    return CarlSFTTrainer


# -- the backend -----------------------------------------------------------------------------------


class TorchBackend:
    name = "torch"

    def __init__(
        self,
        config: TrainConfig,
        *,
        home: Path,
        output_dir: Path,
        reporter: Reporter,
        pump: CommandPump,
        resuming: bool = False,
        ranks: Ranks | None = None,
    ) -> None:
        self.config = config
        self.ranks = ranks or Ranks()  # several processes: rank 0 alone writes and prints
        self.home = home
        self.output_dir = output_dir
        self.reporter = reporter
        self.pump = pump
        self.resuming = resuming
        self.rng = np.random.default_rng(config.seed)  # which completion is the step's "random" trace
        self.rewards: RewardSet | None = None
        self.vocab_size = 0
        self.model_path = ""
        self.tokenizer: Any = None
        self.model: Any = None
        self.rows: list[dict[str, Any]] = []
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.token_texts: TokenTexts | None = None
        self.peak_flops: float | None = None  # one GPU's dense BF16 peak, where known: MFU

    # -- prepare -------------------------------------------------------------------------------

    def prepare(self) -> None:
        from transformers.utils import logging as hf_logging

        config = self.config
        offline_if_local(config.model)
        hf_logging.disable_progress_bar()  # the run's log is read as lines, by people and the control room
        if self.device == "cpu":
            torch.set_num_threads(CPU_THREADS)
        torch.manual_seed(config.seed)
        self.rows, held, self.rewards, self.model_path = checked_inputs(config, self.home)
        if held:
            self.say(holdout_line(self.rows, held))
        self.tokenizer, self.model = self._load(self.model_path)
        self.vocab_size = int(self.model.config.get_text_config().vocab_size)
        self.token_texts = TokenTexts(self.tokenizer.decode)
        self.peak_flops = self._peak_flops()

    def _peak_flops(self) -> float | None:
        """This GPU's peak from docs/reference/gpus.md §1 when it trains in BF16; on CPU, in FP32 or on a GPU
        the table does not name, None: no perf/mfu (a guessed peak would be a made-up MFU)."""
        if self.device != "cuda":
            return None
        name = torch.cuda.get_device_name()
        if not torch.cuda.is_bf16_supported():
            self.say(f"mfu: {name} trains in float32 here, and the peak table is BF16's: no perf/mfu")
            return None
        peak = gpu_peak(name)
        if peak is None:
            self.say(f"mfu: no peak FLOP/s known for {name!r} (docs/reference/gpus.md): no perf/mfu")
            return None
        self.say(
            f"mfu: {name}, {peak.bf16_tflops:g} TFLOP/s dense BF16 peak ({peak.gpu}, docs/reference/gpus.md)"
        )
        return peak.flops

    def model_flops(self, trainer: Any) -> ModelFlops | None:
        """The trained model's FLOPs per token, when there is a peak to divide them by (LoRA: the
        adapter's parameters are the trainable ones, the base's are frozen)."""
        if self.peak_flops is None:
            return None
        adapter = 0
        if self.config.lora.enabled:
            adapter = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        return ModelFlops.from_config(self.model.config.get_text_config().to_dict(), adapter_params=adapter)

    def step_perf(
        self,
        times: tuple[float, dict[str, float]] | None,
        prompt_lengths: Sequence[int],
        completion_lengths: Sequence[int] | None,
        *,
        flops: ModelFlops | None,
        forwards: int,
    ) -> StepPerf | None:
        return StepPerf.of(
            times,
            prompt_lengths,
            completion_lengths,
            ranks=self.ranks.world,
            per_gpu=self.ranks.world > 1 or self.device == "cuda",
            flops=flops,
            forwards=forwards,
            peak_flops=self.peak_flops,
        )

    def say(self, message: str) -> None:
        if self.ranks.is_main:
            _say(message)

    def _load(self, where: str) -> tuple[Any, Any]:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = torch.bfloat16 if self.device == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
        try:
            tokenizer = AutoTokenizer.from_pretrained(where)
            model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
        except OSError as exc:
            raise BadInput(
                f"model {self.config.model}: cannot load it ({' '.join(str(exc).split())[:200]})"
            ) from None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer, model

    # -- resume ----------------------------------------------------------------------------------

    def warmup_steps(self) -> int:
        return self.config.sft_warmup_steps if self.config.method == "grpo" else 0

    def warmup_done(self) -> bool:
        return (self.output_dir / WARMUP_DIR / WARMUP_DONE).is_file()

    def resume_point(self) -> tuple[Path | None, int]:
        """The newest complete checkpoint and the store step it stands for (what to keep)."""
        checkpoints = []
        for path in self.output_dir.glob("checkpoint-*"):
            number = path.name.removeprefix("checkpoint-")
            if number.isdigit() and (path / "trainer_state.json").is_file() and (path / CARL_STATE).is_file():
                checkpoints.append((int(number), path))
        if checkpoints:
            _, path = max(checkpoints)
            state = json.loads((path / CARL_STATE).read_text())
            return path, int(state["store_step"])
        return None, self.warmup_steps() if self.warmup_done() else 0

    # -- train -----------------------------------------------------------------------------------

    def train(self, resume_from: Path | None) -> str:
        config = self.config
        self.reporter.update_run(
            vocab_size=self.vocab_size, temperature=config.temperature, model=config.model
        )
        if config.method == "sft":
            return self._sft(
                self.model,
                steps=config.max_steps,
                offset=0,
                out=self.output_dir,
                resume_from=resume_from,
                warmup=False,
            )
        model, offset = self.model, 0
        if self.warmup_steps():
            if self.resuming and self.warmup_done():
                _, model = self._load(str(self.output_dir / WARMUP_DIR))
            elif "completion" not in dataset_columns(self.rows):
                self.say(f"no 'completion' column in {config.dataset}: skipping the SFT warm-up")
            else:
                status = self._sft(
                    model,
                    steps=self.warmup_steps(),
                    offset=0,
                    out=self.output_dir / WARMUP_DIR,
                    resume_from=None,
                    warmup=True,
                )
                if status != "finished":
                    return status
                model = self._save_warmup(model)
            offset = self.warmup_steps()
        return self._grpo(model, offset, resume_from)

    def save_final(self) -> Path | None:
        """The trained model (or adapter) and its tokenizer in `final/`, for eval and push."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return None
        path = self.output_dir / FINAL_DIR
        tmp = self.output_dir / (FINAL_DIR + ".tmp")
        ranks = self.ranks
        if ranks.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        ranks.barrier()
        trainer.save_model(str(tmp))  # every rank calls it; the main process writes
        ranks.barrier()
        if ranks.is_main:
            self.tokenizer.save_pretrained(tmp)
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)  # never a half-written final/
        ranks.barrier()
        return path

    def _common_args(self) -> dict[str, Any]:
        cpu = self.device == "cpu"
        return {
            "seed": self.config.seed,
            "learning_rate": self.config.learning_rate,
            "lr_scheduler_type": "constant",  # set_lr then means what it says
            "logging_steps": 1,
            "logging_nan_inf_filter": False,  # a NaN loss must reach the reporter, not be papered over
            "gradient_accumulation_steps": 1,  # one generation batch per optimizer step
            "report_to": [],
            "use_cpu": cpu,
            "bf16": not cpu and torch.cuda.is_bf16_supported(),
            "fp16": False,
            "dataloader_num_workers": 0,
            "disable_tqdm": True,
            "push_to_hub": False,
            **({"activation_checkpointing": False} if cpu else {}),  # recomputation only costs time on CPU
            **({"ddp_timeout": int(collective_timeout())} if self.ranks.world > 1 else {}),
        }

    def _peft_config(self) -> Any:
        lora = self.config.lora
        if not lora.enabled:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )

    def _sft(
        self, model: Any, *, steps: int, offset: int, out: Path, resume_from: Path | None, warmup: bool
    ) -> str:
        from datasets import Dataset
        from trl import SFTConfig

        rows = [{"prompt": r["prompt"], "completion": r["completion"]} for r in self.rows]
        args = SFTConfig(
            output_dir=str(out),
            max_steps=steps,
            per_device_train_batch_size=self.config.warmup_batch
            if warmup
            else self.config.per_device_train_batch_size,
            save_strategy="no" if warmup else "steps",
            save_steps=self.config.save_steps,
            save_total_limit=SAVE_TOTAL_LIMIT,
            **self._common_args(),
        )
        if warmup:
            args.learning_rate = self.config.warmup_lr
        reporter = SFTReporter(self, offset, "sft warm-up" if warmup else "sft")
        trainer = make_sft_trainer_class()(
            model=model,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=self.tokenizer,
            peft_config=self._peft_config(),
        )
        reporter.sft_trainer, reporter.flops = trainer, self.model_flops(trainer)
        # During a warm-up a new weight takes effect when GRPO starts; an SFT run has no rewards.
        set_weight = self.rewards.set_weight if self.rewards is not None else _no_rewards
        self._install(trainer, reporter, offset, set_weight=set_weight)
        started = time.monotonic()
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        self.say(f"{reporter.phase}: {trainer.state.global_step} steps in {time.monotonic() - started:.1f}s")
        self.trainer = trainer
        return "stopped" if self.pump.stopping else "finished"

    def _save_warmup(self, model: Any) -> Any:
        """Keep the warmed-up model on disk: a resumed GRPO phase starts from it (LoRA merged in)."""
        trained = self.trainer.model
        if hasattr(trained, "merge_and_unload"):
            trained = trained.merge_and_unload()
        path = self.output_dir / WARMUP_DIR
        if self.ranks.is_main:
            trained.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
            (path / WARMUP_DONE).write_text(json.dumps({"steps": self.warmup_steps()}) + "\n")
        self.ranks.barrier()
        return trained

    def _grpo(self, model: Any, offset: int, resume_from: Path | None) -> str:
        from datasets import Dataset
        from trl import GRPOConfig

        assert self.rewards is not None
        config, rewards = self.config, self.rewards
        if resume_from is not None:
            state = json.loads((resume_from / CARL_STATE).read_text())
            rewards.load_state_dict(state["rewards"])
        # `prompt` drives generation; every other column reaches the reward functions as a keyword.
        rows = [{key: value for key, value in row.items() if key != "completion"} for row in self.rows]
        args = GRPOConfig(
            output_dir=str(self.output_dir),
            max_steps=config.max_steps,
            per_device_train_batch_size=config.per_device_train_batch_size,
            num_generations=config.num_generations,
            max_completion_length=config.max_completion_length,
            temperature=config.temperature,
            beta=config.beta,
            epsilon=config.epsilon,
            save_steps=config.save_steps,
            save_total_limit=SAVE_TOTAL_LIMIT,
            reward_weights=rewards.current_weights(),
            # Each reward scaled to unit spread in its group before weighting: the weights, and so the
            # cap that keeps coherence below the task reward, are then each reward's share of the advantage.
            multi_objective_aggregation=config.aggregation,
            **self._common_args(),
        )
        trainer = make_trainer_class()(
            model=model,
            reward_funcs=rewards.funcs,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=self.tokenizer,
            peft_config=self._peft_config(),
        )
        trainer.capture = StepCapture()
        self.trainer = trainer
        if rewards.phi_rewards:
            rewards.set_phi_provider(RewardPhi(trainer, config.temperature))
            if config.phi_source == "generate":
                trainer.generation_phi = GenerationPhi(
                    config.temperature, lambda: rewards.needs_phi, self.say
                )
            if self.ranks.world > 1:
                rewards.set_calibration_pool(self._pool)
        reporter = GRPOReporter(self, rewards, offset)
        reporter.flops = self.model_flops(trainer)
        self._install(trainer, reporter, offset, set_weight=reporter.set_weight)
        started = time.monotonic()
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        steps = trainer.state.global_step
        self.say(f"grpo: {steps} steps in {time.monotonic() - started:.1f}s")
        return "stopped" if self.pump.stopping else "finished"

    def _pool(self, values: list[float]) -> list[float]:
        """Every rank's values, in rank order (the coherence reward calibrates on all of them)."""
        return [value for part in self.ranks.all_gather(values) for value in part]

    def _install(self, trainer: Any, reporter: TrainerCallback, offset: int, set_weight: Any) -> None:
        trainer.remove_callback(PrinterCallback)  # it prints every log as a dict; we print one line a step
        trainer.add_callback(StepTimer(trainer.clock, cuda=self.device == "cuda"))
        trainer.add_callback(reporter)
        save_state = getattr(reporter, "save_state", None)
        if save_state is not None and self.ranks.world > 1:
            save_state = self._ranked_save_state(save_state)
        trainer.add_callback(
            CommandCallback(self.pump, step_offset=offset, set_weight=set_weight, on_checkpoint=save_state)
        )

    def _ranked_save_state(self, save_state: Any) -> Any:
        """carl's state goes into a checkpoint last, marking it complete: once every rank has written
        its part (each rank its RNG state), by rank 0 alone."""

        def write(path: Path, step: int) -> None:
            self.ranks.barrier()
            if self.ranks.is_main:
                save_state(path, step)

        return write


def _no_rewards(reward: str, weight: float) -> str:
    raise CarlError("set_weight: an SFT run has no reward weights")


class RewardPhi:
    """Per-token Phi of this step's completions for the coherence rewards: the entropies measured while
    they were sampled when there are some for every completion, else one no-grad forward of prompt +
    completion ids through the policy (token t scored by the logits at t-1)."""

    def __init__(self, trainer: Any, temperature: float) -> None:
        self.trainer = trainer
        self.temperature = temperature

    def __call__(
        self,
        *,
        prompts: list,
        completions: list,
        completion_ids: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> list[np.ndarray | None]:
        started = time.perf_counter()
        capture: StepCapture = self.trainer.capture
        if completion_ids is None or len(capture.prompt_ids) != len(completion_ids):
            return [None] * len(completions)
        sampled = capture.sampled
        if sampled is not None and [len(h) for h in sampled] == [len(c) for c in completion_ids]:
            capture.phi_source = "generate"
            return [phi_from_entropy(h, capture.sampled_width) for h in sampled]
        capture.phi_source = "forward"
        capture.phi_seconds = 0.0  # the forward's time alone (not a sampling kernel that went unused)
        capture.forward_passes += 1
        sequences = [list(p) + list(c) for p, c in zip(capture.prompt_ids, completion_ids, strict=True)]
        width = max(len(s) for s in sequences)
        pad = self.trainer.processing_class.pad_token_id or 0
        device = self.trainer.accelerator.device
        input_ids = torch.full((len(sequences), width), pad, dtype=torch.long, device=device)
        attention = torch.zeros_like(input_ids)
        completion_mask = torch.zeros_like(input_ids)
        for row, (prompt, seq) in enumerate(zip(capture.prompt_ids, sequences, strict=True)):
            input_ids[row, : len(seq)] = torch.tensor(seq)
            attention[row, : len(seq)] = 1
            completion_mask[row, len(prompt) : len(seq)] = 1
        # phi_from_model runs without grad, in eval mode (no dropout), and restores the mode after.
        stats = phi_from_model(
            self.trainer.model, input_ids, attention, completion_mask, temperature=self.temperature
        )
        capture.phi_seconds += time.perf_counter() - started
        return [np.asarray(p, dtype=np.float64) for p in stats.phi]


# -- reporting -------------------------------------------------------------------------------------


def _say(message: str) -> None:
    print(f"[carl] {message}", flush=True)


def _fmt(logs: dict[str, Any], keys: Sequence[tuple[str, str]]) -> str:
    return " ".join(
        f"{label}={logs[key]:.4g}" for key, label in keys if isinstance(logs.get(key), int | float)
    )


class StepTimer(TrainerCallback):
    """A step's clock: started when transformers begins the step, its update closed at the optimizer step (on
    a GPU once the step's kernels are done, so their time is not left to the next step's first sync). The
    reporter stops the clock at the step's end; the phases are timed inside the trainer."""

    def __init__(self, clock: StepClock, *, cuda: bool) -> None:
        self.clock = clock
        self.cuda = cuda

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.clock.start()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.clock.end(UPDATE)


class SFTReporter(TrainerCallback):
    """Writes each SFT step's logs, with Phi derived from the mean token entropy TRL logs, and its perf."""

    def __init__(self, backend: TorchBackend, offset: int, phase: str) -> None:
        self.backend = backend
        self.offset = offset
        self.phase = phase
        self.sft_trainer: Any = None
        self.flops: ModelFlops | None = None
        self.perf: tuple[int, StepPerf] | None = None  # the step's, until its log

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        trainer = self.sft_trainer
        times = trainer.clock.stop()
        lengths, trainer.lengths = trainer.lengths, []
        if self.backend.ranks.world > 1:  # every rank's rows (every rank is here at this step)
            lengths = [n for part in self.backend.ranks.all_gather(lengths) for n in part]
        perf = self.backend.step_perf(times, lengths, None, flops=self.flops, forwards=0)
        self.perf = None if perf is None else (self.offset + state.global_step, perf)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs:
            return
        step = self.offset + state.global_step
        record = StepRecord(step, numeric_logs(logs))
        if self.perf is not None and self.perf[0] == step:
            record.perf, self.perf = self.perf[1], None
        entropy = record.metrics.get("entropy")
        if entropy is not None:
            record.phi = {
                "phi_mean": entropy_to_phi(entropy, self.backend.vocab_size),
                "entropy_mean": entropy,
                "weighting": "token",
                "vocab_size": self.backend.vocab_size,
            }
        self.backend.reporter.write(record)
        _check_loss(record)
        total = self.backend.config.total_steps
        self.backend.say(
            f"{self.phase} step {step}/{total} "
            + _fmt(logs, (("loss", "loss"), ("entropy", "entropy"), ("mean_token_accuracy", "acc")))
        )

    def save_state(self, path: Path, step: int) -> None:
        _write_state(path, {"store_step": step, "step_offset": self.offset, "rewards": None})


def _check_loss(record: StepRecord) -> None:
    if "loss" in record.metrics and record.metrics["loss"] is None:
        raise TrainingFailed(f"the loss became NaN at step {record.step}")


def _write_state(path: Path, state: dict[str, Any]) -> None:
    # Written last into the checkpoint: a checkpoint without it is incomplete and not resumed from.
    tmp = path / (CARL_STATE + ".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, path / CARL_STATE)


class GRPOReporter(TrainerCallback):
    """Per GRPO step: the gate, Phi from the loss forward, a few traces, then TRL's logs; one write."""

    SHOWN = (("reward", "reward"), ("rewards/task/mean", "task"), ("entropy", "entropy"))

    def __init__(self, backend: TorchBackend, rewards: RewardSet, offset: int) -> None:
        self.backend = backend
        self.rewards = rewards
        self.offset = offset
        self.pending: StepRecord | None = None
        self.phi_source: str | None = None  # the coherence rewards' path so far (an event when it changes)
        self.flops: ModelFlops | None = None

    @property
    def trainer(self) -> Any:
        return self.backend.trainer

    def set_weight(self, reward: str, weight: float) -> str:
        result = self.rewards.set_weight(reward, weight)
        self._apply_weights()
        return result

    def _apply_weights(self) -> None:
        self.trainer.reward_weights = torch.tensor(self.rewards.current_weights(), dtype=torch.float32)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._apply_weights()  # a resumed gate may already be open

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = self.offset + state.global_step
        times = self.trainer.clock.stop()  # what follows is the step's record, not the step
        # Several ranks: every rank's completions (TRL gathered the rewards already), so the gate, Phi
        # and the samples are the same on every rank; rank 0 writes them.
        capture: StepCapture = self.trainer.capture.pooled(self.backend.ranks)
        record = StepRecord(step)
        # Every rank's tokens; each sequence was generated once, then taken through the extra forwards and
        # the trained one (rank 0's count of forwards: every rank runs the same ones).
        record.perf = self.backend.step_perf(
            times,
            [len(p) for p in capture.prompt_ids],
            [len(c) for c in capture.completion_ids],
            flops=self.flops,
            forwards=1 + capture.forward_passes,
        )
        gate = self.rewards.gate
        if gate is not None:
            was_open = gate.opened_at is not None
            state_now = gate.update(step, capture.task_mean(self.rewards.names, self.rewards.task_names))
            record.gate = state_now.row()
            if not was_open and state_now.opened_at is not None:
                record.events.append(("gate_open", state_now.reason))
            self._apply_weights()
        entropies = capture.entropies()
        known = [e for e in entropies if e is not None]
        if known:
            vocab = self.backend.vocab_size
            record.phi, phi_metrics = step_phi_stats(
                step, [phi_from_entropy(e, vocab) for e in known], known, vocab
            )
            record.metrics.update(phi_metrics)  # the record's first metrics
            record.samples = self._samples(capture, entropies)
        # Entropy percentiles and Cov(log π, A) from the same loss forward; TRL logs the rest of RL health
        # itself (kl when beta > 0, clip_ratio/*, completions/*, frac_reward_zero_std).
        record.metrics.update(step_token_metrics(entropies, capture.logprobs(), capture.advantages))
        if self.backend.ranks.is_main:
            started = time.perf_counter()
            record.rollouts = self._rollouts(capture, entropies)
            record.metrics[ROLLOUT_SECONDS] = time.perf_counter() - started
        if capture.phi_source is not None:
            # Which path the coherence rewards took, and its time (the sampling kernel's host time on a GPU).
            record.metrics[PHI_FROM_GENERATE] = float(capture.phi_source == "generate")
            record.metrics[f"timing/phi_{capture.phi_source}"] = capture.phi_seconds
            if capture.phi_source != self.phi_source:
                record.events.append(("phi_source", capture.phi_source))
                self.phi_source = capture.phi_source
        self.pending = record

    def _samples(self, capture: StepCapture, entropies: list[np.ndarray | None]) -> list[dict[str, Any]]:
        if capture.rewards is None:
            return []
        totals = capture.totals()
        tokenizer = self.backend.tokenizer
        out = []
        for kind, index in pick_traces(totals, self.backend.rng).items():
            entropy = entropies[index]
            ids = capture.completion_ids[index]
            rewards = {name: _finite(capture.rewards[index, j]) for j, name in enumerate(self.rewards.names)}
            phi = None if entropy is None else phi_from_entropy(entropy, self.backend.vocab_size)
            out.append(
                {
                    "idx": int(index),
                    "kind": kind,
                    "prompt": prompt_text(capture.prompts[index]),
                    "completion": completion_text(capture.completions[index]),
                    "tokens": [tokenizer.decode([t]) for t in ids],
                    "entropy": None if entropy is None else [round(float(h), 5) for h in entropy],
                    "phi": None if phi is None else [round(float(p), 6) for p in phi],
                    "rewards": {**rewards, "total": _finite(totals[index])},
                }
            )
        return out

    def _rollouts(self, capture: StepCapture, entropies: list[np.ndarray | None]) -> list[dict[str, Any]]:
        if capture.rewards is None:
            return []
        config = self.backend.config
        assert self.backend.token_texts is not None
        return step_rollouts(
            prompts=[prompt_text(p) for p in capture.prompts],
            completions=[completion_text(c) for c in capture.completions],
            token_ids=capture.completion_ids,
            token_texts=self.backend.token_texts,
            names=self.rewards.names,
            rewards=capture.rewards,
            totals=capture.totals(),
            advantages=capture.advantages,
            entropies=entropies,
            logprobs=capture.logprobs(),
            group=config.num_generations,
            cap=config.rollouts_per_step,
        )

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs:
            return
        step = self.offset + state.global_step
        record = self.pending if self.pending is not None and self.pending.step == step else StepRecord(step)
        self.pending = None
        # TRL's keys, and the per-completion Phi metrics computed at the step's end.
        record.metrics = {**numeric_logs(logs), **record.metrics}
        self.backend.reporter.write(record)
        _check_loss(record)
        gate = f" gate={record.gate['state']}" if record.gate else ""
        phi = f" phi={record.phi['phi_mean']:.4f}" if record.phi else ""
        self.backend.say(
            f"grpo step {step}/{self.backend.config.total_steps} {_fmt(logs, self.SHOWN)}{phi}{gate}"
        )

    def save_state(self, path: Path, step: int) -> None:
        _write_state(
            path, {"store_step": step, "step_offset": self.offset, "rewards": self.rewards.state_dict()}
        )


def _finite(value: Any) -> float | None:
    value = float(value)
    return round(value, 6) if math.isfinite(value) else None  # float32 rewards: 0.2, not 0.20000000298
