from tempax.runtime.host import cpu_info, cpu_line, parse_cpuinfo
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
