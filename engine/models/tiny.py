"""The built-in tiny model: a small Llama-style causal LM with a byte-level BPE tokenizer.

Built locally in seconds, deterministically, with nothing downloaded, and saved in the Hugging
Face layout that both transformers and mlx-lm load. Tests and the offline demo train it.

torch, transformers and tokenizers are imported inside the functions: importing `engine` must
stay cheap.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

from engine import paths

from .corpus import corpus_hash, demo_corpus

BUILDER_VERSION = 1
BUILD_FILE = "carl_build.json"
MODEL_FILES = (
    "config.json",
    "model.safetensors",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)

VOCAB_SIZE = 512


class Architecture(TypedDict):
    """The model's shape: LlamaConfig's keyword arguments."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    tie_word_embeddings: bool


ARCHITECTURE: Architecture = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,  # mlx-lm's llama defaults to tied; one matrix is also smaller
}

# Fixed ids: the tokenizer trainer places special tokens first, in this order.
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK, *ROLE_TOKENS]

# Each turn is "<|role|>\ncontent</s>\n"; a generation prompt ends with "<|assistant|>\n", so the
# model's turn ends when it emits eos.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def default_model_dir(home: Path | None = None) -> Path:
    return paths.models_dir(home) / "carl-tiny"


def build_fingerprint(seed: int) -> dict[str, Any]:
    """What the built files depend on; a directory with a different fingerprint is rebuilt."""
    return {
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "corpus_hash": corpus_hash(),
        "vocab_size": VOCAB_SIZE,
        "architecture": ARCHITECTURE,
    }


def is_built(out_dir: Path, seed: int = 0) -> bool:
    try:
        recorded = json.loads((out_dir / BUILD_FILE).read_text())
    except (OSError, ValueError):
        return False
    return recorded == build_fingerprint(seed) and all((out_dir / name).is_file() for name in MODEL_FILES)


def build_tiny_model(out_dir: Path, *, seed: int = 0, force: bool = False) -> Path:
    """Build the tiny model into out_dir (or reuse it when already built with this fingerprint)."""
    out_dir = Path(out_dir)
    if not force and is_built(out_dir, seed):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time: processes starting together (the demo run and the agents plane's workers)
    # would otherwise each build and swap in a copy while another is already loading the first one.
    with _build_lock(out_dir):
        if not force and is_built(out_dir, seed):
            return out_dir  # built while we waited
        # Build beside the target and swap it in, so a reader never sees a half-written model.
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        try:
            tokenizer = _train_tokenizer()
            _save_tokenizer(tokenizer, staging)
            _build_model(tokenizer, seed).save_pretrained(staging)
            (staging / BUILD_FILE).write_text(
                json.dumps(build_fingerprint(seed), indent=2, sort_keys=True) + "\n"
            )
            _swap_into_place(staging, out_dir, seed)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir


@contextmanager
def _build_lock(out_dir: Path) -> Iterator[None]:
    """An exclusive flock beside the model directory, held while it is built (released if we die)."""
    lock_path = out_dir.parent / f".{out_dir.name}-build.lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _train_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
        show_progress=False,
    )
    tokenizer.train_from_iterator(demo_corpus(), trainer=trainer)
    return tokenizer


def _save_tokenizer(tokenizer: Any, out_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=ARCHITECTURE["max_position_embeddings"],
    )
    wrapped.save_pretrained(out_dir)
    special = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "additional_special_tokens": ROLE_TOKENS,
    }
    # transformers 5 folds this file into tokenizer_config.json; older loaders still look for it.
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def _build_model(tokenizer: Any, seed: int) -> Any:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {name: tokenizer.token_to_id(token) for name, token in (("pad", PAD), ("bos", BOS), ("eos", EOS))}
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        **ARCHITECTURE,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], max_new_tokens=64
    )
    return model


def _swap_into_place(staging: Path, out_dir: Path, seed: int) -> None:
    if out_dir.exists():
        # Replace only what we built (or nothing at all): never wipe a stranger's directory.
        if any(out_dir.iterdir()) and not (out_dir / BUILD_FILE).exists():
            raise FileExistsError(f"{out_dir} is not empty and holds no tiny-model build; not replacing it")
        shutil.rmtree(out_dir)
    try:
        os.replace(staging, out_dir)
    except OSError:
        # Another process built it between our rmtree and replace; theirs is as good as ours.
        if not is_built(out_dir, seed):
            raise
