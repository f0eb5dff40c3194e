"""The release path every mechanism goes through (dpsql/release.py, sql/00_release.sql).

A release is everything a user can observe. These tests enumerate every releasing macro and every
public Python release function from what is registered, so a new one that misses a channel fails
here: each parameter must be a constant (a volatile expression is refused, naming the parameter,
with nothing charged), rows come out sorted by the released values (or by the DP-chosen rank),
and each release charges its epsilon exactly once.
"""
from __future__ import annotations

import inspect
import random
import re
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import optimize
from dpsql.audit import epsilon_lower_bound
from dpsql.release import check_constant, sorted_release
from dpsql.validation import DPParameterError

# -- what is registered --------------------------------------------------------------------------


def _macros(con) -> dict[str, tuple[list[str], list[str], str]]:
    rows = con.execute("SELECT function_name, parameters, parameter_types, macro_definition FROM duckdb_functions() "
                       "WHERE function_type = 'table_macro' AND function_name LIKE 'dp%'").fetchall()
    return {name: (params, types, body or "") for name, params, types, body in rows}


def releasing_macros(con) -> set[str]:
    """Public table macros whose expansion reaches dp__charge (transitively through other macros)."""
    macros = _macros(con)
    calls = {name: {m for m in macros if m != name and re.search(rf"\b{m}\(", body)}
             for name, (_, _, body) in macros.items()}
    charging = {name for name, (_, _, body) in macros.items() if "dp__charge(" in body}
    changed = True
    while changed:
        changed = False
        for name, callees in calls.items():
            if name not in charging and callees & charging:
                charging.add(name)
                changed = True
    return {m for m in charging if not m.startswith("dp__")}


# A public order of items (greedy_update's order_tbl), independent of t: i16 .. i0 by rank.
PUBLIC_ORDER = "CREATE TABLE o AS SELECT 'i' || j AS item, 16 - j AS rank FROM range(17) b(j)"

# -- one valid call per releasing macro ----------------------------------------------------------

# 300 users; user u holds items i0 .. i(u % 17): popularity falls from 300 users (i0) to 17 (i16).
USER_ITEMS = ("CREATE TABLE t AS SELECT u AS user_id, 'i' || j AS item FROM range(300) a(u), range(17) b(j) "
              "WHERE j <= u % 17")


@dataclass
class Case:
    setup: str
    positional: tuple[str, ...]           # parameters without a default, passed positionally
    args: dict[str, str] = field(default_factory=dict)  # valid SQL for each parameter
    order_by: tuple[str, ...] = ("item",)  # the released order


def _union_case(extra: dict[str, str] | None = None) -> Case:
    args = {"tbl": "'t'", "epsilon": "1.0", "delta": "1e-5", "max_items": "10", "user_col": "'user_id'",
            "item_col": "'item'"}
    return Case(USER_ITEMS, ("tbl", "epsilon", "delta"), {**args, **(extra or {})})


_MAD = {"max_adaptive_degree": "50", "beta": "2"}
_MAD2R = {**_MAD, "split": "[0.1, 0.9]", "b_min": "0.5", "b_max": "2.0", "c_lb": "1.0", "c_ub": "3.0"}
_POLICY = {"alpha": "5", "passes": "1"}
_TOPK = {"k": "3", "domain_method": "'weighted_gaussian'"}

def _optimize_cases() -> dict[str, Case]:
    """The optimisation family's cases (tests/test_optimize_release.py declares them with their data)."""
    import test_optimize_release as opt

    return {name: Case(c.setup, c.positional, dict(c.args), c.order_by) for name, c in opt.CASES.items()}


CASES: dict[str, Case] = {
    "dp_set_union": _union_case({"method": "'weighted_gaussian'"}),
    "dp_set_union_count_laplace": _union_case(),
    "dp_set_union_count_gaussian": _union_case(),
    "dp_set_union_weighted_laplace": _union_case(),
    "dp_set_union_weighted_gaussian": _union_case(),
    "dp_set_union_mad": _union_case(_MAD),
    "dp_set_union_mad2r": _union_case(_MAD2R),
    "dp_set_union_sips": _union_case({"split": "[0.1, 0.9]"}),
    "dp_set_union_sips_cumulative": _union_case({"split": "[0.2, 0.3, 0.5]", "drop_margin": "1.5", "max_boost": "3",
                                                 "tilt": "0.5"}),
    "dp_set_union_policy_laplace": _union_case(_POLICY),
    "dp_set_union_policy_gaussian": _union_case(_POLICY),
    "dp_set_union_greedy_update": Case(USER_ITEMS + "; " + PUBLIC_ORDER, ("tbl", "epsilon", "delta"), {
        "tbl": "'t'", "epsilon": "1.0", "delta": "1e-5", "alpha": "3", "order_tbl": "'o'", "order_col": "'rank'",
        "user_col": "'user_id'", "item_col": "'item'"}),
    "dp_top_k": Case(USER_ITEMS, ("tbl", "k", "epsilon", "delta"), {**_union_case().args, **_TOPK}, ("rank",)),
    "dp_hitting_set": Case(USER_ITEMS, ("tbl", "k", "epsilon", "delta"), {**_union_case().args, **_TOPK}, ("rank",)),
    "dp_top_k_limited_domain": Case(USER_ITEMS, ("tbl", "k", "k_bar", "epsilon", "delta"), {
        **_union_case().args, "k": "3", "k_bar": "5"}, ("rank",)),
    # Element-level (one row) PWS releases: the key is the item, the frequency a number per row.
    "dp_weighted_sample": Case(USER_ITEMS, ("tbl", "epsilon", "delta"), {
        "tbl": "'t'", "epsilon": "1.0", "delta": "1e-5", "tau": "0.5", "scheme": "'ppswor'", "power": "1.0",
        "with_frequencies": "true", "key_col": "'item'", "freq_col": "'user_id'"}, ("key",)),
    "dp_sbh_histogram": Case(USER_ITEMS, ("tbl", "epsilon", "delta"), {
        "tbl": "'t'", "epsilon": "1.0", "delta": "1e-5", "tau": "0.5", "scheme": "'ppswor'", "power": "1.0",
        "key_col": "'item'", "freq_col": "'user_id'", "noise": "'granular'", "granularity": "0.5"}, ("key",)),
    **_optimize_cases(),
    "dp_group_by": Case(USER_ITEMS, ("tbl", "epsilon", "delta"), {
        **_union_case().args, "aggregates": "['count', 'sum', 'mean']", "value_col": "'user_id'", "lower": "0",
        "upper": "10", "selection": "'weighted_gaussian'", "split": "0.5", "pre_threshold": "1", "confidence": "0.9"}),
    # items_tbl: the table itself stands in for a public list (the tests below create only `t`).
    "dp_group_by_public": Case(USER_ITEMS, ("tbl", "items_tbl", "epsilon"), {
        "tbl": "'t'", "items_tbl": "'t'", "epsilon": "1.0", "max_items": "10", "aggregates": "['count', 'mean']",
        "value_col": "'user_id'", "lower": "0", "upper": "10", "confidence": "0.9", "user_col": "'user_id'",
        "item_col": "'item'"}),
}


def _call(name: str, case: Case, params: list[str], override: dict[str, str] | None = None) -> str:
    args = {**case.args, **(override or {})}
    pos = [args[p] for p in case.positional]
    named = [f"{p} := {args[p]}" for p in params if p not in case.positional and p in args]
    return f"SELECT * FROM {name}({', '.join(pos + named)})"


def _volatile(valid: str) -> str:
    # The same value in every row that reaches it, but not provably one value: stats() of this CASE
    # has a NULL and a non-NULL branch. For tbl, query_table evaluates it (to the valid name) while binding.
    return f"(CASE WHEN random() < 2 THEN {valid} ELSE NULL END)"


def _refusal(name: str, param: str) -> str:
    """The error a volatile ``param`` of macro ``name`` must raise (a regular expression)."""
    if param.endswith("_col") or param == "aggregates":  # dp_group_by selects its columns by aggregates
        # Column names select columns through COLUMNS(lambda ...), which DuckDB's binder itself refuses
        # to bind to an expression that is not constant: the query fails before it is planned.
        return "Binder Error: Unsupported expression in COLUMNS"
    names = [param]
    if param in {"method", "domain_method"}:
        names.append("epsilon")  # dp_set_union's branches see a volatile method as epsilon (90_dispatch.sql)
    if name == "dp_group_by":
        names.append("epsilon")  # its selection's epsilon is computed from every parameter (sql/97_group_by.sql)
    return rf"dpsql: ({'|'.join(names)}) must be a constant expression"


def _n_releases(con) -> int:
    return con.execute("SELECT count(*) FROM dp_releases()").fetchall()[0][0]


@pytest.fixture(scope="module")
def macro_con():
    con = dpsql.connect()
    yield con
    con.close()


def test_every_releasing_macro_has_a_case(macro_con):
    # A new releasing macro must be added to CASES (and so to every test below).
    assert releasing_macros(macro_con) == set(CASES)


def test_every_case_parameter_is_a_macro_parameter(macro_con):
    macros = _macros(macro_con)
    for name, case in CASES.items():
        params = macros[name][0]
        assert set(case.args) == set(params), name  # every parameter is exercised


@pytest.mark.parametrize("name", sorted(CASES))
def test_epsilon_and_delta_have_no_default(name):
    # A default would spend budget nobody typed: leaving either out is the binder's error, nothing charged.
    con = dpsql.connect()
    case = CASES[name]
    con.execute(case.setup)
    params = _macros(con)[name][0]
    for missing in [p for p in ("epsilon", "delta") if p in params]:
        named = ", ".join(f"{p} := {case.args[p]}" for p in params if p != missing)
        with pytest.raises(duckdb.BinderException, match="does not support the supplied arguments"):
            con.execute(f"SELECT * FROM {name}({named})").fetchall()
    assert _n_releases(con) == 0
    con.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_volatile_parameter_is_refused_before_the_charge(name):
    con = dpsql.connect()
    case = CASES[name]
    con.execute(case.setup)
    params = _macros(con)[name][0]
    con.execute(_call(name, case, params)).fetchall()  # the valid call releases
    assert _n_releases(con) >= 1
    for p in params:
        before = _n_releases(con)
        expected = _refusal(name, p)
        with pytest.raises(duckdb.Error, match=expected):
            con.execute(_call(name, case, params, {p: _volatile(case.args[p])})).fetchall()
        assert _n_releases(con) == before, (name, p)
    con.close()


def test_getvariable_and_prepared_parameters_are_constants(con):
    con.execute(USER_ITEMS)
    con.execute("SET VARIABLE eps = 0.5")
    con.execute("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := getvariable('eps'), delta := 1e-5)").fetchall()
    con.execute("SELECT * FROM dp_set_union_weighted_gaussian('t', epsilon := ?, delta := 1e-5, max_items := ?)", [0.25, 7]).fetchall()
    assert [(r[0], r[1]) for r in con.execute("SELECT epsilon, parameters FROM dp_releases()").fetchall()] == [
        (0.5, "{'max_items': 100.0, 'user_col': user_id, 'item_col': item}"),
        (0.25, "{'max_items': 7.0, 'user_col': user_id, 'item_col': item}")]


def test_issue_attack_volatile_epsilon_and_cap_release_nothing(con):
    # The attack of the issue: one user holds 5,000 items nobody else holds; epsilon and max_items that
    # flip between a tiny and a huge value released about half of them while the ledger showed 0.01.
    con.execute("CREATE TABLE t AS SELECT 'alice' AS user_id, 'secret_' || i AS item FROM range(5000) r(i)")
    for _ in range(4):
        with pytest.raises(duckdb.Error, match="must be a constant expression"):
            con.execute("""SELECT count(*) FROM dp_set_union('t', method := 'count_gaussian',
                           epsilon := CASE WHEN random() < 0.5 THEN 0.01 ELSE 1000 END, delta := 1e-5,
                           max_items := CASE WHEN random() < 0.5 THEN 1 ELSE 100000 END)""").fetchall()
    assert _n_releases(con) == 0


def test_check_constant_reads_statistics():
    assert check_constant("epsilon", '{"approx_unique":1,"has_no_null":true,"has_null":false,"max":0.5,"min":0.5}')
    assert check_constant("max_items", '{"approx_unique":1,"has_no_null":false,"has_null":true}')  # NULL
    for stats in ['{"has_no_null":true,"has_null":true}',  # random()
                  '{"approx_unique":1,"has_no_null":true,"has_null":false,"max":1000.00,"min":0.01}',  # CASE
                  '{"approx_unique":1,"has_no_null":true,"has_null":true,"max":1,"min":1}',  # value or NULL
                  'not json', None]:
        with pytest.raises(DPParameterError, match="dpsql: epsilon must be a constant"):
            check_constant("epsilon", stats)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if "item_col" in c.args))
def test_null_user_fails_before_the_charge(name):
    # The NULL is the table's last row of 3M: before the charge waited for the data, DuckDB ran the
    # charge first and then failed on the NULL for mad2r and policy_laplace (charged, nothing released).
    con = dpsql.connect()
    con.execute("CREATE TABLE t AS SELECT CASE WHEN i = 2999999 THEN NULL ELSE i % 300000 END AS user_id, "
                "'i' || (i % 1700) AS item FROM range(3000000) r(i)")
    con.execute(PUBLIC_ORDER)  # greedy_update's order_tbl
    case = CASES[name]
    with pytest.raises(duckdb.Error, match=r"dpsql: column user_id \(user_col\) contains NULL"):
        con.execute(_call(name, case, _macros(con)[name][0])).fetchall()
    assert _n_releases(con) == 0
    con.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if "key_col" in c.args))
def test_null_key_fails_before_the_charge(name):
    con = dpsql.connect()
    con.execute("CREATE TABLE t AS SELECT i % 300000 AS user_id, CASE WHEN i = 2999999 THEN NULL "
                "ELSE 'i' || (i % 1700) END AS item FROM range(3000000) r(i)")
    with pytest.raises(duckdb.Error, match=r"dpsql: column item \(key_col\) contains NULL"):
        con.execute(_call(name, CASES[name], _macros(con)[name][0])).fetchall()
    assert _n_releases(con) == 0
    con.close()


# -- row order -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_rows_come_out_in_released_order(name):
    con = dpsql.connect()
    case = CASES[name]
    con.execute(case.setup)
    params = _macros(con)[name][0]
    rows = con.sql(_call(name, case, params, {"epsilon": "5.0"})).to_arrow_table()
    assert rows.num_rows > 1, name  # the check below must have something to order
    keys = [rows.column(c).to_pylist() for c in case.order_by]
    assert list(zip(*keys)) == sorted(zip(*keys)), name
    con.close()


@pytest.mark.parametrize("method", ["weighted_gaussian", "policy_laplace"])
def test_issue_attack_row_order_does_not_reveal_the_added_user(method):
    # The attack of the issue: 2,000 users hold A-E; D' adds one user holding only E as the table's first
    # row. Engine order put E first in 200/200 runs with the user and 0/200 without.
    runs = 60
    hits = {}
    for with_v in (False, True):
        con = dpsql.connect()
        con.execute("SET threads = 1")
        body = "SELECT i AS user_id, unnest(['A','B','C','D','E']) AS item FROM range(2000) r(i)"
        con.execute(f"CREATE TABLE t AS SELECT -1 AS user_id, 'E' AS item UNION ALL {body}" if with_v
                    else f"CREATE TABLE t AS {body}")
        hits[with_v] = sum(dpsql.set_union(con, "t", method, epsilon=1.0, delta=1e-5).column("item")
                           .to_pylist()[:1] == ["E"] for _ in range(runs))
        con.close()
    assert hits == {False: 0, True: 0}
    assert epsilon_lower_bound(hits[True], hits[False], runs, 1e-5, 0.95) <= 1.0


def test_sorted_release_sorts_rows_by_the_released_columns():
    out = sorted_release(pa.table({"item": pa.array(["b", "a", "c", "a"]), "n": [1, 2, 3, 0]}))
    assert out.column("item").to_pylist() == ["a", "a", "b", "c"] and out.column("n").to_pylist() == [0, 2, 1, 3]
    by_n = sorted_release(pa.table({"item": ["x", "y"], "n": [5, 4]}), ["n"])
    assert by_n.column("item").to_pylist() == ["y", "x"]


# -- public Python release functions -------------------------------------------------------------

def _public_functions() -> dict[str, object]:
    """Every public function of dpsql's modules whose first parameter is a connection."""
    import pkgutil
    import importlib

    found = {}
    for info in pkgutil.iter_modules(dpsql.__path__):
        if info.name in {"__main__", "cli", "shell", "dbt", "spark", "demo"}:
            continue  # front ends with their own tests (test_cli, test_shell, test_dbt, test_spark)
        try:
            module = importlib.import_module(f"dpsql.{info.name}")
        except ImportError:
            continue  # an optional extra that is not installed
        for name in getattr(module, "__all__", []):
            fn = getattr(module, name, None)
            if inspect.isfunction(fn):
                params = list(inspect.signature(fn).parameters)
                if params and params[0] in {"con", "connection"}:
                    found[f"{fn.__module__}.{fn.__name__}"] = fn
    return found


# Functions that take a connection but release nothing.
NOT_RELEASES = {
    "dpsql.registration.register", "dpsql.registration.register_macros", "dpsql.registration.source_of",
    "dpsql.registration.register_functions",
    "dpsql.ledger.ledger_for", "dpsql.ledger.database_path",
    "dpsql.state.set_budget", "dpsql.state.budget", "dpsql.state.releases",
    "dpsql.state.attach", "dpsql.state.state_of", "dpsql.state.source_of", "dpsql.state.ledger_of",
    "dpsql.state.current_ledger",
    "dpsql.ledger.resolve_scope",
    "dpsql.optimize.baselines.eval_set_cover_cost", "dpsql.metrics.evaluate",  # NON-private evaluation
}

# Each public release function: the data it needs, a call at epsilon 0.8, and the column(s) its rows
# are ordered by.
def _optimize_calls() -> dict[str, tuple]:
    import test_optimize_release as opt

    return {
        "dpsql.optimize.max_coverage.max_coverage": (
            opt.SETS, lambda con: optimize.max_coverage(con, "sets", "cands", 2, epsilon=0.8), ("rank",)),
        "dpsql.optimize.set_cover.set_cover": (
            opt.SETS, lambda con: optimize.set_cover(con, "sets", "cands", epsilon=0.8), ("position",)),
        "dpsql.optimize.heavy_hitters.shifting_heavy_hitters": (
            opt.STREAM, lambda con: optimize.shifting_heavy_hitters(con, "st", "bk", 2, 3, epsilon=0.8),
            ("t", "bucket")),
        "dpsql.optimize.matroid_coverage.matroid_coverage": (
            opt.SETS, lambda con: optimize.matroid_coverage(con, "sets", "parts", "caps", epsilon=0.8, eta=0.5),
            ("set_id",)),
        "dpsql.optimize.k_median.k_median": (
            opt.METRIC, lambda con: optimize.k_median(con, "kp", "kc", "kd", 2, epsilon=0.8, n_bound=1000),
            ("candidate_id",)),
    }


RELEASE_CALLS = {
    "dpsql.union.set_union": (
        USER_ITEMS, lambda con: dpsql.set_union(con, "t", "mad2r", epsilon=0.8, delta=1e-5), ("item",)),
    "dpsql.topk.top_k": (USER_ITEMS, lambda con: dpsql.top_k(con, "t", 3, epsilon=0.8, delta=1e-5), ("rank",)),
    "dpsql.topk.hitting_set": (
        USER_ITEMS, lambda con: dpsql.hitting_set(con, "t", 3, epsilon=0.8, delta=1e-5), ("rank",)),
    "dpsql.topk.top_k_limited_domain": (
        USER_ITEMS, lambda con: dpsql.top_k_limited_domain(con, "t", 3, 5, epsilon=0.8, delta=1e-5), ("rank",)),
    "dpsql.pws.api.weighted_sample": (USER_ITEMS, lambda con: dpsql.pws.weighted_sample(con, "t", 0.8, 1e-5,
                                                                                      key_col="item"), ("key",)),
    **_optimize_calls(),
    "dpsql.groupby.group_by": (
        USER_ITEMS, lambda con: dpsql.group_by(con, "t", epsilon=0.8, delta=1e-5, max_items=10), ("item",)),
}


def test_every_public_release_function_is_listed():
    assert set(_public_functions()) - NOT_RELEASES == set(RELEASE_CALLS)


@pytest.mark.parametrize("qualname", sorted(RELEASE_CALLS))
def test_public_release_function_charges_its_epsilon_once(qualname):
    con = dpsql.connect()
    setup, call, order_by = RELEASE_CALLS[qualname]
    con.execute(setup)
    out = call(con)
    charged = con.execute("SELECT sum(epsilon) FROM dp_releases()").fetchall()[0][0]
    assert charged == pytest.approx(0.8, rel=1e-12), qualname
    keys = [out.column(c).to_pylist() for c in order_by]
    assert list(zip(*keys)) == sorted(zip(*keys)), qualname
    con.close()


@pytest.mark.parametrize("method", ["weighted_gaussian", "policy_laplace"])
def test_progress_is_checked_before_the_charge_and_its_failure_loses_nothing(method):
    con = dpsql.connect()
    con.execute(USER_ITEMS)
    with pytest.raises(DPParameterError, match="progress must be a function"):
        dpsql.set_union(con, "t", method, epsilon=1.0, delta=1e-5, progress=5)
    assert _n_releases(con) == 0

    def broken(pct):
        raise OSError("stderr is closed")

    with pytest.warns(RuntimeWarning, match="progress callback failed"):
        out = dpsql.set_union(con, "t", method, epsilon=5.0, delta=1e-5, progress=broken)
    assert _n_releases(con) == 1 and out.num_rows > 0  # charged once, and the rows reached the caller
    con.close()


def test_internal_macros_that_read_private_rows_are_documented(macro_con):
    # README ("Who is protected from whom") lists every internal macro that returns exact intermediates
    # of a private table without a charge, so that nobody mistakes one for a release.
    from pathlib import Path

    readme = Path(__file__).resolve().parents[1] / "README.md"
    if not readme.is_file():
        pytest.skip("README.md is not next to the tests")
    text = readme.read_text(encoding="utf-8")
    private = {"tbl", "sets_tbl", "rows_tbl"}
    internal = {name for name, (params, _, body) in _macros(macro_con).items()
                if name.startswith("dp__") and private & set(params) and "dp__charge(" not in body}
    assert internal and {name for name in internal if f"`{name}`" not in text} == set()
