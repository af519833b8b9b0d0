#!/bin/bash
# session 58's fresh twins (gated DSpark and DFlash, ShareGPT as written, 90 minutes of one core each), sampled at T = 1
# (the paper's Table 1 setting), chain of 7, the drafter's picks alone (as the greedy twin comparisons)
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1
R=/work/runs/s62; H=.venv/bin/hf-dspark
SEED=${SEED:-0}
for arm in gated dflash; do
  $H eval-tau --drafter /work/runs/s58/twin-$arm/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
     --max-new-tokens 128 --copy-ngram 0 --temperature 1.0 --seed $SEED --out $R/t1_twin_${arm}_s$SEED.json > $R/t1_twin_${arm}_s$SEED.log 2>&1 &
done
wait
