"""Code and docs speak of the project only, and the README stays a short front page.

Prose (every Markdown page, the comments of YAML and shell files, the comments and docstrings of Python files)
must not carry calendar dates, times of day, commit hashes, talk of who worked on what and where, or paths
outside the repository: a reader of a clone has none of them, and a figure is only reproducible from the command
and the CPU named beside it. Measured figures live in `docs/` pages; a docstring states the rule and the reason.

URLs are removed before the checks (a paper's or a project's address may hold anything). The data sets and the
shared benchmark workloads sit in a `shared` folder beside the clone (`docs/CONTRIBUTING.md`), so
`../shared/data/...` and `../shared/bench/...` are the project's own inputs and allowed; the tokenizer cache's
documented default under the home folder is allowed too. Python string literals that are not docstrings are
code (a test's fixture path, a bench's run folder) and are checked only for paths outside the repository that
name a person's machine.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCANNED_DIRS = ("tempax", "bench", "scripts", "tests", "docs", "recipes", "examples", ".ci")
SCANNED_TOP_FILES = ("README.md", "pyproject.toml")

URL = re.compile(r"https?://\S+")

RULES: dict[str, re.Pattern] = {
    "a calendar date": re.compile(
        r"\b(19|20)\d\d-(0[1-9]|1[0-2])-([0-2]\d|3[01])\b"
        r"|\b(19|20)\d\d/(0[1-9]|1[0-2])/([0-2]\d|3[01])\b"
        r"|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2},? (19|20)\d\d\b"
        r"|\b\d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* (19|20)\d\d\b"
        r"|\b(on|of|from|since|until|before|after) (0?[1-9]|1[0-2])-([0-2]\d|3[01])\b"
        r"|\b(today|yesterday|tonight|this (morning|afternoon|evening))('s)?\b",
        re.I,
    ),
    "a time of day": re.compile(
        r"\b([01]?\d|2[0-3]):[0-5]\d(:[0-5]\d)?\s*(UTC|GMT|CET|CEST|PST|PDT|EST|EDT)\b"
        r"|\b([01]\d|2[0-3]):[0-5]\d\s*-\s*([01]\d|2[0-3]):[0-5]\d\b"
        r"|\b(at|from|until|started|since) ([01]?\d|2[0-3]):[0-5]\d\b"
    ),
    # Hex of 7-40 characters with a letter and a digit; not the mantissa of a float such as 8.270144462585449e-07.
    "a commit hash": re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b(?![-+]\d)"),
    "who worked on what (engineers, sessions, branches)": re.compile(
        r"\bengineers?('s?)?\b|\b(this|that|each|other|one|previous|last) sessions?('s)?\b|\bsessions'"
        r"|\b(this|that|the|a|my|our|your|each|other|git|feature|merged?) branch('s|es)?\b"
        r"|\bmain (at )?commit\b|\bthe lead\b",
        re.I,
    ),
    "a path outside the repository": re.compile(
        r"(?<![\w.])/(work|home|Users|root|mnt|scratch)/"
        r"|(?<![\w.])/tmp\b"
        r"|\.\./(?!shared/(data|bench)\b)[\w.-]+/"
        r"|~/(?!\.cache/tempax\b)"
    ),
}

# A path in a Python string that is code (not a docstring) is checked only against these: a fixture may well
# live in /tmp, but no code should name one person's machine.
CODE_STRING_RULES = {"a path outside the repository": re.compile(r"(?<![\w.])/(work|home|Users)/|\.\./shared/notes\b")}

# (path, rule) -> why that file may match the rule.
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/test_docs_hygiene.py", "a path outside the repository"): "its own cases of what the rule catches",
}


def scanned_files() -> list[str]:
    paths = [p for p in SCANNED_TOP_FILES if os.path.exists(os.path.join(ROOT, p))]
    for top in SCANNED_DIRS:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", ".pytest_cache", ".venv", "runs")]
            for name in files:
                if name.endswith((".py", ".md", ".yaml", ".yml", ".sh", ".toml")) or top == ".ci":
                    paths.append(os.path.relpath(os.path.join(folder, name), ROOT))
    return sorted(paths)


def python_prose(source: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(line, text) of the comments and docstrings of a module, and of its other string literals."""
    prose = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                docstrings.add(id(first.value))
                prose.append((first.value.lineno, first.value.value))
    strings = [(node.lineno, node.value) for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]
    return prose, strings


def hash_comments(source: str) -> list[tuple[int, str]]:
    """The `#` comments of a YAML, TOML or shell file (their prose)."""
    return [(n, line[line.index("#"):]) for n, line in enumerate(source.splitlines(), 1) if "#" in line]


def inside_repo(path: str, text: str, match: re.Match) -> bool:
    """Whether the relative path starting at `match` resolves, from the page's folder, inside the repository."""
    target = re.match(r"[^\s)`'\"]+", text[match.start():]).group(0)
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
    return not resolved.startswith("..")


def findings(path: str) -> list[str]:
    source = open(os.path.join(ROOT, path), encoding="utf-8").read()
    if path.endswith(".py"):
        prose, code_strings = python_prose(source)
    elif path.endswith(".md"):
        prose, code_strings = list(enumerate(source.splitlines(), 1)), []
    else:
        prose, code_strings = hash_comments(source), [(n, line) for n, line in enumerate(source.splitlines(), 1)]
    out = []
    for rules, pieces in ((RULES, prose), (CODE_STRING_RULES, code_strings)):
        for line, text in pieces:
            text = URL.sub("URL", text)
            for rule, pattern in rules.items():
                if (path, rule) in ALLOWED:
                    continue
                for match in pattern.finditer(text):
                    if path.endswith(".md") and match.group(0).startswith("../") and inside_repo(path, text, match):
                        continue  # a relative link between pages, such as docs/measurements -> docs/figures
                    at = line + text.count("\n", 0, match.start())
                    out.append(f"{path}:{at}: {rule}: {match.group(0)!r}")
    return out


def test_the_scan_sees_the_project():
    files = scanned_files()
    assert "README.md" in files and "tempax/__init__.py" in files and "docs/CONTRIBUTING.md" in files
    assert any(p.startswith("recipes/") for p in files) and any(p.startswith(".ci/") for p in files)


@pytest.mark.parametrize("text, rule", [
    ("measured on 2031-04-05, quiet machine", "a calendar date"),
    ("the run of 11-30 was slower", "a calendar date"),
    ("`sum` (today's default)", "a calendar date"),
    ("started 10:19:32 UTC, 453 s in all", "a time of day"),
    ("back to back, 15:45-16:25", "a time of day"),
    ("code = commit a53dc03", "a commit hash"),
    ("four other engineers' jobs", "who worked on what (engineers, sessions, branches)"),
    ("a snapshot of the branch's commit", "who worked on what (engineers, sessions, branches)"),
    ("before this session's last changes", "who worked on what (engineers, sessions, branches)"),
    ("see /work/notes/x.md", "a path outside the repository"),
    ("--out /tmp/cmp.jsonl", "a path outside the repository"),
    ("../shared/notes/calibration.md", "a path outside the repository"),
])
def test_each_rule_catches_its_case(text, rule):
    assert RULES[rule].search(text)


def test_a_relative_link_between_pages_stays_inside():
    """docs/measurements/x.md -> ../figures/a.png is docs/figures/a.png; README.md -> ../notes/a.md is outside."""
    link = "![curve](../figures/a.png)"
    assert inside_repo("docs/measurements/x.md", link, re.search(r"\.\./", link))
    assert not inside_repo("README.md", "see ../notes/a.md", re.search(r"\.\./", "see ../notes/a.md"))


@pytest.mark.parametrize("text", [
    "batch[8:10] and logps[10:18]", "Newcombe 1998, method 10", "steps 9-12, 0.25 -> 0.75", "1.959963984540054",
    "../shared/data/gsm8k/train.jsonl", "../shared/bench/workloads.json", "`~/.cache/tempax`", "runs/cmp.jsonl",
    "the Hub branch (never networked in tests)", "keep the session going", "8.270144462585449e-07",
    "4111111111111111", "0x1f",
])
def test_project_prose_passes(text):
    assert not [rule for rule, pattern in RULES.items() if pattern.search(text)]


def test_code_and_docs_carry_no_dates_hashes_people_or_outside_paths():
    found = [line for path in scanned_files() for line in findings(path)]
    assert not found, "prose that only this one machine or day can read:\n" + "\n".join(found)


# The library is what a pip user installs: none of its lines (a default, a help text, a message, a docstring) may
# name the data and benchmark folders that sit only beside a clone. The recipes, tests, benchmarks and docs of the
# repository reach them; the library defaults to a Hub id or needs the key set (tests/cli/test_validate.py).
BESIDE_THE_CLONE = re.compile(r"\.\./shared\b|\bshared/(data|bench)\b|[\"']shared[\"']")


@pytest.mark.parametrize("line", [
    'path: str = "../shared/data/hh-rlhf-sft/train.jsonl"', "DIR = REPO_ROOT.parent / 'shared' / 'data' / 'gsm8k'",
    "the shared benchmark shapes (shared/bench/workloads.json)",
])
def test_the_beside_the_clone_rule_catches_its_cases(line):
    assert BESIDE_THE_CLONE.search(line)


def test_the_library_names_no_folder_beside_the_clone():
    found = [f"{path}:{n}: {line.strip()}" for path in scanned_files() if path.startswith("tempax/")
             for n, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1)
             if BESIDE_THE_CLONE.search(line)]
    assert not found, "the library names a folder only a clone has (use a Hub id, or require the key):\n" + "\n".join(
        found)


def readme() -> str:
    return open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def test_readme_starts_with_the_two_fresh_machine_commands():
    """The first code block, before any other, is exactly the demo and the test command."""
    first_block = re.search(r"```[^\n]*\n(.*?)```", readme(), re.S)
    assert first_block is not None
    assert first_block.group(1).split("\n")[:-1] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert os.path.exists(os.path.join(ROOT, script))


def test_readme_is_a_front_page():
    """At most 155 lines: a user guide; the measured detail lives in docs/ pages, which the README links."""
    assert len(readme().splitlines()) <= 155


# What a user guide does not carry: figures belong to the machine they were measured on, so they live on
# docs/results.md beside their CPU and command. Model names keep their sizes (SmolLM2-135M, Gemma 3 270M).
README_FIGURES: dict[str, re.Pattern] = {
    "a CPU name": re.compile(r"\b(EPYC|Xeon|Ryzen|Zen ?\d|AMX|AVX(2|-?512)|Core i\d|Graviton|H200|A100)\b", re.I),
    "a duration": re.compile(r"\b\d+(\.\d+)? ?(s|ms|sec|seconds?|min|minutes?|hours?|h)\b(?!-)", re.I),
    "a speed or a ratio": re.compile(r"\b\d+(\.\d+)? ?(x|tokens/s|tok/s|steps?/s|GiB|GB|MiB|MB)\b"),
    "a percentage": re.compile(r"(?<![:.])\b\d+(\.\d+)? ?%(?!})"),  # not a format spec such as {x:.1%}
    "a test tally": re.compile(r"\b\d+ (passed|failed|tests?)\b"),
}


def test_the_readme_quotes_no_figures():
    found = [f"README.md:{n}: {what}: {line.strip()}" for n, line in enumerate(readme().splitlines(), 1)
             for what, rule in README_FIGURES.items() if rule.search(URL.sub("", line))]
    assert not found, "figures belong on docs/results.md (python bench/results.py):\n" + "\n".join(found)


def test_the_readme_figure_rules_catch_figures():
    caught = ["on two AMD EPYC cores", "in 3 min 41 s", "249.0 tokens/s (2.49x)", "at 1.00 GiB", "64.6% answers",
              "1327 passed"]
    kept = ["SmolLM2-135M-Instruct", "Gemma 3 270M", "a 4-bit QLoRA", "Llama-3.2-1B", "train.steps=2",
            "`tempax export RUN_DIR MODEL.gguf --quant q8_0`"]
    assert all(any(r.search(t) for r in README_FIGURES.values()) for t in caught)
    assert not [t for t in kept if any(r.search(t) for r in README_FIGURES.values())]


def test_the_readme_python_quick_start_is_the_shipped_example():
    """The README's Python block is examples/grpo_own_reward.py without its docstring (the end-to-end tier runs
    that file on the real model), so the guide cannot drift from code that runs."""
    block = re.search(r"```python\n(.*?)```", readme(), re.S)
    assert block is not None, "the README has no Python quick start"
    example = open(os.path.join(ROOT, "examples", "grpo_own_reward.py"), encoding="utf-8").read()
    body = example.split('"""', 2)[2].lstrip("\n")
    assert block.group(1) == body


# What a docstring or comment under tempax/ does not quote: a figure measured on one machine (a time, a rate, a
# speed or size ratio, an amount of memory, the CPU it ran on). It belongs on a docs page beside its CPU and the
# command that repeats it (docs/measurements/, docs/results.md); the code states the rule, the reason and where
# the measurement lives. Narrow on purpose, so that what code must say stays sayable: shapes ("1024 x 1024",
# "[2048, 576] x [576, 1536]"), counts, bits, formulas and numbered defaults are not figures, nor are percentages
# (confidence levels, tolerances, defaults) or whole powers of two in bytes (page and block sizes: 4 KiB, 2 MiB).
_NUMBER = r"(?<![\w.-])~?\d+(?:\.\d+)?(?:\s?(?:-|to)\s?~?\d+(?:\.\d+)?)?"
CODE_FIGURES: dict[str, re.Pattern] = {
    "a duration": re.compile(_NUMBER + r" ?(?:ns|us|µs|ms|s|secs?|seconds?|mins?|minutes?|hours?|h)\b(?![-/'])"),
    "a rate": re.compile(_NUMBER + r" ?(?:tokens/s|tok/s|tokens per second|steps?/s|s/step|it/s|[KMGT]i?B/s"
                                   r"|[GT]FLOP/s)"),
    "a speed or size ratio": re.compile(_NUMBER + r" ?x\b(?! ?[\d\[(])"),
    "an amount of memory": re.compile(_NUMBER + r" ?[KMGT]i?B\b(?!/)"),
    "a CPU or accelerator model": re.compile(r"\b(?:EPYC|Xeon|Ryzen|Threadripper|Zen ?\d|Core i\d|Graviton"
                                             r"|Apple M\d|[AHV]100|H200|TPU ?v\d)\b"),
}
# (path, the figure as matched) -> why it is still there (empty: a figure in code is always moved to a docs page).
CODE_FIGURES_LEFT: dict[tuple[str, str], str] = {
}


def _whole_power_of_two_bytes(figure: str) -> bool:
    number = re.match(r"~?(\d+(?:\.\d+)?)(?: ?[KMGT]i?B)$", figure)
    return number is not None and float(number.group(1)).is_integer() and int(float(number.group(1))) > 0 and (
        int(float(number.group(1))) & (int(float(number.group(1))) - 1)) == 0


def code_figures(path: str) -> list[str]:
    """`path:line: what: figure` for every measured figure in the comments and docstrings of a Python file."""
    prose, _ = python_prose(open(os.path.join(ROOT, path), encoding="utf-8").read())
    found = []
    for line, text in prose:
        text = URL.sub("URL", text)
        for what, rule in CODE_FIGURES.items():
            for match in rule.finditer(text):
                figure = match.group(0)
                if what == "an amount of memory" and _whole_power_of_two_bytes(figure):
                    continue
                if (path, figure) not in CODE_FIGURES_LEFT:
                    found.append(f"{path}:{line + text.count(chr(10), 0, match.start())}: {what}: {figure!r}")
    return found


@pytest.mark.parametrize("text", [
    "4.9 ms against 0.7 ms", "about 7x slower", "at ~8 GB/s of cache", "+0.27 GiB peak", "1.2-1.8 s of CPU",
    "on an AMD EPYC Zen 5", "23-38 MB on the tiny model", "349.2 tokens/s", "took 0.531 x their bfloat16 bytes",
    "GRPO step 4.82 s/step", "an H200 took over 200 s",
])
def test_the_code_figure_rules_catch_figures(text):
    assert any(rule.search(text) for rule in CODE_FIGURES.values())


@pytest.mark.parametrize("text", [
    "[2048, 576] x [576, 1536]", "a 16-layer 1024 x 1024 stack", "4.5 bits per weight", "2 x 8 completions",
    "95% Wilson intervals", "CRC-32s of every file", "0x1f", "max_new_tokens=256", "tolerance 1e-5",
    "theta^(-2i/d)", "jaxlib 0.10", "x86-64 with AVX-512", "q [B, T, N, H] x k", "4 B T V bytes per copy",
])
def test_the_code_figure_rules_keep_code_prose(text):
    assert not [what for what, rule in CODE_FIGURES.items() if rule.search(text)]


def test_page_and_block_sizes_are_not_figures():
    assert _whole_power_of_two_bytes("4 KiB") and _whole_power_of_two_bytes("2 MiB")
    assert not _whole_power_of_two_bytes("0.27 GiB") and not _whole_power_of_two_bytes("68 MB")


def test_code_quotes_no_measured_figures():
    """Docstrings and comments under tempax/ state the rule and its reason and point to the page of the
    measurement; the figure itself lives on that page, beside its CPU and command."""
    found = [line for path in scanned_files() if path.startswith("tempax/") and path.endswith(".py")
             for line in code_figures(path)]
    assert not found, ("measured figures in code (move them to docs/measurements/ or docs/results.md, beside the CPU "
                       "and the command, and point there):\n" + "\n".join(found))


# A module docstring says what the module is and why in a few lines; the detail (formulas, papers, measured
# reasons, caveats) lives beside the definitions it describes, in their docstrings or a comment at the place in
# the code, or on a page under docs/measurements/.
MODULE_DOCSTRING_LINES = 20


def module_docstring_lines(source: str) -> int:
    """Lines the module docstring of `source` spans, its quotes' lines included; 0 without one."""
    tree = ast.parse(source)
    if ast.get_docstring(tree, clean=False) is None:
        return 0
    return tree.body[0].end_lineno - tree.body[0].lineno + 1


def test_module_docstring_lines_counts_from_quote_to_quote():
    """A docstring of an opening line, a blank one, a line and the closing quotes spans 4 lines; a module that
    opens with code has none (a later string is not its docstring)."""
    assert module_docstring_lines('"""What.\n\nWhy.\n"""\n\nx = 1\n') == 4
    assert module_docstring_lines('x = 1\n"""not a docstring"""\n') == 0


def test_module_docstrings_say_what_and_why_in_a_few_lines():
    long = []
    for path in scanned_files():
        if path.startswith("tempax/") and path.endswith(".py"):
            lines = module_docstring_lines(open(os.path.join(ROOT, path), encoding="utf-8").read())
            if lines >= MODULE_DOCSTRING_LINES:
                long.append(f"{path}: {lines} lines")
    assert not long, (f"module docstrings of {MODULE_DOCSTRING_LINES} lines or more (keep what the module is and why; "
                      "move the detail to the definitions it describes or to docs/measurements/):\n" + "\n".join(long))


def test_the_results_page_is_what_the_records_give():
    """docs/results.md is written by `python bench/results.py` from bench/records/, never by hand."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "results.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# `bench/NAME.py`, `recipes/<algo>_<model>.yaml`, the playbook's `recipes/myalgo_smollm2.yaml`: files to write.
PLACEHOLDER = re.compile(r"<|\bNAME\b|(^|/)x/|test_y|myalgo")
REPO_PATH = re.compile(r"(?<![\w./-])((?:tempax|tests|bench|scripts|recipes|docs|examples)/[\w./-]*[\w/])")


def test_paths_the_docs_name_exist():
    """Every repository path that the README or a docs page names in a link or inside backticks (a command's
    `pytest tests/...` too) exists, so a moved module cannot leave a stale pointer."""
    pages = ["README.md"] + [p for p in scanned_files() if p.startswith("docs/") and p.endswith(".md")]
    missing = []
    for page in pages:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        names = set(re.findall(r"\]\(((?:docs|\.\./)[^)\s#]+)", text))
        names |= {path for span in re.findall(r"`([^`]+)`", text) for path in REPO_PATH.findall(span)}
        for name in sorted(names):
            target = os.path.normpath(os.path.join(os.path.dirname(page), name)) if name.startswith("..") else name
            if not PLACEHOLDER.search(name) and not os.path.exists(
                    os.path.join(ROOT, target)):
                missing.append(f"{page}: {name}")
    assert not missing, "the docs name files that do not exist:\n" + "\n".join(missing)
