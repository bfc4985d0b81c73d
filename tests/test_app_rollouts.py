"""The rollouts viewer (`R`) driven by Pilot at 80×24 and 160×50 on a real store: a TensorBoard run observed
with its TRL completions parquet attached, a GRPO run of ours whose samples carry per-token entropies (the
rows our trainers write, built by engine/training/step_rollouts.py), and runs read from veRL, prime-rl and
verifiers dumps. List, sort, filter, step navigation, live steps, the group and sample views, the token
colours with their forking marks, the step's entropy histogram and the band over steps."""

from __future__ import annotations

import dataclasses
import html
import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.style import Style
from rich.table import Table
from rich.text import Text
from support import until
from test_observe_rollouts import (
    episode,
    prime_log_episodes,
    trl_step,
    verl_step,
    vf_output,
    vf_save_outputs,
)
from textual.widgets import Static

from carl_tui.app import ControlRoom
from carl_tui.rollouts_detail import RolloutGroupScreen, RolloutSampleScreen, token_styles
from carl_tui.rollouts_model import RolloutsReader
from carl_tui.rollouts_view import RolloutsScreen
from engine.observe.discover import discover, register
from engine.observe.ingest import import_source, register_source
from engine.store import Store
from engine.store.rollout_reads import RolloutRow, percentiles
from engine.training.step_rollouts import TokenTexts, step_rollouts
from widgets.chart import Chart
from widgets.histogram import Histogram
from widgets.long_text import LongText
from widgets.token_text import OPD_ADVANTAGE, level

SIZES = [(80, 24), (160, 50)]
VOCAB = 512
TOKENS = ['{"', "tool", '": "', "get_weather", '", "city": "', "Paris", '"}']  # 7 tokens: the top 20% is 2
HOSTILE = "[link=https://x.invalid]click[/link] \x1b[31mred\x1b[0m"


def entropies(sample: int, step: int) -> list[float]:
    """Per-token entropies of a sample: the two highest on tokens that move with the sample."""
    values = [0.05, 0.2, 0.7, 2.0, 0.08, 0.3, 4.0]
    shift = (sample + step) % len(values)
    return [v * (1.2 - step / 20) for v in values[shift:] + values[:shift]]  # entropy falls as training goes


def our_step(step: int, group: int = 4, prompts: int = 2) -> list[dict[str, Any]]:
    """One GRPO step's rows exactly as our trainers build them (engine/training/rollouts.step_rollouts)."""
    n = group * prompts
    vocab = {i: t for i, t in enumerate(TOKENS)}
    texts = TokenTexts(lambda ids: "".join(vocab[i] for i in ids))
    # the first group's prompt is hostile: markup and an escape sequence, shown as text
    prompts_text = [
        f"{HOSTILE} step {step}" if i < group else f"Weather in city {i // group}?" for i in range(n)
    ]
    rewards = np.array([[float(i % 2), 1.0] for i in range(n)])
    totals = rewards.sum(axis=1) + np.arange(n) * 0.01
    advantages = np.array([(-1.0) ** i * (0.5 + i / 10) for i in range(n)])
    rows = step_rollouts(
        prompts=prompts_text,
        completions=["".join(TOKENS)] * n,
        token_ids=[list(range(len(TOKENS)))] * n,
        token_texts=texts,
        names=["task", "format"],
        rewards=rewards,
        totals=totals,
        advantages=advantages,
        entropies=[np.array(entropies(i, step)) for i in range(n)],
        logprobs=[np.array([-0.1] * len(TOKENS)) for _ in range(n)],
        group=group,
        cap=64,
    )
    return [dict(row, step=step) for row in rows]


def our_run(store: Store, steps: int = 5, name: str = "grpo-ours") -> int:
    run_id = store.create_run(name, source_kind="carl", status="running", max_steps=10, vocab_size=VOCAB)
    store.add_metrics(run_id, [(s, "reward", 1.0 + s / 10, time.time()) for s in range(1, steps + 1)])
    for step in range(1, steps + 1):
        store.add_rollouts(run_id, our_step(step))
    return run_id


def tensorboard_trl_run(store: Store, root: Path) -> int:
    """A TRL output dir: TensorBoard scalars (torch's SummaryWriter) and the completions parquet; observed as
    one run, its rollouts attached."""
    from torch.utils.tensorboard import SummaryWriter

    out = root / "grpo-out"
    writer = SummaryWriter(str(out / "runs" / "Nov27_01-16-09_box"))
    for step in (1, 2, 3):
        writer.add_scalar("train/reward", 0.5 + step / 10, step)
        writer.add_scalar("train/entropy", 2.0 - step / 10, step)
        writer.add_scalar("train/kl", 0.01 * step, step)
        trl_step(out, step)
    writer.close()
    [registered] = register(store, discover(out), follow=False)
    run_ids = set()
    for source_id, _ in registered.sources:
        run_ids |= set(import_source(store, source_id).run_ids)
    [run_id] = run_ids
    return run_id


def dumps_runs(store: Store, root: Path) -> dict[str, int]:
    """A run each from a veRL dump folder, prime-rl's traces and verifiers' results."""
    verl = root / "verl" / "rollout_data"
    verl_step(verl, 1)
    verl_step(verl, 2)
    prime = root / "prime-run"
    prime_log_episodes(
        prime, 1, "train", "effective", [episode(1, "g1", "4", 1.0, 0.5), episode(1, "g1", "5", 0.0, -0.5)]
    )
    results = root / "vf" / "outputs"
    vf_save_outputs(results, [vf_output(i, "4" if i % 2 else "5", float(i % 2)) for i in range(4)])
    out = {}
    for name, path, kind in (
        ("verl", verl, "rollouts-verl"),
        ("prime", prime, "rollouts-prime"),
        ("verifiers", results / "results.jsonl", "rollouts-verifiers"),
    ):
        source_id = register_source(store, path, follow=False, kind=kind)
        [out[name]] = import_source(store, source_id).run_ids
    return out


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


@pytest.fixture
def stores(home: Path, tmp_path: Path) -> dict[str, int]:
    """The store every viewer test opens: our run (selected first: the newest), the TensorBoard + TRL run and
    the runs of the three dumps."""
    with Store(home / "carl.db") as store:
        runs = {"trl": tensorboard_trl_run(store, tmp_path / "sources")}
        runs |= dumps_runs(store, tmp_path / "sources")
        runs["ours"] = our_run(store)
    return runs


def viewer(app: ControlRoom) -> RolloutsScreen:
    assert isinstance(app.screen, RolloutsScreen), app.screen
    return app.screen


def status(app: ControlRoom) -> str:
    return str(viewer(app).query_one("#rollouts-status", Static).content)


def rows(app: ControlRoom) -> list[RolloutRow]:
    """Every row the list holds, in its order (the tests' lists fit in a page)."""
    widget = viewer(app).list
    return [r for i in range(widget.known_rows) if (r := widget.row(i)) is not None]


async def open_viewer(pilot: Any, run_id: int) -> RolloutsScreen:
    app = pilot.app
    await until(pilot, lambda: app.main.view is not None)
    if app.main.view.run.id != run_id:
        app.main.select(run_id)
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == run_id)
    await pilot.press("R")
    await until(pilot, lambda: isinstance(app.screen, RolloutsScreen))
    screen = viewer(app)
    await until(pilot, lambda: screen.list.total is not None and len(rows(app)) == screen.list.total)
    return screen


async def settle(pilot: Any) -> None:
    """Until the list holds every row of its current query."""
    app = pilot.app
    await until(
        pilot, lambda: viewer(app).list.total is not None and len(rows(app)) == viewer(app).list.total
    )


@pytest.mark.parametrize("size", SIZES)
async def test_list_sort_filter_and_steps_on_our_run(home: Path, stores: dict[str, int], size: tuple) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        screen = await open_viewer(pilot, stores["ours"])
        assert "step 5 (5 of 5)" in status(app) and "following the newest" in status(app)
        assert [r.idx for r in rows(app)] == list(range(8)) and {r.step for r in rows(app)} == {5}
        first = screen.list.render_line(0)
        assert "[link=https://x." in first.text  # text, not markup
        assert all(segment.style is None or not segment.style.link for segment in first)
        if size[0] > 100:
            assert "click[/link] \\x1b[31mred" in first.text  # the escape made visible

        await pilot.press("s")  # by reward, the best first
        await settle(pilot)
        totals = [r.total for r in rows(app)]
        assert totals == sorted(totals, reverse=True) and "sort reward ↓" in status(app)
        await pilot.press("S")
        await settle(pilot)
        assert [r.total for r in rows(app)] == sorted(totals)
        await pilot.press("s", "s")  # advantage, length
        await settle(pilot)
        assert "sort length ↓" in status(app)
        await pilot.press("s")  # back to the source's order
        await settle(pilot)
        assert [r.idx for r in rows(app)] == list(range(8))

        await pilot.press("slash")
        await pilot.press(*"adv>0")
        await until(pilot, lambda: "filter adv>0" in status(app))
        await settle(pilot)
        assert [r.idx for r in rows(app)] == [0, 2, 4, 6] and "filter adv>0" in status(app)
        await pilot.press("space", *'"city 1"', "enter")  # a comparison and a phrase: both hold
        await until(pilot, lambda: 'filter adv>0 "city 1"' in status(app))
        await settle(pilot)
        assert [r.idx for r in rows(app)] == [4, 6]
        assert screen.list.has_focus
        # As it is typed the filter applies whenever it can be read; `enter` on one that cannot says why.
        await pilot.press("slash", "ctrl+u", *"task<", "enter")
        await until(
            pilot, lambda: any("a comparison is name<number" in n.message for n in app._notifications)
        )
        assert viewer(app).query_one("#rollouts-filter").display
        await pilot.press("escape")  # esc in the filter clears it
        await until(pilot, lambda: "filter" not in status(app))
        await settle(pilot)
        assert len(rows(app)) == 8 and "filter" not in status(app)

        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert "step 4 (4 of 5)" in status(app) and "following" not in status(app)
        await pilot.press("home")
        await settle(pilot)
        assert {r.step for r in rows(app)} == {1}
        await pilot.press("right")
        await settle(pilot)
        assert {r.step for r in rows(app)} == {2}
        await pilot.press("end")
        await settle(pilot)
        assert "step 5 (5 of 5) · following the newest" in status(app)

        # Live: a new step is followed while on the newest; once moved off it, the view stays.
        with Store(home / "carl.db") as store:
            store.add_rollouts(stores["ours"], our_step(6))
        await until(pilot, lambda: "step 6 (6 of 6)" in status(app))
        await settle(pilot)
        assert {r.step for r in rows(app)} == {6}
        await pilot.press("left")
        await until(pilot, lambda: "step 5 (5 of 6)" in status(app))
        with Store(home / "carl.db") as store:
            store.add_rollouts(stores["ours"], our_step(7))
        await until(pilot, lambda: "(5 of 7)" in status(app))
        await settle(pilot)
        assert {r.step for r in rows(app)} == {5}

        await pilot.press("a")  # every step at once
        await settle(pilot)
        assert screen.list.total == 7 * 8 and "every step (7)" in status(app)
        assert "step" in str(screen.query_one("#rollouts-header", Static).content)
        await pilot.press("s")
        await settle(pilot)
        best = max(r.total for r in rows(app))
        assert rows(app)[0].total == best
        await pilot.press("end")
        await until(pilot, lambda: screen.list.cursor == 7 * 8 - 1)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, RolloutsScreen))
        await pilot.press("q")


def styled(text: Text) -> list[tuple[str, Style]]:
    """Each token of a drawn completion with its style."""
    return [(text.plain[span.start : span.end], Style.parse(str(span.style))) for span in text.spans]


@pytest.mark.parametrize("size", SIZES)
async def test_group_sample_token_colours_histogram_and_band(
    home: Path, stores: dict[str, int], size: tuple
) -> None:
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        screen = await open_viewer(pilot, stores["ours"])
        entropy_panel = screen.query_one("#rollouts-entropy")
        if size[1] < 36:  # a short screen shows the panel when asked
            assert not entropy_panel.display
            await pilot.press("h")
        await until(pilot, lambda: entropy_panel.display)
        # The step's histogram: its 8 samples' 56 tokens, over 0..ln|V|.
        histogram = screen.query_one(Histogram)
        await until(pilot, lambda: sum(histogram.counts) == 56)
        assert histogram.edges[0] == 0 and histogram.edges[-1] == pytest.approx(math.log(VOCAB))
        step_values = [v for i in range(8) for v in entropies(i, 5)]
        top = math.log(VOCAB) / len(histogram.counts)
        assert histogram.counts[0] == sum(1 for v in step_values if v < top * 0.999)
        assert "step 5" in str(histogram.border_title) and "56 tokens of 8 samples" in str(
            histogram.border_title
        )
        drawn = "\n".join(line.plain for line in histogram.lines(histogram.size.width, histogram.size.height))
        assert "█" in drawn and "nats" in drawn
        # The band: p10, p50 and p90 of each step's token entropy, steps 1..5.
        band = screen.query_one(Chart)
        await until(pilot, lambda: band.lines and band.lines[0] is not None and len(band.lines[0]) == 5)
        p50 = list(band.lines[0].mean)
        for step, value in zip(range(1, 6), p50, strict=True):
            want = percentiles([v for i in range(8) for v in entropies(i, step)], (50,))[0]
            assert value == pytest.approx(want, rel=1e-3)
        assert p50 == sorted(p50, reverse=True)  # entropy falls over the run, as the fixture has it
        assert band.build_count >= 1 and "⣿" in "".join(
            band.render_line(y).text for y in range(band.size.height)
        )
        await pilot.press("left")  # the histogram follows the step
        await until(pilot, lambda: "step 4" in str(histogram.border_title))

        # enter: the sample, its token colours and forking marks.
        await pilot.press("right")
        await settle(pilot)
        await pilot.press("down", "enter")  # sample #1
        await until(pilot, lambda: isinstance(app.screen, RolloutSampleScreen))
        sample = app.screen
        summary = sample.query_one("#sample-summary", Static)
        await pilot.pause()
        prompt = sample.query_one("#sample-prompt", LongText)
        assert prompt.plain.startswith("[link=https://x.invalid]click[/link] \\x1b[31mred\\x1b[0m")
        completion = sample.query_one("#sample-completion", LongText)
        assert completion.plain == "".join(TOKENS)
        tokens = [(text, style or Style()) for text, style in completion.pieces]
        assert [t for t, _ in tokens] == TOKENS
        values = entropies(1, 5)
        forks = {TOKENS[i] for i in sorted(range(7), key=lambda i: -values[i])[:2]}
        assert {t for t, style in tokens if style.underline} == forks  # the top 20%: 2 of 7 tokens
        colours = {t: style.color for t, style in tokens}
        scale = [style.color for style in token_styles(app)]
        for token, value in zip(TOKENS, values, strict=True):
            assert colours[token] == scale[level(value)], token
        assert len(set(colours.values())) >= 3
        legend = sample.query_one("#sample-legend", Static).content.plain
        assert "nats" in legend and "Φ" in legend and "underlined: forking tokens, the top 20%" in legend
        table = summary.content
        assert isinstance(table, Table)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen))

        # g: the group of the highlighted sample, side by side.
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, RolloutGroupScreen))
        group = app.screen
        assert [s["idx"] for s in group.samples] == [0, 1, 2, 3] and group.column == 1
        assert "Group 0 · step 5 · 4 completions" in str(group.query_one("#rollout-group").border_title)
        columns = group.query(".group-column")
        assert len(columns) == 4
        visible = [c for c in columns if group.query_one("#group-columns").region.contains_region(c.region)]
        assert len(visible) == (2 if size[0] < 100 else 4)  # as many as fit
        await pilot.press("right", "right")
        assert group.column == 3 and group.focused is columns[3]
        scroller = group.query_one("#group-columns")
        if size[0] < 100:
            assert scroller.scroll_x > 0  # scrolled sideways to it
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RolloutSampleScreen))
        assert app.screen.sample["idx"] == 3
        await pilot.press("escape", "escape")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen))


@pytest.mark.parametrize("size", SIZES)
async def test_every_source_of_the_rollouts_table(home: Path, stores: dict[str, int], size: tuple) -> None:
    """The TensorBoard run with TRL's completions, and the veRL, prime-rl and verifiers runs: listed, sorted,
    grouped and opened alike; they have no per-token values, and the viewer says so."""
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        want = {  # run: (newest step, its samples, the first sample's prompt and completion)
            "trl": (3, 4, "question 3.0", "answer 3.0"),
            "verl": (2, 4, "<|user|>2+0=?", "ok 2.0 é"),
            "prime": (1, 2, "system: be brief\nuser: 2+2?", "4"),
            "verifiers": (0, 4, "user: question 0", "5"),
        }
        for name, (step, count, prompt, completion) in want.items():
            screen = await open_viewer(pilot, stores[name])
            assert f"step {step} " in status(app), name
            listed = rows(app)
            assert len(listed) == count and listed[0].prompt == prompt and listed[0].completion == completion
            assert not screen.query_one("#rollouts-entropy").display  # no per-token values: no panel
            await pilot.press("s")  # by reward
            await settle(pilot)
            totals = [r.total for r in rows(app)]
            assert totals == sorted(totals, reverse=True), name
            await pilot.press("s")
            await settle(pilot)
            advantages = [r.advantage for r in rows(app)]
            having = [a for a in advantages if a is not None]
            assert having == sorted(having, reverse=True) and advantages[: len(having)] == having, name
            await pilot.press("home")  # the source's order again, from the first step
            await settle(pilot)
            await pilot.press("g")
            await until(pilot, lambda: isinstance(app.screen, RolloutGroupScreen))
            group = app.screen.samples
            assert group and len({s["group_id"] for s in group}) == 1 and len({s["step"] for s in group}) == 1
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, RolloutSampleScreen))
            sample = app.screen
            assert sample.query_one("#sample-completion", LongText).plain == sample.sample["completion"]
            assert "carl's own runs" in sample.query_one("#sample-legend", Static).content.plain
            await pilot.press("escape", "escape", "escape")
            await until(pilot, lambda: not isinstance(app.screen, RolloutsScreen | RolloutGroupScreen))
        # The TRL run's groups are its prompts' generations: two a prompt.
        await open_viewer(pilot, stores["trl"])
        await pilot.press("g")
        await until(pilot, lambda: isinstance(app.screen, RolloutGroupScreen))
        assert [s["completion"] for s in app.screen.samples] == ["answer 3.0", "answer 3.1"]
        assert [s["advantage"] for s in app.screen.samples] == [1.0, -1.0]


async def test_a_run_without_rollouts_says_how_they_get_there(home: Path) -> None:
    with Store(home / "carl.db") as store:
        store.create_run("no-rollouts", source_kind="jsonl", status="imported")
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, RolloutsScreen))
        await until(pilot, lambda: viewer(app).query_one("#rollouts-empty").display)
        assert "no rollouts" in status(app)
        await pilot.press("g", "enter", "s", "a", "left", "end")  # nothing to act on: nothing happens
        assert isinstance(app.screen, RolloutsScreen)


async def test_stored_text_stays_text(home: Path) -> None:
    """A run name, a group id, a prompt and a token with markup and escape sequences: drawn as text, the
    control characters made visible, in every title and view of the viewer."""
    hostile = "[link=https://x.invalid]evil[/link] [b]\x1b[31m"
    with Store(home / "carl.db") as store:
        run_id = our_run(store, steps=1)
        with store.transaction():
            store.conn.execute(
                "UPDATE rollouts SET group_id=?, tokens=? WHERE run_id=?", (hostile, "[]", run_id)
            )
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(120, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        run = dataclasses.replace(
            app.main.view.run, name=hostile
        )  # (the run list itself is not under test here)
        await app.push_screen(RolloutsScreen(run, RolloutsReader(home / "carl.db", run_id)))
        await settle(pilot)
        shown = "[link=https://x.invalid]evil[/link] [b]\\x1b[31m"

        def screen_text() -> str:
            return html.unescape(re.sub(r"<[^>]+>", "", app.export_screenshot())).replace("\xa0", " ")

        assert f"Rollouts · {shown}" in screen_text()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RolloutSampleScreen))
        await pilot.pause()
        assert f"Sample · {shown}" in screen_text() and f"group {shown}" in screen_text()
        await pilot.press("escape", "g")
        await until(pilot, lambda: isinstance(app.screen, RolloutGroupScreen))
        await pilot.pause()
        assert f"Group {shown} · step 1" in screen_text()


OPD = [0.0, 0.125, -0.25, 0.875, -0.75, 0.5, 0.03125]  # per token of TOKENS; exact in float16 (and in JSON)
HINT = "Answer with one JSON tool call to get_weather with the city Paris."


def hinted_step(step: int) -> list[dict[str, Any]]:
    """A step's rows as our trainers build them, the even samples hinted as the agents plane's trainer
    keeps them: the hint, the task and the OPD advantage of each token in `extra`."""
    rows = our_step(step)
    for row in rows[::2]:
        row["extra"] = {
            **(row.get("extra") or {}),
            "hint": HINT,
            "task_id": f"task-{row['idx']}",
            "opd_advantage": OPD,
        }
    return rows


@pytest.mark.parametrize("size", SIZES)
async def test_a_hinted_sample_shows_its_hint_and_colours_its_tokens_by_opd_advantage(
    home: Path, size: tuple
) -> None:
    with Store(home / "carl.db") as store:
        run_id = store.create_run("agents-train", source_kind="carl", status="running", vocab_size=VOCAB)
        store.add_metrics(run_id, [(1, "reward", 1.0, time.time())])
        store.add_rollouts(run_id, hinted_step(1))
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await open_viewer(pilot, run_id)
        await pilot.press("enter")  # sample #0: hinted
        await until(pilot, lambda: isinstance(app.screen, RolloutSampleScreen))
        sample = app.screen
        await pilot.pause()
        heading = sample.query_one("#sample-completion-heading", Static)
        legend = sample.query_one("#sample-legend", Static)
        completion = sample.query_one("#sample-completion", LongText)
        assert str(sample.query_one("#sample-hint", Static).content) == HINT
        assert "coloured by token entropy" in str(heading.content) and "Φ" in legend.content.plain
        summary = sample.query_one("#sample-summary", Static).content
        assert isinstance(summary, Table)
        cells = [str(cell) for column in summary.columns for cell in column.cells]
        assert "mean +0.076 · min -0.750 · max +0.875 nats over 7 tokens" in cells  # OPD's row
        assert not any("opd_advantage" in cell or HINT in cell for cell in cells)  # not again in extra
        assert sample.check_action("colour", ()) is True  # two things to colour by: `c` is offered
        by_entropy = list(completion.pieces)
        entropy = [style.color for style in token_styles(app)]
        assert [style.color for _, style in by_entropy if style] == [
            entropy[level(v)] for v in entropies(0, 1)
        ]

        await pilot.press("c")  # the OPD advantage
        await until(pilot, lambda: "coloured by OPD advantage" in str(heading.content))
        assert completion.plain == "".join(TOKENS)
        scale = token_styles(app, OPD_ADVANTAGE)
        assert [(text, style) for text, style in completion.pieces] == [
            (token, scale[OPD_ADVANTAGE.level(value)]) for token, value in zip(TOKENS, OPD, strict=True)
        ]
        assert not any(style and style.underline for _, style in completion.pieces)  # no forking marks here
        assert scale[3] == Style() and len({s.color for s in scale if s.color}) == 6
        assert legend.content.plain == "<-0.5 ██████████████ ≥+0.5 nats · + liked more with the hint"
        await pilot.press("c")  # and back to entropy
        await until(pilot, lambda: "coloured by token entropy" in str(heading.content))
        assert completion.pieces == by_entropy and "Φ" in legend.content.plain
        await pilot.press("escape", "down", "enter")  # sample #1: not hinted, entropy only
        await until(
            pilot, lambda: isinstance(app.screen, RolloutSampleScreen) and app.screen.sample["idx"] == 1
        )
        plain = app.screen
        await pilot.pause()
        assert not plain.query("#sample-hint")
        assert plain.check_action("colour", ()) is False  # entropy only: no `c`
        await pilot.press("c")
        await pilot.pause()
        assert "coloured by token entropy" in str(
            plain.query_one("#sample-completion-heading", Static).content
        )
