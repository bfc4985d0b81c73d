"""The offline analyst on RL health: the KL to the reference, the clip fractions, Cov(log π, A) and completion
length. Each topic has its findings (what `analyst.analyze` lists) and its direct answer, from the digest's
numbers, judged by the thresholds the control room's health uses (engine/coherence/health.py) so that the two
never disagree.
"""

from __future__ import annotations

from typing import Any

from engine.coherence.health import CLIP_RED, CLIP_SPIKE, KL_RED, KL_YELLOW, TRUNCATION_YELLOW

from .entropy import entropy_line
from .wording import Finding, fmt, level_text, movement

CLIPPED_SHARE = TRUNCATION_YELLOW  # completions cut at max_completion_length: the limit shapes the answers
CLIP_KEYS = ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean")


def _config(d: dict[str, Any]) -> dict[str, Any]:
    return d["config"] or {}


# -- findings ----------------------------------------------------------------------------------------


def kl_finding(d: dict[str, Any]) -> list[Finding]:
    t = d["trends"].get("kl")
    if not t or t["late"] is None:
        return []
    advice = "lower the learning rate or raise beta; resume from a checkpoint before the climb"
    if t["nan_steps"] or t["late"] >= KL_RED:
        detail = f"`kl` averages {fmt(t['late'])} nats per token over the last quarter (max {fmt(t['vmax'])})"
        if t["nan_steps"]:
            detail = f"`kl` is NaN or inf on {t['nan_steps']} stretch(es) of the run"
        return [Finding("red", "kl", "The KL to the reference blew up", detail, advice)]
    if t["late"] >= KL_YELLOW:
        detail = (
            f"`kl` averages {fmt(t['late'])} nats per token over the last quarter (from {fmt(t['early'])}): "
            "the policy has moved far from its reference"
        )
        return [Finding("yellow", "kl", "The KL to the reference is high", detail, advice)]
    return []


def _clip_trend(d: dict[str, Any]) -> dict[str, Any] | None:
    return next((d["trends"][k] for k in CLIP_KEYS if k in d["trends"]), None)


def clip_finding(d: dict[str, Any]) -> list[Finding]:
    t = _clip_trend(d)
    if not t or t["late"] is None:
        return []
    advice = "lower the learning rate, or take fewer updates per batch of samples"
    if t["late"] >= CLIP_RED:
        detail = (
            f"`{t['key']}` averages {t['late']:.0%} over the last quarter: "
            "most of each update is clipped away"
        )
        return [Finding("red", "clip", "Most tokens are clipped", detail, advice)]
    if t["vmax"] is not None and t["vmax"] >= CLIP_SPIKE:
        detail = f"`{t['key']}` reached {t['vmax']:.0%} (now {fmt(t['last'])} at step {t['last_step']})"
        return [Finding("yellow", "clip", "The clip fraction spiked", detail, advice)]
    return []


def length_finding(d: dict[str, Any]) -> list[Finding]:
    t = d["trends"].get("completions/clipped_ratio")
    if not t or t["late"] is None or t["late"] < CLIPPED_SHARE:
        return []
    return [
        Finding(
            "yellow",
            "length",
            "Most completions hit the length limit",
            f"{t['late']:.0%} of recent completions were cut at max_completion_length",
            "raise max_completion_length or reward shorter answers (concise)",
        )
    ]


# -- answers ------------------------------------------------------------------------------------------


def kl_answer(d: dict[str, Any], question: str) -> list[str]:
    t, beta = d["trends"].get("kl"), _config(d).get("beta")
    policy = d["trends"].get("policy_kl")
    if not t:
        if beta == 0:
            lines = [
                "This run has no KL term: `beta` is 0 in its config, so no KL to a reference model is "
                "computed or logged (TRL and carl's MLX trainer log `kl` only when beta > 0). Only the clip "
                "keeps each update near the policy that sampled."
            ]
        else:
            lines = [
                "This run logs no `kl` series, so the offline analyst cannot say how far the policy moved."
            ]
        if policy:
            lines.append(
                f"- `policy_kl` (how far an update moved) is {level_text(policy)}, {movement(policy)}."
            )
        return lines
    if t["nan_steps"] or (t["late"] is not None and t["late"] >= KL_RED):
        verdict = (
            f"that is a blow-up (the control room's health is red from {KL_RED:g} nats per token, or NaN)"
        )
    elif t["late"] is not None and t["late"] >= KL_YELLOW:
        verdict = f"that is high: the control room warns from {KL_YELLOW:g} nat per token"
    else:
        verdict = (
            f"not too high: the control room warns from {KL_YELLOW:g} nat per token and calls "
            f"{KL_RED:g} a blow-up"
        )
    lines = [f"The KL to the reference (`kl`) is {level_text(t, ' nats')}, {movement(t)}; {verdict}."]
    lines.append(f"- Highest: {fmt(t['vmax'])} nats per token; last quarter's mean {fmt(t['late'])}.")
    if beta is not None:
        lines.append(f"- `beta` is {fmt(beta)} in the config: the loss adds beta × KL per token.")
    if policy:
        lines.append(f"- `policy_kl` (how far an update moved) is {level_text(policy)}, {movement(policy)}.")
    return lines


def clip_answer(d: dict[str, Any], question: str) -> list[str]:
    t = _clip_trend(d)
    if not t:
        return [
            "This run logs no clip fraction (`clip_ratio/*`), so the offline analyst cannot answer about it."
        ]
    if t["late"] is not None and t["late"] >= CLIP_RED:
        verdict = f"too high: over {CLIP_RED:.0%} sustained, most of each update is clipped away"
    elif t["vmax"] is not None and t["vmax"] >= CLIP_SPIKE:
        verdict = (
            f"it spiked to {t['vmax']:.0%} (the control room calls a step above {CLIP_SPIKE:.0%} a spike)"
        )
    else:
        verdict = (
            f"within bounds: the control room calls a step above {CLIP_SPIKE:.0%} a spike and {CLIP_RED:.0%} "
            "sustained red"
        )
    what = (
        "tokens whose ratio the clip held, either side"
        if t["key"].endswith("region_mean")
        else "tokens clipped"
    )
    lines = [f"The clip fraction (`{t['key']}`, {what}) is {level_text(t)}, {movement(t)}; {verdict}."]
    for key, side in (
        ("clip_ratio/low_mean", "below 1 - ε, A < 0"),
        ("clip_ratio/high_mean", "above 1 + ε, A > 0"),
    ):
        if key != t["key"] and (o := d["trends"].get(key)):
            lines.append(
                f"- `{key}` ({side}): {fmt(o['last'])} at step {o['last_step']}, max {fmt(o['vmax'])}."
            )
    if (epsilon := _config(d).get("epsilon")) is not None:
        lines.append(
            f"- ε is {fmt(epsilon)} in the config: the ratio is clipped to [{1 - epsilon:.3g}, "
            f"{1 + epsilon:.3g}]."
        )
    lines.append(
        "- With one update per batch of samples (GRPO's default) the ratio starts at 1: a fraction near 0 is "
        "what a healthy run shows."
    )
    return lines


def covariance_answer(d: dict[str, Any], question: str) -> list[str]:
    t = d["trends"].get("cov/logp_adv")
    if not t:
        return [
            "This run has no `cov/logp_adv`: Cov(log π, A) is recorded by carl's own trainers (from the "
            "log-probability of each completion token in the loss forward, and the advantages), and no "
            "framework logs it."
        ]
    mean = t["mean"] or 0.0
    if mean > 0:
        sign = (
            "positive on average: the tokens the policy was already sure of are the rewarded ones, so each "
            "update pushes the entropy down (ΔH ≈ −η·Cov under natural policy gradient)"
        )
    else:
        sign = (
            "negative or zero on average: the rewarded tokens are the less likely ones, "
            "which holds the entropy up"
        )
    lines = [f"Cov(log π, A) (`cov/logp_adv`) is {level_text(t)}, {movement(t)}; {sign}."]
    if entropy := entropy_line(d):
        lines.append(f"- {entropy}")
    lines.append(
        "- Per token, over the step's completion tokens, each carrying its completion's advantage; "
        "docs/reference/frameworks.md §4."
    )
    return lines


def length_answer(d: dict[str, Any], question: str) -> list[str]:
    trends, limit = d["trends"], _config(d).get("max_completion_length")
    t = trends.get("completions/mean_length")
    clipped = trends.get("completions/clipped_ratio")
    if not t and not clipped:
        return [
            "This run logs no completion length (`completions/*`), "
            "so the offline analyst cannot answer about it."
        ]
    lines = []
    if t:
        lines.append(f"Completions average {level_text(t, ' tokens')}, {movement(t)}.")
    if clipped and clipped["late"] is not None:
        cut = f"max_completion_length ({limit})" if limit else "max_completion_length"
        verdict = "most answers are cut off" if clipped["late"] >= CLIPPED_SHARE else "the limit rarely bites"
        early = f" ({clipped['early']:.0%} early in the run)" if clipped["early"] is not None else ""
        line = f"{clipped['late']:.0%} of recent completions hit {cut} without ending{early}: {verdict}."
        lines.append(line if not lines else f"- {line}")
    if longest := trends.get("completions/max_length"):
        lines.append(f"- Longest at step {longest['last_step']}: {fmt(longest['last'])} tokens.")
    return lines
