"""Our reader of the `.wandb` framing (engine/observe/wandb_log.py) against the writer's framing
(tests/wandb_frames.py, as core/pkg/leveldb/record.go writes it), files the real wandb wrote
(tests/data/wandb/, written by wandb 0.19 and 0.31), and damage: a bad checksum, a record too long to hold, a
file cut anywhere. Then what the W&B reader makes of records that point at tables and carry console output."""

from __future__ import annotations

import io
import json
import random
import zlib
from pathlib import Path
from typing import Any

import pytest
import wandb_frames
from support import series

from engine.console.scan import scan_console
from engine.observe import observe, register_source
from engine.observe.ingest import ingest_source
from engine.observe.wandb_log import (
    BLOCK,
    MAX_RECORD,
    Damaged,
    Oversized,
    RecordLog,
    header_problem,
)
from engine.observe.wandb_tables import MAX_TABLE_BYTES
from engine.store import Store

DATA = Path(__file__).parent / "data" / "wandb"


def read_all(data: bytes, offset: int = 0, **kw: Any) -> tuple[list[tuple[int, Any]], RecordLog]:
    log = RecordLog(io.BytesIO(data), len(data), offset, **kw)
    return list(log), log


def payloads(items: list[tuple[int, Any]]) -> list[bytes]:
    return [bytes(item) for _, item in items if isinstance(item, bytes | memoryview)]


def sizes() -> list[int]:
    """Records of every size that matters: empty, small, exactly filling a block, spanning several."""
    rng = random.Random(7)
    return [
        0,
        1,
        100,
        BLOCK - 14,
        BLOCK - 7,
        BLOCK,
        3 * BLOCK + 5,
        *(rng.randrange(2000) for _ in range(300)),
    ]


def test_the_writers_framing_is_read_back_whole_at_every_cut() -> None:
    rng = random.Random(3)
    records = [bytes(rng.getrandbits(8) for _ in range(n)) for n in sizes()]
    data = wandb_frames.frame(records)
    items, log = read_all(data)
    assert payloads(items) == records and [o for o, _ in items] == wandb_frames.starts(records)
    assert (log.offset, log.stopped) == (len(data), "end")
    cuts = [rng.randrange(len(data)) for _ in range(200)]
    cuts += [k * BLOCK + d for k in range(1, 6) for d in (-8, -7, -6, -1, 0, 1, 7)]
    for cut in cuts:
        f = io.BytesIO(data)
        first = RecordLog(f, cut, 0)
        head = payloads(list(first))
        assert first.offset <= cut and (first.stopped == "partial" or first.offset == cut)
        rest = payloads(list(RecordLog(f, len(data), first.offset)))
        assert head + rest == records, cut


@pytest.mark.parametrize("version", ["0.19.11", "0.31.0"])
def test_files_the_real_wandb_wrote(version: str) -> None:
    """Fixtures written by each wandb (tests/data/wandb/write_fixture.py): every record parses, none damaged,
    and the file framed again by the writer's rules is the same bytes."""
    from wandb.proto.wandb_internal_pb2 import Record

    [path] = (DATA / version).glob("wandb/*/run-*.wandb")
    data = path.read_bytes()
    items, log = read_all(data)
    records = payloads(items)
    assert len(records) == len(items) > 20 and log.stopped == "end"
    kinds = {Record.FromString(r).WhichOneof("record_type") for r in records}
    assert {"run", "history", "summary", "exit", "output_raw"} <= kinds
    assert wandb_frames.frame(records) == data


def test_a_bad_checksum_costs_the_rest_of_its_block_in_one_line() -> None:
    records = [json.dumps({"n": n, "pad": "x" * 300}).encode() for n in range(400)]
    data = bytearray(wandb_frames.frame(records))
    starts = wandb_frames.starts(records)
    data[starts[50] + 9] ^= 0x01  # a payload byte of record 50
    items, log = read_all(bytes(data))
    damaged = [(o, d) for o, d in items if isinstance(d, Damaged)]
    assert damaged == [(starts[50], Damaged(starts[50], "checksum mismatch"))]
    next_block = (starts[50] // BLOCK + 1) * BLOCK
    # Lost: the damaged record and the others that begin in its block (the last of them crossing into the
    # next block, whose first chunk is then skipped as a piece without its beginning).
    assert payloads(items) == [r for n, r in enumerate(records) if n < 50 or starts[n] >= next_block]
    assert log.stopped == "end" and not log.resync


def test_the_crc_is_ieee_over_type_and_payload() -> None:
    """Plain CRC-32 as zlib computes it: a chunk whose checksum is masked the way LevelDB masks its own is
    damage."""
    good = wandb_frames.chunk(wandb_frames.FULL, b"abc")
    assert good[:4] == zlib.crc32(b"\x01abc").to_bytes(4, "little")
    items, _ = read_all(wandb_frames.HEADER + good)
    assert payloads(items) == [b"abc"]
    masked = (((zlib.crc32(b"\x01abc") >> 15) | (zlib.crc32(b"\x01abc") << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    items, _ = read_all(wandb_frames.HEADER + masked.to_bytes(4, "little") + good[4:])
    assert [type(i).__name__ for _, i in items] == ["Damaged"]


def test_a_record_longer_than_the_limit_is_skipped_unread_in_one_line() -> None:
    big = b"z" * (MAX_RECORD + 3 * BLOCK)
    records = [b"before", big, b"after"]
    data = wandb_frames.frame(records)
    items, log = read_all(data)
    starts = wandb_frames.starts(records)
    assert items[0] == (starts[0], b"before") and items[2] == (starts[2], b"after")
    assert items[1] == (starts[1], Oversized(starts[1], len(big)))
    # Followed: cut inside the skipped record, the cursor says where the skip goes on, with its start.
    f = io.BytesIO(data)
    cut = starts[1] + MAX_RECORD + 2 * BLOCK + 100
    first = RecordLog(f, cut, 0)
    assert payloads(list(first)) == [b"before"] and first.skip is not None and first.skip[0] == starts[1]
    assert first.offset <= cut and first.stopped == "partial"
    second = RecordLog(f, len(data), first.offset, skip=first.skip)
    assert list(second) == [(starts[1], Oversized(starts[1], len(big))), (starts[2], b"after")]


def test_the_header() -> None:
    assert header_problem(wandb_frames.HEADER) is None
    assert header_problem(b":W&B\xe1\xbe\x01") == (
        "log format version 1, but carl reads version 0 (written by a newer wandb?)"
    )
    assert header_problem(b"PK\x03\x04\x00\x00\x00") == "not a W&B run file"


# -- the W&B reader on records made here: tables, console, bounds ----------------------------------------


def history(step: int, items: dict[str, Any]) -> bytes:
    from wandb.proto.wandb_internal_pb2 import Record

    record = Record()
    record.history.step.num = step
    for key, value in {"_step": step, "_timestamp": 1.7e9 + step, **items}.items():
        item = record.history.item.add()
        item.nested_key.extend(key.split("|"))
        item.value_json = json.dumps(value)
    return record.SerializeToString()


def output(line: str) -> bytes:
    from wandb.proto.wandb_internal_pb2 import Record

    record = Record()
    record.output_raw.line = line
    return record.SerializeToString()


def table_value(key: str, path: str) -> dict[str, Any]:
    return {f"{key}|_type": "table-file", f"{key}|path": path, f"{key}|nrows": 2, f"{key}|ncols": 4}


def run_folder(tmp_path: Path, records: list[bytes], tables: dict[str, bytes]) -> Path:
    folder = tmp_path / "wandb" / "offline-run-20260101_000000-abc"
    for relative, data in tables.items():
        (folder / "files" / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / "files" / relative).write_bytes(data)
    folder.mkdir(parents=True, exist_ok=True)
    wandb_frames.write(folder / "run-abc.wandb", records)
    return folder


def rollouts(store: Store) -> list[tuple[Any, ...]]:
    return store.conn.execute(
        "SELECT step, idx, prompt, completion, rewards, total, extra FROM rollouts ORDER BY step, idx"
    ).fetchall()


def test_tables_of_samples_become_rollouts_and_others_are_left(store: Store, tmp_path: Path) -> None:
    trl = {
        "columns": ["step", "prompt", "completion", "acc", "fmt", "solution", "advantage"],
        "data": [[3, "2+2?", "4", 1.0, 0.5, "4", 0.7], [3, "2+2?", "5", 0.0, 0.5, "4", -0.7]],
    }
    numbers = {"columns": ["a", "b"], "data": [[1, 2]]}
    big = b'{"columns": ["prompt", "completion"], "data": [["' + b"x" * MAX_TABLE_BYTES + b'", "y"]]}'
    folder = run_folder(
        tmp_path,
        [
            history(3, {"loss": 1.0, **table_value("completions", "media/table/c_3.table.json")}),
            history(4, table_value("numbers", "media/table/n_4.table.json")),
            history(5, table_value("huge", "media/table/h_5.table.json")),
            history(6, table_value("escape", "../../../etc/passwd")),
        ],
        {
            "media/table/c_3.table.json": json.dumps(trl).encode(),
            "media/table/n_4.table.json": json.dumps(numbers).encode(),
            "media/table/h_5.table.json": big,
        },
    )
    _, result = observe(store, folder)
    assert result.rows == 1  # the loss: a table's size and shape are not metrics
    assert rollouts(store) == [
        (3, 0, "2+2?", "4", '{"acc": 1.0, "fmt": 0.5}', 1.5, '{"solution": "4", "table": "completions"}'),
        (3, 1, "2+2?", "5", '{"acc": 0.0, "fmt": 0.5}', 0.5, '{"solution": "4", "table": "completions"}'),
    ]
    advantages = [r[0] for r in store.conn.execute("SELECT advantage FROM rollouts ORDER BY idx")]
    assert advantages == [0.7, -0.7]
    assert len(result.problems) == 2 and result.bad_lines == 2
    assert "table 'huge'" in result.problems[0] and "larger than 32 MiB; not read" in result.problems[0]
    assert (
        "table 'escape'" in result.problems[1] and "not a file under the run's files/" in result.problems[1]
    )


def test_output_records_become_the_runs_console_once(store: Store, tmp_path: Path) -> None:
    """An offline run of a wandb that writes no output.log (0.29): the console is a copy beside carl.db,
    appended batch by batch, each line once however often the batches stop and start."""
    lines = [f"step {n}\n" for n in range(300)]
    records = [output(line) for line in lines] + [history(0, {"loss": 1.0})]
    folder = run_folder(tmp_path, records, {})
    source_id = register_source(store, folder, follow=True)
    for _ in range(100):
        if ingest_source(store, source_id, max_rows=1, max_seconds=0.0).caught_up:
            break
    [console] = store.system.consoles()
    copy = Path(console["path"])
    assert copy.parent == store.path.parent / "consoles" and console["kind"] == "wandb"
    assert copy.read_text() == "".join(lines)


@pytest.mark.parametrize("version", ["0.19.11", "0.31.0"])
def test_a_run_each_wandb_wrote_is_read_whole(store: Store, version: str) -> None:
    """The fixture run of each wandb (the oldest and the newest the registry has) read under the wandb
    installed here: metrics, config, the end, veRL's validation table and a TRL-style table as rollouts, the
    console."""
    [run_dir] = (DATA / version).glob("wandb/offline-run-*")
    _, result = observe(store, run_dir)
    assert result.bad_lines == 0, result.problems
    [run_id] = result.run_ids
    run = store.run(run_id)
    assert (run["name"], run["status"], run["vocab_size"], run["max_steps"]) == (
        "fixture-grpo",
        "finished",
        128,
        12,
    )
    assert series(store, run_id, "reward") == {step: step / 12 for step in range(1, 13)}
    rows = store.conn.execute(
        "SELECT step, idx, prompt, completion, rewards, total, advantage FROM rollouts ORDER BY step, idx"
    ).fetchall()
    validation = [r for r in rows if r[0] in (4, 8, 12)]
    assert [(r[0], r[2], r[3], json.loads(r[4])) for r in validation] == [
        (step, prompt, f"answer {n} at {step}", {"score": float((step + n) % 2)})
        for step in (4, 8, 12)
        for n, prompt in enumerate(["What is 2+2?", "Name a prime.", "Capital of France?"])
    ]
    assert [r for r in rows if r[0] == 6] == [
        (6, 1_000_000, "2+2?", "4", '{"accuracy_reward": 1.0}', 1.0, 0.5),  # the second table key's range
        (6, 1_000_001, "2+2?", "5", '{"accuracy_reward": 0.0}', 0.0, -0.5),
    ]
    [console] = store.system.consoles()
    text = Path(console["path"]).read_text()
    assert "step 12: reward 1.000" in text and "ValueError: a fixture" in text
    assert scan_console(store, console).new == 1  # the traceback
