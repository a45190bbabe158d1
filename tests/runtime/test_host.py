from tempax.runtime.host import accelerator_attached, cpu_info, cpu_line, parse_cpuinfo
from tempax.runtime.process import settings_in_effect

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse avx2 fma avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16

processor\t: 1
vendor_id\t: SomethingElse
model name\t: not read
flags\t\t: sse
"""


def test_parse_cpuinfo_reads_the_first_processor_and_keeps_the_relevant_flags():
    info = parse_cpuinfo(CPUINFO)
    assert len(info.pop("fingerprint")) == 16
    assert info == {"vendor": "GenuineIntel", "model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                    "flags": ["avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_tile",
                              "amx_bf16", "amx_int8"]}


def test_benchmarks_record_the_cpu():
    settings = settings_in_effect()
    assert settings["cpu"] == cpu_line() and str(cpu_info()["model"]) in settings["cpu"]
    assert cpu_info()["cores"] >= 1


def test_the_fingerprint_changes_with_any_flag():
    """Machine code may use any instruction the CPU has, so one flag more or less is another fingerprint."""
    same = parse_cpuinfo(CPUINFO)["fingerprint"]
    assert parse_cpuinfo(CPUINFO.replace("processor\t: 1", "processor\t: 7"))["fingerprint"] == same
    assert parse_cpuinfo(CPUINFO.replace(" sse avx2", " sse avx2 avx512vl"))["fingerprint"] != same
    assert parse_cpuinfo(CPUINFO.replace("8481C", "8480C"))["fingerprint"] != same


def test_accelerator_attached_reads_jax_platforms_then_the_pci_bus_then_gpu_device_files(tmp_path):
    root = tmp_path
    assert accelerator_attached({}, sys_root=str(root)) is None
    other = root / "sys/bus/pci/devices/0000:00:04.0"
    other.mkdir(parents=True)
    (other / "vendor").write_text("0x8086\n")  # an Intel device: not an accelerator
    assert accelerator_attached({}, sys_root=str(root)) is None
    tpu = root / "sys/bus/pci/devices/0000:00:05.0"
    tpu.mkdir(parents=True)
    (tpu / "vendor").write_text("0x1ae0\n")  # Google's vendor id, as a TPU chip lists itself
    assert accelerator_attached({}, sys_root=str(root)) == "tpu"
    assert accelerator_attached({"JAX_PLATFORMS": "cpu"}, sys_root=str(root)) is None  # the user's choice wins
    assert accelerator_attached({"JAX_PLATFORMS": "cuda,cpu"}, sys_root=str(tmp_path / "none")) == "gpu"
    gpu_root = tmp_path / "gpu"
    (gpu_root / "dev").mkdir(parents=True)
    (gpu_root / "dev/nvidia0").write_text("")
    assert accelerator_attached({}, sys_root=str(gpu_root)) == "gpu"
