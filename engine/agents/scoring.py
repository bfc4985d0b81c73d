"""Step scoring of the agents plane: PRM judges, environment profiles, and the reward.

After Tentalis (reference §5-6), with the project's rules (§12):
- every step score is clamped to [0, 1] at the scorer (published, a judge replying 3 and 3 put 3.0
  into the rollout);
- the profile comes from the result's own `environment` field (published, it was read from a field
  that does not exist, so every result was scored as `chat`);
- every dimension of every profile is implemented (published, only prm and halugate were); a
  dimension without its data is left out and the weights renormalise over the others;
- the reward the trainer optimises is the outcome, averaged with the task's verifier where it has
  one, never the manager's feedback (rule 4).

A reply is `<step>..</step>` spans and an `<answer>..</answer>` (`split_reply`, `render_reply`).
Judges answer `{progress, correctness, reasoning}` for step i seeing steps 1..i only: the offline
heuristic (`OfflineJudge`), an OpenAI-compatible server (`OpenAIJudge`: vLLM, llama.cpp, Ollama) or
Claude (`ClaudeJudge`). Text sent to a remote judge goes through `redact` (secrets out) first.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import math
import operator
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from engine.llm import claude
from engine.llm.redact import redact

from .events import ResultEvent, TaskEvent

log = logging.getLogger("carl.agents")

NEUTRAL = 0.5  # the score of a vote, step or profile that could not be judged: undecided, not wrong


def clamp01(value: float) -> float:
    """`value` limited to [0, 1]; NaN (undecided) is 0.5."""
    if math.isnan(value):
        return NEUTRAL
    return min(1.0, max(0.0, value))


def mean(values: Sequence[float], empty: float = 0.0) -> float:
    return sum(values) / len(values) if values else empty


# ================================================================================================ replies

_TAG = re.compile(r"<(/?)(step|answer)>", re.IGNORECASE)


@dataclass(frozen=True)
class _Tag:
    start: int
    end: int
    closing: bool
    name: str


def _tags(text: str) -> list[_Tag]:
    return [_Tag(m.start(), m.end(), m.group(1) == "/", m.group(2).lower()) for m in _TAG.finditer(text)]


def split_reply(text: str) -> tuple[list[str], str]:
    """The steps and the answer of a reply.

    Steps are the `<step>..</step>` spans, stripped; a step left open runs to the next `<step>` or
    `<answer>`, or to the end. The answer is the `<answer>..</answer>` span (left open: to the end),
    or the whole stripped text when there is none. A reply without step tags takes its steps from
    the non-empty lines before `<answer>` (or of the whole text).
    """
    tags = _tags(text)
    opening_answer = next((t for t in tags if t.name == "answer" and not t.closing), None)
    answer = _answer(text, tags, opening_answer)
    if any(t.name == "step" and not t.closing for t in tags):
        return _tagged_steps(text, tags), answer
    before = text[: opening_answer.start] if opening_answer is not None else text
    return [line.strip() for line in before.splitlines() if line.strip()], answer


def _answer(text: str, tags: list[_Tag], opening: _Tag | None) -> str:
    if opening is None:
        return text.strip()
    close = next((t for t in tags if t.start > opening.start and t.name == "answer" and t.closing), None)
    return text[opening.end : close.start if close is not None else len(text)].strip()


def _tagged_steps(text: str, tags: list[_Tag]) -> list[str]:
    steps = []
    for i, tag in enumerate(tags):
        if tag.name != "step" or tag.closing:
            continue
        # The first later tag that closes this step, opens another step, or opens the answer ends it.
        end = next(
            (t.start for t in tags[i + 1 :] if t.name == "step" or (t.name == "answer" and not t.closing)),
            len(text),
        )
        steps.append(text[tag.end : end].strip())
    return steps


def render_reply(steps: Sequence[str], answer: str) -> str:
    """The canonical text of a reply: one `<step>` line per step, then the `<answer>`."""
    return "\n".join([*(f"<step>{step}</step>" for step in steps), f"<answer>{answer}</answer>"])


# =========================================================================================== reading text


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _word_set(
    """a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing down during each either else etc ever every few
    for from further get gets got had has have having he her here hers herself him himself his how however
    i if in into is it its itself just let lets like may me might more most must my myself need needs no
    nor not of off on once only or other our ours ourselves out over own please same shall she should so
    some such than that the their theirs them themselves then there these they this those through to too
    under until up upon us very via want was we were what when where whether which while who whom whose
    why will with would yes yet you your yours yourself yourselves"""
)
# Words a step often starts with: capitalised there, they name no entity to check against the task.
DISCOURSE = _word_set(
    """first second third fourth fifth finally next then now so thus therefore hence step answer result
    note since given here there this that it ok okay sure done final check look find identify determine
    compute calculate use call return output select choose pick read write run open start begin consider
    recall know assume verify confirm conclude think plan try apply add subtract multiply divide count
    compare search click type press scroll wait"""
)
NEGATIONS = frozenset({"not", "no", "never", "none", "cannot", "neither", "nor", "without"})

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_'\-]*")
_CAPITALISED = re.compile(r"(?<![\w'])[A-Z][A-Za-z0-9]+")
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")
_QUOTED = re.compile(r"\"([^\"\n]{1,80})\"|(?<!\w)'([^'\n]{1,80})'(?!\w)")
_LIST_MARKER = re.compile(r"(?im)^\s*(?:step\s*)?\d+[.):]\s+")
_BRACKETS = {")": "(", "]": "[", "}": "{"}
MAX_JSON_STARTS = 200


def normalise_number(text: str) -> str:
    """`3`, `3.0` and `3.00` are one number: its shortest general form."""
    return format(float(text), ".10g")


def numbers(text: str) -> list[str]:
    """The numbers in `text`, normalised, leaving out list markers (`1.`, `Step 2:`)."""
    return [normalise_number(n) for n in _NUMBER.findall(_LIST_MARKER.sub(" ", text))]


def word_parts(word: str) -> set[str]:
    """A word and its pieces: `get_weather` is also `get` and `weather`."""
    lowered = word.lower().strip("'-_")
    return {lowered} | {p for p in re.split(r"[_\-']", lowered) if p}


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def content_words(text: str) -> set[str]:
    """The words of `text` and their pieces, without stopwords and single letters."""
    found: set[str] = set()
    for word in _WORD.findall(text):
        found |= {p for p in word_parts(word) if len(p) > 1 and p not in STOPWORDS}
    return found


def entities(text: str) -> set[str]:
    """Capitalised words that are not stopwords or step openers ("First", "Then"), lower-cased."""
    return {w.lower() for w in _CAPITALISED.findall(text) if w.lower() not in STOPWORDS | DISCOURSE}


def json_values(text: str) -> list[Any]:
    """Every JSON object or array embedded in `text`, outermost first, without overlaps (at most
    MAX_JSON_STARTS brackets are tried, so a long text full of brackets stays cheap)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    index = 0
    for _ in range(MAX_JSON_STARTS):
        start = _next_bracket(text, index)
        if start == -1:
            break
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            index = start + 1
            continue
        found.append(value)
        index = end
    return found


def _next_bracket(text: str, index: int) -> int:
    positions = [p for p in (text.find("{", index), text.find("[", index)) if p != -1]
    return min(positions) if positions else -1


def json_terms(value: Any) -> set[str]:
    """The keys and scalar values of a JSON value, as terms (strings lower-cased, numbers normalised)."""
    terms: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            terms |= content_words(str(key)) | json_terms(item)
    elif isinstance(value, list):
        for item in value:
            terms |= json_terms(item)
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int | float):
        terms.add(normalise_number(str(value)))
    elif isinstance(value, str):
        terms |= content_words(value) | set(numbers(value))
        if 1 < len(value) <= 40:
            terms.add(value.lower())
    return terms


def salient_terms(text: str) -> set[str]:
    """What a text is about: content words, numbers, capitalised names, quoted strings, JSON keys and
    values (all lower-cased)."""
    terms = content_words(text) | set(numbers(text)) | entities(text)
    terms |= {(a or b).strip().lower() for a, b in _QUOTED.findall(text) if (a or b).strip()}
    for value in json_values(text):
        terms |= json_terms(value)
    return terms


def covers(term: str, terms: set[str], lowered_text: str) -> bool:
    """Whether a text (its terms, and its lower-cased self for phrases) mentions `term` as a whole word."""
    if term in terms:
        return True
    return re.search(rf"(?<![\w]){re.escape(term)}(?![\w])", lowered_text) is not None


def coverage(wanted: set[str], text: str) -> float:
    """The share of `wanted` terms that `text` mentions."""
    if not wanted:
        return NEUTRAL
    terms, lowered = salient_terms(text), text.lower()
    return sum(covers(term, terms, lowered) for term in wanted) / len(wanted)


_OPERATORS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_EQUATION = re.compile(
    r"((?:-?\d+(?:\.\d+)?\s*[-+*/×÷]\s*)+-?\d+(?:\.\d+)?)"  # numbers joined by operators
    r"\s*=\s*(-?\d+(?:\.\d+)?)"  # = the claimed result
    r"(?![\d.]*\s*[-+*/×÷]\s*\d)"  # ... that is not itself the start of more arithmetic
)


def _evaluate(expression: str) -> float:
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        raise ValueError("not arithmetic")

    return walk(ast.parse(expression.replace("×", "*").replace("÷", "/"), mode="eval").body)


def equations(text: str) -> tuple[set[str], int]:
    """Written arithmetic (`12 + 30 = 42`, `6 × 7 = 42`): the results that check out, and how many
    do not. An expression that continues an operator before it (`x - 5 + 3 = ...`) is not judged."""
    right: set[str] = set()
    wrong = 0
    for match in _EQUATION.finditer(text):
        before = text[: match.start()].rstrip()
        if before and before[-1] in "+-*/×÷(=":
            continue
        try:
            value = _evaluate(match.group(1))
        except (ValueError, ArithmeticError, SyntaxError, RecursionError):  # not judged: too odd or too big
            continue
        claimed = float(match.group(2))
        if math.isclose(value, claimed, rel_tol=1e-6, abs_tol=1e-9):
            right.add(normalise_number(match.group(2)))
        else:
            wrong += 1
    return right, wrong


def balanced(text: str) -> bool:
    """Brackets nest and close, and double quotes pair up (quoted text is not bracket-checked)."""
    stack: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "([{":
            stack.append(char)
        elif char in _BRACKETS and (not stack or stack.pop() != _BRACKETS[char]):
            return False
    return not stack and not in_string


def distinct_ratio(text: str) -> float:
    """Distinct tokens over tokens: 1.0 for varied text, low for degenerate repetition."""
    tokens = text.lower().split()
    return len(set(tokens)) / len(tokens) if tokens else 0.0


def word_share(text: str) -> float:
    """Letters and digits over the visible characters: low for symbol soup."""
    visible = [c for c in text if not c.isspace()]
    return sum(c.isalnum() for c in visible) / len(visible) if visible else 0.0


_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
_CLAUSE = re.compile(r",\s*(?:and|but|while|whereas)\s+|\s+(?:but|whereas)\s+", re.IGNORECASE)


def claims(text: str, min_words: int = 2) -> list[str]:
    """The sentences and clauses of `text` that assert something checkable: a number, a name, or at
    least `min_words` content words."""
    found = []
    for sentence in _SENTENCE_END.split(_LIST_MARKER.sub("", text)):
        for clause in _CLAUSE.split(sentence):
            clause = clause.strip()
            if not clause:
                continue
            checkable = numbers(clause) or entities(clause) or len(content_words(clause)) >= min_words
            if checkable:
                found.append(clause)
    return found


def facts(text: str) -> tuple[set[str], set[str]]:
    """What a text asserts that can be checked: (numbers, names), names lower-cased."""
    return set(numbers(text)), entities(text)


@dataclass(frozen=True)
class Source:
    """What claims are checked against: the task prompt (and the task's reference, when given)."""

    text: str
    words: frozenset[str]
    numbers: frozenset[str]
    sentences: tuple[str, ...]

    @classmethod
    def of(cls, prompt: str, reference: str | None = None) -> Source:
        text = prompt if not reference else f"{prompt}\n{reference}"
        return cls(text, frozenset(salient_terms(text)), frozenset(numbers(text)), tuple(claims(text, 1)))

    def grounds(self, fact: str) -> bool:
        """A fact is grounded when the source names it, or (a name like `get_weather`) one of its parts."""
        return (
            fact in self.words
            or fact in self.numbers
            or any(len(part) > 2 and part in self.words for part in word_parts(fact) - STOPWORDS)
        )


# ============================================================================================ the judges


class JudgeReplyError(ValueError):
    """A judge answered, but not with a JSON object: the vote counts 0.5 (not left out)."""


class StepJudge(Protocol):
    """Judges step `index` (0-based) of `steps` for `task`, seeing steps 0..index only.

    Returns the reply's JSON object (`progress`, `correctness`, `reasoning`), whatever its values;
    raises JudgeReplyError when the reply is not a JSON object, anything else on transport errors.
    """

    name: str

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]: ...


def judge_prompt(task: str, steps: Sequence[str], index: int) -> str:
    """The one user message of a judge call (reference §5): the task, steps 1..i numbered, and the
    step under judgement; later steps are never shown. Every text goes through `redact`."""
    shown = "\n".join(f"{n}. {redact(step)}" for n, step in enumerate(steps[: index + 1], 1))
    return (
        "You judge one step of a worker's solution to a task.\n\n"
        f"Task:\n{redact(task)}\n\n"
        f"Steps so far:\n{shown}\n\n"
        f"Step under judgement (step {index + 1}):\n{redact(steps[index])}\n\n"
        "Reply with one JSON object and nothing else: "
        '{"progress": <0 to 1: 0 = no progress on the task, 1 = solves it>, '
        '"correctness": <0 to 1: 0 = wrong, 1 = fully sound>, '
        '"reasoning": "<one short sentence>"}'
    )


_FENCE = re.compile(r"^```[A-Za-z]*\s*(.*?)\s*```$", re.DOTALL)


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a judge's reply (fenced in ``` or after a short preamble)."""
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    try:
        value = json.loads(stripped)
    except ValueError:
        objects = [v for v in json_values(stripped) if isinstance(v, dict)]
        if not objects:
            raise JudgeReplyError(f"the judge's reply is not JSON: {_one_line(text)}") from None
        value = objects[0]
    if not isinstance(value, dict):
        raise JudgeReplyError(f"the judge replied {type(value).__name__}, not a JSON object")
    return value


def _one_line(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class OfflineJudge:
    """A deterministic judge that reads the text; no network.

    progress = 0.75 x coverage + 0.25 x structure. Coverage: the share of the task's salient terms
    (content words, numbers, names, quoted strings, JSON keys and values) that steps 1..i mention.
    Structure: 1.0 when step i holds a JSON object or array, 0.5 when it states a result (`= 42`,
    `answer: ...`), else 0.

    correctness = the product of factors for step i: 0 when it has no letters or digits; word share
    (alphanumerics over visible characters) below 0.5 scales it down; a distinct-token ratio below
    0.5 (six tokens or more) scales it down; ungrounded facts (numbers and names that neither the
    task nor checked arithmetic gives) take up to 0.6 off by their share; unbalanced brackets or
    quotes x0.7; each wrong equation (`2 + 2 = 5`) halves it.
    """

    name = "offline"

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]:
        progress, why_progress = self.progress(task, steps, index)
        correctness, why_correct = self.correctness(task, steps, index)
        return {
            "progress": progress,
            "correctness": correctness,
            "reasoning": f"{why_progress}; {why_correct}",
        }

    def progress(self, task: str, steps: Sequence[str], index: int) -> tuple[float, str]:
        wanted = salient_terms(task)
        covered = coverage(wanted, "\n".join(steps[: index + 1]))
        structure = self.structure(steps[index])
        score = clamp01(0.75 * covered + 0.25 * structure)
        return score, f"covers {covered:.0%} of the task's terms, structure {structure:.1f}"

    @staticmethod
    def structure(step: str) -> float:
        if any(isinstance(v, dict | list) and v for v in json_values(step)):
            return 1.0
        if re.search(r"(?i)(=\s*-?\d|\b(answer|result)\s*(is|:))", step):
            return 0.5
        return 0.0

    def correctness(self, task: str, steps: Sequence[str], index: int) -> tuple[float, str]:
        step = steps[index]
        if not any(c.isalnum() for c in step):
            return 0.0, "the step has no words"
        score, reasons = 1.0, []
        share = word_share(step)
        if share < 0.5 and not json_values(step):
            score *= share / 0.5
            reasons.append(f"mostly symbols ({share:.0%} alphanumeric)")
        ratio = distinct_ratio(step)
        if len(step.split()) >= 6 and ratio < 0.5:
            score *= ratio / 0.5
            reasons.append(f"repetitive ({ratio:.0%} distinct tokens)")
        ungrounded, checked, wrong = self.grounding(task, steps, index)
        if checked:
            score *= 1 - 0.6 * len(ungrounded) / checked
            if ungrounded:
                reasons.append(f"ungrounded: {', '.join(sorted(ungrounded)[:3])}")
        if not balanced(step):
            score *= 0.7
            reasons.append("unbalanced brackets or quotes")
        if wrong:
            score *= 0.5**wrong
            reasons.append(f"{wrong} wrong equation{'s' if wrong > 1 else ''}")
        return clamp01(score), ", ".join(reasons) or "sound"

    @staticmethod
    def grounding(task: str, steps: Sequence[str], index: int) -> tuple[set[str], int, int]:
        """(ungrounded facts of step i, facts checked, wrong equations in step i)."""
        source = Source.of(task)
        derived: set[str] = set()
        for earlier in steps[:index]:
            derived |= equations(earlier)[0]
        right, wrong = equations(steps[index])
        step_numbers, names = facts(steps[index])
        checked = step_numbers | names
        ungrounded = {f for f in checked if f not in derived | right and not source.grounds(f)}
        return ungrounded, len(checked), wrong


class OpenAIJudge:
    """A judge behind an OpenAI-compatible `/chat/completions` (vLLM, llama.cpp server, Ollama serve).

    `base_url` ends in `/v1`. JSON output is requested with `response_format={"type": "json_object"}`.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        temperature: float | None = None,
        max_tokens: int = 256,
    ) -> None:
        self.name = f"openai:{model}"
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.temperature = temperature  # None: the server's default (votes need some randomness)
        self.max_tokens = max_tokens
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(timeout=timeout)

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": judge_prompt(task, steps, index)}],
            "response_format": {"type": "json_object"},
            "max_tokens": self.max_tokens,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        response = await self._client.post(self.url, json=body, headers=self._headers)
        response.raise_for_status()
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeReplyError("the reply has no choices[0].message.content") from None
        if not isinstance(content, str):
            raise JudgeReplyError("choices[0].message.content is not text")
        return parse_json_object(content)

    async def aclose(self) -> None:
        await self._client.aclose()


def first_text(message: Any) -> str:
    """The first text block of a Messages API reply."""
    for block in message.content:
        if getattr(block, "type", None) == "text":
            return str(block.text)
    raise JudgeReplyError("the reply has no text block")


class ClaudeJudge:
    """A judge on the Anthropic Messages API (the SDK is imported when the judge is made; without it,
    `claude.ClaudeUnavailable` says how to install it)."""

    def __init__(
        self,
        api_key: str,
        model: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        max_tokens: int = 256,
    ) -> None:
        self.model = claude.resolve_model(model)  # one model for every Claude request the engine makes
        self.name = f"claude:{self.model}"
        self.max_tokens = max_tokens
        self._client = claude.async_client(api_key, base_url, timeout, max_retries)

    async def judge(self, task: str, steps: Sequence[str], index: int) -> dict[str, Any]:
        message = await self._client.messages.create(
            model=self.model,
            max_tokens=self.max_tokens,
            messages=[{"role": "user", "content": judge_prompt(task, steps, index)}],
        )
        return parse_json_object(first_text(message))

    async def aclose(self) -> None:
        await self._client.close()


# =============================================================================================== the PRM


def vote_of(reply: dict[str, Any]) -> float:
    """One judge reply as a vote: (progress + correctness) / 2, each clamped to [0, 1]; a missing,
    non-numeric or NaN value counts 0.5."""
    return (_judged(reply.get("progress")) + _judged(reply.get("correctness"))) / 2


def _judged(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return NEUTRAL
    return clamp01(float(value))


@dataclass(frozen=True)
class StepScores:
    """The PRM's scores of a result's steps, and the judge calls that failed and were left out."""

    scores: tuple[float, ...]
    failures: tuple[str, ...] = ()
    calls: int = 0


class PRMScorer:
    """Per-step process reward: `votes` judge calls per step in parallel; the step score is their
    median (even count: the mean of the middle two). A reply that is not JSON votes 0.5; a transport
    error is left out; no vote left gives 0.5. Steps are scored one after another."""

    def __init__(self, judge: StepJudge, votes: int = 1) -> None:
        if votes < 1:
            raise ValueError("votes must be at least 1")
        self.judge = judge
        self.votes = votes

    async def score(self, task: str, steps: Sequence[str]) -> list[float]:
        return list((await self.score_steps(task, steps)).scores)

    async def score_steps(self, task: str, steps: Sequence[str]) -> StepScores:
        scores: list[float] = []
        failures: list[str] = []
        for index in range(len(steps)):
            votes = await asyncio.gather(*(self._vote(task, steps, index) for _ in range(self.votes)))
            valid = [v for v in votes if isinstance(v, float)]
            failures += [v for v in votes if isinstance(v, str)]
            scores.append(clamp01(statistics.median(valid)) if valid else NEUTRAL)
        return StepScores(tuple(scores), tuple(failures), len(steps) * self.votes)

    async def _vote(self, task: str, steps: Sequence[str], index: int) -> float | str:
        """A vote, or the one-line reason the call failed (left out of the median)."""
        try:
            return vote_of(await self.judge.judge(task, steps, index))
        except JudgeReplyError:
            return NEUTRAL
        except Exception as exc:  # transport: the vote is left out, never the whole result
            reason = f"{type(exc).__name__}: {_one_line(str(exc))}"
            log.warning("judge %s failed on step %d: %s", self.judge.name, index + 1, reason)
            return reason


# ========================================================================================= the dimensions

PROFILES: dict[str, dict[str, float]] = {
    "chat": {"prm": 0.6, "halugate": 0.3, "length": 0.1},
    "terminal": {"success": 0.8, "efficiency": 0.2},
    "swe": {"tests": 0.5, "prm": 0.3, "diff_size": 0.2},
    "gui": {"prm": 0.5, "action_validity": 0.3, "efficiency": 0.2},
}
FALLBACK_PROFILE = "chat"
DEFAULT_STEP_BUDGET = 8  # steps (or commands) a task may take before efficiency starts to fall
DIFF_SCALE = 200  # changed diff lines at which diff_size is 0.5


@dataclass(frozen=True)
class LengthBand:
    """The target length of a step, in whitespace-separated words: 1.0 inside [min, max]; below,
    words/min; above, max/words (twice too long is 0.5); empty is 0."""

    min_words: int = 2
    max_words: int = 80

    def __post_init__(self) -> None:
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError("LengthBand needs 1 <= min_words <= max_words")

    def score(self, text: str) -> float:
        count = len(text.split())
        if count == 0:
            return 0.0
        if count < self.min_words:
            return count / self.min_words
        if count > self.max_words:
            return self.max_words / count
        return 1.0


@dataclass(frozen=True)
class Evidence:
    """What the dimensions read: the task, the result's steps (or its answer, when it has none), the
    PRM's step scores, and the environment signals (task metadata, overridden by result metadata)."""

    prompt: str
    reference: str | None
    steps: tuple[str, ...]
    answer: str
    step_scores: tuple[float, ...]
    metadata: dict[str, Any]
    length_band: LengthBand = LengthBand()
    step_budget: int = DEFAULT_STEP_BUDGET

    @property
    def units(self) -> tuple[str, ...]:
        """What the per-step dimensions score: the steps, or the answer alone when there are none."""
        return self.steps or ((self.answer,) if self.answer.strip() else ())


Dimension = Callable[[Evidence], list[float] | None]


def prm_dimension(evidence: Evidence) -> list[float]:
    """The PRM step scores; a result without steps has none, and scores 0 (nothing to credit)."""
    if not evidence.step_scores:
        return [0.0] * len(evidence.units)
    return [clamp01(s) for s in evidence.step_scores]


def halugate_dimension(evidence: Evidence) -> list[float]:
    source = Source.of(evidence.prompt, evidence.reference)
    return [halugate_score(unit, source) for unit in evidence.units]


def length_dimension(evidence: Evidence) -> list[float]:
    return [evidence.length_band.score(unit) for unit in evidence.units]


def success_dimension(evidence: Evidence) -> list[float] | None:
    """From `exit_codes` (one per step; another count gives every step the share that succeeded) or
    one `exit_code`: 1.0 for exit status 0, else 0.0."""
    meta, count = evidence.metadata, len(evidence.units)
    if "exit_codes" in meta:
        codes = _int_list(meta["exit_codes"], "exit_codes")
        if not codes:
            return None
        ok = [1.0 if code == 0 else 0.0 for code in codes]
        return ok if len(ok) == count else [mean(ok)] * count
    if "exit_code" in meta and meta["exit_code"] is not None:
        return [1.0 if _integer(meta["exit_code"], "exit_code") == 0 else 0.0] * count
    return None


def efficiency_dimension(evidence: Evidence) -> list[float] | None:
    """Steps taken (or `len(metadata["commands"])`) against `metadata["step_budget"]` (default
    DEFAULT_STEP_BUDGET): 1.0 within the budget, budget/taken beyond it. Nothing taken: no data."""
    meta = evidence.metadata
    commands = meta.get("commands")
    if commands is None:
        taken = len(evidence.steps)
    elif isinstance(commands, list):
        taken = len(commands)
    else:
        taken = _integer(commands, "commands")
    budget = _integer(meta["step_budget"], "step_budget") if "step_budget" in meta else evidence.step_budget
    if budget < 1:
        raise ValueError("metadata.step_budget: must be at least 1")
    if taken <= 0:
        return None
    return [1.0 if taken <= budget else budget / taken] * len(evidence.units)


def tests_dimension(evidence: Evidence) -> list[float] | None:
    """`tests_passed / tests_total`; no data without both, or when no test ran."""
    meta = evidence.metadata
    if "tests_passed" not in meta or "tests_total" not in meta:
        return None
    passed, total = (
        _integer(meta["tests_passed"], "tests_passed"),
        _integer(meta["tests_total"], "tests_total"),
    )
    if total == 0:
        return None
    if not 0 <= passed <= total:
        raise ValueError(f"metadata.tests_passed: {passed} is not within 0..tests_total ({total})")
    return [passed / total] * len(evidence.units)


def diff_size_dimension(evidence: Evidence) -> list[float] | None:
    """1 / (1 + changed/DIFF_SCALE), changed = `diff_lines`, or the +/- lines of a unified `diff`
    (not its ---/+++ headers): a 200-line change scores 0.5, an empty one 1.0."""
    meta = evidence.metadata
    if "diff_lines" in meta:
        changed = _integer(meta["diff_lines"], "diff_lines")
        if changed < 0:
            raise ValueError("metadata.diff_lines: must not be negative")
    elif isinstance(meta.get("diff"), str):
        changed = changed_lines(meta["diff"])
    else:
        return None
    return [1.0 / (1.0 + changed / DIFF_SCALE)] * len(evidence.units)


def changed_lines(diff: str) -> int:
    return sum(
        1
        for line in diff.splitlines()
        if line[:1] in "+-" and line and not line.startswith(("+++ ", "--- ", "+++\t", "---\t"))
    )


def action_validity_dimension(evidence: Evidence) -> list[float]:
    return [1.0 if parse_action(unit) is not None else 0.0 for unit in evidence.units]


def _integer(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"metadata.{key}: expected an integer (got {value!r})")
    return value


def _int_list(value: Any, key: str) -> list[int]:
    if not isinstance(value, list):
        raise ValueError(f"metadata.{key}: expected a list of integers")
    return [_integer(v, key) for v in value]


DIMENSIONS: dict[str, Dimension] = {
    "prm": prm_dimension,
    "halugate": halugate_dimension,
    "length": length_dimension,
    "success": success_dimension,
    "efficiency": efficiency_dimension,
    "tests": tests_dimension,
    "diff_size": diff_size_dimension,
    "action_validity": action_validity_dimension,
}
NEEDS = {
    "success": "metadata exit_code or exit_codes",
    "efficiency": "steps or metadata commands",
    "tests": "metadata tests_passed and tests_total (> 0)",
    "diff_size": "metadata diff or diff_lines",
}


# ----------------------------------------------------------------------------------------- halugate

SUPPORTED, UNSUPPORTED, CONTRADICTED = 1.0, 0.5, 0.0
NO_CLAIMS = 0.8


def claim_verdict(claim: str, source: Source) -> float:
    """1.0 supported, 0.5 unsupported, 0.0 contradicted, by the source (prompt and reference) only.

    Contradicted: written arithmetic that is wrong; a number or name the source lacks, in a claim
    that shares context words with a source sentence holding a number (or name) of its own; or the
    negation of a source sentence (one of the two has a negation word, and the claim's other content
    words are that sentence's).
    Supported: every number and name is grounded (or checked arithmetic), and at least half of the
    claim's content words are the source's. Anything else is unsupported.
    """
    claim_numbers, names = facts(claim)
    derived, wrong = equations(claim)
    if wrong:
        return CONTRADICTED
    loose_numbers = {n for n in claim_numbers if n not in derived and not source.grounds(n)}
    loose_names = {n for n in names if not source.grounds(n)}
    context = content_words(claim) - names - NEGATIONS
    for sentence in source.sentences:
        shared = context & (content_words(sentence) - NEGATIONS)
        if not shared:
            continue
        sentence_numbers, sentence_names = facts(sentence)
        if (loose_numbers and sentence_numbers) or (loose_names and sentence_names):
            return CONTRADICTED
        if _negates(claim, sentence, context):
            return CONTRADICTED
    if loose_numbers or loose_names:
        return UNSUPPORTED
    grounded = sum(source.grounds(w) for w in context)
    return SUPPORTED if not context or grounded / len(context) >= 0.5 else UNSUPPORTED


def _negates(claim: str, sentence: str, context: set[str]) -> bool:
    claim_negated = bool(NEGATIONS & set(words(claim))) or "n't" in claim.lower()
    sentence_negated = bool(NEGATIONS & set(words(sentence))) or "n't" in sentence.lower()
    if claim_negated == sentence_negated or len(context) < 2:
        return False
    return len(context & content_words(sentence)) / len(context) >= 0.8


def halugate_score(step: str, source: Source) -> float:
    """The mean verdict of the step's claims; 0.8 when it makes none."""
    verdicts = [claim_verdict(claim, source) for claim in claims(step)]
    return mean(verdicts) if verdicts else NO_CLAIMS


# ----------------------------------------------------------------------------------------- GUI actions


@dataclass(frozen=True)
class GuiAction:
    name: str
    args: tuple[Any, ...]


_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_STRING = r"\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')\s*"
_ACTIONS: dict[str, tuple[re.Pattern[str], bool]] = {
    # name: (argument pattern, may the numbers be negative)
    "click": (re.compile(rf"{_NUM},{_NUM}"), False),
    "double_click": (re.compile(rf"{_NUM},{_NUM}"), False),
    "type": (re.compile(_STRING), False),
    "key": (re.compile(_STRING), False),
    "scroll": (re.compile(rf"{_NUM},{_NUM}"), True),  # negative deltas scroll up or left
    "drag": (re.compile(rf"{_NUM},{_NUM},{_NUM},{_NUM}"), False),
    "wait": (re.compile(_NUM), False),
}
_CALL = re.compile(r"^`*\s*([a-z_]+)\((.*)\)\s*;?\s*`*\s*;?$", re.DOTALL)


def parse_action(step: str) -> GuiAction | None:
    """The GUI action a step ends with, or None. The grammar (the whole step, or its last non-empty
    line, optionally in backticks and with a trailing `;`):

        click(x, y) | double_click(x, y) | drag(x1, y1, x2, y2)   x, y >= 0
        scroll(dx, dy)                                              signed: negative scrolls up/left
        type("text") | key("name")                                  a quoted string; a key is non-empty
        wait(seconds)                                               seconds >= 0
    """
    lines = [line.strip() for line in step.strip().splitlines() if line.strip()]
    for candidate in (step.strip(), lines[-1] if lines else ""):
        action = _parse_call(candidate)
        if action is not None:
            return action
    return None


def _parse_call(text: str) -> GuiAction | None:
    call = _CALL.match(text)
    if call is None or call.group(1) not in _ACTIONS:
        return None
    name = call.group(1)
    pattern, signed = _ACTIONS[name]
    args = pattern.fullmatch(call.group(2))
    if args is None:
        return None
    if name in ("type", "key"):
        value = _string_literal(args.group(1))
        if value is None or (name == "key" and not value.strip()):
            return None
        return GuiAction(name, (value,))
    values = tuple(float(v) for v in args.groups())
    if not signed and any(v < 0 for v in values):
        return None
    return GuiAction(name, values)


def _string_literal(text: str) -> str | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


# ========================================================================================== combining


@dataclass(frozen=True)
class ScoredResult:
    """A result's scores. `step_scores` and `prm_score` are the PRM's (clamped; the mean of the steps,
    0.0 without steps); `outcome_score` is the profile's weighted score averaged over the steps;
    `dimensions` holds each dimension that had data, averaged over the steps; `reward` is what the
    trainer optimises (`reward_of`). `notes` says what was left out, and why."""

    step_scores: list[float]
    prm_score: float
    outcome_score: float
    dimensions: dict[str, float]
    profile: str
    verifier_score: float | None
    reward: float
    notes: tuple[str, ...] = field(default=())


def reward_of(outcome_score: float, verifier_score: float | None) -> float:
    """The trainer's reward: the mean of the outcome and the task's verifier when it has one, else the
    outcome. The manager's feedback is never part of it (rule 4)."""
    if verifier_score is None:
        return clamp01(outcome_score)
    return clamp01((clamp01(outcome_score) + clamp01(verifier_score)) / 2)


def profile_for(environment: str) -> tuple[str, tuple[str, ...]]:
    """The profile that scores an environment, and a note when it is the chat fallback."""
    if environment in PROFILES:
        return environment, ()
    return FALLBACK_PROFILE, (f"environment {environment!r} has no profile: scored with the chat profile",)


def combine(profile: str, evidence: Evidence) -> tuple[list[float], dict[str, float], list[str]]:
    """Per unit, sum(w * s) / sum(w) over the profile's dimensions that had data and did not fail.

    Returns (per-unit scores, each dimension's mean, notes). No dimension left: every unit 0.5.
    """
    per_dimension: dict[str, list[float]] = {}
    notes: list[str] = []
    for name in PROFILES[profile]:
        try:
            values = DIMENSIONS[name](evidence)
        except Exception as exc:  # a dimension that fails is left out, not the whole result
            notes.append(f"{name} failed: {_one_line(str(exc) or type(exc).__name__)}")
            continue
        if values is None:
            notes.append(f"{name}: no data ({NEEDS.get(name, 'nothing to read')})")
            continue
        per_dimension[name] = [clamp01(v) for v in values]
    weights = PROFILES[profile]
    total = sum(weights[name] for name in per_dimension)
    if total < 1e-12:
        return [NEUTRAL] * len(evidence.units), {}, notes
    units = [
        clamp01(sum(weights[name] * values[i] for name, values in per_dimension.items()) / total)
        for i in range(len(evidence.units))
    ]
    return units, {name: mean(values) for name, values in per_dimension.items()}, notes


class CombinedScorer:
    """Scores a result with the PRM and its environment's profile (reference §6, rule 3).

    A failed result scores 0 everywhere (no steps, no outcome, no reward): a crash is not a partial
    answer. A result without steps has PRM 0 and its answer stands in for the steps elsewhere; with
    neither steps nor answer, the outcome is 0.
    """

    def __init__(
        self,
        prm: PRMScorer,
        *,
        length_band: LengthBand | None = None,
        step_budget: int = DEFAULT_STEP_BUDGET,
    ) -> None:
        self.prm = prm
        self.length_band = length_band or LengthBand()
        self.step_budget = step_budget

    async def score(self, task: TaskEvent, result: ResultEvent, verifier_score: float | None) -> ScoredResult:
        profile, notes = profile_for(result.environment)
        verifier = None if verifier_score is None else clamp01(verifier_score)
        if result.status == "failed":
            return ScoredResult([], 0.0, 0.0, {}, profile, verifier, 0.0, (*notes, "failed result: scored 0"))
        answer = result.answer or split_reply(result.result)[1]
        prm = await self.prm.score_steps(task.prompt, result.steps)
        if prm.failures:
            notes += (
                f"prm: {len(prm.failures)} of {prm.calls} judge calls failed (last: {prm.failures[-1]})",
            )
        evidence = Evidence(
            prompt=task.prompt,
            reference=task.reference,
            steps=tuple(result.steps),
            answer=answer,
            step_scores=prm.scores,
            metadata={**task.metadata, **result.metadata},
            length_band=self.length_band,
            step_budget=self.step_budget,
        )
        if not evidence.units:
            notes += ("no steps and no answer: outcome 0",)
            return ScoredResult([], 0.0, 0.0, {}, profile, verifier, reward_of(0.0, verifier), notes)
        if not evidence.steps and "prm" in PROFILES[profile]:
            notes += ("no steps: prm 0, the answer stands in for the steps",)
        per_unit, dimensions, more_notes = combine(profile, evidence)
        outcome = clamp01(mean(per_unit))
        return ScoredResult(
            step_scores=list(prm.scores),
            prm_score=clamp01(mean(prm.scores)),
            outcome_score=outcome,
            dimensions=dimensions,
            profile=profile,
            verifier_score=verifier,
            reward=reward_of(outcome, verifier),
            notes=(*notes, *more_notes),
        )
