"""Verify policies: how many of its B drafts each request sends to the target in one step.

Vocabulary (R requests in the batch, B drafts per block, slot (r, k) = draft k of request r):

- `conf_logits` z  [R, B]: confidence-head logits; c_k = sigmoid(z_k / T_k) estimates P(draft k accepted |
  drafts 0..k-1 accepted), with per-position calibration temperatures T (SPEC section 5).
- `survival` a     [R, B]: prefix survival a_k = prod_{i<=k} c_i = P(drafts 0..k all accepted); non-increasing in k.
- `lengths` l      [R]   : drafts verified per request, each in 0..B. The target always also scores the anchor, so
  request r costs l_r + 1 verify tokens and yields 1 + (accepted drafts) tokens; l_r = 0 is a plain decode step.
- `table`: a StepTimeTable giving SPS(N), target steps per second with N verify tokens in the batch.
- Theta(n) = (R + sum of the n admitted survivals) * SPS(R + n): expected committed tokens per second.

Exactness (SPEC section 3): a truncation keeps rejection sampling exact iff whether slot k is verified never
depends on the value of draft x_k. c_k depends on x_{k-1} and the backbone state h_k, not on x_k, so:
- `ConfidenceThreshold` (verify while c_k >= threshold) is exact;
- `algorithm1` on same-step survival is exact: slots are admitted in survival order with positions as the tie
  break, so every slot ranked before (r, k) belongs to another request or to an earlier position of r, and the
  early stop only looks at those;
- `budget` (K from survivals of earlier steps) + `allocate` (the K slots to the top-K current survivals) is
  exact: the budget is fixed before the current drafts exist and the allocation only compares (r, k) against
  slots that do not depend on x_k. A same-step argmax of Theta(K) is NOT exact (paper App. A);
- `best_depth` / `AdaptiveVerification` choose the step's draft depth from earlier steps before drafting: exact.

Two layouts of the verify batch, two prices:
- packed (vLLM/SGLang varlen attention): a step costs R + n tokens, so slots are priced one by one with the
  table; `algorithm1`, `budget` and `allocate` are the paper's rules for that layout;
- padded (a transformers forward: every row is as long as the longest): a step at draft depth L costs
  R x (L + 1) tokens however the drafts are spread, so our loop's `AdaptiveVerification` chooses L with
  `best_depth`, priced by whole-step times the loop measures (`hf_dspark.step_costs.StepCosts`).

The functional core (`survival_from_confidence`, `algorithm1`, `budget`, `allocate`, `best_depth`) is
vectorized: one sort or cumsum and one table slice per call, no Python loop over slots; all but the first
compute in float64 on the input's device.
The policies run on CPU (the loop needs host-side lengths to lay out the ragged verify batch) and return CPU int64.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor
from transformers.utils import logging

from .step_costs import StepCosts, catch_up_columns

if TYPE_CHECKING:
    from .step_table import StepTimeTable

logger = logging.get_logger(__name__)

# A plain step chosen by a clear margin (drafting's best rate at most SKIP_MARGIN of plain decoding's) stands for
# the next SKIP_RECHECK steps of the same batch without re-pricing: until a step drafts again the survival is fixed,
# fewer usable drafts only lower drafting's value, and the plain price moves a few percent over such a run. A
# decision re-priced every step cost ~0.08 ms of a 38 ms batch-1 step in the loop (0.15 ms at batch 64), against
# ~0.015 ms measured alone: the forward between two decisions evicts the Python state they read.
SKIP_MARGIN, SKIP_RECHECK = 0.9, 8


# ----------------------------------------------------------------------------------------------------------------
# Functional core
# ----------------------------------------------------------------------------------------------------------------


def _calibrated_confidence(conf_logits: Tensor, temperatures: Tensor | None) -> Tensor:
    """c = sigmoid(z / T) in float32; NaN logits become confidence 0 (with a one-time warning).

    conf_logits: [R, L]; temperatures: [B >= L] or None (T = 1), the first L apply. Returns [R, L].
    """
    z = conf_logits.float()
    if temperatures is not None:
        if temperatures.shape[0] < z.shape[-1]:
            raise ValueError(
                f"temperatures has {temperatures.shape[0]} entries but the drafts have {z.shape[-1]} positions; "
                "use the calibration fitted for this block size."
            )
        z = z / temperatures[: z.shape[-1]].to(device=z.device, dtype=z.dtype)
    c = torch.sigmoid(z)
    nan = torch.isnan(c)
    if nan.any():
        logger.warning_once(
            "The confidence head returned NaN logits; those drafts (and every later draft of the same request) "
            "are treated as survival 0."
        )
        c = c.masked_fill(nan, 0.0)
    return c


def _checked_temperatures(temperatures) -> Tensor | None:
    """Calibration temperatures as a float32 CPU tensor [B], refusing non-positive or non-finite values."""
    if temperatures is None:
        return None
    t = torch.as_tensor(temperatures, dtype=torch.float32).reshape(-1)
    if t.numel() == 0 or not bool(torch.all(torch.isfinite(t) & (t > 0))):
        raise ValueError(f"Calibration temperatures must be positive finite numbers, got {t.tolist()}.")
    return t


def survival_from_confidence(conf_logits: Tensor, temperatures: Tensor | None = None) -> Tensor:
    """Prefix survival a_k = prod_{i<=k} sigmoid(z_i / T_i).

    Args:
        conf_logits: [R, B] confidence-head logits.
        temperatures: [B] STS temperatures, or None for T = 1 (uncalibrated head).
    Returns:
        [R, B] float32 survival, non-increasing along B. A NaN logit gives survival 0 from its position on.
    """
    t = _checked_temperatures(temperatures)
    return torch.cumprod(_calibrated_confidence(conf_logits, t), dim=-1)


def _checked_survival(survival: Tensor) -> Tensor:
    """Survival [R, B] as float64, repairing bad input with a one-time warning each.

    NaN -> 0; values outside [0, 1] -> clamped; a rise along B -> running minimum (cummin), since survival of a
    longer prefix can never exceed that of a shorter one.
    """
    if survival.dim() != 2:
        raise ValueError(f"survival must be a [R, B] tensor, got shape {tuple(survival.shape)}.")
    s = survival.to(torch.float64)
    if s.numel() == 0:
        return s
    # Fast path: 1 >= s_0 >= s_1 >= ... >= s_{B-1} >= 0 covers range and monotonicity; NaN fails every comparison.
    bounded = torch.nn.functional.pad(s, (1, 1), value=1.0)
    bounded[:, -1] = 0.0
    if bool(torch.all(bounded[:, 1:] <= bounded[:, :-1])):
        return s
    if bool(torch.isnan(s).any()):
        logger.warning_once("Survival contains NaN; treating those slots (and later ones) as survival 0.")
        s = torch.nan_to_num(s, nan=0.0)
    if bool(((s < 0) | (s > 1)).any()):
        logger.warning_once("Survival has values outside [0, 1]; clamping them into [0, 1].")
        s = s.clamp(0.0, 1.0)
    if bool((s[:, 1:] > s[:, :-1]).any()):
        logger.warning_once(
            "Survival rises along the block, which a prefix probability cannot; using its running minimum."
        )
        s = torch.cummin(s, dim=1).values
    return s


def _slot_order(s: Tensor) -> tuple[Tensor, Tensor]:
    """All R*B slots sorted by survival, descending, ties by position then request.

    s: [R, B] float64. Returns (sorted survival [R*B], request index of each sorted slot [R*B]).
    """
    R = s.shape[0]
    flat = s.t().reshape(-1)  # slot (r, k) at k * R + r, so a stable sort breaks ties by position, then request
    values, order = torch.sort(flat, descending=True, stable=True)
    return values, order % R


def _throughput(sorted_survival: Tensor, num_requests: int, table: StepTimeTable) -> Tensor:
    """Theta(n) = (R + sum of the first n survivals) * SPS(R + n) for n = 0..n_max: [n_max + 1] float64.

    sorted_survival: [M] float64 (descending). n_max = min(M, max_batch_tokens - R): the table cannot price a
    batch above its max_batch_tokens, so the scheduler never goes there (when even R is beyond it, only n = 0 is
    returned, priced at the table's last probe).
    """
    R = num_requests
    n_max = max(0, min(sorted_survival.numel(), table.max_batch_tokens - R))
    theta = sorted_survival.new_zeros(n_max + 1)
    torch.cumsum(sorted_survival[:n_max], 0, out=theta[1:])
    theta.add_(R)
    lo = min(R, table.max_batch_tokens)
    return theta.mul_(table.steps_per_sec_range(lo, lo + n_max + 1).to(sorted_survival.device))


def algorithm1(survival: Tensor, table: StepTimeTable) -> Tensor:
    """The paper's Algorithm 1: greedy admission in survival order with an early stop (exact with same-step survival).

    Slots are sorted by survival (descending; ties by position, then request) and admitted one at a time; the
    first admission that lowers Theta = (R + sum of admitted survival) * SPS(R + admitted) is refused and stops the
    scan (an admission that keeps Theta equal is taken). Survival never rises along B and ties go to the smaller
    position, so the admitted set is a prefix of every request.

    Args:
        survival: [R, B] prefix survival of the current step's drafts.
        table: StepTimeTable (SPS as a function of total verify tokens).
    Returns:
        [R] int64 lengths, each in 0..B.
    """
    s = _checked_survival(survival)
    R = s.shape[0]
    if R == 0:
        return torch.zeros(0, dtype=torch.int64, device=s.device)
    values, rows = _slot_order(s)
    theta = _throughput(values, R, table)
    lowers = theta[1:] < theta[:-1]  # [n_max]: admission n + 1 lowers Theta
    admitted = int((torch.cumsum(lowers, 0) == 0).sum())  # admissions before the first decrease
    return torch.bincount(rows[:admitted], minlength=R)


def budget(stale_survival: Tensor, table: StepTimeTable, num_requests: int | None = None) -> int:
    """Production budget: K = argmax_K Theta(K) over K = 0..R*B, with survivals from an earlier step (stale).

    Theta(K) = (R + sum of the top-K stale survivals) * SPS(R + K); the smallest K wins a tie.

    Rows finish between steps, so the stale batch (R' rows) can differ from the current one (R rows). The stale
    survivals are then read as a distribution: the j-th best of the R*B current slots gets the stale value at the
    same rank quantile, sorted_stale[ceil(j * R' / R) - 1] (j = 1..R*B). With R == R' this is exactly the sorted
    stale survival. This needs no bookkeeping of which rows survived and depends on nothing of the current step
    but R, which is known before the drafts exist.

    Args:
        stale_survival: [R', B] survival of an earlier step (the paper uses the one two steps back).
        table: StepTimeTable.
        num_requests: R, the current number of requests (default R').
    Returns:
        K, the number of draft slots to verify this step (0..R*B).
    """
    values, R = _stale_values(stale_survival, num_requests)
    if R == 0:
        return 0
    return int(torch.argmax(_throughput(values, R, table)))


def _stale_values(stale_survival: Tensor, num_requests: int | None) -> tuple[Tensor, int]:
    """Stale survivals sorted descending and mapped onto the current R requests by rank quantile (see `budget`)."""
    s = _checked_survival(stale_survival)
    R_stale, B = s.shape
    R = R_stale if num_requests is None else int(num_requests)
    if R < 0:
        raise ValueError(f"num_requests must be >= 0, got {R}.")
    if R == 0:
        return s.new_zeros(0), 0
    if R_stale == 0:
        raise ValueError(
            f"stale_survival has no rows, so it says nothing about a batch of {R} requests; "
            "verify the full block until a step with requests has been seen."
        )
    values = torch.sort(s.reshape(-1), descending=True).values
    if R != R_stale:
        j = torch.arange(1, R * B + 1, device=s.device)
        values = values[(j * R_stale + R - 1) // R - 1]
    return values, R


def best_depth(
    stale_survival: Tensor,
    step_seconds: Tensor,
    num_requests: int | None = None,
    usable: Tensor | None = None,
) -> int:
    """The draft depth L that maximizes expected committed tokens per second, judged from stale survival.

    Every request verifies up to L drafts (a padded verify batch costs R x (L + 1) tokens whatever survives), so
    a step at depth L commits R + S_L tokens in expectation, S_L = sum over positions k < L of the mean stale
    survival at k times the number of requests that can still emit a draft at k (all R unless `usable` says
    otherwise: a request one token short of max_new_tokens gains nothing from drafts), and takes step_seconds[L].
    L = 0 is a plain target step without a drafter pass. Returns argmax_L (R + S_L) / step_seconds[L], the smallest
    L on ties. The choice depends only on earlier steps (and the timing model), never on the drafts it leads to, so
    truncating at L keeps the output exact. A static batch (one that waits for its slowest request) is better
    judged by `static_batch_seconds`, which prices the ragged finish this per-step rate ignores.

    Args:
        stale_survival: [R', B] prefix survival of an earlier drafted step.
        step_seconds: [B + 1] predicted seconds of a step at depth 0..B (inf = not allowed), e.g.
            `StepCosts.seconds(R, B)`.
        num_requests: R, the current number of requests (default R', or len(usable)).
        usable: [R] drafts each request can still commit (tokens left to generate - 1); None: no limit.
    Returns:
        L in 0..B.
    """
    s = _checked_survival(stale_survival)
    R_stale, B = s.shape
    if usable is not None:
        if num_requests is not None and usable.shape != (int(num_requests),):
            raise ValueError(f"usable must have one entry per request ({num_requests}), got shape {tuple(usable.shape)}.")
        num_requests = usable.shape[0]
    R = R_stale if num_requests is None else int(num_requests)
    if R < 0:
        raise ValueError(f"num_requests must be >= 0, got {R}.")
    seconds = _checked_seconds(step_seconds, B)
    if R == 0:
        return 0
    if R_stale == 0:
        raise ValueError(
            f"stale_survival has no rows, so it says nothing about a batch of {R} requests; "
            "draft the full block until a step with requests has been seen."
        )
    return _rate_depth(s.mean(0).tolist(), seconds.tolist(), R, None if usable is None else usable.tolist())


def _rate_depth(survival: list[float], seconds: list[float], num_requests: int, usable: list[int] | None) -> int:
    """`best_depth` on checked input: mean survival [B], B + 1 seconds, usable [R] or None."""
    return _first_max(_rates(survival, seconds, num_requests, usable))  # the smallest L on ties


def _rates(survival: list[float], seconds: list[float], num_requests: int, usable: list[int] | None) -> list[float]:
    """B + 1 expected committed tokens per second of a step at depth 0..B (see `best_depth`).

    Python floats: it runs before every step, right after a forward has evicted the caches, where numpy's per-call
    cost on 8 numbers dominated (~120 us per decision in the loop at batch 1 against ~5 us measured alone)."""
    left = None if usable is None else sorted(usable)  # drafts each request can still commit
    tokens, rates = float(num_requests), [num_requests / seconds[0]]
    for k, s_k in enumerate(survival):
        tokens += s_k * (num_requests if left is None else len(left) - bisect.bisect_right(left, k))  # requests that can use draft k
        rates.append(tokens / seconds[k + 1])
    return rates


def _first_max(values: list[float]) -> int:
    """Index of the first maximum."""
    return max(range(len(values)), key=values.__getitem__)


def _checked_seconds(step_seconds: Tensor, block_size: int) -> Tensor:
    """[B + 1] positive step seconds (inf allowed) as float64, or a clear error."""
    if step_seconds.shape != (block_size + 1,):
        raise ValueError(
            f"step_seconds must have B + 1 = {block_size + 1} entries (depth 0..B), got shape {tuple(step_seconds.shape)}."
        )
    seconds = step_seconds.to(torch.float64)
    if not bool((seconds > 0).all()):  # NaN fails the comparison too
        raise ValueError(f"step_seconds must be positive (inf allowed), got {seconds.tolist()}.")
    return seconds


_NODES = (np.arange(32) + 0.5) / 32  # midpoint rule for the expected finish step of a static batch


def _upper_tail_ratio(x: np.ndarray) -> np.ndarray:
    """Phi(-x) e^(x^2 / 2) for x >= 0, Borjesson and Sundberg's 1 / (sqrt(2 pi) (0.661 x + 0.339 sqrt(x^2 + 5.51)))
    (relative error < 0.3%). It needs no erf, so numpy can do it: at a decision's few hundred to few thousand
    numbers, the same model in torch took ~0.9 ms on two threads (per-op cost), in numpy 0.1-0.3 ms."""
    return 1.0 / (math.sqrt(2 * math.pi) * (0.661 * x + 0.339 * np.sqrt(x * x + 5.51)))


def _inverse_gaussian_cdf(t: np.ndarray, mean: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """P(N <= t) [B, G, T] at t [B, 1, T] for N inverse Gaussian with mean m and variance [B, G] (shape
    lambda = m^3 / variance): Phi(a) + e^(2 lambda / m) Phi(-x), with q = sqrt(m / variance), a = q (t - m) / sqrt(t),
    x = q (t + m) / sqrt(t) >= 0. Both terms go through `_upper_tail_ratio`: Phi(-|a|) = e^(-a^2 / 2) ratio(|a|),
    and the second term is e^(-a^2 / 2) ratio(x) (the same number, without the overflow of e^(2 lambda / m))."""
    m = mean[:, :, None]  # [B, G, 1]
    qrt = np.sqrt(mean / variance)[:, :, None] / np.sqrt(t)  # [B, G, T]
    a, x = qrt * (t - m), qrt * (t + m)
    gauss = np.exp(-0.5 * a * a)
    below = gauss * _upper_tail_ratio(np.abs(a))  # Phi(-|a|)
    return np.clip(np.where(a >= 0, 1.0 - below, below) + gauss * _upper_tail_ratio(x), 0.0, 1.0)


def static_batch_seconds(
    stale_survival: Tensor, step_seconds: Tensor, one_request_seconds: Tensor, usable: Tensor
) -> Tensor:
    """Expected seconds until a static batch is done if every step drafts at depth L, for L = 0..B.

    A static batch (transformers' generate(): nobody joins, the call waits for its slowest request) pays for the
    ragged finish that drafting causes: plain steps move every request one token in lock step, while at depth L
    request r needs N_r steps for its u_r remaining tokens, N_r random, and the call lasts max_r N_r steps with
    fewer and fewer requests. The per-step rate (`best_depth`) sees none of this; on a CPU, where a step with one
    request costs ~0.8 of a plain step with 16, the finish took half of a 32-token call's drafting time.

    Model: a step at depth L with R' requests costs one[L] + k_L (R' - 1), the line through the one-request and
    the R-request prices (k_L = (step[L] - one[L]) / (R - 1)), so the call costs
    one[L] E[max_r N_r] + k_L (sum_r E[N_r] - E[max_r N_r]). N_r is the first passage of u_r by a walk whose
    steps are 1 + a, a the accepted drafts at depth L (P(a > k) = mean survival at k; cutting a draft short at
    a request's last token does not change the step count): by renewal theory E[N_r] ~ u_r / mu + (E[X^2] / (2 mu)
    - 1/2) / mu and Var N_r ~ var(a) u_r / mu^3 (mu = 1 + E[a]), and N_r is taken as inverse Gaussian (the first
    passage of a drifting Brownian motion: right-skewed like the real step count; a normal underestimates the
    maximum of 16 by ~3% at 32 tokens). E[max] integrates 1 - prod_r F_r over a 32-node grid. Depth 0 is exact:
    max_r u_r steps. The loop drafts at most (most tokens left - 1), so the last steps of a call can run shallower
    than L and cost less than priced: deep depths with few tokens left are overpriced (16 requests, 8 tokens,
    depth 7: +15%), a bias towards shallower depths. Modelling that cap moved simulated throughput by at most
    +-0.02x (`scripts/simulate_static_batch.py`), so it is left out. The tests check the model against simulation.
    Past steps only: exact.

    Args:
        stale_survival: [R', B] (or [B]) prefix survival of an earlier drafted step.
        step_seconds: [B + 1] seconds of a step at depth 0..B with all R requests (inf = not allowed).
        one_request_seconds: [B + 1] seconds of a step at depth 0..B with one request.
        usable: [R] drafts each request can still commit (tokens left to generate - 1).
    Returns:
        [B + 1] float64 expected seconds (inf where a depth is not allowed).
    """
    s = _checked_survival(stale_survival.reshape(-1, stale_survival.shape[-1])).mean(0).cpu().numpy()  # [B]
    B = s.shape[0]
    full = _checked_seconds(step_seconds, B).cpu().numpy()  # [B + 1]
    one = _checked_seconds(one_request_seconds, B).cpu().numpy()
    if usable.dim() != 1 or usable.numel() == 0 or bool((usable < 0).any()):
        raise ValueError(f"usable must be a non-empty [R] tensor of drafts >= 0, got {usable.tolist()}.")
    return torch.from_numpy(_static_batch_seconds(s, full, one, usable.cpu().numpy()))


def _static_batch_seconds(survival: np.ndarray, full: np.ndarray, one: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """`static_batch_seconds` on checked numpy input: mean survival [B], seconds [B + 1] twice, usable [R] >= 0.
    Written for few numpy calls (0.1-0.3 ms for 1-31 distinct usable values): it runs before every drafting step."""
    u, count = np.unique(usable, return_counts=True)  # [G] distinct drafts left, requests with each
    u, count = u + 1.0, count.astype(np.float64)  # [G] tokens each group still needs
    inv_mu, offset, spread, Ea, Ea2 = [], [], [], 0.0, 0.0  # per depth L = 1..B, for a step's X = 1 + a
    for k, s_k in enumerate(survival.tolist()):
        Ea, Ea2 = Ea + s_k, Ea2 + (2 * k + 1) * s_k  # E[a] = sum_{k<L} P(a > k), E[a^2] = sum_{k<L} (2k + 1) P(a > k)
        mu = 1.0 + Ea
        inv_mu.append(1.0 / mu)
        offset.append(((1.0 + 2.0 * Ea + Ea2) / (2.0 * mu) - 0.5) / mu)  # E[N] = u / mu + (E[X^2] / (2 mu) - 1/2) / mu
        spread.append(max(Ea2 - Ea * Ea, 0.0) / mu**3)  # Var N = Var(a) u / mu^3
    inv_mu, offset, spread = np.array(inv_mu)[:, None], np.array(offset)[:, None], np.array(spread)[:, None]  # [B, 1]
    mean = np.minimum(np.maximum(u * inv_mu + offset, 1.0), u)  # [B, G] expected steps per request: 1 <= N <= u
    variance = np.maximum(spread * u, 1e-9 * mean * mean)  # [B, G]
    sd = np.sqrt(variance)
    lo = np.maximum((mean - 8 * sd).max(1, keepdims=True), 0.0)  # [B, 1]: below, the max is surely larger
    width = (mean + 12 * sd).max(1, keepdims=True) - lo  # [B, 1]: above lo + width, every request is surely done
    t = (lo + width * _NODES)[:, None, :]  # [B, 1, T]
    with np.errstate(divide="ignore"):  # log 0 = -inf: nobody is sure to be done yet
        all_done = np.exp(count @ np.log(_inverse_gaussian_cdf(t, mean, variance)))  # [B, T] P(max_r N_r <= t)
    steps = np.concatenate([[u[-1]], lo[:, 0] + width[:, 0] * (1 - all_done).mean(1)])  # [B + 1] E[max_r N_r]
    request_steps = np.concatenate([[count @ u], mean @ count])  # [B + 1] expected steps summed over requests
    R = usable.shape[0]
    with np.errstate(invalid="ignore"):  # inf - inf and inf * 0 where a depth is not allowed: masked below
        slope = np.maximum(full - one, 0.0) / (R - 1) if R > 1 else np.zeros_like(full)  # [B + 1] per extra request
        seconds = one * steps + slope * (request_steps - steps)
    seconds[~np.isfinite(full) | ~np.isfinite(one)] = math.inf
    return seconds


def _drafting_depth(rates: list[float]) -> int:
    """The best depth L >= 1 by the rates of depth 0..B (`best_depth` with the plain step ruled out): what a probe
    drafts."""
    return 1 + _first_max(rates[1:])


def geometric_survival(mean_accepted_length: float, block_size: int) -> Tensor:
    """A prior survival [B] from a drafter's measured mean accepted length tau (accepted drafts + 1, e.g. its
    calibration's held-out tau): every position survives with the same alpha, a_k = alpha^(k+1), where alpha solves
    sum_k a_k = tau - 1 (bisection; alpha = 1 when tau - 1 >= B)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}.")
    if not math.isfinite(mean_accepted_length) or mean_accepted_length < 1.0:
        raise ValueError(f"The mean accepted length counts the bonus token, so it is >= 1; got {mean_accepted_length}.")
    target = min(mean_accepted_length - 1.0, float(block_size))
    lo, hi = 0.0, 1.0
    for _ in range(60):  # sum_k alpha^k is increasing in alpha
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(mid ** k for k in range(1, block_size + 1)) < target else (lo, mid)
    return hi ** torch.arange(1, block_size + 1, dtype=torch.float64)


def prior_survival(calibration: dict | None, block_size: int) -> Tensor | None:
    """The survival a scheduler assumes before its first drafted step: `geometric_survival` of the held-out tau that
    `hf-dspark calibrate` recorded in calibration.json (`source.tau`); None when the calibration does not say."""
    tau = ((calibration or {}).get("source") or {}).get("tau")
    if not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau < 1.0:
        return None
    return geometric_survival(float(tau), block_size)


def allocate(survival: Tensor, K: int) -> Tensor:
    """Give K verify slots to the top-K slots by current survival (ties: smaller position, then smaller request).

    Survival never rises along B and ties go to the smaller position, so each request gets a prefix.

    Args:
        survival: [R, B] current-step prefix survival.
        K: number of draft slots to verify (>= 0; more than R*B means all).
    Returns:
        [R] int64 lengths, each in 0..B, summing to min(K, R*B).
    """
    if K < 0:
        raise ValueError(f"The verify budget K must be >= 0, got {K}.")
    s = _checked_survival(survival)
    R = s.shape[0]
    if R == 0:
        return torch.zeros(0, dtype=torch.int64, device=s.device)
    _, rows = _slot_order(s)
    return torch.bincount(rows[:K], minlength=R)


# ----------------------------------------------------------------------------------------------------------------
# Policies: the interface the generation loop calls once per step
# ----------------------------------------------------------------------------------------------------------------


class VerifyPolicy:
    """How many drafts each request verifies this step.

    Per generate call the loop calls `reset()`; per step it calls `draft_depth(R, B)` before drafting,
    `lengths(conf_logits, depth)` after drafting and before verification (skipped when the depth is 0), and
    `observe_step(...)` at the end. Policies that need confidence logits and get None (a drafter without a
    confidence head) verify every drafted token and say so once.
    """

    needs_confidence = False
    fallback_reason: str | None = None  # a FullBlock standing in for a scheduler that could not run says why

    def reset(self) -> None:
        """Forget per-generation state (history of earlier steps)."""

    def draft_depth(
        self, num_requests: int, block_size: int, usable: Tensor | Sequence[int] | None = None, pending_columns: int = 0
    ) -> int:
        """How many of the B block slots the drafter fills this step, 0..B; 0 skips the drafter (a plain step).

        Called before drafting, so it may use only earlier steps (that keeps every policy exact). `usable` [R]
        (a tensor or a list of ints): drafts each request can still commit (None: no limit). `pending_columns`:
        context columns the drafter has not projected yet (a drafting step projects them first, for every
        request). The loop may lower the depth further (num_speculative_tokens, tokens left to generate).
        """
        return block_size

    def observe_step(
        self,
        num_requests: int,
        depth: int,
        step_seconds: float,
        draft_seconds: float,
        accepted: Tensor | None = None,
        catch_up: tuple[int, float] | None = None,
    ) -> None:
        """The step just finished: its wall time and its drafter pass's (0 when skipped), at depth `depth`, and
        `accepted` [R], the drafts each request accepted (None on a plain step). `catch_up`: (request-columns,
        seconds) of the context columns earlier plain steps (or the prefill) left and this drafting step projected
        first, included in both times (None: none)."""

    def lengths(self, conf_logits: Tensor | None, block_size: int, num_requests: int | None = None) -> Tensor:
        """Drafts to verify per request.

        Args:
            conf_logits: [R, L] confidence logits of this step's drafts (L == block_size), or None when the
                drafter has no confidence head.
            block_size: L, drafts per request this step (the depth drafted, at most the drafter's block).
            num_requests: R; needed only when conf_logits is None, checked against it otherwise.
        Returns:
            [R] int64 CPU tensor, each in 0..B.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}.")
        if conf_logits is None:
            if num_requests is None:
                raise ValueError("Pass num_requests when conf_logits is None: the policy cannot infer the batch size.")
            if self.needs_confidence:
                logger.warning_once(
                    f"{type(self).__name__} needs confidence logits but the drafter has none (no confidence head); "
                    "verifying the full block instead."
                )
                return torch.full((num_requests,), block_size, dtype=torch.int64)
            return self._lengths(None, num_requests, block_size)
        if conf_logits.dim() != 2 or conf_logits.shape[1] != block_size:
            raise ValueError(
                f"conf_logits must have shape [R, {block_size}] (one logit per draft), got {tuple(conf_logits.shape)}."
            )
        R = conf_logits.shape[0]
        if num_requests is not None and num_requests != R:
            raise ValueError(f"num_requests={num_requests} but conf_logits has {R} rows.")
        if R == 0:
            return torch.zeros(0, dtype=torch.int64)
        return self._lengths(conf_logits.detach().to("cpu", torch.float32), R, block_size)

    def _lengths(self, conf_logits: Tensor | None, num_requests: int, block_size: int) -> Tensor:
        """conf_logits: [R, B] float32 CPU, or None for policies that do not need it. Returns [R] int64."""
        raise NotImplementedError


class FullBlock(VerifyPolicy):
    """Verify every draft (or the first `max_len`, drafting no more than that): plain DSpark/DFlash.
    `fallback_reason`: why the scheduler, when it was wanted, could not run (`generation.choose_policy`)."""

    def __init__(self, max_len: int | None = None, fallback_reason: str | None = None):
        if max_len is not None and max_len < 0:
            raise ValueError(f"max_len must be >= 0, got {max_len}.")
        self.max_len = max_len
        self.fallback_reason = fallback_reason

    def draft_depth(self, num_requests, block_size, usable=None, pending_columns=0):
        return block_size if self.max_len is None else min(self.max_len, block_size)

    def _lengths(self, conf_logits, num_requests, block_size):
        return torch.full((num_requests,), self.draft_depth(num_requests, block_size), dtype=torch.int64)

    def __repr__(self):
        return f"{type(self).__name__}(max_len={self.max_len})"


class FixedLength(FullBlock):
    """Verify the first k drafts of every request (k = 0 is plain decoding through our loop: no drafter pass)."""

    def __init__(self, k: int):
        super().__init__(max_len=k)


class ConfidenceThreshold(VerifyPolicy):
    """Verify drafts while the calibrated per-position confidence c_k >= threshold; the first c_k below cuts.

    Exact: c_k depends on x_{k-1} and h_k, never on x_k.
    """

    needs_confidence = True

    def __init__(self, threshold: float, temperatures: Tensor | None = None):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold}.")
        self.threshold = float(threshold)
        self.temperatures = _checked_temperatures(temperatures)

    def _lengths(self, conf_logits, num_requests, block_size):
        keep = _calibrated_confidence(conf_logits, self.temperatures) >= self.threshold  # [R, L]
        return torch.cumprod(keep.long(), dim=1).sum(dim=1)

    def __repr__(self):
        return f"{type(self).__name__}(threshold={self.threshold})"


class AdaptiveVerification(VerifyPolicy):
    """The hardware-aware scheduler of our loop: the draft depth that maximizes expected tokens per second.

    transformers runs the verify batch padded to its longest row, so a step costs R x (L + 1) target tokens plus
    a drafter pass at depth L, however many drafts would survive; per-request lengths below L would save
    nothing. The scheduler therefore chooses one depth per step (SPEC section 6 with the padded price; the
    paper's per-request rule, `budget` + `allocate`, is for packed verify batches):

    - before the step, `best_depth(survival of the latest drafted step, costs.seconds(R, B), R, usable)`,
      valuing a draft only for the requests that can still emit it (`usable`, from the loop); when that drafts
      and the batch is static (`static_batch`, R > 1), drafting must also pay once the batch's ragged finish is
      priced: if the expected time to finish the whole batch at that depth (`static_batch_seconds`, with
      `costs.seconds(1, B)` pricing the tail's one-request steps) exceeds plain decoding's, the depth becomes the
      one that finishes soonest, 0 included. (Taking that argmin always drafted shallower than the per-step rule
      at synthetic batch 4 in an earlier sweep and lost 2% there in `scripts/simulate_static_batch.py`: it compares
      constant-depth policies.) The costs are
      the loop's own measured step times (`StepCosts`, the step table as the prior), so drafting, verifying and
      bookkeeping are all priced. Depth 0 skips the drafter: a weak drafter or a loaded device costs a plain step.
      While skipping it drafts anyway (a probe at the best depth >= 1) after `probe_every` skipped steps,
      doubling the interval after each probe that confirms the skip, up to `max_probe_every`, and never before the
      probe's predicted extra seconds (over a plain step, plus the catch-up: projecting the context columns the
      skipped steps left, `StepCosts.catch_up_seconds`, when more than one step's worth wait) are at most
      `probe_budget` of the seconds spent in the skipped steps (a depth-1 probe cost ~2 extra plain steps at
      batch 64 and ~1 at batch 1 on a CPU, so at 1% it waits ~100-200 plain steps; at 3% the probes took ~2% of the
      time at batch 1 with the shipped drafter). Each
      probe that the next decision does not follow halves that share, down to an eighth of `probe_budget`: a
      drafter that keeps failing costs less and less (at 1% the probes and the scheduler's bookkeeping lost ~2% at
      batch 1 with the shipped drafter; at a quarter, probes were still ~0.25% of the time), and one drafting
      decision restores it. A skip by a clear margin is not re-priced for the next few steps (`SKIP_RECHECK`);
    - a close call goes to a fresh measurement: when drafting wins by a factor g < 1 + `remeasure_margin` (per
      step, or over the static batch) over a plain price last measured n steps ago, and the plain step would cost
      at most `remeasure_budget` of those steps (1 - 1/g <= remeasure_budget n: g = 1.05 after 10 steps, 1.2
      after 33 at 0.5%), the step runs plain instead, so the plain price the decisions compare against is recent
      (`StepCosts` weighs the new measurement most). A drifting machine had made a plain price learned 30 s
      earlier 20% too high, and drafting at synthetic batch 64 ran 17% slower than plain decoding;
    - every request verifies the L drafts; their calibrated confidences become the survival for the next
      decision (positions beyond L repeat the last drafted position's conditional confidence);
    - the survival is kept honest by what verification found: it is scaled by rho = (accepted + 1) / (predicted
      + 1) over the last `acceptance_window` drafted steps (predicted = the sum of the verified slots' survival),
      capped at 1. A head that is overconfident on this traffic (its calibration was fitted elsewhere) would
      otherwise keep the scheduler drafting for nothing; a calibrated head gets rho ~ 1;
    - until a step has drafted, the survival is `prior_survival` (e.g. `geometric_survival` of the drafter's
      held-out tau): a weak drafter under load starts with plain steps and the probe schedule, as if it had been
      skipping (forcing a first draft cost ~2 plain steps at batch 64 on a CPU); without a prior the first step
      drafts the full block (~5 plain steps at batch 64);
    - a prior that says skip is a guess about a text not seen yet, so the first step of a call drafts anyway (an
      opening probe at the best depth >= 1) when its extra seconds, catch-up included, are at most
      `opening_budget` of the call's plain decoding time (its longest request's tokens left x a plain step). The
      held-out tau behind the prior (2.0) is well below a math prompt's (~2.6): at 8 GSM8K prompts x 64 tokens the
      prior kept every step of a call plain, while a call whose first step drafted went on drafting at depth 4-6
      (`bench_results/s45`).
    Every choice uses earlier steps only: exact.

    A new generate call (`reset()`) is a new text: the last call's skip run and probe schedule go, and so does
    its last drafted step's survival when there is a prior (the next decision starts from the prior). The last
    step of a call says little about the next prompt: carried over, a text that ended on doubted drafts made the
    demo's next calls of its code prompt run 40 and 52 of their steps plain (`bench_results/s40`). With
    `carry_over=True`, what verification found (rho) stays and scales the prior too, and without a prior the last
    survival stands in for it; earlier calls are still the past, so this stays exact. The measured step costs are
    always kept.

    Args:
        table: the device's step table (the prior of the step costs).
        temperatures: [B] calibration temperatures of the confidence head (None: uncalibrated).
        probe_every, max_probe_every: skipped steps before the first probe, and the cap of its doubling.
        carry_over: keep what verification found (rho; without a prior, the last survival) across generate calls.
        costs: the step-cost model (default `StepCosts(table)`, learning from the loop's timings).
        acceptance_window: drafted steps whose accepted / predicted drafts correct the survival (0: no correction).
        prior_survival: [B] survival assumed until a step has drafted (None: the first step drafts the full block).
        probe_budget: most of the skipped steps' time that one probe's extra cost may take (0.01 = 1%; math.inf:
            probe every `probe_every`.. `max_probe_every` skipped steps whatever a probe costs).
        static_batch: draft only where it pays over the whole static batch (`static_batch_seconds`); True for generate(),
            whose batch waits for its slowest request; False where finished requests are replaced at once.
        remeasure_margin, remeasure_budget: the relative gain of drafting below which the plain price is measured
            again, and the most of the steps since its last measurement that doing so may cost (0: never).
        opening_budget: most of a call's plain decoding time that its opening probe may cost (0: no opening probe).
    """

    needs_confidence = True

    def __init__(
        self,
        table: StepTimeTable,
        temperatures: Tensor | None = None,
        probe_every: int = 4,
        max_probe_every: int = 64,
        carry_over: bool = False,
        costs: StepCosts | None = None,
        acceptance_window: int = 32,
        prior_survival: Tensor | None = None,
        probe_budget: float = 0.01,
        static_batch: bool = True,
        remeasure_margin: float = 0.25,
        remeasure_budget: float = 0.005,
        opening_budget: float = 0.02,
    ):
        if not 1 <= probe_every <= max_probe_every:
            raise ValueError(f"Need 1 <= probe_every <= max_probe_every, got {probe_every} and {max_probe_every}.")
        if acceptance_window < 0:
            raise ValueError(f"acceptance_window must be >= 0, got {acceptance_window}.")
        if not probe_budget >= 0:
            raise ValueError(f"probe_budget must be a fraction >= 0 (math.inf: no budget), got {probe_budget}.")
        if not (remeasure_margin >= 0 and remeasure_budget >= 0):
            raise ValueError(f"Need remeasure_margin >= 0 and remeasure_budget >= 0, got {remeasure_margin} and {remeasure_budget}.")
        if not opening_budget >= 0:
            raise ValueError(f"opening_budget must be a fraction >= 0, got {opening_budget}.")
        self.remeasure_margin, self.remeasure_budget = float(remeasure_margin), float(remeasure_budget)
        self.opening_budget = float(opening_budget)
        self._opening = True  # the next decision is a call's first
        self.prior_survival = None if prior_survival is None else _checked_survival(torch.as_tensor(prior_survival).reshape(1, -1))
        self.probe_budget = float(probe_budget)
        self.static_batch = static_batch
        self.costs = StepCosts(table) if costs is None else costs
        self.temperatures = _checked_temperatures(temperatures)
        self.probe_every, self.max_probe_every = probe_every, max_probe_every
        self.carry_over = carry_over
        self._survival: np.ndarray | None = None  # [R', B] float64 survival of the latest drafted step
        self._block_size: int | None = None
        self._usable: list[int] | None = None  # [R] drafts each request of the current step can still commit
        self._decision: tuple[int, list[float] | None] | None = None  # (B, what _decision_survival gives) until it changes
        self._skip_run: tuple[int, int, int] | None = None  # (R, B, last skipped count) a clear skip stands for
        self._skipped, self._interval = 0, probe_every
        self._probes = 0  # probes since the last drafting decision (each confirmed the skip)
        self._skipped_s = 0.0  # seconds of the plain steps since the last drafted step
        self._predicted = 0.0  # expected accepted drafts of the step being verified (sum of its verified survival)
        self._outcomes: deque[tuple[float, int]] = deque(maxlen=acceptance_window)  # (predicted, accepted) per drafted step

    def reset(self) -> None:
        self._skip_run, self._decision, self._opening = None, None, True
        self._skipped, self._skipped_s, self._interval, self._probes = 0, 0.0, self.probe_every, 0
        if not self.carry_over:
            self._outcomes.clear()
        if not self.carry_over or self.prior_survival is not None:
            self._survival = None

    @property
    def acceptance_ratio(self) -> float:
        """rho = (accepted + 1) / (predicted + 1) drafts over the recent drafted steps (1 before any)."""
        return (sum(a for _, a in self._outcomes) + 1.0) / (sum(p for p, _ in self._outcomes) + 1.0)

    def draft_depth(
        self, num_requests: int, block_size: int, usable: Tensor | Sequence[int] | None = None, pending_columns: int = 0
    ) -> int:
        run = self._skip_run
        if run is not None and run[0] == num_requests and run[1] == block_size and self._skipped < run[2]:
            self._skipped += 1  # a clear skip stands (see SKIP_RECHECK)
            return 0
        self._skip_run = None
        opening, self._opening = self._opening, False
        use = None  # [R] as Python ints: Python numbers throughout a decision (see `_rates`)
        if usable is not None:
            use = usable.tolist() if isinstance(usable, Tensor) else [int(u) for u in usable]
        if use is not None and len(use) != num_requests:
            raise ValueError(f"usable must have one entry per request ({num_requests}), got {len(use)}.")
        self._block_size, self._usable = block_size, use
        survival = self._decision_survival(block_size)  # [B]
        if survival is None:
            return block_size  # nothing drafted yet and no prior: warm up with the full block
        seconds = self.costs.seconds_list(num_requests, block_size)  # B + 1
        rates = _rates(survival, seconds, num_requests, use)  # B + 1 tokens per second
        depth = _first_max(rates)
        gain = rates[depth] / rates[0] if rates[0] > 0 else math.inf  # how much faster than plain decoding drafting looks
        if depth > 0 and self.static_batch and use is not None and num_requests > 1:
            # drafting pays per step; does it still pay once the batch's ragged finish is priced?
            one = np.array(self.costs.seconds_list(1, block_size))
            call_seconds = _static_batch_seconds(np.array(survival), np.array(seconds), one, np.array(use))
            if call_seconds[depth] > call_seconds[0]:
                depth = int(np.argmin(call_seconds))  # no: the depth that finishes the call soonest, maybe plain
            gain = call_seconds[0] / call_seconds[depth]
        if depth > 0:
            self._skipped, self._skipped_s, self._interval, self._probes = 0, 0.0, self.probe_every, 0
            if gain < 1.0 + self.remeasure_margin and self.costs.age(0, num_requests) * self.remeasure_budget >= 1.0 - 1.0 / gain:
                return 0  # a close call against a plain price measured long ago: measure it again
            return depth
        catch_up = self.costs.catch_up_seconds(num_requests * catch_up_columns(pending_columns, block_size))
        if opening and self._survival is None and use is not None:  # the prior's skip: probe the new text once
            probe = _drafting_depth(rates)
            if seconds[probe] - seconds[0] + catch_up <= self.opening_budget * max(use) * seconds[0]:
                return probe
        self._skipped += 1
        probe = self._probe_depth(rates, seconds, catch_up) if self._skipped > self._interval else 0
        if probe == 0:
            if max(rates[1:]) <= SKIP_MARGIN * rates[0]:  # a clear skip stands for a few steps (never past a probe's turn)
                last = self._skipped + SKIP_RECHECK - 1
                self._skip_run = (num_requests, block_size, last if self._skipped > self._interval else min(last, self._interval))
            return 0
        self._skipped, self._skipped_s, self._interval = 0, 0.0, min(2 * self._interval, self.max_probe_every)
        self._probes += 1
        return probe

    def _probe_depth(self, rates: list[float], seconds: list[float], catch_up: float) -> int:
        """The depth of a probe due now, or 0 while it would cost more than its share of the time spent skipping
        (its extra step time over a plain step, plus `catch_up` seconds projecting the skipped context columns)."""
        if self.probe_budget == math.inf:
            return _drafting_depth(rates)
        allowance = self.probe_budget / 2 ** min(self._probes, 3) * self._skipped_s - catch_up  # for the step itself
        if not min(seconds[1:]) - seconds[0] <= allowance:
            return 0  # even the cheapest probe would cost more than its share
        probe = _drafting_depth(rates)
        return probe if seconds[probe] - seconds[0] <= allowance else 0

    def _decision_survival(self, block_size: int) -> list[float] | None:
        """The mean survival [B] the next decision uses: the latest drafted step's of this call, or the prior until
        one has drafted (the drafter's held-out tau says what to expect), scaled by rho (capped at 1); None when
        neither fits the block. Kept until a drafted step changes it (plain steps reuse it)."""
        if self._decision is not None and self._decision[0] == block_size:
            return self._decision[1]
        s = None  # [R' or 1, B]
        if self._survival is not None and self._survival.shape[1] == block_size:
            s = self._survival
        elif self.prior_survival is not None and self.prior_survival.shape[1] == block_size:
            s = self.prior_survival.numpy()
        if s is not None:
            s = (np.minimum(s * self.acceptance_ratio, 1.0) if self._outcomes else s).mean(0).tolist()
        self._decision = (block_size, s)
        return s

    def observe_step(self, num_requests, depth, step_seconds, draft_seconds, accepted=None, catch_up=None):
        if catch_up is not None and depth > 0:  # priced apart: the step's own cost is what a drafting step repeats
            self.costs.observe_catch_up(*catch_up)
            step_seconds, draft_seconds = step_seconds - catch_up[1], max(draft_seconds - catch_up[1], 0.0)
        self.costs.observe(num_requests, depth, step_seconds, draft_seconds)
        if depth == 0:
            self._skipped_s += step_seconds
        if depth > 0 and accepted is not None:
            self._outcomes.append((self._predicted, int(accepted.sum())))
            self._decision, self._skip_run = None, None

    def _lengths(self, conf_logits, num_requests, block_size):
        c = _calibrated_confidence(conf_logits, self.temperatures).numpy().astype(np.float64)  # [R, L]
        B = max(self._block_size or block_size, block_size)
        c = np.concatenate([c, np.repeat(c[:, -1:], B - block_size, axis=1)], axis=1)  # [R, B]: past the drafted depth
        self._survival, self._decision, self._skip_run = np.cumprod(c, axis=1), None, None
        verified = self._survival[:, :block_size]  # [R, L]; the loop cuts a request at what it can still emit
        if self._usable is not None and len(self._usable) == num_requests:
            verified = verified * (np.arange(block_size) < np.array(self._usable)[:, None])
        self._predicted = float(verified.sum())
        return torch.full((num_requests,), block_size, dtype=torch.int64)

    def __repr__(self):
        return (
            f"{type(self).__name__}(calibrated={self.temperatures is not None}, carry_over={self.carry_over}, "
            f"acceptance_ratio={self.acceptance_ratio:.2f})"
        )


# ----------------------------------------------------------------------------------------------------------------
# Overhead measurement (called by the benchmark tool; never asserted in tests)
# ----------------------------------------------------------------------------------------------------------------


def scheduler_overhead_ms(R: int = 64, B: int = 7, steps: int = 200) -> float:
    """Median wall time (ms) of the scheduler's work in one drafting step of a static batch at batch R, block B,
    on CPU: `draft_depth` (with `usable` spread over 32 values, so the static-batch model prices up to 32 groups)
    + `lengths` + `observe_step` of `AdaptiveVerification`; every draft is accepted, so it keeps drafting (a
    plain step skips `lengths` and the static-batch model and costs less)."""
    from .step_table import DEFAULT_BATCH_TOKENS, StepTimeTable

    tokens = list(DEFAULT_BATCH_TOKENS)
    latency_s = [0.02 + 0.0005 * (-(-n // 16)) for n in tokens]  # a 16-token staircase
    table = StepTimeTable(tokens, [1.0 / t for t in latency_s], max_batch_tokens=tokens[-1])
    policy = AdaptiveVerification(table, temperatures=torch.linspace(1.0, 1.5, B))
    gen = torch.Generator().manual_seed(0)
    usable = [200 + r % 32 for r in range(R)]  # [R] drafts each request can still commit (a list, as the loop passes)
    times = []
    for i in range(steps + 1):
        z = torch.randn(R, B, generator=gen) + 2.0
        t0 = time.perf_counter()
        depth = policy.draft_depth(R, B, usable=usable)
        if depth:
            policy.lengths(z[:, :depth], depth)
        policy.observe_step(R, depth, 0.05 + 0.01 * depth, 0.005 * depth, torch.full((R,), depth) if depth else None)
        if i:  # the first call is the warm-up (no survival yet)
            times.append(time.perf_counter() - t0)
    times.sort()
    return 1000.0 * times[len(times) // 2]
