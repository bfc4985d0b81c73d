"""The `carl observe` families: every format it reads, from a real writer's files, mutated.

A case is a folder of files (`FileCase.files`: bytes, or something that is not a regular file) and the path
given to the reader. It is fed either to `carl observe PATH` (the command a person types, its output
captured), or to the engine's follow of it (`register_source` and `ingest_source` tick after tick with small
budgets, as the daemon does it, a directory through discovery).
"""

from __future__ import annotations

import contextlib
import io
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from hostile import values as hv
from hostile.oracle import ERROR, HANG, Outcome
from hostile.runner import DIRECTORY, Family, Workspace, file_name, materialize, path_kind, swallowed
from hostile.seeds import seed_bytes

MAX_TICKS = 3_000  # follow ticks before a source that never catches up counts as a hang


@dataclass
class FileCase:
    files: dict[str, Any]  # relative path -> bytes, a special (runner.SPECIALS) or a Writer
    target: str  # the path given to the reader, relative to the case folder
    mode: str  # "cli" (carl observe) or "follow" (the engine's ticks)
    rows: int = 20_000  # the follow budget per tick


class Writer:
    """File content made by a writer when the case is laid out (a framed record file)."""

    def write(self, path: Path) -> None:
        raise NotImplementedError


def lay_out(where: Path, files: dict[str, Any]) -> None:
    plain = {k: v for k, v in files.items() if not isinstance(v, Writer)}
    materialize(where, plain)
    for relative, writer in files.items():
        if isinstance(writer, Writer):
            (where / relative).parent.mkdir(parents=True, exist_ok=True)
            writer.write(where / relative)


def feed_observe(case: FileCase, ws: Workspace, where: Path) -> Outcome:
    lay_out(where, case.files)
    path = where / case.target if case.target else where
    if case.mode in ("cli", "cli-tty"):  # through a pipe, or on a terminal: its progress bar drawn
        return swallowed(ws.cli("observe", str(path), tty=case.mode == "cli-tty"))
    return follow(ws, path, case.rows)


def follow(ws: Workspace, path: Path, rows: int) -> Outcome:
    """The engine's side: register the source(s), then ingest tick after tick until caught up."""
    from engine.observe import ObserveError, ingest_source, register_source
    from engine.observe.discover import discover, register
    from engine.store import Store

    with Store(ws.db) as store:
        try:
            if path.is_dir() and not path.is_symlink():
                found = discover(path)
                registered = register(store, found, follow=True)
                problems = [e for r in registered for e in r.errors]
                sources = [source_id for r in registered for source_id, _ in r.sources]
            else:
                problems, sources = [], [register_source(store, path, follow=True)]
        except ObserveError as exc:
            return Outcome(ERROR, str(exc))
        for source_id in sources:
            for _ in range(MAX_TICKS):
                try:
                    result = ingest_source(store, source_id, max_rows=rows, max_seconds=0.2)
                except ObserveError as exc:  # recorded on the source; a transient one is tried next tick
                    problems.append(str(exc))
                    break
                problems += result.problems
                if result.caught_up:
                    break
            else:
                return Outcome(HANG, f"source {source_id} never caught up in {MAX_TICKS} ticks")
    return swallowed(Outcome("ok"), problems)


@st.composite
def mode(draw: st.DrawFn) -> tuple[str, int]:
    how = draw(st.sampled_from(["cli", "cli-tty", "follow"]))
    return how, draw(st.sampled_from([1, 3, 50, 20_000]))


def list_runs(ws: Workspace) -> Outcome:
    """`carl runs` once the cases are in: every name and source stored, as the listing prints them."""
    return swallowed(ws.cli("runs"))


def observe_family(name: str, make_seeds: Any, cases: Any, ci_examples: int = 80) -> Family:
    return Family(name, make_seeds, cases, feed_observe, ci_examples, after=list_runs)


# -- JSONL logs: ours, veRL's file logger, prime-rl's metrics.jsonl ------------------------------------------

OURS = [
    {
        "step": step,
        "loss": 1 / (step + 1),
        "reward": step / 6,
        "rewards/task/mean": 0.5,
        "entropy": 2.0 - step / 6,
        "phi/mean": 0.9,
        "vocab_size": 512,
        "timestamp": 1.7e9 + step,
        "train": {"kl": 0.01, "clip_ratio": {"low": 0.0, "high": 0.1}},
    }
    for step in range(6)
]
VERL = [
    {
        "step": step,
        "data": {
            "actor/entropy": 1.5 - step / 10,
            "actor/pg_loss": 0.1,
            "actor/ppo_kl": 0.01,
            "critic/score/mean": step / 6,
            "critic/rewards/mean": step / 6,
            "response_length/mean": 120.0 + step,
        },
    }
    for step in range(1, 6)
]
PRIME = [
    {
        "step": step,
        "time": 1.7e9 + step,
        "entropy/all/mean": 1.2,
        "reward/mean": step / 6,
        "loss/mean": 0.3,
        "seq_len/mean": 200.0,
    }
    for step in range(5)
]


def jsonl_cases(lines: list[dict[str, Any]], name: str) -> Any:
    @st.composite
    def cases(draw: st.DrawFn, seeds: Any) -> FileCase:
        data = draw(hv.mutated_lines(lines))
        file = draw(file_name(name))
        how, rows = draw(mode())
        return FileCase(
            {f"logs/{file}": draw(path_kind(data))},
            f"logs/{file}" if draw(st.booleans()) else "logs",
            how,
            rows,
        )

    return lambda seeds: cases(seeds)


# -- trainer_state.json --------------------------------------------------------------------------------------

STATE = {
    "best_metric": None,
    "epoch": 1.0,
    "global_step": 6,
    "max_steps": 6,
    "logging_steps": 1,
    "log_history": [
        {"epoch": 0.1 * step, "grad_norm": 1.0, "learning_rate": 1e-5, "loss": 1 / step, "step": step}
        for step in range(1, 7)
    ]
    + [{"train_runtime": 10.0, "train_loss": 0.5, "step": 6}],
    "train_batch_size": 2,
}
MODEL_CONFIG = {"vocab_size": 512, "model_type": "llama", "_name_or_path": "tiny", "hidden_size": 64}


@st.composite
def trainer_state_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    state = draw(hv.json_bytes(STATE))
    config = draw(hv.json_bytes(MODEL_CONFIG)) if draw(st.booleans()) else hv.dumps(MODEL_CONFIG)
    files = {
        "out/trainer_state.json": draw(path_kind(state)),
        "out/config.json": draw(path_kind(config)),
        "out/checkpoint-3/trainer_state.json": draw(path_kind(draw(hv.json_bytes(STATE)))),
    }
    target = draw(st.sampled_from(["out", "out/trainer_state.json", "out/checkpoint-3"]))
    how, rows = draw(mode())
    return FileCase(files, target, how, rows)


# -- Trackio -------------------------------------------------------------------------------------------------

TRACKIO_SQL = (
    "INSERT INTO metrics (run_id, timestamp, run_name, step, metrics) VALUES (?, ?, ?, ?, ?)",
    "UPDATE configs SET config = ?",
    "UPDATE configs SET run_name = ?",
    "UPDATE metrics SET metrics = ? WHERE id = (SELECT min(id) FROM metrics)",
    "UPDATE metrics SET step = ? WHERE id = (SELECT max(id) FROM metrics)",
    "UPDATE metrics SET timestamp = ?",
    "DELETE FROM configs",
    "ALTER TABLE metrics DROP COLUMN run_name",
    "DROP TABLE configs",
    "PRAGMA application_id = 1128354380",  # ours ("CARL"): a carl store is not a Trackio project
)


def sql_value(draw: st.DrawFn) -> Any:
    """A value as a hostile writer may put it in an SQLite column: text, a blob, a number, NULL."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return hv.dumps(draw(hv.mutated_json({"loss": 0.5, "reward": 1.0}))).decode("utf-8", "replace")
    if kind == 1:
        return draw(st.binary(max_size=40)) + draw(st.sampled_from(hv.BYTE_ATOMS))
    if kind == 2:
        value = draw(hv.hostile_number())
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            return str(value)  # SQLite holds no larger integer: a writer stores its text
        return value if not isinstance(value, hv.Raw) else value.text
    if kind == 3:
        return hv.storable_text(draw(hv.hostile_text()))
    if kind == 4:
        return None
    return hv.dumps(draw(hv.mutated_json(MODEL_CONFIG))).decode("utf-8", "replace")


@st.composite
def sqlite_bytes(draw: st.DrawFn, seed: bytes, statements: tuple[str, ...], value: Any = sql_value) -> bytes:
    """The SQLite file `seed` after a few hostile statements (their values from `value`), and now and then
    damaged bytes."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(seed)
        for _ in range(draw(st.integers(1, 4))):
            statement = draw(st.sampled_from(statements))
            params = [value(draw) for _ in range(statement.count("?"))]
            with contextlib.suppress(sqlite3.Error):  # one this file cannot take: the others make it hostile
                conn.execute(statement, params)
        conn.commit()
        data = conn.serialize()
    finally:
        conn.close()
    if draw(st.integers(0, 5)) == 0:
        data = draw(hv.mutated_bytes(data))
    return data


@st.composite
def trackio_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    data = draw(sqlite_bytes(seeds["trackio"], TRACKIO_SQL))
    file = draw(file_name("project.db"))
    how, rows = draw(mode())
    return FileCase(
        {f"trackio/{file}": draw(path_kind(data))},
        draw(st.sampled_from([f"trackio/{file}", "trackio"])),
        how,
        rows,
    )


# -- Trackio traces and histograms --------------------------------------------------------------------------

TRACE_MESSAGES = [{"role": "user", "content": "2 + 2 = ?"}, {"role": "assistant", "content": "4"}]
TRACE_METADATA = {
    "reward": 1.0,
    "rewards/accuracy": 1.0,
    "advantage": 0.5,
    "group_id": 3,
    "model_version": 7,
    "step": 7,
    "completion_tokens": 2,
}
HISTOGRAM = {"_type": "trackio.histogram", "bins": [0.0, 1.0, 2.0, 3.0], "values": [4, 0, 1]}
TRACES_SQL = (
    (
        "INSERT INTO traces (id, run_id, timestamp, run_name, step, key, trace_index, messages, metadata,"
        " search_text) SELECT ?, run_id, ?, run_name, ?, ?, ?, ?, ?, '' FROM configs"
    ),
    "UPDATE traces SET messages = ? WHERE rowid = (SELECT min(rowid) FROM traces)",
    "UPDATE traces SET metadata = ? WHERE rowid = (SELECT max(rowid) FROM traces)",
    "UPDATE traces SET step = ?",
    "UPDATE traces SET trace_index = ?",
    "UPDATE traces SET key = ?, run_name = ?",
    "UPDATE traces SET timestamp = ?",
    "UPDATE traces SET run_id = ? WHERE rowid % 2 = 1",
    "UPDATE metrics SET metrics = ? WHERE id = (SELECT max(id) FROM metrics)",
    "DELETE FROM traces WHERE rowid % 2 = 0",
    "ALTER TABLE traces DROP COLUMN metadata",
    "DROP TABLE traces",
)


def trace_value(draw: st.DrawFn) -> Any:
    """A value for a traces or metrics column: a hostile trace's messages or metadata, a hostile histogram in
    a metrics payload, or any value `sql_value` makes."""
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return hv.dumps(draw(hv.mutated_json(TRACE_MESSAGES))).decode("utf-8", "replace")
    if kind == 1:
        return hv.dumps(draw(hv.mutated_json(TRACE_METADATA))).decode("utf-8", "replace")
    if kind == 2:
        payload = {"train/loss": 0.5, "logprobs": draw(hv.mutated_json(HISTOGRAM))}
        return hv.dumps(payload).decode("utf-8", "replace")
    if kind == 3 and draw(st.integers(0, 9)) == 0:  # a trace past the reader's limit
        return hv.dumps([{"role": "user", "content": "x" * (5 << 20)}]).decode()
    return sql_value(draw)


@st.composite
def trackio_traces_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    data = draw(sqlite_bytes(seeds["trackio-traces"], TRACES_SQL, trace_value))
    how, rows = draw(mode())
    return FileCase({"trackio/project.db": draw(path_kind(data))}, "trackio/project.db", how, rows)


# -- MLflow: an mlflow.db and an mlruns/ directory -----------------------------------------------------------

MLFLOW_SQL = (
    (
        "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan)"
        " SELECT ?, ?, ?, run_uuid, ?, 0 FROM runs"
    ),
    (
        "INSERT INTO latest_metrics (key, value, timestamp, run_uuid, step, is_nan)"
        " SELECT ?, ?, 0, run_uuid, ?, 0 FROM runs"
    ),
    "UPDATE metrics SET value = ? WHERE rowid = (SELECT min(rowid) FROM metrics)",
    "UPDATE metrics SET step = ?",
    "UPDATE latest_metrics SET step = ?",
    "UPDATE params SET value = ?",
    "UPDATE params SET key = ? WHERE key = 'vocab_size'",
    "UPDATE runs SET name = ?",
    "UPDATE runs SET status = ?",
    "UPDATE runs SET start_time = ?",
    "UPDATE experiments SET name = ?",
    "UPDATE tags SET value = ?",
    "UPDATE alembic_version SET version_num = ?",
    "DELETE FROM experiments",
)


@st.composite
def mlflow_db_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    data = draw(sqlite_bytes(seeds["mlflow.db"], MLFLOW_SQL))
    how, rows = draw(mode())
    return FileCase(
        {"store/mlflow.db": draw(path_kind(data))},
        draw(st.sampled_from(["store/mlflow.db", "store"])),
        how,
        rows,
    )


@st.composite
def mlruns_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    files: dict[str, Any] = {"mlruns/.trash": DIRECTORY}
    texts = dict(seeds["mlruns"])
    for _ in range(draw(st.integers(1, 3))):
        relative = draw(st.sampled_from(sorted(k for k, v in texts.items() if isinstance(v, bytes))))
        op = draw(st.integers(0, 3))
        if op == 0:
            texts[relative] = draw(hv.mutated_bytes(texts[relative]))
        elif op == 1:  # a metric or param under a hostile name (a key is its file's path)
            folder = relative.rsplit("/", 1)[0]
            name = hv.storable_text(draw(hv.hostile_text()))[:60].replace("/", "_").replace("\x00", "")
            name = "x" if name in ("", ".", "..") else name  # a name a file can have
            texts[f"{folder}/{name}"] = texts[relative]
        elif op == 2:  # a metric line "timestamp value step" with hostile fields
            line = " ".join(str(draw(st.one_of(hv.hostile_number(), hv.hostile_text()))) for _ in range(3))
            texts[relative] = texts[relative] + line.encode("utf-8", "replace") + b"\n"
        else:
            texts[relative] = draw(path_kind(texts[relative], special_one_in=2))
    files.update({f"mlruns/{k}": v for k, v in texts.items()})
    how, rows = draw(mode())
    return FileCase(files, "mlruns", how, rows)


# -- TensorBoard ---------------------------------------------------------------------------------------------


class TFRecords(Writer):
    """An event file: the records framed by tensorboard's own RecordWriter (length, CRCs)."""

    def __init__(self, records: list[bytes], tail: bytes = b"") -> None:
        self.records, self.tail = records, tail

    def write(self, path: Path) -> None:
        from tensorboard.summary.writer.record_writer import RecordWriter

        out = io.BytesIO()
        writer = RecordWriter(out)
        for record in self.records:
            writer.write(record)
        path.write_bytes(out.getvalue() + self.tail)

    def __repr__(self) -> str:
        return f"TFRecords({len(self.records)} records, tail={self.tail[:20]!r})"


def tf_records(data: bytes) -> list[bytes]:
    """The records of a TFRecord file (length, its CRC, data, its CRC)."""
    records, at = [], 0
    while at + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        records.append(data[at + 12 : at + 12 + length])
        at += 16 + length
    return records


def proto_text(draw: st.DrawFn) -> str:
    """Hostile text a protobuf string field can hold (valid UTF-8: no lone surrogate)."""
    return hv.storable_text(draw(hv.hostile_text()))[:5000]


@st.composite
def hostile_event(draw: st.DrawFn) -> bytes:
    """An Event as a hostile writer may make it: tags of control bytes and markup, steps and times at the ends
    of their types, NaN and inf, tensors of any dtype and shape, a config text of hostile JSON."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    event = Event(
        step=draw(st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**31, 7])),
        wall_time=draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e308, 1.7e9])),
    )
    for _ in range(draw(st.integers(1, 3))):
        value = Summary.Value(
            tag=draw(st.sampled_from(["train/loss", "model_config/text_summary", "args/text_summary"]))
            if draw(st.booleans())
            else proto_text(draw)
        )
        kind = draw(st.integers(0, 3))
        if kind == 0:
            value.simple_value = draw(st.floats(width=32, allow_nan=True, allow_infinity=True))
        elif kind == 1:  # a tensor of the scalars plugin, of any dtype and shape
            value.metadata.plugin_data.plugin_name = draw(
                st.sampled_from(["scalars", "text", proto_text(draw)])
            )
            value.tensor.dtype = draw(st.integers(0, 30))
            for dim in draw(st.lists(st.sampled_from([0, 1, -1, 2**40, 3]), max_size=2)):
                value.tensor.tensor_shape.dim.add(size=dim)
            value.tensor.tensor_content = draw(st.binary(max_size=24))
            if draw(st.booleans()):
                value.tensor.float_val.extend(draw(st.lists(st.floats(width=32), max_size=3)))
        elif kind == 2:  # a text as transformers' TensorBoardCallback writes the config, hostile
            value.metadata.plugin_data.plugin_name = "text"
            value.tensor.dtype = 7  # DT_STRING
            value.tensor.string_val.append(hv.dumps(draw(hv.mutated_json(MODEL_CONFIG))))
        else:
            value.histo.min = draw(st.floats(allow_nan=True))
        event.summary.value.append(value)
    return event.SerializeToString()


def hostile_sample_text(draw: st.DrawFn) -> bytes:
    """A text as a hostile writer of samples may put it: OpenRLHF's form, a markdown table or JSON, their
    parts hostile; bytes that are not UTF-8; now and then past the reader's limit."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        text = f"Sample:\\n{proto_text(draw)}\\n\\nReward: {draw(hv.hostile_number())}"
    elif kind == 1:
        header = draw(st.sampled_from(["prompt | completion | reward", "response", proto_text(draw)[:80]]))
        rows = [" | ".join(proto_text(draw)[:200] for _ in range(3)) for _ in range(draw(st.integers(0, 4)))]
        many = draw(st.sampled_from([1, 1, 1, 12_000]))
        text = "\n".join([f"| {header} |", "|---|---|---|", *(f"| {row} |" for row in rows * many)])
    elif kind == 2:
        seed = {"prompt": "q", "completion": "a", "reward": 1.0, "rewards/x": 0.5, "group_id": 1}
        value = draw(hv.mutated_json(seed if draw(st.booleans()) else [seed, seed]))
        return hv.dumps(value)
    elif kind == 3:
        return draw(st.binary(max_size=60)) + draw(st.sampled_from(hv.BYTE_ATOMS))
    elif kind == 4 and draw(st.integers(0, 9)) == 0:
        text = "Sample:\\n" + "x" * (5 << 20) + "\\n\\nReward: 1.0"
    else:
        text = proto_text(draw)
    return text.encode("utf-8", "surrogatepass")


@st.composite
def hostile_sample_event(draw: st.DrawFn) -> bytes:
    """An Event holding what becomes rollouts or histograms, hostile: texts of samples (one, or a 2-D table
    whose shape may lie), v1 histograms with NaN, inf, limits going down or lengths that disagree, and tensors
    of the histograms plugin of any dtype and shape."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    event = Event(
        step=draw(st.sampled_from([0, -1, 2**63 - 1, -(2**63), 3])),
        wall_time=draw(st.sampled_from([0.0, float("nan"), float("inf"), 1.7e9])),
    )
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.integers(0, 2))
        value = Summary.Value(
            tag=draw(
                st.sampled_from(["train/generated_samples/text_summary", "actor/logprobs", "train/ratio"])
            )
            if draw(st.booleans())
            else proto_text(draw)
        )
        if kind == 0:
            value.metadata.plugin_data.plugin_name = "text"
            value.tensor.dtype = draw(st.sampled_from([7, 7, 1]))
            for dim in draw(st.lists(st.sampled_from([1, 2, 3, 0, -1, 2**40]), max_size=2)):
                value.tensor.tensor_shape.dim.add(size=dim)
            value.tensor.string_val.extend(hostile_sample_text(draw) for _ in range(draw(st.integers(0, 4))))
        elif kind == 1:
            numbers = st.floats(allow_nan=True, allow_infinity=True)
            value.histo.min = draw(numbers)
            value.histo.max = draw(numbers)
            value.histo.bucket_limit.extend(draw(st.lists(numbers, max_size=6)))
            value.histo.bucket.extend(draw(st.lists(numbers, max_size=6)))
            if draw(st.integers(0, 19)) == 0:
                value.histo.bucket_limit.extend(range(70_000))
                value.histo.bucket.extend([1.0] * 70_000)
        else:
            value.metadata.plugin_data.plugin_name = "histograms"
            value.tensor.dtype = draw(st.integers(0, 30))
            for dim in draw(st.lists(st.sampled_from([3, 2, 0, -1, 2**40, 70_000]), max_size=3)):
                value.tensor.tensor_shape.dim.add(size=dim)
            value.tensor.tensor_content = draw(st.binary(max_size=96))
            if draw(st.booleans()):
                value.tensor.double_val.extend(draw(st.lists(st.floats(allow_nan=True), max_size=9)))
        event.summary.value.append(value)
    return event.SerializeToString()


@st.composite
def tensorboard_samples_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    records = list(seeds["tensorboard-samples"])
    content: Any
    if draw(st.integers(0, 3)) == 0:
        content = draw(hv.mutated_bytes(seeds["tensorboard-samples-file"]))
    else:
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(records)))
            if draw(st.booleans()) and records:  # a record's own bytes damaged, framed again with good CRCs
                records[min(at, len(records) - 1)] = draw(
                    hv.mutated_bytes(records[min(at, len(records) - 1)])
                )
            else:
                records.insert(at, draw(hostile_sample_event()))
        content = TFRecords(records)
    how, rows = draw(mode())
    name = "tb/run1/events.out.tfevents.1700000000.host.1.0"
    return FileCase({name: draw(path_kind(content))}, draw(st.sampled_from(["tb", name])), how, rows)


def tensorboard_samples_seeds(folder: Path) -> dict[str, Any]:
    from hostile.seeds import SEEDS

    [file] = (SEEDS / "tensorboard-samples").glob("events.out.tfevents.*")
    data = file.read_bytes()
    return {"tensorboard-samples": tf_records(data), "tensorboard-samples-file": data}


@st.composite
def tensorboard_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    records = list(seeds["tensorboard"])
    content: Any
    op = draw(st.integers(0, 3))
    if op == 0:  # the file's bytes damaged (a CRC fails, a length lies)
        content = draw(hv.mutated_bytes(seeds["tensorboard-file"]))
    else:
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(records)))
            if op == 1 and records:  # a record's own bytes damaged, framed again with good CRCs
                at = min(at, len(records) - 1)
                records[at] = draw(hv.mutated_bytes(records[at]))
            else:
                records.insert(at, draw(hostile_event()))
        # A record cut off; a header (its CRC right) claiming 2 GiB or 2**63 bytes, over the 16 MiB bound
        # (never read: the file ends first), alone or before more records.
        tail = draw(
            st.sampled_from([b"", b"\x10\x00\x00\x00", b"\x00" * 11, claimed(2 << 30), claimed(1 << 63)])
        )
        if tail and draw(st.booleans()):
            tail += b"".join(frame(record) for record in records[:2])
        content = TFRecords(records, tail)
    name = draw(file_name("events.out.tfevents.1700000000.host.1.0", hostile_one_in=20))
    how, rows = draw(mode())
    return FileCase(
        {f"tb/run1/{name}": draw(path_kind(content))},
        draw(st.sampled_from(["tb", f"tb/run1/{name}"])),
        how,
        rows,
    )


def claimed(length: int) -> bytes:
    """A TFRecord header claiming `length` bytes, the length's CRC right."""
    from engine.observe.tfrecord import crc32c_api, masked

    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked(crc32c_api()(raw)))


def frame(data: bytes) -> bytes:
    """One whole TFRecord, both CRCs right."""
    from engine.observe.tfrecord import crc32c_api, masked

    crc = crc32c_api()
    return claimed(len(data)) + data + struct.pack("<I", masked(crc(data)))


def tensorboard_seeds(folder: Path) -> dict[str, Any]:
    from hostile.seeds import SEEDS

    [file] = (SEEDS / "tensorboard").glob("events.out.tfevents.*")
    data = file.read_bytes()
    return {"tensorboard": tf_records(data), "tensorboard-file": data}


# -- W&B -----------------------------------------------------------------------------------------------------


class WandbRecords(Writer):
    """A `.wandb` file: its records framed as wandb's writer frames them (tests/wandb_frames.py: LevelDB log
    blocks, a CRC-32 each)."""

    def __init__(self, records: list[bytes]) -> None:
        self.records = records

    def write(self, path: Path) -> None:
        import wandb_frames

        wandb_frames.write(path, self.records)

    def __repr__(self) -> str:
        return f"WandbRecords({len(self.records)} records)"


def wandb_seed_records(data: bytes) -> list[bytes]:
    """The records of a `.wandb` file, as our framing reader reads them."""
    from engine.observe.wandb_log import RecordLog

    items = RecordLog(io.BytesIO(data), len(data), 0)
    return [bytes(item) for _, item in items if isinstance(item, bytes | memoryview)]


@st.composite
def hostile_record(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A W&B record with hostile keys, values (as the JSON text wandb keeps them), names and steps."""
    from wandb.proto.wandb_internal_pb2 import Record

    record = Record()
    kind = draw(st.integers(0, 4))
    if kind == 0:
        record.history.step.num = draw(st.sampled_from([0, -1, 2**63 - 1, -(2**63), 5]))
        for _ in range(draw(st.integers(1, 3))):
            item = record.history.item.add()
            if draw(st.booleans()):
                item.nested_key.extend([proto_text(draw) for _ in range(draw(st.integers(1, 3)))])
            else:
                item.key = (
                    draw(st.sampled_from(["train/loss", "_step", "_timestamp", "train/global_step"]))
                    if draw(st.booleans())
                    else proto_text(draw)
                )
            item.value_json = hv.dumps(draw(hv.hostile_value())).decode("utf-8", "replace")
    elif kind == 1:
        item = record.config.update.add()
        item.key = (
            draw(st.sampled_from(["vocab_size", "max_steps", "_name_or_path"]))
            if draw(st.booleans())
            else proto_text(draw)
        )
        item.value_json = hv.dumps(draw(hv.mutated_json(MODEL_CONFIG))).decode("utf-8", "replace")
    elif kind == 2:
        item = record.summary.update.add()
        item.key = proto_text(draw)
        item.value_json = hv.dumps(draw(hv.hostile_value())).decode("utf-8", "replace")
    elif kind == 3:
        record.run.run_id = proto_text(draw)[:100]
        record.run.display_name = proto_text(draw)
    else:
        record.exit.exit_code = draw(st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31)]))
    return record.SerializeToString()


@st.composite
def wandb_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    records = list(seeds["wandb"])
    op = draw(st.integers(0, 3))
    content: Any
    if op == 0:
        content = draw(hv.mutated_bytes(seeds["wandb-file"]))
    else:
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(records)))
            if op == 1 and records:
                at = min(at, len(records) - 1)
                records[at] = draw(hv.mutated_bytes(records[at]))
            elif draw(st.integers(0, 9)) == 0:  # a record that spans blocks
                records.insert(at, draw(hostile_record(seeds["wandb"])) + b"\x00" * 40_000)
            else:
                records.insert(at, draw(hostile_record(seeds["wandb"])))
        content = WandbRecords(records)
    run_dir = seeds["wandb-dir"]
    how, rows = draw(mode())
    name = f"wandb/{run_dir}/run-seed.wandb"
    return FileCase(
        {name: draw(path_kind(content))},
        draw(st.sampled_from(["wandb", f"wandb/{run_dir}", name])),
        how,
        rows,
    )


def wandb_seeds(folder: Path) -> dict[str, Any]:
    from hostile.seeds import SEEDS

    [file] = (SEEDS / "wandb").glob("*/run-*.wandb")
    data = file.read_bytes()
    return {"wandb": wandb_seed_records(data), "wandb-file": data, "wandb-dir": file.parent.name}


# W&B Tables: history records pointing at table files (veRL's wide validation table, TRL's completions table),
# the files mutated, missing, not regular files, or named by paths that would leave the run's files/.
WANDB_TABLES = {
    "val/generations": {
        "columns": ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"],
        "data": [[4, "2+2?", "4", 1.0, "3+3?", "7", 0.0], [8, "2+2?", "4", 1.0, "3+3?", "6", 1.0]],
    },
    "completions": {
        "columns": ["step", "prompt", "completion", "accuracy", "solution", "advantage"],
        "data": [
            [8, [{"role": "user", "content": "2+2?"}], "4", 1.0, "4", 0.5],
            [8, "2+2?", "5", 0.0, "4", -0.5],
        ],
    },
}
TABLE_PATHS = (
    "../../escape.table.json",
    "/etc/passwd",
    "media/table/" + "x" * 300 + ".json",
    "",
    "media/\x00",
)


def table_record(key: str, path: str, step: int) -> bytes:
    from wandb.proto.wandb_internal_pb2 import Record

    record = Record()
    record.history.step.num = step
    for field, value in (("_type", "table-file"), ("path", path), ("nrows", 2)):
        item = record.history.item.add()
        item.nested_key.extend([key, field])
        item.value_json = hv.dumps(value).decode()
    return record.SerializeToString()


@st.composite
def wandb_table_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    run_dir = f"wandb/{seeds['wandb-dir']}"
    records = list(seeds["wandb"])
    files: dict[str, Any] = {}
    for n in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(WANDB_TABLES)))
        path = f"media/table/{key}_{n}_abc.table.json"
        if draw(st.integers(0, 9)) == 0:
            path = draw(st.sampled_from(TABLE_PATHS))
        table = WANDB_TABLES[key]
        content = draw(hv.json_bytes(table)) if draw(st.booleans()) else hv.dumps(table)
        if path.startswith("media/table/") and len(path) < 100 and draw(st.integers(0, 7)):
            files[f"{run_dir}/files/{path}"] = draw(path_kind(content))
        at = draw(st.integers(0, len(records)))
        records.insert(at, table_record(key if draw(st.integers(0, 5)) else proto_text(draw), path, 8))
    files[f"{run_dir}/run-seed.wandb"] = WandbRecords(records)
    how, rows = draw(mode())
    return FileCase(files, draw(st.sampled_from(["wandb", run_dir])), how, rows)


# -- TRL's completions parquet -------------------------------------------------------------------------------


def parquet_bytes(table: dict[str, list[Any]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(pa.table(table), out)
    return out.getvalue()


@st.composite
def hostile_column(draw: st.DrawFn, rows: int) -> list[Any]:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return [hv.storable_text(draw(hv.hostile_text()))[:2000] for _ in range(rows)]
    if kind == 1:
        return [draw(st.floats(allow_nan=True, allow_infinity=True)) for _ in range(rows)]
    if kind == 2:
        return [draw(st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**31])) for _ in range(rows)]
    if kind == 3:  # conversational: a list of messages, hostile
        return [
            [
                {
                    "role": hv.storable_text(draw(hv.hostile_text()))[:50],
                    "content": hv.storable_text(draw(hv.hostile_text()))[:500],
                }
            ]
            for _ in range(rows)
        ]
    if kind == 4:
        return [None] * rows
    return [draw(st.binary(max_size=20)) for _ in range(rows)]


@st.composite
def trl_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    files: dict[str, Any] = {}
    for step in (1, 2):
        name = f"out/completions/completions_{step:05d}.parquet"
        seed = seeds["trl"][step - 1]
        op = draw(st.integers(0, 3))
        if op == 0:
            files[name] = seed
        elif op == 1:
            files[name] = draw(hv.mutated_bytes(seed))
        elif op == 2 and draw(st.integers(0, 3)) == 0:  # one long completion many times: dictionary-encoded
            rows, length = draw(st.sampled_from([(200, 1 << 16), (12, (1 << 20) + 1)]))  # past the 1 Mi cut
            text = draw(st.sampled_from(["y", "é", "\x00"])) * length
            files[name] = parquet_bytes(
                {
                    "step": [step] * rows,
                    "prompt": ["q"] * rows,
                    "completion": [text] * rows,
                    "r": [1.0] * rows,
                }
            )
        else:  # a table as a hostile log_completions may write it
            rows = draw(st.sampled_from([0, 1, 4]))
            table = {
                "step": [step] * rows,
                "prompt": ["question"] * rows,
                "completion": ["answer"] * rows,
                "accuracy_reward": [1.0] * rows,
                "advantage": [0.5] * rows,
            }
            for _ in range(draw(st.integers(1, 3))):
                column = (
                    draw(st.sampled_from([*table, "extra"]))
                    if draw(st.booleans())
                    else hv.storable_text(draw(hv.hostile_text()))[:80]
                )
                table[column] = draw(hostile_column(rows))
            if draw(st.integers(0, 5)) == 0:
                del table[draw(st.sampled_from(sorted(table)))]
            try:
                files[name] = parquet_bytes(table)
            except Exception:  # noqa: BLE001 (a table pyarrow itself cannot write: the seed stands in)
                files[name] = seed
        files[name] = draw(path_kind(files[name], special_one_in=20))
    how, rows = draw(mode())
    target = draw(st.sampled_from(["out", "out/completions", "out/completions/completions_00001.parquet"]))
    return FileCase(files, target, how, rows)


# -- rollout dumps: veRL, prime-rl, verifiers ----------------------------------------------------------------

VERL_SAMPLE = {"input": "<|user|>2+2=?", "output": "4 é", "gts": "4", "score": 1.0, "step": 1, "acc": True}
VF_OUTPUT = {
    "example_id": 0,
    "prompt": [{"role": "user", "content": "question 0"}],
    "completion": [{"role": "assistant", "content": "4"}],
    "answer": "4",
    "reward": 1.2,
    "error": None,
    "timing": {"generation_ms": 10.0, "scoring_ms": 1.0, "total_ms": 11.0},
    "is_completed": True,
    "is_truncated": False,
    "stop_condition": "stop",
    "metrics": {"correct_answer": 1.0, "format_reward": 1.0},
    "token_usage": {"input_tokens": 12.0, "output_tokens": 5.0},
    "correct_answer": 1.0,
}


def prime_episode(step: int, group: str, answer: str, score: float) -> dict[str, Any]:
    node = {
        "parent": None,
        "message": {"role": "assistant", "content": answer},
        "sampled": True,
        "timestamp": 1.7e9,
        "token_ids": [1, 2, 3, 4, 5],
        "mask": [False, False, True, True, True],
        "is_content": [],
        "logprobs": [-0.5, -1.5, -2.5],
        "advantages": [0.5, 0.5, 0.5],
    }
    trace = {
        "version": 1,
        "id": f"t-{group}-{answer}",
        "task": {"type": "math", "data": {"question": "2+2"}},
        "nodes": [{**node, "message": {"role": "user", "content": "2+2?"}, "sampled": False}, node],
        "rewards": {"correct": {"score": score, "weight": 1.0}},
        "metrics": {"num_turns": 1.0},
        "is_completed": True,
        "ok": True,
        "errors": [],
    }
    return {
        "id": f"e-{group}-{answer}",
        "env": {"id": "gsm8k", "name": "gsm8k"},
        "group": {"id": group},
        "run": {"type": "train", "id": "r1", "work": {"type": "train", "step": step - 1}},
        "ok": True,
        "errors": [],
        "traces": [trace],
    }


@st.composite
def verl_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    files = {}
    for step in (1, 2):
        lines = [{**VERL_SAMPLE, "step": step, "score": float(i % 2)} for i in range(4)]
        files[f"dumps/{draw(st.sampled_from([str(step), '00' + str(step), str(2**64)]))}.jsonl"] = draw(
            path_kind(draw(hv.mutated_lines(lines)))
        )
    how, rows = draw(mode())
    return FileCase(files, "dumps", how, rows)


@st.composite
def prime_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    lines = [prime_episode(1, "g1", "4", 1.0), prime_episode(1, "g1", "5", 0.0)]
    step_dir = draw(st.sampled_from(["step_1", "step_2", f"step_{2**63}", "step_-1"]))
    files = {
        f"run/rollouts/{step_dir}/train/effective/traces.jsonl": draw(
            path_kind(draw(hv.mutated_lines(lines)))
        )
    }
    how, rows = draw(mode())
    return FileCase(files, draw(st.sampled_from(["run", "run/rollouts"])), how, rows)


@st.composite
def verifiers_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    lines = [{**VF_OUTPUT, "example_id": i} for i in range(3)]
    files = {"vf/results.jsonl": draw(path_kind(draw(hv.mutated_lines(lines))))}
    how, rows = draw(mode())
    return FileCase(files, "vf", how, rows)


# -- issue 29's discovery paths: verifiers 0.4 traces, a run from several trackers, add_scalars sub-runs ---

# Files the real writers wrote (tests/data/*/write_*.py).
DATA = Path(__file__).resolve().parent.parent / "data"


def data_files(folder: str) -> dict[str, bytes]:
    """Every file under tests/data/<folder> but the script that wrote them, relative path -> bytes."""
    root = DATA / folder
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".py")
    }


def data_seeds(folder: Path) -> dict[str, Any]:
    return {name: data_files(name) for name in ("verifiers", "verl", "tensorboardx")}


def json_lines(data: bytes) -> list[Any]:
    import json

    return [json.loads(line) for line in data.splitlines() if line.strip()]


@st.composite
def verifiers_traces_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    """verifiers 0.4's run dir: its traces.jsonl mutated line by line (or left empty beside `configs/`)."""
    files = dict(seeds["verifiers"])
    [traces] = [name for name in files if name.endswith("traces.jsonl")]
    lines = json_lines(files[traces])
    files[traces] = draw(path_kind(draw(hv.mutated_lines(lines)) if draw(st.integers(0, 9)) else b""))
    how, rows = draw(mode())
    return FileCase(
        {f"vf/{k}": v for k, v in files.items()}, draw(st.sampled_from(["vf", f"vf/{traces}"])), how, rows
    )


@st.composite
def paired_trackers_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    """veRL's file logger, TensorBoard and rollout dump of one run, discovered together (pairing.py peeks at
    each and joins them): one of them mutated."""
    files = dict(seeds["verl"])
    log = "my_project/grpo_run.jsonl"
    [events] = [name for name in files if "tfevents" in name]
    victim = draw(st.sampled_from([log, events, "rollouts/2.jsonl"]))
    if victim == events:
        records = tf_records(files[events])
        at = draw(st.integers(0, len(records)))
        records.insert(at, draw(hostile_event()))
        files[events] = TFRecords(records, draw(st.sampled_from([b"", b"\x00" * 11])))
    else:
        files[victim] = draw(path_kind(draw(hv.mutated_lines(json_lines(files[victim])))))
    how, rows = draw(mode())
    return FileCase({f"exp/{k}": v for k, v in files.items()}, "exp", how, rows)


@st.composite
def add_scalars_cases(draw: st.DrawFn, seeds: Any) -> FileCase:
    """tensorboardX's add_scalars sub-runs under hostile folder names, their records mutated."""
    files = {}
    for name, data in seeds["tensorboardx"].items():
        folder, _, file = name.rpartition("/")
        parts = folder.split("/")
        if len(parts) == 3:  # run/<main_tag>/<name>: the sub-run's folders named by the writer's caller
            parts[1] = draw(file_name(parts[1], hostile_one_in=3))
            parts[2] = draw(st.sampled_from([parts[2], "", "x" * 200, "a/b"])) or parts[2]
        records = tf_records(data)
        if draw(st.booleans()):
            records.insert(draw(st.integers(0, len(records))), draw(hostile_event()))
        files["/".join([*parts, file])] = draw(path_kind(TFRecords(records)))
    how, rows = draw(mode())
    return FileCase(files, "run", how, rows)


# -- seeds and the families ----------------------------------------------------------------------------------


def no_seeds(folder: Path) -> None:
    return None


def mlflow_seeds(folder: Path) -> dict[str, Any]:
    from hostile.seeds import SEEDS

    root = SEEDS / "mlflow" / "mlruns"
    mlruns = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    return {"mlflow.db": seed_bytes("mlflow/mlflow.db"), "mlruns": mlruns}


def trl_seeds(folder: Path) -> dict[str, Any]:
    return {"trl": [seed_bytes(f"trl/completions/completions_{step:05d}.parquet") for step in (1, 2)]}


FAMILIES = [
    observe_family("jsonl-ours", no_seeds, jsonl_cases(OURS, "metrics.jsonl")),
    observe_family("jsonl-verl", no_seeds, jsonl_cases(VERL, "my_experiment.jsonl")),
    observe_family("jsonl-prime-rl", no_seeds, jsonl_cases(PRIME, "metrics.jsonl")),
    observe_family("trainer-state", no_seeds, trainer_state_cases),
    observe_family("trackio", lambda folder: {"trackio": seed_bytes("trackio.db")}, trackio_cases),
    observe_family("mlflow-db", mlflow_seeds, mlflow_db_cases, ci_examples=30),
    observe_family("mlflow-mlruns", mlflow_seeds, mlruns_cases, ci_examples=30),
    observe_family("tensorboard", tensorboard_seeds, tensorboard_cases),
    observe_family(
        "trackio-traces",
        lambda folder: {"trackio-traces": seed_bytes("trackio-traces.db")},
        trackio_traces_cases,
    ),
    observe_family("tensorboard-samples", tensorboard_samples_seeds, tensorboard_samples_cases),
    observe_family("wandb", wandb_seeds, wandb_cases),
    observe_family("wandb-tables", wandb_seeds, wandb_table_cases, ci_examples=40),
    observe_family("trl-parquet", trl_seeds, trl_cases),
    observe_family("verl-dumps", no_seeds, verl_cases),
    observe_family("prime-rl-dumps", no_seeds, prime_cases),
    observe_family("verifiers-dumps", no_seeds, verifiers_cases),
    observe_family("verifiers-traces", data_seeds, verifiers_traces_cases),
    observe_family("paired-trackers", data_seeds, paired_trackers_cases, ci_examples=40),
    observe_family("tensorboard-add-scalars", data_seeds, add_scalars_cases, ci_examples=40),
]
