"""The model a local worker serves, and the same model as the trainer sees it.

A worker samples with `LocalPolicy.generate`: its own loop over the KV cache, drawing each token
from exactly softmax(logits / temperature), with no top-k, top-p or repetition penalty. The
log-probability of every drawn token under that distribution travels with the rollout as the
behaviour policy, and the trainer recomputes it with `response_logprobs` over one forward of
prompt + response (token t scored by the logits at t-1, docs/reference/carl.md §2). Both sides use the same
float32 log-softmax, so on a fresh adapter the importance ratio is 1 to float rounding.

A new adapter is swapped into the live model (`swap_adapter`): the base stays loaded, peft adds
the adapter beside the previous one, switches to it and deletes the old one. The weights of a full
fine-tune of the same base are copied into the live model in place (`swap_full_weights`), once every
tensor is checked to fit; an adapter that comes after them goes on the base again, reloaded.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.coherence.phi import phi_from_entropy, token_entropy
from engine.errors import CarlError
from engine.training import data as training_data
from engine.training import grpo
from engine.training.backend import CPU_THREADS, one_line
from engine.training.config import TINY_MODEL

if TYPE_CHECKING:
    from torch import Tensor

BASE_VERSION = "base"  # what a worker serves before any adapter arrives


class PolicyError(CarlError):
    """The served model cannot do what was asked (load, generate, take an adapter): one line."""


@dataclass
class Generation:
    """One sampled answer, with what the trainer needs to use it as a rollout."""

    prompt_token_ids: list[int]  # the exact ids the model was conditioned on
    token_ids: list[int]  # generated, up to and including eos when it was produced
    text: str  # decoded without special tokens
    logprobs: list[float]  # per token: log softmax(logits / temperature) of the drawn token
    entropies: list[float]  # per token, nats, of that same distribution
    phi_mean: float | None  # mean per-token Phi = 1 - H / ln|V|; None with no tokens
    model_version: str
    temperature: float = 1.0
    finished: bool = False  # True when eos ended it (not the token limit)


# -- the model ---------------------------------------------------------------------------------


def resolve_model(model: str, home: Path) -> Path | str:
    """A local model directory (the built-in tiny model is built on first use), or a hub id as given."""
    where = training_data.resolve_model(model, home, seed=0)
    return Path(where) if model == TINY_MODEL or training_data.is_local_model(model) else where


def base_fingerprint(model_dir: Path | str) -> str:
    """16 hex digits of the sha256 of the base model's config.json (for a hub id, the downloaded one).

    An adapter names the fingerprint of the base it was trained on; a worker serving another base
    refuses it (docs/reference/agents-plane.md §12 rule 6) instead of loading weights that do not fit.
    """
    path = Path(model_dir)
    if isinstance(model_dir, str) and not path.is_dir():
        from huggingface_hub import hf_hub_download

        try:
            path = Path(hf_hub_download(model_dir, "config.json"))
        except Exception as exc:
            raise PolicyError(f"model {model_dir}: cannot read its config.json ({one_line(exc)})") from None
    else:
        path = path / "config.json"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read it ({exc.strerror})") from None
    return hashlib.sha256(data).hexdigest()[:16]


def load_model(where: Path | str, name: str, device: str) -> tuple[Any, Any]:
    """(tokenizer, model) in float32, eval mode, frozen; pad token = eos when the tokenizer has none.

    float32 on every device: the trainer's importance ratio divides two probabilities computed
    on two machines, and reduced precision would put its rounding into that ratio.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    training_data.offline_if_local(name)
    hf_logging.disable_progress_bar()  # a worker's log is read as lines
    if device == "cpu":
        torch.set_num_threads(CPU_THREADS)  # tiny matrices: more threads only synchronise
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(where))
        model = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise PolicyError(f"model {name}: cannot load it ({one_line(exc)[:200]})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # transformers wraps `to` in functools.wraps, which typeshed types as a plain callable: mypy takes the
    # device for `self`.
    model.to(device).eval()  # type: ignore[arg-type]
    model.requires_grad_(False)
    return tokenizer, model


# -- scoring prompt + response pairs (shared with the trainer) --------------------------------------


@dataclass
class PackedBatch:
    """Prompt + response rows, right-padded: one forward scores every response token."""

    input_ids: Tensor  # [B, T]
    attention_mask: Tensor  # [B, T]
    completion_mask: Tensor  # [B, T], True at response tokens
    lengths: list[int]  # response tokens per row

    @classmethod
    def of(
        cls, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, device: str
    ) -> PackedBatch:
        """The pairs packed by engine.training.grpo.pack (the MLX backend's too), as tensors on `device`."""
        import torch

        try:
            packed = grpo.pack(pairs, pad_id)
        except ValueError as exc:
            raise PolicyError(str(exc)) from None
        return cls(
            torch.from_numpy(packed.ids).to(device),
            torch.from_numpy(packed.attention).to(device),
            torch.from_numpy(packed.completion).to(device),
            packed.lengths,
        )


def response_logprobs(logits: Tensor, batch: PackedBatch, temperature: float) -> list[Tensor]:
    """Per row, log softmax(logits / temperature) of each response token, scored by the logits at t-1.

    Only the response rows of the logits are normalised (a [tokens, V] slice, not [B, T, V]); the
    result keeps the logits' graph, so the trainer differentiates through it.
    """
    import torch

    targets = batch.completion_mask[:, 1:]
    rows = logits[:, :-1][targets].float() / temperature  # row-major: sample by sample, in token order
    picked = torch.log_softmax(rows, dim=-1).gather(-1, batch.input_ids[:, 1:][targets].unsqueeze(-1))
    return list(picked.squeeze(-1).split(batch.lengths))


def forward(model: Any, batch: PackedBatch) -> Tensor:
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits


# -- the served policy -------------------------------------------------------------------------------


class LocalPolicy:
    """A causal LM served by a worker: generation with behaviour log-probs, and adapter hot-swap."""

    def __init__(
        self,
        name: str,
        where: Path | str,
        tokenizer: Any,
        model: Any,
        *,
        device: str,
        fingerprint: str,
        seed: int = 0,
    ) -> None:
        self.name = name  # the model as given ("carl-tiny", a directory or a hub id)
        self.where = where
        self.tokenizer = tokenizer
        self.model = model
        self.device = device
        self.fingerprint = fingerprint
        self.version = BASE_VERSION
        self.vocab_size = _logits_width(model)
        self.context = int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or 0)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.cache_arg = _cache_arg(model)
        self._seeds = np.random.default_rng(seed)  # each unseeded generation draws its seed from here
        self._slot: str | None = None  # the peft adapter name in use (None: the bare base)
        self._loads = 0
        self.full_weights: str | None = None  # the version whose every weight is loaded (None: the base's)

    @classmethod
    def load(cls, model: str, home: Path, *, seed: int = 0, device: str | None = None) -> LocalPolicy:
        import torch

        where = resolve_model(model, home)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        tokenizer, loaded = load_model(where, model, device)
        return cls(
            model, where, tokenizer, loaded, device=device, fingerprint=base_fingerprint(where), seed=seed
        )

    # -- prompts -----------------------------------------------------------------------------------

    def prompt_ids(self, prompt: str, system: str | None = None) -> list[int]:
        """The ids the model is conditioned on: the chat template with the assistant turn opened."""
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        if self.tokenizer.chat_template is None:  # a base model without a template: plain text
            text = f"{system}\n\n{prompt}" if system else prompt
            return list(self.tokenizer(text)["input_ids"])
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [int(i) for i in ids]

    # -- generation --------------------------------------------------------------------------------

    def generate(
        self,
        prompt: str,
        *,
        system: str | None = None,
        max_new_tokens: int = 48,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> Generation:
        return self.generate_ids(
            self.prompt_ids(prompt, system), max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )

    def generate_ids(
        self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float, seed: int | None = None
    ) -> Generation:
        """Sample up to `max_new_tokens` from softmax(logits / temperature), one token at a time."""
        import torch
        from transformers import DynamicCache

        if not temperature > 0:
            raise PolicyError(f"temperature must be > 0, got {temperature}")
        if not prompt_ids:
            raise PolicyError("the prompt has no tokens")
        room = self.context - len(prompt_ids) if self.context else max_new_tokens
        if room <= 0:
            raise PolicyError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context is {self.context}"
            )
        if seed is None:
            seed = int(self._seeds.integers(2**62))
        generator = torch.Generator(device=self.device).manual_seed(seed)
        tokens: list[int] = []
        logprobs: list[float] = []
        entropies: list[float] = []
        finished = False
        step_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.model.config)  # filled in place by every forward
        with torch.inference_mode():
            for _ in range(min(max_new_tokens, room)):
                out = self.model(
                    input_ids=step_ids, use_cache=True, logits_to_keep=1, **{self.cache_arg: cache}
                )
                logits = out.logits[0, -1:].float()
                logp = torch.log_softmax(logits / temperature, dim=-1)  # the trainer's exact formula
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                entropy, _ = token_entropy(logits, temperature=temperature)
                tokens.append(token)
                logprobs.append(float(logp[0, token]))
                entropies.append(float(entropy[0]))
                if token in self.eos_ids:
                    finished = True
                    break
                step_ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        phi = phi_from_entropy(np.asarray(entropies, dtype=np.float64), self.vocab_size)
        return Generation(
            prompt_token_ids=list(prompt_ids),
            token_ids=tokens,
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            logprobs=logprobs,
            entropies=entropies,
            phi_mean=float(phi.mean()) if tokens else None,
            model_version=self.version,
            temperature=temperature,
            finished=finished,
        )

    def score(
        self, prompt_ids: Sequence[int], token_ids: Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        """Log-probs of `token_ids` after `prompt_ids` under the policy as it is now (no sampling)."""
        import torch

        batch = PackedBatch.of([(prompt_ids, token_ids)], self.tokenizer.pad_token_id or 0, self.device)
        with torch.inference_mode():
            return response_logprobs(forward(self.model, batch), batch, temperature)[0].tolist()

    # -- adapters ----------------------------------------------------------------------------------

    def swap_adapter(self, path: Path, version: str, base_fingerprint: str | None) -> None:
        """Serve the peft LoRA adapter at `path` as `version`, without reloading the base.

        An empty or None fingerprint is taken on trust; one that names another base is refused.
        On any failure the policy keeps serving what it served before.
        """
        from peft import PeftModel

        self._check_base(version, base_fingerprint)
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise PolicyError(f"adapter {version}: {path} is not a peft adapter (no adapter_config.json)")
        if self.full_weights is not None:  # an adapter is trained on the base: put the base back first
            self.tokenizer, self.model = load_model(self.where, self.name, self.device)
            self.full_weights, self._slot = None, None
        # peft's own slot names, not the version: a version may hold characters a module name may not,
        # and the same version may arrive twice (a redelivered update) and must still load.
        self._loads += 1
        slot = f"adapter_{self._loads}"
        try:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(str(path), adapter_name=slot)
            else:
                self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=slot)
            self.model.set_adapter(slot)
        except Exception as exc:
            if isinstance(self.model, PeftModel) and slot in self.model.peft_config:
                self.model.delete_adapter(slot)
                if self._slot is not None:
                    self.model.set_adapter(self._slot)
            raise PolicyError(f"adapter {version}: cannot load {path} ({one_line(exc)[:200]})") from None
        if self._slot is not None:
            self.model.delete_adapter(self._slot)  # one at a time: they would pile up in memory otherwise
        self._slot = slot
        self.model.eval()
        self.model.requires_grad_(False)
        self.version = version

    def swap_full_weights(self, path: Path, version: str, base_fingerprint: str | None) -> None:
        """Serve every weight of the model in `path` (a full fine-tune of this base) as `version`.

        Each tensor must be one of the model's, of the same shape, and the model's tensors it lacks
        must be tied to one it has (an untied output head); otherwise nothing is changed. The copy
        is in place (no second model in memory), converted to the served dtype.
        """
        import torch
        from peft import PeftModel

        self._check_base(version, base_fingerprint)
        state = read_weights(Path(path), version)
        if isinstance(self.model, PeftModel):
            self.model = self.model.unload()  # the adapter's layers out, the base's weights untouched
            self._slot = None
        own = self.model.state_dict()
        wrong = [k for k, v in state.items() if k not in own or tuple(own[k].shape) != tuple(v.shape)]
        if wrong:
            key = wrong[0]
            what = (
                "not a weight of this model"
                if key not in own
                else (f"shape {tuple(state[key].shape)}, the model's is {tuple(own[key].shape)}")
            )
            raise PolicyError(f"weights {version}: {key}: {what} ({len(wrong)} such; another architecture?)")
        given = {own[k].data_ptr() for k in state}
        missing = [k for k in own if k not in state and own[k].data_ptr() not in given]
        if missing:
            raise PolicyError(
                f"weights {version}: {len(missing)} of the model's tensors missing, first {missing[0]}"
            )
        with torch.no_grad():
            self.model.load_state_dict(state, strict=False)
        self.model.eval()
        self.model.requires_grad_(False)
        self.version = version
        self.full_weights = version

    def _check_base(self, version: str, base_fingerprint: str | None) -> None:
        if base_fingerprint and base_fingerprint != self.fingerprint:
            raise PolicyError(
                f"weights {version} were trained from base {base_fingerprint}, but this worker "
                f"serves {self.name} (base {self.fingerprint})"
            )

    def attach_trainable_lora(self, *, r: int, alpha: int, target_modules: str | list[str], seed: int) -> Any:
        """Wrap the base in a fresh trainable LoRA adapter: the trainer's view of the served model.

        Dropout is 0: the importance ratio must compare the very function the worker sampled from,
        and dropout noise would move it off 1 for a policy that has not changed. B starts at zero, so
        the adapter policy equals the base until the first optimizer step.
        """
        import torch
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(seed)  # A's random init
        config = LoraConfig(
            r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules, task_type="CAUSAL_LM"
        )
        self.model = get_peft_model(self.model, config)
        self.model.eval()  # no dropout anywhere; gradients still flow
        return self.model

    @property
    def adapters(self) -> list[str]:
        """The peft adapter slots loaded now (at most one after a swap)."""
        config = getattr(self.model, "peft_config", None)
        return list(config) if config else []


def read_weights(path: Path, version: str) -> dict[str, Tensor]:
    """Every tensor of the safetensors files in `path` (one file, or the shards), on the CPU."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise PolicyError(f"weights {version}: {path} holds no .safetensors file")
    state: dict[str, Tensor] = {}
    for file in files:
        try:
            state.update(load_file(str(file), device="cpu"))
        except Exception as exc:
            raise PolicyError(f"weights {version}: cannot read {file.name} ({one_line(exc)[:200]})") from None
    return state


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    listed = configured if isinstance(configured, list) else [configured]
    ids = {int(i) for i in listed if i is not None}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


def _cache_arg(model: Any) -> str:
    """transformers 5.x renamed the forward's `past_key_values` to `cache`; use whichever it takes."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _logits_width(model: Any) -> int:
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)
