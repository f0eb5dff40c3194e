"""benchmarks/bench_grid_params.py: the variants that set module constants of ``dpsql.union.cumulative``.

Those variants (the delta split and the margin's fall) are benchmark code: inside ``module_constants`` the
calibration, the charge's accounting and the rendered rounds must all read the variant's value, and after
it the package must be exactly as before (its caches hold no value computed under the variant).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

_saved_path = list(sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_grid_params as params  # noqa: E402

sys.path[:] = _saved_path

from dpsql.union import cumulative  # noqa: E402

A = (1.0, 1e-5, 100)


def _state():
    c = cumulative.sips_cumulative_parameters(*A)
    text = cumulative.rounds_sql("t", *A, list(cumulative.DEFAULT_SPLIT), 3.0, 2.0, 0.7, "user_id", "item")
    assert "dp__sips_cumulative_rounds(" in text
    return c, text


def test_every_constant_variant_names_a_constant_of_the_module():
    for label, values in params.CONSTANT_VARIANTS.items():
        for name, value in values.items():
            default = getattr(cumulative, name)
            assert isinstance(default, float) and 0 < value < 1 and value != default, label


@pytest.mark.parametrize("label", sorted(params.CONSTANT_VARIANTS))
def test_a_variant_changes_the_calibration_inside_and_nothing_after(label):
    before, text_before = _state()
    with params.module_constants(params.CONSTANT_VARIANTS[label]):
        inside, text_inside = _state()
    after, text_after = _state()
    assert (after, text_after) == (before, text_before)
    assert inside != before and text_inside != text_before
    # the charge's total is still (epsilon, delta) at most, and the delta split is the variant's
    assert inside.accounting.delta <= A[1] and inside.accounting.epsilon <= A[0]
    values = params.CONSTANT_VARIANTS[label]
    q = values.get("NOVEL_SHARE", cumulative.NOVEL_SHARE)
    last = values.get("LAST_NOVEL_SHARE", cumulative.LAST_NOVEL_SHARE)
    with params.module_constants(values):
        rounds = cumulative.sips_cumulative_calibration(*A)
    assert math.isclose(math.fsum(r.delta_novel for r in rounds), q * A[1], rel_tol=1e-12)
    assert math.isclose(rounds[-1].delta_novel, last * q * A[1], rel_tol=1e-12)


def test_the_margin_fall_moves_only_the_drop_bounds():
    with params.module_constants({"_MARGIN_FALL": 0.9}):
        steep = cumulative.sips_cumulative_parameters(*A)
    c = cumulative.sips_cumulative_parameters(*A)
    assert (steep.rho, steep.sigma, steep.share) == (c.rho, c.sigma, c.share)
    # round 1 (k = 0) drops at the full margin under any fall; later rounds drop nearer the threshold
    assert steep.drop_below[0] == c.drop_below[0]
    assert all(s > d for s, d in zip(steep.drop_below[1:-1], c.drop_below[1:-1]))


def test_a_larger_novel_share_leaves_the_gaussian_rounds_less_delta_and_more_noise():
    c = cumulative.sips_cumulative_parameters(*A)
    with params.module_constants({"NOVEL_SHARE": 0.8}):
        more = cumulative.sips_cumulative_parameters(*A)
    with params.module_constants({"NOVEL_SHARE": 0.2}):
        less = cumulative.sips_cumulative_parameters(*A)
    # less delta for the Gaussian rounds: more noise per round
    assert more.sigma[0] > c.sigma[0] > less.sigma[0]


def test_released_runs_a_constant_variant_under_its_constants_only():
    seen = []

    def fake(con, label, epsilon, delta, max_items):
        seen.append((label, cumulative.NOVEL_SHARE, cumulative.sips_cumulative_parameters(*A).rho[-1]))
        return 0

    run = params._released_with_constants(fake)
    run(None, "novel_0.8", *A)
    run(None, "default", *A)
    assert seen[0][:2] == ("novel_0.8", 0.8) and seen[1][:2] == ("default", cumulative.NOVEL_SHARE)
    assert seen[0][2] != seen[1][2]
