"""Phi per token, measured from the distribution that generated the token (docs/reference/carl.md §1-2).

    H   = -sum_v p_v ln p_v   (nats)        Phi = 1 - H / ln|V|

`token_entropy` reduces [N, V] logits row chunk by row chunk in float32 and never holds more
than two [chunk, V] float32 buffers; `completion_token_stats` applies the alignment rule
(completion token t is scored by the logits at t-1, prompt included as context);
`phi_from_model` runs the no-grad forward that produces those logits.

Only training code imports this module: torch is imported here, never in `engine.coherence`.

How a chunk is reduced, and why not the textbook e = exp(z - m), s = sum e, t = sum e*z: on
CPU `torch.exp` costs more than the whole `torch.softmax` kernel, whose vectorised exp is
faster. So each chunk (two float32 buffers, reused) takes
    m = max z,  d = (z - m) / temperature (upcast to float32),  p = softmax(d),
    P = sum p,  p_max = max p,  T = sum p * d (in place in p)
and, with e = exp(d) and S the kernel's own normaliser (p = e / S, and p_max = 1 / S because
the largest d is 0):
    ln sum e = ln P - ln p_max,   H = ln sum e - T / P,   lse = m / temperature + ln sum e.
Dividing by our own P (an accurate pairwise sum) cancels the rounding of the kernel's S, and
the shift by m keeps every product in T small, so float32 is exact to ~1e-6 nats at any offset.
On 2,048 x 151,936 float32 logits this is about 2x one softmax and 6-8x faster than TRL's
`entropy_from_logits` CPU path (bench/bench_phi.py).

On the CPU, when numba is installed (the `train` extra), a contiguous float32/bf16/fp16 tensor
goes to `engine.coherence.phi_numba` instead: one read of the logits with an exp that
vectorises, about 3x faster again on one thread (its docstring; docs/results/phi-kernel.md).
On CUDA, when Triton is installed (torch's CUDA wheels bring it), a tensor with unit column stride
goes to `engine.coherence.phi_triton`: the same one-read reduction, where the torch kernel's chain
of ops reads a float32 chunk many times (docs/results/phi-kernel.md).
`kernel="torch"` (or CARL_PHI_KERNEL=torch in the environment) keeps the torch kernel.
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

ArrayT = TypeVar("ArrayT", "Tensor", np.ndarray)

# A chunk holds about this many logits (4 MiB per float32 buffer; 6 rows at |V| = 151,936).
# bench/bench_phi.py sweeps chunk_rows on a 2-core CPU: 4-8 rows at that width are fastest, with
# 1-2 rows paying per-op overhead and 32+ rows falling out of cache.
CHUNK_ELEMENTS = 1 << 20
# On a GPU each op of a chunk is a kernel launch (~10 a chunk), so small chunks are launch-bound:
# 64 MiB per float32 buffer (110 rows at |V| = 151,936). bench/gpu_check.py sweeps it.
CHUNK_ELEMENTS_GPU = 1 << 24


def default_chunk_rows(vocab_size: int, device_type: str = "cpu") -> int:
    elements = CHUNK_ELEMENTS if device_type == "cpu" else CHUNK_ELEMENTS_GPU
    return max(1, elements // max(1, vocab_size))


# -- the kernel -------------------------------------------------------------------------------


def token_entropy(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    kernel: Literal["auto", "torch", "numba", "triton"] = "auto",
) -> tuple[Tensor, Tensor]:
    """Entropy (nats) and log-sum-exp of softmax(logits / temperature), row by row.

    logits: [N, V] in float32, bfloat16 or float16 (any floating dtype; reduced in float32).
    Returns two float32 [N] tensors on the logits' device. Masked columns (-inf) carry zero
    probability; a row with no finite logit has no distribution and gives NaN.
    kernel: "auto" takes the numba kernel where it applies (`numba_applies`: CPU), the Triton one
    where it applies (`triton_applies`: CUDA), and the torch one elsewhere; "torch", "numba" or
    "triton" insists on one. Extra memory: two [chunk_rows, V] float32 buffers for the torch kernel,
    whatever N is; none for the numba and Triton kernels (they ignore chunk_rows).
    """
    import torch

    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if kernel not in ("auto", "torch", "numba", "triton"):
        raise ValueError(f"kernel must be 'auto', 'torch', 'numba' or 'triton', got {kernel!r}")
    if kernel == "auto" and os.environ.get("CARL_PHI_KERNEL", "auto") == "torch":
        kernel = "torch"
    if kernel in ("auto", "numba") and numba_applies(logits):
        return _numba_entropy(logits, temperature)
    if kernel in ("auto", "triton") and triton_applies(logits):
        from engine.coherence import phi_triton

        return phi_triton.token_entropy(logits, temperature=temperature)
    if kernel == "triton":
        raise ValueError(
            "the Triton kernel needs triton installed and a CUDA float32, bfloat16 or float16 tensor with"
            f" unit column stride; got {logits.dtype} on {logits.device}"
        )
    if kernel == "numba":
        raise ValueError(
            "the numba kernel needs numba installed and a contiguous float32, bfloat16 or float16 "
            f"CPU tensor; got {logits.dtype} on {logits.device}"
            f"{'' if logits.is_contiguous() else ', not contiguous'}"
        )
    n, v = logits.shape
    entropy = torch.empty(n, dtype=torch.float32, device=logits.device)
    lse = torch.empty(n, dtype=torch.float32, device=logits.device)
    rows = max(1, min(chunk_rows or default_chunk_rows(v, logits.device.type), n))
    shifted = torch.empty(rows, v, dtype=torch.float32, device=logits.device)
    probs = torch.empty_like(shifted)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        chunk = logits[start:stop]
        h, lz = _reduce_chunk(chunk, temperature, shifted[: stop - start], probs[: stop - start])
        entropy[start:stop], lse[start:stop] = h, lz
    return entropy, lse


_numba_kernel: Any = None  # engine.coherence.phi_numba once imported; False where numba is missing


def _phi_numba() -> Any:
    global _numba_kernel
    if _numba_kernel is None:
        try:
            from engine.coherence import phi_numba
        except ImportError:  # numba is in the `train` extra, not the base install
            _numba_kernel = False
        else:
            _numba_kernel = phi_numba
    return _numba_kernel


def numba_applies(logits: Tensor) -> bool:
    """Whether `token_entropy` can take the numba kernel for these logits: numba installed, a CPU
    tensor, float32, bfloat16 or float16, contiguous."""
    import torch

    return (
        logits.device.type == "cpu"
        and logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and logits.dim() == 2
        and logits.is_contiguous()
        and bool(_phi_numba())
    )


_has_triton: bool | None = None


def triton_applies(logits: Tensor) -> bool:
    """Whether `token_entropy` can take the Triton kernel for these logits: triton installed, a CUDA
    tensor, float32, bfloat16 or float16, unit stride along the vocabulary."""
    import torch

    global _has_triton
    if logits.device.type != "cuda" or logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if logits.dim() != 2 or logits.stride(-1) != 1:
        return False
    if _has_triton is None:
        from engine.coherence import phi_triton

        _has_triton = phi_triton.available()
    return _has_triton


def _numba_entropy(logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    import torch

    values = logits.detach()
    bfloat16 = values.dtype == torch.bfloat16
    array = (values.view(torch.uint16) if bfloat16 else values).numpy()
    # As many threads as torch's own ops would use, so neither path is the slow one.
    entropy, lse = _phi_numba().token_entropy(
        array, temperature=temperature, bfloat16=bfloat16, threads=torch.get_num_threads()
    )
    return torch.from_numpy(entropy), torch.from_numpy(lse)


def _reduce_chunk(chunk: Tensor, temperature: float, shifted: Tensor, probs: Tensor) -> tuple[Tensor, Tensor]:
    """(entropy, lse) of one chunk; `shifted` and `probs` are float32 buffers of its shape."""
    import torch

    m = chunk.amax(dim=-1, keepdim=True).float()
    # The shift keeps the products summed below small, so float32 gets H to ~1e-6 nats whatever
    # the logits' offset. A low-precision chunk is upcast into the buffer first and shifted in
    # place: a mixed-dtype sub would allocate a float32 temporary of the chunk's size.
    same = chunk.dtype == torch.float32
    d = torch.sub(chunk, m, out=shifted) if same else shifted.copy_(chunk).sub_(m)
    if temperature != 1.0:
        d.div_(temperature)
    p = torch.softmax(d, dim=-1, out=probs)
    total = p.sum(dim=-1, keepdim=True)  # P: 1 up to the kernel's rounding of its normaliser
    log_norm = total.log() - p.amax(dim=-1, keepdim=True).log()  # ln sum exp(d)
    # T = sum p * d, in place: no third buffer. A masked column gives 0 * -inf = NaN and carries no
    # probability, so it is dropped. On the CPU the NaN check is free; on a GPU it would wait for the
    # device at every chunk (every decoding step, in the generating pass), so nansum drops them there.
    # A NaN logit still gives NaN: its row's P is NaN.
    if chunk.device.type != "cpu":
        dot = p.mul_(d).nansum(dim=-1, keepdim=True)
    else:
        dot = p.mul_(d).sum(dim=-1, keepdim=True)
        if bool(dot.isnan().any()):
            dot = torch.where(dot.isnan(), p.nansum(dim=-1, keepdim=True), dot)
    entropy = (log_norm - dot / total).clamp_(min=0.0)  # clamp: rounding just below 0 only
    return entropy.squeeze(-1), (m / temperature + log_norm).squeeze(-1)


def reference_entropy(logits: Tensor, *, temperature: float = 1.0) -> Tensor:
    """Float64 entropy (nats) by plain log_softmax, for tests and benches: [N, V] -> [N]."""
    import torch

    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    # xlogy-style: 0 * -inf is 0 at masked columns, not NaN.
    return -torch.where(logp.isneginf(), torch.zeros_like(logp), logp.exp() * logp).sum(dim=-1)


def phi_from_entropy(entropy: ArrayT, vocab_size: int) -> ArrayT:
    """Phi = 1 - H / ln|V|, with |V| the logits width (docs/reference/carl.md §1);
    a tensor or a numpy array."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return 1.0 - entropy / math.log(vocab_size)


def selected_token_stats(
    logits: Tensor, next_ids: Tensor, lse: Tensor, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """(probability, surprisal in nats) of next_ids[i] under row i, with `lse` from `token_entropy`.

    logits [N, V], next_ids [N], lse [N] (same temperature). Both results are float32 [N].
    """
    picked = logits.gather(-1, next_ids.long().unsqueeze(-1)).squeeze(-1).float()
    logp = (picked / temperature - lse).clamp_(max=0.0)  # rounding can put it a hair above 0
    return logp.exp(), -logp


# -- completions ------------------------------------------------------------------------------


@dataclass
class CompletionTokenStats:
    """Per-token values of each completion (float32 arrays, one per sequence, completion tokens only)."""

    phi: list[np.ndarray]
    entropy: list[np.ndarray]  # nats
    selected_prob: list[np.ndarray]
    surprisal: list[np.ndarray]  # nats
    vocab_size: int
    temperature: float

    def __len__(self) -> int:
        return len(self.phi)


def completion_mask_from_lengths(prompt_lengths: Any, attention_mask: Tensor) -> Tensor:
    """Completion positions: column >= prompt_lengths[b] and not padding.

    prompt_lengths[b] is the column of row b's first completion token (padding before it
    included), e.g. len(prompt) for right-padded prompt + completion rows.
    """
    import torch

    lengths = torch.as_tensor(prompt_lengths, device=attention_mask.device).view(-1, 1)
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device).view(1, -1)
    return (columns >= lengths) & attention_mask.bool()


def completion_token_stats(
    logits: Tensor,
    input_ids: Tensor,
    *,
    completion_mask: Tensor | None = None,
    prompt_lengths: Any = None,
    attention_mask: Tensor | None = None,
    vocab_size: int | None = None,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
) -> CompletionTokenStats:
    """Phi, entropy, selected probability and surprisal of every completion token.

    logits [B, T, V] from a plain forward over the prompt + completion ids [B, T]. Completion
    token t is scored by logits[:, t - 1] (docs/reference/carl.md §2): the prompt is context, and prompt and
    padding positions are masked out. Give `completion_mask` [B, T] (1 at completion tokens),
    or `prompt_lengths` [B] with an optional `attention_mask` for the padding. `vocab_size`
    defaults to the logits width, which is the |V| of Phi.
    """
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(input_ids.shape):
        raise ValueError(
            f"logits {tuple(logits.shape)} must be [B, T, V] over input_ids {tuple(input_ids.shape)}"
        )
    mask = _completion_mask(input_ids, completion_mask, prompt_lengths, attention_mask)
    width = vocab_size or logits.shape[-1]
    out = CompletionTokenStats([], [], [], [], width, temperature)
    for row in range(input_ids.shape[0]):
        stats = _sequence_stats(logits[row], input_ids[row], mask[row], temperature, chunk_rows)
        entropy, prob, surprisal = (t.cpu().numpy().astype(np.float32, copy=False) for t in stats)
        out.phi.append((1.0 - entropy / np.float32(math.log(width))).astype(np.float32))
        out.entropy.append(entropy)
        out.selected_prob.append(prob)
        out.surprisal.append(surprisal)
    return out


def _completion_mask(
    input_ids: Tensor, completion_mask: Tensor | None, prompt_lengths: Any, attention_mask: Tensor | None
) -> Tensor:
    import torch

    if completion_mask is not None:
        mask = torch.as_tensor(completion_mask, device=input_ids.device).bool()
    elif prompt_lengths is not None:
        attention = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        mask = completion_mask_from_lengths(prompt_lengths, attention.to(input_ids.device))
    else:
        raise ValueError("give completion_mask or prompt_lengths")
    if mask.shape != input_ids.shape:
        raise ValueError(f"completion mask {tuple(mask.shape)} must match input_ids {tuple(input_ids.shape)}")
    if bool(mask[:, 0].any()):
        raise ValueError("a completion token at column 0 has no previous position to be scored by")
    return mask


def _sequence_stats(
    logits: Tensor, ids: Tensor, mask: Tensor, temperature: float, chunk_rows: int | None
) -> tuple[Tensor, Tensor, Tensor]:
    """(entropy, selected_prob, surprisal) at one sequence's completion tokens."""
    import torch

    positions = mask.nonzero().squeeze(-1)
    if positions.numel() == 0:
        empty = torch.empty(0, dtype=torch.float32)
        return empty, empty, empty
    first, last = int(positions[0]), int(positions[-1])
    # One contiguous view of rows first-1 .. last-1 (no copy); rows inside it that are not
    # completion positions (rare holes in the mask) are reduced and then dropped.
    span = logits[first - 1 : last]
    entropy, lse = token_entropy(span, temperature=temperature, chunk_rows=chunk_rows)
    prob, surprisal = selected_token_stats(span, ids[first : last + 1], lse, temperature=temperature)
    keep = positions - first
    return entropy[keep], prob[keep], surprisal[keep]


# -- from a model -----------------------------------------------------------------------------


def phi_from_model(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    completion_mask: Tensor,
    *,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    vocab_size: int | None = None,
    batch_size: int | None = None,
) -> CompletionTokenStats:
    """No-grad forwards of a causal LM over prompt + completion ids, reduced to per-token Phi.

    The logits stay in the model's dtype and are reduced chunk by chunk in float32. Positions
    before the earliest completion token's predecessor are not projected at all when the model
    takes `logits_to_keep` (transformers' causal LMs do), and `batch_size` rows per forward
    bound the logits held at once (default: all rows in one forward). The model runs in eval
    mode (no dropout) and its mode is restored after. |V| defaults to the LM head's width.
    """
    import torch

    mask = torch.as_tensor(completion_mask, device=input_ids.device).bool()
    if bool(mask[:, 0].any()):
        raise ValueError("a completion token at column 0 has no previous position to be scored by")
    width = vocab_size or _logits_width(model)
    step = batch_size or max(1, input_ids.shape[0])
    out = CompletionTokenStats([], [], [], [], width, temperature)
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, input_ids.shape[0], step):
                rows = slice(start, start + step)
                attention = attention_mask[rows] if attention_mask is not None else None
                part = _forward_stats(
                    model, input_ids[rows], attention, mask[rows], width, temperature, chunk_rows
                )
                for name in ("phi", "entropy", "selected_prob", "surprisal"):
                    getattr(out, name).extend(getattr(part, name))
    finally:
        model.train(was_training)
    return out


def _forward_stats(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    mask: Tensor,
    width: int,
    temperature: float,
    chunk_rows: int | None,
) -> CompletionTokenStats:
    if not bool(mask.any()):  # nothing to score: skip the forward
        empty = [np.zeros(0, dtype=np.float32) for _ in range(input_ids.shape[0])]
        return CompletionTokenStats(empty, list(empty), list(empty), list(empty), width, temperature)
    kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        first = int(mask.any(dim=0).nonzero()[0])
        kwargs["logits_to_keep"] = input_ids.shape[1] - (first - 1)  # columns first-1 .. T-1
    logits = model(**kwargs).logits
    offset = input_ids.shape[1] - logits.shape[1]  # columns dropped on the left
    return completion_token_stats(
        logits,
        input_ids[:, offset:],
        completion_mask=mask[:, offset:],
        vocab_size=width,
        temperature=temperature,
        chunk_rows=chunk_rows,
    )


def _logits_width(model: Any) -> int:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.vocab_size)


__all__ = [
    "CHUNK_ELEMENTS",
    "CHUNK_ELEMENTS_GPU",
    "CompletionTokenStats",
    "completion_mask_from_lengths",
    "completion_token_stats",
    "default_chunk_rows",
    "numba_applies",
    "phi_from_entropy",
    "phi_from_model",
    "reference_entropy",
    "selected_token_stats",
    "token_entropy",
    "triton_applies",
]
