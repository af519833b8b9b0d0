"""`OtherCpuUse` sees another process's CPU use, and reports say when timings ran beside it."""
import subprocess
import sys
import time

import pytest

from hf_dspark import cpu_load
from hf_dspark.bench import Record, contention_warning

pytestmark = pytest.mark.skipif(cpu_load.busy_cpu_seconds() is None, reason="needs Linux /proc/stat")


def test_sees_a_busy_process():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it start
        with cpu_load.OtherCpuUse() as load:
            time.sleep(1.0)
    finally:
        spinner.kill()
        spinner.wait()
    assert load.cores is not None and load.cores > 0.6, load.cores
    assert load.busy


def test_own_work_is_not_counted():
    with cpu_load.OtherCpuUse() as idle:  # whatever else this machine runs
        time.sleep(0.5)
    with cpu_load.OtherCpuUse() as load:
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:  # this process keeps one core busy
            pass
    assert load.cores is not None and load.cores < idle.cores + 0.5, (load.cores, idle.cores)


def test_bench_warns_only_above_the_threshold():
    quiet, loud = Record("dspark", "gsm8k", 1, other_cpu_cores=0.05), Record("plain", "gsm8k", 1, other_cpu_cores=1.3)
    assert contention_warning([quiet, Record("plain", "gsm8k", 1)]) is None
    warning = contention_warning([quiet, loud])
    assert "1.30" in warning and "rerun with nothing else running" in warning
