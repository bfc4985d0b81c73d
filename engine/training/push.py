"""`carl push RUN REPO`: a run's trained model (or LoRA adapter) and a model card, to the Hugging Face Hub.

One commit holds the model files of the run's `final/` (else its newest checkpoint), never the
optimizer or trainer state a checkpoint also keeps, and README.md: a card written from the store
(method, rewards, the last metrics, the latest eval) with a snippet that loads the model.

An MLX run's LoRA adapter goes up in mlx-lm's format, plus its exact peft copy in `peft/` where
one exists (engine.training.mlx_artifacts; the card says why when none does). An MLX run's full
weights are in the Hugging Face layout already and go up as they are.

huggingface_hub is imported inside the functions that talk to the Hub (it is slow to import), and
every failure is one line: a refused token, a missing repo or an unreachable Hub never shows a
traceback. The token is passed to huggingface_hub only: never printed, logged or stored.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import CarlError
from engine.text import visible

from .artifacts import base_model_of, carl_run, is_adapter, model_dir, model_files, process_alive
from .backend import BadInput, one_line
from .mlx_artifacts import (
    MLX_ADAPTER_FILE,
    NotExact,
    convert_to_peft,
    hub_repo_of,
    is_mlx_adapter,
    mlx_adapter_config,
)

if TYPE_CHECKING:
    from engine.store import StoreReader

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
CARD = "README.md"
PEFT_DIR = "peft"  # where an MLX adapter's peft copy goes in the repo
TINY_MODEL = "carl-tiny"
# What the card reports of the run's curves: (store key, label).
CARD_METRICS = (
    ("reward", "total reward"),
    ("rewards/task/mean", "task reward"),
    ("phi/mean", "mean Phi (coherence)"),
    ("phi/entropy", "mean entropy"),
)
GATED_REWARDS = ("coherence", "commitment")
BACKENDS = {"torch": "torch (TRL)", "mlx": "MLX (mlx-lm)"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
# The Hub's rule for one half of `namespace/name`: letters, digits, - _ . ; not starting or ending in - or .
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{_PART}/{_PART}")


# -- the command line ------------------------------------------------------------------------


def add_push_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run name or id")
    parser.add_argument("repo", help="Hub repo to push to, as namespace/name (created when missing)")
    parser.add_argument(
        "--token", default=None, help="Hugging Face token (default: $HF_TOKEN, else your `hf auth login`)"
    )
    parser.add_argument("--endpoint", default=None, help="Hub URL (default: $HF_ENDPOINT or huggingface.co)")
    parser.add_argument("--private", action="store_true", help="create the repo private (if it is new)")
    parser.add_argument("--revision", default=None, help="branch to commit to (created when missing)")
    parser.add_argument("--message", "-m", default=None, help="commit message")
    parser.add_argument("--home", type=Path, default=None, help="carl home (default: $CARL_HOME or ~/.carl)")


def push_from_args(args: argparse.Namespace) -> int:
    """Run `carl push` with parsed arguments: prints the commit URL; returns the exit code."""
    from engine import paths

    home = Path(args.home).expanduser() if args.home else paths.carl_home()
    try:
        url = push_run(
            home,
            args.run,
            args.repo,
            token=args.token,
            endpoint=args.endpoint,
            private=args.private,
            revision=args.revision,
            message=args.message,
        )
    except BadInput as exc:
        say_error(str(exc))
        return EXIT_BAD_INPUT
    except CarlError as exc:
        say_error(str(exc))
        return EXIT_FAILED
    print(url)
    return EXIT_OK


def say_error(message: str) -> None:
    print(f"carl push: {visible(message)}", file=sys.stderr, flush=True)


# -- the push --------------------------------------------------------------------------------


def push_run(
    home: Path,
    ref: str,
    repo: str,
    *,
    token: str | None,
    endpoint: str | None,
    private: bool,
    revision: str | None,
    message: str | None,
) -> str:
    """Upload run `ref`'s model and its card to `repo` in one commit; returns the commit's URL."""
    from engine import paths
    from engine.store import StoreReader

    check_repo_id(repo)
    endpoint = _endpoint(endpoint)
    if importlib.util.find_spec("huggingface_hub") is None:
        raise BadInput("push needs huggingface_hub: pip install 'carl-tui[train]'")
    run = find_pushable_run(home, ref)
    path = model_dir(run)
    # (path in the repo, file); peft writes its own README.md: ours wins
    files = [(f.name, f) for f in model_files(path) if f.name != CARD]
    with tempfile.TemporaryDirectory(prefix="carl-push-") as scratch:
        peft_problem, note = None, ""
        if is_mlx_adapter(path):
            peft_problem = _peft_copy(path, Path(scratch) / PEFT_DIR)
            if peft_problem is None:
                files += [(f"{PEFT_DIR}/{f.name}", f) for f in sorted((Path(scratch) / PEFT_DIR).iterdir())]
            note = f" (with its peft copy in {PEFT_DIR}/)" if peft_problem is None else " (no peft copy)"
        reader = StoreReader(paths.db_path(home))
        try:
            card = model_card(run, reader, path, repo=repo, peft_problem=peft_problem)
        finally:
            reader.close()
        token = resolve_token(token)
        size = sum(f.stat().st_size for _, f in files) / 1e6
        print(f"carl push: {len(files)} files ({size:.1f} MB) from {path} to {repo}{note}", file=sys.stderr)
        message = message or f"carl: run {run['name']} ({path.name}, step {run.get('last_step') or 0})"
        return _commit(
            repo,
            files,
            card,
            token=token,
            endpoint=endpoint,
            private=private,
            revision=revision,
            message=message,
        )


def _peft_copy(path: Path, out: Path) -> str | None:
    """Write the MLX adapter's peft copy into `out`; None when written, else why there is none."""
    try:
        convert_to_peft(path, out)
    except NotExact as exc:
        return str(exc)
    return None


def check_repo_id(repo: str) -> None:
    """A repo id the Hub accepts, with its namespace: checked before anything else happens."""
    if "/" not in repo:
        raise BadInput(f"repo {repo!r}: give it as namespace/name (e.g. your-user/{repo})")
    if not REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo or repo.endswith(".git"):
        raise BadInput(
            f"repo {repo!r} is not a Hub repo id: namespace/name, each up to 96 letters, digits, '-', '_' or"
            " '.', not starting or ending with '-' or '.', without '--' or '..'"
        )


def _endpoint(endpoint: str | None) -> str | None:
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise BadInput(f"endpoint {endpoint!r} (--endpoint or $HF_ENDPOINT): expected an http(s):// URL")
    return endpoint.rstrip("/") if endpoint else None


def find_pushable_run(home: Path, ref: str) -> dict[str, Any]:
    """A finished (or stopped, or failed) carl run, by name or id."""
    from engine import paths
    from engine.store import Store, StoreError

    try:
        store = Store(paths.db_path(home), create=False)
    except StoreError as exc:  # a wrong --home: the user's input, like a wrong run name
        raise BadInput(str(exc)) from None
    with store:
        run = carl_run(store, ref, for_what="no model to push")
    if run["status"] in ("running", "paused") and not _dead(run.get("pid")):
        pid = f" (pid {run['pid']})" if run.get("pid") else ""
        raise BadInput(
            f"run {run['name']!r} is still {run['status']}{pid}: push it once it has finished or stopped"
        )
    return run


def _dead(pid: int | None) -> bool:
    """True only when the run's process is known to be gone (a stale 'running' status)."""
    return bool(pid) and not process_alive(pid)


def resolve_token(token: str | None) -> str:
    """--token, else $HF_TOKEN, else huggingface_hub's stored login; none at all is one line."""
    if token:
        return token
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    from huggingface_hub import get_token
    from huggingface_hub.errors import OIDCError

    try:
        found = get_token()
    except (OSError, OIDCError) as exc:
        raise BadInput(f"cannot read the stored Hugging Face login: {one_line(exc)}") from None
    if not found:
        raise BadInput("no Hugging Face token: pass --token, set HF_TOKEN, or log in with `hf auth login`")
    return found


def _commit(
    repo: str,
    files: list[tuple[str, Path]],
    card: str,
    *,
    token: str,
    endpoint: str | None,
    private: bool,
    revision: str | None,
    message: str,
) -> str:
    """Create the repo (and branch) when missing, then one commit of the files and the card."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=endpoint, token=token, library_name="carl-tui")
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(f)) for name, f in files]
    operations.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=card.encode()))
    with hub_errors(repo, revision, api.endpoint, token):
        # private=None, not False: a public default must not override an org's private-by-default.
        api.create_repo(repo, private=True if private else None, exist_ok=True)
        if revision and revision != "main":  # like `hf upload --revision`: a new branch is made
            api.create_branch(repo, branch=revision, exist_ok=True)
        info = api.create_commit(repo, operations=operations, commit_message=message, revision=revision)
    return str(info.commit_url)


# -- the Hub's errors, as one line ------------------------------------------------------------


@contextlib.contextmanager
def hub_errors(repo: str, revision: str | None, endpoint: str, token: str) -> Iterator[None]:
    """huggingface_hub's exceptions as a one-line BadInput (exit 2) or CarlError (exit 1).
    Anything unexpected is a bug and keeps its traceback."""
    try:
        yield
    except Exception as exc:
        error = translate_hub_error(exc, repo, revision, endpoint)
        if error is None:
            raise
        text = str(error)
        if len(token) >= 8:  # a server could echo the token: it must never reach a terminal
            text = text.replace(token, "***")
        raise type(error)(text) from None


def translate_hub_error(
    exc: BaseException, repo: str, revision: str | None, endpoint: str
) -> CarlError | None:
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if _cause(exc, OfflineModeIsEnabled) is not None:
        return BadInput("HF_HUB_OFFLINE is set: unset it to push")
    http = _cause(exc, HfHubHTTPError)
    if isinstance(http, HfHubHTTPError):
        return _http_error(http, repo, revision)
    transport = _cause(exc, _transport_errors())
    if transport is not None and "xet" in str(transport).lower():
        # hf_xet is installed, so huggingface_hub uploads large files through xet storage only.
        hint = "if this hub does not serve xet storage, set HF_HUB_DISABLE_XET=1 to upload through git LFS"
        return CarlError(f"the xet upload to {endpoint} failed: {one_line(transport)} ({hint})")
    if transport is not None:
        return CarlError(f"cannot reach the hub at {endpoint}: {one_line(transport)}")
    if isinstance(exc, ValueError):  # e.g. the Hub found the card's metadata invalid
        return BadInput(f"the hub rejected the push: {one_line(exc)}")
    return None


def _http_error(exc: Any, repo: str, revision: str | None) -> CarlError:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    status = int(exc.response.status_code)
    try:
        label = f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        label = str(status)
    detail = f": {' '.join(str(exc.server_message).split())[:200]}" if exc.server_message else ""
    namespace = repo.split("/")[0]
    if isinstance(exc, RevisionNotFoundError):
        return BadInput(f"{repo} has no branch {revision or 'main'!r} ({label})")
    if isinstance(exc, RepositoryNotFoundError):
        return BadInput(f"{repo}: the hub has no such repo, or the token cannot see it ({label})")
    if status == 401:
        return BadInput(f"the hub refused the token ({label}): check --token, HF_TOKEN or `hf auth login`")
    if status == 403:
        return BadInput(
            f"the token may not write to {repo} ({label}): it needs write access to {namespace!r}"
        )
    if status == 404:
        return BadInput(f"{repo}: not found on the hub ({label}){detail}")
    if status == 409:
        return BadInput(f"{repo}: the hub reports a conflict ({label}){detail}")
    if 400 <= status < 500:
        return BadInput(f"the hub rejected the push to {repo} ({label}){detail}")
    return CarlError(f"the hub failed ({label}){detail}: try again later")


def _cause(
    exc: BaseException | None, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """`exc` or the first exception in its cause chain of these kinds (LFS uploads wrap theirs)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, kinds):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection and timeout errors: huggingface_hub 2.x speaks httpx2, 1.x httpx."""
    import importlib

    kinds: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError, AttributeError):
            kinds.append(importlib.import_module(name).TransportError)
    return tuple(kinds)


# -- the model card --------------------------------------------------------------------------


def model_card(
    run: dict[str, Any],
    reader: StoreReader,
    model_path: Path,
    *,
    repo: str = "REPO",
    peft_problem: str | None = None,
) -> str:
    """README.md for the pushed model: YAML metadata the Hub indexes, then what the run did.

    For an MLX adapter the card says how to load it with mlx-lm and, unless `peft_problem` says why
    there is none, with peft from its copy in peft/."""
    config = _config(run)
    adapter = is_adapter(model_path)
    mlx = is_mlx_adapter(model_path)
    base = base_model_of(model_path) if adapter else (run.get("model") or config.get("model"))
    base = hub_repo_of(base) if base else base
    if mlx:
        load = _how_to_load_mlx_adapter(repo, base, peft_problem)
    else:
        load = _how_to_load(repo, adapter, base, model_path, mlx_run=run.get("backend") == "mlx")
    sections = [
        _front_matter(config, adapter, base, mlx=mlx, mlx_run=run.get("backend") == "mlx"),
        _intro(run, adapter, mlx=mlx),
        _training(run, config, model_path, base),
        _rewards(config),
        _metrics(reader, int(run["id"])),
        _evaluation(reader, int(run["id"]), model_path),
        load,
    ]
    return "\n".join(s for s in sections if s)


def _config(run: dict[str, Any]) -> dict[str, Any]:
    try:
        data = json.loads(run.get("config") or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def hub_id(value: str | None) -> str | None:
    """`value` when it names a Hub model (namespace/name), not a local directory or carl-tiny."""
    if not value or not REPO_ID.fullmatch(value) or Path(value).expanduser().exists():
        return None
    return value


def _front_matter(
    config: dict[str, Any], adapter: bool, base: str | None, *, mlx: bool = False, mlx_run: bool = False
) -> str:
    tags = [
        "carl",
        config.get("method") or "grpo",
        "coherence",
        *(["lora"] if adapter else []),
        *(["mlx"] if mlx_run or mlx else []),
    ]
    library = "mlx" if mlx else "peft" if adapter else "transformers"
    lines = ["---", f"library_name: {library}"]
    if hub_id(base):
        lines.append(f"base_model: {_yaml(str(base))}")
    lines += ["pipeline_tag: text-generation", "tags:", *(f"- {_yaml(t)}" for t in tags), "---", ""]
    return "\n".join(lines)


def _yaml(value: str) -> str:
    """A YAML scalar: plain when safe, else double-quoted (a JSON string is valid YAML)."""
    return value if re.fullmatch(r"[A-Za-z0-9][\w./-]*", value) else json.dumps(value)


def _intro(run: dict[str, Any], adapter: bool, *, mlx: bool = False) -> str:
    what = "A LoRA adapter for mlx-lm" if mlx else "A LoRA adapter" if adapter else "A causal language model"
    return (
        f"# {run['name']}\n\n{what} trained with carl (coherence-aware reinforcement learning) in run"
        f" `{run['name']}`. carl rewards the task and, once the task reward is learned, the coherence of"
        " the model's own token distributions (Phi).\n"
    )


def _training(run: dict[str, Any], config: dict[str, Any], model_path: Path, base: str | None) -> str:
    method = str(config.get("method") or "grpo")
    label = method.upper()
    warmup = config.get("sft_warmup_steps") or 0
    if method == "grpo" and warmup:
        label += f", after {warmup} SFT warm-up steps"
    steps = f"{run.get('last_step') or 0}" + (f" of {run['max_steps']}" if run.get("max_steps") else "")
    rows = [
        ("run", f"`{run['name']}` (id {run['id']}, {run.get('status')})"),
        ("method", label),
        ("steps", steps),
        ("base model", _base_label(base)),
        ("weights", f"`{model_path.name}/`"),
    ]
    if run.get("backend") in BACKENDS:
        rows.insert(2, ("backend", BACKENDS[run["backend"]]))
    if config.get("learning_rate") is not None:
        rows.append(("learning rate", _number(config["learning_rate"])))
    lora = _adapter_settings(model_path)
    if lora:
        rows.append(("LoRA", lora))
    return "## Training\n\n" + _table(("", ""), rows)


def _base_label(base: str | None) -> str:
    if hub_id(base):
        return f"[{base}](https://huggingface.co/{base})"
    if not base or base == TINY_MODEL or Path(base).name == TINY_MODEL:
        return "carl-tiny (carl's built-in tiny model)"
    return f"a local model (`{Path(base).name}`)"  # its full path is the trainer's business


def _adapter_settings(model_path: Path) -> str | None:
    if is_mlx_adapter(model_path):
        data = mlx_adapter_config(model_path)
        lora = data.get("lora_parameters") or {}
        rank, scale = lora.get("rank"), lora.get("scale")
        alpha = _number(scale * rank) if isinstance(scale, (int, float)) and isinstance(rank, int) else "?"
        targets = lora.get("keys") or "every linear layer"
        return (
            f"r={rank}, alpha={alpha} (mlx-lm scale {_number(scale)}), targets {targets}, in the last"
            f" {data.get('num_layers')} blocks"
        )
    try:
        data = json.loads((model_path / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return None
    return f"r={data.get('r')}, alpha={data.get('lora_alpha')}, targets {data.get('target_modules')}"


def _rewards(config: dict[str, Any]) -> str:
    rewards = [r for r in config.get("rewards") or [] if isinstance(r, dict) and r.get("name")]
    if not rewards:
        return ""
    rows = [(f"`{r['name']}`", _number(r.get("weight", 1.0))) for r in rewards]
    text = "## Rewards\n\n" + _table(("reward", "weight"), rows)
    gated = [r["name"] for r in rewards if r["name"] in GATED_REWARDS]
    if gated:
        text += (
            f"\nThe coherence rewards ({', '.join(gated)}) are gated by carl's cascade: they count"
            " once the task reward has been learned.\n"
        )
    if config.get("aggregation"):
        text += f"\nRewards are combined with `{config['aggregation']}`.\n"
    return text


def _metrics(reader: StoreReader, run_id: int) -> str:
    rows = []
    for key, label in CARD_METRICS:
        series = reader.series(run_id, key)
        if series.latest is not None:
            rows.append((f"`{key}`", label, _number(series.latest), str(series.latest_step)))
    if not rows:
        return "## Last metrics\n\nThe run recorded none of reward, task reward, Phi or entropy.\n"
    return "## Last metrics\n\n" + _table(("metric", "", "value", "step"), rows)


def _evaluation(reader: StoreReader, run_id: int, model_path: Path) -> str:
    result = reader.latest_eval(run_id)
    if result is None:
        return "## Evaluation\n\nNot evaluated on held-out prompts (`carl eval RUN` does).\n"
    metrics = result.get("metrics") or {}
    verdict = "passed" if result.get("passed") else "failed"
    evaluated = Path(str(metrics.get("model_dir") or "")).name
    where = f" (weights of `{evaluated}/`)" if evaluated else ""
    if evaluated and evaluated != model_path.name:
        where += f", not the `{model_path.name}/` pushed here"
    rows = [
        (f"`{k}`", _number(v))
        for k, v in metrics.items()
        if k != "model_dir" and isinstance(v, (int, float, str))
    ]
    text = f"## Evaluation\n\nThe latest held-out evaluation **{verdict}**{where}.\n\n"
    text += _table(("metric", "value"), rows) if rows else ""
    reasons = [str(r) for r in result.get("reasons") or []]
    return text + ("\n" + "".join(f"- {_cell(r)}\n" for r in reasons) if reasons else "")


def _how_to_load(
    repo: str, adapter: bool, base: str | None, model_path: Path, *, mlx_run: bool = False
) -> str:
    has_tokenizer = any((model_path / name).is_file() for name in TOKENIZER_FILES)
    tokenizer_from = repo if has_tokenizer or not hub_id(base) else str(base)
    if adapter:
        code = (
            "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n"
            f'model = AutoPeftModelForCausalLM.from_pretrained("{repo}")\n'
        )
    else:
        code = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model = AutoModelForCausalLM.from_pretrained("{repo}")\n'
        )
    code += f'tokenizer = AutoTokenizer.from_pretrained("{tokenizer_from}")\n'
    text = f"## How to load\n\n```python\n{code}```\n"
    if adapter and not hub_id(base):
        text += (
            "\nThe adapter's base model is not on the Hub: load it yourself and apply the adapter with"
            f' `PeftModel.from_pretrained(base_model, "{repo}")`.\n'
        )
    if mlx_run and not adapter:
        text += (
            "\nmlx-lm, which trained it, loads it too:\n\n```python\nfrom mlx_lm import load\n\n"
            f'model, tokenizer = load("{repo}")\n```\n'
        )
    return text


def _how_to_load_mlx_adapter(repo: str, base: str | None, peft_problem: str | None) -> str:
    """mlx-lm's way (the adapter over its base), then peft's from the copy in peft/, or why there is none."""
    on_hub = hub_id(base)
    name = str(base) if on_hub else f"path/to/{Path(base or 'base-model').name}"
    files = f'["{MLX_ADAPTER_FILE}", "adapter_config.json"]'
    text = (
        "## How to load\n\nWith mlx-lm, which trained it:\n\n```python\n"
        "from huggingface_hub import snapshot_download\nfrom mlx_lm import load\n\n"
        f'adapter = snapshot_download("{repo}", allow_patterns={files})\n'
        f'model, tokenizer = load("{name}", adapter_path=adapter)\n```\n'
    )
    if peft_problem is None:
        text += (
            f"\nWith transformers and peft, from the exact peft copy in `{PEFT_DIR}/`:\n\n"
            "```python\nfrom peft import PeftModel\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'base = AutoModelForCausalLM.from_pretrained("{name}")\n'
            f'model = PeftModel.from_pretrained(base, "{repo}", subfolder="{PEFT_DIR}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{repo}")\n```\n'
        )
    else:
        text += (
            f"\nThis repo holds the adapter in mlx-lm's format only: it has no exact peft equivalent, as"
            f" {_cell(peft_problem)}.\n"
        )
    if not on_hub:
        text += f"\nThe adapter's base model is not on the Hub: put its directory in place of `{name}`.\n"
    return text


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _cell(str(value))
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
