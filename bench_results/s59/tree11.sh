#!/bin/bash
# tree of 11 (the step table's size on this machine) for S6 and a candidate, side by side, one thread each
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s59; H=.venv/bin/hf-dspark; EV="--sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128"
$H eval-tau --drafter model_cards/dspark-smollm2-135m-instruct $EV --draft-tree-size 11 --out $R/tree11_S6.json > $R/tree11_S6.log 2>&1 &
$H eval-tau --drafter $1 $EV --draft-tree-size 11 --out $R/tree11_$2.json > $R/tree11_$2.log 2>&1 &
wait; date; echo TREE11 DONE
