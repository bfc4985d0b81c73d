"""Several nodes, without processes: what a node sends checked field by field (a hostile message is one line,
never a traceback), the engine's writer on a real store (each message once, however often it comes; a bad one
is a rejected row and the batch around it is stored), a node's console appended, cut back and rotated, a log
followed through rotation and truncation, a node lost after its timeout and live again, `[nodes]` of
engine.toml, and `carl node`'s one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_text import RAW_CONTROL, SHORT

from engine import paths
from engine.cli import main as carl
from engine.nodes import follow, writer
from engine.nodes.follow import FollowError, LogFollower
from engine.nodes.node_settings import DEFAULT_LOST_AFTER_S, load_nodes_settings
from engine.nodes.nodes_job import NodesJob
from engine.nodes.state import NodeState, NodeStateError
from engine.nodes.wire import (
    MAX_CONSOLE_BYTES,
    MAX_LINE_BYTES,
    MAX_MESSAGE_BYTES,
    Rejected,
    console_name,
    default_node_name,
    encode,
    node_name_problem,
    parse,
)
from engine.nodes.writer import Incoming, NodeWriter, append_lines
from engine.store import Store, StoreReader
from engine.system import Sampler

SAMPLE = {"t": 1_700_000_000.0, "cpu": 12.5, "cores": [10.0, 15.0], "load": [0.5, 0.4, 0.3], "mem_used": 1e9}


def message(node: str, kind: str, **body: object) -> Incoming:
    data = encode({"type": kind, "node": node, "host": f"{node}.example", **body})
    return Incoming(f"carl.nodes.{node}.{kind}", data)


def sample(node: str, t: float, cpu: float = 12.5) -> Incoming:
    return message(node, "sample", sample={**SAMPLE, "t": t, "cpu": cpu})


def console(node: str, n: int, lines: list[str], *, epoch: str = "e1", run: str | None = None) -> Incoming:
    return message(
        node,
        "console",
        console="train.log",
        source="/x/train.log",
        run=run,
        epoch=epoch,
        n=n,
        offset=0,
        lines=lines,
    )


# -- what a node sends, checked ------------------------------------------------------------------------------


def test_a_real_sample_and_hello_pass_and_name_their_node() -> None:
    real = Sampler().sample()
    parsed = parse(
        "carl.nodes.gpu-1.sample", encode({"type": "sample", "node": "gpu-1", "sample": real.to_json()})
    )
    assert parsed.node == "gpu-1" and parsed.sample is not None
    assert parsed.sample.scalars() == real.scalars()
    hello = parse(
        "carl.nodes.gpu-1.hello",
        encode(
            {
                "type": "hello",
                "node": "gpu-1",
                "host": "gpu-1.lab",
                "info": {
                    "cores": 8,
                    "memory": 2**34,
                    "platform": "Linux x86_64",
                    "gpus": [{"index": 0, "name": "H100"}],
                },
                "note": "no NVIDIA GPU: NVML not found",
                "surplus": "kept out",
            }
        ),
    )
    assert (
        hello.hello is not None
        and hello.hello.info["cores"] == 8
        and hello.hello.info["gpus"][0]["name"] == "H100"
    )
    assert hello.hello.note == "no NVIDIA GPU: NVML not found" and "surplus" not in hello.hello.info


@pytest.mark.parametrize(
    ("subject", "data", "reason"),
    [
        ("carl.nodes.n1", b"{}", "unknown subject"),
        ("carl.nodes.n1.reboot", b"{}", "unknown subject"),
        ("carl.nodes.n1.sample", b"x" * (MAX_MESSAGE_BYTES + 1), "too large: 262,145 bytes"),
        ("carl.nodes.n1.sample", b"{not json", "not JSON: "),
        ("carl.nodes.n1.sample", b"\xff\xfe{}", "not JSON: "),
        ("carl.nodes.n1.sample", b"[" * 100_000 + b"]" * 100_000, "not JSON: nested too deeply"),
        ("carl.nodes.n1.sample", b"[1, 2]", "expected a JSON object, not list"),
        ("carl.nodes.evil.sample", b'{"type": "sample", "node": "../../etc"}', "node: only letters, digits"),
        ("carl.nodes.evil.sample", b'{"type": "sample", "node": "a\\u001b[2Jb"}', "node: only letters"),
        ("carl.nodes.evil.sample", b'{"type": "sample", "node": 7}', "node: expected text, not int"),
        (
            "carl.nodes.evil.sample",
            b'{"type": "sample", "node": "n1"}',
            "node: 'n1', but the subject names 'evil'",
        ),
        (
            "carl.nodes.n1.sample",
            b'{"type": "hello", "node": "n1"}',
            "type: 'hello', but the subject says 'sample'",
        ),
        (
            "carl.nodes.n1.sample",
            b'{"type": "sample", "node": "n1"}',
            "sample: a sample is an object, not NoneType",
        ),
        (
            "carl.nodes.n1.sample",
            b'{"type": "sample", "node": "n1", "sample": {"t": 1, "cpu": -5}}',
            "sample: cpu: -5 is out of range",
        ),
        (
            "carl.nodes.n1.sample",
            b'{"type": "sample", "node": "n1", "sample": {"t": 1, "gpus": [{"index": 0, "util": "high"}]}}',
            "sample: gpus[0].util: expected a number",
        ),
        (
            "carl.nodes.n1.hello",
            b'{"type": "hello", "node": "n1", "info": {"cores": -1}}',
            "info.cores: expected",
        ),
        (
            "carl.nodes.n1.console",
            b'{"type": "console", "node": "n1", "console": "../x", "epoch": "e", "n": 1, "lines": ["a"]}',
            "console: expected a name",
        ),
        (
            "carl.nodes.n1.console",
            b'{"type": "console", "node": "n1", "console": "c", "epoch": "e", "n": 1,'
            b' "lines": ["a\\nforged"]}',
            "lines[0]: holds a line break",
        ),
        (
            "carl.nodes.n1.console",
            b'{"type": "console", "node": "n1", "console": "c", "epoch": "e", "n": 0, "lines": ["a"]}',
            "n: expected a whole number from 1",
        ),
    ],
)
def test_a_hostile_message_is_one_line_naming_what_is_wrong(subject: str, data: bytes, reason: str) -> None:
    with pytest.raises(Rejected) as caught:
        parse(subject, data)
    said = str(caught.value)
    assert said.startswith(reason) or reason in said, said
    assert "\n" not in said and len(said) <= 500


def test_node_and_console_names_are_data_never_paths() -> None:
    for bad in ("", "../x", "a/b", "a.b", "-x", "x" * 65, "é"):
        assert node_name_problem(bad) is not None, bad
    assert node_name_problem("gpu-node_3") is None
    assert node_name_problem(default_node_name()) is None
    taken: set[str] = set()
    first = console_name("train.log", taken)
    taken.add(first)
    assert (first, console_name("train.log", taken)) == ("train.log", "train.log-2")
    assert console_name("../../.bashrc", set()) == "bashrc"


# -- the engine's writer -------------------------------------------------------------------------------------


def test_a_batch_is_stored_with_its_bad_message_rejected_and_once_however_often_it_comes(
    store: Store, tmp_path: Path
) -> None:
    run_id = store.create_run("r1", source_kind="jsonl")
    batch = [
        message(
            "n1",
            "hello",
            info={"cores": 4, "memory": 2**33, "gpus": []},
            note="no NVIDIA GPU: NVML not found",
        ),
        sample("n1", 100.0),
        Incoming(
            "carl.nodes.n1.sample", b'{"type": "sample", "node": "n1", "sample": {"t": 101, "cpu": 1e300}}'
        ),
        sample("n1", 102.0),
        console("n1", 1, ["line 1", "\x1b[31mred\x1b[0m"], run="r1"),
        console("n1", 2, ["line 3"], run="r1"),
        sample("n2", 100.0),
    ]
    home = tmp_path / "home"
    nodes = NodeWriter(store, home)
    counts = nodes.write(batch)
    assert (counts.stored, counts.rejected, counts.repeats) == (6, 1, 0)
    again = nodes.write(batch)  # a batch committed and never acknowledged comes again after a kill
    assert (again.stored, again.rejected, again.repeats) == (6, 1, 2)

    reader = StoreReader(store.path)
    try:
        by_name = {n["name"]: n for n in reader.system.nodes()}
        assert by_name["n1"]["via"] == "nats" and by_name["n1"]["state"] == "live"
        assert by_name["n1"]["host"] == "n1.example" and by_name["n1"]["info"]["cores"] == 4
        assert by_name["n1"]["note"] == "no NVIDIA GPU: NVML not found"
        n1 = by_name["n1"]["id"]
        assert reader.system.series(n1, "cpu/percent", 0, 200).t == [100.0, 102.0]
        assert reader.system.now()[n1]["t"] == 102.0
        [consoles] = [reader.system.node_consoles(n1)]
        assert [c["lines"] for c in consoles] == [3] and consoles[0]["run_id"] == run_id
        [registered] = reader.system.run_consoles(run_id)
        assert (
            registered["kind"] == "node"
            and registered["node"] == "n1"
            and registered["path"] == consoles[0]["path"]
        )
        rejected = reader.system.node_rejected()
    finally:
        reader.close()
    rollup = store.conn.execute(
        "SELECT n FROM system_rollups WHERE node_id=? AND key='cpu/percent' AND width=60", (n1,)
    ).fetchall()
    assert sum(r[0] for r in rollup) == 2  # folded in once each
    assert Path(consoles[0]["path"]).read_text() == "line 1\n\x1b[31mred\x1b[0m\nline 3\n"
    assert Path(consoles[0]["path"]).is_relative_to(home / "nodes" / str(n1))
    assert [(r["node"], r["reason"]) for r in rejected] == [("n1", "sample: cpu: 1e+300 is out of range")] * 2
    assert json.loads(rejected[0]["payload"])["sample"]["t"] == 101


def test_a_node_cannot_take_the_engine_machines_name_nor_fill_the_store(store: Store, tmp_path: Path) -> None:
    store.system.node("box", host="box", via="local")
    nodes = NodeWriter(store, tmp_path)
    counts = nodes.write([sample("box", 1.0)])
    assert counts.rejected == 1 and "is the name of the engine's own machine" in counts.reasons[0]
    assert store.system.node_row("box") == (1, "local", "live")
    flood = [console("n1", 1, ["x"])] + [
        message("n1", "console", console=f"c{i}", epoch="e", n=1, lines=["x"]) for i in range(20)
    ]
    counts = nodes.write(flood)
    assert counts.stored == 16 and counts.rejected == 5
    assert "a node keeps 16 consoles at most" in counts.reasons[0]


def test_a_console_append_that_was_never_committed_is_cut_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "console-1.log"
    assert append_lines(path, 0, ["a", "b"]) == 4
    with open(path, "ab") as out:
        out.write(b"c\n")  # appended, then the engine was killed before the store said so
    assert append_lines(path, 4, ["c"]) == 6
    assert path.read_text() == "a\nb\nc\n"
    monkeypatch.setattr(writer, "CONSOLE_FILE_MAX", 8)
    assert append_lines(path, 6, ["d", "e"]) == 4  # rotated: the old file is kept as .1
    assert (tmp_path / "console-1.log.1").read_text() == "a\nb\nc\n" and path.read_text() == "d\ne\n"
    path.write_text("d\ne\nuncommitted\n")  # rotated again in a transaction that rolled back: a new file ...
    path.rename(tmp_path / "gone")
    path.write_text("x\n")  # ... shorter than the committed length: every byte of it is uncommitted
    assert append_lines(path, 4, ["f"]) == 2 and path.read_text() == "f\n"


def test_a_silent_node_is_lost_after_its_timeout_keeps_what_it_sent_and_is_live_when_it_speaks(
    store: Store, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "engine.toml").write_text("[nodes]\nlost_after_s = 0.5\n")
    local = store.system.node("box", host="box", via="local")
    nodes = NodeWriter(store, home)
    nodes.write([sample("n1", 10.0), sample("n2", 10.0)])
    job = NodesJob(store, home, plane_address=lambda: None)
    job.tick()
    assert {n["name"]: n["state"] for n in store.system.nodes()} == {
        "box": "live",
        "n1": "live",
        "n2": "live",
    }
    time.sleep(0.6)  # (a store's clock: lost_after_s of wall time must pass)
    nodes.write([sample("n2", 11.0)])
    job.next_lost_check = 0.0
    job.tick()
    states = {n["name"]: (n["state"], n["note"]) for n in store.system.nodes()}
    assert states["n1"] == (
        "lost",
        "no sample for 0.5 s (nothing reads the nodes' stream: no [nodes] url in engine.toml, and the agents"
        " plane is down)",
    )
    assert states["n2"] == ("live", None) and states["box"][0] == "live" and local == 1
    nodes.write([sample("n1", 12.0)])
    assert {n["name"]: n["state"] for n in store.system.nodes()}["n1"] == "live"
    n1 = store.system.node_row("n1")
    assert n1 is not None
    times = store.conn.execute(
        "SELECT t FROM system_samples WHERE node_id=? AND key='cpu/percent' ORDER BY t", (n1[0],)
    ).fetchall()
    assert [t for (t,) in times] == [10.0, 12.0]
    nodes.write([message("n1", "bye", reason="SIGTERM")])
    assert (
        store.system.nodes()[1]["state"] == "stopped"
        and store.system.nodes()[1]["note"] == "said bye (SIGTERM)"
    )
    job.close()
    assert store.kv("nodes.consumer")["state"] == "off"


# -- following a log -----------------------------------------------------------------------------------------


def test_a_log_is_followed_through_long_lines_bad_bytes_rotation_and_truncation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"one\r\ntwo \xff\xfe\n" + b"x" * (MAX_LINE_BYTES + 10) + b"\nunfinished")
    follower = LogFollower(log)
    first = follower.read()
    assert first is not None and first.lines[:2] == ["one", "two \ufffd\ufffd"]
    assert [len(p) for p in first.lines[2:]] == [MAX_LINE_BYTES, 10]
    assert first.offset == 0 and first.end == log.stat().st_size - len("unfinished")
    assert follower.read() is None  # the unfinished last line waits for its newline ...
    monkeypatch.setattr(follow, "PARTIAL_WAIT_S", 0.0)
    tail = follower.read()  # ... or until it has sat long enough
    assert tail is not None and tail.lines == ["unfinished"]

    with open(log, "ab") as out:
        out.write(b"\nafter\n")
    assert follower.read().lines == ["", "after"]  # type: ignore[union-attr]
    log.rename(tmp_path / "train.log.1")
    with open(tmp_path / "train.log.1", "ab") as out:
        out.write(b"last of the old\n")
    log.write_bytes(b"new file\n")
    assert follower.read().lines == ["last of the old"]  # type: ignore[union-attr]
    fresh = follower.read()
    assert fresh is not None and fresh.lines == ["new file"] and fresh.offset == 0
    assert any("rotated" in note for note in follower.notes)
    log.write_bytes(b"cut\n")  # truncated, same file
    log.write_bytes(b"c\n")
    again = follower.read()
    assert again is not None and again.lines == ["c"] and any("truncated" in n for n in follower.notes)
    follower.close()


def test_a_message_stays_bounded_whatever_the_log_holds(tmp_path: Path) -> None:
    log = tmp_path / "noise.log"
    log.write_bytes(b"\x1b" * 200_000 + b"\n" + b"\n" * 5000)
    follower = LogFollower(log)
    while (chunk := follower.read()) is not None:
        assert chunk.end - chunk.offset <= MAX_CONSOLE_BYTES
        data = encode(
            {"type": "console", "node": "n", "console": "c", "epoch": "e", "n": 1, "lines": chunk.lines}
        )
        assert len(data) < MAX_MESSAGE_BYTES
        parse("carl.nodes.n.console", data)
    assert follower.offset == log.stat().st_size


def test_a_fifo_or_a_missing_log_is_one_line_and_a_big_log_starts_near_its_end(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(FollowError, match="a FIFO"):
        LogFollower(fifo).read()
    with pytest.raises(FollowError, match="no such file"):
        LogFollower(tmp_path / "nothing.log").read()
    big = tmp_path / "big.log"
    line = b"y" * 99 + b"\n"
    big.write_bytes(line * (follow.FIRST_READ_MAX // 100 + 1000))
    follower = LogFollower(big)
    chunk = follower.read()
    skip = big.stat().st_size - follow.FIRST_READ_MAX
    assert chunk is not None and chunk.offset == -(-skip // len(line)) * len(line)  # the next line's start
    assert chunk.lines[0] == "y" * 99 and "are not sent" in follower.notes[0]
    follower.close()


# -- settings and the command line ---------------------------------------------------------------------------


def test_nodes_settings_and_their_one_line_problems(tmp_path: Path) -> None:
    assert load_nodes_settings(tmp_path) == (load_nodes_settings(tmp_path)[0], [])
    (tmp_path / "engine.toml").write_text(
        '[nodes]\nurl = "nats://10.0.0.5:4222"\ntoken_file = "nodes.token"\nlost_after_s = 10\n'
    )
    settings, problems = load_nodes_settings(tmp_path)
    assert problems == [] and settings.url == "nats://10.0.0.5:4222" and settings.lost_after_s == 10.0
    assert settings.token_file == str(tmp_path / "nodes.token")
    (tmp_path / "engine.toml").write_text(
        '[nodes]\nurl = "http://x"\nlost_after_s = -1\nenabled = "yes"\ncolour = 1\n'
    )
    settings, problems = load_nodes_settings(tmp_path)
    assert settings.url is None and settings.lost_after_s == DEFAULT_LOST_AFTER_S and settings.enabled
    assert [p.split(":")[1].strip() for p in problems] == [
        "nodes.colour",
        "nodes.url",
        "nodes.lost_after_s",
        "nodes.enabled",
    ]
    assert all(p.startswith("engine.toml: ") and "\n" not in p for p in problems)


def test_carl_node_says_what_is_wrong_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = ["--home", str(tmp_path / "home")]
    assert carl([*home, "node"]) == 2
    assert (
        capsys.readouterr().err == "carl: node: give --join URL (the NATS server to publish to), or --list\n"
    )
    assert carl([*home, "node", "--join", "http://x:1"]) == 2
    assert (
        "carl: --join: 'http://x:1' is not a nats:// (or tls://, ws://) URL with a host"
        in capsys.readouterr().err
    )
    assert (
        carl([*home, "node", "--join", "nats://127.0.0.1:4222", "--token-file", str(tmp_path / "none")]) == 2
    )
    assert "--token-file: " in capsys.readouterr().err
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert carl([*home, "node", "--join", "nats://127.0.0.1:4222", "--log", str(fifo)]) == 2
    assert "a FIFO (named pipe), not a log file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        carl([*home, "node", "--join", "nats://127.0.0.1:4222", "--name", "../etc"])
    assert "only letters, digits" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        carl([*home, "node", "--join", "nats://127.0.0.1:4222", "--interval", "0"])
    assert "expected seconds from 0.1 to 3600" in capsys.readouterr().err
    assert carl([*home, "node", "--list"]) == 2
    assert "no store here" in capsys.readouterr().err
    Store(paths.db_path(tmp_path / "home")).close()
    assert carl([*home, "node", "--list"]) == 0
    assert capsys.readouterr().out.startswith("the engine reads no nodes")


def test_a_second_node_of_the_same_name_and_home_refuses_to_start(tmp_path: Path) -> None:
    first = NodeState(tmp_path, "n1").acquire()
    try:
        with pytest.raises(NodeStateError, match="another carl node named 'n1' runs with this home"):
            NodeState(tmp_path, "n1").acquire()
        NodeState(tmp_path, "n2").acquire().release()  # another name: its own state
    finally:
        first.release()
    NodeState(tmp_path, "n1").acquire().release()


@pytest.mark.slow
def test_carl_node_list_prints_what_a_hostile_node_sent_as_visible_text(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Store(paths.db_path(home)) as store:
        nodes = NodeWriter(store, home)
        nodes.write(
            [
                Incoming("carl.nodes.x.sample", encode({"type": "sample", "node": f"a{SHORT}b"})),
                Incoming(f"carl.nodes.{SHORT}.sample", b"{}"),
                sample("n1", 1.0),
            ]
        )
        assert len(store.system.nodes()) == 1
    result = subprocess.run(
        [sys.executable, "-m", "engine.cli", "--home", str(home), "node", "--list"],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0 and b"Traceback" not in result.stderr
    shown = result.stdout.decode()
    assert RAW_CONTROL.findall(shown) == [] and "\\x1b]52" in shown and "n1" in shown
