"""A wrong column name is a dpsql error naming its parameter, raised before anything is charged.

The macros pick columns with COLUMNS(lambda ...); without the dp__absent column a name that matches nothing
fails in DuckDB's binder with a message about dpsql's internal star expression. The cases are generated from
what is registered: every public macro of the evaluation, PWS and optimisation families and each of its
parameters ending in _col, so a new macro or column parameter without a valid call here fails.
"""
from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql.core import sqltext

from test_release import CASES as RELEASE_CASES, Case, _call, _n_releases

_FILES = ("60_tools/evaluation.sql", "70_pws/pws.sql", "80_optimize/optimize.sql")

_EVAL_DATA = ("CREATE TABLE t AS SELECT u AS user_id, 'i' || j AS item FROM range(30) a(u), range(5) b(j) WHERE j <= u % 5;"
              "CREATE TABLE rel AS SELECT * FROM (VALUES ('i0'), ('i1')) v(item);")
_EVAL = {"tbl": "'t'", "released_tbl": "'rel'", "user_col": "'user_id'", "item_col": "'item'", "released_col": "'item'"}

# Valid calls of the macros that release nothing (the releasing ones come from tests/conformance/test_release.py).
LOCAL_CASES: dict[str, Case] = {
    "dp_eval_missing_mass": Case(_EVAL_DATA, ("tbl", "released_tbl"), {**_EVAL, "p": "1"}),
    "dp_eval_top_k_missing_mass": Case(_EVAL_DATA, ("tbl", "released_tbl", "k"), {**_EVAL, "k": "2"}),
    "dp_eval_hits": Case(_EVAL_DATA, ("tbl", "released_tbl"), dict(_EVAL)),
    "dp_eval_coverage_by_frequency": Case(_EVAL_DATA, ("tbl", "released_tbl"), dict(_EVAL)),
    "dp_threshold_sample": Case(RELEASE_CASES["dp_weighted_sample"].setup, ("tbl", "tau"), {
        "tbl": "'t'", "tau": "0.5", "key_col": "'item'", "freq_col": "'user_id'", "salt": "7"}),
    "dp_eval_set_cover_cost": Case(RELEASE_CASES["dp_set_cover"].setup
                                   + "CREATE TABLE perm AS SELECT * FROM (VALUES (1, 2), (2, 1)) v(position, set_id);",
                                   ("tbl", "permutation_tbl"), {
        "tbl": "'sets'", "permutation_tbl": "'perm'", "set_col": "'set_id'", "element_col": "'element'",
        "position_col": "'position'", "permutation_set_col": "'set_id'"}),
    "dp_weighted_sample_estimate": Case(
        "CREATE TABLE smp AS SELECT 'k' || i AS key, 1 + i % 5 AS token FROM range(20) r(i);",
        ("sample_tbl", "epsilon", "delta"), {
            "sample_tbl": "'smp'", "epsilon": "1.0", "delta": "1e-5", "key_col": "'key'", "token_col": "'token'"}),
}


def _public_macros() -> set[str]:
    """The public macros of the three files: written there, or generated around a body written there."""
    mine = [m.name for m in sqltext.macros().values() if m.file in _FILES]
    return {n for n in mine if n.startswith("dp_") and not n.startswith("dp__")} | \
        {"dp_" + n.removeprefix("dp__body_") for n in mine if n.startswith("dp__body_")}


def _column_params() -> dict[str, list[str]]:
    """Each public table macro of the three files with parameters ending in _col -> those parameters."""
    con = dpsql.connect()
    try:
        rows = con.execute("SELECT function_name, parameters FROM duckdb_functions() "
                           "WHERE function_type = 'table_macro'").fetchall()
    finally:
        con.close()
    mine = _public_macros()
    return {name: [p for p in params if p.endswith("_col")] for name, params in rows
            if name in mine and any(p.endswith("_col") for p in params)}


COLUMN_PARAMS = _column_params()


def _case(name: str) -> Case:
    return LOCAL_CASES.get(name) or RELEASE_CASES[name]


def test_every_macro_with_a_column_parameter_has_a_valid_call():
    assert {"dp_weighted_sample", "dp_eval_hits", "dp_k_median", "dp_eval_set_cover_cost"} <= set(COLUMN_PARAMS)
    missing = [name for name in COLUMN_PARAMS if name not in LOCAL_CASES and name not in RELEASE_CASES]
    assert not missing, f"add a valid call to LOCAL_CASES for {missing}"


@pytest.mark.parametrize("name", sorted(COLUMN_PARAMS))
def test_wrong_column_names_its_parameter_and_charges_nothing(name):
    con = dpsql.connect()
    case = _case(name)
    con.execute(case.setup)
    params = [p for p in case.args]
    con.execute(_call(name, case, params)).fetchall()  # the valid call runs (and charges if it releases)
    before = _n_releases(con)
    for p in COLUMN_PARAMS[name]:
        expected = (rf"^Invalid Input Error: dpsql: {p} := 'no_such_col' is not a column of '\w+'; its columns "
                    rf"are [\w, ]+\. Pass {p} := '<column name>'$")
        with pytest.raises(duckdb.Error, match=expected) as err:
            con.execute(_call(name, case, params, {p: "'no_such_col'"})).fetchall()
        assert "COLUMNS" not in str(err.value) and "dp__" not in str(err.value), (name, p)
        assert _n_releases(con) == before, (name, p)  # nothing charged
    con.close()


@pytest.mark.parametrize("name", sorted(COLUMN_PARAMS))
def test_wrong_column_of_an_empty_table_is_still_an_error(name):
    # Without rows no per-row check runs, and a missing column reads as a constant NULL the optimizer can
    # prune on: the error must come from a check that runs once per query.
    con = dpsql.connect()
    case = _case(name)
    con.execute(case.setup)
    tables = {v.strip("'") for k, v in case.args.items() if k == "tbl" or k.endswith("_tbl")}
    for t in tables:
        con.execute(f"DELETE FROM {t}")
    params = list(case.args)
    before = _n_releases(con)
    for p in COLUMN_PARAMS[name]:
        with pytest.raises(duckdb.Error, match=rf"dpsql: {p} := 'no_such_col' is not a column of"):
            con.execute(_call(name, case, params, {p: "'no_such_col'"})).fetchall()
    assert _n_releases(con) == before
    con.close()


def test_column_names_stay_case_insensitive():
    con = dpsql.connect()
    con.execute(_EVAL_DATA)
    assert con.execute("SELECT hits, users FROM dp_eval_hits('t', 'rel', user_col := 'USER_ID', item_col := 'Item', "
                       "released_col := 'ITEM')").fetchall() == [(30, 30)]
    assert con.execute("SELECT count(*) FROM dp_threshold_sample('t', 1e9, key_col := 'ITEM', "
                       "freq_col := 'User_Id', salt := 1)").fetchall() == [(5,)]
    con.close()
