#!/bin/bash
# a ship candidate's evals beside S7's stored ones (bench_results/s59/; eval-tau is deterministic on this machine):
# tree of 15 and tree of 11, chain with copies (the card's eval_tau.json), calibration, held-out chain. Usage: D NAME
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s64; H=.venv/bin/hf-dspark; EV="--sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128"
$H eval-tau --drafter $1 $EV --draft-tree-size 15 --out $R/tree_$2.json > $R/tree_$2.log 2>&1 &
$H eval-tau --drafter $1 $EV --draft-tree-size 11 --out $R/tree11_$2.json > $R/tree11_$2.log 2>&1 &
wait; date; echo TREES DONE
$H eval-tau --drafter $1 $EV --out $R/eval_$2_copy.json > $R/eval_$2_copy.log 2>&1 &
( $H calibrate --drafter $1 --prompts heldout --num-prompts 24 --max-new-tokens 128 > $R/calib_$2.log 2>&1;
  $H eval-tau --drafter $1 --sets heldout --num-prompts 40 --max-new-tokens 128 --copy-ngram 0 --out $R/eval_$2_heldout.json > $R/eval_$2_heldout.log 2>&1 ) &
wait; date; echo SHIPEVALS DONE
