"""`--json` on the listing commands: one JSON object a line for a listing, one object for a status,
nothing on stdout for an empty listing. Real CLI processes on a real store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_report import carl, fill_store
from test_trajectory_import import claude_session, write_jsonl

from engine.store import Store

RUN_KEYS = {
    "id",
    "name",
    "status",
    "source_kind",
    "backend",
    "model",
    "last_step",
    "max_steps",
    "phase",
    "health",
    "eval_passed",
    "eval_task",
    "eval_solved",
    "eval_at",
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("listings") / "home"
    home.mkdir()
    fill_store(home)
    return home


def json_lines(stdout: str) -> list[dict[str, Any]]:
    lines = stdout.splitlines()
    assert all(line.startswith("{") for line in lines), stdout[:200]
    return [json.loads(line) for line in lines]


def test_runs_json_is_one_run_a_line_with_its_newest_eval(home: Path) -> None:
    result = carl(home, "runs", "--json")
    assert result.returncode == 0, result.stderr
    runs = json_lines(result.stdout)
    assert [r["name"] for r in runs] == ["alpha", "beta", "fresh"] + [
        f"abl-{arm}-s{seed}" for arm in ("task-only", "cascade") for seed in (0, 1, 2)
    ]
    assert all(set(r) >= RUN_KEYS for r in runs)
    alpha, beta, fresh = runs[:3]
    assert (alpha["status"], alpha["source_kind"], alpha["backend"], alpha["model"]) == (
        "running",
        "carl",
        "torch",
        "carl-tiny",
    )
    assert (alpha["last_step"], alpha["max_steps"]) == (59, 60)
    assert (alpha["eval_passed"], alpha["eval_task"], alpha["eval_solved"]) == (
        True,
        0.7,
        0.6,
    )  # the newer of two
    assert (beta["source_kind"], beta["eval_passed"], beta["eval_task"], beta["eval_solved"]) == (
        "jsonl",
        None,
        None,
        None,
    )
    assert (fresh["last_step"], fresh["backend"], fresh["eval_at"]) == (None, "mlx", None)
    failed = runs[-1]
    assert (failed["status"], failed["error"]) == ("failed", "out of memory")
    text = carl(home, "runs").stdout  # the table is unchanged
    assert "alpha" in text and not text.lstrip().startswith("{")


def test_experiments_json_has_cells_and_per_arm_intervals(home: Path) -> None:
    result = carl(home, "experiments", "--json")
    assert result.returncode == 0, result.stderr
    abl, waiting = json_lines(result.stdout)
    assert (abl["name"], abl["status"], abl["arms"], abl["seeds"], abl["steps"], abl["warmup_steps"]) == (
        "abl",
        "running",
        ["task-only", "cascade"],
        [0, 1, 2],
        30,
        5,
    )
    assert abl["cell_status"] == {"finished": 5, "failed": 1}
    cells = {(c["arm"], c["seed"]): c for c in abl["cells"]}
    assert cells["cascade", 2]["status"] == "failed" and cells["cascade", 2]["error"] == "out of memory"
    assert cells["task-only", 1]["run"] == "abl-task-only-s1" and cells["task-only", 1]["task"] == 0.6
    task_only, cascade = abl["summary"]
    assert (task_only["arm"], task_only["seeds"], task_only["finished"]) == ("task-only", 3, 3)
    assert task_only["task"]["mean"] == pytest.approx(0.6) and task_only["task"]["n"] == 3
    assert task_only["task"]["ci95"] == pytest.approx([0.6 - 0.2484137, 0.6 + 0.2484137], abs=1e-6)
    assert (cascade["finished"], cascade["task"]["n"]) == (2, 2)
    assert cascade["solved"]["ci95"] == pytest.approx([0.7 - 1.2706205, 0.7 + 1.2706205], abs=1e-6)
    assert [c["status"] for c in waiting["cells"]] == ["pending"] and waiting["cells"][0]["run"] is None
    assert waiting["summary"][0]["task"] == {"mean": None, "ci95": None, "n": 0}

    text = carl(home, "experiments").stdout
    assert "abl" in text and "0.600 [0.352, 0.848]" in text and "5/6 cells finished" in text


def test_empty_listings_print_no_json(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    for command in (["runs", "--json"], ["experiments", "--json"]):
        result = carl(missing, *command)
        assert (result.returncode, result.stdout) == (0, ""), result.stderr
        assert "no store" in result.stderr
    empty = tmp_path / "empty"
    Store(empty / "carl.db").close()
    for command in (["runs", "--json"], ["experiments", "--json"], ["trajectories", "list", "--json"]):
        result = carl(empty, *command)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", ""), command
    assert "no experiments yet" in carl(empty, "experiments").stdout


def test_engine_status_json(tmp_path: Path) -> None:
    result = carl(tmp_path / "home", "engine", "status", "--json")
    assert result.returncode == 3  # as without --json: 3 when the engine is down
    status = json.loads(result.stdout)
    assert status["state"] == "down" and status["pid"] is None
    assert status["log_path"].endswith("engine.log")


def test_hooks_status_json(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    where = ("--project", "--project-dir", str(project))
    before = json.loads(carl(tmp_path / "home", "hooks", "status", *where, "--json").stdout)
    assert before == {
        "scope": "project",
        "path": str(project / ".claude" / "settings.json"),
        "installed": False,
        "events": [],
    }
    assert carl(tmp_path / "home", "hooks", "install", *where).returncode == 0
    after = json.loads(carl(tmp_path / "home", "hooks", "status", *where, "--json").stdout)
    assert after["installed"] is True and "Stop" in after["events"]


def test_trajectories_list_and_status_json(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_jsonl(tmp_path / "projects" / "-home-dev-proj" / "s1.jsonl", claude_session())
    assert carl(home, "trajectories", "import", str(tmp_path / "projects")).returncode == 0
    listed = json_lines(carl(home, "trajectories", "list", "--json").stdout)
    assert len(listed) >= 1
    assert {
        "id",
        "session_id",
        "agent",
        "domain",
        "tool_count",
        "success_rate",
        "reward",
        "advantage",
        "holdout",
        "prompt",
    } == set(listed[0])
    assert listed[0]["agent"] == "claude-code" and isinstance(listed[0]["holdout"], bool)
    status = json.loads(carl(home, "trajectories", "status", "--json").stdout)
    assert status["trajectories"] == len(listed) and status["hook_payloads"] == 0
    assert isinstance(status["domains"], list) and isinstance(status["triggers"], list)
