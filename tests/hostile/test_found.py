"""What the hostile-input suite found, one regression test per defect (each failed before its fix).

Each docstring names the issue 22 class it belongs to and the family of the suite that found it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_hostile_files import no_hang

SEEDS = Path(__file__).resolve().parent / "seeds"


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# -- the TOML settings files: tui.toml, trajectories.toml, engine.toml (engine/tomlfile.py) ------------------------


def load_toml_settings(home: Path) -> list[str]:
    """Each TOML settings file of `home` loaded as the product loads it; the line each one gives."""
    from carl_tui.config import ConfigError, load_config
    from engine.alerts.config import load_settings
    from engine.trajectories.config import TrajectoryConfigError, load

    lines = []
    for loader, error in ((load_config, ConfigError), (load, TrajectoryConfigError)):
        with pytest.raises(error) as refused:
            loader(home)
        lines.append(str(refused.value))
    lines += load_settings(home)[1]
    return lines


NAMES = ("tui.toml", "trajectories.toml", "engine.toml")


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_a_toml_settings_file_that_is_not_a_file(tmp_path: Path, kind: str) -> None:
    """§4, found by the tui-toml, trajectories-toml and engine-toml families: a FIFO in place of one of the three
    TOML settings files hung the control room's start, `carl trajectories import` and the engine (read_text), and
    a link to /dev/zero read until the memory ran out. Each is refused by type now, in one line."""
    for name in NAMES:
        if kind == "fifo":
            os.mkfifo(tmp_path / name)
        else:
            (tmp_path / name).symlink_to("/dev/zero")
    fifos = [tmp_path / name for name in NAMES] if kind == "fifo" else []
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    lines = no_hang(lambda: load_toml_settings(tmp_path), *fifos)
    assert lines == [
        f"{tmp_path / 'tui.toml'}: {what}, not a regular file",
        f"{tmp_path / 'trajectories.toml'}: {what}, not a regular file",
        f"engine.toml: {what}, not a regular file",
    ]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a = " + "[" * 5000 + "]" * 5000 + "\n", "invalid TOML: nested too deeply"),
        (
            "a = " + "9" * 5000 + "\n",
            "invalid TOML: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits",
        ),
    ],
)
def test_toml_that_tomllib_cannot_take(tmp_path: Path, text: str, line: str) -> None:
    """§7, the TOML families: nesting tomllib recurses into raised RecursionError, and an integer of 5,000 digits
    ValueError, with a traceback from each of the three loaders (they caught TOMLDecodeError alone)."""
    for name in NAMES:
        (tmp_path / name).write_text(text)
    assert load_toml_settings(tmp_path) == [
        f"{tmp_path / 'tui.toml'}: {line}",
        f"{tmp_path / 'trajectories.toml'}: {line}",
        f"engine.toml: {line}",
    ]


# -- the hook recorder ---------------------------------------------------------------------------------------------


def test_a_hook_payload_nested_too_deeply_is_dropped_with_its_reason(tmp_path: Path) -> None:
    """§1, found by the hook-payloads family: a payload nested thousands of levels deep raised RecursionError in
    the recorder; it was logged as `hook failed: RecursionError` (a crash) rather than as the bad input it is."""
    from engine.trajectories.capture.recorder import record

    record(b'{"session_id": "s", "tool_input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", tmp_path)
    log = (tmp_path / "logs" / "hook-errors.log").read_text()
    assert "not JSON (nested too deeply)" in log and "hook failed" not in log
    assert not list((tmp_path / "spool" / "hooks").glob("*.json"))
