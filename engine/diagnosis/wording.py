"""How the offline analyst words a finding, a number and a series' trend (a digest's trend dict)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class Finding:
    severity: str  # red | yellow | info
    topic: str  # plateau, hacking, gate, trap, entropy, variance, nan, stalled, failed, eval, kl, clip, ...
    title: str
    detail: str
    advice: str = ""


def fmt(value: float | None) -> str:
    """A number in three significant digits (thousands with separators); a dash for none or not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def is_flat(t: dict[str, Any]) -> bool:
    """No movement beyond noise: flat for the last quarter or more, or an early→late change
    within two noise widths."""
    if t["flat_since"] is not None:
        return True
    change, noise = t.get("change"), t.get("noise") or 0.0
    return change is not None and abs(change) <= 2 * noise


def level_text(t: dict[str, Any], unit: str = "") -> str:
    """A series' latest value and its mean over the run."""
    text = f"{fmt(t['last'])}{unit} at step {t['last_step']}"
    if t.get("mean") is not None:
        text += f" (mean {fmt(t['mean'])}{unit} over steps {t['first_step']}–{t['last_step']})"
    return text


def movement(t: dict[str, Any]) -> str:
    """How a series moved: flat since a step, flat within its noise, or rising/falling early→late."""
    if t["flat_since"] is not None:
        return f"flat at {fmt(t['flat_level'])} ± {fmt(t['noise'])} since step {t['flat_since']}"
    if t["change"] is None:
        return "too short to have a trend"
    if is_flat(t):
        return (
            f"flat: {fmt(t['early'])} in the first quarter, {fmt(t['late'])} in the last (within its noise)"
        )
    way = "rising" if t["change"] > 0 else "falling"
    return (
        f"{way} from {fmt(t['early'])} in the first quarter to {fmt(t['late'])} in the last "
        f"({t['change']:+.3g})"
    )
