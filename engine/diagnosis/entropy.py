"""The offline analyst on entropy, judged as the control room's health judges it (docs/reference/carl.md
§6.1).

Entropy collapse is an RL failure, so it is judged over the RL steps only, from the run's RL start
(engine/coherence/analysis.py `rl_start`: the first step with a reward, or the step after the SFT warm-up the
config names), by health's own rule on the same steps (engine/coherence/health.py `judge_entropy`, read by
digest.py `entropy_brief`). An SFT warm-up is meant to make the policy certain: its entropy drop is learning,
and during a warm-up the answer says so, with what the entropy did there.

One answer names one start of the entropy: the start of RL (health's baseline) once RL has begun, the
warm-up's first step before, the run's first step for a run without RL. `span` gives it, and the headline,
the entropy answer, its finding and the covariance answer all say it.
"""

from __future__ import annotations

from typing import Any

from engine.coherence.health import ENTROPY_COLLAPSE_MIN_DROP, ENTROPY_COLLAPSE_RATIO

from .wording import Finding, code, fmt


def _steps(pair: list[int] | tuple[int, int]) -> str:
    a, b = pair
    return f"step {a}" if a == b else f"steps {a}–{b}"


def _judged(d: dict[str, Any]) -> dict[str, Any] | None:
    e = d.get("entropy")
    return e["rl"]["judged"] if e and e["rl"] else None


def warmup_name(d: dict[str, Any]) -> str:
    """What the steps before RL are: the SFT warm-up the config names, else the steps before the first
    reward."""
    return "the SFT warm-up" if d["rl"]["warmup_steps"] else "the steps before the first reward"


def span(d: dict[str, Any]) -> dict[str, Any] | None:
    """The entropy's start and where it is now, each with what it is (one definition per answer): over RL
    once it has begun (health's start and trailing window, or the RL steps' first and last value while too
    few to judge), over the warm-up before it, over the run without RL. None: no entropy logged."""
    e = d.get("entropy")
    if not e:
        return None
    stage, start = d["rl"]["stage"], d["rl"]["start"]
    if stage == "rl" and (j := _judged(d)):
        return {
            "start": j["start"],
            "start_at": f"at the start of RL (the mean of {_steps(j['start_steps'])})",
            "now": j["now"],
            "now_at": f"now (the mean of {_steps(j['now_steps'])})",
            "over": f"since RL began at step {start}",
        }
    if stage == "rl":
        rl = d["rl_trends"].get(e["key"]) or d["trends"].get(e["key"])
        return {
            "start": rl["first"],
            "start_at": f"at step {rl['first_step']}",
            "now": rl["last"],
            "now_at": f"at step {rl['last_step']}",
            "over": f"since RL began at step {start}",
        }
    if stage == "warmup" and e["before_rl"]:
        b = e["before_rl"]
        return {
            "start": b["first"],
            "start_at": f"at step {b['first_step']}",
            "now": b["last"],
            "now_at": f"at step {b['last_step']}",
            "over": f"in {warmup_name(d)}",
        }
    r = e["run"]
    return {
        "start": r["first"],
        "start_at": f"at step {r['first_step']}",
        "now": r["last"],
        "now_at": f"at step {r['last_step']}",
        "over": "over the run",
    }


def brief(d: dict[str, Any]) -> str:
    """`phi/entropy` 0.09→0.05 since RL began at step 601: the run's headline figure."""
    s = span(d)
    if not s:
        return ""
    return f"{code(d['entropy']['key'])} {fmt(s['start'])}→{fmt(s['now'])} {s['over']}"


def entropy_finding(d: dict[str, Any]) -> list[Finding]:
    j = _judged(d)
    if not j or not j["collapsed"]:
        return []
    s = span(d)
    assert s is not None
    before = (
        f"; {warmup_name(d)} before RL is not judged (its entropy drop is learning)"
        if d["entropy"]["before_rl"]
        else ""
    )
    return [
        Finding(
            "yellow",
            "entropy",
            "Entropy collapsed",
            f"{code(d['entropy']['key'])} fell from {fmt(s['start'])} nats {s['start_at']} to "
            f"{fmt(s['now'])} {s['now_at']}, {j['now'] / j['start'] - 1:+.0%}{before}",
            "a collapsed policy explores little: raise the temperature or add an entropy bonus",
            covers="entropy collapsed from ",  # health's reason, with the numbers of when it was judged
        )
    ]


def _rule() -> str:
    return (
        "the control room's health calls it a collapse when the entropy is below "
        f"{ENTROPY_COLLAPSE_RATIO:.0%} of its start of RL and at least {ENTROPY_COLLAPSE_MIN_DROP:g} nats "
        "lower"
    )


def entropy_answer(d: dict[str, Any], question: str) -> list[str]:
    e, rl = d.get("entropy"), d["rl"]
    if not e:
        return [
            "This run has no entropy series (`phi/entropy` or `entropy`), so the offline analyst cannot "
            "answer about its entropy."
        ]
    key, s = code(e["key"]), span(d)
    assert s is not None
    if rl["stage"] == "warmup":
        lines = [_warmup_lead(d, key, s)]
    elif rl["stage"] == "rl":
        lines = [_rl_lead(d, key, s)]
        if e["before_rl"]:
            steps = f"steps {e['before_rl']['first_step']}–{e['before_rl']['last_step']}"
            lines.append(
                f"- The SFT warm-up before RL ({steps}) is not judged: it makes the policy certain on "
                "purpose, so its entropy drop is learning, not a collapse."
                if rl["warmup_steps"]
                else f"- The steps before the first reward ({steps}) are not judged."
            )
    else:
        lines = [
            f"Entropy ({key}) went from {fmt(s['start'])} nats {s['start_at']} to {fmt(s['now'])} "
            f"{s['now_at']}. "
            "This run has no RL steps (no reward is logged), and entropy collapse is an RL failure: the "
            "control room's health does not judge it here, and an SFT run's entropy falls as it learns."
        ]
    temperature = d["run"]["temperature"] or (d["config"] or {}).get("temperature")
    if temperature is not None:
        lines.append(f"- Sampling temperature: {fmt(temperature)}.")
    if d["eval"] and d["eval"]["metrics"].get("entropy") is not None:
        lines.append(f"- The held-out eval's answers: {fmt(d['eval']['metrics']['entropy'])} nats.")
    return lines


def _warmup_lead(d: dict[str, Any], key: str, s: dict[str, Any]) -> str:
    rl, step = d["rl"], d["run"]["step"]
    if rl["warmup_steps"]:
        where = (
            f"The run is in its SFT warm-up (step {fmt(step)} of {fmt(rl['warmup_steps'])}; "
            f"RL starts at step {rl['start']})"
        )
        doing = (
            "That is learning, not a collapse: the warm-up trains the model on example answers, which makes "
            "it certain of them."
        )
    else:
        where = f"The run has not reached RL: no step has a reward yet (RL starts at step {rl['start']})"
        doing = "Entropy before RL is not judged."
    went = "fell" if s["now"] is not None and s["start"] is not None and s["now"] < s["start"] else "went"
    return (
        f"{where}: its entropy ({key}) {went} from {fmt(s['start'])} nats {s['start_at']} to {fmt(s['now'])} "
        f"{s['now_at']}. {doing} The control room's health judges entropy collapse over the RL steps only, "
        f"from step {rl['start']}; it has not begun."
    )


def _rl_lead(d: dict[str, Any], key: str, s: dict[str, Any]) -> str:
    j, rl = _judged(d), d["rl"]
    if j is None:
        points = d["entropy"]["rl"]["points"]
        return (
            f"Entropy ({key}) since RL began at step {rl['start']}: {fmt(s['start'])} nats {s['start_at']}, "
            f"{fmt(s['now'])} {s['now_at']}; too few RL steps to judge a collapse yet ({points} of the "
            f"{d['entropy']['rl']['needs']} the control room's health needs)."
        )
    ratio, drop = j["now"] / j["start"] if j["start"] else 0.0, j["start"] - j["now"]
    if j["collapsed"]:
        verdict = f"that is a collapse: {_rule()}, and it says so"
    elif ratio >= ENTROPY_COLLAPSE_RATIO:
        verdict = f"no collapse: {_rule()}"
    else:
        verdict = f"no collapse: it is only {fmt(drop)} nats lower, and {_rule()}"
    return (
        f"Entropy ({key}) since RL began at step {rl['start']}: {fmt(s['start'])} nats {s['start_at']}, "
        f"{fmt(s['now'])} {s['now_at']}, {ratio:.0%} of its start; {verdict}."
    )


def entropy_line(d: dict[str, Any]) -> str:
    """One line on the entropy for another topic's answer (Cov(log π, A)), with the answer's one start."""
    s = span(d)
    if not s:
        return ""
    return (
        f"Entropy ({code(d['entropy']['key'])}) {s['over']}: {fmt(s['start'])} nats {s['start_at']}, "
        f"{fmt(s['now'])} {s['now_at']}."
    )
