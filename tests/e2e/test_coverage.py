"""Every `tempax ...` command of README.md and docs/*.md is run by the end-to-end tier, or allow-listed here with
the reason it cannot run on a test machine. Part of the default suite (no model, no subprocess): a guide line
added without a case fails here, naming it.

A case covers a command by naming its text, as written in the guide, in `Case.covers` (tests/e2e/cases.py); every
module-level `Case` of tests/e2e (lists and tuples of them included) counts.
"""

from __future__ import annotations

import glob
import importlib
import os

from tests.documented_commands import ROOT, documented_commands
from tests.e2e.cases import Case

# Documented commands the tier cannot run, each with why and what it runs instead.
NOT_RUN = {
    "tempax grpo --config RECIPE.yaml grpo.workers=4 grpo.max_staleness=2 ray.address=auto":
        "joins a running Ray cluster (ray.address=auto), which a test machine does not have; the same rollout "
        "workers on a local Ray instance run (test_runs.py: 1 and 2 workers, staleness 0 and 1, one killed)",
    # docs/multi-host.md: commands for separate machines; tests/parallel/test_two_hosts.py (slow) runs the same
    # commands, environment and Ray layout between two network namespaces.
    **{f"JAX_COORDINATOR_ADDRESS=10.0.0.1:8476 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID={i} tempax sft --config recipe.yaml "
       "train.run_dir=$SHARED/runs/sft": "needs two machines; the two-host tests start exactly this pair (data and "
       "FSDP meshes)" for i in (0, 1)},
    "tempax grpo --config RECIPE.yaml grpo.workers=1 ray.address=10.0.0.1:6379 ray.worker_resource=rollout_host":
        "needs a Ray cluster over two machines; the two-host Ray test places the worker on the second namespace",
}


def _cases_in(value) -> list[Case]:
    if isinstance(value, Case):
        return [value]
    if isinstance(value, (list, tuple)):
        return [case for item in value for case in _cases_in(item)]
    return []


def e2e_cases() -> list[tuple[str, Case]]:
    """(module, case) for every module-level Case of tests/e2e, each once (under the module that defines it first)."""
    out, seen = [], set()
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "e2e", "*.py"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if name == "__init__" or not (name.startswith("test_") or name == "conftest"):
            continue
        module = importlib.import_module(f"tests.e2e.{name}")
        for value in vars(module).values():
            for case in _cases_in(value):
                if id(case) not in seen:
                    seen.add(id(case))
                    out.append((name, case))
    return out


def test_every_documented_command_is_run_or_allow_listed():
    covered = {command for _, case in e2e_cases() for command in case.covered}
    missing = [f"{name}: {command}" for name, command in documented_commands()
               if command not in covered and command not in NOT_RUN]
    print("documented commands the end-to-end tier does not run:")
    for command, reason in NOT_RUN.items():
        print(f"  {command}\n    because {reason}")
    assert not missing, ("documented commands no end-to-end case covers (add a Case to tests/e2e, one line, or a "
                         "reason to NOT_RUN in tests/e2e/test_coverage.py):\n  " + "\n  ".join(missing))


def test_cases_and_the_allow_list_name_documented_commands():
    """A case or an allow-list entry whose command a guide no longer shows is stale: its text must be updated."""
    documented = {command for _, command in documented_commands()}
    stale = [f"{module}: {case.id}: {command}" for module, case in e2e_cases() for command in case.covered
             if command not in documented]
    stale += [f"NOT_RUN: {command}" for command in NOT_RUN if command not in documented]
    assert not stale, "covers a command no guide shows:\n  " + "\n  ".join(stale)


def test_case_ids_are_unique():
    ids = [case.id for _, case in e2e_cases()]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
