"""Hostile input, issue 22: paths that are not files (§4), and SQLite files that are not ours (§9).

Each test uses the real thing: a FIFO made with os.mkfifo (the call under test runs in a thread, so a read
that blocks fails the test instead of hanging it), a real symbolic link loop, a real foreign SQLite file whose
bytes are compared before and after. Every failure is one line naming the path, never a hang or a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_trajectory_import import claude_session, write_jsonl

from engine.cli import main as carl_main
from engine.files import FileKindError, is_regular, open_regular, read_regular, regular_file, resolved
from engine.observe import ObserveError, detect_kind, observe
from engine.observe.discover import discover
from engine.store import Store, StoreError, StoreReader
from engine.trajectories.importers.trace_files import import_paths
from engine.yamlfile import read_mapping


def no_hang(fn: Callable[[], Any], *fifos: Path, timeout: float = 20.0) -> Any:
    """`fn()` in a thread; if it is still running after `timeout`, it is blocked on a FIFO: open each FIFO for
    writing once (which lets the reader go) and fail."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the test's thread)
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        for fifo in fifos:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
        raise AssertionError(f"blocked on a FIFO: {', '.join(map(str, fifos))}")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def carl(home: Path, *args: str) -> int:
    return no_hang(lambda: carl_main(["--home", str(home), *args]), *[Path(a) for a in args if "fifo" in a])


def one_line(text: str) -> str:
    """The only line of `text` (the test fails on a traceback or several lines)."""
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CARL_HOME", str(tmp_path / "home"))  # `carl --home` sets it: restored after the test
    return tmp_path / "home"


@pytest.fixture
def loop(tmp_path: Path) -> Path:
    """A symbolic link loop: a -> b -> a."""
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    return tmp_path / "loop-a"


# -- the shared helpers --------------------------------------------------------------------------------------


def test_the_file_helpers_refuse_by_type_before_opening(tmp_path: Path, loop: Path) -> None:
    """§4: a FIFO, a device, a directory and a loop are each one line; a FIFO is never opened."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    good = tmp_path / "good.txt"
    good.write_text("hello")
    kinds = {fifo: "a FIFO (named pipe)", Path("/dev/null"): "a character device", tmp_path: "a directory"}
    for path, kind in kinds.items():
        with pytest.raises(FileKindError) as refused:
            no_hang(lambda p=path: open_regular(p), fifo)
        assert str(refused.value) == f"{path}: {kind}, not a regular file"
        assert not is_regular(path)
    with pytest.raises(FileKindError, match="a symbolic link loop$"):
        regular_file(loop)
    with pytest.raises(FileKindError, match="a symbolic link loop$"):
        resolved(loop)
    with pytest.raises(FileKindError, match="larger than 3 bytes"):
        read_regular(good, limit=3)
    assert read_regular(good) == b"hello" and is_regular(good)


# -- carl observe --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["metrics.jsonl", "fifo", "trainer_state.json", "events.out.tfevents.1.host"]
)
def test_a_fifo_given_to_carl_observe_is_one_line(
    home: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """§4: `carl observe FIFO` hung for ever (whatever its name says it is)."""
    fifo = tmp_path / "fifo-dir" / name
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    assert no_hang(lambda: carl_main(["--home", str(home), "observe", str(fifo)]), fifo) == 2
    assert one_line(capsys.readouterr().err) == f"carl: {fifo}: a FIFO (named pipe), not a file to import"


def test_a_symlink_loop_given_to_carl_observe_is_one_line(
    home: Path, loop: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """§4: a symbolic link loop raised RuntimeError('Symlink loop') with a traceback."""
    assert carl(home, "observe", str(loop)) == 2
    assert one_line(capsys.readouterr().err) == f"carl: {loop}: a symbolic link loop"
    with pytest.raises(ObserveError, match="a symbolic link loop$"):
        detect_kind(loop)


def test_a_fifo_config_json_beside_trainer_state_is_skipped(home: Path, tmp_path: Path) -> None:
    """§4: a FIFO config.json beside trainer_state.json hung `carl observe DIR` (|V| is looked for there)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 1.0}]}))
    os.mkfifo(out / "config.json")
    assert carl(home, "observe", str(out)) == 0
    with Store(home / "carl.db") as store:
        assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 1


def test_a_fifo_trainer_state_in_a_folder_is_not_taken_for_one(tmp_path: Path) -> None:
    """§4: discovery's walk and the trainer_state reader never open a FIFO named trainer_state.json (this held
    already; kept as a guard beside the cases that hung)."""
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    os.mkfifo(run / "trainer_state.json")
    write_jsonl(tmp_path / "runs" / "b" / "metrics.jsonl", [{"step": 1, "loss": 1.0}])
    found = no_hang(lambda: discover(tmp_path / "runs"), run / "trainer_state.json")
    assert [r.main.kind for r in found.runs] == ["jsonl"]


def test_a_fifo_jsonl_inside_a_folder_given_to_observe(home: Path, tmp_path: Path) -> None:
    """§4: discovery skips a FIFO named like a log; the good log beside it is imported (held already: a
    guard)."""
    folder = tmp_path / "logs"
    write_jsonl(folder / "good.jsonl", [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}])
    os.mkfifo(folder / "fifo.jsonl")
    assert carl(home, "observe", str(folder)) == 0
    with Store(home / "carl.db") as store:
        assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 2


def test_a_log_swapped_for_a_fifo_while_followed(store: Store, tmp_path: Path) -> None:
    """§4: the JSONL reader checks the type on every batch: a followed log replaced by a FIFO is one line."""
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1, "loss": 1.0}\n')
    observe(store, log, follow=True)
    log.unlink()
    os.mkfifo(log)
    from engine.observe import ingest_source

    with pytest.raises(ObserveError, match="a FIFO .named pipe., not a JSONL file$"):
        no_hang(lambda: ingest_source(store, 1), log)


def test_a_fifo_inside_an_mlruns_tree_is_refused(store: Store, tmp_path: Path) -> None:
    """§4: MLflow's file store opens whatever its tree holds; a FIFO there is refused before MLflow runs."""
    from engine.observe.mlflow_store import check_files

    metrics = tmp_path / "mlruns" / "0" / "abc" / "metrics"
    metrics.mkdir(parents=True)
    (tmp_path / "mlruns" / "0" / "meta.yaml").write_text("name: x\n")
    os.mkfifo(metrics / "loss")
    with pytest.raises(ObserveError, match="loss: a FIFO .named pipe. inside the MLflow store"):
        check_files(tmp_path / "mlruns")


def test_an_event_file_swapped_for_a_fifo(store: Store, tmp_path: Path) -> None:
    """§4: TensorBoard's reader never opens an event file that is not a regular file."""
    from engine.observe.reader_base import Budget
    from engine.observe.tensorboard import EventBatch

    fifo = tmp_path / "events.out.tfevents.1.host"
    os.mkfifo(fifo)
    batch = EventBatch({"id": 1, "follow": 0}, Budget(100, 1.0), {})
    assert no_hang(lambda: batch.read_file(fifo, fifo.name, ""), fifo) is True
    assert batch.result.problems == [f"{fifo.name}: a FIFO (named pipe), not an event file"]


# -- carl trajectories import --------------------------------------------------------------------------------


def test_a_fifo_among_transcripts_is_skipped_and_the_rest_imported(tmp_path: Path) -> None:
    """§4: a FIFO *.jsonl inside a folder given to `trajectories import` hung the import for ever."""
    folder = tmp_path / "projects"
    write_jsonl(folder / "session.jsonl", claude_session())
    os.mkfifo(folder / "blocked.jsonl")
    result = no_hang(lambda: import_paths([folder]), folder / "blocked.jsonl")
    assert len(result.trajectories) == 3
    assert f"{folder / 'blocked.jsonl'}: a FIFO (named pipe), not a file to import" in result.skipped


def test_a_fifo_or_a_loop_given_to_trajectories_import(
    home: Path, tmp_path: Path, loop: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """§4: given by name, a FIFO is one line (not 'not found', not a hang), a loop is one line; exit status
    2."""
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    assert carl(home, "trajectories", "import", str(fifo)) == 2
    out = capsys.readouterr()
    assert f"{fifo}: a FIFO (named pipe), not a file to import" in out.out
    assert one_line(out.err) == "carl: nothing imported: 1 file(s) or line(s) skipped"
    assert carl(home, "trajectories", "import", str(loop)) == 2
    assert one_line(capsys.readouterr().err) == f"carl: {loop}: a symbolic link loop"


# -- configs and datasets ------------------------------------------------------------------------------------


def test_a_fifo_config_or_dataset_is_one_line(tmp_path: Path) -> None:
    """§4/§7: a FIFO given as carl.yaml, agents.yaml or a dataset is refused without being opened."""
    from engine.training.backend import BadInput
    from engine.training.config import ConfigError, load_config
    from engine.training.data import load_rows

    fifo = tmp_path / "carl.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"carl.yaml: a FIFO \(named pipe\), not a regular file$"):
        no_hang(lambda: load_config(fifo), fifo)
    data = tmp_path / "data.jsonl"
    os.mkfifo(data)
    with pytest.raises(BadInput, match=r"data.jsonl: a FIFO \(named pipe\), not a dataset file$"):
        no_hang(lambda: load_rows(str(data), 0), data)


def test_a_symlink_loop_as_a_settings_file(loop: Path) -> None:
    """§4: read_mapping (carl.yaml, agents.yaml) says a loop is a loop."""
    from engine.errors import CarlError

    with pytest.raises(CarlError, match="a symbolic link loop$"):
        read_mapping(loop, CarlError)


# -- the store: foreign files, empty files, FIFOs ------------------------------------------------------------


def foreign_db(path: Path) -> bytes:
    """Somebody else's SQLite file, in rollback-journal mode; its bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    "command",
    [("runs",), ("trajectories", "list"), ("observe", "LOG"), ("trajectories", "status")],
)
def test_a_foreign_sqlite_carl_db_is_refused_untouched(
    home: Path, tmp_path: Path, command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """§9: `carl observe` and `carl trajectories list` (and status) switched a foreign carl.db to WAL before
    refusing it; `carl runs`, a reader, never did, and is checked beside them."""
    db = home / "carl.db"
    before = foreign_db(db)
    mode = os.stat(db).st_mode
    log = tmp_path / "m.jsonl"
    log.write_text('{"step": 1, "loss": 1.0}\n')
    assert carl(home, *[str(log) if a == "LOG" else a for a in command]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"carl: {db}: this SQLite file is not a carl database (application_id 0x0)"
    )
    assert db.read_bytes() == before and os.stat(db).st_mode == mode
    assert not Path(f"{db}-wal").exists()


def test_an_empty_carl_db_is_one_line_for_listings(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """§9: a 0-byte carl.db gave a traceback (no such table: runs) on `carl runs`."""
    home.mkdir()
    (home / "carl.db").write_bytes(b"")
    assert carl(home, "runs") == 2
    line = one_line(capsys.readouterr().err)
    assert (
        line == f"carl: {home / 'carl.db'}: an empty database, with nothing stored yet (not set up by carl)"
    )
    with Store(home / "carl.db") as store:  # the writer sets an empty file up, as it does a new one
        assert store.conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    StoreReader(home / "carl.db").close()


def test_a_fifo_or_a_loop_as_carl_db(tmp_path: Path, loop: Path) -> None:
    """§4/§9: the store refuses a carl.db that is a FIFO (SQLite would block opening it) or a loop."""
    fifo = tmp_path / "carl.db"
    os.mkfifo(fifo)
    for open_store in (Store, StoreReader):
        with pytest.raises(StoreError, match=r"carl.db: a FIFO \(named pipe\), not a carl database$"):
            no_hang(lambda o=open_store: o(fifo), fifo)
        with pytest.raises(StoreError, match="a symbolic link loop$"):
            open_store(loop)
