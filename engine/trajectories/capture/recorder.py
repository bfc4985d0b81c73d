"""The Claude Code hook recorder: one payload on stdin becomes one spool file. Nothing else.

Run by every hook event, so it must never disturb the agent. `carl hooks install` runs it as
`<python> -S -E -c 'import sys; sys.path[0] = "<this folder>"; import recorder; recorder.main()' [--home DIR]`
(cached bytecode; `<python> -S .../recorder.py` works too but compiles this file on every call, ~1.5 ms),
so no module in this folder may shadow the standard library (json, os, pwd).

It always exits 0, never writes to stdout (on UserPromptSubmit stdout would be added to Claude's
context), and costs little more than the interpreter's own start. Hence: standard library only,
and only the modules an interpreter started with `-S` already holds (`posix`, `sys`, `time`) plus
the C JSON scanner `_json`: `os` and `json` would add ~1 ms and ~6 ms (json pulls in re, enum,
functools). The engine turns spool files into trajectories later (hooks.py), so the recorder
works, and loses nothing, while the engine is down.

Spool: `<home>/spool/hooks/<time_ns:020d>-<pid>-<n>-<rand>.json` = `{"received_at": <unix s>,
"payload": <the payload bytes as received>}`, written to `.tmp-<name>` then renamed, so a reader
never sees a partial file. Names sort in arrival order. Not fsynced: a crash of this process or
of the engine loses nothing, a power cut may (the reader moves an empty file to spool/bad/).
Input that is not a JSON object is logged to `<home>/logs/hook-errors.log` and dropped.
"""

import sys  # no `from __future__ import annotations`: importing __future__ costs time too
import time

if sys.platform == "win32":  # pragma: no cover - Windows has no `posix`: use os.
    import os as _os
else:  # `posix` is built in and already loaded; `os` is a ~1 ms import.
    import posix as _os

SOFT_CAP = 8 * 1024 * 1024  # larger payloads are stored with their big strings cut
# Larger still: logged and dropped (Claude Code truncates tool output long before this).
HARD_CAP = 64 * 1024 * 1024
CUT_CHARS = 20_000
LOG_BYTES = 200
_WS = " \t\n\r"  # JSON whitespace
_counter = 0


class _Context:
    """What `_json.make_scanner` reads from a decoder: json.loads' defaults, without importing json."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__
    memo: dict[str, str] = {}


def _scanner():
    try:
        import _json

        # typeshed types the context as a make_scanner; the C scanner reads only _Context's attributes.
        return _json.make_scanner(_Context())  # type: ignore[arg-type]
    except Exception:  # no C accelerator: the slow, sure way
        import json

        decoder = json.JSONDecoder()
        return lambda text, idx: decoder.raw_decode(text, idx)


def parse_object(raw: bytes) -> tuple[dict | None, str]:
    """(the JSON object, "") or (None, why not): json.loads' rules, for a UTF-8 object."""
    if raw[:3] == b"\xef\xbb\xbf":
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _parse_slow(raw)
    start = len(text) - len(text.lstrip(_WS))
    if start == len(text):
        return None, "empty payload"
    try:
        value, end = _scanner()(text, start)
    except StopIteration:
        return None, "not JSON"
    except Exception:  # a decode error: the C scanner reports it via json.decoder, which is not loaded
        return _parse_slow(text)
    if text[end:].strip(_WS):
        return None, "not JSON (extra data)"
    if not isinstance(value, dict):
        return None, f"not a JSON object ({type(value).__name__})"
    return value, ""


def _parse_slow(data: bytes | str) -> tuple[dict | None, str]:
    """json.loads itself, for the rare cases: its error message, UTF-16/32 input (it detects those)."""
    import json

    try:
        value = json.loads(data)
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    except RecursionError:  # nested deeper than the parser goes: no hook payload is
        return None, "not JSON (nested too deeply)"
    return (value, "") if isinstance(value, dict) else (None, "not a JSON object")


def _getenv(name: str) -> str | None:
    # Where os is loaded (imported by `carl hook`, tests; always on Windows) os.environ is the live
    # environment; posix.environ, a start-up snapshot with bytes keys, serves the bare recorder.
    os_module = sys.modules.get("os")
    if os_module is not None:
        return os_module.environ.get(name) or None
    value = _os.environ.get(name.encode())
    return value.decode(sys.getfilesystemencoding(), "surrogateescape") if value else None


def _user_home() -> str:
    home = _getenv("HOME") or _getenv("USERPROFILE")
    if home:
        return home
    import pwd  # no HOME: the password database, as Path.home() does

    return pwd.getpwuid(_os.getuid()).pw_dir


def carl_home(argv: list[str] | None = None) -> str:
    """`--home DIR`, else $CARL_HOME, else ~/.carl (engine.paths.carl_home, without importing it)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--home" in argv[:-1]:
        home = argv[argv.index("--home") + 1]
    else:
        home = _getenv("CARL_HOME") or _user_home() + "/.carl"
    if home == "~" or home.startswith(("~/", "~\\")):
        home = _user_home() + home[1:]
    return home


def record(stdin_bytes: bytes, home: object) -> None:
    """Store one hook payload in the spool of carl home `home`, or log why it was dropped."""
    home = str(home)
    received_ns = time.time_ns()
    if len(stdin_bytes) > HARD_CAP:
        _log(home, "payload too large, dropped", stdin_bytes)
        return
    payload, why = parse_object(stdin_bytes)
    if payload is None:
        _log(home, why, stdin_bytes)
        return
    body = _wrap(stdin_bytes, payload, received_ns)
    _spool(home, body, received_ns)


def _wrap(raw: bytes, payload: dict, received_ns: int) -> bytes:
    """The spool file's bytes. The payload was just validated as one JSON object, so its bytes
    can go inside the wrapper as they are: no re-encoding on the hot path."""
    head = b'{"received_at": ' + repr(received_ns / 1e9).encode() + b', "payload": '
    if len(raw) <= SOFT_CAP and _plain_utf8(raw):
        return head + raw.strip(b" \t\n\r") + b"}\n"
    import json  # rare: re-encode (cut, or from another encoding)

    return head + json.dumps(_cut(payload) if len(raw) > SOFT_CAP else payload).encode() + b"}\n"


def _plain_utf8(raw: bytes) -> bool:
    if raw.isascii():
        return True
    if raw[:3] == b"\xef\xbb\xbf":
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _cut(payload: dict) -> dict:
    """A huge payload keeps its shape and scalars; long strings in tool_input/tool_response are cut."""

    def cut(value: object) -> object:
        if isinstance(value, str) and len(value) > CUT_CHARS:
            return value[:CUT_CHARS] + f"... [carl: {len(value) - CUT_CHARS} characters cut]"
        if isinstance(value, dict):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, list):
            return [cut(v) for v in value]
        return value

    return {
        **payload,
        **{k: cut(payload[k]) for k in ("tool_input", "tool_response", "error") if k in payload},
    }


def _spool(home: str, body: bytes, received_ns: int) -> None:
    global _counter
    _counter += 1
    folder = home + "/spool/hooks"
    name = f"{received_ns:020d}-{_os.getpid()}-{_counter}-{_os.urandom(3).hex()}.json"
    tmp = f"{folder}/.tmp-{name}"
    flags = _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL | getattr(_os, "O_BINARY", 0)
    try:
        fd = _os.open(tmp, flags, 0o600)
    except FileNotFoundError:  # first call for this home: make the folders (mode 0700)
        _make_dirs(home, home + "/spool", folder)
        fd = _os.open(tmp, flags, 0o600)
    try:
        view = memoryview(body)
        while view:
            view = view[_os.write(fd, view) :]
    finally:
        _os.close(fd)
    _os.rename(tmp, f"{folder}/{name}")


def _make_dirs(*folders: str) -> None:
    import os  # first call only

    for folder in folders:
        try:
            os.makedirs(folder, 0o700)
            os.chmod(folder, 0o700)  # makedirs' mode is filtered by the umask
        except FileExistsError:
            pass


def _log(home: str, reason: str, raw: bytes) -> None:
    """One line in logs/hook-errors.log; never raises (the agent must not notice)."""
    try:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        line = f"{stamp} {' '.join(reason.split())} {raw[:LOG_BYTES]!r}\n".encode("utf-8", "replace")
        path = home + "/logs/hook-errors.log"
        flags = _os.O_WRONLY | _os.O_APPEND | _os.O_CREAT
        try:
            fd = _os.open(path, flags, 0o600)
        except FileNotFoundError:
            _make_dirs(home, home + "/logs")
            fd = _os.open(path, flags, 0o600)
        try:
            _os.write(fd, line)  # one O_APPEND write: lines from concurrent hooks do not interleave
        finally:
            _os.close(fd)
    except BaseException:
        pass


def _read_stdin(limit: int) -> bytes:
    chunks = []
    size = 0
    while size <= limit:
        chunk = _os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def main(argv: list[str] | None = None) -> int:
    """Record stdin; whatever happens, return 0 and print nothing."""
    home = None
    raw = b""
    try:
        home = carl_home(argv)
        raw = _read_stdin(HARD_CAP)
        record(raw, home)
    except BaseException as exc:  # even KeyboardInterrupt: the hook's exit status must stay 0
        if home is not None:
            _log(home, f"hook failed: {type(exc).__name__}: {exc}", raw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
