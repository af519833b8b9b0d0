#!/bin/bash
# make demo alternated: the shipped S6 files, then the candidate's model.safetensors + calibration.json in the card
cd /work/main
C=model_cards/dspark-smollm2-135m-instruct; R=/work/runs/s59
mkdir -p $R/s6files && cp $C/model.safetensors $C/calibration.json $C/reliability.png $R/s6files/
use() { cp $1/model.safetensors $1/calibration.json $1/reliability.png $C/; }
for i in 1 2; do
  use $R/s6files; make demo > $R/demo_S6_$i.txt 2>&1
  use $R/soup-S6AB; make demo > $R/demo_S7_$i.txt 2>&1
done
date; echo DEMOS DONE
