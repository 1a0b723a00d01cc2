"""The CPU this process runs on, in the words that decide which graph is fastest: its model and instruction sets.

Used by graph calibration (engine/calibration.py: its choices are recorded per machine) and by the benches,
which print what they measured on. Read from /proc/cpuinfo; elsewhere the model is platform's word for the
processor and the instruction sets are unknown (an empty tuple), which still names one signature per machine.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

# /proc/cpuinfo flag -> the name people know it by. These change which kernels onnxruntime's MLAS picks:
# AVX2/FMA (the baseline), AVX-512 (wider fp32 GEMM), VNNI (int8 dot products, in AVX-512 or the AVX2-width
# AVX-VNNI), BF16 and AMX (tile GEMMs for bf16 and int8).
INSTRUCTION_SETS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512F",
    "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX-512 BF16",
    "avx512_fp16": "AVX-512 FP16",
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
}
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class Machine:
    cpu_model: str
    instruction_sets: tuple[str, ...]  # names from INSTRUCTION_SETS' values, in its order
    usable_cpus: int  # the CPUs this process may run on (affinity, so a container's cpuset counts)

    @property
    def native_bf16(self) -> bool:
        """Whether the CPU computes bfloat16 products itself (AVX512-BF16 or AMX): where it does not, a bf16 graph
        would be emulated, slower than fp32, and is never a candidate (engine/calibration.py)."""
        return "AVX-512 BF16" in self.instruction_sets or "AMX-BF16" in self.instruction_sets

    def describe(self) -> str:
        sets = ", ".join(self.instruction_sets) or "instruction sets unknown"
        return f"{self.cpu_model} ({sets}); {self.usable_cpus} usable CPUs"


def _cpuinfo_field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def this_machine() -> Machine:
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    model = _cpuinfo_field(text, "model name") or platform.processor() or platform.machine() or "unknown CPU"
    flags = set((_cpuinfo_field(text, "flags") or "").split())
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        usable = os.cpu_count() or 1
    return Machine(model, tuple(name for flag, name in INSTRUCTION_SETS.items() if flag in flags), usable)
