"""A text of any length drawn a screen at a time (issue 30 §10: one Static holding a 1 MB completion took 8 s
to open, 100,000 coloured tokens 29 s and 300 MB)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from support import until

from carl_tui.app import ControlRoom
from carl_tui.rollouts_detail import RolloutSampleScreen
from engine.store import Store, StoreReader
from widgets.long_text import LongText, wrap


def shown(pieces: list[tuple[str, None]], width: int) -> list[str]:
    return ["".join(pieces[i][0][a:b] for i, a, b in line) for line in wrap(pieces, width)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from(list("ab  \nxyz数é")), max_size=30), max_size=8),
    st.integers(1, 12),
)
def test_wrapping_keeps_every_character_in_order_and_each_line_within_its_width(
    texts: list[str], width: int
) -> None:
    lines = shown([(t, None) for t in texts], width)
    assert "".join(lines) == "".join(texts).replace("\n", "")
    assert all(cell_len(line) <= max(width, 2) for line in lines)  # a wide character alone may overhang


def test_a_full_line_breaks_after_its_last_space_and_a_newline_starts_a_line() -> None:
    assert shown([("the quick brown fox", None)], 10) == ["the quick ", "brown fox"]
    assert shown([("ab", None), ("cd\nef", None)], 10) == ["abcd", "ef"]
    assert shown([("abcdefghijkl", None)], 5) == ["abcde", "fghij", "kl"]  # a word longer than the line


async def test_a_million_character_completion_opens_and_draws_only_what_is_on_screen(tmp_path: Path) -> None:
    completion = "".join(f"word{i} " for i in range(150_000))[:1_000_000]
    tokens = [f" t{i}" for i in range(100_000)]
    with Store(tmp_path / "carl.db") as store:
        run_id = store.create_run("long", source_kind="carl", vocab_size=512)
        entropy = [(i % 40) / 10 for i in range(100_000)]
        store.add_rollouts(
            run_id,
            [
                {"step": 1, "idx": 0, "prompt": "p", "completion": completion, "total": 1.0},
                {
                    "step": 1,
                    "idx": 1,
                    "prompt": "p",
                    "completion": "".join(tokens),
                    "tokens": tokens,
                    "entropy": entropy,
                    "total": 0.5,
                },
            ],
        )
    reader = StoreReader(tmp_path / "carl.db")
    samples = [reader.rollout(rollout_id) for (rollout_id,) in reader.conn.execute("SELECT id FROM rollouts")]
    reader.close()
    app = ControlRoom(tmp_path, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        for sample in samples:
            assert sample is not None
            await app.push_screen(RolloutSampleScreen(app.main.view.run, sample))
            text = app.screen.query_one("#sample-completion", LongText)
            await until(pilot, lambda text=text: text.line_count > 5_000)
            assert text.plain == sample["completion"]
            await pilot.pause()
            assert (
                0 < text._strip.cache_info().currsize <= 30
            )  # the lines on screen, not the text's thousands
            app.screen.query_one("#rollout-sample").scroll_end(animate=False)
            await pilot.pause()
            last = "".join(seg.text for seg in text.render_line(text.line_count - 1)).rstrip()
            assert sample["completion"].rstrip().endswith(last.split()[-1])
            await pilot.press("escape")
