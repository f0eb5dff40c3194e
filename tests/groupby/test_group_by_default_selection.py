"""dp_group_by's default selection, chosen per setting (issue 34 point 3; benchmarks/README.md, "The default
selection per setting"): ``selection := NULL`` resolves, from ``max_items`` and ``max_groups`` only, to the
truncated geometric coin when each user is capped at one group, else to the set-union default. The resolved
rule is what the calibration reports and the ledger records, and every front end (SQL, Python, CLI, the
BigQuery syntax) runs the same rule; an explicit selection is unchanged."""
from __future__ import annotations

import io
import json

import duckdb
import pyarrow as pa
import pytest

import dpsql
from dpsql import groupby as gb
from dpsql import union
from dpsql.core.state import ledger_of
from dpsql.core.validation import DPParameterError

from conftest import registered_signature, seeded
from test_group_by import load

TG, SIPS = gb.TRUNCATED_GEOMETRIC, union.DEFAULT_METHOD

# (max_items, max_groups) -> the rule the default names: the coin only when both caps are 1
RESOLUTION = [((1, None), TG), ((1, 1), TG), ((2, None), SIPS), ((2, 1), SIPS), ((1, 2), SIPS),
              ((100, 1), SIPS), ((100, None), SIPS), ((5, 5), SIPS), ((3, None), SIPS)]


def _rows(n_users: int = 300) -> list[tuple[int, str, float]]:
    """User u holds the groups g(u % 5) and g((u + 1) % 5) (two each): at max_items 1 the cap binds."""
    return [(u, f"g{(u + j) % 5}", float(u % 4)) for u in range(n_users) for j in range(2)]


@pytest.mark.parametrize("caps,rule", RESOLUTION)
def test_the_default_is_resolved_from_the_caps_only(caps, rule):
    max_items, max_groups = caps
    assert gb.TRUNCATED_GEOMETRIC_MAX_CAP == 1  # the measured crossover (benchmarks/README.md)
    assert gb.default_selection(max_items, max_groups) == rule
    # the calibration resolves it (its default, and the declaration's NULL through check_call) and reports it
    cal = gb.group_by_calibration(1.0, 1e-5, max_items, max_groups=max_groups)
    assert cal.selection == rule
    assert cal == gb.group_by_calibration(1.0, 1e-5, max_items, selection=rule, max_groups=max_groups)
    assert gb.check_call(1.0, 1e-5, max_items, ("count",), None, None, None, None, 0.5, 1, 0.95, public=False,
                         max_groups=max_groups) == cal


def test_the_coin_by_default_splits_the_selection_share_by_max_groups():
    cal = gb.group_by_calibration(1.0, 1e-5, 1)
    assert (cal.selection, cal.selection_cap, cal.selection_group_epsilon, cal.selection_group_delta) == (
        TG, 1, 0.5, 0.5e-5)
    assert cal.accounting.accountant == "basic"


def test_an_explicit_selection_is_kept_and_a_public_list_has_none():
    for selection in (SIPS, "mad", "post_threshold", TG):
        assert gb.group_by_calibration(1.0, 1e-5, 1, selection=selection).selection == selection
        assert gb.group_by_calibration(1.0, 1e-5, 100, selection=selection, max_groups=1).selection == selection
    assert gb.group_by_calibration(1.0, 1e-5, 1, selection=None).selection is None  # a public list
    assert gb.check_call(1.0, 1e-5, 1, ("count",), None, None, None, None, 0.5, 1, 0.95,
                         public=True).selection is None


def test_bad_caps_are_refused_by_their_own_checks_before_the_default_is_resolved():
    with pytest.raises(DPParameterError, match="max_items"):
        gb.group_by_calibration(1.0, 1e-5, 0)
    with pytest.raises(DPParameterError, match="max_groups"):
        gb.group_by_calibration(1.0, 1e-5, 1, max_groups=0)
    # pre_threshold names the rule the default resolved to
    with pytest.raises(DPParameterError, match="selection is 'truncated_geometric'"):
        gb.group_by_calibration(1.0, 1e-5, 1, pre_threshold=3)


def test_the_declaration_and_the_macros_default_is_null(con):
    mech = next(m for m in gb.MECHANISMS if m.name == "group_by")
    assert mech.param("selection").default is None
    sig = {name: (kind, default) for name, kind, default in registered_signature(con, "dp_group_by")}
    assert sig["selection"] == ("VARCHAR", "NULL")
    assert "selection VARCHAR := NULL" in gb.generated_sql()  # dp_group_by_calibration's header


@pytest.mark.parametrize("caps,rule", [((1, None), TG), ((100, 1), SIPS), ((2, None), SIPS)])
def test_sql_calibration_reports_the_resolved_rule(con, caps, rule):
    max_items, max_groups = caps
    got = con.execute("SELECT dp_group_by_calibration(1.0, 1e-5, max_items := ?, max_groups := ?).selection",
                      [max_items, max_groups]).fetchone()[0]
    assert got == rule
    explicit = con.execute("SELECT dp_group_by_calibration(1.0, 1e-5, max_items := 1, selection := 'mad').selection"
                           ).fetchone()[0]
    assert explicit == "mad"


def _last_calibration(con) -> dict:
    return json.loads(ledger_of(con).releases()[-1].calibration)


@pytest.mark.parametrize("caps,rule", [((1, None), TG), ((100, 1), SIPS)])
def test_the_default_release_is_the_explicit_rule_s_release(caps, rule):
    """A seeded release with the default and one with the resolved rule passed explicitly: the same rows (the
    same rule drew the same coins), and the ledger records the resolved rule for both, from SQL and Python."""
    max_items, max_groups = caps
    extra = "" if max_groups is None else f", max_groups := {max_groups}"
    outs, records = [], []
    for selection in (None, rule):
        con = seeded(20261128)
        load(con, _rows())
        sel = "" if selection is None else f", selection := '{selection}'"
        outs.append(con.sql(f"SELECT * FROM dp_group_by('t', 1.0, 1e-5, max_items := {max_items}{extra}{sel})"
                                ).to_arrow_table())
        records.append(_last_calibration(con))
        con.close()
    assert outs[0].equals(outs[1]) and outs[0].num_rows > 0
    assert records[0] == records[1] and records[0]["selection"] == rule
    con = seeded(20261128)
    load(con, _rows())
    py = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, max_items=max_items, max_groups=max_groups)
    assert py.equals(outs[0]) and _last_calibration(con) == records[0]
    con.close()


def test_cli_group_by_reports_and_runs_the_resolved_rule(tmp_path, monkeypatch):
    from dpsql.frontends import cli

    monkeypatch.chdir(tmp_path)
    rows = _rows()
    pa_table = pa.table({"user_id": [r[0] for r in rows], "item": [r[1] for r in rows]})  # noqa: F841
    duckdb.sql("COPY (FROM pa_table) TO 'data.parquet'")

    def run(*flags):
        out, err = io.StringIO(), io.StringIO()
        code = cli.main(["group-by", "data.parquet", "--epsilon", "1", "--delta", "1e-5", *flags, "--json"],
                        out=out, err=err)
        assert code == 0, err.getvalue()
        return json.loads(out.getvalue())

    assert run("--max-items", "1")["calibration"]["selection"] == TG
    assert run("--max-items", "100", "--max-groups", "1")["calibration"]["selection"] == SIPS
    # the rules the default may name are flags' choices too
    assert run("--max-items", "1", "--selection", "sips_cumulative")["calibration"]["selection"] == SIPS
    assert run("--max-items", "3", "--selection", TG)["calibration"]["selection"] == TG


def test_bigquery_syntax_with_one_group_per_unit_runs_the_coin(con):
    from dpsql.groupby import bigquery

    load(con, _rows())
    for k, rule in ((1, TG), (3, SIPS)):
        bigquery.sql(con, f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-5, "
                          f"max_groups_contributed = {k}, privacy_unit_column = user_id) item, "
                          f"COUNT(*, contribution_bounds_per_group => (0, 1)) AS n FROM t GROUP BY item")
        assert _last_calibration(con)["selection"] == rule
