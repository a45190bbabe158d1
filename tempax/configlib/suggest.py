""""Did you mean": the nearest valid keys for an unknown config key, and the nearest recipe files for a missing
one, so an error names the fix and not only the mistake."""

from __future__ import annotations

import difflib
from pathlib import Path

from tempax.configlib.fields import all_keys, dotted_key


def unknown_key_message(key: str, siblings: list[str], path: str, root: tuple[type, str]) -> str:
    """The error for the unknown dotted `key` in the section at `path` whose valid keys are `siblings`: up to three
    near keys of that section, else the same key at another level of `root` (the outermost class and its path:
    `learning_rate` for `optimizer.learning_rate`), else the section's valid keys."""
    leaf = key.rsplit(".", 1)[-1]
    close = [dotted_key(path, s) for s in difflib.get_close_matches(leaf, siblings, n=3, cutoff=0.6)]
    if not close:
        # Maybe the key is right but at the wrong level ('learning_rate' instead of 'optimizer.learning_rate').
        leaves: dict[str, list[str]] = {}
        for k in all_keys(*root):
            leaves.setdefault(k.rsplit(".", 1)[-1], []).append(k)
        near = leaves.get(leaf) or [
            k for name in difflib.get_close_matches(leaf, list(leaves), n=3, cutoff=0.8) for k in leaves[name]
        ]
        close = near[:3]
    msg = f"unknown key '{key}'"
    if close:
        return msg + "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    where = f"under '{path}'" if path else "at the top level"
    return msg + f"; valid keys {where}: " + ", ".join(siblings)


def nearest_choice(value: object, choices: tuple[object, ...]) -> str:
    """"; did you mean 'x'?" naming the choice nearest `value` as text, or "" when none is near."""
    close = difflib.get_close_matches(str(value), [str(a) for a in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def nearest_recipes(path: Path) -> str:
    """"did you mean A, B? " naming the YAML files whose names are nearest a missing recipe's (in its folder, or in
    the folder whose name is nearest its folder's: `recipe/` for `recipes/`), or "" when none is near."""
    try:
        folder = path.parent
        if not folder.is_dir():
            parent = folder.parent
            near = difflib.get_close_matches(folder.name, [p.name for p in parent.iterdir() if p.is_dir()], n=1)
            if not near:
                return ""
            folder = parent / near[0]
        names = [p.name for p in folder.iterdir() if p.suffix in (".yaml", ".yml")]
    except OSError:  # a folder that cannot be listed: no suggestion, the message stands
        return ""
    near = difflib.get_close_matches(path.name, names, n=3)
    return f"did you mean {', '.join(str(folder / name) for name in near)}? " if near else ""
