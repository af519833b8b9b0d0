#!/bin/bash
# session 58's twins (gated DSpark and DFlash, fresh, 90 minutes of ShareGPT as written each) continued side by side on the
# same self-distilled answers of sessions 59-60 (cached states), one core each, the same command but --init: still
# twins (same data, init recipe, seed, lr and minutes; only the head differs); then greedy and T = 1 chain evals
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s62; S=/work/runs
MIN=${MIN:-105}
COMMON="--data $S/s59/data-mix,$S/s59/data-sd07,$S/s60/data-sd07,$S/s60/data-mix --eval-sequences 8 --ce-weight 1.0 --ce-label target \
  --batch-size 4 --num-anchors 128 --lr 1e-3 --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes $MIN \
  --time-budget-min $((MIN + 3)) --eval-every 400 --seed 62 --no-progress"
date; echo TRAIN START
for arm in gated dflash; do
  flag=""  # as run: an --init drafter without a Markov head trains as DFlash; the CLI then refused --dflash beside --init (it takes it now, same run)
  .venv/bin/hf-dspark train $COMMON $flag --init $S/s58/twin-$arm/drafter --out $R/twin2-$arm > $R/twin2-$arm.log 2>&1 &
done
wait
date; echo TRAIN DONE
for arm in gated dflash; do
  .venv/bin/hf-dspark eval-tau --drafter $R/twin2-$arm/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --copy-ngram 0 --out $R/eval_twin2_$arm.json > $R/eval_twin2_$arm.log 2>&1 &
done
wait
date; echo GREEDY DONE
for arm in gated dflash; do
  .venv/bin/hf-dspark eval-tau --drafter $R/twin2-$arm/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --copy-ngram 0 --temperature 1.0 --seed 0 --out $R/t1_twin2_${arm}_s0.json > $R/t1_twin2_${arm}_s0.log 2>&1 &
done
wait
date; echo DONE
