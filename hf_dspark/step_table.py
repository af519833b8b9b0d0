"""Step-time tables: how many target forward steps per second the device runs with N verify tokens in the batch.

The scheduler prices every draft slot against this curve (SPEC section 6). The curve is a staircase (kernel tile
sizes, memory-bound vs compute-bound regimes) and is kept as measured: lookup is a floor lookup, no smoothing.

JSON (compatible with SGLang's SpsCostTable, plus `metadata`):
    {"sample_batch_tokens": [1, 2, 4, ...],        # strictly increasing N probes
     "sample_steps_per_sec": [41.2, 40.9, ...],    # 1 / median forward latency at each probe
     "max_batch_tokens": 512,                      # the scheduler never plans a batch above this
     "metadata": {"device_name", "device_slug", "dtype", "linear_kernels", "torch_version", "transformers_version",
                  "target_id", "context_length", "num_requests", "date", "repeats", "warmup", "curves"}}

Tables live at `step_tables/<target slug>/<device slug>.json`, both in the local cache
(`~/.cache/hf_dspark/step_tables/...`) and in the drafter's Hub repo; `load_or_profile` tries them in that order.

Batch size: the main curve is measured with N tokens split as evenly as possible over R = num_requests[0] rows.
When several R are profiled, `metadata["curves"]` holds one curve per R and `for_num_requests(R)` returns the
table of the largest probed R <= the run's R (the smallest probed R if none is smaller).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import huggingface_hub
import torch
import transformers
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
from torch import Tensor
from tqdm.auto import tqdm
from transformers import DynamicCache
from transformers.utils import logging

from .attention import grouped_kv_heads_under_masks, keeps_grouped_kv_heads
from .io_utils import write_text_atomic
from .prepack import is_prepacked

logger = logging.get_logger(__name__)

DEFAULT_BATCH_TOKENS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DEFAULT_CACHE_DIR = Path("~/.cache/hf_dspark/step_tables")
FLAT_TOLERANCE = 0.01  # steps/sec all within 1% of each other = flat
DEFAULT_KERNELS = "default"  # torch's own linear layers
PREPACKED_KERNELS = "onednn-prepacked"  # hf_dspark.prepack_linears


class InvalidStepTableError(ValueError):
    """A step-time table that is malformed, flat, or measured for another device, dtype or target."""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def target_slug(target_id: str) -> str:
    """Folder name of a target: "HuggingFaceTB/SmolLM2-135M" -> "huggingfacetb-smollm2-135m"."""
    return _slug(target_id)


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def device_name(device: torch.device | str | None = None) -> str:
    """Human-readable device name: the GPU's marketing name or the CPU model."""
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return _cpu_model_name()
    return device.type


def device_slug(device: torch.device | str | None = None) -> str:
    """File name of a device's table: "cpu-amd-epyc-2t" (CPU model + torch threads), "cuda-nvidia-h200"."""
    device = torch.device("cpu" if device is None else device)
    if device.type == "cpu":
        return _slug(f"cpu-{_cpu_model_name()}-{torch.get_num_threads()}t")
    return _slug(f"{device.type}-{device_name(device)}")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def linear_kernels(model) -> str:
    """What multiplies the model's linear layers: "onednn-prepacked" (`hf_dspark.prepack_linears`) or "default"."""
    return PREPACKED_KERNELS if is_prepacked(model) else DEFAULT_KERNELS


def _check_curve(tokens, steps_per_sec, max_batch_tokens) -> None:
    """Raise InvalidStepTableError naming the first problem of a curve."""
    if not isinstance(tokens, list) or not isinstance(steps_per_sec, list):
        raise InvalidStepTableError("sample_batch_tokens and sample_steps_per_sec must be lists.")
    if not tokens:
        raise InvalidStepTableError("The step table is empty: sample_batch_tokens has no probes.")
    if len(tokens) != len(steps_per_sec):
        raise InvalidStepTableError(
            f"sample_batch_tokens has {len(tokens)} probes but sample_steps_per_sec has {len(steps_per_sec)} values."
        )
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in tokens):
        raise InvalidStepTableError(f"sample_batch_tokens must be positive integers, got {tokens}.")
    if any(b <= a for a, b in zip(tokens, tokens[1:])):
        raise InvalidStepTableError(f"sample_batch_tokens must be strictly increasing, got {tokens}.")
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in steps_per_sec
    ):
        raise InvalidStepTableError(f"sample_steps_per_sec must be positive finite numbers, got {steps_per_sec}.")
    if min(steps_per_sec) >= (1 - FLAT_TOLERANCE) * max(steps_per_sec):
        raise InvalidStepTableError(
            f"sample_steps_per_sec is flat (all within {FLAT_TOLERANCE:.0%} of each other); a flat table would "
            "silently disable the scheduler -- profile over a wider range of batch_tokens."
        )
    if not isinstance(max_batch_tokens, int) or isinstance(max_batch_tokens, bool) or max_batch_tokens < 1:
        raise InvalidStepTableError(f"max_batch_tokens must be a positive integer, got {max_batch_tokens!r}.")


@dataclass
class StepTimeTable:
    """Target steps per second as a function of the total number of verify tokens N in the batch."""

    sample_batch_tokens: list[int]
    sample_steps_per_sec: list[float]
    max_batch_tokens: int
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        self.sample_batch_tokens = list(self.sample_batch_tokens)
        self.sample_steps_per_sec = list(self.sample_steps_per_sec)
        _check_curve(self.sample_batch_tokens, self.sample_steps_per_sec, self.max_batch_tokens)
        for r, curve in (self.metadata.get("curves") or {}).items():
            if not (str(r).isdigit() and int(r) >= 1 and isinstance(curve, dict)):
                raise InvalidStepTableError(f"metadata.curves must map batch sizes to curves, got key {r!r}.")
            try:
                _check_curve(curve.get("sample_batch_tokens"), curve.get("sample_steps_per_sec"), self.max_batch_tokens)
            except InvalidStepTableError as e:
                raise InvalidStepTableError(f"The curve for {r} requests is invalid: {e}") from e
        self.sample_steps_per_sec = [float(v) for v in self.sample_steps_per_sec]
        self._tokens = torch.tensor(self.sample_batch_tokens, dtype=torch.int64)  # [P]
        self._steps_per_sec = torch.tensor(self.sample_steps_per_sec, dtype=torch.float64)  # [P]
        # [last probe + 1]: SPS(N) for N = 0..last probe (constant above), so the scheduler's hot path is a slice
        self._dense = self.steps_per_sec_tensor(torch.arange(self.sample_batch_tokens[-1] + 1))

    # -- lookup ----------------------------------------------------------------------------------------------------

    def steps_per_sec(self, n_tokens: int) -> float:
        """Floor lookup: the value at the largest probe <= n_tokens (the first probe's below it, the last above)."""
        i = bisect.bisect_right(self.sample_batch_tokens, n_tokens) - 1
        return self.sample_steps_per_sec[max(i, 0)]

    def steps_per_sec_tensor(self, n: Tensor) -> Tensor:
        """Vectorized floor lookup. n: [...] integer token counts -> [...] float64 steps/sec on n's device."""
        tokens, sps = self._tokens.to(n.device), self._steps_per_sec.to(n.device)
        i = torch.searchsorted(tokens, n.to(torch.int64), right=True) - 1
        return sps[i.clamp_(min=0)]

    def seconds_interpolated(self, n: Tensor) -> Tensor:
        """Step seconds at n tokens, linear between probes (constant outside them): [...] float64 on n's device.

        Not the lookup the scheduler prices with (that is the floor lookup above); it is for *ratios* between two
        token counts, e.g. scaling a step measured at one batch size to another, where a floor between two sparse
        probes would make the ratio jump.
        """
        tokens, seconds = self._tokens.to(n.device, torch.float64), 1.0 / self._steps_per_sec.to(n.device)
        x = n.to(torch.float64).clamp(min=float(tokens[0]), max=float(tokens[-1]))
        i = (torch.searchsorted(tokens, x, right=True) - 1).clamp_(0, max(tokens.numel() - 2, 0))  # segment start
        j = (i + 1).clamp_(max=tokens.numel() - 1)
        span = (tokens[j] - tokens[i]).clamp_(min=1.0)
        return seconds[i] + (seconds[j] - seconds[i]) * (x - tokens[i]) / span

    def steps_per_sec_range(self, start: int, stop: int) -> Tensor:
        """SPS(N) for N = start..stop-1, 0 <= start <= stop <= max_batch_tokens + 1: [stop - start] float64 (CPU)."""
        if not 0 <= start <= stop <= self.max_batch_tokens + 1:
            raise ValueError(f"N range [{start}, {stop}) is outside the table's 0..{self.max_batch_tokens}.")
        inside = self._dense[start:stop]
        if stop <= self._dense.numel():
            return inside
        return torch.cat([inside, self._dense[-1:].expand(stop - max(start, self._dense.numel()))])

    def for_num_requests(self, num_requests: int) -> StepTimeTable:
        """The curve measured with the largest probed R <= num_requests (this table if only one R was probed)."""
        curves = self.metadata.get("curves")
        if not curves:
            return self
        probed = sorted(int(r) for r in curves)
        below = [r for r in probed if r <= num_requests]
        r = below[-1] if below else probed[0]
        curve = curves[str(r)]
        if curve["sample_batch_tokens"] == self.sample_batch_tokens:
            return self
        meta = {k: v for k, v in self.metadata.items() if k != "curves"} | {"num_requests": [r]}
        return StepTimeTable(curve["sample_batch_tokens"], curve["sample_steps_per_sec"], self.max_batch_tokens, meta)

    # -- JSON ------------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "sample_batch_tokens": self.sample_batch_tokens,
            "sample_steps_per_sec": self.sample_steps_per_sec,
            "max_batch_tokens": self.max_batch_tokens,
            "metadata": self.metadata,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write the JSON atomically (temporary file in the same folder, then os.replace)."""
        path = Path(path).expanduser()
        write_text_atomic(path, self.to_json())
        return path

    def check_matches(
        self,
        *,
        device_slug: str | None = None,
        dtype: str | None = None,
        target_id: str | None = None,
        linear_kernels: str | None = None,
        grouped_kv_heads: bool | None = None,
    ) -> None:
        """Raise InvalidStepTableError if the metadata names another device, dtype, target, linear-layer kernels or
        attention path than expected (a table without `linear_kernels` was measured with torch's default ones, one
        without `grouped_kv_heads` with repeated key/value heads under masks: `hf_dspark.attention`)."""
        meta = self.metadata
        if device_slug is not None and meta.get("device_slug") != device_slug:
            raise InvalidStepTableError(
                f"The table was measured on device {meta.get('device_slug')!r}, not on this {device_slug!r}."
            )
        if dtype is not None and meta.get("dtype") != dtype:
            raise InvalidStepTableError(f"The table was measured in dtype {meta.get('dtype')!r}, not {dtype!r}.")
        if target_id is not None and target_slug(str(meta.get("target_id", ""))) != target_slug(target_id):
            raise InvalidStepTableError(
                f"The table was measured for target {meta.get('target_id')!r}, not {target_id!r}."
            )
        measured = meta.get("linear_kernels", DEFAULT_KERNELS)
        if linear_kernels is not None and measured != linear_kernels:
            raise InvalidStepTableError(
                f"The table was measured with {measured!r} linear layers, not {linear_kernels!r} "
                "(hf_dspark.prepack_linears changes a step's cost)."
            )
        measured = bool(meta.get("grouped_kv_heads", False))
        if grouped_kv_heads is not None and measured != grouped_kv_heads:
            heads = {True: "grouped", False: "repeated"}
            raise InvalidStepTableError(
                f"The table's verify forwards ran with {heads[measured]} key/value heads under their masks, ours with "
                f"{heads[grouped_kv_heads]} (hf_dspark.attention changes a step's cost)."
            )

    @classmethod
    def from_dict(
        cls,
        data,
        *,
        device_slug: str | None = None,
        dtype: str | None = None,
        target_id: str | None = None,
        linear_kernels: str | None = None,
        grouped_kv_heads: bool | None = None,
    ) -> StepTimeTable:
        """Build and validate a table; the keyword arguments, when given, must match its metadata."""
        if not isinstance(data, dict):
            raise InvalidStepTableError(f"A step table must be a JSON object, got {type(data).__name__}.")
        missing = [k for k in ("sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens") if k not in data]
        if missing:
            raise InvalidStepTableError(f"The step table lacks {', '.join(missing)}.")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise InvalidStepTableError("The step table's metadata must be a JSON object.")
        table = cls(data["sample_batch_tokens"], data["sample_steps_per_sec"], data["max_batch_tokens"], metadata)
        table.check_matches(
            device_slug=device_slug, dtype=dtype, target_id=target_id, linear_kernels=linear_kernels,
            grouped_kv_heads=grouped_kv_heads,
        )
        return table

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        device_slug: str | None = None,
        dtype: str | None = None,
        target_id: str | None = None,
        linear_kernels: str | None = None,
        grouped_kv_heads: bool | None = None,
    ) -> StepTimeTable:
        """Read and validate a JSON table; raises InvalidStepTableError (or OSError if unreadable)."""
        raw = Path(path).expanduser().read_bytes()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidStepTableError(f"{path} is not valid JSON (truncated or corrupt?): {e}.") from e
        return cls.from_dict(
            data, device_slug=device_slug, dtype=dtype, target_id=target_id, linear_kernels=linear_kernels,
            grouped_kv_heads=grouped_kv_heads,
        )


# --------------------------------------------------------------------------------------------------------------------
# Profiling
# --------------------------------------------------------------------------------------------------------------------


def _verify_batch(n_tokens: int, num_requests: int, context_len: int, vocab_size: int, gen, device):
    """N new tokens split as evenly as possible over R rows, right-padded, on top of a context of context_len.

    Returns input_ids [R, W], attention_mask [R, context_len + W], position_ids [R, W] with W = ceil(N / R).
    """
    R, W = num_requests, -(-n_tokens // num_requests)
    per_row = torch.full((R,), n_tokens // R, dtype=torch.int64)
    per_row[: n_tokens % R] += 1
    input_ids = torch.randint(vocab_size, (R, W), generator=gen)
    new_mask = torch.arange(W)[None, :] < per_row[:, None]
    attention_mask = torch.cat([torch.ones(R, context_len, dtype=torch.int64), new_mask.long()], dim=1)
    position_ids = (context_len + torch.arange(W)).expand(R, W)
    return input_ids.to(device), attention_mask.to(device), position_ids.to(device)


def _timed_forward(model, cache, input_ids, attention_mask, position_ids) -> float:
    """Seconds for one target forward (CUDA events on GPU, perf_counter on CPU)."""
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        cache=cache,
        use_cache=True,
    )
    with grouped_kv_heads_under_masks(model, input_ids.shape[1]):  # as the loop's verify forwards run
        if input_ids.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(**kwargs)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        t0 = time.perf_counter()
        model(**kwargs)
        return time.perf_counter() - t0


@torch.inference_mode()
def profile(
    model,
    *,
    batch_tokens=None,
    num_requests=(1,),
    context_len: int = 256,
    repeats: int = 5,
    warmup: int = 2,
    progress: bool = True,
    max_batch_tokens: int | None = None,
    target_id: str | None = None,
) -> StepTimeTable:
    """Measure target steps/sec against N verify tokens on the model's device and dtype.

    For every R in num_requests and every probe N >= R: N random tokens split over R rows on top of a
    DynamicCache prefilled with `context_len` random tokens per row; `warmup` untimed rounds, then `repeats` timed
    ones, each round timing every probe in turn; a probe's time is its median over the rounds. The appended tokens are
    cropped after each forward, so every repeat sees the same context. The main curve is the first R; with several R
    all curves go to `metadata["curves"]`.

    Args:
        batch_tokens: probes N (default DEFAULT_BATCH_TOKENS up to max_batch_tokens).
        max_batch_tokens: largest N the scheduler may plan (default 512, or max(batch_tokens)).
        target_id: recorded in the metadata (default model.config.name_or_path).
    Raises:
        InvalidStepTableError: if the measured curve is flat (the scheduler could not tell costs apart).
    """
    if context_len < 1 or repeats < 1 or warmup < 0:
        raise ValueError("profile needs context_len >= 1, repeats >= 1 and warmup >= 0.")
    if max_batch_tokens is None:
        max_batch_tokens = max(batch_tokens) if batch_tokens else DEFAULT_BATCH_TOKENS[-1]
    probes = sorted({int(n) for n in (batch_tokens or DEFAULT_BATCH_TOKENS) if 1 <= n <= max_batch_tokens})
    num_requests = [int(r) for r in num_requests]
    if not probes or not num_requests or min(num_requests) < 1:
        raise ValueError("profile needs at least one probe in 1..max_batch_tokens and num_requests >= 1.")
    param = next(model.parameters())
    vocab_size = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(0)
    curves = {}
    total = sum(n >= r for r in num_requests for n in probes) * (warmup + repeats)
    with tqdm(total=total, desc="profiling target steps/sec", disable=not progress) as bar:
        for r in num_requests:
            context = torch.randint(vocab_size, (r, context_len), generator=gen).to(param.device)
            cache = DynamicCache(config=model.config)
            model(input_ids=context, cache=cache, use_cache=True)
            batches = {n: _verify_batch(n, r, context_len, vocab_size, gen, param.device) for n in probes if n >= r}
            times = {n: [] for n in batches}
            for i in range(warmup + repeats):  # every round times every probe: a machine whose speed drifts (a shared
                for n, batch in batches.items():  # VM) slows all probes alike instead of bending the curve
                    elapsed = _timed_forward(model, cache, *batch)
                    cache.crop(-batch[0].shape[1])
                    if i >= warmup:
                        times[n].append(elapsed)
                    bar.set_postfix(R=r, N=n)
                    bar.update()
            curves[str(r)] = {
                "sample_batch_tokens": list(times),
                "sample_steps_per_sec": [1.0 / statistics.median(t) for t in times.values()],
            }
    metadata = {
        "device_name": device_name(param.device),
        "device_slug": device_slug(param.device),
        "dtype": _dtype_name(param.dtype),
        "linear_kernels": linear_kernels(model),
        "grouped_kv_heads": keeps_grouped_kv_heads(model),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "target_id": target_id or model.config.name_or_path,
        "context_length": context_len,
        "num_requests": num_requests,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "repeats": repeats,
        "warmup": warmup,
    }
    if len(num_requests) > 1:
        metadata["curves"] = curves
    first = curves[str(num_requests[0])]
    return StepTimeTable(first["sample_batch_tokens"], first["sample_steps_per_sec"], max_batch_tokens, metadata)


# --------------------------------------------------------------------------------------------------------------------
# Cache: local folder -> drafter repo (Hub or local folder) -> profile
# --------------------------------------------------------------------------------------------------------------------


def _table_file(target_id: str, slug: str) -> str:
    """Relative path of a table: "<target slug>/<device slug>.json" (under step_tables/ in a drafter repo)."""
    return f"{target_slug(target_id)}/{slug}.json"


def local_table_path(target_id: str, device: torch.device | str | None = None, cache_dir=None) -> Path:
    """Where `load_or_profile` caches this device's table for a target: `<cache_dir>/<target slug>/<device slug>.json`
    (cache_dir defaults to ~/.cache/hf_dspark/step_tables)."""
    root = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    return root / _table_file(target_id, device_slug(device))


def _hub_offline() -> bool:
    env = os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    return huggingface_hub.constants.HF_HUB_OFFLINE or env


def _drafter_repo_file(drafter_repo: str, path_in_repo: str) -> Path | None:
    """The table file from a local drafter folder or its Hub repo (cached / offline aware), or None if absent."""
    if os.path.isdir(drafter_repo):
        path = Path(drafter_repo) / path_in_repo
        return path if path.is_file() else None
    try:
        return Path(huggingface_hub.hf_hub_download(drafter_repo, path_in_repo, local_files_only=_hub_offline()))
    except (EntryNotFoundError, LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        logger.info(f"No step table {path_in_repo} in {drafter_repo} ({type(e).__name__}).")
        return None


def _load_checked(path: Path, expected: dict) -> StepTimeTable | None:
    """The table at path if it is valid and matches `expected`; else None, with a warning naming the file and why."""
    try:
        return StepTimeTable.load(path, **expected)
    except (InvalidStepTableError, OSError) as e:
        logger.warning(f"Ignoring step table {path}: {e}")
        return None


def load_or_profile(
    model,
    *,
    drafter_repo: str | None,
    target_id: str,
    cache_dir: str | os.PathLike | None = None,
    profile_kwargs: dict | None = None,
    profile_if_missing: bool = True,
) -> StepTimeTable | None:
    """The step table for this target on this device and dtype: local cache, then the drafter repo, then profile.

    1. `<cache_dir>/<target slug>/<device slug>.json` (cache_dir defaults to ~/.cache/hf_dspark/step_tables);
    2. `step_tables/<target slug>/<device slug>.json` in the drafter repo: a local folder, or the Hub through
       `hf_hub_download` (offline from the Hub cache when HF_HUB_OFFLINE=1); a table found there is copied to 1;
    3. `profile(model, target_id=target_id, **profile_kwargs)`, saved atomically to 1.
    A corrupt, truncated, flat or mismatched (other device, dtype, target, linear kernels or attention path) table is
    skipped with a warning naming the file and why. Raises InvalidStepTableError only if the fresh profile itself is
    flat. With `profile_if_missing=False`, returns None instead of profiling.
    """
    param = next(model.parameters())
    expected = dict(
        device_slug=device_slug(param.device),
        dtype=_dtype_name(param.dtype),
        target_id=target_id,
        linear_kernels=linear_kernels(model),
        grouped_kv_heads=keeps_grouped_kv_heads(model),
    )
    table_file = _table_file(target_id, expected["device_slug"])
    local = local_table_path(target_id, param.device, cache_dir)

    if local.is_file() and (table := _load_checked(local, expected)) is not None:
        return table
    if drafter_repo is not None:
        remote = _drafter_repo_file(drafter_repo, f"step_tables/{table_file}")
        if remote is not None and (table := _load_checked(remote, expected)) is not None:
            _save_quietly(table, local)
            return table

    if not profile_if_missing:
        return None
    logger.warning(
        f"No step table for {target_id} on {expected['device_slug']} ({expected['dtype']}); profiling the target "
        "now (saved to the local cache; share it with hf_dspark.step_table.upload_step_table)."
    )
    table = profile(model, target_id=target_id, **(profile_kwargs or {}))
    _save_quietly(table, local)
    return table


def _save_quietly(table: StepTimeTable, path: Path) -> None:
    try:
        table.save(path)
    except OSError as e:
        logger.warning(f"Could not write the step table cache {path}: {e}")


def upload_step_table(table: StepTimeTable, repo_id: str, target_id: str, token: str | None = None):
    """Upload a table to `step_tables/<target slug>/<device slug>.json` of a (drafter) Hub repo; returns CommitInfo."""
    slug = table.metadata.get("device_slug")
    if not slug:
        raise InvalidStepTableError(
            "The table's metadata has no device_slug; profile it with hf_dspark.step_table.profile."
        )
    if table.metadata.get("target_id"):
        table.check_matches(target_id=target_id)
    return huggingface_hub.HfApi(token=token).upload_file(
        path_or_fileobj=table.to_json().encode(),
        path_in_repo=f"step_tables/{_table_file(target_id, slug)}",
        repo_id=repo_id,
        commit_message=f"Add step table for {target_id} on {slug} ({table.metadata.get('dtype', '?')})",
    )
