"""StepCosts: the table as the prior, measured cells, interpolation across depths and batch sizes, bad input."""

import math

import pytest
import torch

from hf_dspark.step_costs import StepCosts
from hf_dspark.step_table import StepTimeTable


def linear_table(max_batch_tokens=64):
    """A target forward of 0.01 s + 0.001 s per token (probed at every N, so lookups are exact)."""
    tokens = list(range(1, max_batch_tokens + 1))
    return StepTimeTable(tokens, [1.0 / (0.01 + 0.001 * n) for n in tokens], max_batch_tokens)


def test_without_measurements_the_table_prices_the_padded_batch_and_drafting_is_free():
    costs = StepCosts(linear_table(max_batch_tokens=20))
    got = costs.seconds(4, 7)  # R = 4: depth L costs 4 (L + 1) tokens; 6 columns and more exceed 20 tokens
    expected = [0.01 + 0.001 * 4 * (L + 1) for L in range(5)] + [math.inf] * 3
    assert got.tolist() == pytest.approx(expected)


def test_measured_cells_are_means_of_the_recent_steps():
    costs = StepCosts(linear_table(), window=3, half_life=math.inf)  # equal weights
    costs.observe(4, 2, step_seconds=0.5, draft_seconds=0.1)
    assert costs.measured(4, 2) and not costs.measured(4, 3) and not costs.measured(3, 2)
    assert float(costs.seconds(4, 7)[2]) == pytest.approx(0.5)
    costs.observe(4, 2, step_seconds=0.7, draft_seconds=0.1)
    assert float(costs.seconds(4, 7)[2]) == pytest.approx(0.6)
    costs.observe(4, 2, step_seconds=1.4, draft_seconds=0.1)  # a slow step counts in full
    assert float(costs.seconds(4, 7)[2]) == pytest.approx(0.8667, abs=1e-4)
    for _ in range(3):  # the window forgets: the machine got slower
        costs.observe(4, 2, step_seconds=0.9, draft_seconds=0.2)
    assert float(costs.seconds(4, 7)[2]) == pytest.approx(0.9)
    costs.observe(4, 0, step_seconds=0.2, draft_seconds=0.05)  # a plain step never spends time in the drafter
    assert float(costs.seconds(4, 7)[0]) == pytest.approx(0.2)


def test_a_cell_measured_again_after_a_long_gap_follows_the_new_measurement():
    costs = StepCosts(linear_table(), window=9, half_life=8)
    for _ in range(9):  # plain steps while the machine was slow
        costs.observe(4, 0, step_seconds=0.43)
    assert costs.age(0) == 0 and costs.age(3) == math.inf
    for _ in range(64):  # a run of drafting steps
        costs.observe(4, 3, step_seconds=1.0, draft_seconds=0.3)
    assert costs.age(0) == 64 and costs.age(3) == 0
    costs.observe(4, 0, step_seconds=0.36)  # the machine got faster meanwhile
    # the new measurement weighs 1, the eight old ones left in the window 2^(-age / 8) at ages 65..72
    old = sum(0.5 ** (age / 8) for age in range(65, 73))
    assert float(costs.seconds(4, 7)[0]) == pytest.approx((0.36 + old * 0.43) / (1 + old))
    assert float(costs.seconds(4, 7)[0]) < 0.362  # 99% the new one
    assert costs.age(0) == 0 and costs.age(3) == 1
    with pytest.raises(ValueError, match="half_life"):
        StepCosts(linear_table(), half_life=0)


def test_unmeasured_depths_scale_the_table_and_follow_the_drafter_line():
    table = linear_table()
    costs = StepCosts(table)
    T = lambda n: 0.01 + 0.001 * n  # noqa: E731
    # the loop's verify part is 2x the table; the drafter costs 0.02 + 0.01 L
    for L in (1, 3):
        costs.observe(8, L, step_seconds=2 * T(8 * (L + 1)) + 0.02 + 0.01 * L, draft_seconds=0.02 + 0.01 * L)
    got = costs.seconds(8, 7)
    for L in range(1, 8):
        assert float(got[L]) == pytest.approx(2 * T(8 * (L + 1)) + 0.02 + 0.01 * L)
    assert float(got[0]) == pytest.approx(2 * T(8))


def test_one_measured_depth_makes_drafting_proportional_to_depth():
    costs = StepCosts(linear_table())
    costs.observe(2, 4, step_seconds=0.1, draft_seconds=0.04)
    draft = costs.seconds(2, 7) - StepCosts(linear_table()).seconds(2, 7) * (0.06 / (0.01 + 0.001 * 10))
    assert draft[1:].tolist() == pytest.approx([0.01 * L for L in range(1, 8)])


def test_an_unseen_batch_size_borrows_from_the_nearest_measured_one():
    table = linear_table()
    T = lambda n: 0.01 + 0.001 * n  # noqa: E731
    costs = StepCosts(table)
    costs.observe(8, 2, step_seconds=0.1, draft_seconds=0.03)  # verify 0.07 vs table 0.034
    costs.observe(8, 5, step_seconds=0.5, draft_seconds=0.075)  # verify 0.425 vs table 0.058: a larger ratio
    costs.observe(16, 2, step_seconds=0.3, draft_seconds=0.05)
    costs.observe(16, 1, step_seconds=0.2, draft_seconds=0.02)
    got = costs.seconds(6, 3)  # nearest measured: 8
    assert float(got[2]) == pytest.approx(0.1 * T(18) / T(24))  # the same depth at R = 8, scaled by the table
    ratio8 = 0.07 / T(24)  # depths R = 8 never ran get its smallest ratio (optimistic) and its drafter line
    assert float(got[0]) == pytest.approx(ratio8 * T(6))
    # depth 1 ran only at R = 16 (0.105 s scaled), but depth 2 borrowed from R = 8 is cheaper: a shallower step
    # is never priced above a deeper one
    assert float(got[1]) == pytest.approx(min(0.2 * T(12) / T(32), float(got[2]))) == pytest.approx(float(got[2]))
    assert float(costs.seconds(14, 3)[1]) == pytest.approx(0.2 * T(28) / T(32))  # nearest to depth 1 there: R = 16
    assert float(got[3]) == pytest.approx(ratio8 * T(24) + 0.03 + 0.015)  # drafter line through depths 2 and 5
    assert float(costs.seconds(12, 3)[2]) > float(costs.seconds(11, 3)[2])  # ties go to the larger size
    assert float(costs.seconds(8, 3)[2]) == pytest.approx(0.1)  # measured at R itself: as measured


def test_bad_measurements_are_refused():
    costs = StepCosts(linear_table())
    for args in [(0, 1, 0.1, 0.0), (2, -1, 0.1, 0.0), (2, 1, float("nan"), 0.0), (2, 1, 0.1, -1.0)]:
        with pytest.raises(ValueError):
            costs.observe(*args)
    with pytest.raises(ValueError, match="window"):
        StepCosts(linear_table(), window=0)
    with pytest.raises(ValueError, match="block_size"):
        costs.seconds(2, 0)


def test_a_step_measured_beyond_the_table_is_not_borrowed():
    """The warm-up drafts the full block even where R (B + 1) exceeds max_batch_tokens; that cell has no table time
    to scale by, so a smaller R must not borrow it (it once priced the full block at 0 s: free drafting)."""
    T = lambda n: 0.01 + 0.001 * n  # noqa: E731
    costs = StepCosts(linear_table(max_batch_tokens=64))
    costs.observe(4, 7, step_seconds=0.2, draft_seconds=0.05)  # 32 tokens: inside the table
    costs.observe(9, 7, step_seconds=0.5, draft_seconds=0.1)  # 72 tokens: beyond it
    costs.observe(9, 0, step_seconds=0.03)
    assert math.isinf(float(costs.seconds(12, 7)[7]))  # 96 tokens at depth 7: not allowed
    got = costs.seconds(8, 7)  # 64 tokens: allowed; the nearest R' = 9 lies outside the table there, so R' = 4
    assert float(got[7]) == pytest.approx(0.2 * T(64) / T(32))
    assert bool((got > 0).all())


def test_borrowing_scales_by_the_interpolated_table_not_its_staircase():
    """Probes every 32 tokens: R = 63 at depth 1 is 126 tokens, which the floor lookup puts on the 96-token probe,
    while R' = 64 (128 tokens) sits on its own. Scaling a measured R' = 64 step by the floor ratio priced R = 63 at
    0.76x; the interpolated ratio keeps it where the table says, just under R' = 64's."""
    tokens = list(range(32, 513, 32))
    T = lambda n: 0.01 + 0.001 * n  # noqa: E731
    costs = StepCosts(StepTimeTable(tokens, [1.0 / T(n) for n in tokens], 512))
    costs.observe(64, 1, step_seconds=1.2, draft_seconds=0.1)
    got = float(costs.seconds(63, 7)[1])
    assert got == pytest.approx(1.2 * T(126) / T(128))
    assert 0.98 * 1.2 < got < 1.2


def test_no_depth_is_priced_above_a_deeper_one():
    """A plain step borrowed from a far batch size must not cost more than a drafting step measured nearby."""
    costs = StepCosts(StepTimeTable([32, 64], [3.0, 2.0], max_batch_tokens=512))  # flat below 32 tokens
    costs.observe(32, 0, step_seconds=0.33)
    costs.observe(4, 1, step_seconds=0.2, draft_seconds=0.05)
    got = costs.seconds(6, 7)
    assert float(got[0]) == pytest.approx(float(got[1])) and float(got[1]) < 0.33
    assert bool((got[1:] >= got[:-1]).all())


def test_a_catch_up_is_priced_per_request_column_apart_from_the_steps():
    costs = StepCosts(linear_table())
    assert costs.catch_up_seconds(1000) == 0.0  # none measured yet: optimistic
    costs.observe_catch_up(100, 0.2)  # 2 ms per request-column
    costs.observe_catch_up(200, 0.2)  # 1 ms
    costs.observe_catch_up(0, 1.0)  # nothing projected: says nothing
    assert costs.catch_up_seconds(1000) == pytest.approx(1.5)
    assert costs.catch_up_seconds(0) == 0.0
    assert not costs.measured(1, 1)  # no step cell learns from it


def test_a_size_that_never_drafted_borrows_the_drafter_seconds_of_the_nearest_one_that_did():
    """A one-request tail: its nearest measured size (R = 2) ran only plain steps. Its drafting steps must still
    pay a drafter pass (measured at R = 3), not come out as cheap as the plain step."""
    costs = StepCosts(StepTimeTable([32, 64], [9.0, 8.0], max_batch_tokens=512))  # flat below 32 tokens
    costs.observe(2, 0, step_seconds=0.039)
    costs.observe(3, 6, step_seconds=0.099, draft_seconds=0.018)
    got = costs.seconds(1, 7)
    assert float(got[0]) == pytest.approx(0.039)
    assert float(got[1]) == pytest.approx(0.039 + 0.018 / 6)  # the line through R = 3's one drafting depth
    assert float(got[7]) == pytest.approx(0.039 + 0.018 * 7 / 6)


def test_a_plain_cell_stays_as_measured_and_drafting_depths_follow_one_line():
    """Plain measured at R stays; R's one measured drafting depth sets the line's level, the estimate its slope."""
    costs = StepCosts(StepTimeTable([32, 64], [9.0, 8.0], max_batch_tokens=512))
    costs.observe(1, 0, step_seconds=0.039)
    costs.observe(1, 5, step_seconds=0.075, draft_seconds=0.015)  # verify 0.06: the ratio prices the rest
    got = costs.seconds(1, 7).tolist()
    assert got[5] == pytest.approx(0.075) and got[0] == pytest.approx(0.039)
    slope = 0.015 / 5  # the flat table adds nothing; the drafter line through depth 5 adds 3 ms per depth
    assert got[6] == pytest.approx(0.075 + slope) and got[7] == pytest.approx(0.075 + 2 * slope)
    assert got[1] == pytest.approx(0.075 - 4 * slope)
    assert got == sorted(got)


def test_every_drafting_step_reprices_every_depth():
    """One slow depth-7 step early on must not keep depth 7 dear while depth 5 runs: the line pools R's depths.
    (Per-depth means priced the full block at batch 1 from one stale step, and the scheduler ran at 0.89x of it.)"""
    costs = StepCosts(StepTimeTable([32, 64], [9.0, 8.0], max_batch_tokens=512))  # flat at batch 1, as on a CPU
    costs.observe(1, 7, step_seconds=0.2, draft_seconds=0.02)  # a slow phase
    for _ in range(40):
        costs.observe(1, 5, step_seconds=0.1, draft_seconds=0.01)
    got = costs.seconds(1, 7).tolist()
    assert got[5] == pytest.approx(0.1, rel=0.02) and got[7] < 0.11


def test_the_drafting_line_averages_noise_across_depths():
    """Steps at depths 3 and 7, each +-20% noisy, alternating: the line recovers 0.1 + 0.002 L within a few percent,
    and never prices a deeper depth below a shallower one."""
    costs = StepCosts(linear_table(max_batch_tokens=512))
    gen = torch.Generator().manual_seed(0)
    for i in range(200):
        L = 3 if i % 2 else 7
        costs.observe(1, L, step_seconds=(0.1 + 0.002 * L) * (1 + 0.2 * (2 * float(torch.rand(1, generator=gen)) - 1)))
    got = costs.seconds(1, 7).tolist()
    assert got[1:] == sorted(got[1:])
    assert got[7] == pytest.approx(0.114, rel=0.06) and got[3] == pytest.approx(0.106, rel=0.06)


def test_where_the_table_is_steep_each_measured_depth_keeps_its_own_price():
    """Batch 16: the table prices the full block at ~5 plain steps, a staircase a line in L does not follow, so no
    pooling there (pooled, the scheduler drafted at 0.86x of plain decoding at batch 16 on a 2-core CPU)."""
    costs = StepCosts(linear_table(max_batch_tokens=512))  # T(128) / T(16) = 5.3
    costs.observe(16, 7, step_seconds=0.5, draft_seconds=0.02)
    for _ in range(20):
        costs.observe(16, 2, step_seconds=0.2, draft_seconds=0.01)
    got = costs.seconds(16, 7).tolist()
    assert got[7] == pytest.approx(0.5) and got[2] == pytest.approx(0.2)
