"""Themes for the control room: Textual `Theme` objects plus the stylesheet shipped beside them.

Chart colours come from theme variables (`chart-line-N`, `chart-band`, `chart-marker`), so a
theme decides how Phi, its band and each reward function look.
"""

from __future__ import annotations

from pathlib import Path

from textual.theme import Theme

STYLESHEET = Path(__file__).with_name("carl.tcss")

CARL_DARK = Theme(
    name="carl-dark",
    primary="#5fafff",
    secondary="#af87ff",
    accent="#ffaf5f",
    warning="#ffd75f",
    error="#ff5f5f",
    success="#5fd787",
    foreground="#d0d0d0",
    background="#121212",
    surface="#1c1c1c",
    panel="#262626",
    dark=True,
    variables={
        "chart-line-0": "#5fd7ff",
        "chart-line-1": "#ffaf5f",
        "chart-line-2": "#87d787",
        "chart-line-3": "#d787d7",
        "chart-line-4": "#ffd75f",
        "chart-line-5": "#ff8787",
        "chart-band": "#005f87",
        "chart-marker": "#ff5fd7",
        "chart-axis": "#808080",
    },
)

CARL_LIGHT = Theme(
    name="carl-light",
    primary="#005fd7",
    secondary="#8700af",
    accent="#d75f00",
    warning="#af8700",
    error="#d70000",
    success="#008700",
    foreground="#1c1c1c",
    background="#fafafa",
    surface="#eeeeee",
    panel="#e4e4e4",
    dark=False,
    variables={
        "chart-line-0": "#005faf",
        "chart-line-1": "#d75f00",
        "chart-line-2": "#008700",
        "chart-line-3": "#8700af",
        "chart-line-4": "#af8700",
        "chart-line-5": "#d70000",
        "chart-band": "#afd7ff",
        "chart-marker": "#d7005f",
        "chart-axis": "#6c6c6c",
    },
)

# Pure black and white with saturated, widely separated hues: readable on a projector or
# through a low-quality SSH client palette.
CARL_HIGH_CONTRAST = Theme(
    name="carl-high-contrast",
    primary="#ffff00",
    secondary="#00ffff",
    accent="#ff00ff",
    warning="#ffff00",
    error="#ff0000",
    success="#00ff00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#000000",
    dark=True,
    luminosity_spread=0.0,
    text_alpha=1.0,
    variables={
        "chart-line-0": "#ffffff",
        "chart-line-1": "#ffff00",
        "chart-line-2": "#00ffff",
        "chart-line-3": "#ff00ff",
        "chart-line-4": "#00ff00",
        "chart-line-5": "#ff8000",
        "chart-band": "#0000ff",
        "chart-marker": "#ff0000",
        "chart-axis": "#ffffff",
    },
)

# Okabe-Ito palette: distinguishable with the common forms of colour blindness.
CARL_COLORBLIND = Theme(
    name="carl-colorblind",
    primary="#56b4e9",
    secondary="#cc79a7",
    accent="#e69f00",
    warning="#f0e442",
    error="#d55e00",
    success="#009e73",
    foreground="#e0e0e0",
    background="#101010",
    surface="#1a1a1a",
    panel="#242424",
    dark=True,
    variables={
        "chart-line-0": "#56b4e9",
        "chart-line-1": "#e69f00",
        "chart-line-2": "#009e73",
        "chart-line-3": "#cc79a7",
        "chart-line-4": "#f0e442",
        "chart-line-5": "#d55e00",
        "chart-band": "#0072b2",
        "chart-marker": "#d55e00",
        "chart-axis": "#909090",
    },
)

THEMES: tuple[Theme, ...] = (CARL_DARK, CARL_LIGHT, CARL_HIGH_CONTRAST, CARL_COLORBLIND)
THEME_NAMES: tuple[str, ...] = tuple(t.name for t in THEMES)
DEFAULT_THEME = CARL_DARK.name
