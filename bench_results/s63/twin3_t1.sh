#!/bin/bash
# the twins of twin_cont3.sh sampled at T = 1: chain of 7, drafts alone, seed 0
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s63
for arm in gated dflash; do
  .venv/bin/hf-dspark eval-tau --drafter $R/twin3-$arm/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --copy-ngram 0 --temperature 1.0 --seed 0 --out $R/t1_twin3_$arm.json > $R/t1_twin3_$arm.log 2>&1 &
done
wait
