"""Sampling, SFT export, adapter training and plan evaluation over stored, scored trajectories
(docs/reference/karl.md §5, §6 with rules 12(c) and 12(d));
the training test trains the tiny model for real."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.store import Store
from engine.trajectories.scoring.signals import quality, score
from engine.trajectories.store import is_holdout, recompute_advantages, upsert
from engine.trajectories.training.export import (
    SYSTEM_PROMPT,
    copies_for,
    export_sft,
    plan_text,
    user_text,
)
from engine.trajectories.training.flowrl_sampler import Record, Step, load_records, sample
from engine.trajectories.training.plan_eval import (
    bootstrap_diff,
    eval_records,
    example_metrics,
    format_report,
    parse_plan,
)
from engine.trajectories.trajectory import Event, Trajectory

DOMAINS = ("web", "data", "infra")
N_TRAIN, N_HOLDOUT = 52, 8
os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})


# -- a store of synthetic, really scored trajectories ------------------------------------------------


def _uids() -> list[str]:
    """The first uids that give exactly N_TRAIN trained-on and N_HOLDOUT hold-out trajectories."""
    train, held, i = [], [], 0
    while len(train) < N_TRAIN or len(held) < N_HOLDOUT:
        uid = f"synthetic-{i}"
        side = held if is_holdout(uid) else train
        if len(side) < (N_HOLDOUT if side is held else N_TRAIN):
            side.append(uid)
        i += 1
    return sorted(train + held, key=lambda u: int(u.split("-")[1]))


def _events(kind: str, path: str) -> list[Event]:
    ok = {"success": True}
    if kind == "good":  # read, edit, test, re-read: verified and consistent
        return [
            Event("Grep", params={"pattern": "def handler"}, **ok),
            Event("Read", params={"file_path": path}, **ok),
            Event("Edit", params={"file_path": path}, **ok),
            Event("Bash", params={"command": "pytest -q"}, exit_code=0, **ok),
            Event("Read", params={"file_path": path}, **ok),
        ]
    if kind == "bad":  # blind edits, a thrashed file and failing commands
        return [
            Event("Edit", params={"file_path": path}, **ok),
            Event("Edit", params={"file_path": path}, **ok),
            Event("Edit", params={"file_path": path}, **ok),
            Event("Bash", success=False, exit_code=1, params={"command": "python run.py"}),
            Event("Bash", success=False, exit_code=2, params={"command": "python run.py --again"}),
            Event("Bash", success=False, exit_code=1, params={"command": "python run.py"}),
        ]
    return [
        Event("Glob", params={"pattern": "**/*.py"}, **ok),
        Event("Read", params={"file_path": path}, **ok),
        Event("Bash", params={"command": "ls"}, **ok),
    ]


def make_trajectory(index: int, uid: str) -> Trajectory:
    domain = DOMAINS[index % 3]
    kind = ("good", "mid", "bad", "good", "bad")[index % 5]
    path = f"/home/dev/{domain}/src/module_{index % 7}.py"
    start = 1_700_000_000.0 + index * 1000
    events = _events(kind, path)
    return Trajectory(
        uid=uid,
        session_id=f"s{index}",
        agent="claude-code",
        source="test",
        prompt=f"{kind} task {index}: fix the {domain} handler in module {index % 7}",
        cwd=f"/home/dev/{domain}",
        started_at=start,
        ended_at=start + 15 * len(events),
        events=events,
        domain=domain,
        correction=kind == "bad",
        session_continued=True,
    )


def fill_store(store: Store) -> None:
    items = []
    for index, uid in enumerate(_uids()):
        t = make_trajectory(index, uid)
        items.append((t, score(t), {}, quality(t)))
    upsert(store, items)
    recompute_advantages(
        store
    )  # docs/reference/karl.md §12(c): one pass over the whole store, before any sampling


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    with Store(home / "carl.db") as store:
        fill_store(store)
    yield home


@pytest.fixture
def records(home: Path) -> list[Record]:
    with Store(home / "carl.db") as store:
        return load_records(store, include_holdout=True)


def rec(
    i: int,
    domain: str | None = "a",
    reward: float | None = 0.5,
    advantage: float | None = 0.0,
    holdout: bool = False,
    **kw: object,
) -> Record:
    events = kw.pop(
        "events", [Step("Read", True, {"file_path": "a.py"}), Step("Edit", True, {"file_path": "a.py"})]
    )
    return Record(
        id=i,
        uid=f"u{i}",
        domain=domain,
        reward=reward,
        advantage=advantage,
        prompt=str(kw.pop("prompt", f"task number {i} in the repo")),
        events=events,  # type: ignore[arg-type]
        grade="high",
        tool_count=2,
        holdout=holdout,
        total_tools=2,
        successes=2,
        **kw,
    )  # type: ignore[arg-type]


# -- loading and sampling ---------------------------------------------------------------------------


def test_load_records_reads_the_stored_advantage_and_leaves_the_holdout_out(home: Path) -> None:
    with Store(home / "carl.db") as store:
        trained = load_records(store)
        every = load_records(store, include_holdout=True)
        stored = dict(store.conn.execute("SELECT uid, advantage FROM trajectories").fetchall())
    assert len(trained) == N_TRAIN and len(every) == N_TRAIN + N_HOLDOUT
    assert sum(r.holdout for r in every) == N_HOLDOUT and not any(r.holdout for r in trained)
    assert {r.uid: r.advantage for r in every} == stored  # read, never recomputed
    good = next(r for r in every if r.prompt.startswith("good"))
    assert good.tools == ["Grep", "Read", "Edit", "Bash", "Read"] and good.successes == good.total_tools == 5
    assert good.events[1].params == {"file_path": good.events[2].params["file_path"]}
    assert {r.domain for r in every} == set(DOMAINS)
    assert max(r.advantage for r in every) > 0 > min(r.advantage for r in every)  # type: ignore[type-var]


@pytest.mark.parametrize("strategy", ["uniform", "balanced", "advantage", "top_k"])
def test_the_holdout_is_never_sampled(records: list[Record], strategy: str) -> None:
    for seed in range(5):
        batch = sample(records, 200, strategy, seed=seed)  # type: ignore[arg-type]
        assert batch and not any(r.holdout for r in batch)


def test_balanced_gives_each_domain_its_share_and_small_domains_the_remainder() -> None:
    pool = (
        [rec(i, "a") for i in range(20)]
        + [rec(20 + i, "b") for i in range(20)]
        + [rec(40, "c"), rec(41, "c")]
    )
    batch = sample(pool, 10, "balanced", seed=1)
    # per_domain = 3, remainder = 1: the domain with at most 3 records takes the extra draw (with replacement)
    assert Counter(r.domain for r in batch) == {"a": 3, "b": 3, "c": 4}
    assert len({r.id for r in batch if r.domain == "a"}) == 3  # enough records: drawn without replacement
    even = sample([rec(i, DOMAINS[i % 3]) for i in range(60)], 9, "balanced", seed=2)
    assert Counter(r.domain for r in even) == dict.fromkeys(DOMAINS, 3)


def test_advantage_sampling_prefers_high_advantages() -> None:
    pool = [rec(i, advantage=a) for i, a in enumerate(np.linspace(-3, 3, 13))]
    batch = sample(pool, 13, "advantage", seed=0)
    assert len(batch) == 13
    draws = [r for seed in range(100) for r in sample(pool, 13, "advantage", seed=seed)]
    counts = Counter(r.id for r in draws)
    assert counts[12] > counts[6] > counts[0] > 0  # w = max(exp((A - maxA)/2), 0.01): never zero
    assert np.mean([r.advantage for r in draws]) > 1.0  # type: ignore[misc]


def test_top_k_takes_the_highest_rewards_in_order_and_min_reward_filters() -> None:
    pool = [rec(i, reward=r) for i, r in enumerate([0.2, 0.9, None, 0.7, 0.95, 0.4])]
    assert [r.id for r in sample(pool, 3, "top_k")] == [4, 1, 3]
    assert {r.id for r in sample(pool, 10, "uniform", min_reward=0.5, seed=0)} == {1, 3, 4}
    assert len(sample(pool, 10, "uniform", seed=0)) == 6  # B = min(batch, records)
    with pytest.raises(ValueError, match="unknown sampling strategy"):
        sample(pool, 3, "flowrl")  # type: ignore[arg-type]


def test_a_seed_reproduces_the_batch(records: list[Record]) -> None:
    for strategy in ("uniform", "balanced", "advantage"):
        first = [r.id for r in sample(records, 12, strategy, seed=7)]  # type: ignore[arg-type]
        assert first == [r.id for r in sample(records, 12, strategy, seed=7)]  # type: ignore[arg-type]
        assert first != [r.id for r in sample(records, 12, strategy, seed=8)]  # type: ignore[arg-type]


# -- the export -------------------------------------------------------------------------------------


def test_plan_text_matches_the_reference_format_line_by_line() -> None:
    steps = [
        Step("Read", True, {"file_path": "/home/me/proj/src/app.py"}),
        Step("Edit", True, {"file_path": "/home/me/proj/src/app.py"}),
        Step("Bash", False, {"command": "pytest -q"}),
    ]
    record = rec(1, reward=0.6149, events=steps)
    record.total_tools, record.successes = 3, 2
    assert plan_text(record).split("\n") == [
        "1. [ok] Read ../src/app.py",
        "2. [ok] Edit ../src/app.py",
        "3. [fail] Bash: pytest -q",
        "",
        "Result: 2/3 tools succeeded, reward=0.61",
    ]
    more = [
        Step("Grep", None, {"pattern": "x" * 50}),
        Step("Glob", True, {"pattern": "**/*.py"}),
        Step("Agent", True, {"description": "explore " * 10}),
        Step("Write", True, {"file_path": "src/a.py"}),
        Step("WebFetch", True, {"url": "https://example.com/" + "p" * 40, "query": "q", "description": "d"}),
        Step("TodoWrite", True, {}),
        Step("Read", True, {}),
        Step("Bash", True, {"command": "c" * 100}),
    ]
    record = rec(2, reward=None, events=more * 3)
    record.total_tools, record.successes = 60, 40
    lines = plan_text(record).split("\n")
    assert lines[:8] == [
        f"1. [?] Grep '{'x' * 40}'",
        "2. [ok] Glob '**/*.py'",
        f"3. [ok] Task: {('explore ' * 10)[:60]}",
        "4. [ok] Write src/a.py",
        f"5. [ok] WebFetch(url={('https://example.com/' + 'p' * 40)[:30]}, query=q)",
        "6. [ok] TodoWrite",
        "7. [ok] Read",
        f"8. [ok] Bash: {'c' * 80}",
    ]
    assert (
        len(lines) == 20 + 2 and lines[19].startswith("20. ") and lines[-1] == "Result: 40/60 tools succeeded"
    )


def test_user_text_falls_back_to_the_working_directory() -> None:
    assert user_text(rec(1, prompt="fix the login flow")) == "fix the login flow"
    assert user_text(rec(2, prompt="fix it", cwd="/w/app")) == "[Task in /w/app]"
    assert user_text(rec(3, prompt="")) == "[Task in unknown project]"
    assert user_text(rec(4, prompt="y" * 5000)) == "y" * 4000


def test_copies_follow_the_advantage_tiers() -> None:
    tiers = {-1.0: 0, 0.0: 0, None: 0, 0.05: 1, 0.1: 1, 0.2: 2, 0.3: 2, 0.31: 3, 4.0: 3}
    assert {a: copies_for(a) for a in tiers} == tiers


def test_export_dedups_and_drops_with_reasons(tmp_path: Path) -> None:
    pool = [
        rec(1, advantage=0.5),
        rec(2, advantage=0.5, prompt="task number 1 in the repo"),  # duplicate of 1
        rec(3, advantage=-0.2),
        rec(4, advantage=0.2, reward=0.1),
        rec(5, advantage=0.05),
        rec(6, advantage=1.0, events=[Step("Read", True, {})]),
        rec(7, advantage=2.0, holdout=True),
        rec(8, advantage=0.2),
    ]
    pool[-1].grade = "low"
    result = export_sft(pool, tmp_path, min_reward=0.2, quality="medium")
    assert result.holdout_excluded == 1 and result.eligible == 4 and result.unique == 2
    assert result.dropped == {
        "below_min_reward": 1,
        "too_few_events": 1,
        "quality": 1,
        "advantage_not_positive": 1,
        "duplicate": 1,
    }
    assert result.tiers == {0: 1, 1: 1, 2: 0, 3: 2}
    assert result.train_examples + result.valid_examples == 3 + 1


def _texts(path: Path) -> list[str]:
    return [json.dumps(json.loads(line)["messages"][1:]) for line in path.read_text().splitlines()]


def test_export_splits_by_trajectory_then_oversamples(records: list[Record], tmp_path: Path) -> None:
    result = export_sft(records, tmp_path)
    train, valid = _texts(tmp_path / "train.jsonl"), _texts(tmp_path / "valid.jsonl")
    assert not set(train) & set(valid)  # docs/reference/karl.md §12(d): no example on both sides
    assert result.holdout_excluded == N_HOLDOUT and result.unique == result.train_unique + result.valid_unique
    assert result.unique >= 10 and result.valid_unique == result.unique - int(result.unique * 0.9 + 1e-9)
    by_id = {r.id: r for r in records}
    assert len(train) == sum(
        copies_for(by_id[e.record_id].advantage) for e in {e.key: e for e in result.train}.values()
    )
    assert len(train) == result.train_examples and len(valid) == result.valid_examples
    counts = Counter(train)
    assert set(counts.values()) <= {1, 2, 3} and max(counts.values()) > 1  # repeated inside the train side
    held = {user_text(r) for r in records if r.holdout}
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert all(r["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT} for r in rows)
    assert not held & {r["messages"][1]["content"] for r in rows}
    assert all(by_id[e.record_id].advantage > 0 for e in result.train + result.valid)  # type: ignore[operator]
    pc = [json.loads(line) for line in (tmp_path / "train_pc.jsonl").read_text().splitlines()]
    assert [p["prompt"] + p["completion"] for p in pc] == [r["messages"] for r in rows]
    assert export_sft(records, tmp_path / "again").train == result.train  # seeded: the same files again


def test_uniform_training_rows_match_the_advantage_count_and_keep_valid_out(records: list[Record]) -> None:
    from engine.trajectories.training.train import training_examples

    adv, export = training_examples(records, "advantage")
    uni, _ = training_examples(records, "uniform", seed=3)
    assert len(uni) == len(adv) == export.train_examples
    valid = {e.key for e in export.valid}
    assert not valid & {e.key for e in uni} and not valid & {e.key for e in adv}
    by_id = {r.id: r for r in records}
    assert not any(by_id[e.record_id].holdout for e in uni + adv)
    assert any(by_id[e.record_id].advantage <= 0 for e in uni)  # type: ignore[operator]  # any advantage
    assert len(training_examples(records, "advantage", size=7)[0]) == 7


# -- plan parsing and metrics -----------------------------------------------------------------------


def test_a_plan_parses_back_into_its_tools(records: list[Record]) -> None:
    for record in records:
        steps = parse_plan(plan_text(record))
        assert [s.tool for s in steps] == record.tools[:20]
    text = (
        "1. [ok] Read ../src/app.py\n2. Bash: pytest -q\nnoise\n"
        "3) [fail] WebFetch(url=http://a, b, query=x)\n4. [?] Task: look around\n5. ???\n\n"
        "Result: 3/4 tools succeeded\n6. Read after.py"
    )
    steps = parse_plan(text)
    assert [s.tool for s in steps] == ["Read", "Bash", "WebFetch", "Agent"]
    assert steps[2].params == {"url": "http://a, b", "query": "x"} and steps[0].params == {
        "file_path": "../src/app.py"
    }
    assert parse_plan("complete gibberish without numbers") == []
    assert [s.tool for s in parse_plan("1. [ok] Read a.py\n2. [ok] Result: 1/1 tools\n3. Edit a.py")] == [
        "Read"
    ]


def test_example_metrics_and_bootstrap(records: list[Record]) -> None:
    record = next(r for r in records if r.prompt.startswith("good"))
    exact = example_metrics(record, plan_text(record))
    assert exact["similarity"] == exact["jaccard"] == exact["first_tool"] == 1.0
    assert exact["plan_reward"] == pytest.approx(record.reward, abs=0.05)  # same steps, all successes
    empty = example_metrics(record, "I don't know")
    assert empty["similarity"] == empty["jaccard"] == empty["first_tool"] == 0.0 and empty["steps"] == 0
    mean, lo, hi = bootstrap_diff([1.0, 0.5, 0.75, 1.0], [0.5, 0.5, 0.25, 0.5], seed=3)
    assert lo <= mean <= hi and mean == pytest.approx(0.375)
    assert bootstrap_diff([1.0, 0.5], [0.5, 0.5], seed=3) == bootstrap_diff([1.0, 0.5], [0.5, 0.5], seed=3)
    chosen, selection = eval_records(records)
    assert chosen and all(r.holdout for r in chosen) and "hold-out" in selection


# -- a real adapter ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_an_adapter_as_a_carl_run_then_evaluate_its_plans(home: Path) -> None:
    from engine.trajectories.training.plan_eval import evaluate_adapter
    from engine.trajectories.training.train import format_train, train_adapter

    result = train_adapter(home, strategy="advantage", steps=6, batch_size=2, lora_r=8, lora_alpha=16, seed=0)
    assert result.ok, format_train(result)
    assert result.run_name == "traj-advantage" and result.status == "finished"
    assert result.model_dir == home / "runs" / f"{result.run_id}-traj-advantage" / "final"  # from its id
    assert (result.model_dir / "adapter_config.json").is_file()
    assert result.dataset == home / "trajectory-data" / "traj-advantage" / "train_pc.jsonl"
    assert len(result.dataset.read_text().splitlines()) == result.examples == result.export.train_examples
    with Store(home / "carl.db") as store:
        run = store.run(result.run_id)  # type: ignore[arg-type]
        losses = store.conn.execute(
            "SELECT step FROM metrics WHERE run_id=? AND key='loss'", (result.run_id,)
        ).fetchall()

        trained = store.kv("last_train")
        triggers = {t["kind"] for t in store.kv("plasticity")["triggers"]}
    # The training is what the retraining triggers now compare against: not stale, no new data.
    assert trained["run"] == "traj-advantage" and trained["count"] > 0 and trained["domains"]
    assert "stale" not in triggers and "volume" not in triggers
    assert run is not None and run["source_kind"] == "carl" and run["last_step"] == 6
    config = json.loads(run["config"])
    assert (
        config["method"] == "sft" and config["lora"]["enabled"] and config["dataset"] == str(result.dataset)
    )
    assert sorted(s for (s,) in losses) == list(range(1, 7))

    report = evaluate_adapter(
        home, result.model_dir, compare_uniform=result.model_dir, limit=4, max_new_tokens=48
    )
    assert report.n == 4 and set(report.models) == {"adapter", "uniform", "base", "actual"}
    for model in report.models.values():
        assert model.n == 4 and 0.0 <= model.parsed_share <= 1.0
        assert all(
            0.0 <= model.means[m] <= 1.0 for m in ("similarity", "jaccard", "first_tool", "plan_reward")
        )
    assert report.models["actual"].means["similarity"] == 1.0
    same = [d for d in report.diffs if (d.a, d.b) == ("adapter", "uniform")]
    assert same and all(d.mean == d.lo == d.hi == 0.0 for d in same)  # the same adapter twice: no difference
    assert "adapter - base" in format_report(report)
