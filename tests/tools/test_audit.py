"""dpsql.tools.audit: Clopper-Pearson bounds, the replica fast path, and audits of correct and broken mechanisms.

The audits run on seeded (NOT private) connections, so they are deterministic; the confidence
levels below are fixed in advance so that a correct mechanism fails with probability <= 1 %
(resp. a broken one passes with small probability by the power computations in the comments).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

import dpsql
from dpsql.union import adaptive
from dpsql.tools import audit
from dpsql.core.validation import DPParameterError
from dpsql.core.errors import DpsqlError


@pytest.mark.parametrize("k,n,alpha", [(0, 10, 0.05), (3, 10, 0.05), (10, 10, 0.05), (1, 1000, 0.01),
                                       (517, 1000, 0.025), (999, 1000, 0.2), (0, 1, 0.5), (1, 1, 0.5)])
def test_clopper_pearson_matches_beta_quantiles(k, n, alpha):
    lower, upper = audit.clopper_pearson(k, n, alpha)
    exact_lower = 0.0 if k == 0 else stats.beta.ppf(alpha, k, n - k + 1)
    exact_upper = 1.0 if k == n else stats.beta.ppf(1 - alpha, k + 1, n - k)
    assert lower == pytest.approx(exact_lower, rel=1e-10, abs=1e-15)
    assert upper == pytest.approx(exact_upper, rel=1e-10, abs=1e-15)
    assert lower <= k / n <= upper


def test_clopper_pearson_zero_successes_closed_form():
    # k = 0: the upper bound solves (1 - p)^n = alpha
    _, upper = audit.clopper_pearson(0, 500, 0.05)
    assert upper == pytest.approx(1 - 0.05 ** (1 / 500), rel=1e-10)


def test_epsilon_lower_bound_formula():
    runs, delta, conf = 10_000, 1e-5, 0.9
    a = (1 - conf) / 2
    hi_low = stats.beta.ppf(a, 900, runs - 900 + 1)
    lo_up = stats.beta.ppf(1 - a, 300 + 1, runs - 300)
    assert audit.epsilon_lower_bound(900, 300, runs, delta, conf) == pytest.approx(
        math.log((hi_low - delta) / lo_up), rel=1e-9)
    # no evidence: the likelier event's lower bound does not exceed delta
    assert audit.epsilon_lower_bound(0, 0, runs, 0.5, conf) == 0.0
    # identical frequencies never give a positive bound
    assert audit.epsilon_lower_bound(5000, 5000, runs, delta, conf) == 0.0


def _seeded(seed: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return dpsql.connect(seed=seed)


def test_replicas_are_independent_trials_with_the_analytic_probability():
    """Stacked copies in one SQL call behave as Bernoulli trials of P[w + N(0, sigma^2) > rho]."""
    cal = dpsql.calibrate("weighted_gaussian", epsilon=1.0, delta=1e-5, max_items=100)
    pairs = audit._single_item_pairs([18, 24], 1)   # two pairs side by side, as in the pilot
    copies = 4000
    con = _seeded(11)
    try:
        runs = audit._run(con, audit.MECHANISMS["weighted_gaussian"], 1.0, 1e-5, pairs, copies)
    finally:
        con.close()
    assert len(runs) == 2
    for n, (c0, c1) in zip((18, 24), runs):
        for counts, w in ((c0, n), (c1, n + 1)):
            p = stats.norm.sf((cal.threshold - w) / cal.scale)
            sd = math.sqrt(p * (1 - p) / copies)
            assert len(counts) == copies and set(np.unique(counts)) <= {0, 1}
            assert abs(counts.mean() - p) <= 4 * sd


@pytest.mark.parametrize("mechanism", ["weighted_gaussian", "weighted_laplace", "greedy_update",
                                       "mad_adaptive", "sbh_histogram", "sips_cumulative",
                                       "sips_cumulative_boost"])
def test_correct_mechanisms_are_not_refuted(mechanism):
    r = audit.audit(mechanism, epsilon=1.0, delta=1e-5, runs=1000, confidence=0.99, seed=5)
    assert r.runs == 1000 and r.claimed_epsilon == 1.0 and r.delta == 1e-5
    assert 0.0 <= r.epsilon_lower_bound <= r.claimed_epsilon
    assert not r.refuted
    assert 0.0 <= r.p_bounds[0] <= r.p_hat[0] <= 1.0 and 0.0 <= r.p_hat[1] <= r.p_bounds[1] <= 1.0


def test_wrong_sigma_is_caught():
    # sigma/4 ~ 0.97 at (1, 1e-5): e.g. 18 vs 19 users give P[release] ~ 0.002 vs ~ 0.033, a bound near 2
    # at 5000 runs and confidence 0.95 (power analysis before the run, not tuned).
    r = audit.audit("broken_sigma", epsilon=1.0, delta=1e-5, runs=5000, confidence=0.95, seed=5)
    assert r.refuted and r.epsilon_lower_bound > 1.0


def test_mad_with_min_instead_of_max_is_caught():
    # r(i) = min{0, .}: the added user shifts three items by ~1.1 sigma each; P[no y released] ~ 0.057
    # vs ~ 5e-4 at 27 users per y (bound ~ 3 at 3000 runs).
    r = audit.audit("broken_mad_min", epsilon=1.0, delta=1e-5, runs=3000, confidence=0.95, seed=5)
    assert r.refuted and r.epsilon_lower_bound > 1.0


def test_broken_variants_leave_the_shipped_macros_alone():
    con = _seeded(3)
    try:
        listing = ("SELECT function_name, macro_definition FROM duckdb_functions() "
                   "WHERE function_type = 'table_macro' AND function_name LIKE 'dp%' "
                   "AND NOT contains(function_name, '_audit_') ORDER BY ALL")
        before = con.sql(listing).fetchall()
        audit._register_broken_mad(con, "mad")
        audit._register_broken_sigma(con, "weighted_gaussian")
        audit._register_unsorted(con, "weighted_gaussian")
        audit._register_private_candidates(con, "max_coverage")
        con.execute("CREATE TABLE t AS SELECT (i // 3)::BIGINT AS user_id, (i % 5)::BIGINT AS item FROM range(60) r(i)")
        shipped = con.sql("SELECT * FROM dp__mad_weights('t', 28.0, max_adaptive_degree := 4) ORDER BY item").fetchall()
        after = con.sql(listing).fetchall()
        added = con.sql("SELECT count(*) FROM duckdb_functions() WHERE contains(function_name, '_audit_')").fetchall()
    finally:
        con.close()
    assert len(before) > 10 and before == after
    # dp__audit_min_mad_stage, dp__audit_min_mad_weights, and four releases, each a generated wrapper and
    # its body (dp__audit_x, dp__body__audit_x): broken_sigma, min_mad, unsorted, private_candidates
    assert added[0][0] == 10
    # the shipped stage still truncates with r = max{0, .}: no item weight below its initial user weights
    # minus the truncation (w_reroute >= 0)
    assert all(row[4] >= 0 for row in shipped)


@pytest.mark.parametrize("d_max", [4, 50])
def test_mad_min_variant_exceeds_the_l2_sensitivity(d_max):
    """Pre-noise weights on the rerouting pair: shipped MAD moves them by exactly 1 in l2 (the added
    user's own item), the min{0, .} variant by far more (~ alpha tau sqrt(d_max - 1) / d_max)."""
    tau = adaptive.mad_round(1.0, 1e-5, 100, d_max).tau
    pair = audit._mad_min_pair(int(math.ceil(tau)), d_max)
    d0, d1, n_items = audit._stack(pair, 1, True)
    con = _seeded(4)
    try:
        audit._register_broken_mad(con, "mad")
        shifts = {}
        for macro in ("dp__mad_weights", "dp__audit_min_mad_weights"):
            w = []
            for data in (d0, d1):
                con.register("arrow_data", data)
                con.execute("CREATE OR REPLACE TABLE t AS FROM arrow_data")
                w.append(dict(con.sql(f"SELECT item, w FROM {macro}('t', {tau}, "
                                      f"max_adaptive_degree := {d_max})").fetchall()))
            shifts[macro] = math.sqrt(sum((w[1].get(i, 0.0) - w[0].get(i, 0.0)) ** 2 for i in range(n_items)))
    finally:
        con.close()
    assert shifts["dp__mad_weights"] <= 1.0 + 1e-9
    assert shifts["dp__audit_min_mad_weights"] > 3.0


def test_variant_builder_refuses_changed_sql():
    with pytest.raises(DpsqlError, match="exactly one"):
        audit._substitute("SELECT a FROM b", "no such text", "x")
    with pytest.raises(DpsqlError, match="macro dp_no_such_macro not found in the shipped SQL"):
        audit._variant("dp_no_such_macro", "dp__audit_x")
    with pytest.raises(DpsqlError, match="exactly one"):
        audit._variant("dp__mad_stage", "dp__audit_x", [("no such text", "x")])


@pytest.mark.parametrize("kwargs,name", [({"mechanism": "nope"}, "mechanism"),
                                         ({"mechanism": "mad", "runs": 10}, "runs"),
                                         ({"mechanism": "mad", "runs": 2.5}, "runs"),
                                         ({"mechanism": "mad", "confidence": 1.0}, "confidence"),
                                         ({"mechanism": "mad", "confidence": 0}, "confidence"),
                                         ({"mechanism": "mad", "epsilon": -1.0}, "epsilon"),
                                         ({"mechanism": "mad", "delta": 1.5}, "delta"),
                                         ({"mechanism": "mad", "seed": "x"}, "seed"),
                                         ({"mechanism": "broken_order", "pilot_runs": 10}, "pilot_runs"),
                                         ({"mechanism": "mad", "runs": 30, "epsilon": 2.5}, "runs")])
def test_bad_parameters_name_the_parameter(kwargs, name):
    with pytest.raises(DPParameterError, match=name):
        audit.audit(**kwargs)


@pytest.mark.parametrize("args,name", [((5, 4, 0.05), "successes"), ((-1, 4, 0.05), "successes"),
                                       ((1, 0, 0.05), "trials"), ((1, 4, 1.0), "alpha")])
def test_clopper_pearson_bad_parameters(args, name):
    with pytest.raises(DPParameterError, match=name):
        audit.clopper_pearson(*args)


def test_markdown_table_lists_every_result():
    r = audit.AuditResult("mad", 1.0, 1e-5, 0.25, 1000, "e", (0.2, 0.1), (0.18, 0.12), 0.95, "d")
    bad = audit.AuditResult("broken_sigma", 1.0, 1e-5, 1.5, 1000, "e", (0.2, 0.1), (0.18, 0.12), 0.95, "d")
    table = audit.to_markdown([r, bad])
    assert table.count("\n") == 3 and "`mad`" in table and "0.250" in table
    assert "REFUTED" in table.splitlines()[3] and "REFUTED" not in table.splitlines()[2]


# --------------------------------------------------------------------------------------------
# Whole-output events: row order, number of rows, the exact output
# --------------------------------------------------------------------------------------------

def test_output_events_are_the_events_they_name():
    outputs = [(("A",), ("B",)), (("B",), ("A",)), (), (("A",),), (("A",), (None,)), ((None,), ("A",))]
    events = dict(audit._output_events(outputs))
    hits = {name: [bool(ev(o)) for o in outputs] for name, ev in events.items()}
    # NULLs sort last, as in DuckDB's ORDER BY ... ASC
    assert hits["rows in sorted order"] == [True, False, True, True, True, False]
    assert hits["first row 'A'"] == [True, False, False, True, True, False]
    assert hits["first row 'B'"] == [False, True, False, False, False, False]
    assert hits["no rows"] == [False, False, True, False, False, False]
    assert hits[">= 2 rows"] == [True, True, False, False, True, True]
    assert hits["<= 1 rows"] == [False, False, True, True, False, False]
    assert hits["row 'B' in the output"] == [True, True, False, False, False, False]
    exact = [name for name in events if name.startswith("output = ")]
    assert len(exact) == len(set(outputs)) and all(sum(h) == 1 for n, h in hits.items() if n in exact)
    for name, h in hits.items():
        if not name.startswith("NOT (") and not name.endswith(" rows"):
            assert hits[f"NOT ({name})"] == [not x for x in h]
    assert ">= 3 rows" not in hits and "<= 2 rows" not in hits  # no pilot output had 3 rows


def test_whole_output_runs_see_the_stored_row_order_of_an_unsorted_macro():
    """On the attack's pair the unsorted copy of weighted_gaussian releases A..E in both datasets,
    E first iff the added row is stored first; the shipped macro releases them sorted."""
    pair = audit._order_pairs(1.0, 1e-5)[0]
    con = _seeded(8)
    try:
        audit._register_unsorted(con, "weighted_gaussian")
        out = {name: audit._run_outputs(con, audit.MECHANISMS[name], 1.0, 1e-5, pair, 10)
               for name in ("broken_order", "order_weighted_gaussian")}
    finally:
        con.close()
    every = [(item,) for item in audit._ORDER_ITEMS]
    e = every[-1]
    for name, (o0, o1) in out.items():
        assert all(sorted(o) == every for o in o0 + o1)
    assert all(list(o) == every for o in out["order_weighted_gaussian"][0] + out["order_weighted_gaussian"][1])
    assert all(o[0] == e for o in out["broken_order"][1])
    assert not any(o[0] == e for o in out["broken_order"][0])


def test_runs_too_few_to_refute_the_claim_are_refused():
    # 30 vs 0 hits give at most ln(0.8841 / 0.1159) = 2.03 at confidence 0.95: enough for epsilon 1, not 2.5
    assert audit.epsilon_lower_bound(30, 0, 30, 1e-5, 0.95) == pytest.approx(2.03, abs=0.01)
    with pytest.raises(DPParameterError, match=r"runs = 30 is too few .* use runs >= 60"):
        audit.audit("mad", epsilon=2.5, runs=30)


@pytest.mark.slow
def test_unsorted_release_is_refuted_by_the_order_event():
    # the broken order is deterministic (E first on D' only): 40 vs 0 hits in 40 runs give
    # ln(0.9119 / 0.0881) = 2.34 at confidence 0.95, whatever the pilot picks among the order events
    r = audit.audit("broken_order", epsilon=1.0, delta=1e-5, runs=40, confidence=0.95, seed=5, pilot_runs=20)
    assert r.refuted and r.epsilon_lower_bound > 1.0
    assert "row" in r.event or "output" in r.event


@pytest.mark.slow
def test_candidate_sets_from_private_rows_are_refuted():
    # set B exists only while its element does: "B in the output" is certain on D and impossible on D'
    r = audit.audit("broken_coverage", epsilon=1.0, delta=1e-5, runs=40, confidence=0.95, seed=5, pilot_runs=20)
    assert r.refuted and r.epsilon_lower_bound > 1.0 and r.delta == 0.0


@pytest.mark.parametrize("mechanism", [
    "order_weighted_gaussian",
    pytest.param("order_policy_laplace", marks=pytest.mark.slow),
    pytest.param("rows_weighted_gaussian", marks=pytest.mark.slow),
    pytest.param("coverage_max_coverage", marks=pytest.mark.slow),
    "spelling_weighted_gaussian"])
def test_whole_output_events_do_not_refute_the_shipped_releases(mechanism):
    # an order leak as large as the attack's (p 1 vs 0) would give a bound of 1.95 at 40 runs and
    # confidence 0.99; a correct release is refuted with probability <= 1 %
    r = audit.audit(mechanism, epsilon=1.0, delta=1e-5, runs=40, confidence=0.99, seed=5, pilot_runs=20)
    assert r.runs == 40 and r.claimed_epsilon == 1.0
    assert 0.0 <= r.epsilon_lower_bound <= r.claimed_epsilon, (r.event, r.p_hat)
    assert not r.refuted


@pytest.mark.parametrize("mechanism", ["order_weighted_gaussian", "coverage_max_coverage", "pws_weighted_sample",
                                       "mad_adaptive"])
def test_non_constant_epsilon_is_refused_before_the_charge(mechanism):
    r = audit.check_refusal(mechanism)
    assert r.refused and r.charges == 0 and "must be a constant expression" in r.message
    # the check has power: a constant expression of the same value runs and charges once
    ok = audit.check_refusal(mechanism, expression="0.5 + 0.3125")
    assert not ok.refused and ok.charges == 1 and ok.message == ""


@pytest.mark.parametrize("mechanism", ["mad2r", "sips", "sips_cumulative", "order_sips_cumulative"])
def test_non_constant_list_parameter_is_refused_before_the_charge(mechanism):
    # The LIST form of the attack: a split flipping between two lists at each use.
    r = audit.check_refusal(mechanism, expression=audit.VOLATILE_SPLIT, parameter="split")
    assert r.refused and r.charges == 0 and "must be a constant expression" in r.message
    ok = audit.check_refusal(mechanism, expression="[0.5::DOUBLE, 0.5]", parameter="split")
    assert not ok.refused and ok.charges == 1 and ok.message == ""


def test_check_refusal_bad_parameters():
    with pytest.raises(DPParameterError, match="mechanism"):
        audit.check_refusal("nope")
    with pytest.raises(DPParameterError, match="expression"):
        audit.check_refusal("mad", expression=" ")
    with pytest.raises(DPParameterError, match="parameter"):
        audit.check_refusal("mad", parameter="1; DROP TABLE t")
