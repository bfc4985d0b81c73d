"""The numba Phi kernel (engine.coherence.phi_numba) against the float64 reference and the torch kernel.

Every case is fixed or derandomized: a failure reproduces. The tolerance is 1e-5 nats on H and
1e-5 on Phi, ten times tighter than the torch kernel's tests (tests/test_phi.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("numba")

from llvmlite import binding as llvm_binding  # noqa: E402  (numba's own dependency)

from engine.coherence import phi_numba  # noqa: E402
from engine.coherence.phi import numba_applies, phi_from_entropy, reference_entropy, token_entropy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-5  # nats, and Phi
BLOCK = phi_numba.BLOCK
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DERANDOMIZED = settings(
    max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def numba_entropy(
    logits: torch.Tensor, temperature: float = 1.0, threads: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    bf16 = logits.dtype == torch.bfloat16
    array = (logits.view(torch.uint16) if bf16 else logits).numpy()
    return phi_numba.token_entropy(array, temperature=temperature, bfloat16=bf16, threads=threads)


def assert_matches_reference(logits: torch.Tensor, temperature: float = 1.0) -> np.ndarray:
    """The numba entropy, lse and Phi of `logits` against float64, NaN where the reference is NaN."""
    entropy, lse = numba_entropy(logits, temperature)
    assert entropy.dtype == lse.dtype == np.float32 and entropy.shape == lse.shape == (logits.shape[0],)
    expected = reference_entropy(logits, temperature=temperature).numpy()
    expected_lse = torch.logsumexp(logits.double() / temperature, dim=-1).numpy()
    defined = np.isfinite(expected)
    np.testing.assert_array_equal(np.isnan(entropy), ~defined)
    np.testing.assert_array_equal(np.isnan(lse), ~defined)
    error = np.abs(entropy[defined] - expected[defined])
    assert error.max(initial=0.0) <= TOL, f"max |H - H64| = {error.max():.3g} nats"
    width = logits.shape[1]
    if width >= 2:
        phi_error = np.abs(
            phi_from_entropy(entropy[defined], width) - phi_from_entropy(expected[defined], width)
        )
        assert phi_error.max(initial=0.0) <= TOL
    lse_error = np.abs(lse[defined] - expected_lse[defined])
    assert (lse_error <= 1e-5 + 1e-6 * np.abs(expected_lse[defined])).all()
    return entropy


def logits_of(
    n: int, v: int, scale: float, seed: int, dtype: torch.dtype, offset: float = 0.0
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, v, generator=gen) * scale + offset).to(dtype)


# -- against float64 ----------------------------------------------------------------------------


@DERANDOMIZED
@given(
    n=st.integers(1, 24),
    v=st.one_of(st.integers(1, 3 * BLOCK + 5), st.sampled_from([BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK])),
    log_scale=st.floats(-3, 2),
    offset=st.floats(-1e4, 1e4),
    dtype=st.sampled_from(DTYPES),
    temperature=st.sampled_from([1.0, 0.6, 1.7]),
    masked=st.floats(0.0, 0.99),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_the_float64_reference(
    n: int,
    v: int,
    log_scale: float,
    offset: float,
    dtype: torch.dtype,
    temperature: float,
    masked: float,
    seed: int,
) -> None:
    logits = logits_of(n, v, 10.0**log_scale, seed, torch.float32, offset)
    gen = torch.Generator().manual_seed(seed + 1)
    drop = torch.rand(n, v, generator=gen) < masked
    drop[:, seed % v] = False  # every row keeps a finite logit
    logits = logits.masked_fill(drop, float("-inf")).to(dtype)
    entropy = assert_matches_reference(logits, temperature)
    assert (entropy >= 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_qwen_vocabulary_width(dtype: torch.dtype, temperature: float) -> None:
    v = 151_936
    logits = torch.cat([logits_of(6, v, 3.0, 1, torch.float32), logits_of(2, v, 0.5, 2, torch.float32, 40.0)])
    logits[1, : v // 2] = float("-inf")  # half the vocabulary masked: 74 whole blocks
    logits[2, 12_345] = 60.0  # near one-hot: exp(-40) per other column
    assert_matches_reference(logits.to(dtype), temperature)


@pytest.mark.parametrize("v", [1, 2, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_the_running_maximum_moves_block_by_block(v: int, temperature: float) -> None:
    """Rising rows move the maximum in every block, so the sums are re-shifted each time; a
    falling row sets it once; a row whose maximum sits in its last column sets it at the end."""
    ramp = torch.linspace(-30.0, 30.0, v)
    rows = [ramp, ramp.flip(0), torch.linspace(-2.0, 2.0, v) ** 2, torch.zeros(v)]
    last = logits_of(1, v, 1.0, 7, torch.float32)[0]
    last[-1] = 25.0
    steps = torch.arange(v, dtype=torch.float32) // BLOCK * 15.0  # jumps of 15 at each block edge
    logits = torch.stack([*rows, last, steps + logits_of(1, v, 1.0, 8, torch.float32)[0]])
    for dtype in DTYPES:
        assert_matches_reference(logits.to(dtype), temperature)


def test_masked_blocks_before_and_after_the_finite_ones() -> None:
    v = 4 * BLOCK + 3
    logits = logits_of(4, v, 2.0, 3, torch.float32)
    logits[0, : 2 * BLOCK] = float("-inf")  # leading whole blocks masked
    logits[1, BLOCK:] = float("-inf")  # trailing ones
    logits[2, ::2] = float("-inf")  # every other column
    logits[3, BLOCK + 5 : 3 * BLOCK] = float("-inf")  # a hole
    assert_matches_reference(logits, 0.8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("v", [1, 5, BLOCK + 9, 151_936])
def test_one_hot_over_a_masked_vocabulary_is_exactly_phi_one(dtype: torch.dtype, v: int) -> None:
    logits = torch.full((3, v), float("-inf"))
    hot = torch.tensor([0, v // 2, v - 1])
    logits[torch.arange(3), hot] = torch.tensor([-500.0, 3.25, 1e4])
    entropy, lse = numba_entropy(logits.to(dtype))
    assert entropy.tolist() == [0.0, 0.0, 0.0]
    assert lse.tolist() == logits.to(dtype).float()[torch.arange(3), hot].tolist()


@pytest.mark.parametrize("v", [2, BLOCK, 151_936])
def test_uniform_rows_give_phi_zero(v: int) -> None:
    entropy, lse = numba_entropy(torch.full((2, v), -7.5))
    assert np.abs(phi_from_entropy(entropy, v)).max() <= 1e-6
    np.testing.assert_allclose(lse, -7.5 + math.log(v), rtol=1e-6)


def test_rows_without_a_distribution_are_nan() -> None:
    v = 2 * BLOCK + 1
    logits = logits_of(5, v, 1.0, 4, torch.float32)
    logits[0] = float("-inf")  # no finite logit
    logits[1, 3] = float("nan")  # in the first block
    logits[2, -1] = -float("nan")  # a NaN with the sign bit set, in the last block
    logits[3, BLOCK] = float("inf")
    entropy, lse = numba_entropy(logits)
    assert np.isnan(entropy[:4]).all() and np.isnan(lse[:4]).all()
    assert np.isfinite(entropy[4]) and np.isfinite(lse[4])


def test_threads_change_no_bit() -> None:
    logits = logits_of(37, 3 * BLOCK + 11, 3.0, 5, torch.bfloat16)
    one, one_lse = numba_entropy(logits, 0.9, threads=1)
    for threads in (2, 3, 8, 64):
        many, many_lse = numba_entropy(logits, 0.9, threads=threads)
        np.testing.assert_array_equal(many, one)
        np.testing.assert_array_equal(many_lse, one_lse)


# -- behind token_entropy -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_entropy_takes_the_numba_kernel_and_agrees_with_torch(dtype: torch.dtype) -> None:
    logits = logits_of(50, 3000, 4.0, 6, dtype, offset=-20.0)
    logits[7, :2000] = float("-inf")
    assert numba_applies(logits)
    entropy, lse = token_entropy(logits, temperature=0.7)
    expected, expected_lse = numba_entropy(logits, 0.7)
    np.testing.assert_array_equal(entropy.numpy(), expected)  # the numba kernel ran
    np.testing.assert_array_equal(lse.numpy(), expected_lse)
    torch_entropy, torch_lse = token_entropy(logits, temperature=0.7, kernel="torch", chunk_rows=7)
    assert (entropy - torch_entropy).abs().max().item() <= TOL
    assert (lse - torch_lse).abs().max().item() <= 1e-5 + 1e-6 * lse.abs().max().item()


def test_token_entropy_falls_back_to_torch_where_numba_does_not_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logits = logits_of(20, 600, 3.0, 7, torch.float32)
    strided = logits.t().contiguous().t()  # the same values, not contiguous
    wide = logits.double()
    for other in (strided, wide):
        assert not numba_applies(other)
        entropy, _ = token_entropy(other, chunk_rows=3)
        np.testing.assert_array_equal(
            entropy.numpy(), token_entropy(other, chunk_rows=3, kernel="torch")[0].numpy()
        )
        with pytest.raises(ValueError, match="numba kernel"):
            token_entropy(other, kernel="numba")
    monkeypatch.setenv("CARL_PHI_KERNEL", "torch")
    entropy, _ = token_entropy(logits, chunk_rows=3)
    np.testing.assert_array_equal(
        entropy.numpy(), token_entropy(logits, chunk_rows=3, kernel="torch")[0].numpy()
    )
    with pytest.raises(ValueError, match="kernel must be"):
        token_entropy(logits, kernel="fast")  # type: ignore[arg-type]


def test_the_numba_kernel_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        phi_numba.token_entropy(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(TypeError):
        phi_numba.token_entropy(np.zeros((2, 3), np.float64))
    with pytest.raises(TypeError):
        phi_numba.token_entropy(np.zeros((2, 3), np.float32), bfloat16=True)
    with pytest.raises(ValueError):
        phi_numba.token_entropy(np.zeros((2, 3), np.float32), temperature=0.0)
    entropy, lse = phi_numba.token_entropy(np.zeros((0, 5), np.float32))
    assert entropy.shape == lse.shape == (0,)


def test_the_compiled_kernel_is_cached_on_disk(tmp_path: Path) -> None:
    """A second process loads the machine code the first one compiled: no compile on its first call."""
    code = (
        "import json, numpy as np\n"
        "from engine.coherence import phi_numba\n"
        "phi_numba.token_entropy(np.zeros((2, 8), np.float32))\n"
        "stats = phi_numba._entropy_rows.stats\n"
        "print(json.dumps([len(stats.cache_hits), len(stats.cache_misses)]))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def first_call() -> tuple[int, int]:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env
        )
        hits, misses = json.loads(out.stdout.strip().splitlines()[-1])
        return hits, misses

    assert first_call() == (0, 1)  # compiled, and written to the cache
    assert first_call() == (1, 0)  # loaded from it


VECTOR_PROBE = """
import re, sys
import numpy as np
from engine.coherence import phi_numba
phi_numba.token_entropy(np.zeros((2, 4096), dtype=np.float32))
asm = next(iter(phi_numba._block_sums.inspect_asm().values()))
print(phi_numba.VECTOR_TARGET, "|", len(re.findall("zmm", asm)), len(re.findall("ymm", asm)))
"""


def vector_registers(tmp_path: Path, **env: str) -> tuple[str, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", VECTOR_PROBE],
        env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    target, counts = out.rsplit("|", 1)
    zmm, ymm = map(int, counts.split())
    return target.strip(), zmm, ymm


@pytest.mark.skipif(
    "+avx512f" not in llvm_binding.get_host_cpu_features().flatten(), reason="the CPU has no AVX-512"
)
def test_avx512_parts_get_512_bit_vectors_even_where_llvm_prefers_256(tmp_path: Path) -> None:
    """LLVM's tuning for Intel's AVX-512 servers prefers 256-bit vectors: compiled for cascadelake, the
    kernel was ymm code at half the zmm speed. The module lifts that preference before numba's first
    compile, unless NUMBA_CPU_FEATURES chooses the features."""
    target, zmm, ymm = vector_registers(tmp_path / "lifted", NUMBA_CPU_NAME="cascadelake")
    assert target == "AVX-512: host features, -prefer-256-bit" and zmm > 0
    features = llvm_binding.get_host_cpu_features().flatten()
    target, zmm, ymm = vector_registers(
        tmp_path / "kept", NUMBA_CPU_NAME="cascadelake", NUMBA_CPU_FEATURES=features
    )
    assert target == "NUMBA_CPU_FEATURES set: left as is" and zmm == 0 and ymm > 0
