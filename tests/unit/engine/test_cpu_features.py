"""The host CPU's model and ISA flags, from /proc/cpuinfo's text."""

from __future__ import annotations

from workers.engine.cpu_features import ISA_FLAGS, HostCPU, host_cpu, parse_cpuinfo

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 avx512_vnni
processor\t: 1
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 avx512_vnni
"""


def test_cpuinfo_gives_the_model_and_flags() -> None:
    model, flags = parse_cpuinfo(CPUINFO)
    assert model == "AMD EPYC 9R14"
    assert {"avx2", "avx512_bf16"} <= flags and "amx_bf16" not in flags


def test_bf16_matmul_needs_amx_or_avx512_bf16() -> None:
    def cpu(*flags: str) -> HostCPU:
        return HostCPU(model="x", machine="x86_64", flags=flags, cores=2)

    assert cpu("avx2", "avx512_bf16").has_bf16_matmul
    assert cpu("amx_bf16").has_bf16_matmul
    assert not cpu("avx2", "fma", "avx512f").has_bf16_matmul
    assert "ISA: avx2 fma" in cpu("avx2", "fma").line()


def test_this_host_is_described() -> None:
    host = host_cpu()
    assert host.model and host.cores >= 1
    assert set(host.flags) <= {*ISA_FLAGS, "bf16"}
