"""Hostile input, issue 22: text that cannot be encoded (§2), numbers out of range (§3), names that would be
paths (§6), configs that gave a traceback (§7), a flood of metric keys and imports that import nothing (§10).

Every test feeds a real file (or a real command line) to the real reader: bad input is one line naming what
and where, never a traceback, and what was good beside it is stored.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_trajectory_import import CODEX_ID, claude_session, codex_rollout, published_session, write_jsonl

from engine.cli import main as carl_main
from engine.limits import COUNT_MAX, BoundError, bounded_int, int_text
from engine.names import MAX_NAME, InvalidName, as_name, valid_name
from engine.observe import observe
from engine.observe.runkeys import KEYS_CAPPED, MAX_KEYS
from engine.store import Store
from engine.text import loads_storable, storable
from engine.trajectories.importers.trace_files import import_paths


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))  # `carl --home` sets it: restored after the test
    return tmp_path / "home"


def carl(home: Path, *args: str) -> int:
    return carl_main(["--home", str(home), *args])


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def text_lines(lines: list[Any]) -> str:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)


# -- the shared helpers --------------------------------------------------------------------------------------


def test_storable_text() -> None:
    """§2: lone surrogates (a JSON escape, a file name that was not UTF-8) become U+FFFD; the rest is kept."""
    assert storable("ok ☃") == "ok ☃"
    assert storable("a\ud800b\udcffc") == "a\ufffdb\ufffdc"
    value = loads_storable('{"k\\ud800": ["\\udfff", {"x": "\\uD83D\\uDE00"}], "n": 1}')
    assert value == {"k\ufffd": ["\ufffd", {"x": "😀"}], "n": 1}  # a real pair stays the character it is
    json.dumps(value).encode("utf-8")
    sqlite3.connect(":memory:").execute("SELECT ?", (json.dumps(value, ensure_ascii=False),))


def test_bounded_integers() -> None:
    """§3: bool is not an int, a float only when integral, 2**63, NaN, inf and text refused, naming the
    field."""
    assert bounded_int(3.0, "x") == 3 and bounded_int(2**63 - 1, "x") == 2**63 - 1
    for bad, why in (
        (True, "expected an integer from 1 to 10, not True"),
        (2.5, "expected an integer from 1 to 10, not 2.5"),
        (float("nan"), "expected an integer from 1 to 10, not nan"),
        ("5", "expected an integer from 1 to 10, not '5'"),
        (11, "11 is out of range (1 to 10)"),
        (2**100_000, "a 100001-bit integer is out of range (1 to 10)"),
    ):
        with pytest.raises(BoundError) as refused:
            bounded_int(bad, "steps", 1, 10)
        assert str(refused.value) == f"steps: {why}"
    assert int_text("9223372036854775807") == 2**63 - 1
    assert (
        int_text("9223372036854775808") is None and int_text("9" * 5000) is None and int_text("1e3") is None
    )


def test_valid_and_imported_names() -> None:
    """§6: a name is printable, at most 128 characters, with no path separator; a 50 MB name is refused at
    once; a name a foreign tool recorded is made one."""
    assert valid_name("run-1 (lr 1e-3)", "name") == "run-1 (lr 1e-3)"
    for bad, why in (
        ("../../../../elsewhere/x", "contains a path separator (/ or \\)"),
        ("a\\b", "contains a path separator (/ or \\)"),
        ("..", "'..' is not a name"),
        ("a\x1b[2Jb", "contains a control or unprintable character"),
        ("x" * (50 << 20), f"{50 << 20:,} characters long (at most {MAX_NAME})"),
        ("", "empty"),
    ):
        with pytest.raises(InvalidName) as refused:
            valid_name(bad, "name")
        assert str(refused.value) == f"name: {why}"
    assert as_name("a\ud800\x1bb" + "c" * 500) == "a\ufffd b" + "c" * (MAX_NAME - 4)
    assert as_name("..") == "run" and as_name("out/run-1") == "out/run-1"


# -- §2 text that cannot be encoded --------------------------------------------------------------------------


def test_one_bad_transcript_costs_nothing_beside_it(home: Path, tmp_path: Path) -> None:
    """§2: a lone surrogate in a prompt and a session id raised UnicodeEncodeError at insert, after every file
    was parsed: the whole import was lost. Now the text is made storable where it is read."""
    folder = tmp_path / "projects"
    bad = text_lines(claude_session())
    bad = bad.replace("Fix the failing parser test", "Fix \\ud800 the test").replace(
        '"sessionId": "5f1c', '"sessionId": "\\udc805f1c'
    )
    (folder / "bad.jsonl").parent.mkdir(parents=True)
    (folder / "bad.jsonl").write_text(bad)
    good = [dict(line, sessionId="other") if isinstance(line, dict) else line for line in claude_session()]
    write_jsonl(folder / "good.jsonl", good)
    assert carl(home, "trajectories", "import", str(folder)) == 0
    with Store(home / "carl.db") as store:
        prompts = [r[0] for r in store.conn.execute("SELECT prompt FROM trajectories ORDER BY prompt")]
        sessions = {r[0] for r in store.conn.execute("SELECT session_id FROM trajectories")}
    assert len(prompts) == 6 and "Fix \ufffd the test" in prompts
    assert "other" in sessions and any(s.startswith("\ufffd5f1c") for s in sessions)


def test_a_file_name_that_is_not_utf8(home: Path, tmp_path: Path) -> None:
    """§2: a transcript whose name is not UTF-8 is imported; its source is kept with U+FFFD."""
    folder = tmp_path / "projects"
    folder.mkdir()
    name = os.fsdecode(b"sess\xff.jsonl")
    (folder / name).write_text(text_lines(claude_session()))
    result = import_paths([folder])
    assert len(result.trajectories) == 3
    assert {t.source for t in result.trajectories} == {str(folder / "sess\ufffd.jsonl")}
    assert all(t.session_id == "5f1c2a9e-0d6b-4c1e-9a43-7e2b1f0c8d11" for t in result.trajectories)


def test_observed_text_is_stored_not_dropped(store: Store, tmp_path: Path) -> None:
    """§2: a key holding a lone surrogate was dropped; a run named by a file that is not UTF-8 raised at
    insert."""
    log = tmp_path / "m.jsonl"
    log.write_text('{"step": 1, "lo\\ud800ss": 1.0, "ok": 2.0}\n')
    _, result = observe(store, log, name=None)
    keys = {r[0] for r in store.conn.execute("SELECT key FROM metrics")}
    assert result.rows == 2 and keys == {"lo\ufffdss", "ok"}
    odd = tmp_path / os.fsdecode(b"odd\xfe.jsonl")
    odd.write_text('{"step": 1, "loss": 1.0}\n')
    from engine.observe import ObserveError

    with pytest.raises(ObserveError, match="the path is not valid UTF-8, so it cannot be kept; rename it$"):
        observe(store, odd)


def test_a_dataset_prompt_with_a_lone_surrogate(tmp_path: Path) -> None:
    """§2: a dataset's \\ud800 escape reached the store mid-training (samples, rollouts); now it is
    storable."""
    from engine.training.data import load_rows

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "say \\ud800", "reference": "x"}\n')
    assert load_rows(str(data), 0) == [{"prompt": "say \ufffd", "reference": "x"}]


# -- §3 numbers out of range ---------------------------------------------------------------------------------


def test_huge_integers_in_observed_files(home: Path, tmp_path: Path) -> None:
    """§3: a vocab_size >= 2**63 in a JSONL line, and in a config.json beside trainer_state.json (with
    max_steps 2**64), raised OverflowError at insert. They are ignored; the metrics are imported."""
    log = tmp_path / "m.jsonl"
    write_jsonl(log, [{"step": 1, "entropy": 1.0, "vocab_size": 2**63}, {"step": 2**63, "loss": 1.0}])
    assert carl(home, "observe", str(log)) == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "trainer_state.json").write_text(
        json.dumps({"max_steps": 2**64, "log_history": [{"step": 1, "loss": 1}]})
    )
    (out / "config.json").write_text(json.dumps({"vocab_size": 2**63}))
    assert carl(home, "observe", str(out)) == 0
    with Store(home / "carl.db") as store:
        runs = store.conn.execute("SELECT vocab_size, max_steps FROM runs ORDER BY id").fetchall()
        assert runs == [(None, None), (None, None)]
        assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 2


def trackio_db(path: Path, steps: list[Any], config: dict[str, Any]) -> Path:
    """A Trackio project database (its schema 2: run ids beside names) holding one run with these steps."""
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE metrics (id INTEGER PRIMARY KEY AUTOINCREMENT, timestamp TEXT, run_id TEXT,"
        " run_name TEXT, step INTEGER, metrics TEXT)"
    )
    conn.execute(
        "CREATE TABLE configs (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, run_name TEXT, config TEXT,"
        " created_at TEXT)"
    )
    conn.execute(  # a run name that is not UTF-8: read as text all the same
        "INSERT INTO configs (run_id, run_name, config) VALUES ('r1', CAST(x'72756eff' AS TEXT), ?)",
        (json.dumps(config),),
    )
    for i, step in enumerate(steps):
        conn.execute(
            "INSERT INTO metrics (timestamp, run_id, run_name, step, metrics) VALUES (?, 'r1', 'run', ?, ?)",
            ("2026-01-01T00:00:00", step, json.dumps({"loss": float(i)})),
        )
    conn.commit()
    conn.close()
    return path


def test_trackio_steps_that_are_not_integers(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """§3: a text, NaN or inf step in a Trackio database (and a config's vocab_size >= 2**63) raised
    ValueError or OverflowError. Each bad row is one line; the good rows are imported."""
    db = trackio_db(
        tmp_path / "project.db",
        [1, "abc", float("inf"), 2**63 - 1, 3],
        {"vocab_size": 2**63, "max_steps": 2**64},
    )
    assert carl(home, "observe", str(db)) == 0
    err = capsys.readouterr().err
    assert (
        "metrics row 2: step 'abc' is not an integer" in err
        and "metrics row 3: step inf is not an integer" in err
    )
    with Store(home / "carl.db") as store:
        steps = [r[0] for r in store.conn.execute("SELECT step FROM metrics ORDER BY step")]
        run = store.conn.execute("SELECT name, vocab_size, max_steps FROM runs").fetchone()
    assert steps == [1, 3, 2**63 - 1] and run == ("run\ufffd", None, None)


def test_exit_codes_past_32_bits_in_transcripts(home: Path, tmp_path: Path) -> None:
    """§3: an exit code >= 2**63 (Codex metadata, Claude Code's 'Exit code N' text) raised OverflowError when
    the import was saved, losing every file. A code that is no exit code is unknown; the rest is kept."""
    codex = codex_rollout()
    for line in codex:
        payload = line.get("payload", {}) if isinstance(line, dict) else {}
        if isinstance(payload.get("output"), str):
            payload["output"] = payload["output"].replace('"exit_code": 1', f'"exit_code": {2**63}')
            payload["output"] = payload["output"].replace("Exit code: 2\n", f"Exit code: {'9' * 30}\n")
    write_jsonl(tmp_path / "codex" / f"rollout-2026-03-01T09-00-00-{CODEX_ID}.jsonl", codex)
    claude = text_lines(claude_session()).replace("Exit code 1", f"Exit code {'9' * 5000}")
    (tmp_path / "claude").mkdir()
    (tmp_path / "claude" / "s.jsonl").write_text(claude)
    karl = published_session(1, ["Bash", "Read"], failed={0})
    karl["trajectory"]["events"][0]["exit_code"] = 2**63
    write_jsonl(tmp_path / "karl" / "k.jsonl", [karl])
    folders = [str(tmp_path / kind) for kind in ("codex", "claude", "karl")]
    assert carl(home, "trajectories", "import", *folders) == 0
    with Store(home / "carl.db") as store:
        codes = {r[0] for r in store.conn.execute("SELECT exit_code FROM trajectory_events")}
        agents = {r[0] for r in store.conn.execute("SELECT agent FROM trajectories")}
    assert agents == {"codex", "claude-code", "karl"} and max(c for c in codes if c is not None) < 2**31


@pytest.mark.parametrize(
    ("yaml_text", "line"),
    [
        ("max_steps: true\n", "max_steps: Input should be a valid integer, not True"),
        ("max_steps: 1.0e+29\n", f"max_steps: Input should be less than or equal to {COUNT_MAX}"),
        ("max_steps: '5'\n", "max_steps: Input should be a valid integer, not '5'"),
        ("seed: 99999999999999999999999\n", "seed: Input should be less than or equal to 4294967295"),
        ("learning_rate: .inf\n", "learning_rate: Input should be a finite number"),
        ("learning_rate: true\n", "learning_rate: Input should be a valid number, not True"),
        ("lora: {r: 9223372036854775808}\n", f"lora.r: Input should be less than or equal to {COUNT_MAX}"),
    ],
)
def test_config_numbers_are_numbers(tmp_path: Path, yaml_text: str, line: str) -> None:
    """§3/§7: `max_steps: true` was taken as 1 and `max_steps: 1e29` reached SQLite; each is one line now."""
    from engine.training.config import ConfigError, load_config

    path = tmp_path / "carl.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == f"{path}: {line}"
    path.write_text("max_steps: 3.0\n")  # an integral float is an integer
    assert load_config(path).max_steps == 3


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--max-steps", str(2**63)],
        ["train", "--processes", "0"],
        ["observe", "x.jsonl", "--vocab-size", str(2**64)],
        ["trajectories", "list", "--limit", str(2**63)],
        ["demo", "--steps", "-1"],
    ],
)
def test_integer_flags_are_bounded(home: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """§3: an integer flag out of range reached the store (OverflowError); argparse says so in its usage
    line."""
    with pytest.raises(SystemExit) as exited:
        carl(home, *argv)
    assert exited.value.code == 2
    assert "is out of range" in capsys.readouterr().err


def test_a_port_above_65535(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """§3: a NATS URL with a port past 65535 raised ValueError deep in the client; now the setting is
    refused."""
    from engine.agents.plane_settings import AgentsConfigError, load_settings

    path = tmp_path / "agents.yaml"
    path.write_text("agents:\n  url: nats://127.0.0.1:99999\n")
    with pytest.raises(AgentsConfigError) as refused:
        load_settings(path)
    assert str(refused.value) == (
        f"{path}:2: agents.url: 'nats://127.0.0.1:99999': the port must be a number from 1 to 65535"
    )
    from carl_tui.launch import tui_main

    with pytest.raises(SystemExit):
        tui_main(["--serve", "--port", "70000"])
    assert "70000 is out of range (0 to 65535)" in capsys.readouterr().err


# -- §6 a name becomes a path --------------------------------------------------------------------------------


def test_a_run_name_never_makes_a_path(tmp_path: Path) -> None:
    """§6: a run named `../../../../elsewhere/x` wrote its checkpoints outside CARL_HOME; a run's directory
    comes from its id now, and such a name is refused where it enters (config, --name)."""
    from engine.training.config import ConfigError, TrainConfig, load_config
    from engine.training.lifecycle import open_run

    home = tmp_path / "home"
    path = tmp_path / "carl.yaml"
    path.write_text("name: ../../../../elsewhere/x\n")
    with pytest.raises(ConfigError, match=r"name: contains a path separator \(/ or \\\)$"):
        load_config(path)
    with Store(home / "carl.db") as store:
        old = store.create_run("old", source_kind="carl")
        store.update_run(old, output_dir=str(home / "runs" / "old"))  # as runs were laid out before
        run_id, output_dir = open_run(store, TrainConfig(name="x"), home, "..", None)
        assert output_dir == home / "runs" / f"{run_id}-run" and output_dir.parent == home / "runs"
        run_id, output_dir = open_run(store, TrainConfig(name="mine"), home, None, None)
        assert output_dir == home / "runs" / f"{run_id}-mine"
        assert store.run(old)["output_dir"] == str(
            home / "runs" / "old"
        )  # an existing run keeps its directory


def test_a_name_flag_that_is_a_path(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """§6: `--name ../../x` was taken as given."""
    for argv in (["train", "--name", "../../x"], ["observe", "x.jsonl", "--name", "a/b"]):
        with pytest.raises(SystemExit):
            carl(home, *argv)
        assert "contains a path separator" in capsys.readouterr().err


# -- §7 configs that gave a traceback ------------------------------------------------------------------------


# Each level repeats the one before ten times: a million values from a file of a few hundred bytes.
ALIAS_BOMB = b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
    b"a%d: &a%d [" % (i, i) + b", ".join([b"*a%d" % (i - 1)] * 10) + b"]\n" for i in range(1, 6)
)


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"name: \xff\xfe\n", "not UTF-8 text (byte 6 is 0xff)"),
        (b"a: " + b"[" * 50_000 + b"]" * 50_000 + b"\n", "invalid YAML: nested too deeply"),
        (
            b"a:" + b"".join(b"\n" + b"  " * i + b"k:" for i in range(1, 60)) + b" 1\n",
            "nested deeper than 32 levels",
        ),
        (ALIAS_BOMB, "more than 100,000 values (YAML aliases expanding?)"),
    ],
)
def test_configs_that_gave_a_traceback(tmp_path: Path, content: bytes, line: str) -> None:
    """§7: invalid UTF-8 YAML (UnicodeDecodeError), deeply nested YAML (RecursionError) and an alias bomb."""
    from engine.training.config import ConfigError, load_config

    path = tmp_path / "carl.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == f"{path}: {line}"


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (
            '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "d.jsonl:1: not readable JSON (nested too deeply)",
        ),
        ('{"prompt": 5}\n', "d.jsonl:1: 'prompt' is int, not text or a list of messages"),
        (
            '{"prompt": "ok"}\n{"prompt": [{"role": "user"}]}\n',
            "d.jsonl:2: 'prompt'[0] is not a message (an object with a 'content')",
        ),
        ('{"prompt": null}\n', "d.jsonl:1: 'prompt' is NoneType, not text or a list of messages"),
    ],
)
def test_datasets_that_gave_a_traceback(tmp_path: Path, content: str, line: str) -> None:
    """§7: deeply nested dataset JSON (RecursionError) and a prompt that is not text failed mid-training."""
    from engine.training.backend import BadInput
    from engine.training.data import load_rows

    path = tmp_path / "d.jsonl"
    path.write_text(content)
    with pytest.raises(BadInput) as refused:
        load_rows(str(path), 0)
    assert str(refused.value) == f"dataset {tmp_path}/{line}"


def test_an_output_dir_that_is_a_file(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """§7: an output_dir that is a file raised FileExistsError with a traceback; now the run fails with one
    line."""
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("mine")
    config = tmp_path / "carl.yaml"
    config.write_text(f"output_dir: {in_the_way}\nmax_steps: 1\n")
    assert carl(home, "train", "--config", str(config)) == 2
    assert one_line(capsys.readouterr().err) == (
        f"carl train: output_dir {in_the_way}: a regular file, not a directory"
    )
    assert in_the_way.read_text() == "mine"
    with Store(home / "carl.db") as store:
        assert store.conn.execute("SELECT status, error FROM runs").fetchone() == (
            "failed",
            f"output_dir {in_the_way}: a regular file, not a directory",
        )


# -- §10 a flood of keys; imports that import nothing --------------------------------------------------------


def test_distinct_keys_are_capped_per_run(store: Store, tmp_path: Path) -> None:
    """§10: one line with 60k distinct keys took 22 s of engine time. A run keeps MAX_KEYS keys, says so once
    (in the result and an event on the run), and keeps importing the keys it has."""
    log = tmp_path / "m.jsonl"
    flood = {f"k{i:05d}": 1.0 for i in range(MAX_KEYS + 1000)}
    write_jsonl(
        log,
        [{"step": 1, **flood}, {"step": 2, "k00000": 2.0, "new": 1.0, **{f"z{i}": 1.0 for i in range(5)}}],
    )
    _, result = observe(store, log)
    keys = store.conn.execute("SELECT count(DISTINCT key) FROM metrics").fetchone()[0]
    assert keys == MAX_KEYS
    assert store.conn.execute("SELECT value FROM metrics WHERE key='k00000' AND step=2").fetchone() == (2.0,)
    events = store.conn.execute("SELECT detail FROM events WHERE kind=?", (KEYS_CAPPED,)).fetchall()
    assert len(events) == 1 and events[0][0].startswith(f"more than {MAX_KEYS:,} distinct metric keys")
    assert [p for p in result.problems if "distinct metric keys" in p] == [f"run 1: {events[0][0]}"]


def test_an_import_of_nothing_is_not_a_success(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """§10: exit status was 0 when a non-empty input imported nothing; now 2, with one line saying why."""
    log = tmp_path / "m.jsonl"
    write_jsonl(log, [{"x": "y"}, {"step": "z"}])
    assert carl(home, "observe", str(log)) == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == f"carl: {log}: nothing imported (m.jsonl:1: no step)"
    )
    folder = tmp_path / "logs"
    write_jsonl(folder / "a.jsonl", [{"step": "bad", "loss": 1.0}])
    assert carl(home, "observe", str(folder)) == 2  # the only log in it gave nothing
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(f"carl: nothing could be read from {folder}")
    )
    write_jsonl(folder / "b.jsonl", [{"step": 1, "loss": 1.0}])
    assert carl(home, "observe", str(folder)) == 0  # one log of two: imported, and the other one named
    assert "a.jsonl: nothing imported" in capsys.readouterr().err
    (tmp_path / "unknown").mkdir()
    write_jsonl(tmp_path / "unknown" / "x.jsonl", [{"a": 1}])
    assert carl(home, "trajectories", "import", str(tmp_path / "unknown")) == 2
    assert capsys.readouterr().err.strip() == "carl: nothing imported: 1 file(s) or line(s) skipped"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert carl(home, "observe", str(empty)) == 0  # an empty log is one about to be written
