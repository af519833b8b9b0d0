"""How much CPU other processes used while we timed something, so that a timing taken beside another job says so.

A benchmark run beside a training job measures the contention: on a 2-core CPU, plain `generate()` of SmolLM2-135M
fell from 33 to 22 tokens/s beside another job, and the speedups of contenders timed in turn moved by up to 30%.
`OtherCpuUse` reads the machine's busy CPU time (Linux `/proc/stat`) and this process's own CPU time around a block:
what is left over is the other processes' share, in cores, averaged over the block's wall time.

    with OtherCpuUse() as load:
        ...  # timed work
    if warning := contention_warning(load.cores):
        print(warning)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# other processes' average use, in cores, above which timings are reported as taken under contention (an idle
# machine's background daemons stay near 0.01-0.05 cores)
BUSY_CORES = 0.25


def busy_cpu_seconds() -> float | None:
    """CPU seconds all processes of this machine have spent busy since boot (user, nice, system, irq, softirq,
    steal), or None where /proc/stat is not there (not Linux)."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class OtherCpuUse:
    """Context manager: `cores` is the average number of cores that other processes kept busy during the block
    (None where it cannot be read), `busy` whether that is enough to skew timings (`BUSY_CORES`)."""

    def __init__(self) -> None:
        self.cores: float | None = None

    def __enter__(self) -> OtherCpuUse:
        self._start = (busy_cpu_seconds(), time.process_time(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        machine0, own0, wall0 = self._start
        machine1, own1, wall1 = busy_cpu_seconds(), time.process_time(), time.perf_counter()
        if machine0 is None or machine1 is None or wall1 <= wall0:
            return
        # clock ticks are coarse (10 ms): clamp the rounding below zero away
        self.cores = max(0.0, ((machine1 - machine0) - (own1 - own0)) / (wall1 - wall0))

    @property
    def busy(self) -> bool:
        return is_busy(self.cores)


def is_busy(cores: float | None) -> bool:
    """Whether other processes' use (in cores; None: unknown) is enough to skew timings."""
    return cores is not None and cores > BUSY_CORES


def contention_warning(cores: float | None) -> str | None:
    """One sentence for a report whose timings ran while other processes kept `cores` cores busy, naming the fix
    (None when they did not: `is_busy`)."""
    if not is_busy(cores):
        return None
    return (
        f"warning: other processes kept {cores:.2f} of {os.cpu_count()} cores busy while these timings ran, so they "
        "measure contention as much as generation; rerun with nothing else running (stop training, data or test jobs "
        "first)."
    )
