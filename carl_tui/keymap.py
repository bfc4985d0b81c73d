"""Keys: every binding has an id, and the `[keymap]` table of tui.toml maps ids to other keys
through Textual's keymap (App.set_keymap), as Posting does:

    [keymap]
    next-theme = "y"          # t becomes y
    help = "h,f1"             # several keys: comma-separated

A bad entry (an id no binding has, an empty key) is left out and reported in one line; the help
screen shows the keys in force.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

from textual.binding import Binding
from textual.screen import Screen

# The modules whose classes declare bindings: the ids a keymap may name are theirs. Imported only
# to check a keymap (after the first frame), since most are loaded on first use.
BINDING_MODULES = (
    "carl_tui.main_screen",
    "carl_tui.runs",
    "carl_tui.screens",
    "carl_tui.chat_screen",
    "carl_tui.agent_task_screen",
    "carl_tui.trajectory_screen",
    "carl_tui.explorer",
    "carl_tui.inspector",
    "carl_tui.rollouts_view",
    "carl_tui.rollouts_detail",
    "carl_tui.system_view",
    "carl_tui.console_view",
    "widgets.activity",
    "widgets.agents",
    "widgets.chat_log",
    "widgets.rollout_list",
    "widgets.log_lines",
)
KEY_NAMES = {"question_mark": "?", "slash": "/", "escape": "esc", "plus": "+"}


def bindings_of(cls: type) -> list[Binding]:
    """The Binding objects a class declares itself (not those it inherits)."""
    return [b for b in cls.__dict__.get("BINDINGS", []) if isinstance(b, Binding)]


def binding_classes() -> list[type]:
    """Every class of the control room that declares bindings."""
    classes: list[type] = []
    for name in BINDING_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == name and bindings_of(value):
                classes.append(value)
    return classes


def known_ids() -> set[str]:
    return {b.id for cls in binding_classes() for b in bindings_of(cls) if b.id}


def check_keymap(
    raw: Mapping[str, Any], known: Iterable[str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The usable entries of a `[keymap]` table, and what is wrong with the others (one phrase each).
    With `known`, an id outside it is wrong too."""
    known = set(known) if known is not None else None
    keymap: dict[str, str] = {}
    problems: list[str] = []
    for binding_id, keys in raw.items():
        if known is not None and binding_id not in known:
            problems.append(f"{binding_id!r} is no binding's id")
        elif not isinstance(keys, str) or not [k for k in keys.split(",") if k.strip()]:
            problems.append(f"{binding_id!r} has no key")
        else:
            keymap[binding_id] = ",".join(k.strip() for k in keys.split(",") if k.strip())
    return keymap, problems


def keymap_line(problems: list[str], path: object) -> str:
    """One line for every bad entry, naming the file."""
    return f"{path} [keymap]: ignored " + "; ".join(problems)


def key_display(keys: str) -> str:
    """`question_mark,f1` as `? / f1`."""
    return " / ".join(KEY_NAMES.get(k.strip(), k.strip()) for k in keys.split(","))


def keys_in_force(binding: Binding, keymap: Mapping[str, str]) -> str:
    """How the help shows a binding's keys: the keymap's when it remaps the binding."""
    if binding.id and binding.id in keymap:
        return key_display(keymap[binding.id])
    return binding.key_display or key_display(binding.key)


def help_rows(screen: Screen[Any], keymap: Mapping[str, str]) -> list[tuple[str, str]]:
    """The help's rows: keys from the same binding tables that drive the key bar, as the keymap maps them:
    the screen's own first, then those of the widget that has focus, then the two that work everywhere.
    Textual's generic bindings (cursor, scroll, copy, the palette's own) have no id: they are not the
    control room's keys and are left out. A row with no key is a section's header."""
    rows: list[tuple[str, str]] = [("", "Control room")]
    rows += [(keys_in_force(b, keymap), b.description) for b in bindings_of(type(screen)) if b.description]
    seen = {d for _, d in rows}
    here: list[tuple[str, str]] = []
    for entry in screen.active_bindings.values():
        b = entry.binding
        # Ours have ids; Textual's generic widget keys (cursor, scroll, copy) have none.
        if b.description and b.id and b.description not in seen and entry.node is not screen:
            seen.add(b.description)
            here.append((screen.app.get_key_display(b), b.tooltip or b.description))  # the longer one
    if here:
        rows += [("", "Here"), *here]
    rows += [
        ("", "Everywhere"),
        ("ctrl+p", "Command palette: themes, chart mode, observe, engine, panes"),
        ("tab", "Next pane"),
    ]
    return rows
