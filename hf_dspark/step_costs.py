"""What one decoding step costs, learned online from the loop's own timings, with the step table as the prior.

A step with R requests and draft depth L (the drafter proposes L tokens per request and every request verifies
up to L of them; L = 0 is a plain target step that skips the drafter) takes

    seconds(R, L) = verify(R, L) + draft(R, L),        draft(R, 0) = 0

- verify(R, L): everything except the drafter pass: the target forward over R x (L + 1) tokens (transformers
  pads every row of a batch to the longest one, so the depth, not the number of surviving drafts, sets the
  cost), acceptance, commit and cache bookkeeping;
- draft(R, L): the drafter pass, whose vocabulary-wide lm_head grows with L.

The step table measures only the target forward, outside the loop; the rest of a step (the drafter, per-row
Python work, cache compaction) is what made a table-only price too optimistic under load. So `StepCosts` keeps the
mean of the last `window` measured verify and draft seconds per (R, L) -- a mean, not a median: throughput is
tokens over total time, so every slow step counts, whatever made it slow -- weighted by recency: a measurement
`half_life` observed steps older than another weighs half as much. In a run of steps at one cell, the window's
nine measurements weigh 1 down to 1/4 (default half_life 4: worth ~7 equal ones); a cell measured again after a gap
(a probe after a run of plain steps, a plain step after a run of drafting) is priced almost only by the new
measurement (97% after 28 steps). Machines drift (a CPU's step time moved 0.43 -> 0.36 s
within one benchmark), and a cell last measured in another phase, compared with one measured now, chose
drafting at synthetic batch 64 where plain decoding was 17% faster. `age(L)` tells the scheduler how stale a
depth's price is. Where the table prices every depth at R within `POOL_MAX_TABLE_SPREAD` plain steps (small
batches on a CPU), once R has drafted its drafting depths are priced by one line a + b L through all of R's recent
drafting steps (`_pooled_drafting_line`): depths a few percent apart were otherwise decided by a few noisy steps
each, and a depth measured once in a slow phase kept its price until it ran again, which it then never did. It
predicts a cell it has not measured (and gives the line's slope before R has drafted at two depths):
- verify: the table's time T_R(R (L + 1)) scaled by the smallest measured/table ratio of the cells measured at R
  (optimistic, so an unmeasured depth that might be the best gets tried once and is known from then on);
- draft: the least-squares line (intercept and slope >= 0) through the measured depths at R; with one depth
  measured, proportional to L (optimistic for shallower depths, so the scheduler tries them and learns);
- a depth measured at other batch sizes but not at R: the nearest such batch size's measured step, scaled by the
  table (T_R(R (L + 1)) / T_R'(R' (L + 1)), interpolated between the table's probes: with a floor lookup, R = 63
  at depth 1 (126 tokens) fell to the 96-token probe and was priced 36% below R = 64). Rows finish one by one, so
  a static batch's tail walks R down through sizes the scheduler has not seen yet; without this, each new R would
  explore the depths afresh;
- a depth measured nowhere: a batch size never measured borrows the ratio and the line of the nearest measured one
  (the line of the nearest one that drafted, if that one only ran plain steps);
- finally no estimate is priced above a deeper step or below a shallower one (a step at depth L does a subset of a
  step at L + 1's work), while a cell measured at R stays as measured: the estimates come from different cells, and
  at a static batch's tail a plain step borrowed from R' = 32 was priced above a drafting step measured at R = 4
  (0.33 s vs 0.20 s at R = 6), which made drafting look free; lowering measured cells the same way priced a
  one-request depth-5 step measured at 75 ms at an estimated 39 ms (fp32, synthetic batch 32).
With no measurement at all, verify is the table's time and drafting is free: the first steps draft.

A drafting step after plain steps first projects the context columns those steps left for the drafter (its
`DraftContext` defers them): a catch-up that grows with the skipped steps and the batch, not with the depth. It is
priced apart, per request-column (`observe_catch_up`, `catch_up_seconds`): with the shipped drafter on SmolLM2 in
bf16 a batch-64 catch-up took 21 us per request-column (`OMP_NUM_THREADS=2 python scripts/catch_up_cost.py`), 1.3
ms per skipped ~100 ms plain step: more than a probe's whole 1% budget of those steps, and 0.24 s for a call's 180
columns, which, counted as drafter time, made the next drafting steps look several times dearer than they are.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

import torch
from torch import Tensor

from .step_table import StepTimeTable


POOL_HALF_LIVES = 2.0  # a drafting step weighs half as much in its batch size's line after this many half_lifes
POOL_MAX_TABLE_SPREAD = 2.0  # pool only where the table prices the deepest verify at most this many plain steps:
# there depths differ by less than a step's noise; beyond (batch 16 on a 2-core CPU: ~3.5x), the table's staircase
# gives each depth its shape, which a line in L does not follow (pooled there, batch 16 drafted at 0.86x of plain)
POOL_SLOPE_PRIOR = 4.0  # the estimate's slope weighs like this much weight x depth^2 of steps (two fresh ones 2 apart)


class StepCosts:
    """Seconds of one decoding step against batch size R and draft depth L, from measured steps.

    Args:
        table: the device's step table (prior for the target forward; `for_num_requests(R)` picks the curve).
        window: how many recent measurements of a cell its mean covers (older ones are forgotten, so the costs
            follow a machine whose speed drifts).
        half_life: observed steps after which a measurement weighs half as much as a new one in its cell's mean.
    """

    def __init__(self, table: StepTimeTable, window: int = 9, half_life: float = 4.0):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}.")
        if not half_life > 0:
            raise ValueError(f"half_life must be > 0 observed steps, got {half_life}.")
        self.table = table
        self.window, self.half_life = window, float(half_life)
        self._clock = 0  # steps observed so far
        self._last_seen: dict[int, dict[int, int]] = {}  # L -> R -> clock of the latest step measured at (R, L)
        self._cells: dict[int, dict[int, tuple[float, float]]] = {}  # R -> L -> (verify s, draft s) means of the window
        self._measured_at: dict[int, list[int]] = {}  # L -> sorted batch sizes R with a measured (R, L) cell
        self._recent: dict[tuple[int, int], deque[tuple[int, float, float]]] = {}  # (R, L) -> last `window` (clock, verify, draft)
        self._prior: dict[tuple[int, int], list[float]] = {}  # (R, B) -> table seconds per depth
        self._scale: dict[tuple[int, int], list[float]] = {}  # (R, B) -> interpolated table seconds per depth
        self._catch_up: deque[float] = deque(maxlen=window)  # seconds per request-column of recent catch-ups

    def observe(self, num_requests: int, depth: int, step_seconds: float, draft_seconds: float = 0.0) -> None:
        """Record one measured step: its wall time and the part spent in the drafter pass (0 for a plain step)."""
        if num_requests < 1 or depth < 0:
            raise ValueError(f"Need num_requests >= 1 and depth >= 0, got {num_requests} and {depth}.")
        if not (math.isfinite(step_seconds) and math.isfinite(draft_seconds) and 0.0 <= draft_seconds):
            raise ValueError(f"Step timings must be finite and >= 0, got {step_seconds} and {draft_seconds}.")
        draft_seconds = draft_seconds if depth else 0.0  # a plain step has no drafter pass
        self._tick(depth, num_requests)
        recent = self._recent.setdefault((num_requests, depth), deque(maxlen=self.window))
        recent.append((self._clock, max(step_seconds - draft_seconds, 0.0), draft_seconds))
        weights = [0.5 ** ((self._clock - clock) / self.half_life) for clock, _, _ in recent]
        total = sum(weights)
        cells = self._cells.setdefault(num_requests, {})
        if depth not in cells:
            bisect.insort(self._measured_at.setdefault(depth, []), num_requests)
        cells[depth] = (
            sum(w * v for w, (_, v, _) in zip(weights, recent)) / total,
            sum(w * d for w, (_, _, d) in zip(weights, recent)) / total,
        )

    def observe_catch_up(self, request_columns: int, seconds: float) -> None:
        """Record one catch-up: `request_columns` deferred context columns (summed over requests) projected in
        `seconds`."""
        if request_columns > 0 and math.isfinite(seconds) and seconds >= 0:
            self._catch_up.append(seconds / request_columns)

    def catch_up_seconds(self, request_columns: int) -> float:
        """Predicted seconds to project `request_columns` deferred context columns: the mean rate of the recent
        catch-ups, 0 before any (optimistic, like an unmeasured drafting step: the first one measures it)."""
        if not self._catch_up or request_columns <= 0:
            return 0.0
        return request_columns * sum(self._catch_up) / len(self._catch_up)

    def _tick(self, depth: int, num_requests: int) -> None:
        """Advance the clock by one observed step at (R, L)."""
        self._clock += 1
        self._last_seen.setdefault(depth, {})[num_requests] = self._clock

    def measured(self, num_requests: int, depth: int) -> bool:
        """Whether a step at exactly (R, L) has been measured."""
        return depth in self._cells.get(num_requests, {})

    def age(self, depth: int, num_requests: int | None = None) -> float:
        """Steps observed since a step at depth L was last measured, at any batch size, or with `num_requests` at
        one within 20% of R (0.8 R .. 1.25 R); inf if never. A price borrowed from a far batch size is as unknown as
        an old one: a batch-64 plain price scaled from batch 32, "fresh" because a one-request plain step had just
        run, made drafting look 8% faster at synthetic batch 64 where it was 8-16% slower (fp32)."""
        seen = self._last_seen.get(depth, {})
        clocks = [c for r, c in seen.items() if num_requests is None or 0.8 * num_requests <= r <= 1.25 * num_requests]
        return math.inf if not clocks else float(self._clock - max(clocks))

    def _table_seconds(self, num_requests: int, block_size: int) -> list[float]:
        """T_R(R (L + 1)) for L = 0..B: B + 1 floats; inf where the batch exceeds the table's max_batch_tokens.

        Cached per (R, B): the table never changes. Callers must not modify the returned list.
        """
        key = (num_requests, block_size)
        if key not in self._prior:
            table = self.table.for_num_requests(num_requests)
            n = num_requests * torch.arange(1, block_size + 2)
            seconds = (1.0 / table.steps_per_sec_tensor(n)).masked_fill(n > table.max_batch_tokens, math.inf)
            self._prior[key] = seconds.tolist()
        return self._prior[key]

    def _scale_seconds(self, num_requests: int, block_size: int) -> list[float]:
        """The table's time at R (L + 1) tokens for L = 0..B, interpolated between probes: the scale for borrowing a
        step measured at another batch size (a floor lookup between sparse probes makes that ratio jump)."""
        key = (num_requests, block_size)
        if key not in self._scale:
            n = num_requests * torch.arange(1, block_size + 2)
            self._scale[key] = self.table.for_num_requests(num_requests).seconds_interpolated(n).tolist()
        return self._scale[key]

    def _nearest_measured(self, num_requests: int, depth: int, block_size: int) -> int | None:
        """The measured batch size nearest R at depth L (ties: the larger), inside the table at L: a step the loop
        ran past max_batch_tokens (the warm-up's full block at a large R) has no table time to scale by."""
        for r in _nearest(self._measured_at.get(depth, []), num_requests):
            if math.isfinite(self._table_seconds(r, block_size)[depth]):
                return r
        return None

    def seconds(self, num_requests: int, block_size: int) -> Tensor:
        """Predicted seconds of a step at depth L = 0..B for R requests: [B + 1] float64 (inf = not allowed)."""
        return torch.tensor(self.seconds_list(num_requests, block_size), dtype=torch.float64)

    def seconds_list(self, num_requests: int, block_size: int) -> list[float]:
        """`seconds` as B + 1 Python floats: what the scheduler uses before every step, right after a forward has
        evicted the caches, where even the two tensor ops of building and reading back a tensor cost tens of us."""
        R, B = num_requests, block_size
        if R < 1 or B < 1:
            raise ValueError(f"Need num_requests >= 1 and block_size >= 1, got {R} and {B}.")
        prior = self._table_seconds(R, B)
        seen = R if R in self._cells else min(self._cells, key=lambda r: (abs(r - R), -r), default=None)  # ties: larger
        cells = {L: c for L, c in self._cells[seen].items() if L <= B} if seen is not None else {}
        if not cells:
            return list(prior)
        seen_prior = prior if seen == R else self._table_seconds(seen, B)
        ratios = [v / seen_prior[L] for L, (v, _) in cells.items() if math.isfinite(seen_prior[L])]
        ratio = min(ratios) if ratios else 1.0  # optimistic: an unmeasured cell gets tried, then known
        out = [t * ratio + d if math.isfinite(t) else math.inf for t, d in zip(prior, _line(self._drafter_cells(R, seen, B), B))]
        depths = [L for L in range(1, B + 1) if math.isfinite(prior[L])]
        flat = bool(depths) and prior[depths[-1]] <= POOL_MAX_TABLE_SPREAD * prior[0]  # pool R's drafting depths
        model_slope = _slope(out) if flat else 0.0  # seconds per depth of the estimate (table x ratio + drafter line)
        for L in range(B + 1):  # a depth measured at R speaks for itself; elsewhere, the nearest R' scaled by the table
            if not math.isfinite(prior[L]):
                continue
            near = self._nearest_measured(R, L, B)
            if near is not None:
                v, d = self._cells[near][L]
                out[L] = v + d if near == R else (v + d) * self._scale_seconds(R, B)[L] / self._scale_seconds(near, B)[L]
        here = self._cells.get(R, {})
        pooled = self._pooled_drafting_line(R, model_slope, depths) if flat else None
        if pooled is not None:  # R's drafting depths: one line through all of R's recent drafting steps
            a, b = pooled
            out[1:] = [a + b * L if math.isfinite(t) else math.inf for L, t in enumerate(out[1:], 1)]
            here = {L: c for L, c in here.items() if L == 0}  # the line is an estimate: it falls in line with plain
        # a step does a subset of a deeper one's work: no estimate above a deeper price or below a shallower one
        # (a cell measured at R stays as measured: when estimates and measurements disagree, the estimate is wrong)
        for L in range(B - 1, -1, -1):
            if L not in here:
                out[L] = min(out[L], out[L + 1])
        for L in range(1, B + 1):
            if L not in here:
                out[L] = max(out[L], out[L - 1])
        return out

    def _pooled_drafting_line(self, R: int, prior_slope: float, depths: list[int]) -> tuple[float, float] | None:
        """(a, b): the drafting step's seconds a + b L at R, least squares through every recent drafting step at R
        (all depths in `depths` pooled; a step `POOL_HALF_LIVES` x `half_life` steps older weighs half as much),
        the slope shrunk toward `prior_slope` by `POOL_SLOPE_PRIOR` (so one measured depth gives the prior's slope)
        and kept >= 0; None while R has not drafted. Per-depth means priced depths a few percent apart by a few noisy steps each: at
        batch 1 on a CPU (verify 8 tokens ~1.1x a plain step) a depth-7 price measured once in a slow phase was
        never revisited, and the scheduler ran at 0.89x of the full block (bench_results/s26)."""
        sw = sx = sy = sxx = sxy = 0.0
        for L in depths:
            for clock, v, d in self._recent.get((R, L), ()):
                w = 0.5 ** ((self._clock - clock) / (POOL_HALF_LIVES * self.half_life))
                sw, sx, sy, sxx, sxy = sw + w, sx + w * L, sy + w * (v + d), sxx + w * L * L, sxy + w * L * (v + d)
        if sw == 0.0:
            return None
        mean_L, mean_y = sx / sw, sy / sw
        slope = (sxy - sw * mean_L * mean_y + POOL_SLOPE_PRIOR * prior_slope) / (sxx - sw * mean_L * mean_L + POOL_SLOPE_PRIOR)
        slope = max(slope, 0.0)
        return mean_y - slope * mean_L, slope

    def _drafter_cells(self, R: int, seen: int, B: int) -> dict[int, tuple[float, float]]:
        """The cells whose drafter seconds price R's drafting: those of `seen` (the measured batch size nearest R),
        or, when it never drafted, of the nearest batch size that did (with none, drafting is free). A one-request
        tail whose nearest measured size had only plain steps once priced every depth at the plain step's 39 ms,
        where a depth-5 step took 75 ms, and the static-batch model saw a free tail (fp32, synthetic batch 32)."""
        if any(L >= 1 for L in self._cells[seen]):
            return {L: c for L, c in self._cells[seen].items() if L <= B}
        drafted = sorted({r for L, rows in self._measured_at.items() if L >= 1 for r in rows})
        near = next(_nearest(drafted, R), None)
        return {} if near is None else {L: c for L, c in self._cells[near].items() if L <= B}


def catch_up_columns(pending_columns: int, block_size: int) -> int:
    """Of the context columns waiting when a drafting step starts, those that are a catch-up: all of them when more
    than one verify step's worth (B + 1) wait, else none (a drafting step after a drafting step projects only the
    previous verify's columns, part of every drafting step's price)."""
    return pending_columns if pending_columns > block_size + 1 else 0


def _nearest(rows: list[int], R: int):
    """The values of the sorted list `rows` by distance to R, ties: the larger first."""
    hi = bisect.bisect_left(rows, R)
    lo = hi - 1
    while lo >= 0 or hi < len(rows):
        if hi < len(rows) and (lo < 0 or rows[hi] - R <= R - rows[lo]):
            yield rows[hi]
            hi += 1
        else:
            yield rows[lo]
            lo -= 1


def _slope(seconds: list[float]) -> float:
    """Seconds per depth between depth 1 and the deepest finite depth of `seconds` (0 with fewer than two)."""
    finite = [L for L in range(1, len(seconds)) if math.isfinite(seconds[L])]
    if len(finite) < 2:
        return 0.0
    return max((seconds[finite[-1]] - seconds[finite[0]]) / (finite[-1] - finite[0]), 0.0)


def _line(cells: dict[int, tuple[float, float]], block_size: int) -> list[float]:
    """Drafter seconds for L = 0..B from the measured depths: least squares c0 + c1 L with c0, c1 >= 0."""
    points = [(L, d) for L, (_, d) in cells.items() if L >= 1]
    if not points:
        return [0.0] * (block_size + 1)
    n = len(points)
    mean_L, mean_d = sum(L for L, _ in points) / n, sum(d for _, d in points) / n
    slope, intercept = mean_d / mean_L, 0.0  # through the origin
    if n >= 2:
        slope = max(sum((L - mean_L) * (d - mean_d) for L, d in points) / sum((L - mean_L) ** 2 for L, _ in points), 0.0)
        intercept = mean_d - slope * mean_L
        if intercept < 0:
            slope, intercept = sum(L * d for L, d in points) / sum(L * L for L, _ in points), 0.0
    return [0.0] + [intercept + slope * L for L in range(1, block_size + 1)]
