"""tempax.configlib.callables: `import_callable` finds `module:name` and `file.py:name` and names what is wrong."""

from __future__ import annotations

import pytest

from tempax.configlib.callables import import_callable
from tempax.errors import ConfigError


def test_import_callable_reads_a_file_a_module_and_names_what_is_wrong(tmp_path, monkeypatch):
    """`file.py:name` relative to the working directory, `module:name` with the working directory on the path
    (the `tempax` script's own folder is what Python puts first), and one-line errors for each bad reference."""
    (tmp_path / "my_rewards.py").write_text("def exact(prompts, completions, **columns):\n    return [1.0]\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('bad module')\n")
    monkeypatch.chdir(tmp_path)
    assert import_callable("my_rewards.py:exact", key="k")([], ["x"]) == [1.0]
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    assert import_callable("my_rewards:exact", key="k")([], ["x"]) == [1.0]
    cases = [("nothing", "is not 'package.module:name'"), ("missing.py:f", "no file missing.py"),
             ("my_rewards.py:nope", "has no 'nope'; it defines exact"),
             ("broken.py:f", "cannot import 'broken.py:f' \\(RuntimeError: bad module\\)"),
             ("tempax_no_such_module:f", "cannot import 'tempax_no_such_module:f'")]
    for ref, message in cases:
        with pytest.raises(ConfigError, match=f"^k: .*{message}"):
            import_callable(ref, key="k")
