"""Every mechanism is declared once (dpsql.core.mechanism) and every front end derives from the declarations.

A declaration that disagrees with its SQL macro, lacks its proof note, or is missing from a front end
fails here -- so adding a mechanism is its module (with its declaration), its SQL file and its tests.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import dpsql
from dpsql.tools import audit
from dpsql.frontends import cli
from dpsql.core import ledger, registry as mechanisms, release, sqltext
from dpsql import union
from dpsql.core.mechanism import PRIVACY_UNITS, REQUIRED, Mechanism, Param, preferred
from dpsql.core.sqltext import sql_dir, sql_files

from conftest import registered_signature, same_value
from test_release import release_cases

PROOFS = Path(__file__).resolve().parents[2] / "docs" / "proofs"
ALL = mechanisms.all_mechanisms()


def _registered() -> dict[str, tuple[list[str], list[str], str]]:
    con = dpsql.connect()
    try:
        rows = con.execute("SELECT function_name, parameters, parameter_types, macro_definition "
                           "FROM duckdb_functions() WHERE function_type = 'table_macro'").fetchall()
    finally:
        con.close()
    return {name: (list(params), [str(t) for t in types], definition) for name, params, types, definition in rows}


REGISTERED = _registered()


@pytest.fixture(scope="module")
def mcon():
    c = dpsql.connect()
    yield c
    c.close()


def test_every_family_is_declared():
    assert {"set_union", "top_k", "pws", "optimize"} <= set(mechanisms.families())
    assert list(mechanisms.set_union_methods()) == list(dpsql.METHODS)
    assert len(ALL) == len(mechanisms.by_macro())  # one macro per mechanism


# -- the conformance checks of one declaration (also run over a family added from outside: test_toy_mechanism)


def check_declaration_matches_its_sql_macro(mech: Mechanism, registered: dict[str, tuple[list[str], list[str], str]],
                                           con) -> None:
    # What DuckDB holds for the releasing macro and for its body: the declared names, order and types
    # (duckdb_functions()) and defaults (DuckDB's rendering of each, evaluated by DuckDB).
    for macro in (mech.macro, release.body_macro(mech)):
        assert macro in registered, f"{macro} is declared but not registered"
        params, types, _ = registered[macro]
        assert params == list(mech.param_names), macro
        assert types == [p.sql_type for p in mech.params], macro
        for p, (_, sql_type, default) in zip(mech.params, registered_signature(con, macro)):
            if p.required:
                assert default is None, f"{macro}.{p.name} has a SQL default but is declared required"
            else:
                assert default is not None, f"{macro}.{p.name} is declared with a default the SQL lacks"
                assert same_value(con, default, p.sql_default(), sql_type), (macro, p.name, default)
    # the body is the shipped query under its generated header: DuckDB holds the same definition for it
    # as for that query registered afresh
    body = sqltext.macro(release.body_macro(mech))
    assert body.generated and body.signature == release.signature(mech.params)
    con.execute(body.renamed("dp__test_shipped_body").sql)
    ((definition,),) = con.execute("SELECT macro_definition FROM duckdb_functions() "
                                   "WHERE function_name = 'dp__test_shipped_body'").fetchall()
    assert definition == registered[body.name][2]


def check_body_is_in_its_declared_file(mech: Mechanism) -> None:
    # Mechanism.sql names the file of the body (the registry orders mechanisms by it; registration loads
    # a family's files from outside the package by it)
    assert mech.sql, f"{mech.name} declares no SQL file (Mechanism.sql)"
    path = Path(mech.sql) if Path(mech.sql).is_absolute() else sql_dir() / mech.sql
    assert path in sql_files(), f"{mech.sql} is not loaded at registration"
    assert f"{sqltext.BODY_MARKER} {release.body_macro(mech)}\n" in path.read_text(encoding="utf-8"), mech.sql


def check_privacy_parameters_are_required(mech: Mechanism) -> None:
    for p in ("epsilon", "delta"):
        if p in mech.param_names:
            assert mech.param(p).required, f"{mech.macro}: {p} must have no default"
    assert "epsilon" in mech.param_names


def proof_note(mech: Mechanism) -> Path:
    """docs/proofs/<proof>.md, or the proof folder of the family that declares it."""
    return (mechanisms.family_of(mech).proofs or PROOFS) / f"{mech.proof}.md"


def check_proof_note(mech: Mechanism) -> None:
    note = proof_note(mech)
    assert note.is_file(), f"write docs/proofs/{mech.proof}.md with the privacy argument of {mech.name}"
    assert mech.name.split("_")[0] in note.read_text(encoding="utf-8").lower()


def check_example_is_a_release_case(mech: Mechanism) -> None:
    # tests/conformance/test_release.py runs every releasing macro through the release-path checks, with this call
    assert mech.example is not None, f"declare a small valid call of {mech.macro} (Mechanism.example)"
    assert mech.macro in release_cases()
    assert set(mech.example.arguments) == set(mech.param_names), mech.name  # every parameter is exercised


def check_audit_cases(mech: Mechanism) -> None:
    # each declared audit case is a case of the audit and releases through the mechanism's macro (a broken
    # variant: through the audit's own copy of it, which its setup registers)
    for spec in mech.audit:
        case = audit.declared_case(mech, spec)
        assert case.name in audit.MECHANISMS, f"dpsql.tools.audit lacks {mech.name}'s case {case.name}"
        assert audit.MECHANISMS[case.name].sql(1.0, 1e-5) == case.sql(1.0, 1e-5)
        if case.broken:
            assert case.setup is not None and "FROM dp__audit_" in case.sql(1.0, 1e-5), (mech.name, case.name)
        else:
            assert f"{mech.macro}(" in case.sql(1.0, 1e-5), (mech.name, case.name)


@pytest.mark.parametrize("name", sorted(ALL))
def test_declaration_matches_its_sql_macro(name, mcon):
    check_declaration_matches_its_sql_macro(ALL[name], REGISTERED, mcon)


@pytest.mark.parametrize("name", sorted(ALL))
def test_body_is_in_its_declared_file(name):
    check_body_is_in_its_declared_file(ALL[name])


def test_no_declared_default_is_written_in_sql():
    # Every declared body's header is generated (sqltext refuses a hand-written one); the files hold
    # only the body queries under their markers.
    bodies = {release.body_macro(m) for m in ALL.values()}
    assert {name for name, m in sqltext.macros().items() if m.generated} == bodies
    for f in sqltext.files():
        for name in bodies:
            assert f"MACRO {name}(" not in f.text, (f.name, name)


@pytest.mark.parametrize("name", sorted(ALL))
def test_privacy_parameters_are_required(name):
    check_privacy_parameters_are_required(ALL[name])


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_mechanism_has_its_proof_note(name):
    check_proof_note(ALL[name])


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_mechanism_is_a_release_case(name):
    check_example_is_a_release_case(ALL[name])


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_declared_audit_case_is_audited(name):
    check_audit_cases(ALL[name])


def test_mechanisms_are_listed_in_the_order_of_their_sql_files():
    # the registry's order (front ends list methods so): the SQL load order, then each module's order
    assert list(mechanisms.set_union_methods()) == [
        "count_laplace", "count_gaussian", "weighted_laplace", "weighted_gaussian",  # 30_union/10_basic.sql
        "mad", "mad2r", "sips",                                                      # 30_union/20_adaptive.sql
        "sips_cumulative",                                                           # 30_union/30_cumulative.sql
        "policy_laplace", "policy_gaussian", "greedy_update",                        # 30_union/40_policy.sql
        "auto"]                                                                      # 30_union/95_auto.sql
    files = [m.sql for m in ALL.values()]
    assert files == sorted(files)


def test_dispatcher_is_generated_from_the_declarations():
    shipped = next(f.text for f in sqltext.files() if f.name == "30_union/90_dispatch.sql")
    assert shipped == union.dispatch_sql(), "regenerate sql/30_union/90_dispatch.sql from dpsql.union.dispatch_sql()"
    # the dispatcher runs, through query(), the call the declarations render for the chosen method
    assert "FROM query(" in shipped and "dp__set_union_body_sql(method, tbl, epsilon, delta, max_items" in shipped
    values = {"tbl": "t", "epsilon": 1.0, "delta": 1e-5, "max_items": 10.0, "user_col": "u", "item_col": "i"}
    for name, mech in union.METHODS.items():
        call = union.body_call_sql(name, values)
        assert call.startswith(f"SELECT item FROM {release.body_macro(mech)}('t', epsilon := "), call
        assert ("max_items := " in call) == ("max_items" in mech.param_names), call


def test_dispatcher_signature_comes_from_the_default_methods_declaration(mcon):
    params, _, _ = REGISTERED["dp_set_union"]
    assert params == ["tbl", "epsilon", "delta", "method", "max_items", "user_col", "item_col"]
    reported = registered_signature(mcon, "dp_set_union")
    assert same_value(mcon, dict((n, d) for n, _, d in reported)["method"], f"'{union.DEFAULT_METHOD}'", "VARCHAR")
    # the CLI's flags default to the same values
    declared = cli._params("dp_set_union")
    assert set(declared) == set(params)
    for name, sql_type, default in reported:
        p = declared[name]
        assert (default is None) == p.required, name
        assert p.required or same_value(mcon, default, p.sql_default(), sql_type), name


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
    spark = pytest.importorskip("dpsql.frontends.spark")
    assert tuple(spark.PARALLEL_METHODS) == tuple(n for n, m in union.METHODS.items() if m.spark is not None)
    for name in spark.PARALLEL_METHODS:
        form = union.METHODS[name].spark
        assert form is not None and form.release in spark.RELEASES, name  # a Spark release for each
        if form.release == "one_shot":
            assert union.METHODS[name].weighting is not None, name


def test_defaults_are_the_most_preferred_declarations():
    # one place: Mechanism.preference (the Spark backend's default is the best method it runs)
    assert union.DEFAULT_METHOD == "sips_cumulative" == preferred(union.METHODS.values())
    spark = pytest.importorskip("dpsql.frontends.spark")
    assert spark.DEFAULT_METHOD == "sips_cumulative" == preferred(union.METHODS[n] for n in spark.PARALLEL_METHODS)


def test_the_choices_of_top_k_and_group_by_are_declared():
    from dpsql import groupby, topk

    assert topk.GAUSSIAN_DOMAIN_METHODS == {"weighted_gaussian", "count_gaussian", "policy_gaussian", "mad", "mad2r",
                                            "sips"}
    assert groupby.PRE_THRESHOLD_METHODS == ("count_laplace", "count_gaussian", "weighted_laplace", "weighted_gaussian")
    assert {n: union.METHODS[n].weighting for n in groupby.PRE_THRESHOLD_METHODS} == {
        "count_laplace": "count", "count_gaussian": "count", "weighted_laplace": "inverse",
        "weighted_gaussian": "inverse_sqrt"}


def test_the_cli_lists_every_declared_mechanism():
    import io

    out = io.StringIO()
    assert cli.main(["mechanisms"], out=out, err=io.StringIO()) == 0
    listed = [line.split()[0] for line in out.getvalue().splitlines()[1:]]
    assert listed == list(ALL)


def test_every_set_union_and_top_k_mechanism_is_audited():
    audited = " ".join(case.sql(1.0, 1e-5) for case in audit.MECHANISMS.values())
    for mech in list(union.METHODS.values()) + [ALL["top_k"]]:
        assert f"{mech.macro}(" in audited, f"dpsql.tools.audit has no case for {mech.name}"
        assert mech.audit, f"{mech.name} declares no audit case (Mechanism.audit)"


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
    # generated wrapper's alone (tests/conformance/test_release.py checks the unit each release records).
    for f in sqltext.files():
        if f.name != "00_core/05_ledger.sql":
            assert "dp__charge(" not in f.text, f.name
    for mech in ALL.values():
        assert "dp__charge(dp__checked.macro, dp__checked.unit," in release.wrapper_sql(mech)


@pytest.fixture
def epsilons_checked(monkeypatch):
    """A function running a query and returning the epsilon values checked meanwhile (every module's
    check_epsilon is spied on)."""
    import sys

    from dpsql.core import validation
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
    # The pruned branches receive a NULL epsilon (sql/30_union/90_dispatch.sql) and stop at its check: the values
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
