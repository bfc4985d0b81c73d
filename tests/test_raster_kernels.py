"""The chart's envelope pass has two kernels with one contract (widgets/raster.py): plain Python
over the lists the store reads, numpy over arrays. Drawn from the same buckets, they must give
the same envelopes and so the same dots, cell for cell: checked on random series with gaps
(NaN), infinities, repeated steps, raw points and rollup buckets, at several widths."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from engine.store.reader import Series
from widgets.raster import BandLayer, LineLayer, MarkerLayer, envelopes, rasterize


def _random_series(rng: random.Random, *, level: int) -> tuple[Series, Series]:
    """The same buckets as lists (as the store reads them) and as numpy arrays."""
    n = rng.choice([1, 2, 3, 17, 200, 1500])
    start = rng.randrange(0, 1000)
    if level == 1:
        first = sorted(start + rng.randrange(0, 4 * n) for _ in range(n))  # repeated steps happen
        last = first
    else:
        first = [start + i * level for i in range(n)]
        last = [f + level - 1 for f in first]
    centre = rng.uniform(-5, 5)

    def value() -> float:
        roll = rng.random()
        if roll < 0.05:
            return math.nan
        if roll < 0.07:
            return rng.choice([math.inf, -math.inf])
        return centre + rng.gauss(0, 1)

    vmin = [value() for _ in range(n)]
    vmax = vmin if level == 1 else [v if v != v else v + abs(rng.gauss(0, 1)) for v in vmin]
    mean = vmin
    lists = Series(list(first), list(last), list(vmin), list(vmax), list(mean), level)
    arrays = Series(
        np.array(first, dtype=np.int64),
        np.array(last, dtype=np.int64),
        np.array(vmin),
        np.array(vmax),
        np.array(mean),
        level,
    )
    return lists, arrays


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all((x != x and y != y) or x == y for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("seed", range(40))
def test_python_and_numpy_kernels_draw_the_same(seed: int) -> None:
    rng = random.Random(seed)
    level = rng.choice([1, 1, 4, 64])
    line_l, line_a = _random_series(rng, level=level)
    lo_l, lo_a = _random_series(rng, level=level)
    hi_l, hi_a = _random_series(rng, level=level)
    steps = [*line_l.first, *lo_l.first, *hi_l.first]
    x_range = (float(min(steps)), float(max(steps)) + rng.choice([0, 10]))
    width, height = rng.choice([(1, 1), (7, 3), (40, 10), (160, 24)])
    markers = MarkerLayer(tuple(rng.uniform(*x_range) for _ in range(3)))
    for mode in ("braille", "block"):
        dot_cols = width * 2  # both modes have 2 dot columns a cell
        as_lists = [BandLayer(lo_l, hi_l), LineLayer(line_l), markers]
        as_arrays = [BandLayer(lo_a, hi_a), LineLayer(line_a), markers]
        for ours, theirs in zip(
            envelopes(as_lists, x_range, dot_cols), envelopes(as_arrays, x_range, dot_cols), strict=True
        ):
            assert _same(ours.lo, theirs.lo) and _same(ours.hi, theirs.hi), (seed, mode, ours.kind)
        a = rasterize(as_lists, width, height, x_range, mode=mode)
        b = rasterize(as_arrays, width, height, x_range, mode=mode)
        assert a.bits == b.bits and a.owner == b.owner, (seed, mode)


def test_a_chart_of_store_read_lists_does_not_import_numpy() -> None:
    """What the store reads is drawn without numpy: the control room's first frame need not load it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from engine.store.reader import Series\n"
        "from widgets.raster import BandLayer, LineLayer, rasterize\n"
        "s = Series([0, 1, 2], [0, 1, 2], [0.1, float('nan'), 0.3], "
        "[0.1, float('nan'), 0.3], [0.1, 0.2, 0.3])\n"
        "r = rasterize([BandLayer(s, s), LineLayer(s)], 10, 4, (0, 2))\n"
        "assert any(''.join(r.lines()).strip())\n"
        "print('numpy' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
