#!/bin/bash
# session 25: the DFlash twin at a small budget. Two arms trained concurrently (1 thread each) from the same
# target-layer init, on the same data, seed and minutes; the only difference is --dflash.
cd "$(dirname "$0")/../.."  # the repository root; data directories from make-data under /work/runs
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p /work/runs/s25  # the logs and eval JSONs
DATA=/work/runs/data-dom8,/work/runs/data-dom7,/work/runs/data-sd3,/work/runs/data-dom6
COMMON="--data $DATA --eval-data /work/runs/data-heldout --eval-sequences 26 --layers 2 --draft-vocab-size 16384 \
  --batch-size 4 --num-anchors 128 --lr 1e-3 --warmup-ratio 0.03 --max-steps 100000 --schedule-minutes 88 \
  --time-budget-min 90 --eval-every 250 --seed 25 --no-progress"
date; echo TRAIN START
.venv/bin/python -m hf_dspark.training.cli train $COMMON --out /work/runs/twin-dspark > /work/runs/s25/twin-dspark.log 2>&1 &
P1=$!
.venv/bin/python -m hf_dspark.training.cli train $COMMON --dflash --out /work/runs/twin-dflash > /work/runs/s25/twin-dflash.log 2>&1 &
P2=$!
wait $P1 $P2
date; echo TRAIN DONE
for arm in dspark dflash; do
  .venv/bin/python -c "import torch; from hf_dspark.targets import load_target; from hf_dspark import DSparkDrafter; \
m, t = load_target('smollm2-135m-instruct'); d = DSparkDrafter.from_pretrained('/work/runs/twin-$arm/drafter', target=m, dtype=torch.float32); \
d.to(torch.bfloat16).save_pretrained('/work/runs/cand-twin-$arm')"
done
date; echo EVAL
for arm in dspark dflash; do
  .venv/bin/hf-dspark eval-tau --drafter /work/runs/cand-twin-$arm --sets gsm8k,humaneval,mtbench --num-prompts 40 \
    --max-new-tokens 128 --out /work/runs/s25/eval_twin_$arm.json > /work/runs/s25/eval-$arm.log 2>&1 &
done
wait
date; echo POST DONE
