"""The MLX backend's LoRA adapter on disk, read without MLX, and its exact copy in peft's format.

mlx-lm keeps an adapter as `adapters.safetensors` (per adapted linear layer `<prefix>.lora_a`
[in, r] and `<prefix>.lora_b` [r, out]) beside `adapter_config.json` (`fine_tune_type`,
`num_layers`, `lora_parameters: {rank, scale, dropout, keys}`), and computes
y = W x + scale * (x @ lora_a) @ lora_b. peft computes y = W x + (lora_alpha / r) * B(A(x)) with
A.weight [r, in] and B.weight [out, r]. So the copy is lora_A.weight = lora_a.T,
lora_B.weight = lora_b.T, r = rank, lora_alpha = scale * r, under peft's key names
(`base_model.model.<prefix>.lora_A.weight`).

The copy is exact or it is not made: every adapted layer must be a plain linear layer of a block
(`model.layers.N.`), present under the same name and shape in the base model's own weights, with
the same modules adapted in each adapted block. DoRA, LoRA on embeddings or mixture-of-experts
layers, a quantized base and a scale that is not a positive number are refused with the reason.
The tensors are moved as raw bytes (a transpose is a permutation), so bf16 needs no framework.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from .artifacts import base_model_of

MLX_ADAPTER_FILE = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_BLOCK = re.compile(r"model\.layers\.(\d+)\.(.+)")
_ITEM_SIZE = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}


class NotExact(ValueError):
    """Why an MLX adapter has no exact peft equivalent."""


def is_mlx_adapter(path: Path) -> bool:
    """An adapter in mlx-lm's layout (adapters.safetensors + adapter_config.json)."""
    return (path / MLX_ADAPTER_FILE).is_file() and (path / ADAPTER_CONFIG).is_file()


def hub_repo_of(base: str) -> str:
    """A base model recorded as its Hugging Face cache snapshot (…/models--org--name/snapshots/<sha>,
    where the MLX backend loads a Hub model from) as the repo id org/name; anything else as it is."""
    parts = Path(base).parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/")
    return base


def mlx_adapter_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# -- safetensors, as bytes -------------------------------------------------------------------


Tensor = tuple[str, list[int], bytes]  # (dtype, shape, raw little-endian data)


def read_safetensors(path: Path, *, header_only: bool = False) -> dict[str, Tensor]:
    """name -> (dtype, shape, bytes); with header_only, the bytes are empty."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = b"" if header_only else f.read()
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        out[name] = (entry["dtype"], list(entry["shape"]), data[begin:end])
    return out


def write_safetensors(path: Path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset, blobs = 0, []
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def transposed(tensor: Tensor) -> Tensor:
    dtype, shape, data = tensor
    size = _ITEM_SIZE.get(dtype)
    if size is None or len(shape) != 2:
        raise NotExact(f"a {dtype} tensor of shape {shape} is not a matrix this copy can transpose")
    matrix = np.frombuffer(data, dtype=f"<u{size}").reshape(shape)
    return dtype, [shape[1], shape[0]], np.ascontiguousarray(matrix.T).tobytes()


# -- the base model's weights, by name -----------------------------------------------------


def base_model_dir(base: str) -> Path | None:
    """The base model's directory on this machine: as given, or the Hugging Face cache's copy."""
    if Path(base).expanduser().is_dir():
        return Path(base).expanduser()
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(base, local_files_only=True, allow_patterns=["*.json", "*.safetensors"])
        )
    except Exception:  # not cached, not a repo id, no huggingface_hub: not on this machine
        return None


def base_weight_shapes(directory: Path) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        shapes.update(
            {name: shape for name, (_, shape, _) in read_safetensors(file, header_only=True).items()}
        )
    return shapes


# -- the conversion --------------------------------------------------------------------------


def mlx_adapter_to_peft(src_dir: Path, dst_dir: Path) -> bool:
    """Write the peft copy of the MLX adapter in `src_dir` into `dst_dir`; False (nothing written)
    when no exact copy exists."""
    try:
        convert_to_peft(src_dir, dst_dir)
    except NotExact:
        return False
    return True


def convert_to_peft(src_dir: Path, dst_dir: Path) -> None:
    """`dst_dir`/adapter_model.safetensors + adapter_config.json, peft's exact equivalent of the MLX
    adapter in `src_dir`; NotExact (and nothing written) says why there is none."""
    config = mlx_adapter_config(src_dir)
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise NotExact(
            f"it is a {kind} adapter (fine_tune_type {kind!r}), and only LoRA maps onto peft exactly"
        )
    params = config.get("lora_parameters") or {}
    rank, scale = params.get("rank"), params.get("scale")
    if not isinstance(rank, int) or rank <= 0:
        raise NotExact(f"its rank {rank!r} is not a positive integer")
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale)):
        raise NotExact(f"its scale {scale!r} is not a number")
    if scale <= 0:
        raise NotExact(f"its scale {scale!r} is not positive, as peft's lora_alpha / r must be")
    base = base_model_of(src_dir)
    if not base:
        raise NotExact("its adapter_config.json does not name the base model")
    directory = base_model_dir(base)
    if directory is None:
        raise NotExact(
            f"its base model {Path(base).name!r} is not on this machine to check the layers against"
        )
    base_config = _json(directory / "config.json")
    if base_config.get("quantization") or base_config.get("quantization_config"):
        raise NotExact("its base model is quantized, and peft cannot load that base")
    shapes = base_weight_shapes(directory)
    weights = read_safetensors(src_dir / MLX_ADAPTER_FILE)

    out: dict[str, Tensor] = {}
    adapted: dict[int, set[str]] = {}
    for name in sorted(weights):
        prefix, _, leaf = name.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise NotExact(f"{name} is not a LoRA matrix (lora_a or lora_b)")
        block = _BLOCK.fullmatch(prefix)
        if block is None:
            raise NotExact(f"{prefix} is not a layer of the model's blocks (model.layers.N.*)")
        if leaf == "lora_b":
            continue
        if prefix + ".lora_b" not in weights:
            raise NotExact(f"{prefix} has lora_a without lora_b")
        a, b = weights[name], weights[prefix + ".lora_b"]
        base_shape = shapes.get(prefix + ".weight")
        if base_shape is None or len(base_shape) != 2:
            raise NotExact(f"the base model has no linear weight {prefix}.weight (mlx-lm names it otherwise)")
        out_features, in_features = base_shape
        if a[1] != [in_features, rank] or b[1] != [rank, out_features]:
            raise NotExact(
                f"{prefix}: lora_a {a[1]} and lora_b {b[1]} do not fit its weight {base_shape} at rank {rank}"
            )
        out[f"{PEFT_PREFIX}{prefix}.lora_A.weight"] = transposed(a)
        out[f"{PEFT_PREFIX}{prefix}.lora_B.weight"] = transposed(b)
        adapted.setdefault(int(block.group(1)), set()).add(block.group(2))
    if not out:
        raise NotExact("it adapts no layer")
    modules = next(iter(adapted.values()))
    if any(m != modules for m in adapted.values()):
        raise NotExact("its blocks adapt different modules, which one peft target list cannot say")

    lora_alpha: float | int = scale * rank
    if float(lora_alpha).is_integer():
        lora_alpha = int(lora_alpha)
    peft_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": hub_repo_of(base),
        "r": rank,
        "lora_alpha": lora_alpha,
        "lora_dropout": float(params.get("dropout") or 0.0),
        "target_modules": _targets(modules, shapes, set(adapted)),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "init_lora_weights": True,
    }
    blocks = {int(m.group(1)) for name in shapes if (m := _BLOCK.fullmatch(name))}
    if set(adapted) != blocks:  # mlx-lm's num_layers: the last N blocks only
        peft_config.update(layers_to_transform=sorted(adapted), layers_pattern="layers")
    dst_dir.mkdir(parents=True, exist_ok=True)
    write_safetensors(dst_dir / PEFT_WEIGHTS, out, {"format": "pt"})
    (dst_dir / ADAPTER_CONFIG).write_text(json.dumps(peft_config, indent=2) + "\n")


def _targets(modules: set[str], shapes: dict[str, list[int]], blocks: set[int]) -> list[str]:
    """peft's target_modules: each adapted module by its leaf name (q_proj), or by its path in the
    block (self_attn.q_proj) where a module of the same leaf name is left alone."""
    block = min(blocks)
    present = set()
    for name in shapes:
        match = _BLOCK.fullmatch(name)
        if match and int(match.group(1)) == block and name.endswith(".weight"):
            present.add(match.group(2).removesuffix(".weight"))
    targets = []
    for module in sorted(modules):
        leaf = module.rsplit(".", 1)[-1]
        namesakes = {p for p in present if p == leaf or p.endswith("." + leaf)}
        targets.append(leaf if namesakes <= modules else module)
    return sorted(targets)


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
