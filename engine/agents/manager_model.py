"""The manager's own model (`agents.manager_model`, `--manager-model`): a local causal LM writes the hints,
and is trained on how much they helped.

Each hint it writes is sampled like a worker's answer (engine/agents/policy.py: the drawn tokens and their
log-probs kept), from a short prompt holding the task, the answer and what was wrong. When the manager judges
that hint (engine/agents/manager_judge.py: the verifier's score of the next attempt at a similar task minus
the hinted attempt's), the hint becomes a `ManagerRolloutEvent` on `training.manager` with reward (help + 1) /
2: the manager trainer (`python -m engine.agents manager-trainer`, the same GRPO path as the workers', its own
run `agents-manager` and its own schedule) groups every `train.group_size` judged hints for similar tasks
(manager_judge.similar_key) as one GRPO group, trains a LoRA adapter, and publishes it on `model.manager`; the
manager swaps it in between two hints, as a worker does. A hint never judged (no similar task came back) is
never a rollout.

With Claude as the manager (agents.feedback claude), Claude writes the hints and is judged, never trained.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.redact import redact

from .events import ManagerRolloutEvent, ModelUpdateEvent, ResultEvent, TaskEvent
from .hints import Hint, Signal, offline_hint, trimmed
from .manager_judge import Judged, similar_key
from .plane_settings import AgentsSettings

log = logging.getLogger("carl.agents")
HINT_TOKENS = 32  # a hint is a sentence
WRITTEN = 10_000  # hints remembered until judged; the oldest forgotten first (never judged: never trained)
ASKED_CHARS = 600  # of the task, the answer and the signal each, in the manager model's prompt


def manager_prompt(task: TaskEvent, answer: str, signal: Signal) -> str:
    """What the manager's model is asked (each part cut to ASKED_CHARS, through `redact`)."""

    def part(text: str) -> str:
        return redact(" ".join(text.split()))[:ASKED_CHARS]

    return (
        f"Task: {part(task.prompt)}\n"
        f"Answer: {part(answer) or '(empty)'}\n"
        f"What was wrong: {part(signal.text)}\n"
        "One short instruction to do it right next time:"
    )


@dataclass(frozen=True)
class _Written:
    hint: Hint
    prompt: str
    generation: Any  # engine.agents.policy.Generation
    task: TaskEvent


class ModelHints:
    """Hints written by the manager's local model; each remembered until judged, then a rollout of it."""

    def __init__(self, settings: AgentsSettings, home: Path, *, seed: int = 0) -> None:
        if not settings.manager_model:
            raise ValueError("ModelHints needs agents.manager_model")
        self.model = settings.manager_model
        self.temperature = settings.temperature
        self.group_size = settings.train.group_size
        self._judged: dict[str, int] = {}  # hints judged so far per similarity key (their GRPO groups)
        self.home = home
        self.seed = seed
        self._policy: Any = None
        self._written: OrderedDict[str, _Written] = OrderedDict()
        self.lock = asyncio.Lock()  # one generation or swap at a time

    @property
    def version(self) -> str | None:
        return None if self._policy is None else str(self._policy.version)

    def _loaded(self) -> Any:
        if self._policy is None:
            from .policy import LocalPolicy

            self._policy = LocalPolicy.load(self.model, self.home, seed=self.seed)
        return self._policy

    async def hint(self, task: TaskEvent, result: ResultEvent, signal: Signal) -> Hint:
        answer = result.answer or result.result
        prompt = manager_prompt(task, answer, signal)
        async with self.lock:
            policy = await asyncio.to_thread(self._loaded)
            generation = await asyncio.to_thread(
                policy.generate, prompt, max_new_tokens=HINT_TOKENS, temperature=self.temperature
            )
        text = trimmed(generation.text)
        if not text.strip() or not generation.token_ids:  # nothing written: the offline hint, not a rollout
            return Hint(trimmed(offline_hint(task, signal)), signal.source, signal.text)
        hint = Hint(text, "manager_model", signal.text, manager_version=generation.model_version)
        self._written[task.task_id] = _Written(hint, prompt, generation, task)
        while len(self._written) > WRITTEN:
            self._written.popitem(last=False)
        return hint

    def rollout(self, judged: Judged) -> ManagerRolloutEvent | None:
        """The judged hint as a rollout of the manager's model (None: not one it wrote, or judged already)."""
        if judged.kind != "hint_help":
            return None
        written = self._written.pop(judged.task_id, None)
        if written is None:
            return None
        gen, task = written.generation, written.task
        reward = min(1.0, max(0.0, (judged.value + 1.0) / 2.0))
        key = similar_key(task)
        count = self._judged.get(key, 0)
        self._judged[key] = count + 1
        if len(self._judged) > WRITTEN:
            self._judged.pop(next(iter(self._judged)))
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return ManagerRolloutEvent(
            task_id=task.task_id,
            worker_id=judged.worker_id,
            task_type=task.task_type,
            environment=task.environment,
            group_id=f"hints-{digest}-{count // self.group_size}",
            group_size=self.group_size,
            prompt=written.prompt,
            response=written.hint.text,
            prm_score=reward,
            outcome_score=reward,
            reward=reward,
            model_version=gen.model_version,
            prompt_token_ids=list(gen.prompt_token_ids),
            response_token_ids=list(gen.token_ids),
            token_logprobs=[float(x) for x in gen.logprobs],
            temperature=gen.temperature,
        )

    async def swap(self, update: ModelUpdateEvent, path: Path) -> str:
        """Serve the manager trainer's new adapter (between two hints); one line saying what is served."""
        async with self.lock:
            policy = await asyncio.to_thread(self._loaded)
            await asyncio.to_thread(policy.swap_adapter, path, update.model_version, update.base_fingerprint)
        return f"manager model serves {update.model_version}"
