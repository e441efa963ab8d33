"""The CPU's instruction sets, read once from /proc/cpuinfo: what decides which inference backends run fast here.

Tests replace `cpu_flags` (``monkeypatch.setattr(vit.deploy.cpu, "cpu_flags", lambda: frozenset({...}))``); the
other functions read it at every call.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # x86 AMX, AVX512-BF16; Arm's "bf16" feature
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # int8 dot products that add in 32 bits
SHOWN_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (x86 "flags", Arm "Features"); None where there is no such file."""
    return _read_flags()


@cache
def _read_flags() -> frozenset[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return frozenset(f for line in text.splitlines() if line.startswith(("flags", "Features"))
                     for f in line.split(":", 1)[-1].split())


def describe_cpu(flags: frozenset[str] | None = None) -> str:
    """The flags that decide the backends, e.g. ``avx2 avx512f avx512_vnni amx_int8`` (or ``unknown``)."""
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return "unknown (no /proc/cpuinfo)"
    return " ".join(f for f in SHOWN_FLAGS if f in flags) or "none of " + " ".join(SHOWN_FLAGS)


def has_native_bf16(flags: frozenset[str] | None = None) -> bool | None:
    """Whether the CPU computes bf16 in hardware; None if unknown. Without it torch emulates bf16, several times
    slower than fp32."""
    flags = cpu_flags() if flags is None else flags
    return None if flags is None else bool(flags & set(BF16_FLAGS))


def has_amx_bf16(flags: frozenset[str] | None = None) -> bool | None:
    """Whether the CPU has AMX tiles for bf16 (Intel Sapphire Rapids and later); None if unknown."""
    flags = cpu_flags() if flags is None else flags
    return None if flags is None else "amx_bf16" in flags


def has_vnni(flags: frozenset[str] | None = None) -> bool | None:
    """Whether the CPU has int8 dot-product instructions (VNNI or AMX); None if unknown."""
    flags = cpu_flags() if flags is None else flags
    return None if flags is None else bool(flags & set(VNNI_FLAGS))


def reduce_range_for(flags: frozenset[str] | None = None) -> bool:
    """Whether static int8 weights should use 7 bits: on x86 without VNNI onnxruntime's u8s8 kernel (VPMADDUBSW)
    adds pairs of products in 16 bits, which saturate with full-range weights (onnxruntime's quantisation docs).
    An unknown CPU gets the safe choice."""
    return not has_vnni(flags)
