"""Micro-benchmark every hf_dspark kernel against its torch reference on one CUDA GPU.

Writes report.md and report.json into --out. Bandwidth is counted from the fewest bytes the operation
must move (each needed input read once, each output written once), so both backends are measured
against the same work; "% peak" compares the Triton kernel with the card's datasheet bandwidth.
Called by scripts/gpu_check.sh; runs in about a minute.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_dspark.kernels import (HAS_TRITON, build_cu_num_draft, build_verify_inputs, flatten_ragged, gather_kv,
                               markov_sample_block, rejection_sample)

PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0}      # datasheet HBM bandwidth, keyed by device-name substring
BLOCK = 7
HIDDEN = 4096
RANK = 256
REQUESTS = (1, 16, 64)
VOCABS = (49152, 151936)
ROTATE_BYTES = 256 << 20     # rotate among input sets this large in total, so L2 (60 MB) cannot serve repeats


def peak_gbps(name: str) -> float | None:
    return next((v for k, v in PEAK_GBPS.items() if k in name), None)


def median_ms(fn, input_sets, warmup: int = 3, repeats: int = 25) -> float:
    for i in range(warmup):
        fn(*input_sets[i % len(input_sets)])
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*input_sets[i % len(input_sets)])
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copies(make, nbytes: int):
    """Enough independent input sets to defeat the L2 cache (at most 8)."""
    return [make(seed) for seed in range(max(1, min(8, math.ceil(ROTATE_BYTES / max(nbytes, 1)))))]


def bench(name, config, make, run, nbytes, rows):
    input_sets = copies(make, nbytes)
    entry = {"kernel": name, **config, "bytes": nbytes}
    for backend in ("torch", "triton") if HAS_TRITON else ("torch",):
        try:
            entry[f"{backend}_ms"] = median_ms(lambda *a: run(*a, backend=backend), input_sets)
        except Exception as exc:   # report and carry on: one failing kernel should not hide the rest
            entry[f"{backend}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    del input_sets
    torch.cuda.empty_cache()
    rows.append(entry)
    print(json.dumps(entry), flush=True)


def rejection_cases(rows):
    for V in VOCABS:
        for R in REQUESTS:
            for greedy in (True, False):
                D, T = R * BLOCK, R * (BLOCK + 1)

                def make(seed, R=R, V=V, D=D, T=T, greedy=greedy):
                    g = torch.Generator(device="cuda").manual_seed(seed)
                    probs = torch.softmax(torch.randn(T, V, device="cuda", generator=g), -1)
                    q = torch.softmax(torch.randn(D, V, device="cuda", generator=g), -1)
                    drafts = torch.randint(0, V, (D,), device="cuda", generator=g)
                    cu = build_cu_num_draft(torch.full((R,), BLOCK, device="cuda"))
                    u = torch.rand(D, device="cuda", generator=g)
                    noise = torch.empty(R, V, device="cuda").exponential_(generator=g)
                    return (probs, drafts, None if greedy else q, cu, None if greedy else u,
                            None if greedy else noise)

                def run(*args, backend, greedy=greedy):
                    return rejection_sample(*args, greedy, backend=backend)

                # greedy needs every target row's argmax; sampled reads the accepted drafts' scalars and
                # then one target row, one draft row and one noise row per request
                nbytes = T * V * 4 if greedy else R * 3 * V * 4
                bench("rejection_sample", {"mode": "greedy" if greedy else "sampled", "R": R, "V": V},
                      make, run, nbytes, rows)


def markov_cases(rows):
    for V in VOCABS:
        for R in REQUESTS:
            for temperature in (0.0, 1.0):
                def make(seed, R=R, V=V, temperature=temperature):
                    g = torch.Generator(device="cuda").manual_seed(seed)
                    bf16 = torch.bfloat16
                    return (torch.randn(R, BLOCK, V, device="cuda", generator=g),
                            torch.randn(R, BLOCK, HIDDEN, device="cuda", generator=g).to(bf16),
                            torch.randint(0, V, (R,), device="cuda", generator=g),
                            (0.05 * torch.randn(V, RANK, device="cuda", generator=g)).to(bf16),
                            (0.05 * torch.randn(V, RANK, device="cuda", generator=g)).to(bf16),
                            torch.randn(HIDDEN + RANK, device="cuda", generator=g).to(bf16),
                            torch.zeros(1, device="cuda"), temperature,
                            torch.empty(R, BLOCK, V, device="cuda").exponential_(generator=g) if temperature else None)

                # per step: W2 once, the step's logits (+ noise read and q write when sampling), hidden
                per_step = V * RANK * 2 + R * V * 4 * (3 if temperature else 1) + R * (HIDDEN + RANK) * 2
                bench("markov_sample_block", {"mode": "sampled" if temperature else "greedy", "R": R, "V": V},
                      make, lambda *a, backend: markov_sample_block(*a, backend=backend), BLOCK * per_step, rows)


def layout_cases(rows):
    for R in REQUESTS:
        S, Hk, Dh = 2048, 8, 128

        def make_kv(seed, R=R):
            g = torch.Generator(device="cuda").manual_seed(seed)
            kv = torch.randn(R, Hk, S, Dh, device="cuda", generator=g).to(torch.bfloat16)
            keep = torch.arange(S - BLOCK, device="cuda").expand(R, -1).contiguous()
            return kv, keep

        bench("gather_kv", {"mode": "bf16 S=2048 Hk=8 D=128", "R": R, "V": 0}, make_kv,
              lambda *a, backend: gather_kv(*a, backend=backend), 2 * R * Hk * (S - BLOCK) * Dh * 2, rows)
        for V in VOCABS:
            def make_rows(seed, R=R, V=V):
                g = torch.Generator(device="cuda").manual_seed(seed)
                return (torch.randn(R, BLOCK + 1, V, device="cuda", generator=g),
                        torch.randint(0, BLOCK + 1, (R,), device="cuda", generator=g))

            bench("flatten_ragged", {"mode": "fp32", "R": R, "V": V}, make_rows,
                  lambda *a, backend: flatten_ragged(*a, backend=backend),
                  2 * R * (BLOCK / 2 + 1) * V * 4, rows)      # expected rows kept: mean l_r = 3.5

        def make_inputs(seed, R=R):
            g = torch.Generator(device="cuda").manual_seed(seed)
            return (torch.randint(0, 1000, (R,), device="cuda", generator=g),
                    torch.randint(0, 1000, (R, BLOCK), device="cuda", generator=g),
                    torch.randint(0, BLOCK + 1, (R,), device="cuda", generator=g),
                    torch.randint(0, 4096, (R,), device="cuda", generator=g))

        bench("build_verify_inputs", {"mode": "int64", "R": R, "V": 0}, make_inputs,
              lambda *a, backend: build_verify_inputs(*a, 0, backend=backend), R * (BLOCK + 3) * 8 * 3, rows)


def write_report(out: Path, rows, meta):
    peak = meta["peak_gbps"]
    for row in rows:
        for backend in ("torch", "triton"):
            if f"{backend}_ms" in row:
                row[f"{backend}_gbps"] = row["bytes"] / (row[f"{backend}_ms"] * 1e-3) / 1e9
        if "triton_ms" in row and "torch_ms" in row:
            row["speedup"] = row["torch_ms"] / row["triton_ms"]
        if peak and "triton_gbps" in row:
            row["triton_pct_peak"] = 100 * row["triton_gbps"] / peak
    (out / "report.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))

    def cell(row, key, fmt):
        return format(row[key], fmt) if key in row else ("error" if key.split("_")[0] + "_error" in row else "-")

    lines = [f"# hf_dspark kernel benchmark on {meta['device']}", "",
             f"torch {meta['torch']}, triton {meta['triton']}, peak bandwidth "
             + (f"{peak:.0f} GB/s (datasheet)" if peak else "unknown (device not in the table)"),
             f"tests: {meta.get('pytest', 'not run')}", "",
             "Times are CUDA-event medians of 25 calls after warm-up (host syncs inside a call included); "
             "GB/s counts the minimal bytes each operation must move.", "",
             "| kernel | mode | R | V | torch ms | triton ms | speedup | triton GB/s | % peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['kernel']} | {row['mode']} | {row['R']} | {row['V'] or '-'} | "
                     f"{cell(row, 'torch_ms', '.3f')} | {cell(row, 'triton_ms', '.3f')} | "
                     f"{cell(row, 'speedup', '.2f')} | {cell(row, 'triton_gbps', '.0f')} | "
                     f"{cell(row, 'triton_pct_peak', '.1f')} |")
    errors = [f"- {r['kernel']} {r['mode']} R={r['R']} V={r['V']}: {r.get('triton_error') or r.get('torch_error')}"
              for r in rows if "triton_error" in r or "torch_error" in r]
    if errors:
        lines += ["", "## Errors", *errors]
    if not HAS_TRITON:
        lines += ["", "**triton is not installed on this machine: only the torch references were timed.**"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pytest", default="not run", help="one-line summary of the test run, for the report")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch.cuda.is_available() is False: run this on a machine with a CUDA GPU.", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    triton_version = "not installed"
    if HAS_TRITON:
        import triton
        triton_version = triton.__version__
    meta = {"device": name, "peak_gbps": peak_gbps(name), "torch": torch.__version__, "triton": triton_version,
            "pytest": args.pytest}
    rows = []
    started = time.time()
    for cases in (rejection_cases, markov_cases, layout_cases):
        cases(rows)
    meta["bench_seconds"] = round(time.time() - started, 1)
    write_report(args.out, rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
