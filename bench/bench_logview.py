"""The log view (`L`) on 1 GB of log: opening it at its end, against `tail -n 50` on the same file, and
scrolling a page at a time.

The file (bench/out/logview-1g.log, built once) is 1 GiB of training-log lines of about 100 bytes (11 million
lines), its last line marked. Every figure is measured in the same run as its baseline, the page cache warm
for both (each reads the file once first).

- engine: `LogReader` (engine/console/log_reader.py) as the log view's thread drives it: the time to its first
  answer (the file's end, indexed, its last 50 lines read as text) against `tail -n 50 FILE` (a process, its
  output read); then the time until the whole file is indexed (line numbers, search, jumps) and what the
  index holds.
- in the app: `carl-tui` on a real pty at 160×50 with the run whose console the file is; from the `L` key's
  event (Textual's own time, as the driver made it) to the end of the first screen refresh that shows the
  file's last line (hooked in from outside, as bench/bench_rollouts_view.py does); against the same `tail`.
- scrolling: 100 `pgup` from the end, then 100 `pgdn` from the top (every page read from the file, not
  cached), 30 ms apart; from each key's event to the refresh that shows its page. Goal: p95 <= 50 ms a page.

    python bench/bench_logview.py      # builds the file once (about 10 s)
"""

from __future__ import annotations

import compileall
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import OUT, ROOT, PtyApp, percentile  # noqa: E402

SIZE = 1 << 30
LAST = b"the very last line of the log\n"
PAGES = 100
GOAL_MS = 50.0
PGUP, PGDN = b"\x1b[5~", b"\x1b[6~"
TIMED_APP = r"""
import sys, time
from textual.app import App
from textual.screen import Screen

log, pending, seen, shown = open(sys.argv[1], "w", buffering=1), [], set(), {"top": None}
post = App.post_message
def post_message(self, message):
    key = getattr(message, "key", None)
    if key in ("L", "pageup", "pagedown") and message.time not in seen:
        seen.add(message.time)  # the app hands a key on to the screen: counted once
        pending.append((key, message.time))
    return post(self, message)
App.post_message = post_message

refresh = Screen._compositor_refresh
def compositor_refresh(self):
    refresh(self)
    if not pending or type(self).__name__ != "ConsoleScreen":
        return
    lines = self.query_one("LogLines")
    if lines.index is None or not lines.count:
        return
    top, now = lines.top_line, time.monotonic()
    if pending[0][0] == "L":
        if top + lines.size.height >= lines.count:  # the end shown
            log.write(f"L {(now - pending.pop(0)[1]) * 1000:.3f}\n")
    elif top != shown["top"]:  # a page moved: every key it answers (two may come in one refresh)
        for key, t in pending:
            log.write(f"{key} {(now - t) * 1000:.3f}\n")
        pending.clear()
    shown["top"] = top
Screen._compositor_refresh = compositor_refresh

from carl_tui.launch import tui_main
sys.exit(tui_main(sys.argv[2:]))
"""


def build_log(path: Path) -> Path:
    if path.exists() and path.stat().st_size > SIZE:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        f"{{'loss': {1 / (i + 1):.4f}, 'grad_norm': {0.5 + i % 7 / 10:.3f}, 'learning_rate': 1e-06, "
        f"'reward': {i % 11 / 10:.2f}, 'step': {i}}}\n".encode()
        for i in range(10_000)
    ]
    block = b"".join(lines)
    with open(path, "wb") as f:
        written = 0
        while written < SIZE - len(LAST):
            chunk = block[: SIZE - len(LAST) - written]
            f.write(chunk)
            written += len(chunk)
        f.write(b"\n" + LAST)  # after the cut line the block left
    return path


def tail_seconds(path: Path) -> float:
    started = time.perf_counter()
    out = subprocess.run(["tail", "-n", "50", str(path)], capture_output=True, check=True).stdout
    took = time.perf_counter() - started
    assert out.endswith(LAST)
    return took


def engine_open(path: Path) -> tuple[float, float, int, int]:
    """(seconds to the end shown, seconds to the whole index, lines, index bytes)."""
    from engine.console.log_reader import LogReader, Opened
    from engine.console.logfile import read_line

    started = time.perf_counter()
    reader = LogReader(path)
    first = [r for r in reader.answer(timeout=0.01) if isinstance(r, Opened)][0]
    shown = [
        read_line(first.file, first.index, i, first.end)[0] for i in range(first.count - 50, first.count)
    ]
    end_shown = time.perf_counter() - started
    reader.view_ready.set()  # drawn: the reader indexes the whole file now
    assert shown[-1] == LAST.decode().strip()
    while not (whole := [r for r in reader.answer(timeout=0.01) if isinstance(r, Opened) and r.whole]):
        pass
    indexed = time.perf_counter() - started
    opened = whole[0]
    for done in (first, opened):
        done.file.close()
    reader.close()
    return end_shown, indexed, opened.count, opened.index.nbytes


def build_home(home: Path, log: Path) -> None:
    from engine.store import Store

    home.mkdir(parents=True, exist_ok=True)
    for stale in home.glob("carl.db*"):
        stale.unlink()
    with Store(home / "carl.db") as store:
        run_id = store.create_run("bench-logview", source_kind="carl", status="running")
        store.system.add_console(run_id, str(log), "train")


def in_app(home: Path) -> dict[str, list[float]]:
    """Milliseconds per key, by key: `L` (open at the end), then `pageup`s, then `pagedown`s."""
    for package in ("carl_tui", "engine", "widgets", "themes"):  # as installed (bench/bench_tui.py says why)
        compileall.compile_dir(ROOT / package, quiet=1)
    timings = OUT / "logview-keys.log"
    argv = [sys.executable, "-c", TIMED_APP, str(timings), "--home", str(home), "--no-engine"]
    app = PtyApp(argv, env={"TEXTUAL_ANIMATIONS": "none", "PYTHONPATH": str(ROOT)}).start()
    try:
        app.wait_for(lambda t: "bench-logview" in t and "Quit" in t, timeout=60)
        app.pump(1.0)
        app.send(b"L")
        app.wait_for(lambda t: LAST.decode().strip() in t, timeout=60)
        app.wait_for(lambda t: " lines · 1.0 GB" in t and "the last" not in t, timeout=120)  # whole
        app.pump(0.5)
        for key in [PGUP] * PAGES:
            app.send(key)
            app.pump(0.03)
        app.send(b"g")
        app.pump(0.5)
        for key in [PGDN] * PAGES:
            app.send(key)
            app.pump(0.03)
        app.pump(1.0)
        app.send(b"\x1b")  # closed, then opened again: the modules are loaded now
        app.wait_for(lambda t: "Quit" in t and "bench-logview" in t, timeout=30)
        app.pump(1.0)
        app.send(b"L")
        app.wait_for(lambda t: LAST.decode().strip() in t, timeout=60)
        app.pump(1.0)
    finally:
        app.stop()
    out: dict[str, list[float]] = {}
    for line in timings.read_text().split("\n"):
        if line:
            key, ms = line.split()
            out.setdefault(key, []).append(float(ms))
    return out


def main() -> None:
    log = build_log(OUT / "logview-1g.log")
    tail_seconds(log)  # the page cache warm for both
    tails = [tail_seconds(log) for _ in range(5)]
    opens = [engine_open(log) for _ in range(3)]
    tail_ms = statistics.median(tails) * 1000
    end_ms = statistics.median(o[0] for o in opens) * 1000
    whole_ms = statistics.median(o[1] for o in opens) * 1000
    _, _, count, index_bytes = opens[0]
    print(f"tail_n50_ms={tail_ms:.1f} (baseline, median of 5)")
    print(f"logview_engine_end_shown_ms={end_ms:.1f} ratio_to_tail={end_ms / tail_ms:.2f}")
    print(
        f"logview_engine_whole_index_ms={whole_ms:.0f} ratio_to_tail={whole_ms / tail_ms:.1f} "
        f"lines={count:,} index_MB={index_bytes / 1e6:.0f} ({index_bytes / count:.1f} bytes a line)"
    )
    home = OUT / "logview-home"
    build_home(home, log)
    keys = in_app(home)
    tail_ms = statistics.median(tail_seconds(log) for _ in range(5)) * 1000
    first_ms, again_ms = keys["L"]
    print(
        f"logview_in_app_open_at_end_ms={first_ms:.1f} (the first time: numpy and the view's modules are "
        f"loaded) again_ms={again_ms:.1f} tail_n50_ms={tail_ms:.1f} ratio={first_ms / tail_ms:.0f} "
        f"ratio_again={again_ms / tail_ms:.0f}"
    )
    for key in ("pageup", "pagedown"):
        ms = keys.get(key, [])
        if len(ms) != PAGES:
            raise RuntimeError(f"{len(ms)} {key} timed in the app, {PAGES} sent")
        p50, p95 = percentile(ms, 50), percentile(ms, 95)
        verdict = "OK" if p95 <= GOAL_MS else "MISSED"
        print(
            f"logview_scroll_{key}_p50_ms={p50:.1f} p95_ms={p95:.1f} goal_p95<={GOAL_MS:.0f} "
            f"ratio={p95 / GOAL_MS:.2f} pages={len(ms)} {verdict}"
        )


if __name__ == "__main__":
    main()
