"""Stop strings: where a completion's text ends, and which of its tokens produced that text.

A stop string can span several tokens or start in the middle of one, so it is found in decoded text, not in
ids. The text is cut right before the earliest occurrence of any stop string; the tokens kept are the shortest
prefix whose text already contains that occurrence (so the token that completed the stop string is kept and
masked in, as the model did produce it, and everything after it is dropped).
"""

from __future__ import annotations

from typing import Callable, Sequence

Decode = Callable[[Sequence[int]], str]


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """Index of the earliest occurrence of any of `stops` in `text`, or None."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def cut_at_stop(ids: Sequence[int], decode: Decode, stops: Sequence[str]) -> tuple[str, int, bool]:
    """(text, number of tokens kept, whether a stop string was found) for one completion.

    Without a stop string the text is `decode(ids)` and every token is kept. With one, the text is cut before
    it and the tokens are cut after the first token whose prefix text contains it (found by bisection: a
    prefix's text grows with the prefix).
    """
    text = decode(ids)
    at = find_stop(text, stops) if stops else None
    if at is None:
        return text, len(ids), False
    lo, hi = 1, len(ids)  # the shortest prefix whose text holds a stop string at or before `at`
    while lo < hi:
        mid = (lo + hi) // 2
        hit = find_stop(decode(ids[:mid]), stops)
        if hit is not None and hit <= at:
            hi = mid
        else:
            lo = mid + 1
    return text[:at], lo, True
