"""Drafters written by speculators' own classes (tests/fixtures/speculators, built by
scripts/make_speculators_fixtures.py in speculators' venv) load here and compute what speculators computes: draft
logits, Markov-corrected and confidence logits (teacher-forced), greedy drafts -- through the drafting path (one
anchor at a time, the drafter's context cache) and through the training packing (all anchors in one pass). Also the
round trip: a reduced-vocabulary drafter trained here, exported, that speculators loaded and ran. speculators itself
is never imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from hf_dspark import DSparkDrafter
from hf_dspark.draft_context import DraftContext
from hf_dspark.drafting import draft_block
from hf_dspark.processing import Processing
from hf_dspark.training.packing import pack_blocks

FIXTURES = Path(__file__).parent / "fixtures" / "speculators"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.safetensors").is_file())
TOL = 1e-4


@pytest.fixture(scope="module")
def verifier() -> Qwen3ForCausalLM:
    """The tiny verifier: its config, embeddings and lm_head (the drafter never runs its layers: taps are given)."""
    target = Qwen3ForCausalLM(Qwen3Config(**json.loads((FIXTURES / "verifier_config.json").read_text()))).float().eval()
    weights = load_file(str(FIXTURES / "verifier.safetensors"))
    with torch.no_grad():
        target.model.embed_tokens.weight.copy_(weights["model.embed_tokens.weight"])
        target.lm_head.weight.copy_(weights["lm_head.weight"])
    return target


def load_case(name: str, verifier) -> tuple[DSparkDrafter, dict[str, torch.Tensor]]:
    drafter = DSparkDrafter.from_pretrained(FIXTURES / name, target=verifier, dtype=torch.float32)
    return drafter, load_file(str(FIXTURES / name / "reference.safetensors"))


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert float((got.float() - want.float()).abs().max()) <= TOL


def teacher_prev(ids: torch.Tensor, p: int, drafter: DSparkDrafter) -> torch.Tensor:
    """Slot k's previous token under teacher forcing: x_{p+k}, or x_{p+k-1} in the z-lab layout (whose slot k
    predicts x_{p+k}; its anchor slot sees the anchor) -- speculators' DSpark forward."""
    b = drafter.config.block_slots
    tokens = ids[p : p + b]
    return tokens if drafter.config.sample_from_anchor else torch.cat([tokens[:1], tokens[:-1]])


def test_every_layout_is_covered():
    assert {"dspark_vanilla_full_vocab", "dspark_gated_reduced_vocab", "dspark_rnn_reduced_vocab_noncausal",
            "dspark_default_layout", "dflash_sample_from_anchor", "dflash_zlab_layout", "dspark_rnn_zlab_layout",
            "roundtrip_hf_dspark_export"} <= set(CASES)


@pytest.mark.parametrize("name", CASES)
def test_config_translation(name, verifier):
    drafter, _ = load_case(name, verifier)
    raw = json.loads((FIXTURES / name / "config.json").read_text())
    cfg = drafter.config
    layer = raw["transformer_layer_config"]
    assert cfg.block_slots == raw["block_size"] and cfg.sample_from_anchor == raw["sample_from_anchor"]
    assert cfg.block_size == raw["block_size"] - (0 if raw["sample_from_anchor"] else 1)  # drafts per round
    assert cfg.target_layer_ids == [i - 1 for i in raw["aux_hidden_state_layer_ids"]]
    assert drafter.draft_vocab_size == raw["draft_vocab_size"]
    if layer.get("use_sliding_window") and "sliding_attention" in layer.get("layer_types", []):
        assert cfg.layer_types == layer["layer_types"] and cfg.sliding_window == layer["sliding_window"]
    else:
        assert not any(cfg.sliding_layers)
    assert cfg.sliding_window_non_causal == raw["sliding_window_non_causal"]


@pytest.mark.parametrize("name", CASES)
def test_drafting_path_matches_speculators(name, verifier):
    """One anchor at a time, as generation drafts: context = taps before the anchor through DraftContext."""
    drafter, ref = load_case(name, verifier)
    ids, taps, anchors = ref["input_ids"][0], ref["hidden_states"], ref["anchors"].tolist()
    greedy = Processing(None, do_sample=False)
    for a, p in enumerate(anchors):
        ctx = DraftContext(drafter)
        ctx.append(taps[:, :p], torch.arange(p)[None])
        kv = ctx.kv()
        b = drafter.config.block_slots
        block = torch.full((1, b), drafter.config.mask_token_id)
        block[0, 0] = ids[p]
        positions = p + torch.arange(b)[None]
        mask = torch.ones(1, 1, b, p + b, dtype=torch.bool)
        with torch.no_grad():
            hidden = drafter.block_hidden(block, positions, kv, mask)[0]  # [B, H]
            base = drafter.base_logits(hidden)
            close(base, ref["draft_logits"][a])
            prev = teacher_prev(ids, p, drafter)
            logits = base
            if drafter.markov_head is not None:
                logits = base + drafter.markov_head.block_bias(prev, hidden)
            close(logits, ref["teacher_forced_logits"][a])
            if "teacher_forced_conf_logits" in ref:
                close(drafter.confidence_logit(hidden, prev), ref["teacher_forced_conf_logits"][a])
            draft = draft_block(drafter, ids[p : p + 1], torch.tensor([p]), kv, torch.ones(1, p, dtype=torch.bool), greedy)
        assert draft.tokens[0].tolist() == ref["greedy_drafts"][a].tolist()
        if "greedy_conf_logits" in ref:
            close(draft.conf_logits[0], ref["greedy_conf_logits"][a])


@pytest.mark.parametrize("name", CASES)
def test_training_packing_matches_speculators(name, verifier):
    """All anchors in one packed pass (hf_dspark.training.packing), sliding layers included."""
    drafter, ref = load_case(name, verifier)
    ids, taps, anchors = ref["input_ids"], ref["hidden_states"], ref["anchors"]
    t, b = ids.shape[1], drafter.config.block_slots
    packed = pack_blocks(ids, torch.ones_like(ids, dtype=torch.bool), anchors[None], b, drafter.config.mask_token_id)
    prev = torch.stack([teacher_prev(ids[0], p, drafter) for p in anchors.tolist()])  # [A, B]
    with torch.no_grad():
        kv = drafter.context_kv(drafter.context_features(taps), torch.arange(t)[None])
        hidden = drafter.block_hidden(packed.block_ids, packed.positions, kv, packed.mask).view(len(anchors), b, -1)
        close(drafter.base_logits(hidden), ref["draft_logits"])
        if drafter.markov_head is not None:
            bias = drafter.markov_head.block_bias(prev, hidden)
            close(drafter.base_logits(hidden) + bias, ref["teacher_forced_logits"])
        if "teacher_forced_conf_logits" in ref:
            close(drafter.confidence_logit(hidden, prev), ref["teacher_forced_conf_logits"])


def test_the_sliding_window_matters_in_these_fixtures(verifier):
    """Guard against a vacuous test: drafting the sliding fixture with full attention would differ."""
    drafter, ref = load_case("dspark_vanilla_full_vocab", verifier)
    drafter.config.layer_types = None
    ids, taps, anchors = ref["input_ids"], ref["hidden_states"], ref["anchors"]
    b = drafter.config.block_size
    packed = pack_blocks(ids, torch.ones_like(ids, dtype=torch.bool), anchors[None], b, drafter.config.mask_token_id)
    with torch.no_grad():
        kv = drafter.context_kv(drafter.context_features(taps), torch.arange(ids.shape[1])[None])
        hidden = drafter.block_hidden(packed.block_ids, packed.positions, kv, packed.mask).view(len(anchors), b, -1)
        assert float((drafter.base_logits(hidden) - ref["draft_logits"]).abs().max()) > 0.1


def test_export_writes_what_speculators_loaded(verifier, tmp_path):
    """Re-exporting the round-trip drafter reproduces the committed export (that speculators loaded and matched)."""
    drafter, _ = load_case("roundtrip_hf_dspark_export", verifier)
    drafter.save_pretrained(tmp_path, format="speculators")
    want = json.loads((FIXTURES / "roundtrip_hf_dspark_export" / "config.json").read_text())
    got = json.loads((tmp_path / "config.json").read_text())
    want["speculators_config"]["verifier"]["name_or_path"] = got["speculators_config"]["verifier"]["name_or_path"]
    assert got == want
    mine, theirs = load_file(str(tmp_path / "model.safetensors")), load_file(
        str(FIXTURES / "roundtrip_hf_dspark_export" / "model.safetensors"))
    assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
