"""The offline analyst answers the question asked: the router finds the topics (gate, Φ, entropy,
rewards, eval, loss, status, trajectories, agents), and the answer leads with the direct answer on
each, from real store files. The gate records are written the way the trainers write them: the real
`CascadeGate` fed each step's stored task-reward mean, one `gate_states` row per step and a
`gate_open` event at the opening."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import pytest
from test_diagnosis import grpo_run, hacked_run

from engine.agents.audit import AuditWriter, Incoming
from engine.agents.events import WorkerStatusEvent
from engine.coherence.analysis import analyze_run
from engine.diagnosis.analyst import ANSWERS, FINDINGS_OF, answer
from engine.diagnosis.digest import build_digest
from engine.diagnosis.router import TOPICS, route
from engine.rewards.cascade_gate import CascadeGate
from engine.store import Store, StoreReader
from engine.trajectories.store import save as save_trajectories
from engine.trajectories.trajectory import Event, Trajectory

CASCADE = {
    "mode": "gated",
    "min_points": 5,
    "percentile": 0.6,
    "window": 5,
    "min_above": 3,
    "ramp_steps": 10,
    "cap_ratio": 0.5,
}


def late_task(s: int) -> float:
    """Nothing solved for 25 steps, then a steady climb: the gate's threshold stays 0 until the
    positive steps are 40% of the history, so it opens in the 40s."""
    return 0.0 if s <= 25 else 0.2 + 0.6 * (s - 25) / 95


def gated_run(
    store: Store,
    name: str,
    steps: int,
    task: Callable[[int], float] = late_task,
    cascade: dict[str, Any] | None = None,
    **series: Any,
) -> tuple[int, int | None]:
    """A run with its gate record; returns the run id and the step the gate opened (None: never)."""
    run_id = grpo_run(store, name, steps, **{"rewards/task/mean": task}, **series)
    cascade = cascade or CASCADE
    config = json.loads(store.run(run_id)["config"])
    store.update_run(run_id, config=config | {"cascade": cascade})
    gate = CascadeGate(
        cascade["min_points"],
        cascade["percentile"],
        cascade["window"],
        cascade["min_above"],
        cascade["ramp_steps"],
        always_open=cascade["mode"] == "always",
    )
    fed = store.conn.execute(
        "SELECT step, value FROM metrics WHERE run_id=? AND key='rewards/task/mean' ORDER BY step", (run_id,)
    ).fetchall()
    for step, value in fed:
        was_open = gate.opened_at is not None
        state = gate.update(step, value)
        store.add_gate_states(run_id, [state.row()])
        if not was_open and state.opened_at is not None:
            store.add_event(run_id, step, "gate_open", state.reason)
    with store.transaction():
        analyze_run(store, run_id)  # phase and health, as the engine writes them
    return run_id, gate.opened_at


def ask(store: Store, run_id: int, question: str) -> tuple[str, str]:
    """The answer's lead (its first line after the label) and the whole answer."""
    reader = StoreReader(store.path)
    try:
        digest = build_digest(reader, run_id)
    finally:
        reader.close()
    text = answer(digest, question)
    label, blank, lead, *_ = text.splitlines()
    assert label.startswith("**Offline analyst**") and blank == ""
    return lead, text


def last_value(store: Store, run_id: int, key: str) -> tuple[int, float]:
    step, value = store.conn.execute(
        "SELECT step, value FROM metrics WHERE run_id=? AND key=? ORDER BY step DESC LIMIT 1", (run_id, key)
    ).fetchone()
    return step, value


# -- the router ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "topics"),
    [
        ("why did the gate open?", ["gate"]),
        ("When did the coherence rewards kick in?", ["gate"]),  # not Φ, not the rewards
        ("when did it open?", ["gate"]),  # a weak word, alone
        ("Is PHI rising?", ["phi"]),
        ("is Φ going up?", ["phi"]),
        ("what is the φ band?", ["phi"]),
        ("how many nats is the entropy?", ["entropy"]),
        ("is the nats server up?", ["agents"]),
        ("is the format reward hacked?", ["rewards"]),
        ("why is reward flat since step 40?", ["rewards"]),
        ("why is it stuck?", ["rewards"]),
        ("why is there no gradient?", ["rewards"]),  # zero reward variance, not the gradient norm
        ("is the grad norm exploding?", ["loss"]),
        ("did Φ rise after the gate opened?", ["phi", "gate"]),
        ("how do I aggregate these?", []),  # "gate" only at the start of a word
        ("what's the weather like?", []),
        ("How is this run doing? Is anything wrong, and what should I change?", ["status"]),
        ("is the KL too high?", ["kl"]),
        ("Is the KL divergence blowing up?", ["kl"]),  # not the loss's "diverge"
        ("did training diverge?", ["loss"]),
        ("what is the clip fraction?", ["clip"]),
        ("is the trust region too tight?", ["clip"]),
        ("what does the covariance say?", ["covariance"]),
        ("what drives the entropy down?", ["covariance"]),
        ("are the completions getting longer?", ["length"]),
        ("how many answers are truncated?", ["length"]),
        ("how long are the answers?", ["length"]),
        ("how long until it finishes?", ["status"]),
    ],
)
def test_the_router_finds_the_topics_in_order(question: str, topics: list[str]) -> None:
    assert route(question) == topics


def test_every_topic_has_an_answer_and_its_findings() -> None:
    assert [t.name for t in TOPICS] == list(ANSWERS) == list(FINDINGS_OF)


# -- the gate ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "question",
    [
        "why did the gate open?",
        "When did the cascade gate open?",
        "when did the coherence rewards kick in?",
        "Is the gate open yet?",
        "what opened the gate",
    ],
)
def test_why_the_gate_opened_leads_with_the_step_and_the_rule(store: Store, question: str) -> None:
    run_id, opened = gated_run(store, "opened", 120)
    assert opened is not None and 40 <= opened <= 45
    lead, text = ask(store, run_id, question)
    assert lead.startswith(f"The cascade gate opened at step {opened}: ")
    state = store.conn.execute(
        "SELECT above, window, threshold, history FROM gate_states WHERE run_id=? AND step=?",
        (run_id, opened),
    ).fetchone()
    assert f"{state[0]} of the last {state[1]} task-reward means" in lead
    assert f"threshold {state[2]:.3g} (the p60 of the {state[3]} means so far)" in lead
    assert "the rule needs 3 of 5" in lead
    # The window the gate looked at, from the stored task reward, and the closed step before it.
    window = [
        v
        for _, v in store.conn.execute(
            "SELECT step, value FROM metrics WHERE run_id=? AND key='rewards/task/mean' "
            "AND step BETWEEN ? AND ? ORDER BY step",
            (run_id, opened - 4, opened),
        ).fetchall()
    ]
    assert f"steps {opened - 4}–{opened}: " + ", ".join(f"{v:.3g}" for v in window) in text
    assert (
        f"At step {opened - 1} it was still closed: its threshold, the p60 of the {opened - 1} task-reward "
        in text
    )
    assert "The rule (the run's config)" in text


def test_a_gate_that_has_not_opened_says_why_not(store: Store) -> None:
    # Too few points yet.
    early, _ = gated_run(store, "early", 4)
    lead, _ = ask(store, early, "why hasn't the gate opened?")
    assert lead == (
        "The cascade gate has not opened (closed at step 4): it has 4 task-reward means and needs 5 "
        "before it may open (cascade.min_points)."
    )
    # A task reward that is 0 on most steps: a zero threshold.
    zero, opened = gated_run(store, "zero", 35)
    assert opened is None
    lead, _ = ask(store, zero, "is the cascade open?")
    assert lead.startswith(
        "The cascade gate has not opened (closed at step 35): its threshold, the p60 of the 35 "
    )
    assert (
        "is 0, and it opens only on a positive threshold: the task reward has been 0 or less on more than 60%"
        in lead
    )
    # A task reward that only falls: never above the running threshold.
    falling, opened = gated_run(store, "falling", 60, task=lambda s: 0.5 - 0.002 * s)
    assert opened is None
    lead, text = ask(store, falling, "Why is the gate still closed?")
    threshold = store.conn.execute(
        "SELECT threshold FROM gate_states WHERE run_id=? AND step=60", (falling,)
    ).fetchone()[0]
    assert lead == (
        f"The cascade gate has not opened (closed at step 60): 0 of the last 5 task-reward means are at "
        f"or above the threshold {threshold:.3g} (the p60 of the 60 so far), and it needs 3 "
        "(cascade.min_above)."
    )
    best = store.conn.execute(
        "SELECT above, window, step, threshold FROM gate_states WHERE run_id=? ORDER BY above DESC, step DESC"
        " LIMIT 1",
        (falling,),
    ).fetchone()
    assert best[0] == 2
    assert f"Closest it came: {best[0]}/{best[1]} at step {best[2]} (threshold {best[3]:.3g} then)." in text
    # The supporting finding follows, first among the findings.
    findings = text[text.index("**Findings**") :]
    assert findings.splitlines()[1].startswith("- 🟡 **The cascade gate has never opened**")


def test_an_always_on_gate_and_a_run_without_a_gate(store: Store) -> None:
    always, opened = gated_run(store, "always", 30, cascade=CASCADE | {"mode": "always"})
    lead, _ = ask(store, always, "why did the gate open so early?")
    assert opened == 1 and lead.startswith(
        "The cascade gate was open from step 1 because cascade.mode is `always`"
    )
    plain = grpo_run(store, "plain", 30)
    lead, _ = ask(store, plain, "why did the gate open?")
    assert lead.startswith("Run plain has no cascade gate record, so there is no gate to open or close")


def test_the_old_answer_did_not_lead_with_the_gate(store: Store) -> None:
    """Issue 14: 'why did the gate open?' got the general findings, and the gate was not among them."""
    run_id, opened = gated_run(store, "issue", 120)
    lead, text = ask(store, run_id, "why did the gate open?")
    assert f"opened at step {opened}" in lead and not lead.startswith("Run **issue**")


# -- Φ and entropy -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "question",
    ["How is phi doing?", "is Φ rising?", "what's the coherence of the policy?", "PHI band and phase?"],
)
def test_phi_questions_lead_with_phi(store: Store, question: str) -> None:
    run_id, _ = gated_run(
        store,
        "phi",
        120,
        **{
            "phi/mean": lambda s: 0.55 + 0.3 * s / 120,
            "phi/p10": lambda s: 0.3 + 0.2 * s / 120,
            "phi/p90": lambda s: 0.8 + 0.15 * s / 120,
        },
    )
    lead, text = ask(store, run_id, question)
    step, last = last_value(store, run_id, "phi/mean")
    assert lead.startswith(f"Φ (`phi/mean`) is {last:.3g} at step {step} (mean ")
    assert "rising from" in lead
    assert f"Band at step 120: p10 {0.5:.3g} to p90 {0.95:.3g}" in text
    phase = store.run(run_id)["phase"]
    assert phase and f"- Phase: {phase}" in text


@pytest.mark.parametrize(
    "question",
    ["did the entropy collapse?", "Entropy?", "how many nats per token now?", "is it still exploring?"],
)
def test_entropy_questions_lead_with_entropy(store: Store, question: str) -> None:
    collapsed, _ = gated_run(
        store, "collapsed", 100, **{"phi/entropy": lambda s: 5.0 * math.exp(-s / 15) + 0.05}
    )
    lead, text = ask(store, collapsed, question)
    # The numbers are health's own (its reason says them): the start of RL, and the trailing window.
    reason = json.loads(store.run(collapsed)["health_reasons"])[0]
    start, now = re.match(
        r"entropy collapsed from (\S+) to (\S+) nats since RL began at step 1$", reason
    ).groups()
    assert lead.startswith(
        f"Entropy (`phi/entropy`) since RL began at step 1: {start} nats at the start of RL (the mean of "
        f"steps 1–10), {now} now (the mean of steps 91–100), "
    )
    assert "; that is a collapse: the control room's health calls it a collapse when " in lead
    assert text.index("- 🟡 **Entropy collapsed**") == text.index("- 🟡 **", text.index("**Findings**"))
    healthy = grpo_run(store, "healthy", 100, **{"phi/entropy": lambda s: 3.0 - 0.005 * s})
    lead, _ = ask(store, healthy, question)
    assert lead.startswith("Entropy (`phi/entropy`) since RL began at step 1: 2.97 nats at the start of RL")
    assert "; no collapse: " in lead


# -- rewards, eval, loss, status -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "question",
    [
        "How are the rewards?",
        "is the task reward still improving?",
        "what does each reward do?",
        "why is the reward flat?",
    ],
)
def test_reward_questions_lead_with_the_task_reward(store: Store, question: str) -> None:
    run_id, _ = gated_run(store, "rewards", 120)
    lead, text = ask(store, run_id, question)
    step, last = last_value(store, run_id, "rewards/task/mean")
    assert lead.startswith(f"`rewards/task/mean` is {last:.3g} at step {step} (mean ")
    assert ", rising from " in lead
    assert "- `rewards/format/mean` is " in text and "- `reward` is " in text
    assert "- Weights in the config: task ×1.0, format ×0.5." in text


def test_reward_hacking_and_a_named_reward(store: Store) -> None:
    hacked = hacked_run(store)
    lead, _ = ask(store, hacked, "Is the model reward hacking?")
    assert lead.startswith("Yes, this looks like reward hacking: format reward at 0.98")
    lead, text = ask(store, hacked, "why is the format reward so high?")
    assert lead.startswith("`rewards/format/mean` is 0.98 at step 200")
    assert text.index("**Reward hacking") < text.index("is flat**")  # the rewards' findings come first
    honest, _ = gated_run(store, "honest", 120)
    lead, _ = ask(store, honest, "any reward hacking or cheating?")
    assert lead.startswith("No reward hacking in the numbers: the analyst calls it hacking when the format")


@pytest.mark.parametrize(
    "question",
    [
        "did the eval pass?",
        "How does it do on held-out prompts?",
        "what share of the holdout is solved?",
        "does it generalise?",
    ],
)
def test_eval_questions(store: Store, question: str) -> None:
    run_id, _ = gated_run(store, "evaluated", 60)
    lead, _ = ask(store, run_id, question)
    assert lead.startswith("No held-out eval has run for run evaluated") and "`carl eval evaluated`" in lead
    store.add_eval(
        run_id,
        True,
        {"task": 0.71, "solved": 0.65, "phi": 0.83, "entropy": 0.4, "format": 1.0, "step": 60, "prompts": 20},
        ["mean task reward 0.710 >= 0.500"],
    )
    lead, text = ask(store, run_id, question)
    assert lead == (
        "The held-out eval passed at step 60 on 20 held-out prompts: task reward 0.71, solved 65%, "
        "format-compliant 100%, Φ 0.83."
    )
    assert "- mean task reward 0.710 >= 0.500" in text


@pytest.mark.parametrize(
    "question", ["is the loss NaN?", "did training diverge?", "why is the loss going to inf?", "Loss?"]
)
def test_loss_questions(store: Store, question: str) -> None:
    run_id = grpo_run(store, "nan", 80, loss=lambda s: None if s > 50 else 0.1)
    lead, text = ask(store, run_id, question)
    first = re.match(r"The loss became NaN or inf: `loss` is NaN/inf from about step (\d+) ", lead)
    assert first and 51 <= int(first.group(1)) <= 53  # the NaN starts at 51; the digest holds 32 buckets
    assert "**The loss became NaN**" in text.split("**Findings**")[1].splitlines()[1]
    finite = grpo_run(store, "finite", 80, loss=lambda s: 1.0 - 0.01 * s)
    lead, _ = ask(store, finite, question)
    assert lead.startswith("The loss (`loss`) is 0.2 at step 80 (mean ") and lead.endswith("; no NaN or inf.")


@pytest.mark.parametrize(
    "question", ["how is it going?", "What's wrong?", "status?", "How is this run doing? Is anything wrong?"]
)
def test_status_questions_give_the_general_picture(store: Store, question: str) -> None:
    run_id = grpo_run(store, "good", 120)
    lead, text = ask(store, run_id, question)
    assert lead == "Run good is finished at step 120 of 120; nothing looks wrong in its numbers."
    assert "Nothing looks wrong in the numbers the store holds." in text


# -- RL health: KL, clip fractions, covariance, length ------------------------------------------------------


@pytest.mark.parametrize(
    "question", ["is the KL too high?", "KL?", "has the policy drifted from the reference model?"]
)
def test_kl_questions_get_a_direct_answer_from_the_stored_numbers(store: Store, question: str) -> None:
    calm = grpo_run(store, "calm", 100, kl=lambda s: 0.02 + 0.001 * s)
    lead, text = ask(store, calm, question)
    step, last = last_value(store, calm, "kl")
    assert lead.startswith(f"The KL to the reference (`kl`) is {last:.3g} nats at step {step} (mean ")
    assert lead.endswith("; not too high: the control room warns from 1 nat per token and calls 5 a blow-up.")
    assert "could not tell" not in text
    high = grpo_run(store, "high", 100, kl=lambda s: 0.05 * s)
    lead, text = ask(store, high, question)
    assert "; that is high: the control room warns from 1 nat per token." in lead
    assert (
        text.split("**Findings**")[1].splitlines()[1].startswith("- 🟡 **The KL to the reference is high**")
    )
    blown = grpo_run(store, "blown", 100, kl=lambda s: 0.05 if s < 60 else 2.0 ** ((s - 55) / 3))
    lead, text = ask(store, blown, question)
    assert "; that is a blow-up (the control room's health is red from 5 nats per token, or NaN)." in lead
    assert "- 🔴 **The KL to the reference blew up**" in text
    # No KL term at all: beta is 0, so nothing was computed, and the answer says why.
    plain = grpo_run(store, "no-beta", 50)
    config = json.loads(store.run(plain)["config"])
    store.update_run(plain, config=config | {"beta": 0.0})
    lead, _ = ask(store, plain, question)
    assert lead.startswith("This run has no KL term: `beta` is 0 in its config")


def test_clip_questions(store: Store) -> None:
    spiky = grpo_run(
        store,
        "spiky",
        100,
        **{
            "clip_ratio/region_mean": lambda s: 0.35 if s == 70 else 0.01,
            "clip_ratio/low_mean": lambda s: 0.3 if s == 70 else 0.004,
            "clip_ratio/high_mean": lambda s: 0.05 if s == 70 else 0.006,
        },
    )
    config = json.loads(store.run(spiky)["config"])
    store.update_run(spiky, config=config | {"epsilon": 0.2})
    lead, text = ask(store, spiky, "is the clip fraction ok?")
    assert lead.startswith(
        "The clip fraction (`clip_ratio/region_mean`, tokens whose ratio the clip held, either"
    )
    assert "it spiked to 35% (the control room calls a step above 20% a spike)." in lead
    assert "- `clip_ratio/low_mean` (below 1 - ε, A < 0): 0.004 at step 100, max 0.3." in text
    assert "- ε is 0.2 in the config: the ratio is clipped to [0.8, 1.2]." in text
    assert "- 🟡 **The clip fraction spiked**" in text
    calm = grpo_run(store, "calm", 100, **{"clip_ratio/region_mean": lambda s: 0.0})
    lead, _ = ask(store, calm, "clipping?")
    assert "; within bounds: the control room calls a step above 20% a spike and 50% sustained red." in lead
    none = grpo_run(store, "none", 20)
    assert ask(store, none, "clip ratio?")[0].startswith("This run logs no clip fraction (`clip_ratio/*`)")


def test_covariance_questions(store: Store) -> None:
    run_id = grpo_run(
        store,
        "cov",
        100,
        **{"cov/logp_adv": lambda s: 0.02 - 0.0001 * s, "phi/entropy": lambda s: 2.0 - 0.01 * s},
    )
    lead, text = ask(store, run_id, "what does the covariance say?")
    step, last = last_value(store, run_id, "cov/logp_adv")
    assert lead.startswith(f"Cov(log π, A) (`cov/logp_adv`) is {last:.3g} at step {step} (mean ")
    assert "; positive on average: the tokens the policy was already sure of are the rewarded ones" in lead
    assert (
        "- Entropy (`phi/entropy`) since RL began at step 1: 1.94 nats at the start of RL (the mean of "
        in text
    )
    lead, _ = ask(store, grpo_run(store, "observed", 20), "Cov(log π, A)? the logprob covariance")
    assert lead.startswith("This run has no `cov/logp_adv`: Cov(log π, A) is recorded by carl's own trainers")


def test_length_questions(store: Store) -> None:
    run_id = grpo_run(
        store,
        "long",
        100,
        **{
            "completions/mean_length": lambda s: 10 + 0.2 * s,
            "completions/max_length": lambda s: 32.0,
            "completions/clipped_ratio": lambda s: min(1.0, s / 80),
        },
    )
    config = json.loads(store.run(run_id)["config"])
    store.update_run(run_id, config=config | {"max_completion_length": 32})
    lead, text = ask(store, run_id, "are the completions getting longer?")
    assert lead.startswith("Completions average 30 tokens at step 100 (mean ") and ", rising from " in lead
    assert "- 100% of recent completions hit max_completion_length (32) without ending" in text
    assert "most answers are cut off." in text and "- Longest at step 100: 32 tokens." in text
    findings = text.split("**Findings**")[1].splitlines()
    assert findings[1].startswith("- 🟡 **Most completions hit the length limit**")


# -- what the offline analyst cannot answer -----------------------------------------------------------------


@pytest.mark.parametrize(
    "question",
    [
        "what do the trajectories say?",
        "How many KARL trajectories are there?",
        "which Claude Code sessions scored best?",
        "show me the best trajectory",
    ],
)
def test_trajectory_questions_say_what_the_analyst_cannot_answer(store: Store, question: str) -> None:
    run_id = grpo_run(store, "t", 20)
    lead, _ = ask(store, run_id, question)
    assert lead.startswith("The store holds no trajectories, so there is nothing to say about them")
    events = [Event("Bash", True, 0, params={"command": "pytest"}), Event("Edit", True, None, params={})]
    save_trajectories(store, [Trajectory(f"u{i}", f"s{i}", "karl", "test", events=events) for i in range(3)])
    lead, _ = ask(store, run_id, question)
    assert lead.startswith(
        "The offline analyst cannot answer questions about trajectories: "
        "it only knows the store holds 3 of them."
    )
    assert "ask Claude" in lead and "`carl trajectories status`" in lead


@pytest.mark.parametrize(
    "question",
    ["how are the agents doing?", "Which worker is failing?", "is the manager up?", "is the nats server up?"],
)
def test_agent_questions_say_what_the_analyst_cannot_answer(store: Store, question: str) -> None:
    run_id = grpo_run(store, "a", 20)
    lead, _ = ask(store, run_id, question)
    assert lead.startswith("The store holds no agent events, so there is nothing to say about them")
    status = WorkerStatusEvent(
        worker_id="w1",
        kind="model",
        task_types=["demo"],
        model="tiny",
        model_version="base",
        state="idle",
        host="box",
        pid=100,
    )
    AuditWriter(store).write([Incoming(status.subject(), status.encode(), 1, "test:1")])
    lead, _ = ask(store, run_id, question)
    assert lead.startswith(
        "The offline analyst cannot answer questions about agent events: it only knows the store "
        "holds 1 of them."
    )
    assert "Agents pane (4)" in lead


@pytest.mark.parametrize("question", ["what's the weather like?", "tell me a joke", "¿qué tal?", "42"])
def test_a_question_without_a_topic_says_so_then_gives_the_general_picture(
    store: Store, question: str
) -> None:
    run_id, _ = gated_run(store, "vague", 60)
    lead, text = ask(store, run_id, question)
    assert lead.startswith("The offline analyst could not tell what this question asks about")
    for title in ("the cascade gate", "Φ (coherence", "entropy", "the rewards", "the held-out eval"):
        assert title in lead
    assert "Run **vague**: finished, step 60 of 60" in text


def test_several_topics_get_each_in_the_order_asked(store: Store) -> None:
    run_id, opened = gated_run(store, "both", 120)
    lead, text = ask(store, run_id, "did Φ rise after the gate opened?")
    assert lead.startswith("Φ (`phi/mean`) is ")
    assert f"\nThe cascade gate opened at step {opened}: " in text
    assert text.index("Φ (`phi/mean`) is ") < text.index("The cascade gate opened")
