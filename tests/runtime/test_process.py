import os
import subprocess
import sys

import pytest

from tempax.runtime import process

FLAG = process.SCHEDULER_FLAG
AMD = {"vendor": "AuthenticAMD", "flags": ["avx2", "fma", "avx512f", "avx512_bf16"]}
INTEL_AMX = {"vendor": "GenuineIntel", "flags": ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]}


@pytest.fixture
def thp(tmp_path, monkeypatch):
    """Points the module at a fake transparent-huge-page setting file on a glibc Linux; returns a setter."""
    path = tmp_path / "enabled"
    monkeypatch.setattr(process, "THP_SETTING", str(path))
    monkeypatch.setattr(process.sys, "platform", "linux")
    monkeypatch.setattr(process.platform, "libc_ver", lambda: ("glibc", "2.36"))
    monkeypatch.setattr(process, "cpu_info", lambda: AMD)  # a CPU that gets no per-CPU flag
    monkeypatch.setattr(process, "accelerator_attached", lambda env: None)  # the step runs on this CPU
    return path.write_text


def test_scheduler_by_default_huge_pages_when_asked(thp):
    thp("always [madvise] never\n")
    assert process.tuned_env({"PATH": "/bin"}) == {"PATH": "/bin", "XLA_FLAGS": FLAG}
    assert process.tuned_env({"TEMPAX_HUGE_PAGES": "1"}) == {
        "TEMPAX_HUGE_PAGES": "1", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "XLA_FLAGS": FLAG}
    # the user's other tunables and flags are kept
    env = process.tuned_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "XLA_FLAGS": "--xla_dump_to=/tmp/d",
                             "TEMPAX_HUGE_PAGES": "1"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert env["XLA_FLAGS"] == f"--xla_dump_to=/tmp/d {FLAG}"


def test_with_an_accelerator_training_jobs_keep_the_heap_only_when_asked(thp, monkeypatch):
    """On a TPU host the kept heap's one arena serialised the compiler's threads (the 1B LoRA step: 63 s against
    19 s), and the step's temporaries live on the device anyway."""
    seen = []
    monkeypatch.setattr(process, "accelerator_attached", lambda env: seen.append(env) or "tpu")
    assert "GLIBC_TUNABLES" not in process.tuned_env({}, job="train")
    assert seen == [{}]
    assert process.tuned_env({"TEMPAX_KEEP_HEAP": "1"}, job="train")["GLIBC_TUNABLES"] == ":".join(
        process.KEEP_HEAP_TUNABLES)


def test_training_jobs_keep_the_heap_unless_turned_off(thp):
    thp("always [madvise] never\n")
    heap = ":".join(process.KEEP_HEAP_TUNABLES)
    assert heap == "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"
    assert process.tuned_env({}, job="train") == {"GLIBC_TUNABLES": heap, "XLA_FLAGS": FLAG}
    assert process.tuned_env({"TEMPAX_KEEP_HEAP": "0"}, job="train") == {"TEMPAX_KEEP_HEAP": "0", "XLA_FLAGS": FLAG}
    assert process.tuned_env({}, job=None) == {"XLA_FLAGS": FLAG}  # decoding, GRPO, ...: opt-in only
    assert process.tuned_env({"TEMPAX_KEEP_HEAP": "1"}, job=None)["GLIBC_TUNABLES"] == heap
    assert process.tuned_env({"TEMPAX_REEXEC": "0"}, job="train") == {"TEMPAX_REEXEC": "0"}
    # huge pages are opt-in for every job, and go with the kept heap when both are asked for
    assert process.tuned_env({"TEMPAX_HUGE_PAGES": "1"}, job="train")["GLIBC_TUNABLES"] == (
        f"{heap}:glibc.malloc.hugetlb=1")
    thp("[always] madvise never\n")  # huge pages: nothing to ask for; the kept heap does not depend on them
    assert process.tuned_env({"TEMPAX_HUGE_PAGES": "1"}, job="train")["GLIBC_TUNABLES"] == heap


def test_a_tunable_the_user_named_keeps_the_users_value(thp):
    thp("always [madvise] never\n")
    env = process.tuned_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4:glibc.rtld.optional_static_tls=512"},
                            job="train")
    assert env["GLIBC_TUNABLES"] == ("glibc.malloc.arena_max=4:glibc.rtld.optional_static_tls=512:"
                                     "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776")


def test_not_glibc_means_no_heap_tunables(thp, monkeypatch):
    monkeypatch.setattr(process.platform, "libc_ver", lambda: ("", ""))
    assert process.tuned_env({}, job="train") == {"XLA_FLAGS": FLAG}
    monkeypatch.setattr(process.sys, "platform", "darwin")
    assert process.tuned_env({"TEMPAX_KEEP_HEAP": "1"}) == {"TEMPAX_KEEP_HEAP": "1", "XLA_FLAGS": FLAG}


FAULTS = """
import resource, sys
from tempax.runtime.process import setup_process
setup_process(job="train")
import jax, jax.numpy as jnp
# the gradient of a 4-layer MLP: its activations (4 x [2048, 1024] float32 and more, over 64 MiB) are temporaries
# that XLA:CPU allocates afresh on every execution
def loss(weights, x):
    for w_in, w_out in weights:
        x = x + jnp.tanh(x @ w_in) @ w_out
    return jnp.sum(x * x)
step = jax.jit(jax.grad(loss))
weights = [(jnp.full((256, 1024), 0.01), jnp.full((1024, 256), 0.01)) for _ in range(4)]
x = jnp.ones((2048, 256), jnp.float32)
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(step(weights, x))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults[2:]))
"""


@pytest.mark.skipif(not process.glibc_linux(), reason="glibc's tunables only")
def test_a_kept_heap_maps_a_steps_memory_once():
    """The real thing, in child processes: with glibc's defaults every run maps the step's temporaries afresh and
    faults their pages in; with the kept heap, runs find them mapped. (Not every run: which free block a
    temporary lands in depends on the order the previous run's buffers were freed, so now and then the heap
    grows, then stays; hence the fewest faults of runs 3-10.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "TEMPAX_REEXEC", "TEMPAX_HUGE_PAGES")}

    def faults(keep_heap: str) -> int:
        out = subprocess.run([sys.executable, "-c", FAULTS], env={**env, "TEMPAX_KEEP_HEAP": keep_heap},
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[-1])

    kept, fresh = faults("1"), faults("0")
    assert fresh > 32 * 2**20 // 4096  # 32 MiB or more of the temporaries' pages, every run
    assert kept < fresh / 20


def test_per_cpu_flags():
    """oneDNN's products on an AVX-512 Intel CPU only; the AMD EPYC measured gets none."""
    assert process.cpu_xla_flags(INTEL_AMX) == [process.ONEDNN_FLAG]
    assert process.cpu_xla_flags({"vendor": "GenuineIntel", "flags": ["avx2", "fma"]}) == []
    assert process.cpu_xla_flags(AMD) == []
    assert process.cpu_xla_flags({"vendor": "", "flags": []}) == []
    assert process.tuned_env({}, cpu=INTEL_AMX) == {"XLA_FLAGS": f"{FLAG} {process.ONEDNN_FLAG}"}
    assert process.tuned_env({}, cpu=AMD) == {"XLA_FLAGS": FLAG}
    # the user's value of the flag wins, in either direction
    mine = {"XLA_FLAGS": "--xla_cpu_use_onednn=false"}
    assert process.tuned_env(mine, cpu=INTEL_AMX) == {"XLA_FLAGS": f"--xla_cpu_use_onednn=false {FLAG}"}
    mine = {"XLA_FLAGS": "--xla_cpu_use_onednn=true"}
    assert process.tuned_env(mine, cpu=AMD) == {"XLA_FLAGS": f"--xla_cpu_use_onednn=true {FLAG}"}
    assert process.tuned_env({"TEMPAX_REEXEC": "0"}, cpu=INTEL_AMX) == {"TEMPAX_REEXEC": "0"}


@pytest.mark.parametrize("mode", ["[always] madvise never\n", "always madvise [never]\n"])
def test_huge_pages_always_or_never_leave_malloc_alone(thp, mode):
    thp(mode)
    assert process.tuned_env({"TEMPAX_HUGE_PAGES": "1"}) == {"TEMPAX_HUGE_PAGES": "1", "XLA_FLAGS": FLAG}


def test_the_users_choices_win(thp):
    thp("always [madvise] never\n")
    mine = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0", "TEMPAX_HUGE_PAGES": "1",
            "XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"}
    assert process.tuned_env(mine) == mine
    assert process.tuned_env({"TEMPAX_REEXEC": "0"}) == {"TEMPAX_REEXEC": "0"}


def test_no_setting_file_or_not_glibc_means_no_malloc_change(thp, tmp_path, monkeypatch):
    monkeypatch.setattr(process, "THP_SETTING", str(tmp_path / "missing"))
    assert "GLIBC_TUNABLES" not in process.tuned_env({"TEMPAX_HUGE_PAGES": "1"})
    thp("always [madvise] never\n")
    monkeypatch.setattr(process, "THP_SETTING", str(tmp_path / "enabled"))
    monkeypatch.setattr(process.platform, "libc_ver", lambda: ("", ""))
    assert "GLIBC_TUNABLES" not in process.tuned_env({"TEMPAX_HUGE_PAGES": "1"})


@pytest.mark.parametrize("huge_pages", ["0", "1"])
@pytest.mark.parametrize("job", [None, "train"])
def test_setup_runs_the_same_command_once_with_the_settings(huge_pages, job):
    """The real thing, in a child process: the command re-runs itself at most once and sees the settings."""
    code = (
        f"import os, sys; from tempax.runtime.process import setup_process; setup_process({job!r}); "
        "print(repr(os.environ.get('GLIBC_TUNABLES', '')), repr(os.environ.get('XLA_FLAGS', '')), sys.argv[1:])"
    )
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "TEMPAX_REEXEC", "XLA_FLAGS", "TEMPAX_KEEP_HEAP")}
    env["TEMPAX_HUGE_PAGES"] = huge_pages
    out = subprocess.run([sys.executable, "-c", code, "a", "b=1"], env=env, capture_output=True, text=True,
                         check=True).stdout
    expected = process.tuned_env(env, job=job)
    assert out.strip() == f"{expected.get('GLIBC_TUNABLES', '')!r} {expected['XLA_FLAGS']!r} ['a', 'b=1']"
    assert out.count("\n") == 1  # printed once: the re-executed process does not re-execute again


def test_the_compilation_cache_is_per_cpu_and_can_be_turned_off(tmp_path):
    """`$TEMPAX_CACHE/xla/<fingerprint>`, every program cached; off with TEMPAX_COMPILE_CACHE=0; the user's own
    JAX cache folder is left as set."""
    cpu = {"vendor": "AuthenticAMD", "flags": ["avx2"], "fingerprint": "abc123"}
    env = process.compilation_cache_env({"TEMPAX_CACHE": str(tmp_path)}, cpu, command="sft")
    assert env == {"TEMPAX_CACHE": str(tmp_path), "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla" / "abc123"),
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    # `generate` and `chat` store their programs whole instead, never beside JAX's cache (`compilation_cache_env`).
    for command in ("generate", "chat"):
        assert process.compilation_cache_env({"TEMPAX_CACHE": str(tmp_path)}, cpu, command=command) == {
            "TEMPAX_CACHE": str(tmp_path), "TEMPAX_PROGRAMS_DIR": str(tmp_path / "xla" / "abc123" / "programs")}
    other = process.compilation_cache_env({"TEMPAX_CACHE": str(tmp_path)}, {**cpu, "fingerprint": "def456"})
    assert other["JAX_COMPILATION_CACHE_DIR"] != env["JAX_COMPILATION_CACHE_DIR"]
    assert process.compilation_cache_env({"TEMPAX_COMPILE_CACHE": "0"}, cpu) == {"TEMPAX_COMPILE_CACHE": "0"}
    mine = {"JAX_COMPILATION_CACHE_DIR": "/elsewhere"}
    assert process.compilation_cache_env(mine, cpu) == mine


def test_the_weight_cache_sits_in_the_tempax_cache_and_can_be_turned_off(tmp_path):
    env = process.weight_cache_env({"TEMPAX_CACHE": str(tmp_path)})
    assert env["TEMPAX_WEIGHTS_DIR"] == str(tmp_path / "weights")
    assert "TEMPAX_WEIGHTS_DIR" not in process.weight_cache_env({"TEMPAX_WEIGHT_CACHE": "0"})
    assert process.weight_cache_env({"TEMPAX_WEIGHTS_DIR": "/mine"})["TEMPAX_WEIGHTS_DIR"] == "/mine"


# Compiles a program sharded over 8 host devices and reports whether it came from the persistent cache.
_SHARDED_PROGRAM = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name.rpartition("/")[2]))
mesh = jax.sharding.Mesh(jax.devices(), ("data",))
x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data")))
y = jax.jit(lambda a: (a @ a.T).sum(axis=1))(x)
print(events.count("compile_requests_use_cache"), events.count("cache_hits"), float(y.sum()),
      len(y.sharding.device_set))
"""


def test_a_second_process_loads_sharded_programs_from_the_cache(tmp_path):
    """XLA:CPU in the pinned jaxlib: the first run compiles every program (no cache hit), the second reads every
    one back (as many hits as compile requests), the sharded product included; both give the sum of A A^T with
    A = arange(64) as 8x8, spread over all 8 devices."""
    env = process.compilation_cache_env({**os.environ, "TEMPAX_CACHE": str(tmp_path),
                                         "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    runs = [subprocess.run([sys.executable, "-c", _SHARDED_PROGRAM], env=env, capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    a = [[8.0 * i + j for j in range(8)] for i in range(8)]
    total = sum(sum(x * y for x, y in zip(r, s)) for r in a for s in a)
    requests, hits = [int(r[0]) for r in runs], [int(r[1]) for r in runs]
    assert requests[0] >= 1 and hits == [0, requests[1]]
    assert all(float(r[2]) == total and r[3] == "8" for r in runs)
    assert os.listdir(env["JAX_COMPILATION_CACHE_DIR"])
