"""Flat-layout kernels for DSpark decoding: Triton on CUDA, a pure-torch reference beside each.

Every kernel-backed function takes ``backend=`` ("auto" | "triton" | "torch"; default from the env
var HF_DSPARK_KERNELS, else "auto": Triton for CUDA tensors when triton imports) and ``debug=``
(value checks that sync the device; default from HF_DSPARK_DEBUG). See dispatch.py.
"""

from .argmax import first_argmax
from .dispatch import HAS_TRITON
from .layout import build_cu_num_draft, build_verify_inputs, flatten_ragged, gather_kv
from .markov_sampler import markov_sample_block
from .rejection import rejection_sample
from .sampling import exp_noise, sample_index, sample_rows

__all__ = [
    "HAS_TRITON",
    "build_cu_num_draft",
    "build_verify_inputs",
    "exp_noise",
    "first_argmax",
    "flatten_ragged",
    "gather_kv",
    "markov_sample_block",
    "rejection_sample",
    "sample_index",
    "sample_rows",
]
