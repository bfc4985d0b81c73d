"""The offline analyst: a deterministic diagnosis from the same digest Claude gets.

It looks for the failures RL practitioners actually hit — a plateau, reward hacking (format up,
task flat), a cascade gate that never opens, the coherence trap (Phi up, task flat), entropy
collapse, groups with no reward variance, a NaN loss, a stalled or failed run — each with the
numbers behind it.

`answer` answers the question asked: the router (router.py) finds the topics it names (the gate,
Φ, entropy, the rewards, the eval, the loss, the KL, the clip fractions, Cov(log π, A), completion length
(those four in rl_health.py), the run's status, trajectories, agents), and each
topic's answer leads with the direct answer from the digest's numbers ("the gate opened at step 42:
3 of the last 5 task-reward means were at or above the threshold…"), then the findings follow,
those on the question's topics first. Where the digest cannot answer (trajectories and agents
beyond their counts, an eval that never ran) it says so and names what can. A question with no
topic it knows is told so, with the topics it knows, then the general picture. A question that
names a step ("since step 40") also gets the before/after figures around that step.
"""

from __future__ import annotations

import re
from typing import Any

from engine.redact import redact

from .digest import task_keys
from .entropy import brief as entropy_brief
from .entropy import entropy_answer, entropy_finding
from .rl_health import (
    clip_answer,
    clip_finding,
    covariance_answer,
    kl_answer,
    kl_finding,
    length_answer,
    length_finding,
)
from .router import TOPICS, route
from .wording import Finding, code, fmt, is_flat, level_text, moved, movement, prose

SEVERITY_ORDER = {"red": 0, "yellow": 1, "info": 2}
OFFLINE_LABEL = "**Offline analyst** (deterministic, from the store; not Claude)"
ZERO_STD_SHARE = 0.5  # groups with one reward for every completion: no advantage, no gradient
HACK_FORMAT = 0.9
HACK_GAP = 0.3  # format reward at least this far above the task reward
SILENT_S, CRASHED_S = 120.0, 600.0


def _steps(t: dict[str, Any]) -> int:
    return t["last_step"] - t["first_step"] + 1


# -- the checks --------------------------------------------------------------------------------


def _failed(d: dict[str, Any]) -> list[Finding]:
    run = d["run"]
    if run["status"] == "failed" or run["error"]:
        return [
            Finding(
                "red",
                "failed",
                "The run failed",
                f"at step {fmt(run['step'])}: "
                + (prose(run["error"]) if run["error"] else "no reason recorded"),
                "fix the cause, then resume from the last checkpoint (r in the control room)",
            )
        ]
    return []


CONSOLE_ADVICE = {
    "oom": "lower the batch (per_device_train_batch_size, num_generations) or max_completion_length, or turn "
    "on gradient checkpointing, then resume from the last checkpoint",
    "nccl": "a rank or the interconnect failed: check that every rank is alive (the processes of the run) "
    "and run again with NCCL_DEBUG=INFO for NCCL's own account",
    "traceback": "open the log view (L) on the run: t jumps to the traceback, with its frames",
}
# How health words each kind in its reason (engine/system/box_health.py CONSOLE_WHAT), which the finding
# stands for.
CONSOLE_REASON = {"traceback": "traceback", "oom": "CUDA out of memory", "nccl": "NCCL error"}
CONSOLE_TITLE = {
    "oom": "CUDA ran out of memory",
    "nccl": "An NCCL error",
    "traceback": "A traceback in the console",
}


def _console(d: dict[str, Any]) -> list[Finding]:
    """The newest traceback, CUDA out-of-memory or NCCL error the scan found in the run's console; its level
    is the engine's (the console_error reason of its health, engine/system/box_health.py) when it has one."""
    findings = (d.get("console") or {}).get("findings") or []
    if not findings:
        return []
    newest, run = findings[0], d["run"]
    ended_it = run["health"] == "red" and any("in the console:" in r for r in run["health_reasons"] or [])
    severity = (
        "red" if newest["kind"] in ("oom", "nccl") or run["status"] == "failed" or ended_it else "yellow"
    )
    at = f" line {newest['line_no']:,}" if newest["line_no"] else ""
    return [
        Finding(
            severity,
            "console",
            CONSOLE_TITLE.get(newest["kind"], "An error in the console"),
            f"{code(newest['line'])} ({prose(newest['file'])}{at})",
            CONSOLE_ADVICE.get(newest["kind"], CONSOLE_ADVICE["traceback"]),
            covers=f"{CONSOLE_REASON.get(newest['kind'], newest['kind'])} in the console: ",
        )
    ]


def _nan(d: dict[str, Any]) -> list[Finding]:
    for key in ("loss", "train/loss"):
        points = d["series"].get(key)
        t = d["trends"].get(key)
        if not t:
            continue
        bad = [s for s, v in points or [] if v is None]
        if t["nan_steps"] or bad or t["last"] is None:
            first = bad[0] if bad else t["last_step"]
            return [
                Finding(
                    "red",
                    "nan",
                    "The loss became NaN",
                    f"{code(key)} is NaN/inf from about step {first} "
                    f"(last finite value {fmt(t['vmax'])} at most)",
                    "lower the learning rate or clip gradients harder, "
                    "and resume from a checkpoint before it",
                )
            ]
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
    return [
        Finding(
            severity,
            "stalled",
            "The run has stopped writing steps",
            f"no step since {mins:.0f} min (last step {fmt(run['step'])}); status still says running",
            "check the training process and its log (logs/train-*.log under $CARL_HOME)",
        )
    ]


def _plateau(d: dict[str, Any]) -> list[Finding]:
    out = []
    for key in task_keys(d):
        t = d["trends"][key]
        if t["flat_since"] is None or _steps(t) < 8:
            continue
        span = t["last_step"] - t["flat_since"] + 1
        share = span / _steps(t)
        level = t["flat_level"]
        detail = (
            f"{code(key)} has stayed at {fmt(level)} ± {fmt(t['noise'])} since step {t['flat_since']} "
            f"({span} steps, {share:.0%} of the steps it was logged; range {fmt(t['vmin'])}–{fmt(t['vmax'])})"
        )
        ceiling = t["vmax"] is not None and level is not None and level >= 0.95 * t["vmax"] and level >= 0.95
        if ceiling:
            out.append(
                Finding("info", "plateau", f"{code(key)} is at its ceiling", detail, "the task is solved")
            )
            continue
        out.append(
            Finding(
                "yellow",
                "plateau",
                f"{code(key)} is flat",
                detail,
                "check the zero-variance share and the entropy; a larger group (num_generations), "
                "a higher temperature or a learning-rate change can restart progress",
            )
        )
    return out


def _hacking(d: dict[str, Any]) -> list[Finding]:
    trends = d["trends"]
    form = trends.get("rewards/format/mean")
    tasks = [trends[k] for k in task_keys(d) if k.startswith("rewards/")]
    if not form or not tasks or form["late"] is None:
        return []
    task = tasks[0]
    # The shape learned far better than the task; a task reward flat near the top is success, not hacking.
    behind = task["late"] is not None and form["late"] - task["late"] >= HACK_GAP
    if form["late"] >= HACK_FORMAT and is_flat(task) and behind:
        return [
            Finding(
                "yellow",
                "hacking",
                "Reward hacking: the format is learned, the task is not",
                f"format reward at {fmt(form['late'])} (from {fmt(form['early'])}) while "
                f"{code(task['key'])} stays flat at {fmt(task['late'])} (change {fmt(task['change'])}, "
                f"noise {fmt(task['noise'])})",
                "raise the task weight or lower the format weight; check the task reward on samples (v)",
            )
        ]
    return []


def _gate(d: dict[str, Any]) -> list[Finding]:
    gate = d["gate"]["current"]
    if not gate:
        return []
    transitions = d["gate"]["transitions"]
    opened = [t for t in transitions if t["state"] in ("open", "ramping")]
    if gate["state"] in ("open", "ramping"):
        step = opened[0]["step"] if opened else gate["step"]
        return [
            Finding(
                "info",
                "gate",
                "The cascade gate is open",
                f"since step {step}; coherence weights at ×{fmt(gate['multiplier'])}: {gate['reason']}",
            )
        ]
    first = transitions[0]["step"] if transitions else gate["step"]
    closed_for = gate["step"] - first + 1
    if closed_for < 20:
        return []
    return [
        Finding(
            "yellow",
            "gate",
            "The cascade gate has never opened",
            f"closed for {closed_for} steps (since step {first}): {gate['above']}/{gate['window']} recent "
            f"steps above the threshold {fmt(gate['threshold'])}; {gate['reason']}",
            "the coherence rewards are not acting; the task reward is not showing sustained progress — "
            "lower cascade.percentile or cascade.min_above if that progress is real",
        )
    ]


def _trap(d: dict[str, Any]) -> list[Finding]:
    phi = d["rl_trends"].get("phi/mean") or d["trends"].get("phi/mean")
    keys = task_keys(d)
    if not phi or not keys or phi["early"] is None or phi["late"] is None:
        return []
    task = d["trends"][keys[0]]
    rise = phi["late"] - phi["early"]
    # The task compared over the same quarters as Φ: a task reward that rose, then levelled off high, is not
    # the trap. Yellow, as the control room's health flags it (engine/coherence/health.py).
    if rise > max(0.05, 3 * (phi["noise"] or 0)) and phi["late"] >= 0.9 and not moved(task):
        return [
            Finding(
                "yellow",
                "trap",
                "The coherence trap: Φ rises while the task does not",
                f"Φ {fmt(phi['early'])}→{fmt(phi['late'])} (max {fmt(phi['vmax'])}) while "
                f"{code(task['key'])} stays at {fmt(task['late'])} (change {fmt(task['change'])}): "
                "the policy is becoming certain, not correct",
                "keep the coherence weights below the task's (cascade.cap_ratio), or close the gate by "
                "lowering their weights (w) until the task reward moves",
            )
        ]
    return []


def _variance(d: dict[str, Any]) -> list[Finding]:
    t = d["trends"].get("frac_reward_zero_std")
    if not t or t["late"] is None or t["late"] < ZERO_STD_SHARE:
        return []
    return [
        Finding(
            "red" if t["late"] >= 0.9 else "yellow",
            "variance",
            "Groups without reward variance",
            f"{t['late']:.0%} of recent groups gave every completion the same reward (early "
            f"{t['early']:.0%}): those prompts contribute no advantage, so no gradient",
            "use partial-credit rewards, a larger group (num_generations) or a higher temperature",
        )
    ]


def _eval(d: dict[str, Any]) -> list[Finding]:
    e = d.get("eval")
    if not e:
        return []
    m = e["metrics"]
    figures = ", ".join(
        f"{k} {fmt(m[k])}" for k in ("task", "solved", "format", "phi") if m.get(k) is not None
    )
    if e["passed"]:
        return [
            Finding(
                "info",
                "eval",
                "The held-out eval passed",
                f"{figures}: {'; '.join(e['reasons'])}",
            )
        ]
    return [
        Finding(
            "yellow",
            "eval",
            "The held-out eval failed",
            f"{figures}: {'; '.join(e['reasons'])}",
            "the model does not yet do the task on prompts it never trained on",
        )
    ]


# What the box says of a run (engine/system/box_health.py), as the analyst words it: a title and what to do.
BOX_FINDINGS = {
    "rank_died": (
        "A process of the run died",
        "its console shows its last lines; a SIGKILL with no traceback is most often the out-of-memory killer"
        " (dmesg says so); fix the cause, then resume from the last checkpoint",
    ),
    "disk_full": (
        "The disk the run writes on is filling",
        "free space or keep fewer checkpoints (save_total_limit) before a checkpoint fails to be written",
    ),
    "gpu_idle": (
        "The GPUs are idle",
        "a stalled data pipeline, a hung collective or work left on the CPU; the console and a stack dump of"
        " the ranks (py-spy dump) say which",
    ),
    "gpu_memory": (
        "GPU memory is nearly full",
        "lower the batch size or the sequence length, or turn on gradient checkpointing, before an"
        " out-of-memory ends the run",
    ),
    "xid": (
        "The GPU driver reported an XID error",
        "look at dmesg and nvidia-smi -q; XID 48, 74 and 79 mean the GPU needs a reset or a replacement",
    ),
}


def _box(d: dict[str, Any]) -> list[Finding]:
    """The box's reasons: a process gone, the disk filling, idle or full GPUs, XID errors."""
    found = []
    for flag in d.get("box") or []:
        if flag["cause"] in BOX_FINDINGS:
            title, advice = BOX_FINDINGS[flag["cause"]]
            reason = flag["reason"]
            found.append(Finding(flag["level"], flag["cause"], title, prose(reason), advice, covers=reason))
    return found


def _health(d: dict[str, Any], found: list[Finding]) -> list[Finding]:
    reasons = [
        r
        for r in d["run"]["health_reasons"] or []
        if not any(r == f.detail or (f.covers and r.startswith(f.covers)) for f in found)
    ]
    if not reasons or d["run"]["health"] == "green":
        return []
    return [
        Finding(
            d["run"]["health"] or "yellow",
            "health",
            "The engine's health check",
            "; ".join(prose(r) for r in reasons),
        )
    ]


CHECKS = (
    _failed,
    _console,
    _nan,
    _stalled,
    _trap,
    _hacking,
    _plateau,
    _gate,
    entropy_finding,
    _variance,
    kl_finding,
    clip_finding,
    length_finding,
    _eval,
    _box,
)


def analyze(digest: dict[str, Any]) -> list[Finding]:
    found: list[Finding] = []
    for check in CHECKS:
        found += check(digest)
    found += _health(digest, found)
    return sorted(found, key=lambda f: SEVERITY_ORDER.get(f.severity, 3))


# -- answering: the topics the question asks about, each led by its direct answer ---------------

# The findings that support each topic's answer: listed first among all the findings.
FINDINGS_OF = {
    "gate": {"gate"},
    "phi": {"trap"},
    "entropy": {"entropy"},
    "rewards": {"plateau", "hacking", "variance", "length"},
    "eval": {"eval"},
    "loss": {"nan"},
    "kl": {"kl"},
    "clip": {"clip"},
    "covariance": {"entropy"},
    "length": {"length"},
    "status": {"failed", "console", "stalled", "health", *BOX_FINDINGS},
    "trajectories": set(),
    "agents": set(),
}
# Within a topic, a finding the question names by its own words comes first ("flat": the plateau).
FINDING_WORDS = {
    "plateau": r"flat|plateau|stuck|not (?:improv|learn)",
    "hacking": r"hack|cheat|gaming|format",
    "variance": r"variance|zero[- ]std|advantage|gradient",
    "length": r"length|clipped|truncat",
}
ASK_CLAUDE = "ask Claude (set ANTHROPIC_API_KEY: it reads the store with its tools)"


def _around(d: dict[str, Any], step: int, keys: list[str] | None = None) -> list[str]:
    """Each series' mean before `step` and from it on."""
    lines = []
    if keys is None:
        keys = [*task_keys(d)[:2], "reward", "phi/mean", "phi/entropy", "frac_reward_zero_std"]
    for key in dict.fromkeys(keys):
        points = [(s, v) for s, v in d["series"].get(key, []) if v is not None]
        before = [v for s, v in points if s < step]
        after = [v for s, v in points if s >= step]
        if before and after:
            b, a = sum(before) / len(before), sum(after) / len(after)
            lines.append(
                f"- {code(key)}: mean {fmt(b)} before step {step}, {fmt(a)} from it on ({a - b:+.3g})"
            )
        elif after:
            lines.append(
                f"- {code(key)}: {fmt(after[0])} at step {step}, {fmt(after[-1])} now (no data before it)"
            )
    return lines


def _gate_answer(d: dict[str, Any], question: str) -> list[str]:
    gate, run = d["gate"], d["run"]
    now = gate["current"]
    if not now:
        return [
            f"Run {prose(run['name'])} has no cascade gate record, so there is no gate to open or close: "
            "carl records one every step for the runs it trains with a task reward (this run's source: "
            f"{prose(run['source'])})."
        ]
    rule, opened = gate["rule"], gate["opened"]
    pct = f"p{round(rule['percentile'] * 100)}"
    fed = ", ".join(f"`{k}`" for k in gate["window_keys"]) or "the task reward"
    if opened and (rule["mode"] == "always" or "always" in (opened["reason"] or "")):
        lines = [
            f"The cascade gate was open from step {opened['step']} because cascade.mode is `always` (the "
            "ablation without a gate): the coherence rewards never waited for the task reward."
        ]
    elif opened:
        lines = [
            f"The cascade gate opened at step {opened['step']}: {opened['above']} of the last "
            f"{opened['window']} task-reward means were at or above the threshold {fmt(opened['threshold'])} "
            f"(the {pct} of the {opened['history']} means so far) and above 0, and the rule needs "
            f"{rule['min_above']} of {rule['window']} (cascade.min_above of cascade.window)."
        ]
        lines += _gate_window(gate, fed)
        if before := gate["before_open"]:
            lines.append(
                f"- At step {before['step']} it was still closed: {_why_closed(before, rule, now=False)}."
            )
        lines.append(
            f"- Now (step {now['step']}): {now['reason']}; coherence weights ×{fmt(now['multiplier'])}."
        )
        lines += _around(d, opened["step"], [*task_keys(d)[:1], "phi/mean"])
    else:
        lines = [
            f"The cascade gate has not opened (closed at step {now['step']}): "
            f"{_why_closed(now, rule, now=True)}."
        ]
        lines += _gate_window(gate, fed)
        closest = gate["closest"]
        if closest and closest["step"] != now["step"] and (closest["above"] or 0) > (now["above"] or 0):
            lines.append(
                f"- Closest it came: {closest['above']}/{closest['window']} at step {closest['step']} "
                f"(threshold {fmt(closest['threshold'])} then)."
            )
        lines.append("- While it is closed the coherence rewards are not called: their weight is 0.")
    source = (
        "the run's config" if rule["source"] == "config" else "carl's defaults: the run's config has none"
    )
    lines.append(
        f"- The rule ({source}): after {rule['min_points']} task-reward means the threshold is the {pct} of "
        f"all of them; the gate opens when {rule['min_above']} of the last {rule['window']} are at or above "
        f"it and above 0, ramps the coherence weights in over {rule['ramp_steps']} steps and stays open."
    )
    return lines


def _why_closed(row: dict[str, Any], rule: dict[str, Any], *, now: bool) -> str:
    """Why the gate's record `row` is closed, by the rule: too few points, a zero threshold, or
    too few of the window's task-reward means at or above the threshold."""
    has, are, is_ = ("has", "are", "is") if now else ("had", "were", "was")
    n, threshold = row["history"] or 0, row["threshold"] or 0.0
    pct = f"p{round(rule['percentile'] * 100)}"
    if n < rule["min_points"]:
        return (
            f"it {has} {n} task-reward means and needs {rule['min_points']} before it may open "
            "(cascade.min_points)"
        )
    if threshold <= 0:
        return (
            f"its threshold, the {pct} of the {n} task-reward means so far, {is_} {fmt(threshold)}, and it "
            f"opens only on a positive threshold: the task reward {has} been 0 or less on more than "
            f"{rule['percentile']:.0%} of the steps"
        )
    return (
        f"{row['above']} of the last {row['window']} task-reward means {are} at or above the threshold "
        f"{fmt(threshold)} (the {pct} of the {n} so far), and it needs {rule['min_above']} "
        "(cascade.min_above)"
    )


def _gate_window(gate: dict[str, Any], fed: str) -> list[str]:
    window = gate["window"]
    if not window:
        return []
    values = ", ".join(fmt(v) for _, v in window)
    return [f"- The task reward the gate looked at ({fed}), steps {window[0][0]}–{window[-1][0]}: {values}."]


def _phi_answer(d: dict[str, Any], question: str) -> list[str]:
    t = d["trends"].get("phi/mean")
    if not t:
        return [
            "This run has no Φ series (`phi/mean`), so the offline analyst cannot answer about its "
            "coherence: Φ is logged by carl's own training and by CarlCallback, not by every source."
        ]
    lines = [f"Φ (`phi/mean`) is {level_text(t)}, {movement(t)}; range {fmt(t['vmin'])}–{fmt(t['vmax'])}."]
    p10, p90 = d["trends"].get("phi/p10"), d["trends"].get("phi/p90")
    if p10 and p90:
        lines.append(
            f"- Band at step {p90['last_step']}: p10 {fmt(p10['last'])} to p90 {fmt(p90['last'])} "
            f"(mean over the run {fmt(p10.get('mean'))} to {fmt(p90.get('mean'))})."
        )
    if d["run"]["phase"]:
        lines.append(f"- Phase: {d['run']['phase']} (the engine's reading of the recent Φ trend).")
    for e in d["events"]:
        if e["kind"] == "crystallization":
            lines.append(f"- Crystallization at step {e['step']}: {e['detail']}.")
    if during := d["rl_trends"].get("phi/mean"):
        lines.append(
            f"- Over the RL steps only ({during['first_step']}–{during['last_step']}): "
            f"{fmt(during['early'])} in the first quarter, {fmt(during['late'])} in the last."
        )
    if d["eval"] and d["eval"]["metrics"].get("phi") is not None:
        lines.append(f"- The held-out eval's answers: Φ {fmt(d['eval']['metrics']['phi'])}.")
    return lines


def _reward_keys(d: dict[str, Any], question: str) -> list[str]:
    """Every reward's mean series, the ones the question names first, then the task rewards, the
    others and the weighted total."""
    trends = d["trends"]
    keys = [k for k in trends if k.startswith("rewards/") and k.endswith("/mean")]
    named = [k for k in keys if re.search(rf"(?<![a-z0-9_]){re.escape(k.split('/')[1].lower())}", question)]
    ordered = [*named, *task_keys(d), *keys, *(k for k in ("reward", "train/reward") if k in trends)]
    return list(dict.fromkeys(k for k in ordered if k in trends))


def _hacking_verdict(d: dict[str, Any]) -> str:
    found = _hacking(d)
    if found:
        return f"Yes, this looks like reward hacking: {found[0].detail}."
    form = d["trends"].get("rewards/format/mean")
    tasks = [d["trends"][k] for k in task_keys(d) if k.startswith("rewards/")]
    if not form or not tasks:
        return (
            "The offline analyst cannot check for format hacking: the run has no format and task reward pair."
        )
    return (
        f"No reward hacking in the numbers: the analyst calls it hacking when the format reward is at least "
        f"{HACK_FORMAT} and at least {HACK_GAP} above a flat task reward; here format {fmt(form['late'])} "
        f"and {code(tasks[0]['key'])} {fmt(tasks[0]['late'])} in the last quarter, "
        f"the task {movement(tasks[0])}."
    )


def _rewards_answer(d: dict[str, Any], question: str) -> list[str]:
    keys = _reward_keys(d, question)
    if not keys and d["rl"]["stage"] == "warmup":
        return [
            f"{_stage_sentence(d)}: no reward is computed before RL, so there is no reward to be flat yet. "
            "The warm-up's progress shows in its loss."
        ]
    if not keys:
        return ["This run has no reward series, so the offline analyst cannot answer about its rewards."]
    lines = [f"{code(k)} is {level_text(d['trends'][k])}, {movement(d['trends'][k])}." for k in keys]
    if re.search(r"hack|cheat|gaming", question):
        lines.insert(0, _hacking_verdict(d))
    lines[1:] = [f"- {line}" for line in lines[1:]]
    rewards = (d["config"] or {}).get("rewards")
    if isinstance(rewards, list) and rewards:
        weights = ", ".join(
            f"{prose(r.get('name'))} ×{prose(r.get('weight', 1.0))}" for r in rewards if isinstance(r, dict)
        )
        lines.append(f"- Weights in the config: {weights}.")
    zero = d["trends"].get("frac_reward_zero_std")
    if zero and zero["late"] is not None:
        lines.append(
            f"- Groups with no reward variance: {zero['late']:.0%} in the last quarter ({zero['early']:.0%} "
            "in the first)."
        )
    return lines


def _eval_answer(d: dict[str, Any], question: str) -> list[str]:
    e, name = d["eval"], d["run"]["name"]
    if not e:
        return [
            f"No held-out eval has run for run {prose(name)}, so the offline analyst has no eval result to "
            f"report: run {code('carl eval ' + name)} (or press e in the control room) to score the model "
            "on the prompts the run held out of training."
        ]
    m = e["metrics"]
    where = (f" at step {m['step']}" if m.get("step") is not None else "") + (
        f" on {m['prompts']} held-out prompts" if m.get("prompts") else ""
    )
    figures = [
        f"task reward {fmt(m['task'])}" if m.get("task") is not None else "",
        f"solved {m['solved']:.0%}" if m.get("solved") is not None else "",
        f"format-compliant {m['format']:.0%}" if m.get("format") is not None else "",
        f"Φ {fmt(m['phi'])}" if m.get("phi") is not None else "",
    ]
    lines = [
        f"The held-out eval {'passed' if e['passed'] else 'failed'}{where}: "
        + ", ".join(f for f in figures if f)
        + "."
    ]
    lines += [f"- {reason}" for reason in e["reasons"]]  # carl's own words and numbers (evaluate.py)
    if keys := task_keys(d):
        t = d["trends"][keys[0]]
        lines.append(f"- In training, {code(keys[0])} was {fmt(t['last'])} at step {t['last_step']}.")
    return lines


def _loss_answer(d: dict[str, Any], question: str) -> list[str]:
    key = next((k for k in ("loss", "train/loss") if k in d["trends"]), None)
    if key is None:
        return ["This run has no loss series (`loss`), so the offline analyst cannot answer about its loss."]
    t, stage = d["trends"][key], d["rl"]["stage"]
    rl, before = d["rl_trends"].get(key), d["before_rl_trends"].get(key)
    if nan := _nan(d):
        lines = [
            f"The loss became NaN or inf: {nan[0].detail}.",
            f"- Its finite values: {fmt(t['vmin'])}–{fmt(t['vmax'])}, {movement(t)}.",
        ]
    elif stage == "warmup" and d["rl"]["warmup_steps"]:
        lines = [
            f"{_stage_sentence(d)}: the loss ({code(key)}), the cross-entropy on the warm-up's example "
            f"answers, is {level_text(t)}, {movement(t)}; no NaN or inf."
        ]
    elif rl and before:
        # Two losses: the SFT warm-up's cross-entropy, then RL's policy loss, which sits near 0 by
        # construction.
        lines = [
            f"Over the RL steps (from step {d['rl']['start']}) the loss ({code(key)}) is {level_text(rl)}, "
            f"{movement(rl)}; no NaN or inf. RL's loss is a policy-gradient surrogate that sits near 0: its "
            "level says little, a NaN or a blow-up says much.",
            f"- Before RL ({_warmup_words(d)}, steps {before['first_step']}–{before['last_step']}): "
            f"{fmt(before['first'])} at step {before['first_step']} to {fmt(before['last'])} at step "
            f"{before['last_step']}, {movement(before)}.",
        ]
    else:
        lines = [f"The loss ({code(key)}) is {level_text(t)}, {movement(t)}; no NaN or inf."]
    for other in ("grad_norm", "learning_rate", "kl"):
        if o := d["trends"].get(other):
            lines.append(f"- `{other}` is {fmt(o['last'])} at step {o['last_step']}, {movement(o)}.")
    return lines


def _warmup_words(d: dict[str, Any]) -> str:
    return "the SFT warm-up" if d["rl"]["warmup_steps"] else "the steps before the first reward"


def _stage_sentence(d: dict[str, Any]) -> str:
    """Where a run before RL is: `The run is in its SFT warm-up (step 425 of 600; RL starts at step 601)`."""
    rl, step = d["rl"], d["run"]["step"]
    if rl["warmup_steps"]:
        return (
            f"The run is in its SFT warm-up (step {fmt(step)} of {fmt(rl['warmup_steps'])}; "
            f"RL starts at step {rl['start']})"
        )
    return f"The run has not reached RL (step {fmt(step)}; RL starts at step {rl['start']}, its first reward)"


def _stage(d: dict[str, Any]) -> str:
    """` (SFT warm-up, RL from step 601)` or ` (RL since step 601, after an SFT warm-up)`: the headline's word
    on RL."""
    rl = d["rl"]
    if rl["stage"] == "warmup":
        return f" (SFT warm-up, RL from step {rl['start']})" if rl["warmup_steps"] else " (before RL)"
    if rl["stage"] == "rl" and rl["warmup_steps"]:
        return f" (RL since step {rl['start']}, after an SFT warm-up)"
    return ""


CRASH_WORDS = r"crash|fail|die[ds]?\b|dead|error|exception|traceback|kill|oom\b|out of memory|nccl|broke"


def _crash(d: dict[str, Any], problems: list[Finding]) -> str:
    """Why the run crashed, from what the store holds of its end (its error, its console, a process that
    died, a silence), or that it did not."""
    run = d["run"]
    causes = [f for f in problems if f.topic in ("failed", "console", "rank_died", "stalled")]
    if causes:
        return "What the store holds of its end: " + "; ".join(f"{f.title}: {f.detail}" for f in causes) + "."
    where = f"it is {run['status']} at step {fmt(run['step'])}"
    if run["status"] == "running" and run["last_update"]:
        where += f" and wrote its last step {(d['now'] - run['last_update']) / 60:.0f} min ago"
    return (
        f"Run {prose(run['name'])} has not crashed: {where}; no error is recorded, its console shows no "
        "traceback, and no process of it died."
    )


def _status_answer(d: dict[str, Any], question: str) -> list[str]:
    run = d["run"]
    problems = [f for f in analyze(d) if f.severity != "info"]
    verdict = (
        f"{len(problems)} problem{'s' if len(problems) != 1 else ''}: " + "; ".join(f.title for f in problems)
        if problems
        else "nothing looks wrong in its numbers"
    )
    lines = [
        f"Run {prose(run['name'])} is {run['status']} at step {fmt(run['step'])}"
        + (f" of {fmt(run['max_steps'])}" if run["max_steps"] else "")
        + _stage(d)
        + f"; {verdict}."
    ]
    if re.search(CRASH_WORDS, question):
        lines = [_crash(d, problems), f"- {lines[0]}"]
    if run["status"] == "running" and run["last_update"]:
        lines.append(f"- Last step written {(d['now'] - run['last_update']) / 60:.0f} min ago.")
    if run["phase"] or run["health"]:
        lines.append(
            f"- Phase {run['phase'] or '—'}, health {run['health'] or '—'}"
            + (f": {'; '.join(map(prose, run['health_reasons']))}" if run["health_reasons"] else "")
            + "."
        )
    if d["rl"]["stage"] == "warmup":
        lines.append(
            f"- {_stage_sentence(d)}: the control room's RL rules (entropy collapse, zero-variance groups, "
            "the KL, the clip fractions) judge the RL steps only."
        )
    if run["error"]:
        lines.append(f"- Error: {prose(run['error'])}.")
    if console := _console(d):
        lines.append(f"- Its console's last error: {console[0].detail}.")
    return lines


def _counts_only(what: str, count: int, where: str, start: str) -> list[str]:
    if not count:
        return [f"The store holds no {what}, so there is nothing to say about them: {start}."]
    return [
        f"The offline analyst cannot answer questions about {what}: it only knows the store holds {count:,} "
        f"of them. For more, {ASK_CLAUDE}, or {where}."
    ]


def _trajectories_answer(d: dict[str, Any], question: str) -> list[str]:
    return _counts_only(
        "trajectories",
        d["counts"]["trajectories"],
        "open the Trajectories pane (3) or run `carl trajectories status` / `carl trajectories list`",
        "record Claude Code sessions with `carl hooks install` or import them with "
        "`carl trajectories import`",
    )


def _agents_answer(d: dict[str, Any], question: str) -> list[str]:
    return _counts_only(
        "agent events",
        d["counts"]["agent_events"],
        "open the Agents pane (4) or run `carl agents status` / `carl agents events`",
        "start the agents plane with `carl agents up`",
    )


ANSWERS = {
    "gate": _gate_answer,
    "phi": _phi_answer,
    "entropy": entropy_answer,
    "rewards": _rewards_answer,
    "eval": _eval_answer,
    "loss": _loss_answer,
    "kl": kl_answer,
    "clip": clip_answer,
    "covariance": covariance_answer,
    "length": length_answer,
    "status": _status_answer,
    "trajectories": _trajectories_answer,
    "agents": _agents_answer,
}


def _not_understood() -> list[str]:
    topics = "; ".join(t.title for t in TOPICS)
    return [
        "The offline analyst could not tell what this question asks about, so here is the general picture. "
        f"It answers questions about: {topics}."
    ]


def answer(digest: dict[str, Any], question: str = "", *, reason: str = "") -> str:
    """A Markdown answer: the direct answer for each topic the question asks about (or a plain
    statement that it could not tell), the run in one line, the figures around a step the question
    names, then the findings, those on the question's topics first."""
    run = digest["run"]
    q = question.casefold()
    topics = route(question)
    label = OFFLINE_LABEL + (f" — {reason}" if reason else "")
    lines = [label, ""]
    for topic in topics:
        lines += [*ANSWERS[topic](digest, q), ""]
    if not topics:
        lines += [*_not_understood(), ""]
    headline = [
        f"Run **{prose(run['name'])}**: {run['status']}, step {fmt(run['step'])}"
        + (f" of {fmt(run['max_steps'])}" if run["max_steps"] else "")
        + _stage(digest)
        + (f", phase {run['phase']}" if run["phase"] else "")
    ]
    for key in task_keys(digest)[:1]:
        t = digest["trends"][key]
        headline.append(f"{code(key)} {fmt(t['first'])}→{fmt(t['last'])}")
    if phi := digest["trends"].get("phi/mean"):
        headline.append(f"`phi/mean` {fmt(phi['last'])} at step {phi['last_step']}")
    if entropy := entropy_brief(digest):
        headline.append(entropy)
    lines.append("; ".join(headline) + ".")
    if match := re.search(r"step\s+(\d+)", q):
        around = _around(digest, int(match.group(1)))
        if around:
            lines += ["", f"**Around step {match.group(1)}**", *around]
    findings = analyze(digest)
    wanted = set().union(*(FINDINGS_OF[t] for t in topics))
    named = {topic for topic, words in FINDING_WORDS.items() if re.search(words, q)}
    findings.sort(
        key=lambda f: (f.topic not in wanted, f.topic not in named, SEVERITY_ORDER.get(f.severity, 3))
    )
    problems = [f for f in findings if f.severity != "info"]
    if findings:
        lines += ["", f"**Findings** ({len(problems)} problem{'s' if len(problems) != 1 else ''})"]
    for f in findings:
        mark = {"red": "🔴", "yellow": "🟡"}.get(f.severity, "ℹ")  # no U+FE0F: visible() writes it out
        lines.append(
            f"- {mark} **{f.title}** — {f.detail}."
            + (f" *{f.advice[0].upper()}{f.advice[1:]}.*" if f.advice else "")
        )
    if not problems:
        lines += ["", "Nothing looks wrong in the numbers the store holds."]
    return redact("\n".join(lines).rstrip() + "\n")
