#!/usr/bin/env bash
# The load sweep of docs/performance.md: plain generate() vs DSpark (full block) vs the scheduler at batch 1-64,
# with the shipped drafter and with synthetic drafts of acceptance 0.8, greedy on GSM8K, 32 new tokens, 3 timed passes.
# Resumable: a size group whose JSON exists is skipped. Run it on an otherwise idle machine. Arguments after the
# folder go to every `hf-dspark bench` run (e.g. --dtype float32: the default, auto, is bf16 on CPUs with AMX or
# avx512_bf16, where greedy outputs may diverge from plain decoding and synthetic drafts lose their meaning).
#
# KINDS picks the drafts (default "real syn"): e.g. the shipped drafter in bf16 and synthetic drafts in fp32,
#   KINDS=real bash scripts/load_sweep.sh outputs/sweep; KINDS=syn bash scripts/load_sweep.sh outputs/sweep_fp32 --dtype float32
#
#   OMP_NUM_THREADS=2 bash scripts/load_sweep.sh [out-folder [bench args...]]      # default outputs/sweep
set -euo pipefail
out=${1:-outputs/sweep}
shift || true
common=("$@")
mkdir -p "$out"
bench() { name=$1; shift; [ -f "$out/$name.json" ] && return 0
  hf-dspark bench --prompts gsm8k --max-new-tokens 32 --repeats 3 "$@" "${common[@]}" --json "$out/$name.json"; }
for kind in ${KINDS:-real syn}; do
  extra=(); [ $kind = syn ] && extra=(--synthetic-acceptance 0.8)
  bench ${kind}_bs1 --n 8 --batch-sizes 1 --contenders plain,dspark,dspark_adaptive "${extra[@]}"
  bench ${kind}_bs4-16 --n 32 --batch-sizes 4,16 --contenders plain,dspark,dspark_adaptive "${extra[@]}"
  # the full block with a weak drafter (the previous shipped one) already ran at 0.46x of plain at batch 16
  # (docs/performance.md): at 32-64 it only costs time
  full=dspark,; [ $kind = real ] && full=
  bench ${kind}_bs32-64 --n 64 --batch-sizes 32,64 --contenders plain,${full}dspark_adaptive "${extra[@]}"
  python scripts/merge_bench.py "$out/${kind}_bs1.json" "$out/${kind}_bs4-16.json" "$out/${kind}_bs32-64.json" --out "$out/$kind"
done
