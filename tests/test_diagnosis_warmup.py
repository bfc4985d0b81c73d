"""The offline analyst judges a run as the control room's health does (issue 30 §11): the RL rules over the RL
steps only, from the run's RL start; during an SFT warm-up its entropy drop is learning, not a collapse. One
starting entropy per answer; a loss that falls beyond its noise is falling, not "flat". The usual questions
on a demo-like run in its warm-up, the same run in RL, a run whose entropy really collapses in RL and a run
with the box's reasons (a rank that died, a traceback in its console) each get an answer that agrees with the
run's health. Stores are written through the real writer, health by the engine's own analysis."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import end_all, finish, series, start_training, wait_for
from test_diagnosis import grpo_run
from test_training_runner import paused_at

from engine.coherence.analysis import analyze_run
from engine.console.scan import scan_console
from engine.diagnosis.analyst import answer
from engine.diagnosis.digest import build_digest, digest_text
from engine.store import ProcessRow, Store, StoreReader
from engine.system.run_processes import end_reason
from engine.training.config import load_config

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 600  # the demo's SFT warm-up
LN_V = math.log(512)  # the tiny model's vocabulary: entropy starts near ln|V|
QUESTIONS = ("how is it going?", "why did it crash?", "is it collapsing?", "why is the reward flat?")
NUMBER = r"(-?[0-9][0-9.,e+-]*)"


def warmup_entropy(s: int) -> float:
    """The demo's warm-up: from ln|V| (the untrained model) to a few hundredths of a nat."""
    return 0.06 + (LN_V - 0.06) * math.exp(-s / 25)


def demo_like(
    store: Store,
    name: str,
    last: int,
    *,
    rl_entropy: Callable[[int], float] = lambda s: 0.06 - 0.02 * (s - WARMUP) / 400,
    status: str = "running",
) -> int:
    """A run with the demo's config written as `carl train` writes it: 600 SFT steps (loss, entropy, Φ), then
    GRPO steps with the demo's rewards, up to step `last`. `rl_entropy(s)`: the entropy at RL step s."""
    rng = np.random.default_rng(7)
    config = load_config(ROOT / "engine" / "training" / "demo.yaml").model_dump(mode="json")
    run_id = store.create_run(
        name,
        source_kind="carl",
        status=status,
        config=config,
        max_steps=WARMUP + config["max_steps"],
        vocab_size=512,
    )
    store.update_run(run_id, temperature=1.0)
    now = time.time()
    rows = []
    for s in range(1, last + 1):
        entropy = warmup_entropy(s) if s <= WARMUP else rl_entropy(s)
        entropy = max(1e-4, entropy + rng.normal(0, 0.003))
        rows += [
            (s, "entropy", entropy, now),
            (s, "phi/entropy", entropy, now),
            (s, "phi/mean", 1 - entropy / LN_V, now),
            (s, "learning_rate", 0.0025 if s <= WARMUP else 0.0005, now),
        ]
        if s <= WARMUP:
            # SFT's cross-entropy: a steep fall, then a long slow one, far beyond its step-to-step noise.
            loss = 6.0 * math.exp(-s / 12) + 0.2 - 0.15 * s / WARMUP + rng.normal(0, 0.01)
            rows.append((s, "loss", loss, now))
            continue
        task = min(1.0, 0.75 + 0.2 * (s - WARMUP) / 400 + rng.normal(0, 0.05))
        rows += [
            (s, "loss", rng.normal(0, 0.02), now),
            (s, "rewards/task/mean", task, now),
            (s, "rewards/format/mean", min(1.0, 0.99 + rng.normal(0, 0.005)), now),
            (s, "rewards/concise/mean", 1.0, now),
            (s, "reward", 1.0 + task, now),
            (s, "frac_reward_zero_std", 0.05, now),
        ]
    store.add_metrics(run_id, rows)
    store.update_run(run_id, last_step=last, last_update=now)
    return run_id


def judged(store: Store, run_id: int) -> tuple[str, list[str], dict[str, Any]]:
    """Health as the engine stores it, and the digest the analyst answers from."""
    with store.transaction():
        analyze_run(store, run_id)
    row = store.run(run_id)
    assert row is not None
    reader = StoreReader(store.path)
    try:
        digest = build_digest(reader, run_id)
    finally:
        reader.close()
    return row["health"], json.loads(row["health_reasons"]), digest


def entropy_starts(text: str) -> set[str]:
    """Every number an answer gives as where the entropy started, on the lines that speak of entropy."""
    patterns = (
        rf"`phi/entropy` {NUMBER}→",  # the headline
        rf"(?:fell|went|collapsed) from {NUMBER}",
        rf"{NUMBER} nats at the start of RL",
        rf"steps only \([^)]*\): {NUMBER}",
        rf"from {NUMBER} in the first quarter",
    )
    # The loss's line names the warm-up's cross-entropy: its numbers are the loss's.
    lines = [line for line in text.splitlines() if re.search(r"(?<!cross-)[Ee]ntropy", line)]
    return {m.group(1).rstrip(".,") for line in lines for p in patterns for m in re.finditer(p, line)}


# -- §11: the warm-up is a warm-up ----------------------------------------------------------------------


def test_during_the_warm_up_the_analyst_says_warm_up_not_entropy_collapsed(store: Store) -> None:
    """The demo stopped at step 425 of its 600-step warm-up: health green, the guide says warm-up entropy is
    not judged, and the analyst said "Entropy collapsed" (6.22 → 0.08 nats over the run)."""
    run_id = demo_like(store, "demo", 425)
    health, reasons, digest = judged(store, run_id)
    assert (health, reasons) == ("green", ["training dynamics healthy"])
    for question in QUESTIONS:
        text = answer(digest, question)
        assert "Entropy collapsed" not in text and "that is a collapse" not in text, (question, text)
        assert "Nothing looks wrong in the numbers the store holds." in text, (question, text)
    assert (digest["rl"]["start"], digest["rl"]["stage"]) == (WARMUP + 1, "warmup")
    lead = answer(digest, "is it collapsing?").splitlines()[2]
    first, now = digest["entropy"]["before_rl"]["first"], digest["entropy"]["before_rl"]["last"]
    assert lead.startswith(
        "The run is in its SFT warm-up (step 425 of 600; RL starts at step 601): its entropy (`phi/entropy`) "
        f"fell from {first:.3g} nats at step 1 to {now:.3g} at step 425. That is learning, not a collapse"
    ), lead
    assert "health judges entropy collapse over the RL steps only, from step 601; it has not begun" in lead
    assert first > 5.5 and now < 0.1  # what the warm-up did: ln|V| to a few hundredths
    # The digest Claude gets says the same.
    assert "RL starts at step 601 (the run is before it: SFT warm-up of 600 steps" in digest_text(digest)


def test_a_real_collapse_during_rl_after_the_warm_up_is_one_with_healths_numbers(store: Store) -> None:
    """The same warm-up, then RL whose entropy falls from 1.5 nats to 0.05: health flags it from the start of
    RL, and the analyst says the collapse with health's own two numbers, once."""
    run_id = demo_like(store, "collapsing", 900, rl_entropy=lambda s: 0.05 + 1.45 * math.exp(-(s - 600) / 60))
    health, reasons, digest = judged(store, run_id)
    start, now = re.fullmatch(
        rf"entropy collapsed from {NUMBER} to {NUMBER} nats since RL began at step 601", reasons[0]
    ).groups()  # type: ignore[union-attr]
    assert health == "yellow" and float(start) > 1.0 and float(now) < 0.1
    text = answer(digest, "is it collapsing?")
    assert (
        f"since RL began at step 601: {start} nats at the start of RL (the mean of steps 601–630), {now} now"
        in (text)
    )
    assert "that is a collapse" in text
    status = answer(digest, "how is it going?")
    assert "🟡 **Entropy collapsed** — `phi/entropy` fell from " + start in status
    assert "The engine's health check" not in status  # the finding stands for health's reason: not twice
    assert entropy_starts(text) == entropy_starts(status) == {start}


# -- §11: one starting entropy per answer ----------------------------------------------------------------


@pytest.mark.parametrize("last", [425, 800])
def test_an_answer_names_one_starting_entropy(store: Store, last: int) -> None:
    """The analyst said "`phi/entropy` 6.22→0.0798" (the first bucket) and "fell from 2.05" (the first
    quarter's mean) in one answer. Now the start is one number everywhere: the warm-up's first step before RL,
    and the start of RL as health defines it (the mean of the first tenth of the RL steps) after."""
    run_id = demo_like(store, "demo", last)
    _, _, digest = judged(store, run_id)
    rows = store.conn.execute(
        "SELECT value FROM metrics WHERE run_id=? AND key='phi/entropy' ORDER BY step", (run_id,)
    ).fetchall()
    values = np.array([v for (v,) in rows])
    if last < WARMUP:
        expected = f"{values[0]:.3g}"
    else:
        rl = values[WARMUP:]
        expected = f"{rl[: max(5, len(rl) // 10)].mean():.3g}"
    for question in (*QUESTIONS, "what drives the entropy? the covariance"):
        text = answer(digest, question)
        assert entropy_starts(text) == {expected}, (question, text)


# -- §11: a falling loss is falling ------------------------------------------------------------------------


def test_a_loss_falling_beyond_its_noise_is_falling_and_one_within_it_is_flat(store: Store) -> None:
    """In the warm-up the loss fell 0.17 → 0.06 over its last 400 steps with a step-to-step noise of 0.01; the
    analyst called it "flat at 0.114 since step 94": the band was 2% of the whole run's range (6.2)."""
    run_id = demo_like(store, "demo", 425)
    _, _, digest = judged(store, run_id)
    loss = digest["trends"]["loss"]
    assert loss["flat_since"] is None  # the digest Claude reads says no "flat since" either
    lead = answer(digest, "how is the loss?").splitlines()[2]
    assert ", falling from " in lead and "flat" not in lead, lead
    assert re.search(rf"falling from {NUMBER} in the first quarter to {NUMBER} in the last", lead)
    # Its tail alone: still falling (the last 200 steps lose 0.05, the noise of that fit is ~0.002).
    since_200 = [
        v
        for s, v in store.conn.execute(
            "SELECT step, value FROM metrics WHERE run_id=? AND key='loss' AND step>225", (run_id,)
        )
    ]
    assert since_200[0] - since_200[-1] > 0.03
    # A loss that only wanders within its noise is flat, and said so.
    flat_run = grpo_run(store, "flat", 120)  # loss 0.1 ± 0.01
    _, _, flat = judged(store, flat_run)
    assert flat["trends"]["loss"]["flat_since"] is not None
    assert re.search(r", flat at 0\.\d+ ± 0\.0\d+ since step 1; ", answer(flat, "how is the loss?"))


def test_a_reward_rising_beyond_its_noise_is_said_to_rise(store: Store) -> None:
    """The demo's task reward rose 0.80 → 0.92 over 400 RL steps with a per-step noise of 0.08: the analyst
    called it flat since step 601, the first RL step (a rise within one step's noise), and a problem."""
    run_id = demo_like(store, "demo", 1000, status="finished")
    health, _, digest = judged(store, run_id)
    assert health == "green"
    text = answer(digest, "why is the reward flat?")
    lead = text.splitlines()[2]
    assert lead.startswith("`rewards/task/mean` is ") and ", rising from " in lead, lead
    assert "beyond its noise" in lead
    # Flat for a stretch at its end, maybe (the reward nears 1), never from the first RL step on.
    assert not re.search(r"`rewards/task/mean` has stayed at \S+ ± \S+ since step 601 ", text)
    task = digest["trends"]["rewards/task/mean"]
    assert task["change"] > task["change_band"] > 0


# -- §11: the usual questions on four runs, each answer agreeing with the run's health -------------------


def box_run(store: Store, tmp_path: Path) -> int:
    """A GRPO run whose rank 1 was killed by SIGKILL at step 80 and whose console ends with a traceback."""
    run_id = grpo_run(store, "boxed", 80, status="running")
    store.update_run(run_id, last_update=time.time() - 30)
    node = store.system.node("gpu-box", host="gpu-box", via="local")
    started = time.time() - 600
    store.system.note_processes(
        run_id,
        node,
        [
            ProcessRow(4242, started, "launcher", "running", "torchrun train.py"),
            ProcessRow(4243, started + 1, "rank", "running", "python train.py", rank=1),
        ],
    )
    rank = store.system.process_of(run_id, 4243)
    assert rank is not None
    reason = end_reason("rank 1 (pid 4243)", None, 9, 80)
    store.system.process_ended(rank["id"], exit_code=None, signal=9, end_step=80, reason=reason, died=True)
    log = tmp_path / "train.log"
    log.write_text(
        'step 79 loss=0.1\nTraceback (most recent call last):\n  File "train.py", line 12, in <module>\n'
        "    trainer.train()\nRuntimeError: NCCL communicator was aborted on rank 0\n"
    )
    store.system.add_console(run_id, str(log), "user")
    (console,) = [c for c in store.system.consoles() if c["run_id"] == run_id]
    assert scan_console(store, console, final=True).new == 1
    return run_id


@pytest.fixture
def four_runs(store: Store, tmp_path: Path) -> dict[str, int]:
    return {
        "warm-up": demo_like(store, "in-warmup", 425),
        "rl": demo_like(store, "in-rl", 800),
        "collapse": demo_like(
            store, "collapse", 900, rl_entropy=lambda s: 0.05 + 1.45 * math.exp(-(s - 600) / 60)
        ),
        "box": box_run(store, tmp_path),
    }


def test_the_usual_questions_agree_with_the_runs_health(store: Store, four_runs: dict[str, int]) -> None:
    for kind, run_id in four_runs.items():
        health, reasons, digest = judged(store, run_id)
        answers = {q: answer(digest, q) for q in QUESTIONS}
        status = answers["how is it going?"]
        # Health's verdict and every one of its reasons are in the status answer, or a finding stands for it.
        assert f"health {health}" in status, (kind, status)
        for reason in reasons:
            if reason == "training dynamics healthy":
                continue
            assert (
                reason in status
                or reason.split(":")[0] in status
                or (reason.startswith("entropy collapsed") and "**Entropy collapsed**" in status)
            ), (kind, reason, status)
        for question, text in answers.items():
            if health == "green":
                # Nothing health judges (entropy, zero-variance groups, KL, clip, the trap) is a problem.
                assert not re.search(
                    r"🟡 \*\*(Entropy collapsed|Groups without|The KL|The clip|The coh)", text
                )
            if health != "red":  # no finding graver than health's verdict (the trap was red beside a yellow)
                assert "🔴" not in text, (kind, question, text)
            if not any(r.startswith("entropy collapsed") for r in reasons):
                assert "Entropy collapsed" not in text and "that is a collapse" not in text, (kind, question)
        crash = answers["why did it crash?"].splitlines()[2]
        if kind == "box":
            assert health == "red"
            assert crash.startswith("What the store holds of its end: ")
            assert "rank 1 (pid 4243) killed by SIGKILL at step 80" in crash
            assert "`RuntimeError: NCCL communicator was aborted on rank 0`" in crash
        else:
            assert crash.startswith(f"Run {digest['run']['name']} has not crashed: it is running at step "), (
                crash
            )
        if kind == "warm-up":
            flat = answers["why is the reward flat?"].splitlines()[2]
            assert "no reward is computed before RL, so there is no reward to be flat yet" in flat
        if kind == "collapse":
            assert "that is a collapse" in answers["is it collapsing?"]
        if kind == "rl":
            assert "; no collapse: " in answers["is it collapsing?"]
            assert "- The SFT warm-up before RL (steps 1–600) is not judged" in answers["is it collapsing?"]


# -- §11 on a real run: the tiny model's warm-up, paused in it, then its first GRPO steps ----------------

REAL_WARMUP = 60


def test_a_real_tiny_model_run_in_its_warm_up_then_in_rl(
    store: Store, tmp_path: Path, tiny_model: Path
) -> None:
    """`carl train` on the demo's config (its warm-up cut to 60 steps, then 3 GRPO steps), paused in the
    warm-up: its entropy falls from ln|V| as it learns, and the analyst called that a collapse. Asked there,
    and again once RL has begun, every answer agrees with health and names one starting entropy."""
    config = load_config(ROOT / "engine" / "training" / "demo.yaml").model_dump(mode="json")
    config |= {"model": str(tiny_model), "sft_warmup_steps": REAL_WARMUP, "max_steps": 3, "save_steps": 1000}
    config["eval"]["at_end"] = False
    path = tmp_path / "warm.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    proc = start_training(tmp_path, "--config", str(path), "--name", "warm")
    try:
        run_id = wait_for(lambda: store.run_id_by_name("warm"), proc=proc)
        held = paused_at(store, run_id, proc, after_step=40)
        assert held < REAL_WARMUP
        health, reasons, digest = judged(store, run_id)
        assert (health, reasons) == ("green", ["training dynamics healthy"])
        assert (digest["rl"]["start"], digest["rl"]["stage"]) == (REAL_WARMUP + 1, "warmup")
        entropy = series(store, run_id, "phi/entropy")
        first, now = entropy[1], entropy[held]
        assert first > 6.0 and now < first / 2  # what the old rule called a collapse
        for question in (*QUESTIONS, "how is the loss?"):
            text = answer(digest, question)
            assert "Entropy collapsed" not in text and "that is a collapse" not in text, (question, text)
            assert entropy_starts(text) == {f"{first:.3g}"}, (question, text)
        lead = answer(digest, "is it collapsing?").splitlines()[2]
        assert lead.startswith(
            f"The run is in its SFT warm-up (step {held} of {REAL_WARMUP}; RL starts at step "
            f"{REAL_WARMUP + 1}): its entropy (`phi/entropy`) fell from {first:.3g} nats at step 1 to "
            f"{now:.3g} at step {held}. "
            "That is learning, not a collapse"
        ), lead
        loss = answer(digest, "how is the loss?").splitlines()[2]
        assert ", falling from " in loss and "flat" not in loss, loss
        store.enqueue_command("resume", target="run", run_id=run_id, origin="test")
        code, _, err = finish(proc, timeout=600)
    finally:
        end_all([proc])
    assert code == 0, err
    health, reasons, digest = judged(store, run_id)
    assert digest["rl"]["stage"] == "rl" and digest["run"]["step"] == REAL_WARMUP + 3
    rl_first = series(store, run_id, "phi/entropy")[REAL_WARMUP + 1]
    for question in QUESTIONS:
        text = answer(digest, question)
        assert "Entropy collapsed" not in text and "that is a collapse" not in text, (question, text)
        assert entropy_starts(text) == {f"{rl_first:.3g}"}, (question, text)
    lead = answer(digest, "is it collapsing?").splitlines()[2]
    assert f"since RL began at step {REAL_WARMUP + 1}: {rl_first:.3g} nats at step {REAL_WARMUP + 1}" in lead
    assert "too few RL steps to judge a collapse yet (3 of the 10 the control room's health needs)" in lead
