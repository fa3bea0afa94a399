"""Argument checks shared by fp8mp's config objects (recipes, policies, trainer config)."""
from __future__ import annotations


def check_int(subject: str, value, minimum: int) -> int:
    """`value` if it is an int >= minimum, else ValueError "<subject> must be an int >= <minimum>, got ...".

    bool is an int subclass, but margin=True is a mistake, not a margin of 1: it is refused.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{subject} must be an int >= {minimum}, got {value!r}")
    return value
