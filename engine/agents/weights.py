"""Model weights over the plane: each version one archive in a JetStream object store bucket.

A publisher (the plane's trainer, or the plane serving a run) packs the files that make the weights
(a peft adapter, or a full model's config and safetensors) into one uncompressed tar archive, puts
it in the `CARL_MODELS` bucket under the version's name, and names it in the `ModelUpdateEvent`
with the digest the object store computed (`SHA-256=<base64url>`). A worker fetches the object by
that name, checks its digest against the event's (the object may have been replaced since), unpacks
it into a folder of its own (`$CARL_HOME/agents/received/<worker>/`: workers of one home never unpack over
the copy another is loading) and swaps it in. No filesystem is shared, so a worker on another machine
serves what the trainer trained.

The bucket keeps the newest `KEPT_VERSIONS` objects (a worker only ever loads the newest; one that
joins late finds it there). An archive holds plain files with plain names only: anything else in it
(a link, a directory, a path) is refused before a byte is written.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import nats.js.errors
from nats.js.api import ObjectStoreConfig, StorageType

from engine.errors import CarlError
from engine.names import slug

from .bus import publish_retrying
from .events import ModelUpdateEvent, WeightsKind

MODELS_BUCKET = "CARL_MODELS"
KEPT_VERSIONS = 4  # objects kept in the bucket, and archives kept unpacked by each worker
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
# A full model: its config and weights (sharded or not); its tokenizer is the base's, which the worker has.
FULL_SUFFIXES = (".safetensors", ".safetensors.index.json")
FULL_FILES = ("config.json", "generation_config.json")
DIGEST_FILE = ".digest"  # written last into an unpacked archive: a directory without it is incomplete


class WeightsError(CarlError):
    """Weights that cannot be packed, put, fetched or unpacked: one line."""


def weights_kind(directory: Path) -> WeightsKind | None:
    """'adapter' (peft's, or mlx-lm's), 'full' (a config and safetensors weights), or None."""
    if (directory / "adapter_config.json").is_file():
        return "adapter"
    if (directory / "config.json").is_file() and any(directory.glob("*.safetensors")):
        return "full"
    return None


def weights_files(directory: Path, kind: WeightsKind) -> list[Path]:
    """The files that make the weights in `directory`: no optimizer, trainer state or tokenizer."""
    if kind == "adapter":
        names = [name for name in ADAPTER_FILES if (directory / name).is_file()]
    else:
        names = sorted(
            p.name
            for p in directory.iterdir()
            if p.is_file()
            and (p.name in FULL_FILES or p.name.endswith(FULL_SUFFIXES))
            and not p.name.startswith(("optimizer", "scheduler"))
        )
    files = [directory / name for name in names]
    if kind == "adapter" and not any(f.name.startswith("adapter_model") for f in files):
        raise WeightsError(f"{directory}: an adapter_config.json without adapter weights")
    return files


def pack(directory: Path, kind: WeightsKind, archive: Path) -> None:
    """Write the weights of `directory` into the tar `archive`, each file under its bare name."""
    files = weights_files(directory, kind)
    if not files:
        raise WeightsError(f"{directory}: no weights to send")
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for file in files:
            tar.add(file, arcname=file.name, recursive=False)


def unpack(archive: Path, target: Path, digest: str) -> None:
    """Unpack `archive` into the new directory `target`, refusing any member that is not a plain file
    with a plain name; `target` appears whole (with its digest file) or not at all. A complete `target`
    of the same digest is left as it is: whoever is loading it keeps its files."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with tarfile.open(archive, "r:") as tar:
            members = tar.getmembers()
            for member in members:
                if not member.isreg() or not SAFE_NAME.match(member.name):
                    raise WeightsError(f"the archive holds {member.name!r}, not a plain file: refused")
            for member in members:
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                with source, (staging / member.name).open("xb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
        (staging / DIGEST_FILE).write_text(digest + "\n")
        if _complete(target, digest):
            return
        if target.exists():  # an incomplete one: moved aside in one rename, then removed
            os.replace(target, staging.with_name(staging.name + ".old"))
            shutil.rmtree(staging.with_name(staging.name + ".old"), ignore_errors=True)
        os.replace(staging, target)
    except tarfile.TarError as exc:
        raise WeightsError(f"not a tar archive of weights ({exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def file_digest(path: Path) -> str:
    """`SHA-256=<base64url>` of a file, as nats' object store writes an object's digest."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "SHA-256=" + base64.urlsafe_b64encode(h.digest()).decode()


def received_dir(home: Path, worker_id: str) -> Path:
    """Where one worker keeps the weights it fetched, one directory per archive digest. Each worker has
    its own: two workers of one home fetching the same update each unpack, load and forget their own copy
    (with one folder, one worker's unpacking replaced the directory the other was loading)."""
    path = home / "agents" / "received" / worker_dir_name(worker_id)
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    return path


def worker_dir_name(worker_id: str) -> str:
    """A directory name for a worker id (an id from outside: never a path): its safe characters and a
    short hash of the whole, so two ids that differ only in unsafe characters keep two folders."""
    tag = hashlib.sha256(worker_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{slug(worker_id, 40)}-{tag}"


def digest_dir_name(digest: str) -> str:
    """A directory name from a digest (an id, never a name from outside): its base64url characters."""
    return digest.removeprefix("SHA-256=").rstrip("=")


# -- the bucket ------------------------------------------------------------------------------------


async def models_bucket(js: Any, replicas: int = 1, *, create: bool = True) -> Any:
    """The plane's object store bucket of weights (made on first use, file storage)."""
    try:
        return await js.object_store(MODELS_BUCKET)
    except nats.js.errors.BucketNotFoundError:
        if not create:
            raise
    config = ObjectStoreConfig(
        description="carl agents plane: model weights, one tar archive per version",
        storage=StorageType.FILE,
        replicas=replicas,
    )
    return await js.create_object_store(MODELS_BUCKET, config=config)


async def put_weights(
    js: Any, update: ModelUpdateEvent, directory: Path, *, replicas: int = 1
) -> ModelUpdateEvent:
    """Put the weights of `directory` in the bucket as `update.model_version`; the update naming them."""
    bucket = await models_bucket(js, replicas)
    with tempfile.TemporaryDirectory(prefix="carl-weights-") as tmp:
        archive = Path(tmp) / "weights.tar"
        await asyncio.to_thread(pack, directory, update.weights, archive)
        with archive.open("rb") as data:
            info = await bucket.put(update.model_version, data)
    await _forget_old(bucket)
    return update.model_copy(
        update={
            "bucket": MODELS_BUCKET,
            "object_name": update.model_version,
            "digest": info.digest,
            "size": info.size,
        }
    )


async def _forget_old(bucket: Any) -> None:
    """Delete all but the newest KEPT_VERSIONS objects (the bucket would otherwise grow with every step)."""
    try:
        objects = await bucket.list(ignore_deletes=True)
    except nats.js.errors.NotFoundError:  # an empty bucket
        return
    live = sorted((o for o in objects if not o.deleted), key=lambda o: o.mtime or "")
    for old in live[:-KEPT_VERSIONS]:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await bucket.delete(old.name)


async def publish_update(
    js: Any, update: ModelUpdateEvent, directory: Path | None = None, *, replicas: int = 1
) -> ModelUpdateEvent:
    """Put the weights (from `directory`, else the update's checkpoint_path) in the bucket, then publish
    the update that names them; returns it."""
    update = await put_weights(js, update, Path(directory or update.checkpoint_path), replicas=replicas)
    await publish_retrying(js, update)
    return update


# -- fetching ------------------------------------------------------------------------------------


async def fetch_weights(js: Any, update: ModelUpdateEvent, home: Path, worker_id: str) -> Path:
    """The update's weights, unpacked on this machine in the worker's own folder: fetched from the bucket
    by name, their digest checked against the update's (already there under that digest: not fetched
    again)."""
    if not (update.bucket and update.object_name and update.digest):
        raise WeightsError(f"update {update.model_version} names no object to fetch")
    root = received_dir(home, worker_id)
    target = root / digest_dir_name(update.digest)
    if _complete(target, update.digest):
        return target
    try:
        bucket = await js.object_store(update.bucket)
        info = await bucket.get_info(update.object_name)
    except nats.js.errors.BucketNotFoundError:
        raise WeightsError(f"no object store bucket {update.bucket!r} on the plane") from None
    except nats.js.errors.ObjectNotFoundError:
        raise WeightsError(f"{update.bucket}/{update.object_name}: no such object (deleted?)") from None
    if info.digest != update.digest:
        raise WeightsError(
            f"{update.bucket}/{update.object_name} holds other weights now ({info.digest}, "
            f"the update names {update.digest})"
        )
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        archive = Path(tmp) / "weights.tar"
        try:
            with archive.open("wb") as out:
                await bucket.get(update.object_name, writeinto=out)
        except nats.js.errors.DigestMismatchError:
            raise WeightsError(
                f"{update.bucket}/{update.object_name}: its chunks do not match its digest"
            ) from None
        got = await asyncio.to_thread(file_digest, archive)
        if got != update.digest:  # checked here too: what is unpacked is exactly what was announced
            raise WeightsError(
                f"{update.bucket}/{update.object_name}: fetched {got}, the update names {update.digest}"
            )
        await asyncio.to_thread(unpack, archive, target, update.digest)
    _forget_received(root, keep=target)
    return target


def _complete(target: Path, digest: str) -> bool:
    try:
        return (target / DIGEST_FILE).read_text().strip() == digest
    except OSError:
        return False


def _forget_received(root: Path, keep: Path) -> None:
    """Keep the newest KEPT_VERSIONS unpacked archives (the one in use among them)."""
    found = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
    )
    for old in found[:-KEPT_VERSIONS]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
