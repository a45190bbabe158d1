"""The package's import layering, read from the source with `ast` (nothing is imported):

    cli -> {experiments, export} -> algorithms -> rl -> {train, generate, rewards, data, eval} -> models -> {ops, parallel}
    cli -> serve -> generate
                            rl -> envs -> {rewards, models}

with the top-level helpers `errors`, `configlib` and `progress` and the runtime layer `runtime` (CPU identity,
process set-up, the cache folder; `tempax/__init__`'s lazy loaders aside) underneath as the foundation every layer
may use. `ops` (the numerical ops and their per-platform variants) sits under `models` beside `parallel` and
imports neither: arrays in, arrays out, so the losses of the layers above may use it too. `experiments` (stages,
pipelines, budgets, comparison tables: the demos) and `export` (exported models, model cards, model facts) read
the algorithms' records and runs, so they sit above `algorithms`, beside each other, under `cli`. Each package may
import only what `MAY_IMPORT` lists for it:
no upward arrow, no sideways arrow other than the ones stated there (the RL layer samples with `generate`, trains
with `train` and scores with `rewards`; evaluation generates and scores). The environments of agentic RL
(`envs`: tool calls, tools, the environment protocol) sit below the RL layer: an environment scores with
`rewards` and renders with the model's tokenizer but never samples or trains, so the RL layer drives
environments and not the reverse. Function-local imports (and
`if TYPE_CHECKING:` ones) count like module-level ones. Inside `algorithms`, an algorithm package
(`algorithms/<name>/`) imports no other algorithm package; the shared modules beside them (`common`, `run`,
`registry`, `run_dirs`, `recommend`, `episode_eval`, `validate`) import none.

No cycle: no module of tempax imports itself back through other modules of tempax, counting every import —
module level, function-local and under `if TYPE_CHECKING:` (a type-only arrow back still makes a reader follow the
two modules both ways, and it is how the loop and its hooks, or a config and the code it builds with, grow
together). Modules, not packages, are the nodes (`from tempax.train.config import X` is an arrow to
`tempax.train.config`, not to `tempax.train`'s `__init__`). The only exceptions are the groups in
`KNOWN_CYCLES`, each with the change that removes it; a listed group that no longer forms a cycle fails the
test too, so the list only shrinks.
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
    "cli": {"experiments", "export", "algorithms", "rl", "envs", "serve", *MIDDLE, *LOWER},
    "experiments": {"algorithms", "rl", "envs", *MIDDLE, *LOWER},  # the demos: stages chained with budgets
    "export": {"algorithms", "train", *LOWER},  # exported models and their cards, read from runs and records
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
SHARED_ALGORITHM_MODULES = {"common", "run", "registry", "run_dirs", "recommend", "episode_eval", "validate"}
# Cycles that exist and are removed by a change of their own (the modules of each, and why it is still here).
KNOWN_CYCLES: dict[frozenset[str], str] = {
    frozenset({"tempax.models.tokenizer", "tempax.models.gguf_tokenizer"}):
        "gguf_tokenizer imports tokenizer.import_transformers inside a function; that helper moves below both",
}


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


def import_graph(modules: dict[str, str]) -> dict[str, dict[str, int]]:
    """module -> {tempax module it imports: the line of the first such import}, every kind of import counted."""
    graph: dict[str, dict[str, int]] = defaultdict(dict)
    for module, path in modules.items():
        for target, line, _ in imports_of(path, modules):
            if target in modules and target != module:
                graph[module].setdefault(target, line)
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The groups of modules that import each other around a loop (strongly connected components of more than one
    module; Tarjan's algorithm, iterative so a deep import chain cannot exhaust the stack)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            nxt = next(targets, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(frozenset(group))
    return groups


def test_no_import_cycles():
    """Every import counts (module level, function-local, `if TYPE_CHECKING:`); see the module docstring."""
    modules = all_modules()
    graph = import_graph(modules)
    groups = import_cycles(graph)
    new = []
    for group in sorted(groups, key=sorted):
        if group in KNOWN_CYCLES:
            continue
        arrows = [f"  {os.path.relpath(modules[m], os.path.dirname(ROOT))}:{graph[m][t]} imports {t}"
                  for m in sorted(group) for t in sorted(graph[m]) if t in group]
        new.append(" <-> ".join(sorted(group)) + "\n" + "\n".join(arrows))
    assert not new, "import cycles (move what both need below them, or type against a protocol):\n" + "\n".join(new)
    gone = [" <-> ".join(sorted(g)) for g in KNOWN_CYCLES if g not in groups]
    assert not gone, "no longer a cycle; delete it from KNOWN_CYCLES:\n" + "\n".join(gone)


def test_the_cycle_check_counts_type_checking_and_function_local_imports(tmp_path):
    """a imports b at module level; b imports a only under TYPE_CHECKING; c imports d at module level and d imports
    c inside a function; e imports a (no arrow back). Two cycles, {a, b} and {c, d}; e is in none."""
    sources = {
        "a": "import tempax.b\n",
        "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tempax.a import A\n",
        "c": "from tempax.d import f\n",
        "d": "def f():\n    import tempax.c\n",
        "e": "import tempax.a\n",
    }
    modules = {}
    for name, text in sources.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        modules[f"tempax.{name}"] = str(path)
    groups = import_cycles(import_graph(modules))
    assert sorted(map(sorted, groups)) == [["tempax.a", "tempax.b"], ["tempax.c", "tempax.d"]]


def test_nothing_outside_the_cli_imports_it():
    """The CLI only parses arguments and prints: what a library, a benchmark or a test of another package needs
    lives below it. Only `tempax/cli` itself and its tests (`tests/cli`) import `tempax.cli`; others run the
    command as a user does (`python -m tempax.cli.main` in a child process), which is not an import."""
    repo = os.path.dirname(ROOT)
    modules = all_modules()
    wrong = []
    for top in ("tempax", "bench", "tests"):
        for folder, _, files in os.walk(os.path.join(repo, top)):
            rel = os.path.relpath(folder, repo)
            if rel.split(os.sep)[:2] in (["tempax", "cli"], ["tests", "cli"]):
                continue
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                path = os.path.join(folder, f)
                wrong += [f"{os.path.relpath(path, repo)}:{line} imports {target}"
                          for target, line, _ in imports_of(path, modules)
                          if target == "tempax.cli" or target.startswith("tempax.cli.")]
    assert not wrong, "imports of the CLI from outside it (move what they need below tempax/cli):\n" + "\n".join(wrong)


def test_the_checker_sees_function_local_and_from_imports(tmp_path):
    """A function-local `from tempax.cli.main import main` inside a models file is found, named as the module it
    imports, and flagged as not module-level; a module-level one is flagged as such."""
    modules = {"tempax.cli.main": "", "tempax.models.decoder": ""}
    path = tmp_path / "m.py"
    path.write_text("import tempax.models.decoder\n\ndef f():\n    from tempax.cli.main import main\n")
    assert imports_of(str(path), modules) == [("tempax.models.decoder", 1, True), ("tempax.cli.main", 4, False)]
