"""Claude Code hooks: the recorder as a real process, the settings.json installer, the spool, assembly."""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine.errors import CarlError
from engine.trajectories.capture import hooks, recorder
from engine.trajectories.capture.hooks import HookSettingsError, SpoolItem, assemble

SID = "9f1c2b7e-5d1a-4c55-8a0e-3f2d1c0b9a87"
COMMON = {
    "session_id": SID,
    "transcript_path": f"/home/dev/.claude/projects/-w-app/{SID}.jsonl",
    "cwd": "/w/app",
    "permission_mode": "default",
}
SPOOL_NAME = re.compile(r"^\d{20}-\d+-\d+-[0-9a-f]{6}\.json$")


# ---------------------------------------------------------------------------------------------------
# Real payload shapes (docs/reference/agent-traces.md §1.2-1.3)


def session_start(**kw: Any) -> dict[str, Any]:
    return {
        **COMMON,
        "hook_event_name": "SessionStart",
        "source": "startup",
        "model": "claude-sonnet-4-5",
        **kw,
    }


def prompt(text: str, **kw: Any) -> dict[str, Any]:
    return {**COMMON, "hook_event_name": "UserPromptSubmit", "prompt": text, **kw}


def pre(tool: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {
        **COMMON,
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": "toolu_01",
    }


def post(tool: str, tool_input: dict[str, Any], response: Any = None, **kw: Any) -> dict[str, Any]:
    response = (
        {"stdout": "ok\n", "stderr": "", "interrupted": False, "isImage": False}
        if response is None
        else response
    )
    return {
        **COMMON,
        "hook_event_name": "PostToolUse",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_response": response,
        "tool_use_id": "toolu_02",
        **kw,
    }


def failure(tool: str, tool_input: dict[str, Any], error: str, **kw: Any) -> dict[str, Any]:
    return {
        **COMMON,
        "hook_event_name": "PostToolUseFailure",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": "toolu_03",
        "error": error,
        **kw,
    }


def stop() -> dict[str, Any]:
    return {**COMMON, "hook_event_name": "Stop", "stop_hook_active": False, "last_assistant_message": "Done."}


def session_end() -> dict[str, Any]:
    return {**COMMON, "hook_event_name": "SessionEnd", "reason": "prompt_input_exit"}


BASH = {"command": "pytest -q tests/test_api.py", "description": "Run the API tests", "timeout": 120000}
READ = {"file_path": "/w/app/api.py", "offset": 1, "limit": 200}
EDIT = {"file_path": "/w/app/api.py", "old_string": "a", "new_string": "b", "replace_all": False}

EVERY_EVENT = [
    session_start(),
    prompt("add a health endpoint to the API"),
    pre("Bash", BASH),
    post(
        "Read",
        READ,
        {"type": "text", "file": {"filePath": READ["file_path"], "content": "x" * 2000}},
        duration_ms=12,
    ),
    failure("Bash", BASH, "Exit code 1\nFAILED tests/test_api.py::test_health", duration_ms=830),
    stop(),
    session_end(),
]


# ---------------------------------------------------------------------------------------------------
# The recorder as Claude Code runs it


def run_hook(body: bytes, home: Path, argv: list[str] | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CARL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-S", str(hooks.HOOK_SCRIPT), *(argv or [])],
        input=body,
        capture_output=True,
        env=env,
        timeout=30,
    )


def spool_files(home: Path) -> list[Path]:
    folder = home / "spool" / "hooks"
    return sorted(folder.iterdir()) if folder.exists() else []


def test_every_event_is_spooled_as_received_silently(tmp_path: Path) -> None:
    home = tmp_path / "carl"
    for payload in EVERY_EVENT:
        done = run_hook(json.dumps(payload, indent=1).encode() + b"\n", home)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    files = spool_files(home)
    assert [f.name for f in files if not SPOOL_NAME.match(f.name)] == []
    wrappers = [json.loads(f.read_bytes()) for f in files]
    assert [w["payload"] for w in wrappers] == EVERY_EVENT  # name order is arrival order
    stamps = [w["received_at"] for w in wrappers]
    assert stamps == sorted(stamps) and all(isinstance(s, float) for s in stamps)
    assert stat.S_IMODE((home / "spool" / "hooks").stat().st_mode) == 0o700
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert not (home / "logs" / "hook-errors.log").exists()


def test_the_installed_command_records_through_the_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CARL_HOME", raising=False)
    settings = hooks.install("user", home=tmp_path)
    command = json.loads(settings.read_text())["hooks"]["UserPromptSubmit"][0]["hooks"][0]["command"]
    env = {**os.environ, "CARL_HOME": str(tmp_path / "carl"), "PYTHONPATH": "/nonexistent"}
    body = json.dumps(prompt("héllo ✓")).encode()
    done = subprocess.run(
        command, shell=True, input=body, capture_output=True, env=env, timeout=30, cwd=tmp_path
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert [item.payload for item in hooks.read_spool(tmp_path / "carl")] == [prompt("héllo ✓")]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json at all", "not JSON"),
        (b"", "empty payload"),
        (b"  \n", "empty payload"),
        (b'[{"hook_event_name": "Stop"}]', "not a JSON object (list)"),
        (b'{"session_id": "x"', "not JSON"),
        (b'{"a": 1} {"b": 2}', "extra data"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (b'"Stop"', "not a JSON object"),
    ],
)
def test_bad_payloads_are_logged_and_dropped(tmp_path: Path, body: bytes, reason: str) -> None:
    home = tmp_path / "carl"
    done = run_hook(body, home)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert spool_files(home) == []
    lines = (home / "logs" / "hook-errors.log").read_text().splitlines()
    assert len(lines) == 1 and reason in lines[0] and repr(body[:200]) in lines[0]


def test_concurrent_sessions_lose_nothing(tmp_path: Path) -> None:
    home = tmp_path / "carl"
    sessions = [
        [{**post("Bash", {"command": f"echo {s}-{i}"}), "session_id": f"s{s}"} for i in range(25)]
        for s in range(8)
    ]

    def one_session(payloads: list[dict[str, Any]]) -> list[int]:
        return [run_hook(json.dumps(p).encode(), home).returncode for p in payloads]

    with ThreadPoolExecutor(8) as pool:
        codes = [c for result in pool.map(one_session, sessions) for c in result]
    assert codes == [0] * 200
    files = spool_files(home)
    assert len(files) == 200 and not [f for f in files if f.name.startswith(".")]
    items = hooks.read_spool(home)
    got = sorted(json.dumps(i.payload, sort_keys=True) for i in items)
    assert got == sorted(json.dumps(p, sort_keys=True) for s in sessions for p in s)
    for session in sessions:  # each session's own order survives the interleaving
        mine = [i.payload for i in items if i.session_id == session[0]["session_id"]]
        assert mine == session


def test_record_in_process_and_its_edges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "carl"
    recorder.record(b'\xef\xbb\xbf{"hook_event_name": "Stop", "session_id": "bom"}', home)  # BOM: re-encoded
    monkeypatch.setattr(recorder, "SOFT_CAP", 1000)
    big = post("Read", READ, {"file": {"content": "y" * 50_000}}, session_id="big")
    recorder.record(json.dumps(big).encode(), home)
    items = hooks.read_spool(home)
    assert items[0].payload == {"hook_event_name": "Stop", "session_id": "bom"}
    content = items[1].payload["tool_response"]["file"]["content"]
    assert items[1].payload["tool_input"] == READ and len(content) < 21_000 and "characters cut" in content


def test_main_swallows_every_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(raw: bytes, home: object) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(recorder, "record", explode)
    monkeypatch.setattr(recorder, "_read_stdin", lambda limit: b"{}")
    assert recorder.main(["--home", str(tmp_path)]) == 0
    assert "hook failed: RuntimeError: disk on fire" in (tmp_path / "logs" / "hook-errors.log").read_text()


def test_carl_home_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("CARL_HOME", raising=False)
    assert recorder.carl_home([]) == f"{tmp_path}/.carl"
    monkeypatch.setenv("CARL_HOME", "~/elsewhere")
    assert recorder.carl_home([]) == f"{tmp_path}/elsewhere"
    assert recorder.carl_home(["--home", "/x/y"]) == "/x/y"  # baked in by install: wins over the env


def test_carl_hook_cli_helper(tmp_path: Path) -> None:
    code = (
        "import sys; from engine.trajectories.capture.hooks import hook_cli_main; sys.exit(hook_cli_main([]))"
    )
    env = {**os.environ, "CARL_HOME": str(tmp_path)}
    body = json.dumps(stop()).encode()
    done = subprocess.run([sys.executable, "-c", code], input=body, capture_output=True, env=env, timeout=60)
    assert (done.returncode, done.stdout) == (0, b"")
    assert [i.payload for i in hooks.read_spool(tmp_path)] == [stop()]


# ---------------------------------------------------------------------------------------------------
# settings.json


USER_SETTINGS = {
    "model": "opus",
    "permissions": {"allow": ["Bash(npm test:*)"], "deny": []},
    "hooks": {
        "PostToolUse": [
            {"matcher": "Edit|Write", "hooks": [{"type": "command", "command": "prettier --write"}]}
        ],
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done", "timeout": 3}]}],
        "Notification": [{"hooks": [{"type": "command", "command": "say hi"}]}],
    },
    "env": {"FOO": "ünïcode"},
}


def write_settings(path: Path, data: Any, indent: int = 2) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    body = (json.dumps(data, indent=indent, ensure_ascii=False) + "\n").encode()
    path.write_bytes(body)
    return body


def our_handlers(data: dict[str, Any]) -> dict[str, int]:
    return {
        event: sum(hooks.is_ours(h.get("command")) for g in groups for h in g.get("hooks", []))
        for event, groups in data.get("hooks", {}).items()
    }


@pytest.mark.parametrize("indent", [2, 4])
def test_install_is_idempotent_and_uninstall_restores(tmp_path: Path, indent: int) -> None:
    path = tmp_path / ".claude" / "settings.json"
    original = write_settings(path, USER_SETTINGS, indent)
    assert hooks.install("user", home=tmp_path, carl_home=tmp_path / "carl") == path
    first = path.read_bytes()
    data = json.loads(first)
    assert our_handlers(data) == {
        "PostToolUse": 1,
        "Stop": 1,
        "Notification": 0,
        "SessionStart": 1,
        "UserPromptSubmit": 1,
        "PostToolUseFailure": 1,
        "SessionEnd": 1,
    }
    assert {k: v for k, v in data.items() if k != "hooks"} == {
        k: v for k, v in USER_SETTINGS.items() if k != "hooks"
    }
    assert (
        data["hooks"]["PostToolUse"][0] == USER_SETTINGS["hooks"]["PostToolUse"][0]
    )  # the user's group, untouched
    assert data["hooks"]["PostToolUse"][1]["matcher"] == "*"
    assert data["hooks"]["Stop"][0] == USER_SETTINGS["hooks"]["Stop"][0]
    assert "PreToolUse" not in data["hooks"]
    assert f'\n{" " * indent}"model"' in first.decode()  # the file's own indentation is kept

    hooks.install("user", home=tmp_path, carl_home=tmp_path / "carl")
    assert path.read_bytes() == first  # byte-identical
    hooks.uninstall("user", home=tmp_path)
    assert path.read_bytes() == original
    hooks.uninstall("user", home=tmp_path)
    assert path.read_bytes() == original


def test_install_into_a_missing_file_and_back(tmp_path: Path) -> None:
    path = hooks.install("project", project_dir=tmp_path)
    assert path == tmp_path.resolve() / ".claude" / "settings.json"
    assert set(json.loads(path.read_text())["hooks"]) == set(hooks.INSTALL_EVENTS)
    hooks.uninstall("project", project_dir=tmp_path)
    assert json.loads(path.read_text()) == {}


def test_our_handler_moved_into_a_user_group_is_kept_once(tmp_path: Path) -> None:
    ours = {"type": "command", "command": "/old/venv/bin/python -S /old/src/engine/trajectories/hook.py"}
    mine = {"type": "command", "command": "log-tool.sh"}
    settings = {"hooks": {"PostToolUse": [{"matcher": "*", "hooks": [mine, ours, dict(ours)]}]}}
    path = tmp_path / ".claude" / "settings.json"
    write_settings(path, settings)
    hooks.install("user", home=tmp_path)
    group = json.loads(path.read_text())["hooks"]["PostToolUse"]
    assert len(group) == 1 and len(group[0]["hooks"]) == 2 and group[0]["hooks"][0] == mine
    assert group[0]["hooks"][1]["command"] == hooks.hook_command(carl_home=_env_home())  # updated in place
    hooks.uninstall("user", home=tmp_path)
    assert json.loads(path.read_text()) == {"hooks": {"PostToolUse": [{"matcher": "*", "hooks": [mine]}]}}


def _env_home() -> Path | None:
    value = os.environ.get("CARL_HOME")
    return Path(value).expanduser().resolve() if value else None


@pytest.mark.parametrize(
    ("text", "line"),
    [('{\n  "model": "opus",\n  "hooks": {,}\n}\n', 3), ("{\n  // comment\n}\n", 2), ("[1, 2]\n", 1)],
)
def test_invalid_settings_are_refused_untouched(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / ".claude" / "settings.json"
    path.parent.mkdir()
    path.write_text(text)
    for action in (hooks.install, hooks.uninstall):
        with pytest.raises(HookSettingsError) as caught:
            action("user", home=tmp_path)
        message = str(caught.value)
        assert isinstance(caught.value, CarlError) and "\n" not in message
        assert message.startswith(f"{path}:{line}: ")
        assert path.read_text() == text


def test_hooks_of_the_wrong_shape_are_refused(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.json"
    body = write_settings(path, {"hooks": {"Stop": {"command": "x"}}})
    with pytest.raises(HookSettingsError, match="hooks.Stop is not a list"):
        hooks.install("user", home=tmp_path)
    assert path.read_bytes() == body


def test_install_over_a_null_hooks_table(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.json"
    write_settings(path, {"model": "opus", "hooks": None})
    hooks.install("user", home=tmp_path)
    assert set(json.loads(path.read_text())["hooks"]) == set(hooks.INSTALL_EVENTS)
    hooks.uninstall("user", home=tmp_path)
    assert json.loads(path.read_text()) == {"model": "opus"}


def test_scopes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    assert hooks.settings_path("user") == tmp_path / "me" / ".claude" / "settings.json"
    monkeypatch.chdir(tmp_path)
    assert hooks.settings_path("project") == tmp_path.resolve() / ".claude" / "settings.json"
    assert (
        hooks.settings_path("local", project_dir=tmp_path / "p")
        == tmp_path.resolve() / "p/.claude/settings.local.json"
    )
    user = hooks.install("user")
    project = hooks.install("project", project_dir=tmp_path / "p")
    assert user.exists() and project.exists() and user != project
    assert hooks.installed_events("project", project_dir=tmp_path / "p") == list(hooks.INSTALL_EVENTS)
    with pytest.raises(HookSettingsError):
        hooks.settings_path("global")  # type: ignore[arg-type]


def test_install_bakes_in_the_carl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "engine-home"))
    path = hooks.install("user", home=tmp_path)
    command = json.loads(path.read_text())["hooks"]["Stop"][0]["hooks"][0]["command"]
    env = {**os.environ, "CARL_HOME": str(tmp_path / "claude-sees-this")}
    subprocess.run(command, shell=True, input=json.dumps(stop()).encode(), env=env, check=True, timeout=30)
    assert len(spool_files(tmp_path / "engine-home")) == 1


@pytest.mark.parametrize(
    ("command", "ours"),
    [
        (hooks.hook_command(), True),
        ("/usr/bin/python3 -S '/opt/x/engine/trajectories/hook.py'", True),
        ("/usr/bin/python3 -S '/opt/x/engine/trajectories/capture/recorder.py'", True),
        # installed before the recorder moved to capture/: install finds it and rewrites it
        (
            """py -S -E -c 'import sys; sys.path[0] = "/x/engine/trajectories"; import hook; hook.main()'""",
            True,
        ),
        ("carl hook", True),
        ("/home/me/.local/bin/carl hook --home /tmp/c", True),
        ('"C:/bin/carl.exe" hook', True),
        ("carl hooks install", False),
        ("prettier --write", False),
        ("~/bin/webhook.sh", False),
        (None, False),
    ],
)
def test_is_ours(command: str | None, ours: bool) -> None:
    assert hooks.is_ours(command) is ours


def test_hooks_cli_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hooks.hooks_cli_main(["install", "--user"]) == 0
    assert hooks.hooks_cli_main(["status"]) == 0
    assert hooks.hooks_cli_main(["uninstall"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("carl hooks installed in") and "UserPromptSubmit" in out[1]
    assert out[2].startswith("carl hooks removed from")


# ---------------------------------------------------------------------------------------------------
# The spool


def test_read_spool_moves_bad_files_and_finishes_stale_ones(tmp_path: Path) -> None:
    for payload in (prompt("one"), stop()):
        recorder.record(json.dumps(payload).encode(), tmp_path)
    folder = hooks.spool_dir(tmp_path)
    (folder / "00000000000000000001-1-1-aaaaaa.json").write_text('{"received_at": 1.0, "payl')
    stale = folder / ".tmp-00000000000000000002-1-1-bbbbbb.json"
    stale.write_text(json.dumps({"received_at": 2.0, "payload": session_start()}))
    os.utime(stale, (0, 0))
    fresh = folder / ".tmp-99999999999999999999-1-1-cccccc.json"
    fresh.write_text("{")  # a recorder still writing: left alone
    bad: list[tuple[Path, str]] = []
    items = hooks.read_spool(tmp_path, on_bad=lambda p, why: bad.append((p, why)))
    assert [i.payload["hook_event_name"] for i in items] == ["SessionStart", "UserPromptSubmit", "Stop"]
    assert [p.name for p, _ in bad] == ["00000000000000000001-1-1-aaaaaa.json"]
    assert (tmp_path / "spool" / "bad" / bad[0][0].name).exists() and fresh.exists()
    assert "bad spool file" in (tmp_path / "logs" / "hook-errors.log").read_text()
    assert len(hooks.read_spool(tmp_path, limit=2)) == 2
    assert hooks.remove_spool(items) == 3 and hooks.remove_spool(items) == 0
    assert hooks.read_spool(tmp_path) == []
    assert hooks.read_spool(tmp_path / "nothing-here") == []


# ---------------------------------------------------------------------------------------------------
# Assembly (docs/reference/agent-traces.md §1.5, docs/reference/karl.md rule 12)


def timed(*payloads: dict[str, Any], start: float = 1_700_000_000.0) -> list[dict[str, Any]]:
    """Spool wrappers, one second apart."""
    return [{"received_at": start + i, "payload": p} for i, p in enumerate(payloads)]


TWO_TURNS = timed(
    session_start(),
    prompt("add a health endpoint to the API"),
    pre("Read", READ),
    post("Read", READ, {"type": "text", "file": {"filePath": READ["file_path"]}}, duration_ms=12),
    post("Edit", EDIT, {"filePath": EDIT["file_path"], "structuredPatch": []}),
    failure("Bash", BASH, "Exit code 1\nFAILED tests/test_api.py::test_health\n1 failed"),
    stop(),
    prompt("no, that's wrong: the endpoint must be /healthz"),
    post("Edit", EDIT),
    post("Bash", BASH, {"stdout": "1 passed", "stderr": "", "interrupted": False}),
    stop(),
)


def test_two_turns_with_a_correction() -> None:
    result = assemble(TWO_TURNS)
    first, second = result.trajectories
    assert (result.open_turn, result.model, result.session_id) == (False, "claude-sonnet-4-5", SID)
    assert (first.agent, first.source, first.session_id, first.cwd) == ("claude-code", "hook", SID, "/w/app")
    assert first.prompt == "add a health endpoint to the API" and first.turn_index == 0
    assert [(e.tool, e.success, e.exit_code) for e in first.events] == [
        ("Read", True, None),
        ("Edit", True, None),
        ("Bash", False, 1),
    ]
    assert first.events[0].params == {"file_path": "/w/app/api.py"} and first.events[0].duration_ms == 12
    assert first.events[2].params == {"command": BASH["command"], "description": BASH["description"]}
    assert first.events[2].bash_error and first.events[1].ts == 1_700_000_004.0
    assert (first.started_at, first.ended_at) == (1_700_000_001.0, 1_700_000_006.0)
    assert (first.session_continued, first.correction, first.redo) == (True, True, False)
    assert (second.session_continued, second.correction, second.redo) == (None, None, None)
    assert [(e.tool, e.success, e.exit_code) for e in second.events] == [
        ("Edit", True, None),
        ("Bash", True, None),
    ]
    assert first.uid != second.uid


def test_reassembly_keeps_uids_and_updates_the_earlier_turn() -> None:
    before = assemble(TWO_TURNS[:7]).trajectories
    after = assemble(TWO_TURNS).trajectories
    assert len(before) == 1 and before[0].uid == after[0].uid
    assert before[0].correction is None and after[0].correction is True
    assert [t.uid for t in assemble(TWO_TURNS).trajectories] == [t.uid for t in after]
    items = [SpoolItem(Path(f"{i}.json"), w["received_at"], w["payload"]) for i, w in enumerate(TWO_TURNS)]
    assert [t.uid for t in assemble(items).trajectories] == [t.uid for t in after]
    with_id = timed(prompt("do it", prompt_id="p-1"), post("Edit", EDIT), stop())
    moved = timed(prompt("do it", prompt_id="p-1"), post("Edit", EDIT), stop(), start=5.0)
    assert assemble(with_id).trajectories[0].uid == assemble(moved).trajectories[0].uid


def test_a_turn_without_tools_still_judges_the_one_before() -> None:
    result = assemble(
        timed(
            prompt("rename the module"),
            post("Bash", {"command": "git mv a.py b.py"}),
            stop(),
            prompt("thanks! what does it do now?"),
            stop(),
            prompt("try again, but keep the old name as an alias"),
        )
    )
    assert len(result.trajectories) == 1 and result.open_turn
    only = result.trajectories[0]
    assert (only.session_continued, only.correction, only.redo) == (True, False, False)  # judged by "thanks!"


def test_missing_stop_closes_at_the_next_prompt_and_session_end_closes() -> None:
    result = assemble(
        timed(
            prompt("run the tests"),
            post("Bash", BASH),
            failure("Bash", BASH, "Command exited with non-zero status code 2"),
            prompt("still failing, why did you skip the fixture?"),
            post("Read", READ),
            session_end(),
        )
    )
    first, second = result.trajectories
    assert first.ended_at == 1_700_000_002.0  # its last payload: no Stop came
    assert first.events[1].exit_code == 2 and first.correction is True
    assert second.ended_at == 1_700_000_005.0 and not result.open_turn and result.ended


def test_an_open_turn_is_not_emitted_until_closed_or_stale() -> None:
    payloads = timed(prompt("refactor"), post("Edit", EDIT))
    assert assemble(payloads).trajectories == [] and assemble(payloads).open_turn
    assert assemble(payloads, now=1_700_000_001.0 + 60).open_turn
    stale = assemble(payloads, now=1_700_000_001.0 + hooks.STALE_TURN_S + 1)
    assert not stale.open_turn and stale.trajectories[0].ended_at == 1_700_000_001.0


def test_injected_prompts_are_not_human() -> None:
    result = assemble(
        timed(
            prompt("start the dev server in the background"),
            post("Bash", {"command": "npm run dev"}),
            stop(),
            prompt("<task-notification>the server said: that's wrong, port busy</task-notification>"),
            post("Bash", {"command": "lsof -i :3000"}),
            stop(),
            prompt("<local-command-stdout>That's wrong. Undo.</local-command-stdout>"),
            prompt("great, looks good"),
        )
    )
    (only,) = result.trajectories
    assert [e.params["command"] for e in only.events] == ["npm run dev", "lsof -i :3000"]  # one turn
    assert (only.session_continued, only.correction, only.redo) == (True, False, False)


def test_tool_errors_subagents_and_stop_hook_continuation() -> None:
    result = assemble(
        timed(
            prompt("fetch the docs"),
            post("WebFetch", {"url": "https://example.com", "prompt": "summarize"}, {"error": "HTTP 404"}),
            post("mcp__db__query", {"query": "select 1"}, {"isError": True, "content": []}),
            post("Write", {"file_path": "/w/a", "content": "x"}, {"success": False}),
            post("Bash", {"command": "ls"}, {"is_error": True}),
            post("Agent", {"prompt": "look around", "subagent_type": "Explore"}, {"status": "completed"}),
            post("Read", READ, agent_id="agent-7", agent_type="Explore"),
            failure("Bash", {"command": "sleep 999"}, "Command timed out", is_interrupt=True),
            stop(),
            post("Bash", {"command": "echo more"}),
            stop(),  # a Stop hook kept Claude going
            pre("Bash", BASH),
        )
    )
    (only,) = result.trajectories
    assert [(e.tool, e.success, e.exit_code) for e in only.events] == [
        ("WebFetch", False, None),
        ("mcp__db__query", False, None),
        ("Write", False, None),
        ("Bash", False, None),
        ("Agent", True, None),
        ("Bash", False, None),
        ("Bash", True, None),
    ]
    assert only.ended_at == 1_700_000_010.0 and not result.open_turn


def test_tool_calls_before_any_prompt_form_a_prompt_less_turn() -> None:
    result = assemble([post("Bash", BASH, received_at=5.0), stop() | {"received_at": 6.0}])
    (only,) = result.trajectories
    assert only.prompt == "" and only.events[0].ts == 5.0 and only.ended_at == 6.0


def test_spooled_payloads_assemble_end_to_end(tmp_path: Path) -> None:
    for wrapper in TWO_TURNS:
        recorder.record(json.dumps(wrapper["payload"]).encode(), tmp_path)
    recorder.record(json.dumps({**prompt("other session"), "session_id": "other"}).encode(), tmp_path)
    sessions = hooks.group_by_session(hooks.read_spool(tmp_path))
    assert list(sessions) == [SID, "other"]
    assert [len(assemble(items).trajectories) for items in sessions.values()] == [2, 0]


def test_hooks_installed_before_the_recorder_moved_are_repointed_and_record_again(tmp_path: Path) -> None:
    """An upgrade moved trajectories/hook.py to capture/recorder.py: the engine points the old handlers at the
    recorder again (same interpreter, same baked-in home), and leaves the user's own handlers alone."""
    old_folder = tmp_path / "old-checkout" / "engine" / "trajectories"
    old_code = f"import sys; sys.path[0] = {json.dumps(str(old_folder))}; import hook; hook.main()"
    old_command = shlex.join([sys.executable, "-S", "-E", "-c", old_code, "--home", str(tmp_path / "carl")])
    theirs = {"type": "command", "command": "prettier --write"}
    settings = tmp_path / ".claude" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(
        json.dumps(
            {
                "hooks": {
                    "Stop": [{"hooks": [{"type": "command", "command": old_command, "timeout": 5}]}],
                    "PostToolUse": [{"matcher": "*", "hooks": [theirs]}],
                }
            }
        )
    )
    assert hooks.repoint_moved_recorder("user", home=tmp_path) == settings
    data = json.loads(settings.read_text())
    command = data["hooks"]["Stop"][0]["hooks"][0]["command"]
    assert command == hooks.hook_command(sys.executable, carl_home=tmp_path / "carl")
    assert data["hooks"]["PostToolUse"][0]["hooks"] == [theirs]
    done = subprocess.run(
        command, shell=True, input=json.dumps(stop()).encode(), timeout=30, capture_output=True
    )
    assert done.returncode == 0 and len(spool_files(tmp_path / "carl")) == 1
    assert hooks.repoint_moved_recorder("user", home=tmp_path) is None  # current handlers are left alone
