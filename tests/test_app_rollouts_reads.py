"""What the rollouts viewer reads (engine/store/rollout_reads.py, through StoreReader): the filter language,
pages by keyset in every order (forward, backward, from a looked-up position) against a plain sort of the same
rows, the indexes the sorts use, and the token entropy statistics; then the viewer's reader thread
(carl_tui/rollouts_model.py) on its own: pages, totals, new steps, a run that went back."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from carl_tui.rollouts_model import PAGE, Band, Page, RolloutsReader, StepHistogram, Steps, Total
from engine.store import SCHEMA_VERSION, Store, StoreReader
from engine.store.rollout_reads import (
    SORTS,
    FilterError,
    RolloutFilter,
    RolloutQuery,
    parse_filter,
    percentiles,
    spread,
)

VALUE = {"reward": "total", "advantage": "advantage", "length": "length"}


def test_the_filter_language() -> None:
    parsed = parse_filter(
        'reward<0.2 adv>=0 len > 100 step=3 task==1 accuracy_reward!=0.5 timeout "two words"'
    )
    assert parsed.ranges == (
        ("total", "<", 0.2),
        ("advantage", ">=", 0.0),
        ("length", ">", 100.0),
        ("step", "=", 3.0),
        ("rewards.task", "=", 1.0),
        ("rewards.accuracy_reward", "!=", 0.5),
    )
    assert parsed.text == ("timeout", "two words")
    assert parse_filter("R<-1e-3 A>.5").ranges == (("total", "<", -0.001), ("advantage", ">", 0.5))
    assert parse_filter("") == RolloutFilter() and not parse_filter("  ")
    assert parse_filter('"reward<0.2"').text == ("reward<0.2",)  # quoted: text, not a comparison
    for bad in ("reward<", "<0.2", "adv>x"):
        with pytest.raises(FilterError):
            parse_filter(bad)


def build(
    store: Store, seed: int = 0, steps: int = 7, per_step: int = 23
) -> tuple[int, list[dict[str, Any]]]:
    """A run whose values repeat (ties) and are sometimes missing (NULL), and another run beside it."""
    rng = random.Random(seed)
    run_id = store.create_run("keyset", source_kind="carl")
    other = store.create_run("other", source_kind="carl")
    rows = []
    for step in range(steps):
        for idx in range(per_step):
            rows.append(
                {
                    "step": step,
                    "idx": idx,
                    "group_id": str(idx // 4),
                    "prompt": f"prompt {rng.choice(['alpha', 'beta', '50%_off'])} {idx}",
                    "completion": f"answer {rng.randrange(5)}",
                    "rewards": {"task": rng.choice([0.0, 0.5, 1.0])} if rng.random() < 0.5 else {},
                    "total": None if rng.random() < 0.3 else rng.choice([0.0, 0.25, 0.5, 1.0]),
                    "advantage": None if rng.random() < 0.1 else round(rng.gauss(0, 1), 1),
                    "length": None if rng.random() < 0.1 else rng.randrange(1, 8),
                }
            )
    store.add_rollouts(run_id, rows)
    store.add_rollouts(other, [dict(r, prompt="other run") for r in rows[:30]])
    for row in rows:  # as stored: a total left out is the sum of the rewards when they are all there
        row["task"] = row["rewards"].get("task")
        row["id"], row["total"] = store.conn.execute(
            "SELECT id, total FROM rollouts WHERE run_id=? AND step=? AND idx=?",
            (run_id, row["step"], row["idx"]),
        ).fetchone()
    return run_id, rows


def expected(rows: list[dict[str, Any]], query: RolloutQuery, match: Any = None) -> list[int]:
    """The ids of `query` by a plain sort: the source's order, or the value (ties by id) with the rows that
    have none last, by id, in the same direction."""
    chosen = [
        r for r in rows if (query.step is None or r["step"] == query.step) and (match is None or match(r))
    ]
    if query.sort == "order":
        ordered = sorted(chosen, key=lambda r: (r["step"], r["idx"]), reverse=query.descending)
        return [r["id"] for r in ordered]
    column = VALUE[query.sort]
    having = sorted(
        (r for r in chosen if r[column] is not None),
        key=lambda r: (r[column], r["id"]),
        reverse=query.descending,
    )
    missing = sorted(
        (r for r in chosen if r[column] is None), key=lambda r: r["id"], reverse=query.descending
    )
    return [r["id"] for r in having + missing]


def read_forward(reader: StoreReader, query: RolloutQuery, limit: int) -> list[int]:
    ids: list[int] = []
    after = None
    while True:
        page = reader.rollout_page(query, after=after, limit=limit)
        ids += [r.id for r in page]
        if len(page) < limit:
            return ids
        after = page[-1].key


def read_backward(reader: StoreReader, query: RolloutQuery, limit: int) -> list[int]:
    ids: list[int] = []
    before = None
    while True:
        page = reader.rollout_page(query, after=before, limit=limit, backward=True)
        ids = [r.id for r in page] + ids
        if len(page) < limit:
            return ids
        before = page[0].key


@pytest.mark.parametrize("sort", SORTS)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("step", [None, 3])
def test_pages_by_keyset_are_the_plain_sort(
    store: Store, sort: str, descending: bool, step: int | None
) -> None:
    run_id, rows = build(store)
    reader = StoreReader(store.path)
    query = RolloutQuery(run_id, step, sort, descending)
    want = expected(rows, query)
    assert reader.rollout_total(query) == len(want)
    for limit in (1, 7, 500):
        assert read_forward(reader, query, limit) == want
        assert read_backward(reader, query, limit) == want
    for position in (0, 1, len(want) // 2, len(want) - 2, len(want) - 1):
        key = reader.rollout_key_at(query, position, len(want))
        [row] = reader.rollout_page(query, after=key, limit=1, inclusive=True)
        assert row.id == want[position]
    assert reader.rollout_key_at(query, len(want), len(want)) is None
    reader.close()


def test_filters_are_the_plain_filter(store: Store) -> None:
    run_id, rows = build(store, seed=1)
    reader = StoreReader(store.path)
    cases = {
        "reward<0.5 adv>0": lambda r: (
            (r["total"] is not None and r["total"] < 0.5)
            and (r["advantage"] is not None and r["advantage"] > 0)
        ),
        "len>=4 step!=2": lambda r: r["length"] is not None and r["length"] >= 4 and r["step"] != 2,
        "task=1": lambda r: r["task"] == 1.0,
        "ALPHA": lambda r: "alpha" in r["prompt"],  # any case
        "50%": lambda r: "50%" in r["prompt"],  # LIKE's wildcards are text here
        "_off": lambda r: "_off" in r["prompt"],
        '"answer 3" beta': lambda r: "answer 3" in r["completion"] and "beta" in r["prompt"],
        "nothing-matches": lambda r: False,
    }
    for text, match in cases.items():
        for sort in ("order", "reward"):
            query = RolloutQuery(run_id, None, sort, True, parse_filter(text))
            want = expected(rows, query, match)
            assert read_forward(reader, query, 10) == want, text
            assert reader.rollout_total(query) == len(want), text
    reader.close()


def test_the_sorts_read_along_an_index(store: Store) -> None:
    run_id, _ = build(store)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 7
    reader = StoreReader(store.path)
    plans: list[str] = []

    def trace(sql: str) -> None:
        if sql.startswith("SELECT") and "PRAGMA" not in sql:
            plan = store.conn.execute("EXPLAIN QUERY PLAN " + sql.replace("?", "1")).fetchall()
            plans.append(str(plan))

    reader.conn.set_trace_callback(trace)
    for sort in ("reward", "advantage", "length"):
        reader.rollout_page(RolloutQuery(run_id, None, sort, True), after=(0, 1.0, 5), limit=10)
        column = VALUE[sort]
        assert f"idx_rollouts_run_{column}" in plans[-1] and "TEMP B-TREE" not in plans[-1], plans[-1]
    # One step: its rows come from the (run, step, idx) index, never a walk of the run along a value index.
    reader.rollout_page(RolloutQuery(run_id, 3, "reward", True), limit=10)
    assert "idx_rollouts_run_step_idx" in plans[-1], plans[-1]
    # New rows' steps: read along the new ids only.
    assert reader.rollout_steps_since(run_id, 5) == list(range(7))
    assert "INTEGER PRIMARY KEY" in plans[-1], plans[-1]
    reader.close()


def test_step_lists_groups_and_token_entropy(store: Store) -> None:
    run_id = store.create_run("tokens", source_kind="carl", vocab_size=512)
    values = [[0.1, 0.2, 3.0], [0.5, 4.0, float("nan")], None]
    store.add_rollouts(
        run_id,
        [
            {
                "step": 4,
                "idx": i,
                "group_id": "g" if i < 2 else "",
                "prompt": "same" if i else "first",
                "completion": str(i),
                "tokens": None if v is None else ["a"] * len(v),
                "entropy": v,
            }
            for i, v in enumerate(values)
        ]
        + [{"step": 9, "idx": 0, "prompt": "p", "completion": "c", "tokens": ["x"], "entropy": [1.0]}],
    )
    reader = StoreReader(store.path)
    assert reader.rollout_step_list(run_id) == [4, 9] and reader.rollout_step_list(run_id, after=4) == [9]
    assert [r["idx"] for r in reader.rollout_group(run_id, 4, "g")] == [0, 1]
    assert [r["idx"] for r in reader.rollout_group(run_id, 4, "", "same")] == [2]  # no group: the same prompt
    hist = reader.entropy_histogram(run_id, 4, bins=4, top=math.log(512))
    assert hist is not None and (hist.tokens, hist.samples, sum(hist.counts)) == (5, 2, 5)
    assert hist.edges[-1] == pytest.approx(math.log(512)) and hist.counts == [3, 1, 1, 0]  # NaN left out
    assert reader.entropy_histogram(run_id, 5) is None
    finite = [0.1, 0.2, 3.0, 0.5, 4.0]
    band = reader.entropy_band(run_id, [4, 9, 11])  # float16 as stored: three significant digits
    assert [step for step, *_ in band] == [4, 9] and band[1] == (9, 1.0, 1.0, 1.0)
    assert band[0][1:] == pytest.approx(tuple(percentiles(finite, (10, 50, 90))), rel=1e-3)
    assert percentiles([5.0, 1.0, 3.0, 2.0, 4.0], (10, 50, 90)) == [1.0, 3.0, 5.0]
    assert spread(list(range(10)), 4) == [0, 3, 6, 9] and spread([1, 2], 5) == [1, 2]
    reader.close()


def test_a_store_before_schema_7_is_read_without_its_indexes(tmp_path: Path) -> None:
    with Store(tmp_path / "carl.db") as store:
        run_id, rows = build(store)
        for column in ("total", "advantage", "length"):
            store.conn.execute(f"DROP INDEX idx_rollouts_run_{column}")
        store.conn.execute("PRAGMA user_version=6")
    reader = StoreReader(tmp_path / "carl.db")
    query = RolloutQuery(run_id, None, "reward", True)
    assert read_forward(reader, query, 9) == expected(rows, query)
    reader.close()
    with Store(tmp_path / "carl.db") as store:  # a writer migrates it
        indexes = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"idx_rollouts_run_total", "idx_rollouts_run_advantage", "idx_rollouts_run_length"} <= indexes


# -- the viewer's reader thread, driven here by hand ---------------------------------------------------------


def answers(reader: RolloutsReader, timeout: float = 0.0) -> list[Any]:
    return reader.answer(timeout=timeout)


def test_the_reader_thread_reads_pages_counts_and_follows_steps(store: Store) -> None:
    run_id = store.create_run("live", source_kind="carl", vocab_size=64)
    sample = {"prompt": "p", "completion": "c", "tokens": ["a", "b"], "entropy": [0.5, 2.0]}
    store.add_rollouts(
        run_id, [dict(sample, step=s, idx=i, total=float(i)) for s in (1, 2) for i in range(250)]
    )
    reader = RolloutsReader(store.path, run_id, period=0.0)
    first = answers(reader)
    assert [r for r in first if isinstance(r, Steps)] == [Steps([1, 2], reset=True)]

    generation = reader.set_query(RolloutQuery(run_id, None, "reward", True))
    reader.want_pages(generation, [0, 2])  # page 2 is far: not answered, asked again once the size is known
    got = answers(reader)
    pages = {r.number: r for r in got if isinstance(r, Page)}
    assert [r.total for r in pages[0].rows[:3]] == [249.0, 249.0, 248.0] and 2 not in pages
    assert [r for r in got if isinstance(r, Total)] == [Total(generation, 500)]
    reader.want_pages(generation, [4, 2, 3])  # the last page from the end, then by keyset either way
    pages = {r.number: r.rows for r in answers(reader) if isinstance(r, Page)}
    assert [len(pages[n]) for n in (2, 3, 4)] == [PAGE, PAGE, PAGE]
    assert pages[4][-1].total == 0.0 and pages[2][0].total == 149.0
    assert reader.rows_read == 4 * PAGE  # each page once, nothing else

    newer = reader.set_query(RolloutQuery(run_id, 1))  # a new list: the old one's pages are dropped
    reader.want_pages(generation, [1])
    reader.want_pages(newer, [0, 1, 2])
    got = answers(reader)
    assert all(r.generation == newer for r in got if isinstance(r, Page | Total))
    assert [len(r.rows) for r in got if isinstance(r, Page)] == [100, 100, 50]

    reader.want_histogram(2, None)
    reader.want_band()
    got = answers(reader)
    [hist] = [r for r in got if isinstance(r, StepHistogram)]
    assert hist.histogram is not None and (hist.histogram.samples, hist.histogram.tokens) == (250, 500)
    [band] = [r for r in got if isinstance(r, Band)]
    assert [p[0] for p in band.points] == [1, 2]

    store.add_rollouts(run_id, [dict(sample, step=3, idx=0), dict(sample, step=2, idx=900)])
    got = answers(reader)
    assert Steps([1, 2, 3], frozenset({2, 3})) in got
    assert [p[0] for r in got if isinstance(r, Band) for p in r.points] == [1, 2, 3]
    with store.transaction():  # a resume forgets the steps after its checkpoint
        store.conn.execute("DELETE FROM rollouts WHERE run_id=? AND step>=2", (run_id,))
    assert Steps([1], reset=True) in answers(reader)
    reader.close()
