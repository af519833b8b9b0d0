"""Prepacked linear layers for decoding on a CPU (oneDNN), in fp32 and, on CPUs that multiply bf16 natively, bf16.

At decode time a small model on a CPU is memory-bound: every step streams all its weights once. torch's default
fp32 CPU matrix product (MKL) streams a weight at full speed only for one row of input (a matrix-vector product);
for 2-16 rows, the shapes of a verify step, it runs at about half that speed, and a verify step of 8 tokens costs
~1.8 one-token steps on a 2-core AVX2 CPU. oneDNN with the weight packed once ahead of time streams it for any
small number of rows: there a verify step of 8 tokens costs ~1.3 one-token steps, and a one-token step about what
MKL's does (`python scripts/prepacked_linear_speed.py` measures both on the real target). In bf16 on a CPU with
avx512_bf16, torch's default bf16 linear is also slower than oneDNN on a weight packed once: packed, a one-token
forward of the real target took 0.77x the time and an 8-token one 0.74x, with bitwise the same logits (2-core AMD
EPYC; `python scripts/prepacked_linear_speed.py bfloat16 25`).

On those CPUs its rows were also batch-invariant: a row's output bitwise the same whether multiplied alone or with
15 others, so a verify forward computed each position's logits exactly as a one-token forward (MKL's differ in the
last bits); the script checks it, since oneDNN may split a reduction differently elsewhere.

`prepack_linears(model)` turns every plain `nn.Linear` of a CPU model in fp32 (or bf16 where `packs_bf16()`) into a
`PrepackedLinear` in place (state dict, parameters and tied weights unchanged; a packed copy of each weight is kept
beside it, so the weights' memory doubles). Without autograd, on the CPU, in the dtype it was packed in, for up to
MAX_PACKED_ROWS rows, its forward multiplies by the packed copy (repacked if the weight changed); otherwise
(training, another dtype or device, a long prefill) it is `nn.Linear`'s forward.
`unpack_linears(model)` undoes it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import logging

logger = logging.get_logger(__name__)

# the number of rows the packed layout is tuned for: a verify step of block 7 is 8 tokens per request. Measured on
# the real target (2-core AVX2): packed for 8 rows is faster than MKL at 1-64 rows; packed for 1 row is slower at 2-16
PACK_BATCH_HINT = 8
# above this many rows (a prefill) torch's default kernels are back in front: a forward of 1,024 / 6,400 tokens took
# 1.07x / 1.08x as long prepacked, one of 128 / 512 tokens 0.97x
MAX_PACKED_ROWS = 512


def prepacking_available() -> bool:
    """Whether this torch build can prepack linear weights (oneDNN, which x86-64 and aarch64 CPU builds include)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache  # the CPU's flags do not change while the process runs; the DSpark loops ask on every call
def cpu_multiplies_bf16() -> bool:
    """Whether this CPU has bf16 instructions (avx512_bf16 or AMX; read from /proc/cpuinfo once, False where it is
    absent)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def packs_bf16() -> bool:
    """Whether bf16 weights are worth prepacking here: oneDNN with bf16 support on a CPU with bf16 instructions
    (elsewhere torch emulates bf16 products and bf16 is not the dtype to decode in; `targets.fast_dtype`)."""
    return prepacking_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported() and cpu_multiplies_bf16()


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The weight dtypes `prepack_linears` packs on this machine: fp32, and bf16 where `packs_bf16()`."""
    return (torch.float32, torch.bfloat16) if packs_bf16() else (torch.float32,)


def can_prepack(model: nn.Module) -> bool:
    """Whether `prepack_linears(model)` would serve it: parameters on the CPU in a packable dtype (fp32, or bf16 on a
    CPU with bf16 instructions) and a torch build with oneDNN."""
    param = next(model.parameters(), None)
    return param is not None and param.is_cpu and prepacking_available() and param.dtype in packable_dtypes()


class PrepackedLinear(nn.Linear):
    """An `nn.Linear` that, without autograd on the CPU in the dtype it was packed in, multiplies by a oneDNN-prepacked
    copy of its weight.

    Made by `prepack_linears`, never constructed directly; `unpack_linears` turns it back into an `nn.Linear`.
    """

    _packed: torch.Tensor  # opaque oneDNN layout of self.weight
    _packed_key: tuple[int, int]  # (data_ptr, _version) of the weight it was packed from
    _packed_dtype: torch.dtype  # the weight's dtype when packed: other dtypes take nn.Linear's forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            weight.dtype != self._packed_dtype  # a model moved to another dtype since packing
            or x.dtype != weight.dtype
            or not x.is_cpu
            or not weight.is_cpu
            or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
            or x.numel() > MAX_PACKED_ROWS * self.in_features
        ):
            return F.linear(x, weight, self.bias)
        if (weight.data_ptr(), weight._version) != self._packed_key:  # loaded, edited or replaced since packing
            self._pack()
        rows = x.reshape(-1, self.in_features).contiguous()  # [tokens, in] (a no-op for a contiguous x)
        out = torch.ops.mkldnn._linear_pointwise(rows, self._packed, self.bias, "none", [], "")  # [tokens, out]
        return out.reshape(*x.shape[:-1], self.out_features)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the opaque packed copy out; the copy packs its own weight on first use."""
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        state["_packed_key"] = None
        return state

    def _pack(self) -> None:
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_BATCH_HINT)
        self._packed_key = (self.weight.data_ptr(), self.weight._version)
        self._packed_dtype = self.weight.dtype


def prepack_linears(model: nn.Module) -> int:
    """Prepack every plain `nn.Linear` of a CPU model in fp32 (or bf16 on a CPU with bf16 instructions) in place;
    returns how many were packed.

    Subclasses of `nn.Linear` (PEFT's LoRA layers, quantized layers) and layers in another dtype than the model's are
    left alone. Raises ValueError if the model's parameters are not on the CPU in a packable dtype, RuntimeError if
    this torch build has no oneDNN.
    """
    if not prepacking_available():
        raise RuntimeError(
            "This torch build has no oneDNN (torch.backends.mkldnn.is_available() is False), so linear weights "
            "cannot be prepacked; use the model as it is."
        )
    if not can_prepack(model):
        param = next(model.parameters(), None)
        where = f"{param.dtype} on {param.device}" if param is not None else "no parameters"
        bf16 = "" if packs_bf16() else " (bf16 only on a CPU with avx512_bf16 or AMX, which this one lacks)"
        raise ValueError(
            f"prepack_linears is for fp32 or bf16 models on the CPU{bf16}; this model has {where}. Load it in fp32 "
            "on the CPU (load_target(..., dtype=torch.float32)), or leave it unpacked."
        )
    dtype = next(model.parameters()).dtype
    packed = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == dtype and module.weight.device.type == "cpu":
            module.__class__ = PrepackedLinear
            module._pack()
            packed += 1
    logger.info(f"Prepacked {packed} {str(dtype).removeprefix('torch.')} linear layers (oneDNN, tuned for {PACK_BATCH_HINT} rows).")
    return packed


def unpack_linears(model: nn.Module) -> int:
    """Turn every `PrepackedLinear` of the model back into an `nn.Linear`, freeing the packed copies."""
    unpacked = 0
    for module in model.modules():
        if type(module) is PrepackedLinear:
            del module._packed, module._packed_key, module._packed_dtype
            module.__class__ = nn.Linear
            unpacked += 1
    return unpacked


def is_prepacked(model: nn.Module) -> bool:
    """Whether any linear layer of the model is prepacked."""
    return any(type(module) is PrepackedLinear for module in model.modules())


def prepack_like(drafter: nn.Module, target: nn.Module) -> None:
    """Prepack the drafter's linear layers when its target's are and the drafter can be (`can_prepack`: the drafter
    runs at the same small row counts; called by the DSpark loops, so prepacking the target is the one switch).
    A packable target that is not prepacked gets a one-time hint."""
    if not is_prepacked(target):
        if can_prepack(target):
            logger.warning_once(
                "DSpark on a CPU model with torch's default linear layers: hf_dspark.prepack_linears(model) can make "
                "its verify steps much cheaper (a verify step of 8 tokens fell from 1.8 to 1.3 one-token steps in "
                "fp32 on a 2-core AVX2 CPU, and took 0.74x the time in bf16 on one with avx512_bf16; "
                "hf_dspark.targets.load_target does it)."
            )
    elif not is_prepacked(drafter) and can_prepack(drafter):
        prepack_linears(drafter)
