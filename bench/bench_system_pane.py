"""Bytes the control room writes to the terminal per 10 s with the System pane shown and nothing else
changing, while the machine is sampled at 2 s. Prints, each against the baseline measured in the same run:

- ours: the control room as shipped (the pane refreshes only the lines whose text changed), at 80×24 and
  160×50;
- whole pane: the same control room with the pane redrawing all of itself whenever any of its lines changed
  (what a pane without the line-by-line comparison would send);
- nvitop at the same interval (`nvitop --interval 2`, 80×24), when it is installed and runs here: it needs
  NVML, so on a machine without an NVIDIA driver it exits at once and the line says so.

The samples are written by the engine's own system job (`SystemJob.tick` on a real `Store`, this machine's
real readings: its CPU share moves at every sample, its memory and disk now and then) in a thread of this
process every 2 s; the control room runs as `carl-tui --no-engine` on a real pty, its screen read through pyte
(bench/harness.py). The store holds one finished run, so nothing but the samples moves.

    python bench/bench_system_pane.py
    NVITOP_PATH=/dir/with/nvitop python bench/bench_system_pane.py   # nvitop installed apart (pip --target)
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import PtyApp  # noqa: E402

from engine.store import Store  # noqa: E402
from engine.system.system_job import SystemJob  # noqa: E402

INTERVAL_S = 2.0
WINDOW_S = 10.0
ROUNDS = 3  # windows measured per variant (the median is printed)
SIZES = ((80, 24), (160, 50))

# The control room with a pane that redraws all of itself when any line changed: the same lines, the same
# timer, only the refresh differs (widgets/system_pane.py `SystemPane.redraw`).
WHOLE_PANE = """
import sys
from widgets.system_pane import SystemPane, box_lines

def redraw(self, *, whole=False):
    width = self.content_size.width or 40
    lines = box_lines(self.data, width, self.max_lines, wide=self.wide, now=self.clock())
    if lines != self.lines or whole:
        layout = len(lines) != len(self.lines)
        self.lines = lines
        self._strips.clear()
        self.refresh(layout=layout)

SystemPane.redraw = redraw
from carl_tui.launch import tui_main
sys.argv[0] = "carl-tui"
tui_main()
"""


class Sampling:
    """The engine's system job in a thread: a sample every INTERVAL_S into the store."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.samples = 0

    def run(self) -> None:
        with Store(self.home / "carl.db") as store:
            job = SystemJob(store, self.home)
            while not self.stop.is_set():
                job.tick()
                self.samples = job.samples
                self.stop.wait(max(0.01, job.seconds_to_next()))
            job.close()

    def __enter__(self) -> Sampling:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def make_home(root: Path) -> Path:
    home = root / "home"
    home.mkdir(mode=0o700)
    with Store(home / "carl.db") as store:
        run_id = store.create_run("bench-system", source_kind="jsonl", status="finished", max_steps=100)
        now = time.time()
        store.add_metrics(run_id, [(s, "phi/mean", 0.5 + s / 200, now) for s in range(100)])
    return home


def measure(
    argv: list[str], size: tuple[int, int], ready: str, env: dict[str, str]
) -> tuple[list[int], float, str]:
    """Bytes written in each of ROUNDS windows of WINDOW_S once `ready` shows, the control room's CPU seconds
    per window, and the last screen."""
    app = PtyApp(argv, cols=size[0], rows=size[1], env=env).start()
    try:
        app.wait_for(lambda text: ready in text, timeout=60)
        app.pump(3.0)  # the first paint and the key bar settle
        process = psutil.Process(app.pid)
        cpu_before = sum(process.cpu_times()[:2])
        counts = []
        for _ in range(ROUNDS):
            before = app.bytes_read
            app.pump(WINDOW_S)
            counts.append(app.bytes_read - before)
        cpu = (sum(process.cpu_times()[:2]) - cpu_before) / ROUNDS
        return counts, cpu, app.text()
    finally:
        app.stop()


def nvitop(env: dict[str, str]) -> str:
    """nvitop's bytes per 10 s at 80×24, or why it did not run."""
    argv = [sys.executable, "-m", "nvitop", "--interval", str(INTERVAL_S)]
    # nvitop alone on its path: with this repository's folders on it, nvitop hangs after its NVML error here
    app = PtyApp(argv, cols=80, rows=24, env={**env, "PYTHONPATH": os.environ.get("NVITOP_PATH", "")}).start()
    try:
        app.pump(5.0)  # it starts, or says why it cannot
        counts = []
        for _ in range(ROUNDS):
            before = app.bytes_read
            app.pump(WINDOW_S)
            counts.append(app.bytes_read - before)
        said = [line.strip() for line in app.text().splitlines() if line.strip()]
        exited = psutil.Process(app.pid).status() == psutil.STATUS_ZOMBIE
        if exited or (said and "ERROR" in said[0]):  # no NVML: it says so first (and may not exit on a pty)
            return f"nvitop_did_not_run: {said[0][:100] if said else 'no output'}"
        return f"nvitop_bytes_per_10s={statistics.median(counts):.0f} (80x24, --interval {INTERVAL_S:g})"
    finally:
        app.stop()


def main() -> None:
    env = {"TEXTUAL_ANIMATIONS": "none", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    with tempfile.TemporaryDirectory() as tmp:
        home = make_home(Path(tmp))
        ours_argv = [sys.executable, "-m", "carl_tui", "--home", str(home), "--no-engine"]
        whole_argv = [sys.executable, "-c", WHOLE_PANE, "--home", str(home), "--no-engine"]
        with Sampling(home) as sampling:
            for size in SIZES:
                ours, ours_cpu, screen = measure(ours_argv, size, "cpu", env)
                whole, whole_cpu, _ = measure(whole_argv, size, "cpu", env)
                ours_b, whole_b = statistics.median(ours), statistics.median(whole)
                print(
                    f"{size[0]}x{size[1]} ours_bytes_per_10s={ours_b:.0f} (rounds {ours})"
                    f" baseline_whole_pane_bytes_per_10s={whole_b:.0f} (rounds {whole})"
                    f" ratio={ours_b / whole_b:.2f}"
                    f" tui_cpu_s_per_10s ours={ours_cpu:.3f} whole_pane={whole_cpu:.3f}"
                )
            pane = [line for line in screen.splitlines() if "cpu" in line or "ram" in line or "disk" in line]
            print("pane at 160x50:", " | ".join(line.strip()[:40] for line in pane[:3]))
            print(nvitop(env))
            print(f"samples_written={sampling.samples} interval_s={INTERVAL_S:g} window_s={WINDOW_S:g}")


if __name__ == "__main__":
    main()
