"""tempax.generate.stops: where a completion's text ends at a stop string, and which tokens made that text."""

from __future__ import annotations

from tempax.generate.stops import cut_at_stop, find_stop

# A toy detokenizer: token i is the text PIECES[i]. A stop string may span tokens or start inside one.
PIECES = ["Ans", "wer", ": 4", "2\n", "##", "#", " more", "EN", "D"]


def decode(ids):
    return "".join(PIECES[i] for i in ids)


def test_find_stop_is_the_earliest_of_any_stop_string():
    assert find_stop("a###b END", ["END", "###"]) == 1
    assert find_stop("abc", ["x", "y"]) is None
    assert find_stop("END", ["END"]) == 0


def test_a_stop_string_spanning_tokens_keeps_the_token_that_completed_it():
    """ids 0..6 decode to "Answer: 42\\n### more"; "###" starts at 11, made by tokens 4 ("##") and 5 ("#"): the
    text is cut before it ("Answer: 42\\n") and 6 tokens are kept (through "#", the one that completed it)."""
    text, kept, found = cut_at_stop([0, 1, 2, 3, 4, 5, 6], decode, ["###"])
    assert (text, kept, found) == ("Answer: 42\n", 6, True)


def test_the_earliest_stop_wins_and_a_stop_inside_one_token_cuts_after_that_token():
    """"Answer: 42\\n" then "EN"+"D": with stops ["END", ": 4"] the earliest is ": 4" at 6, inside token 2 (": 4"):
    text "Answer", 3 tokens kept."""
    assert cut_at_stop([0, 1, 2, 3, 7, 8], decode, ["END", ": 4"]) == ("Answer", 3, True)


def test_no_stop_keeps_everything():
    assert cut_at_stop([0, 1, 2], decode, ["###"]) == ("Answer: 4", 3, False)
    assert cut_at_stop([0, 1, 2], decode, []) == ("Answer: 4", 3, False)
