"""LoRA fine-tuning of a trained drafter on a domain (via `peft`).

`add_lora(drafter)` wraps the drafter in a `PeftModel` with LoRA on the attention (q/k/v/o), MLP (gate/up/down)
and context projection (fc); the base weights stay frozen. The wrapped drafter trains with the same `Trainer`
(only the LoRA parameters require grad), generates through `hf_dspark.generate` (it accepts a PeftModel), saves
its adapter with `save_adapter`, reloads it with `load_adapter`, and `merge_and_unload()` gives a plain drafter.
"""

from __future__ import annotations

from pathlib import Path

from peft import LoraConfig, PeftModel, get_peft_model

from ..modeling import DSparkDrafter

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "fc"]


def add_lora(drafter: DSparkDrafter, r: int = 16, alpha: int = 32, dropout: float = 0.0, targets: list[str] | None = None) -> PeftModel:
    """Wrap `drafter` (bound to its target) with fresh LoRA adapters; only adapter weights are trainable."""
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets or LORA_TARGETS, bias="none")
    model = get_peft_model(drafter, cfg)
    return model


def unwrap(model) -> DSparkDrafter:
    """The DSparkDrafter inside a PeftModel (or the drafter itself)."""
    if isinstance(model, DSparkDrafter):
        return model
    return model.base_model.model


def save_adapter(model: PeftModel, folder: str | Path) -> None:
    """Write adapter_config.json + adapter_model.safetensors (atomic: written to a temp folder, then renamed)."""
    import os
    import shutil
    import tempfile

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.save_pretrained(str(tmp))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def load_adapter(drafter: DSparkDrafter, folder: str | Path, trainable: bool = False) -> PeftModel:
    """Attach a saved adapter to a (bound) base drafter."""
    if not (Path(folder) / "adapter_config.json").is_file():
        raise ValueError(f"{folder} holds no LoRA adapter (adapter_config.json); train one with `hf-dspark finetune`.")
    return PeftModel.from_pretrained(drafter, str(folder), is_trainable=trainable)


def merge(model: PeftModel) -> DSparkDrafter:
    """Fold the LoRA weights into the base drafter; the result is a plain, still bound DSparkDrafter."""
    target = unwrap(model).target
    merged = model.merge_and_unload()
    if target is not None:
        merged.bind(target)
    return merged
