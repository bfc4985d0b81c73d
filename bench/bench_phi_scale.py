"""Φ at real scale: GRPO steps of a randomly initialised model with Qwen2.5-0.5B's shape, with and without
the coherence rewards.

The model: |V| 151,936, hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4,864, tied embeddings; a
Qwen2 config built here, nothing downloaded, random weights (the tiny model's tokenizer: its ids are
a subset of the vocabulary). Training: TRL's GRPOTrainer through our `CarlGRPOTrainer`, LoRA (r 16,
every linear layer), one prompt a step, 8 completions of 64 tokens, temperature 1. Three arms,
each `--steps` steps after one warm-up step:
  task      a task reward only (a cheap Python function of the text)
  generate  + the coherence reward, Φ from the generating pass (engine/training/phi_sampling.py)
  forward   + the coherence reward, Φ from one no-grad forward (the fallback path)
Figures:
  coherence cost per step: Φ's own time in the step (the sampling kernel, or the forward) over the
            step's time, in the same step (goal <= 3%); and the arms' step times for reference
  memory    peak RSS added by Φ (CPU): across each sampling-kernel call, and during the forward path's
            forward (goal: at most one kernel chunk, 4 MiB)
  lm_head   Φ's time against the lm_head matmul of the same decoding steps
On 2 shared CPU cores each step takes tens of seconds: the defaults (2 steps an arm) take ~10 minutes.
`--device cuda` runs it in bf16 on a GPU (bench/gpu_check.py does).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from engine.coherence.phi import CHUNK_ELEMENTS  # noqa: E402

QWEN25_05B = {
    "vocab_size": 151_936,
    "hidden_size": 896,
    "intermediate_size": 4_864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32_768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
MIB = 2**20
PROMPTS = [
    "<|user|>\nWhat is the weather in Paris?</s>\n<|assistant|>\n",
    "<|user|>\nCall the weather tool for Oslo.</s>\n<|assistant|>\n",
    "<|user|>\nIs it raining in Lima today?</s>\n<|assistant|>\n",
]


def build(device: str, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from engine.models.tiny import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(Path(tempfile.mkdtemp()) / "carl-tiny"))
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    config = Qwen2Config(
        **QWEN25_05B,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device, dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def task_reward(completions: list, **kwargs: Any) -> list[float]:
    return [min(len(c), 64) / 64 for c in completions]


class Meter:
    """Times and RSS growth of the Φ calls and of the lm_head matmuls during generation."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.proc = psutil.Process()
        self.lm_head = 0.0
        self.phi = 0.0
        self.phi_rss = 0  # bytes: largest RSS growth across one sampling-kernel call
        self.forward_rss = 0  # bytes: peak RSS growth during the forward path's call
        self._started = 0.0

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def hook_lm_head(self, model: Any) -> None:
        head = model.get_output_embeddings()

        def before(module: Any, args: Any) -> None:
            if args[0].shape[1] == 1:  # a decoding step (the loss forward projects every position)
                self.sync()
                self._started = time.perf_counter()

        def after(module: Any, args: Any, output: Any) -> None:
            if args[0].shape[1] == 1:
                self.sync()
                self.lm_head += time.perf_counter() - self._started

        head.register_forward_pre_hook(before)
        head.register_forward_hook(after)

    def wrap_sampler(self, sampler: Any) -> None:
        meter, call = self, sampler.__class__.__call__

        def measured(processor: Any, input_ids: Any, scores: Any) -> Any:
            meter.sync()
            rss, started = meter.proc.memory_info().rss, time.perf_counter()
            out = call(processor, input_ids, scores)
            meter.sync()
            meter.phi += time.perf_counter() - started
            meter.phi_rss = max(meter.phi_rss, meter.proc.memory_info().rss - rss)
            return out

        # processor(input_ids, scores) looks __call__ up on the class: give this one a measuring subclass.
        sampler.__class__ = type("MeasuredSamplingEntropy", (sampler.__class__,), {"__call__": measured})

    def peak_rss(self, fn: Any) -> Any:
        base, peak, done = self.proc.memory_info().rss, [0], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], self.proc.memory_info().rss - base)
                time.sleep(0.002)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            return fn()
        finally:
            done.set()
            thread.join()
            self.forward_rss = max(self.forward_rss, peak[0])


def run_arm(arm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig

    from engine.training.phi_sampling import GenerationPhi
    from engine.training.torch_backend import RewardPhi, make_trainer_class

    meter = Meter(args.device)
    steps: list[dict[str, float]] = []

    def coherence(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float]:
        started = time.perf_counter()
        phi = meter.peak_rss(
            lambda: provider(prompts=prompts, completions=completions, completion_ids=completion_ids)
        )
        meter.sync()
        if trainer.capture.phi_source == "forward":
            meter.phi += time.perf_counter() - started
        return [float(np.mean(p)) for p in phi]

    class Steps(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            meter.sync()
            meter.phi = meter.lm_head = 0.0
            meter.phi_rss = meter.forward_rss = 0
            self.started = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            meter.sync()
            steps.append(
                {
                    "step": time.perf_counter() - self.started,
                    "phi": meter.phi,
                    "lm_head": meter.lm_head,
                    "phi_rss": meter.phi_rss,
                    "forward_rss": meter.forward_rss,
                }
            )
            print(
                f"  {arm:8} step {len(steps)}: {steps[-1]['step']:.2f}s, phi {meter.phi * 1e3:.1f} ms,"
                f" lm_head (decoding) {meter.lm_head * 1e3:.1f} ms",
                flush=True,
            )

    cuda = args.device == "cuda"
    model, tokenizer = build(
        args.device, torch.bfloat16 if cuda else torch.float32
    )  # the same weights each arm
    config = GRPOConfig(
        output_dir=str(out / arm),
        max_steps=args.steps + 1,
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=64,
        temperature=1.0,
        learning_rate=1e-5,
        use_cpu=not cuda,
        bf16=cuda,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        seed=0,
        **({} if cuda else {"activation_checkpointing": False}),  # as the backend: a CPU-only setting
    )
    funcs: list[Any] = [task_reward] + ([coherence] if arm != "task" else [])
    trainer = make_trainer_class()(
        model=model,
        reward_funcs=funcs,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 8]),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(Steps())
    provider = RewardPhi(trainer, 1.0)
    if arm == "generate":
        trainer.generation_phi = GenerationPhi(1.0, lambda: True, lambda line: print(f"  {line}"))
        original = trainer.generation_phi._place

        def place(t: Any, m: Any) -> None:
            first = trainer.generation_phi.sampler is None
            original(t, m)
            if first:
                meter.wrap_sampler(trainer.generation_phi.sampler)

        trainer.generation_phi._place = place
    meter.hook_lm_head(trainer.model)
    trainer.train()
    kept = steps[1:]  # the first step warms up (allocator, numba's cache load, kernels)
    result = {
        "step": statistics.median(s["step"] for s in kept),
        "phi": statistics.median(s["phi"] for s in kept),
        "lm_head": statistics.median(s["lm_head"] for s in kept),
        "phi_rss": max(s["phi_rss"] for s in kept),
        "forward_rss": max(s["forward_rss"] for s in kept),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="GRPO on a Qwen2.5-0.5B-shaped model: what Φ costs")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--steps", type=int, default=2, help="measured steps an arm (after one warm-up)")
    parser.add_argument("--arms", default="task,generate,forward")
    args = parser.parse_args()
    began = time.perf_counter()
    if args.device == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    model, _ = build(args.device, torch.bfloat16 if args.device == "cuda" else torch.float32)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: Qwen2 {params / 1e6:.0f}M parameters, |V| {QWEN25_05B['vocab_size']:,}, {args.device};"
        f" built in {time.perf_counter() - began:.0f}s",
        flush=True,
    )
    del model
    out = Path(tempfile.mkdtemp(prefix="carl-phi-scale-"))
    results = {}
    for arm in args.arms.split(","):
        results[arm] = run_arm(arm, args, out)
        gc.collect()  # the arm's model and trainer, before the next is built
    print("arm       step s   phi ms   phi/step   lm_head ms (decoding)   phi/lm_head")
    for arm, r in results.items():
        share = r["phi"] / r["step"]
        versus = r["phi"] / r["lm_head"] if r["lm_head"] else math.nan
        print(
            f"{arm:8} {r['step']:7.2f} {r['phi'] * 1e3:8.1f} {share:9.2%} {r['lm_head'] * 1e3:12.1f} "
            f"{versus:22.2f}"
        )
    chunk = CHUNK_ELEMENTS * 4 / MIB
    if "generate" in results:
        r = results["generate"]
        print(
            f"coherence cost per step (generating pass): {r['phi'] / r['step']:.2%} of the step (goal <= 3%);"
            f" Φ {r['phi'] / r['lm_head']:.2f}x the decoding lm_head matmuls"
        )
        if args.device == "cpu":
            print(
                f"peak RSS added by Φ (generating pass): {r['phi_rss'] / MIB:.1f} MiB (goal <= one chunk, "
                f"{chunk:.0f} MiB)"
            )
    if "forward" in results:
        r = results["forward"]
        print(f"coherence cost per step (forward path): {r['phi'] / r['step']:.2%} of the step")
        if args.device == "cpu":
            print(f"peak RSS added by Φ (forward path): {r['forward_rss'] / MIB:.0f} MiB")
    if "task" in results and "generate" in results:
        print(
            f"step time, generate arm / task arm: {results['generate']['step'] / results['task']['step']:.3f}"
            " (arms run one after the other: shared-machine noise included)"
        )
    print(f"took {time.perf_counter() - began:.0f}s")


if __name__ == "__main__":
    main()
