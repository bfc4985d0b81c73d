"""The tiny model answered in numpy: greedy answers and the entropy of each answer token, without torch or
transformers.

`carl eval` of a run of the built-in tiny model (engine/models/tiny.py: a 2-layer Llama, 64 wide, |V| 512)
spent ~90% of its time importing torch and transformers (5-6 s of ~6.5 s on an idle 2-core machine, ~28 s of
36-43 s on a busy one) for well under a second of arithmetic. This module runs the same network from its
safetensors file with numpy, its tokenizer with `tokenizers` and its chat template with jinja2, as
transformers would: `supports` says which model directories it takes (exactly the tiny model's
architecture, full weights, its own chat template); anything else goes through transformers.

The arithmetic is Llama's (transformers' `modeling_llama.py`): RMSNorm in float32, rotary embeddings with
the default rope, causal attention over the row's own tokens (a left-padded batch masks its padding), a SiLU
MLP, the tied LM head. Greedy answers and per-token entropies match the transformers path to float32
rounding (tests/test_eval.py compares both on a trained run).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .tiny import CHAT_TEMPLATE

WEIGHTS = "model.safetensors"
# The config a model must have to be answered here: the tiny model's architecture, nothing else.
REQUIRED = {
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "pretraining_tp": 1,
}


def chat_template(path: Path) -> str | None:
    """The model directory's chat template, as transformers finds it (its own file, else the tokenizer's
    config)."""
    file = path / "chat_template.jinja"
    if file.is_file():
        return file.read_text()
    try:
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    return template if isinstance(template, str) else None


def supports(path: Path) -> bool:
    """Whether `path` holds the tiny model's architecture (full weights, one safetensors file, a
    tokenizer.json and the tiny model's chat template), which this module answers exactly as transformers."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or any(config.get(k, v) != v for k, v in REQUIRED.items()):
        return False
    rope = config.get("rope_parameters") or {}
    if config.get("rope_scaling") or rope.get("rope_type", "default") != "default":
        return False
    if config.get("architectures") != ["LlamaForCausalLM"] or config.get("dtype", "float32") != "float32":
        return False
    files = (path / WEIGHTS, path / "tokenizer.json")
    return all(f.is_file() for f in files) and chat_template(path) in (CHAT_TEMPLATE, CHAT_TEMPLATE + "\n")


class TinyTokenizer:
    """The model's fast tokenizer (tokenizers) and chat template (jinja2, sandboxed as transformers
    renders)."""

    def __init__(self, path: Path) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = json.loads((path / "config.json").read_text())
        self.eos_token_id = int(config["eos_token_id"])
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self.template = env.from_string(chat_template(path) or CHAT_TEMPLATE)

    def model_input(self, prompt: Any) -> str:
        """The text the model is fed: the chat template with the generation prompt, or the text."""
        if isinstance(prompt, str):
            return prompt
        return self.template.render(messages=prompt, add_generation_prompt=True)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


class TinyLlama:
    """The network, float32, from its safetensors file; `greedy` answers a batch of prompts."""

    def __init__(self, path: Path) -> None:
        from safetensors.numpy import load_file

        config = json.loads((path / "config.json").read_text())
        self.weights = {
            k: np.ascontiguousarray(v, dtype=np.float32) for k, v in load_file(path / WEIGHTS).items()
        }
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or config["hidden_size"] // self.heads)
        self.eps = float(config["rms_norm_eps"])
        theta = float(
            (config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta", 10000.0)
        )
        exponents = np.arange(0, self.head_dim, 2, dtype=np.int64).astype(np.float32) / self.head_dim
        self.inv_freq = (1.0 / (theta**exponents)).astype(np.float32)
        self.embed = self.weights["model.embed_tokens.weight"]
        self.head = self.weights.get("lm_head.weight", self.embed)
        self.vocab_size = int(self.head.shape[0])

    def _w(self, name: str) -> np.ndarray:
        return self.weights[name]

    def _norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        variance = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return weight * (x / np.sqrt(variance + np.float32(self.eps))).astype(np.float32)

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: [B, heads, T, D]; positions: [B, T]."""
        freqs = positions[..., None].astype(np.float32) * self.inv_freq  # [B, T, D/2]
        emb = np.concatenate([freqs, freqs], axis=-1)
        cos, sin = np.cos(emb)[:, None], np.sin(emb)[:, None]
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return (x * cos + rotated * sin).astype(np.float32)

    def forward(
        self, ids: np.ndarray, positions: np.ndarray, keys_ok: np.ndarray, cache: list[list[np.ndarray]]
    ) -> np.ndarray:
        """Logits [B, T, V] of the new tokens `ids` [B, T] at `positions`, attending to the cached keys and
        values and to themselves (causally); `keys_ok` [B, cached + T]: which keys are real tokens."""
        batch, length = ids.shape
        x = self.embed[ids]
        before = cache[0][0].shape[2] if cache else 0
        causal = np.arange(before + length)[None, :] <= (before + np.arange(length))[:, None]  # [T, K]
        allowed = causal[None, None] & keys_ok[:, None, None, :]  # [B, 1, T, K]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self._norm(x, self._w(p + "input_layernorm.weight"))
            q = (h @ self._w(p + "self_attn.q_proj.weight").T).reshape(
                batch, length, self.heads, self.head_dim
            )
            k = (h @ self._w(p + "self_attn.k_proj.weight").T).reshape(
                batch, length, self.kv_heads, self.head_dim
            )
            v = (h @ self._w(p + "self_attn.v_proj.weight").T).reshape(
                batch, length, self.kv_heads, self.head_dim
            )
            q = self._rope(q.transpose(0, 2, 1, 3), positions)
            k = self._rope(k.transpose(0, 2, 1, 3), positions)
            v = v.transpose(0, 2, 1, 3)
            if len(cache) <= i:
                cache.append([k, v])
            else:
                cache[i] = [
                    np.concatenate([cache[i][0], k], axis=2),
                    np.concatenate([cache[i][1], v], axis=2),
                ]
            keys, values = cache[i]
            if self.kv_heads != self.heads:
                keys = np.repeat(keys, self.heads // self.kv_heads, axis=1)
                values = np.repeat(values, self.heads // self.kv_heads, axis=1)
            scores = np.where(
                allowed, (q @ keys.transpose(0, 1, 3, 2)) * np.float32(self.head_dim**-0.5), -np.inf
            )
            top = np.max(scores, axis=-1, keepdims=True)
            # A padding query sees no key: it attends to nothing (zeros), never NaN into the real rows.
            weights = np.where(allowed, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0).astype(
                np.float32
            )
            weights /= np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(1e-30))
            attended = (weights @ values).transpose(0, 2, 1, 3).reshape(batch, length, -1)
            x = x + attended @ self._w(p + "self_attn.o_proj.weight").T
            h = self._norm(x, self._w(p + "post_attention_layernorm.weight"))
            gate = h @ self._w(p + "mlp.gate_proj.weight").T
            up = h @ self._w(p + "mlp.up_proj.weight").T
            x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ self._w(p + "mlp.down_proj.weight").T
        x = self._norm(x, self._w("model.norm.weight"))
        return (x @ self.head.T).astype(np.float32)

    def greedy(
        self, prompts: list[list[int]], max_new_tokens: int, eos: int, temperature: float
    ) -> list[tuple[list[int], list[float]]]:
        """Per prompt: the greedy answer's ids (up to and with eos) and the entropy (nats) at `temperature` of
        the distribution that chose each of its tokens. The batch is left-padded, as transformers pads it."""
        width = max(len(p) for p in prompts)
        ids = np.zeros((len(prompts), width), dtype=np.int64)
        keys_ok = np.zeros((len(prompts), width), dtype=bool)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = prompt
            keys_ok[row, width - len(prompt) :] = True
        positions = np.maximum(np.cumsum(keys_ok, axis=1) - 1, 0)
        cache: list[list[np.ndarray]] = []
        logits = self.forward(ids, positions, keys_ok, cache)[:, -1]
        answers: list[list[int]] = [[] for _ in prompts]
        entropies: list[list[float]] = [[] for _ in prompts]
        done = np.zeros(len(prompts), dtype=bool)
        next_position = positions[:, -1] + 1
        for _ in range(max_new_tokens):
            chosen = np.argmax(logits, axis=-1)
            h = entropy(logits, temperature)
            for i in np.flatnonzero(~done):
                answers[i].append(int(chosen[i]))
                entropies[i].append(float(h[i]))
                done[i] = chosen[i] == eos
            if done.all():
                break
            keys_ok = np.concatenate([keys_ok, np.ones((len(prompts), 1), dtype=bool)], axis=1)
            logits = self.forward(chosen[:, None], next_position[:, None], keys_ok, cache)[:, -1]
            next_position = next_position + 1
        return list(zip(answers, entropies, strict=True))


def entropy(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Entropy in nats of softmax(logits / T), row by row, accumulated in float64."""
    z = logits.astype(np.float64) / temperature
    z -= z.max(axis=-1, keepdims=True)
    p = np.exp(z)
    total = p.sum(axis=-1, keepdims=True)
    return np.log(total[..., 0]) - (p * z).sum(axis=-1) / total[..., 0]


def phi_of(entropies: list[float], vocab_size: int) -> float:
    """The mean Phi of an answer's tokens, 1 - H/ln|V| (docs/reference/carl.md §1)."""
    return float(np.mean([1.0 - h / math.log(vocab_size) for h in entropies])) if entropies else math.nan
