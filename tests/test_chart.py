"""The chart: the numpy rasterizer on its own, then the widget inside a real Textual app."""

from __future__ import annotations

import math

import numpy as np
import pytest
from rich.color import Color
from textual.app import App, ComposeResult
from textual.theme import Theme

from engine.store.reader import Series
from widgets.chart import LINE_COLOURS, AxisScale, Chart, entropy_axis
from widgets.raster import (
    BLOCK_CHARS,
    BandLayer,
    LineLayer,
    MarkerLayer,
    at_least,
    cell_col,
    envelopes,
    extent,
    format_tick,
    nice_ticks,
    rasterize,
    significant_digits,
)


def raw(values: list[float] | np.ndarray, steps: list[int] | np.ndarray | None = None) -> Series:
    """A raw series as the store reads it: first == last, vmin == vmax == mean (separate arrays)."""
    v = np.asarray(values, dtype=np.float64)
    s = np.arange(len(v), dtype=np.int64) if steps is None else np.asarray(steps, dtype=np.int64)
    return Series(s, s.copy(), v, v.copy(), v.copy(), 1)


def is_braille(ch: str) -> bool:
    return 0x2800 <= ord(ch) <= 0x28FF


# -- rasterizer ------------------------------------------------------------------------------


def test_flat_line_lands_on_its_dot_row() -> None:
    # 5 cells high = 20 dot rows; over (0, 19) the value 5 is dot row 19 - 5 = 14:
    # cell row 3, third dot row of the cell = dots 3 and 6 = U+2824 in every cell.
    raster = rasterize([LineLayer(raw([5.0] * 100))], 10, 5, (0, 99), (0, 19))
    assert raster.lines() == [" " * 10] * 3 + ["⠤" * 10] + [" " * 10]


def test_spike_survives_downsampling() -> None:
    values = np.zeros(100_000)
    values[54_321] = 1.0
    raster = rasterize([LineLayer(raw(values))], 20, 5, (0, 99_999), (0, 1))
    spike_col = cell_col(54_321, (0, 99_999), 20, "braille")
    assert np.flatnonzero(np.array(raster.bits)[0]).tolist() == [
        spike_col
    ]  # only the spike reaches the top row
    assert all(np.array(raster.bits)[:, spike_col] != 0)  # and it runs down to the zero line
    assert all(np.array(raster.bits)[-1] != 0)  # the zero line is unbroken


def test_rollup_buckets_draw_their_min_and_max() -> None:
    first = np.arange(0, 400, 100, dtype=np.int64)
    vmax = np.array([0.1, 0.1, 0.9, 0.1])
    series = Series(first, first + 99, np.zeros(4), vmax, np.full(4, 0.05), level=100)
    raster = rasterize([LineLayer(series)], 8, 4, (0, 399), (0, 1))
    # bucket 2 sits at its midpoint, step 249.5; its vmax (not its mean) reaches the top row
    assert np.flatnonzero(np.array(raster.bits)[0]).tolist() == [cell_col(249.5, (0, 399), 8, "braille")]


def test_nan_is_a_gap_and_does_not_move_the_bounds() -> None:
    values = np.linspace(0.0, 1.0, 100)
    values[40:60] = np.nan
    values[10] = np.inf
    layers = [LineLayer(raw(values))]
    envs = envelopes(layers, (0, 99), 20)
    assert extent(envs) == (0.0, 1.0)
    raster = rasterize(layers, 10, 4, (0, 99), (0, 1))
    drawn = (np.array(raster.bits) != 0).any(axis=0)
    # steps 40..59 fill dot columns 8..11, i.e. cells 4 and 5; every other cell column has ink
    assert drawn.tolist() == [True] * 4 + [False, False] + [True] * 4


def test_band_fills_between_lo_and_hi() -> None:
    # 5 cells = 20 dot rows over (0, 1): hi 0.75 -> dot row 5, lo 0.25 -> dot row 14
    band = BandLayer(raw([0.25] * 50), raw([0.75] * 50))
    raster = rasterize([band], 6, 5, (0, 49), (0, 1))
    expected_rows = [0x00, 0xF6, 0xFF, 0x3F, 0x00]  # rows 5-7, 8-11, 12-14 of the cells
    assert raster.bits == [[bits] * 6 for bits in expected_rows]
    # where one edge is unknown (NaN) the column is a gap, not a line at the other edge
    lo = np.full(50, 0.25)
    lo[20:30] = np.nan
    band_env = envelopes([BandLayer(raw(lo), raw([0.75] * 50))], (0, 49), 12)[0]
    assert np.isnan(band_env.hi[5:7]).all() and np.isfinite(np.array(band_env.hi)[[0, 3, 8, 11]]).all()


def test_braille_bits_for_known_patterns() -> None:
    full = rasterize([BandLayer(raw([-5.0] * 10), raw([5.0] * 10))], 3, 2, (0, 9), (0, 1))
    assert full.lines() == ["\u28ff" * 3] * 2
    left = rasterize([MarkerLayer((0.0,))], 1, 1, (0, 1), (0, 1))
    right = rasterize([MarkerLayer((1.0,))], 1, 1, (0, 1), (0, 1))
    both = rasterize([MarkerLayer((0.0, 1.0))], 1, 1, (0, 1), (0, 1))
    assert (left.lines(), right.lines(), both.lines()) == (["\u2847"], ["\u28b8"], ["\u28ff"])


def test_steep_line_is_joined_without_holes() -> None:
    # two dot columns: 0 at the bottom then 1 at the top; each reaches halfway to the other
    raster = rasterize([LineLayer(raw([0.0, 1.0]))], 1, 2, (0, 1), (0, 1))
    assert raster.lines() == ["\u28b8", "\u2847"]  # right column rows 0-3, left column rows 4-7


def test_sparse_points_are_bridged() -> None:
    raster = rasterize([LineLayer(raw([0.0, 1.0], steps=[0, 1000]))], 30, 6, (0, 1000), (0, 1))
    assert (np.array(raster.bits) != 0).any(axis=0).all()  # a straight line across every column
    assert np.array(raster.bits)[0, -1] != 0 and np.array(raster.bits)[-1, 0] != 0
    assert np.flatnonzero(np.array(raster.bits)[:, 15]).tolist() in ([2], [3], [2, 3])  # through the middle


def test_block_mode_uses_block_characters() -> None:
    layers = [LineLayer(raw(np.sin(np.linspace(0, 6, 500))))]
    lines = rasterize(layers, 30, 6, (0, 499), (-1, 1), mode="block").lines()
    text = "".join(lines)
    assert set(text) <= set(BLOCK_CHARS) and set(text) - {" "}
    assert not any(is_braille(ch) for ch in text)
    full = rasterize([BandLayer(raw([-5.0] * 10), raw([5.0] * 10))], 3, 2, (0, 9), (0, 1), mode="block")
    assert full.lines() == ["███"] * 2


def test_later_layer_wins_the_cell_colour() -> None:
    band = BandLayer(raw([0.0] * 20), raw([1.0] * 20))
    line = LineLayer(raw([0.9] * 20))
    raster = rasterize([band, line], 4, 4, (0, 19), (-1, 2))
    line_rows = {r for r in range(4) if (np.array(raster.owner)[r] == 1).all()}
    band_rows = {r for r in range(4) if (np.array(raster.owner)[r] == 0).all()}
    assert len(line_rows) == 1 and band_rows and line_rows.isdisjoint(band_rows)
    owner = np.array(raster.owner)
    assert (owner[0] == -1).all() and (owner[3] == -1).all()  # (-1, 2) leaves room


def test_nice_ticks_step_by_one_two_five() -> None:
    ticks, step = nice_ticks((0.0, 1.0), 5)
    assert step == pytest.approx(0.2) and [round(t, 6) for t in ticks] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks((0.0, 3.0), 10, integer=True) == ([0.0, 1.0, 2.0, 3.0], 1.0)
    assert nice_ticks((13.0, 987.0), 4) == ([200.0, 400.0, 600.0, 800.0], 200.0)


def test_tick_labels_are_compact() -> None:
    assert format_tick(1200, 200, trim=True) == "1.2k"
    assert format_tick(3_400_000, 200_000, trim=True) == "3.4M"
    assert format_tick(2000, 500, trim=True) == "2k"
    assert format_tick(0.6000000000000001, 0.2) == "0.6"
    assert format_tick(-1e-17, 0.1) == "0.0"
    assert format_tick(0.00012, 0.00001) == "1.2e-4"
    rng = np.random.default_rng(1)
    for value, step in zip(rng.normal(0, 1e9, 200), 10.0 ** rng.integers(-9, 9, 200), strict=True):
        assert len(format_tick(float(value), float(step))) <= 7, (value, step)


def test_a_minimum_span_widens_about_the_centre_and_shifts_inside_the_limits() -> None:
    phi = (0.0, 1.0)
    assert at_least((0.0022, 0.0024), 0.05, phi) == (0.0, 0.05)  # shifted up, not cut at 0
    assert at_least((0.9990, 0.9992), 0.05, phi) == (0.95, 1.0)  # shifted down, not cut at 1
    lo, hi = at_least((0.49, 0.51), 0.05, phi)
    assert math.isclose(lo, 0.475) and math.isclose(hi, 0.525)  # about the centre
    assert at_least((0.2, 0.6), 0.05, phi) == (0.2, 0.6)  # wide enough already
    assert at_least((0.0, 0.01), 2.0, phi) == phi  # wider than the limits: the limits
    lo, hi = at_least((-0.001, 0.001), 0.05, phi)  # values outside their limits stay visible
    assert math.isclose(lo, -0.025) and math.isclose(hi, 0.025)
    assert at_least((6.22, 6.23), 0.1) == pytest.approx((6.175, 6.275))  # no limits: centred


def test_value_labels_keep_at_most_the_digits_asked_for() -> None:
    assert format_tick(6.22366, 1e-5) == "6.22366"  # the step alone asks for five decimals
    assert format_tick(6.22366, 1e-5, digits=4) == "6.224"
    assert format_tick(12_345, 1, digits=4) == "12.35k"
    assert format_tick(0.0023456, 1e-8, digits=4) == "2.35e-3"  # 4 digits do not fit 7 cells
    assert format_tick(0.0, 0.02, digits=4) == "0.00"
    assert [significant_digits(t) for t in ("6.224", "0.0023", "2.3e-3", "1.5k", "0.00", "-0.05")] == [
        4,
        2,
        2,
        2,
        1,
        1,
    ]


# -- the widget ------------------------------------------------------------------------------


class ChartApp(App[None]):
    def compose(self) -> ComposeResult:
        yield Chart(empty_text="no Phi data yet")


def rows(chart: Chart) -> list[str]:
    """The rendered text of every line, each checked to fill the widget's width exactly."""
    strips = [chart.render_line(y) for y in range(chart.size.height)]
    assert {strip.cell_length for strip in strips} == {chart.size.width}
    assert {len(strip.text) for strip in strips} == {chart.size.width}
    return [strip.text for strip in strips]


def phi_series(n: int = 2001) -> tuple[Series, Series, Series]:
    phi = 0.5 + 0.4 * np.tanh(np.linspace(-2, 2, n))
    return raw(phi), raw(phi - 0.05), raw(phi + 0.05)


@pytest.mark.asyncio
async def test_empty_chart_shows_its_message() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one(Chart)
        await pilot.pause()
        lines = rows(chart)
        assert lines[11] == "no Phi data yet".center(80).rstrip().ljust(80)
        assert all(not line.strip() for i, line in enumerate(lines) if i != 11)
        chart.set_series(raw([math.nan] * 10), band=(Series.empty(), Series.empty()))
        chart.empty_text = "still nothing"
        await pilot.pause()
        assert rows(chart)[11].strip() == "still nothing"


@pytest.mark.asyncio
async def test_axes_show_round_ticks() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one(Chart)
        mean, p10, p90 = phi_series()
        chart.set_series(mean, band=(p10, p90))
        chart.y_range = (0.0, 1.0)
        await pilot.pause()
        lines = rows(chart)
        labels = {line.split("┤")[0].strip(): i for i, line in enumerate(lines[:-1]) if "┤" in line}
        assert list(labels) == ["1.0", "0.8", "0.6", "0.4", "0.2", "0.0"]
        assert labels["1.0"] == 0 and labels["0.0"] == 22  # the last plot row; the x axis is below
        assert lines[-1].split() == ["└0", "500", "1k", "1.5k", "2k"]
        assert any(is_braille(ch) for line in lines for ch in line)


@pytest.mark.asyncio
async def test_right_axis_shows_entropy_in_nats() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one(Chart)
        chart.set_series(phi_series()[0])
        chart.y_range = (0.0, 1.0)
        chart.set_right_transform(entropy_axis(64))  # ln 64 = 4.1589
        await pilot.pause()
        lines = rows(chart)
        pairs = {line.split("┤")[0].strip(): line.split("├")[1].strip() for line in lines if "├" in line}
        assert pairs["0.0"] == "4.16" and pairs["1.0"] == "0.00" and pairs["0.6"] == "1.66"


@pytest.mark.asyncio
async def test_secondary_series_gets_its_own_scale() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one(Chart)
        chart.set_series(raw(np.linspace(0, 1, 300)), secondary=raw(np.linspace(0, 3e6, 300)))
        await pilot.pause()
        right = [line.split("├")[1].strip() for line in rows(chart) if "├" in line]
        assert "3M" in right and "0" in right and "1M" in right
        left = [line.split("┤")[0].strip() for line in rows(chart) if "┤" in line]
        assert "1.0" in left and "0.0" in left


@pytest.mark.asyncio
async def test_strips_are_rebuilt_only_when_something_changed() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one(Chart)
        mean, p10, p90 = phi_series()
        chart.set_series(mean, band=(p10, p90))
        await pilot.pause()
        builds = chart.build_count
        for _ in range(3):
            rows(chart)
        await pilot.pause()
        assert chart.build_count == builds
        dark_line = chart.component_style("chart--line-0")

        chart.mode = "block"
        await pilot.pause()
        assert chart.build_count == builds + 1
        assert not any(is_braille(ch) for line in rows(chart) for ch in line)

        app.theme = "textual-light"
        await pilot.pause()
        assert chart.build_count == builds + 2
        light_line = chart.component_style("chart--line-0")
        assert light_line != dark_line
        styles = {seg.style for y in range(23) for seg in chart.render_line(y) if seg.text.strip("│┤ ")}
        assert light_line in styles and chart.component_style("chart--band") in styles

        app.register_theme(Theme("chart-test", primary="#0000ff", variables={"chart-line-0": "#123456"}))
        app.theme = "chart-test"
        await pilot.pause()
        assert chart.build_count == builds + 3
        assert chart.line_style(0).color == chart.line_style(LINE_COLOURS).color == Color.parse("#123456")

        with pytest.raises(ValueError):
            chart.mode = "ascii"


@pytest.mark.asyncio
async def test_markers_are_full_height_in_their_own_colour() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one(Chart)
        chart.set_series(raw(np.full(1000, 0.5)))
        chart.set_markers([250])
        await pilot.pause()
        marker = chart.component_style("chart--marker")
        assert marker != chart.component_style("chart--line-0")
        marked = [
            y
            for y in range(23)
            if any(seg.style == marker and seg.text.strip() for seg in chart.render_line(y))
        ]
        assert len(marked) == 22  # every plot row but the line's, where the line wins the cell
        chart.set_right_transform(entropy_axis(64))
        await pilot.pause()
        builds = len(rows(chart)) and chart.build_count
        chart.set_markers([250])  # the same markers and an equal transform: nothing to redraw
        chart.set_right_transform(entropy_axis(64))
        await pilot.pause()
        rows(chart)
        assert chart.build_count == builds


def axis_labels(chart: Chart) -> tuple[list[str], list[str]]:
    """The tick labels at the left (before ┤) and right (after ├) axes, top to bottom."""
    lines = rows(chart)
    left = [line.split("┤")[0].strip() for line in lines if "┤" in line]
    right = [line.split("├")[1].strip() for line in lines if "├" in line]
    return left, right


@pytest.mark.asyncio
async def test_each_axis_has_its_own_minimum_span() -> None:
    app = ChartApp()
    async with app.run_test(size=(80, 24)) as pilot:
        chart = app.query_one(Chart)
        noise = np.random.default_rng(3).normal(0, 6e-6, 500)
        chart.set_series(raw(0.00233 + noise))
        await pilot.pause()
        lo, hi = chart.drawn_range or (0.0, 0.0)
        assert hi - lo < 1e-3  # no scale given: the noise fills the chart
        left, _ = axis_labels(chart)
        assert len(left) >= 2 and all(significant_digits(label) <= 4 for label in left), left

        chart.left_scale = AxisScale(min_span=0.05, limits=(0.0, 1.0))
        await pilot.pause()
        assert chart.drawn_range == (0.0, 0.05)
        left, _ = axis_labels(chart)
        assert left[0] == "0.05" and left[-1] == "0.00", left
        chart.set_series(raw(0.9991 + noise))
        await pilot.pause()
        assert chart.drawn_range == (0.95, 1.0)

        # the labels a right transform prints get the right scale's minimum span: with |V| = 2
        # (ln 2 = 0.693) a Φ window of 0.05 spans 0.035 nats, so it widens to 0.1 / ln 2 of Φ
        chart.set_right_transform(entropy_axis(2))
        chart.right_scale = AxisScale(min_span=0.1)
        await pilot.pause()
        lo, hi = chart.drawn_range or (0.0, 0.0)
        assert math.isclose(hi - lo, 0.1 / math.log(2)) and hi == 1.0
        _, right = axis_labels(chart)
        assert len(right) >= 2 and all(significant_digits(label) <= 4 for label in right), right

        # a secondary series on its own right scale: entropy flat near 6.2237 nats
        chart.set_right_transform(None)
        chart.set_series(raw(0.0023 + noise), secondary=raw(6.2237 - 6.2 * noise))
        await pilot.pause()
        lo, hi = chart.drawn_right_range or (0.0, 0.0)
        assert math.isclose(hi - lo, 0.1) and math.isclose((lo + hi) / 2, 6.2237, abs_tol=1e-3)
        _, right = axis_labels(chart)
        assert len(right) >= 2 and all(significant_digits(label) <= 4 for label in right), right
