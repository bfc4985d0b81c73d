"""Throughput and MFU pieces on their own: the model's FLOPs per token against a hand count, the GPU names the
peak table matches (and the ones it must not), the step clock's phases, and what a step's record says.

The real runs of both backends check the perf/* keys they write (tests/test_training_runner.py,
tests/test_mlx_training.py, tests/test_training_distributed.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.training.flops import PEAKS, ModelFlops, gpu_peak
from engine.training.perf import GENERATION, SCORING, UPDATE, StepClock, StepPerf

ROOT = Path(__file__).resolve().parent.parent

# -- FLOPs per token ----------------------------------------------------------------------------------------

TINY_N = 2 * (64 * 16 * (2 * 4 + 2 * 4) + 3 * 64 * 128) + 512 * 64  # docs/reference/gpus.md §2


def test_the_tiny_models_flops_per_token_by_hand(tiny_model: Path) -> None:
    config = json.loads((tiny_model / "config.json").read_text())
    flops = ModelFlops.from_config(config)
    assert flops is not None
    assert TINY_N == 114_688
    assert (flops.matmul_params, flops.layers, flops.attention_width) == (TINY_N, 2, 64)
    # Per token at T = 10: a forward 2N + 4·L·H·Q·T, trained 6N + 12·L·H·Q·T (PaLM, appendix B).
    assert flops.forward(10) == 10 * (2 * TINY_N + 4 * 2 * 64 * 10) == 2_344_960
    assert flops.train(10) == 10 * (6 * TINY_N + 12 * 2 * 64 * 10) == 7_034_880
    # A step: each sequence generated once (a forward) and trained once.
    assert flops.step([10, 10], forwards=1, trained=True) == 2 * (2_344_960 + 7_034_880)


def test_n_is_the_weights_a_token_multiplies_through(tiny_model: Path) -> None:
    """N from the config equals the loaded model's linear layers' weights (the tied LM head once), and leaves
    out the input embedding's lookup and the norms."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    linear = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert sum(linear.values()) == TINY_N
    total = sum(p.numel() for p in model.parameters())
    assert total - TINY_N == sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    # The torch backend counts from the loaded model's config, MLX from config.json: the same.
    loaded = ModelFlops.from_config(model.config.get_text_config().to_dict())
    assert loaded == ModelFlops.from_config(json.loads((tiny_model / "config.json").read_text()))


def test_a_grouped_query_model_with_its_own_head_dim() -> None:
    """Qwen2.5-0.5B's published config (2 KV heads of 64 for 14 query heads, tied, |V| 151,936): 494M
    parameters, of which N counts all but the biases and norms."""
    config = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151_936,
        "tie_word_embeddings": True,
    }
    flops = ModelFlops.from_config(config)
    assert flops is not None
    per_layer = 896 * 64 * (2 * 14 + 2 * 2) + 3 * 896 * 4864
    assert flops.matmul_params == 24 * per_layer + 151_936 * 896 == 493_961_216
    assert flops.attention_width == 14 * 64
    lora = ModelFlops.from_config(config, adapter_params=1000)
    assert lora is not None
    assert lora.train(1) == 4 * flops.matmul_params + 6 * 1000 + 12 * 24 * 896
    assert lora.forward(1) == 2 * (flops.matmul_params + 1000) + 4 * 24 * 896


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "qwen3_moe", "num_experts_per_tok": 8},  # a mixture of experts
        {"model_type": "mixtral", "num_local_experts": 8},
        {"model_type": "gpt2", "n_embd": 768},  # another architecture
        {"model_type": "llama", "intermediate_size": None},  # a config without one of its sizes
        {"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2},
    ],
)
def test_what_is_not_a_dense_gated_decoder_has_no_count(config: dict) -> None:
    base = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 16}
    assert ModelFlops.from_config({**base, "hidden_size": 8, **config}) is None


def test_a_multimodal_config_is_counted_on_its_text_config() -> None:
    text = {
        "model_type": "qwen2",
        "hidden_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 16,
        "vocab_size": 32,
    }
    assert ModelFlops.from_config({"model_type": "x_vl", "text_config": text}) == ModelFlops.from_config(text)


# -- the peak table -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.5),
        ("NVIDIA H100", 989.5),
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", 835.5),
        ("NVIDIA H200", 989.5),
        ("NVIDIA H200 NVL", 835.5),
        ("NVIDIA GH200 480GB", 989.5),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-SXM4-40GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L40S", 362.05),
        ("NVIDIA L40", 181.05),
        ("NVIDIA L4", 121.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA A40", 149.7),
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA GeForce RTX 3090", 71.0),
        ("NVIDIA RTX A6000", 154.8),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GB200", 2500.0),
        ("nvidia  h100  80gb  hbm3", 989.5),  # case and spacing are not the name
    ],
)
def test_gpu_names_match_their_row(name: str, tflops: float) -> None:
    peak = gpu_peak(name)
    assert peak is not None and peak.bf16_tflops == tflops and peak.flops == tflops * 1e12


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA GeForce RTX 4090 Laptop GPU",  # another chip, another peak
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA A10G",  # not NVIDIA's A10 datasheet
        "NVIDIA H800",
        "NVIDIA H20",
        "Tesla V100-SXM2-16GB",
        "Tesla T4",
        "AMD Instinct MI300X",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a slice of the GPU
        "NVIDIA L40S-48Q",
        "",
    ],
)
def test_names_the_table_does_not_hold_have_no_peak(name: str) -> None:
    assert gpu_peak(name) is None


def test_the_code_table_is_the_documented_one() -> None:
    """docs/reference/gpus.md §1 cites a source per row; the code's PEAKS hold the same GPUs and figures."""
    text = (ROOT / "docs" / "reference" / "gpus.md").read_text(encoding="utf-8")
    section = text.split("## 1.", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    documented = {cells[0].lstrip("| "): float(cells[2].replace(",", "")) for cells in rows[1:]}
    assert documented == {peak.gpu: peak.bf16_tflops for peak in PEAKS}
    assert all(re.search(r"\w", cells[3]) for cells in rows[1:])  # every row names its source


# -- the step clock and the record --------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_counts_each_phase_once_and_only_inside_a_step() -> None:
    now = FakeClock()
    clock = StepClock(now)
    clock.begin(GENERATION)  # before any step: an evaluation's generation, say
    now.now = 5.0
    clock.end(GENERATION)
    assert clock.stop() is None
    clock.start()
    with clock.phase(GENERATION):
        now.now = 7.0
    with clock.phase(SCORING):
        now.now = 7.5
    clock.begin(UPDATE)  # opened in one hook (the loss)...
    with clock.phase(UPDATE):  # ...the loss forward inside it is not counted twice
        now.now = 8.0
    now.now = 9.0
    clock.end(UPDATE)  # ...closed in another (the optimizer step)
    clock.end(UPDATE)  # an extra end changes nothing
    now.now = 9.25
    assert clock.stop() == (4.25, {GENERATION: 2.0, SCORING: 0.5, UPDATE: 1.5})
    clock.start()
    clock.begin(UPDATE)
    now.now = 10.0
    assert clock.stop() == (0.75, {UPDATE: 0.75})  # a phase still open ends with the step


def test_a_grpo_steps_record() -> None:
    perf = StepPerf.of(
        (2.0, {GENERATION: 1.0, SCORING: 0.25, UPDATE: 0.5}),
        [10, 20],
        [30, 40],
        ranks=2,
        per_gpu=True,
    )
    assert perf is not None
    assert perf.metrics() == {
        "perf/step_time_s": 2.0,
        "perf/tokens_per_s": 50.0,
        "perf/samples_per_s": 1.0,
        "perf/prompt_tokens_per_s": 15.0,
        "perf/completion_tokens_per_s": 35.0,
        "perf/time/generation_s": 1.0,
        "perf/time/scoring_s": 0.25,
        "perf/time/update_s": 0.5,
        "perf/tokens_per_s_per_gpu": 25.0,
    }


def test_mfu_is_the_steps_model_flops_over_the_peak_of_every_rank() -> None:
    model = ModelFlops(matmul_params=1_000_000, layers=2, attention_width=64)
    lengths = ([100, 200], [50, 50])
    perf = StepPerf.of((0.5, {}), *lengths, ranks=2, flops=model, forwards=2, peak_flops=1e12)
    assert perf is not None
    flops = sum(2 * model.forward(n) + model.train(n) for n in (150, 250))
    assert perf.metrics()["perf/mfu"] == pytest.approx(flops / 0.5 / 2e12)
    assert 0 < perf.metrics()["perf/mfu"] < 1
    # No peak (CPU, an unknown GPU) or no count (another architecture): no MFU, never a guess.
    for peak, counted in ((None, model), (1e12, None)):
        assert "perf/mfu" not in StepPerf.of((0.5, {}), *lengths, flops=counted, peak_flops=peak).metrics()


def test_an_sft_step_has_what_applies_and_a_stepless_clock_no_record() -> None:
    perf = StepPerf.of((0.5, {UPDATE: 0.45}), [12, 8])
    assert perf is not None
    assert perf.metrics() == {
        "perf/step_time_s": 0.5,
        "perf/tokens_per_s": 40.0,
        "perf/samples_per_s": 4.0,
        "perf/time/update_s": 0.45,
    }
    assert StepPerf.of(None, [1]) is None
    assert StepPerf.of((0.0, {}), [1]).metrics() == {}  # type: ignore[union-attr]
