"""Scheduler core against plain-Python brute force, non-anticipation, policies and bad input."""

import copy
import math
import random

import numpy as np
import pytest
import torch
import transformers

from hf_dspark.scheduler import (
    SKIP_RECHECK,
    _rates,
    AdaptiveVerification,
    ConfidenceThreshold,
    FixedLength,
    FullBlock,
    algorithm1,
    allocate,
    budget,
    geometric_survival,
    prior_survival,
    scheduler_overhead_ms,
    survival_from_confidence,
    best_depth,
    static_batch_seconds,
)
from hf_dspark.testing import FixedStepCosts
from hf_dspark.step_table import StepTimeTable


@pytest.fixture(autouse=True)
def fresh_warning_once():
    transformers.utils.logging.warning_once.cache_clear()


def random_table(rng: random.Random) -> StepTimeTable:
    """A random staircase over small N; sometimes max_batch_tokens cuts into the range the cases reach."""
    tokens = sorted(rng.sample(range(1, 20), rng.randint(2, 6)))
    latency, sps = 1.0, []
    for _ in tokens:
        latency *= rng.choice([1.0, 1.0, 1.05, 1.3, 2.0])  # plateaus and steps
        sps.append(1.0 / latency)
    if min(sps) >= 0.99 * max(sps):
        sps[-1] = 0.5 * sps[0]
    return StepTimeTable(tokens, sps, max_batch_tokens=rng.choice([tokens[-1], tokens[-1] + 8, rng.randint(1, 12)]))


def random_survival(rng: random.Random, R: int, B: int) -> torch.Tensor:
    """[R, B] non-increasing rows of multiples of 1/64 (exact sums, frequent ties)."""
    rows = [sorted((rng.randint(0, 64) / 64 for _ in range(B)), reverse=True) for _ in range(R)]
    return torch.tensor(rows, dtype=torch.float64).reshape(R, B)


def sorted_slots(survival):
    """All (survival, position, request) slots in the scheduler's order."""
    R, B = survival.shape
    slots = [(survival[r][k].item(), k, r) for r in range(R) for k in range(B)]
    return sorted(slots, key=lambda s: (-s[0], s[1], s[2]))


def algorithm1_loop(survival, table):
    """Algorithm 1, one admission at a time. Returns (lengths, admitted slot set)."""
    R = survival.shape[0]
    lengths, admitted, total, n = [0] * R, set(), 0.0, 0
    theta = R * table.steps_per_sec(R)
    for a, k, r in sorted_slots(survival):
        if R + n + 1 > table.max_batch_tokens:
            break
        new_theta = (R + (total + a)) * table.steps_per_sec(R + n + 1)
        if new_theta < theta:
            break
        theta, total, n = new_theta, total + a, n + 1
        lengths[r] += 1
        admitted.add((r, k))
    return lengths, admitted


def budget_loop(stale, table, R):
    R_stale, B = stale.shape
    values = sorted(stale.reshape(-1).tolist(), reverse=True)
    values = [values[-(-j * R_stale // R) - 1] for j in range(1, R * B + 1)]  # rank-quantile resample to R rows
    best_k, best = 0, None
    for K in range(0, min(R * B, max(0, table.max_batch_tokens - R)) + 1):
        theta = (R + sum(values[:K])) * table.steps_per_sec(R + K)
        if best is None or theta > best:
            best_k, best = K, theta
    return best_k


def best_depth_loop(stale, seconds, R, usable=None):
    """argmax over L of (R + sum over k < L of mean stale survival at k x requests with more than k usable drafts)
    / seconds[L], smallest L on ties."""
    R_stale, B = stale.shape
    usable = [B] * R if usable is None else usable
    mean = [sum(stale[r][k].item() for r in range(R_stale)) / R_stale for k in range(B)]
    best_l, best = 0, None
    for L in range(B + 1):
        tokens = R + sum(mean[k] for u in usable for k in range(min(L, u)))
        rate = tokens / seconds[L]
        if best is None or rate > best:
            best_l, best = L, rate
    return best_l


def allocate_loop(survival, K):
    lengths = [0] * survival.shape[0]
    for _, _, r in sorted_slots(survival)[:K]:
        lengths[r] += 1
    return lengths


def test_algorithm1_matches_one_at_a_time_admission_and_admits_prefixes():
    rng = random.Random(0)
    for _ in range(600):
        R, B = rng.randint(1, 3), rng.randint(1, 4)
        survival, table = random_survival(rng, R, B), random_table(rng)
        expected, admitted = algorithm1_loop(survival, table)
        assert algorithm1(survival, table).tolist() == expected
        assert admitted == {(r, k) for r in range(R) for k in range(expected[r])}


def test_algorithm1_stops_at_first_decrease_not_at_global_maximum():
    # SPS halves at N = 2 (Theta drops) and is flat afterwards, so admitting everything would pay off later.
    table = StepTimeTable([1, 2], [2.0, 1.0], max_batch_tokens=64)
    survival = torch.full((1, 7), 0.99)
    assert algorithm1(survival, table).tolist() == [0]
    assert budget(survival, table) == 7


def test_budget_matches_brute_force_argmax():
    rng = random.Random(1)
    for _ in range(400):
        R_stale, B = rng.randint(1, 3), rng.randint(1, 4)
        stale, table = random_survival(rng, R_stale, B), random_table(rng)
        R = rng.choice([R_stale, rng.randint(1, 4)])
        assert budget(stale, table, R) == budget_loop(stale, table, R)


def test_budget_for_a_grown_batch_reads_stale_survival_as_a_distribution():
    rng = random.Random(2)
    for _ in range(100):
        stale, table = random_survival(rng, 2, 3), random_table(rng)
        assert budget(stale, table, num_requests=4) == budget(torch.cat([stale, stale]), table)


def test_best_depth_matches_brute_force():
    rng = random.Random(11)
    depths = set()
    for _ in range(400):
        R_stale, B = rng.randint(1, 3), rng.randint(1, 4)
        stale = random_survival(rng, R_stale, B)
        R = rng.choice([R_stale, rng.randint(1, 4)])
        seconds = [rng.choice([0.5, 1.0, 1.2, 2.0, 4.0, float("inf")]) for _ in range(B + 1)]
        seconds[0] = rng.choice([0.5, 1.0])
        got = best_depth(stale, torch.tensor(seconds), R)
        assert got == best_depth_loop(stale, seconds, R)
        depths.add(got)
        usable = [rng.randint(0, B) for _ in range(R)]
        assert best_depth(stale, torch.tensor(seconds), R, torch.tensor(usable)) == best_depth_loop(stale, seconds, R, usable)
    assert depths >= {0, 1, 2, 3}


def test_best_depth_values_only_the_drafts_a_request_can_still_emit():
    good = torch.full((4, 7), 0.9).cumprod(1)
    linear = torch.tensor([1.0] + [1.2 + 0.1 * L for L in range(1, 8)])
    assert best_depth(good, linear, 4) == 7
    assert best_depth(good, linear, 4, usable=torch.tensor([2, 2, 2, 2])) == 2  # deeper drafts cannot commit
    assert best_depth(good, linear, 4, usable=torch.tensor([0, 0, 0, 0])) == 0  # every request ends this step
    half, flat = torch.full((4, 7), 0.5).cumprod(1), torch.tensor([1.0] + [1.5] * 7)  # drafting: 1.5 plain steps
    assert best_depth(half, flat, 4) == 7  # (4 + 4 x 0.99) / 1.5 > 4
    assert best_depth(half, flat, usable=torch.tensor([7, 7, 0, 0])) == 0  # (4 + 2 x 0.99) / 1.5 < 4
    with pytest.raises(ValueError, match="one entry per request"):
        best_depth(good, linear, 3, usable=torch.tensor([1, 1]))


def test_best_depth_prices_the_whole_step():
    good = torch.full((2, 7), 0.9).cumprod(1)
    linear = torch.tensor([1.0] + [1.2 + 0.1 * L for L in range(1, 8)])  # drafting costs 0.2 + 0.1 per depth
    assert best_depth(good, linear) == 7  # good drafts: deep blocks pay
    assert best_depth(good, torch.tensor([1.0] + [10.0] * 7)) == 0  # a drafter 9x a plain step does not
    assert best_depth(torch.zeros(2, 7), linear) == 0  # nothing survives: plain is as good and cheaper
    assert best_depth(torch.full((2, 7), 0.5).cumprod(1), linear) == 2  # (2 + 1.5) / 1.4 beats L = 1 and L = 3
    assert best_depth(good, torch.tensor([1.0, 1.3, 1.4] + [math.inf] * 5)) == 2  # beyond max_batch_tokens: inf
    with pytest.raises(ValueError, match="B \\+ 1"):
        best_depth(good, torch.ones(7))
    with pytest.raises(ValueError, match="positive"):
        best_depth(good, torch.tensor([1.0, 0.0] + [1.0] * 6))


def test_adaptive_skips_drafting_when_it_does_not_pay_and_probes_with_backoff():
    table = StepTimeTable([1, 8], [10.0, 9.0], max_batch_tokens=64)
    costs = FixedStepCosts([0.1] + [0.15 + 0.01 * L for L in range(1, 8)])  # a drafter half a plain step
    # a probe's extra 0.06 s may take 31% of the skipped steps' time: after 2 plain steps (0.2 s) it may run
    policy = AdaptiveVerification(table, probe_every=2, max_probe_every=8, costs=costs, probe_budget=0.31)
    weak = torch.full((1, 7), -6.0)  # survival ~0.0025

    def run(policy, steps):
        pattern = []
        for _ in range(steps):
            depth = policy.draft_depth(1, 7)
            pattern.append(depth)
            if depth:
                policy.lengths(weak[:, :depth], depth)
            policy.observe_step(1, depth, float(costs.seconds(1, 7)[depth]), 0.0)
        return pattern

    assert policy.draft_depth(1, 7) == 7  # no survival yet: warm-up with the full block
    policy.lengths(weak, 7)
    # skip 2, probe, skip 4, probe, skip 8, probe, skip 8, ...; probes draft the best positive depth only
    assert run(policy, 30)[:18] == [0, 0, 1, 0, 0, 0, 0, 1] + [0] * 8 + [1, 0]
    # the default budget (1%): a probe costing 0.6 plain steps waits for 60 plain steps (61: 60 x 0.1 s rounds
    # below 6 s), whatever probe_every says, and a clear skip is re-priced every SKIP_RECHECK = 8 steps, so it runs
    # at the 67th; each probe that finds nothing halves the budget, down to an eighth: 121 (on the 8-step grid:
    # 125), 241, then 481 skipped steps per probe
    frugal = AdaptiveVerification(table, probe_every=2, max_probe_every=8, costs=costs)
    frugal.draft_depth(1, 7)
    frugal.lengths(weak, 7)
    pattern = run(frugal, 2000)
    probes = [i for i, depth in enumerate(pattern) if depth]
    assert set(pattern) == {0, 1}
    assert [b - a for a, b in zip([-1] + probes, probes)] == [67, 125, 241, 481, 481, 481]
    strong = torch.full((1, 1), 8.0)
    policy.lengths(strong, 1)  # a probe that finds drafting worthwhile again (deeper slots extrapolated)
    assert [policy.draft_depth(1, 7) for _ in range(3)] == [7, 7, 7]
    policy.lengths(weak, 7)
    policy.reset()  # a new generate call starts over: warm-up drafts again
    assert policy.draft_depth(1, 7) == 7
    carried = AdaptiveVerification(table, carry_over=True, costs=costs)
    carried.draft_depth(1, 7)
    carried.lengths(weak, 7)
    carried.reset()  # ...unless the scheduler carries its measurements over (as the loop's default one does)
    assert carried.draft_depth(1, 7) == 0
    with pytest.raises(ValueError, match="probe_every"):
        AdaptiveVerification(table, probe_every=0)


def test_a_new_call_starts_from_the_prior_not_from_the_last_calls_tail():
    """With a prior, a carried-over scheduler does not let the last drafted step of one text (a tail that drafted
    badly) make the next call skip; what verification found (rho) is carried and scales the prior."""
    table = StepTimeTable([1, 8], [10.0, 9.0], max_batch_tokens=64)
    costs = FixedStepCosts([0.1] + [0.1 + 0.02 * L for L in range(1, 8)])
    weak, confident = torch.full((1, 7), -8.0), torch.full((1, 7), 4.0)
    policy = AdaptiveVerification(table, costs=costs, carry_over=True, prior_survival=geometric_survival(3.0, 7))
    depth = policy.draft_depth(1, 7)
    assert depth > 0  # the prior (held-out tau 3) says drafting pays
    policy.lengths(weak[:, :depth], depth)  # the call ends on drafts that will not survive...
    policy.observe_step(1, depth, 0.2, 0.02, accepted=torch.zeros(1, dtype=torch.int64))  # ...as predicted: rho ~ 1
    assert policy.draft_depth(1, 7) == 0  # the rest of this call skips
    policy.reset()
    assert policy.draft_depth(1, 7) == depth  # the next text starts from the prior again
    policy.lengths(confident[:, :depth], depth)
    for _ in range(4):  # drafts the head was sure of and verification rejected: rho ~ 0.04
        policy.observe_step(1, depth, 0.2, 0.02, accepted=torch.zeros(1, dtype=torch.int64))
    assert policy.acceptance_ratio < 0.1
    policy.reset()
    assert policy.draft_depth(1, 7) == 0  # carried: the prior scaled by rho says skip


def test_a_clear_skip_stands_for_a_few_steps_and_a_close_one_is_repriced_every_step():
    """Between drafted steps only the prices move: a skip that drafting misses by more than 10% is re-priced every
    SKIP_RECHECK steps (cheap plain steps), a closer one every step; either way drafting resumes once it pays."""
    table = StepTimeTable([1, 8], [10.0, 9.0], max_batch_tokens=64)
    sure = torch.full((1, 7), 8.0)  # survival ~1: depth L commits L + 1 tokens

    def steps_until_drafting(draft_seconds):
        seconds = [0.1] + [draft_seconds] * 7
        policy = AdaptiveVerification(table, costs=FixedStepCosts(lambda _: seconds), probe_budget=0.0)  # no probes
        assert policy.draft_depth(1, 7) == 7  # warm-up
        policy.lengths(sure, 7)
        depths = []
        for step in range(40):
            if step == 14:
                seconds[1:] = [0.2] * 7  # drafting becomes 4x better than plain decoding
            depths.append(policy.draft_depth(1, 7))
            policy.observe_step(1, depths[-1], seconds[depths[-1]], 0.0)
            if depths[-1]:
                return depths
        return depths

    clear = steps_until_drafting(10.0)  # drafting's best rate: 8 tokens / 10 s = 0.08x plain decoding's
    assert clear[:-1] == [0] * (len(clear) - 1) and clear[-1] == 7 and 15 < len(clear) <= 14 + SKIP_RECHECK
    close = steps_until_drafting(0.85)  # 8 / 0.85 s: 0.94x plain decoding's, within SKIP_MARGIN
    assert close == [0] * 14 + [7]


def test_a_probe_pays_for_the_context_it_catches_up_on():
    """A probe after many plain steps first projects the context columns they left; its budget covers that
    catch-up too (priced per request-column from earlier catch-ups), and the drafting step's price does not."""
    table = StepTimeTable([1, 8], [10.0, 9.0], max_batch_tokens=64)
    costs = FixedStepCosts([0.1] + [0.15 + 0.01 * L for L in range(1, 8)])  # a probe's extra: 0.06 s
    weak = torch.full((1, 7), -6.0)

    def first_probe(pending_columns):
        policy = AdaptiveVerification(table, probe_every=2, max_probe_every=8, costs=costs)
        policy.draft_depth(1, 7)
        policy.lengths(weak, 7)
        for step in range(1000):
            depth = policy.draft_depth(1, 7, pending_columns=pending_columns)
            policy.observe_step(1, depth, float(costs.seconds(1, 7)[depth]), 0.0)
            if depth:
                return step

    costs.observe_catch_up(600, 0.06)  # 0.1 ms per request-column
    assert first_probe(8) == 66  # one verify step's columns (<= B + 1) are part of any drafting step's price
    assert 121 <= first_probe(600) <= 128  # 0.06 s of catch-up doubles the probe's cost: twice the skipped time

    policy = AdaptiveVerification(table)
    policy.draft_depth(1, 7)
    policy.lengths(weak, 7)
    policy.observe_step(1, 7, 0.5, 0.35, accepted=torch.tensor([0]), catch_up=(100, 0.3))
    assert policy.costs.seconds_list(1, 7)[7] == pytest.approx(0.2)  # verify 0.15 + drafter 0.05
    assert policy.costs.catch_up_seconds(100) == pytest.approx(0.3)


def test_a_plain_price_borrowed_from_a_far_batch_size_is_measured_before_a_close_call():
    """Batch 32 has just run plain steps (and a one-request tail); batch 64's plain price is only scaled from them.
    On a close call the first batch-64 step runs plain, so drafting is judged against a price measured there."""
    table = StepTimeTable([32, 64, 128], [10.0, 5.0, 2.5], max_batch_tokens=512)
    policy = AdaptiveVerification(table, prior_survival=torch.full((7,), 0.19))
    for _ in range(20):
        policy.observe_step(32, 0, 0.1, 0.0)
    policy.observe_step(32, 1, 0.16, 0.02)  # a drafting step: its drafter line prices the deeper depths
    policy.observe_step(1, 0, 0.03, 0.0)
    assert policy.costs.age(0) == 0 and policy.costs.age(0, 64) == math.inf and policy.costs.age(0, 32) == 2
    rates = _rates(policy._decision_survival(7), policy.costs.seconds_list(64, 7), 64, None)
    assert 1.0 < max(rates) / rates[0] < 1.25  # depth 7 looks 10% better than plain decoding: a close call
    assert policy.draft_depth(64, 7) == 0  # ... against a price borrowed from batch 32: measure it
    policy.observe_step(64, 0, 0.2, 0.0)
    assert policy.costs.age(0, 64) == 0


def test_a_close_call_against_a_stale_plain_price_measures_plain_again():
    """The machine speeds up from 1.2x to 1x while the scheduler drafts: the plain price it learned while slow makes
    drafting look 16% better when it is 3% worse. A plain step measured again (after ~28 drafted steps at a 0.5%
    budget) shows it, and the scheduler stops drafting; without re-measuring it drafts on."""
    table = StepTimeTable([1, 2], [1.0, 1.0 / 1.2], max_batch_tokens=64)
    z = torch.full((1, 1), math.log(0.45 / 0.55))  # survival 0.45: 1.45 tokens per drafting step
    plain_s, draft_s, verify_s = 1.0, 0.3, 1.2  # at speed 1: drafting costs 1.5 plain steps for 1.45x the tokens

    def run(policy, steps):
        for _ in range(9):
            policy.observe_step(1, 0, 1.2 * plain_s, 0.0)  # measured while the machine was slow
        for _ in range(9):
            policy.observe_step(1, 1, verify_s + draft_s, draft_s)  # then fast, drafting
        policy.lengths(z, 1)
        depths = []
        for _ in range(steps):  # the machine stays fast
            depth = policy.draft_depth(1, 1)
            if depth:
                policy.lengths(z, 1)
            policy.observe_step(1, depth, verify_s + draft_s if depth else plain_s, draft_s if depth else 0.0)
            depths.append(depth)
        return depths

    kept = run(AdaptiveVerification(table, remeasure_budget=0.0), 60)
    assert kept == [1] * 60
    fresh = run(AdaptiveVerification(table), 60)
    first_plain = fresh.index(0)
    assert 9 + first_plain == 28  # 1 - 1 / 1.16 = 0.14 <= 0.005 x steps since the plain price (9 before the loop)
    assert fresh[first_plain:first_plain + 20] == [0] * 20  # from then on the scheduler skips (probes come later)
    with pytest.raises(ValueError, match="remeasure"):
        AdaptiveVerification(table, remeasure_budget=-1)


def test_adaptive_corrects_an_overconfident_head_with_what_verification_accepted():
    table = StepTimeTable([1, 8], [10.0, 9.0], max_batch_tokens=64)
    costs = FixedStepCosts([0.1] + [0.1 + 0.02 * L for L in range(1, 8)])
    confident = torch.full((4, 7), 4.0)  # c = 0.98: worth drafting the full block at these costs
    policy = AdaptiveVerification(table, costs=costs)
    assert policy.draft_depth(4, 7) == 7 and policy.acceptance_ratio == 1.0
    policy.lengths(confident, 7)
    assert policy.draft_depth(4, 7) == 7  # believed, until verification says otherwise
    policy.lengths(confident, 7)  # this step's drafts: ~26 accepted drafts predicted...
    policy.observe_step(4, 7, 0.3, 0.1, accepted=torch.zeros(4, dtype=torch.int64))  # ...none accepted
    predicted = 4 * float((torch.sigmoid(torch.tensor(4.0)) ** torch.arange(1, 8)).sum())
    assert policy.acceptance_ratio == pytest.approx(1 / (1 + predicted), rel=1e-5)
    assert policy.draft_depth(4, 7) == 0  # now it skips the drafter
    assert "acceptance_ratio=0.0" in repr(policy)
    # a calibrated head keeps rho near 1; slots a request cannot emit (usable) are not counted as predicted
    calibrated = AdaptiveVerification(table, costs=costs)
    usable = torch.tensor([7, 7, 2, 0])
    calibrated.draft_depth(4, 7, usable=usable)
    calibrated.lengths(torch.full((4, 7), 20.0), 7)  # survival 1 everywhere: 7 + 7 + 2 + 0 verified slots count
    calibrated.observe_step(4, 7, 0.3, 0.1, accepted=torch.tensor([7, 7, 2, 0]))
    assert calibrated.acceptance_ratio == pytest.approx(1.0)
    calibrated.reset()  # a fresh call forgets it (carry_over=False)
    assert calibrated.acceptance_ratio == 1.0
    with pytest.raises(ValueError, match="acceptance_window"):
        AdaptiveVerification(table, acceptance_window=-1)


def test_allocate_matches_brute_force_top_k_with_position_tie_break():
    rng = random.Random(3)
    for _ in range(400):
        R, B = rng.randint(1, 3), rng.randint(1, 4)
        survival = random_survival(rng, R, B)
        K = rng.randint(0, R * B + 2)
        lengths = allocate(survival, K)
        assert lengths.tolist() == allocate_loop(survival, K)
        assert lengths.dtype == torch.int64 and int(lengths.sum()) == min(K, R * B)


def test_allocate_breaks_ties_by_position_then_request():
    survival = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    assert allocate(survival, 3).tolist() == [2, 1]  # (0,0), (1,0), (0,1)


def test_scheduler_never_plans_beyond_max_batch_tokens():
    table = StepTimeTable([1, 64], [100.0, 90.0], max_batch_tokens=10)
    survival = torch.ones(4, 7)
    assert int(algorithm1(survival, table).sum()) == 6
    assert budget(survival, table) == 6
    assert algorithm1(torch.ones(12, 7), table).tolist() == [0] * 12


# -- non-anticipation --------------------------------------------------------------------------------------------


def anticipation_violations(rule, conf_logits, rng, trials=200):
    """How often changing draft x_k (which moves only c_{k+1..}) flips whether slot k is verified.

    rule: conf_logits [R, B] -> lengths [R]; it is called on the original and a perturbed copy.
    """
    R, B = conf_logits.shape
    base = rule(conf_logits)
    violations = 0
    for _ in range(trials):
        r, k = rng.randrange(R), rng.randrange(B - 1)
        changed = conf_logits.clone()
        changed[r, k + 1 :] = torch.randn(B - k - 1) * 3
        violations += bool(base[r] > k) != bool(rule(changed)[r] > k)
    return violations


def staircase_table():
    tokens = [1, 2, 4, 8, 12, 16, 24, 32]
    return StepTimeTable(tokens, [1.0 / (1 + 0.15 * (-(-n // 4))) for n in tokens], max_batch_tokens=32)


def adaptive_rule(table, history):
    """AdaptiveVerification with a fixed history: every call starts from the same state (verifies its depth)."""
    policy = AdaptiveVerification(table)
    for z in history:
        policy.draft_depth(z.shape[0], z.shape[1])
        policy.lengths(z, z.shape[1])

    def rule(z):
        p = copy.deepcopy(policy)
        depth = p.draft_depth(z.shape[0], z.shape[1])
        lengths = p.lengths(z[:, :depth], depth) if depth else torch.zeros(z.shape[0], dtype=torch.int64)
        return lengths

    return rule


def test_threshold_adaptive_and_algorithm1_are_non_anticipating():
    rng, gen, table = random.Random(4), torch.Generator().manual_seed(4), staircase_table()
    for _ in range(5):
        z = torch.randn(3, 6, generator=gen) * 2 + 1.5
        history = [torch.randn(rng.randint(1, 4), 6, generator=gen) * 2 + 1.5 for _ in range(2)]
        rules = {
            "threshold": lambda z: ConfidenceThreshold(0.6).lengths(z, z.shape[1]),
            "adaptive": adaptive_rule(table, history),
            "algorithm1": lambda z: algorithm1(survival_from_confidence(z), table),
        }
        for name, rule in rules.items():
            assert anticipation_violations(rule, z, rng) == 0, name


def test_the_check_catches_anticipating_rules():
    rng, gen, table = random.Random(5), torch.Generator().manual_seed(5), staircase_table()

    def lookahead_threshold(z):  # decides slot k with c_{k+1}
        keep = torch.sigmoid(z[:, 1:]) >= 0.6
        return torch.cat([keep, keep[:, -1:]], 1).long().cumprod(1).sum(1)

    def same_step_argmax(z):  # budget from the current step's own survival (paper App. A)
        survival = survival_from_confidence(z)
        return allocate(survival, budget(survival, table))

    for rule in (lookahead_threshold, same_step_argmax):
        found = sum(anticipation_violations(rule, torch.randn(3, 6, generator=gen) * 2 + 1.5, rng) for _ in range(5))
        assert found > 0, rule.__name__


# -- policies ----------------------------------------------------------------------------------------------------


def test_static_policies():
    z = torch.tensor([[3.0, 3.0, -3.0, 3.0], [-3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]])
    assert FullBlock().lengths(z, 4).tolist() == [4, 4, 4]
    assert FullBlock(max_len=2).lengths(None, 4, num_requests=2).tolist() == [2, 2]
    assert FixedLength(6).lengths(z, 4).tolist() == [4, 4, 4]
    assert FixedLength(0).lengths(z, 4).tolist() == [0, 0, 0]
    assert ConfidenceThreshold(0.5).lengths(z, 4).tolist() == [2, 0, 4]
    # temperature 10 at position 0 pulls sigmoid(3 / 10) = 0.57 under 0.9
    assert ConfidenceThreshold(0.9, temperatures=[10.0, 1.0, 1.0, 1.0]).lengths(z, 4).tolist() == [0, 0, 0]


def test_adaptive_warms_up_with_the_full_block_then_drafts_the_best_depth_of_the_latest_survival():
    table, gen = staircase_table(), torch.Generator().manual_seed(6)
    seconds = [1.0] + [1.3 + 0.1 * L for L in range(1, 6)]
    policy = AdaptiveVerification(table, costs=FixedStepCosts(seconds), remeasure_margin=0)  # the per-step rule alone
    for _ in range(2):  # reset() forgets the survival
        policy.reset()
        last = None
        for R in (3, 3, 2, 4, 1):
            depth = policy.draft_depth(R, 5)
            if last is None:
                assert depth == 5
            else:
                assert depth == best_depth(last, torch.tensor(seconds), R)
            z = torch.randn(R, 5, generator=gen) * 2 + 1
            if depth:
                assert policy.lengths(z[:, :depth], depth).tolist() == [depth] * R  # padded batch: all verify L
                c = torch.sigmoid(z[:, :depth])
                last = torch.cat([c, c[:, -1:].expand(-1, 5 - depth)], 1).cumprod(1)  # extended past L


def test_adaptive_prices_with_the_curve_for_the_batch_size():
    curves = {
        "1": {"sample_batch_tokens": [1, 2, 8], "sample_steps_per_sec": [10.0, 10.0, 1.0]},
        "4": {"sample_batch_tokens": [4, 5, 40], "sample_steps_per_sec": [10.0, 1.0, 1.0]},
    }
    table = StepTimeTable(**curves["1"], max_batch_tokens=40, metadata={"curves": curves})
    assert table.for_num_requests(7).sample_batch_tokens == [4, 5, 40]
    policy = AdaptiveVerification(table)
    z = torch.full((4, 3), 5.0)
    policy.draft_depth(4, 3)
    policy.lengths(z, 3)
    assert policy.draft_depth(4, 3) == 0  # R = 4 curve: a second column costs 10x
    assert policy.draft_depth(1, 3) == 3  # R = 1 curve: up to 7 tokens cost the same


def test_confidence_policies_fall_back_to_full_block_without_confidence_head(caplog):
    table = staircase_table()
    for policy in (ConfidenceThreshold(0.5), AdaptiveVerification(table)):
        assert policy.lengths(None, 7, num_requests=3).tolist() == [7, 7, 7]
    assert "no confidence head" in caplog.text
    with pytest.raises(ValueError, match="num_requests"):
        FullBlock().lengths(None, 7)


def test_policy_rejects_wrong_shapes_and_parameters():
    with pytest.raises(ValueError, match=r"\[R, 7\]"):
        FullBlock().lengths(torch.zeros(2, 5), 7)
    with pytest.raises(ValueError, match="threshold"):
        ConfidenceThreshold(1.5)
    with pytest.raises(ValueError, match="temperatures"):
        ConfidenceThreshold(0.5, temperatures=[1.0, 0.0])
    with pytest.raises(ValueError, match="block size"):
        ConfidenceThreshold(0.5, temperatures=[1.0, 1.0]).lengths(torch.zeros(1, 3), 3)


# -- bad input ---------------------------------------------------------------------------------------------------


def test_zero_requests_give_empty_lengths():
    table, empty = staircase_table(), torch.zeros(0, 5)
    assert algorithm1(empty, table).shape == (0,)
    assert allocate(empty, 3).shape == (0,)
    assert budget(torch.rand(2, 5), table, num_requests=0) == 0
    for policy in (FullBlock(), ConfidenceThreshold(0.5), AdaptiveVerification(table)):
        assert policy.lengths(empty, 5).shape == (0,)
    with pytest.raises(ValueError, match="no rows"):
        budget(empty, table, num_requests=2)


def test_nan_confidence_is_survival_zero_from_there_on(caplog):
    z = torch.tensor([[4.0, float("nan"), 4.0, 4.0], [4.0, 4.0, 4.0, 4.0]])
    survival = survival_from_confidence(z)
    assert survival[0, 1:].tolist() == [0.0, 0.0, 0.0] and bool((survival[1] > 0.9).all())
    assert "NaN" in caplog.text
    assert ConfidenceThreshold(0.5).lengths(z, 4).tolist() == [1, 4]
    assert algorithm1(survival, StepTimeTable([1, 8], [10.0, 9.0], 16)).tolist() == [1, 4]


def test_survival_outside_unit_interval_is_clamped(caplog):
    table = staircase_table()
    bad = torch.tensor([[1.5, 0.9, -0.2]])
    assert algorithm1(bad, table).tolist() == algorithm1(torch.tensor([[1.0, 0.9, 0.0]]), table).tolist()
    assert "outside [0, 1]" in caplog.text


def test_non_monotone_survival_is_repaired_by_running_minimum(caplog):
    rng, table = random.Random(7), staircase_table()
    for _ in range(50):
        raw = torch.tensor([[rng.random() for _ in range(4)] for _ in range(3)])
        fixed = torch.cummin(raw, dim=1).values
        assert algorithm1(raw, table).tolist() == algorithm1(fixed, table).tolist()
        assert allocate(raw, 5).tolist() == allocate(fixed, 5).tolist()
    assert "running minimum" in caplog.text


def test_nan_survival_counts_as_zero():
    survival = torch.tensor([[0.9, float("nan"), 0.8]])
    assert allocate(survival, 3).tolist() == [3]
    assert algorithm1(survival, StepTimeTable([1, 2, 3], [10.0, 9.0, 8.0], 8)).tolist() == [1]


def test_scheduler_overhead_benchmark_runs():
    assert scheduler_overhead_ms(R=8, B=4, steps=5) > 0


def test_geometric_prior_matches_the_drafters_measured_tau():
    for tau in (1.0, 1.108, 2.5, 4.0):
        s = geometric_survival(tau, 7)
        assert float(s.sum()) == pytest.approx(tau - 1, abs=1e-9) and bool((s[1:] <= s[:-1]).all())
    assert geometric_survival(9.0, 7).tolist() == [1.0] * 7  # more than the block can accept: everything survives
    with pytest.raises(ValueError, match="bonus"):
        geometric_survival(0.5, 7)
    assert float(prior_survival({"source": {"tau": 1.108}}, 7).sum()) == pytest.approx(0.108)
    assert prior_survival(None, 7) is None and prior_survival({"temperatures": [1.0] * 7}, 7) is None
    assert prior_survival({"source": {"tau": "n/a"}}, 7) is None


def test_before_any_draft_the_prior_is_the_survival():
    """Before any drafted step the scheduler knows only the drafter's held-out tau: where drafting is cheap a weak
    drafter drafts one token, a strong one the full block; where a draft costs 60% of a plain step the weak one
    starts with plain steps and the probe schedule (forcing a first draft cost ~2 plain steps at batch 64 on a CPU).
    Without a prior the first step drafts the full block."""
    table = StepTimeTable([1, 8], [10.0, 9.0], max_batch_tokens=64)
    cheap = FixedStepCosts([0.1] + [0.1 + 0.002 * L for L in range(1, 8)])
    dear = FixedStepCosts([0.1] + [0.15 + 0.01 * L for L in range(1, 8)])
    first = lambda prior, costs, margin=0.0: AdaptiveVerification(  # noqa: E731
        table, costs=costs, prior_survival=prior, probe_budget=math.inf, remeasure_margin=margin
    ).draft_depth(1, 7)
    weak, strong = geometric_survival(1.108, 7), geometric_survival(6.5, 7)  # weak: the shipped drafter's tau
    assert first(None, dear) == 7
    assert first(weak, cheap) == 1 and first(strong, cheap) == 7 and first(strong, dear) == 7
    assert first(weak, cheap, margin=0.1) == 0  # a 7% gain over a plain price never measured: measure it first
    assert first(geometric_survival(6.5, 4), dear) == 7  # a prior for another block size is ignored
    policy = AdaptiveVerification(table, costs=dear, prior_survival=weak, probe_budget=math.inf)
    depths = []
    for _ in range(5):
        depths.append(policy.draft_depth(1, 7))
        policy.observe_step(1, depths[-1], 0.1, 0.0)
    assert depths == [0, 0, 0, 0, 1]  # skips like a scheduler that measured a weak drafter, then probes


def test_a_call_whose_prior_says_skip_opens_with_one_probe():
    """The prior is a guess about a text not seen yet: where it says skip, a call's first step drafts anyway (the
    best depth >= 1) when that costs at most `opening_budget` of the call's plain time; the rest of the call follows
    what the probe found, and the next call opens again."""
    table = StepTimeTable([1, 8], [10.0, 9.0], max_batch_tokens=64)
    dear = FixedStepCosts([0.1] + [0.15 + 0.01 * L for L in range(1, 8)])  # a depth-1 probe's extra: 0.06 s
    sure, doubtful = torch.full((1, 7), 8.0), torch.full((1, 7), -6.0)
    policy = AdaptiveVerification(table, costs=dear, prior_survival=geometric_survival(1.108, 7), carry_over=True)

    def step(usable, confidence):
        depth = policy.draft_depth(1, 7, usable=[usable])
        if depth:
            policy.lengths(confidence[:, :depth], depth)
        policy.observe_step(1, depth, float(dear.seconds(1, 7)[depth]), 0.0,
                            accepted=torch.full((1,), depth if confidence is sure else 0))
        return depth

    assert step(64, sure) == 1  # 0.06 s <= 2% of 64 plain steps (0.128 s): the prior's skip is probed
    assert step(63, sure) == 7  # this text drafts well: the full block from here on
    policy.reset()
    assert [step(64, doubtful) for _ in range(4)] == [1, 0, 0, 0]  # one probe per call, then what it found
    policy.reset()
    assert step(4, sure) == 0  # a call of 4 tokens: 0.06 s > 2% of 0.4 s
    closed = AdaptiveVerification(table, costs=dear, prior_survival=geometric_survival(1.108, 7), opening_budget=0.0)
    assert closed.draft_depth(1, 7, usable=[64]) == 0
    with pytest.raises(ValueError, match="opening_budget"):
        AdaptiveVerification(table, opening_budget=-1.0)


def _simulated_static_batch_seconds(alpha, left, depth, cost, trials=4000, seed=0):
    """Monte Carlo of a static batch drafting at `depth` every step, each draft accepted with probability alpha, a
    step with R' requests at depth d costing cost(R', d). Returns the mean seconds over `trials` batches twice:
    priced at `depth` every step (what `static_batch_seconds` models), and as the loop runs it (a step drafts at
    most the most tokens any request has left - 1)."""
    rng = np.random.default_rng(seed)
    left = np.tile(np.asarray(left), (trials, 1))  # [trials, R] tokens each request still needs
    modelled, capped = np.zeros(trials), np.zeros(trials)
    while (left > 0).any():
        alive = left > 0
        running, n = alive.any(1), alive.sum(1)  # [trials]
        d = np.maximum(np.minimum(depth, left.max(1) - 1), 0)  # [trials] the step's depth in the loop
        modelled += np.where(running, cost(n, np.full_like(d, depth)), 0.0)
        capped += np.where(running, cost(n, d), 0.0)
        accepted = np.cumprod(rng.random((*left.shape, max(depth, 1))) < alpha, axis=2).sum(2)  # leading successes
        accepted = np.minimum(accepted, d[:, None])
        left = np.where(alive, left - np.minimum(1 + accepted, left), 0)
    return float(modelled.mean()), float(capped.mean())


@pytest.mark.parametrize("left", [[32] * 16, [32] * 4 + [25] * 4 + [12] * 8, [6] * 4, [400] * 8])
def test_static_batch_seconds_matches_simulation(left):
    """The expected time to finish a static batch at every depth (renewal moments, inverse-Gaussian maximum) is
    within 3% of a simulation with the same survival and costs; the loop's cap on the last steps only makes the
    real batch cheaper (the model's bias is towards shallower depths)."""
    alpha, B = 0.8, 7
    survival = (alpha ** torch.arange(1, B + 1, dtype=torch.float64))[None]

    def cost(r, d):  # a CPU-like step: fixed part, per verify token, drafter pass growing with the depth
        return 0.3 + 0.004 * r * (d + 1) + np.where(d > 0, 0.05 + 0.05 * d, 0.0)

    R = len(left)
    full = torch.tensor([float(cost(R, np.int64(L))) for L in range(B + 1)], dtype=torch.float64)
    one = torch.tensor([float(cost(1, np.int64(L))) for L in range(B + 1)], dtype=torch.float64)
    predicted = static_batch_seconds(survival, full, one, torch.tensor(left) - 1)
    for L in range(B + 1):
        modelled, capped = _simulated_static_batch_seconds(alpha, left, L, cost, trials=4000 if max(left) < 100 else 500)
        assert float(predicted[L]) == pytest.approx(modelled, rel=0.03), (L, predicted.tolist())
        assert capped <= modelled


def test_static_batch_drafts_only_when_it_pays_after_the_ragged_finish():
    """16 requests with 32 tokens to go, where a one-request step costs as much as a plain step with 16 (a CPU
    under light load): drafting at depth 3 that wins 10% per step loses it to the ragged finish (the call waits
    for the slowest request), so the scheduler keeps plain steps; a 50% win still drafts. One request has nobody
    to wait for, and a 4000-token budget makes the finish a small share: both draft at the 10% win."""
    survival = (0.8 ** torch.arange(1, 8, dtype=torch.float64))[None]  # [1, 7]
    per_row = 1 + float(survival[0, :3].sum())  # committed tokens per request at depth 3
    table = StepTimeTable([1, 2], [2.0, 1.0], max_batch_tokens=2)

    def policy(gain, static_batch=True, R=16):  # depth 3 (besides plain) commits per_row tokens in per_row / gain plain steps
        costs = FixedStepCosts([1.0, math.inf, math.inf, per_row / gain] + [math.inf] * 4)
        costs.observe(R, 0, 1.0)  # the plain price is fresh at this batch size: no re-measuring
        return AdaptiveVerification(table, costs=costs, prior_survival=survival[0], static_batch=static_batch)

    many, one = torch.full((16,), 31), torch.full((1,), 31)
    assert best_depth(survival, policy(1.1).costs.seconds(16, 7), usable=many) == 3  # the per-step rule drafts
    assert policy(1.1).draft_depth(16, 7, usable=many) == 0
    assert policy(1.5).draft_depth(16, 7, usable=many) == 3
    assert policy(1.1, R=1).draft_depth(1, 7, usable=one) == 3
    assert policy(1.1).draft_depth(16, 7, usable=torch.full((16,), 3999)) == 3
    assert policy(1.1).draft_depth(16, 7) == 3  # no budget known: nothing to price the finish by
    assert policy(1.1, static_batch=False).draft_depth(16, 7, usable=many) == 3  # finished requests get replaced
