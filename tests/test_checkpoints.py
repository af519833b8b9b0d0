"""Checkpoint formats: DeepSpec-native and speculators miniatures written from the SPEC list, our own format,
export to DeepSpec, and every bad-input error."""

import json
import pickle
import time

import pytest
import torch
from conftest import make_tiny_drafter, make_tiny_target
from safetensors.torch import save_file

from hf_dspark import DSparkConfig, DSparkDrafter
from hf_dspark.checkpoints import export_deepspec

V, H, HEADS, KV, HD, FFN, R = 256, 64, 4, 2, 16, 128, 8
TAPS = [1, 3]

QWEN3_TARGET = dict(
    model_type="qwen3", vocab_size=V, hidden_size=H, intermediate_size=FFN, num_attention_heads=HEADS,
    num_key_value_heads=KV, head_dim=HD, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=1000000.0,
    max_position_embeddings=512, attention_bias=False, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
)


def spec_shapes(layers: int, rank: int, head_type: str, confidence: bool, conf_with_markov: bool) -> dict:
    """Every weight name and shape of a DeepSpec-native DSpark checkpoint, as listed in SPEC.md section 2."""
    shapes = {
        "embed_tokens.weight": [V, H], "lm_head.weight": [V, H], "fc.weight": [H, len(TAPS) * H],
        "hidden_norm.weight": [H], "norm.weight": [H],
    }
    for i in range(layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [HEADS * HD, H], p + "self_attn.k_proj.weight": [KV * HD, H],
            p + "self_attn.v_proj.weight": [KV * HD, H], p + "self_attn.o_proj.weight": [H, HEADS * HD],
            p + "self_attn.q_norm.weight": [HD], p + "self_attn.k_norm.weight": [HD],
            p + "mlp.gate_proj.weight": [FFN, H], p + "mlp.up_proj.weight": [FFN, H], p + "mlp.down_proj.weight": [H, FFN],
        })
    if rank:
        shapes.update({"markov_head.markov_w1.weight": [V, rank], "markov_head.markov_w2.weight": [V, rank]})
        if head_type == "gated":
            shapes.update({"markov_head.gate_proj.weight": [rank, H + rank], "markov_head.gate_proj.bias": [rank]})
        if head_type == "rnn":
            shapes.update({"markov_head.joint_proj.weight": [3 * rank, 2 * rank + H], "markov_head.joint_proj.bias": [3 * rank]})
    if confidence:
        shapes.update({"confidence_head.proj.weight": [1, H + (rank if conf_with_markov else 0)], "confidence_head.proj.bias": [1]})
    return shapes


def dspark_fields(layers, rank, head_type, confidence, conf_with_markov) -> dict:
    return dict(
        num_target_layers=6, block_size=7, target_layer_ids=TAPS, mask_token_id=250, markov_rank=rank,
        markov_head_type=head_type, enable_confidence_head=confidence, confidence_head_with_markov=conf_with_markov,
        num_anchors=64,
    )


def random_weights(shapes: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def write_checkpoint(folder, config: dict, weights: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))


def write_deepspec(folder, layers=2, rank=R, head_type="vanilla", confidence=True, conf_with_markov=True, **extra):
    """A miniature DeepSpec-native checkpoint (Qwen3 target config + DSpark fields); returns its weights."""
    config = dict(QWEN3_TARGET, architectures=["Qwen3DSparkModel"], num_hidden_layers=layers,
                  layer_types=["full_attention"] * layers, tie_word_embeddings=False,
                  **dspark_fields(layers, rank, head_type, confidence, conf_with_markov))
    config.update(extra)
    weights = random_weights(spec_shapes(layers, rank, head_type, confidence, conf_with_markov))
    write_checkpoint(folder, config, weights)
    return weights


def write_speculators(folder, head_type="gated", layers=2, draft_vocab=V, **extra):
    """A miniature speculators DSpark checkpoint (nested layer config, aux ids = tap ids + 1); returns its weights."""
    fields = dspark_fields(layers, R, head_type, True, True)
    fields.pop("target_layer_ids")
    config = dict(
        speculators_model_type="dspark", architectures=["DSparkSpeculator"], speculators_version="0.3.0",
        transformer_layer_config=dict(QWEN3_TARGET, num_hidden_layers=layers, architectures=["Qwen3ForCausalLM"]),
        aux_hidden_state_layer_ids=[i + 1 for i in TAPS], sample_from_anchor=True, draft_vocab_size=draft_vocab,
        **fields,
    )
    config.update(extra)
    weights = random_weights(spec_shapes(layers, R, head_type, True, True))
    if draft_vocab != V:
        weights["lm_head.weight"] = weights["lm_head.weight"][:draft_vocab]
        weights["markov_head.markov_w2.weight"] = weights["markov_head.markov_w2.weight"][:draft_vocab]  # W2 over D
        weights["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
        weights["t2d"] = torch.arange(V) < draft_vocab
    write_checkpoint(folder, config, weights)
    return weights


def assert_same_parameters(model: DSparkDrafter, weights: dict) -> None:
    state = model.state_dict()
    assert set(state) == set(weights)
    for name, t in weights.items():
        assert torch.equal(state[name], t), name


# ---------------------------------------------------------------------------- DeepSpec-native
@pytest.mark.parametrize(
    "rank, head_type, confidence, conf_with_markov",
    [(R, "vanilla", True, True), (R, "gated", True, True), (R, "rnn", True, True), (R, "rnn", True, False), (0, "vanilla", False, False)],
    ids=["vanilla", "gated", "rnn", "rnn-confidence-without-markov", "dflash"],
)
def test_deepspec_native_miniature_loads_exactly(tmp_path, rank, head_type, confidence, conf_with_markov):
    weights = write_deepspec(tmp_path, rank=rank, head_type=head_type, confidence=confidence, conf_with_markov=conf_with_markov)
    model = DSparkDrafter.from_pretrained(tmp_path)
    assert_same_parameters(model, weights)
    cfg = model.config
    assert (cfg.target_layer_ids, cfg.num_target_layers, cfg.block_size, cfg.mask_token_id) == (TAPS, 6, 7, 250)
    assert (cfg.markov_rank, cfg.markov_head_type, cfg.num_hidden_layers) == (rank, head_type, 2)
    assert cfg.rope_parameters["rope_theta"] == 1000000.0 and cfg.head_dim == HD
    assert not cfg.share_target_embeddings
    if rank == 0:
        assert model.markov_head is None and model.confidence_head is None


def test_deepspec_native_loads_with_a_target_and_dtype(tmp_path):
    write_deepspec(tmp_path, num_target_layers=6)
    target = make_tiny_target()
    model = DSparkDrafter.from_pretrained(tmp_path, target=target, dtype="bfloat16")
    assert model.target is target and model.fc.weight.dtype == torch.bfloat16
    assert model.input_embeddings() is model.embed_tokens  # its own (frozen) copy wins over the target's


# ---------------------------------------------------------------------------- speculators
@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_speculators_miniature_loads_exactly(tmp_path, head_type):
    weights = write_speculators(tmp_path, head_type=head_type)
    model = DSparkDrafter.from_pretrained(tmp_path)
    assert model.config.target_layer_ids == TAPS
    assert model.tap_hidden_state_ids == [i + 1 for i in TAPS]
    assert (model.config.markov_head_type, model.config.num_hidden_layers, model.config.head_dim) == (head_type, 2, HD)
    assert_same_parameters(model, weights)


def test_speculators_prefixed_names_and_identity_vocab_maps(tmp_path):
    """"model."-prefixed names are accepted; full-vocabulary d2t/t2d maps are identities and are dropped."""
    weights = write_speculators(tmp_path)
    stored = {f"model.{k}": v for k, v in weights.items()}
    stored.update(d2t=torch.zeros(V, dtype=torch.long), t2d=torch.ones(V, dtype=torch.bool))
    save_file(stored, str(tmp_path / "model.safetensors"))
    model = DSparkDrafter.from_pretrained(tmp_path)
    assert not model.config.share_target_embeddings
    assert_same_parameters(model, weights)


def test_speculators_without_sample_from_anchor_counts_drafts_not_slots(tmp_path):
    """z-lab layout: speculators' block of 7 slots drafts 6 tokens (its anchor slot drafts nothing)."""
    write_speculators(tmp_path, sample_from_anchor=False)
    cfg = DSparkDrafter.from_pretrained(tmp_path).config
    assert (cfg.sample_from_anchor, cfg.block_size, cfg.block_slots) == (False, 6, 7)
    write_speculators(tmp_path, sample_from_anchor=False, block_size=1)
    with pytest.raises(ValueError, match="sample_from_anchor=False and block_size=1: its block drafts nothing"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_speculators_reduced_draft_vocab_loads_with_its_maps(tmp_path):
    weights = write_speculators(tmp_path, draft_vocab=128)
    model = DSparkDrafter.from_pretrained(tmp_path)
    assert model.config.draft_vocab_size == 128 and model.lm_head.weight.shape[0] == 128
    assert torch.equal(model.draft_target_ids(), torch.arange(128))
    assert_same_parameters(model, weights)


def test_speculators_reduced_draft_vocab_without_maps_is_refused(tmp_path):
    weights = write_speculators(tmp_path, draft_vocab=128)
    save_file({k: v for k, v in weights.items() if k not in ("d2t", "t2d")}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="reduced vocabulary \\(128 of 256 tokens\\) but its weights lack the d2t/t2d"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_speculators_other_algorithm_is_refused(tmp_path):
    write_speculators(tmp_path, speculators_model_type="eagle3")
    with pytest.raises(ValueError, match="speculators_model_type='eagle3' is not a DSpark/DFlash checkpoint"):
        DSparkDrafter.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------- our format, export, tying
def test_save_load_round_trip_without_embeddings(tmp_path, tiny_target, tiny_drafter):
    tiny_drafter.save_pretrained(tmp_path)
    with open(tmp_path / "config.json") as f:
        assert json.load(f)["model_type"] == "dspark"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "embed_tokens.weight" not in names and "lm_head.weight" not in names
    loaded = DSparkDrafter.from_pretrained(tmp_path, target=tiny_target)
    assert_same_parameters(loaded, tiny_drafter.state_dict())
    assert loaded.config.to_dict() | {"_name_or_path": None} == tiny_drafter.config.to_dict() | {"_name_or_path": None}
    assert loaded.input_embeddings() is tiny_target.get_input_embeddings()
    assert loaded.output_head() is tiny_target.lm_head


def test_unbound_shared_drafter_asks_for_bind(tmp_path, tiny_drafter):
    tiny_drafter.save_pretrained(tmp_path)
    loaded = DSparkDrafter.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"not bound; call drafter.bind\(model\) first"):
        loaded.input_embeddings()


def test_export_deepspec_reloads_identically(tmp_path, tiny_target, tiny_drafter):
    from hf_dspark.checkpoints import export_deepspec

    export_deepspec(tiny_drafter, tmp_path, tiny_target)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["tie_word_embeddings"] is False
    assert raw["num_hidden_layers"] == 1 and raw["num_target_layers"] == 6
    reloaded = DSparkDrafter.from_pretrained(tmp_path)
    state = reloaded.state_dict()
    assert torch.equal(state.pop("embed_tokens.weight"), tiny_target.get_input_embeddings().weight)
    assert torch.equal(state.pop("lm_head.weight"), tiny_target.lm_head.weight)
    assert_same_parameters(tiny_drafter, state)
    for name in ("target_layer_ids", "block_size", "mask_token_id", "markov_rank", "markov_head_type", "head_dim",
                 "enable_confidence_head", "confidence_head_with_markov", "rope_parameters"):
        assert getattr(reloaded.config, name) == getattr(tiny_drafter.config, name), name


def test_bind_shares_the_target_embedding_modules(tiny_target, tiny_drafter):
    assert tiny_drafter.embed_tokens is None and tiny_drafter.lm_head is None
    assert tiny_drafter.input_embeddings() is tiny_target.get_input_embeddings()
    assert tiny_drafter.output_head() is tiny_target.get_output_embeddings()
    assert tiny_drafter.target is tiny_target
    assert not any(p is tiny_target.lm_head.weight for p in tiny_drafter.parameters())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(vocab_size=300), "vocab_size 256 != target's 300"),
        (dict(hidden_size=96), "hidden_size 64 != target's 96"),
        (dict(num_hidden_layers=8), "num_target_layers 6 != target's 8 layers"),
    ],
)
def test_bind_refuses_a_target_that_does_not_fit(tiny_drafter, overrides, message):
    with pytest.raises(ValueError, match=message + ".*load the drafter trained for this target"):
        tiny_drafter.bind(make_tiny_target(**overrides))


def test_require_target_refuses_another_target(tiny_drafter):
    with pytest.raises(ValueError, match="bound to a different target"):
        tiny_drafter.require_target(make_tiny_target())


# ---------------------------------------------------------------------------- bad checkpoints
def test_missing_weights(tmp_path):
    weights = write_deepspec(tmp_path)
    del weights["fc.weight"], weights["layers.1.mlp.up_proj.weight"]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing 2 weights \(fc.weight, layers.1.mlp.up_proj.weight\)"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_extra_weights(tmp_path):
    weights = write_deepspec(tmp_path)
    weights["layers.2.mlp.up_proj.weight"] = torch.zeros(FFN, H)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"unexpected 1 weights \(layers.2.mlp.up_proj.weight\).*describes another drafter"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_wrong_weight_shape(tmp_path):
    weights = write_deepspec(tmp_path)
    weights["fc.weight"] = torch.zeros(H, 3 * H)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"fc.weight has shape \(64, 192\) but the config expects \(64, 128\)"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_truncated_safetensors(tmp_path):
    write_deepspec(tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors is truncated or corrupt.*download or save the drafter again"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_unknown_architecture(tmp_path):
    write_deepspec(tmp_path, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(ValueError, match="Unknown drafter architecture \\['LlamaForCausalLM'\\]"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_gemma4_dspark_is_not_implemented(tmp_path):
    write_deepspec(tmp_path, architectures=["Gemma4DSparkModel"], model_type="gemma4_text")
    with pytest.raises(NotImplementedError, match="Gemma4DSparkModel"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_deepspec_config_without_dspark_fields(tmp_path):
    write_deepspec(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    del raw["target_layer_ids"]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="lacks target_layer_ids"):
        DSparkDrafter.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_size=10**7), "hidden_size=10000000 is absurdly large"),
        (dict(vocab_size=10**10), "vocab_size=10000000000 is absurdly large"),
        (dict(num_hidden_layers=100_000), "num_hidden_layers=100000 is absurdly large"),
        (dict(hidden_size=0), "hidden_size=0 must be a positive integer"),
        (dict(target_layer_ids=[1, 5]), "taps the target's last layer 5"),
        (dict(block_size=65), r"block_size=65 must be an integer in \[1, 64\]"),
    ],
)
def test_bad_config_is_refused_before_allocation(tmp_path, monkeypatch, overrides, message):
    write_deepspec(tmp_path, **overrides)

    def no_allocation(*args, **kwargs):
        raise AssertionError("the drafter was constructed before the config was validated")

    monkeypatch.setattr(DSparkDrafter, "__init__", no_allocation)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        DSparkDrafter.from_pretrained(tmp_path)
    assert time.perf_counter() - start < 2.0


class _Trap:
    """Unpickling this creates a sentinel file: proof that a loader ran pickle."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return open, (str(self.sentinel), "w")


def test_pickled_weights_are_never_loaded(tmp_path, monkeypatch):
    config = json.loads(json.dumps(dict(QWEN3_TARGET, architectures=["Qwen3DSparkModel"], num_hidden_layers=2,
                                        **dspark_fields(2, R, "vanilla", True, True))))
    (tmp_path / "config.json").write_text(json.dumps(config))
    sentinel = tmp_path / "UNPICKLED"
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(_Trap(sentinel)))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with pytest.raises(ValueError, match="no .safetensors weights \\(found pytorch_model.bin: pickled weights are never loaded"):
        DSparkDrafter.from_pretrained(tmp_path)
    assert not sentinel.exists()


def test_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_config_that_is_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    save_file({"x": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        DSparkDrafter.from_pretrained(tmp_path)


def test_missing_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="check the"):
        DSparkDrafter.from_pretrained(str(tmp_path / "no" / "such" / "drafter"))


def test_weights_of_another_drafter_are_refused(tmp_path):
    # a drafter saved with one config cannot silently load another's weights
    target = make_tiny_target()
    make_tiny_drafter(target, markov_head_type="gated").save_pretrained(tmp_path / "gated")
    make_tiny_drafter(target, markov_head_type="rnn").save_pretrained(tmp_path / "rnn")
    (tmp_path / "rnn" / "model.safetensors").replace(tmp_path / "gated" / "model.safetensors")
    with pytest.raises(ValueError, match="missing 2 weights \\(markov_head.gate_proj.bias"):
        DSparkDrafter.from_pretrained(tmp_path / "gated", target=target)


BAD_MAPS = {
    "t2d missing": (lambda d2t, t2d: (d2t, None), "weights lack the d2t/t2d maps"),
    "d2t wrong shape": (lambda d2t, t2d: (d2t[:-1], t2d), "d2t must be an integer tensor of shape \\[draft_vocab_size=128\\]"),
    "d2t float": (lambda d2t, t2d: (d2t.float(), t2d), "d2t must be an integer tensor"),
    "t2d not bool": (lambda d2t, t2d: (d2t, t2d.long()), "t2d must be a bool tensor of shape \\[vocab_size=256\\]"),
    "t2d wrong shape": (lambda d2t, t2d: (d2t, t2d[:-1]), "t2d must be a bool tensor"),
    "maps disagree": (lambda d2t, t2d: (d2t, torch.roll(t2d, 1)), "t2d and d2t disagree"),
    "outside the vocabulary": (lambda d2t, t2d: (d2t + 200, t2d), "outside the target vocabulary"),
    "duplicated ids": (lambda d2t, t2d: (torch.cat([d2t[:1], d2t[1:] - 1]), t2d), "two draft ids to the same target id"),
}


@pytest.mark.parametrize("case", list(BAD_MAPS))
def test_bad_vocabulary_maps_are_refused_before_the_model_is_built(tmp_path, case, monkeypatch):
    weights = write_speculators(tmp_path, draft_vocab=128)
    change, message = BAD_MAPS[case]
    d2t, t2d = change(weights["d2t"], weights["t2d"])
    stored = {k: v for k, v in weights.items() if k not in ("d2t", "t2d")}
    stored.update({k: v for k, v in (("d2t", d2t), ("t2d", t2d)) if v is not None})
    save_file(stored, str(tmp_path / "model.safetensors"))
    monkeypatch.setattr(DSparkDrafter, "__init__", lambda *a, **k: pytest.fail("the model was built"))
    with pytest.raises(ValueError, match=message):
        DSparkDrafter.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "layer_config, message",
    [
        (dict(layer_types=["sliding_attention", "chunked_attention"], use_sliding_window=True, sliding_window=8),
         "layer_types holds chunked_attention, which hf_dspark does not implement"),
        (dict(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, sliding_window=0),
         "sliding_window=0 must be a positive integer"),
        (dict(layer_types=["sliding_attention"], use_sliding_window=True, sliding_window=8),
         "layer_types lists 1 layers but num_hidden_layers is 2"),
        (dict(model_type="gemma3"), "transformer_layer_config.model_type='gemma3' is not implemented"),
    ],
    ids=["unknown-layer-type", "window-0", "layer-count", "layer-model"],
)
def test_speculators_layouts_we_do_not_implement_are_refused_by_name(tmp_path, layer_config, message):
    write_speculators(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["transformer_layer_config"].update(layer_config)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message):
        DSparkDrafter.from_pretrained(tmp_path)


def test_speculators_sliding_layers_without_use_sliding_window_are_full_attention(tmp_path):
    """Qwen3Config drops the window unless use_sliding_window: speculators' masks are then the full ones."""
    write_speculators(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2, sliding_window=8)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = DSparkDrafter.from_pretrained(tmp_path).config
    assert not any(cfg.sliding_layers) and cfg.sliding_window is None


def test_deepspec_export_refuses_what_it_cannot_express(tmp_path):
    target = make_tiny_target()
    reduced = DSparkDrafter(DSparkConfig.from_target(target.config, mask_token_id=255, draft_vocab_size=100)).bind(target)
    with pytest.raises(ValueError, match="export_deepspec cannot write a reduced-vocabulary drafter"):
        export_deepspec(reduced, tmp_path)
    sliding = DSparkDrafter(DSparkConfig.from_target(
        target.config, mask_token_id=255, layer_types=["sliding_attention"], sliding_window=16)).bind(target)
    with pytest.raises(ValueError, match="export_deepspec cannot write sliding_attention layers"):
        export_deepspec(sliding, tmp_path)


@pytest.mark.parametrize("fmt", ["hf_dspark", "speculators"])
def test_reduced_vocab_sliding_zlab_drafter_round_trips_in_both_formats(tmp_path, fmt):
    """Our format stores the vocabulary part under speculators' names (d2t, t2d, lm_head over D rows, W2 over D);
    both formats reload the same drafter, layer layout and block layout included."""
    target = make_tiny_target()
    cfg = DSparkConfig.from_target(target.config, mask_token_id=255, draft_vocab_size=100, num_hidden_layers=2,
                                   layer_types=["sliding_attention", "full_attention"], sliding_window=12,
                                   sample_from_anchor=False, block_size=5)
    torch.manual_seed(0)
    drafter = DSparkDrafter(cfg).bind(target)
    drafter.set_draft_vocab(torch.randperm(255)[:100])
    drafter.save_pretrained(tmp_path, format=fmt)
    reloaded = DSparkDrafter.from_pretrained(tmp_path, target=target)
    assert_same_parameters(reloaded, drafter.state_dict())
    for name in ("draft_vocab_size", "layer_types", "sliding_window", "sliding_window_non_causal", "sample_from_anchor",
                 "block_size", "block_slots"):
        assert getattr(reloaded.config, name) == getattr(cfg, name), name
    stored = set(safe_open_keys(tmp_path / "model.safetensors"))
    assert {"d2t", "t2d", "lm_head.weight", "markov_head.markov_w2.weight"} <= stored and "embed_tokens.weight" not in stored
    if fmt == "speculators":
        raw = json.loads((tmp_path / "config.json").read_text())
        assert (raw["block_size"], raw["sample_from_anchor"], raw["draft_vocab_size"]) == (6, False, 100)


def safe_open_keys(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())
