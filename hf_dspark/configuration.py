"""`DSparkConfig`: the drafter's configuration, derived from (and checked against) a target model.

A DSpark drafter copies its layer dimensions from the target it drafts for, taps the target's decoder
layers at `target_layer_ids`, and drafts `block_size` tokens per round. `markov_rank = 0` is plain
DFlash: one class serves both.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedConfig

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
LAYER_TYPES = ("full_attention", "sliding_attention")

# Upper bounds that no real drafter reaches; a config beyond them is refused before any allocation.
_MAX_VOCAB = 4_000_000
_MAX_HIDDEN = 65_536
_MAX_INTERMEDIATE = 262_144
_MAX_LAYERS = 256
_MAX_HEADS = 1_024
_MAX_PARAMS = 40_000_000_000


def default_target_layer_ids(num_target_layers: int, num_taps: int = 5) -> list[int]:
    """Tap ids spread evenly over layers 1..L-3 (36 layers -> [1, 9, 17, 25, 33])."""
    if num_target_layers < 3:
        raise ValueError(
            f"num_target_layers={num_target_layers} is too small to tap: the target needs at least 3 decoder layers."
        )
    lo, hi = 1, max(1, num_target_layers - 3)
    if num_taps <= 1 or hi == lo:
        return [lo] if num_taps <= 1 or hi == lo else [lo, hi]
    ids = [round(lo + i * (hi - lo) / (num_taps - 1)) for i in range(num_taps)]
    return sorted(set(ids))


class DSparkConfig(PreTrainedConfig):
    r"""Configuration of a [`DSparkDrafter`].

    Layer dimensions (`hidden_size`, `intermediate_size`, heads, `head_dim`, `rms_norm_eps`, RoPE settings,
    `vocab_size`, `max_position_embeddings`) are copied from the target by [`DSparkConfig.from_target`].

    Args:
        num_hidden_layers: number of drafter decoder layers (DeepSpec uses 5 for Qwen3-4B/8B).
        block_size: drafted tokens per round B (slot k predicts token p+k+1, "anchor as first prediction").
        target_layer_ids: 0-based target decoder layers whose outputs feed the drafter (never the last one).
        num_target_layers: number of decoder layers of the target.
        mask_token_id: an unused vocabulary row used for the B-1 masked slots of a block.
        markov_rank: rank r of the Markov head; 0 disables it (plain DFlash).
        markov_head_type: "vanilla", "gated" or "rnn".
        enable_confidence_head: whether the drafter predicts per-position acceptance.
        confidence_head_with_markov: whether the confidence head also sees W1[x_{k-1}].
        share_target_embeddings: the checkpoint carries no `embed_tokens`/`lm_head`; they are the target's.
        target_model_id: name of the target this drafter was trained for (informational, checked at bind).
        draft_vocab_size: number D of target tokens the drafter can propose (None or `vocab_size`: all of them).
            With D < vocab_size the drafter has its own `lm_head` over D rows, the Markov head's W2 has D rows, and
            the buffers `d2t` [D] (offsets: target id = draft id + d2t[draft id]) and `t2d` [V] (bool) map between the
            two vocabularies, exactly as speculators writes them. Verification stays exact: q = 0 outside the draft
            vocabulary.
        layer_types: per drafter layer, "full_attention" (the block sees the whole context before the anchor and
            attends bidirectionally inside itself) or "sliding_attention" (speculators' layout: the block sees only
            the `sliding_window` context positions p-W..p-1 before its anchor at p, and attends causally inside
            itself unless `sliding_window_non_causal`). None: every layer is full_attention.
        sliding_window: W, the context window of sliding_attention layers (a positive integer; required by them).
        sliding_window_non_causal: sliding_attention layers attend bidirectionally inside the block (speculators'
            `sliding_window_non_causal`); full_attention layers always do.
        sample_from_anchor: True (DSpark, DeepSpec): the block is [anchor, MASK x (B-1)] and slot k drafts token
            p+k+1, B drafts. False (z-lab DFlash, speculators' DFlash default): the block has one more slot,
            [anchor, MASK x B], whose anchor slot drafts nothing; slot k >= 1 drafts token p+k. Either way
            `block_size` counts the drafts per round (speculators' block_size is `block_slots`).
    """

    model_type = "dspark"

    vocab_size: int = 32000
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 1
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_parameters: dict | None = None
    max_position_embeddings: int = 32768
    attention_bias: bool = False
    block_size: int = 7
    target_layer_ids: list[int] | None = None
    num_target_layers: int | None = None
    mask_token_id: int | None = None
    markov_rank: int = 0
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = False
    num_anchors: int = 512
    share_target_embeddings: bool = True
    target_model_id: str | None = None
    draft_vocab_size: int | None = None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    sliding_window_non_causal: bool = False
    sample_from_anchor: bool = True
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs: Any) -> None:
        if self.head_dim is None and self.num_attention_heads:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.rope_parameters is None:
            self.rope_parameters = {"rope_type": "default", "rope_theta": float(kwargs.pop("rope_theta", 10000.0))}
        if self.target_layer_ids is not None:
            self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.layer_types is not None:
            self.layer_types = list(self.layer_types)
        self.check()
        super().__post_init__(**kwargs)

    # ------------------------------------------------------------------ validation
    def check(self) -> None:
        """Raise a one-sentence `ValueError` naming the bad field and the fix."""
        for name, bound in (
            ("vocab_size", _MAX_VOCAB),
            ("hidden_size", _MAX_HIDDEN),
            ("intermediate_size", _MAX_INTERMEDIATE),
            ("num_hidden_layers", _MAX_LAYERS),
            ("num_attention_heads", _MAX_HEADS),
            ("num_key_value_heads", _MAX_HEADS),
            ("head_dim", _MAX_HIDDEN),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"DSparkConfig.{name}={value!r} must be a positive integer; copy it from the target config.")
            if value > bound:
                raise ValueError(
                    f"DSparkConfig.{name}={value} is absurdly large (limit {bound}); the config is corrupt or not a drafter config."
                )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"DSparkConfig.num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; copy both from the target config."
            )
        if self.estimated_num_parameters() > _MAX_PARAMS:
            raise ValueError(
                f"DSparkConfig describes ~{self.estimated_num_parameters() / 1e9:.0f}B parameters, far beyond any drafter; "
                "the config is corrupt or not a drafter config."
            )
        if not isinstance(self.block_size, int) or not 1 <= self.block_size <= 64:
            raise ValueError(f"DSparkConfig.block_size={self.block_size!r} must be an integer in [1, 64]; 7 is the usual choice.")
        if not isinstance(self.markov_rank, int) or not 0 <= self.markov_rank <= self.vocab_size:
            raise ValueError(
                f"DSparkConfig.markov_rank={self.markov_rank!r} must be in [0, vocab_size={self.vocab_size}]; "
                "use 0 for plain DFlash or a small rank such as 64-256."
            )
        if self.draft_vocab_size is not None and (
            not isinstance(self.draft_vocab_size, int) or isinstance(self.draft_vocab_size, bool)
            or not 1 <= self.draft_vocab_size <= self.vocab_size
        ):
            raise ValueError(
                f"DSparkConfig.draft_vocab_size={self.draft_vocab_size!r} must be an integer in [1, vocab_size={self.vocab_size}] "
                "(or None for the full vocabulary)."
            )
        if self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(
                f"DSparkConfig.markov_head_type={self.markov_head_type!r} is unknown; use one of {', '.join(MARKOV_HEAD_TYPES)}."
            )
        if self.confidence_head_with_markov and self.enable_confidence_head and self.markov_rank == 0:
            raise ValueError(
                "DSparkConfig.confidence_head_with_markov=True needs markov_rank > 0; set it to False for a DFlash drafter."
            )
        if self.mask_token_id is not None and not 0 <= int(self.mask_token_id) < self.vocab_size:
            raise ValueError(
                f"DSparkConfig.mask_token_id={self.mask_token_id} is outside the vocabulary [0, {self.vocab_size}); "
                "pick an unused vocabulary row."
            )
        if self.target_layer_ids is not None:
            self.check_target_layer_ids(self.target_layer_ids, self.num_target_layers)
        self.check_layer_types()

    def check_layer_types(self) -> None:
        """layer_types: one known type per layer; a sliding layer needs a positive sliding_window."""
        types = self.layer_types
        if types is not None:
            if not isinstance(types, list) or len(types) != self.num_hidden_layers:
                raise ValueError(
                    f"DSparkConfig.layer_types={types!r} must list one type per drafter layer "
                    f"(num_hidden_layers={self.num_hidden_layers})."
                )
            unknown = sorted({str(t) for t in types} - set(LAYER_TYPES))
            if unknown:
                raise ValueError(
                    f"DSparkConfig.layer_types holds {', '.join(unknown)}, which hf_dspark does not implement; "
                    f"use {' or '.join(LAYER_TYPES)}."
                )
        w = self.sliding_window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w <= 0):
            raise ValueError(f"DSparkConfig.sliding_window={w!r} must be a positive integer (the context window W).")
        if types is not None and "sliding_attention" in types and w is None:
            raise ValueError(
                "DSparkConfig.layer_types has sliding_attention layers but sliding_window is not set; give the window."
            )
        if not isinstance(self.sample_from_anchor, bool):
            raise ValueError(f"DSparkConfig.sample_from_anchor={self.sample_from_anchor!r} must be true or false.")
        if not isinstance(self.sliding_window_non_causal, bool):
            raise ValueError(
                f"DSparkConfig.sliding_window_non_causal={self.sliding_window_non_causal!r} must be true or false."
            )

    @property
    def block_slots(self) -> int:
        """Slots of one drafted block: block_size, plus the anchor slot that drafts nothing when not
        sample_from_anchor."""
        return self.block_size + (0 if self.sample_from_anchor else 1)

    @property
    def sliding_layers(self) -> list[bool]:
        """Per drafter layer: True where it is a sliding_attention layer."""
        return [t == "sliding_attention" for t in (self.layer_types or ["full_attention"] * self.num_hidden_layers)]

    @staticmethod
    def check_target_layer_ids(ids: list[int], num_target_layers: int | None) -> None:
        """Tap ids must be non-empty, strictly increasing, in [0, L-2] (the last layer is post-norm in HF)."""
        if not ids:
            raise ValueError("DSparkConfig.target_layer_ids is empty; give at least one target layer to tap, e.g. [1, 9, 17].")
        if any(b <= a for a, b in zip(ids, ids[1:])):
            raise ValueError(f"DSparkConfig.target_layer_ids={ids} must be strictly increasing; sort them and drop duplicates.")
        if num_target_layers is None:
            return
        if ids[0] < 0 or ids[-1] > num_target_layers - 1:
            raise ValueError(
                f"DSparkConfig.target_layer_ids={ids} are out of range for a target with {num_target_layers} layers; "
                f"use ids in [0, {num_target_layers - 2}]."
            )
        if ids[-1] == num_target_layers - 1:
            raise ValueError(
                f"DSparkConfig.target_layer_ids={ids} taps the target's last layer {num_target_layers - 1}, whose HF hidden "
                f"state is post-norm; use ids up to {num_target_layers - 2}."
            )

    def estimated_num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        hd = self.head_dim or h // max(1, self.num_attention_heads)
        attn = h * hd * (2 * self.num_attention_heads + 2 * (self.num_key_value_heads or self.num_attention_heads))
        layer = attn + 3 * h * i
        taps = len(self.target_layer_ids or [1])
        d = self.draft_vocab_size or v
        markov = (v + d) * self.markov_rank
        embeddings = 0 if self.share_target_embeddings else 2 * v * h
        draft_head = d * h if d < v else 0
        return self.num_hidden_layers * layer + taps * h * h + markov + embeddings + draft_head

    @property
    def reduced_vocab(self) -> bool:
        """True when the drafter proposes only `draft_vocab_size` < `vocab_size` tokens."""
        return self.draft_vocab_size is not None and self.draft_vocab_size < self.vocab_size

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target(
        cls,
        target_config: PreTrainedConfig,
        *,
        num_hidden_layers: int = 1,
        block_size: int = 7,
        target_layer_ids: list[int] | None = None,
        num_taps: int = 5,
        mask_token_id: int | None = None,
        tokenizer: Any = None,
        markov_rank: int = 64,
        markov_head_type: str = "vanilla",
        enable_confidence_head: bool | None = None,
        confidence_head_with_markov: bool | None = None,
        target_model_id: str | None = None,
        **kwargs: Any,
    ) -> "DSparkConfig":
        """Derive a drafter config from a target config.

        Dims are copied from the target; default taps are spread over 1..L-3; the mask token is
        `mask_token_id` if given, else an unused vocabulary row found via `tokenizer` (a row beyond the
        tokenizer's vocabulary, or an unused reserved special token).
        """
        text = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
        num_target_layers = int(text.num_hidden_layers)
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(num_target_layers, num_taps)
        if mask_token_id is None:
            mask_token_id = find_mask_token_id(text.vocab_size, tokenizer)
        if enable_confidence_head is None:
            enable_confidence_head = markov_rank > 0
        if confidence_head_with_markov is None:
            confidence_head_with_markov = enable_confidence_head and markov_rank > 0
        rope = getattr(text, "rope_parameters", None)
        if rope is None:
            rope = {"rope_type": "default", "rope_theta": float(getattr(text, "rope_theta", 10000.0))}
        heads = int(text.num_attention_heads)
        return cls(
            vocab_size=int(text.vocab_size),
            hidden_size=int(text.hidden_size),
            intermediate_size=int(text.intermediate_size),
            num_hidden_layers=num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
            hidden_act=getattr(text, "hidden_act", "silu"),
            rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
            rope_parameters=dict(rope),
            max_position_embeddings=int(getattr(text, "max_position_embeddings", 32768)),
            block_size=block_size,
            target_layer_ids=list(target_layer_ids),
            num_target_layers=num_target_layers,
            mask_token_id=int(mask_token_id),
            markov_rank=markov_rank,
            markov_head_type=markov_head_type,
            enable_confidence_head=enable_confidence_head,
            confidence_head_with_markov=confidence_head_with_markov,
            bos_token_id=getattr(text, "bos_token_id", None),
            eos_token_id=getattr(text, "eos_token_id", None),
            pad_token_id=getattr(text, "pad_token_id", None),
            target_model_id=target_model_id or getattr(text, "_name_or_path", None) or None,
            **kwargs,
        )


_MASK_NAME_HINTS = ("mask", "reserved", "unused", "placeholder")


def find_mask_token_id(vocab_size: int, tokenizer: Any = None) -> int:
    """Pick an unused vocabulary row for the MASK slots.

    Prefers a row beyond the tokenizer's vocabulary (e.g. Qwen3: 151669 of 151936), then an added special
    token whose name says it is a mask/reserved/unused token, then any added special token that no chat
    template or special-token role uses.
    """
    if tokenizer is None:
        raise ValueError(
            "Cannot choose a mask token without the tokenizer; pass mask_token_id=<an unused vocab id> or tokenizer=..."
        )
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    roles = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = str(getattr(tokenizer, "chat_template", "") or "")
    added = sorted(getattr(tokenizer, "added_tokens_decoder", {}).items())
    free = [(i, str(t)) for i, t in added if i not in roles and str(t) not in template and 0 <= i < vocab_size]
    for i, name in free:
        if any(hint in name.lower() for hint in _MASK_NAME_HINTS):
            return i
    if free:
        return free[-1][0]
    raise ValueError(
        "Found no unused vocabulary row for the mask token (the tokenizer fills the vocabulary and has no spare special "
        "token); pass mask_token_id=<id of a token your data never uses>."
    )
