"""A family from outside the package, registered through the registry's one hook, is everywhere.

The toy family lives in a temporary directory: its module (a declaration and its UDFs), its SQL body
file and its proof note, and nothing else. ``dpsql.core.registry.add_family`` -- the hook dpsql's own
families go through when they are discovered -- registers it; then it is found by SQL (its generated
releasing macro runs and charges the ledger), by Python (the registry), by the CLI's list of
mechanisms, by the audit, and by the conformance checks of tests/conformance/test_mechanisms.py and
tests/conformance/test_release.py. It is removed at the end of each test: nothing leaks into other tests.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import sys
from pathlib import Path
from typing import Iterator

import duckdb
import pytest

import dpsql
from dpsql.core import registration, registry
from dpsql.core.release import check_release
from dpsql.frontends import cli
from dpsql.tools import audit

import test_mechanisms
import test_release

MODULE = "dpsql_toy_family"

TOY_MODULE = '''\
"""A toy family: counts of capped users per item, Laplace noise, a threshold (count_laplace's calibration)."""
from pathlib import Path

from duckdb.sqltypes import DOUBLE
import duckdb

from dpsql.union import basic
from dpsql.core.mechanism import AuditCase, Mechanism, user_item_example, user_item_params
from dpsql.core.udf import Udf, scalar


def toy_calibration(epsilon, delta, max_items):
    """Laplace noise of scale max_items/epsilon and its threshold: exactly count_laplace's."""
    return basic.count_laplace_calibration(epsilon, delta, max_items)


def udfs(source):
    def cal(epsilon, delta, max_items):
        c = toy_calibration(epsilon, delta, max_items)
        return {"scale": c.scale, "threshold": c.threshold}

    return [Udf("dp__toy_calibration", scalar(cal), (DOUBLE, DOUBLE, DOUBLE),
                duckdb.struct_type({"scale": DOUBLE, "threshold": DOUBLE}))]


MECHANISMS = (
    Mechanism(name="toy_count", family="toy", macro="dp_toy_count", unit="user", params=user_item_params(),
              description="toy: capped user counts, Laplace noise", proof="toy_count", calibrate=toy_calibration,
              sql=str(Path(__file__).with_name("toy.sql")), example=user_item_example(),
              audit=(AuditCase("threshold", options=(("max_items", 4), ("t", 4)), note="max_items 4"),
                     AuditCase("order", note="row order, added row stored first"))),
)
'''

TOY_SQL = """\
-- The toy family's body: counts of capped users per item, Laplace noise, released above the threshold.
-- dpsql:body dp__body_toy_count
WITH dp__cal AS (SELECT unnest(dp__toy_calibration(epsilon, delta, max_items))),
dp__weights AS MATERIALIZED (FROM dp__set_union_weights(tbl, 'count', max_items := max_items, user_col := user_col,
                                                        item_col := item_col))
SELECT item FROM dp__weights CROSS JOIN dp__cal
WHERE w + dp_laplace_noise(scale) > threshold;
"""

TOY_PROOF = """\
# toy_count: why the release is (epsilon, delta)-DP

count_laplace's argument: one user adds 1 to at most max_items counts (l1 sensitivity max_items),
Laplace noise of scale max_items/epsilon, and a threshold whose delta covers the added user's own items.
"""


@contextlib.contextmanager
def toy_family(folder: Path) -> Iterator[registry.Family]:
    """The toy family written to ``folder`` and registered; removed (and forgotten by Python) on exit."""
    (folder / f"{MODULE}.py").write_text(TOY_MODULE, encoding="utf-8")
    (folder / "toy.sql").write_text(TOY_SQL, encoding="utf-8")
    (folder / "proofs").mkdir()
    (folder / "proofs" / "toy_count.md").write_text(TOY_PROOF, encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        importlib.invalidate_caches()
        family = registry.add_family(importlib.import_module(MODULE), proofs=folder / "proofs")
        try:
            yield family
        finally:
            registry.remove_family(family)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(MODULE, None)


@pytest.fixture
def toy(tmp_path):
    with toy_family(tmp_path) as family:
        yield family


def _toy():
    return registry.all_mechanisms()["toy_count"]


def test_the_registry_has_it(toy):
    mech = _toy()
    assert toy.mechanisms == (mech,) and registry.family_of(mech) is toy
    assert registry.by_macro()["dp_toy_count"] is mech and registry.families()["toy"] == (mech,)
    assert list(registry.all_mechanisms())[-1] == "toy_count"  # after dpsql's own
    assert "toy_count" not in registry.set_union_methods() and "toy_count" not in dpsql.METHODS
    # Python: the declaration validates and calibrates a call as the release does
    checked = check_release(mech, {"tbl": "t", "epsilon": 1.0, "delta": 1e-5, "max_items": 4})
    assert checked["macro"] == "dp_toy_count" and checked["unit"] == "user" and checked["epsilon"] == 1.0
    with pytest.raises(dpsql.DPParameterError, match="epsilon"):
        mech.validate(tbl="t", epsilon=-1.0, delta=1e-5)


def test_its_releasing_macro_runs_and_charges_the_ledger(toy):
    con = dpsql.connect()
    try:
        con.execute(test_release.USER_ITEMS)
        rows = con.execute("SELECT * FROM dp_toy_count('t', epsilon := 5.0, delta := 1e-5, max_items := 4)").fetchall()
        released = [r[0] for r in rows]
        # i0 .. i3 are held by 300 .. 249 users, each counted (4 items a user at most): far above the
        # threshold (about 4 + 4 ln(1/delta)/5 ~ 13) at noise scale 4/5
        assert {"i0", "i1", "i2", "i3"} <= set(released) and released == sorted(released)
        assert [(r.mechanism, r.unit, r.epsilon, r.delta) for r in dpsql.releases(con)] == [
            ("dp_toy_count", "user", 5.0, 1e-5)]
        with pytest.raises(duckdb.Error, match="must be a constant expression"):
            con.execute("SELECT * FROM dp_toy_count('t', epsilon := random() + 1, delta := 1e-5)").fetchall()
        assert len(dpsql.releases(con)) == 1  # refused before anything was charged
    finally:
        con.close()


def test_the_cli_lists_it(toy):
    out = io.StringIO()
    assert cli.main(["mechanisms"], out=out, err=io.StringIO()) == 0
    assert ["toy_count", "toy", "user", "dp_toy_count"] in [line.split() for line in out.getvalue().splitlines()]


def test_the_audit_covers_it(toy):
    assert {"toy_count", "order_toy_count"} <= set(audit.MECHANISMS)
    assert "dp_toy_count(" in audit.MECHANISMS["toy_count"].sql(1.0, 1e-5)
    test_mechanisms.check_audit_cases(_toy())
    # and the audit runs it: a correct release is refuted with probability <= 1 % at confidence 0.99
    r = audit.audit("toy_count", epsilon=1.0, delta=1e-5, runs=1000, confidence=0.99, seed=5)
    assert r.runs == 1000 and not r.refuted and 0.0 <= r.epsilon_lower_bound <= 1.0
    refusal = audit.check_refusal("order_toy_count")
    assert refusal.refused and refusal.charges == 0


def test_the_conformance_checks_run_over_it(toy, monkeypatch):
    mech = _toy()
    registered = test_mechanisms._registered()
    con = dpsql.connect()
    try:
        test_mechanisms.check_declaration_matches_its_sql_macro(mech, registered, con)
    finally:
        con.close()
    test_mechanisms.check_body_is_in_its_declared_file(mech)
    test_mechanisms.check_privacy_parameters_are_required(mech)
    test_mechanisms.check_proof_note(mech)
    test_mechanisms.check_example_is_a_release_case(mech)
    # tests/conformance/test_release.py's release-path checks, with the cases derived afresh (the toy's among them)
    monkeypatch.setattr(test_release, "CASES", test_release.release_cases())
    assert "dp_toy_count" in test_release.CASES
    con = dpsql.connect()
    try:
        test_release.test_every_releasing_macro_has_a_case(con)
        test_release.test_every_case_parameter_is_a_macro_parameter(con)
        test_release.test_every_releasing_macro_is_its_generated_wrapper(con)
    finally:
        con.close()
    test_release.test_epsilon_and_delta_have_no_default("dp_toy_count")
    test_release.test_volatile_parameter_is_refused_before_anything_is_read("dp_toy_count")
    test_release.test_rows_come_out_in_released_order("dp_toy_count")
    test_release.test_item_spelling_of_every_releasing_macro("dp_toy_count")


def test_removing_it_leaves_nothing(tmp_path):
    before = list(registry.all_mechanisms())
    with toy_family(tmp_path):
        assert "toy_count" in registry.all_mechanisms()
        earlier = dpsql.connect()
        earlier.execute(test_release.USER_ITEMS)
    assert list(registry.all_mechanisms()) == before and "toy_count" not in audit.MECHANISMS
    # a connection registered while it was there keeps the macro, which now refuses to run, charging nothing
    try:
        with pytest.raises(duckdb.Error, match="toy_count is no longer a registered mechanism"):
            earlier.execute("SELECT * FROM dp_toy_count('t', epsilon := 1.0, delta := 1e-5)").fetchall()
        assert dpsql.releases(earlier) == []
    finally:
        earlier.close()
    assert all(path.name != "toy.sql" for path in registration.sql_files())
    con = dpsql.connect()
    try:
        found = con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name LIKE '%toy%'").fetchall()
    finally:
        con.close()
    assert found == [(0,)]


def test_a_family_that_declares_a_known_name_again_is_refused(tmp_path):
    (tmp_path / "dpsql_toy_clash.py").write_text(
        "from dpsql.core.registry import all_mechanisms\nMECHANISMS = (all_mechanisms()['weighted_gaussian'],)\n",
        encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        before = registry.registered_families()
        with pytest.raises(TypeError, match="declared twice"):
            registry.add_family(importlib.import_module("dpsql_toy_clash"))
        assert registry.registered_families() == before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("dpsql_toy_clash", None)
    with pytest.raises(KeyError, match="no family"):
        registry.remove_family("dpsql_toy_clash")
