"""Training, calibration and LoRA fine-tuning of DSpark / DFlash drafters for any transformers target.

  data.py      prompts -> self-distilled responses -> sharded token ids + loss masks (atomic, resumable)
  packing.py   anchor sampling and the packed block attention mask
  losses.py    0.1 CE + 0.9 L1 + 1.0 BCE with exp(-k/4) position weights (DFlash twin: CE only)
  trainer.py   online training loop: checkpoints, exact resume, held-out tau, accelerate multi-process
  evaluate.py  tau and calibration samples from the real decoding loop
  peft.py      LoRA adapters on a trained drafter
  cli.py       `hf-dspark make-data | train | calibrate | finetune | eval-tau`
"""
