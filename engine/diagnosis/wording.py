"""How the offline analyst words a finding, a number and a series' trend (a digest's trend dict), and how it
quotes stored text (a run's name, a metric key, a console line) in its Markdown."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass
class Finding:
    severity: str  # red | yellow | info
    topic: str  # plateau, hacking, gate, trap, entropy, variance, nan, stalled, failed, eval, kl, clip, ...
    title: str
    detail: str
    advice: str = ""
    covers: str = ""  # the health reason this finding stands for, when it words it otherwise


def fmt(value: float | None) -> str:
    """A number in three significant digits (thousands with separators); a dash for none or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


# -- stored text in Markdown: shown as the text it is, never as markup ------------------------------------

# What starts markup inside a line: emphasis, code, a link's brackets, an entity, strikethrough. HTML, links
# and images are off in the parser that draws an answer (render.py), and stored text is put inside a line.
_MARKUP = re.compile(r"([\\`*_\[\]&~])")


def prose(value: Any) -> str:
    """Stored text (a name, a reason, a line of a log) for Markdown prose, on one line: every character that
    could start markup inside a line is escaped, so `**x**` or `[x](y)` in a run's name shows as written."""
    return _MARKUP.sub(r"\\\1", " ".join(str(value).splitlines()))


def code(value: Any) -> str:
    """Stored text as inline code: fenced by more backticks than the longest run inside it (CommonMark), so
    a backtick in a metric's name cannot end the code early."""
    s = " ".join(str(value).splitlines())
    fence = "`" * (max((len(run) for run in re.findall("`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ")) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


# -- trends --------------------------------------------------------------------------------------------


def _band(t: dict[str, Any]) -> float:
    """The change early→late that is still no move: the digest's band (K_NOISE standard deviations of the
    difference of two quarter means), else two step-to-step noise widths."""
    band = t.get("change_band")
    band = band if band is not None else 2 * (t.get("noise") or 0.0)
    scale = max(abs(t.get("early") or 0.0), abs(t.get("late") or 0.0), 1.0)
    return band if band > 1e-12 * scale else 0.0  # a series without noise: no rounding error for its band


def is_flat(t: dict[str, Any]) -> bool:
    """No movement beyond noise: flat for the last quarter or more, or an early→late change within the
    series' change band."""
    if t["flat_since"] is not None:
        return True
    change = t.get("change")
    return change is not None and abs(change) <= _band(t)


def level_text(t: dict[str, Any], unit: str = "") -> str:
    """A series' latest value and its mean over the run."""
    text = f"{fmt(t['last'])}{unit} at step {t['last_step']}"
    if t.get("mean") is not None:
        text += f" (mean {fmt(t['mean'])}{unit} over steps {t['first_step']}–{t['last_step']})"
    return text


def moved(t: dict[str, Any]) -> bool:
    """The early→late change is beyond the series' change band."""
    change = t.get("change")
    return change is not None and abs(change) > _band(t)


def movement(t: dict[str, Any]) -> str:
    """How a series moved, as its numbers say: rising or falling from the first quarter to the last when
    that change is beyond its noise (and flat since a step, when its tail has been), flat otherwise."""
    flat = (
        f"flat at {fmt(t['flat_level'])} ± {fmt(t['noise'])} since step {t['flat_since']}"
        if t["flat_since"] is not None
        else ""
    )
    if t["change"] is None or (flat and t["flat_since"] <= t["first_step"]):
        return flat or "too short to have a trend"
    if moved(t):
        way = "rising" if t["change"] > 0 else "falling"
        text = (
            f"{way} from {fmt(t['early'])} in the first quarter to {fmt(t['late'])} in the last "
            f"({t['change']:+.3g}, beyond its noise of ±{fmt(_band(t))})"
        )
        return f"{text}, and {flat}" if flat else text
    return flat or (
        f"flat: {fmt(t['early'])} in the first quarter, {fmt(t['late'])} in the last (within its noise of "
        f"±{fmt(_band(t))})"
    )
