"""The package's import layering, read from the source with `ast` (nothing is imported):

    cli -> algorithms -> rl -> {train, generate, rewards, data, eval} -> models -> {ops, parallel}
    cli -> serve -> generate
                            rl -> envs -> {rewards, models}

with the top-level helpers `errors`, `configlib` and `progress` and the runtime layer `runtime` (CPU identity,
process set-up, the cache folder; `tempax/__init__`'s lazy loaders aside) underneath as the foundation every layer
may use. `ops` (the numerical ops and their per-platform variants) sits under `models` beside `parallel` and
imports neither: arrays in, arrays out, so the losses of the layers above may use it too. Each package may import
only what `MAY_IMPORT` lists for it:
no upward arrow, no sideways arrow other than the ones stated there (the RL layer samples with `generate`, trains
with `train` and scores with `rewards`; evaluation generates and scores). The environments of agentic RL
(`envs`: tool calls, tools, the environment protocol) sit below the RL layer: an environment scores with
`rewards` and renders with the model's tokenizer but never samples or trains, so the RL layer drives
environments and not the reverse. Function-local imports (and
`if TYPE_CHECKING:` ones) count like module-level ones. Inside `algorithms`, an algorithm package
(`algorithms/<name>/`) imports no other algorithm package; the shared modules beside them (`common`, `run`,
`registry`, `recommend`, `episode_eval`) import none. Imports that run when a module is imported (module level, not under
`if TYPE_CHECKING:`) form no cycle.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tempax")
FOUNDATION = {"errors", "configlib", "progress", "runtime"}
MIDDLE = {"train", "generate", "rewards", "data", "eval"}
LOWER = {"models", "ops", "parallel"}
MAY_IMPORT: dict[str, set[str]] = {
    "cli": {"algorithms", "rl", "envs", "serve", *MIDDLE, *LOWER},
    "serve": {"generate", *LOWER},  # the HTTP server and its batcher, on the generation engine
    "algorithms": {"rl", "envs", *MIDDLE, *LOWER},
    "rl": {"envs", "train", "generate", "rewards", "data", *LOWER},
    "envs": {"rewards", *LOWER},
    "eval": {"generate", "rewards", "data", *LOWER},
    "train": set(LOWER),
    "generate": set(LOWER),
    "rewards": set(LOWER),
    "data": set(LOWER),
    "models": {"ops", "parallel"},
    "ops": set(),  # jax and the foundation only: models, parallel and everything above build on it
    "parallel": set(),
    "configlib": {"errors"},
    "progress": set(),  # progress bars: tqdm and the standard library only
    "runtime": {"errors"},  # below every layer: the standard library and the error types only
    "errors": set(),
    "__init__": {"models", "algorithms"},  # `tempax.load`, `tempax.train` and friends, imported on first use
}
SHARED_ALGORITHM_MODULES = {"common", "run", "registry", "recommend", "episode_eval"}


def module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel.removesuffix(".__init__")


def all_modules() -> dict[str, str]:
    """module name -> file path of every module under tempax/."""
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                out[module_name(path)] = path
    return out


def imports_of(path: str, modules: dict[str, str]) -> list[tuple[str, int, bool]]:
    """(imported tempax module, line, at module level) of every import in a file; `from a import b` names the
    module a.b when b is one."""
    tree = ast.parse(open(path).read(), path)
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # imports inside module-level try/if blocks run at import time; TYPE_CHECKING ones never
        if isinstance(node, (ast.If, ast.Try)) and not _is_type_checking(node):
            top_level.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    found = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = list(dict.fromkeys(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                                         else node.module for a in node.names))
        for target in targets:
            if target == "tempax" or target.startswith("tempax."):
                found.append((target, node.lineno, id(node) in top_level))
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def algorithm_of(module: str) -> str | None:
    """The algorithm package a module belongs to (`tempax.algorithms.<name>.*`), or the shared module's name."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "algorithms" else None


def test_every_package_is_placed_in_a_layer():
    packages = {package_of(m) for m in all_modules()}
    assert packages <= set(MAY_IMPORT), f"new top-level packages need a layer in MAY_IMPORT: {packages - set(MAY_IMPORT)}"


def test_imports_point_down_the_layers():
    modules = all_modules()
    wrong = []
    for module, path in sorted(modules.items()):
        src = package_of(module)
        for target, line, _ in imports_of(path, modules):
            dst = package_of(target)
            if dst != src and dst not in FOUNDATION and dst not in MAY_IMPORT[src]:
                wrong.append(f"{os.path.relpath(path, os.path.dirname(ROOT))}:{line} ({src}) imports {target} ({dst})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_algorithm_imports_another():
    modules = all_modules()
    wrong = []
    for module, path in sorted(modules.items()):
        own = algorithm_of(module)
        if own is None:
            continue
        for target, line, _ in imports_of(path, modules):
            other = algorithm_of(target)
            if other is None or other == own or other in SHARED_ALGORITHM_MODULES:
                continue
            wrong.append(f"{os.path.relpath(path, os.path.dirname(ROOT))}:{line} imports {target}")
    assert not wrong, "an algorithm imports another (move what they share below them):\n" + "\n".join(wrong)


def test_no_import_cycles_at_module_level():
    modules = all_modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for target, _, top in imports_of(path, modules):
            if top and target in modules and target != module:
                graph[module].add(target)
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for module in sorted(modules):
        if module not in state:
            visit(module, [])
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_function_local_and_from_imports(tmp_path):
    """A function-local `from tempax.cli.main import main` inside a models file is found, named as the module it
    imports, and flagged as not module-level; a module-level one is flagged as such."""
    modules = {"tempax.cli.main": "", "tempax.models.decoder": ""}
    path = tmp_path / "m.py"
    path.write_text("import tempax.models.decoder\n\ndef f():\n    from tempax.cli.main import main\n")
    assert imports_of(str(path), modules) == [("tempax.models.decoder", 1, True), ("tempax.cli.main", 4, False)]
