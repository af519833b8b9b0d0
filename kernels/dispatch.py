"""Backend selection and host-side input checks shared by every kernel.

Each public function in this package has a Triton kernel and a pure-torch reference. The
backend comes from the keyword ``backend=`` or, when that is None, from the env var
``HF_DSPARK_KERNELS`` (``auto`` | ``triton`` | ``torch``; default ``auto``):

- ``auto``   -> Triton when every tensor is on CUDA and triton imports, else torch;
- ``triton`` -> Triton; on CPU tensors the kernels run in the Triton interpreter (slow; this is how
  the tests check them on a machine without a GPU), which needs TRITON_INTERPRET=1 in the
  environment before triton is first imported (transformers may import it: set it at startup);
- ``torch``  -> the reference, which is also the fast CPU path.

Debug checks (value checks that cost a device sync) run when ``debug=True`` or the env var
``HF_DSPARK_DEBUG=1``; cheap shape checks always run.
"""

from __future__ import annotations

import os

import torch


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in ("1", "true", "on", "yes")


try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    HAS_TRITON = True
    # the kernels (and triton's own tl.max, tl.sum, ...) were defined for the CPU interpreter
    INTERPRETED = _env_flag("TRITON_INTERPRET") and isinstance(tl.max, InterpretedFunction)
except ImportError:  # the torch references still work
    triton = None
    tl = None
    HAS_TRITON = INTERPRETED = False

BACKENDS = ("auto", "triton", "torch")


def select_backend(backend: str | None, *tensors: torch.Tensor | None) -> str:
    """Return "triton" or "torch" for a call on ``tensors`` (None entries are ignored)."""
    choice = (backend or os.environ.get("HF_DSPARK_KERNELS") or "auto").lower()
    if choice not in BACKENDS:
        raise ValueError(f"Unknown kernel backend {choice!r}; use one of {', '.join(BACKENDS)}.")
    if choice == "torch":
        return "torch"
    on_cuda = all(t.is_cuda for t in tensors if t is not None)
    if choice == "auto":
        return "triton" if HAS_TRITON and on_cuda else "torch"
    if not HAS_TRITON:
        raise ValueError("backend='triton' was requested but triton is not installed; "
                         "install triton or use backend='torch'.")
    if not on_cuda and not INTERPRETED:
        raise ValueError("backend='triton' on CPU tensors needs the Triton interpreter: set TRITON_INTERPRET=1 "
                         "before anything imports triton, or move the tensors to CUDA, or use backend='torch'.")
    return "triton"


def debug_enabled(debug: bool | None) -> bool:
    return _env_flag("HF_DSPARK_DEBUG") if debug is None else debug


def check(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless condition holds (message: what is wrong and the fix)."""
    if not condition:
        raise ValueError(message)


def check_token_range(ids: torch.Tensor, vocab: int, name: str) -> None:
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        check(0 <= lo and hi < vocab,
              f"{name} holds ids in [{lo}, {hi}] outside the vocab [0, {vocab}); "
              f"pass token ids produced with the same vocabulary as the probability rows.")


def check_rows_sum_to_one(probs: torch.Tensor, name: str) -> None:
    if probs.numel():
        atol = 1e-3 if probs.dtype in (torch.float32, torch.float64) else 1e-2   # 16-bit rounding
        err = (probs.float().sum(-1) - 1).abs().max().item()
        check(err <= atol,
              f"{name} rows must be probability distributions but a row sum is off by {err:.3g}; "
              f"pass softmax outputs (or use greedy mode for raw logits).")


def check_cu_num_draft(cu_num_draft: torch.Tensor, num_draft_tokens: int) -> None:
    check(cu_num_draft.numel() > 0 and int(cu_num_draft[0]) == 0,
          "cu_num_draft must start at 0; build it with build_cu_num_draft(num_verify).")
    if cu_num_draft.numel() > 1:
        check(bool((cu_num_draft[1:] >= cu_num_draft[:-1]).all()),
              "cu_num_draft must be non-decreasing; build it with build_cu_num_draft(num_verify).")
    last = int(cu_num_draft[-1])
    check(last == num_draft_tokens,
          f"cu_num_draft ends at {last} but draft_token_ids holds {num_draft_tokens} tokens; "
          f"rebuild cu_num_draft from the per-request draft counts of this step.")


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def num_programs_target(device: torch.device) -> int:
    """How many programs a launch should have to fill the device (small in the interpreter)."""
    if device.type == "cuda":
        return 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return 4
