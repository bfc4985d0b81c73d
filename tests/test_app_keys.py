"""Keys: every binding has an id, the `[keymap]` table of tui.toml remaps them through Textual's keymap,
a bad entry is one line (never a traceback), and help shows the keys in force."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest
from support import ROOT, until
from test_app_control import carl_run, commands, settled
from textual.binding import Binding

import carl_tui
import widgets
from carl_tui.app import ControlRoom
from carl_tui.keymap import binding_classes, bindings_of, check_keymap, known_ids
from carl_tui.main_screen import MainScreen
from carl_tui.preferences import load_config


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


ENTRY_SCRIPTS = ("carl_tui.__main__", "carl_tui.cli_carl")  # importing them runs the program


def every_class_with_bindings() -> set[type]:
    found = set()
    for package in (carl_tui, widgets):
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if module.name in ENTRY_SCRIPTS:
                continue
            loaded = importlib.import_module(module.name)
            for _, value in inspect.getmembers(loaded, inspect.isclass):
                if value.__module__ == module.name and bindings_of(value):
                    found.add(value)
    return found


def test_every_binding_has_a_unique_id_the_keymap_knows() -> None:
    classes = every_class_with_bindings()
    assert classes == set(binding_classes()), "keymap.BINDING_MODULES misses a module"
    ids = [b.id for cls in classes for b in bindings_of(cls)]
    assert all(ids), [f"{cls.__name__}: {b.key}" for cls in classes for b in bindings_of(cls) if not b.id]
    assert len(ids) == len(set(ids)), "an id names one binding"
    assert set(ids) == known_ids()
    assert all(isinstance(b, Binding) for cls in classes for b in cls.BINDINGS)


def test_the_guide_lists_every_id_of_the_control_room() -> None:
    guide = (ROOT / "docs" / "guide" / "control-room.md").read_text(encoding="utf-8")
    keys = guide.split("## Keys", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z][a-z0-9.-]*)`", keys))
    missing = {b.id for b in bindings_of(MainScreen)} - listed
    missing |= {
        b.id
        for cls in binding_classes()
        if cls.__module__ != "carl_tui.main_screen"
        for b in bindings_of(cls)
    } - listed
    assert missing == set()


def test_check_keymap_keeps_the_good_entries_and_names_the_bad() -> None:
    keymap, problems = check_keymap(
        {"next-theme": "y", "help": " h , f1 ", "quit": "", "stop": 3, "nope": "z"},
        {"next-theme", "help", "quit", "stop"},
    )
    assert keymap == {"next-theme": "y", "help": "h,f1"}
    assert problems == ["'quit' has no key", "'stop' has no key", "'nope' is no binding's id"]


async def test_a_keymap_remaps_keys_and_help_shows_them(home: Path) -> None:
    (home / "tui.toml").write_text(
        'theme = "carl-dark"\n\n[keymap]\nnext-theme = "y"\nhelp = "h"\nstop = "S"\nno-such-key = "z"\n'
        'quit = ""\n'
    )
    carl_run(home)
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.main.view is not None)
        # The bad entries: one line, after the first frame; the good ones are in force.
        await until(pilot, lambda: any("[keymap]" in n.message for n in app._notifications))
        lines = [n.message for n in app._notifications if "[keymap]" in n.message]
        assert len(lines) == 1 and "\n" not in lines[0]
        assert "'no-such-key' is no binding's id" in lines[0] and "'quit' has no key" in lines[0]
        assert "tui.toml" in lines[0]
        theme = app.theme
        await pilot.press("t")  # no longer bound
        assert app.theme == theme
        await pilot.press("y")
        assert app.theme != theme
        assert load_config(home).keymap["next-theme"] == "y", "saving the theme keeps the keymap"
        await pilot.press("question_mark")  # no longer help
        assert app.screen.__class__.__name__ == "MainScreen"
        await pilot.press("h")
        assert app.screen.__class__.__name__ == "HelpScreen"
        rows = {description: key for key, description in app.screen.rows}
        assert rows["Theme"] == "y" and rows["Help"] == "h" and rows["Stop"] == "S"
        assert rows["Quit"] == "q", "an entry without a key leaves the binding as it was"
        assert rows["Checkpoint"] == "c"
        await pilot.press("escape")
        # The stop key is remapped, and its confirmation asks for the key in force.
        await pilot.press("s")
        assert app.screen.__class__.__name__ == "MainScreen"
        await pilot.press("S")
        assert app.screen.__class__.__name__ == "ConfirmScreen"
        assert "(or S again)" in app.screen.message
        await pilot.pause(0.35)  # destructive keys are debounced
        await pilot.press("S")
        await settled(pilot)
        assert commands(home) == [("stop", {}, "run")]


async def test_a_keymap_that_is_no_table_is_one_line_and_defaults(home: Path) -> None:
    (home / "tui.toml").write_text('keymap = "y"\n')
    app = ControlRoom(home, start_engine=False)
    async with app.run_test(size=(80, 24)) as pilot:
        assert app.config_error and "tui.toml: keymap: must be a table" in app.config_error
        await pilot.press("question_mark")
        assert app.screen.__class__.__name__ == "HelpScreen"
