"""The rollouts viewer at 1,000,000 rollouts: scroll latency, from a key press to its lines on screen.

The store holds one run of 1,000,000 rollouts (1,000 steps of 1,000 samples, past a run's cap: the worst case
a reader can meet), written with the real schema and every index. `carl-tui` runs on a real pty at 160×50, as
a person meets it over SSH (as bench/bench_tui.py); the viewer lists every step at once (`a`), in the source's
order and then by reward (`s`, read along the reward index). 200 keys each (`↓`, `pgdn`, and some `↑`,
`pgup`), 30 ms apart, as a person holding a key. Two figures for the same keys:

- in the app (the goal's measure, "the app's own refresh timing"): from the key's event (made by Textual's
  driver as the bytes arrive) to the end of the first screen refresh that draws the cursor on its new row,
  every list line of the screen read (no `loading…`) and the status line's new row number; the app is
  `carl-tui` itself, with that timing hooked in from outside (TIMED_APP below);
- on the terminal: from writing the key to the pty until the screen, emulated by pyte, shows the same. This
  adds pyte's parsing of what the app wrote (pyte reads about 0.5 MB/s here; a scroll redraws some 15 KB).

Goal: p95 <= 50 ms in the app. Then the cost the sorts' indexes (schema 7) add to storing a GRPO step's
rollouts: the demo's 64 samples of 24 tokens with their per-token values, with and without the three indexes.

    python bench/bench_rollouts_view.py     # builds bench/out/rollouts-1m once (about a minute)
"""

from __future__ import annotations

import compileall
import json
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import OUT, ROOT, PtyApp, percentile  # noqa: E402

ROWS = 1_000_000
PER_STEP = 1000
GOAL_MS = 50.0
KEYS = 200
DOWN, UP, PGDN, PGUP = b"\x1b[B", b"\x1b[A", b"\x1b[6~", b"\x1b[5~"
ROW = re.compile(r"row ([\d,]+) of 1,000,000")
INDEXES = {
    "idx_rollouts_run_step_idx": (
        "CREATE UNIQUE INDEX idx_rollouts_run_step_idx ON rollouts (run_id, step, idx)"
    ),
    **{
        f"idx_rollouts_run_{c}": f"CREATE INDEX idx_rollouts_run_{c} ON rollouts (run_id, {c})"
        for c in ("total", "advantage", "length")
    },
}
# `carl-tui` with its key-to-screen time logged: each key event's time (Textual's own, stamped as the driver
# made it) to the end of the refresh that showed its move, one line of milliseconds per key.
TIMED_APP = r"""
import sys, time
from textual.app import App
from textual.screen import Screen

log, pending, seen = open(sys.argv[1], "w", buffering=1), [], set()
post = App.post_message
def post_message(self, message):
    if getattr(message, "key", None) in ("down", "up", "pagedown", "pageup") and message.time not in seen:
        seen.add(message.time)  # the app hands a key on to the screen: counted once
        pending.append(message.time)
    return post(self, message)
App.post_message = post_message

def drawn(screen):
    rows = screen.list
    top = int(rows.scroll_offset.y)
    status = str(screen.query_one("#rollouts-status").content)
    shown = range(top, min(top + rows.size.height, rows.known_rows))
    return all(rows.row(i) is not None for i in shown) and f"row {rows.cursor + 1:,} of" in status

refresh = Screen._compositor_refresh
def compositor_refresh(self):
    refresh(self)
    if pending and type(self).__name__ == "RolloutsScreen" and drawn(self):
        now = time.monotonic()
        for t in pending:
            log.write(f"{(now - t) * 1000:.3f}\n")
        pending.clear()
Screen._compositor_refresh = compositor_refresh

from carl_tui.launch import tui_main
sys.exit(tui_main(sys.argv[2:]))
"""
WORDS = [
    "the",
    "of",
    "tool",
    "weather",
    "city",
    "call",
    "answer",
    "json",
    "paris",
    "berlin",
    "rain",
    "sun",
    "cloud",
    "wind",
    "is",
    "it",
]


def build_store(home: Path) -> Path:
    """One run of ROWS rollouts with prompts and completions of a few dozen words; built once, cached."""
    from engine.store import Store
    from engine.store.rollouts import ROLLOUT_COLUMNS, ROLLOUT_WIDTH

    db = home / "carl.db"
    marker = home / f"built-{ROWS}"
    if marker.exists() and db.exists():
        return db
    home.mkdir(parents=True, exist_ok=True)
    for stale in home.glob("carl.db*"):
        stale.unlink()
    rng = random.Random(0)
    started = time.perf_counter()
    with Store(db) as store:
        run_id = store.create_run("bench-rollouts", source_kind="carl", status="finished", vocab_size=512)
        with store.transaction():
            for name in INDEXES:  # built once the rows are in: faster than row by row
                store.conn.execute(f"DROP INDEX {name}")
            rows = (
                (
                    run_id,
                    i // PER_STEP,
                    i % PER_STEP,
                    str(i % PER_STEP // 8),
                    f"prompt {i}: " + " ".join(rng.choices(WORDS, k=24)),
                    " ".join(rng.choices(WORDS, k=40)),
                    json.dumps({"task": (t := rng.random())}),
                    round(t + rng.random(), 4),
                    round(rng.gauss(0, 1), 4),
                    rng.randrange(1, 512),
                    None,
                    None,
                    None,
                    None,
                    0.0,
                )
                for i in range(ROWS)
            )
            store.conn.executemany(
                f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES ({', '.join('?' * ROLLOUT_WIDTH)})", rows
            )
            for sql in INDEXES.values():
                store.conn.execute(sql)
    marker.touch()
    print(f"  built {ROWS:,} rollouts in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return db


def cursor_row(text: str) -> int | None:
    match = ROW.search(text)
    return int(match.group(1).replace(",", "")) if match else None


def settled(text: str, before: int | None) -> bool:
    """The cursor moved and every line of the list is drawn."""
    row = cursor_row(text)
    return row is not None and row != before and "loading…" not in text


def scroll(app: PtyApp, keys: list[bytes]) -> list[float]:
    latencies = []
    for key in keys:
        before = cursor_row(app.text())
        written = time.perf_counter()
        app.send(key)
        while True:  # the screen is read again only when bytes arrived (pyte's text is the costly part)
            if app.pump(0.001) and settled(app.text(), before):
                break
            if time.perf_counter() - written > 10:
                raise TimeoutError(f"the screen never showed the move; last screen:\n{app.text()}")
        latencies.append(time.perf_counter() - written)
        app.pump(0.03)  # the next key a moment later, as a person holding a key
    return latencies


def key_sequence(count: int) -> list[bytes]:
    """Mostly down a line and a screen at a time, some back: what reading a list is."""
    pattern = [DOWN] * 4 + [PGDN] * 3 + [UP, PGUP]
    return [pattern[i % len(pattern)] for i in range(count)]


NAMES = {DOWN: "down", UP: "up", PGDN: "pgdn", PGUP: "pgup"}


def report(label: str, keys: list[bytes], latencies: list[float], *, goal: bool = True) -> None:
    p50, p95 = percentile(latencies, 50) * 1000, percentile(latencies, 95) * 1000
    verdict = ("OK" if p95 <= GOAL_MS else "MISSED") if goal else "(the emulator's time included)"
    by_key = " ".join(
        f"{name}_p50/p95_ms={percentile(ms, 50) * 1000:.0f}/{percentile(ms, 95) * 1000:.0f}"
        for key, name in NAMES.items()
        if (ms := [t for k, t in zip(keys, latencies, strict=True) if k == key])
    )
    print(
        f"rollouts_scroll_1M_{label}_p50_ms={p50:.1f} p95_ms={p95:.1f} goal_p95<={GOAL_MS:.0f} "
        f"ratio={p95 / GOAL_MS:.2f} keys={len(latencies)} {verdict} ({by_key})"
    )


def insert_cost() -> None:
    """ms to store one GRPO step's 64 rollouts (24 tokens each, per-token values), without and with the three
    indexes schema 7 adds; the median over 300 steps each, alternating, in fresh stores."""
    from engine.store import Store

    rng = random.Random(1)

    def step_rows(step: int) -> list[dict]:
        return [
            {
                "step": step,
                "idx": i,
                "group_id": str(i // 8),
                "prompt": " ".join(rng.choices(WORDS, k=30)),
                "completion": " ".join(rng.choices(WORDS, k=20)),
                "rewards": {"task": rng.random(), "format": 1.0},
                "advantage": rng.gauss(0, 1),
                "length": 24,
                "tokens": rng.choices(WORDS, k=24),
                "entropy": [rng.random() * 3 for _ in range(24)],
                "logprob": [-rng.random() for _ in range(24)],
            }
            for i in range(64)
        ]

    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        stores = {}
        for indexed in (False, True):
            store = Store(Path(tmp) / f"{indexed}.db")
            if not indexed:
                for column in ("total", "advantage", "length"):
                    store.conn.execute(f"DROP INDEX idx_rollouts_run_{column}")
            stores[indexed] = (store, store.create_run("bench", source_kind="carl"))
        for step in range(300):
            rows = step_rows(step)
            for indexed in (step % 2 == 0, step % 2 == 1):
                store, run_id = stores[indexed]
                started = time.perf_counter()
                store.add_rollouts(run_id, rows)
                times[indexed].append(time.perf_counter() - started)
        for store, _ in stores.values():
            store.close()
    without, with_ = statistics.median(times[False]) * 1000, statistics.median(times[True]) * 1000
    print(
        f"rollouts_insert_64_samples_ms={with_:.2f} baseline_without_v7_indexes_ms={without:.2f} "
        f"ratio={with_ / without:.2f}"
    )


def main() -> None:
    home = OUT / "rollouts-1m"
    build_store(home)
    for package in ("carl_tui", "engine", "widgets", "themes"):  # as installed (bench/bench_tui.py says why)
        compileall.compile_dir(ROOT / package, quiet=1)
    log = OUT / "rollouts-view-keys.log"
    argv = [sys.executable, "-c", TIMED_APP, str(log), "--home", str(home), "--no-engine"]
    app = PtyApp(argv, env={"TEXTUAL_ANIMATIONS": "none", "PYTHONPATH": str(ROOT)}).start()
    keys = key_sequence(KEYS)
    try:
        app.wait_for(lambda t: "bench-rollouts" in t and "Quit" in t, timeout=60)
        app.send(b"R")
        app.wait_for(lambda t: "row 1 of 1,000" in t and "loading…" not in t, timeout=60)
        app.send(b"a")  # every step: the million
        app.wait_for(lambda t: "row 1 of 1,000,000" in t and "loading…" not in t, timeout=60)
        app.pump(0.5)
        terminal = {"source_order": scroll(app, keys)}
        app.send(b"s")  # by reward, along the reward index
        app.wait_for(lambda t: "sort reward" in t and "row 1 of 1,000,000" in t and "loading…" not in t, 60)
        app.pump(0.5)
        terminal["by_reward"] = scroll(app, keys)
        app.pump(0.5)
    finally:
        app.stop()
    in_app = [float(line) / 1000 for line in log.read_text().split()]
    if len(in_app) != 2 * KEYS:
        raise RuntimeError(f"{len(in_app)} keys timed in the app, {2 * KEYS} sent")
    for index, label in enumerate(terminal):
        report(f"in_app_{label}", keys, in_app[index * KEYS : (index + 1) * KEYS])
        report(f"on_terminal_pyte_{label}", keys, terminal[label], goal=False)
    insert_cost()


if __name__ == "__main__":
    main()
