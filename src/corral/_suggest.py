""""Did you mean …?" for a mistyped name (a provider, a configuration key)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'docker'?)"`` for the choice closest to ``word``, or ``""`` when no
    choice is close (or ``word`` is not a string). Meant to follow the quoted wrong name."""
    import difflib  # start-up cost (~0.6 ms of a takeover's imports): the error path only

    if not isinstance(word, str) or not word:
        return ""
    close = difflib.get_close_matches(word, sorted(set(choices)), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
