"""Messages in the words the user typed: a setting given as a command-line flag is named as that flag.

The library validates its option records in their field names ("max_new_tokens must be a positive integer"), the
names a recipe and a Python caller use. On the command line the same value came from `--max-new-tokens`, so a
command building such a record from its flags renames the field that opens the message:

    with fields_as_flags(max_new_tokens="--max-new-tokens", group_size="--samples"):
        options = EvalOptions(max_new_tokens=args.max_new_tokens, group_size=args.samples)
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

from tempax.errors import TempaxError

_OPENING_NAME = re.compile(r"[A-Za-z_]\w*")


@contextlib.contextmanager
def fields_as_flags(**flags: str) -> Iterator[None]:
    """Re-raises a `TempaxError` whose message opens with one of the field names given (field=flag) as the same
    error opening with the flag instead; other errors pass unchanged."""
    try:
        yield
    except TempaxError as e:
        text = str(e)
        opening = _OPENING_NAME.match(text)
        if opening is None or opening.group() not in flags:
            raise
        raise type(e)(flags[opening.group()] + text[opening.end():]) from None
