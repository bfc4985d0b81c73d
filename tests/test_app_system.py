"""The System pane and the System screen (`S`) through Pilot, on stores whose box was written by the real
writer (`store.system.add_sample`, with this machine's real samples from the engine's Sampler, or samples with
GPU readings: this machine has no GPU), at 80×24 and 160×50: CPU, RAM and disk with the no-GPU line; GPUs;
a lost node and a quiet one; the run's throughput; only the lines that changed are redrawn; the screen's
charts over wall time, its window, its step row and cursor, the processes table; names that try to be
markup or escape sequences shown as text. And the reads under them: the watcher reads the box only when it
moved, and the run's steps by wall time are bounded."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import until
from textual.content import Content

from carl_tui.app import ControlRoom
from carl_tui.model import StoreWatcher
from carl_tui.system_model import SystemFeed
from carl_tui.system_view import SystemScreen
from engine.store import Store, StoreReader
from engine.store.system import ProcessRow
from engine.system import Sampler, SystemJob
from engine.system.readings import DiskReading, GpuReading, Sample
from engine.system.system_job import SAMPLING_OFF
from widgets.system_pane import SystemPane
from widgets.time_chart import TimeChart

SIZES = [(80, 24), (160, 50)]
HOSTILE = "x[/bold]y\x1b[2J"
GiB = 2**30


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


def a_run(
    store: Store, name: str = "grpo", steps: int = 50, *, start: float | None = None, perf: bool = False
) -> int:
    """A running run whose steps were written 2 s apart, the last one now (or from `start`)."""
    run_id = store.create_run(name, source_kind="jsonl", max_steps=100, vocab_size=512)
    t0 = (time.time() - 2 * steps) if start is None else start
    rows = [(s, "loss", 1.0 / (s + 1), t0 + 2 * s) for s in range(steps)]
    rows += [(s, "phi/mean", 0.5, t0 + 2 * s) for s in range(steps)]
    if perf:
        rows += [(s, "perf/tokens_per_s", 2345.0, t0 + 2 * s) for s in range(steps)]
        rows += [(s, "perf/mfu", 0.41, t0 + 2 * s) for s in range(steps)]
    store.add_metrics(run_id, rows)
    return run_id


def machine_sample(home: Path) -> Sample:
    """A real sample of this machine, with its $CARL_HOME's disk (what the engine's job stores)."""
    sampler = Sampler()
    sampler.watch([home])
    return sampler.sample()


def a_sample(t: float, *, cpu: float = 37.0, gpus: int = 0, util: float = 87.0) -> Sample:
    """A sample as a machine with `gpus` GPUs would give it (the readings the sampler fills from NVML)."""
    sample = Sample(
        t=t, cpu=cpu, cores=[cpu, cpu], load=[1.5, 1.0, 0.5], mem_used=12 * GiB, mem_total=31 * GiB
    )
    sample.swap_used, sample.swap_total, sample.net_recv, sample.net_sent = 0.0, 0.0, 1000.0, 2000.0
    sample.disks = [DiskReading("/", 500 * GiB, 412 * GiB, ["/home/carl"])]
    sample.gpus = [
        GpuReading(
            index=i,
            name="NVIDIA H100 80GB HBM3",
            util=util,
            mem_used=71 * GiB,
            mem_total=80 * GiB,
            power_w=312.0,
            power_limit_w=700.0,
            temp_c=71.0,
        )
        for i in range(gpus)
    ]
    return sample


def store_samples(store: Store, node: int, samples: list[Sample]) -> None:
    for sample in samples:
        store.system.add_sample(node, sample.t, sample.scalars(), sample.to_json())


def plain(border: object) -> str:
    """A border title or subtitle as its text (Textual gives it back as markup)."""
    return Content.from_markup(str(border)).plain


def pane(app: ControlRoom) -> SystemPane:
    return app.query_one(SystemPane)


def rendered_text(widget: SystemPane | TimeChart) -> str:
    return "\n".join(widget.render_line(y).text for y in range(widget.size.height))


@pytest.mark.parametrize("size", SIZES)
async def test_the_pane_shows_cpu_ram_disk_and_that_there_is_no_gpu(
    home: Path, size: tuple[int, int]
) -> None:
    sample = machine_sample(home)
    with Store(home / "carl.db") as store:
        a_run(store)
        node = store.system.node("this-box", host="this-box", via="local")
        store_samples(store, node, [sample])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: "cpu" in pane(app).text())
        text = pane(app).text()
        assert "ram" in text and "disk" in text and "free" in text
        used, total = sample.mem_used, sample.mem_total
        assert total and used is not None and "/" in text.split("ram", 1)[1].splitlines()[0]
        if not sample.gpus:  # a GPU machine shows its GPUs instead (test_the_pane_shows_each_gpu)
            [note] = [line for line in text.splitlines() if line.startswith("no NVIDIA GPU")]
            # One line: the whole note where it fits, else what it is before its reason.
            assert note == sample.notes[0] or (
                note == "no NVIDIA GPU" and len(sample.notes[0]) > pane(app).size.width
            )
            assert "Traceback" not in rendered_text(pane(app))
            await pilot.press("5")  # maximized: the whole note
            await until(pilot, lambda: sample.notes[0] in pane(app).text().splitlines())
            await pilot.press("5")
            await until(pilot, lambda: not pane(app).wide)
        assert "this-box" in plain(pane(app).border_title)
        # What the terminal shows: the lines at the pane's width, the note cut to it.
        shown = rendered_text(pane(app))
        assert "cpu" in shown and "ram" in shown and "disk" in shown


@pytest.mark.parametrize("size", SIZES)
async def test_the_pane_shows_each_gpu_and_maximized_every_reading(home: Path, size: tuple[int, int]) -> None:
    with Store(home / "carl.db") as store:
        a_run(store, perf=True)
        node = store.system.node("gpu-box", host="gpu-box", via="local")
        store_samples(store, node, [a_sample(time.time() - 2, gpus=2), a_sample(time.time(), gpus=2)])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: "gpu1" in pane(app).text())
        text = pane(app).text()
        gpu0 = next(line for line in text.splitlines() if line.startswith("gpu0"))
        assert "87%" in gpu0 and "71°C" in gpu0
        assert "71/80G" in text  # memory used / total
        assert "no NVIDIA GPU" not in text
        assert "2.3k tok/s" in text  # the run's throughput (perf/tokens_per_s)
        await pilot.press("5")
        await until(pilot, lambda: pane(app).wide and pane(app).size.height > 10)
        gpu0 = next(line for line in pane(app).text().splitlines() if line.startswith("gpu0"))
        assert "87%" in gpu0 and "71/80G" in gpu0 and "312/700W" in gpu0 and "71°C" in gpu0
        assert "█" in gpu0  # both bars on one line
        assert "MFU 41%" in pane(app).text()
        assert not app.query_one("#main").display or app.query_one("#main").region.width == 0
        await pilot.press("5")
        await until(pilot, lambda: not pane(app).wide)
        assert app.query_one("#main").region.width > 0


async def test_eight_gpus_fold_to_fit_a_small_screen_and_unfold_on_a_larger_one(home: Path) -> None:
    with Store(home / "carl.db") as store:
        a_run(store)
        node = store.system.node("dgx", host="dgx", via="local")
        store_samples(store, node, [a_sample(time.time() - 2, gpus=8), a_sample(time.time(), gpus=8)])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "cpu" in pane(app).text())
        lines = pane(app).text().splitlines()
        assert len(lines) <= pane(app).max_lines == 9
        assert lines[0].startswith("gpu×8") and "avg 87%" in lines[0] and "max 89%" in lines[1]
        assert [line[:4] for line in lines[2:5]] == ["cpu ", "ram ", "disk"]
        await pilot.resize_terminal(160, 50)
        await until(pilot, lambda: "gpu7" in pane(app).text())
        lines = pane(app).text().splitlines()
        assert pane(app).max_lines == 22 and len(lines) == 8 * 2 + 3  # a GPU in two lines, then cpu ram disk


async def test_a_lost_node_and_a_quiet_one_say_so_in_one_line(home: Path) -> None:
    now = time.time()
    with Store(home / "carl.db") as store:
        a_run(store)
        box = store.system.node("box-a", host="box-a", via="local")
        store_samples(store, box, [a_sample(now - 600), a_sample(now - 598)])  # the engine stopped sampling
        remote = store.system.node("box-b", host="box-b", via="nats")
        store_samples(store, remote, [a_sample(now, gpus=1)])
        store.system.set_node_state(remote, "lost", "no sample for 30 s")
        live = store.system.node("box-c", host="box-c", via="nats")
        store_samples(store, live, [a_sample(now - 2), a_sample(now)])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "box-c" in pane(app).text() and app.engine.state == "down")
        await until(pilot, lambda: "engine down" in pane(app).text())
        lines = pane(app).text().splitlines()
        assert lines[0].startswith("◌ box-a no sample since") and lines[0].endswith("engine down")
        assert lines[1].startswith("✕ box-b lost at") and lines[1].endswith(": no sample for 30 s")
        assert lines[2].startswith("● box-c") and "cpu 37%" in lines[2]
        assert len(lines) == 3, "a node is one line in a small pane"
        assert "3 nodes" in plain(pane(app).border_title)
        await pilot.press("5")  # maximized: a block per node; the lost one is still one line
        await until(pilot, lambda: pane(app).wide)
        lines = pane(app).text().splitlines()
        assert sum(1 for line in lines if "box-b" in line) == 1
        assert any(line.startswith("cpu") for line in lines) and any(
            line.startswith("● box-c") for line in lines
        )


async def test_only_the_lines_that_changed_are_redrawn(home: Path) -> None:
    now = time.time()
    with Store(home / "carl.db") as store:
        a_run(store)
        node = store.system.node("box", host="box", via="local")
        store_samples(store, node, [a_sample(now - 2, gpus=1), a_sample(now, gpus=1)])
        app = ControlRoom(home, start_engine=False)
        async with app.run_test(size=(80, 24)) as pilot:
            widget = pane(app)
            await until(pilot, lambda: "gpu0" in widget.text())
            await pilot.pause(0.3)
            before = widget.text().splitlines()
            widget.rendered.clear()
            # The next sample: only the CPU moved (the GPU, memory and disk read the same).
            store_samples(store, node, [a_sample(now + 2, gpus=1, cpu=90.0)])
            await until(pilot, lambda: "90%" in widget.text())
            await pilot.pause(0.3)
            after = widget.text().splitlines()
            cpu = next(y for y, line in enumerate(after) if line.startswith("cpu"))
            assert [y for y, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [cpu]
            assert widget.refreshed == [cpu]
            assert set(widget.rendered) == {cpu}, "Textual asked the pane for the changed line only"
            # A sample that changes nothing shown redraws nothing.
            widget.rendered.clear()
            store_samples(store, node, [a_sample(now + 4, gpus=1, cpu=90.0)])
            await until(
                pilot, lambda: app.main.box is not None and max(app.main.box.samples[node]["t"], 0) == now + 4
            )
            await pilot.pause(0.3)
            assert widget.refreshed == [] and not widget.rendered


async def test_names_from_a_node_are_text(home: Path) -> None:
    now = time.time()
    with Store(home / "carl.db") as store:
        a_run(store)
        node = store.system.node(HOSTILE, host=HOSTILE, via="nats")
        sample = a_sample(now, gpus=1)
        sample.gpus[0].name = "[red]gpu[/red]\x1b]0;owned\x07"
        sample.notes = ["[b]note\x1b[31m"]
        store_samples(store, node, [sample])
        other = store.system.node("plain", host="plain", via="local")
        store_samples(store, other, [a_sample(now)])
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: "plain" in pane(app).text())
        assert "x[/bold]y\\x1b[2J" in pane(app).text()
        await pilot.press("5")
        await until(pilot, lambda: pane(app).wide and "note" in pane(app).text())
        text = pane(app).text()
        assert "[b]note\\x1b[31m" in text and "[red]gpu[/red]\\x1b]0;owned\\x07" in text
        assert "\x1b" not in rendered_text(pane(app))
        await pilot.press("5", "S")
        await until(pilot, lambda: isinstance(app.screen, SystemScreen) and len(app.screen.sections) == 2)
        heading = app.screen.query_one(f"#system-node-{node}").render()
        assert "x[/bold]y\\x1b[2J" in str(heading)
        await pilot.press("n", "n", "N")  # from node to node
        assert isinstance(app.screen, SystemScreen)


async def test_the_system_screen_draws_the_box_over_time_aligned_with_the_run(home: Path) -> None:
    now = time.time()
    with Store(home / "carl.db") as store:
        run_id = a_run(store, steps=300, start=now - 600)  # a step every 2 s over the last 10 minutes
        node = store.system.node("box", host="box", via="local")
        # GPU utilisation fell from 90% to 5% at the step written 200 s ago: step 200.
        store_samples(
            store,
            node,
            [
                a_sample(t, gpus=1, util=90.0 if t < now - 200 else 5.0)
                for t in range(int(now) - 600, int(now) + 1, 2)
            ],
        )
        rank = ProcessRow(
            pid=4242, started=now - 500, role="rank", state="running", rank=1, cpu=95.0, rss=3 * GiB
        )
        runner = ProcessRow(pid=4241, started=now - 500, role="runner", state="running", cpu=5.0, rss=GiB)
        store.system.note_processes(run_id, node, [runner, rank])
        [row] = [p for p in store.system.open_processes(node) if p["pid"] == 4242]
        store.system.process_ended(
            row["id"],
            exit_code=None,
            signal=9,
            end_step=250,
            reason="rank 1 (pid 4242) killed by SIGKILL at step 250",
        )
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(160, 50)) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run_id)
        await pilot.press("S")
        await until(pilot, lambda: isinstance(app.screen, SystemScreen) and app.screen.news is not None)
        screen = app.screen
        assert isinstance(screen, SystemScreen)
        header = str(screen.query_one("#system-header").render())
        assert "last 15 min" in header and "run grpo" in header and "1 node" in header
        kinds = {kind for (_, kind) in screen.charts}
        assert {"cpu", "mem", "disk", "net", "gpu-util", "gpu-mem_used", "gpu-power_w", "gpu-temp_c"} <= kinds
        util = screen.charts[(node, "gpu-util")]
        await until(pilot, lambda: any("\u2801" <= c <= "\u28ff" for c in rendered_text(util)))
        # The step row under the clock names the run's steps at the clock's labels.
        step_row = rendered_text(util).splitlines()[-1]
        assert step_row.strip().startswith("st") and any(ch.isdigit() for ch in step_row)
        # The cursor: at the newest sample, then back to where the utilisation fell.
        await pilot.press("left")
        await until(pilot, lambda: "cursor" in str(screen.query_one("#system-header").render()))
        assert "step 299" in str(screen.query_one("#system-header").render())
        for _ in range(CURSOR_BACK_TO_DROP):
            await pilot.press("left")
        # 195 s before the newest sample: just after the drop (step 202); a move further (210 s): before it.
        after = cursor_step(screen)
        assert 200 <= after <= 203 and plain(util.border_subtitle).split("━")[1].strip() == "5%"
        await pilot.press("left")
        before = cursor_step(screen)
        assert 193 <= before < 200 and plain(util.border_subtitle).split("━")[1].strip() == "90%"
        # The run's processes, the live one first, the killed rank with how it ended.
        table = screen.query_one("#system-processes")
        assert table.row_count == 2
        cells = [str(c) for c in table.get_row_at(1)]
        assert cells[0] == "4242" and cells[1] == "rank 1" and "SIGKILL at step 250" in cells[7]
        assert [str(c) for c in table.get_row_at(0)][:2] == ["4241", "runner"]
        # A longer window: the feed reads it again, from the minute rollups when raw samples are too many.
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: screen.news is not None and screen.news.window == 3600)
        assert "last 1 h" in str(screen.query_one("#system-header").render())
        await pilot.press("right_square_bracket", "right_square_bracket")
        await until(pilot, lambda: screen.news is not None and screen.news.window == 86400)
        await pilot.press("escape")  # the cursor was cleared by the new window: esc closes
        await until(pilot, lambda: not isinstance(app.screen, SystemScreen))


def cursor_step(screen: SystemScreen) -> int:
    """The run's step at the cursor, as the header says it."""
    header = str(screen.query_one("#system-header").render())
    return int(header.split(" step ", 1)[1].split()[0].replace(",", ""))


CURSOR_BACK_TO_DROP = 13  # a cursor move is a 60th of the 15-minute window: 13 of them, 195 s


@pytest.mark.parametrize("size", SIZES)
async def test_the_system_screen_at_both_sizes_without_samples_or_processes(
    home: Path, size: tuple[int, int]
) -> None:
    with Store(home / "carl.db") as store:
        a_run(store)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        assert "nothing sampled" in " ".join(pane(app).text().split())
        await pilot.press("S")
        await until(pilot, lambda: isinstance(app.screen, SystemScreen) and app.screen.news is not None)
        screen = app.screen
        assert screen.query_one("#system-empty").display
        assert screen.query_one("#system-no-processes").display
        await pilot.press("q")
        await until(pilot, lambda: not isinstance(app.screen, SystemScreen))


async def test_sampling_turned_off_in_engine_toml_is_said_in_the_pane(home: Path) -> None:
    """The engine's system job marks the machine stopped while `[system] enabled = false`, and live again."""
    with Store(home / "carl.db") as store:
        a_run(store)
        job = SystemJob(store, home)
        job.tick()  # sampling, as by default
        (home / "engine.toml").write_text("[system]\nenabled = false\n")
        job.config.look_now()  # the job looks at engine.toml every 2 s: now
        job.tick()
        [node] = store.system.nodes()
        assert (node["state"], node["note"]) == ("stopped", SAMPLING_OFF)
        app = ControlRoom(home, start_engine=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "sampling is off" in " ".join(pane(app).text().split()))
            assert " ".join(pane(app).text().split()).startswith(
                "○ stopped: sampling is off ([system] enabled"
            )
            (home / "engine.toml").write_text("[system]\nenabled = true\n")
            job.config.look_now()
            job.tick()
            await until(pilot, lambda: pane(app).text().startswith("cpu") or "cpu" in pane(app).text())
            assert "sampling is off" not in pane(app).text()
        job.close()
        assert store.system.nodes()[0]["state"] == "live"


def test_the_watcher_reads_the_box_only_when_it_moved(home: Path) -> None:
    with Store(home / "carl.db") as store:
        run_id = a_run(store)
        watcher = StoreWatcher(home / "carl.db")
        first = watcher.poll()
        assert first is not None and first.box is not None and first.box.nodes == []
        node = store.system.node("box", host="box", via="local")
        now = time.time()
        store_samples(store, node, [a_sample(now - 2), a_sample(now)])
        snap = watcher.poll()
        assert snap is not None and snap.box is not None
        assert [n["name"] for n in snap.box.nodes] == ["box"] and snap.box.intervals[node] == pytest.approx(
            2.0
        )
        assert snap.box.samples[node]["cpu"] == 37.0
        store.add_metrics(run_id, [(999, "loss", 0.1, time.time())])  # the store moved, the box did not
        snap = watcher.poll()
        assert snap is not None and snap.box is None
        assert watcher.poll() is None  # nothing moved
        store.system.note_processes(
            run_id, node, [ProcessRow(pid=1, started=1.0, role="runner", state="running")]
        )
        snap = watcher.poll()
        assert snap is not None and snap.box is not None and [p["pid"] for p in snap.box.processes] == [1]
        watcher.reader.close()  # type: ignore[union-attr]


def test_the_run_steps_by_wall_time_are_bounded(store: Store) -> None:
    run_id = store.create_run("long", source_kind="jsonl")
    t0 = 1_700_000_000.0
    store.add_metrics(run_id, [(s, "loss", 1.0, t0 + 2 * s) for s in range(100_000)])
    reader = StoreReader(store.path)
    try:
        few = reader.system.run_steps(run_id, t0 + 100, t0 + 120)
        assert few == [(s, t0 + 2 * s) for s in range(50, 61)]
        spread = reader.system.run_steps(run_id, t0, t0 + 200_000, max_points=100)
        assert len(spread) == 100 and spread[0] == (0, t0) and spread[-1] == (99_999, t0 + 199_998)
        assert all(b[0] > a[0] for a, b in zip(spread, spread[1:], strict=False))
        assert reader.system.run_steps(run_id, t0 - 100, t0 - 1) == []
        assert reader.system.run_steps(run_id + 1, t0, t0 + 10) == []
    finally:
        reader.close()


def test_the_feed_reads_again_only_when_the_box_moved_or_the_window_changed(home: Path) -> None:
    with Store(home / "carl.db") as store:
        node = store.system.node("box", host="box", via="local")
        store_samples(store, node, [a_sample(time.time())])
        feed = SystemFeed(home / "carl.db", None)
        news = feed.poll()
        assert news is not None and news.window == 900 and [n.node["name"] for n in news.nodes] == ["box"]
        assert feed.poll() is None and feed.reads == 1
        store.create_run("other", source_kind="jsonl")  # the store moved, the box did not
        assert feed.poll() is None and feed.reads == 1
        feed.set_window(3600)
        news = feed.poll()
        assert news is not None and news.window == 3600 and feed.reads == 2
        store_samples(store, node, [a_sample(time.time() + 2)])
        assert feed.poll() is not None and feed.reads == 3
        feed.close()
