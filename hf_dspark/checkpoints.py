"""Reading and writing drafter checkpoints.

Three layouts load unchanged:
- ours: `config.json` with `model_type: "dspark"`; weights without the target's embeddings/lm_head;
- DeepSpec-native (`deepseek-ai/dspark_qwen3_*_block7`): the target's config plus DSpark fields and
  `architectures: ["Qwen3DSparkModel"]`, weights with the exact SPEC names (embeddings included);
- speculators (`speculators_model_type: "dspark"` or `"dflash"`): nested `transformer_layer_config` (its layer
  layout included), `aux_hidden_state_layer_ids` (= our ids + 1), `sample_from_anchor` (False: the z-lab layout,
  whose block has one slot more than its drafts), optional reduced draft vocabulary with `d2t`/`t2d`.
`export_deepspec` writes the DeepSpec-native layout that vLLM and SGLang load; `export_speculators` (or
`save_pretrained(folder, format="speculators")`) writes speculators' layout, reduced vocabularies and sliding-window
layers included.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .configuration import LAYER_TYPES, DSparkConfig
from .draft_vocab import check_draft_maps
from .io_utils import atomic_path, write_json_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .modeling import DSparkDrafter

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CALIBRATION_NAME = "calibration.json"
CUSTOM_GENERATE_DIR = Path(__file__).parent / "custom_generate"

_TEXT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "hidden_act",
    "attention_bias",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)
_DSPARK_FIELDS = (
    "block_size",
    "target_layer_ids",
    "num_target_layers",
    "mask_token_id",
    "markov_rank",
    "markov_head_type",
    "enable_confidence_head",
    "confidence_head_with_markov",
    "num_anchors",
)


# ---------------------------------------------------------------------------- resolution and reading
def resolve_folder(path_or_repo: str | os.PathLike, **hub_kwargs: Any) -> Path:
    """A local folder as is; a Hub repo id through `snapshot_download` (works offline from the HF cache)."""
    if os.path.isdir(path_or_repo):
        return Path(path_or_repo)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    kwargs = {k: v for k, v in hub_kwargs.items() if k in ("revision", "cache_dir", "token", "local_files_only") and v is not None}
    try:
        return Path(
            snapshot_download(
                str(path_or_repo),
                allow_patterns=["config.json", "*.safetensors", INDEX_NAME, CALIBRATION_NAME, "custom_generate/*"],
                **kwargs,
            )
        )
    except HFValidationError as err:
        raise ValueError(f"{path_or_repo!r} is neither a local folder nor a valid Hub repo id; check the path.") from err
    except Exception as err:  # offline misses, 404s, auth errors
        raise ValueError(
            f"Could not find drafter {path_or_repo!r} locally or on the Hub ({type(err).__name__}); check the name, "
            "or download it while online (HF_HUB_OFFLINE=1 only reads the local cache)."
        ) from err


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder} has no config.json; point to a drafter folder or repo.")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg} at line {err.lineno}); re-download or re-save the drafter.") from err
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object; re-download or re-save the drafter.")
    return raw


def weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX_NAME
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    single = folder / WEIGHTS_NAME
    if single.is_file():
        return [single]
    found = sorted(folder.glob("*.safetensors"))
    if not found:
        bins = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found {', '.join(bins)}: pickled weights are never loaded; convert them to safetensors)" if bins else ""
        raise ValueError(f"{folder} has no .safetensors weights{hint}.")
    return found


def read_weights(files: list[Path], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Read safetensors files (never pickle); a truncated or corrupt file gives a clear error."""
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    state[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"{path} is truncated or corrupt ({err}); delete it and download or save the drafter again."
            ) from err
    return state


def weight_names(files: list[Path]) -> set[str]:
    names: set[str] = set()
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                names.update(f.keys())
        except (SafetensorError, OSError, ValueError, RuntimeError) as err:
            raise ValueError(f"{path} is truncated or corrupt ({err}); delete it and download or save the drafter again.") from err
    return names


# ---------------------------------------------------------------------------- config translation
def _rope_from(text: dict) -> dict:
    rope = text.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        return dict(rope)
    rope = dict(text.get("rope_scaling") or {})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope["rope_theta"] = float(text.get("rope_theta", 10000.0))
    return rope


def _dims_from(text: dict) -> dict:
    out = {k: text[k] for k in _TEXT_FIELDS if text.get(k) is not None}
    out["rope_parameters"] = _rope_from(text)
    return out


def translate_config(raw: dict, names: set[str]) -> tuple[DSparkConfig, str]:
    """Turn any supported config.json into a `DSparkConfig`; returns (config, layout name)."""
    archs = raw.get("architectures") or []
    shares = "embed_tokens.weight" not in {n.removeprefix("model.") for n in names}
    if raw.get("model_type") == "dspark":
        fields = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "architectures")}
        return DSparkConfig(**fields), "hf_dspark"
    if raw.get("speculators_model_type") is not None:
        return _from_speculators(raw, shares, names), "speculators"
    if archs and archs[0] == "Gemma4DSparkModel":
        raise NotImplementedError(
            "Gemma4DSparkModel checkpoints (Gemma 4 drafters with sliding-window layers) are not supported yet; "
            "use a Qwen3DSparkModel / speculators DSpark checkpoint."
        )
    if archs and archs[0] == "Qwen3DSparkModel":
        missing = [k for k in ("target_layer_ids", "block_size", "mask_token_id") if k not in raw]
        if missing:
            raise ValueError(f"This Qwen3DSparkModel config lacks {', '.join(missing)}; the checkpoint is incomplete.")
        fields = _dims_from(raw)
        fields.update({k: raw[k] for k in _DSPARK_FIELDS if raw.get(k) is not None})
        fields["share_target_embeddings"] = shares
        return DSparkConfig(**fields), "deepspec"
    raise ValueError(
        f"Unknown drafter architecture {archs or raw.get('model_type')!r}; expected an hf_dspark config (model_type "
        "'dspark'), a DeepSpec Qwen3DSparkModel or a speculators DSpark checkpoint."
    )


# speculators' own defaults (pydantic fields of DFlashSpeculatorConfig / DSparkSpeculatorConfig, 0.9) for fields a
# config.json may leave out
_SPECULATORS_DEFAULTS = {
    "dspark": dict(sample_from_anchor=True, markov_rank=256, markov_head_type="vanilla", enable_confidence_head=True,
                   confidence_head_with_markov=True, block_size=8, sliding_window_non_causal=False),
    "dflash": dict(sample_from_anchor=False, markov_rank=0, enable_confidence_head=False,
                   confidence_head_with_markov=False, block_size=8, sliding_window_non_causal=False),
}
_SPECULATORS_LAYER_MODELS = ("qwen3", "llama")  # transformer_layer_config.model_type values we read


def _speculators_layer_config(text: dict) -> Any:
    """The draft layers' config exactly as speculators builds it (`AutoConfig.for_model(model_type, **dict)`, Qwen3Config
    without a model_type), so that fields left out of config.json take that class's defaults."""
    from transformers import AutoConfig

    model_type = text.get("model_type", "qwen3")
    if model_type not in _SPECULATORS_LAYER_MODELS:
        raise ValueError(
            f"transformer_layer_config.model_type={model_type!r} is not implemented here (speculators builds Qwen3-style "
            f"draft layers from {' or '.join(_SPECULATORS_LAYER_MODELS)} configs only)."
        )
    types = text.get("layer_types")
    if types is not None:
        unknown = sorted({str(t) for t in types} - set(LAYER_TYPES))
        if unknown:
            raise ValueError(
                f"transformer_layer_config.layer_types holds {', '.join(unknown)}, which hf_dspark does not implement "
                f"(only {' and '.join(LAYER_TYPES)})."
            )
        if text.get("num_hidden_layers") is not None and len(types) != text["num_hidden_layers"]:
            raise ValueError(
                f"transformer_layer_config.layer_types lists {len(types)} layers but num_hidden_layers is "
                f"{text['num_hidden_layers']}; the config is inconsistent."
            )
    fields = {k: v for k, v in text.items() if k not in ("model_type", "transformers_version", "architectures")}
    try:
        return AutoConfig.for_model(model_type, **fields)
    except Exception as err:  # transformers' own validators (strict dataclasses) raise their own types
        raise ValueError(f"transformer_layer_config is invalid ({err}); the checkpoint's config is corrupt.") from err


def _speculators_layout(layer: Any, raw: dict, num_layers: int) -> dict:
    """layer_types / sliding_window / sliding_window_non_causal as speculators' DFlash backbone applies them: a layer
    of type sliding_attention with the config's (effective) `sliding_window`; a sliding layer without a window is a
    full-attention layer there (its mask is the full one), so it becomes one here."""
    types = list(getattr(layer, "layer_types", None) or ["full_attention"] * num_layers)
    window = getattr(layer, "sliding_window", None)
    if len(types) != num_layers:
        raise ValueError(
            f"transformer_layer_config.layer_types lists {len(types)} layers but num_hidden_layers is {num_layers}; "
            "the config is inconsistent."
        )
    if window is None:
        types = ["full_attention"] * num_layers
    elif "sliding_attention" in types and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
        raise ValueError(f"transformer_layer_config.sliding_window={window!r} must be a positive integer.")
    sliding = "sliding_attention" in types
    return dict(
        layer_types=types if sliding else None,
        sliding_window=int(window) if sliding else None,
        sliding_window_non_causal=bool(raw["sliding_window_non_causal"]),
    )


def _from_speculators(raw: dict, shares: bool, names: set[str]) -> DSparkConfig:
    kind = raw["speculators_model_type"]
    if kind not in _SPECULATORS_DEFAULTS:
        raise ValueError(
            f"speculators_model_type={kind!r} is not a DSpark/DFlash checkpoint; only 'dspark' and 'dflash' load here."
        )
    raw = {**_SPECULATORS_DEFAULTS[kind], **{k: v for k, v in raw.items() if v is not None}}
    from_anchor = bool(raw["sample_from_anchor"])
    if not from_anchor and int(raw["block_size"]) < 2:
        raise ValueError(
            f"This speculators checkpoint has sample_from_anchor=False and block_size={raw['block_size']}: its block "
            "drafts nothing (the anchor slot never drafts); the checkpoint is corrupt."
        )
    text = dict(raw.get("transformer_layer_config") or {})
    layer = _speculators_layer_config(text)
    vocab = int(layer.vocab_size)
    draft_vocab = raw.get("draft_vocab_size", vocab)
    if draft_vocab != vocab and not {"d2t", "t2d"} <= names:
        raise ValueError(
            f"This speculators checkpoint drafts over a reduced vocabulary ({draft_vocab} of {vocab} tokens) but its "
            "weights lack the d2t/t2d maps; the checkpoint is incomplete."
        )
    aux = raw.get("aux_hidden_state_layer_ids")
    if not aux:
        raise ValueError("This speculators checkpoint has no aux_hidden_state_layer_ids; it cannot say which target layers to tap.")
    heads = int(layer.num_attention_heads)
    rope = getattr(layer, "rope_parameters", None) or {}
    if "sliding_attention" in rope:  # per-layer-type rope: speculators' draft uses the sliding one for every layer
        rope = rope["sliding_attention"]
    fields = dict(
        vocab_size=vocab,
        hidden_size=int(layer.hidden_size),
        intermediate_size=int(layer.intermediate_size),
        num_hidden_layers=int(layer.num_hidden_layers),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(layer, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(layer, "head_dim", None) or layer.hidden_size // heads),
        rms_norm_eps=float(layer.rms_norm_eps),
        hidden_act=layer.hidden_act,
        attention_bias=bool(getattr(layer, "attention_bias", False)),
        max_position_embeddings=int(layer.max_position_embeddings),
        rope_parameters=_rope_from({"rope_parameters": dict(rope)} if rope else text),
        **{k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if text.get(k) is not None},
    )
    fields.update({k: raw[k] for k in _DSPARK_FIELDS if raw.get(k) is not None and k != "target_layer_ids"})
    fields.update(_speculators_layout(layer, raw, fields["num_hidden_layers"]))
    fields["sample_from_anchor"] = from_anchor
    fields["block_size"] = int(raw["block_size"]) - (0 if from_anchor else 1)  # ours counts drafts, not slots
    fields["target_layer_ids"] = [int(i) - 1 for i in aux]
    fields["share_target_embeddings"] = shares
    if draft_vocab != vocab:
        fields["draft_vocab_size"] = int(draft_vocab)
    return DSparkConfig(**fields)


def _normalise_names(state: dict[str, torch.Tensor], config: DSparkConfig) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in state.items():
        if name in ("d2t", "t2d") and not config.reduced_vocab:
            continue  # identity maps of a full-vocabulary speculators drafter
        out[name.removeprefix("model.")] = t
    return out


def check_vocab_maps(files: list[Path], config: DSparkConfig) -> None:
    """A reduced-vocabulary checkpoint's d2t/t2d: present, and valid for its config (read alone, before the weights)."""
    maps: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name.removeprefix("model.") in ("d2t", "t2d"):
                    maps[name.removeprefix("model.")] = f.get_tensor(name)
    missing = [k for k in ("d2t", "t2d") if k not in maps]
    if missing:
        raise ValueError(
            f"The config sets draft_vocab_size={config.draft_vocab_size} but the weights lack {', '.join(missing)}; "
            "the checkpoint is incomplete."
        )
    check_draft_maps(maps["d2t"], maps["t2d"], config.vocab_size, config.draft_vocab_size)


# ---------------------------------------------------------------------------- public loaders / writers
def load_drafter(
    cls: type["DSparkDrafter"],
    path_or_repo: str | os.PathLike,
    *,
    target: "PreTrainedModel | None" = None,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
    **hub_kwargs: Any,
) -> "DSparkDrafter":
    folder = resolve_folder(path_or_repo, **hub_kwargs)
    raw = read_config(folder)
    files = weight_files(folder)
    config, layout = translate_config(raw, weight_names(files))  # validates sizes before any allocation
    if config.reduced_vocab:
        check_vocab_maps(files, config)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if dtype is None and target is not None:
        dtype = target.dtype
    state = _normalise_names(read_weights(files, dtype), config)
    model = cls(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} weights ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})")
        if extra:
            parts.append(f"unexpected {len(extra)} weights ({', '.join(extra[:4])}{', ...' if len(extra) > 4 else ''})")
        raise ValueError(
            f"{folder} does not match its config.json: {'; '.join(parts)}; the checkpoint is incomplete or its config "
            "describes another drafter."
        )
    for name, t in state.items():
        if tuple(t.shape) != tuple(expected[name].shape):
            raise ValueError(
                f"{folder}: weight {name} has shape {tuple(t.shape)} but the config expects {tuple(expected[name].shape)}; "
                "the config and weights belong to different drafters."
            )
    model.load_state_dict(state, strict=True)
    if dtype is not None:
        model.to(dtype)
    if device is not None:
        model.to(device)
    elif target is not None:
        model.to(target.device)
    model.eval()
    calibration = folder / CALIBRATION_NAME
    if calibration.is_file():
        from .calibration import load_calibration

        model.calibration = load_calibration(calibration, block_size=config.block_size)
    model.name_or_path = str(path_or_repo)
    if target is not None:
        model.bind(target)
    return model


def save_drafter(
    drafter: "DSparkDrafter", save_directory: str | os.PathLike, *, format: str = "hf_dspark", custom_generate: bool = True,
    **_: Any,
) -> None:
    if format == "speculators":
        export_speculators(drafter, save_directory)
        return
    if format != "hf_dspark":
        raise ValueError(f"save_pretrained(format={format!r}) is unknown; use 'hf_dspark' (default) or 'speculators'.")
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    with atomic_path(folder / WEIGHTS_NAME) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", "producer": "hf_dspark"})
    config = drafter.config.to_dict()
    config["architectures"] = ["DSparkDrafter"]
    write_json_atomic(folder / "config.json", config)
    if drafter.calibration is not None:
        write_json_atomic(folder / CALIBRATION_NAME, drafter.calibration)
    if custom_generate:
        write_custom_generate(folder)


def write_custom_generate(folder: str | os.PathLike) -> None:
    """Copy `custom_generate/{generate.py,requirements.txt}` so the folder works with `generate(custom_generate=...)`."""
    dest = Path(folder) / "custom_generate"
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("generate.py", "requirements.txt"):
        with atomic_path(dest / name) as tmp:
            shutil.copyfile(CUSTOM_GENERATE_DIR / name, tmp)


def export_deepspec(drafter: "DSparkDrafter", save_directory: str | os.PathLike, target: "PreTrainedModel | None" = None) -> None:
    """Write the DeepSpec-native layout (target config + DSpark fields, `Qwen3DSparkModel`, embeddings included)
    that vLLM (`method: "dspark"`) and SGLang (`--speculative-algorithm DSPARK`) load."""
    target = drafter.require_target(target)
    cfg = drafter.config
    if cfg.reduced_vocab:
        raise ValueError(
            f"export_deepspec cannot write a reduced-vocabulary drafter (draft_vocab_size={cfg.draft_vocab_size}): "
            "DeepSpec's Qwen3DSparkModel has no d2t/t2d maps; use export_speculators instead."
        )
    if not cfg.sample_from_anchor:
        raise ValueError(
            "export_deepspec cannot write a z-lab DFlash drafter (sample_from_anchor=False): DeepSpec's blocks draft "
            "from the anchor slot; use export_speculators instead."
        )
    if any(cfg.sliding_layers):
        raise ValueError(
            "export_deepspec cannot write sliding_attention layers (DeepSpec's drafter layers attend to the full context); "
            "use export_speculators instead."
        )
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    text = target.config.get_text_config().to_dict()
    out = {k: v for k, v in text.items() if k not in ("_name_or_path", "transformers_version", "quantization_config")}
    rope = dict(cfg.rope_parameters)
    out.update(
        architectures=["Qwen3DSparkModel"],
        num_hidden_layers=cfg.num_hidden_layers,
        layer_types=["full_attention"] * cfg.num_hidden_layers,
        tie_word_embeddings=False,
        rope_theta=rope.get("rope_theta"),
        head_dim=cfg.head_dim,
        **{k: getattr(cfg, k) for k in _DSPARK_FIELDS},
    )
    tensors = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    dtype = drafter.fc.weight.dtype
    tensors.setdefault("embed_tokens.weight", drafter.input_embeddings().weight.detach()[: cfg.vocab_size].to(dtype).contiguous().cpu())
    tensors.setdefault("lm_head.weight", drafter.output_head().weight.detach()[: cfg.vocab_size].to(dtype).contiguous().cpu())
    with atomic_path(folder / WEIGHTS_NAME) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", "producer": "hf_dspark export_deepspec"})
    write_json_atomic(folder / "config.json", out)


def export_speculators(drafter: "DSparkDrafter", save_directory: str | os.PathLike, target: "PreTrainedModel | None" = None) -> None:
    """Write speculators' DSpark layout (what `speculators.models.dspark.DSparkDraftModel.save_pretrained` writes and
    its `from_pretrained` -- hence vLLM -- loads): nested Qwen3 `transformer_layer_config` with the layer layout,
    `aux_hidden_state_layer_ids` = tap ids + 1, `speculators_config` naming the verifier; weights without
    `embed_tokens` (reloaded from the verifier), without `lm_head` unless the draft vocabulary is reduced (then with
    its D rows and the `d2t`/`t2d` maps)."""
    target = drafter.require_target(target)
    cfg = drafter.config
    shared_embed, shared_head = target.get_input_embeddings(), target.get_output_embeddings()
    own = [(name, m, t) for name, m, t in (("embed_tokens", drafter.embed_tokens, shared_embed),
                                           ("lm_head", None if cfg.reduced_vocab else drafter.lm_head, shared_head))
           if m is not None]
    for name, mine, theirs in own:  # speculators reloads these from the verifier: they must be the verifier's
        if not torch.equal(mine.weight.detach().cpu().float(), theirs.weight.detach()[: cfg.vocab_size].cpu().float()):
            raise ValueError(
                f"The drafter's own {name} differs from the target's; speculators always takes it from the verifier, so "
                "this drafter cannot be exported to speculators' layout."
            )
    text = target.config.get_text_config()
    sliding = any(cfg.sliding_layers)
    layer = dict(
        model_type="qwen3",
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        hidden_act=cfg.hidden_act,
        rms_norm_eps=cfg.rms_norm_eps,
        attention_bias=cfg.attention_bias,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters=dict(cfg.rope_parameters),
        layer_types=cfg.layer_types or ["full_attention"] * cfg.num_hidden_layers,
        use_sliding_window=sliding,
        sliding_window=cfg.sliding_window if sliding else None,
        tie_word_embeddings=False,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
    )
    with_markov = cfg.enable_confidence_head and cfg.confidence_head_with_markov and cfg.markov_rank > 0
    out = dict(
        architectures=["DSparkSpeculator"],
        speculators_model_type="dspark",
        speculators_version="0.9.0",
        transformer_layer_config=layer,
        aux_hidden_state_layer_ids=[i + 1 for i in cfg.target_layer_ids],
        block_size=cfg.block_slots,
        draft_vocab_size=drafter.draft_vocab_size,
        mask_token_id=cfg.mask_token_id,
        sample_from_anchor=cfg.sample_from_anchor,
        sliding_window_non_causal=cfg.sliding_window_non_causal,
        markov_rank=cfg.markov_rank,
        markov_head_type=cfg.markov_head_type,
        enable_confidence_head=cfg.enable_confidence_head,
        confidence_head_with_markov=with_markov,
        target_hidden_size=None,
        tie_word_embeddings=False,
        dtype=str(drafter.fc.weight.dtype).removeprefix("torch."),
        speculators_config=dict(
            algorithm="dspark",
            default_proposal_method="greedy",
            proposal_methods=[dict(proposal_type="greedy", speculative_tokens=cfg.block_size, accept_tolerance=0.0,
                                   verifier_accept_k=1)],
            verifier=dict(
                name_or_path=getattr(text, "_name_or_path", None) or cfg.target_model_id,
                architectures=list(getattr(target.config, "architectures", None) or [type(target).__name__]),
            ),
        ),
    )
    skip = {"embed_tokens.weight"} | (set() if cfg.reduced_vocab else {"lm_head.weight"})
    tensors = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items() if k not in skip}
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / WEIGHTS_NAME) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", "producer": "hf_dspark export_speculators"})
    write_json_atomic(folder / "config.json", out)
