"""Reading text without a model: the words, numbers, names, JSON, arithmetic and claims a text holds.

The offline judge, the hallucination check and the manager's offline feedback all read text with these.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .scale import NEUTRAL


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


_CONTRACTED = re.compile(r"(?:n't|'s|'re|'ve|'ll|'d|'m)$")


def content_words(text: str) -> set[str]:
    """The words of `text` and their pieces, without stopwords (contracted ones too: it's, don't)
    and single letters."""
    found: set[str] = set()
    for word in _WORD.findall(text):
        if _CONTRACTED.sub("", word.lower()) in STOPWORDS | {"ca", "wo", "sha"}:  # can't, won't, shan't
            continue
        found |= {p for p in word_parts(word) if len(p) > 1 and p not in STOPWORDS}
    return found


_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety"
UNIT_WORDS = {word: n for n, word in enumerate(f"{_UNITS} sixteen seventeen eighteen nineteen".split())}
TENS_WORDS = {word: 10 * n for n, word in enumerate(_TENS.split(), 2)}
NUMBER_WORDS = frozenset(UNIT_WORDS) | frozenset(TENS_WORDS)
_DIGIT_WORDS = "|".join(w for w, n in UNIT_WORDS.items() if 0 < n < 10)
_SPELLED = re.compile(
    rf"(?<![\w-])(?:({'|'.join(TENS_WORDS)})(?:[- ]({_DIGIT_WORDS}))?|({'|'.join(UNIT_WORDS)}))(?![\w-])",
    re.IGNORECASE,
)


def spelled_numbers(text: str) -> set[str]:
    """Numbers written as words, zero to ninety-nine ("forty-two"), normalised. A lone "one" is left
    out: it is a pronoun as often as a number ("one of the tools")."""
    found: set[str] = set()
    for match in _SPELLED.finditer(text):
        tens, unit, alone = (g.lower() if g else None for g in match.groups())
        if alone is not None:
            if alone != "one":
                found.add(str(UNIT_WORDS[alone]))
        elif tens is not None:
            found.add(str(TENS_WORDS[tens] + (UNIT_WORDS[unit] if unit else 0)))
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
# `x` between two numbers is multiplication too: people write "6 x 7" as often as "6 × 7" or "6 * 7".
_EQUATION = re.compile(
    r"((?:-?\d+(?:\.\d+)?\s*[-+*/×÷xX]\s*)+-?\d+(?:\.\d+)?)"  # numbers joined by operators
    r"\s*=\s*(-?\d+(?:\.\d+)?)"  # = the claimed result
    r"(?![\d.]*\s*[-+*/×÷xX]\s*\d)"  # ... that is not itself the start of more arithmetic
)
# An expression asked about ("What is 6 x 7?"): a minus only with spaces round it, so dates and ranges
# (2024-01-05, 3-4 days) are not sums.
_EXPRESSION = re.compile(
    r"(?<![\w.])-?\d+(?:\.\d+)?(?:(?:\s*[+*/×÷xX]\s*|\s+-\s+)-?\d+(?:\.\d+)?)+"
    r"(?!\w|\.\d|\s*=)"  # a whole expression (not 0x1F), and not one a claim states the value of
)
_WORD_OPERATORS = {"plus": "+", "minus": "-", "times": "*", "multiplied by": "*", "divided by": "/"}
_WORD_OPERATOR = re.compile(rf"(?<=\d)\s+({'|'.join(_WORD_OPERATORS)})\s+(?=-?\d)", re.IGNORECASE)


def _evaluate(expression: str) -> float:
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        raise ValueError("not arithmetic")

    # Only digits, dots, spaces and operators reach here (the patterns above): any x is multiplication.
    plain = expression.replace("×", "*").replace("÷", "/").replace("x", "*").replace("X", "*")
    return walk(ast.parse(plain, mode="eval").body)


def equations(text: str) -> tuple[set[str], int]:
    """Written arithmetic (`12 + 30 = 42`, `6 × 7 = 42`, `6 x 7 = 42`): the results that check out, and
    how many do not. An expression that continues an operator before it (`x - 5 + 3 = ...`) is not judged."""
    right: set[str] = set()
    wrong = 0
    for match, good in _judged_equations(text):
        if good:
            right.add(normalise_number(match.group(2)))
        else:
            wrong += 1
    return right, wrong


def checked_numbers(text: str) -> set[str]:
    """Every number of the written arithmetic in `text` that checks out, operands and result: a true
    sum is no invention, wherever its numbers came from."""
    found: set[str] = set()
    for match, good in _judged_equations(text):
        if good:
            found |= set(numbers(match.group(0)))
    return found


_CONTINUES = re.compile(r"(?:[-+*/×÷(=]|\d\s*[xX])$")  # an operator (or a number times) just before


def _judged_equations(text: str) -> list[tuple[re.Match[str], bool]]:
    judged = []
    for match in _EQUATION.finditer(text):
        if _CONTINUES.search(text[: match.start()].rstrip()):
            continue
        try:
            value = _evaluate(match.group(1))
        except (ValueError, ArithmeticError, SyntaxError, RecursionError):  # not judged: too odd or too big
            continue
        judged.append((match, math.isclose(value, float(match.group(2)), rel_tol=1e-6, abs_tol=1e-9)))
    return judged


def arithmetic(text: str) -> set[str]:
    """The values of the arithmetic a text asks about (`What is 6 x 7?`, `15 divided by 3`): what a
    right answer states, though the text never writes it."""
    spelled = _WORD_OPERATOR.sub(lambda m: f" {_WORD_OPERATORS[m.group(1).lower()]} ", text)
    values: set[str] = set()
    for match in _EXPRESSION.finditer(spelled):
        try:
            value = _evaluate(match.group(0))
        except (ValueError, ArithmeticError, SyntaxError, RecursionError):
            continue
        if math.isfinite(value):
            values.add(normalise_number(repr(value)))
    return values


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


_WORDLIKE = re.compile(r"^[\w\"'{}\[\]:;,.!?()\-+*/=<>@#$%&|~^`]+$")
_LETTERS = re.compile(r"[^\W\d_]{4,}")


def readability(text: str) -> float:
    """The share of the text's whitespace-separated words that read as words. Punctuation standing
    alone ("-", "!!") is neither; a text of nothing else reads as nothing (0.0); no words at all: 1.0."""
    judged = [_reads(word) for word in text.split() if not _punctuation(word)]
    if not judged:
        return 0.0 if text.strip() else 1.0
    return sum(judged) / len(judged)


def readable_words(text: str) -> int:
    """How many of the text's words read as words."""
    return sum(1 for word in text.split() if not _punctuation(word) and _reads(word))


def _punctuation(word: str) -> bool:
    return not any(c.isalnum() or not c.isprintable() or c == "\ufffd" for c in word)


def _reads(word: str) -> bool:
    """Printable, no replacement character, not too long, and every long run of letters has a vowel
    (what a model's byte soup rarely manages)."""
    if "\ufffd" in word or not _WORDLIKE.match(word) or len(word) > 40:
        return False
    runs = _LETTERS.findall(word)
    return all(len(run) < 20 and any(c in "aeiouyAEIOUY" for c in run) for run in runs)


def word_share(text: str) -> float:
    """Letters and digits over the visible characters: low for symbol soup."""
    visible = [c for c in text if not c.isspace()]
    return sum(c.isalnum() for c in visible) / len(visible) if visible else 0.0


_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")
_CLAUSE = re.compile(r",\s*(?:and|but|while|whereas)\s+|\s+(?:but|whereas)\s+", re.IGNORECASE)


def claims(text: str, min_words: int = 2) -> list[str]:
    """The sentences and clauses of `text` that assert something checkable: a number, a name, or at
    least `min_words` content words, in text that reads as text (at least half its words read as
    words: a model's byte soup asserts nothing, whatever city names float in it)."""
    found = []
    for sentence in _SENTENCE_END.split(_LIST_MARKER.sub("", text)):
        for clause in _CLAUSE.split(sentence):
            clause = clause.strip()
            if not clause or readability(clause) < 0.5:
                continue
            checkable = numbers(clause) or entities(clause) or len(content_words(clause)) >= min_words
            if checkable:
                found.append(clause)
    return found


def facts(text: str) -> tuple[set[str], set[str]]:
    """What a text asserts that can be checked: (numbers, names), names lower-cased."""
    return set(numbers(text)), entities(text)


_IDENTIFIER = re.compile(r"(?<![\w-])[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+(?![\w-])")


def identifiers(text: str) -> set[str]:
    """snake_case names (`get_weather`, `find_hotels`), lower-cased: a tool, function or key that is
    either the one asked for or another."""
    return {match.lower() for match in _IDENTIFIER.findall(text)}


SHORT_ANSWER_WORDS = 4  # a reference this short is the answer's own words ("blue", "carbon dioxide")


@dataclass(frozen=True)
class Source:
    """What claims are checked against: the task prompt (and the task's reference, when given).

    `numbers` holds the values of the arithmetic the prompt asks about as well. `expected` is what a
    right answer states, by kind: "number" (the reference's numbers and the prompt's arithmetic),
    "name", "identifier", and "term" (a reference of SHORT_ANSWER_WORDS words or fewer with no fact
    in it: "blue", "carbon dioxide"). Another fact of one of those kinds, in place of the expected
    one, is a wrong answer.
    """

    text: str
    words: frozenset[str]
    numbers: frozenset[str]
    sentences: tuple[str, ...]
    expected: dict[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def of(cls, prompt: str, reference: str | None = None) -> Source:
        """The source of a task, made once per prompt and reference: it is read, never changed, and the
        scorer asks for it three times a result (0.5 ms of the manager's CPU a task,
        bench/bench_agents.py)."""
        return _source_of(prompt, reference)

    @classmethod
    def made(cls, prompt: str, reference: str | None = None) -> Source:
        text = prompt if not reference else f"{prompt}\n{reference}"
        computed = arithmetic(prompt)
        expected = {"number": set(computed)}
        if reference:
            expected["number"] |= set(numbers(reference))
            expected["name"] = entities(reference)
            expected["identifier"] = identifiers(reference)
            if not any(expected.values()) and len(reference.split()) <= SHORT_ANSWER_WORDS:
                expected["term"] = content_words(reference)
        return cls(
            text,
            frozenset(salient_terms(text) | computed),
            frozenset(set(numbers(text)) | computed),
            tuple(claims(text, 1)),
            {kind: frozenset(found) for kind, found in expected.items() if found},
        )

    @property
    def answer(self) -> frozenset[str]:
        """Every fact and term a right answer states."""
        return frozenset().union(*self.expected.values())

    def grounds(self, fact: str) -> bool:
        """A fact is grounded when the source names it, or (a name like `get_weather`) one of its parts."""
        return (
            fact in self.words
            or fact in self.numbers
            or any(len(part) > 2 and part in self.words for part in word_parts(fact) - STOPWORDS)
        )


@functools.lru_cache(maxsize=1024)
def _source_of(prompt: str, reference: str | None) -> Source:
    return Source.made(prompt, reference)


def shorten(text: str, limit: int = 80) -> str:
    """`text` on one line, cut to `limit` characters: a judge's reply or an error, in a note or a log."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
