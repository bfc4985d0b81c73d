"""`carl eval RUN`: the trained model on the prompts its run held out of training.

Greedy answers (what a user would deploy) to at most `eval.max_prompts` held-out prompts, scored
by the run's own task rewards and its format reward, with the Phi of each answer measured at the
run's sampling temperature from the distributions that chose its tokens. The verdict, every
figure and the reasons go into the store's `evals` table, which the control room shows.

A run the MLX backend trained is answered by MLX (mlx-lm loads its model, or its base and
adapter), a torch run by transformers: the same prompts, lengths, figures and rows either way. A run of
the built-in tiny model (the demo's) is answered in numpy (engine/models/tiny_numpy.py), the same answers
and figures as transformers gives, so `carl eval demo` does not import torch and transformers (~90% of its
time) for under a second of arithmetic.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from engine.coherence.phi import phi_from_entropy
from engine.store import Store
from engine.text import visible

from .artifacts import base_model_of, carl_run, is_adapter, model_dir
from .backend import BadInput, TrainingFailed, one_line
from .config import ConfigError, TrainConfig, config_from_data
from .holdout import distinct_prompts, split_holdout
from .mlx_artifacts import is_mlx_adapter

FORMAT_FULL = 0.999  # a format reward this high is full compliance (float32 rewards: 1.0 - eps)
MLX_BATCH = 16  # prompts of one length answered together on MLX


@dataclass
class EvalResult:
    run_id: int
    run_name: str
    passed: bool
    metrics: dict[str, Any]
    reasons: list[str]
    answers: list[dict[str, Any]] = field(default_factory=list)


def find_carl_run(store: Store, ref: str) -> dict[str, Any]:
    return carl_run(store, ref, for_what="nothing to evaluate")


def run_config(run: dict[str, Any]) -> TrainConfig:
    try:
        return config_from_data(json.loads(run["config"] or "{}"), f"run {run['name']}")
    except ConfigError as exc:
        raise BadInput(str(exc)) from None


def held_out_prompts(config: TrainConfig) -> list[dict[str, Any]]:
    """The rows of the prompts the run held out, one per prompt, in order: what `carl eval` asks."""
    from .data import load_rows

    _, held = split_holdout(load_rows(config.dataset, config.seed), config.eval.holdout)
    return distinct_prompts(held)


def evaluate_run(store: Store, ref: str, *, home: Path, max_prompts: int | None = None) -> EvalResult:
    """Evaluate run `ref` (name or id) and store the result; BadInput when it cannot be evaluated."""

    run = find_carl_run(store, ref)
    config = run_config(run)
    if not any(spec.name == "task" or ":" in spec.name for spec in config.rewards):
        raise BadInput(
            f"run {run['name']!r} has no task reward to evaluate with (rewards: {config.reward_names})"
        )
    held = held_out_prompts(config)
    if not held:
        raise BadInput(
            f"run {run['name']!r} held no prompts out of training (eval.holdout is {config.eval.holdout})"
        )
    held = held[: max_prompts or config.eval.max_prompts]
    path = model_dir(run)
    answer = _answer_mlx if _with_mlx(run, path) else _answer_numpy if _with_numpy(path) else _answer
    started = time.monotonic()
    answers, phi, entropy = answer(config, path, held, home)
    metrics, passed, reasons = _score(config, held, answers, phi, entropy)
    metrics.update(
        model_dir=str(path),
        step=run.get("last_step"),
        prompts=len(held),
        seconds=round(time.monotonic() - started, 2),
    )
    store.add_eval(run["id"], passed, metrics, reasons)
    store.add_event(
        run["id"], run.get("last_step"), "eval", ("passed" if passed else "failed") + ": " + reasons[0]
    )
    shown = [
        {"prompt": _prompt_text(r["prompt"]), "answer": a["text"], **a["rewards"]}
        for r, a in zip(held, answers, strict=True)
    ]
    return EvalResult(run["id"], run["name"], passed, metrics, reasons, shown)


# -- answering ---------------------------------------------------------------------------------


def _load(config: TrainConfig, path: Path, home: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from .data import offline_if_local, resolve_model

    offline_if_local(config.model)
    hf_logging.disable_progress_bar()
    tokenizer_dir = path if (path / "tokenizer_config.json").is_file() else None
    try:
        if is_adapter(path):
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
            tokenizer_dir = tokenizer_dir or Path(base_model_of(path) or "")
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        if tokenizer_dir is None or not str(tokenizer_dir):
            tokenizer_dir = Path(resolve_model(config.model, home, config.seed))
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path}: cannot load the model ({' '.join(str(exc).split())[:200]})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer, model.eval()


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in prompt)


def _as_model_input(tokenizer: Any, prompt: Any) -> str:
    """The text TRL would feed the model: the chat template with the generation prompt, or the text."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)


def _answer(
    config: TrainConfig, path: Path, rows: list[dict[str, Any]], home: Path
) -> tuple[list[dict[str, Any]], list[float], list[float]]:
    """Greedy answers with their token ids, and each answer's mean Phi and entropy."""
    import torch

    from engine.coherence.phi import phi_from_model

    torch.manual_seed(config.seed)
    tokenizer, model = _load(config, path, home)
    texts = [_as_model_input(tokenizer, row["prompt"]) for row in rows]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=config.max_completion_length,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    width = batch["input_ids"].shape[1]
    generated = out[:, width:]
    answers, masks = [], torch.zeros_like(out)
    for row, ids in enumerate(generated.tolist()):
        if tokenizer.eos_token_id in ids:
            ids = ids[: ids.index(tokenizer.eos_token_id) + 1]  # the eos is a choice the model made too
        masks[row, width : width + len(ids)] = 1
        answers.append({"ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=True)})
    attention = torch.cat([batch["attention_mask"], masks[:, width:]], dim=1)
    stats = phi_from_model(model, out, attention, masks, temperature=config.temperature)
    phi = [float(np.mean(p)) if len(p) else math.nan for p in stats.phi]
    entropy = [float(np.mean(h)) if len(h) else math.nan for h in stats.entropy]
    return answers, phi, entropy


# -- answering the tiny model with numpy ------------------------------------------------------------


def _with_numpy(path: Path) -> bool:
    """The built-in tiny model's architecture, full weights: answered without importing torch or
    transformers (engine/models/tiny_numpy.py), the same answers and figures."""
    from engine.models.tiny_numpy import supports

    return not is_adapter(path) and supports(path)


def _answer_numpy(
    config: TrainConfig, path: Path, rows: list[dict[str, Any]], home: Path
) -> tuple[list[dict[str, Any]], list[float], list[float]]:
    """As `_answer`, in numpy: greedy answers, each token's entropy from the distribution that chose it."""
    from engine.models.tiny_numpy import TinyLlama, TinyTokenizer, phi_of

    try:
        tokenizer, model = TinyTokenizer(path), TinyLlama(path)
    except (OSError, ValueError, KeyError) as exc:
        raise BadInput(f"{path}: cannot load the model ({' '.join(str(exc).split())[:200]})") from None
    prompts = [tokenizer.encode(tokenizer.model_input(row["prompt"])) for row in rows]
    generated = model.greedy(
        prompts, config.max_completion_length, tokenizer.eos_token_id, config.temperature
    )
    answers = [{"ids": ids, "text": tokenizer.decode(ids)} for ids, _ in generated]
    phi = [phi_of(h, model.vocab_size) for _, h in generated]
    entropy = [float(np.mean(h)) if h else math.nan for _, h in generated]
    return answers, phi, entropy


# -- answering with MLX ------------------------------------------------------------------------


def _with_mlx(run: dict[str, Any], path: Path) -> bool:
    """MLX answers for an MLX run; without mlx installed, its full weights (Hugging Face's layout)
    are answered by transformers, but its adapter cannot be."""
    if run.get("backend") != "mlx" and not is_mlx_adapter(path):
        return False
    if importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None:
        return True
    if is_mlx_adapter(path):
        raise BadInput(
            f"run {run['name']!r} holds an MLX adapter: evaluating it needs mlx and mlx-lm "
            "(pip install 'carl-tui[mlx]')"
        )
    return False


def _load_mlx(config: TrainConfig, path: Path, home: Path) -> tuple[Any, Any]:
    """mlx-lm's model (the base with the adapter, for an adapter) and the Hugging Face tokenizer."""
    from mlx_lm import load

    from .data import is_local_model, offline_if_local, resolve_model

    offline_if_local(config.model)
    where, adapter = str(path), None
    if is_mlx_adapter(path):
        where, adapter = base_model_of(path) or "", str(path)
        if not where or (is_local_model(where) and not Path(where).expanduser().is_dir()):
            where = resolve_model(config.model, home, config.seed)  # the recorded base moved: the run's model
    try:
        # mlx-lm types load's result as a 2- or a 3-tuple (the config too, with return_config): the first two
        model, wrapper = load(str(where), adapter_path=adapter)[:2]
    except Exception as exc:  # mlx-lm raises many kinds for a directory it cannot read
        raise BadInput(
            f"{path}: cannot load the model with mlx-lm ({' '.join(str(exc).split())[:200]})"
        ) from None
    model.eval()
    return model, getattr(wrapper, "_tokenizer", wrapper)  # the tokenizer the torch path uses, unwrapped


def _answer_mlx(
    config: TrainConfig, path: Path, rows: list[dict[str, Any]], home: Path
) -> tuple[list[dict[str, Any]], list[float], list[float]]:
    """As `_answer`, on MLX: greedy tokens, each scored by the distribution that chose it (at the
    run's temperature). Prompts of one length are answered together (no padding, a KV cache)."""
    model, tokenizer = _load_mlx(config, path, home)
    prompts = [
        tokenizer(_as_model_input(tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"]
        for row in rows
    ]
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(prompts):
        by_length.setdefault(len(ids), []).append(index)
    answers: list[dict[str, Any]] = [{} for _ in rows]
    phi, entropy = [math.nan] * len(rows), [math.nan] * len(rows)
    for indices in by_length.values():
        for start in range(0, len(indices), MLX_BATCH):
            group = indices[start : start + MLX_BATCH]
            generated = _greedy_mlx(model, [prompts[i] for i in group], config, tokenizer.eos_token_id)
            for index, (ids, entropies, width) in zip(group, generated, strict=True):
                answers[index] = {"ids": ids, "text": tokenizer.decode(ids, skip_special_tokens=True)}
                if ids:
                    entropy[index] = float(np.mean(entropies))
                    phi[index] = float(np.mean(phi_from_entropy(np.asarray(entropies), width)))
    return answers, phi, entropy


def _greedy_mlx(
    model: Any, prompts: list[list[int]], config: TrainConfig, eos: int | None
) -> list[tuple[list[int], list[float], int]]:
    """Greedy completions of equal-length prompts: per row (token ids up to and with eos, the
    entropy in nats of each token's distribution at the temperature, |V|)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from engine.coherence.phi_mlx import token_entropy

    cache = make_prompt_cache(model)
    logits = model(mx.array(prompts), cache=cache)[:, -1, :]
    tokens: list[list[int]] = [[] for _ in prompts]
    entropies: list[list[float]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for _ in range(config.max_completion_length):
        chosen = mx.argmax(logits, axis=-1)
        h = token_entropy(logits, temperature=config.temperature)[0]
        mx.eval(chosen)
        # [n] arrays: a token and its entropy a row (mlx types tolist() as a scalar or a nested list)
        row_tokens, row_entropies = cast(list[int], chosen.tolist()), cast(list[float], h.tolist())
        for row, (token, value) in enumerate(zip(row_tokens, row_entropies, strict=True)):
            if not done[row]:
                tokens[row].append(token)
                entropies[row].append(value)
                done[row] = token == eos
        if all(done):
            break
        logits = model(chosen[:, None], cache=cache)[:, -1, :]
    width = int(logits.shape[-1])
    return [(tokens[r], entropies[r], width) for r in range(len(prompts))]


# -- scoring -----------------------------------------------------------------------------------


def _reward_columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    from .data import dataset_columns

    columns = dataset_columns(rows) - {"prompt", "completion"}
    return {name: [row[name] for row in rows] for name in sorted(columns)}


def _score(
    config: TrainConfig,
    rows: list[dict[str, Any]],
    answers: list[dict[str, Any]],
    phi: list[float],
    entropy: list[float],
) -> tuple[dict[str, Any], bool, list[str]]:
    from .data import dataset_columns, run_task
    from .reward_set import build_rewards

    rewards = build_rewards(config, run_task(config, dataset_columns(rows)))
    prompts = [row["prompt"] for row in rows]
    completions: list[Any] = [
        a["text"] if isinstance(p, str) else [{"role": "assistant", "content": a["text"]}]
        for p, a in zip(prompts, answers, strict=True)
    ]
    kwargs = {**_reward_columns(rows), "completion_ids": [a["ids"] for a in answers]}
    scored: dict[str, np.ndarray] = {}
    for name, fn in zip(rewards.names, rewards.funcs, strict=True):
        if name in rewards.task_names or name == "format":
            try:
                values = fn(prompts=prompts, completions=completions, **kwargs)
            except TrainingFailed as exc:
                raise BadInput(f"eval: {exc}") from None
            scored[name] = np.array([math.nan if v is None else float(v) for v in values])
    for answer, index in zip(answers, range(len(answers)), strict=True):
        answer["rewards"] = {name: _round(values[index]) for name, values in scored.items()}

    e = config.eval
    task = np.nanmean([scored[n] for n in rewards.task_names], axis=0)
    metrics: dict[str, Any] = {
        "task": _round(np.nanmean(task)),
        "solved": _round(float(np.mean(task >= e.solved_at))),
        "phi": _round(np.nanmean(phi)),
        "entropy": _round(np.nanmean(entropy)),
        "answer_tokens": _round(float(np.mean([len(a["ids"]) for a in answers]))),
    }
    checks = [("task", metrics["task"], e.min_task, "mean task reward")]
    if "format" in scored:
        metrics["format"] = _round(float(np.mean(scored["format"] >= FORMAT_FULL)))
        checks.append(("format", metrics["format"], e.min_format, "format-compliant answers"))
    if e.min_solved is not None:
        checks.append(("solved", metrics["solved"], e.min_solved, "share of held-out prompts solved"))
    if e.min_phi is not None:
        checks.append(("phi", metrics["phi"], e.min_phi, "mean Phi of the answers"))
    failed = [_reason(*c, ok=False) for c in checks if not _meets(c[1], c[2])]
    met = [_reason(*c, ok=True) for c in checks if _meets(c[1], c[2])]
    return metrics, not failed, failed + met


def _meets(value: float | None, threshold: float) -> bool:
    return value is not None and value >= threshold


def _reason(key: str, value: float | None, threshold: float, label: str, *, ok: bool) -> str:
    shown = "n/a" if value is None else f"{value:.3f}"
    return f"{label} {shown} {'>=' if ok else '<'} {threshold:g}"


def _round(value: Any) -> float | None:
    value = float(value)
    return round(value, 4) if math.isfinite(value) else None


# -- printing ----------------------------------------------------------------------------------


def print_result(result: EvalResult, *, show: int = 5) -> None:
    verdict = "PASSED" if result.passed else "FAILED"
    m = result.metrics
    print(
        f"eval of run {result.run_name!r} (step {m.get('step')}, {m['prompts']} held-out prompts): {verdict}"
    )
    for reason in result.reasons:
        print(f"  {reason}")
    shown = ", ".join(f"{k} {m[k]}" for k in ("task", "solved", "format", "phi", "entropy") if k in m)
    print(f"  {shown}")
    for answer in result.answers[:show]:
        prompt = answer["prompt"].replace("\n", " ")[:60]
        print(f"  > {prompt}\n    {answer['answer'][:100]!r}")


def eval_from_args(home: Path, ref: str, max_prompts: int | None, as_json: bool) -> int:
    from engine import paths

    with Store(paths.db_path(home)) as store:
        try:
            result = evaluate_run(store, ref, home=home, max_prompts=max_prompts)
        except TrainingFailed as exc:
            raise BadInput(one_line(exc)) from None
    if as_json:
        print(
            json.dumps(
                {
                    "run": result.run_name,
                    "passed": result.passed,
                    "metrics": result.metrics,
                    "reasons": result.reasons,
                    "answers": result.answers,
                }
            )
        )
    else:
        print_result(result)
    return 0 if result.passed else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.training.evaluate RUN` (what the engine runs for the control room's eval)."""
    import argparse

    from engine import paths
    from engine.errors import CarlError

    parser = argparse.ArgumentParser(prog="python -m engine.training.evaluate")
    parser.add_argument("run")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        return eval_from_args(args.home or paths.carl_home(), args.run, args.max_prompts, args.json)
    except CarlError as exc:
        print(f"carl eval: {visible(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
