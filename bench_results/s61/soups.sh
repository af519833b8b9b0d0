#!/bin/bash
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s61; H=.venv/bin/hf-dspark; EV="--sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128"
for a in VS7 VCS7; do $H eval-tau --drafter $R/soup-$a $EV --copy-ngram 0 --out $R/eval_$a.json > $R/eval_$a.log 2>&1 & done
wait; date; echo SOUPS DONE
