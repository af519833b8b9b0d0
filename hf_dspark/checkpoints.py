"""Reading and writing drafter checkpoints.

Three layouts load unchanged:
- ours: `config.json` with `model_type: "dspark"`; weights without the target's embeddings/lm_head;
- DeepSpec-native (`deepseek-ai/dspark_qwen3_*_block7`): the target's config plus DSpark fields and
  `architectures: ["Qwen3DSparkModel"]`, weights with the exact SPEC names (embeddings included);
- speculators (`speculators_model_type: "dspark"`): nested `transformer_layer_config`,
  `aux_hidden_state_layer_ids` (= our ids + 1), `sample_from_anchor` (must be true).
`export_deepspec` writes the DeepSpec-native layout that vLLM and SGLang load.
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

from .configuration import DSparkConfig
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
        if raw["speculators_model_type"] != "dspark":
            raise ValueError(
                f"speculators_model_type={raw['speculators_model_type']!r} is not a DSpark checkpoint; only 'dspark' loads here."
            )
        if not raw.get("sample_from_anchor", False):
            raise ValueError(
                "This speculators checkpoint has sample_from_anchor=False (z-lab DFlash layout, B-1 drafts per block); "
                "DSpark needs the anchor-as-first-prediction layout (sample_from_anchor=True)."
            )
        text = dict(raw.get("transformer_layer_config") or {})
        vocab = text.get("vocab_size")
        draft_vocab = raw.get("draft_vocab_size", vocab)
        if draft_vocab != vocab and not {"d2t", "t2d"} <= names:
            raise ValueError(
                f"This speculators checkpoint drafts over a reduced vocabulary ({draft_vocab} of {vocab} tokens) but its "
                "weights lack the d2t/t2d maps; the checkpoint is incomplete."
            )
        aux = raw.get("aux_hidden_state_layer_ids")
        if not aux:
            raise ValueError("This speculators checkpoint has no aux_hidden_state_layer_ids; it cannot say which target layers to tap.")
        fields = _dims_from(text)
        fields.update({k: raw[k] for k in _DSPARK_FIELDS if raw.get(k) is not None})
        fields["target_layer_ids"] = [int(i) - 1 for i in aux]
        fields["share_target_embeddings"] = shares
        if draft_vocab != vocab:
            fields["draft_vocab_size"] = int(draft_vocab)
        return DSparkConfig(**fields), "speculators"
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


def _normalise_names(state: dict[str, torch.Tensor], config: DSparkConfig) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in state.items():
        if name in ("d2t", "t2d") and not config.reduced_vocab:
            continue  # identity maps of a full-vocabulary speculators drafter
        out[name.removeprefix("model.")] = t
    if config.reduced_vocab:
        from .modeling import check_draft_maps

        missing = [k for k in ("d2t", "t2d") if k not in out]
        if missing:
            raise ValueError(
                f"The config sets draft_vocab_size={config.draft_vocab_size} but the weights lack {', '.join(missing)}; "
                "the checkpoint is incomplete."
            )
        check_draft_maps(out["d2t"], out["t2d"], config.vocab_size, config.draft_vocab_size)
    return out


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


def save_drafter(drafter: "DSparkDrafter", save_directory: str | os.PathLike, *, custom_generate: bool = True, **_: Any) -> None:
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
