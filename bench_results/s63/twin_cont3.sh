#!/bin/bash
# session 62's continued twins (gated DSpark and DFlash) continued again side by side, one core each, on the same
# self-distilled answers of sessions 59-60 (cached states): the same command for both, --dflash for the DFlash arm;
# then greedy chain evals with the drafts alone
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s63; S=/work/runs
MIN=${MIN:-100}
COMMON="--data $S/s59/data-mix,$S/s59/data-sd07,$S/s60/data-sd07,$S/s60/data-mix --eval-sequences 8 --ce-weight 1.0 --ce-label target \
  --batch-size 4 --num-anchors 128 --lr 6e-4 --ema-decay 0.998 --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes $MIN \
  --time-budget-min $((MIN + 3)) --eval-every 400 --seed 63 --no-progress"
date; echo TRAIN START
.venv/bin/hf-dspark train $COMMON --init $S/s62/twin2-gated/drafter --out $R/twin3-gated > $R/twin3-gated.log 2>&1 &
.venv/bin/hf-dspark train $COMMON --dflash --init $S/s62/twin2-dflash/drafter --out $R/twin3-dflash > $R/twin3-dflash.log 2>&1 &
wait
date; echo TRAIN DONE
for arm in gated dflash; do
  .venv/bin/hf-dspark eval-tau --drafter $R/twin3-$arm/drafter --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --copy-ngram 0 --out $R/eval_twin3_$arm.json > $R/eval_twin3_$arm.log 2>&1 &
done
wait
date; echo DONE
