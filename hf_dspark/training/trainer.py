"""Online DSpark / DFlash drafter training (SPEC section 4): the target's taps are computed on the fly.

One step: a batch of sequences -> frozen target forward (taps + final hidden states, or the optional bf16 cache)
-> anchors sampled per sequence -> all blocks packed into one drafter pass -> teacher-forced Markov head ->
losses (losses.py) -> AdamW (warmup + cosine, grad clip) on the drafter's own weights (the target, its embeddings
and lm_head stay frozen).

Checkpoints (`<out>/checkpoint/trainer_state.safetensors`, atomic; tensors + JSON metadata, nothing pickled) hold the drafter weights, optimizer, scheduler, RNG
states and the data position (epoch, cursor), so a killed run resumes exactly: the data order is a seeded
permutation per epoch and each step's anchors come from a generator seeded by (seed, epoch, cursor).
`<out>/drafter/` is the latest drafter in `save_pretrained` format; `<out>/history.json` the learning curve.

Multi-GPU / multi-node: `accelerate launch [--num_processes 8 --num_machines M ...] -m hf_dspark.training.cli train
--accelerate ...`. Each process holds the target and the drafter on its device, takes its own batch_size sequences
of every step (the data cursor advances by batch_size * num_processes), and the drafter's gradients are averaged
across processes (`Accelerator.reduce`) before clipping and the AdamW step, so every rank keeps identical weights;
rank 0 writes checkpoints. Here it runs as one CPU process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import PreTrainedModel

from ..configuration import DSparkConfig
from ..io_utils import atomic_path, write_json_atomic
from ..modeling import DSparkDrafter
from .data import TokenDataset, target_hidden
from .losses import LossWeights, dspark_losses, expected_tau, replayed_decoding, sparse_target
from .packing import PackedBlocks, pack_blocks, pad_batch, sample_anchors

STATE_FILE = "trainer_state.safetensors"
LEGACY_STATE_FILE = "trainer_state.pt"  # pickled by earlier versions: never loaded


@dataclass
class TrainConfig:
    data_dir: str
    out_dir: str
    max_steps: int = 1000
    batch_size: int = 1  # sequences per step
    num_anchors: int = 128  # blocks per sequence
    anchors: str = "uniform"  # "uniform" over the response, or "decoded": where greedy decoding starts its blocks
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    bf16_autocast: bool = False
    seed: int = 0
    checkpoint_minutes: float = 5.0
    eval_every: int = 100  # steps between held-out evaluations (0 = only at the end)
    eval_sequences: int = 8  # last sequences of the data held out from training (of the Trainer's eval_dataset if given)
    stop_at: float | None = None  # unix time: checkpoint and stop (the schedule is not shortened)
    schedule_minutes: float | None = None  # the warmup + cosine span this much training time (max_steps: a cap)
    ema_decay: float = 0.0  # > 0: keep an exponential moving average of the weights; evaluated and exported instead
    losses: LossWeights = field(default_factory=LossWeights)


def write_state(path: Path, state: dict) -> None:
    """A trainer state (`Trainer.state_dict()`) as one safetensors file, atomically: the drafter's weights, the
    optimizer's tensors and the torch RNG state as tensors, everything else as JSON in the metadata."""
    tensors = {f"drafter.{k}": v.contiguous() for k, v in state["drafter"].items()}
    tensors.update({f"ema.{k}": v.contiguous() for k, v in state.get("ema", {}).items()})
    opt = state["optimizer"]
    per_param: dict[str, dict] = {}
    for idx, slots in opt["state"].items():
        per_param[str(idx)] = {}
        for key, value in slots.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{idx}.{key}"] = value.detach().contiguous()
            else:
                per_param[str(idx)][key] = value
    tensors["rng.torch"] = state["rng"]["torch"]
    version, internal, gauss = state["rng"]["python"]
    meta = {k: v for k, v in state.items() if k not in ("drafter", "ema", "optimizer", "rng")}
    meta.update(optimizer={"param_groups": opt["param_groups"], "scalars": per_param},
                rng_python=[version, list(internal), gauss])
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"trainer_state": json.dumps(meta)})


def read_state(path: Path) -> dict:
    """The inverse of `write_state` (no unpickling anywhere)."""
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["trainer_state"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    opt_state: dict[int, dict] = {int(i): dict(v) for i, v in meta["optimizer"]["scalars"].items()}
    drafter, ema = {}, {}
    for key, value in tensors.items():
        kind, _, rest = key.partition(".")
        if kind == "drafter":
            drafter[rest] = value
        elif kind == "ema":
            ema[rest] = value
        elif kind == "optimizer":
            idx, _, slot = rest.partition(".")
            opt_state.setdefault(int(idx), {})[slot] = value
    version, internal, gauss = meta.pop("rng_python")
    optimizer = {"state": opt_state, "param_groups": meta.pop("optimizer")["param_groups"]}
    return {**meta, "drafter": drafter, "ema": ema, "optimizer": optimizer,
            "rng": {"torch": tensors["rng.torch"], "python": (version, tuple(internal), gauss)}}


def _glibc_malloc_trim():
    """glibc's `malloc_trim`, or None elsewhere (musl, macOS, Windows)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _glibc_malloc_trim()


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc; a no-op elsewhere). A CPU step's temporaries change size with
    every batch's sequence lengths and fragment glibc's heap: without this a SmolLM2 run's anonymous memory grew ~58 MB
    per step, with it ~18 MB (scripts/training_memory.py; most of the rest is oneDNN's cache of one primitive per
    matrix shape)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def anonymous_memory_mb() -> float:
    """This process's anonymous resident memory (RssAnon, MB; Linux): what the heap holds, without memory-mapped
    files such as the feature cache."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("RssAnon"))


def lr_lambda(step: int, total: int, warmup_ratio: float) -> float:
    """Linear warmup over warmup_ratio * total steps, then cosine decay to 0."""
    warm = max(1, int(round(warmup_ratio * total)))
    if step < warm:
        return (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def freeze_target(target: PreTrainedModel) -> None:
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)


def build_drafter(
    target: PreTrainedModel, tokenizer, draft_token_ids: torch.Tensor | None = None, init_from_target: bool = True, **config_kwargs
) -> DSparkDrafter:
    """A fresh drafter for `target` (config from `DSparkConfig.from_target`), bound, with fp32 master weights.

    Args:
        draft_token_ids: [D] target ids the drafter may propose (a reduced draft vocabulary, e.g. the D most frequent
            response tokens of the training data; `choose_draft_vocab`); None = the full vocabulary.
        init_from_target: start from the target's own weights where shapes allow: the drafter layers from the target's
            last decoder layers, fc as the identity on the last tap, the final norm and the draft lm_head rows from the
            target's. (From random layers the step-0 logits are far too peaked; from the target's they are not.)
    """
    if draft_token_ids is not None:
        config_kwargs["draft_vocab_size"] = int(draft_token_ids.numel())
    cfg = DSparkConfig.from_target(target.config, tokenizer=tokenizer, **config_kwargs)
    drafter = DSparkDrafter(cfg).float()  # fp32 master weights whatever the target's dtype (autocast does the bf16 math)
    if draft_token_ids is not None:
        drafter.set_draft_vocab(draft_token_ids)
    with torch.no_grad():
        if cfg.reduced_vocab:
            drafter.lm_head.weight.copy_(target_head_rows(drafter, target).float())
        final_norm = getattr(target.get_decoder(), "norm", None)
        if final_norm is not None and getattr(final_norm, "weight", None) is not None and final_norm.weight.shape == drafter.norm.weight.shape:
            drafter.norm.weight.copy_(final_norm.weight.float())
        if init_from_target:
            init_from_target_layers(drafter, target)
    return drafter.bind(target)


def target_head_rows(drafter: DSparkDrafter, target: PreTrainedModel) -> torch.Tensor:
    """[D, H] the target's lm_head rows of the drafter's draft vocabulary (the whole head, cut to V, when not reduced)."""
    head = target.get_output_embeddings().weight.detach()
    ids = drafter.draft_target_ids()
    return (head[ids] if ids is not None else head[: drafter.draft_vocab_size]).contiguous()


def init_from_target_layers(drafter: DSparkDrafter, target: PreTrainedModel) -> None:
    """Copy the target's last decoder layers into the drafter's (matching names and shapes only) and make fc the
    identity on the last tapped layer, so context features start as the target's own hidden states."""
    copy_target_layers(list(drafter.layers), target)
    h = drafter.config.hidden_size
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, -h:].copy_(torch.eye(h))


def copy_target_layers(layers: list[torch.nn.Module], target: PreTrainedModel) -> None:
    """Copy the target's last len(layers) decoder layers into `layers` (matching names and shapes only)."""
    for mine, theirs in zip(layers, list(target.get_decoder().layers)[-len(layers):]):
        source = dict(theirs.named_parameters())
        for name, p in mine.named_parameters():
            if name in source and source[name].shape == p.shape:
                p.copy_(source[name].float())


@torch.no_grad()
def grow_drafter(
    drafter: DSparkDrafter,
    target: PreTrainedModel,
    num_hidden_layers: int | None = None,
    markov_rank: int | None = None,
    markov_head_type: str | None = None,
) -> DSparkDrafter:
    """A copy of a trained drafter with more decoder layers, a higher Markov rank and/or a gated Markov head that drafts
    exactly as it did.

    New layers go after the old ones and start from the target's last layers (as a fresh drafter's do) with their
    output projections (attention o_proj, MLP down_proj) zero, so each adds nothing to the residual stream until it
    trains. New Markov rank components get small random W1 columns and zero W2 columns (no bias yet), and the
    confidence head zero weights on them. Growing the rank needs a vanilla head (gated/rnn heads mix the rank). A
    vanilla head becomes a gated one (`markov_head_type="gated"`) with a gate of zero weights and bias, so
    sigmoid(0) = 1/2 on every latent, and W2 doubled: the bias W2 (g * e) is the old W2 e bit for bit."""
    cfg = drafter.config
    layers = cfg.num_hidden_layers if num_hidden_layers is None else num_hidden_layers
    rank = cfg.markov_rank if markov_rank is None else markov_rank
    head_type = cfg.markov_head_type if markov_head_type is None else markov_head_type
    own_head = cfg.markov_head_type if cfg.markov_rank else "none, a DFlash drafter"
    if layers < cfg.num_hidden_layers or rank < cfg.markov_rank:
        raise ValueError(f"Growing a drafter of {cfg.num_hidden_layers} layers and Markov rank {cfg.markov_rank} to "
                         f"{layers} layers and rank {rank} would shrink it; give at least its own sizes.")
    if rank > cfg.markov_rank and (cfg.markov_rank == 0 or cfg.markov_head_type != "vanilla"):
        raise ValueError(f"Only a vanilla Markov head's rank can grow (this drafter's head: {own_head}); "
                         "train a new drafter with --markov-rank instead of --init.")
    gating = head_type != cfg.markov_head_type
    if gating and (cfg.markov_rank == 0 or (cfg.markov_head_type, head_type) != ("vanilla", "gated")):
        raise ValueError(f"A Markov head can only grow from vanilla to gated (this drafter's head: {own_head}; asked: "
                         f"{head_type}); train a new drafter with --markov-head-type instead of --init.")
    new = DSparkDrafter(DSparkConfig.from_dict(
        {**cfg.to_dict(), "num_hidden_layers": layers, "markov_rank": rank, "markov_head_type": head_type}
    )).float()
    if cfg.reduced_vocab:
        new.set_draft_vocab(drafter.draft_target_ids().cpu())
    added = list(new.layers)[cfg.num_hidden_layers:]
    copy_target_layers(added, target)
    for layer in added:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    old, mine = drafter.state_dict(), new.state_dict()
    for name, value in old.items():
        if name not in mine:
            raise ValueError(f"cannot grow this drafter: {name} has no place in the grown one")
        mine[name][tuple(slice(0, n) for n in value.shape)].copy_(value)  # the old block of a grown tensor
    if rank > cfg.markov_rank:
        w1, w2 = new.markov_head.markov_w1.weight, new.markov_head.markov_w2.weight
        w1[:, cfg.markov_rank:].normal_(0.0, float(drafter.markov_head.markov_w1.weight.float().std()))
        w2[:, cfg.markov_rank:].zero_()
        if new.confidence_head is not None and cfg.confidence_head_with_markov:
            new.confidence_head.proj.weight[:, cfg.hidden_size + cfg.markov_rank:].zero_()
    if gating:  # g = sigmoid(0) = 1/2 everywhere, and 2 W2 (e / 2) = W2 e exactly (powers of two)
        new.markov_head.gate_proj.weight.zero_()
        new.markov_head.gate_proj.bias.zero_()
        new.markov_head.markov_w2.weight.mul_(2.0)
    return new.bind(target)


def choose_draft_vocab(dataset: TokenDataset, size: int, vocab_size: int, always: list[int] = ()) -> tuple[torch.Tensor, float]:
    """The `size` most frequent response tokens of the data as trained on (a `dir:N` directory counts N times; plus
    `always`, e.g. EOS), sorted; returns (ids [D], the fraction of those response tokens they cover)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i in range(len(dataset)):
        ids, mask = dataset[i]
        counts += dataset.repeats[i] * torch.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    boost = counts.clone()
    boost[list(always)] = counts.max() + 1
    ids = boost.topk(min(size, vocab_size)).indices.sort().values
    return ids, float(counts[ids].sum()) / max(1, int(counts.sum()))


def fit_head_map(source: torch.Tensor, trained: torch.Tensor, ridge: float = 1e-4) -> torch.Tensor:
    """source [K, H] (the target's lm_head rows of K tokens), trained [K, H'] (a trained drafter's rows of the same
    tokens) -> [H + 1, H'] the affine map that best takes one to the other (least squares, trained ~ [source, 1] @ map,
    with a ridge of `ridge` x the mean diagonal of the normal equations)."""
    a = _with_ones_column(source)  # [K, H + 1]
    gram = a.T @ a  # [H + 1, H + 1]
    return torch.linalg.solve(gram + ridge * gram.diagonal().mean() * torch.eye(a.shape[1], dtype=a.dtype), a.T @ trained)


def apply_head_map(source: torch.Tensor, head_map: torch.Tensor) -> torch.Tensor:
    """source [N, H] -> [N, H'] through `fit_head_map`'s affine map."""
    return _with_ones_column(source) @ head_map


def _with_ones_column(x: torch.Tensor) -> torch.Tensor:  # [N, H] -> [N, H + 1]: the affine map's inputs
    return torch.cat([x, x.new_ones(x.shape[0], 1)], dim=1)


@torch.no_grad()
def remap_draft_vocab(drafter: DSparkDrafter, target: PreTrainedModel, draft_token_ids: torch.Tensor) -> DSparkDrafter:
    """A copy of a trained drafter that proposes `draft_token_ids` [D'] instead: tokens it already had keep their
    lm_head and Markov-bias rows; new ones get no Markov bias and lm_head rows from the target's, carried over by the
    affine map that best takes the kept tokens' target rows to their trained rows (`fit_head_map`; the target's rows
    as they are when fewer than H + 1 tokens are kept). A trained drafter's hidden states have moved away from the
    target's output space (its rows keep a median cosine of ~0.8 to the target's), so raw target rows score new
    tokens wrongly: SmolLM2's drafter grown from 16,384 to 32,768 tokens read held-out replayed tau 2.63 with raw rows,
    3.27 with mapped ones, against 3.32 before growing (`bench_results/s61/`). Everything else (layers, fc, norms, the
    confidence head, the Markov head's input side) is kept."""
    cfg = DSparkConfig.from_dict({**drafter.config.to_dict(), "draft_vocab_size": int(draft_token_ids.numel())})
    new = DSparkDrafter(cfg).float()
    new.set_draft_vocab(draft_token_ids)
    old_ids = drafter.draft_target_ids()
    old_ids = torch.arange(drafter.draft_vocab_size) if old_ids is None else old_ids.cpu()
    new_ids = new.draft_target_ids()
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith(("lm_head.", "markov_head.markov_w2.", "d2t", "t2d"))}
    _, unexpected = new.load_state_dict(state, strict=False)  # same config but D: every other tensor fits
    assert not unexpected, unexpected
    source = target_head_rows(new, target).float().cpu()  # [D', H] the target's rows of the new vocabulary
    new.lm_head.weight.copy_(source)
    where = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    where[old_ids] = torch.arange(old_ids.numel())
    old_row = where[new_ids]  # [D'] the old draft id of each new one, -1 where new
    kept = old_row >= 0
    rows = old_row[kept].to(drafter.lm_head.weight.device)  # the trained drafter may sit on the GPU, `new` on the CPU
    new.lm_head.weight[kept] = drafter.lm_head.weight[rows].float().cpu()
    if int(kept.sum()) > source.shape[1] and not kept.all():  # enough kept rows for the map's H + 1 unknowns
        new.lm_head.weight[~kept] = apply_head_map(source[~kept], fit_head_map(source[kept], new.lm_head.weight[kept]))
    if cfg.markov_rank:
        new.markov_head.markov_w2.weight.zero_()
        new.markov_head.markov_w2.weight[kept] = drafter.markov_head.markov_w2.weight[rows].float().cpu()
    return new.bind(target)


def draft_slot_logits(
    drafter: DSparkDrafter,
    taps: torch.Tensor,  # [N, T, m*H] the target's tapped hidden states
    input_ids: torch.Tensor,  # [N, T]
    loss_mask: torch.Tensor,  # [N, T] bool
    anchors: torch.Tensor,  # [N, A], -1 = padding
) -> tuple[torch.Tensor, torch.Tensor, PackedBlocks, tuple[torch.Tensor, ...]]:
    """The teacher-forced drafter pass over every block: (Markov-corrected draft logits [S, D] of the S supervised
    slots, their hidden states [S, H], the packed blocks, the slots' (sequence, block, position) indices)."""
    cfg = drafter.config
    n, t = input_ids.shape
    a, b = anchors.shape[1], cfg.block_size
    packed = pack_blocks(input_ids, loss_mask, anchors, b, cfg.mask_token_id)
    ctx_pos = torch.arange(t, device=input_ids.device).expand(n, t)
    ctx_kv = drafter.context_kv(drafter.context_features(taps), ctx_pos)
    hidden = drafter.block_hidden(packed.block_ids, packed.positions, ctx_kv, packed.mask).view(n, a, b, -1)
    where = packed.valid.nonzero(as_tuple=True)  # the S supervised slots
    h = hidden[where]  # [S, H]
    draft = drafter.base_logits(h)  # [S, D]
    if drafter.markov_head is not None:
        draft = draft + drafter.markov_head.bias(drafter.markov_head.block_latent(packed.prev_ids, hidden)[where])
    return draft, h, packed, where


def draft_labels(drafter: DSparkDrafter, labels: torch.Tensor) -> torch.Tensor:
    """Target token ids -> the drafter's vocabulary (-1: not draftable)."""
    return drafter.target_to_draft()[labels] if drafter.config.reduced_vocab else labels


def drafter_step_outputs(
    drafter: DSparkDrafter,
    target: PreTrainedModel,
    input_ids: torch.Tensor,  # [N, T]
    loss_mask: torch.Tensor,  # [N, T] bool
    anchors: torch.Tensor,  # [N, A], -1 = padding
    weights: LossWeights,
    cached: tuple[torch.Tensor, torch.Tensor] | None = None,  # taps [N, T, m*H], final [N, T, H]
    target_head: torch.Tensor | None = None,  # [D, H] the target's lm_head rows of the draft vocabulary
    top_k: int = 32,
) -> tuple[dict[str, torch.Tensor], PackedBlocks, torch.Tensor]:
    """The training forward: returns (loss dict, packed blocks, greedy match with the target [N*A, B] bool).

    Only the supervised slots (the contiguous valid prefix of each block) go through the lm_head and the losses."""
    if cached is None:
        taps, final = target_hidden(target, input_ids, drafter.tap_hidden_state_ids)
    else:
        taps, final = cached
    n, t = input_ids.shape
    a, b = anchors.shape[1], drafter.config.block_size
    draft, h, packed, where = draft_slot_logits(drafter, taps, input_ids, loss_mask, anchors)
    # the confidence head learns from its own loss only: its BCE target is ~0 early on and would pull the backbone's
    # hidden states toward "reject" while the distillation loss pulls elsewhere
    conf = drafter.confidence_logit(h.detach(), packed.prev_ids[where])
    sparse = None
    if weights.needs_target:
        with torch.no_grad():  # the target's top-k once per distinct position (overlapping blocks share them)
            lin = where[0] * t + packed.target_pos[where]  # [S]
            uniq, inverse = torch.unique(lin, return_inverse=True)
            if target_head is None:
                target_head = target_head_rows(drafter, target)
            logits = final.reshape(n * t, -1)[uniq].to(target_head.dtype) @ target_head.T  # [U, D]
            ids, probs = sparse_target(logits, top_k)
            sparse = (ids[inverse], probs[inverse])
    labels = draft_labels(drafter, packed.labels[where])
    out = dspark_losses(draft, where[2], sparse, labels, conf, weights, b)
    match = torch.zeros(n, a, b, dtype=torch.bool, device=h.device)
    match[where] = out.pop("match")
    return out, packed, match.view(n * a, b)


@torch.no_grad()
def decoded_anchors(
    drafter: DSparkDrafter,
    taps: torch.Tensor,  # [1, T, m*H]
    input_ids: torch.Tensor,  # [1, T]
    loss_mask: torch.Tensor,  # [1, T] bool
) -> torch.Tensor:
    """The anchors greedy decoding visits on one self-distilled sequence with the drafter as it is now: every
    candidate anchor drafted teacher-forced (the data's tokens are the target's greedy ones), then
    `replayed_decoding`. Returns sorted positions [V]."""
    cand = sample_anchors(loss_mask[0], 1 << 30).to(input_ids.device)  # [M] every candidate anchor
    if not cand.numel():
        return cand
    draft, _, packed, where = draft_slot_logits(drafter, taps, input_ids, loss_mask, cand[None])
    match = torch.zeros_like(packed.valid)  # [1, M, B]
    match[where] = draft.argmax(dim=-1) == draft_labels(drafter, packed.labels[where])
    visited, _ = replayed_decoding(cand.cpu(), match[0].cpu(), packed.valid[0].cpu())
    return torch.tensor(visited, dtype=torch.long)


class Trainer:
    """Owns the drafter, optimizer, scheduler and data position; `run()` trains to max_steps or stop_at."""

    def __init__(
        self,
        drafter: DSparkDrafter,
        target: PreTrainedModel,
        dataset: TokenDataset,
        config: TrainConfig,
        pad_id: int = 0,
        log=print,
        export=None,
        accelerator=None,
        eval_dataset: TokenDataset | None = None,
    ) -> None:
        """`eval_dataset`: held-out sequences from other data (its last `eval_sequences`), so that no training
        sequence is held out and the held-out set stays the same while the training data grows."""
        if not getattr(drafter.config, "sample_from_anchor", True):
            raise ValueError(
                "Training supports the DSpark block layout only (sample_from_anchor=True: the anchor slot drafts); this "
                "drafter uses the z-lab DFlash layout (sample_from_anchor=False). Train a fresh drafter instead of --init."
            )
        self.drafter, self.target, self.data, self.cfg, self.log = drafter, target, dataset, config, log
        # how the model is written next to each checkpoint (default: save_pretrained into <out>/drafter)
        self.export = export or (lambda out: drafter.save_pretrained(str(out / "drafter")))
        self.pad_id = pad_id
        # multi-process (accelerate launch): each rank takes its own slice of every step's sequences and gradients are
        # averaged across ranks before the optimizer step; only rank 0 writes files
        self.acc = accelerator
        self.rank = accelerator.process_index if accelerator is not None else 0
        self.world = accelerator.num_processes if accelerator is not None else 1
        self.device = target.device
        freeze_target(target)
        drafter.train()
        named = [(n, p) for n, p in drafter.named_parameters() if p.requires_grad]
        self.param_names, self.params = [n for n, _ in named], [p for _, p in named]
        # fp32 like the master weights; starts at the initial weights, so a short run's average keeps part of --init
        self.ema = [p.detach().clone() for p in self.params] if config.ema_decay else None
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=config.weight_decay)
        self.elapsed = 0.0  # training seconds (saved in checkpoints; a time-spanned schedule reads it)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(self.schedule_step(s), config.max_steps, config.warmup_ratio)
        )
        n = len(dataset)
        if eval_dataset is None:  # held out: the training data's last eval_sequences, taken out of training
            self.eval_data, held = dataset, min(config.eval_sequences, max(0, n - 1))
            evaluated = held
        else:  # held out: eval_dataset's last eval_sequences; every training sequence trains
            self.eval_data, held = eval_dataset, 0
            evaluated = min(config.eval_sequences, len(eval_dataset))
        self.train_index = [i for i in range(n - held) for _ in range(dataset.repeats[i])]  # `dir:N` weights
        self.eval_index = list(range(len(self.eval_data) - evaluated, len(self.eval_data)))
        self.step, self.epoch, self.cursor = 0, 0, 0
        self.tokens_seen, self.blocks_seen = 0, 0
        self.history: list[dict] = []
        self.out = Path(config.out_dir)
        self.state_path = self.out / "checkpoint" / STATE_FILE
        self.target_head = target_head_rows(drafter, target)  # [D, H], gathered once
        self._eval_features: dict[int, tuple] = {}  # held-out sequence -> (taps, final), computed once
        cached = dataset.check_cache(target, drafter.tap_hidden_state_ids)
        if cached:
            log(f"[train] {cached} of {n} sequences read the target's states from the cache (the rest run its forward)")

    # ---------------------------------------------------------------- schedule
    def schedule_step(self, step: int) -> int:
        """Where the lr schedule stands: `step`, or further along when it spans a training time (schedule_minutes),
        so the cosine reaches 0 when that time is spent whatever the step rate."""
        if not self.cfg.schedule_minutes:
            return step
        return max(step, int(self.cfg.max_steps * self.elapsed / (60.0 * self.cfg.schedule_minutes)))

    def schedule_done(self) -> bool:
        """max_steps reached, or (schedule_minutes) the schedule's time spent: schedule_step(step) >= step."""
        return self.schedule_step(self.step) >= self.cfg.max_steps

    # ---------------------------------------------------------------- data order
    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.cfg.seed * 7919 + epoch)
        perm = torch.randperm(len(self.train_index), generator=g).tolist()
        return [self.train_index[i] for i in perm]

    def next_batch(self) -> tuple[list[int], torch.Generator]:
        """Sequence indices for the next step and the anchor generator; advances (epoch, cursor)."""
        per_step = self.cfg.batch_size * self.world
        order = self._order(self.epoch)
        if self.cursor + per_step > len(order) and self.cursor > 0:
            self.epoch, self.cursor = self.epoch + 1, 0
            order = self._order(self.epoch)
        start = self.cursor + self.rank * self.cfg.batch_size
        idx = order[start : start + self.cfg.batch_size] or order[: self.cfg.batch_size]
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.epoch * 100_003 + start)
        self.cursor += per_step
        return idx, gen

    def batch_tensors(self, idx: list[int], gen: torch.Generator, num_anchors: int):
        seqs = [self.data[i] for i in idx]
        anchors = [sample_anchors(m, num_anchors, gen) for _, m in seqs]
        ids, lm, _, anc = pad_batch(seqs, anchors, self.pad_id)
        ids, lm, anc = ids.to(self.device), lm.to(self.device), anc.to(self.device)
        return ids, lm, anc, self._features(idx, ids)

    def _features(self, idx: list[int], ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(taps [N, T, m*H], final [N, T, H]) of the batch: the cache's where it has them, the target's forward for
        the other rows; None when no row is cached (the step runs the forward itself)."""
        hid = [self.data.cached_hidden(i) for i in idx]
        if all(h is None for h in hid):
            return None
        missing = [r for r, h in enumerate(hid) if h is None]
        if missing:
            with torch.no_grad():
                taps, final = target_hidden(self.target, ids[missing], self.drafter.tap_hidden_state_ids)
            for r, t, f in zip(missing, taps, final):
                hid[r] = (t, f)
        t = ids.shape[1]
        pad = lambda x: torch.nn.functional.pad(x.to(self.device, self.target.dtype), (0, 0, 0, t - x.shape[0]))  # noqa: E731
        return torch.stack([pad(h[0]) for h in hid]), torch.stack([pad(h[1]) for h in hid])

    # ---------------------------------------------------------------- one step
    def train_step(self) -> dict[str, float]:
        idx, gen = self.next_batch()
        ids, lm, anc, cached = self.batch_tensors(idx, gen, self.cfg.num_anchors)
        if self.cfg.anchors == "decoded":
            anc, cached = self.decoded_batch_anchors(ids, lm, cached, gen)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16_autocast):
            out, packed, match = drafter_step_outputs(
                self.drafter, self.target, ids, lm, anc, self.cfg.losses, cached, self.target_head
            )
        self.optimizer.zero_grad(set_to_none=True)
        out["loss"].backward()
        if self.world > 1:
            for p in self.params:
                grad = p.grad if p.grad is not None else torch.zeros_like(p)
                p.grad = self.acc.reduce(grad, reduction="mean")
        gnorm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:  # ema <- decay * ema + (1 - decay) * weights
            for avg, p in zip(self.ema, self.params):
                avg.lerp_(p.detach(), 1.0 - self.cfg.ema_decay)
        self.step += 1
        # counted on this rank, scaled by the number of ranks (each takes as many sequences)
        self.tokens_seen += self.world * int(sum(len(self.data[i][0]) for i in idx))
        self.blocks_seen += self.world * int(packed.valid[..., 0].sum())
        valid = packed.valid.reshape(match.shape)
        return {
            "loss": float(out["loss"].detach()),
            "ce": float(out["ce"].detach()),
            "l1": float(out["l1"].detach()),
            "kl": float(out["kl"].detach()),
            "bce": float(out["bce"].detach()),
            "acc": float(out["acc"].detach()),
            "accept": float(out["soft_accept"]),
            "match": float(out["greedy_match"]),
            "tau_tf": expected_tau(match, valid),
            "grad_norm": float(gnorm),
            "lr": self.scheduler.get_last_lr()[0],
        }

    @torch.no_grad()
    def decoded_batch_anchors(self, ids: torch.Tensor, lm: torch.Tensor, cached, gen: torch.Generator):
        """--anchors decoded: each sequence's blocks start where greedy decoding with the current drafter starts them
        (`decoded_anchors`; at most num_anchors of them, sampled). Returns (anchors [N, A], features)."""
        if cached is None:
            cached = target_hidden(self.target, ids, self.drafter.tap_hidden_state_ids)
        rows = []
        for r in range(ids.shape[0]):
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16_autocast):
                visited = decoded_anchors(self.drafter, cached[0][r : r + 1], ids[r : r + 1], lm[r : r + 1])
            if visited.numel() > self.cfg.num_anchors:
                visited = visited[torch.randperm(visited.numel(), generator=gen)[: self.cfg.num_anchors]].sort().values
            rows.append(visited)
        anc = torch.full((ids.shape[0], max(1, max(len(v) for v in rows))), -1, dtype=torch.long)
        for r, v in enumerate(rows):
            anc[r, : len(v)] = v
        return anc.to(self.device), cached

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Teacher-forced greedy tau on the held-out sequences: `eval_tau_tf` with every response position as an
        anchor, `eval_tau_replay` at the positions greedy decoding visits (`replayed_decoding`). On greedy
        self-distilled data the latter is the tau `generate()` would get on those answers."""
        if not self.eval_index:
            return {}
        self.drafter.eval()
        matches, valids, soft, ce = [], [], [], []
        replay_tokens = replay_blocks = 0
        for i in self.eval_index:
            ids, m = self.eval_data[i]
            anchors = sample_anchors(m, 1 << 30)
            if i not in self._eval_features:  # the target's features of a held-out sequence never change
                x = ids[None].to(self.device)
                self._eval_features[i] = target_hidden(self.target, x, self.drafter.tap_hidden_state_ids)
            for chunk in anchors.split(256):
                x, lm, _, anc = (z.to(self.device) for z in pad_batch([(ids, m)], [chunk], self.pad_id))
                with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.bf16_autocast):
                    out, packed, match = drafter_step_outputs(
                        self.drafter, self.target, x, lm, anc, self.cfg.losses, self._eval_features[i], self.target_head
                    )
                matches.append(match)
                valids.append(packed.valid.reshape(match.shape))
                soft.append(float(out["soft_accept"]))
                ce.append(float(out["ce"]))
            chunks = -(-len(anchors) // 256)  # this sequence's rows: the last chunks appended
            if chunks:
                _, lengths = replayed_decoding(
                    anchors, torch.cat(matches[-chunks:]).cpu(), torch.cat(valids[-chunks:]).cpu()
                )
                replay_tokens, replay_blocks = replay_tokens + sum(lengths), replay_blocks + len(lengths)
        self.drafter.train()
        match, valid = torch.cat(matches), torch.cat(valids)
        per_pos = ((match.float().cumprod(1) * valid).sum(0) / valid.sum(0).clamp_min(1)).tolist()
        return {
            "eval_tau_tf": expected_tau(match, valid),
            "eval_tau_replay": replay_tokens / max(1, replay_blocks),
            "eval_soft_accept": sum(soft) / len(soft),
            "eval_ce": sum(ce) / len(ce),
            "eval_prefix_accept_per_position": per_pos,
        }

    @contextlib.contextmanager
    def averaged_weights(self):
        """The moving average of the weights in place of the trained ones while the block runs (with --ema-decay;
        otherwise nothing changes): what evaluation measures and what the exported drafter holds."""
        if self.ema is None:
            yield
            return
        trained = [p.detach().clone() for p in self.params]
        _copy_into(self.params, self.ema)
        try:
            yield
        finally:
            _copy_into(self.params, trained)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {
            "drafter": {n: p.detach().clone() for n, p in zip(self.param_names, self.params)},
            "ema": dict(zip(self.param_names, self.ema)) if self.ema is not None else {},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "tokens_seen": self.tokens_seen,
            "blocks_seen": self.blocks_seen,
            "elapsed": self.elapsed,
            "history": self.history,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
            "train_config": asdict(self.cfg),
        }

    def save_checkpoint(self) -> None:
        if self.rank == 0:
            try:
                write_state(self.state_path, self.state_dict())
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise OSError(exc.errno, f"Disk full while writing {self.state_path} (the previous checkpoint is "
                                  "intact); free space and rerun the same command to resume from it.") from exc
                raise
            with self.averaged_weights():
                self.export(self.out)
            write_json_atomic(self.out / "history.json", self.history)
        if self.acc is not None:
            self.acc.wait_for_everyone()

    def load_checkpoint(self) -> bool:
        legacy = self.state_path.with_name(LEGACY_STATE_FILE)
        if not self.state_path.is_file() and legacy.is_file():
            raise ValueError(
                f"{legacy} is a pickled checkpoint of an earlier hf_dspark, which this version does not unpickle; "
                f"continue from its weights with a new run: --init {self.out / 'drafter'} --out <new folder>."
            )
        if not self.state_path.is_file():
            return False
        try:
            state = read_state(self.state_path)
        except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same advice
            raise ValueError(f"{self.state_path} is unreadable ({exc}); delete it to restart training from scratch.") from None
        saved = {"ema_decay": 0.0, **state["train_config"]}  # checkpoints written before the field existed: off
        for field_name in ("max_steps", "schedule_minutes", "ema_decay"):  # the schedule and the average depend on them
            if saved.get(field_name) != getattr(self.cfg, field_name):
                raise ValueError(
                    f"{self.state_path} was trained with --{field_name.replace('_', '-')} {saved.get(field_name)}; "
                    "resume with the same value (the run's schedule and average depend on it) or use a new --out."
                )
        result = self.drafter.load_state_dict(state["drafter"], strict=False)
        if result.unexpected_keys:
            raise ValueError(
                f"{self.state_path} holds weights of another drafter ({result.unexpected_keys[:3]}...); use a new --out."
            )
        if self.ema is not None:
            _copy_into(self.ema, [state["ema"][n] for n in self.param_names])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for k in ("step", "epoch", "cursor", "tokens_seen", "blocks_seen", "elapsed", "history"):
            setattr(self, k, state[k])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        return True

    # ---------------------------------------------------------------- loop
    def run(self, progress: bool = True) -> dict:
        from tqdm import tqdm

        # process-wide: the draft softmax's far tail underflows to denormals, which the CPU multiplies ~100x slower
        # (~10% of a CPU step); flushed to zero they change nothing a loss can see
        torch.set_flush_denormal(True)
        if self.load_checkpoint():
            self.log(f"[train] resumed at step {self.step} (epoch {self.epoch}, cursor {self.cursor})")
        bar = tqdm(total=self.cfg.max_steps, initial=self.step, disable=not progress, dynamic_ncols=True)
        last_ckpt = time.time()
        ema, stats = None, {}
        if not self.history and self.cfg.eval_every:
            self._record({})  # the untrained drafter: the learning curve starts at 0 tokens
        while not self.schedule_done():
            if self.cfg.stop_at is not None and time.time() >= self.cfg.stop_at:
                self.log(f"[train] stop_at reached at step {self.step}; checkpoint saved")
                break
            t0 = time.time()
            stats = self.train_step()
            if self.device.type == "cpu":
                release_freed_memory()
            self.elapsed += time.time() - t0
            ema = ema or {}
            for k, v in stats.items():  # running means for the bar (a step without full blocks has no tau_tf)
                if not math.isnan(v):
                    ema[k] = v if k not in ema else 0.9 * ema[k] + 0.1 * v
            bar.set_postfix(
                loss=f"{ema.get('loss', float('nan')):.3f}",
                acc=f"{ema.get('accept', float('nan')):.3f}",
                tau_tf=f"{ema.get('tau_tf', float('nan')):.2f}",
            )
            bar.update(1)
            entry = None
            if self.cfg.eval_every and self.step % self.cfg.eval_every == 0:
                entry = self._record(stats)
            if time.time() - last_ckpt >= self.cfg.checkpoint_minutes * 60:
                self.save_checkpoint()
                last_ckpt = time.time()
                if entry is None:
                    self.log(f"[train] step {self.step}: loss {stats['loss']:.4f}, checkpoint saved")
        bar.close()
        if not self.history or self.history[-1]["step"] != self.step:
            self._record(stats)
        self.save_checkpoint()
        return self.history[-1]

    def _record(self, stats: dict) -> dict:
        entry = {
            "step": self.step,
            "epoch": self.epoch,
            "tokens_seen": self.tokens_seen,
            "blocks_seen": self.blocks_seen,
            "train_seconds": round(self.elapsed, 1),
            **{f"train_{k}": v for k, v in stats.items()},
        }
        with self.averaged_weights():
            entry.update(self.evaluate())
        self.history.append(entry)
        write_json_atomic(self.out / "history.json", self.history)
        shown = [("loss", stats.get("loss"), ".4f"), ("held-out tau_tf", entry.get("eval_tau_tf"), ".3f"),
                 ("replayed", entry.get("eval_tau_replay"), ".3f")]
        self.log(f"[train] step {self.step}: tokens {self.tokens_seen}, "
                 + ", ".join(f"{name} {'-' if value is None else format(value, spec)}" for name, value, spec in shown))
        return entry


@torch.no_grad()
def _copy_into(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    for d, s in zip(dst, src):
        d.copy_(s)


def plot_learning_curve(history: list[dict], path: str | os.PathLike, title: str = "DSpark drafter") -> None:
    """tau (teacher-forced greedy, held-out) against training tokens, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(h["tokens_seen"], h["eval_tau_tf"]) for h in history if "eval_tau_tf" in h]
    fig, ax = plt.subplots(figsize=(6, 4))
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-")
    ax.set_xlabel("training tokens (target tokens through the drafter pass)")
    ax.set_ylabel("held-out tau (greedy, teacher-forced)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
