"""The hallucination check: each claim of a step against the task's prompt and reference."""

from __future__ import annotations

from .scale import mean
from .text import NEGATIONS, Source, claims, content_words, equations, facts, words

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
