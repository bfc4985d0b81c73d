"""Trajectories end to end: hooks installed in a (temporary) Claude Code settings file, the installed
command run with real payload shapes, the real engine turning the spool into scored turns, the
control room showing and opening them; and the `carl trajectories` commands over an import."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import until
from test_trajectory_import import claude_session, write_jsonl

from carl_tui.app import ControlRoom
from engine.control import start_engine, stop_engine
from engine.store import Store, StoreReader
from widgets.activity import TrajectoriesPane

ROOT = Path(__file__).resolve().parent.parent
SESSION = "9d2f6c1e-4b7a-4e0f-8a1c-3b5d7e9f0a21"


def payloads(cwd: str) -> list[dict]:
    base = {
        "session_id": SESSION,
        "transcript_path": f"{cwd}/t.jsonl",
        "cwd": cwd,
        "permission_mode": "default",
    }
    tool = {**base, "tool_use_id": "toolu_1"}
    return [
        {**base, "hook_event_name": "SessionStart", "source": "startup", "model": "claude-sonnet-5-5"},
        {**base, "hook_event_name": "UserPromptSubmit", "prompt": "fix the failing test in app.py"},
        {
            **tool,
            "hook_event_name": "PostToolUse",
            "tool_name": "Read",
            "tool_input": {"file_path": f"{cwd}/app.py"},
            "tool_response": {"type": "text"},
        },
        {
            **tool,
            "hook_event_name": "PostToolUse",
            "tool_name": "Edit",
            "tool_input": {"file_path": f"{cwd}/app.py", "old_string": "a", "new_string": "b"},
            "tool_response": {"filePath": f"{cwd}/app.py"},
        },
        {
            **tool,
            "hook_event_name": "PostToolUseFailure",
            "tool_name": "Bash",
            "tool_input": {"command": "pytest -q", "description": "run tests"},
            "error": "Exit code 1\nFAILED",
        },
        {
            **tool,
            "hook_event_name": "PostToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": "pytest -q"},
            "tool_response": {"stdout": "1 passed", "stderr": ""},
        },
        {**base, "hook_event_name": "Stop", "stop_hook_active": False},
        {**base, "hook_event_name": "UserPromptSubmit", "prompt": "no, that's wrong — undo the edit"},
    ]


def installed_command(settings: Path, event: str) -> str:
    data = json.loads(settings.read_text())
    return data["hooks"][event][0]["hooks"][0]["command"]


def carl(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(home), *args],
        cwd=ROOT,
        env=env or {**os.environ},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
async def test_hooks_to_engine_to_control_room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from carl_tui.trajectory_screen import TrajectoryScreen

    home, user_home = tmp_path / "carl", tmp_path / "user"
    user_home.mkdir()
    env = {**os.environ, "HOME": str(user_home), "CARL_HOME": str(home)}
    done = carl(home, "hooks", "install", "--user", env=env)
    assert done.returncode == 0, done.stderr
    settings = user_home / ".claude" / "settings.json"
    command = installed_command(settings, "PostToolUse")
    for payload in payloads(str(tmp_path / "proj")):
        hook = subprocess.run(
            ["sh", "-c", command],
            input=json.dumps(payload),
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert hook.returncode == 0 and hook.stdout == ""
    assert len(list((home / "spool" / "hooks").glob("*.json"))) == 8  # recorded while the engine is down

    monkeypatch.setenv("CARL_HOME", str(home))
    start_engine(home)
    try:
        deadline = time.monotonic() + 60
        row = None
        while time.monotonic() < deadline and row is None:
            if (home / "carl.db").exists():
                reader = StoreReader(home / "carl.db")
                try:
                    if reader.version >= 3 and reader.table_count("trajectories"):
                        row = reader.trajectory(reader.trajectories_after(0, 1)[0]["id"])
                finally:
                    reader.close()
            time.sleep(0.2)
        assert row is not None, "the engine never turned the spool into a trajectory"
        assert list((home / "spool" / "hooks").glob("*.json")) == []
        assert row["prompt"] == "fix the failing test in app.py" and row["agent"] == "claude-code"
        assert [(e["tool"], e["ok"]) for e in row["events"]] == [
            ("Read", 1),
            ("Edit", 1),
            ("Bash", 0),
            ("Bash", 1),
        ]
        assert row["events"][2]["exit_code"] == 1
        assert row["outcome"] == {
            "correction_detected": True,
            "redo_detected": False,
            "build_success": None,
            "session_continued": True,
        }
        assert set(row["signals"]) == {"outcome", "process", "efficiency", "verification", "consistency"}
        assert row["signals"]["verification"] == 0.4  # 0.4·[pytest ran]; no build, no read after the edit
        assert row["domain"] is not None

        app = ControlRoom(home, start_engine=False)
        async with app.run_test(size=(120, 40)) as pilot:
            pane = app.query_one(TrajectoriesPane)
            await until(pilot, lambda: len(pane.rows) == 1)
            assert "1 domain" in str(app.query_one("#trajectories").border_subtitle)
            pane.focus()
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, TrajectoryScreen))
            await pilot.pause()
            shown = "\n".join(
                s.render_line(y).text for s in app.screen.query("Static") for y in range(s.size.height)
            )
            assert "fix the failing test in app.py" in shown
            assert re.search(r"3 ✕ +Bash pytest -q  \(exit 1\)", shown) and re.search(r"1 ✓ +Read ", shown)
            assert "verification" in shown and "advantage" in shown and "Domain baselines" in shown
    finally:
        stop_engine(home, timeout=10.0)
    assert carl(home, "hooks", "uninstall", "--user", env=env).returncode == 0
    assert "hooks" not in json.loads(settings.read_text())


@pytest.mark.slow
def test_import_list_status_ablate_export(tmp_path: Path) -> None:
    home = tmp_path / "carl"
    project = tmp_path / "projects" / "-home-dev-proj"
    write_jsonl(project / "s1.jsonl", claude_session())
    write_jsonl(project / "bad.jsonl", ["{not json", json.dumps({"type": "summary"})])
    first = carl(home, "trajectories", "import", str(tmp_path / "projects"))
    assert first.returncode == 0, first.stderr
    assert "new" in first.stdout
    again = carl(home, "trajectories", "import", str(tmp_path / "projects"))
    assert " 0 new, 0 updated" in again.stdout, again.stdout  # idempotent
    listed = carl(home, "trajectories", "list")
    assert listed.returncode == 0 and "claude-code" in listed.stdout
    status = carl(home, "trajectories", "status")
    assert "trajectories" in status.stdout and "retraining triggers" in status.stdout
    too_few = carl(home, "trajectories", "ablate")
    assert too_few.returncode == 2 and "needs more than 20" in too_few.stderr
    missing = carl(home, "trajectories", "import", str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.strip().endswith("nope: no such file or folder")
    with Store(home / "carl.db") as store:
        assert store.conn.execute("SELECT count(*) FROM trajectories").fetchone()[0] >= 1
