"""Phi's kernel on CUDA, written in Triton: one read of the logits, one exp per logit.

    H = -sum_v p_v ln p_v   (nats)        Phi = 1 - H / ln|V|

The torch kernel (engine/coherence/phi.py) is a chain of ops, each a pass over a float32 chunk: on a
GPU it costs many reads of the logits, where this kernel reads them once. `engine.coherence.phi.
token_entropy` takes it for contiguous CUDA tensors when Triton is installed (it comes with torch's
CUDA wheels). The same reduction as the numba kernel (engine/coherence/phi_numba.py), in base 2: one
program per row walks it in blocks of BLOCK columns:
  - the block's maximum bm; if it is above the running maximum m, the sums move to the new shift:
    with c = (m - bm) * log2(e) / temperature and a = 2^c, S <- a S and D <- a (D + c S);
  - then with y = (z - m) * log2(e) / temperature (y <= 0) and e = 2^y:  S += sum e,  D += sum e y,
and at the end H = ln 2 (log2 S - D / S), lse = m / temperature + ln S. S and D are float32, kept per lane
(BLOCK lanes, each summing |V| / BLOCK terms) and added up once at the end. Masked (-inf) columns
give e = 0 and add nothing; a row with no finite logit gives NaN, and so does a NaN logit.

Only training code imports this module (it imports triton); it is never imported where triton is
missing (`available()`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

# Columns a program reads per iteration, and its warps. bench/gpu_check.py sweeps them on
# [8192 x 151,936] bf16: on an H100, 4096 columns with 4 or 8 warps take 1.08-1.09x one read of the
# logits, 2048 with 8 warps 1.21x, 16 warps 1.36-2.4x (docs/results/phi-kernel.md).
BLOCK = 4096
NUM_WARPS = 8

_kernel: Any = None


def available() -> bool:
    """Whether Triton imports here (torch's CUDA wheels bring it)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _compiled() -> Any:
    """The @triton.jit kernel, defined on first use (importing triton costs ~1 s)."""
    global _kernel
    if _kernel is not None:
        return _kernel
    import triton
    import triton.language as tl

    @triton.jit
    def entropy_rows(x_ptr, h_ptr, lse_ptr, stride, n_cols, scale, BLOCK: tl.constexpr):  # noqa: N803
        row = tl.program_id(0)
        base = x_ptr + row.to(tl.int64) * stride
        lanes = tl.arange(0, BLOCK)
        m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)  # running maximum of the logits
        s = tl.zeros([BLOCK], dtype=tl.float32)  # sum of 2^y, y = (z - m) * scale, per lane
        d = tl.zeros([BLOCK], dtype=tl.float32)  # sum of 2^y * y, per lane
        for start in range(0, n_cols, BLOCK):
            cols = start + lanes
            z = tl.load(base + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            new = tl.maximum(m, tl.max(z, axis=0))
            if new > m:  # a new running maximum: move what was summed to the new shift
                shift = (m - new) * scale  # -inf on the first finite block, where s and d are 0
                a = tl.exp2(shift)
                d = a * (d + tl.where(s > 0, shift * s, 0.0))
                s = a * s
                m = new
            # The shift before the scaling keeps y exact at any offset of the logits; while every column
            # so far is masked, m is -inf and so is y.
            y = (z - tl.where(m > -float("inf"), m, 0.0)) * scale
            e = tl.exp2(y)
            s += e
            d += tl.where(e > 0, e * y, 0.0)  # e = 0: a masked column (0 * -inf would be NaN)
        total = tl.sum(s, axis=0)
        dot = tl.sum(d, axis=0)
        ln2 = 0.6931471805599453
        h = ln2 * (tl.log2(total) - dot / total)
        h = tl.where(h < 0.0, 0.0, h)  # rounding just below 0 only; NaN stays NaN
        lse = ln2 * (m * scale + tl.log2(total))  # m / temperature + ln S
        ok = total > 0.0  # no finite logit: no distribution
        tl.store(h_ptr + row, tl.where(ok, h, float("nan")))
        tl.store(lse_ptr + row, tl.where(ok, lse, float("nan")))

    _kernel = entropy_rows
    return _kernel


def token_entropy(
    logits: Tensor, *, temperature: float = 1.0, block: int = BLOCK, num_warps: int = NUM_WARPS
) -> tuple[Tensor, Tensor]:
    """Entropy (nats) and log-sum-exp of softmax(logits / temperature) per row: two float32 [N] tensors.

    logits: [N, V] float32, bfloat16 or float16 with unit stride along V (rows may be strided).
    """
    import torch

    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"logits must be [N, V] with unit column stride, got shape {tuple(logits.shape)}")
    n, v = logits.shape
    entropy = torch.empty(n, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        _compiled()[(n,)](
            logits,
            entropy,
            lse,
            logits.stride(0),
            v,
            math.log2(math.e) / temperature,
            BLOCK=block,
            num_warps=num_warps,
        )
    return entropy, lse


__all__ = ["BLOCK", "available", "token_entropy"]
