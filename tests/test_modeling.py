"""DSparkDrafter forward pieces: shapes for every Markov head, DFlash without heads, block and context semantics."""

import pytest
import torch
from conftest import make_tiny_drafter, make_tiny_target

N, C, B = 2, 5, 7  # rows, context tokens, block size
V, H, R, MASK = 256, 64, 16, 255


def context(drafter, seed=1, positions=None):
    """Random taps for C context tokens -> (features [N, C, H], per-layer K/V)."""
    g = torch.Generator().manual_seed(seed)
    taps = torch.randn(N, C, len(drafter.config.target_layer_ids) * H, generator=g)
    features = drafter.context_features(taps)
    positions = torch.arange(C).expand(N, C) if positions is None else positions
    return features, drafter.context_kv(features, positions)


def block(anchor=(5, 9), start=C):
    """[anchor, MASK x (B-1)] ids [N, B] at positions start..start+B-1 [N, B], and an all-visible mask."""
    ids = torch.full((N, B), MASK)
    ids[:, 0] = torch.tensor(anchor)
    positions = torch.arange(start, start + B).expand(N, B)
    return ids, positions, torch.ones(N, 1, B, C + B, dtype=torch.bool)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_forward_shapes(tiny_target, head_type):
    drafter = make_tiny_drafter(tiny_target, markov_head_type=head_type)
    assert drafter.tap_hidden_state_ids == [i + 1 for i in drafter.config.target_layer_ids]
    with torch.no_grad():
        features, kv = context(drafter)
        assert features.shape == (N, C, H)
        assert len(kv) == drafter.config.num_hidden_layers
        for k, v in kv:
            assert k.shape == v.shape == (N, 2, C, 16)
        ids, positions, mask = block()
        hidden = drafter.block_hidden(ids, positions, kv, mask)
        assert hidden.shape == (N, B, H)
        logits = drafter.base_logits(hidden)
        assert logits.shape == (N, B, V)
        torch.testing.assert_close(logits, tiny_target.lm_head(hidden))
        prev = ids[:, 0]
        latent, state = drafter.markov_latent(prev, hidden[:, 0])
        assert latent.shape == (N, R)
        assert (state is not None) == (head_type == "rnn")
        if state is not None:
            assert state.shape == (N, R)
        assert drafter.markov_bias(latent).shape == (N, V)
        conf = drafter.confidence_logit(hidden, ids)
        assert conf.shape == (N, B) and conf.dtype == torch.float32
        assert drafter.confidence_head.proj.weight.shape == (1, H + R)
        assert drafter.markov_head.block_bias(ids, hidden).shape == (N, B, V)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_teacher_forced_block_bias_equals_stepping(tiny_target, head_type):
    drafter = make_tiny_drafter(tiny_target, markov_head_type=head_type)
    g = torch.Generator().manual_seed(3)
    prev = torch.randint(0, V, (N, B), generator=g)
    hidden = torch.randn(N, B, H, generator=g)
    with torch.no_grad():
        forced = drafter.markov_head.block_bias(prev, hidden)
        state, stepped = None, []
        for k in range(B):
            latent, state = drafter.markov_latent(prev[:, k], hidden[:, k], state)
            stepped.append(drafter.markov_bias(latent))
    torch.testing.assert_close(forced, torch.stack(stepped, dim=1), rtol=0, atol=1e-6)


def test_rnn_state_carries_across_positions(tiny_target):
    drafter = make_tiny_drafter(tiny_target, markov_head_type="rnn")
    torch.nn.init.normal_(drafter.markov_head.joint_proj.weight, std=0.5)
    prev = torch.tensor([[4, 4], [7, 4]])  # same token at position 1, different history
    hidden = torch.zeros(N, 2, H)
    with torch.no_grad():
        bias = drafter.markov_head.block_bias(prev, hidden)
    assert not torch.allclose(bias[0, 1], bias[1, 1])


def test_dflash_has_no_markov_or_confidence_parameters(tiny_target):
    drafter = make_tiny_drafter(tiny_target, markov_rank=0)
    names = list(dict(drafter.named_parameters()))
    assert not any(n.startswith(("markov_head", "confidence_head")) for n in names)
    assert drafter.markov_head is None and drafter.confidence_head is None
    with torch.no_grad():
        _, kv = context(drafter)
        ids, positions, mask = block()
        hidden = drafter.block_hidden(ids, positions, kv, mask)
    assert drafter.markov_latent(ids[:, 0], hidden[:, 0]) == (None, None)
    assert drafter.confidence_logit(hidden, ids) is None


def test_confidence_head_without_markov_input(tiny_target):
    drafter = make_tiny_drafter(tiny_target, confidence_head_with_markov=False)
    assert drafter.confidence_head.proj.weight.shape == (1, H)
    assert drafter.confidence_logit(torch.randn(N, B, H), torch.zeros(N, B, dtype=torch.long)).shape == (N, B)


def test_block_attention_is_bidirectional(tiny_drafter):
    """Changing the last MASK slot's input changes the first slot's hidden state: no causal mask in the block."""
    with torch.no_grad():
        _, kv = context(tiny_drafter)
        ids, positions, mask = block()
        before = tiny_drafter.block_hidden(ids, positions, kv, mask)
        ids[:, -1] = 17
        after = tiny_drafter.block_hidden(ids, positions, kv, mask)
    assert not torch.allclose(before[:, 0], after[:, 0], atol=1e-4)
    assert not torch.allclose(before[:, 1], after[:, 1], atol=1e-4)


def test_masked_context_positions_do_not_influence_the_block(tiny_drafter):
    hidden_cols = [1, 3]
    with torch.no_grad():
        features, kv = context(tiny_drafter)
        ids, positions, mask = block()
        mask[:, :, :, hidden_cols] = False
        reference = tiny_drafter.block_hidden(ids, positions, kv, mask)
        perturbed = features.clone()
        perturbed[:, hidden_cols] = torch.randn(N, len(hidden_cols), H) * 10
        kv_perturbed = tiny_drafter.context_kv(perturbed, torch.arange(C).expand(N, C))
        torch.testing.assert_close(tiny_drafter.block_hidden(ids, positions, kv_perturbed, mask), reference, rtol=0, atol=1e-6)
        perturbed[:, 0] += 1.0  # a visible position does matter
        kv_visible = tiny_drafter.context_kv(perturbed, torch.arange(C).expand(N, C))
        assert not torch.allclose(tiny_drafter.block_hidden(ids, positions, kv_visible, mask), reference, atol=1e-4)


def test_context_kv_is_append_only(tiny_drafter):
    """K/V of a context computed in two chunks equals K/V computed at once (positions carried explicitly)."""
    with torch.no_grad():
        features, whole = context(tiny_drafter)
        positions = torch.arange(C).expand(N, C)
        first = tiny_drafter.context_kv(features[:, :2], positions[:, :2])
        rest = tiny_drafter.context_kv(features[:, 2:], positions[:, 2:])
    for (k, v), (k1, v1), (k2, v2) in zip(whole, first, rest):
        torch.testing.assert_close(torch.cat([k1, k2], dim=2), k)
        torch.testing.assert_close(torch.cat([v1, v2], dim=2), v)


def test_only_relative_positions_matter(tiny_drafter):
    """RoPE: shifting context and block positions together leaves the block hidden states unchanged."""
    with torch.no_grad():
        _, kv = context(tiny_drafter)
        ids, positions, mask = block()
        reference = tiny_drafter.block_hidden(ids, positions, kv, mask)
        _, kv_shifted = context(tiny_drafter, positions=torch.arange(C).expand(N, C) + 100)
        shifted = tiny_drafter.block_hidden(ids, positions + 100, kv_shifted, mask)
        torch.testing.assert_close(shifted, reference, rtol=1e-4, atol=1e-4)
        moved = tiny_drafter.block_hidden(ids, positions + 1, kv, mask)  # anchor off its true position
    assert not torch.allclose(moved, reference, atol=1e-4)


def test_rows_are_independent(tiny_drafter):
    """A packed batch of rows gives each row what it gets alone."""
    with torch.no_grad():
        _, kv = context(tiny_drafter)
        ids, positions, mask = block()
        together = tiny_drafter.block_hidden(ids, positions, kv, mask)
        alone = tiny_drafter.block_hidden(ids[1:], positions[1:], [(k[1:], v[1:]) for k, v in kv], mask[1:])
    torch.testing.assert_close(together[1:], alone, rtol=1e-5, atol=1e-5)


def test_a_query_that_sees_nothing_gives_finite_output(tiny_drafter):
    with torch.no_grad():
        _, kv = context(tiny_drafter)
        ids, positions, mask = block()
        mask[1] = False
        hidden = tiny_drafter.block_hidden(ids, positions, kv, mask)
    assert torch.isfinite(hidden).all()


@pytest.mark.parametrize(
    "rope",
    [None, {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}],
    ids=["default", "llama3"],
)
def test_rope_matches_the_target(rope):
    target = make_tiny_target(**({"rope_parameters": rope} if rope else {}))
    drafter = make_tiny_drafter(target)
    torch.testing.assert_close(drafter.rotary.inv_freq, target.model.rotary_emb.inv_freq)
    positions = torch.arange(6)[None]
    cos, sin = drafter.rotary(positions, torch.float32)
    ref_cos, ref_sin = target.model.rotary_emb(torch.zeros(1, 6, H), positions)
    torch.testing.assert_close(cos[:, 0], ref_cos)
    torch.testing.assert_close(sin[:, 0], ref_sin)


def test_unbound_shared_drafter_cannot_embed(tiny_target):
    from hf_dspark import DSparkConfig, DSparkDrafter

    drafter = DSparkDrafter(DSparkConfig.from_target(tiny_target.config, mask_token_id=MASK))
    with pytest.raises(ValueError, match=r"not bound; call drafter.bind\(model\) first"):
        drafter.output_head()
    with pytest.raises(ValueError, match="not bound to a target"):
        drafter.require_target()


def test_calling_the_drafter_directly_explains_the_entry_points(tiny_drafter):
    with pytest.raises(TypeError, match="assistant_model=drafter"):
        tiny_drafter(torch.zeros(1, 1, dtype=torch.long))
