"""Skill and domain inference from portable evidence (docs/reference/karl.md §8, project rule 12(f)).

The §8 counting mechanism: collect evidence strings (every event's `file_path`, `command` and
`pattern`, plus the working directory, the repository name and the prompt); for every
(string, entry) pair whose regex matches (case-insensitive search) add 1 to the entry's
(skill, domain). The highest count wins, ties go to the pair listed first, no match gives
(None, None): the `_global` bucket.

The default table holds only portable evidence, no personal directory names or hostnames:

entry      (skill, domain)           evidence
iOS        (ios-build, ios)          `.xcodeproj`, `.swift`, `xcodebuild`, `swift build/test`, `pod install`
infra      (deploy-ops, infra)       `Dockerfile`, `docker-compose`, `docker`, `.service`, `kubectl`, `helm`,
                                     `terraform`, `.tf`
data       (supabase-ops, data)      `supabase`, `migration(s)`, `.sql`, `psql`, `alembic`
notebooks  (notebook, data-science)  `.ipynb`, `jupyter`
Rust       (rust-dev, rust)          `.rs`, `Cargo.toml`, `cargo`
Go         (go-dev, go)              `.go`, `go.mod`, `go build/test/run/mod/vet`
web        (web-dev, web)            `.ts/.tsx/.js/.jsx/.mjs/.cjs/.vue/.svelte/.css`, `package.json`,
                                     `npm/npx/yarn/pnpm/bun`
Python     (python-dev, python)      `.py`, `pyproject.toml`, `requirements*.txt`, `pip`, `pytest`, `python`,
                                     `uv`, `ruff`
JVM        (jvm-dev, jvm)            `.java/.kt/.kts/.gradle`, `pom.xml`, `gradle(w)`, `mvn`
C/C++      (c-cpp-dev, systems)      `.c/.h/.cc/.cpp/.hpp`, `CMakeLists.txt`, `cmake`
shell      (shell-scripting, infra)  `.sh/.bash/.zsh` scripts
docs       (docs-writing, docs)      `.md/.rst/.mdx`, a `docs/` folder, `mkdocs`, `sphinx`

Order matters only for ties: specific platforms (iOS, infra, data, notebooks) come before the
languages they are written in, and docs come last, since nearly every repository has Markdown.
Tests are not a domain of their own: `pytest` counts toward Python, `cargo test` toward Rust.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from engine.trajectories.trajectory import Trajectory

EVIDENCE_PARAMS = ("file_path", "command", "pattern")
MATCH_CACHE_SIZE = 65_536  # distinct evidence strings remembered per table (paths and commands repeat)

# (pattern, skill, domain), in tie-break order.
DEFAULT_ENTRIES: tuple[tuple[str, str, str], ...] = (
    (
        r"\.xcodeproj|\.xcworkspace|\.swift$|\bxcodebuild\b|\bswift (build|test)\b|\bpod install\b",
        "ios-build",
        "ios",
    ),
    (
        r"Dockerfile|docker-compose|\bdocker\b|\.service$|\bkubectl\b|\bhelm\b|\bterraform\b|\.tf$",
        "deploy-ops",
        "infra",
    ),
    (r"supabase|\bmigrations?\b|\.sql$|\bpsql\b|\balembic\b", "supabase-ops", "data"),
    (r"\.ipynb$|\bjupyter\b", "notebook", "data-science"),
    (r"\.rs$|Cargo\.toml|\bcargo\b", "rust-dev", "rust"),
    (r"\.go$|\bgo\.mod\b|\bgo (build|test|run|mod|vet)\b", "go-dev", "go"),
    (
        r"\.(ts|tsx|js|jsx|mjs|cjs|vue|svelte|css|scss)$|package\.json|\b(npm|npx|yarn|pnpm|bun)\b",
        "web-dev",
        "web",
    ),
    (
        r"\.py$|pyproject\.toml|requirements[\w.-]*\.txt|\b(pip3?|pytest|python3?|uv|ruff|mypy)\b",
        "python-dev",
        "python",
    ),
    (r"\.(java|kt|kts|gradle)$|pom\.xml|\b(gradlew?|mvn)\b", "jvm-dev", "jvm"),
    (r"\.(c|h|cc|cpp|cxx|hpp)$|CMakeLists\.txt|\bcmake\b", "c-cpp-dev", "systems"),
    (r"\.(sh|bash|zsh)$", "shell-scripting", "infra"),
    (r"\.(md|mdx|rst)$|(^|/)docs?/|\bmkdocs\b|\bsphinx\b", "docs-writing", "docs"),
)


@dataclass(frozen=True)
class DomainEntry:
    pattern: re.Pattern[str]
    skill: str
    domain: str


class DomainTable:
    """An ordered table of (regex, skill, domain) entries; see the module docstring for the defaults."""

    def __init__(self, entries: Iterable[DomainEntry]) -> None:
        self.entries = tuple(entries)
        self._pairs = list(dict.fromkeys((e.skill, e.domain) for e in self.entries))  # first-listed order
        self._slot = [self._pairs.index((e.skill, e.domain)) for e in self.entries]
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def default(cls) -> DomainTable:
        return DEFAULT_TABLE

    @classmethod
    def from_config(cls, entries: list[dict[str, Any]], replace_defaults: bool = False) -> DomainTable:
        """User entries ({"pattern", "skill", "domain"}) first, so they win ties; then the defaults
        unless `replace_defaults`. A bad entry raises ValueError naming its index and pattern."""
        user = [_entry(i, raw) for i, raw in enumerate(entries)]
        return cls(user if replace_defaults else [*user, *DEFAULT_TABLE.entries])

    def matches(self, text: str) -> tuple[int, ...]:
        """Indices (into the (skill, domain) pairs) of every entry whose regex matches `text`."""
        hit = self._cache.get(text)
        if hit is None:
            hit = tuple(
                slot for slot, e in zip(self._slot, self.entries, strict=True) if e.pattern.search(text)
            )
            if len(self._cache) >= MATCH_CACHE_SIZE:
                self._cache.clear()
            self._cache[text] = hit
        return hit

    def classify(self, evidence: Iterable[str]) -> tuple[str | None, str | None]:
        """The (skill, domain) with the most (string, entry) matches; ties to the first listed."""
        votes: Counter[int] = Counter()
        for text, times in Counter(s for s in evidence if s).items():
            for slot in self.matches(text):
                votes[slot] += times
        if not votes:
            return None, None
        best = max(votes.values())
        return self._pairs[min(slot for slot, n in votes.items() if n == best)]

    def infer(self, t: Trajectory) -> tuple[str | None, str | None]:
        """An explicit skill or domain on the trajectory is kept as is; otherwise count the evidence."""
        if t.skill or t.domain:
            return t.skill, t.domain
        return self.classify(evidence(t))


def evidence(t: Trajectory) -> list[str]:
    """§8 evidence strings: every event's file_path, command and pattern, then cwd, repository, prompt."""
    out = [v for e in t.events for k in EVIDENCE_PARAMS if (v := e.params.get(k))]
    out.extend(s for s in (t.cwd, t.git_repo, t.prompt) if s)
    return out


def _entry(index: int, raw: Any) -> DomainEntry:
    if not isinstance(raw, dict):
        raise ValueError(f"domain table entry {index}: expected a table with pattern, skill, domain")
    pattern, skill, domain = raw.get("pattern"), raw.get("skill"), raw.get("domain")
    if not isinstance(pattern, str) or not isinstance(skill, str) or not isinstance(domain, str):
        raise ValueError(f"domain table entry {index}: pattern, skill and domain must all be strings")
    try:
        return DomainEntry(re.compile(pattern, re.IGNORECASE), skill, domain)
    except re.error as err:
        raise ValueError(f"domain table entry {index}: bad pattern {pattern!r}: {err}") from None


DEFAULT_TABLE = DomainTable(DomainEntry(re.compile(p, re.IGNORECASE), s, d) for p, s, d in DEFAULT_ENTRIES)


def infer(t: Trajectory, table: DomainTable = DEFAULT_TABLE) -> tuple[str | None, str | None]:
    return table.infer(t)
