"""Nothing stored reaches the terminal raw (issue 22 §5): a store whose run names, metric and reward keys,
prompts, completions, tokens, trajectories, agent events, chat messages, command results and source errors
hold ESC/CSI, OSC (a title; OSC 52, the clipboard), C1 CSI, CR, BS, DEL, Rich/Textual markup and a lone
surrogate (tests/hostile_text.py). Every `carl` listing prints their visible escapes only (the raw bytes of
stdout and stderr are checked), and the control room starts on it, shows every pane, screen and notification
without a raw control byte or a rendered link, at 80x24 and 160x50, and exits cleanly."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_text import RAW_CONTROL, SHORT, fill
from support import until
from textual.strip import Strip

from carl_tui.app import ControlRoom
from engine.store import Store
from engine.text import VisibleStream, visible, visible_line

SIZES = [(80, 24), (160, 50)]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


# -- the helper ----------------------------------------------------------------------------------------


def test_visible_writes_out_every_control_character_but_newline_and_tab() -> None:
    """§5: the rule itself. ESC, OSC 52's BEL, C1 CSI, CR, BS and DEL become text; a lone surrogate cannot
    be printed either (U+FFFD); newline and tab stay, except on one line (`visible_line`)."""
    assert (
        visible("a\x1b]52;c;aGk=\x07\x9b2J\r\b\x7f\tb\nc\ud800")
        == "a\\x1b]52;c;aGk=\\x07\\x9b2J\\r\\x08\\x7f\tb\nc\ufffd"
    )
    assert visible_line("k\ny\tz") == "k\\ny\\tz"
    assert visible(None) == "" and visible("[b]x[/b]") == "[b]x[/b]"  # markup is not its business: text is
    out = io.StringIO()
    print("run \x1b[2J\x9b", file=VisibleStream(out))  # type: ignore[arg-type]
    assert out.getvalue() == "run \\x1b[2J\\x9b\n"


def test_visible_writes_out_format_characters_and_long_runs_of_combining_marks() -> None:
    """Issue 30 §9: what moves a border without a control byte becomes text too; ordinary accents, Greek,
    CJK and emoji stay as they are."""
    assert visible("rtl\u202egpj.exe") == "rtl\\u202egpj.exe"  # not "rtlexe.jpg"
    assert visible("\u2066iso\u2069 a\u200bb\ufeff") == "\\u2066iso\\u2069 a\\u200bb\\ufeff"
    assert visible("\U0001f468\u200d\U0001f469") == "\U0001f468\\u200d\U0001f469"
    assert visible("\u2764\ufe0f") == "\u2764\\ufe0f"
    assert visible("Z\u0301\u0302\u0303\u0304") == "Z\u0301\u0302\\u0303\\u0304"  # two marks stay
    assert visible("tag\U000e0041") == "tag\\U000e0041"
    plain = "café Φ — naïve 数据 \U0001f600 e\u0301"
    assert visible(plain) == plain


def test_every_format_character_of_this_python_is_written_out() -> None:
    """The ranges in engine/text.py against the running Python's Unicode database (category Cf)."""
    import unicodedata

    missed = [
        hex(cp)
        for cp in range(0xA0, sys.maxunicode + 1)
        if unicodedata.category(chr(cp)) == "Cf" and visible(chr(cp)) == chr(cp)
    ]
    assert missed == []


# -- the headless commands -------------------------------------------------------------------------------


def carl(home: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`carl ARGS` as a user runs it; its output as the terminal would receive it (bytes)."""
    env = {**os.environ, "CARL_HOME": str(home), "ANTHROPIC_API_KEY": ""}
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args], capture_output=True, env=env, timeout=120
    )


def raw_controls(data: bytes) -> list[str]:
    """The characters a terminal would obey in `data` (it must be UTF-8: a lone surrogate cannot be
    printed)."""
    return RAW_CONTROL.findall(data.decode("utf-8"))


COMMANDS = [
    ("runs",),
    ("runs", "--json"),
    ("experiments",),
    ("experiments", "--json"),
    ("trajectories", "list"),
    ("trajectories", "status"),
    ("agents", "status"),
    ("agents", "events"),
    ("agents", "events", "--rejected"),
    ("diagnose", "2", "--offline"),
    ("diagnose", SHORT),  # an unknown run: the error line quotes it and lists the stored names
    ("eval", SHORT),
    ("report", "2", "-o", "__OUT__"),
    ("observe", "__FILE__"),  # a file named with escapes: its lines name it
    ("runs", "\x1b]52;c;aGk=\x07"),  # argparse's own error quotes the line
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a)[:30].encode("unicode_escape").decode())
def test_every_listing_prints_visible_escapes_only(home: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    """§5: `carl runs`, `carl trajectories list`, error lines (and every other command that prints stored
    text) printed ESC, OSC 52, C1 CSI, CR and BS raw: the pane title was rewritten and the screen cleared."""
    fill(home)
    hostile_file = tmp_path / "bad\x1b]52;c;aGk=\x07\u009b2J\r.jsonl"
    hostile_file.write_text("not json\n")
    args = tuple(
        {"__OUT__": str(tmp_path / "report.html"), "__FILE__": str(hostile_file)}.get(a, a) for a in args
    )
    result = carl(home, *args)
    assert b"Traceback" not in result.stderr, result.stderr.decode(errors="replace")
    assert raw_controls(result.stdout) == [] and raw_controls(result.stderr) == []
    shown = (result.stdout + result.stderr).decode()
    if args[0] in ("runs", "experiments", "trajectories", "agents", "diagnose", "eval", "observe"):
        assert "\\x1b" in shown or "\\u001b" in shown or args == ("trajectories", "status"), shown


def test_a_table_keeps_its_columns_when_a_name_holds_escapes(home: Path) -> None:
    """§5: the escapes are written out before the columns are padded and cut, so the next column stays put."""
    fill(home)
    lines = carl(home, "runs").stdout.decode().splitlines()
    status_at = lines[0].index("STATUS")
    assert all(line[status_at:].startswith("running") for line in lines[1:]), lines


# -- the control room -------------------------------------------------------------------------------------


def problems(app: ControlRoom) -> list[str]:
    """Every screen line (the top screen, with its toasts) holding a raw control character or a link."""
    found = []
    strips: list[Strip] = app.screen._compositor.render_strips()
    for y, strip in enumerate(strips):
        if RAW_CONTROL.search(strip.text):
            found.append(f"{type(app.screen).__name__} line {y}: raw {strip.text!r}")
        for segment in strip:
            style = segment.style
            if style is not None and (style.link or (style.meta or {}).get("@click", "").startswith("link(")):
                found.append(f"{type(app.screen).__name__} line {y}: a link in {segment.text!r}")
    return found


def pending_command(home: Path) -> int | None:
    with Store(home / "carl.db") as store:
        row = store.conn.execute("SELECT id FROM commands WHERE state='pending' ORDER BY id DESC").fetchone()
    return row[0] if row else None


async def visit(app: ControlRoom, pilot: Any, keys: tuple[str, ...], screen: str | None) -> list[str]:
    """Press `keys`, wait for `screen` (a screen's class name; None: the main one) and let it draw."""
    await pilot.press(*keys)
    want = screen or "MainScreen"
    try:
        await until(pilot, lambda: type(app.screen).__name__ == want, timeout=20)
    except AssertionError:
        raise AssertionError(f"{keys} did not open {want}: {type(app.screen).__name__} is on top") from None
    await pilot.pause(0.4)
    return problems(app)


# (keys, the screen they open): each view of stored text the control room has, then back to the main screen.
TOUR = [
    (("tab",), None),  # the Trajectories pane, focused (its cursor line)
    (("enter",), "TrajectoryScreen"),
    (("escape", "tab", "4"), None),  # the Agents pane, maximized: the workers table and every event
    (("enter",), "AgentTaskScreen"),  # its newest task: prompt, steps, answer, feedback
    (("escape", "v"), "SamplesScreen"),
    (("escape", "R"), "RolloutsScreen"),
    (("enter",), "RolloutSampleScreen"),
    (("escape", "g"), "RolloutGroupScreen"),
    (("escape", "escape", "m"), "ExplorerScreen"),
    (("i",), "InspectorScreen"),
    (("escape", "escape", "d"), "ChatScreen"),
    (("ctrl+l", "enter"), "ChatScreen"),  # the stored conversation: the question and the answer
    (("escape", "s"), "ConfirmScreen"),
    (("escape", "w"), "ValueScreen"),
    (("escape",), None),
]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_control_room_shows_hostile_text_as_text(
    home: Path, size: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """§5: a run name holding markup (`x[link=http://127.0.0.1/]y`) killed the control room at start; escape
    sequences in names, keys, prompts and events reached the terminal raw (a pane's title rewritten, the
    screen cleared). Now every view of every stored string is text, its control characters written out."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)  # the chat's offline analyst: nothing is sent
    ids = fill(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.main.view is not None and app.main.view.run.id == ids["run_id"])
        await until(pilot, lambda: bool(app.query_one("#agents").agent_events))
        await pilot.pause(0.4)
        found = problems(app)
        assert "\\x1b]52" in str(app.main.run_list.get_option_at_index(0).prompt)  # the name, written out
        # a command sent from here that fails with a hostile result: its notification quotes it
        await pilot.press("c")
        await until(pilot, lambda: pending_command(home) is not None)
        with Store(home / "carl.db") as store:
            store.finish_command(
                pending_command(home), False, f"failed: {SHORT} [link=http://127.0.0.1/]x[/]"
            )
        await until(pilot, lambda: any(n.severity == "error" for n in app._notifications))
        await pilot.pause(0.4)
        found += problems(app)
        for keys, screen in TOUR:
            found += await visit(app, pilot, keys, screen)
        assert found == []
        await pilot.press("q")
    assert app.return_code in (None, 0)
