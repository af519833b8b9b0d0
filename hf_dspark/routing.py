"""`model.generate(..., assistant_model=<DSparkDrafter>)` on the models a drafter is bound to, and on nothing else.

Binding (`DSparkDrafter.from_pretrained(..., target=model)` or `drafter.bind(model)`) installs two attributes on
that model instance -- never on its class, never on `GenerationMixin`:

- `generate`: a call whose `assistant_model` is a DSparkDrafter (or a PEFT model around one) runs the engine
  `dspark_engine=` names: "dspark" (the default) is our batched loop, `hf_dspark.generate`, reached through
  transformers' `custom_generate`; "transformers" is transformers' own assisted loop (`_assisted_decoding`, batch
  1) with `DSparkCandidateGenerator`. Every other call goes to the class's `generate` untouched.
- `_get_candidate_generator`: hands transformers' assisted loop a `DSparkCandidateGenerator` when the assistant is
  a DSparkDrafter, with the options of the `dspark_engine="transformers"` call (a context variable, so concurrent
  calls in other threads keep theirs); any other assistant gets transformers' own choice.

The attributes are `functools.partial`s of module functions, so they follow the model into pipelines, `copy.deepcopy`
and pickle. A model that was never bound passes a DSparkDrafter to transformers' generic assisted decoding, which stops at once with
an error naming the fix (see `DSparkDrafter.__getattr__`).
"""

from __future__ import annotations

import functools
import inspect
from contextvars import ContextVar
from typing import Any

from transformers import PreTrainedModel

from .candidate_generator import DSparkCandidateGenerator
from .generation import BEAM_SEARCH_REFUSED, as_drafter, generate

# the options of the dspark_engine="transformers" call in progress (None: the generator's defaults)
_TRANSFORMERS_LOOP_OPTIONS: ContextVar[dict[str, Any] | None] = ContextVar("dspark_transformers_loop_options", default=None)


def install_route(model: PreTrainedModel) -> None:
    """Route `model.generate(..., assistant_model=<DSparkDrafter>)` to DSpark on this model instance (idempotent)."""
    if not is_routed(model):
        model.generate = functools.partial(_routed_generate, model)
        model._get_candidate_generator = functools.partial(_candidate_generator, model)


def is_routed(model: PreTrainedModel) -> bool:
    """Whether `install_route` ran on this model instance."""
    return getattr(vars(model).get("generate"), "func", None) is _routed_generate


def _routed_generate(self: PreTrainedModel, *args: Any, dspark_engine: str | None = None, **kwargs: Any) -> Any:
    """`generate()` of a bound model: DSpark for a DSparkDrafter assistant (the engine `dspark_engine` names), the
    class's `generate` for everything else."""
    drafter = as_drafter(kwargs.get("assistant_model"))
    if drafter is None:
        if dspark_engine is not None:
            raise ValueError("dspark_engine= chooses how a DSpark drafter runs; pass assistant_model=<DSparkDrafter> with it.")
        return type(self).generate(self, *args, **kwargs)
    if kwargs.get("custom_generate") is not None:
        raise ValueError("Pass either assistant_model=<DSparkDrafter> or custom_generate=..., not both.")
    _check_assistant_tokenizer(kwargs.pop("assistant_tokenizer", None), kwargs.get("tokenizer"))
    kwargs["assistant_model"] = drafter
    engine = dspark_engine or "dspark"
    if engine == "dspark":
        return _run_dspark_loop(self, args, kwargs)
    if engine == "transformers":
        return _run_transformers_loop(self, args, kwargs)
    raise ValueError(
        f"dspark_engine must be 'dspark' (our batched loop, the default) or 'transformers' (transformers' assisted "
        f"loop, batch 1), got {dspark_engine!r}."
    )


def _run_dspark_loop(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Our batched loop through `custom_generate`; generate() does not forward the streamer, the tokenizer or the
    stop strings of a generation config to a custom_generate callable, so they travel under our own names."""
    drafter = kwargs.pop("assistant_model")
    kwargs["dspark_streamer"] = kwargs.pop("streamer", None)
    kwargs["stop_tokenizer"] = kwargs.pop("tokenizer", None)
    gen = kwargs.get("generation_config")
    if kwargs.get("stop_strings") is None and gen is not None and getattr(gen, "stop_strings", None) is not None:
        gen = gen.__class__.from_dict(gen.to_dict())
        kwargs["stop_strings"], gen.stop_strings = gen.stop_strings, None
        kwargs["generation_config"] = gen
    return type(model).generate(model, *args, custom_generate=generate, drafter=drafter, **kwargs)


def _run_transformers_loop(model: PreTrainedModel, args: tuple, kwargs: dict[str, Any]) -> Any:
    """transformers' own assisted loop; our `_get_candidate_generator` gives it a DSparkCandidateGenerator with the
    options this call names."""
    gen = kwargs.get("generation_config") or model.generation_config
    lookup = kwargs.get("prompt_lookup_num_tokens", getattr(gen, "prompt_lookup_num_tokens", None))
    ours = ("verify_policy", "draft_tree_size", "copy_ngram")
    if any(kwargs.get(k) is not None for k in ours) or kwargs.get("adaptive_verification") or lookup is not None:
        raise ValueError(
            "verify_policy, adaptive_verification, draft_tree_size, copy_ngram and prompt_lookup_num_tokens run in our "
            "loop only: drop dspark_engine='transformers' (transformers' loop takes confidence_threshold, "
            "num_speculative_tokens and markov)."
        )
    for name in ("verify_policy", "adaptive_verification", "draft_tree_size", "copy_ngram"):
        kwargs.pop(name, None)
    if (kwargs.get("num_beams") or gen.num_beams or 1) > 1:  # transformers would drop the assistant: beam search
        raise ValueError(BEAM_SEARCH_REFUSED)
    options = {k: kwargs.pop(k) for k in ("confidence_threshold", "num_speculative_tokens", "markov") if k in kwargs}
    token = _TRANSFORMERS_LOOP_OPTIONS.set(options)
    try:
        return type(model).generate(model, *args, **kwargs)
    finally:
        _TRANSFORMERS_LOOP_OPTIONS.reset(token)


def _candidate_generator(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
    """transformers' `_get_candidate_generator`, except for DSpark drafters."""
    call = inspect.signature(type(self)._get_candidate_generator).bind(self, *args, **kwargs).arguments
    drafter = as_drafter(call.get("assistant_model"))
    if drafter is None:
        return type(self)._get_candidate_generator(self, *args, **kwargs)
    if call["input_ids"].shape[0] > 1:
        raise ValueError(
            "transformers' assisted loop runs one prompt at a time; drop dspark_engine='transformers' to run the batch "
            "in our loop."
        )
    options = _TRANSFORMERS_LOOP_OPTIONS.get() or {}
    return DSparkCandidateGenerator(
        drafter, self, call["generation_config"], call["logits_processor"], call["model_kwargs"], **options
    )


def _check_assistant_tokenizer(assistant_tokenizer: Any, tokenizer: Any) -> None:
    """A DSpark drafter drafts in its target's vocabulary: an assistant tokenizer may only be the target's own."""
    if assistant_tokenizer is None or assistant_tokenizer is tokenizer:
        return
    if tokenizer is None or assistant_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            "A DSpark drafter has no tokenizer of its own (it drafts in its target's vocabulary), so assistant_tokenizer= "
            "must be the target's tokenizer (pass it as tokenizer= too) or left out. A drafter for another tokenizer "
            "cannot assist this model: load the one trained for it with DSparkDrafter.from_pretrained(..., target=model)."
        )
