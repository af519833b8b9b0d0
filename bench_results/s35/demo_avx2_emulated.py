"""Run examples/demo.py as an AVX2-only CPU would: no bf16 instructions (so fp32), torch's AVX2 kernels and
oneDNN capped at AVX2 (set ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 in the environment)."""
import os, runpy, sys
assert os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" and os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2"
import torch
import hf_dspark.prepack as prepack
prepack.cpu_multiplies_bf16 = lambda: False
import hf_dspark.targets as targets
targets.cpu_multiplies_bf16 = lambda: False
print("torch CPU capability:", torch.backends.cpu.get_cpu_capability())
sys.argv = ["examples/demo.py"]
runpy.run_path("examples/demo.py", run_name="__main__")
