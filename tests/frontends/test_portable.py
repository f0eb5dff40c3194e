"""The SQL stages other engines translate (dpsql.frontends.portable), checked without Java or pyspark.

A stage another engine may translate is marked ``-- dpsql:portable <name>`` directly above its
definition in ``sql/*.sql``. Here: every mark names the macro or CTE below it, every stage the
Spark backend addresses is marked (read from dpsql/frontends/spark.py's source, so a new call cannot skip
the mark), each marked stage translates to Spark SQL that sqlglot parses, unmarked stages and
bindings that are not inputs are refused, and the Spark backend's method list, options and
required budget come from the mechanism declarations. Skips only when sqlglot is missing."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

sqlglot = pytest.importorskip("sqlglot")

import dpsql  # noqa: E402
from dpsql.frontends import portable
from dpsql import union
from dpsql.frontends import spark as dspark
from dpsql.core.registry import set_union_methods  # noqa: E402
from dpsql.frontends.portable import MARKER, Stage, TranslationError, macros, stage_sql, stages  # noqa: E402
from dpsql.core import sqltext  # noqa: E402
from dpsql.core.validation import DPParameterError  # noqa: E402


def _body(macro: str):
    return sqlglot.parse_one(macros()[macro].body, read="duckdb")


def _ctes(tree) -> dict:
    return {c.alias: c for c in tree.find_all(sqlglot.exp.CTE)}


def _relation_params(macro: str) -> set[str]:
    """Parameters read as relations (``query_table(param)``)."""
    found = set()
    for fn in _body(macro).find_all(sqlglot.exp.Anonymous):
        if fn.name.lower() == "query_table" and fn.expressions and isinstance(fn.expressions[0], sqlglot.exp.Column):
            found.add(fn.expressions[0].name)
    return found & set(macros()[macro].params)


def _constants(macro: str, bound) -> dict:
    # Any number translates; 2.0 keeps b_min * b_max >= 1 (UserWeights' closed form, the translatable branch).
    return {p: 2.0 for p in macros()[macro].params if p not in bound}


# ---------------------------------------------------------------------------
# The marks
# ---------------------------------------------------------------------------

def test_every_mark_names_the_macro_or_cte_below_it():
    marks = portable._marks()
    assert marks
    for file, line, name, stage in marks:
        assert stage is not None, f"{file}:{line}: {MARKER} {name} is not directly above {name}'s definition"
        assert stage.macro in macros(), (file, line)
        if stage.cte is not None:
            assert stage.cte in _ctes(_body(stage.macro)), (file, line, stage.name)
    # every line that looks like a mark is one (a typo or an indented mark would be silently ignored)
    looks = [(f.name, i + 1) for f in sqltext.files() for i, text in enumerate(f.text.splitlines())
             if text.lstrip().startswith(MARKER)]
    assert looks == [(f, ln) for f, ln, _, _ in marks]
    assert len(stages()) == len(marks)  # no stage is marked twice


def _spark_calls() -> list[tuple[str, frozenset, str | None]]:
    """Every (macro, relation keys, output) that dpsql/frontends/spark.py translates, read from its source.

    A call whose macro, output or relation keys are not literals fails here: the stages the
    backend addresses must be visible to this test.
    """
    tree = ast.parse(Path(dspark.__file__).read_text())
    calls = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_run_stage"):
            continue
        first, rels = node.args[0], node.args[1]
        if isinstance(first, ast.Constant):
            names = [first.value]
        else:
            assert isinstance(first, ast.IfExp), ast.unparse(node)
            names = [first.body.value, first.orelse.value]
        assert isinstance(rels, ast.Dict) and all(isinstance(k, ast.Constant) for k in rels.keys), ast.unparse(node)
        output = None
        for kw in node.keywords:
            if kw.arg == "output":
                assert isinstance(kw.value, ast.Constant), ast.unparse(node)
                output = kw.value.value
        calls += [(name, frozenset(k.value for k in rels.keys), output) for name in names]
    return calls


def test_every_stage_the_spark_backend_translates_is_marked_and_translates():
    calls = _spark_calls()
    assert len(calls) >= 10
    used = {Stage(macro, output).name for macro, _, output in calls}
    # the contribution bounding is translated too, not re-implemented
    assert {"dp__user_items", "dp__capped_user_items", "dp__capped_user_items_window"} <= used
    assert used <= set(stages()), sorted(used - set(stages()))
    for macro, keys, output in calls:
        sql = stage_sql(macro, {k: f"rel_{i}" for i, k in enumerate(sorted(keys))}, _constants(macro, keys),
                        output=output)
        sqlglot.parse_one(sql, read="spark")


def test_a_kept_translation_is_the_fresh_one_with_the_calls_names():
    """Backends bind fresh ``dp__...`` names per call: the kept template, with those names in its slots, is
    exactly what translating afresh gives, for every call the Spark backend makes, on first use and after."""
    portable._TEMPLATES.clear()
    for round_ in range(2):
        for macro, keys, output in _spark_calls():
            names = {k: f"dp__spark_{round_}{i}x{len(k)}" for i, k in enumerate(sorted(keys, reverse=True))}
            constants = _constants(macro, keys)
            assert stage_sql(macro, names, constants, output=output) == \
                portable._stage_sql(macro, names, constants, output), (macro, output)
    assert portable._TEMPLATES  # and they were kept
    # Other names (not a dp__ identifier) are translated afresh, never put into a kept template's slots.
    kept = dict(portable._TEMPLATES)
    sql = stage_sql("dp__set_union_weights", {"dp__capped_user_items": "capped"}, {"weighting": "count"})
    assert "FROM capped" in sql and portable._TEMPLATES == kept
    # Constants are part of the key: another value is another translation.
    a = stage_sql("dp__set_union_weights", {"dp__capped_user_items": "dp__a"}, {"weighting": "count"})
    b = stage_sql("dp__set_union_weights", {"dp__capped_user_items": "dp__a"}, {"weighting": "inverse_sqrt"})
    assert "'count'" in a and "'inverse_sqrt'" in b


def test_every_marked_stage_translates_to_spark_sql():
    for stage in stages().values():
        tree = _body(stage.macro)
        inputs = portable._inputs(sqlglot.exp, tree, stage.cte)
        ctes = _ctes(tree)
        # Bind what only DuckDB can compute: nested macros, and input CTEs that call a dpsql UDF.
        udf_ctes = {name for name in inputs & set(ctes)
                    if any(f.name.lower().startswith("dp_") for f in ctes[name].find_all(sqlglot.exp.Anonymous))}
        bound = _relation_params(stage.macro) | (inputs - set(ctes)) | udf_ctes
        sql = stage_sql(stage.macro, {k: f"rel_{i}" for i, k in enumerate(sorted(bound))},
                        _constants(stage.macro, bound), output=stage.cte)
        parsed = sqlglot.parse_one(sql, read="spark")
        assert parsed.find(sqlglot.exp.Select) is not None, stage.name
        assert "noise" not in sql.lower() and "calibration" not in sql.lower(), stage.name


def test_unmarked_stages_and_stray_bindings_are_refused():
    with pytest.raises(TranslationError, match=r"the CTE dp__m2_noisy1 of dp__body_set_union_mad2r is not an exported stage"):
        stage_sql("dp__body_set_union_mad2r", {}, output="dp__m2_noisy1")
    with pytest.raises(TranslationError, match=r"the macro dp__body_set_union_mad2r is not an exported stage"):
        stage_sql("dp__body_set_union_mad2r", {"dp__capped_user_items_window": "c"})
    with pytest.raises(TranslationError, match=r"cannot bind 'dp__m2_p1', which is neither a relation parameter "
                                               r"nor an input"):
        stage_sql("dp__body_set_union_mad2r", {"dp__m2_noisy1": "n", "dp__m2_p1": "p"}, output="dp__m2_items2")
    with pytest.raises(TranslationError, match="no table macro named"):
        stage_sql("dp__nope", {})


def test_a_misplaced_mark_is_an_error(monkeypatch, tmp_path):
    bad = tmp_path / "99_bad.sql"
    bad.write_text("CREATE OR REPLACE TEMP MACRO dp__x(rel VARCHAR) AS TABLE\n"
                   "-- dpsql:portable dp__y\n"
                   "WITH dp__z AS (SELECT 1 AS a) FROM dp__z;\n")
    monkeypatch.setattr(sqltext, "sql_files", lambda: [bad])
    with pytest.raises(TranslationError, match=r"99_bad.sql:2: the mark -- dpsql:portable dp__y is not directly "
                                               r"above the definition"):
        portable.stages()


# ---------------------------------------------------------------------------
# What the translation makes explicit
# ---------------------------------------------------------------------------

def test_translated_stages_are_the_macros_with_bindings():
    sql = stage_sql("dp__set_union_weights", {"dp__capped_user_items": "capped"}, {"weighting": "inverse_sqrt"})
    assert "FROM capped" in sql and "'inverse_sqrt'" in sql
    assert "CAST(1.0 AS DOUBLE)" in sql  # Spark would read 1.0 as a DECIMAL and round 1/d
    assert "RAISE_ERROR" in sql.upper() and "ERROR(" not in sql.upper().replace("RAISE_ERROR(", "")
    # b_min * b_max >= 1: DuckDB prunes the UDF branch of UserWeights, and so does the translation.
    closed = stage_sql("dp__user_weight_rows", {"rows_rel": "rows"}, {"b_min": 0.5, "b_max": 2.0})
    assert "dp__user_weights" not in closed.lower() and "UNION" not in closed.upper()
    with pytest.raises(TranslationError, match="dp__user_weights"):
        stage_sql("dp__user_weight_rows", {"rows_rel": "rows"}, {"b_min": 0.5, "b_max": 1.5})
    with pytest.raises(TranslationError, match="b_min"):
        stage_sql("dp__user_weight_rows", {"rows_rel": "rows"}, {"b_max": 2.0})
    # A CTE of a release macro comes with what it reads and nothing else: no calibration, no noise.
    items2 = stage_sql("dp__body_set_union_mad2r", {"dp__m2_noisy1": "noisy", "dp__m2_cal": "cal"},
                       output="dp__m2_items2")
    assert "calibration" not in items2.lower() and "noise" not in items2.lower()
    assert "FROM noisy" in items2 and "cal AS dp__m2_cal" in items2


def test_list_subscripts_and_integer_parameters_keep_duckdbs_meaning():
    """DuckDB's x[i] counts from 1 and from the end when negative: Spark's element_at, not Spark's x[i]."""
    tree = sqlglot.parse_one("SELECT x[1], x[-1], x[r], x[-2], s['f'] FROM t", read="duckdb")
    got = portable._subscripts_as_element_at(sqlglot.exp, tree).sql(dialect="spark")
    assert got == "SELECT ELEMENT_AT(x, 1), ELEMENT_AT(x, -1), ELEMENT_AT(x, r), ELEMENT_AT(x, -2), s['f'] FROM t", got
    # a parameter declared INTEGER is bound as an integer (a list index), any other number as a DOUBLE
    assert portable._literal(sqlglot.exp, 3, "INTEGER").sql(dialect="spark") == "3"
    assert portable._literal(sqlglot.exp, 3, "DOUBLE").sql(dialect="spark") == "3.0e0"


def test_constants_are_bound_as_the_doubles_they_are():
    """A stage's DOUBLE constants (a round's calibration) are literals both engines read back exactly: the
    shortest repr with an exponent (a plain decimal literal is a DECIMAL first, whose conversion can round
    twice), an infinity as text, None as a typed NULL. Checked by running DuckDB's translation of a round's
    state on its own noisy sums against the same arithmetic in Python."""
    import math
    import random

    import duckdb

    exp = sqlglot.exp
    rnd = random.Random(3)
    values = [rnd.uniform(-1e3, 1e3) * 10 ** rnd.randint(-12, 12) for _ in range(200)]
    values += [0.1, 1 / 3, 2.5e-05, -21.340451374627897, 5e-324, 1.7976931348623157e308]
    con = duckdb.connect()
    texts = [portable._literal(exp, v, "DOUBLE").sql(dialect="duckdb") for v in values]
    assert all("e" in t and "CAST" not in t for t in texts)
    assert list(con.execute(f"SELECT [{', '.join(texts)}]").fetchone()[0]) == values
    assert portable._literal(exp, -math.inf, "DOUBLE").sql(dialect="spark") == "CAST('-Infinity' AS DOUBLE)"
    assert portable._literal(exp, None, "DOUBLE").sql(dialect="spark") == "CAST(NULL AS DOUBLE)"
    for v in (-math.inf, math.inf, None):
        assert con.execute(f"SELECT {portable._literal(exp, v, 'DOUBLE').sql(dialect='duckdb')}").fetchone()[0] == v
    # a round's state with its calibration bound: z = share * noisy, passed z >= F rho, dropped z < F drop_below
    share, big_f, rho = 0.03714660576604473, 0.060363234369822674, 95.07010371513447
    for drop_below in (-21.340451374627897, -math.inf):
        constants = {"share": share, "cumulative_share": big_f, "rho": rho, "drop_below": drop_below}
        sql = stage_sql("dp__sips_cumulative_round", {"dp__scr_noisy": "noisy"}, constants, output="dp__scr_state",
                        dialect="duckdb")
        noisy = [rnd.uniform(-2000, 3000) for _ in range(300)]
        con.execute("CREATE OR REPLACE TABLE noisy AS SELECT 'i' || i AS item, x AS noisy "
                    "FROM (SELECT unnest(range(len($1))) AS i, unnest($1) AS x)", [noisy])
        got = {item: (z, passed, dropped) for item, z, passed, dropped in con.execute(sql).fetchall()}
        want = {}
        for i, x in enumerate(noisy):
            z = share * x
            want[f"i{i}"] = (z, z >= big_f * rho, z < big_f * rho and z < big_f * drop_below)
        assert got == want


def test_a_keyed_scalar_lookup_is_a_left_join_outside_duckdb_with_the_same_rows():
    """Spark runs a correlated scalar subquery as a nested loop join once the looked-up relation outgrows its
    broadcast threshold: outside DuckDB the round's per-user lookup is an equi-join, with the same result."""
    import random

    import duckdb

    sums = stage_sql("dp__sips_cumulative_round", {"rows_rel": "rows", "prev_rel": "prev"},
                     {"share": 0.5, "max_boost": 2.0}, output="dp__scr_sums")
    assert re.search(r"LEFT JOIN \(SELECT \*, TRUE AS dp__found FROM dp__scr_users\) AS dp__lookup0 "
                     r"ON dp__lookup0.user_id IS NOT DISTINCT FROM", sums), sums
    assert "WHERE dp__scr_users.user_id" not in sums  # no correlated subquery left
    query = ("SELECT item, p, (SELECT {'c': c, 'k': u.k + 1} FROM u WHERE u.k IS NOT DISTINCT FROM r.k) AS w, "
             "(SELECT c FROM u AS v WHERE r.k IS NOT DISTINCT FROM v.k) AS c2 FROM r WHERE p > 0")
    rewritten = portable._keyed_lookups_as_joins(sqlglot.exp, sqlglot.parse_one(query, read="duckdb"))
    assert rewritten.sql(dialect="duckdb").count("LEFT JOIN") == 2
    rnd = random.Random(7)
    con = duckdb.connect()
    # keys unique in u (as the DuckDB form requires), some rows' keys absent from u, NULL keys on both sides
    con.execute("CREATE TABLE u AS SELECT * FROM (VALUES (1, 10.0), (2, 20.0), (NULL, 99.0), (5, NULL)) t(k, c)")
    con.execute("CREATE TABLE r (k INTEGER, item VARCHAR, p DOUBLE)")
    con.executemany("INSERT INTO r VALUES (?, ?, ?)",
                    [[rnd.choice([1, 2, 3, 5, None]), f"i{rnd.randrange(5)}", rnd.choice([0.0, 0.5, 1.0])]
                     for _ in range(200)])
    before = sorted(con.execute(query).fetchall(), key=repr)
    after = sorted(con.execute(rewritten.sql(dialect="duckdb")).fetchall(), key=repr)
    assert before == after and len(before) > 100
    # a query over more than one relation, or a lookup by anything but one key, is left as written
    for kept in ("SELECT (SELECT c FROM u WHERE u.k IS NOT DISTINCT FROM r.k) FROM r JOIN s USING (k)",
                 "SELECT (SELECT c FROM u WHERE u.k = r.k) FROM r",
                 "SELECT (SELECT max(c) FROM u WHERE u.k IS NOT DISTINCT FROM r.k GROUP BY u.k) FROM r"):
        tree = sqlglot.parse_one(kept, read="duckdb")
        assert portable._keyed_lookups_as_joins(sqlglot.exp, tree.copy()) == tree, kept


def test_the_cap_is_the_macro_with_a_64_bit_hash_and_the_bound_salt():
    for macro in ("dp__capped_user_items", "dp__capped_user_items_window"):
        sql = stage_sql(macro, {"dp__user_items": "pairs", "dp__salt": "salt"}, {"max_items": 3})
        # DuckDB's hash is 64 bits; Spark's hash is a 32-bit murmur3, whose ties would bias the ranking
        assert "XXHASH64(XXHASH64(user_id, item) ^ s)" in sql, sql
        assert not re.search(r"(?<!XX)HASH\(", sql.upper())
        assert "salt AS dp__salt" in sql and "secret" not in sql.lower()
        assert "ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY" in sql
        sqlglot.parse_one(sql, read="spark")


# ---------------------------------------------------------------------------
# The Spark backend's methods and parameters come from the declarations
# ---------------------------------------------------------------------------

SPARK_METHODS = {"count_laplace", "count_gaussian", "weighted_laplace", "weighted_gaussian", "mad", "mad2r", "sips",
                 "sips_cumulative"}
COMMON = {"tbl", "epsilon", "delta", "max_items", "user_col", "item_col"}


def test_spark_methods_and_options_are_the_declarations():
    declared = set_union_methods()
    assert dspark.PARALLEL_METHODS == tuple(n for n, m in declared.items() if m.spark is not None)
    assert set(dspark.PARALLEL_METHODS) == SPARK_METHODS
    for name in dspark.PARALLEL_METHODS:  # a release for each, and the weighting the one-shot release reads
        form = declared[name].spark
        assert form is not None and form.release in dspark.RELEASES, name
        assert (form.release == "one_shot") == (declared[name].weighting is not None), name
    assert ({n for n in dspark.PARALLEL_METHODS if declared[n].spark.release != "one_shot"}
            == {"mad", "mad2r", "sips", "sips_cumulative"})
    assert dspark.DEFAULT_METHOD == union.DEFAULT_METHOD  # the most preferred declaration has a Spark form
    for name in dspark.PARALLEL_METHODS:
        assert dspark._options_of(name) == tuple(n for n in declared[name].param_names if n not in COMMON)
    assert dspark._options_of("mad2r") == ("split", "max_adaptive_degree", "beta", "b_min", "b_max", "c_lb", "c_ub")


@pytest.mark.parametrize("fn", [dspark.set_union, dspark.top_k_domain])
def test_spark_releases_require_epsilon_and_delta(fn):
    params = inspect.signature(fn).parameters
    for name in ("epsilon", "delta"):
        assert params[name].default is inspect.Parameter.empty, name
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="epsilon"):
        fn(None, *(() if fn is dspark.set_union else (10,)), delta=1e-5)


@pytest.mark.parametrize("method,kwargs", [
    ("weighted_gaussian", dict(beta=2.0)),
    ("mad", dict(split=[0.5, 0.5])),
    ("sips", dict(tbl="t")),
    ("mad2r", dict(b_min=0.2)),
    ("mad2r", dict(split=[0.5, 0.6])),
    ("mad", dict(max_adaptive_degree=1.5)),
    ("sips_cumulative", dict(tilt=-1.0)),
    ("sips_cumulative", dict(drop_margin=101.0)),
    ("count_laplace", dict(max_items=2.5)),
    ("weighted_gaussian", dict(epsilon=0.0)),
    ("policy_gaussian", dict()),
])
def test_spark_parameter_errors_are_dpsql_set_union_errors(method, kwargs):
    """Refused before the DataFrame is touched (here: None), with dpsql.set_union's message."""
    given = {"epsilon": 1.0, "delta": 1e-5, **kwargs}
    with pytest.raises(DPParameterError) as spark_err:
        dspark.set_union(None, method, **given)
    if method not in dspark.PARALLEL_METHODS:
        assert "has no Spark form" in str(spark_err.value)
        return
    con = dpsql.connect()
    try:
        con.execute("CREATE TABLE t (user_id BIGINT, item VARCHAR)")
        with pytest.raises(Exception) as duck_err:  # some checks run in the macro's calibration UDF
            union.set_union(con, "t", method, **given)
    finally:
        con.close()
    assert str(spark_err.value).startswith("dpsql: ")
    assert str(spark_err.value) in str(duck_err.value)
