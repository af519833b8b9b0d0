"""DSparkConfig: derivation from a target, default taps, mask-token choice, and every validation error."""

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, PreTrainedTokenizerFast

from hf_dspark import DSparkConfig
from hf_dspark.configuration import default_target_layer_ids, find_mask_token_id

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
VALID = dict(BASE, target_layer_ids=[1, 3], num_target_layers=6, mask_token_id=255, markov_rank=8)


def config(**overrides) -> DSparkConfig:
    return DSparkConfig(**{**VALID, **overrides})


def tiny_tokenizer(num_tokens: int, specials: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with `num_tokens` rows: '<unk>', '<s>', '</s>', then words, then `specials`."""
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(num_tokens - 3 - len(specials))]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
    tok.add_special_tokens({"additional_special_tokens": list(specials)})
    assert len(tok) == num_tokens
    return tok


# ---------------------------------------------------------------------------- from_target
def test_from_target_copies_dims_and_spreads_taps():
    target = LlamaConfig(
        vocab_size=300, hidden_size=96, intermediate_size=200, num_hidden_layers=36, num_attention_heads=6,
        num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5, max_position_embeddings=1024, rope_theta=5e5,
    )
    cfg = DSparkConfig.from_target(target, mask_token_id=299, num_hidden_layers=2, markov_rank=16)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "rms_norm_eps", "max_position_embeddings"):
        assert getattr(cfg, name) == getattr(target, name), name
    assert cfg.rope_parameters["rope_theta"] == 5e5
    assert cfg.num_hidden_layers == 2 and cfg.num_target_layers == 36
    assert cfg.target_layer_ids == [1, 9, 17, 25, 33]
    assert cfg.mask_token_id == 299
    assert cfg.enable_confidence_head and cfg.confidence_head_with_markov


@pytest.mark.parametrize("layers", [3, 4, 6, 12, 30, 36, 40, 64])
def test_default_taps_are_valid_and_spread_over_1_to_L_minus_3(layers):
    ids = default_target_layer_ids(layers)
    assert ids[0] == 1 and ids[-1] == max(1, layers - 3)
    DSparkConfig.check_target_layer_ids(ids, layers)


def test_default_taps_need_three_layers():
    with pytest.raises(ValueError, match="at least 3 decoder layers"):
        default_target_layer_ids(2)


def test_mask_token_beyond_the_tokenizer_vocabulary():
    target = LlamaConfig(**BASE, num_hidden_layers=6)
    assert DSparkConfig.from_target(target, tokenizer=tiny_tokenizer(250)).mask_token_id == 250


def test_mask_token_from_a_reserved_special_token():
    tok = tiny_tokenizer(256, specials=("<|im_start|>", "<|reserved_7|>", "<|tool|>"))
    reserved = tok.convert_tokens_to_ids("<|reserved_7|>")
    assert find_mask_token_id(256, tok) == reserved
    assert DSparkConfig.from_target(LlamaConfig(**BASE, num_hidden_layers=6), tokenizer=tok).mask_token_id == reserved


def test_mask_token_explicit_override_wins():
    tok = tiny_tokenizer(250)
    assert DSparkConfig.from_target(LlamaConfig(**BASE, num_hidden_layers=6), tokenizer=tok, mask_token_id=7).mask_token_id == 7


def test_mask_token_needs_a_tokenizer_or_an_id():
    with pytest.raises(ValueError, match="pass mask_token_id="):
        DSparkConfig.from_target(LlamaConfig(**BASE, num_hidden_layers=6))


def test_mask_token_error_when_the_vocabulary_is_full():
    with pytest.raises(ValueError, match="no unused vocabulary row.*mask_token_id="):
        find_mask_token_id(256, tiny_tokenizer(256))


# ---------------------------------------------------------------------------- validation
def test_valid_config_passes():
    cfg = config()
    assert cfg.head_dim == 16 and cfg.target_layer_ids == [1, 3]


@pytest.mark.parametrize(
    "ids, message",
    [
        ([1, 6], r"out of range for a target with 6 layers; use ids in \[0, 4\]"),
        ([-1, 2], "out of range"),
        ([3, 1], "strictly increasing"),
        ([2, 2], "strictly increasing"),
        ([1, 5], "taps the target's last layer 5"),
        ([], "target_layer_ids is empty"),
    ],
)
def test_bad_tap_ids(ids, message):
    with pytest.raises(ValueError, match=message):
        config(target_layer_ids=ids)


@pytest.mark.parametrize("block_size", [0, 65, -1])
def test_block_size_outside_1_to_64(block_size):
    with pytest.raises(ValueError, match=r"block_size=.* must be an integer in \[1, 64\]"):
        config(block_size=block_size)


@pytest.mark.parametrize("rank", [-1, 257])
def test_markov_rank_outside_0_to_vocab(rank):
    with pytest.raises(ValueError, match=r"markov_rank=.* must be in \[0, vocab_size=256\]"):
        config(markov_rank=rank)


def test_unknown_markov_head_type():
    with pytest.raises(ValueError, match="markov_head_type='lstm' is unknown; use one of vanilla, gated, rnn"):
        config(markov_head_type="lstm")


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads", "head_dim"])
@pytest.mark.parametrize("value", [0, -4])
def test_non_positive_sizes(field, value):
    with pytest.raises(ValueError, match=f"{field}={value} must be a positive integer"):
        config(**{field: value})


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"])
def test_absurd_sizes(field):
    with pytest.raises(ValueError, match=f"{field}=.* is absurdly large"):
        config(**{field: 10**9})


def test_absurd_total_parameter_count():
    with pytest.raises(ValueError, match="far beyond any drafter"):
        config(hidden_size=32768, intermediate_size=131072, num_hidden_layers=200, num_attention_heads=128,
               num_key_value_heads=8)


def test_heads_must_divide():
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        config(num_attention_heads=4, num_key_value_heads=3)


def test_mask_token_outside_vocabulary():
    with pytest.raises(ValueError, match=r"mask_token_id=256 is outside the vocabulary \[0, 256\)"):
        config(mask_token_id=256)


def test_confidence_with_markov_needs_a_rank():
    with pytest.raises(ValueError, match="confidence_head_with_markov=True needs markov_rank > 0"):
        config(markov_rank=0, enable_confidence_head=True, confidence_head_with_markov=True)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(layer_types=["sliding_attention"], sliding_window=0), "sliding_window=0 must be a positive integer"),
        (dict(layer_types=["sliding_attention"], sliding_window=-4), "sliding_window=-4 must be a positive integer"),
        (dict(layer_types=["sliding_attention"]), "sliding_attention layers but sliding_window is not set"),
        (dict(layer_types=["chunked_attention"], sliding_window=8), "layer_types holds chunked_attention"),
        (dict(layer_types=["full_attention", "full_attention"]), "one type per drafter layer"),
        (dict(sliding_window_non_causal="yes"), "sliding_window_non_causal='yes' must be true or false"),
    ],
)
def test_bad_layer_layouts_are_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        config(num_hidden_layers=1, **overrides)


def test_layer_layout_round_trips_through_the_config():
    cfg = config(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=16,
               sliding_window_non_causal=True)
    assert cfg.sliding_layers == [True, False]
    again = DSparkConfig(**{k: v for k, v in cfg.to_dict().items() if k not in ("model_type", "transformers_version")})
    assert (again.layer_types, again.sliding_window, again.sliding_window_non_causal) == (
        ["sliding_attention", "full_attention"], 16, True)
    assert config(num_hidden_layers=2).sliding_layers == [False, False]
