"""A short, real TRL GRPO run of the tiny model on the demo task, observed through Trackio.

It leaves what a user's own TRL script would leave, so the control room can observe it:
a Trackio project at `<out_dir>/trackio/carl-demo.db` (keys prefixed `train/`) and
`<out_dir>/grpo/trainer_state.json` plus checkpoints. Everything runs on CPU and offline.

Run it as its own process (`python -m engine.demo OUT_DIR`): Trackio reads TRACKIO_DIR once, at
import, so one process can write only one Trackio directory.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from engine.models.tiny import build_tiny_model, default_model_dir

from .task import REWARD_FUNCS, task_rows

TRACKIO_PROJECT = "carl-demo"
# The matrices are tiny, so intra-op threads only add synchronisation: on a 2-core box, where
# Trackio's writer thread shares the cores, two threads measured 2-10x slower than one.
TORCH_THREADS = 1

# Tuned on a 2-core CPU. A GRPO step samples 8 completions (at most 24 tokens) for one prompt:
# with 4, the group baseline was too noisy for rewards to move within 120 steps; with 8 and this
# learning rate, format reward climbs from about 0.6 to 0.9 while entropy falls, at 12-20 steps/s.
GRPO_SETTINGS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "num_generations": 8,
    "max_completion_length": 24,
    "learning_rate": 1e-3,
    "lr_scheduler_type": "constant",
    "temperature": 1.0,
    "beta": 0.0,
    "logging_steps": 1,
    "save_steps": 20,
    "save_total_limit": 2,
}
SFT_SETTINGS: dict[str, Any] = {
    "per_device_train_batch_size": 32,
    "learning_rate": 5e-3,
    "lr_scheduler_type": "constant",
    "logging_steps": 5,
}
# Settings both trainers share: CPU, float32, no hub, no tqdm (progress goes to stdout as lines).
COMMON_SETTINGS: dict[str, Any] = {
    "use_cpu": True,
    "bf16": False,
    "fp16": False,
    "activation_checkpointing": False,  # recomputation only costs time at this size
    "dataloader_num_workers": 0,
    "disable_tqdm": True,
    "push_to_hub": False,
}


def run_observed_demo(
    out_dir: Path,
    *,
    max_steps: int = 120,
    model_dir: Path | None = None,
    seed: int = 0,
    warmup_sft_steps: int = 30,
) -> Path:
    """Build the tiny model, warm it up with SFT, then train it with GRPO. Returns out_dir."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    _prepare_environment(out_dir / "trackio")

    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(TORCH_THREADS)
    model_dir = build_tiny_model(model_dir or default_model_dir(), seed=seed)
    model, tokenizer = _load(model_dir)
    _say(f"model {model_dir} ({sum(p.numel() for p in model.parameters()):,} parameters)")
    if warmup_sft_steps > 0:
        model = _sft_warmup(model, tokenizer, out_dir / "sft", steps=warmup_sft_steps, seed=seed)
    _grpo(model, tokenizer, out_dir / "grpo", max_steps=max_steps, seed=seed)
    return out_dir


def _prepare_environment(trackio_dir: Path) -> None:
    """Offline, local-only settings; they must be in place before transformers or trackio import."""
    trackio = sys.modules.get("trackio")
    if trackio is not None and Path(trackio.utils.TRACKIO_DIR).resolve() != trackio_dir.resolve():
        raise RuntimeError(
            f"trackio was already imported with TRACKIO_DIR={trackio.utils.TRACKIO_DIR}; "
            "run the demo in its own process (python -m engine.demo OUT_DIR)"
        )
    os.environ["TRACKIO_DIR"] = str(trackio_dir)
    # A Space or server here would send metrics off the machine.
    for name in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_DATASET_ID", "TRACKIO_BUCKET_ID"):
        os.environ.pop(name, None)
    os.environ.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
            # The process log is read by people and by the control room: lines, not progress bars.
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        }
    )


def _say(message: str) -> None:
    print(f"[carl-demo] {message}", flush=True)


def _load(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    return model, tokenizer


def _sft_warmup(model: Any, tokenizer: Any, out_dir: Path, *, steps: int, seed: int) -> Any:
    """A few SFT steps on the gold calls, so GRPO starts from a model that emits call-like text."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    rows = [{"prompt": row["prompt"], "completion": row["completion"]} for row in task_rows(seed)]
    args = SFTConfig(
        output_dir=str(out_dir),
        max_steps=steps,
        seed=seed,
        save_strategy="no",
        report_to=[],
        **SFT_SETTINGS,
        **COMMON_SETTINGS,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    _print_progress(trainer, "sft", ("loss", "mean_token_accuracy", "entropy"))
    started = time.monotonic()
    trainer.train()
    _say(f"sft warm-up: {steps} steps in {time.monotonic() - started:.1f}s")
    return trainer.model


def _grpo(model: Any, tokenizer: Any, out_dir: Path, *, max_steps: int, seed: int) -> None:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    # `prompt` drives generation; the answer columns reach the reward functions as keywords.
    rows = [{key: row[key] for key in ("prompt", "answer_tool", "answer_city")} for row in task_rows(seed)]
    args = GRPOConfig(
        output_dir=str(out_dir),
        max_steps=max_steps,
        seed=seed,
        report_to=["trackio"],
        project=TRACKIO_PROJECT,
        run_name=f"demo-seed{seed}",
        trackio_space_id=None,
        trackio_static_space_id=False,  # never create or sync a Hugging Face Space
        **GRPO_SETTINGS,
        **COMMON_SETTINGS,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=list(REWARD_FUNCS),  # typed as TRL's list (of rewards, models or names)
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    _print_progress(trainer, "grpo", ("reward", "reward_std", "entropy", "completions/mean_length"))
    started = time.monotonic()
    trainer.train()
    elapsed = time.monotonic() - started
    trainer.save_state()  # <out_dir>/trainer_state.json, beside the checkpoints
    trainer.save_model()
    _say(f"grpo: {max_steps} steps in {elapsed:.1f}s ({max_steps / elapsed:.2f} steps/s)")


def _print_progress(trainer: Any, phase: str, keys: tuple[str, ...]) -> None:
    """Print one short line per logging step (for a person tailing the process log), in place of
    the trainer's own printer, which dumps every metric as a dict."""
    from transformers import PrinterCallback, TrainerCallback

    class Progress(TrainerCallback):
        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
        ) -> None:
            if not logs or "train_runtime" in logs:
                return
            shown = " ".join(
                f"{key}={logs[key]:.4g}" for key in keys if isinstance(logs.get(key), int | float)
            )
            _say(f"{phase} step {state.global_step}/{state.max_steps} {shown}")

    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(Progress())
