#!/usr/bin/env bash
# The README's load sweep: plain generate() vs DSpark (full block) vs the scheduler at batch 1-64, with the shipped
# drafter and with synthetic drafts of acceptance 0.8, greedy on GSM8K, 32 new tokens, 3 timed passes.
# Resumable: a size group whose JSON exists is skipped. Run it on an otherwise idle machine. Arguments after the
# folder go to every `hf-dspark bench` run (e.g. --dtype float32: the default, auto, is bf16 on CPUs with AMX or
# avx512_bf16, where greedy outputs may diverge from plain decoding and synthetic drafts lose their meaning).
#
# KINDS picks the drafts (default "real syn"): e.g. the shipped drafter in bf16 and synthetic drafts in fp32,
#   KINDS=real bash scripts/load_sweep.sh out/sweep; KINDS=syn bash scripts/load_sweep.sh out/sweep_fp32 --dtype float32
#
#   OMP_NUM_THREADS=2 bash scripts/load_sweep.sh [out-folder [bench args...]]      # default bench_results/paired
set -euo pipefail
out=${1:-bench_results/paired}
shift || true
common=("$@")
mkdir -p "$out"
bench() { name=$1; shift; [ -f "$out/$name.json" ] && return 0
  hf-dspark bench --prompts gsm8k --max-new-tokens 32 --repeats 3 "$@" "${common[@]}" --json "$out/$name.json"; }
for kind in ${KINDS:-real syn}; do
  extra=(); [ $kind = syn ] && extra=(--synthetic-acceptance 0.8)
  bench ${kind}_bs1 --n 8 --batch-sizes 1 --contenders plain,dspark,dspark_adaptive "${extra[@]}"
  bench ${kind}_bs4-16 --n 32 --batch-sizes 4,16 --contenders plain,dspark,dspark_adaptive "${extra[@]}"
  # the full block with the shipped drafter runs at 0.35-0.45x of plain at batch 32-64 (bench_results/README.md)
  full=dspark,; [ $kind = real ] && full=
  bench ${kind}_bs32-64 --n 64 --batch-sizes 32,64 --contenders plain,${full}dspark_adaptive "${extra[@]}"
  python scripts/merge_bench.py "$out/${kind}_bs1.json" "$out/${kind}_bs4-16.json" "$out/${kind}_bs32-64.json" --out "$out/$kind"
done
