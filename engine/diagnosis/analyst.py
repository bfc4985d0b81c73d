"""The offline analyst: a deterministic diagnosis from the same digest Claude gets.

It looks for the failures RL practitioners actually hit — a plateau, reward hacking (format up,
task flat), a cascade gate that never opens, the coherence trap (Phi up, task flat), entropy
collapse, groups with no reward variance, a NaN loss, a stalled or failed run — and answers with
the numbers behind each finding. A question that names a step ("since step 40") also gets the
before/after figures around that step.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .redact import redact

SEVERITY_ORDER = {"red": 0, "yellow": 1, "info": 2}
OFFLINE_LABEL = "**Offline analyst** (deterministic, from the store; not Claude)"
ENTROPY_COLLAPSE = 0.5  # late entropy below this share of the early entropy
ZERO_STD_SHARE = 0.5  # groups with one reward for every completion: no advantage, no gradient
HACK_FORMAT = 0.9
HACK_GAP = 0.3  # format reward at least this far above the task reward
SILENT_S, CRASHED_S = 120.0, 600.0
NON_TASK = {"format", "concise", "coherence", "commitment"}


@dataclass
class Finding:
    severity: str  # red | yellow | info
    topic: str  # plateau, hacking, gate, trap, entropy, variance, nan, stalled, failed, eval, ...
    title: str
    detail: str
    advice: str = ""


def _f(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def task_keys(digest: dict[str, Any]) -> list[str]:
    """The run's task reward series: rewards/<name>/mean of every reward that is not format,
    concise or coherence; the total reward when there are none."""
    trends = digest["trends"]
    keys = [k for k in trends if k.startswith("rewards/") and k.split("/")[1] not in NON_TASK]
    if keys:
        return keys
    return [k for k in ("reward", "train/reward") if k in trends]


def _is_flat(t: dict[str, Any]) -> bool:
    """No movement beyond noise: flat for the last quarter or more, or an early→late change
    within two noise widths."""
    if t["flat_since"] is not None:
        return True
    change, noise = t.get("change"), t.get("noise") or 0.0
    return change is not None and abs(change) <= 2 * noise


def _steps(t: dict[str, Any]) -> int:
    return t["last_step"] - t["first_step"] + 1


# -- the checks --------------------------------------------------------------------------------


def _failed(d: dict[str, Any]) -> list[Finding]:
    run = d["run"]
    if run["status"] == "failed" or run["error"]:
        return [Finding("red", "failed", "The run failed",
                        f"at step {_f(run['step'])}: {run['error'] or 'no reason recorded'}",
                        "fix the cause, then resume from the last checkpoint (r in the control room)")]  # fmt: skip
    return []


def _nan(d: dict[str, Any]) -> list[Finding]:
    for key in ("loss", "train/loss"):
        points = d["series"].get(key)
        t = d["trends"].get(key)
        if not t:
            continue
        bad = [s for s, v in points or [] if v is None]
        if t["nan_steps"] or bad or t["last"] is None:
            first = bad[0] if bad else t["last_step"]
            return [Finding("red", "nan", "The loss became NaN",
                            f"{key} is NaN/inf from about step {first} (last finite value {_f(t['vmax'])} at most)",
                            "lower the learning rate or clip gradients harder, and resume from a checkpoint before it")]  # fmt: skip
    return []


def _stalled(d: dict[str, Any]) -> list[Finding]:
    run = d["run"]
    if run["status"] != "running" or not run["last_update"]:
        return []
    quiet = d["now"] - run["last_update"]
    if quiet < SILENT_S:
        return []
    severity = "red" if quiet >= CRASHED_S else "yellow"
    mins = quiet / 60
    return [Finding(severity, "stalled", "The run has stopped writing steps",
                    f"no step since {mins:.0f} min (last step {_f(run['step'])}); status still says running",
                    "check the training process and its log (logs/train-*.log under $CARL_HOME)")]  # fmt: skip


def _plateau(d: dict[str, Any]) -> list[Finding]:
    out = []
    for key in task_keys(d):
        t = d["trends"][key]
        if t["flat_since"] is None or _steps(t) < 8:
            continue
        span = t["last_step"] - t["flat_since"] + 1
        share = span / _steps(t)
        level = t["flat_level"]
        detail = (f"{key} has stayed at {_f(level)} ± {_f(t['noise'])} since step {t['flat_since']} "
                  f"({span} steps, {share:.0%} of the steps it was logged; range {_f(t['vmin'])}–{_f(t['vmax'])})")  # fmt: skip
        ceiling = t["vmax"] is not None and level is not None and level >= 0.95 * t["vmax"] and level >= 0.95
        if ceiling:
            out.append(Finding("info", "plateau", f"{key} is at its ceiling", detail, "the task is solved"))
            continue
        out.append(Finding("yellow", "plateau", f"{key} is flat", detail,
                           "check the zero-variance share and the entropy; a larger group (num_generations), "
                           "a higher temperature or a learning-rate change can restart progress"))  # fmt: skip
    return out


def _hacking(d: dict[str, Any]) -> list[Finding]:
    trends = d["trends"]
    fmt = trends.get("rewards/format/mean")
    tasks = [trends[k] for k in task_keys(d) if k.startswith("rewards/")]
    if not fmt or not tasks or fmt["late"] is None:
        return []
    task = tasks[0]
    # The shape learned far better than the task; a task reward flat near the top is success, not hacking.
    behind = task["late"] is not None and fmt["late"] - task["late"] >= HACK_GAP
    if fmt["late"] >= HACK_FORMAT and _is_flat(task) and behind:
        return [Finding("yellow", "hacking", "Reward hacking: the format is learned, the task is not",
                        f"format reward at {_f(fmt['late'])} (from {_f(fmt['early'])}) while {task['key']} stays flat at "
                        f"{_f(task['late'])} (change {_f(task['change'])}, noise {_f(task['noise'])})",
                        "raise the task weight or lower the format weight; check the task reward on samples (v)")]  # fmt: skip
    return []


def _gate(d: dict[str, Any]) -> list[Finding]:
    gate = d["gate"]["current"]
    if not gate:
        return []
    transitions = d["gate"]["transitions"]
    opened = [t for t in transitions if t["state"] in ("open", "ramping")]
    if gate["state"] in ("open", "ramping"):
        step = opened[0]["step"] if opened else gate["step"]
        return [Finding("info", "gate", "The cascade gate is open",
                        f"since step {step}; coherence weights at ×{_f(gate['multiplier'])}: {gate['reason']}")]  # fmt: skip
    first = transitions[0]["step"] if transitions else gate["step"]
    closed_for = gate["step"] - first + 1
    if closed_for < 20:
        return []
    return [Finding("yellow", "gate", "The cascade gate has never opened",
                    f"closed for {closed_for} steps (since step {first}): {gate['above']}/{gate['window']} recent "
                    f"steps above the threshold {_f(gate['threshold'])}; {gate['reason']}",
                    "the coherence rewards are not acting; the task reward is not showing sustained progress — "
                    "lower cascade.percentile or cascade.min_above if that progress is real")]  # fmt: skip


def _trap(d: dict[str, Any]) -> list[Finding]:
    phi = d.get("rewarded_trends", {}).get("phi/mean") or d["trends"].get("phi/mean")
    keys = task_keys(d)
    if not phi or not keys or phi["early"] is None or phi["late"] is None:
        return []
    task = d["trends"][keys[0]]
    rise = phi["late"] - phi["early"]
    if rise > max(0.05, 3 * (phi["noise"] or 0)) and phi["late"] >= 0.9 and _is_flat(task):
        return [Finding("red", "trap", "The coherence trap: Φ rises while the task does not",
                        f"Φ {_f(phi['early'])}→{_f(phi['late'])} (max {_f(phi['vmax'])}) while {task['key']} stays at "
                        f"{_f(task['late'])} (change {_f(task['change'])}): the policy is becoming certain, not correct",
                        "keep the coherence weights below the task's (cascade.cap_ratio), or close the gate by "
                        "lowering their weights (w) until the task reward moves")]  # fmt: skip
    return []


def _entropy(d: dict[str, Any]) -> list[Finding]:
    t = d["trends"].get("phi/entropy") or d["trends"].get("entropy")
    during = d.get("rewarded_trends", {}).get("phi/entropy")
    if not t or not t["early"] or t["late"] is None:
        return []
    if t["late"] < ENTROPY_COLLAPSE * t["early"]:
        warmup = (d["config"] or {}).get("sft_warmup_steps")
        note = f" (an SFT warm-up of {warmup} steps explains part of it)" if warmup else ""
        if during and during["early"] and during["late"] is not None:
            note += f"; over the rewarded steps {_f(during['early'])}→{_f(during['late'])}"
        return [Finding("yellow", "entropy", "Entropy collapsed",
                        f"{t['key']} fell from {_f(t['early'])} to {_f(t['late'])} nats "
                        f"({(t['late'] / t['early'] - 1):+.0%}; min {_f(t['vmin'])}){note}",
                        "a collapsed policy explores little: raise the temperature or add an entropy bonus")]  # fmt: skip
    return []


def _variance(d: dict[str, Any]) -> list[Finding]:
    t = d["trends"].get("frac_reward_zero_std")
    if not t or t["late"] is None or t["late"] < ZERO_STD_SHARE:
        return []
    return [Finding("red" if t["late"] >= 0.9 else "yellow", "variance", "Groups without reward variance",
                    f"{t['late']:.0%} of recent groups gave every completion the same reward (early {t['early']:.0%}):"
                    " those prompts contribute no advantage, so no gradient",
                    "use partial-credit rewards, a larger group (num_generations) or a higher temperature")]  # fmt: skip


def _clipped(d: dict[str, Any]) -> list[Finding]:
    t = d["trends"].get("completions/clipped_ratio")
    if not t or t["late"] is None or t["late"] < 0.5:
        return []
    return [Finding("yellow", "length", "Most completions hit the length limit",
                    f"{t['late']:.0%} of recent completions were cut at max_completion_length",
                    "raise max_completion_length or reward shorter answers (concise)")]  # fmt: skip


def _eval(d: dict[str, Any]) -> list[Finding]:
    e = d.get("eval")
    if not e:
        return []
    m = e["metrics"]
    figures = ", ".join(
        f"{k} {_f(m[k])}" for k in ("task", "solved", "format", "phi") if m.get(k) is not None
    )
    if e["passed"]:
        return [Finding("info", "eval", "The held-out eval passed", f"{figures}: {'; '.join(e['reasons'])}")]
    return [Finding("yellow", "eval", "The held-out eval failed", f"{figures}: {'; '.join(e['reasons'])}",
                    "the model does not yet do the task on prompts it never trained on")]  # fmt: skip


def _health(d: dict[str, Any], found: list[Finding]) -> list[Finding]:
    reasons = d["run"]["health_reasons"] or []
    if not reasons or d["run"]["health"] == "green":
        return []
    return [Finding(d["run"]["health"] or "yellow", "health", "The engine's health check",
                    "; ".join(reasons))]  # fmt: skip


CHECKS = (_failed, _nan, _stalled, _trap, _hacking, _plateau, _gate, _entropy, _variance, _clipped, _eval)


def analyze(digest: dict[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    for check in CHECKS:
        found += check(digest)
    found += _health(digest, found)
    return sorted(found, key=lambda f: SEVERITY_ORDER.get(f.severity, 3))


# -- answering -------------------------------------------------------------------------------

TOPIC_WORDS = {
    "plateau": ("flat", "plateau", "stuck", "stall", "not improv", "not learn", "reward"),
    "hacking": ("hack", "format", "cheat", "gaming"),
    "gate": ("gate", "cascade", "coherence reward", "open"),
    "trap": ("phi", "φ", "coheren", "certain", "trap"),
    "entropy": ("entropy", "collapse", "explor"),
    "variance": ("variance", "zero", "std", "advantage", "gradient"),
    "nan": ("nan", "loss", "diverg", "inf"),
    "stalled": ("stall", "hang", "stuck", "dead", "crash"),
    "eval": ("eval", "held", "generaliz", "generalis"),
}


def _around(d: dict[str, Any], step: int) -> list[str]:
    lines = []
    keys = [*task_keys(d)[:2], "reward", "phi/mean", "phi/entropy", "frac_reward_zero_std"]
    for key in dict.fromkeys(keys):
        points = [(s, v) for s, v in d["series"].get(key, []) if v is not None]
        before = [v for s, v in points if s < step]
        after = [v for s, v in points if s >= step]
        if before and after:
            b, a = sum(before) / len(before), sum(after) / len(after)
            lines.append(f"- `{key}`: mean {_f(b)} before step {step}, {_f(a)} from it on ({a - b:+.3g})")
        elif after:
            lines.append(f"- `{key}`: {_f(after[0])} at step {step}, {_f(after[-1])} now (no data before it)")
    return lines


def answer(digest: dict[str, Any], question: str = "", *, reason: str = "") -> str:
    """A Markdown answer: what the question asks about first, then every other finding."""
    run = digest["run"]
    q = question.lower()
    findings = analyze(digest)
    wanted = {topic for topic, words in TOPIC_WORDS.items() if any(w in q for w in words)}
    findings.sort(key=lambda f: (f.topic not in wanted, SEVERITY_ORDER.get(f.severity, 3)))
    label = OFFLINE_LABEL + (f" — {reason}" if reason else "")
    lines = [label, ""]
    headline = [f"Run **{run['name']}**: {run['status']}, step {_f(run['step'])}"
                + (f" of {_f(run['max_steps'])}" if run["max_steps"] else "")
                + (f", phase {run['phase']}" if run["phase"] else "")]  # fmt: skip
    for key in (*task_keys(digest)[:1], "phi/mean", "phi/entropy"):
        t = digest["trends"].get(key)
        if t:
            headline.append(f"`{key}` {_f(t['first'])}→{_f(t['last'])}")
    lines.append("; ".join(headline) + ".")
    if match := re.search(r"step\s+(\d+)", q):
        around = _around(digest, int(match.group(1)))
        if around:
            lines += ["", f"**Around step {match.group(1)}**", *around]
    problems = [f for f in findings if f.severity != "info"]
    lines += [
        "",
        f"**Findings** ({len(problems)} problem{'s' if len(problems) != 1 else ''})" if findings else "",
    ]
    for f in findings:
        mark = {"red": "🔴", "yellow": "🟡"}.get(f.severity, "ℹ️")
        lines.append(
            f"- {mark} **{f.title}** — {f.detail}."
            + (f" *{f.advice[0].upper()}{f.advice[1:]}.*" if f.advice else "")
        )
    if not problems:
        lines += ["", "Nothing looks wrong in the numbers the store holds."]
    return redact("\n".join(lines).rstrip() + "\n")
