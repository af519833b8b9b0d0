"""Tiny random Llama targets and a byte-level tokenizer with a chat template, for fast training tests."""

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from hf_dspark.configuration import DSparkConfig
from hf_dspark.modeling import DSparkDrafter

VOCAB = 256
MASK_ID = 255
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Characters 32..126 plus a few specials; ids stay below MASK_ID."""
    specials = ["<pad>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]
    vocab = {t: i for i, t in enumerate(specials)}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    vocab["<unk>"] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<|end|>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": specials[2:]})
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def tiny_target(seed: int = 0, layers: int = 6) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=1, pad_token_id=0, bos_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.name_or_path = f"tiny-llama-{seed}-{layers}"
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 0
    return model


def tiny_drafter(target, markov_rank: int = 16, seed: int = 1) -> DSparkDrafter:
    torch.manual_seed(seed)
    cfg = DSparkConfig.from_target(target.config, mask_token_id=MASK_ID, markov_rank=markov_rank, target_layer_ids=[1, 3])
    return DSparkDrafter(cfg).bind(target)
