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
    with delta = (m - bm) log2(e) / temperature, S <- 2^delta * S and D <- 2^delta * (D + delta * S);
  - then, in base 2, with x = (z - m) log2(e) / temperature in float32 (x <= 0) and e = 2^x:
        S += sum e,   D += sum e * x,
    and at the end H = ln S - ln 2 * D / S, lse = m / temperature + ln S.
So the logits are read from memory once, and each logit costs one 2^x: x = n + f with n = rint(x),
a degree-6 polynomial in f (|f| <= 1/2), and 2^n built from exponent bits, all of which LLVM
vectorises: ~1e-7 relative, where numba's `math.exp` is a scalar libm call per element (the PyPI
llvmlite has no SVML). Base 2 spares e^d the range reduction by ln 2 (two FMAs and a multiply a
logit). Where x < -126 the term is exactly 0, which also gives masked (-inf) columns zero
probability without a 0 * -inf NaN. S and D are float32 sums within a block (the vectoriser spreads
each over the vector lanes) and float64 across blocks: H is within ~1e-6 nats of float64 at
V = 151,936 (float32's own rounding of H near 12 nats is 5e-7).

The vector width. The kernel is bound by its arithmetic (~17 vector instructions a vector of
logits), so it runs at the width LLVM picks. For Intel's AVX-512 server parts (skylake-avx512,
cascadelake, icelake-server, sapphirerapids) LLVM's tuning prefers 256-bit vectors ("prefer-256-bit"):
numba, which targets the host CPU, then emits ymm code, and the kernel took 3.0x a plain sum on a
cascadelake Xeon where AMD's Zen 4/5 (no such preference) get zmm code and 1.6-2.0x. So on any CPU
with AVX-512, and unless NUMBA_CPU_FEATURES says otherwise, this module adds "-prefer-256-bit" to
numba's target features before its first compile (`prefer_512_bit_vectors`); compiled for
cascadelake on a Zen 5 the kernel goes from ymm to zmm and from 4.0x to 2.0x a plain sum
(docs/results/phi-kernel.md).

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
from numba.core import config as numba_config
from numba.core import registry
from numba.core.codegen import get_host_cpu_features
from numba.extending import intrinsic


def prefer_512_bit_vectors() -> str:
    """Let numba use 512-bit vectors where the CPU has AVX-512 (see the module's docstring). It must run
    before numba's first compile in the process (the target machine is made once); it changes nothing
    where NUMBA_CPU_FEATURES is set, where the CPU has no AVX-512, or where numba already compiled
    something. Returns what it did, for the bench."""
    # numba's config sets CPU_FEATURES from the environment, through globals(): unseen by a type checker
    if numba_config.CPU_FEATURES is not None:  # type: ignore[attr-defined]
        return "NUMBA_CPU_FEATURES set: left as is"
    features = get_host_cpu_features()
    if "+avx512f" not in features.split(","):
        return "no AVX-512: host features"
    if "_toplevel_target_context" in vars(registry.cpu_target):
        return "numba had compiled already: host features"
    numba_config.CPU_FEATURES = features + ",-prefer-256-bit"  # type: ignore[attr-defined]
    return "AVX-512: host features, -prefer-256-bit"


VECTOR_TARGET = prefer_512_bit_vectors()  # before the first @njit below

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
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# Below x = -126 (log2 units) a term is set to 2^-127 built from zero exponent bits: exactly 0. 2^-126 is
# float32's smallest normal, 1e-38 of the row's largest term (1): no such term can change the sums.
_FLOOR = np.float32(-126.0)
_ZERO_EXPONENT = np.float32(-127.0)
# 2^f ~ 1 + f (C1 + f (C2 + f (C3 + f (C4 + f (C5 + f C6))))) for |f| <= 1/2: a near-minimax fit of the
# relative error (Lawson-reweighted least squares on Chebyshev nodes), 1e-7 relative in float32.
_C1, _C2, _C3 = (
    np.float32(0.6931471824645996),
    np.float32(0.24022647738456726),
    np.float32(0.055503323674201965),
)
_C4, _C5, _C6 = (
    np.float32(0.00961843691766262),
    np.float32(0.0013398875016719103),
    np.float32(0.00015353360504377633),
)


# -- bit casts numba has no spelling for (inlined by LLVM, so the loops still vectorise) ---------
# numba's stubs give an intrinsic's call its typing context argument too, which jitted code never passes:
# mypy's call-arg check is ignored where the kernel calls them.


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
def _exp2(x: np.float32) -> np.float32:
    """2^x for float32 -127 <= x <= 0 (or NaN), ~1e-7 relative; exactly 0 at x = -127."""
    n = np.rint(x)
    f = x - n  # exact, |f| <= 1/2
    y = (((((_C6 * f + _C5) * f + _C4) * f + _C3) * f + _C2) * f + _C1) * f + np.float32(1.0)
    # 2^n from its exponent bits; n >= -127 because x >= -127, and n = -127 gives 0.
    return y * _bits_float32((np.int32(n) + np.int32(127)) << np.int32(23))  # type: ignore[call-arg]  # numba's stubs: see the bit casts


@numba.njit(cache=True)
def _block_max(block: np.ndarray) -> np.float32:
    """Largest value of a block (NaN if it holds a NaN with the sign bit clear), as float32."""
    # Flipping the magnitude bits of negative floats makes signed-integer order the float order.
    key = _I32_MIN
    for j in range(block.size):
        bits: np.int32 = _float32_bits(_as_float32(block[j]))  # type: ignore[call-arg]  # numba's stubs: see the bit casts
        bits = bits ^ ((bits >> _SIGN_SHIFT) & _MAGNITUDE)
        key = bits if bits > key else key
    return _bits_float32(key ^ ((key >> _SIGN_SHIFT) & _MAGNITUDE))  # type: ignore[call-arg]  # numba's stubs: see the bit casts


@numba.njit(fastmath={"reassoc", "contract"}, cache=True)
def _block_sums(block: np.ndarray, m: np.float32, scale: np.float32) -> tuple[np.float32, np.float32]:
    """(sum e, sum e * x) over a block, x = (z - m) * scale in log2 units and e = 2^x, in float32."""
    total = np.float32(0.0)
    dot = np.float32(0.0)
    for j in range(block.size):
        x = (_as_float32(block[j]) - m) * scale  # type: ignore[call-arg]  # numba's stubs: see the bit casts
        x = _ZERO_EXPONENT if x < _FLOOR else x  # written so that a NaN x stays NaN
        e = _exp2(x)
        total += e
        dot += e * x
    return total, dot


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _entropy_rows(logits: np.ndarray, temperature: float, entropy: np.ndarray, lse: np.ndarray) -> None:
    """entropy[i], lse[i] of softmax(logits[i] / temperature) for each row of a C-contiguous 2-D array."""
    # Base 2: x = (z - m) * log2(e) / T, so e^((z - m) / T) = 2^x needs no range reduction by ln 2. The
    # shift by m comes first, so the rounding of the scale only perturbs the row's temperature by 1e-7.
    scale = np.float32(LOG2E / temperature)
    scale64 = np.float64(scale)
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
                    delta = (np.float64(m) - np.float64(bm)) * scale64  # log2 units, < 0
                    shrink = math.exp(delta * LN2)
                    dot = shrink * (dot + delta * total)
                    total = shrink * total
                m = bm
            elif bm == -np.inf:
                continue  # every column of the block is masked: nothing to add
            block_total, block_dot = _block_sums(block, m, scale)
            total += np.float64(block_total)
            dot += np.float64(block_dot)
        if total > 0.0:
            log_total = math.log(total)
            h = log_total - LN2 * dot / total  # dot is in log2 units
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
