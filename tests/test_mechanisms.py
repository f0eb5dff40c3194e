"""Every mechanism is declared once (dpsql.mechanism) and every front end derives from the declarations.

A declaration that disagrees with its SQL macro, lacks its proof note, or is missing from a front end
fails here -- so adding a mechanism is its module (with its declaration), its SQL file and its tests.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import dpsql
from dpsql import audit, cli, ledger, mechanisms, release, union
from dpsql.mechanism import PRIVACY_UNITS, REQUIRED, Mechanism, Param
from dpsql.registration import sql_dir

from test_release import CASES as RELEASE_CASES

PROOFS = Path(__file__).resolve().parents[1] / "docs" / "proofs"
ALL = mechanisms.all_mechanisms()


def _registered() -> dict[str, tuple[list[str], list[str]]]:
    con = dpsql.connect()
    try:
        rows = con.execute("SELECT function_name, parameters, parameter_types FROM duckdb_functions() "
                           "WHERE function_type = 'table_macro'").fetchall()
    finally:
        con.close()
    return {name: (list(params), [str(t) for t in types]) for name, params, types in rows}


REGISTERED = _registered()


def test_every_family_is_declared():
    assert {"set_union", "top_k", "pws", "optimize"} <= set(mechanisms.families())
    assert list(mechanisms.set_union_methods()) == list(dpsql.METHODS)
    assert len(ALL) == len(mechanisms.by_macro())  # one macro per mechanism


@pytest.mark.parametrize("name", sorted(ALL))
def test_declaration_matches_its_sql_macro(name):
    mech = ALL[name]
    assert mech.macro in REGISTERED, f"{mech.macro} is declared but not registered"
    params, types = REGISTERED[mech.macro]
    assert list(mech.param_names) == params
    assert [p.sql_type for p in mech.params] == types
    # the body the generated wrapper calls takes the same parameters (the wrapper passes each by name)
    assert REGISTERED[release.body_macro(mech)] == (params, types), release.body_macro(mech)
    defaults = cli.macro_defaults(mech.macro)
    for p in mech.params:
        if p.required:
            assert p.name not in defaults, f"{mech.macro}.{p.name} has a SQL default but is declared required"
        else:
            assert p.name in defaults, f"{mech.macro}.{p.name} is declared with a default the SQL lacks"
            assert _same_sql(defaults[p.name], p.sql_default()), (mech.macro, p.name, defaults[p.name])


def _same_sql(a: str, b: str) -> bool:
    con = dpsql.connect()
    try:
        x, y = con.execute(f"SELECT {a}, {b}").fetchall()[0]
    finally:
        con.close()
    return x == y


@pytest.mark.parametrize("name", sorted(ALL))
def test_privacy_parameters_are_required(name):
    mech = ALL[name]
    for p in ("epsilon", "delta"):
        if p in mech.param_names:
            assert mech.param(p).required, f"{mech.macro}: {p} must have no default"
    assert "epsilon" in mech.param_names


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_mechanism_has_its_proof_note(name):
    note = PROOFS / f"{ALL[name].proof}.md"
    assert note.is_file(), f"write docs/proofs/{ALL[name].proof}.md with the privacy argument of {name}"
    assert name.split("_")[0] in note.read_text(encoding="utf-8").lower()


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_mechanism_is_a_release_case(name):
    # tests/test_release.py runs every releasing macro through the release-path checks
    assert ALL[name].macro in RELEASE_CASES


def test_dispatcher_is_generated_from_the_declarations():
    shipped = (sql_dir() / "90_dispatch.sql").read_text(encoding="utf-8")
    assert shipped == union.dispatch_sql(), "regenerate sql/90_dispatch.sql from dpsql.union.dispatch_sql()"
    # the dispatcher runs, through query(), the call the declarations render for the chosen method
    assert "FROM query(" in shipped and "dp__set_union_body_sql(method, tbl, epsilon, delta, max_items" in shipped
    values = {"tbl": "t", "epsilon": 1.0, "delta": 1e-5, "max_items": 10.0, "user_col": "u", "item_col": "i"}
    for name, mech in union.METHODS.items():
        call = union.body_call_sql(name, values)
        assert call.startswith(f"SELECT item FROM {release.body_macro(mech)}('t', epsilon := "), call
        assert ("max_items := " in call) == ("max_items" in mech.param_names), call


def test_dispatcher_signature_comes_from_the_default_methods_declaration():
    params, _ = REGISTERED["dp_set_union"]
    assert params == ["tbl", "epsilon", "delta", "method", "max_items", "user_col", "item_col"]
    assert cli.macro_defaults("dp_set_union")["method"] == f"'{union.DEFAULT_METHOD}'"


def test_the_cli_offers_every_method_and_every_method_option():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    su = sub.choices["set-union"]
    method = next(a for a in su._actions if a.dest == "method")
    assert list(method.choices) == list(union.METHODS)
    flags = {a.dest for a in su._actions}
    for name in union.METHODS:
        for opt in union.options_of(name):
            assert f"option_{opt}" in flags, f"set-union has no --{opt.replace('_', '-')} for {name}"


def test_spark_runs_the_declared_parallel_methods():
    spark = pytest.importorskip("dpsql.spark")
    assert tuple(spark.PARALLEL_METHODS) == tuple(n for n, m in union.METHODS.items() if m.spark)


def test_every_set_union_and_top_k_mechanism_is_audited():
    audited = " ".join(case.sql(1.0, 1e-5) for case in audit.MECHANISMS.values())
    for mech in list(union.METHODS.values()) + [ALL["top_k"]]:
        assert f"{mech.macro}(" in audited, f"dpsql.audit has no case for {mech.name}"


def test_python_api_validates_against_the_declaration():
    con = dpsql.connect()
    con.execute("CREATE TABLE t AS SELECT u AS user_id, 'i' || (u % 3) AS item FROM range(50) r(u)")
    with pytest.raises(dpsql.DPParameterError, match="alpha does not apply to method 'mad2r'"):
        dpsql.set_union(con, "t", "mad2r", epsilon=1.0, delta=1e-5, alpha=2.0)
    with pytest.raises(dpsql.DPParameterError, match="max_items does not apply to method 'greedy_update'"):
        dpsql.set_union(con, "t", "greedy_update", epsilon=1.0, delta=1e-5, max_items=3)
    with pytest.raises(dpsql.DPParameterError, match="split"):
        dpsql.set_union(con, "t", "mad2r", epsilon=1.0, delta=1e-5, split=[0.5, 0.6])
    assert dpsql.releases(con) == []  # nothing charged
    # an option reaches the method's macro: split [1.0] is one round (MAD alone at full budget)
    out = dpsql.set_union(con, "t", "sips", epsilon=1.0, delta=1e-5, split=[1.0])
    assert out.column_names == ["item"]
    record = dpsql.releases(con)[-1]
    assert record.mechanism == "dp_set_union_sips" and "[1.0]" in record.parameters


def test_validate_fills_defaults_and_refuses_unknown_or_missing():
    mech = union.METHODS["mad2r"]
    values = mech.validate(tbl="t", epsilon=1, delta=1e-5)
    assert values["epsilon"] == 1.0 and values["max_items"] == 100 and values["beta"] == 2.0
    with pytest.raises(dpsql.DPParameterError, match="epsilon is required"):
        mech.validate(tbl="t", delta=1e-5)
    with pytest.raises(dpsql.DPParameterError, match="alpha is not a parameter of dp_set_union_mad2r"):
        mech.validate(tbl="t", epsilon=1, delta=1e-5, alpha=3)


def test_a_declaration_refuses_an_unknown_unit_and_duplicate_parameters():
    p = Param("epsilon", "DOUBLE")
    with pytest.raises(TypeError, match="unit"):
        Mechanism("x", "f", "dp_x", "row", (p,), "", "x")
    with pytest.raises(TypeError, match="duplicate"):
        Mechanism("x", "f", "dp_x", "user", (p, p), "", "x")
    assert Param("k", "DOUBLE").default is REQUIRED


def test_only_the_generated_wrappers_charge():
    # A mechanism's SQL holds its body: the charge (and the unit it records, the declaration's) is the
    # generated wrapper's alone (tests/test_release.py checks the unit each release records).
    for path in sql_dir().glob("*.sql"):
        text = path.read_text(encoding="utf-8")
        if path.name != "05_ledger.sql":
            assert "dp__charge(" not in text, path.name
    for mech in ALL.values():
        assert "dp__charge(dp__checked.macro, dp__checked.unit," in release.wrapper_sql(mech)


@pytest.fixture
def epsilons_checked(monkeypatch):
    """A function running a query and returning the epsilon values checked meanwhile (every module's
    check_epsilon is spied on)."""
    import sys

    from dpsql import validation
    seen: list = []
    original = validation.check_epsilon

    def spy(epsilon, *args, **kwargs):
        seen.append(epsilon)
        return original(epsilon, *args, **kwargs)

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("dpsql") and getattr(module, "check_epsilon", None) is original:
            monkeypatch.setattr(module, "check_epsilon", spy)

    def run(query: str) -> list:
        con = dpsql.connect()
        con.execute("CREATE TABLE t AS SELECT u AS user_id, 'i' || (u % 50) AS item FROM range(500) r(u)")
        seen.clear()
        con.execute(query).fetchall()
        con.close()
        return list(seen)

    return run


@pytest.mark.parametrize("method", ["mad2r", "weighted_gaussian", "policy_gaussian"])
def test_the_dispatcher_calibrates_only_the_method_it_runs(epsilons_checked, method):
    # The pruned branches receive a NULL epsilon (sql/90_dispatch.sql) and stop at its check: the values
    # calibrated are exactly those of the method's own macro. (Before: every branch calibrated, 4-6 s at
    # max_items 100,000 against 0.15 s for the method's macro.)
    direct = epsilons_checked(f"FROM {union.METHODS[method].macro}('t', epsilon := 0.7, delta := 1e-5, "
                              f"max_items := 100000)")
    dispatched = epsilons_checked(f"FROM dp_set_union('t', epsilon := 0.7, delta := 1e-5, method := '{method}', "
                                  f"max_items := 100000)")
    assert {e for e in dispatched if e is not None} == {e for e in direct if e is not None}
    # (the pruned branches stop at their NULL epsilon; how many checks a release makes depends on what
    # earlier releases in the process cached, so only the values are compared)
    # the analytic Gaussian's bisection no longer re-checks epsilon (a MAD2R release made 121 checks, 115
    # of them in the bisection): a few checks per calibration, not one per bisection step
    assert len(direct) <= 32, len(direct)
