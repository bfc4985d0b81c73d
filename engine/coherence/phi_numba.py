"""Phi's kernel on the CPU, compiled by numba: one read of the logits, at the speed of the vector units.

    H = -sum_v p_v ln p_v   (nats)        Phi = 1 - H / ln|V|

`token_entropy` gives the entropy and log-sum-exp of softmax(logits / temperature) for each row of
an [N, V] float32, float16 or bfloat16 array. `engine.coherence.phi.token_entropy` calls it for
contiguous CPU tensors when numba is installed (the `train` extra); the torch kernel there stays
for GPUs and as the fallback. Only training code imports this module: the TUI never loads numba.

How a row is reduced. It is walked once, in blocks of BLOCK columns that stay in the L1 cache:
  - the block's maximum bm, taken on the float32 bit patterns as integers (a float max reduction
    with NaN semantics does not vectorise; an integer one does, and maps to the same order);
  - if bm is above the running maximum m, what was summed so far is moved to the new shift:
    with delta = (m - bm) / temperature, S <- e^delta * S and D <- e^delta * (D + delta * S);
  - then, with d = (z - m) / temperature in float32 (d <= 0), e = exp(d):
        S += sum e,   D += sum e * d,
    and at the end H = ln S - D / S, lse = m / temperature + ln S.
So the logits are read from memory once, and each logit costs one exp. exp is a Cephes-style
polynomial (range reduction by ln 2 split in two, degree 6, 2^n built from exponent bits) that
LLVM vectorises: ~1e-7 relative, where numba's `math.exp` is a scalar libm call per element.
Where d < -88 the term is exactly 0, which also gives masked (-inf) columns zero probability
without a 0 * -inf NaN. S and D are float32 sums within a block (the vectoriser spreads each over
the vector lanes) and float64 across blocks: H is within ~1e-6 nats of float64 at
V = 151,936 (float32's own rounding of H near 12 nats is 5e-7).

A row with no finite logit has no distribution: its entropy and lse are NaN; a NaN logit gives
NaN. Rows are independent, so splitting them across threads (`threads`, nogil) changes no bit.

The compiled code is cached on disk (numba's `cache=True`, in __pycache__ beside this file, or
NUMBA_CACHE_DIR): the first call on a machine compiles for about a second per input dtype, and
later processes load it in milliseconds.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# Columns per block: 4 KiB of float32 logits (2 KiB of bf16/fp16), read from memory by the max sweep
# and again from L1 by the exp sweep. Timed on [2048 x 151,936] float32 at one thread while this was
# written: blocks of 256-2048 are within ~10% of each other, 8192 (32 KiB, past L1) ~20% slower.
# And no float32 partial sum holds more than BLOCK terms, even where the loop is not vectorised.
BLOCK = 1024
# Rows are split across threads only when each thread gets at least this many logits.
MIN_ELEMENTS_PER_THREAD = 1 << 18

_I32_MIN = np.int32(-(2**31))
_MAGNITUDE = np.int32(0x7FFFFFFF)
_SIGN_SHIFT = np.int32(31)
_FLOOR = np.float32(-88.0)  # exp(-88) = 6e-39: below float32's smallest normal, so the term is 0
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # ln 2 in two parts: n * _LN2_HI is exact for |n| <= 128
_LN2_LO = np.float32(-2.12194440e-4)
# Cephes expf: e^r ~ 1 + r + r^2 (P5 + r (P4 + r (P3 + r (P2 + r (P1 + r P0))))) for |r| <= ln2 / 2.
_P0, _P1, _P2, _P3 = (
    np.float32(1.9875691500e-4),
    np.float32(1.3981999507e-3),
    np.float32(8.3334519073e-3),
    np.float32(4.1665795894e-2),
)
_P4, _P5 = np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)


# -- bit casts numba has no spelling for (inlined by LLVM, so the loops still vectorise) ---------


@intrinsic
def _as_float32(typingctx: Any, value: types.Type) -> tuple[Any, Callable[..., Any]] | None:
    """float32 as is; uint16 as bfloat16 bits; int16 as float16 bits (numba cannot type float16 arrays)."""
    if value == types.float32:

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return args[0]

    elif value == types.uint16:

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            wide = builder.zext(args[0], ir.IntType(32))
            return builder.bitcast(builder.shl(wide, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    elif value == types.int16:

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    else:
        return None
    return types.float32(value), codegen


@intrinsic
def _float32_bits(typingctx: Any, value: types.Type) -> tuple[Any, Callable[..., Any]]:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _bits_float32(typingctx: Any, value: types.Type) -> tuple[Any, Callable[..., Any]]:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


# -- the kernel -----------------------------------------------------------------------------------
# fastmath is given per function and kept narrow: "contract" (FMAs) for the polynomial, and
# "reassoc" only where sums must be reordered to vectorise. Neither assumes away NaN or inf.


@numba.njit(fastmath={"contract"}, cache=True)
def _exp(d: np.float32) -> np.float32:
    """e^d for float32 -88 <= d <= 0 (or NaN), ~1e-7 relative; exactly 0 below about -87.9."""
    n = np.rint(d * _LOG2E)
    r = d - n * _LN2_HI
    r = r - n * _LN2_LO
    y = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    y = y * r * r + r + np.float32(1.0)
    # 2^n from its exponent bits; n >= -127 because d >= -88, and n = -127 gives 0.
    return y * _bits_float32((np.int32(n) + np.int32(127)) << np.int32(23))


@numba.njit(cache=True)
def _block_max(block: np.ndarray) -> np.float32:
    """Largest value of a block (NaN if it holds a NaN with the sign bit clear), as float32."""
    # Flipping the magnitude bits of negative floats makes signed-integer order the float order.
    key = _I32_MIN
    for j in range(block.size):
        bits = _float32_bits(_as_float32(block[j]))
        bits = bits ^ ((bits >> _SIGN_SHIFT) & _MAGNITUDE)
        key = bits if bits > key else key
    return _bits_float32(key ^ ((key >> _SIGN_SHIFT) & _MAGNITUDE))


@numba.njit(fastmath={"reassoc", "contract"}, cache=True)
def _block_sums(block: np.ndarray, m: np.float32, inv_t: np.float32) -> tuple[np.float32, np.float32]:
    """(sum e, sum e * d) over a block, d = (z - m) * inv_t, in float32."""
    total = np.float32(0.0)
    dot = np.float32(0.0)
    for j in range(block.size):
        d = (_as_float32(block[j]) - m) * inv_t
        d = _FLOOR if d < _FLOOR else d  # written so that a NaN d stays NaN
        e = _exp(d)
        total += e
        dot += e * d
    return total, dot


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _entropy_rows(logits: np.ndarray, temperature: float, entropy: np.ndarray, lse: np.ndarray) -> None:
    """entropy[i], lse[i] of softmax(logits[i] / temperature) for each row of a C-contiguous 2-D array."""
    inv_t = np.float32(1.0 / temperature)
    for i in range(logits.shape[0]):
        row = logits[i]
        m = np.float32(-np.inf)
        total = 0.0
        dot = 0.0
        for start in range(0, row.size, BLOCK):
            block = row[start : start + BLOCK]
            bm = _block_max(block)
            if not bm <= m:  # a new running maximum (or NaN): move the sums to the new shift
                if m > -np.inf:
                    delta = (np.float64(m) - np.float64(bm)) / temperature
                    scale = math.exp(delta)
                    dot = scale * (dot + delta * total)
                    total = scale * total
                m = bm
            elif bm == -np.inf:
                continue  # every column of the block is masked: nothing to add
            block_total, block_dot = _block_sums(block, m, inv_t)
            total += np.float64(block_total)
            dot += np.float64(block_dot)
        if total > 0.0:
            log_total = math.log(total)
            h = log_total - dot / total
            entropy[i] = 0.0 if h < 0.0 else h  # rounding just below 0 only; a NaN stays NaN
            lse[i] = np.float64(m) / temperature + log_total
        else:  # no finite logit, or a NaN: no distribution
            entropy[i] = np.nan
            lse[i] = np.nan


# -- the call -------------------------------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _thread_pool(threads: int) -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < threads:
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="carl-phi")
        return _pool


def token_entropy(
    logits: np.ndarray, *, temperature: float = 1.0, bfloat16: bool = False, threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Entropy (nats) and log-sum-exp of softmax(logits / temperature), row by row: two float32 [N].

    logits: a C-contiguous [N, V] float32 or float16 array, or the uint16 bit patterns of bfloat16
    values with `bfloat16=True` (numpy has no bfloat16). `threads` > 1 splits the rows into that
    many contiguous parts, reduced at once (the kernel releases the GIL); no result changes.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [N, V], got shape {logits.shape}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if bfloat16:
        if logits.dtype.itemsize != 2 or logits.dtype.kind not in "iu":
            raise TypeError(f"bfloat16 logits come as 16-bit integer bit patterns, got {logits.dtype}")
        values = logits.view(np.uint16)
    elif logits.dtype == np.float16:
        values = logits.view(np.int16)  # numba reads float16 as its bit pattern (see _as_float32)
    elif logits.dtype == np.float32:
        values = logits
    else:
        raise TypeError(f"logits must be float32, float16 or bfloat16 bits, got {logits.dtype}")
    values = np.ascontiguousarray(values)
    n = values.shape[0]
    entropy = np.empty(n, dtype=np.float32)
    lse = np.empty(n, dtype=np.float32)
    parts = max(1, min(threads, n, values.size // MIN_ELEMENTS_PER_THREAD))
    if parts == 1:
        _entropy_rows(values, float(temperature), entropy, lse)
        return entropy, lse
    bounds = np.linspace(0, n, parts + 1).astype(int)
    spans = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    jobs = [
        _thread_pool(parts).submit(_entropy_rows, values[s], float(temperature), entropy[s], lse[s])
        for s in spans
    ]
    for job in jobs:
        job.result()
    return entropy, lse


__all__ = ["BLOCK", "token_entropy"]
