"""A deterministic English-like corpus for the GPT example (no downloads, nothing to license).

Sentences come from a small grammar (subject-verb agreement, adjectives,
prepositional phrases, relative clauses, quoted speech) mixed with lines of
integer arithmetic whose results are correct, so a byte-level model has
spelling, syntax and a little arithmetic to learn. The same seed gives the
same bytes on every machine (Python's `random.Random` is platform-independent).
"""
from __future__ import annotations

import random

NOUNS = (
    "river", "lantern", "merchant", "garden", "sailor", "teacher", "window", "mountain", "letter", "engine",
    "captain", "forest", "painter", "village", "clock", "harbor", "student", "bridge", "market", "soldier",
    "kitchen", "doctor", "island", "farmer", "library", "storm", "horse", "castle", "singer", "orchard",
)
ADJECTIVES = (
    "old", "quiet", "bright", "narrow", "heavy", "gentle", "crooked", "golden", "distant", "careful",
    "broken", "patient", "silver", "hungry", "ancient", "restless", "small", "wide", "honest", "cold",
)
VERBS = (  # (third person singular, plural)
    ("watches", "watch"), ("follows", "follow"), ("remembers", "remember"), ("carries", "carry"),
    ("finds", "find"), ("builds", "build"), ("answers", "answer"), ("crosses", "cross"),
    ("paints", "paint"), ("leaves", "leave"), ("guards", "guard"), ("visits", "visit"),
)
PREPOSITIONS = ("near", "behind", "under", "beyond", "across", "beside", "inside", "above")
SPEAKERS = ("the captain", "the teacher", "the old farmer", "my sister", "the doctor", "a stranger")


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") and noun[-2] not in "aeiou" else noun + "s"


def _noun_phrase(rng: random.Random) -> tuple[str, bool]:
    """('the quiet rivers', plural?)"""
    plural = rng.random() < 0.35
    noun = _plural(rng.choice(NOUNS)) if plural else rng.choice(NOUNS)
    adjectives = rng.sample(ADJECTIVES, k=rng.choice((0, 0, 1, 1, 2)))
    article = "the" if plural or rng.random() < 0.6 else ("an" if (adjectives or [noun])[0][0] in "aeiou" else "a")
    return " ".join([article, *adjectives, noun]), plural


def _clause(rng: random.Random) -> str:
    subject, plural = _noun_phrase(rng)
    if rng.random() < 0.25:
        rel_verb = rng.choice(VERBS)[1 if plural else 0]
        subject += f" that {rel_verb} {_noun_phrase(rng)[0]}"
    verb = rng.choice(VERBS)[1 if plural else 0]
    clause = f"{subject} {verb} {_noun_phrase(rng)[0]}"
    if rng.random() < 0.5:
        clause += f" {rng.choice(PREPOSITIONS)} {_noun_phrase(rng)[0]}"
    return clause


def _sentence(rng: random.Random) -> str:
    clause = _clause(rng)
    if rng.random() < 0.3:
        clause += f", and {_clause(rng)}"
    sentence = clause[0].upper() + clause[1:] + "."
    if rng.random() < 0.15:
        sentence = f'"{sentence[:-1]}," said {rng.choice(SPEAKERS)}.'
    return sentence


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-")
    return f"{a} {op} {b} = {a + b if op == '+' else a - b}."


def make_corpus(num_bytes: int, seed: int = 1234) -> bytes:
    """At least `num_bytes` bytes of ASCII text: paragraphs of sentences, some arithmetic lines."""
    if not isinstance(num_bytes, int) or num_bytes < 1:
        raise ValueError(f"make_corpus: argument 'num_bytes' must be an int >= 1, got {num_bytes!r}")
    rng = random.Random(seed)
    paragraphs, size = [], 0
    while size < num_bytes:
        lines = [_arithmetic(rng) if rng.random() < 0.1 else _sentence(rng) for _ in range(rng.randint(3, 7))]
        paragraphs.append(" ".join(lines))
        size += len(paragraphs[-1]) + 2
    return "\n\n".join(paragraphs).encode("ascii")


if __name__ == "__main__":
    print(make_corpus(1200).decode())
