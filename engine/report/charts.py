"""The report's plotly figures, built from `RunData` (plain lists, so each figure's JSON is plain
arrays). Imported only by the report: plotly is the `report` extra, never the base install's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.colors import hex_to_rgb, qualitative
from plotly.subplots import make_subplots

from .run_data import XY, RunData

TEMPLATE = "plotly_white"
HEIGHT = 360
GATE_STATES = ("closed", "ramping", "open")  # the `cascade/state` codes 0, 1, 2


def colours(n: int) -> list[str]:
    """One colour per run: plotly's ten, or 24 when more runs are drawn together."""
    palette = qualitative.Plotly if n <= len(qualitative.Plotly) else qualitative.Dark24
    return [palette[i % len(palette)] for i in range(n)]


def _figure(*, secondary: bool = False) -> go.Figure:
    fig = make_subplots(specs=[[{"secondary_y": True}]]) if secondary else go.Figure()
    fig.update_layout(
        template=TEMPLATE,
        height=HEIGHT,
        margin={"l": 60, "r": 60, "t": 30, "b": 50},
        hovermode="x unified",
        legend={"orientation": "h", "y": -0.2},
    )
    fig.update_xaxes(title_text="step")
    return fig


def _line(xy: XY, name: str, colour: str | None = None, **kwargs: Any) -> go.Scatter:
    line = {"color": colour} if colour else {}
    return go.Scatter(x=xy[0], y=xy[1], name=name, mode="lines", line=line, **kwargs)


def phi_entropy(run: RunData, colour: str) -> go.Figure:
    """Φ mean with its p10–p90 band across tokens, and the mean entropy (nats) on the right axis."""
    fig = _figure(secondary=True)
    band_lo, band_hi = run.series.get("phi/p10"), run.series.get("phi/p90")
    if band_lo and band_hi:
        red, green, blue = hex_to_rgb(colour)
        fill = f"rgba({red},{green},{blue},0.18)"
        fig.add_trace(
            _line(band_hi, "Φ p90", colour, line_width=0, showlegend=False, hoverinfo="skip"),
            secondary_y=False,
        )
        fig.add_trace(
            _line(band_lo, "Φ p10–p90", colour, fill="tonexty", fillcolor=fill, line_width=0),
            secondary_y=False,
        )
    if mean := run.series.get("phi/mean"):
        fig.add_trace(_line(mean, "Φ mean", colour), secondary_y=False)
    if entropy := run.series.get("phi/entropy"):
        fig.add_trace(_line(entropy, "entropy (nats)", "#7f7f7f", line_dash="dot"), secondary_y=True)
    fig.update_yaxes(title_text="Φ", secondary_y=False)
    fig.update_yaxes(title_text="entropy (nats)", secondary_y=True, showgrid=False)
    return fig


def rewards(run: RunData) -> go.Figure:
    """The total reward and each reward function's mean."""
    fig = _figure()
    keys = (["reward"] if "reward" in run.series else []) + run.reward_keys
    for key, colour in zip(keys, colours(len(keys)), strict=True):
        fig.add_trace(_line(run.series[key], key, colour, line_width=3 if key == "reward" else 2))
    fig.update_yaxes(title_text="reward")
    return fig


def gate(run: RunData) -> go.Figure:
    """The cascade gate: the coherence multiplier, the task-reward threshold, the state (right axis)
    and a line at the step it opened."""
    fig = _figure(secondary=True)
    if xy := run.series.get("cascade/multiplier"):
        fig.add_trace(_line(xy, "multiplier", "#636efa"), secondary_y=False)
    if xy := run.series.get("cascade/threshold"):
        fig.add_trace(_line(xy, "threshold (task reward)", "#00cc96", line_dash="dot"), secondary_y=False)
    if xy := run.series.get("cascade/state"):
        fig.add_trace(_line(xy, "state", "#ef553b", line_shape="hv"), secondary_y=True)
    fig.update_yaxes(title_text="multiplier / threshold", secondary_y=False)
    fig.update_yaxes(
        title_text="state",
        secondary_y=True,
        showgrid=False,
        range=[-0.2, 2.2],
        tickvals=[0, 1, 2],
        ticktext=list(GATE_STATES),
    )
    if run.gate_opened is not None:
        fig.add_vline(
            x=run.gate_opened,
            line_dash="dash",
            line_color="#ef553b",
            annotation_text=f"opened at step {run.gate_opened}",
            annotation_position="top left",
        )
    return fig


def eval_figures(figures: dict[str, Any]) -> go.Figure | None:
    """The newest eval's figures that are shares or means in [0, 1], as bars."""
    shown = [
        (k, v)
        for k, v in figures.items()
        if k in ("task", "solved", "format", "phi") and isinstance(v, int | float)
    ]
    if not shown:
        return None
    fig = _figure()
    fig.add_trace(
        go.Bar(
            x=[k for k, _ in shown],
            y=[v for _, v in shown],
            text=[f"{v:.3g}" for _, v in shown],
            marker_color="#636efa",
            name="held-out",
        )
    )
    fig.update_xaxes(title_text="")
    fig.update_yaxes(title_text="value", range=[0, 1.05])
    fig.update_layout(hovermode="closest", showlegend=False)
    return fig


def overlay(runs: Sequence[RunData], palette: Sequence[str], key: str, axis: str) -> go.Figure:
    """One series of several runs, one colour per run; the gate multiplier also marks each opening."""
    fig = _figure()
    for run, colour in zip(runs, palette, strict=True):
        if xy := run.series.get(key):
            fig.add_trace(_line(xy, run.label, colour))
            if key == "cascade/multiplier" and run.gate_opened is not None:
                fig.add_trace(
                    go.Scatter(
                        x=[run.gate_opened],
                        y=[0],
                        mode="markers",
                        showlegend=False,
                        marker={"color": colour, "symbol": "triangle-up", "size": 11},
                        name=f"{run.label}: opened at step {run.gate_opened}",
                    )
                )
    fig.update_yaxes(title_text=axis)
    return fig


def arms(
    summary: Sequence[dict[str, Any]], cells: Sequence[dict[str, Any]], field: str, axis: str
) -> go.Figure:
    """Per arm: the mean over finished seeds as a bar with its 95% CI, and each finished seed as a point."""
    fig = _figure()
    names = [a["arm"] for a in summary]
    figures = [a[field] for a in summary]
    means = [f["mean"] for f in figures]
    plus = [f["ci95"][1] - f["mean"] if f["ci95"] else 0 for f in figures]
    minus = [f["mean"] - f["ci95"][0] if f["ci95"] else 0 for f in figures]
    fig.add_trace(
        go.Bar(
            x=names,
            y=means,
            name="mean over seeds (95% CI)",
            marker_color="#c6cbf5",
            error_y={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
        )
    )
    seeded = [c for c in cells if c["status"] == "finished" and c[field] is not None]
    fig.add_trace(
        go.Scatter(
            x=[c["arm"] for c in seeded],
            y=[c[field] for c in seeded],
            mode="markers",
            name="one seed",
            marker={"color": "#1f2a7a", "size": 9},
            text=[f"seed {c['seed']}: {c['run'] or ''}" for c in seeded],
        )
    )
    fig.update_xaxes(title_text="arm", type="category", categoryorder="array", categoryarray=names)
    fig.update_yaxes(title_text=axis)
    fig.update_layout(hovermode="closest")
    return fig
