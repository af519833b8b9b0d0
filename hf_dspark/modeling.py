"""`DSparkDrafter`: the DFlash parallel backbone plus the Markov head and the confidence head.

Parameter names are exactly the DeepSpec-native ones (no "model." prefix): `embed_tokens`, `lm_head`
(both optional: when absent they are the bound target's), `fc`, `hidden_norm`, `layers.{i}.*` (Qwen3-style,
with q_norm/k_norm and RoPE), `norm`, `markov_head.*`, `confidence_head.proj`.

Shape symbols: N rows (requests or sequences), C context tokens, Q query (block) tokens, B block size,
H hidden size, m number of taps, V vocabulary, r Markov rank, Hq/Hk query/key heads, D head dim.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.utils import logging

from .checkpoints import load_drafter, save_drafter
from .configuration import DSparkConfig
from .draft_vocab import check_draft_maps

logger = logging.get_logger(__name__)

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per drafter layer: keys, values [N, Hk, C, D]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., size] -> [..., size]
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    """RoPE with the target's settings (default, or any `rope_type` transformers knows)."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        rope = dict(config.rope_parameters or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type == "default":
            dim = config.head_dim
            inv_freq = 1.0 / (float(rope.get("rope_theta", 10000.0)) ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            self.scaling = 1.0
        else:
            inv_freq, self.scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N, T] -> cos, sin [N, 1, T, D] (broadcast over heads)."""
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype)[:, None], (emb.sin() * self.scaling).to(dtype)[:, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, T, D], cos/sin [N, 1, T, D] -> [N, heads, T, D]."""
    return x * cos + _rotate_half(x) * sin


@dataclass
class PackedBlockMask:
    """Visibility when A drafting blocks of B slots are packed into one query stream (training): the queries of block
    a see the context keys where `context[n, a]` is True and every key of their own block, nothing else.

    The attention then scores A*B x (C + B) pairs instead of the full mask's A*B x (C + A*B)
    (`packed_block_attention`): at SmolLM2's shape (4 sequences of ~330 tokens, 112 blocks of 8 slots each), the full
    masked scaled_dot_product_attention took 1.5-2.2x as long, forward + backward, on 2 CPU threads. `dense()` gives
    the equivalent full mask."""

    context: torch.Tensor  # [N, A, C] bool, True = visible
    real: torch.Tensor  # [N, A] bool, False for padding blocks (they see only their own block; outputs unused)
    block_size: int

    def dense(self) -> torch.Tensor:
        """The full mask [N, 1, A*B, C + A*B] (True = visible); padding blocks see nothing."""
        n, a, c = self.context.shape
        b = self.block_size
        ctx = self.context[:, :, None, :].expand(n, a, b, c).reshape(n, a * b, c)
        blk = torch.arange(a, device=self.context.device).repeat_interleave(b)  # [A*B] block index of each query
        same = (blk[:, None] == blk[None, :])[None] & self.real.repeat_interleave(b, dim=1)[:, :, None]  # [N, A*B, A*B]
        return torch.cat([ctx, same], dim=-1)[:, None]


def packed_block_attention(
    q: torch.Tensor,  # [N, H, A*B, D]
    ctx_k: torch.Tensor,  # [N, Hk, C, D]
    ctx_v: torch.Tensor,  # [N, Hk, C, D]
    blk_k: torch.Tensor,  # [N, Hk, A*B, D]
    blk_v: torch.Tensor,  # [N, Hk, A*B, D]
    mask: PackedBlockMask,
) -> torch.Tensor:  # [N, H, A*B, D]
    """Attention of packed blocks: each query against the context (masked) and its own block's B keys, in one softmax
    (fp32); query head h reads key/value head h // (H / Hk), as scaled_dot_product_attention's enable_gqa."""
    n, h, q_len, d = q.shape
    hk, b = ctx_k.shape[1], mask.block_size
    g, a = h // hk, q_len // b
    qg = q.view(n, hk, g, q_len, d) * d**-0.5
    s_ctx = torch.einsum("nkgqd,nkcd->nkgqc", qg, ctx_k)  # [N, Hk, g, Q, C]
    hidden = ~mask.context.repeat_interleave(b, dim=1)[:, None, None]  # [N, 1, 1, Q, C]
    s_ctx = s_ctx.masked_fill(hidden, float("-inf"))
    s_blk = torch.einsum("nkgabd,nkacd->nkgabc", qg.view(n, hk, g, a, b, d), blk_k.view(n, hk, a, b, d))  # [.., A, B, B]
    p = torch.cat([s_ctx, s_blk.reshape(n, hk, g, q_len, b)], dim=-1).float().softmax(dim=-1).to(q.dtype)
    c = ctx_k.shape[2]
    out = torch.einsum("nkgqc,nkcd->nkgqd", p[..., :c], ctx_v)
    out = out + torch.einsum("nkgabc,nkacd->nkgabd", p[..., c:].reshape(n, hk, g, a, b, b), blk_v.view(n, hk, a, b, d)).reshape(
        n, hk, g, q_len, d
    )
    return out.view(n, h, q_len, d)


class DraftAttention(nn.Module):
    """Queries from the block; keys/values = [context features ; block], both through k_proj/v_proj."""

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        h, d, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=bias)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)

    def key_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, T, H] -> keys, values [N, Hk, T, D] (keys normed and rotated)."""
        n, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(n, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(n, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,  # [N, Q, H] block hidden states
        cos: torch.Tensor,  # [N, 1, Q, D]
        sin: torch.Tensor,  # [N, 1, Q, D]
        ctx_k: torch.Tensor,  # [N, Hk, C, D]
        ctx_v: torch.Tensor,  # [N, Hk, C, D]
        mask: torch.Tensor | PackedBlockMask,  # [N, 1, Q, C + Q] bool, True = visible (or packed training blocks)
    ) -> torch.Tensor:  # [N, Q, H]
        n, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(n, q_len, self.num_heads, self.head_dim)).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k_blk, v_blk = self.key_values(x, cos, sin)
        ctx_k, ctx_v = ctx_k.to(k_blk.dtype), ctx_v.to(v_blk.dtype)
        if isinstance(mask, PackedBlockMask):
            out = packed_block_attention(q, ctx_k, ctx_v, k_blk, v_blk, mask)
        else:
            k, v = torch.cat([ctx_k, k_blk], dim=2), torch.cat([ctx_v, v_blk], dim=2)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(n, q_len, -1))


class DraftMLP(nn.Module):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DraftAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = DraftMLP(config)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):  # shapes as DraftAttention.forward
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """Previous-token logit bias `W2 latent`, latent from `e = W1[x_{k-1}]`.

    vanilla: latent = e;  gated: latent = sigmoid(gate_proj([h; e])) * e;
    rnn: [g, c, o] = joint_proj([s; e; h]), s' = g*s + (1-g)*tanh(c), latent = tanh(o).
    """

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__()
        r, v, h = config.markov_rank, config.vocab_size, config.hidden_size
        self.head_type = config.markov_head_type
        self.rank = r
        self.markov_w1 = nn.Embedding(v, r)  # indexed by the previous token: any target id
        self.markov_w2 = nn.Linear(r, config.draft_vocab_size or v, bias=False)  # a bias over the draft vocabulary
        if self.head_type == "gated":
            self.gate_proj = nn.Linear(h + r, r)
        elif self.head_type == "rnn":
            self.joint_proj = nn.Linear(2 * r + h, 3 * r)

    def prev_embedding(self, prev_ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., r]
        return self.markov_w1(prev_ids)

    def latent(
        self,
        prev_ids: torch.Tensor,  # [...]
        hidden: torch.Tensor,  # [..., H]
        state: torch.Tensor | None = None,  # [..., r] (rnn only; zeros at the block start)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # latent [..., r], next state [..., r] | None
        e = self.prev_embedding(prev_ids).to(hidden.dtype)
        if self.head_type == "vanilla":
            return e, None
        if self.head_type == "gated":
            return torch.sigmoid(self.gate_proj(torch.cat([hidden, e], dim=-1))) * e, None
        if state is None:
            state = torch.zeros_like(e)
        g, c, o = self.joint_proj(torch.cat([state, e, hidden], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(g)
        return torch.tanh(o), g * state + (1.0 - g) * torch.tanh(c)

    def bias(self, latent: torch.Tensor) -> torch.Tensor:  # [..., r] -> [..., D]
        return self.markov_w2(latent)

    def block_latent(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced latents for whole blocks: prev_ids [..., B], hidden [..., B, H] -> [..., B, r]."""
        if self.head_type != "rnn":
            return self.latent(prev_ids, hidden)[0]
        state, out = None, []
        for k in range(prev_ids.shape[-1]):
            latent, state = self.latent(prev_ids[..., k], hidden[..., k, :], state)
            out.append(latent)
        return torch.stack(out, dim=-2)

    def block_bias(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Teacher-forced bias for whole blocks: prev_ids [..., B], hidden [..., B, H] -> [..., B, D]."""
        return self.bias(self.block_latent(prev_ids, hidden))


class ConfidenceHead(nn.Module):
    """c_k = sigmoid(proj([h_k ; W1[x_{k-1}]])): P(draft k accepted | drafts < k accepted)."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # [..., H (+r)] -> [...] logits
        return self.proj(features).squeeze(-1)


def sliding_window_mask(mask: torch.Tensor, num_queries: int, window: int, non_causal: bool) -> torch.Tensor:
    """A full-attention block mask [N, 1, Q, C + Q] (True = visible) -> the mask of a sliding_attention layer, with
    speculators' semantics: each query keeps only the last `window` context keys it sees (its block's anchor at p
    sees the context positions < p, so these are p-W..p-1), and block keys at later slots are hidden unless
    `non_causal`. Blocks are runs of mutually visible queries, so the packed training layout (A blocks of B slots,
    block-diagonal) works as the single drafting block does."""
    c = mask.shape[-1] - num_queries
    ctx, blk = mask[..., :c], mask[..., c:]
    later = ctx.flip(-1).cumsum(-1, dtype=torch.int32).flip(-1)  # visible context keys at or after each column
    ctx = ctx & (later <= window)
    if not non_causal:
        blk = blk & torch.ones(num_queries, num_queries, dtype=torch.bool, device=mask.device).tril()
    return torch.cat([ctx, blk], dim=-1)


class DSparkDrafter(PreTrainedModel):
    """DSpark drafter (DFlash when `config.markov_rank == 0`).

    Load with `DSparkDrafter.from_pretrained(path_or_repo, target=model)` (DeepSpec-native, speculators or
    our own format) or build with `DSparkDrafter(DSparkConfig.from_target(model.config, ...))` and
    `drafter.bind(model)`.
    """

    config_class = DSparkConfig
    base_model_prefix = "dspark"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _no_split_modules = ["DraftLayer"]

    def __init__(self, config: DSparkConfig) -> None:
        super().__init__(config)
        h = config.hidden_size
        if config.target_layer_ids is None:
            raise ValueError("DSparkConfig.target_layer_ids is not set; build the config with DSparkConfig.from_target(...).")
        if config.mask_token_id is None:
            raise ValueError("DSparkConfig.mask_token_id is not set; build the config with DSparkConfig.from_target(...).")
        if config.share_target_embeddings:
            self.embed_tokens = None
            self.lm_head = None
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, h)
            self.lm_head = nn.Linear(h, config.vocab_size, bias=False)
        if config.reduced_vocab:  # speculators' layout: own head over D rows, maps between the vocabularies
            d = config.draft_vocab_size
            self.lm_head = nn.Linear(h, d, bias=False)
            self.register_buffer("d2t", torch.zeros(d, dtype=torch.long))  # target id = draft id + d2t[draft id]
            self.register_buffer("t2d", torch.arange(config.vocab_size) < d)  # target id is draftable (default: ids < D)
        self.fc = nn.Linear(len(config.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)
        self.markov_head = MarkovHead(config) if config.markov_rank > 0 else None
        self.confidence_head = None
        if config.enable_confidence_head:
            with_markov = config.confidence_head_with_markov and config.markov_rank > 0
            self.confidence_head = ConfidenceHead(h + (config.markov_rank if with_markov else 0))
        self._target: Any = None  # weakref to the bound target
        self._shared: tuple[nn.Module, nn.Module] | None = None  # (embeddings, lm_head) of the bound target
        self.calibration: dict | None = None  # Sequential Temperature Scaling result, if present
        self.last_stats: Any = None
        self._dspark_scheduler: Any = None  # (key, AdaptiveVerification) reused across generate calls
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        std = 0.02
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    # ------------------------------------------------------------------ draft vocabulary
    @property
    def draft_vocab_size(self) -> int:
        """D: how many tokens the drafter proposes (the target's vocabulary size unless reduced)."""
        return self.config.draft_vocab_size or self.config.vocab_size

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Choose the draft vocabulary: target_ids [D] distinct target ids (draft id i proposes target_ids[i])."""
        ids = torch.as_tensor(target_ids, dtype=torch.long).flatten()
        d2t = ids - torch.arange(ids.numel(), device=ids.device)
        check_draft_maps(d2t, None, self.config.vocab_size, self.draft_vocab_size)
        self.d2t.copy_(d2t)
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_target_ids(self) -> torch.Tensor | None:
        """[D] the target id of each draft id (None for a full-vocabulary drafter)."""
        if not self.config.reduced_vocab:
            return None
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def target_to_draft(self) -> torch.Tensor | None:
        """[V] the draft id of each target id, -1 where the drafter cannot propose it (None when not reduced)."""
        if not self.config.reduced_vocab:
            return None
        ids = self.draft_target_ids()
        out = torch.full((self.config.vocab_size,), -1, dtype=torch.long, device=ids.device)
        out[ids] = torch.arange(ids.numel(), device=ids.device)
        return out

    def to_target_vocab(self, values: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
        """Draft-vocabulary values [..., D] -> target vocabulary [..., V], `fill` where the drafter cannot propose:
        -inf for logits, 0 for probabilities (q = 0 there, and verification's residual max(0, p - q) covers those
        tokens exactly)."""
        if not self.config.reduced_vocab:
            return values
        out = values.new_full((*values.shape[:-1], self.config.vocab_size), fill)
        return out.index_copy_(-1, self.draft_target_ids(), values)

    # ------------------------------------------------------------------ target binding
    def bind(self, target: PreTrainedModel) -> "DSparkDrafter":
        """Tie the drafter to `target`: check the dims match, share its embeddings/lm_head if needed, and route
        `target.generate(..., assistant_model=<DSparkDrafter>)` to DSpark on that model instance (`hf_dspark.routing`;
        other models and calls are untouched)."""
        text = target.config.get_text_config()
        cfg = self.config
        problems = []
        if int(text.vocab_size) != cfg.vocab_size:
            problems.append(f"vocab_size {cfg.vocab_size} != target's {text.vocab_size}")
        if int(text.hidden_size) != cfg.hidden_size:
            problems.append(f"hidden_size {cfg.hidden_size} != target's {text.hidden_size}")
        if cfg.num_target_layers is not None and int(text.num_hidden_layers) != cfg.num_target_layers:
            problems.append(f"num_target_layers {cfg.num_target_layers} != target's {text.num_hidden_layers} layers")
        if problems:
            raise ValueError(
                f"This drafter does not fit {type(target).__name__} ({'; '.join(problems)}); load the drafter trained for "
                "this target, or train one with `hf-dspark train`."
            )
        DSparkConfig.check_target_layer_ids(cfg.target_layer_ids, int(text.num_hidden_layers))
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None or head.weight.shape[0] < cfg.vocab_size:
            raise ValueError(f"{type(target).__name__} has no usable lm_head; DSpark needs a causal-LM target.")
        if cfg.reduced_vocab:
            check_draft_maps(self.d2t, self.t2d, cfg.vocab_size, cfg.draft_vocab_size)
        self._shared = (embed, head)
        self._target = weakref.ref(target)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):  # pipelines compare these with the target's
            setattr(self.config, name, getattr(text, name, None))
        from .routing import install_route  # here: routing imports the generation loop, which imports this module

        install_route(target)
        return self

    @property
    def target(self) -> PreTrainedModel | None:
        """The bound target model (None when unbound or garbage collected)."""
        return self._target() if self._target is not None else None

    def require_target(self, target: PreTrainedModel | None = None) -> PreTrainedModel:
        """Return the bound target, checking that `target` (if given) is the one this drafter is bound to."""
        bound = self.target
        if bound is None:
            if target is None:
                raise ValueError("The drafter is not bound to a target; call drafter.bind(model) first.")
            self.bind(target)
            return target
        if target is not None and bound is not target:
            raise ValueError(
                "The drafter is bound to a different target model; call drafter.bind(model) with the model you generate with."
            )
        return bound

    def input_embeddings(self) -> nn.Module:
        if self.embed_tokens is not None:
            return self.embed_tokens
        if self._shared is None:
            raise ValueError("The drafter shares the target's embeddings but is not bound; call drafter.bind(model) first.")
        return self._shared[0]

    def output_head(self) -> nn.Module:
        if self.lm_head is not None:
            return self.lm_head
        if self._shared is None:
            raise ValueError("The drafter shares the target's lm_head but is not bound; call drafter.bind(model) first.")
        return self._shared[1]

    def get_input_embeddings(self) -> nn.Module | None:
        return self.embed_tokens if self.embed_tokens is not None else (self._shared[0] if self._shared else None)

    def get_output_embeddings(self) -> nn.Module | None:
        return self.lm_head

    # ------------------------------------------------------------------ forward pieces
    @property
    def tap_hidden_state_ids(self) -> list[int]:
        """Indices into HF `hidden_states` (layer l's output is hidden_states[l + 1])."""
        return [i + 1 for i in self.config.target_layer_ids]

    def context_features(self, taps: torch.Tensor) -> torch.Tensor:
        """taps [N, C, m*H] (concatenated target layer outputs) -> context features [N, C, H]."""
        return self.hidden_norm(self.fc(taps.to(self.fc.weight.dtype)))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> KVCache:
        """features [N, C, H], positions [N, C] -> per layer (keys, values) [N, Hk, C, D]."""
        cos, sin = self.rotary(positions, features.dtype)
        return [layer.self_attn.key_values(features, cos, sin) for layer in self.layers]

    def block_hidden(
        self,
        block_ids: torch.Tensor | None,  # [N, Q] anchors and MASK tokens (or pass inputs_embeds)
        positions: torch.Tensor,  # [N, Q] absolute positions of the block slots
        ctx_kv: KVCache,  # per layer [N, Hk, C, D]
        mask: torch.Tensor | PackedBlockMask,  # [N, 1, Q, C + Q] bool, True = visible (or packed training blocks)
        inputs_embeds: torch.Tensor | None = None,  # [N, Q, H] instead of block_ids
    ) -> torch.Tensor:  # [N, Q, H] final-normed hidden states h_k
        x = inputs_embeds if inputs_embeds is not None else self.input_embeddings()(block_ids)
        x = x.to(self.fc.weight.dtype)
        cos, sin = self.rotary(positions, x.dtype)
        cfg = self.config
        sliding = cfg.sliding_layers
        masks = {False: mask}
        if any(sliding):
            full = mask.dense() if isinstance(mask, PackedBlockMask) else mask
            masks[True] = sliding_window_mask(full, x.shape[1], cfg.sliding_window, cfg.sliding_window_non_causal)
        # a query that sees nothing (a padding block) attends everywhere instead of producing NaN; its output is unused
        masks = {kind: m if isinstance(m, PackedBlockMask) else m | ~m.any(dim=-1, keepdim=True) for kind, m in masks.items()}
        for layer, (k, v), slides in zip(self.layers, ctx_kv, sliding):
            x = layer(x, cos, sin, k, v, masks[slides])
        return self.norm(x)

    def base_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> U_k [..., D] through the lm_head (the target's shared one, or the drafter's own over the
        draft vocabulary; map with `to_target_vocab`)."""
        head = self.output_head()
        return head(hidden.to(head.weight.dtype))[..., : self.draft_vocab_size]

    def markov_latent(
        self, prev_ids: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """prev_ids [...], hidden [..., H] -> Markov latent [..., r] (None without a head), next rnn state."""
        if self.markov_head is None:
            return None, None
        return self.markov_head.latent(prev_ids, hidden, state)

    def markov_bias(self, latent: torch.Tensor) -> torch.Tensor:
        """latent [..., r] -> logit bias [..., D]."""
        return self.markov_head.bias(latent)

    def confidence_logit(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor | None:
        """hidden [..., H], prev_ids [...] -> confidence logit z_k [...] (None without a confidence head)."""
        if self.confidence_head is None:
            return None
        feats = hidden
        if self.confidence_head.proj.in_features > hidden.shape[-1]:
            feats = torch.cat([hidden, self.markov_head.prev_embedding(prev_ids).to(hidden.dtype)], dim=-1)
        return self.confidence_head(feats).float()

    def __getattr__(self, name: str) -> Any:
        """nn.Module's lookup; a drafter has no `generation_config`, and the AttributeError says why when
        transformers' generic assisted decoding (a model the drafter is not bound to) reads it first."""
        if name == "generation_config":
            raise AttributeError(self._not_routed_message())
        return super().__getattr__(name)

    def _not_routed_message(self) -> str:
        bound = self.target
        where = "is not bound to a model" if bound is None else f"is bound to another model ({type(bound).__name__})"
        return (
            f"transformers' generic assisted decoding got a DSparkDrafter, which {where}. Bind it to the model you "
            "generate with -- DSparkDrafter.from_pretrained(..., target=model) or drafter.bind(model) -- and "
            "model.generate(..., assistant_model=drafter) runs DSpark; or pass custom_generate=hf_dspark.generate, "
            "drafter=drafter."
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - guidance only
        raise TypeError(
            "DSparkDrafter is not called directly; pass it to target.generate(..., assistant_model=drafter) "
            "or use the training forward in hf_dspark.training."
        )

    # ------------------------------------------------------------------ persistence
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str, *model_args: Any, target: PreTrainedModel | None = None, **kwargs: Any) -> "DSparkDrafter":  # type: ignore[override]
        """Load a drafter (our format, DeepSpec-native or speculators) from a folder or Hub repo.

        Args:
            pretrained_model_name_or_path: local folder or Hub repo id.
            target: bind to this target after loading (required when the checkpoint has no embeddings).
            dtype: parameter dtype (default: the target's dtype, else float32).
            revision, cache_dir, token, local_files_only: forwarded to the Hub download.
        """
        if model_args:
            raise TypeError("DSparkDrafter.from_pretrained takes the path and keyword arguments only.")
        return load_drafter(cls, pretrained_model_name_or_path, target=target, **kwargs)

    def save_pretrained(self, save_directory: str, **kwargs: Any) -> None:  # type: ignore[override]
        """Write our format atomically: config.json, model.safetensors (no shared embeddings), calibration.json,
        and a `custom_generate/` folder so the folder also works as `generate(custom_generate=folder)`."""
        save_drafter(self, save_directory, **kwargs)
