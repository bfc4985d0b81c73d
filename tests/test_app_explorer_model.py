"""The metrics explorer's plain parts, on their own: the smoothing (against values worked out by hand from
TensorBoard's and Trackio's formulas, docs/guide/control-room.md), the key filter, the grid's rows, the log
axis, what a chart draws, and the pins of tui.toml."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from carl_tui.explorer_model import (
    GridRow,
    KeyInfo,
    ShownRun,
    count_line,
    filter_keys,
    grid_rows,
    key_matches,
    locate,
    log10_series,
    moved_step,
    order_keys,
    plan_chart,
    rows_in_view,
    scrolled_to,
    short_value,
    value_at,
)
from carl_tui.preferences import ConfigError, TuiConfig, load_config, save_config
from carl_tui.smoothing import Smoothing, centred_mean, ema
from engine.store import Series

NAN = math.nan


def raw(values: list[float], start: int = 0) -> Series:
    steps = list(range(start, start + len(values)))
    return Series(steps, steps, values, values, values, 1, values[-1] if values else None, steps[-1])


# -- smoothing ----------------------------------------------------------------------------------------


def test_ema_is_tensorboards_debiased_average() -> None:
    # w = 0.5, x = 1, 3, 2:
    #   last = 0.5;   debias 1 - 0.5   = 0.5    -> 1.0
    #   last = 1.75;  debias 1 - 0.25  = 0.75   -> 2.333...
    #   last = 1.875; debias 1 - 0.125 = 0.875  -> 2.142857...
    assert ema([1.0, 3.0, 2.0], 0.5) == pytest.approx([1.0, 7 / 3, 15 / 7])
    # w = 0.6, x = 2, 0: last = 0.8 -> 0.8/0.4 = 2; last = 0.48 -> 0.48/0.64 = 0.75
    assert ema([2.0, 0.0], 0.6) == pytest.approx([2.0, 0.75])
    # the first point is itself, whatever the weight
    assert ema([5.0, 1.0], 0.99)[0] == pytest.approx(5.0)


def test_ema_passes_non_finite_points_and_leaves_a_constant_series_alone() -> None:
    # NaN is drawn as it is and does not count in t: the point after it is the 2nd finite one.
    smoothed = ema([1.0, NAN, 3.0], 0.5)
    assert smoothed[0] == 1.0 and math.isnan(smoothed[1]) and smoothed[2] == pytest.approx(7 / 3)
    assert ema([0.3, 0.3, 0.3], 0.9) == [0.3, 0.3, 0.3]
    assert ema([], 0.6) == []
    assert ema([1.0, 2.0], 0.0) == [1.0, 2.0]  # weight 0: no smoothing


def test_centred_mean_is_trackios_window() -> None:
    # k = 3: one point each side, fewer at the ends
    assert centred_mean([1.0, 2.0, 6.0, 3.0], 3) == pytest.approx([1.5, 3.0, 11 / 3, 4.5])
    # k = 10 on 5 points: the window is 5, two each side
    assert centred_mean([1.0, 2.0, 3.0, 4.0, 10.0], 10) == pytest.approx([2.0, 2.5, 4.0, 4.75, 17 / 3])
    # k below 3 counts as 3; a NaN stays and is left out of its neighbours' means
    smoothed = centred_mean([1.0, NAN, 3.0, 5.0], 1)
    assert smoothed[0] == 1.0 and math.isnan(smoothed[1]) and smoothed[2:] == pytest.approx([4.0, 4.0])


def test_smoothing_cycles_and_steps_its_weight_and_window() -> None:
    smoothing = Smoothing()
    assert smoothing.label == "no smoothing"
    smoothing = smoothing.cycled()
    assert smoothing.kind == "ema" and smoothing.label == "EMA w=0.6"
    assert smoothing.stronger().label == "EMA w=0.7" and smoothing.weaker().label == "EMA w=0.5"
    assert Smoothing("ema", 0.999).stronger().weight == 0.999 and Smoothing("ema", 0.3).weaker().weight == 0.3
    smoothing = smoothing.cycled()
    assert smoothing.label == "centred mean k=10"
    assert smoothing.stronger().window == 20 and smoothing.weaker().window == 5
    assert smoothing.cycled().kind == "none"
    assert Smoothing().stronger() == Smoothing()  # nothing to step


def test_smoothing_a_series_draws_one_line_through_its_means() -> None:
    series = raw([1.0, 3.0, 2.0])
    assert Smoothing().apply(series) is series
    smoothed = Smoothing("ema", 0.5).apply(series)
    assert list(smoothed.first) == [0, 1, 2] and smoothed.level == 1
    assert (
        list(smoothed.vmin)
        == list(smoothed.vmax)
        == list(smoothed.mean)
        == pytest.approx([1.0, 7 / 3, 15 / 7])
    )
    assert smoothed.latest == pytest.approx(15 / 7)
    bucketed = Series([0, 4], [3, 7], [0.0, 2.0], [2.0, 6.0], [1.0, 4.0], 4, 5.0, 7)
    assert Smoothing("ema", 0.5).apply(bucketed).mean == pytest.approx([1.0, 3.0])  # of the means 1, 4


# -- keys and the grid ------------------------------------------------------------------------------


KEYS = order_keys(
    [
        KeyInfo("rewards/task/mean"),
        KeyInfo("entropy", "actor/entropy"),
        KeyInfo("loss"),
        KeyInfo("clip_ratio/low_mean"),
        KeyInfo("clip_ratio/high_mean"),
        KeyInfo("rewards/format/mean"),
        KeyInfo("timing_s/gen"),
    ]
)


def test_keys_are_grouped_by_prefix_and_a_renamed_key_shows_both_names() -> None:
    assert [k.key for k in KEYS] == [
        "entropy",
        "loss",
        "clip_ratio/high_mean",
        "clip_ratio/low_mean",
        "rewards/format/mean",
        "rewards/task/mean",
        "timing_s/gen",
    ]
    assert KEYS[0].label == "entropy  (actor/entropy)" and KEYS[0].group == ""
    assert KEYS[2].group == "clip_ratio"
    # stored names cannot drive the terminal: their control characters, newline and tab too, are written out
    assert KeyInfo("a\x1b[31m\nb").label == "a\\x1b[31m\\nb"
    assert KeyInfo("tab\there").label == "tab\\there"


def test_the_filter_takes_a_substring_or_a_glob() -> None:
    names = lambda text: [k.key for k in filter_keys(KEYS, text)]  # noqa: E731
    assert names("clip") == ["clip_ratio/high_mean", "clip_ratio/low_mean"]
    assert names("MEAN")[:1] == ["clip_ratio/high_mean"]  # case-insensitive
    assert names("rewards/*") == ["rewards/format/mean", "rewards/task/mean"]
    assert names("*/mean") == ["rewards/format/mean", "rewards/task/mean"]  # a glob matches the whole key
    assert names("clip_ratio/?ow_mean") == ["clip_ratio/low_mean"]
    assert names("[lt]*") == ["loss", "timing_s/gen"]
    assert names("actor/*") == ["entropy"]  # the source's own name matches too
    assert names("") == [k.key for k in KEYS] and names("nothing") == []
    assert key_matches(KeyInfo("kl"), "KL")
    assert count_line(2, 200) == "2 of 200 keys" and count_line(1, 1) == "1 of 1 key"


def test_grid_rows_start_each_group_and_scroll_by_rows() -> None:
    rows = grid_rows(KEYS, 2)
    assert rows == [
        GridRow(("entropy", "loss"), "(no prefix)"),
        GridRow(("clip_ratio/high_mean", "clip_ratio/low_mean"), "clip_ratio"),
        GridRow(("rewards/format/mean", "rewards/task/mean"), "rewards"),
        GridRow(("timing_s/gen",), "timing_s"),
    ]
    assert grid_rows(KEYS, 1)[1] == GridRow(("loss",), None)  # the group's second row has no heading
    # rows of 11 lines and a heading each: 24 lines hold 2 of them, 36 hold 3
    assert rows_in_view(rows, 0, 24, 11) == 2 and rows_in_view(rows, 0, 36, 11) == 3
    assert rows_in_view(rows, 3, 5, 11) == 1  # one row at least, even cut
    assert locate(rows, "rewards/task/mean") == (2, 1) and locate(rows, "nope") is None
    assert scrolled_to(rows, 0, 3, 24, 11) == 2  # the 4th row in view: two rows down
    assert scrolled_to(rows, 2, 0, 24, 11) == 0
    assert scrolled_to(rows, 1, 2, 24, 11) == 1  # already in view: no move


def test_short_values() -> None:
    assert [short_value(v) for v in (None, 0.0, 0.012345678, 123456.0, 1e-5, -2.5, math.inf)] == [
        "—",
        "0",
        "0.01235",
        "1.235e5",
        "1e-5",
        "-2.5",
        "inf",
    ]


# -- what a chart draws -----------------------------------------------------------------------------


def test_a_log_axis_leaves_out_values_not_above_zero_and_says_how_many() -> None:
    series = raw([0.001, 0.0, -1.0, 10.0, 100.0])
    logged, dropped = log10_series(series)
    assert dropped == 2
    assert logged.mean[0] == pytest.approx(-3) and logged.mean[3:] == pytest.approx([1, 2])
    assert math.isnan(logged.mean[1]) and math.isnan(logged.mean[2])
    plan = plan_chart(KeyInfo("x"), [ShownRun(1, "a")], {(1, "x"): series}, smoothing=Smoothing(), log=True)
    assert plan.log and plan.dropped == 2 and plan.title == "x 100 · log · 2 ≤ 0 left out"


def test_a_plan_overlays_runs_in_their_colours_and_bands_the_raw_values_under_a_smoothed_line() -> None:
    a, b = raw([1.0, 3.0, 2.0]), raw([2.0, 2.0, 5.0])
    runs = [ShownRun(7, "b", 3), ShownRun(5, "a", 1)]
    plan = plan_chart(KeyInfo("kl"), runs, {(7, "kl"): b, (5, "kl"): a}, smoothing=Smoothing(), pinned=True)
    assert plan.lines == (b, a) and plan.colors == (3, 1) and plan.band is None
    assert plan.title == "◆ kl 5"
    one = plan_chart(KeyInfo("kl"), runs[1:], {(5, "kl"): a}, smoothing=Smoothing("ema", 0.5))
    assert one.band == (a, a)  # the raw values, faint under the smoothed line
    assert list(one.lines[0].mean) == pytest.approx([1.0, 7 / 3, 15 / 7])  # type: ignore[union-attr]
    missing = plan_chart(KeyInfo("kl"), runs, {(5, "kl"): a}, smoothing=Smoothing())
    assert missing.lines == (None, a)


def test_the_cursor_moves_by_bucket_and_reads_the_value_there() -> None:
    series = Series([0, 4, 8], [3, 7, 9], [0.0, 1.0, 2.0], [1.0, 2.0, 3.0], [0.5, 1.5, 2.5], 4, 2.5, 9)
    assert moved_step(series, None, -1) == 9  # the newest step first
    assert (
        moved_step(series, 9, -1) == 7 and moved_step(series, 7, -1) == 3 and moved_step(series, 3, -1) == 3
    )
    assert moved_step(series, 3, 1) == 7 and moved_step(series, 9, 1) == 9
    assert value_at(series, 5) == 1.5 and value_at(series, 12) is None and value_at(None, 1) is None


# -- pins in tui.toml --------------------------------------------------------------------------------


def test_pins_are_kept_per_run_in_tui_toml(tmp_path: Path) -> None:
    config = TuiConfig().toggle_pin("grpo-1", "kl").toggle_pin("grpo-1", "loss").toggle_pin("other", "kl")
    assert config.pinned("grpo-1") == ["kl", "loss"] and config.pinned("nope") == []
    save_config(tmp_path, config)
    text = (tmp_path / "tui.toml").read_text()
    assert "[pins]" in text and load_config(tmp_path).pins == {"grpo-1": ["kl", "loss"], "other": ["kl"]}
    config = config.toggle_pin("grpo-1", "kl").toggle_pin("other", "kl")
    assert config.pins == {"grpo-1": ["loss"]}  # a run with no pin left leaves the table
    (tmp_path / "tui.toml").write_text('[pins]\ngrpo-1 = "kl"\n')
    with pytest.raises(ConfigError, match=r"tui.toml: pins: must be a table of run name = \[metric keys\]"):
        load_config(tmp_path)
