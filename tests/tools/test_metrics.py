"""NON-PRIVATE evaluation metrics (docs/proofs/reference_checks.md E1), in Python and as dp_eval_* macros,
and `dpsql evaluate`."""
from __future__ import annotations

import io
import json
import math

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.tools import metrics
from dpsql.frontends.cli import main
from dpsql.core.validation import DPParameterError

TOY = {1: {"a", "b"}, 2: {"a"}, 3: {"a", "c"}}  # docs/proofs/reference_checks.md E1: N = 5, N(a) = 3


@pytest.fixture
def toy(con):
    rows = [(u, x) for u, s in TOY.items() for x in sorted(s)]
    staged = pa.table({"user_id": [r[0] for r in rows], "item": [r[1] for r in rows]})  # noqa: F841
    con.execute("CREATE TABLE w AS SELECT * FROM staged")
    con.execute("CREATE TABLE s_a AS SELECT 'a' AS item")
    con.execute("CREATE TABLE s_c AS SELECT 'c' AS item")
    con.execute("CREATE TABLE s_none (item VARCHAR)")
    return con


def test_toy_values_in_python():
    assert metrics.item_counts(TOY) == {"a": 3, "b": 1, "c": 1}
    assert metrics.missing_mass(TOY, {"a"}) == pytest.approx(2 / 5)
    assert metrics.missing_mass(TOY, {"a"}, p=math.inf) == pytest.approx(1 / 5)
    assert metrics.missing_mass(TOY, {"a"}, p=0) == 2
    assert metrics.missing_mass(TOY, {"a"}, p=2) == pytest.approx(math.sqrt(2) / 5)
    assert metrics.top_k_missing_mass(TOY, ["a"], 2) == pytest.approx(1 / 5)
    assert metrics.hits(TOY, {"c"}) == 1
    assert metrics.hits(TOY, metrics.greedy_hitting_set(TOY, 1)) == 3  # Opt(W, 1) = 3
    assert metrics.missing_mass(TOY, {"a", "b", "c"}) == 0.0
    assert metrics.coverage_by_frequency(TOY, {"a"}) == [(0, 2, 0), (1, 1, 1)]


def test_toy_values_in_sql(toy):
    def mm(released, p="1"):
        return toy.execute(f"FROM dp_eval_missing_mass('w', '{released}', p := {p})").fetchall()[0][1]

    assert mm("s_a") == pytest.approx(2 / 5)
    assert mm("s_a", "'infinity'::DOUBLE") == pytest.approx(1 / 5)
    assert mm("s_a", "0") == 2
    assert mm("s_a", "2") == pytest.approx(math.sqrt(2) / 5)
    assert mm("s_none") == pytest.approx(1.0)
    assert toy.execute("FROM dp_eval_top_k_missing_mass('w', 's_a', 2)").fetchall() == [(2, 1, pytest.approx(0.2))]
    assert toy.execute("FROM dp_eval_top_k_missing_mass('w', 's_none', 1)").fetchall() == [(1, 0, pytest.approx(0.6))]
    assert toy.execute("FROM dp_eval_hits('w', 's_c')").fetchall() == [(1, 3)]
    assert toy.execute("FROM dp_eval_coverage_by_frequency('w', 's_a')").fetchall() == [(0, 1, 1, 2, 0),
                                                                                       (1, 2, 3, 1, 1)]


def test_bad_arguments(toy):
    with pytest.raises(duckdb.Error, match="p must be a number >= 0"):
        toy.execute("FROM dp_eval_missing_mass('w', 's_a', p := -1)").fetchall()
    with pytest.raises(duckdb.Error, match="more than k = 1"):
        toy.execute("FROM dp_eval_top_k_missing_mass('w', 'w', 1)").fetchall()
    with pytest.raises(duckdb.Error, match="k must be a whole number"):
        toy.execute("FROM dp_eval_top_k_missing_mass('w', 's_a', 1.5)").fetchall()
    with pytest.raises(DPParameterError, match="p must"):
        metrics.missing_mass(TOY, {"a"}, p=-2)
    with pytest.raises(DPParameterError, match="more than k"):
        metrics.top_k_missing_mass(TOY, ["a", "b"], 1)


def test_greedy_takes_the_largest_marginal_gain():
    users = {1: {"a", "b"}, 2: {"a", "b"}, 3: {"a"}, 4: {"c"}, 5: {"c"}, 6: {"b"}}
    assert metrics.greedy_hitting_set(users, 2) == ["a", "c"]  # a hits 3; then c hits 2 more (b only 1)
    assert metrics.greedy_hitting_set(users, 10) == ["a", "c", "b"]  # min(k, |D|) rounds
    assert metrics.greedy_hitting_set(users, 1, domain=["b", "c"]) == ["b"]


def test_evaluate_matches_the_python_references(toy):
    doc = metrics.evaluate(toy, "w", "s_a", k=2)
    assert doc["missing_mass"] == pytest.approx(0.4)
    assert doc["missing_mass_p"] == {"0": 2.0, "1": pytest.approx(0.4), "2": pytest.approx(math.sqrt(2) / 5),
                                     "inf": pytest.approx(0.2)}
    assert (doc["hits"], doc["users"], doc["released_items"], doc["k"]) == (3, 3, 1, 2)
    assert doc["top_k_missing_mass"] == pytest.approx(0.2)
    assert [b["items"] for b in doc["coverage_by_frequency"]] == [2, 1]


def test_random_data_sql_agrees_with_python(con):
    import random
    rng = random.Random(4)
    users = {u: {f"w{int(rng.paretovariate(1.2)) % 60}" for _ in range(rng.randint(1, 12))} for u in range(150)}
    rows = [(u, x) for u, s in users.items() for x in s]
    staged = pa.table({"user_id": [r[0] for r in rows], "item": [r[1] for r in rows]})  # noqa: F841
    con.execute("CREATE TABLE r AS SELECT * FROM staged")
    released = sorted(metrics.item_counts(users))[::3][:7]
    con.execute("CREATE TABLE rel AS SELECT unnest(?::VARCHAR[]) AS item", [released])
    doc = metrics.evaluate(con, "r", "rel", k=7)
    for key, p in (("0", 0), ("1", 1), ("2", 2), ("inf", math.inf)):
        assert doc["missing_mass_p"][key] == pytest.approx(metrics.missing_mass(users, released, p), rel=1e-12)
    assert doc["top_k_missing_mass"] == pytest.approx(metrics.top_k_missing_mass(users, released, 7), rel=1e-12)
    assert doc["hits"] == metrics.hits(users, released)
    assert [(b["bucket"], b["items"], b["released_items"]) for b in doc["coverage_by_frequency"]] == \
        metrics.coverage_by_frequency(users, released)


def test_cli_evaluate_json(tmp_path):
    data = tmp_path / "data.parquet"
    pq.write_table(pa.table({"user_id": [1, 1, 2, 3, 3], "item": ["a", "b", "a", "a", "c"]}), data)
    released = tmp_path / "released.csv"
    released.write_text("rank,item\n1,a\n")
    out, err = io.StringIO(), io.StringIO()
    assert main(["evaluate", str(data), "--released", str(released), "--k", "2", "--json"], out=out, err=err) == 0, \
        err.getvalue()
    doc = json.loads(out.getvalue())
    assert doc["private"] is False and "NON-PRIVATE" in doc["note"]
    assert doc["missing_mass"] == pytest.approx(0.4) and doc["top_k_missing_mass"] == pytest.approx(0.2)
    assert doc["hits"] == 3
    out = io.StringIO()
    assert main(["evaluate", str(data), "--released", str(released)], out=out, err=err) == 0
    assert "NON-PRIVATE" in out.getvalue() and "missing mass" in out.getvalue()
    assert main(["evaluate", str(data), "--released", str(tmp_path / "nope.csv")], out=out, err=err) == 2
