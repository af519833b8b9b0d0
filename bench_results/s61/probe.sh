#!/bin/bash
# held-out tau on 64 of session 60's greedy answers (S7 never trained on them), no training step: S7, S7 grown to
# 32,768 tokens with mapped new rows, the same with the target's raw rows
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
R=/work/runs/s61; H=.venv/bin/hf-dspark
python $R/grow_vocab.py 32768 $R/S7-V32 && python $R/grow_vocab.py 32768 $R/S7-V32raw --raw
for d in model_cards/dspark-smollm2-135m-instruct $R/S7-V32 $R/S7-V32raw; do
  $H train --init $d --data /work/runs/s60/data-mix --eval-sequences 64 --max-steps 0 --no-progress --out $R/probe-$(basename $d)
done
