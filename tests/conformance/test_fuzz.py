"""Input hardening: every public SQL entry point under hostile arguments (hypothesis, deterministic).

Properties (issue 7, input hardening):

* a hostile parameter value (NaN, +-inf, negative, zero, NULL, subnormal, huge, fractional) either
  raises ``duckdb.Error`` whose message contains ``dpsql`` and names the parameter, or returns a
  correct result (released values are a subset of the input's, the right columns, at most k rows);
* a failing call releases nothing: read through a streaming reader, no row arrives before the error;
* column-name parameters holding injection payloads never execute anything and never read another
  column: the call fails, the table is intact afterwards, and the error names the missing column;
* a table that does not exist, or has the wrong shape, is an error; an EMPTY table is not an error
  but an empty release (decided: an empty table is a valid dataset, and "nothing to release" is the
  correct answer for it; the evaluation macros return their one summary row);
* the shell reports every failing statement as one ``Error: ...`` line, never a traceback.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.frontends.shell import run_shell

from conftest import seeded

FUZZ = settings(derandomize=True, max_examples=5, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values every numeric parameter is tried with, plus hypothesis' own floats.
HOSTILE = [math.nan, math.inf, -math.inf, -1.0, 0.0, -0.0, None, 1e300, -1e300, 2.5, 1e-320, 5e-324,
           1e18, 0.5, 1.0]
hostile_numbers = st.one_of(st.sampled_from(HOSTILE), st.floats(allow_nan=True, allow_infinity=True))

SETUP = [
    "CREATE TABLE t AS SELECT 'u' || (i % 60) AS user_id, 'w' || (i % 7) AS item FROM range(600) r(i)",
    "CREATE TABLE t_dup AS SELECT * FROM t UNION ALL SELECT * FROM t",
    "CREATE TABLE t_empty (user_id VARCHAR, item VARCHAR)",
    "CREATE TABLE t_null AS SELECT NULL::VARCHAR AS user_id, NULL::VARCHAR AS item FROM range(5)",
    "CREATE TABLE t_noitem AS SELECT user_id FROM t",
    # nested items without strings (a string inside a nested value is refused as a key: sql/00_core/15_checks.sql)
    "CREATE TABLE t_list AS SELECT user_id, [hash(item) % 1000, 7] AS item FROM t",
    "CREATE TABLE t_struct AS SELECT user_id, {'w': hash(item) % 1000, 'd': DATE '2024-01-01'} AS item FROM t",
    "CREATE TABLE t_list_text AS SELECT user_id, [item, 'x'] AS item FROM t",
    "CREATE TABLE t_struct_text AS SELECT user_id, {'w': item} AS item FROM t",
    "CREATE TABLE rel AS SELECT 'w1' AS item UNION ALL SELECT 'w2'",
    "CREATE TABLE ev AS SELECT 'k' || (i % 7) AS key FROM range(700) r(i)",
    "CREATE TABLE ev_empty (key VARCHAR)",
    "CREATE TABLE ev_null AS SELECT NULL::VARCHAR AS key FROM range(3)",
    "CREATE TABLE agg_list AS SELECT 'k' || i AS key, [i] AS n FROM range(5) r(i)",
    "CREATE TABLE smp AS SELECT 'k1' AS key, 2::BIGINT AS token UNION ALL SELECT 'k2', 1",
    "CREATE TABLE sets AS SELECT 's' || (i % 5) AS set_id, i % 40 AS element FROM range(200) r(i)",
    "CREATE TABLE sets_empty (set_id VARCHAR, element INTEGER)",
    "CREATE TABLE set_cands AS SELECT 's' || i AS set_id FROM range(5) r(i)",
    "CREATE TABLE parts AS SELECT 's' || i AS set_id, i % 2 AS part FROM range(5) r(i)",
    "CREATE TABLE caps AS SELECT i AS part, 2 AS capacity FROM range(2) r(i)",
    "CREATE TABLE stream AS SELECT 'u' || (i % 30) AS user_id, 1 + (i % 3) AS t, 'b' || (i % 2) AS bucket "
    "FROM range(90) r(i)",
    "CREATE TABLE stream_empty (user_id VARCHAR, t INTEGER, bucket VARCHAR)",
    "CREATE TABLE buckets AS SELECT 'b' || i AS bucket FROM range(2) r(i)",
    "CREATE TABLE cands AS SELECT i AS candidate_id FROM range(4) r(i)",
    "CREATE TABLE pts AS SELECT i % 4 AS point FROM range(40) r(i)",
    "CREATE TABLE pts_empty (point INTEGER)",
    "CREATE TABLE dist AS SELECT a.i AS point, b.i AS candidate, abs(a.i - b.i) / 3.0 AS distance "
    "FROM range(4) a(i), range(4) b(i)",
    "CREATE TABLE perm AS SELECT i + 1 AS position, 's' || i AS set_id FROM range(5) r(i)",
]


@pytest.fixture(scope="module")
def con():
    c = seeded(20261122)
    for statement in SETUP:
        c.execute(statement)
    yield c
    c.close()


def literal(value) -> str:
    """A SQL literal for a fuzzed value (strings are quoted with doubled quotes, as a user would)."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float) and not math.isfinite(value):
        return f"'{value!r}'::DOUBLE"
    return f"{float(value)!r}::DOUBLE"


def stream(con, sql: str) -> tuple[list[str], list[tuple], Optional[duckdb.Error]]:
    """Run ``sql`` through a streaming reader (one row per batch); rows received before any error."""
    rows: list[tuple] = []
    columns: list[str] = []
    try:
        reader = con.sql(sql).to_arrow_reader(1)
        columns = list(reader.schema.names)
        for batch in reader:
            rows.extend(zip(*(col.to_pylist() for col in batch.columns)))
    except duckdb.Error as exc:
        return columns, rows, exc
    return columns, rows, None


def hashable(value):
    """LIST and STRUCT values come back as list / dict: make them comparable set members."""
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    return value


def values(con, sql: str) -> set:
    return {hashable(r[0]) for r in con.sql(sql).fetchall()}


# ---------------------------------------------------------------- result checks (valid inputs)

def ranked(k_param: str, table_sql: str):
    """(rank, value) rows: ranks 1..n, n <= k, distinct values drawn from the input."""
    def check(con, columns, rows, params):
        assert len(rows) <= params.get(k_param, math.inf)
        assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
        got = [r[1] for r in rows]
        assert len(set(got)) == len(got) and set(got) <= values(con, table_sql)
    return check


def subset_of(table_sql: str):
    def check(con, columns, rows, params):
        got = [r[0] for r in rows]
        assert len(set(got)) == len(got) and set(got) <= values(con, table_sql)
    return check


def check_threshold_sample(con, columns, rows, params):
    true = dict(con.sql("SELECT key, count(*) FROM ev GROUP BY key").fetchall())
    for key, frequency, q in rows:
        assert true[key] == frequency and 0 < q <= 1


def check_sbh(con, columns, rows, params):
    assert {r[0] for r in rows} <= values(con, "SELECT key FROM ev")
    assert all(0 < r[2] <= 1 and math.isfinite(r[1]) for r in rows)


def check_estimate(con, columns, rows, params):
    assert sorted((r[0], r[1]) for r in rows) == [("k1", 2), ("k2", 1)]
    assert all(r[2] is None or not math.isnan(r[2]) for r in rows)


def check_set_cover(con, columns, rows, params):
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    assert sorted(r[1] for r in rows) == sorted(values(con, "SELECT set_id FROM set_cands"))


def check_heavy_hitters(con, columns, rows, params):
    assert all(1 <= t <= params["horizon"] and b in ("b0", "b1") for t, b in rows)


def check_matroid(con, columns, rows, params):
    ranked("k", "SELECT set_id FROM parts")(con, columns, rows, {})
    part = dict(con.sql("SELECT set_id, part FROM parts").fetchall())
    for p in (0, 1):
        assert sum(part[r[1]] == p for r in rows) <= 2


def check_missing_mass(con, columns, rows, params):
    # released = the table itself: nothing is missed, for every p
    assert len(rows) == 1 and rows[0][1] == 0.0


def check_top_k_missing_mass(con, columns, rows, params):
    (k, released, mm), = rows
    assert released == 2 and 0.0 <= mm <= 1.0


@dataclass
class Entry:
    """One SQL entry point: a template with a {placeholder} per fuzzed parameter and their valid values."""

    name: str
    template: str
    valid: dict
    columns: list[str]
    check: Callable
    # column-name parameters and the table the template reads them from (injection tests)
    col_params: dict = field(default_factory=dict)
    # {table placeholder: (valid table, empty table)} for the table tests
    tables: dict = field(default_factory=dict)

    def sql(self, **override) -> str:
        args = {k: literal(v) for k, v in {**self.valid, **override}.items()}
        return self.template.format(**args)


UNION_COLS = {"user_col": "user_id", "item_col": "item"}
EVAL_COLS = {**UNION_COLS, "released_col": "item"}
UNION_TABLES = {"tbl": ("t", "t_empty")}
SET_UNION_METHODS = list(dpsql.METHODS)  # every declared method
ITEMS = "SELECT item FROM t"
SU = dict(epsilon=1.0, delta=1e-5, max_items=100.0, user_col="user_id", item_col="item", tbl="t")
SU_ARGS = ("epsilon := {epsilon}, delta := {delta}, max_items := {max_items}, user_col := {user_col}, "
           "item_col := {item_col}")

ENTRIES: list[Entry] = [
    Entry(f"dp_set_union[{m}]", f"FROM dp_set_union({{tbl}}, method := '{m}', {SU_ARGS})", dict(SU),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES)
    for m in SET_UNION_METHODS
] + [
    Entry("dp_set_union[method]", "FROM dp_set_union({tbl}, method := {method}, epsilon := 1.0, delta := 1e-5)", dict(tbl="t", method="mad2r"),
          ["item"], subset_of(ITEMS)),
    Entry("dp_set_union_count_laplace", f"FROM dp_set_union_count_laplace({{tbl}}, {SU_ARGS})", dict(SU),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_count_gaussian", f"FROM dp_set_union_count_gaussian({{tbl}}, {SU_ARGS})", dict(SU),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_weighted_laplace", f"FROM dp_set_union_weighted_laplace({{tbl}}, {SU_ARGS})", dict(SU),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_weighted_gaussian", f"FROM dp_set_union_weighted_gaussian({{tbl}}, {SU_ARGS})", dict(SU),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_mad",
          f"FROM dp_set_union_mad({{tbl}}, {SU_ARGS}, max_adaptive_degree := {{max_adaptive_degree}}, "
          "beta := {beta})",
          dict(SU, max_adaptive_degree=50.0, beta=2.0), ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_mad2r",
          f"FROM dp_set_union_mad2r({{tbl}}, {SU_ARGS}, max_adaptive_degree := {{max_adaptive_degree}}, "
          "beta := {beta}, b_min := {b_min}, b_max := {b_max}, c_lb := {c_lb}, c_ub := {c_ub})",
          dict(SU, max_adaptive_degree=50.0, beta=2.0, b_min=0.5, b_max=2.0, c_lb=1.0, c_ub=3.0),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_sips", f"FROM dp_set_union_sips({{tbl}}, {SU_ARGS})", dict(SU),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_sips_cumulative", f"FROM dp_set_union_sips_cumulative({{tbl}}, {SU_ARGS})", dict(SU),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_policy_laplace",
          f"FROM dp_set_union_policy_laplace({{tbl}}, {SU_ARGS}, alpha := {{alpha}}, passes := {{passes}})",
          dict(SU, alpha=5.0, passes=1.0), ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_policy_gaussian",
          f"FROM dp_set_union_policy_gaussian({{tbl}}, {SU_ARGS}, alpha := {{alpha}}, passes := {{passes}})",
          dict(SU, alpha=5.0, passes=1.0), ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_set_union_greedy_update",
          "FROM dp_set_union_greedy_update({tbl}, epsilon := {epsilon}, delta := {delta}, alpha := {alpha}, "
          "user_col := {user_col}, item_col := {item_col})",
          dict(epsilon=1.0, delta=1e-5, alpha=3.0, user_col="user_id", item_col="item", tbl="t"),
          ["item"], subset_of(ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_top_k", f"FROM dp_top_k({{tbl}}, {{k}}, {SU_ARGS})", dict(SU, k=3.0),
          ["rank", "item"], ranked("k", ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_hitting_set", f"FROM dp_hitting_set({{tbl}}, {{k}}, {SU_ARGS})", dict(SU, k=3.0),
          ["rank", "item"], ranked("k", ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_top_k_limited_domain", f"FROM dp_top_k_limited_domain({{tbl}}, {{k}}, {{k_bar}}, {SU_ARGS})",
          dict(SU, k=3.0, k_bar=5.0), ["rank", "item"], ranked("k", ITEMS), UNION_COLS, UNION_TABLES),
    Entry("dp_weighted_sample",
          "FROM dp_weighted_sample({tbl}, {epsilon}, {delta}, tau := {tau}, power := {power}, key_col := {key_col})",
          dict(tbl="ev", epsilon=0.5, delta=1e-3, tau=0.1, power=1.0, key_col="key"),
          ["key", "token"], subset_of("SELECT key FROM ev"), {"key_col": "key"}, {"tbl": ("ev", "ev_empty")}),
    Entry("dp_threshold_sample",
          "FROM dp_threshold_sample({tbl}, {tau}, power := {power}, key_col := {key_col}, salt := 7)",
          dict(tbl="ev", tau=0.1, power=1.0, key_col="key"),
          ["key", "frequency", "q"], check_threshold_sample, {"key_col": "key"}, {"tbl": ("ev", "ev_empty")}),
    Entry("dp_sbh_histogram",
          "FROM dp_sbh_histogram({tbl}, {epsilon}, {delta}, tau := {tau}, power := {power}, key_col := {key_col})",
          dict(tbl="ev", epsilon=0.5, delta=1e-3, tau=0.1, power=1.0, key_col="key"),
          ["key", "noisy_frequency", "inclusion_probability"], check_sbh, {"key_col": "key"},
          {"tbl": ("ev", "ev_empty")}),
    Entry("dp_weighted_sample_estimate",
          "FROM dp_weighted_sample_estimate({tbl}, {epsilon}, {delta}, tau := {tau}, power := {power})",
          dict(tbl="smp", epsilon=0.5, delta=1e-3, tau=0.1, power=1.0),
          ["key", "token", "estimate"], check_estimate),
    Entry("dp_max_coverage",
          "FROM dp_max_coverage({tbl}, 'set_cands', {k}, epsilon := {epsilon}, set_col := {set_col}, element_col := {element_col})",
          dict(tbl="sets", k=2.0, epsilon=1.0, set_col="set_id", element_col="element"),
          ["rank", "set_id"], ranked("k", "SELECT set_id FROM set_cands"),
          {"set_col": "set_id", "element_col": "element"}, {"tbl": ("sets", "sets_empty")}),
    Entry("dp_set_cover",
          "FROM dp_set_cover({tbl}, 'set_cands', epsilon := {epsilon}, tau_constant := {tau_constant}, set_col := {set_col}, "
          "element_col := {element_col})",
          dict(tbl="sets", epsilon=1.0, tau_constant=1.0, set_col="set_id", element_col="element"),
          ["position", "set_id"], check_set_cover,
          {"set_col": "set_id", "element_col": "element"}, {"tbl": ("sets", "sets_empty")}),
    Entry("dp_shifting_heavy_hitters",
          "FROM dp_shifting_heavy_hitters({tbl}, 'buckets', {k}, epsilon := {epsilon}, "
          "failure_probability := {failure_probability}, horizon := {horizon}, user_col := {user_col}, "
          "time_col := {time_col}, bucket_col := {bucket_col})",
          dict(tbl="stream", k=1.0, epsilon=1.0, failure_probability=0.05, horizon=3.0, user_col="user_id",
               time_col="t", bucket_col="bucket"),
          ["t", "bucket"], check_heavy_hitters,
          {"user_col": "user_id", "time_col": "t", "bucket_col": "bucket"}, {"tbl": ("stream", "stream_empty")}),
    Entry("dp_matroid_coverage",
          "FROM dp_matroid_coverage({tbl}, 'parts', 'caps', epsilon := {epsilon}, eta := {eta}, "
          "failure_probability := {failure_probability}, samples := {samples}, set_col := {set_col}, "
          "element_col := {element_col})",
          dict(tbl="sets", epsilon=1.0, eta=0.5, failure_probability=0.05, samples=16.0, set_col="set_id",
               element_col="element"),
          ["rank", "set_id"], check_matroid,
          {"set_col": "set_id", "element_col": "element"}, {"tbl": ("sets", "sets_empty")}),
    Entry("dp_k_median",
          "FROM dp_k_median({tbl}, 'cands', 'dist', {k}, q := {q}, epsilon := {epsilon}, n_bound := {n_bound}, "
          "point_col := {point_col})",
          dict(tbl="pts", k=2.0, q=1.0, epsilon=1.0, n_bound=100.0, point_col="point"),
          ["rank", "candidate_id"], ranked("k", "SELECT candidate_id FROM cands"),
          {"point_col": "point"}, {"tbl": ("pts", "pts_empty")}),
    Entry("dp_eval_missing_mass",
          "FROM dp_eval_missing_mass({tbl}, 't', p := {p}, user_col := {user_col}, item_col := {item_col}, "
          "released_col := {released_col})",
          dict(tbl="t", p=1.0, user_col="user_id", item_col="item", released_col="item"),
          ["p", "missing_mass"], check_missing_mass, EVAL_COLS),
    Entry("dp_eval_top_k_missing_mass",
          "FROM dp_eval_top_k_missing_mass({tbl}, 'rel', {k}, user_col := {user_col}, item_col := {item_col}, "
          "released_col := {released_col})",
          dict(tbl="t", k=3.0, user_col="user_id", item_col="item", released_col="item"),
          ["k", "released_items", "top_k_missing_mass"], check_top_k_missing_mass, EVAL_COLS),
    Entry("dp_eval_hits",
          "FROM dp_eval_hits({tbl}, 'rel', user_col := {user_col}, item_col := {item_col}, "
          "released_col := {released_col})",
          dict(tbl="t", user_col="user_id", item_col="item", released_col="item"), ["hits", "users"],
          lambda con, c, rows, p: rows == [(60, 60)], EVAL_COLS),
    Entry("dp_eval_coverage_by_frequency",
          "FROM dp_eval_coverage_by_frequency({tbl}, 'rel', user_col := {user_col}, item_col := {item_col}, "
          "released_col := {released_col})",
          dict(tbl="t", user_col="user_id", item_col="item", released_col="item"),
          ["bucket", "min_frequency", "max_frequency", "items", "released_items"],
          lambda con, c, rows, p: sum(r[3] for r in rows) == 7, EVAL_COLS),
    Entry("dp_eval_set_cover_cost",
          "FROM dp_eval_set_cover_cost({tbl}, 'perm', set_col := {set_col}, element_col := {element_col})",
          dict(tbl="sets", set_col="set_id", element_col="element"), ["cost"],
          lambda con, c, rows, p: rows == [(5,)], {"set_col": "set_id", "element_col": "element"}),
]
BY_NAME = {e.name: e for e in ENTRIES}

# Scalar calibration functions: (template, valid values).
SCALARS = {
    "dp_gaussian_sigma": ("SELECT dp_gaussian_sigma({epsilon}, {delta}, sensitivity := {sensitivity})",
                          dict(epsilon=1.0, delta=1e-5, sensitivity=1.0)),
    "dp_gaussian_threshold": ("SELECT dp_gaussian_threshold({epsilon}, {delta}, {max_items})",
                              dict(epsilon=1.0, delta=1e-5, max_items=100.0)),
    "dp_laplace_threshold": ("SELECT dp_laplace_threshold({epsilon}, {delta}, {max_items})",
                             dict(epsilon=1.0, delta=1e-5, max_items=100.0)),
    "dp_set_union_noise_scale": ("SELECT dp_set_union_noise_scale('mad2r', {epsilon}, {delta}, {max_items})",
                                 dict(epsilon=1.0, delta=1e-5, max_items=100.0)),
    "dp_set_union_threshold": ("SELECT dp_set_union_threshold('count_laplace', {epsilon}, {delta}, {max_items})",
                               dict(epsilon=1.0, delta=1e-5, max_items=100.0)),
    "dp_peeling_epsilon": ("SELECT dp_peeling_epsilon({epsilon}, {delta}, {k})", dict(epsilon=0.5, delta=5e-6, k=10.0)),
    "dp_limited_domain_epsilon": ("SELECT dp_limited_domain_epsilon({epsilon}, {delta_prime}, {k})",
                                  dict(epsilon=0.5, delta_prime=5e-6, k=10.0)),
    "dp_pws_L": ("SELECT dp_pws_L({epsilon}, {delta})", dict(epsilon=0.5, delta=1e-3)),
    "dp_pws_pi": ("SELECT dp_pws_pi(3, {epsilon}, {delta}, tau := {tau}, power := {power})",
                  dict(epsilon=0.5, delta=1e-3, tau=0.1, power=1.0)),
    "dp_pws_pi_ij": ("SELECT dp_pws_pi_ij(3, 2, {epsilon}, {delta}, tau := {tau}, power := {power})",
                     dict(epsilon=0.5, delta=1e-3, tau=0.1, power=1.0)),
    "dp_pws_q": ("SELECT dp_pws_q(3, {tau}, power := {power})", dict(tau=0.1, power=1.0)),
    "dp_sbh_threshold": ("SELECT dp_sbh_threshold({epsilon}, {delta})", dict(epsilon=0.5, delta=1e-3)),
    "dp_subsampling_probability": ("SELECT dp_subsampling_probability({epsilon})", dict(epsilon=1.0)),
    "dp_subsampled_epsilon": ("SELECT dp_subsampled_epsilon({eps0}, {p})", dict(eps0=0.693, p=0.5)),
}
SCALAR_PARAMS = [(name, p) for name, (_, valid) in SCALARS.items() for p in valid]


def assert_named_error(exc: duckdb.Error, *names: str) -> None:
    message = str(exc)
    assert "dpsql" in message, message
    assert any(n in message for n in names), f"{names} not named in: {message}"
    assert "Traceback" not in message


# ---------------------------------------------------------------- hostile parameter values

def fuzz(max_examples: int) -> settings:
    return settings(FUZZ, max_examples=max_examples)


def check_hostile_call(con, entry: Entry, param: str, value) -> None:
    """The property: a clear error naming ``param`` with no row released before it, or a correct result."""
    sql = entry.sql(**{param: value})
    columns, rows, exc = stream(con, sql)
    if exc is not None:
        assert rows == [], f"partial release before the error of {sql}"
        assert_named_error(exc, param)
        return
    assert columns == entry.columns, sql
    entry.check(con, columns, rows, dict(entry.valid, **{param: value}))


# The dispatching macros (dp_set_union, and dp_top_k / dp_hitting_set, whose domain step is dp_set_union)
# bind every method's branch (~1 s a call on a loaded machine): they get fewer examples; the per-method
# macros below cover every parameter of every method.
DISPATCHING = [e.name for e in ENTRIES if e.name.startswith("dp_set_union[")]
CHEAP = [e.name for e in ENTRIES if e.name not in DISPATCHING and any(isinstance(v, float) for v in e.valid.values())]


@pytest.mark.parametrize("entry_name", CHEAP)
def test_hostile_parameter_errors_by_name_or_releases_correctly(con, entry_name):
    entry = BY_NAME[entry_name]
    numeric = sorted(p for p, v in entry.valid.items() if isinstance(v, float))
    slow = entry_name in ("dp_top_k", "dp_hitting_set")

    @fuzz(4 if slow else min(12, 3 + len(numeric)))
    @given(param=st.sampled_from(numeric), value=hostile_numbers)
    def run(param, value):
        check_hostile_call(con, entry, param, value)

    run()


@fuzz(8)
@given(method=st.sampled_from(SET_UNION_METHODS), param=st.sampled_from(["epsilon", "delta", "max_items"]),
       value=hostile_numbers)
def test_dispatcher_hostile_parameter(con, method, param, value):
    check_hostile_call(con, BY_NAME[f"dp_set_union[{method}]"], param, value)


@pytest.mark.parametrize("name, param", SCALAR_PARAMS, ids=[f"{n}-{p}" for n, p in SCALAR_PARAMS])
@fuzz(8)
@given(value=hostile_numbers)
def test_calibration_function_errors_by_name_or_is_finite(con, name, param, value):
    template, valid = SCALARS[name]
    args = {k: literal(v) for k, v in valid.items()}
    args[param] = literal(value)
    try:
        (result,), = con.sql(template.format(**args)).fetchall()
    except duckdb.Error as exc:
        assert_named_error(exc, param)
        return
    if name == "dp_subsampled_epsilon" and args["p"] == literal(1.0):
        assert result == math.inf  # no subsampling: one-sided DP bounds nothing (documented)
        return
    assert result is not None and math.isfinite(result) and result >= 0, (name, param, value, result)


@pytest.mark.parametrize("method", [None, "MAD2R", "mad2r; DROP TABLE t", "x' OR '1'='1"])
def test_unknown_method_is_refused(con, method):
    """Unknown (and differently spelt: names are case-sensitive, one spelling per method) methods fail."""
    columns, rows, exc = stream(con, f"FROM dp_set_union('t', method := {literal(method)}, epsilon := 1.0, delta := 1e-5)")
    assert exc is not None and rows == []
    assert_named_error(exc, "method")
    assert con.sql("SELECT count(*) FROM t").fetchall() == [(600,)]


# ---------------------------------------------------------------- column-name injection

PAYLOADS = ["item; DROP TABLE t", "x' OR '1'='1", "it''em", '"item"', "item\\", "\\'; SELECT 1; --",
            "ítem☃", "user_id, item", "*", "item)--", "   ", ""]
payloads = st.one_of(st.sampled_from(PAYLOADS),
                     st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                              max_size=12))
COL_ENTRIES = [e.name for e in ENTRIES if e.col_params and e.name not in DISPATCHING[1:]]


@pytest.mark.parametrize("entry_name", COL_ENTRIES)
def test_column_parameters_are_never_injected(con, entry_name):
    entry = BY_NAME[entry_name]

    @fuzz(3 + 2 * len(entry.col_params))
    @given(param=st.sampled_from(sorted(entry.col_params)), payload=payloads)
    def run(param, payload):
        check_injection(con, entry, param, payload)

    run()


def check_injection(con, entry: Entry, param: str, payload: str) -> None:
    existing = {c.lower() for c in ("user_id", "item", "key", "set_id", "element", "t", "bucket", "point")}
    if payload.lower() in existing:
        return  # names a real column: not hostile
    before = con.sql("SELECT count(*) FROM duckdb_tables()").fetchall()
    columns, rows, exc = stream(con, entry.sql(**{param: payload}))
    assert exc is not None and rows == [], f"{param} := {payload!r} did not fail"
    assert con.sql("SELECT count(*) FROM duckdb_tables()").fetchall() == before
    assert con.sql("SELECT count(*) FROM t").fetchall() == [(600,)]
    message = str(exc)
    if payload.strip():  # the error names the column that is missing (as written in the SQL literal)
        assert payload in message or literal(payload)[1:-1] in message, message


# ---------------------------------------------------------------- tables: missing, empty, wrong shape, duplicates

# The dispatcher's branches are the per-method macros (tested one by one): one dispatching case suffices.
TABLE_CASES = [(e.name, ph) for e in ENTRIES for ph in e.tables if e.name not in DISPATCHING[1:]]


@pytest.mark.parametrize("entry_name, placeholder", TABLE_CASES, ids=[e for e, _ in TABLE_CASES])
def test_missing_table_is_a_catalog_error(con, entry_name, placeholder):
    entry = BY_NAME[entry_name]
    columns, rows, exc = stream(con, entry.sql().replace(literal(entry.valid[placeholder]), "'no_such_table'", 1))
    assert isinstance(exc, duckdb.CatalogException) and "no_such_table" in str(exc) and rows == []


# Coverage and set cover pick among candidates_tbl, matroid coverage among the public sets of parts_tbl and
# k-median among the public candidates:
# with no private records they still return a (data-independent) choice.
PUBLIC_CANDIDATES = {"dp_max_coverage", "dp_set_cover", "dp_matroid_coverage", "dp_k_median"}


@pytest.mark.parametrize("entry_name, placeholder", TABLE_CASES, ids=[e for e, _ in TABLE_CASES])
def test_empty_table_releases_nothing(con, entry_name, placeholder):
    entry = BY_NAME[entry_name]
    valid, empty = entry.tables[placeholder]
    columns, rows, exc = stream(con, entry.sql(**{placeholder: empty}))
    assert exc is None, str(exc)
    assert columns == entry.columns
    if entry_name in PUBLIC_CANDIDATES:  # the candidates are public: a choice among them is still returned
        entry.check(con, columns, rows, entry.valid)
    else:
        assert rows == []


EVAL_EMPTY = {"dp_eval_missing_mass": [(1.0, 0.0)], "dp_eval_hits": [(0, 0)], "dp_eval_coverage_by_frequency": [],
              "dp_eval_top_k_missing_mass": [(3, 2, 0.0)]}


@pytest.mark.parametrize("entry_name", sorted(EVAL_EMPTY))
def test_evaluation_of_an_empty_table(con, entry_name):
    assert con.sql(BY_NAME[entry_name].sql(tbl="t_empty")).fetchall() == EVAL_EMPTY[entry_name]


USER_LEVEL = [e.name for e in ENTRIES if e.tables.get("tbl", ("",))[0] == "t" and e.name not in DISPATCHING[1:]] + \
    ["dp_eval_missing_mass", "dp_eval_hits"]


@pytest.mark.parametrize("entry_name", USER_LEVEL)
def test_all_null_table_is_an_error_naming_the_column(con, entry_name):
    columns, rows, exc = stream(con, BY_NAME[entry_name].sql(tbl="t_null"))
    assert exc is not None and rows == []
    assert_named_error(exc, "user_col", "item_col")


@pytest.mark.parametrize("entry_name", USER_LEVEL)
def test_table_without_the_item_column_is_an_error(con, entry_name):
    columns, rows, exc = stream(con, BY_NAME[entry_name].sql(tbl="t_noitem"))
    assert isinstance(exc, duckdb.Error) and rows == []
    # a dpsql message naming the parameter and the table's columns, not a binder error about internals
    assert "dpsql: item_col := 'item' is not a column of 't_noitem'; its columns are" in str(exc), str(exc)


@pytest.mark.parametrize("shape, method", [("t_list", m) for m in SET_UNION_METHODS]
                         + [("t_struct", m) for m in ("weighted_gaussian", "mad2r", "policy_gaussian")])
def test_nested_items_are_released_as_values_of_their_type(con, shape, method):
    """LIST / STRUCT items are ordinary (comparable) values: released at a large epsilon, type kept."""
    rel = con.sql(f"FROM dp_set_union_{method}('{shape}', epsilon := 50.0, delta := 1e-5)")
    expected = values(con, f"SELECT item FROM {shape}")
    got = [hashable(r[0]) for r in rel.fetchall()]
    assert rel.types[0] == con.sql(f"SELECT item FROM {shape}").types[0]
    assert len(set(got)) == len(got) and set(got) <= expected
    if method != "greedy_update":  # 60 users hold all 7 items: weight >= 60/sqrt(7) against a threshold < 2
        assert set(got) == expected
    # (greedy_update caps weights at Gamma = rho + alpha/epsilon: each item misses with prob e^-3/2)


@pytest.mark.parametrize("shape", ["t_list_text", "t_struct_text"])
def test_nested_items_holding_strings_are_refused_by_type(con, shape):
    """A string inside a nested item may compare under a collation DESCRIBE does not show: refused, uncharged."""
    columns, rows, exc = stream(con, f"FROM dp_set_union_weighted_gaussian('{shape}', epsilon := 50.0, delta := 1e-5)")
    assert exc is not None and rows == []
    assert "item_col := 'item'" in str(exc) and "a string inside a nested value" in str(exc)


@pytest.mark.parametrize("entry_name, tbl", [("dp_weighted_sample", "ev_null"), ("dp_sbh_histogram", "ev_null"),
                                             ("dp_threshold_sample", "ev_null")])
def test_null_keys_are_an_error(con, entry_name, tbl):
    columns, rows, exc = stream(con, BY_NAME[entry_name].sql(tbl=tbl))
    assert exc is not None and rows == []
    assert_named_error(exc, "key_col")


@pytest.mark.parametrize("macro", ["dp_weighted_sample('agg_list', 0.5, 1e-3", "dp_sbh_histogram('agg_list', 0.5, 1e-3",
                                   "dp_threshold_sample('agg_list', 0.1"])
def test_list_frequencies_are_an_error(con, macro):
    columns, rows, exc = stream(con, f"FROM {macro}, key_col := 'key', freq_col := 'n')")
    assert exc is not None and rows == []
    assert_named_error(exc, "freq_col")


def test_duplicate_rows_count_once(con):
    for weighting in ("count", "inverse", "inverse_sqrt"):
        q = "SELECT item, w FROM dp__set_union_weights('{}', '" + weighting + "', max_items := 100) ORDER BY item"
        assert con.sql(q.format("t_dup")).fetchall() == con.sql(q.format("t")).fetchall()
    q = "SELECT item, n FROM dp__eval_item_counts('{}') ORDER BY item"
    assert con.sql(q.format("t_dup")).fetchall() == con.sql(q.format("t")).fetchall()


def test_a_list_of_tables_is_refused_by_the_binder(con):
    columns, rows, exc = stream(con, "FROM dp_set_union(['t', 't_dup'], epsilon := 1.0, delta := 1e-5)")
    assert isinstance(exc, duckdb.BinderException) and rows == []


# ---------------------------------------------------------------- regressions: what the fuzzer found

FOUND = [
    # (call, parameter the error must name); each used to fail with a bare Python/engine error
    ("FROM dp_sbh_histogram('ev', 1e-320, 1e-3)", "epsilon"),           # Laplace scale 1/epsilon = inf
    ("FROM dp_set_cover('sets', 'set_cands', epsilon := 1e-320)", "epsilon"),        # idem (Lap(2/epsilon))
    ("FROM dp_top_k_limited_domain('t', 3, 5, epsilon := 1e-320, delta := 1e-5)", "epsilon"),
    ("FROM dp_set_union_greedy_update('t', epsilon := 1.0, delta := 1e-320)", "delta"),  # 1/(2 delta) = inf
    ("FROM dp_weighted_sample('ev', 1e300, 1e-3)", "epsilon"),          # OverflowError in e^epsilon
    ("FROM dp_weighted_sample_estimate('smp', 710, 1e-3)", "epsilon"),
    ("SELECT dp_pws_L(1e300, 1e-3)", "epsilon"),
    ("SELECT dp_peeling_epsilon(2.2e307, 1e-5, 10)", "epsilon"),         # returned inf
    ("FROM dp_matroid_coverage('sets', 'parts', 'caps', 1.0, eta := 1e-320)", "eta"),  # int(inf) passes
    ("FROM dp_matroid_coverage('sets', 'parts', 'caps', 1.0, eta := 1e-9)", "eta"),    # 4e9 passes: hangs
    ("FROM dp_matroid_coverage('sets', 'parts', 'caps', 1.0, failure_probability := 1e-320)", "failure_probability"),
    ("FROM dp_k_median('pts', 'cands', 'dist', 2, 1.0, n_bound := 1e300)", "n_bound"),  # BIGINT overflow
    ("FROM dp_eval_top_k_missing_mass('t', 'rel', 1e300)", "k"),         # Conversion Error
]


@pytest.mark.parametrize("sql, param", FOUND)
def test_found_inputs_fail_with_a_named_error(con, sql, param):
    columns, rows, exc = stream(con, sql)
    assert exc is not None and rows == []
    assert_named_error(exc, param)


@pytest.mark.parametrize("sql, expected", [
    ("SELECT dp_pws_pi(3, 0.5, 1e-3, tau := 0.1, power := 1e-5)",
     "SELECT dp_pws_pi(3, 0.5, 1e-3, tau := 0.1, power := 0)"),
    ("SELECT dp_subsampled_epsilon(1e300, 0.5)", "SELECT 1e300 + ln(0.5)"),
])
def test_found_inputs_now_compute(con, sql, expected):
    """A tiny power (OverflowError in (x/tau)^(1/power)) and a huge eps0 (in e^eps0) have finite answers."""
    (got,), = con.sql(sql).fetchall()
    (want,), = con.sql(expected).fetchall()
    assert got == pytest.approx(want, rel=1e-3)  # power 1e-5 moves q_3 by a factor 3^1e-5 only


# ---------------------------------------------------------------- the shell

SHELL_FAILURES = [
    ("SELECT * FROM dp_set_union('t', epsilon := 'nan'::DOUBLE, delta := 1e-5);", "epsilon"),
    ("SELECT * FROM dp_top_k('t', 2.5, epsilon := 1.0, delta := 1e-5);", "k"),
    ("SELECT * FROM dp_set_union_mad('t', epsilon := 1.0, delta := 1e-5, item_col := 'item; DROP TABLE t');", "item; DROP TABLE t"),
    ("SELECT * FROM dp_set_union_mad('no_such_table', epsilon := 1.0, delta := 1e-5);", "no_such_table"),
    ("SELECT * FROM dp_set_union_sips('t_null', epsilon := 1.0, delta := 1e-5);", "user_col"),
    ("SELECT * FROM dp_weighted_sample('ev', 1e300, 1e-3);", "epsilon"),
    ("SELECT * FROM dp_k_median('pts', 'cands', 'dist', 2, 1.0, n_bound := 1e300);", "n_bound"),
    ("SELECT * FROM dp_matroid_coverage('sets', 'parts', 'caps', 1.0, eta := 1e-320);", "eta"),
    ("SELECT * FROM dp_eval_top_k_missing_mass('t', 'rel', 1e300);", "k"),
]
SHELL_TABLES = ("t ", "t_null ", "ev ", "rel ", "sets ", "parts ", "caps ", "cands ", "pts ", "dist ")


@pytest.mark.parametrize("statement, name", SHELL_FAILURES)
def test_shell_reports_one_error_line(statement, name):
    setup = "".join(s + ";\n" for s in SETUP if s.startswith(tuple("CREATE TABLE " + t for t in SHELL_TABLES)))
    out, err = io.StringIO(), io.StringIO()
    code = run_shell(None, setup + statement + "\nSELECT 'never' AS never_run;", stdin=io.StringIO(""),
                     out=out, err=err)
    lines = err.getvalue().strip().splitlines()
    if len(lines) == 3 and lines[1].startswith("LINE 1: "):  # DuckDB's excerpt of the statement, with its ^ marker
        assert not lines[2].strip("^ "), err.getvalue()
        lines = lines[:1]
    assert code == 1
    assert len(lines) == 1 and lines[0].startswith("Error: "), err.getvalue()
    assert "Traceback" not in err.getvalue() and name in lines[0]
    assert "never_run" not in out.getvalue()


@pytest.mark.parametrize("payload", ["nope", "x' OR '1'='1", "ü☃\\"])
def test_shell_names_a_missing_column_plainly(payload):
    """A column that is not there is named, with its parameter and the table's real columns (dp__check_columns:
    before, DuckDB reported a binder error about a star expression over dpsql's internals)."""
    out, err = io.StringIO(), io.StringIO()
    code = run_shell(None, "CREATE TABLE t AS SELECT 'u' AS user_id, 'w' AS item;\n"
                     f"SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := 1.0, delta := 1e-5, item_col := {literal(payload)});",
                     stdin=io.StringIO(""), out=out, err=err)
    line = err.getvalue().strip()
    assert code == 1 and "\n" not in line
    assert line == (f"Error: dpsql: item_col := '{payload}' is not a column of 't'; its columns are "
                    "user_id, item. Pass item_col := '<column name>'")
