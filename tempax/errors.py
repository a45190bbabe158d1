"""User-facing errors.

Every problem a user can cause (a missing file, a wrong config key, a malformed row, a model that does not
fit) is raised as a `TempaxError` whose message names the thing and the fix. The CLI prints these messages
without a traceback; anything else is a bug in tempax and keeps its traceback.
"""

from __future__ import annotations


class TempaxError(Exception):
    """An error caused by input the user can fix; the message says what and how."""


class ConfigError(TempaxError):
    """A recipe or override names an unknown key or holds a value of the wrong type."""


class CheckpointError(TempaxError):
    """A checkpoint folder or file is missing, truncated or does not match its config."""


class DataError(TempaxError):
    """A dataset file is missing or too many of its rows are malformed."""


class GenerationError(TempaxError):
    """A generation request cannot be served (empty prompt, prompt longer than the cache, bad sampling knob)."""
