#!/bin/bash
# run E's last weights (its checkpoint's) beside their moving average (its exported drafter): chain evals, then trees of 15
cd /work/main
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
R=/work/runs/s60; H=.venv/bin/hf-dspark; EV="--sets gsm8k,humaneval,mtbench --num-prompts 40 --max-new-tokens 128"
.venv/bin/python - <<'PY'
from hf_dspark import DSparkDrafter
from hf_dspark.training.trainer import read_state
d = DSparkDrafter.from_pretrained("/work/runs/s60/train-E/drafter")
missing = d.load_state_dict(read_state("/work/runs/s60/train-E/checkpoint/trainer_state.safetensors")["drafter"], strict=False)
assert not missing.unexpected_keys, missing.unexpected_keys
d.save_pretrained("/work/runs/s60/train-E-last")
print("wrote train-E-last")
PY
$H eval-tau --drafter $R/train-E/drafter $EV --copy-ngram 0 --out $R/eval_Eavg.json > $R/eval_Eavg.log 2>&1 &
$H eval-tau --drafter $R/train-E-last $EV --copy-ngram 0 --out $R/eval_Elast.json > $R/eval_Elast.log 2>&1 &
wait; date; echo CHAIN-E DONE
