"""JSONL metric logs: mapping, malformed lines, follow mode, bounds and restart safety."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import series

from engine.observe import ObserveError, ingest_source, observe, register_source
from engine.observe import jsonl as jsonl_module
from engine.store import Store, StoreReader

REPO = Path(__file__).resolve().parent.parent


def keys(store: Store, run_id: int) -> set[str]:
    return {r[0] for r in store.conn.execute("SELECT DISTINCT key FROM metrics WHERE run_id=?", (run_id,))}


def lines(*objs: object) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs)


# -- mapping -----------------------------------------------------------------------------------


def test_jsonl_mapping(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        lines(
            {
                "step": 1,
                "loss": 2.5,
                "phi": 0.91,
                "reward_format": 1,
                "reward_mean": 0.5,
                "flag": True,
                "completion": "text",
                "timestamp": 1700000000.5,
            },
            {"global_step": 2, "train_loss": 2.25, "phi_mean": 0.92, "reward_std": 0.1, "kl": 0.01},
            {
                "train/global_step": 3,
                "train/loss": 2.0,
                "trace/phi_mean": 0.93,
                "mean_reward": 0.75,
                "eval/loss": 3.0,
                "big": 10**400,
                "profiling/Time taken: x": 1.0,
            },
            '{"step": 4, "loss": NaN, "entropy": Infinity, "time": 1700000004}',
            {"step": 5.0, "entropy_mean": 1.5, "phi_std": 0.02},
        )
    )
    source_id, result = observe(store, path)
    assert result.bad_lines == 0 and result.problems == []
    assert result.caught_up and len(result.run_ids) == 1
    run_id = result.run_ids[0]
    assert result.rows == store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 17
    assert series(store, run_id, "loss") == {1: 2.5, 2: 2.25, 3: 2.0, 4: None}  # NaN is stored as NULL
    assert series(store, run_id, "phi/mean") == {1: 0.91, 2: 0.92, 3: 0.93}
    assert series(store, run_id, "rewards/format/mean") == {1: 1.0}
    assert series(store, run_id, "reward") == {1: 0.5, 3: 0.75}
    assert series(store, run_id, "reward_std") == {2: 0.1}
    assert series(store, run_id, "eval/loss") == {3: 3.0}
    assert series(store, run_id, "big") == {3: math.inf}
    assert series(store, run_id, "entropy") == {4: math.inf}
    assert series(store, run_id, "phi/entropy") == {5: 1.5}
    assert series(store, run_id, "phi/std") == {5: 0.02}
    assert keys(store, run_id) == {
        "loss",
        "phi/mean",
        "rewards/format/mean",
        "reward",
        "reward_std",
        "kl",
        "eval/loss",
        "big",
        "entropy",
        "phi/entropy",
        "phi/std",
    }
    walls = dict(store.conn.execute("SELECT step, wall_time FROM metrics WHERE key IN ('loss')").fetchall())
    assert walls[1] == 1700000000.5 and walls[4] == 1700000004.0
    assert abs(walls[2] - time.time()) < 60  # no timestamp of its own: the import time

    run = store.run(run_id)
    assert run["name"] == "metrics" and run["source_kind"] == "jsonl" and run["source_id"] == source_id
    assert run["status"] == "imported" and run["last_step"] == 5
    source = store.source(source_id)
    assert source["state"] == "done" and source["rows"] == 17 and source["bad_lines"] == 0
    assert source["kind"] == "jsonl" and source["path"] == str(path.resolve())

    reader = StoreReader(store.path)
    try:
        loss = reader.series(run_id, "loss")
        assert list(loss.first) == [1, 2, 3, 4] and loss.latest == 2.0
    finally:
        reader.close()


def test_name_and_derived_phi(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    ln_v = math.log(50_000)
    path.write_text(
        lines(
            {"step": 0, "vocab_size": 50_000},
            {"step": 1, "entropy": 2.0},
            {"step": 2, "phi": 0.75},
            {"step": 3, "phi": 0.8, "entropy_mean": 1.0},
        )
    )
    _, result = observe(store, path, name="my-run")
    run = store.run(result.run_ids[0])
    assert run["name"] == "my-run" and run["vocab_size"] == 50_000
    assert result.bad_lines == 0  # a line carrying only the vocab size is not malformed
    assert series(store, run["id"], "phi/mean") == {1: pytest.approx(1 - 2.0 / ln_v), 2: 0.75, 3: 0.8}
    assert series(store, run["id"], "phi/entropy") == {1: 2.0, 2: pytest.approx(0.25 * ln_v), 3: 1.0}


def test_malformed_lines_are_counted_with_file_and_line(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(
        b'{"step": 1, "loss": 1.0}\n'
        b"not json\n"
        b"[1, 2]\n"
        b'{"loss": 1.0}\n'
        b'{"step": "3", "loss": 1.0}\n'
        b'{"step": 1.5, "loss": 1.0}\n'
        b'{"step": true, "loss": 1.0}\n'
        b'{"step": 8, "note": "no numbers", "ok": true}\n'
        b'{"step": 9, "loss": "\xff\xfe"}\n'
        b"\n"
        b"   \r\n"
        b'{"step": 12, "loss": 12.0} trailing\n'
        b'{"step": 13, "loss": 13.0}\r\n'
        b'\xef\xbb\xbf{"step": 14, "loss": 14.0}\n'
        b'{"step": 99999999999999999999, "loss": 1.0}\n'
    )
    source_id, result = observe(store, path)
    assert result.problems == [
        "metrics.jsonl:2: not JSON",
        "metrics.jsonl:3: not an object",
        "metrics.jsonl:4: no step",
        "metrics.jsonl:5: step is not an integer",
        "metrics.jsonl:6: step is not an integer",
        "metrics.jsonl:7: step is not an integer",
        "metrics.jsonl:8: no numeric values",
        "metrics.jsonl:9: not UTF-8",
        "metrics.jsonl:12: not JSON",
        "metrics.jsonl:15: step is not an integer",
    ]
    assert result.bad_lines == 10 and store.source(source_id)["bad_lines"] == 10
    assert series(store, result.run_ids[0], "loss") == {1: 1.0, 13: 13.0, 14: 14.0}


def test_problem_list_is_bounded_but_the_count_is_exact(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("oops\n" * 500 + lines({"step": 1, "x": 1}))
    _, result = observe(store, path)
    assert result.bad_lines == 500 and len(result.problems) == 20
    assert result.problems[-1] == "bad.jsonl:20: not JSON"


# -- follow ------------------------------------------------------------------------------------


def test_follow_keeps_a_partial_last_line_for_later(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    path.write_text(lines({"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.9}) + '{"step": 3, "lo')
    source_id, result = observe(store, path, follow=True)
    run_id = result.run_ids[0]
    assert series(store, run_id, "loss") == {1: 1.0, 2: 0.9}
    assert store.source(source_id)["state"] == "following" and store.run(run_id)["status"] == "running"
    assert [s["id"] for s in store.followed_sources()] == [source_id]
    size_before = path.stat().st_size

    again = ingest_source(store, source_id)  # nothing new: caught up, nothing written
    assert again.caught_up and again.rows == 0 and again.bad_lines == 0

    with open(path, "a") as f:
        f.write('ss": 0.8}\n' + lines({"step": 4, "loss": 0.7}))
    result = ingest_source(store, source_id)
    assert result.caught_up and result.rows == 2 and result.bad_lines == 0 and result.run_ids == [run_id]
    assert series(store, run_id, "loss") == {1: 1.0, 2: 0.9, 3: 0.8, 4: 0.7}
    assert store.source(source_id)["cursor"]["offset"] == path.stat().st_size > size_before


def test_a_finished_file_may_lack_its_last_newline(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "done.jsonl"
    path.write_text(lines({"step": 1, "loss": 1.0}) + '{"step": 2, "loss": 0.5}')
    _, result = observe(store, path)
    assert series(store, result.run_ids[0], "loss") == {1: 1.0, 2: 0.5}


def test_truncated_or_replaced_file_is_read_again(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(lines(*({"step": i, "loss": float(i)} for i in range(10))))
    source_id, first = observe(store, path, follow=True)
    path.write_text(lines({"step": 10, "loss": 10.0}))  # shorter than the cursor: rewritten
    result = ingest_source(store, source_id)
    assert result.rows == 1
    assert series(store, first.run_ids[0], "loss")[10] == 10.0
    assert store.source(source_id)["cursor"]["line"] == 1


def test_missing_file_while_following_is_transient(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "rot.jsonl"
    path.write_text(lines({"step": 1, "loss": 1.0}))
    source_id, _ = observe(store, path, follow=True)
    moved = tmp_path / "rot.jsonl.1"
    path.rename(moved)
    with pytest.raises(ObserveError, match=r"rot\.jsonl: the file is gone") as err:
        ingest_source(store, source_id)
    assert err.value.transient
    source = store.source(source_id)
    assert source["state"] == "following" and "rot.jsonl" in source["last_error"]
    path.write_text(lines({"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}))  # rotated back in
    result = ingest_source(store, source_id)
    assert result.rows == 1 and store.source(source_id)["last_error"] is None


# -- bounds ------------------------------------------------------------------------------------


def test_batches_are_bounded_and_add_up(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    body = lines(*({"step": i, "a": i, "b": -i} for i in range(1000)))
    path.write_text(body.replace('{"step": 500, ', "garbage\n{"))  # line 501: garbage, then no step
    source_id = register_source(store, path, follow=False)
    total_rows, total_bad, calls = 0, 0, 0
    while True:
        result = ingest_source(store, source_id, max_rows=50)
        assert result.rows <= 50 + 2  # a line is never split between batches
        total_rows += result.rows
        total_bad += result.bad_lines
        calls += 1
        if result.caught_up:
            break
    assert calls >= 1998 // 50
    assert total_bad == 2 and total_rows == 2 * 999
    assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 2 * 999
    assert store.source(source_id)["rows"] == 2 * 999


def test_huge_lines_are_skipped_without_holding_them(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    huge = '{"step": 2, "blob": "' + "x" * (3 << 20) + '", "loss": 1.0}'
    path.write_text(lines({"step": 1, "loss": 1.0}, huge, {"step": 3, "loss": 3.0}))
    _, result = observe(store, path)
    assert result.problems == ["huge.jsonl:2: line longer than 1 MiB"]
    assert series(store, result.run_ids[0], "loss") == {1: 1.0, 3: 3.0}


def test_huge_line_still_being_written_while_following(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    path.write_text(lines({"step": 1, "loss": 1.0}) + '{"step": 2, "blob": "' + "x" * (3 << 19))
    source_id, result = observe(store, path, follow=True)
    assert result.problems == ["huge.jsonl:2: line longer than 1 MiB"]
    assert store.source(source_id)["cursor"]["skipping"] is True
    with open(path, "a") as f:
        f.write("y" * (3 << 20) + '"}\n' + lines({"step": 3, "loss": 3.0}))
    total = 0
    while True:
        result = ingest_source(store, source_id)
        total += result.bad_lines
        if result.caught_up:
            break
    assert total == 0  # counted once, when it outgrew the limit
    assert series(store, 1, "loss") == {1: 1.0, 3: 3.0}
    assert store.source(source_id)["cursor"]["line"] == 3


# -- restart safety ----------------------------------------------------------------------------


def test_observing_again_imports_nothing_twice(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(lines(*({"step": i, "loss": i / 10, "bad": "x"} for i in range(100)), "oops"))
    source_id, first = observe(store, path)
    assert first.rows == 100 and first.bad_lines == 1
    source_again, second = observe(store, path)
    assert source_again == source_id and second.rows == 0 and second.bad_lines == 0
    assert second.run_ids == first.run_ids
    assert register_source(store, path, follow=True) == source_id
    assert ingest_source(store, source_id).rows == 0
    assert store.run(first.run_ids[0])["status"] == "running"  # followed again
    assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 100
    assert store.conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    source = store.source(source_id)
    assert source["rows"] == 100 and source["bad_lines"] == 1


# The import, held at a known point for the kill: its first batch committed, its second batch's rows written
# in a transaction whose cursor is not saved yet (it waits there, the real save_source_progress after it).
KILLED_IMPORT = """
import sys, time
from engine.store import Store
from engine.observe import observe

store = Store(sys.argv[1])
save, batches = store.save_source_progress, []

def save_then_hold(source_id, cursor, *args, **kwargs):
    if cursor.get("offset", 0) > 0:
        batches.append(cursor["offset"])
        if len(batches) == 2:
            time.sleep(600)
    return save(source_id, cursor, *args, **kwargs)

store.save_source_progress = save_then_hold
observe(store, sys.argv[2])
"""


@pytest.mark.slow
def test_kill_9_mid_import_then_resume_is_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    n = 150_000
    with open(path, "w") as f:
        for i in range(n):
            f.write("not json\n" if i % 1000 == 999 else f'{{"step": {i}, "a": {i}, "b": 0.5}}\n')
    db = tmp_path / "carl.db"
    Store(db).close()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_IMPORT, str(db), str(path)], cwd=REPO)
    try:
        offset = 0
        deadline = time.monotonic() + 60
        while offset == 0 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            reader = StoreReader(db)
            row = reader.conn.execute("SELECT cursor FROM sources").fetchone()
            reader.close()
            offset = json.loads(row[0]).get("offset", 0) if row else 0
    finally:
        os.kill(proc.pid, 9)
        proc.wait()
    assert 0 < offset < path.stat().st_size, "the import should have been killed midway"
    with Store(db) as store:
        rows_before = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
        assert store.source(1)["rows"] == rows_before  # the cursor and its rows committed together
        _, result = observe(store, path)
        good = n - n // 1000
        assert store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 2 * good
        assert result.rows == 2 * good - rows_before
        source = store.source(1)
        assert source["rows"] == 2 * good and source["bad_lines"] == n // 1000


# -- fuzz --------------------------------------------------------------------------------------

GOOD = st.builds(
    lambda values: {"step": None, **values},
    st.dictionaries(
        st.sampled_from(["loss", "kl", "reward_x", "phi", "train/a"]),
        st.floats(allow_nan=False, width=64) | st.integers(-(10**6), 10**6),
        min_size=1,
    ),
)
BAD_BYTES = st.one_of(
    st.binary(max_size=60).map(lambda b: b"#" + b.replace(b"\n", b"")),  # garbage
    st.binary(min_size=1, max_size=8).map(
        lambda b: b'{"step": 1, "s": "\xff' + b.replace(b"\n", b"") + b'"}'
    ),
    st.sampled_from(
        [
            b"[1]",
            b"3",
            b'"s"',
            b"null",
            b'{"loss": 1}',
            b'{"step": "1", "a": 1}',
            b'{"step": 1.5, "a": 1}',
            b'{"step": true, "a": 1}',
            b'{"step": 1, "a": "x"}',
            b'{"step": 1, "a": false}',
            b"[" * 5000,
            b'{"step": 1e400, "a": 1}',
        ]
    ),
)


@st.composite
def jsonl_files(draw: st.DrawFn) -> tuple[bytes, int, dict[tuple[int, str], float]]:
    """(file bytes, malformed line count, expected rows) from good, bad, truncated and blank lines."""
    out: list[bytes] = []
    bad = 0
    expected: dict[tuple[int, str], float] = {}
    for kind in draw(st.lists(st.sampled_from(["good", "bad", "truncated", "blank", "long"]), max_size=25)):
        if kind == "good":
            obj = draw(GOOD)
            obj["step"] = len(out)
            out.append(json.dumps(obj).encode())
            for key, value in obj.items():
                name = jsonl_module.KEYS[key]
                if name is not None:
                    expected.setdefault((len(out) - 1, name), float(value))
        elif kind == "truncated":
            text = json.dumps({"step": len(out), "loss": 1.0}).encode()
            out.append(text[: draw(st.integers(1, len(text) - 1))])
            bad += 1
        elif kind == "bad":
            out.append(draw(BAD_BYTES))
            bad += 1
        elif kind == "long":
            out.append(b'{"step": 1, "pad": "' + b"z" * draw(st.integers(300, 600)) + b'"}')
            bad += 1
        else:
            out.append(draw(st.sampled_from([b"", b"  ", b"\r"])))
    return b"\n".join(out) + (b"\n" if out and draw(st.booleans()) else b""), bad, expected


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jsonl_files(), st.integers(1, 40), st.sampled_from([7, 64, 1 << 20]))
def test_fuzz_jsonl_reader(
    case: tuple[bytes, int, dict[tuple[int, str], float]], max_rows: int, chunk: int
) -> None:
    data, bad, expected = case
    saved = jsonl_module.CHUNK, jsonl_module.MAX_LINE
    # Small limits send short inputs through the chunk-boundary and over-long-line paths.
    jsonl_module.CHUNK, jsonl_module.MAX_LINE = chunk, 256
    try:
        with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "carl.db") as store:
            path = Path(tmp) / "fuzz.jsonl"
            path.write_bytes(data)
            source_id = register_source(store, path, follow=False)
            bad_seen = 0
            for _ in range(10_000):
                result = ingest_source(store, source_id, max_rows=max_rows)
                bad_seen += result.bad_lines
                if result.caught_up:
                    break
            assert result.caught_up
            got = {(s, k): v for s, k, v in store.conn.execute("SELECT step, key, value FROM metrics")}
            assert bad_seen == bad == store.source(source_id)["bad_lines"]
            assert got == pytest.approx(expected, nan_ok=True)
            cursor = store.source(source_id)["cursor"]
            assert cursor["offset"] == len(data)
    finally:
        jsonl_module.CHUNK, jsonl_module.MAX_LINE = saved


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.binary(max_size=40) | st.sampled_from([b"{", b"}", b'"step": 1', b", ", b"\n", b"\xff"]),
        max_size=40,
    ).map(b"".join),
    st.booleans(),
)
def test_fuzz_garbage_bytes_never_crash(data: bytes, follow: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "carl.db") as store:
        path = Path(tmp) / "garbage.jsonl"
        path.write_bytes(data)
        source_id = register_source(store, path, follow=follow)
        for _ in range(1000):
            if ingest_source(store, source_id, max_rows=3).caught_up:
                break
        source = store.source(source_id)
        complete = data.count(b"\n")
        tail = bool(data) and not data.endswith(b"\n")
        # Every line is consumed once (a followed file's unfinished last line waits).
        assert source["cursor"]["line"] == complete + (tail and not follow)
        assert source["cursor"]["offset"] == (data.rfind(b"\n") + 1 if follow else len(data))
        assert source["bad_lines"] <= source["cursor"]["line"]
        assert source["rows"] == store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
