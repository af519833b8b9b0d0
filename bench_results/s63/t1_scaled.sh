#!/bin/bash
# S7 against S7 with its draft logits divided by 0.7 (scale_logits.py), sampled at T = 1, chain of 7, drafts alone
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s63; H=.venv/bin/hf-dspark
for d in S7-t1.0 S7-t0.7; do  # copied here as t1_S7.json and t1_S7_q07.json
  $H eval-tau --drafter $R/$d --sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128 --copy-ngram 0 \
    --temperature 1.0 --seed 0 --out $R/t1_$d.json > $R/t1_$d.log 2>&1 &
done
wait
