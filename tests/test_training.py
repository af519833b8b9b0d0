"""Training: losses by hand, the packed attention mask, exact resume, data shards and bad input."""

import argparse
import collections
import copy
import errno
import json
import math

from pathlib import Path

import pytest
import torch
from _tiny_models import MASK_ID, tiny_drafter, tiny_target, tiny_tokenizer

from hf_dspark.training import data as data_mod
from hf_dspark.training.cli import _eval_dataset, add_subcommands
from hf_dspark.training.data import DataError, GenerationSettings, TokenDataset, last_of_shuffle, make_data, read_prompts
from hf_dspark.training.evaluate import drop_heldout_conversations
from hf_dspark.training.losses import (
    LossWeights,
    draft_log_softmax_at,
    dspark_losses,
    expected_tau,
    replayed_decoding,
    sparse_target,
)
from hf_dspark.training.packing import pack_blocks, pad_batch, sample_anchors
from hf_dspark.training.trainer import (
    TrainConfig,
    Trainer,
    _malloc_trim,
    anonymous_memory_mb,
    drafter_step_outputs,
    lr_lambda,
    release_freed_memory,
)

PROMPTS = ["hello there", "abc def", "x y z", "qq rr", "one two three", "the cat sat", "foo bar", "lorem ipsum"]


@pytest.fixture(scope="module")
def tiny():
    return tiny_target(), tiny_tokenizer()


@pytest.fixture(scope="module")
def data_dir(tiny, tmp_path_factory):
    model, tok = tiny
    out = tmp_path_factory.mktemp("data")
    make_data(model, tok, PROMPTS, out, GenerationSettings(max_new_tokens=24, batch_size=4, prompts_per_shard=4), log=lambda *_: None)
    return out


# ------------------------------------------------------------------------------------------------ losses
def _slots(draft, target_logits, labels, valid, conf, weights, k=32):
    """Run dspark_losses on the valid slots of [M, B, ...] tensors, as the trainer does."""
    where = valid.nonzero(as_tuple=True)
    target = sparse_target(target_logits[where], k) if target_logits is not None else None
    return dspark_losses(draft[where], where[1], target, labels[where], None if conf is None else conf[where], weights, draft.shape[1])


def test_losses_match_a_hand_computed_example():
    ln3 = math.log(3.0)
    draft = torch.tensor([[[0.0, 0.0], [ln3, 0.0]]])  # q = [.5, .5], [.75, .25]
    target = torch.tensor([[[ln3, 0.0], [0.0, 0.0]]])  # p = [.75, .25], [.5, .5]
    labels = torch.tensor([[0, 1]])
    valid = torch.tensor([[True, True]])
    conf = torch.zeros(1, 2)  # sigmoid = .5
    out = _slots(draft, target, labels, valid, conf, LossWeights(ce=0.1, l1=0.9, bce=1.0, kl=1.0))
    w1 = math.exp(-1 / 4)
    ce = (math.log(2) + w1 * math.log(4)) / (1 + w1)  # -ln .5 at slot 0, -ln .25 at slot 1
    l1 = 0.5  # |.5-.75| + |.5-.25| at both slots
    bce = math.log(2)  # soft label 1 - TV = .75 at both slots, prediction .5: -(.75 ln .5 + .25 ln .5)
    kl0 = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    kl1 = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    kl = (kl0 + w1 * kl1) / (1 + w1)
    assert out["ce"].item() == pytest.approx(ce, abs=1e-6)
    assert out["l1"].item() == pytest.approx(l1, abs=1e-6)
    assert out["bce"].item() == pytest.approx(bce, abs=1e-6)
    assert out["kl"].item() == pytest.approx(kl, abs=1e-6)
    assert out["loss"].item() == pytest.approx(0.1 * ce + 0.9 * l1 + 1.0 * bce + kl, abs=1e-6)
    assert out["soft_accept"].item() == pytest.approx(0.75)
    # an invalid slot changes nothing; the DFlash twin is CE only; an undraftable label (-1) is left out of CE
    out2 = _slots(draft, target, labels, torch.tensor([[True, False]]), conf, LossWeights.dflash())
    assert out2["loss"].item() == pytest.approx(math.log(2), abs=1e-6)
    out3 = _slots(draft, target, torch.tensor([[0, -1]]), valid, conf, LossWeights.dflash())
    assert out3["loss"].item() == pytest.approx(math.log(2), abs=1e-6)


def test_ce_against_the_target_argmax_ignores_the_data_token():
    ln3 = math.log(3.0)
    draft = torch.tensor([[[0.0, ln3], [ln3, 0.0]]])  # q = [.25, .75], [.75, .25]
    target = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # argmax 0, then 1
    sampled = torch.tensor([[1, 0]])  # a sampled answer's tokens: the other token at both slots
    valid = torch.tensor([[True, True]])
    on_target = _slots(draft, target, sampled, valid, None, LossWeights(ce=1.0, bce=0.0, kl=0.0, ce_label="target"))
    on_data = _slots(draft, target, sampled, valid, None, LossWeights(ce=1.0, bce=0.0, kl=0.0))
    assert on_target["ce"].item() == pytest.approx(math.log(4), abs=1e-6)  # -ln .25 at both slots
    assert on_data["ce"].item() == pytest.approx(-math.log(0.75), abs=1e-6)
    assert LossWeights(ce=1.0, bce=0.0, kl=0.0, ce_label="target").needs_target
    with pytest.raises(ValueError, match="ce_label='argmax'"):
        LossWeights(ce_label="argmax")


def test_accept_loss_is_one_minus_the_block_prefix_probability_of_the_greedy_labels():
    ln3 = math.log(3.0)
    # two blocks of three slots; the second block's last slot is past its valid prefix
    draft = torch.tensor([[[ln3, 0.0], [0.0, ln3], [0.0, 0.0]], [[0.0, 0.0], [ln3, 0.0], [9.0, 0.0]]])
    target = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]])  # argmax
    valid = torch.tensor([[True, True, True], [True, True, False]])
    data = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w = LossWeights(ce=0.0, bce=0.0, kl=0.0, accept=1.0, ce_label="target")
    out = _slots(draft.clone().requires_grad_(), target, data, valid, None, w)
    # q of the argmax: .75, .75, .5 then .5, .75: prefix products .75, .5625, .28125, .5, .375
    expected = 1 - (0.75 + 0.5625 + 0.28125 + 0.5 + 0.375) / 5
    assert out["acc"].item() == pytest.approx(expected, abs=1e-6)
    assert out["loss"].item() == pytest.approx(expected, abs=1e-6)
    assert w.needs_target
    # on the data's tokens without a target: an undraftable label (-1) ends its block's prefix
    undraftable = torch.tensor([[1, -1, 1], [0, 0, 0]])
    out2 = _slots(draft, None, undraftable, valid, None, LossWeights(ce=0.0, bce=0.0, kl=0.0, accept=1.0))
    # q of the data's token: .25, 0 (undraftable), .5 then .5, .75
    assert out2["acc"].item() == pytest.approx(1 - (0.25 + 0.0 + 0.0 + 0.5 + 0.375) / 5, abs=1e-6)
    # the gradient vanishes at slots after a draft that cannot be accepted (its log q is floored at -60)
    d = draft.clone().requires_grad_()
    _slots(d, None, undraftable, valid, None, LossWeights(ce=0.0, bce=0.0, kl=0.0, accept=1.0))["loss"].backward()
    assert d.grad[0, 2].abs().sum() < 1e-20 and d.grad[0, 0].abs().sum() > 0.01


def test_sparse_target_keeps_the_top_k_and_l1_counts_the_draft_mass_outside_it():
    target = torch.tensor([[[5.0, 4.0, -30.0, -30.0]]])  # mass outside the top 2 is ~1e-15
    draft = torch.tensor([[[0.0, 0.0, 0.0, 0.0]]])  # q uniform: 0.5 of its mass outside the target's top 2
    out = _slots(draft, target, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool), None, LossWeights(l1=1.0, kl=0.0, bce=0.0), k=2)
    p = torch.softmax(torch.tensor([5.0, 4.0]), 0)
    assert out["l1"].item() == pytest.approx(float((0.25 - p).abs().sum() + 0.5), abs=1e-6)


def test_soft_label_is_detached_and_expected_tau_counts_prefixes():
    draft = torch.randn(3, 4, 10, requires_grad=True)
    conf = torch.zeros(3, 4, requires_grad=True)
    out = _slots(draft, torch.randn(3, 4, 10), torch.zeros(3, 4, dtype=torch.long), torch.ones(3, 4, dtype=torch.bool), conf, LossWeights(0, 0, 1, kl=0.0))
    out["loss"].backward()
    assert draft.grad is None or draft.grad.abs().sum() == 0  # BCE reaches only the confidence logit
    match = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert expected_tau(match, torch.ones_like(match)) == pytest.approx(1 + (2 + 0 + 4) / 3)


def test_replayed_decoding_visits_the_positions_decoding_visits():
    # anchors 10..17, block 3; the block at 10 accepts 2 + bonus -> 13 rejects at once -> 14 accepts all -> 18: gone
    anchors = torch.arange(10, 18)
    match = torch.zeros(8, 3, dtype=torch.bool)
    match[0] = torch.tensor([1, 1, 0])
    match[4] = torch.tensor([1, 1, 1])
    match[1] = match[2] = torch.tensor([1, 1, 1])  # easy positions decoding skips: they must not count
    valid = torch.ones_like(match)
    assert replayed_decoding(anchors, match, valid) == ([10, 13, 14], [3, 1, 4])
    valid[4, 2] = False  # the answer ends inside the block at 14 (last anchor 16): its valid prefix + bonus, then stop
    assert replayed_decoding(anchors[:7], match[:7], valid[:7]) == ([10, 13, 14], [3, 1, 3])
    assert replayed_decoding(anchors[:0], match[:0], valid[:0]) == ([], [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_draft_log_softmax_gives_the_unfused_values_and_gradients(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(10, 50) * 6).to(dtype)
    ids = torch.randint(0, 50, (10, 4))
    g_lse, g_at = torch.randn(10), torch.randn(10, 4)
    x = logits.clone().requires_grad_(True)
    lse = torch.logsumexp(x.float(), -1)
    at = x.gather(-1, ids).float()
    (lse * g_lse).sum().add((at * g_at).sum()).backward()
    for rows in (1, 3, 10, None):  # chunks of one row, a ragged last chunk, one chunk, the default
        y = logits.clone().requires_grad_(True)
        lse2, at2, top = draft_log_softmax_at(y, ids, rows)
        (lse2 * g_lse).sum().add((at2 * g_at).sum()).backward()
        torch.testing.assert_close(lse2, lse)
        torch.testing.assert_close(at2, at)
        assert torch.equal(top, logits.float().argmax(-1))
        assert y.grad.dtype == dtype
        torch.testing.assert_close(y.grad, x.grad)


# ------------------------------------------------------------------------------------------------ packing
def test_packed_mask_hides_context_at_and_after_each_anchor_and_padding_blocks_see_nothing():
    torch.manual_seed(0)
    t, b = 30, 4
    ids = torch.randint(0, 100, (2, t))
    lm = torch.zeros(2, t, dtype=torch.bool)
    lm[0, 8:] = True
    lm[1, 5:20] = True  # row 1 is shorter (padding after 20)
    anchors = [sample_anchors(lm[0], 6, torch.Generator().manual_seed(1)), sample_anchors(lm[1], 3, torch.Generator().manual_seed(2))]
    x, m, _, anc = pad_batch([(ids[0], lm[0]), (ids[1, :20], lm[1, :20])], anchors, 0)
    packed = pack_blocks(x, m, anc, b, MASK_ID)
    a = anc.shape[1]
    mask = packed.mask.dense()[:, 0]  # [N, A*B, T + A*B]
    for n in range(2):
        for blk in range(a):
            rows = mask[n, blk * b : (blk + 1) * b]
            p = int(anc[n, blk])
            if p < 0:
                assert not rows.any(), "a padding block must see nothing"
                assert not packed.valid[n, blk].any()
                continue
            assert rows[:, :p].all() and not rows[:, p:t].any(), "context visible iff position < anchor"
            block_cols = rows[:, t:].view(b, a, b)
            assert block_cols[:, blk].all() and block_cols.sum() == b * b, "only the own block is visible"
            assert packed.positions[n, blk * b : (blk + 1) * b].tolist() == list(range(p, p + b))
            assert packed.block_ids[n, blk * b] == x[n, p] and (packed.block_ids[n, blk * b + 1 : (blk + 1) * b] == MASK_ID).all()
            v = packed.valid[n, blk]
            assert v.tolist() == sorted(v.tolist(), reverse=True), "supervised slots form a prefix"
            for k in range(b):
                inside = p + k + 1 < x.shape[1] and bool(m[n, p + k + 1])
                assert bool(v[k]) == (inside and bool(v[: k].all()))
                if v[k]:
                    assert packed.labels[n, blk, k] == x[n, p + k + 1]
                    assert packed.prev_ids[n, blk, k] == x[n, p + k]
    assert (anc[1] >= 0).sum() == 3 and (anc[1] < 0).sum() == a - 3
    # anchors cover p and p + 1 inside the response
    assert all(lm[0, p] and lm[0, p + 1] for p in anchors[0].tolist())


def test_packed_block_attention_gives_the_full_masked_attention_and_its_gradients(tiny):
    model, _ = tiny
    drafter = tiny_drafter(model).float()  # 4 query heads over 2 key/value heads
    torch.manual_seed(0)
    t, b = 24, drafter.config.block_size
    x = torch.randint(3, 100, (2, t))
    lm = torch.zeros(2, t, dtype=torch.bool)
    lm[0, 6:] = True
    lm[1, 4:14] = True
    anchors = [sample_anchors(lm[0], 5, torch.Generator().manual_seed(1)), sample_anchors(lm[1], 2, torch.Generator().manual_seed(2))]
    ids, m, _, anc = pad_batch([(x[0], lm[0]), (x[1, :14], lm[1, :14])], anchors, 0)
    packed = pack_blocks(ids, m, anc, b, MASK_ID)
    taps = torch.randn(2, ids.shape[1], drafter.fc.in_features)
    real = (anc >= 0).repeat_interleave(b, dim=1)  # [N, A*B] queries of real blocks (padding ones are unused)
    outs, grads = [], []
    for mask in (packed.mask, packed.mask.dense()):
        drafter.zero_grad()
        ctx_kv = drafter.context_kv(drafter.context_features(taps), torch.arange(ids.shape[1]).expand(2, -1))
        h = drafter.block_hidden(packed.block_ids, packed.positions, ctx_kv, mask)[real]
        h.square().sum().backward()
        outs.append(h.detach())
        grads.append(drafter.layers[0].self_attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    # fp32 sums in another order (the packed mask's blocks against one dense mask): differences scale with the
    # gradient (max ~6 here; 1.3e-5 seen on a 2-core Xeon with AMX), so the absolute tolerance does too
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5 * float(grads[1].abs().max()))


# ------------------------------------------------------------------------------------------------ trainer
def _trainer(model, tok, data_dir, out, seed=1, **kw):
    kw = {"max_steps": 8, "num_anchors": 6, "eval_every": 0, "eval_sequences": 2, "checkpoint_minutes": 0, **kw}
    cfg = TrainConfig(str(data_dir), str(out), **kw)
    return Trainer(tiny_drafter(model, seed=seed), model, TokenDataset(data_dir, model, tok), cfg, pad_id=0, log=lambda *_: None)


def test_resume_after_a_kill_restores_optimizer_data_position_and_next_loss(tiny, data_dir, tmp_path, monkeypatch):
    model, tok = tiny
    ref = _trainer(model, tok, data_dir, tmp_path / "ref")
    for _ in range(3):
        ref.train_step()
    snap = copy.deepcopy(ref.state_dict())
    ref_next = ref.train_step()["loss"]

    run = _trainer(model, tok, data_dir, tmp_path / "run")
    real_step, calls = Trainer.train_step, {"n": 0}

    def killed_at_fourth(self):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("simulated kill")
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", killed_at_fourth)
    with pytest.raises(KeyboardInterrupt):
        run.run(progress=False)
    monkeypatch.setattr(Trainer, "train_step", real_step)

    resumed = _trainer(model, tok, data_dir, tmp_path / "run", seed=99)  # different init: must come from the checkpoint
    assert resumed.load_checkpoint()
    assert (resumed.step, resumed.epoch, resumed.cursor) == (snap["step"], snap["epoch"], snap["cursor"]) == (3, snap["epoch"], snap["cursor"])
    opt_a, opt_b = snap["optimizer"]["state"], resumed.optimizer.state_dict()["state"]
    assert opt_a.keys() == opt_b.keys()
    for k in opt_a:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a[k][name], opt_b[k][name])
    assert resumed.scheduler.state_dict()["last_epoch"] == snap["scheduler"]["last_epoch"]
    assert resumed.train_step()["loss"] == ref_next


def test_training_lowers_the_loss_and_writes_history_and_drafter(tiny, data_dir, tmp_path):
    model, tok = tiny
    tr = _trainer(model, tok, data_dir, tmp_path / "t", lr=3e-3)
    first = tr.train_step()["loss"]
    for _ in range(7):
        last = tr.train_step()["loss"]
    tr._record({"loss": last})
    tr.save_checkpoint()
    assert last < first
    hist = json.loads((tmp_path / "t" / "history.json").read_text())
    assert hist[-1]["step"] == 8 and "eval_tau_tf" in hist[-1]
    assert (tmp_path / "t" / "drafter" / "model.safetensors").is_file()


def test_decoded_anchors_are_where_replayed_greedy_decoding_starts_its_blocks(tiny, data_dir, tmp_path):
    model, tok = tiny
    tr = _trainer(model, tok, data_dir, tmp_path / "d", lr=3e-3, anchors="decoded", num_anchors=1 << 20)
    for _ in range(4):
        stats = tr.train_step()
    assert math.isfinite(stats["loss"])
    idx, gen = tr.next_batch()
    ids, lm, all_anc, feats = tr.batch_tensors(idx, gen, 1 << 20)
    anc, feats = tr.decoded_batch_anchors(ids, lm, feats, gen)
    out, packed, match = drafter_step_outputs(tr.drafter, model, ids, lm, all_anc, tr.cfg.losses, feats)
    match, valid = match.view(*all_anc.shape, -1), packed.valid
    visited_some_later = False
    for r in range(len(idx)):
        real = all_anc[r] >= 0
        path, _ = replayed_decoding(all_anc[r][real], match[r][real], valid[r][real])
        assert anc[r][anc[r] >= 0].tolist() == path  # the teacher-forced replay of the loss pass's own matches
        assert path[0] == int(all_anc[r][0])  # decoding starts at the first response token
        visited_some_later |= len(path) < int(real.sum())
    assert visited_some_later  # some block accepted drafts, so decoding skipped positions


def test_a_pickled_trainer_checkpoint_of_an_earlier_version_is_refused_not_unpickled(tiny, data_dir, tmp_path, monkeypatch):
    model, tok = tiny
    tr = _trainer(model, tok, data_dir, tmp_path / "old")
    legacy = tmp_path / "old" / "checkpoint" / "trainer_state.pt"
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"\x80\x04 a pickle from an earlier version")
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with pytest.raises(ValueError, match="does not unpickle.*--init .*old/drafter"):
        tr.load_checkpoint()
    tr.train_step()
    tr.save_checkpoint()  # the new format sits beside it and is what resumes
    again = _trainer(model, tok, data_dir, tmp_path / "old")
    assert again.load_checkpoint() and again.step == 1


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(tiny, data_dir, tmp_path, monkeypatch):
    from hf_dspark.training import trainer as trainer_mod

    model, tok = tiny
    tr = _trainer(model, tok, data_dir, tmp_path / "full")
    tr.train_step()
    tr.save_checkpoint()
    tr.train_step()

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer_mod, "save_file", full_disk)
    with pytest.raises(OSError, match="Disk full .* previous checkpoint is intact"):
        tr.save_checkpoint()
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "full" / "checkpoint").iterdir()] == ["trainer_state.safetensors"]
    again = _trainer(model, tok, data_dir, tmp_path / "full")
    assert again.load_checkpoint() and again.step == 1


def test_resume_with_other_max_steps_is_refused(tiny, data_dir, tmp_path):
    model, tok = tiny
    tr = _trainer(model, tok, data_dir, tmp_path / "r")
    tr.train_step()
    tr.save_checkpoint()
    other = _trainer(model, tok, data_dir, tmp_path / "r")
    other.cfg.max_steps = 99
    with pytest.raises(ValueError, match="--max-steps"):
        other.load_checkpoint()


def test_ema_of_the_weights_is_evaluated_exported_and_resumed_while_training_moves_the_live_weights(tiny, data_dir, tmp_path):
    from safetensors.torch import load_file

    model, tok = tiny
    tr = _trainer(model, tok, data_dir, tmp_path / "e", lr=3e-3, ema_decay=0.5)
    expected = [p.detach().clone() for p in tr.params]  # the average starts at the initial weights
    for _ in range(3):
        tr.train_step()
        expected = [0.5 * e + 0.5 * p.detach() for e, p in zip(expected, tr.params)]
    for avg, e, p in zip(tr.ema, expected, tr.params):
        assert torch.allclose(avg, e, atol=1e-6)
    assert any(not torch.equal(avg, p) for avg, p in zip(tr.ema, tr.params))
    live = [p.detach().clone() for p in tr.params]
    with tr.averaged_weights():
        averaged_eval = tr.evaluate()["eval_tau_tf"]
        assert all(torch.equal(p, avg) for p, avg in zip(tr.params, tr.ema))
    assert all(torch.equal(p, w) for p, w in zip(tr.params, live))  # the live weights come back
    assert tr._record({})["eval_tau_tf"] == averaged_eval  # the learning curve measures the average
    tr.save_checkpoint()
    exported = load_file(str(tmp_path / "e" / "drafter" / "model.safetensors"))
    shared = [(name, avg) for name, avg in zip(tr.param_names, tr.ema) if name in exported]
    assert len(shared) >= len(tr.params) // 2
    for name, avg in shared:
        assert torch.allclose(exported[name].float(), avg, atol=1e-6), name
    assert all(torch.equal(p, w) for p, w in zip(tr.params, live))

    resumed = _trainer(model, tok, data_dir, tmp_path / "e", seed=99, lr=3e-3, ema_decay=0.5)
    assert resumed.load_checkpoint()
    assert all(torch.equal(a, b) for a, b in zip(resumed.ema, tr.ema))
    tr.train_step(), resumed.train_step()
    assert all(torch.equal(a, b) for a, b in zip(resumed.ema, tr.ema))
    other = _trainer(model, tok, data_dir, tmp_path / "e", ema_decay=0.9)
    with pytest.raises(ValueError, match="--ema-decay"):
        other.load_checkpoint()


def test_ema_decay_outside_0_1_is_refused_by_name(tmp_path):
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--ema-decay", "1.0"])
    from hf_dspark.training.cli import _loop_config

    with pytest.raises(SystemExit, match=r"--ema-decay 1.0 must be in \[0, 1\)"):
        _loop_config(args)


def test_a_time_spanned_schedule_follows_training_time_and_ends_the_run(tiny, data_dir, tmp_path):
    model, tok = tiny
    tr = _trainer(model, tok, data_dir, tmp_path / "s", schedule_minutes=1.0, warmup_ratio=0.25)
    tr.cfg.max_steps = 1000  # a cap far away: the time decides
    assert tr.schedule_step(3) == 3 and not tr.schedule_done()
    tr.elapsed = 30.0  # half the training time spent: the cosine is past its warmup, at the schedule's middle
    assert tr.schedule_step(3) == 500
    lr = lr_lambda(tr.schedule_step(3), 1000, 0.25)
    assert 0.0 < lr < 1.0 and abs(lr - 0.5 * (1 + math.cos(math.pi * 250 / 750))) < 1e-9
    tr.elapsed = 60.0
    assert tr.schedule_done() and tr.run(progress=False)["step"] == 0  # spent: no further step
    tr.save_checkpoint()
    other = _trainer(model, tok, data_dir, tmp_path / "s", schedule_minutes=2.0)
    other.cfg.max_steps = 1000
    with pytest.raises(ValueError, match="--schedule-minutes"):
        other.load_checkpoint()


# ------------------------------------------------------------------------------------------------ data
def test_a_weighted_data_dir_repeats_its_sequences_per_epoch_but_never_the_held_out_ones(tiny, data_dir, tmp_path):
    model, tok = tiny
    ds = TokenDataset(f"{data_dir},{data_dir}:3", model, tok)
    n = len(ds) // 2
    assert ds.repeats == [1] * n + [3] * n
    cfg = TrainConfig(str(data_dir), str(tmp_path / "w"), max_steps=2, eval_sequences=2)
    tr = Trainer(tiny_drafter(model), model, ds, cfg, pad_id=0, log=lambda *_: None)
    counts = collections.Counter(tr.train_index)
    assert all(counts[i] == 1 for i in range(n)) and all(counts[i] == 3 for i in range(n, 2 * n - 2))
    assert tr.eval_index == [2 * n - 2, 2 * n - 1] and not set(tr.eval_index) & set(counts)
    for bad in ("0", "x", "-2"):
        with pytest.raises(DataError, match="whole number >= 1"):
            TokenDataset(f"{data_dir}:{bad}", model, tok)


def test_eval_data_is_held_out_instead_of_the_training_data_and_never_trains(tiny, data_dir, tmp_path):
    model, tok = tiny
    s = GenerationSettings(max_new_tokens=12, batch_size=4, prompts_per_shard=4)
    make_data(model, tok, last_of_shuffle(PROMPTS, 3), tmp_path / "held", s, log=lambda *_: None)
    ds, held = TokenDataset(data_dir, model, tok), TokenDataset(tmp_path / "held", model, tok)
    cfg = TrainConfig(str(data_dir), str(tmp_path / "w"), max_steps=2, num_anchors=4, eval_sequences=2)
    tr = Trainer(tiny_drafter(model), model, ds, cfg, pad_id=0, log=lambda *_: None, eval_dataset=held)
    assert sorted(set(tr.train_index)) == list(range(len(ds)))  # nothing of the training data is held out
    assert tr.eval_index == [len(held) - 2, len(held) - 1]
    other = Trainer(tiny_drafter(model), model, ds, cfg, pad_id=0, log=lambda *_: None, eval_dataset=ds)
    assert tr.evaluate()["eval_soft_accept"] != other.evaluate()["eval_soft_accept"]  # the same drafter, other sequences
    # the CLI refuses held-out data that is also training data
    args = argparse.Namespace(eval_data=f"{tmp_path / 'held'}")
    with pytest.raises(SystemExit, match="also in --data"):
        _eval_dataset(args, TokenDataset(f"{data_dir},{tmp_path / 'held'}:2", model, tok), model, tok)


def test_heldout_prompts_are_the_ones_make_data_never_reaches(tiny, tmp_path):
    model, tok = tiny
    s = GenerationSettings(max_new_tokens=4, batch_size=4, prompts_per_shard=4)
    make_data(model, tok, PROMPTS, tmp_path, s, max_prompts=len(PROMPTS) - 3, log=lambda *_: None)
    used = {tuple(ids[: int(mask.nonzero()[0])].tolist()) for ids, mask in TokenDataset(tmp_path, model, tok)}
    chat = lambda p: tuple(data_mod._chat_ids(tok, p, None))  # noqa: E731 - the prompt ids make-data writes
    held = last_of_shuffle(PROMPTS, 3)
    assert len(used) == len(PROMPTS) - 3 and not {chat(p) for p in held} & used
    assert {chat(p) for p in PROMPTS} == used | {chat(p) for p in held}
    with pytest.raises(ValueError, match="held-out set of 8 prompts"):
        last_of_shuffle(PROMPTS, len(PROMPTS))
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"text": p}) + "\n" for p in PROMPTS))
    for extra, error, match in (([], ValueError, "held-out set of 0 prompts"),
                                (["--as-written"], SystemExit, "cannot honour it")):
        args = parser.parse_args(["make-data", "--prompts", str(prompts), "--out", str(tmp_path / "h"), "--heldout", "0", *extra])
        with pytest.raises(error, match=match):
            args.func(args)
    assert not (tmp_path / "h").exists()


def test_later_turns_answer_a_conversation_in_its_middle(tiny, tmp_path):
    """make-data --later-turns: each second and later user turn, the turns before it as written, through the chat
    template; the same prompts read back from JSONL `messages` lines."""
    model, tok = tiny
    convs = tmp_path / "convs.json"
    turns = ["hello there", "hi", "abc def", "ok", "x y z"]
    convs.write_text(json.dumps([
        {"conversations": [{"from": "human" if i % 2 == 0 else "gpt", "value": t} for i, t in enumerate(turns)]},
        {"conversations": [{"from": "human", "value": "qq rr"}, {"from": "gpt", "value": "ss"}]},
    ]))
    prompts = data_mod.later_turn_prompts(data_mod.read_conversations(convs))
    assert [[m["content"] for m in p] for p in prompts] == [turns[:3], turns[:5]]
    kept = drop_heldout_conversations(data_mod.read_conversations(convs), held={"hello there"})
    assert data_mod.later_turn_prompts(kept) == [] and [m["content"] for m in kept[0]] == ["qq rr", "ss"]  # held out
    lines = tmp_path / "p.jsonl"
    lines.write_text("".join(json.dumps({"messages": p}) + "\n" for p in prompts) + json.dumps({"text": "foo bar"}) + "\n")
    assert read_prompts(lines) == [*prompts, "foo bar"]
    made = make_data(model, tok, prompts, tmp_path / "d", GenerationSettings(max_new_tokens=4, batch_size=2),
                     log=lambda *_: None)
    assert made["next_prompt"] == 2
    chat = {tuple(tok.apply_chat_template(p, add_generation_prompt=True, return_dict=True)["input_ids"]) for p in prompts}
    assert {tuple(ids[: int(m.nonzero()[0])].tolist()) for ids, m in TokenDataset(tmp_path / "d", model, tok)} == chat
    lines.write_text(json.dumps({"messages": prompts[0][:2]}) + "\n")  # ends with the assistant's turn
    with pytest.raises(DataError, match="p.jsonl:1: 'messages' must alternate"):
        read_prompts(lines)
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["make-data", "--prompts", str(convs), "--out", str(tmp_path / "e"), "--as-written",
                              "--later-turns"])
    with pytest.raises(SystemExit, match="--later-turns picks prompts"):
        args.func(args)


def test_start_prompt_continues_another_directory_without_repeating_a_prompt(tiny, tmp_path):
    model, tok = tiny
    s = GenerationSettings(max_new_tokens=4, batch_size=4, prompts_per_shard=2)
    first = make_data(model, tok, PROMPTS, tmp_path / "a", s, max_prompts=3, log=lambda *_: None)
    rest = make_data(model, tok, PROMPTS, tmp_path / "b", s, start_prompt=first["next_prompt"], log=lambda *_: None)
    assert [x["prompt_range"] for x in rest["shards"]] == [[3, 5], [5, 7], [7, 8]]
    prompt_ids = lambda d: {tuple(ids[: int(m.nonzero()[0])].tolist()) for ids, m in TokenDataset(d, model, tok)}  # noqa: E731
    a, b = prompt_ids(tmp_path / "a"), prompt_ids(tmp_path / "b")
    assert len(a) == 3 and len(b) == len(PROMPTS) - 3 and not a & b
    with pytest.raises(DataError, match="started at prompt 3 of the seeded order, not 0"):
        make_data(model, tok, PROMPTS, tmp_path / "b", s, log=lambda *_: None)
    with pytest.raises(DataError, match="outside the 8 prompts"):
        make_data(model, tok, PROMPTS, tmp_path / "c", s, start_prompt=len(PROMPTS), log=lambda *_: None)
    with pytest.raises(DataError, match="--max-prompts 3 .* --start-prompt 3 there is nothing to generate"):
        make_data(model, tok, PROMPTS, tmp_path / "c", s, start_prompt=3, max_prompts=3, log=lambda *_: None)
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["make-data", "--prompts", "sharegpt", "--out", str(tmp_path / "d"), "--as-written",
                              "--start-prompt", "5"])
    with pytest.raises(SystemExit, match="--start-prompt picks prompts"):
        args.func(args)
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_make_data_resumes_without_duplicates_or_holes(tiny, tmp_path):
    model, tok = tiny
    s = GenerationSettings(max_new_tokens=6, batch_size=2, prompts_per_shard=2)
    make_data(model, tok, PROMPTS, tmp_path, s, max_prompts=3, log=lambda *_: None)  # "killed" after 2 shards
    (tmp_path / "shard-00002.safetensors").write_bytes(b"half-written shard from a killed run")
    man = make_data(model, tok, PROMPTS, tmp_path, s, log=lambda *_: None)
    ranges = [tuple(x["prompt_range"]) for x in man["shards"]]
    assert ranges == [(0, 2), (2, 3), (3, 5), (5, 7), (7, 8)]
    ds = TokenDataset(tmp_path, model, tok)
    assert len(ds) == len(PROMPTS)
    fresh = make_data(model, tok, PROMPTS, tmp_path / "fresh", s, log=lambda *_: None)
    fresh_ds = TokenDataset(tmp_path / "fresh", model, tok)
    assert sorted(tuple(x.tolist()) for x in fresh_ds.ids) == sorted(tuple(x.tolist()) for x in ds.ids)
    assert fresh["next_prompt"] == man["next_prompt"] == len(PROMPTS)
    both = TokenDataset(f"{tmp_path},{tmp_path / 'fresh'}", model, tok)  # several directories, in order
    assert len(both) == 2 * len(PROMPTS) and torch.equal(both[len(PROMPTS)][0], fresh_ds[0][0])


def test_make_data_with_the_continuous_engine_writes_the_loops_shards(tiny, tmp_path):
    """Several shards through one continuous-batching manager (kept across shards, destroyed at the end)."""
    model, tok = tiny
    model = copy.deepcopy(model)  # the run switches the attention and caches a manager while it lasts
    s = GenerationSettings(max_new_tokens=6, batch_size=2, prompts_per_shard=3)
    make_data(model, tok, PROMPTS, tmp_path / "loop", s, max_prompts=6, log=lambda *_: None)
    man = make_data(model, tok, PROMPTS, tmp_path / "cb", s, max_prompts=6, log=lambda *_: None, engine="continuous")
    assert len(man["shards"]) == 2 and getattr(model, "_cached_continuous_batching_manager", None) is None
    for a, b in zip(TokenDataset(tmp_path / "loop", model, tok).ids, TokenDataset(tmp_path / "cb", model, tok).ids):
        assert torch.equal(a, b)


def test_a_data_dir_from_another_target_or_tokenizer_is_refused(tiny, data_dir):
    model, tok = tiny
    with pytest.raises(DataError, match="made for target"):
        TokenDataset(data_dir, tiny_target(layers=4), tok)
    other_tok = tiny_tokenizer()
    other_tok.add_tokens(["<extra>"])
    with pytest.raises(DataError, match="different tokenizer"):
        TokenDataset(data_dir, model, other_tok)
    with pytest.raises(DataError, match="not a data directory"):
        TokenDataset(data_dir / "nowhere", model, tok)


def test_disk_full_during_a_shard_write_leaves_no_partial_shard(tiny, tmp_path, monkeypatch):
    model, tok = tiny

    def full_disk(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data_mod, "save_file", full_disk)
    with pytest.raises(DataError, match="Disk full"):
        make_data(model, tok, PROMPTS[:2], tmp_path, GenerationSettings(max_new_tokens=4, batch_size=2, prompts_per_shard=2), log=lambda *_: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
    assert json.loads((tmp_path / "manifest.json").read_text())["shards"] == []


def test_prompt_readers_and_bad_prompt_files(tmp_path):
    (tmp_path / "ok.jsonl").write_text('{"text": "a"}\n\n{"prompt": "b"}\n')
    assert read_prompts(tmp_path / "ok.jsonl") == ["a", "b"]
    cut = '[{"id": "1", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},\n {"id": "2", "conversations": [{"from": "gpt", "value": "x"}]},\n {"id": "3", "conversations": [{"from": "human", "value": "cut here'
    (tmp_path / "cut.json").write_text(cut)
    assert read_prompts(tmp_path / "cut.json") == ["hi"]  # truncated ShareGPT recovered object by object
    (tmp_path / "empty.jsonl").write_text("  \n")
    with pytest.raises(DataError, match="empty"):
        read_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{"text": \n')
    with pytest.raises(DataError, match="bad.jsonl:2 is not valid JSON"):
        read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "nofield.jsonl").write_text('{"foo": "a"}\n')
    with pytest.raises(DataError, match="--field"):
        read_prompts(tmp_path / "nofield.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="unknown format"):
        read_prompts(tmp_path / "x.csv")
    (tmp_path / "nohuman.json").write_text('[{"conversations": [{"from": "gpt", "value": "x"}]}]')
    with pytest.raises(DataError, match="no ShareGPT conversation"):
        read_prompts(tmp_path / "nohuman.json")
    with pytest.raises(DataError, match="does not exist"):
        read_prompts(tmp_path / "missing.jsonl")


def test_cli_registers_the_training_subcommands():
    parser = argparse.ArgumentParser(prog="hf-dspark")
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["train", "--data", "d", "--out", "o", "--dflash", "--max-steps", "5"])
    assert args.dflash and args.max_steps == 5 and args.func.__name__ == "_train"
    for cmd in ("make-data", "cache-hidden", "calibrate", "finetune", "eval-tau"):
        assert parser.parse_args([cmd] + {"make-data": ["--prompts", "p", "--out", "o"], "cache-hidden": ["--data", "d"], "calibrate": ["--drafter", "d"], "finetune": ["--drafter", "d", "--data", "x", "--out", "o"], "eval-tau": ["--drafter", "d"]}[cmd]).func


def test_train_refuses_shape_options_beside_init_by_name(tmp_path):
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--init", str(tmp_path),
                              "--block-size", "5", "--dflash"])
    with pytest.raises(SystemExit, match="--block-size describes a new drafter's shape; --init"):
        args.func(args)


def test_train_refuses_markov_head_options_beside_dflash_by_name(tmp_path):
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["train", "--data", str(tmp_path), "--out", str(tmp_path / "o"), "--dflash",
                              "--markov-head-type", "gated"])
    with pytest.raises(SystemExit, match="--markov-head-type describes a Markov head, and --dflash trains a drafter without"):
        args.func(args)


# ------------------------------------------------------------------------------------------------ real target
@pytest.mark.real
def test_short_smollm2_training_raises_tau_above_the_untrained_drafter(tmp_path):
    from hf_dspark.targets import load_target

    model, tok = load_target("smollm2-135m-instruct", dtype=torch.float32)
    torch.manual_seed(0)
    prompts = ["Write one sentence about the sea.", "List three colors."]
    make_data(model, tok, prompts, tmp_path / "d", GenerationSettings(max_new_tokens=32, batch_size=2, prompts_per_shard=2), log=lambda *_: None)
    ds = TokenDataset(tmp_path / "d", model, tok)
    from hf_dspark.training.trainer import build_drafter

    drafter = build_drafter(model, tok, markov_rank=16)
    cfg = TrainConfig(str(tmp_path / "d"), str(tmp_path / "o"), max_steps=8, num_anchors=16, lr=2e-3, warmup_ratio=0.0, eval_every=0, eval_sequences=0)
    tr = Trainer(drafter, model, ds, cfg, pad_id=tok.pad_token_id, log=lambda *_: None)
    tr.eval_index = list(range(len(ds)))  # measure on the (tiny) training set itself: this checks learning, not generalisation
    before = tr.evaluate()["eval_tau_tf"]
    for _ in range(8):
        tr.train_step()
    after = tr.evaluate()["eval_tau_tf"]
    assert after > before


def test_optional_hidden_state_cache_gives_the_online_loss(tiny, data_dir, tmp_path):
    import shutil

    model, tok = tiny
    cached_dir = tmp_path / "cached"
    shutil.copytree(data_dir, cached_dir)
    drafter = tiny_drafter(model)
    lines = []
    need = data_mod.cache_hidden_states(cached_dir, model, drafter.tap_hidden_state_ids, log=lines.append)
    assert "GiB" in lines[0] and need == TokenDataset(cached_dir).num_tokens * 3 * 64 * 2
    ds = TokenDataset(cached_dir, model, tok)
    taps, final = ds.cached_hidden(0)
    assert taps.dtype == torch.bfloat16 and taps.shape == (len(ds[0][0]), 2 * 64) and final.shape == (len(ds[0][0]), 64)
    online = _trainer(model, tok, data_dir, tmp_path / "a")
    offline = _trainer(model, tok, cached_dir, tmp_path / "b")
    lo, lc = online.train_step()["loss"], offline.train_step()["loss"]
    assert lc == pytest.approx(lo, rel=0.05)  # bf16 rounding of the cached states only
    # a batch with cached and uncached rows: the target's forward runs for the uncached rows only
    half = tmp_path / "half"
    shutil.copytree(cached_dir, half)
    for f in sorted(half.glob("taps-*.safetensors"))[::2]:
        f.unlink()
    mixed = _trainer(model, tok, half, tmp_path / "c")
    idx = [0, len(mixed.data) - 3]  # a sequence of the first shard (cache deleted) and one of the last (cached)
    assert mixed.data.cached_hidden(idx[0]) is None and mixed.data.cached_hidden(idx[1]) is not None
    ids, _, _, (taps, final) = mixed.batch_tensors(idx, torch.Generator().manual_seed(0), 4)
    ref_taps, ref_final = data_mod.target_hidden(model, ids, drafter.tap_hidden_state_ids)
    n = len(mixed.data[idx[1]][0])  # the cached row's own length (padding rows are never read)
    torch.testing.assert_close(taps[0], ref_taps[0])  # computed: exact
    torch.testing.assert_close(taps[1, :n], ref_taps[1, :n], rtol=2e-2, atol=2e-2)  # cached: bf16
    torch.testing.assert_close(final[1, :n], ref_final[1, :n], rtol=2e-2, atol=2e-2)


def test_a_feature_cache_for_other_taps_or_dtype_is_refused_by_name(tiny, data_dir, tmp_path):
    import shutil

    model, tok = tiny
    cached_dir = tmp_path / "cached"
    shutil.copytree(data_dir, cached_dir)
    drafter = tiny_drafter(model)
    data_mod.cache_hidden_states(cached_dir, model, [1, 2], log=lambda *_: None)  # not the drafter's taps [2, 4]
    with pytest.raises(DataError, match=r"tap set .*\[1, 2\].* needs \[2, 4\].*cache-hidden"):
        _trainer(model, tok, cached_dir, tmp_path / "a")
    with pytest.raises(DataError, match="tap set"):  # caching again for other taps does not mix two tap sets
        data_mod.cache_hidden_states(cached_dir, model, drafter.tap_hidden_state_ids, log=lambda *_: None)
    for f in cached_dir.glob("taps-*.safetensors"):
        f.unlink()
    bf16 = copy.deepcopy(model).to(torch.bfloat16)  # the shared fixture stays fp32
    data_mod.cache_hidden_states(cached_dir, bf16, drafter.tap_hidden_state_ids, log=lambda *_: None)
    with pytest.raises(DataError, match="target dtype bfloat16, but this run needs float32"):
        _trainer(model, tok, cached_dir, tmp_path / "b")


def test_multi_process_ranks_take_disjoint_sequences_and_only_rank_0_writes(tiny, data_dir, tmp_path):
    model, tok = tiny

    class FakeAccelerator:  # what accelerate launch gives rank r of 2 (gradients already equal here)
        def __init__(self, rank):
            self.process_index, self.num_processes = rank, 2

        def reduce(self, tensor, reduction="mean"):
            return tensor

        def wait_for_everyone(self):
            pass

    trainers = []
    for rank in (0, 1):
        cfg = TrainConfig(str(data_dir), str(tmp_path / f"r{rank}"), max_steps=4, num_anchors=4, eval_every=0, eval_sequences=2)
        trainers.append(Trainer(tiny_drafter(model), model, TokenDataset(data_dir, model, tok), cfg, log=lambda *_: None, accelerator=FakeAccelerator(rank)))
    seen = [set(), set()]
    for _ in range(3):
        for rank, tr in enumerate(trainers):
            idx, _ = tr.next_batch()
            seen[rank].update(idx)
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == 6
    for tr in trainers:
        tr.train_step()
        tr.save_checkpoint()
    assert (tmp_path / "r0" / "checkpoint").is_dir() and not (tmp_path / "r1").exists()


# ------------------------------------------------------------------------------------------------ recipe for small budgets
def test_bf16_target_trains_fp32_master_weights_and_every_tensor_moves(tiny, data_dir, tmp_path):
    """With a bf16 target (the CLI default) the drafter keeps fp32 weights: AdamW updates below bf16 resolution used
    to vanish (no RMSNorm weight ever changed)."""
    from hf_dspark.training.trainer import build_drafter

    model, tok = tiny
    target = copy.deepcopy(model).to(torch.bfloat16)
    drafter = build_drafter(target, tok, markov_rank=16, target_layer_ids=[1, 3])
    assert all(p.dtype == torch.float32 for p in drafter.parameters())
    before = {n: p.detach().clone() for n, p in drafter.named_parameters() if p.requires_grad}
    cfg = TrainConfig(str(data_dir), str(tmp_path / "o"), max_steps=4, num_anchors=6, lr=1e-3, warmup_ratio=0.0, eval_every=0,
                      eval_sequences=0, bf16_autocast=True)
    tr = Trainer(drafter, target, TokenDataset(data_dir, target, tok), cfg, pad_id=0, log=lambda *_: None)
    for _ in range(4):
        tr.train_step()
    unchanged = [n for n, p in drafter.named_parameters() if p.requires_grad and torch.equal(p.detach(), before[n])]
    assert unchanged == []


def test_reduced_vocab_drafter_trains_saves_and_reloads_its_maps(tiny, data_dir, tmp_path):
    from hf_dspark import DSparkDrafter
    from hf_dspark.training.trainer import build_drafter, choose_draft_vocab

    model, tok = tiny
    ds = TokenDataset(data_dir, model, tok)
    ids, coverage = choose_draft_vocab(ds, 20, model.config.vocab_size, always=[1])
    assert ids.numel() == 20 and 1 in ids.tolist() and 0.0 < coverage <= 1.0
    drafter = build_drafter(model, tok, draft_token_ids=ids, markov_rank=16, target_layer_ids=[1, 3])
    assert drafter.lm_head.weight.shape == (20, 64) and drafter.markov_head.markov_w2.weight.shape == (20, 16)
    assert torch.equal(drafter.lm_head.weight, model.lm_head.weight[ids])  # draft head rows start as the target's
    cfg = TrainConfig(str(data_dir), str(tmp_path / "o"), max_steps=6, num_anchors=6, lr=3e-3, warmup_ratio=0.0, eval_every=0, eval_sequences=0)
    tr = Trainer(drafter, model, ds, cfg, pad_id=0, log=lambda *_: None)
    first = tr.train_step()["loss"]
    for _ in range(5):
        last = tr.train_step()["loss"]
    assert last < first
    drafter.save_pretrained(str(tmp_path / "saved"))
    back = DSparkDrafter.from_pretrained(str(tmp_path / "saved"), target=model)
    assert back.config.draft_vocab_size == 20 and torch.equal(back.draft_target_ids(), ids)


def test_remapping_the_draft_vocab_keeps_learned_rows_and_starts_new_ones_from_the_target(tiny, data_dir):
    from hf_dspark.training.trainer import build_drafter, remap_draft_vocab

    model, tok = tiny
    old_ids = torch.arange(10, 30)
    drafter = build_drafter(model, tok, draft_token_ids=old_ids, markov_rank=16, target_layer_ids=[1, 3])
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.01 * torch.randn_like(p))  # "trained": every row differs from its init
    new_ids = torch.arange(20, 44)  # 10 tokens shared (20..29), 14 new
    new = remap_draft_vocab(drafter, model, new_ids)
    assert new.config.draft_vocab_size == 24 and torch.equal(new.draft_target_ids(), new_ids)
    assert torch.equal(new.lm_head.weight[:10], drafter.lm_head.weight[10:])
    assert torch.equal(new.lm_head.weight[10:], model.lm_head.weight[30:44].float())
    w2_new, w2_old = new.markov_head.markov_w2.weight, drafter.markov_head.markov_w2.weight
    assert torch.equal(w2_new[:10], w2_old[10:]) and not w2_new[10:].any()
    assert torch.equal(new.fc.weight, drafter.fc.weight) and torch.equal(new.layers[0].mlp.up_proj.weight, drafter.layers[0].mlp.up_proj.weight)
    assert torch.equal(new.confidence_head.proj.weight, drafter.confidence_head.proj.weight)


def test_remapping_carries_new_rows_over_by_the_map_the_kept_rows_fit(tiny):
    """A trained drafter's rows are not the target's: new tokens start from the target's rows mapped the way the
    kept tokens' rows moved. With trained rows an exact affine image of the target's, new rows are that image too."""
    from hf_dspark.training.trainer import build_drafter, remap_draft_vocab

    model, tok = tiny
    h = model.config.hidden_size
    old_ids, new_ids = torch.arange(0, 200), torch.arange(50, 256)  # 150 tokens kept (h + 1 = 65 unknowns), 56 new
    drafter = build_drafter(model, tok, draft_token_ids=old_ids, markov_rank=16, target_layer_ids=[1, 3])
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(h, h, generator=gen) / h**0.5, torch.randn(h, generator=gen)
    source = model.lm_head.weight.detach().float()  # [V, h]
    with torch.no_grad():
        drafter.lm_head.weight.copy_(source[old_ids] @ a + b)
    new = remap_draft_vocab(drafter, model, new_ids)
    assert torch.equal(new.lm_head.weight[:150], drafter.lm_head.weight[50:])  # kept rows bit for bit
    torch.testing.assert_close(new.lm_head.weight[150:], source[200:] @ a + b, rtol=1e-2, atol=1e-2)
    assert not torch.allclose(new.lm_head.weight[150:], source[200:], atol=0.1)  # not the raw target rows


def _saved_tiny_target(tiny, tmp_path):
    """The tiny target saved as a folder for `train --target`, named as the data was made with (its manifest's target id)."""
    model, tok = tiny
    target = tmp_path / "tiny-llama-0-6"
    model.save_pretrained(target), tok.save_pretrained(target)
    return target


def test_train_with_a_larger_vocabulary_beside_init_keeps_every_token_of_the_drafter(tiny, data_dir, tmp_path):
    """`train --init D --draft-vocab-size N`, N >= D's own size: all of D's tokens stay (with their trained rows) and
    the data's most frequent others fill the rest."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.training.trainer import build_drafter, choose_draft_vocab

    model, tok = tiny
    target = _saved_tiny_target(tiny, tmp_path)
    top, _ = choose_draft_vocab(TokenDataset(data_dir, model, tok), 10, model.config.vocab_size)
    own = torch.tensor([t for t in range(model.config.vocab_size) if t not in top.tolist()][-20:])  # rarely if ever seen
    build_drafter(model, tok, draft_token_ids=own, markov_rank=8, target_layer_ids=[1, 3]).save_pretrained(tmp_path / "init")
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["train", "--data", str(data_dir), "--out", str(tmp_path / "o"), "--target", str(target),
                              "--dtype", "float32", "--init", str(tmp_path / "init"), "--draft-vocab-size", "30",
                              "--max-steps", "1", "--eval-sequences", "0", "--eval-every", "0", "--no-progress"])
    args.func(args)
    grown = DSparkDrafter.from_pretrained(str(tmp_path / "o" / "drafter")).draft_target_ids()
    assert grown.numel() == 30 and set(own.tolist()) | set(top.tolist()) <= set(grown.tolist())


def test_train_continues_a_dflash_drafter_with_dflash_and_refuses_it_beside_a_markov_head(tiny, data_dir, tmp_path):
    """`train --init D --dflash`: the DFlash twin's command is its DSpark twin's plus --dflash, also when continuing;
    beside a drafter that has a Markov head, --dflash is refused by name (it cannot drop a trained head)."""
    from hf_dspark import DSparkDrafter
    from hf_dspark.training.trainer import build_drafter

    model, tok = tiny
    target = _saved_tiny_target(tiny, tmp_path)
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="cmd"))
    for rank in (0, 8):
        build_drafter(model, tok, markov_rank=rank, target_layer_ids=[1, 3]).save_pretrained(tmp_path / f"init{rank}")
    common = ["train", "--data", str(data_dir), "--target", str(target), "--dtype", "float32", "--dflash",
              "--max-steps", "1", "--eval-sequences", "0", "--eval-every", "0", "--no-progress"]
    args = parser.parse_args(common + ["--init", str(tmp_path / "init0"), "--out", str(tmp_path / "o0")])
    args.func(args)
    assert DSparkDrafter.from_pretrained(str(tmp_path / "o0" / "drafter")).config.markov_rank == 0
    args = parser.parse_args(common + ["--init", str(tmp_path / "init8"), "--out", str(tmp_path / "o8")])
    with pytest.raises(SystemExit, match=r"--dflash trains a drafter without a Markov head, and --init .*init8 has one"):
        args.func(args)


def _trained_drafter(model, tok):
    """A small vanilla drafter with perturbed ("trained") weights, to grow."""
    from hf_dspark.training.trainer import build_drafter

    drafter = build_drafter(model, tok, draft_token_ids=torch.arange(10, 40), markov_rank=8, target_layer_ids=[1, 3])
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return drafter


def _assert_same_training_outputs(model, data, a, b) -> None:
    """a and b give the same KL and BCE losses and the same greedy matches on two sequences' anchors."""
    seqs, gen = [data[i] for i in range(2)], torch.Generator().manual_seed(0)
    ids, mask, _, anchors = pad_batch(seqs, [sample_anchors(m, 6, gen) for _, m in seqs], 0)
    outs = [drafter_step_outputs(d, model, ids, mask, anchors, LossWeights()) for d in (a, b)]
    for key in ("kl", "bce"):
        torch.testing.assert_close(outs[1][0][key], outs[0][0][key], rtol=1e-5, atol=1e-6)
    assert torch.equal(outs[1][2], outs[0][2])  # the same greedy matches


def _train_three_steps(drafter, model, data, data_dir, tmp_path) -> None:
    cfg = TrainConfig(str(data_dir), str(tmp_path / "o"), max_steps=3, num_anchors=6, lr=1e-3, warmup_ratio=0.0,
                      eval_every=0, eval_sequences=0)
    tr = Trainer(drafter, model, data, cfg, pad_id=0, log=lambda *_: None)
    for _ in range(3):
        tr.train_step()


def test_a_grown_drafter_drafts_exactly_as_before_and_its_new_parts_train(tiny, data_dir, tmp_path):
    """More layers and a higher Markov rank start as no-ops (same draft logits and confidences), then train."""
    from hf_dspark.training.trainer import grow_drafter

    model, tok = tiny
    drafter = _trained_drafter(model, tok)
    grown = grow_drafter(drafter, model, num_hidden_layers=2, markov_rank=16)
    assert (grown.config.num_hidden_layers, grown.config.markov_rank) == (2, 16)
    assert torch.equal(grown.draft_target_ids(), drafter.draft_target_ids())
    data = TokenDataset(data_dir, model, tok)
    _assert_same_training_outputs(model, data, drafter, grown)
    new_parts = {"layers.1.self_attn.o_proj.weight", "layers.1.mlp.down_proj.weight"}
    before = {n: p.detach().clone() for n, p in grown.named_parameters()}
    _train_three_steps(grown, model, data, data_dir, tmp_path)
    params = dict(grown.named_parameters())
    assert all(not torch.equal(params[n], before[n]) for n in new_parts)
    assert params["markov_head.markov_w2.weight"][:, 8:].abs().sum() > 0


def test_a_vanilla_head_grown_gated_drafts_exactly_as_before_and_its_gate_trains(tiny, data_dir, tmp_path):
    """vanilla -> gated: a zero gate (g = 1/2) and W2 doubled give the same bias bit for bit; the gate then learns."""
    from hf_dspark.drafting import draft_tree
    from hf_dspark.processing import Processing
    from hf_dspark.training.trainer import grow_drafter

    model, tok = tiny
    drafter = _trained_drafter(model, tok)
    grown = grow_drafter(drafter, model, markov_head_type="gated")
    assert grown.config.markov_head_type == "gated" and grown.config.markov_rank == 8
    prev, hidden = torch.randint(0, 64, (3, 5)), torch.randn(3, 5, model.config.hidden_size)
    assert torch.equal(grown.markov_bias(grown.markov_latent(prev, hidden)[0]),
                       drafter.markov_bias(drafter.markov_latent(prev, hidden)[0]))
    data = TokenDataset(data_dir, model, tok)
    _assert_same_training_outputs(model, data, drafter, grown)
    # the same tree at inference (the gate reads each slot's hidden state)
    ctx = torch.randn(1, 6, drafter.fc.in_features)
    pos = torch.arange(6)[None]
    trees = []
    for d in (drafter, grown):
        kv = d.context_kv(d.context_features(ctx), pos)
        trees.append(draft_tree(d, torch.tensor([5]), torch.tensor([6]), kv, torch.ones(1, 6, dtype=torch.bool),
                                Processing([], do_sample=False), None, True, depth=4, size=9).tree)
    assert torch.equal(trees[0].tokens, trees[1].tokens) and torch.equal(trees[0].parents, trees[1].parents)
    before = grown.markov_head.gate_proj.weight.detach().clone()
    _train_three_steps(grown, model, data, data_dir, tmp_path)
    assert not torch.equal(grown.markov_head.gate_proj.weight, before)


def test_growing_refuses_to_shrink_or_to_widen_a_gated_head(tiny):
    from hf_dspark.training.trainer import build_drafter, grow_drafter

    model, tok = tiny
    drafter = build_drafter(model, tok, num_hidden_layers=2, markov_rank=8, target_layer_ids=[1, 3])
    with pytest.raises(ValueError, match="would shrink it"):
        grow_drafter(drafter, model, num_hidden_layers=1)
    with pytest.raises(ValueError, match="would shrink it"):
        grow_drafter(drafter, model, num_hidden_layers=0)
    gated = build_drafter(model, tok, markov_rank=8, markov_head_type="gated", target_layer_ids=[1, 3])
    with pytest.raises(ValueError, match="Only a vanilla Markov head's rank can grow"):
        grow_drafter(gated, model, markov_rank=16)
    with pytest.raises(ValueError, match="only grow from vanilla to gated"):
        grow_drafter(gated, model, markov_head_type="vanilla")
    with pytest.raises(ValueError, match="only grow from vanilla to gated"):
        grow_drafter(drafter, model, markov_head_type="rnn")


def test_conversations_as_written_mask_exactly_the_assistant_turns(tiny, tmp_path):
    from hf_dspark.training.data import conversation_sequence, make_data_as_written, read_conversations

    model, tok = tiny
    convs = [
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}, {"from": "human", "value": "ok?"},
                           {"from": "gpt", "value": "sure"}]},
        {"conversations": [{"from": "gpt", "value": "starts with the model"}]},  # dropped: does not open with the user
    ]
    path = tmp_path / "convs.json"
    path.write_text(json.dumps(convs)[:-1] + ", {\"conversations\": [")  # a truncated file, as the wheel's
    read = read_conversations(path)
    assert len(read) == 1 and [m["role"] for m in read[0]] == ["user", "assistant", "user", "assistant"]
    ids, mask = conversation_sequence(tok, read[0], max_tokens=1000)
    assert tok.decode([i for i, m in zip(ids, mask) if m]).replace(" ", "") == "yo<|end|>sure<|end|>"
    assert ids == list(tok.apply_chat_template(read[0], tokenize=True, return_dict=True)["input_ids"])
    manifest = make_data_as_written(model, tok, read * 3, tmp_path / "aw", max_tokens=12, sequences_per_shard=2, log=lambda *_: None)
    ds = TokenDataset(tmp_path / "aw", model, tok)
    assert len(manifest["shards"]) == 2 and len(ds) == 3 and all(len(ds[i][0]) == 12 for i in range(3))
    with pytest.raises(DataError, match="holds another data set"):  # never overwrite other data
        make_data_as_written(model, tok, read, tmp_path / "aw", max_tokens=20, log=lambda *_: None)


@pytest.mark.parametrize("engine", ["loop", "continuous"])
def test_self_distillation_with_rows_leaving_matches_plain_generate(tiny, engine):
    from hf_dspark.training.data import generate_responses

    model, tok = tiny
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
               for p in ("hi", "a much longer prompt here", "mid size")]
    settings = GenerationSettings(max_new_tokens=12, batch_size=3)
    first = model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, pad_token_id=0)[0, -1].item()
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = first  # the first row ends after 4 tokens: it leaves the batch early
    got = generate_responses(model, tok, prompts, settings, engine)
    assert len(got[0][1]) <= 4
    for prompt, (p, resp) in zip(prompts, got):
        ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=12,
                             do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        cut = next((i + 1 for i, t in enumerate(ref) if t == model.generation_config.eos_token_id), len(ref))
        assert p == prompt and resp == ref[:cut]


@pytest.mark.parametrize("do_sample", [False, True])
def test_states_kept_while_generating_are_the_targets_forward_over_each_whole_sequence(tiny, do_sample):
    from hf_dspark.training.data import generate_responses, generate_with_states

    model, tok = tiny
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
               for p in ("hi", "a much longer prompt here", "mid size")]
    settings = GenerationSettings(max_new_tokens=12, batch_size=3, do_sample=do_sample)
    first = model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, pad_token_id=0)[0, -1].item()
    model = copy.deepcopy(model)
    model.generation_config.eos_token_id = first  # greedy: the first row ends early, the others run to the cap
    torch.manual_seed(0)
    plain = generate_responses(model, tok, prompts, settings)
    torch.manual_seed(0)
    got, states = generate_with_states(model, tok, prompts, settings, tap_ids=[1, 2])
    if not do_sample:  # a row fed once more draws a token it never uses, so sampled answers differ; greedy ones do not
        assert got == plain and len(got[0][1]) <= 4 < len(got[1][1]) == 12
    for (p, resp), (taps, final) in zip(got, states):
        ref_taps, ref_final = data_mod.target_hidden(model, torch.tensor([p + resp]), [1, 2])
        assert taps.dtype == final.dtype == torch.bfloat16 and taps.shape == (len(p) + len(resp), 2 * 64)
        torch.testing.assert_close(taps.float(), ref_taps[0], rtol=2e-2, atol=2e-2)  # bf16 storage only
        torch.testing.assert_close(final.float(), ref_final[0], rtol=2e-2, atol=2e-2)


def test_make_data_keeps_the_feature_cache_that_cache_hidden_would_write(tiny, data_dir, tmp_path):
    import shutil

    model, tok = tiny
    drafter = tiny_drafter(model)
    s = GenerationSettings(max_new_tokens=24, batch_size=4, prompts_per_shard=4)  # data_dir's settings
    make_data(model, tok, PROMPTS, tmp_path / "kept", s, max_prompts=4, log=lambda *_: None, tap_ids=drafter.tap_hidden_state_ids)
    make_data(model, tok, PROMPTS, tmp_path / "kept", s, log=lambda *_: None, tap_ids=drafter.tap_hidden_state_ids)  # resumed
    shutil.copytree(data_dir, tmp_path / "after")
    data_mod.cache_hidden_states(tmp_path / "after", model, drafter.tap_hidden_state_ids, log=lambda *_: None)
    kept, after = TokenDataset(tmp_path / "kept", model, tok), TokenDataset(tmp_path / "after", model, tok)
    assert kept.check_cache(model, drafter.tap_hidden_state_ids) == len(kept) == len(PROMPTS)
    for i in range(len(kept)):
        assert torch.equal(kept[i][0], after[i][0])
        for a, b in zip(kept.cached_hidden(i), after.cached_hidden(i)):
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(DataError, match=r"other taps.*new --out, or delete"):  # one directory never mixes two tap sets
        make_data(model, tok, PROMPTS, tmp_path / "kept", s, log=lambda *_: None, tap_ids=[1, 2])
    with pytest.raises(DataError, match="cache-hidden"):  # continuous batching returns tokens only
        make_data(model, tok, PROMPTS, tmp_path / "cb", s, log=lambda *_: None, engine="continuous", tap_ids=[1, 2])
    # killed after a shard's states were written but before the shard was committed, then resumed without them
    stale = data_mod._taps_path(tmp_path / "part", 1)
    make_data(model, tok, PROMPTS, tmp_path / "part", s, max_prompts=4, log=lambda *_: None, tap_ids=drafter.tap_hidden_state_ids)
    shutil.copy(data_mod._taps_path(tmp_path / "kept", 1), stale)
    make_data(model, tok, PROMPTS, tmp_path / "part", s, log=lambda *_: None)
    assert not stale.exists() and TokenDataset(tmp_path / "part", model, tok).check_cache(model, drafter.tap_hidden_state_ids) == 4


def test_continuous_engine_refuses_sampling_by_name(tiny):
    from hf_dspark.training.data import DataError, generate_responses

    model, tok = tiny
    with pytest.raises(DataError, match="--engine loop to sample"):
        generate_responses(model, tok, [[1, 2, 3]], GenerationSettings(do_sample=True), "continuous")
    with pytest.raises(DataError, match="unknown generation engine 'vllm'"):
        generate_responses(model, tok, [[1, 2, 3]], GenerationSettings(), "vllm")


def test_a_zlab_layout_drafter_is_refused_for_training(tiny, data_dir, tmp_path):
    model, tok = tiny
    drafter = tiny_drafter(model)
    drafter.config.sample_from_anchor = False
    cfg = TrainConfig(str(data_dir), str(tmp_path / "o"), max_steps=1, eval_every=0, eval_sequences=0)
    with pytest.raises(ValueError, match="sample_from_anchor=False"):
        Trainer(drafter, model, TokenDataset(data_dir, model, tok), cfg, pad_id=0, log=lambda *_: None)


def _script(name: str):
    """scripts/<name>.py as a module (scripts/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_card_learning_curve_counts_a_new_run_on_from_the_last_point(tmp_path):
    mod = _script("card_learning_curve")
    points = [{"session": 19, "run": "i", "step": 100, "tokens_seen": 5000, "train_seconds": 90.0, "eval_tau_tf": 2.4,
               "cpu_hours": 3.0}]
    history = [{"step": 0, "tokens_seen": 0, "train_seconds": 0.0, "eval_tau_tf": 2.5},
               {"step": 10, "tokens_seen": 800, "train_seconds": 36.0, "train_loss": 1.0},  # no evaluation: left out
               {"step": 20, "tokens_seen": 1600, "train_seconds": 72.0, "eval_tau_tf": 2.6}]
    grown = mod.append_run(points, history, 20, "j", cores=2, label="fresh data", heldout=None)
    assert [(p["step"], p["tokens_seen"], p["cpu_hours"]) for p in grown[1:]] == [(100, 5000, 3.0), (120, 6600, 3.04)]
    assert grown[-1]["label"] == "fresh data" and grown[:1] == points
    with pytest.raises(SystemExit, match="session 19's run i is already in the curve"):
        mod.append_run(points, history, 19, "i", cores=2, label="", heldout=None)
    on_gpu = mod.append_run(grown, history, 21, "gpu", cores=2, label="", heldout=None, gpu=True)
    assert [(p["cpu_hours"], p["gpu_seconds"]) for p in on_gpu[-2:]] == [(3.04, 0.0), (3.04, 72.0)]
    souped = mod.append_run(points, history, 22, "s", cores=1, label="", heldout=None, soup_seconds=216.0)
    assert [(p["tokens_seen"], p["cpu_hours"]) for p in souped[1:]] == [(5000, 3.0), (6600, 3.08)]  # 72 s + 216 s
    mod.draw(grown, tmp_path / "curve.png", "test")
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_card_eval_curve_fits_tau_against_log_tokens_and_says_where_it_reaches_the_goal(tmp_path):
    import math

    mod = _script("card_learning_curve")
    # tau = 2 + 0.5 ln(tokens) on gsm8k, flat on mtbench; the 10-prompt row is off the line and must not be fitted
    rows = [{"what": "early", "tokens_m": 1.0, "cpu_hours": 1, "prompts": 10, "gsm8k": 9.0, "humaneval": 9.0,
             "mtbench": 9.0}]
    rows += [{"what": f"s{t}", "tokens_m": t, "cpu_hours": t, "prompts": 40, "gsm8k": 2 + 0.5 * math.log(t),
              "humaneval": 3.0, "mtbench": 1.5} for t in (1.5, 2.0, 4.0)]
    fits = mod.fit_log_tokens(rows)
    assert fits["gsm8k"] == pytest.approx((2.0, 0.5)) and fits["mtbench"] == pytest.approx((1.5, 0.0))
    assert mod.tokens_for(3.0, fits["gsm8k"]) == pytest.approx(math.e ** 2)
    assert mod.tokens_for(2.2, fits["mtbench"]) == math.inf
    curve = {"goals": {"gsm8k": 3.0, "humaneval": 2.5, "mtbench": 2.2}, "rows": rows}
    report = mod.fit_report(curve)
    assert "gsm8k: 2.69 now" in report and "humaneval: 3.00 now" in report and "goal 2.5: reached" in report
    assert "~7M tokens" in report.splitlines()[1] and "goal 2.2: the fit does not rise" in report
    mod.draw_eval(curve, tmp_path / "eval.png", "test")
    assert (tmp_path / "eval.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match="two or more token counts"):
        mod.fit_log_tokens(rows[:2])


def test_domain_prompts_add_method_stubs_without_changing_the_earlier_list():
    import ast

    mod = _script("make_domain_prompts")
    before = mod.domain_prompts(math=5, code=5, seed=0)
    after = mod.domain_prompts(math=5, code=5, seed=0, methods=5)
    assert len(after) == 15 and set(before) < set(after)
    assert before == mod.domain_prompts(math=5, code=5, seed=0)  # methods=0 is the list of before
    methods = [r for r in after if r.startswith("class ")]
    assert len(methods) == 5
    for stub in methods:
        cls = ast.parse(stub + "        pass\n").body[0]  # a class with one documented public method
        assert isinstance(cls, ast.ClassDef) and not cls.body[0].name.startswith("_") and ast.get_docstring(cls.body[0])


def test_chat_prompts_are_varied_formatted_and_none_reads_as_mt_bench():
    from hf_dspark.training.data import decontaminate

    mod = _script("make_domain_prompts")
    before = mod.domain_prompts(math=5, code=0, seed=0)
    after = mod.domain_prompts(math=5, code=0, seed=0, chat=400)
    assert before == mod.domain_prompts(math=5, code=0, seed=0) and set(before) < set(after)  # chat=0: the list of before
    chat = [r for r in after if r not in before]
    assert len(chat) == len(set(chat)) == 400 and set(chat) == set(mod._chat_prompts(400, seed=0))  # distinct, seeded
    assert all("{" not in c and "}" not in c and c[-1] in '.?!"' for c in chat)  # fully formatted sentences
    starts = {" ".join(c.split()[:2]) for c in chat}
    assert len(starts) > 40  # many families, not one template
    assert decontaminate(chat)[1] == 0  # nothing reads as an evaluation prompt


def test_domain_prompts_add_story_problems_and_code_tasks_without_changing_the_earlier_lists():
    import ast
    import re

    from hf_dspark.training.data import decontaminate, eval_prompts

    mod = _script("make_domain_prompts")
    before = mod.domain_prompts(math=5, code=0, seed=0)
    after = mod.domain_prompts(math=5, code=0, seed=0, stories=200)
    assert before == mod.domain_prompts(math=5, code=0, seed=0) and set(before) < set(after)
    stories = [r for r in after if r not in before]
    assert len(stories) == len(set(stories)) == 200
    assert all(s.endswith("?") and "{" not in s and " -" not in s for s in stories)  # a question, fully formatted
    assert len({s.split()[0] for s in stories}) > 20  # many families and people, not one template
    with_tasks = mod.domain_prompts(math=5, code=0, seed=0, stories=200, tasks=300)
    assert set(after) < set(with_tasks) and len(with_tasks) == 505
    tasks = [r for r in with_tasks if r not in after]
    assert set(tasks) == set(mod._code_tasks(300, seed=0))  # seeded
    assert decontaminate(tasks)[1] == 0  # nothing reads as an evaluation prompt
    names = {m for t in tasks for m in re.findall(r"(\w+)\(", t)}
    humaneval = set(re.findall(r"def (\w+)\(", "\n".join(eval_prompts()["humaneval"])))
    assert len(names) > 40 and not names & humaneval  # many families, none named like a HumanEval function
    shapes = ("Write a Python", "def ", "Implement `", "I need a Python", "Complete the following")
    assert all(sum(t.startswith(s) for t in tasks) > 20 for s in shapes)
    for stub in (t for t in tasks if t.startswith("def ")):  # valid Python: a signature and a docstring with an example
        assert "Example: " in ast.get_docstring(ast.parse(stub + "    pass\n").body[0])


def test_magpie_prompts_start_at_the_user_turn_and_resume_past_a_torn_line(smollm2, tmp_path):
    mod = _script("make_magpie_prompts")
    _, tok = smollm2
    prefix = mod.user_turn_prefix(tok)
    assert prefix.endswith("<|im_start|>user\n") and "<|im_start|>system" in prefix  # the template's own system turn
    assert mod.keep("Write a Python function that reverses a list.")
    assert not mod.keep("Hi") and not mod.keep("Fine.<|im_end|>")
    out = tmp_path / "p.jsonl"
    assert mod.resume(out) == set()
    out.write_text('{"text": "one", "kind": "open"}\n{"text": "two", "kind": "math"}\n{"text": "thr')
    assert mod.resume(out) == {"one", "two"}
    assert out.read_text().count("\n") == 2 and out.read_text().endswith("\n")  # the torn line is gone


def test_soup_drafters_means_the_weights_and_keeps_a_s_rows_for_tokens_b_never_drafted(tiny, data_dir):
    from hf_dspark.training.trainer import build_drafter, choose_draft_vocab

    mod = _script("soup_drafters")
    model, tok = tiny
    ids, _ = choose_draft_vocab(TokenDataset(data_dir, model, tok), 20, model.config.vocab_size, always=[1])
    others = torch.tensor([t for t in range(model.config.vocab_size) if t not in set(ids.tolist())][:5])
    b_ids = torch.cat([ids[:15], others])  # b shares a's first 15 tokens and lacks its last 5

    def perturbed(vocab, seed):
        torch.manual_seed(seed)
        d = build_drafter(model, tok, draft_token_ids=vocab, markov_rank=16, target_layer_ids=[1, 3]).float()
        with torch.no_grad():
            d.fc.weight.add_(torch.randn_like(d.fc.weight))
            d.lm_head.weight.add_(torch.randn_like(d.lm_head.weight))
        return d

    a, b, b_other = perturbed(ids, 0), perturbed(ids, 1), perturbed(b_ids, 2)
    fc_mean = (a.fc.weight + b.fc.weight) / 2
    a_rows, b_rows = a.lm_head.weight.detach().clone(), b_other.lm_head.weight.detach().clone()
    torch.testing.assert_close(mod.soup([perturbed(ids, 0), b], model, [0.5, 0.5]).fc.weight, fc_mean)
    c = perturbed(ids, 3)
    fc_three = 0.5 * a.fc.weight + 0.25 * (b.fc.weight + c.fc.weight)
    lm_three = 0.5 * a_rows + 0.25 * (b.lm_head.weight + c.lm_head.weight)
    three = mod.soup([perturbed(ids, 0), b, c], model, mod.parse_weights("2,1,1", 3))
    torch.testing.assert_close(three.fc.weight, fc_three)
    torch.testing.assert_close(three.lm_head.weight, lm_three)
    mixed = mod.soup([a, b_other, c], model, [0.5, 0.25, 0.25])
    assert torch.equal(mixed.draft_target_ids(), ids)  # a's draft vocabulary
    both = (0.5 * a_rows + 0.25 * (b_rows + c.lm_head.weight))[:15]
    torch.testing.assert_close(mixed.lm_head.weight[:15], both)
    # tokens b_other never drafted: the mean of a and c alone, at their weights renormalised
    torch.testing.assert_close(mixed.lm_head.weight[15:], (2 * a_rows[15:] + c.lm_head.weight[15:]) / 3)
    with pytest.raises(SystemExit, match="3 non-negative numbers"):
        mod.parse_weights("1,1", 3)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads Linux's /proc/self/status")
def test_freed_heap_pages_go_back_to_the_os_after_a_step():
    """The trainer calls release_freed_memory after every CPU step: tensors freed in the middle of glibc's heap
    (smaller than its mmap threshold, as many of a step's temporaries are) stay resident until it runs."""
    if _malloc_trim is None:
        pytest.skip("not glibc: nothing to release")
    blocks = [torch.ones(24_000) for _ in range(3000)]  # ~96 KB each, on the heap
    del blocks[:-1]  # the last one pins the heap's top, so free() alone gives nothing back
    before = anonymous_memory_mb()
    release_freed_memory()
    assert before - anonymous_memory_mb() > 150


def _tau_result(drafter: str, steps: list[int], tokens: list[int], **settings) -> dict:
    """An eval-tau JSON of one set, as the CLI writes it."""
    return {"gsm8k": {"tau": sum(tokens) / sum(steps), "steps": sum(steps), "num_prompts": len(steps),
                      "steps_per_call": steps, "tokens_per_call": tokens},
            "settings": {"drafter": drafter, "adapter": None, "max_new_tokens": 128, "draft_tree_size": None} | settings}


def test_compare_tau_resamples_prompts_in_pairs():
    mod = _script("compare_tau")
    steps = [40, 50, 45, 60, 38, 52, 47, 41]
    base = _tau_result("a", steps, [100, 120, 110, 150, 95, 130, 118, 100])
    (row,) = mod.compare(base, _tau_result("b", steps, base["gsm8k"]["tokens_per_call"]), resamples=500)
    assert row["difference"] == 0 and row["interval"] == [0, 0] and row["p_ahead"] == 0
    # one more token on every prompt: ahead in every resample, and the interval holds the difference
    (row,) = mod.compare(base, _tau_result("b", steps, [t + 1 for t in base["gsm8k"]["tokens_per_call"]]), resamples=500)
    assert row["difference"] == pytest.approx(8 / sum(steps)) and row["p_ahead"] == 1.0
    assert row["interval"][0] <= row["difference"] <= row["interval"][1]
    # one much better prompt among worse ones: ahead on the pooled tau, but the interval straddles zero
    mixed = [t - 2 for t in base["gsm8k"]["tokens_per_call"]]
    mixed[3] += 30
    (row,) = mod.compare(base, _tau_result("b", steps, mixed), resamples=2000)
    assert row["difference"] > 0 and row["interval"][0] < 0 < row["interval"][1] and 0 < row["p_ahead"] < 1


def test_compare_tau_refuses_what_it_cannot_pair(tmp_path):
    mod = _script("compare_tau")
    base = _tau_result("a", [10, 12], [30, 31])
    with pytest.raises(SystemExit, match=r"different settings \(draft_tree_size\)"):
        mod.compare(base, _tau_result("b", [10, 12], [30, 31], draft_tree_size=15))
    rows = mod.compare(base, _tau_result("a", [10, 12], [30, 31], draft_tree_size=15), allowed=("draft_tree_size",))
    assert rows[0]["difference"] == 0.0  # decoding options compared on one drafter, when named
    with pytest.raises(SystemExit, match="2 against 3 prompts"):
        mod.compare(base, _tau_result("b", [10, 12, 9], [30, 31, 20]))
    (tmp_path / "old.json").write_text(json.dumps({"gsm8k": {"tau": 2.5, "steps": 10}, "settings": {}}))
    with pytest.raises(SystemExit, match="no per-prompt counts"):
        mod.load_result(str(tmp_path / "old.json"))
