"""What a worker answers with: a backend, `model` (a transformers model on this machine) or `http` (an
OpenAI-compatible server), behind one protocol (`Backend`): answer a task, hot-swap new weights, close.

- `model` samples at the configured temperature and reports, per generated token, the behaviour policy's
  log-prob, so the trainer's importance ratio is exact; it swaps in each new LoRA adapter, or the full
  weights of a run it serves, without restarting.
- `http` asks the server for each token's log-prob and id (`logprobs`, and vLLM's
  `return_tokens_as_token_ids` and `return_token_ids`), so a server that gives them feeds training like a
  model worker; with `endpoint_lora` it has the server load each new adapter through vLLM's runtime LoRA
  API, then requests it by name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from engine.errors import CarlError

from .events import ModelUpdateEvent, TaskEvent
from .plane_settings import AgentsSettings

if TYPE_CHECKING:
    import httpx

SYSTEM_PROMPT = (
    "Solve the task step by step. Write each step inside <step>...</step>, "
    "then the final answer inside <answer>...</answer>."
)


@dataclass
class Answer:
    """What a backend made of one task."""

    reply: str  # the model's raw text
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    temperature: float | None = None
    phi_mean: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    kind: str
    model: str
    version: str

    def answer(self, task: TaskEvent) -> Answer: ...

    def hot_swap(self, update: ModelUpdateEvent, path: Path) -> str:
        """Serve the update's weights (unpacked at `path` on this machine) from now on; returns what
        was done, in one line."""
        ...

    def close(self) -> None: ...


class WorkerError(CarlError):
    """A worker cannot start (its model or endpoint is unusable), or cannot serve an update; one line."""


class SwapNotNow(WorkerError):
    """The server could not load an update now (an error on its side, or it is overloaded): the worker
    tries again later."""


def system_prompt(settings: AgentsSettings) -> str | None:
    """The instruction sent with every task: the settings' (an empty one: none at all), else the default.
    A model trained without one (the demo run) is served the way it was trained."""
    if settings.system_prompt is None:
        return SYSTEM_PROMPT
    return settings.system_prompt or None


# -- backends ----------------------------------------------------------------------------------


class ModelBackend:
    """A transformers model on this machine (engine.agents.policy)."""

    kind = "model"

    def __init__(self, settings: AgentsSettings, home: Path, *, seed: int = 0) -> None:
        from .policy import LocalPolicy

        self.settings = settings
        self.model = settings.model
        self.policy = LocalPolicy.load(settings.model, home, seed=seed)

    @property
    def version(self) -> str:
        return str(self.policy.version)

    def answer(self, task: TaskEvent) -> Answer:
        generation = self.policy.generate(
            task.prompt,
            system=system_prompt(self.settings),
            max_new_tokens=self.settings.max_new_tokens,
            temperature=self.settings.temperature,
            seed=None,
        )
        return Answer(
            reply=generation.text,
            prompt_token_ids=list(generation.prompt_token_ids),
            token_ids=list(generation.token_ids),
            logprobs=[float(x) for x in generation.logprobs],
            temperature=self.settings.temperature,
            phi_mean=_unit(generation.phi_mean),
        )

    def hot_swap(self, update: ModelUpdateEvent, path: Path) -> str:
        fingerprint = update.base_fingerprint or None
        if update.weights == "full":
            self.policy.swap_full_weights(path, update.model_version, fingerprint)
            return f"serving {update.model_version} (every weight)"
        self.policy.swap_adapter(path, update.model_version, fingerprint)
        return f"serving adapter {update.model_version}"

    def close(self) -> None:
        pass


# What an http worker asks for so that its answers can train: every generated token's log-prob, and
# the ids of the prompt's and the answer's tokens (vLLM: `return_token_ids` puts them beside the text,
# and `return_tokens_as_token_ids` writes each log-prob entry's token as `token_id:<id>`).
BEHAVIOUR_FIELDS: dict[str, Any] = {
    "logprobs": True,
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
}
TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class HttpBackend:
    """An OpenAI-compatible chat completions endpoint (vLLM, llama.cpp server, Ollama)."""

    kind = "http"

    def __init__(self, settings: AgentsSettings, *, timeout: float | None = None) -> None:
        import httpx

        if not settings.endpoint:
            raise WorkerError("an http worker needs an endpoint (--endpoint or agents.endpoint)")
        self.settings = settings
        self.endpoint = settings.endpoint.rstrip("/")
        self.model = settings.endpoint_model or settings.model
        self.version = self.model
        key = os.environ.get("CARL_WORKER_API_KEY") or os.environ.get("OPENAI_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(
            base_url=self.endpoint, headers=headers, timeout=timeout or settings.task_timeout_s
        )
        self.asking = dict(BEHAVIOUR_FIELDS)  # what the server has not refused yet

    def answer(self, task: TaskEvent) -> Answer:
        return self._complete(task.prompt, self.settings.max_new_tokens)

    def _complete(self, prompt: str, max_tokens: int) -> Answer:
        system = system_prompt(self.settings)
        body: dict[str, Any] = {
            "model": self.version,
            "messages": ([{"role": "system", "content": system}] if system else [])
            + [{"role": "user", "content": prompt}],
            "temperature": self.settings.temperature,
            "max_tokens": max_tokens,
        }
        response = self.client.post("/chat/completions", json={**body, **self.asking})
        while response.status_code == 400 and self._refused_field(response.text):
            response = self.client.post("/chat/completions", json={**body, **self.asking})
        if response.status_code != 200:
            raise WorkerError(f"{self.endpoint}: HTTP {response.status_code}: {_snippet(response.text)}")
        try:
            completion = response.json()
            choice = completion["choices"][0]
            reply = choice["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise WorkerError(f"{self.endpoint}: not a chat completion: {_snippet(response.text)}") from None
        prompt_ids, token_ids, logprobs = behaviour_of(completion, choice)
        return Answer(
            reply=reply,
            prompt_token_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            temperature=self.settings.temperature,
            metadata={"finish_reason": choice.get("finish_reason")},
        )

    def _refused_field(self, text: str) -> bool:
        """A 400 that names a field we asked for (a server without it): ask without it from now on."""
        lowered = text.lower()
        for field_name in [f for f in self.asking if f != "logprobs"] + ["logprobs"]:
            if field_name in self.asking and field_name.removesuffix("s") in lowered:
                del self.asking[field_name]
                return True
        return False

    def training_support(self) -> str | None:
        """Why this endpoint's answers cannot train the served model (None: they can): one short
        completion, asking as every task asks, must come back with each token's log-prob and the ids."""
        answer = self._complete("Say OK.", 4)
        missing = [
            what
            for what, given in (
                ("per-token log-probs", answer.logprobs),
                ("token ids", answer.token_ids),
                ("prompt token ids", answer.prompt_token_ids),
            )
            if not given
        ]
        if not answer.token_ids and not answer.logprobs:
            return "gives neither per-token log-probs nor token ids"
        if missing:
            return f"gives no {' and no '.join(missing)}"
        if len(answer.token_ids) != len(answer.logprobs):
            return f"gives {len(answer.token_ids)} token ids for {len(answer.logprobs)} log-probs"
        return None

    def hot_swap(self, update: ModelUpdateEvent, path: Path) -> str:
        keeps = f"keeps serving {self.version}"
        if not self.settings.endpoint_lora:
            return f"{keeps}: {self.endpoint} loads no adapters (agents.endpoint_lora is off)"
        if update.weights != "adapter":
            return f"{keeps}: {update.model_version} is every weight, not an adapter to load"
        # The server beside this worker reads the adapter from this machine's disk: where it was unpacked.
        response = self.client.post(
            "/load_lora_adapter",
            json={"lora_name": update.model_version, "lora_path": str(path)},
        )
        refused = lora_load_refused(response)
        if refused is not None:
            failed = f"{self.endpoint}: loading adapter {update.model_version} failed: {refused}"
            raise (SwapNotNow if response.status_code >= 500 or response.status_code == 429 else WorkerError)(
                failed
            )
        self.version = update.model_version  # the name the server loaded is the name requested
        return f"serving adapter {update.model_version} from {self.endpoint}"

    def close(self) -> None:
        self.client.close()


def lora_load_refused(response: httpx.Response) -> str | None:
    """Why vLLM's `POST /v1/load_lora_adapter` did not load the adapter (None: it is loaded).

    A name already loaded is loaded (a redelivered update asks twice). vLLM started without
    VLLM_ALLOW_RUNTIME_LORA_UPDATING has no such route: FastAPI's bare 404, not vLLM's error object.
    """
    if response.status_code == 200:
        return None
    try:
        body = response.json()
    except ValueError:
        body = None
    message = body.get("message") if isinstance(body, dict) else None
    if response.status_code == 400 and "already been loaded" in str(message):
        return None
    if response.status_code in (404, 405) and not (isinstance(body, dict) and body.get("object") == "error"):
        return (
            "the server has no runtime LoRA loading (vLLM: start it with --enable-lora and "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        )
    return f"HTTP {response.status_code}: {_snippet(str(message) if message else response.text)}"


def behaviour_of(
    completion: dict[str, Any], choice: dict[str, Any]
) -> tuple[list[int], list[int], list[float]]:
    """(prompt token ids, answer token ids, answer log-probs) of a chat completion, each [] when the
    server did not give it (or gave it malformed): vLLM's `prompt_token_ids` beside the choices and
    `token_ids` in the choice, else the ids spelled `token_id:<id>` in the log-prob entries."""
    content = (choice.get("logprobs") or {}).get("content") or []
    entries = [t for t in content if isinstance(t, dict)]
    logprobs = [float(t["logprob"]) for t in entries if isinstance(t.get("logprob"), int | float)]
    if len(logprobs) != len(content):
        logprobs = []
    token_ids = _ids(choice.get("token_ids"))
    if not token_ids and entries:
        spelled = [TOKEN_ID.match(str(t.get("token", ""))) for t in entries]
        token_ids = [int(m.group(1)) for m in spelled if m] if all(spelled) else []
    if logprobs and token_ids and len(token_ids) != len(logprobs):
        token_ids = []  # ids that do not line up with the log-probs would train the wrong tokens
    prompt_ids = _ids(completion.get("prompt_token_ids")) or _ids(choice.get("prompt_token_ids"))
    return prompt_ids, token_ids, logprobs


def _ids(value: Any) -> list[int]:
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        return list(value)
    return []


def check_trainable_endpoint(settings: AgentsSettings) -> None:
    """`--train` with http workers: their server must give what the trainer needs, or the plane does not
    start (today's alternative: every rollout refused, one by one). Raises WorkerError, one line."""
    if not (settings.train.enabled and settings.worker_kind == "http" and settings.workers > 0):
        return
    backend = HttpBackend(settings, timeout=min(settings.task_timeout_s, 60.0))
    try:
        reason = backend.training_support()
    except Exception as exc:
        reason = f"did not answer a probe ({' '.join(str(exc).split())[:200]})"
    finally:
        backend.close()
    if reason is not None:
        raise WorkerError(
            f"--train: http workers cannot feed training: {settings.endpoint} {reason} "
            "(vLLM gives them with logprobs, return_tokens_as_token_ids and return_token_ids)"
        )


def _snippet(text: str) -> str:
    return " ".join(text.split())[:160]


def _unit(value: float | None) -> float | None:
    if value is None or value != value:
        return None
    return min(1.0, max(0.0, float(value)))
