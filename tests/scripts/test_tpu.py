"""scripts/tpu/: preparing a TPU run (a file split into parts that each fit one call, with their hashes), putting
it back together on the other side (missing and damaged parts named and refused), the carry plan, the install
that happens once per machine, and the kernel-less notebook runner."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TPU = os.path.join(ROOT, "scripts", "tpu")
MIB = 2**20


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"tpu_{name}", os.path.join(TPU, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


carry = _module("carry")
run_notebook = _module("run_notebook")


def _bash(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`bash scripts/tpu/SCRIPT ARGS` with this interpreter as the machine's Python, as on a TPU machine (where no
    TEMPAX_CACHE is set: run.sh chooses it) plus `env`."""
    base = {k: v for k, v in os.environ.items() if k not in ("TEMPAX_CACHE", "TPU_INDEX", "TPU_DIR")}
    return subprocess.run(["bash", os.path.join(TPU, script), *args], capture_output=True, text=True, cwd=ROOT,
                          env={**base, "PYTHON": sys.executable, "TPU_PYTHON": sys.executable, **env})


@pytest.fixture
def prepared(tmp_path):
    """A fake 2.5 MiB model file split by prepare.sh into 1 MiB parts: (its bytes, the prepared folder)."""
    data = bytes(range(256)) * (10 * MIB // 4 // 256)  # 2.5 MiB
    source = tmp_path / "fake-model.gguf"
    source.write_bytes(data)
    out = tmp_path / "prepared"
    done = _bash("prepare.sh", "--no-wheels", "--no-data", TPU_DIR=str(out), TPU_GGUF=str(source),
                 TPU_GGUF_PACKAGE="fake_models", TPU_PART_MIB="1")
    assert done.returncode == 0, done.stderr
    return data, out, done.stdout


def _machine(tmp_path, prepared_dir, parts) -> str:
    """A TPU machine's .tpu/ after calls that carried the manifest and `parts` (indices)."""
    remote = tmp_path / "machine"
    (remote / "model").mkdir(parents=True)
    shutil.copy(prepared_dir / "model" / "manifest.json", remote / "model")
    for i in parts:
        shutil.copy(prepared_dir / "model" / f"fake-model.gguf.part-0{i}", remote / "model")
    return str(remote)


def test_prepare_splits_the_file_with_each_part_hashed_and_plans_the_calls(prepared):
    """2.5 MiB in parts of at most 1 MiB: 1 + 1 + 0.5 MiB, each hash that of its slice of the file; the plan
    names the manifest and every part, and no call carries more than 64 MiB with the checkout."""
    data, out, stdout = prepared
    manifest = json.loads((out / "model" / "manifest.json").read_text())
    assert manifest["name"] == "fake-model.gguf" and manifest["package"] == "fake_models"
    assert manifest["size"] == len(data) and manifest["sha256"] == hashlib.sha256(data).hexdigest()
    slices = [data[:MIB], data[MIB:2 * MIB], data[2 * MIB:]]
    assert [p["size"] for p in manifest["parts"]] == [MIB, MIB, MIB // 2]
    assert [p["sha256"] for p in manifest["parts"]] == [hashlib.sha256(s).hexdigest() for s in slices]
    for part, piece in zip(manifest["parts"], slices):
        assert (out / "model" / part["file"]).read_bytes() == piece
    plan = json.loads((out / "carry.json").read_text())
    carried = [item["path"] for call in plan["calls"] for item in call]
    assert [os.path.basename(p) for p in carried] == ["manifest.json"] + [p["file"] for p in manifest["parts"]]
    assert all(plan["checkout_bytes"] + sum(i["bytes"] for i in call) <= 64 * MIB for call in plan["calls"])
    assert "call 1: carry [" in stdout and "to carry:" in stdout


def test_assemble_model_rebuilds_the_file_and_makes_it_findable_by_package(tmp_path, prepared):
    data, out, _ = prepared
    remote = _machine(tmp_path, out, [0, 1, 2])
    done = _bash("run.sh", "assemble-model", TPU_DIR=remote)
    assert done.returncode == 0, done.stderr
    assembled = os.path.join(remote, "model", "fake-model.gguf")
    assert open(assembled, "rb").read() == data
    link = os.path.join(remote, "model", "packages", "fake_models", "fake-model.gguf")
    assert os.path.samefile(link, assembled)
    again = _bash("run.sh", "assemble-model", TPU_DIR=remote)  # already verified: nothing to do
    assert again.returncode == 0 and "fake-model.gguf" in again.stdout


def test_missing_parts_are_named_and_the_file_assembles_when_they_arrive(tmp_path, prepared):
    data, out, _ = prepared
    remote = _machine(tmp_path, out, [0])
    done = _bash("run.sh", "assemble-model", TPU_DIR=remote)
    assert done.returncode == 1
    assert "1 of 3 parts here; missing: fake-model.gguf.part-01, fake-model.gguf.part-02" in done.stderr
    assert not os.path.exists(os.path.join(remote, "model", "fake-model.gguf"))
    for i in (1, 2):  # the next calls bring the rest
        shutil.copy(out / "model" / f"fake-model.gguf.part-0{i}", os.path.join(remote, "model"))
    assert _bash("run.sh", "assemble-model", TPU_DIR=remote).returncode == 0
    assert open(os.path.join(remote, "model", "fake-model.gguf"), "rb").read() == data


def test_a_damaged_part_is_refused_by_name(tmp_path, prepared):
    _, out, _ = prepared
    remote = _machine(tmp_path, out, [0, 1, 2])
    part = os.path.join(remote, "model", "fake-model.gguf.part-01")
    with open(part, "r+b") as f:
        f.seek(1000)
        f.write(b"\xff")
    done = _bash("run.sh", "assemble-model", TPU_DIR=remote)
    assert done.returncode == 2
    assert "1 of 3 parts are damaged" in done.stderr and "fake-model.gguf.part-01: sha256" in done.stderr
    assert not os.path.exists(os.path.join(remote, "model", "fake-model.gguf"))


def test_prepare_names_missing_shared_data(tmp_path):
    done = _bash("prepare.sh", "--no-wheels", "--no-model", TPU_DIR=str(tmp_path / "out"),
                 TPU_SHARED=str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "workloads.json not found; point TPU_SHARED" in done.stderr


def test_plan_keeps_order_and_starts_a_new_call_when_the_next_path_does_not_fit():
    """Budget 60 beside the checkout: wheels 30 + data 10 + manifest 1 = 41 fit one call; the 55 part does not
    (41 + 55 > 60), nor does the 39 part beside it (55 + 39 > 60): three calls."""
    items = [("wheels", 30), ("data", 10), ("manifest", 1), ("part-00", 55), ("part-01", 39)]
    sets = carry.plan(items, budget=60)
    assert [[p for p, _ in s] for s in sets] == [["wheels", "data", "manifest"], ["part-00"], ["part-01"]]
    assert [[p for p, _ in s] for s in carry.plan([("a", 1)] * 3, budget=60, max_paths=2)] == [["a", "a"], ["a"]]
    with pytest.raises(carry.CarryError, match="part-00 is .* MiB, more than .* split it into smaller parts"):
        carry.plan([("part-00", 61 * MIB)], budget=60 * MIB)


def test_requirements_keep_the_machines_jax_and_put_the_tokenizer_path_in_the_second_folder():
    pyproject = os.path.join(ROOT, "pyproject.toml")
    first = [carry.requirement_name(r) for r in carry.requirements(pyproject, "first")]
    second = [carry.requirement_name(r) for r in carry.requirements(pyproject, "second")]
    assert sorted(second) == ["huggingface-hub", "transformers"]
    assert "grain" in first and "flax" in first
    assert not {"jax", "datasets", "transformers", "huggingface-hub"} & set(first)


def test_run_installs_once_per_machine(tmp_path):
    """A fresh machine without the wheels: a clear refusal. With the stamp of this install recorded: the command
    runs at once, with tempax's cache under .tpu/cache."""
    machine = tmp_path / "machine"
    machine.mkdir()
    command = ("python", "-c", "import os; print('ran with', os.environ['TEMPAX_CACHE'])")
    fresh = _bash("run.sh", *command, TPU_DIR=str(machine))
    assert fresh.returncode == 2 and "carry .tpu/wheels in this call" in fresh.stderr
    key = subprocess.run([sys.executable, os.path.join(TPU, "carry.py"), "stamp-key", "pyproject.toml",
                          "scripts/tpu/wheels.txt", "file:///opt/pypi/simple"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    (machine / "site-a").mkdir()
    (machine / "site-b").mkdir()
    (machine / "installed").write_text(key + "\n")
    warm = _bash("run.sh", *command, TPU_DIR=str(machine))
    assert warm.returncode == 0, warm.stderr
    assert "installing" not in warm.stdout and f"ran with {machine / 'cache'}" in warm.stdout


def test_notebook_runner_runs_cells_in_one_namespace(tmp_path):
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["# title"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": ["x = 6\n"]},
        {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": "print(x * 7)"},
    ]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    done = subprocess.run([sys.executable, os.path.join(TPU, "run_notebook.py"), str(path)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "\n42\n" in done.stdout and "code cell 2 of 2" in done.stdout


def test_notebook_runner_refuses_ipython_syntax(tmp_path):
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "%matplotlib inline\nx = 1"}]}))
    with pytest.raises(run_notebook.NotebookError, match="code cell 1 uses IPython syntax .*%matplotlib inline"):
        run_notebook.code_cells(str(path))


def test_run_keeps_the_machines_own_pythonpath_ahead_of_the_installed_folders(tmp_path):
    """A machine whose JAX lives on its PYTHONPATH (not in site-packages): that folder stays on the path, after the
    checkout and before .tpu/site-b and site-a, so its JAX is the one imported."""
    machine = tmp_path / "machine"
    for folder in ("site-a", "site-b"):
        (machine / folder).mkdir(parents=True)
    key = subprocess.run([sys.executable, os.path.join(TPU, "carry.py"), "stamp-key", "pyproject.toml",
                          "scripts/tpu/wheels.txt", "file:///opt/pypi/simple"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    (machine / "installed").write_text(key + "\n")
    own = tmp_path / "machine-jax"
    own.mkdir()
    done = _bash("run.sh", "python", "-c", "import os; print(os.environ['PYTHONPATH'])", TPU_DIR=str(machine),
                 PYTHONPATH=str(own))
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip().splitlines()[-1].split(":")
    assert path[0] == ROOT and path.index(str(own)) < path.index(str(machine / "site-b")) < path.index(
        str(machine / "site-a"))


# Tunix's side (scripts/tpu/tunix.txt, prepare.sh --tunix, run.sh tunix): pip is replaced by a stub that records
# its arguments and writes made-up wheels (download) or made-up installed distributions (install); no network.
FAKE_PIP = r'''
import json, os, sys

args = sys.argv[1:]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
def value(flag):
    return args[args.index(flag) + 1]
lines = [l.split("#")[0].strip() for l in open(value("-r"))]
pins = [l.partition("==") for l in lines if l]
if args[0] == "download":
    os.makedirs(value("-d"), exist_ok=True)
    for name, _, version in pins:
        with open(os.path.join(value("-d"), f"{name.replace('-', '_')}-{version}-py3-none-any.whl"), "wb") as f:
            f.write(b"w" * int(os.environ.get("FAKE_WHEEL_BYTES", "1000")))
elif args[0] == "install":
    target = value("--target")
    for name, _, version in pins:
        info = os.path.join(target, f"{name.replace('-', '_')}-{version or '1.0'}.dist-info")
        os.makedirs(info)
        installed = os.environ.get("FAKE_VERSION_" + name.replace("-", "_"), version or "1.0")
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {installed}\n")
    os.makedirs(os.path.join(target, "tunix"))
    open(os.path.join(target, "tunix", "__init__.py"), "w").close()
'''


@pytest.fixture
def fake_python(tmp_path):
    """A Python for the scripts whose `-m pip` is the stub above and which otherwise runs this interpreter with no
    site-packages (-S), as a bare TPU machine's Python with nothing but its own folders: (its path, the log of pip's
    calls)."""
    stub = tmp_path / "fake_pip.py"
    stub.write_text(FAKE_PIP)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then\n'
                      f'  shift 2; exec "{sys.executable}" -S "{stub}" "$@"\nfi\n'
                      f'exec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    return str(python), tmp_path / "pip.log"


def _pip_calls(log) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_tunix_list_pins_tunix_with_its_safetensors_and_leaves_jax_to_the_machine():
    entries = dict(carry.read_list(os.path.join(TPU, "tunix.txt")))
    assert entries["google-tunix"] == "0.1.7" and entries["qwix"] and entries["flax"]
    assert tuple(map(int, entries["safetensors"].split(".")[:2])) < (0, 8)  # google-tunix 0.1.7: safetensors < 0.8
    assert not {"jax", "jaxlib", "libtpu", "numpy"} & set(entries)
    assert sorted(name for name, version in entries.items() if version is None) == ["pillow", "tensorstore"]


def test_prepare_tunix_downloads_the_pinned_lines_into_a_call_of_their_own(tmp_path, fake_python):
    python, log = fake_python
    out = tmp_path / "prepared"
    done = _bash("prepare.sh", "--no-wheels", "--no-data", "--no-model", "--tunix", TPU_DIR=str(out), PYTHON=python,
                 FAKE_PIP_LOG=str(log), FAKE_WHEEL_BYTES=str(MIB // 2))
    assert done.returncode == 0, done.stderr
    pinned = [(n, v) for n, v in carry.read_list(os.path.join(TPU, "tunix.txt")) if v]
    wheels = sorted(os.listdir(out / "tunix-wheels"))
    assert wheels == sorted(f"{n.replace('-', '_')}-{v}-py3-none-any.whl" for n, v in pinned)
    (download,) = _pip_calls(log)
    assert download[0] == "download" and "--no-deps" in download and "--only-binary=:all:" in download
    assert download[download.index("--python-version") + 1] == "3.11"
    assert "manylinux_2_28_x86_64" in download and "manylinux2014_x86_64" in download
    plan = json.loads((out / "carry.json").read_text())
    assert [[os.path.basename(i["path"]) for i in call] for call in plan["calls"]] == [["tunix-wheels"]]
    assert f"tunix: {len(pinned)} wheels" in done.stdout and not (out / "tunix-pins.txt").exists()


def test_run_tunix_refuses_without_its_wheels_on_a_fresh_machine(tmp_path, fake_python):
    python, log = fake_python
    done = _bash("run.sh", "tunix", "python", "-c", "print('COMMAND-RAN')", TPU_DIR=str(tmp_path / "machine"),
                 TPU_PYTHON=python, FAKE_PIP_LOG=str(log))
    assert done.returncode == 2 and "carry .tpu/tunix-wheels in this call" in done.stderr
    assert "COMMAND-RAN" not in done.stdout and not _pip_calls(log)


def test_run_tunix_installs_once_into_its_own_folder_and_runs_on_its_path_alone(tmp_path, fake_python):
    """The first call installs the list with --no-deps into .tpu/site-tunix from the carried wheels (once: the
    second call does not call pip); the command sees .tpu/site-tunix and none of tempax's folders, and finds
    Tunix's safetensors; a tempax call on the same machine never sees .tpu/site-tunix."""
    python, log = fake_python
    machine = tmp_path / "machine"
    (machine / "tunix-wheels").mkdir(parents=True)
    for folder in ("site-a", "site-b"):
        (machine / folder).mkdir()
    probe = ("python", "-c", "import os, tunix; from importlib.metadata import version; "
             "print(version('safetensors')); print(os.environ['PYTHONPATH'])")
    first = _bash("run.sh", "tunix", *probe, TPU_DIR=str(machine), TPU_PYTHON=python, FAKE_PIP_LOG=str(log))
    assert first.returncode == 0, first.stderr
    assert "installing Tunix" in first.stdout and (machine / "tunix-installed").is_file()
    (install,) = _pip_calls(log)
    assert install[0] == "install" and "--no-deps" in install
    assert install[install.index("--target") + 1] == str(machine / "site-tunix.tmp")
    assert install[install.index("--find-links") + 1] == str(machine / "tunix-wheels")
    assert install[install.index("-r") + 1] == os.path.join(TPU, "tunix.txt")
    listed = dict(carry.read_list(os.path.join(TPU, "tunix.txt")))
    safetensors, pythonpath = first.stdout.strip().splitlines()[-2:]
    assert safetensors == listed["safetensors"]
    path = pythonpath.split(":")
    assert path[0] == ROOT and path[-1] == str(machine / "site-tunix")
    assert not {str(machine / "site-a"), str(machine / "site-b")} & set(path)
    again = _bash("run.sh", "tunix", *probe, TPU_DIR=str(machine), TPU_PYTHON=python, FAKE_PIP_LOG=str(log))
    assert again.returncode == 0 and "installing" not in again.stdout and len(_pip_calls(log)) == 1
    key = subprocess.run([sys.executable, os.path.join(TPU, "carry.py"), "stamp-key", "pyproject.toml",
                          "scripts/tpu/wheels.txt", "file:///opt/pypi/simple"], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    (machine / "installed").write_text(key + "\n")
    tempax_side = _bash("run.sh", "python", "-c", "import os; print(os.environ['PYTHONPATH'])", TPU_DIR=str(machine),
                        TPU_PYTHON=python, FAKE_PIP_LOG=str(log))
    assert tempax_side.returncode == 0, tempax_side.stderr
    assert str(machine / "site-tunix") not in tempax_side.stdout.strip().splitlines()[-1].split(":")


def test_run_tunix_refuses_an_install_that_gives_another_safetensors(tmp_path, fake_python):
    """A strict pin found at another version (here the stub installs safetensors 0.8.0): named, nothing recorded
    as installed, the command not run."""
    python, log = fake_python
    machine = tmp_path / "machine"
    (machine / "tunix-wheels").mkdir(parents=True)
    done = _bash("run.sh", "tunix", "python", "-c", "print('COMMAND-RAN')", TPU_DIR=str(machine), TPU_PYTHON=python,
                 FAKE_PIP_LOG=str(log), FAKE_VERSION_safetensors="0.8.0")
    assert done.returncode == 2 and "safetensors 0.8.0 is found first, not the listed" in done.stderr
    assert not (machine / "tunix-installed").exists() and "COMMAND-RAN" not in done.stdout


def test_check_list_refuses_a_missing_or_strict_mismatch_and_notes_the_rest(tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_text("# a comment\npytest==0.0.1\nno-such-distribution-here==1.0\npackaging\n")
    problems, notes = carry.check_list(str(listed), strict=set())
    assert problems == ["no-such-distribution-here: not installed"]
    assert len(notes) == 1 and notes[0].startswith("pytest ") and "not the listed 0.0.1" in notes[0]
    problems, _ = carry.check_list(str(listed), strict={"pytest"})
    assert any(p.startswith("pytest ") for p in problems)
    assert carry.list_stamp_key(str(listed), "file:///a") != carry.list_stamp_key(str(listed), "file:///b")
