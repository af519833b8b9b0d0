#!/bin/bash
# session 54: after twin.sh, the two twins at batch 1 in bf16, alone on the machine (2 threads)
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 TOKENIZERS_PARALLELISM=false
R=/work/runs/s54
until grep -q "^DONE" $R/twin.log; do sleep 15; done
date; echo BENCH
.venv/bin/hf-dspark bench --drafter $R/twin-dspark/drafter --dflash-drafter $R/twin-dflash/drafter \
  --prompts gsm8k,humaneval,mtbench --n 4 --max-new-tokens 64 --batch-sizes 1 --contenders plain,dflash,dspark \
  --repeats 3 --dtype bfloat16 --json $R/batch1_twin.json > $R/bench.log 2>&1
date; echo DONE
