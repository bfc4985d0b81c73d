"""What MFU is made of: a model's FLOPs per token, from its config, and a GPU's peak, from its name.

MFU (model FLOPs utilisation) is the model FLOP/s a step achieved divided by the hardware's peak
(docs/reference/gpus.md §2-3). Both halves are known only sometimes, and where either is unknown there
is no MFU: never a guessed peak, never a guessed architecture.

- The model's FLOPs follow PaLM's accounting (Chowdhery et al. 2022, appendix B; docs/reference/gpus.md §2):
  per token, 2·N for a forward and 6·N for a forward and backward, N the parameters a token multiplies
  through (the attention and MLP projections of every layer and the LM head; the input embedding is a
  lookup), plus the attention scores, 4·L·H·Q·T forward and 12·L·H·Q·T trained, at sequence length T
  over the whole T x T matrix as PaLM counts it. A frozen base under LoRA has no weight gradients: 4·N,
  and 6 per trainable adapter parameter.
- The peak is the datasheet's dense BF16 tensor-core figure, per GPU, matched whole against
  `torch.cuda.get_device_name()` (docs/reference/gpus.md §1 cites each row). Only names in the table
  match: a laptop part, a MIG slice or a GPU NVIDIA publishes no figure for has none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TERA = 1e12


@dataclass(frozen=True)
class GpuPeak:
    """One row of docs/reference/gpus.md §1: a GPU and its peak dense BF16 tensor FLOP/s."""

    gpu: str  # as the datasheet names it
    names: str  # a pattern matched whole (case-insensitive) against the CUDA device name
    bf16_tflops: float

    @property
    def flops(self) -> float:
        return self.bf16_tflops * TERA


# Dense BF16 with FP32 accumulation (what training runs). Datasheets give the figure "with sparsity"
# (2:4 structured), twice the dense one; the dense one is the peak a model's matmuls can reach.
PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak("B200 (HGX)", r"NVIDIA B200", 2250.0),
    GpuPeak("GB200 (NVL72)", r"NVIDIA GB200", 2500.0),
    GpuPeak("H200 SXM", r"NVIDIA H200( 141GB)?( HBM3e)?", 989.5),
    GpuPeak("H200 NVL", r"NVIDIA H200 NVL", 835.5),
    GpuPeak("H100 SXM", r"NVIDIA H100( SXM5?)?( (64|80|94|96)GB)?( HBM3e?)?", 989.5),
    GpuPeak("H100 PCIe", r"NVIDIA H100 PCIe", 756.5),
    GpuPeak("H100 NVL", r"NVIDIA H100 NVL", 835.5),
    GpuPeak("GH200", r"NVIDIA GH200( (96|144|480)GB)?( HBM3e?)?", 989.5),
    GpuPeak(
        "A100 (SXM4, PCIe; 40 and 80 GB)",
        r"NVIDIA A100(-SXM4?-(40|80)GB|-PCIE-(40|80)GB| (40|80)GB PCIe)?",
        312.0,
    ),
    GpuPeak("A40", r"NVIDIA A40", 149.7),
    GpuPeak("A10", r"NVIDIA A10", 125.0),
    GpuPeak("L40S", r"NVIDIA L40S", 362.05),
    GpuPeak("L40", r"NVIDIA L40", 181.05),
    GpuPeak("L4", r"NVIDIA L4", 121.0),
    GpuPeak("RTX A6000", r"NVIDIA RTX A6000", 154.8),
    GpuPeak("GeForce RTX 4090", r"NVIDIA GeForce RTX 4090", 165.2),
    GpuPeak("GeForce RTX 3090", r"NVIDIA GeForce RTX 3090", 71.0),
)
_COMPILED = tuple((re.compile(p.names, re.IGNORECASE), p) for p in PEAKS)


def gpu_peak(device_name: str) -> GpuPeak | None:
    """The table's row for a CUDA device name (`torch.cuda.get_device_name()`), or None: not known."""
    name = " ".join(device_name.split())
    return next((peak for pattern, peak in _COMPILED if pattern.fullmatch(name)), None)


# Dense decoders whose blocks are attention (q, k, v, o) and a gated MLP (gate, up, down), with these config
# keys (transformers' LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config). Any other architecture, and any
# mixture of experts, has no FLOPs count here rather than a wrong one.
GATED_DECODERS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
EXPERT_KEYS = ("num_experts_per_tok", "num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelFlops:
    """A dense decoder's FLOPs per token (docs/reference/gpus.md §2)."""

    matmul_params: int  # N: the attention and MLP projections of every layer, and the LM head
    layers: int  # L
    attention_width: int  # H·Q: query heads x head dimension
    adapter_params: int = 0  # trainable LoRA parameters; > 0 means the base weights are frozen

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, adapter_params: int = 0) -> ModelFlops | None:
        """From a Hugging Face config (the text config of a multimodal one), or None when it is not a dense
        gated decoder this counts."""
        text = config.get("text_config") or config
        if text.get("model_type") not in GATED_DECODERS or any(text.get(k) for k in EXPERT_KEYS):
            return None
        try:
            hidden = int(text["hidden_size"])
            layers = int(text["num_hidden_layers"])
            heads = int(text["num_attention_heads"])
            kv_heads = int(text.get("num_key_value_heads") or heads)
            head_dim = int(text.get("head_dim") or hidden // heads)
            mlp = int(text["intermediate_size"])
            vocab = int(text["vocab_size"])
        except (KeyError, TypeError, ValueError):
            return None
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
        per_layer = attention + 3 * hidden * mlp  # gate, up, down
        return cls(layers * per_layer + vocab * hidden, layers, heads * head_dim, adapter_params)

    def forward(self, length: int) -> float:
        """A forward over a sequence of `length` tokens (generating it counts the same)."""
        n = self.matmul_params + self.adapter_params
        return length * (2.0 * n + 4.0 * self.layers * self.attention_width * length)

    def train(self, length: int) -> float:
        """A forward and backward over a sequence of `length` tokens."""
        attention = 12.0 * self.layers * self.attention_width * length
        if self.adapter_params:
            return length * (4.0 * self.matmul_params + 6.0 * self.adapter_params + attention)
        return length * (6.0 * self.matmul_params + attention)

    def step(self, lengths: list[int], *, forwards: int, trained: bool) -> float:
        """A step's FLOPs over its sequences: `forwards` passes without gradients over each (generating
        it, a reference or old-policy forward, the coherence rewards' forward), and one trained pass."""
        total = 0.0
        for length in lengths:
            total += forwards * self.forward(length)
            if trained:
                total += self.train(length)
        return total


__all__ = ["PEAKS", "GpuPeak", "ModelFlops", "gpu_peak"]
