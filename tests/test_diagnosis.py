"""Diagnosis without the network: the digest, the store tools, redaction, stored conversations and
the offline analyst against constructed runs with known pathologies (real store files)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.diagnosis.analyst import analyze, answer
from engine.diagnosis.conversations import Conversations
from engine.diagnosis.digest import build_digest, digest_text
from engine.diagnosis.tools import ToolError, run_tool, tools_for
from engine.redact import redact
from engine.store import Store, StoreReader

ROOT = Path(__file__).resolve().parent.parent


def grpo_run(
    store: Store, name: str, steps: int = 120, *, seed: int = 0, status: str = "finished", **series: Any
) -> int:
    """A run with the keys TRL and carl log; `series` maps key -> f(step) (None for a NaN)."""
    rng = np.random.default_rng(seed)
    config = {
        "method": "grpo",
        "learning_rate": 1e-5,
        "num_generations": 8,
        "rewards": [{"name": "task", "weight": 1.0}, {"name": "format", "weight": 0.5}],
    }
    run_id = store.create_run(
        name, source_kind="carl", status=status, config=config, max_steps=steps, vocab_size=512
    )
    defaults = {
        "rewards/task/mean": lambda s: 0.2 + 0.6 * s / steps + rng.normal(0, 0.02),
        "rewards/format/mean": lambda s: 0.5 + 0.3 * s / steps + rng.normal(0, 0.02),
        "phi/mean": lambda s: 0.6 + 0.2 * s / steps + rng.normal(0, 0.005),
        "phi/entropy": lambda s: 3.0 - 0.8 * s / steps + rng.normal(0, 0.02),
        "loss": lambda s: 0.1 + rng.normal(0, 0.01),
        "frac_reward_zero_std": lambda s: 0.1,
    }
    defaults.update(series)
    now = time.time()
    rows = []
    for s in range(1, steps + 1):
        for key, f in defaults.items():
            value = f(s)
            rows.append((s, key, None if value is None else float(value), now))
        rows.append((s, "reward", float(defaults["rewards/task/mean"](s) or 0) + 0.5, now))
    store.add_metrics(run_id, rows)
    store.update_run(run_id, last_step=steps, last_update=now)
    return run_id


def findings(store: Store, run_id: int) -> dict[str, Any]:
    reader = StoreReader(store.path)
    try:
        digest = build_digest(reader, run_id)
    finally:
        reader.close()
    return {f.topic: f for f in analyze(digest)} | {"_digest": digest}


def test_a_healthy_run_has_no_problems(store: Store) -> None:
    found = findings(store, grpo_run(store, "good"))
    problems = [f for k, f in found.items() if k != "_digest" and f.severity != "info"]
    assert problems == []
    text = answer(found["_digest"], "how is it going?")
    assert text.startswith("**Offline analyst**") and "Nothing looks wrong" in text


def hacked_run(store: Store) -> int:
    """200 steps where the format reward climbs to 0.98 while the task reward stays flat near 0.30."""
    rng = np.random.default_rng(1)
    return grpo_run(
        store,
        "hacked",
        200,
        **{
            "rewards/task/mean": lambda s: 0.30 + rng.normal(0, 0.01),
            "rewards/format/mean": lambda s: min(0.98, 0.2 + 0.01 * s),
        },
    )


def test_plateau_and_reward_hacking(store: Store) -> None:
    run_id = hacked_run(store)
    found = findings(store, run_id)
    assert found["hacking"].severity == "yellow"
    assert re.search(r"format reward at 0\.98 .* stays flat at 0\.(29|30)", found["hacking"].detail)
    assert re.search(
        r"`rewards/task/mean` has stayed at 0\.(29|30)\d* ± 0\.0\d+ since step \d+", found["plateau"].detail
    )
    text = answer(found["_digest"], "why is reward flat since step 40?")
    assert "**Around step 40**" in text
    # The question's topic comes first.
    first = text.index("**Findings**")
    assert text.index("is flat", first) < text.index("Reward hacking", first)


def test_the_coherence_trap(store: Store) -> None:
    rng = np.random.default_rng(2)
    run_id = grpo_run(
        store,
        "trap",
        150,
        **{
            "rewards/task/mean": lambda s: 0.40 + rng.normal(0, 0.01),
            "phi/mean": lambda s: 0.55 + 0.43 * s / 150,
        },
    )
    trap = findings(store, run_id)["trap"]
    assert trap.severity == "yellow"  # as the control room's health flags the trap
    assert re.search(r"Φ 0\.6\d*→0\.9\d* .* stays at 0\.(39|40)", trap.detail)


def test_entropy_collapse_and_zero_variance(store: Store) -> None:
    run_id = grpo_run(
        store,
        "collapsed",
        100,
        **{"phi/entropy": lambda s: 5.0 * math.exp(-s / 15) + 0.05, "frac_reward_zero_std": lambda s: 0.95},
    )
    found = findings(store, run_id)
    assert "fell from" in found["entropy"].detail and "nats" in found["entropy"].detail
    assert found["variance"].severity == "red" and "95% of recent groups" in found["variance"].detail


def test_nan_loss_stalled_and_failed(store: Store) -> None:
    nan_run = grpo_run(store, "nan", 80, loss=lambda s: None if s > 50 else 0.1)
    assert "NaN" in findings(store, nan_run)["nan"].title
    stalled = grpo_run(store, "stalled", 40, status="running")
    store.update_run(stalled, last_update=time.time() - 900)
    assert findings(store, stalled)["stalled"].severity == "red"
    failed = grpo_run(store, "failed", 30, status="failed")
    store.update_run(failed, error="the loss became NaN at step 31")
    assert "the loss became NaN at step 31" in findings(store, failed)["failed"].detail


def test_a_gate_that_never_opens(store: Store) -> None:
    run_id = grpo_run(store, "gated", 100)
    store.add_gate_states(
        run_id,
        [
            {
                "step": s,
                "state": "closed",
                "threshold": 0.52,
                "history": s,
                "above": 2,
                "window": 10,
                "multiplier": 0.0,
                "reason": f"closed: 2/10 above p60=0.52 (n={s})",
            }
            for s in range(1, 101)
        ],
    )
    gate = findings(store, run_id)["gate"]
    assert gate.title == "The cascade gate has never opened"
    assert "closed for 100 steps" in gate.detail and "2/10" in gate.detail


def test_digest_text_is_compact_and_redacted(store: Store) -> None:
    run_id = grpo_run(store, "secretive", 300)
    store.update_run(run_id, error="auth failed with key sk-ant-api03-SECRETSECRETSECRET")
    reader = StoreReader(store.path)
    try:
        text = digest_text(build_digest(reader, run_id))
    finally:
        reader.close()
    assert "SECRETSECRET" not in text and "[REDACTED:anthropic-key]" in text
    assert len(text) < 12_000
    assert "rewards/task/mean" in text and "TRENDS" in text and "SERIES" in text


def test_tools_answer_from_the_store(store: Store) -> None:
    run_id = grpo_run(store, "tooled", 1000)
    store.add_samples(
        run_id,
        [
            {
                "step": 500,
                "idx": 0,
                "kind": "best",
                "prompt": "p",
                "completion": "c",
                "tokens": ["a", "b"],
                "phi": [0.5, 0.9],
                "entropy": [1.2, 0.3],
                "rewards": {"task": 1.0},
            }
        ],
    )
    reader = StoreReader(store.path)
    try:
        names = [t["name"] for t in tools_for(reader)]
        assert "get_metric" in names and "get_trajectories" not in names  # no trajectories yet
        exact = json.loads(
            run_tool(reader, run_id, "get_metric", {"key": "loss", "start_step": 10, "end_step": 20})
        )
        assert exact["raw"] and [p[0] for p in exact["points"]] == list(range(10, 21))
        stored = dict(
            store.conn.execute("SELECT step, value FROM metrics WHERE run_id=? AND key='loss'", (run_id,))
        )
        assert exact["points"][0][1] == pytest.approx(stored[10], abs=1e-6)
        wide = json.loads(run_tool(reader, run_id, "get_metric", {"key": "loss", "max_points": 50}))
        assert wide["bucket_steps"] >= 16 and len(wide["buckets"]) <= 64
        samples = json.loads(run_tool(reader, run_id, "get_samples", {"step": 480}))
        assert samples["step"] == 500 and samples["samples"][0]["phi_mean"] == pytest.approx(0.7)
        sample_id = samples["samples"][0]["id"]
        tokens = json.loads(run_tool(reader, run_id, "get_sample_tokens", {"sample_id": sample_id}))
        assert tokens["tokens"] == [["a", 0.5, 1.2], ["b", 0.9, 0.3]]
        with pytest.raises(ToolError, match="no metric 'rewards/task'"):
            run_tool(reader, run_id, "get_metric", {"key": "rewards/task"})
        with pytest.raises(ToolError, match="end_step 1 is before start_step 5"):
            run_tool(reader, run_id, "get_metric", {"key": "loss", "start_step": 5, "end_step": 1})
        with pytest.raises(ToolError, match="unknown tool"):
            run_tool(reader, run_id, "drop_tables", {})
    finally:
        reader.close()


def rollout_run(store: Store, name: str = "rolled") -> int:
    """Ten GRPO steps whose reward drops at step 6, each with 2 groups of 4 stored rollouts (per-token
    entropy and log-probability as our trainers store them); at step 6 the worst answers refuse."""
    drop = {"reward": lambda s: 0.2 if s == 6 else 0.8, "clip_ratio/region_mean": lambda s: 0.01}
    run_id = grpo_run(store, name, 10, **drop, **{"clip_ratio/low_mean": lambda s: 0.004})
    rows = []
    for step in range(1, 11):
        for idx in range(8):
            bad = step == 6 and idx % 4 == 0
            completion = (
                "I cannot help with that."
                if bad
                else f'{{"tool": "get_time", "args": {{"city": "Oslo{idx}"}}}}'
            )
            tokens = completion.split(" ")
            rows.append(
                {
                    "step": step,
                    "idx": idx,
                    "group_id": str(idx // 4),
                    "prompt": f"user: what time is it in Oslo? (step {step})",
                    "completion": completion,
                    "rewards": {"task": 0.0 if bad else 1.0, "format": 0.0 if bad else 1.0},
                    "advantage": -1.5 if bad else 0.5,
                    "length": len(tokens),
                    "tokens": tokens,
                    "entropy": [0.1 * (i + 1) + 0.01 * idx for i in range(len(tokens))],
                    "logprob": [-0.05 * (i + 1) for i in range(len(tokens))],
                }
            )
    store.add_rollouts(run_id, rows)
    return run_id


def test_glob_and_rollout_tools_answer_from_the_store(store: Store) -> None:
    run_id = rollout_run(store)
    plain = grpo_run(store, "plain", 20)
    reader = StoreReader(store.path)
    try:
        names = [t["name"] for t in tools_for(reader, run_id)]
        assert {"find_metrics", "get_rollouts", "get_rollout_tokens"} <= set(names)
        assert "get_rollouts" not in [t["name"] for t in tools_for(reader, plain)]  # no rollouts stored
        # Any key by glob or substring, with its series.
        found = json.loads(run_tool(reader, run_id, "find_metrics", {"pattern": "clip_ratio/*"}))
        assert found["keys"] == ["clip_ratio/low_mean", "clip_ratio/region_mean"]
        assert found["series"]["clip_ratio/region_mean"]["points"][0] == [1, 0.01]
        by_substring = json.loads(
            run_tool(reader, run_id, "find_metrics", {"pattern": "REWARD", "max_points": 10})
        )
        assert {"reward", "rewards/task/mean", "rewards/format/mean"} <= set(by_substring["keys"])
        assert by_substring["series"]["reward"]["points"][5] == [6, 0.2]
        with pytest.raises(ToolError, match="no metric key matches 'kl'; this run's keys: "):
            run_tool(reader, run_id, "find_metrics", {"pattern": "kl"})
        # The worst rollouts of the step nearest the one asked, then the best, then one group side by side.
        worst = json.loads(run_tool(reader, run_id, "get_rollouts", {"step": 6, "pick": "worst", "limit": 2}))
        assert (worst["step"], worst["rollouts_at_step"], worst["groups_at_step"]) == (6, 8, 2)
        assert [r["completion"] for r in worst["rollouts"]] == ["I cannot help with that."] * 2
        assert [r["idx"] for r in worst["rollouts"]] == [0, 4] and worst["rollouts"][0]["advantage"] == -1.5
        best = json.loads(run_tool(reader, run_id, "get_rollouts", {"step": 60, "pick": "best", "limit": 1}))
        assert best["step"] == 10 and best["rollouts"][0]["total"] == 2.0
        group = json.loads(
            run_tool(reader, run_id, "get_rollouts", {"step": 6, "pick": "group", "group_id": "1"})
        )
        assert [r["idx"] for r in group["rollouts"]] == [4, 5, 6, 7]
        assert (
            json.loads(run_tool(reader, plain, "get_rollouts", {"step": 1}))["note"]
            == "this run stored no rollouts"
        )
        # A rollout's tokens with their entropies, and its forks (the top fifth by entropy).
        rollout_id = worst["rollouts"][0]["id"]
        tokens = json.loads(run_tool(reader, run_id, "get_rollout_tokens", {"rollout_id": rollout_id}))
        stored = reader.rollout(rollout_id)
        assert (
            [t[0] for t in tokens["tokens"]] == stored["tokens"] == ["I", "cannot", "help", "with", "that."]
        )
        assert [t[1] for t in tokens["tokens"]] == pytest.approx(stored["entropy"], abs=1e-6)
        assert tokens["forks"] == [[4, "that.", pytest.approx(0.5, abs=1e-3)]]
        with pytest.raises(ToolError, match="no rollout 999999 in this run"):
            run_tool(reader, run_id, "get_rollout_tokens", {"rollout_id": 999999})
        with pytest.raises(ToolError, match="pick must be best, worst, group or all"):
            run_tool(reader, run_id, "get_rollouts", {"step": 6, "pick": "median"})
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnopqrst", "ANTHROPIC_API_KEY="),
        ("token hf_abcdefghijklmnopqrstuvwxyz123 used", "used"),
        ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123", "Authorization: Bearer"),
        ('{"password": "hunter2hunter2"}', '{"password": "'),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", ""),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789 and AKIAABCDEFGHIJKLMNOP", " and "),
        ("connect to nats://abcdefghijklmnopqrst@10.0.0.5:4222 now", "@10.0.0.5:4222 now"),
        ("NATS_URL=tls://hunter2hunter2@nats.example.com", "@nats.example.com"),
        ("postgres://abcdefghijklmnopqrstuvwx@db.internal/x", "@db.internal/x"),
    ],
)
def test_secrets_are_redacted(text: str, kept: str) -> None:
    out = redact(text)
    assert "[REDACTED:" in out and kept in out
    for secret in ("abcdefghijklmnopqrst", "hunter2hunter2", "MIIEpAIBAAKCAQEA", "AKIAABCDEFGHIJKLMNOP"):
        assert secret not in out


def test_a_short_nats_token_in_a_url_is_redacted_and_a_plain_user_is_not() -> None:
    assert redact("nats://s3cr3t@127.0.0.1:4222") == "nats://[REDACTED:url-token]@127.0.0.1:4222"
    assert redact("ssh://git@github.com/org/repo") == "ssh://git@github.com/org/repo"


def test_ordinary_text_is_not_redacted() -> None:
    text = "rewards/task/mean 0.55 since step 40; max_tokens: 4096; the token budget; num_tokens=128"
    assert redact(text) == text


def test_conversations_are_stored_listed_resumed_and_deleted(store: Store) -> None:
    run_id = grpo_run(store, "chatty", 10)
    chats = Conversations(store.path)
    try:
        first, _ = chats.add(None, run_id, "user", "why is reward flat?")
        chats.add(first, run_id, "tool", "get_metric", {"name": "get_metric", "input": {"key": "reward"}})
        chats.add(first, run_id, "assistant", "Because the gate is closed.")
        chats.add(first, run_id, "user", "and now?")
        chats.add(first, run_id, "error", "rate limited")  # the question got no answer
        second, _ = chats.add(None, run_id, "user", "another thread")
        listed = chats.list(run_id)
        assert [c["id"] for c in listed] == [second, first] and listed[1]["messages"] == 5
        assert listed[1]["title"] == "why is reward flat?"
        # Only user/assistant text is history, and an unanswered question is not repeated.
        assert chats.history(first) == [
            {"role": "user", "content": "why is reward flat?"},
            {"role": "assistant", "content": "Because the gate is closed."},
        ]
        assert chats.delete(first) and not chats.delete(first)
        assert [c["id"] for c in chats.list(run_id)] == [second]
        assert chats.messages(first) == []
    finally:
        chats.close()


def test_carl_diagnose_offline_streams_and_json(store: Store) -> None:
    run_id = grpo_run(store, "cli", 60, **{"rewards/task/mean": lambda s: 0.3})
    home = Path(store.path).parent
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "CARL_HOME": str(home)}
    cmd = [sys.executable, "-m", "engine.cli", "diagnose", "cli", "why is the task reward flat?"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # Into a pipe the answer is its Markdown (tests/test_diagnosis_render.py draws it on a terminal).
    assert done.stdout.startswith("**Offline analyst**") and "no ANTHROPIC_API_KEY" in done.stdout
    assert "`rewards/task/mean` is flat" in done.stdout
    as_json = subprocess.run([*cmd, "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    result = json.loads(as_json.stdout)
    assert result["offline"] and result["run_id"] == run_id
    assert any(f["topic"] == "plateau" for f in result["findings"])
    missing = subprocess.run(
        [*cmd[:4], "nope"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and missing.stderr.startswith("carl: nope: no such run")
    chats = Conversations(store.path)
    try:
        assert len(chats.list(run_id)) == 2  # each diagnose is kept as a conversation of the run
    finally:
        chats.close()
