"""benchmarks/bench_grid_cut.py: the choice's cut scored from the committed per-pair table.

The script releases nothing: it reads the means the choice benchmark committed to benchmarks/README.md
and recomputes each pair's statistic. These tests check that it reads that table as written, scores a
candidate by the closed-form expectation the choice benchmark uses, and applies the declared rule (the
largest smallest ratio, then the geometric mean, then the smaller D and c).
"""
from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import pytest

_saved_path = list(sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_grid_choice as choice  # noqa: E402
import bench_grid_cut as cut  # noqa: E402

sys.path[:] = _saved_path


def test_the_committed_table_is_read_whole():
    pairs = cut.committed_pairs()
    # 12 tuning points, 24 report grid points with 10^3-10^5 users, two with 10^6, five shared datasets
    assert len(pairs) == 2 * (12 + 24 + 2 + 5)
    assert {x.part for x in pairs} == set(cut.PARTS)
    assert sum(x.part == "tuning" for x in pairs) == 24
    assert sum(x.part == "report (shared)" for x in pairs) == 10
    assert len({x.name for x in pairs}) == len(pairs)
    first = pairs[0]
    assert (first.point, first.setting, first.part) == ("one-s1.0-n1e4", "a", "tuning")
    assert all(x.best > 0 and 0 <= x.share5 <= 1 for x in pairs)


def _pair(setting="a", default=10.0, greedy=20.0, best=20.0, part="tuning", point="p"):
    return cut.Pair(point, setting, part, 0.5, default, greedy, best)


@pytest.mark.parametrize("low,users,c", [(600, 1000, "0.5"), (480, 1000, "0.5"), (790, 1000, "0.8"),
                                         (30, 40, "0.75")])
def test_expectation_is_the_tail_probability_mix(low, users, c):
    x = _pair()
    counts = {"users": users, "5": low, "3": low}
    p, e = cut.expected(x, counts, 5, c)
    f = Fraction(c).denominator * low - Fraction(c).numerator * users
    assert p == pytest.approx(choice.prob_greedy(f, Fraction(c), 1.0 * cut.SHARE), abs=1e-15)
    assert e == pytest.approx(p * x.greedy + (1 - p) * x.default)
    assert 0 < p < 1


def test_far_from_the_cut_the_pick_is_certain():
    x = _pair(default=30.0, greedy=20.0, best=25.0)
    # 10^5 users, 90 % hold at most 5 items: f is far above 0 for c = 1/2, far below for c = 9/10 + ...
    counts = {"users": 100_000, "5": 90_000, "3": 10_000}
    p5, e5 = cut.expected(x, counts, 5, "0.5")
    p3, e3 = cut.expected(x, counts, 3, "0.5")
    assert p5 == pytest.approx(1.0, abs=1e-12) and e5 == pytest.approx(20.0)
    assert p3 == pytest.approx(0.0, abs=1e-12) and e3 == pytest.approx(30.0)


def test_the_rule_takes_the_largest_minimum_then_the_geometric_mean():
    counts = {"one": {"users": 100_000, "3": 100_000, "5": 100_000},   # greedy_update's shape
              "flat": {"users": 100_000, "3": 60_000, "5": 70_000}}    # the default's, between the cuts
    pairs = [_pair(point="one", default=50.0, greedy=90.0, best=90.0),
             _pair(point="flat", default=140.0, greedy=100.0, best=100.0)]
    # c = 0.5: greedy_update on both (ratio 1.0 and 1.0); c >= 0.75 (D = 5): the default on "flat" (1.4)
    chosen = cut.choose(pairs, counts)
    rs = cut.ratios(pairs, counts, lambda s: chosen)
    assert min(rs) == pytest.approx(1.0, abs=1e-9)
    assert math.exp(sum(math.log(r) for r in rs) / 2) == pytest.approx(math.sqrt(1.4), abs=1e-9)
    assert chosen == (3, "0.65")  # the smallest (D, c) separating the two shapes: D = 3, c in (0.6, 1]
    # a shape where greedy_update leads but fewer users hold few items than on "flat": no cut separates
    # them, the default on both would cost "mid" 0.6, so the rule keeps greedy_update everywhere with the
    # smallest D and c
    counts["mid"] = {"users": 100_000, "3": 58_000, "5": 68_000}
    pairs.append(_pair(point="mid", default=60.0, greedy=100.0, best=100.0))
    chosen = cut.choose(pairs, counts)
    assert chosen == (3, "0.5")
    assert cut.ratios(pairs, counts, lambda s: chosen) == pytest.approx([1.0, 1.0, 1.0], abs=1e-9)
