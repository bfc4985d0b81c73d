"""The metrics explorer's first paint on a big run: 200 keys × 100,000 steps (20M metric rows, written with
Store.add_metrics, so the rollups are the real ones), measured as a person meets it over SSH: a real
process on a pty, its screen read through pyte (bench/harness.py).

For each size (160×50: the grid; 80×24: the list and one chart), in the same run:
- the control room's own first paint (from the process start: the run's name and its Φ chart on screen);
- `m` pressed, until the explorer has drawn every chart in view (160×50) or the list and its chart (80×24).
Prints the medians in seconds and the explorer's first paint as a ratio to the main screen's; then the bytes
the open explorer writes to the terminal over 10 s while the store does not move.

    python bench/bench_explorer.py       # builds bench/out/store-explorer once (a few minutes)

What keeps it fast: the grid is virtual (only the charts in view exist, and only their series are read),
a series is read through the rollups (a few hundred buckets, whatever the run's length), and the keys of
the first screen are read in the same poll as the key listing (carl_tui/explorer_data.py).
"""

from __future__ import annotations

import compileall
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import OUT, ROOT, PtyApp, tui_argv  # noqa: E402

KEYS = 200
STEPS = 100_000
IDLE_S = 10.0
RUNS = 5  # the median of several: start-up times on a shared 2-core box are noisy
RUN_NAME = "bench-200x100k"
PACKAGES = ("carl_tui", "engine", "widgets", "themes")
# Twenty groups of ten, as an RL run's keys read after the framework maps (engine/observe/frameworks.py).
GROUPS = (
    "",
    "phi",
    "rewards",
    "clip_ratio",
    "completions",
    "timing",
    "actor",
    "critic",
    "optim",
    "perf",
    "eval",
    "kl",
    "entropy",
    "tokens",
    "grad",
    "memory",
    "sampling",
    "cascade",
    "gate",
    "system",
)
NAMED = ("phi/mean", "phi/p10", "phi/p90", "phi/entropy", "rewards/task/mean", "rewards/format/mean")


def key_names() -> list[str]:
    keys = list(NAMED) + ["reward", "loss", "kl", "entropy", "grad_norm", "learning_rate"]
    for group in GROUPS:
        for index in range(10):
            if len(keys) == KEYS:
                return keys
            key = f"{group}/metric_{index}" if group else f"metric_{index}"
            if key not in keys:
                keys.append(key)
    return keys


def build_store(home: Path) -> Path:
    """One finished run: 200 keys × 100k steps. Built once and cached in bench/out."""
    import numpy as np

    from engine.store import Store

    db = home / "carl.db"
    marker = home / f"built-{KEYS}x{STEPS}"
    if marker.exists() and db.exists():
        return db
    home.mkdir(parents=True, exist_ok=True)
    for stale in home.glob("carl.db*"):
        stale.unlink()
    rng = np.random.default_rng(0)
    steps = np.arange(STEPS)
    started = time.monotonic()
    with Store(db) as store:
        run_id = store.create_run(
            RUN_NAME, source_kind="jsonl", status="finished", max_steps=STEPS, vocab_size=512
        )
        now = time.time()
        for number, key in enumerate(key_names()):
            trend = 0.2 + 0.6 / (1 + np.exp(-(steps - STEPS * 0.4) / (STEPS * 0.05)))
            values = trend + np.cumsum(rng.normal(0, 0.002, STEPS)) + rng.normal(0, 0.02, STEPS)
            if key.startswith("phi/"):
                values = np.clip(values, 0, 1)
            chunk = 250_000
            for lo in range(0, STEPS, chunk):
                rows = [
                    (int(s), key, float(v), now)
                    for s, v in zip(steps[lo : lo + chunk], values[lo : lo + chunk], strict=True)
                ]
                store.add_metrics(run_id, rows)
            if number % 20 == 19:
                print(f"  built {number + 1} keys ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    marker.touch()
    return db


def braille(text: str) -> bool:
    return any("\u2801" <= ch <= "\u28ff" for ch in text)


def main_painted(text: str) -> bool:
    return RUN_NAME in text and braille(text)


def charts_drawn(lines: list[str]) -> int | None:
    """How many charts are on screen, when every one of them has drawn its line (None while one has not)."""
    count = 0
    for row, line in enumerate(lines):
        start = line.find("╭─ ")  # a chart has a title; the key list has none
        while start >= 0:
            end = line.find("╮", start)
            if end < 0:
                break
            below = [text[start:end] for text in lines[row + 1 : row + 10]]
            if not any(braille(text) for text in below):
                return None
            count += 1
            start = line.find("╭─ ", end)
    return count


def explorer_painted(text: str, least: int) -> bool:
    lines = text.splitlines()
    if not lines or f"{KEYS} of {KEYS} keys" not in lines[0]:
        return False
    drawn = charts_drawn(lines)
    return drawn is not None and drawn >= least


def measure(home: Path, cols: int, rows: int, least: int, idle_s: float = 0.0) -> tuple[float, float, int]:
    """(main screen's first paint from the start, the explorer's first paint from `m`, in seconds; the
    bytes written over `idle_s` seconds after that, the store not moving)."""
    app = PtyApp(tui_argv(home), cols=cols, rows=rows, env={"TEXTUAL_ANIMATIONS": "none"}).start()
    try:
        main_s = app.wait_for(main_painted, timeout=60)
        app.pump(1.0)  # settled: the footer, the engine's look, the first poll
        pressed = time.perf_counter()
        app.send(b"m")
        deadline = pressed + 60
        changed = True
        while not (changed and explorer_painted(app.text(), least)):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"the explorer never painted; last screen:\n{app.text()}")
            changed = app.pump(0.005) > 0
        explorer_s = time.perf_counter() - pressed
        if not idle_s:
            return main_s, explorer_s, 0
        app.pump(2.0)
        before = app.bytes_read
        app.pump(idle_s)
        return main_s, explorer_s, app.bytes_read - before
    finally:
        app.stop()


def main() -> None:
    home = OUT / "store-explorer"
    build_store(home)
    for package in PACKAGES:  # as installed (bench/bench_tui.py says why)
        compileall.compile_dir(ROOT / package, quiet=1)
    for cols, rows, least, what in ((160, 50, 12, "grid"), (80, 24, 1, "list")):
        mains, explorers = [], []
        for _ in range(RUNS):
            main_s, explorer_s, _ = measure(home, cols, rows, least)
            mains.append(main_s)
            explorers.append(explorer_s)
        main_s, explorer_s = statistics.median(mains), statistics.median(explorers)
        print(
            f"explorer_first_paint_{cols}x{rows}_{what}_"
            f"{KEYS}keys_x_{STEPS // 1000}k_steps_s={explorer_s:.3f} "
            f"baseline_main_screen_first_paint_s={main_s:.3f} ratio={explorer_s / main_s:.2f}"
        )
    _, _, idle = measure(home, 160, 50, 12, idle_s=IDLE_S)
    print(f"explorer_idle_bytes_{IDLE_S:.0f}s={idle} (the store not moving; the grid open)")


if __name__ == "__main__":
    main()
