"""LoRA on a drafter: adapter round trip, merge, training only the adapter, generation with a wrapped drafter."""

import copy

import pytest
import torch
from _tiny_models import tiny_drafter, tiny_target, tiny_tokenizer

from hf_dspark.training.evaluate import measure
from hf_dspark.training.peft import LORA_TARGETS, add_lora, load_adapter, merge, save_adapter, unwrap


def _block_logits(drafter, target):
    """Drafter logits for a fixed block: [1, B, V]."""
    torch.manual_seed(0)
    ids = torch.randint(3, 90, (1, 12))
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
        taps = torch.cat([out.hidden_states[i] for i in drafter.tap_hidden_state_ids], dim=-1)
        pos = torch.arange(12)[None]
        kv = drafter.context_kv(drafter.context_features(taps), pos)
        b = drafter.config.block_size
        block = torch.full((1, b), drafter.config.mask_token_id)
        block[0, 0] = ids[0, -1]
        mask = torch.ones(1, 1, b, 12 + b, dtype=torch.bool)
        h = drafter.block_hidden(block, torch.arange(12, 12 + b)[None], kv, mask)
        return drafter.base_logits(h) + drafter.markov_head.block_bias(block, h)


def _perturb_lora(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)


@pytest.fixture()
def setup():
    target = tiny_target()
    base = tiny_drafter(target)
    return target, base, copy.deepcopy(base.state_dict())


def test_lora_adapter_saves_loads_and_merges_to_the_same_logits(setup, tmp_path):
    target, base, base_state = setup
    plain = _block_logits(base, target)
    peft_model = add_lora(base)
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {t for t in LORA_TARGETS if any(f".{t}.lora_A" in n for n in trainable)} == set(LORA_TARGETS)
    _perturb_lora(peft_model)
    adapted = _block_logits(unwrap(peft_model), target)
    assert not torch.allclose(adapted, plain)
    save_adapter(peft_model, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()

    fresh = tiny_drafter(target, seed=5)
    fresh.load_state_dict(base_state)
    loaded = load_adapter(fresh, tmp_path / "adapter")
    torch.testing.assert_close(_block_logits(unwrap(loaded), target), adapted)
    merged = merge(loaded)
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_block_logits(merged, target), adapted, rtol=1e-5, atol=1e-5)


def test_generation_accepts_a_peft_wrapped_drafter(setup):
    target, base, _ = setup
    tok = tiny_tokenizer()
    peft_model = add_lora(base)
    _perturb_lora(peft_model)
    wrapped = measure(peft_model, target, tok, ["hello"], max_new_tokens=10)
    merged = measure(merge(peft_model), target, tok, ["hello"], max_new_tokens=10)
    assert wrapped["steps"] > 0 and wrapped["tau"] == merged["tau"]


def test_loading_a_folder_without_an_adapter_is_refused(setup, tmp_path):
    _, base, _ = setup
    with pytest.raises(ValueError, match="no LoRA adapter"):
        load_adapter(base, tmp_path)


def test_finetuning_trains_only_the_adapter_and_exports_it(setup, tmp_path):
    from hf_dspark.training.data import GenerationSettings, TokenDataset, make_data
    from hf_dspark.training.trainer import TrainConfig, Trainer

    target, base, base_state = setup
    tok = tiny_tokenizer()
    make_data(target, tok, ["hello there", "abc def", "x y z"], tmp_path / "d", GenerationSettings(max_new_tokens=16, batch_size=3, prompts_per_shard=3), log=lambda *_: None)
    peft_model = add_lora(base)
    cfg = TrainConfig(str(tmp_path / "d"), str(tmp_path / "o"), max_steps=2, num_anchors=4, lr=1e-2, eval_every=0, eval_sequences=1)
    tr = Trainer(unwrap(peft_model), target, TokenDataset(tmp_path / "d", target, tok), cfg, log=lambda *_: None,
                 export=lambda out: save_adapter(peft_model, out / "adapter"))
    tr.run(progress=False)
    after = unwrap(peft_model).state_dict()
    for name, value in base_state.items():
        key = next(k for k in after if k.replace(".base_layer", "") == name)
        assert torch.equal(after[key], value), f"{name} must stay frozen"
    assert any(not torch.all(p == 0) for n, p in peft_model.named_parameters() if "lora_B" in n)
    assert (tmp_path / "o" / "adapter" / "adapter_model.safetensors").is_file()
