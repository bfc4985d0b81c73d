"""The hallucination check: each claim of a reply against the task's prompt and reference.

It ranks a right answer above a wrong one above one that does not answer: a reply that says nothing
about the task (no claim, byte soup, or claims about other things) grounds nothing and scores 0; a
wrong answer at least answers the question asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from .scale import mean
from .text_reading import (
    DISCOURSE,
    NEGATIONS,
    NUMBER_WORDS,
    Source,
    checked_numbers,
    claims,
    content_words,
    equations,
    facts,
    identifiers,
    spelled_numbers,
    word_parts,
    words,
)

SUPPORTED, UNSUPPORTED, CONTRADICTED, IRRELEVANT = 1.0, 0.5, 0.25, 0.0
# Words that frame an answer without saying what it is about ("the product is 42", "the sum equals 9").
FRAMING = DISCOURSE | {
    "product",
    "sum",
    "total",
    "difference",
    "quotient",
    "equals",
    "equal",
    "value",
    "makes",
    "gives",
}


def claim_verdict(claim: str, source: Source) -> float:
    """1.0 supported, 0.5 unsupported, 0.25 contradicted, 0.0 irrelevant, by the source (prompt and
    reference) only.

    A claim with nothing of the source's (no grounded word, number or name) is a bare answer when it
    has one word, number or name of its own, framed or not ("The answer is 41", "Lyon", "green"):
    contradicted when that is the kind of thing the answer is, unsupported when the source does not
    say what the answer is, else irrelevant; any other such claim is irrelevant (it speaks of
    something else, or of nothing).
    Contradicted: written arithmetic that is wrong; a number, name or identifier the source lacks
    where the answer is one of that kind (the reference's, or the prompt's arithmetic) and the claim
    states none of the answer's facts of that kind; a number or name the source lacks, in a claim
    that shares context words with a source sentence holding a number (or name) of its own, and
    states nothing of the answer; the negation of a source sentence; or, where the answer is a short
    phrase ("blue"), a claim on the task's subject that brings words of its own and not the answer's.
    Supported: nothing loose, and it states the answer, or a grounded fact, or at least half of its
    content words are the source's. Anything else is unsupported.
    """
    claim_numbers, names = facts(claim)
    claim_numbers |= spelled_numbers(claim)
    names = (names - NUMBER_WORDS) | identifiers(claim)  # "Six" opening a sentence is a number
    if equations(claim)[1]:
        return CONTRADICTED
    checked = checked_numbers(claim)
    loose_numbers = {n for n in claim_numbers if n not in checked and not source.grounds(n)}
    loose_names = {n for n in names if not _grounded_name(n, source)}
    name_words = {part for name in names for part in word_parts(name)}
    context = content_words(claim) - name_words - NEGATIONS - NUMBER_WORDS
    grounded = {w for w in context if source.grounds(w)}
    grounded_facts = (claim_numbers - loose_numbers) | (names - loose_names)
    if not grounded and not grounded_facts:
        own = (context - FRAMING) | loose_numbers | loose_names
        if len(own) != 1:
            return IRRELEVANT
        if _wrong_answer(loose_numbers, loose_names, set(), source) or (
            own & context and "term" in source.expected
        ):
            return CONTRADICTED
        return IRRELEVANT if source.expected else UNSUPPORTED
    stated = source.answer & (grounded_facts | grounded)
    if _wrong_answer(loose_numbers, loose_names, stated, source):
        return CONTRADICTED
    for sentence in source.sentences:
        shared = context & (content_words(sentence) - NEGATIONS)
        if not shared:
            continue
        sentence_numbers, sentence_names = facts(sentence)
        conflicting = (loose_numbers and sentence_numbers) or (loose_names and sentence_names)
        if conflicting and not stated:  # beside the right answer, a new fact is only unsupported
            return CONTRADICTED
        if _negates(claim, sentence, context):
            return CONTRADICTED
    if loose_numbers or loose_names:
        return UNSUPPORTED
    if "term" in source.expected and not stated and grounded and context - grounded - FRAMING:
        return CONTRADICTED
    if stated or grounded_facts or len(grounded) / len(context) >= 0.5:
        return SUPPORTED
    return UNSUPPORTED


def _grounded_name(name: str, source: Source) -> bool:
    """Where the answer is an identifier, another is grounded only as a whole (`get_time` is not
    `get_weather`); else a name is grounded as the source says (`get_weather` by "weather")."""
    if "_" in name and "identifier" in source.expected:
        return name in source.words
    return source.grounds(name)


def _wrong_answer(loose_numbers: set[str], loose_names: set[str], stated: Set[str], source: Source) -> bool:
    """A loose fact where the answer holds one of its kind, and the claim states none of that kind's
    expected facts: another number, identifier or name in the answer's place (a loose name where the
    answer is a word too: "Green." for "blue")."""
    expected = source.expected

    def instead(kind: str, loose: set[str]) -> bool:
        return bool(loose) and kind in expected and not expected[kind] & stated

    loose_identifiers = {n for n in loose_names if "_" in n}
    loose_plain = loose_names - loose_identifiers
    return (
        instead("number", loose_numbers)
        or instead("identifier", loose_identifiers)
        or instead("name", loose_plain)
        or instead("term", loose_plain)
    )


def _negates(claim: str, sentence: str, context: set[str]) -> bool:
    claim_negated = bool(NEGATIONS & set(words(claim))) or "n't" in claim.lower()
    sentence_negated = bool(NEGATIONS & set(words(sentence))) or "n't" in sentence.lower()
    if claim_negated == sentence_negated or len(context) < 2:
        return False
    return len(context & content_words(sentence)) / len(context) >= 0.8


def halugate_score(texts: str | Iterable[str], source: Source) -> float:
    """The check of a reply (its steps and answer, each claim counted once): the mean verdict of its
    claims, a claim about something else counted as unsupported; 0.0 when no claim bears on the
    task at all (no claims, or only irrelevant ones)."""
    pieces = [texts] if isinstance(texts, str) else list(texts)
    found = list(dict.fromkeys(claim for piece in pieces for claim in claims(piece, min_words=1)))
    verdicts = [claim_verdict(claim, source) for claim in found]
    if all(v == IRRELEVANT for v in verdicts):
        return IRRELEVANT
    return mean([UNSUPPORTED if v == IRRELEVANT else v for v in verdicts])
