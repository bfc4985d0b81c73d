"""Φ's kernels on CUDA (`pytest -m gpu`; skipped without CUDA): the Triton and torch kernels against float64,
and the generating pass against a forward over the same tokens. bench/gpu_check.sh runs these and the rest of
the GPU check (speed, memory, a GRPO run, NCCL, the 0.5B-shaped benchmark)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.coherence.phi import reference_entropy, token_entropy, triton_applies

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]
V = 151_936
TOL = 1e-5  # nats


@pytest.fixture(scope="module")
def logits() -> torch.Tensor:
    torch.manual_seed(0)
    base = torch.randn(64, V, device="cuda") * 3
    base[1, ::3] = -math.inf  # masked columns
    base[2] += 1e4  # a large offset
    base[3, :] = -math.inf
    base[3, 7] = 0.0  # one-hot
    return base


@pytest.mark.parametrize("kernel", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kernels_match_float64_on_cuda(
    logits: torch.Tensor, kernel: str, dtype: torch.dtype, temperature: float
) -> None:
    x = logits.to(dtype)
    entropy, lse = token_entropy(x, temperature=temperature, kernel=kernel)
    assert entropy.device.type == "cuda" and entropy.dtype == torch.float32
    assert float((entropy.double() - reference_entropy(x, temperature=temperature)).abs().max()) <= TOL
    expected = torch.logsumexp(x.double() / temperature, dim=-1)
    assert torch.allclose(lse.double(), expected, rtol=1e-6, atol=1e-5)


def test_auto_takes_triton_on_cuda_and_nan_rows_stay_nan(logits: torch.Tensor) -> None:
    assert triton_applies(logits)
    x = logits[:8].clone()
    x[4] = -math.inf  # no finite logit: no distribution
    x[5, 100] = math.nan
    entropy, lse = token_entropy(x)
    assert torch.isnan(entropy[4]) and torch.isnan(lse[4]) and torch.isnan(entropy[5])
    assert not torch.isnan(entropy[[0, 1, 2, 3, 6, 7]]).any()
    assert float(entropy[3]) == 0.0


def test_the_generating_pass_on_cuda_equals_the_forward(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from engine.coherence.phi import phi_from_model
    from engine.training.phi_sampling import SamplingEntropy, recording

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model: Any = AutoModelForCausalLM.from_pretrained(tiny_model).to("cuda").eval()
    prompts = [
        tokenizer(p).input_ids for p in ("<|user|>\nWhat is the weather in Paris?</s>\n<|assistant|>\n", "Hi")
    ]
    pad, eos = tokenizer.pad_token_id or 0, [tokenizer.eos_token_id, *range(100, 140)]
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device="cuda")
    attention = (
        torch.arange(width, device="cuda")[None, :]
        >= torch.tensor([width - len(p) for p in prompts], device="cuda")[:, None]
    ).long()
    config = GenerationConfig(
        do_sample=True, temperature=0.7, max_new_tokens=16, pad_token_id=pad, eos_token_id=eos
    )
    sampler = SamplingEntropy(0.7, eos)
    sampler.place(model, config)
    with recording(model, sampler):
        out = model.generate(input_ids=ids, attention_mask=attention, generation_config=config)
    completions = []
    for row in out[:, width:].tolist():
        ends = [i for i, t in enumerate(row) if t in eos]
        completions.append(row[: ends[0] + 1] if ends else row)
    sampled = sampler.per_sequence([len(c) for c in completions])
    assert sampled is not None
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    full = max(map(len, rows))
    batch = torch.tensor([r + [pad] * (full - len(r)) for r in rows], device="cuda")
    mask = torch.tensor(
        [
            [0] * len(p) + [1] * len(c) + [0] * (full - len(p) - len(c))
            for p, c in zip(prompts, completions, strict=True)
        ],
        device="cuda",
    )
    forward = phi_from_model(model, batch, (batch != pad) | (mask > 0), mask, temperature=0.7)
    for got, want in zip(sampled, forward.entropy, strict=True):
        assert float(abs(got - want).max()) <= TOL
