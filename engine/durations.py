"""Durations as people read them in a status line or a listing: 42s, 3m05s, 2h07m, 1d4h00m."""

from __future__ import annotations


def compact_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    days, rest = divmod(seconds, 86400)
    return (f"{days}d" if days else "") + f"{rest // 3600}h{rest % 3600 // 60:02d}m"
