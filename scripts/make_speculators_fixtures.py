"""Build tests/fixtures/speculators/: tiny checkpoints written by speculators' own classes and their reference outputs.

One command regenerates everything (speculators lives in its own venv; tests/fixtures/speculators/README.md says how
to make it):

    .venv/bin/python scripts/make_speculators_fixtures.py [--speculators-python /work/spec-venv/bin/python]

It runs three stages, each in the interpreter it needs:
1. `speculators` (speculators' venv): a tiny Qwen3 verifier (only its config, embeddings and lm_head are kept), then
   for every case a DSpark/DFlash drafter built with speculators' classes (random fp32 weights), saved with its
   `save_pretrained`, reloaded with its `from_pretrained`, and run on fixed inputs with fixed anchors (eager attention;
   sdpa must agree within 1e-5): draft logits, Markov-corrected teacher-forced logits and confidence logits, and
   greedy drafts (the Markov chain over the drafter's own argmax tokens, using speculators' heads).
2. `export` (this project's venv): an hf_dspark drafter with a reduced vocabulary (chosen from its training data's
   token counts) and sliding-window layers, trained a few steps with hf_dspark.training, exported with
   `export_speculators`.
3. `roundtrip` (speculators' venv): that export loaded with speculators' `from_pretrained` and run as in stage 1.
The tests (tests/test_speculators_fixtures.py) read only the committed files; they never import speculators.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "speculators"
V, H, I, HEADS, KV, HD, TARGET_LAYERS = 64, 16, 32, 2, 1, 8, 4
MASK = V - 1
T = 24  # tokens in the test sequence
ANCHORS = [3, 8, 13, 19]  # fixed anchors; the windows below (3, 5) are smaller than most prefixes
TAPS = [1, 2]  # speculators' aux_hidden_state_layer_ids (= our target_layer_ids + 1)

# name -> (speculators type, block, draft vocab, markov rank, head type, layer_types, window, non-causal, sample_from_anchor)
CASES = {
    "dspark_vanilla_full_vocab": ("dspark", 4, V, 8, "vanilla", ["sliding_attention", "full_attention"], 5, False, True),
    "dspark_gated_reduced_vocab": ("dspark", 4, 40, 8, "gated", ["full_attention", "sliding_attention"], 3, False, True),
    "dspark_rnn_reduced_vocab_noncausal": ("dspark", 3, 48, 4, "rnn", ["sliding_attention", "sliding_attention"], 3, True, True),
    "dspark_default_layout": ("dspark", 4, V, 8, "vanilla", None, None, False, True),  # speculators' own defaults
    "dflash_sample_from_anchor": ("dflash", 4, 48, 0, None, ["sliding_attention", "full_attention"], 3, False, True),
    "dflash_zlab_layout": ("dflash", 4, V, 0, None, ["full_attention"], None, False, False),
    "dspark_rnn_zlab_layout": ("dspark", 4, 40, 4, "rnn", ["full_attention", "sliding_attention"], 3, False, False),
}


# ---------------------------------------------------------------------------------------------------- speculators side
def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {
        "input_ids": torch.randint(0, MASK, (1, T), generator=g),
        "hidden_states": torch.randn(1, T, len(TAPS) * H, generator=g),
        "verifier_last_hidden_states": torch.randn(1, T, H, generator=g),
        "anchors": torch.tensor(ANCHORS),
    }


def _verifier(folder: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=TARGET_LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, max_position_embeddings=256,
                      tie_word_embeddings=False)
    Qwen3ForCausalLM(cfg).save_pretrained(folder)


def _layer_config(case):
    from transformers import Qwen3Config

    _, _, _, _, _, types, window, _, _ = case
    kw = dict(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=2 if types != ["full_attention"] else 1,
              num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, max_position_embeddings=256,
              tie_word_embeddings=False)
    if types is None:  # speculators' train CLI default: every layer sliding, window 2048
        kw.update(layer_types=["sliding_attention"] * 2, sliding_window=2048, use_sliding_window=True)
    elif window is not None:
        kw.update(layer_types=types, sliding_window=window, use_sliding_window=True)
    return Qwen3Config(**kw)


def _build(name, case, verifier: Path, folder: Path) -> None:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    kind, block, draft_vocab, rank, head, _, _, non_causal, from_anchor = case
    spec = SpeculatorsConfig(algorithm=kind, proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=block)],
                             default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(str(verifier)))
    common = dict(transformer_layer_config=_layer_config(case), draft_vocab_size=draft_vocab, block_size=block,
                  aux_hidden_state_layer_ids=TAPS, mask_token_id=MASK, sliding_window_non_causal=non_causal,
                  sample_from_anchor=from_anchor, speculators_config=spec)
    if kind == "dspark":
        cfg = DSparkSpeculatorConfig(**common, markov_rank=rank, markov_head_type=head)
        cls = DSparkDraftModel
    else:
        cfg = DFlashSpeculatorConfig(**common)
        cls = DFlashDraftModel
    torch.manual_seed(sum(map(ord, name)))
    model = cls(cfg)
    for pname, p in model.named_parameters():  # random weights everywhere (norms too, so that they matter)
        if pname.startswith(("embed_tokens", "verifier_lm_head", "lm_head")):
            continue
        with torch.no_grad():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if pname.endswith("norm.weight") else 0.3 * torch.randn_like(p))
    t2d = d2t = None
    if draft_vocab != V:
        ids = torch.randperm(V - 1)[:draft_vocab].sort().values  # never the mask row
        t2d = torch.zeros(V, dtype=torch.bool)
        t2d[ids] = True
        d2t = ids - torch.arange(draft_vocab)
    model.load_vocab_mappings(t2d, d2t)
    model.load_verifier_weights()
    if draft_vocab != V:  # a trained reduced head differs from the verifier's rows
        with torch.no_grad():
            model.lm_head.weight.add_(0.1 * torch.randn_like(model.lm_head.weight))
    model.save_pretrained(folder)
    for extra in folder.glob("*.py"):  # speculators copies its config module; the checkpoint does not need it
        extra.unlink()


def _load(folder: Path, attn: str):
    from speculators import SpeculatorModel, SpeculatorModelConfig

    cfg = SpeculatorModelConfig.from_pretrained(str(folder))
    cfg.transformer_layer_config._attn_implementation = attn
    return SpeculatorModel.from_pretrained(str(folder), config=cfg).float().eval()


def _reference(model) -> dict[str, torch.Tensor]:
    """Run speculators' own forward pieces with the fixed anchors."""
    import speculators.models.dflash.core as core

    x = _inputs()
    anchors = x["anchors"]
    saved = core.select_anchors
    core.select_anchors = lambda loss_mask, n, block: (anchors.clone(), torch.ones(len(anchors), dtype=torch.bool))
    try:
        with torch.no_grad():
            hidden, logits, _, _, idx = model._backbone_forward(
                x["hidden_states"], x["input_ids"], torch.ones(1, T), x["verifier_last_hidden_states"],
                torch.zeros(1, T, dtype=torch.long), max_anchors=len(anchors))
    finally:
        core.select_anchors = saved
    a, b = len(anchors), model.block_size
    hidden = hidden.view(a, b, -1)
    logits = logits.view(a, b, -1)
    out = {**x, "draft_logits": logits.clone()}
    markov = getattr(model, "markov_head", None)
    conf_head = getattr(model, "confidence_head", None)
    with_markov = markov is not None and getattr(model.config, "confidence_head_with_markov", False)

    def heads(prev):  # prev [A, B] target ids -> (bias [A, B, D] or 0, confidence logits [A, B] or None)
        bias = markov.block_bias(prev_token_ids=prev, hidden_states=hidden) if markov is not None else 0.0
        conf = None
        if conf_head is not None:
            feats = torch.cat([hidden, markov.prev_embeddings(prev).to(hidden.dtype)], -1) if with_markov else hidden
            conf = conf_head(feats)
        return bias, conf

    first = 0 if model.config.sample_from_anchor else 1  # z-lab layout: the anchor slot drafts nothing
    with torch.no_grad():
        tokens = x["input_ids"][0, idx].view(a, b)  # x_{p..p+B-1}
        # teacher forcing, as speculators' DSpark forward: slot k's previous token is x_{p+k} (x_{p+k-1} without
        # sample_from_anchor, where slot k predicts x_{p+k})
        prev = tokens if first == 0 else torch.cat([tokens[:, :1], tokens[:, :-1]], 1)
        bias, conf = heads(prev)
        out["teacher_forced_logits"] = logits + bias
        if conf is not None:
            out["teacher_forced_conf_logits"] = conf
        # greedy drafting: the first draft slot's previous token is the anchor, then the drafter's own argmax tokens
        drafted = prev.clone()
        d2t = model.d2t if model.d2t is not None else torch.zeros(logits.shape[-1], dtype=torch.long)
        picks = []
        for k in range(first, b):
            bias, conf = heads(drafted)
            pick = (logits + bias)[:, k].argmax(-1)
            picks.append(pick + d2t[pick])
            if k + 1 < b:
                drafted[:, k + 1] = picks[-1]
        out["greedy_drafts"] = torch.stack(picks, 1)
        if conf is not None:
            out["greedy_conf_logits"] = conf[:, first:]
    return {k: v.contiguous() for k, v in out.items()}


def _record(folder: Path) -> dict:
    from safetensors.torch import save_file

    eager = _reference(_load(folder, "eager"))
    sdpa = _reference(_load(folder, "sdpa"))
    gap = max(float((eager[k].float() - sdpa[k].float()).abs().max()) for k in eager)
    assert gap <= 1e-5, f"{folder.name}: eager and sdpa disagree by {gap}"
    save_file(eager, str(folder / "reference.safetensors"))
    return {"eager_vs_sdpa_max_abs": gap}


def stage_speculators() -> None:
    from importlib.metadata import version

    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        verifier = Path(tmp) / "verifier"
        _verifier(verifier)
        _keep_verifier(verifier)
        meta = {"speculators_version": version("speculators"), "cases": {}}
        for name, case in CASES.items():
            folder = OUT / name
            shutil.rmtree(folder, ignore_errors=True)
            _build(name, case, verifier, folder)
            meta["cases"][name] = _record(folder)
            _portable(folder)
        (OUT / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def _keep_verifier(verifier: Path) -> None:
    """The tests need the verifier's config, embeddings and lm_head only (the taps are given)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(verifier / "model.safetensors"))
    save_file({k: state[k] for k in ("model.embed_tokens.weight", "lm_head.weight")}, str(OUT / "verifier.safetensors"))
    cfg = json.loads((verifier / "config.json").read_text())
    (OUT / "verifier_config.json").write_text(json.dumps(cfg, indent=1) + "\n")


def _portable(folder: Path) -> None:
    """The verifier's path in speculators_config is a temp dir; point it at the (verifier-less) fixture name."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = "tiny-qwen3-verifier"
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def stage_roundtrip(folder: Path) -> None:
    """Load the hf_dspark export with speculators and record its outputs."""
    with tempfile.TemporaryDirectory() as tmp:
        verifier = Path(tmp) / "verifier"
        _verifier(verifier)  # same seed: same embeddings and lm_head as the committed verifier
        cfg = json.loads((folder / "config.json").read_text())
        cfg["speculators_config"]["verifier"]["name_or_path"] = str(verifier)
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        meta = _record(folder)
        _portable(folder)
    path = OUT / "meta.json"
    all_meta = json.loads(path.read_text())
    all_meta["cases"][folder.name] = meta
    path.write_text(json.dumps(all_meta, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------------- hf_dspark side
def stage_export(folder: Path) -> None:
    """An hf_dspark drafter with a reduced vocabulary chosen from the data's token counts, a sliding and a full layer
    and a gated head, trained a few steps here (hf_dspark.training), exported with `export_speculators`."""
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hf_dspark.checkpoints import export_speculators
    from hf_dspark.training.trainer import Trainer, TrainConfig, build_drafter, choose_draft_vocab

    torch.manual_seed(7)
    target = Qwen3ForCausalLM(Qwen3Config(**json.loads((OUT / "verifier_config.json").read_text()))).float().eval()
    weights = load_file(str(OUT / "verifier.safetensors"))
    with torch.no_grad():
        target.model.embed_tokens.weight.copy_(weights["model.embed_tokens.weight"])
        target.lm_head.weight.copy_(weights["lm_head.weight"])

    class Sequences:  # TokenDataset's interface: (input_ids [T], loss_mask [T]); no cached taps
        def __init__(self, n: int) -> None:
            g = torch.Generator().manual_seed(11)
            self.rows = [torch.randint(0, MASK // 2, (40,), generator=g) for _ in range(n)]  # tokens < 31 only

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, i: int):
            mask = torch.ones(len(self.rows[i]), dtype=torch.bool)
            mask[:8] = False  # the "prompt"
            return self.rows[i], mask

        def cached_hidden(self, i: int):
            return None

    data = Sequences(12)
    ids, coverage = choose_draft_vocab(data, 40, V)
    print(f"draft vocabulary: 40 of {V} tokens, {coverage:.1%} of the response tokens")
    drafter = build_drafter(
        target, None, draft_token_ids=ids, init_from_target=False, mask_token_id=MASK,
        target_layer_ids=[t - 1 for t in TAPS], num_hidden_layers=2, block_size=4, markov_rank=8,
        markov_head_type="gated", layer_types=["sliding_attention", "full_attention"], sliding_window=4)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(drafter, target, data, TrainConfig(data_dir=tmp, out_dir=tmp, max_steps=20, num_anchors=8,
                                                             lr=3e-3, eval_sequences=2), log=lambda *a, **k: None)
        losses = [trainer.train_step() for _ in range(20)]
    print(f"trained 20 steps: loss {losses[0].get('loss', float('nan')):.3f} -> {losses[-1].get('loss', float('nan')):.3f}")
    drafter.eval()
    shutil.rmtree(folder, ignore_errors=True)
    export_speculators(drafter, folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=["all", "speculators", "export", "roundtrip"], default="all")
    parser.add_argument("--speculators-python", default="/work/spec-venv/bin/python",
                        help="python of the venv where speculators is installed")
    args = parser.parse_args()
    roundtrip = OUT / "roundtrip_hf_dspark_export"
    if args.stage == "speculators":
        stage_speculators()
    elif args.stage == "export":
        stage_export(roundtrip)
    elif args.stage == "roundtrip":
        stage_roundtrip(roundtrip)
    else:
        me = str(Path(__file__).resolve())
        subprocess.run([args.speculators_python, me, "--stage", "speculators"], check=True, cwd=ROOT)
        subprocess.run([sys.executable, me, "--stage", "export"], check=True, cwd=ROOT)
        subprocess.run([args.speculators_python, me, "--stage", "roundtrip"], check=True, cwd=ROOT)
        print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
