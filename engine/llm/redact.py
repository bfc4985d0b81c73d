"""Secrets out of text before it leaves the machine (diagnosis, a remote judge) or enters the store (traces).

Known token shapes (Anthropic, OpenAI, Hugging Face, GitHub, AWS, Slack, Google, JWTs, bearer
headers, private key blocks, credentials in URLs: `user:password@`, and a NATS URL's `TOKEN@`) and `password=`/`api_key:`-style assignments are replaced by
`[REDACTED:<kind>]`. The shapes are specific enough that metric names and numbers pass intact.
"""

from __future__ import annotations

import re

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        "private-key",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S),
    ),
    ("anthropic-key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{10,}")),
    ("openai-key", re.compile(r"\bsk-(?:proj-|svcacct-)?[A-Za-z0-9_\-]{20,}")),
    ("hf-token", re.compile(r"\bhf_[A-Za-z0-9]{20,}")),
    ("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("aws-key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}")),
    ("google-key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")),
    ("bearer", re.compile(r"(?i)\b(bearer|token)\s+[A-Za-z0-9_\-\.=:/+]{16,}")),
    ("url-password", re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+(?=@)")),
    # A NATS URL's user part alone is its token (nats://TOKEN@host); elsewhere a user part is a secret
    # when it looks like one (16+ token characters).
    (
        "url-token",
        re.compile(r"(?i)(?:(?<=\bnats://)|(?<=\btls://)|(?<=\bws://)|(?<=\bwss://))[^/\s:@\[\]]+(?=@)"),
    ),
    ("url-token", re.compile(r"(?<=://)[A-Za-z0-9_\-.~]{16,}(?=@)")),
]
# `password = hunter2`, "api_key": "abc...", SECRET_TOKEN=..., --token abc...
_ASSIGNMENT = re.compile(
    r"""(?ix)
    (?<![\w\-])(?P<name>(?P<flag>--)?["']?[\w\-]*(?:password|passwd|secret|api[_\-]?key|access[_\-]?key|auth[_\-]?token|
        token|credential)s?["']?)  # a flag (--token X) may use a space instead of = or :
    (?P<sep>\s*[:=]\s*|(?(flag)\s+|(?!)))
    (?P<quote>["']?)(?P<value>[^\s"',;}]{6,})(?P=quote)
    """
)


def redact(text: str) -> str:
    """`text` with every secret it holds replaced; text without secrets comes back unchanged."""
    if not text:
        return text
    for kind, pattern in _PATTERNS:
        if kind == "bearer":
            text = pattern.sub(lambda m: f"{m.group(1)} [REDACTED:token]", text)
        else:
            text = pattern.sub(f"[REDACTED:{kind}]", text)
    return _ASSIGNMENT.sub(_redact_assignment, text)


def _redact_assignment(match: re.Match[str]) -> str:
    value = match.group("value")
    if value.startswith("[REDACTED") or _looks_like_a_number(value):
        return match.group(0)
    quote = match.group("quote")
    return f"{match.group('name')}{match.group('sep')}{quote}[REDACTED:secret]{quote}"


def _looks_like_a_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True
