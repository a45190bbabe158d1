import os
import subprocess
import sys

import pytest

from tempax.cli import process


@pytest.fixture
def thp(tmp_path, monkeypatch):
    """Points the module at a fake transparent-huge-page setting file; returns a setter."""
    path = tmp_path / "enabled"
    monkeypatch.setattr(process, "THP_SETTING", str(path))
    monkeypatch.setattr(process.sys, "platform", "linux")
    monkeypatch.setattr(process.platform, "libc_ver", lambda: ("glibc", "2.36"))

    def set_mode(text: str) -> None:
        path.write_text(text)

    return set_mode


def test_adds_the_tunable_when_huge_pages_are_on_request(thp):
    thp("always [madvise] never\n")
    assert process.huge_page_malloc_env({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    # the user's other tunables are kept
    env = process.huge_page_malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


@pytest.mark.parametrize(
    "mode, env",
    [
        ("[always] madvise never\n", {}),  # already huge pages everywhere
        ("always madvise [never]\n", {}),  # huge pages off
        ("always [madvise] never\n", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}),  # the user's choice wins
        ("always [madvise] never\n", {"TEMPAX_REEXEC": "0"}),  # opted out
    ],
)
def test_leaves_the_process_alone(thp, mode, env):
    thp(mode)
    assert process.huge_page_malloc_env(env) is None


def test_no_setting_file_means_no_change(thp, tmp_path, monkeypatch):
    monkeypatch.setattr(process, "THP_SETTING", str(tmp_path / "missing"))
    assert process.huge_page_malloc_env({}) is None


def test_not_glibc_means_no_change(thp, monkeypatch):
    thp("always [madvise] never\n")
    monkeypatch.setattr(process.platform, "libc_ver", lambda: ("", ""))
    assert process.huge_page_malloc_env({}) is None


def test_reexec_runs_the_same_command_with_the_tunable():
    """The real thing, in a child process: the command re-runs itself once and sees the tunable."""
    code = (
        "import os, sys; from tempax.cli.process import reexec_with_huge_page_malloc as r; r(); "
        "print(os.environ.get('GLIBC_TUNABLES', ''), sys.argv[1:])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "TEMPAX_REEXEC")}
    out = subprocess.run([sys.executable, "-c", code, "a", "b=1"], env=env, capture_output=True, text=True,
                         check=True).stdout
    expected = process.huge_page_malloc_env(env)
    tunables = "" if expected is None else expected["GLIBC_TUNABLES"]
    assert out.strip() == f"{tunables} ['a', 'b=1']"
    assert out.count("\n") == 1  # printed once: the re-executed process does not re-execute again
