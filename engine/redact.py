"""Secrets out of text before it leaves the machine (diagnosis, a remote judge, an alert) or enters the store
(trajectories, hook payloads, chat messages): the one redaction of the project.

Three kinds of check, each replaced by `[REDACTED:<kind>]`:
1. Known token shapes: Anthropic, OpenAI, Stripe (`sk_live_`, `rk_live_`), Hugging Face, GitHub, GitLab
   (`glpat-`), AWS key ids, Slack, Google, npm, PyPI, SendGrid, JWTs, private key blocks, credentials in
   URLs (`user:password@`, and a NATS URL's `TOKEN@`).
2. Labelled values: `password=...`, `"api_key": "..."`, `SECRET_TOKEN=...`, `--token X`, an
   `Authorization:` header of any scheme (Basic, Bearer, ...), `bearer X`, `mysql -pPASSWORD`.
3. Unlabelled keys: a 40-character base64 run of mixed case and digits (an AWS secret access key's shape),
   and a random-looking token (16+ characters: mixed case and digits, or a long hex or alphanumeric run, of
   high entropy) right after a word such as key, secret, token or password ("the deploy key is 9Xk2...").
The checks are specific enough that metric names, numbers, paths, hashes and prose pass intact
(tests/secret_corpus.py holds both sides). Each pattern runs only when its marker (a fixed substring) is in
the text, so text without one costs a few substring tests; every pattern is linear in the text.
detect-secrets was measured for this job and not kept: docs/guide/diagnosis.md says why.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

_TOKEN = r"A-Za-z0-9+/_\-=~"  # what a key, a token or a base64 value is made of
_HEX = re.compile(r"[0-9a-fA-F]+")
# A metric name or a path: words (lower, upper or camel case: humps of 3+ letters, maybe ending in digits)
# and numbers joined by / _ . - or :, as in rewards/accuracy_reward_v2/mean, checkpoint-1200/adapter_model
# or Eval/LossTop1.
_NAME_SEPARATORS = re.compile(r"[/_.:\-]+")
_NAME_PIECE = re.compile(r"[A-Za-z][a-z]*(?:[A-Z][a-z]{2,})*\d*|[A-Z]+\d*|\d+[A-Za-z]{0,2}")


def entropy(text: str) -> float:
    """Shannon entropy of the characters of `text`, in bits per character."""
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def name_like(value: str) -> bool:
    """Whether `value` reads as a metric name or a path (two or more words and numbers joined by separators)
    rather than a generated key, whose runs mix cases and digits (9Xk2Lm7Q..., c9f8e7d6...)."""
    pieces = [piece for piece in _NAME_SEPARATORS.split(value) if piece]
    return len(pieces) >= 2 and all(_NAME_PIECE.fullmatch(piece) for piece in pieces)


def metric_like(value: str) -> bool:
    """A name with a `/` in it: what a labelled value (`token=...`, `token X`) may be without being a secret.
    A slash-free word with digits (hunter2) is still taken for a password there."""
    return "/" in value and name_like(value)


def looks_random(value: str) -> bool:
    """A generated key rather than a word, a name or a number: 16+ characters with digits and letters, of
    high entropy for its classes (upper, lower and digits; or a hex or single-case run of 20+)."""
    if len(value) < 16 or not any(c.isdigit() for c in value) or name_like(value):
        return False
    upper, lower = any(c.isupper() for c in value), any(c.islower() for c in value)
    if upper and lower:
        return entropy(value) >= 3.0
    return len(value) >= 20 and (upper or lower) and entropy(value) >= (3.0 if _HEX.fullmatch(value) else 3.5)


def _aws_secret(match: re.Match[str]) -> str:
    value = match.group()
    mixed = any(c.isupper() for c in value) and any(c.islower() for c in value)
    return "[REDACTED:aws-secret]" if mixed and looks_random(value) and entropy(value) >= 4.0 else value


def _near_keyword(match: re.Match[str]) -> str:
    value = match.group("value")
    if value.startswith("REDACTED") or not looks_random(value):
        return match.group()
    return match.group()[: match.start("value") - match.start()] + "[REDACTED:secret]"


Replacement = str | Callable[[re.Match[str]], str]
# (markers: the pattern runs only when one of them is in the text), whether the markers are looked for in
# the lowered text (those of case-insensitive patterns), the pattern, what replaces a match.
_KEYWORDS = ("passw", "secret", "key", "token", "credential", "pwd")  # every name the two patterns below know
_CHECKS: list[tuple[tuple[str, ...], bool, re.Pattern[str], Replacement]] = [
    (
        ("PRIVATE KEY-----",),
        False,
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
        "[REDACTED:private-key]",
    ),
    (("sk-ant-",), False, re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{10,}"), "[REDACTED:anthropic-key]"),
    (("sk-",), False, re.compile(r"\bsk-(?:proj-|svcacct-)?[A-Za-z0-9_\-]{20,}"), "[REDACTED:openai-key]"),
    (
        ("k_live_", "k_test_"),
        False,
        re.compile(r"\b[rs]k_(?:live|test)_[0-9A-Za-z]{16,}"),
        "[REDACTED:stripe-key]",
    ),
    (("hf_",), False, re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "[REDACTED:hf-token]"),
    (
        ("gh", "github_pat_"),
        False,
        re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
        "[REDACTED:github-token]",
    ),
    (
        ("gl",),
        False,
        re.compile(r"\bgl(?:pat|dt|rt|ptt|soat|cbt|imt|agent|ffct|oas)-[A-Za-z0-9_\-]{20,}"),
        "[REDACTED:gitlab-token]",
    ),
    (("AKIA", "ASIA"), False, re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "[REDACTED:aws-key]"),
    (
        ("xox", "xapp-"),
        False,
        re.compile(r"\b(?:xox[abposr]|xapp)-[A-Za-z0-9\-]{10,}"),
        "[REDACTED:slack-token]",
    ),
    (("AIza",), False, re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"), "[REDACTED:google-key]"),
    (("ya29.",), False, re.compile(r"\bya29\.[0-9A-Za-z_\-]{20,}"), "[REDACTED:google-oauth]"),
    (
        ("hooks.slack.com/",),
        False,
        re.compile(r"(?<=hooks\.slack\.com/)(?:services|workflows|triggers)/[A-Za-z0-9_/\-]{10,}"),
        "[REDACTED:slack-webhook]",
    ),
    (
        ("/api/webhooks/",),
        True,
        re.compile(r"(?i)(?<=/api/webhooks/)\d{5,}/[A-Za-z0-9_\-]{20,}"),
        "[REDACTED:discord-webhook]",
    ),
    # A Telegram bot token: the bot's number, a colon, ~35 characters (also in api.telegram.org/bot...).
    (
        (":",),
        False,
        re.compile(r"(?<![\w:])(?:bot)?\d{8,10}:[A-Za-z0-9_\-]{30,45}(?![\w\-])"),
        "[REDACTED:telegram-token]",
    ),
    (
        ("do", "dor_v1_", "dop_v1_"),
        False,
        re.compile(r"\bdo[opr]_v1_[a-f0-9]{64}\b"),
        "[REDACTED:digitalocean-token]",
    ),
    (("shp",), False, re.compile(r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b"), "[REDACTED:shopify-token]"),
    (("key-",), False, re.compile(r"\bkey-[0-9a-zA-Z]{32}\b"), "[REDACTED:mailgun-key]"),
    (("SK",), False, re.compile(r"\bSK[0-9a-fA-F]{32}\b"), "[REDACTED:twilio-key]"),
    (("gsk_",), False, re.compile(r"\bgsk_[A-Za-z0-9]{40,}"), "[REDACTED:groq-key]"),
    (("r8_",), False, re.compile(r"\br8_[A-Za-z0-9]{30,}"), "[REDACTED:replicate-token]"),
    (("pplx-",), False, re.compile(r"\bpplx-[A-Za-z0-9]{40,}"), "[REDACTED:perplexity-key]"),
    (("xai-",), False, re.compile(r"\bxai-[A-Za-z0-9]{40,}"), "[REDACTED:xai-key]"),
    (("dapi",), False, re.compile(r"\bdapi[0-9a-f]{32}(?:-\d)?\b"), "[REDACTED:databricks-token]"),
    (("PMAK-",), False, re.compile(r"\bPMAK-[0-9a-f]{24}-[0-9a-f]{34}\b"), "[REDACTED:postman-key]"),
    (("ATATT",), False, re.compile(r"\bATATT[A-Za-z0-9_\-=]{20,}"), "[REDACTED:atlassian-token]"),
    (("lin_api_",), False, re.compile(r"\blin_api_[A-Za-z0-9]{32,}"), "[REDACTED:linear-key]"),
    (
        ("ntn_", "secret_"),
        False,
        re.compile(r"\b(?:ntn_[A-Za-z0-9]{40,}|secret_[A-Za-z0-9]{43})\b"),
        "[REDACTED:notion-token]",
    ),
    (
        ("pat-",),
        False,
        re.compile(r"\bpat-(?:na|eu)\d-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"),
        "[REDACTED:hubspot-token]",
    ),
    (("wandb_v",), False, re.compile(r"\bwandb_v\d+_[A-Za-z0-9_]{20,}"), "[REDACTED:wandb-key]"),
    # Azure's shared access signature: the `sig=` of a SAS URL or connection string.
    (("sig=",), True, re.compile(r"(?i)(?<=[?&;]sig=)[A-Za-z0-9%+/=]{16,}"), "[REDACTED:azure-sas]"),
    (("npm_",), False, re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), "[REDACTED:npm-token]"),
    (("pypi-",), False, re.compile(r"\bpypi-[A-Za-z0-9_\-]{32,}"), "[REDACTED:pypi-token]"),
    (
        ("SG.",),
        False,
        re.compile(r"\bSG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"),
        "[REDACTED:sendgrid-key]",
    ),
    (
        ("eyJ",),
        False,
        re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
        "[REDACTED:jwt]",
    ),
    # `Authorization: Basic dXNlcjpwYXNz`, `authorization="Token abc..."`: whatever the scheme, its value.
    (
        ("authoriz",),
        True,
        re.compile(
            r"""(?i)(\bauthorization["']?\s*[:=]\s*["']?(?:(?:basic|bearer|token|digest|negotiate|apikey)\s+)?)"""
            r"[A-Za-z0-9+/=._~\-]{8,}"
        ),
        r"\1[REDACTED:authorization]",
    ),
    (
        ("bearer", "token"),
        True,
        re.compile(r"(?i)\b(bearer|token)\s+([A-Za-z0-9_\-\.=:/+]{16,})"),
        lambda m: m.group() if metric_like(m.group(2)) else f"{m.group(1)} [REDACTED:token]",
    ),
    # `sshpass -p PASSWORD ssh ...`, `curl -u user:PASSWORD URL`: the password of a command line.
    (
        ("sshpass",),
        False,
        re.compile(r"(\bsshpass\b[^\n|;&]{0,200}?\s-p\s*['\"]?)(?!\[REDACTED)([^\s'\"]+)"),
        r"\1[REDACTED:password]",
    ),
    (
        ("curl",),
        False,
        re.compile(r"(\bcurl\b[^\n|;&]{0,300}?\s(?:-u|--user)\s*['\"]?[^\s:'\"]*:)(?!\[REDACTED)([^\s'\"]+)"),
        r"\1[REDACTED:password]",
    ),
    # `mysql -u root -pS3cret`: the password glued to -p (a bare -p asks for it; -P is the port). The
    # options before it are bounded: an unbounded lazy run made a text of many `mysql` words quadratic.
    (
        ("mysql", "mariadb"),
        True,
        re.compile(
            r"(\b(?i:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump)\b[^\n|;&]{0,300}?\s-p)([^\s'\"]+)"
        ),
        r"\1[REDACTED:password]",
    ),
    (
        ("://",),
        False,
        re.compile(r"(?<=://)(?!\[REDACTED)[^/\s:@]+:[^/\s@]+(?=@)"),
        "[REDACTED:url-password]",
    ),
    # A NATS URL's user part alone is its token (nats://TOKEN@host); elsewhere a user part is a secret
    # when it looks like one (16+ token characters).
    (
        ("://",),
        False,
        re.compile(r"(?i)(?:(?<=\bnats://)|(?<=\btls://)|(?<=\bws://)|(?<=\bwss://))[^/\s:@\[\]]+(?=@)"),
        "[REDACTED:url-token]",
    ),
    (("://",), False, re.compile(r"(?<=://)[A-Za-z0-9_\-.~]{16,}(?=@)"), "[REDACTED:url-token]"),
]
# `password = hunter2`, "api_key": "abc...", SECRET_TOKEN=..., --token abc..., AccountKey=...
_ASSIGNMENT = re.compile(
    r"""(?ix)
    (?<![\w\-])(?P<name>(?P<flag>--)?["']?[\w\-]*(?:password|passwd|secret|api[_\-]?key|access[_\-]?key|
        account[_\-]?key|private[_\-]?key|signing[_\-]?key|auth[_\-]?token|token|credential)s?["']?)
    (?P<sep>\s*[:=]\s*|(?(flag)\s+|(?!)))  # a flag (--token X) may use a space instead of = or :
    (?P<quote>["']?)(?P<value>[^\s"',;}]{6,})(?P=quote)
    """
)
# A random-looking token right after a keyword, with at most one small word between: "the key is X",
# "secret: X", "token X".
_NEAR_KEYWORD = re.compile(
    rf"""(?ix)
    \b(?:api[_\-]?keys?|keys?|secrets?|tokens?|passwords?|passwd|pwd|credentials?)\b
    [\s"'`:=]*(?:(?:is|was|are|of|for|here|to)\b[\s"'`:=]*)?
    (?<![{_TOKEN}])(?P<value>[{_TOKEN}]{{16,}})(?![{_TOKEN}])
    """
)
# A W&B API key: 40 hex characters. A git commit is 40 hex characters too: one named as such (commit, sha,
# revision, hash...) in the words just before it stays.
_HEX40 = re.compile(r"(?<![0-9A-Za-z])[0-9a-f]{40}(?![0-9A-Za-z])")
_HASH_WORDS = re.compile(
    r"(?i)(?<![a-z])(?:commit|sha|sha1|git|revision|rev|hash|checksum|digest|head|tree|blob)(?![a-z])"
    r"(?:[\s:=#'\"]+\w{1,12}){0,3}[\s:=#'\"@]*$"
)


def _hex40(match: re.Match[str]) -> str:
    value = match.group()
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return value
    before = match.string[max(0, match.start() - 48) : match.start()]
    return value if _HASH_WORDS.search(before) else "[REDACTED:wandb-key]"


# An AWS secret access key without its label: 40 base64 characters on their own.
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def redact(text: str) -> str:
    """`text` with every secret it holds replaced; text without secrets comes back unchanged."""
    if not text:
        return text
    lowered = text.lower()
    for markers, folded, pattern, replacement in _CHECKS:
        where = lowered if folded else text
        if any(marker in where for marker in markers):
            text = pattern.sub(replacement, text)
    if any(word in lowered for word in _KEYWORDS):
        text = _ASSIGNMENT.sub(_redact_assignment, text)
        text = _NEAR_KEYWORD.sub(_near_keyword, text)
    if len(text) >= 40:
        text = _HEX40.sub(_hex40, text)
        text = _AWS_SECRET.sub(_aws_secret, text)
    return text


# A key whose value is a secret, however plain the value looks (`{"password": "hunter2"}`): what a label in
# text says, said by a JSON object's key. A bare `token` is not one: the rollouts' per-token entries use it.
_SECRET_KEY = re.compile(
    r"(?i)(?:[\w\-]*[_\-])?(?:password|passwd|pwd|secret|client[_\-]?secret|api[_\-]?key|access[_\-]?key|"
    r"secret[_\-]?key|private[_\-]?key|signing[_\-]?key|account[_\-]?key|credentials?|"
    r"(?:auth|access|refresh|api|bot|bearer|session|id)[_\-]?token)s?"
)


def redact_value(value: Any) -> Any:
    """A parsed JSON value (a hook payload, a tool's input or result) with every string in it redacted, before
    it is encoded (an encoded `\\"password\\": ...` or `\\n` hides a label from the text checks); the
    string under a key that names a secret goes whatever it looks like. Dicts and lists are copied (a loop,
    not recursion: the value may be nested as deep as its parser allowed)."""
    if isinstance(value, str):
        return redact(value)
    if not isinstance(value, dict | list):
        return value
    root = value.copy()
    stack: list[dict[Any, Any] | list[Any]] = [root]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in list(items):
            if (
                isinstance(item, str)
                and isinstance(node, dict)
                and isinstance(key, str)
                and _secret_under(key, item)
            ):
                node[key] = "[REDACTED:secret]"
            elif isinstance(item, str):
                node[key] = redact(item)
            elif isinstance(item, dict | list):
                node[key] = item.copy()
                stack.append(node[key])
    return root


def _secret_under(key: str, value: str) -> bool:
    """Whether `value`, under the JSON key `key`, is a secret to replace whole: the key names one, and the
    value is not empty, a number or a metric name."""
    return (
        bool(_SECRET_KEY.fullmatch(key.strip()))
        and bool(value.strip())
        and not value.startswith("[REDACTED")
        and not _looks_like_a_number(value)
        and not metric_like(value)
    )


def _redact_assignment(match: re.Match[str]) -> str:
    value = match.group("value")
    if value.startswith("[REDACTED") or _looks_like_a_number(value) or metric_like(value):
        return match.group(0)
    quote = match.group("quote")
    return f"{match.group('name')}{match.group('sep')}{quote}[REDACTED:secret]{quote}"


def _looks_like_a_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
