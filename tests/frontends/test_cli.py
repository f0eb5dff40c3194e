"""The ``dpsql`` command line end to end: releases, inputs, output formats, Ctrl-C.

A few runs go through `python -m dpsql` in subprocesses, all started at once in
a module fixture (each process spends most of its time importing, so running
them side by side keeps the module fast); the other cases call
``dpsql.frontends.cli.main`` in this process, which is the same code without the import.
"""
from __future__ import annotations

import decimal
import io
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from dpsql.frontends.cli import main

BUDGET = ["--epsilon", "1", "--delta", "1e-5"]
PARAMS = [*BUDGET, "--max-items", "10"]
N_USERS = 400


def dpsql_cmd(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run([sys.executable, "-m", "dpsql", *args], input=stdin, capture_output=True,
                          text=True, encoding="utf-8", cwd=cwd, env=env, timeout=300)


def cli(*args: str) -> SimpleNamespace:
    """Run ``dpsql ARGS`` in this process; the exit code and both outputs."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def assert_clean(result: subprocess.CompletedProcess) -> None:
    """No traceback and no engine teardown noise, whatever the exit code."""
    assert "Traceback" not in result.stderr, result.stderr
    assert "leaked" not in result.stderr, result.stderr


def rows() -> list[tuple[str, str]]:
    """Each user: the 5 common items (always released), 3 of 20 mid items (weight
    near the threshold, so their release is random), and one item of its own."""
    out = []
    for u in range(N_USERS):
        items = [f"common{j}" for j in range(5)]
        items += [f"mid{(u + 7 * j) % 20:02d}" for j in range(3)]
        items.append(f"rare{u}")
        out += [(f"user{u}", item) for item in items]
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("cli")
    pairs = rows()
    table = pa.table({"user_id": [p[0] for p in pairs], "item": [p[1] for p in pairs],
                      "extra": list(range(len(pairs)))})
    pq.write_table(table, folder / "data.parquet")
    pcsv.write_csv(table, folder / "data.csv")
    con = duckdb.connect(str(folder / "data.duckdb"))
    try:
        con.register("staged", table.rename_columns(["uid", "word", "extra"]))
        con.execute("CREATE TABLE events AS SELECT * FROM staged")
        con.execute("CREATE TABLE other AS SELECT 1 AS a")
    finally:
        con.close()
    return SimpleNamespace(dir=folder, items={p[1] for p in pairs},
                           common={f"common{j}" for j in range(5)})


@pytest.fixture(scope="module")
def runs(data) -> dict[str, subprocess.CompletedProcess]:
    """The subprocess runs, started together."""
    commands = {
        "parquet": ["set-union", "data.parquet", *PARAMS],
        "bad_epsilon": ["set-union", "data.parquet", "--epsilon", "-1", "--delta", "1e-5", "--max-items", "10"],
        "missing_file": ["set-union", "no_such_file.parquet", *PARAMS],
        "progress": ["set-union", "data.parquet", *PARAMS, "--progress", "--seed", "3"],
        "weak": ["set-union", "data.parquet", "--epsilon", "20", "--delta", "1e-5", "--ledger", "weak.dpsql-ledger"],
        "no_command": [],
    }
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        futures = {name: pool.submit(dpsql_cmd, *argv, cwd=data.dir) for name, argv in commands.items()}
        return {name: future.result() for name, future in futures.items()}


# ---------------------------------------------------------------- subprocesses

def test_parquet_prints_items_one_per_line(runs, data):
    r = runs["parquet"]
    assert_clean(r)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    items = r.stdout.splitlines()
    assert len(items) == len(set(items))
    assert set(items) <= data.items
    assert data.common <= set(items)  # weight 400/3 against a threshold near 19: released with certainty
    assert items == sorted(items)


def test_bad_epsilon_exits_2_without_traceback(runs):
    r = runs["bad_epsilon"]
    assert_clean(r)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "epsilon" in lines[0]


def test_missing_file_is_one_clear_line(runs):
    r = runs["missing_file"]
    assert_clean(r)
    assert r.returncode == 2
    line = r.stderr.strip()
    assert line.startswith("Error: ") and "\n" not in line
    assert "no_such_file.parquet" in line and "does not exist" in line


def test_progress_and_seed_warning_on_stderr(runs, data):
    r = runs["progress"]
    assert_clean(r)
    assert r.returncode == 0, r.stderr
    assert "NOT differentially private" in r.stderr
    assert "progress: 100%" in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "released" in last and last.endswith(" s")
    assert set(r.stdout.splitlines()) <= data.items  # stdout holds only the items


def test_weak_parameters_warn_in_one_line_without_source(runs, data):
    r = runs["weak"]
    assert_clean(r)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["dpsql: warning: weak privacy parameters of dp_set_union_sips_cumulative: epsilon "
                                     "= 20 > 10 (the odds of any outcome may change by a factor up to e^epsilon). The "
                                     "release runs; choose smaller values for a meaningful guarantee"]
    assert data.common <= set(r.stdout.splitlines())


def test_no_command_shows_help(runs):
    r = runs["no_command"]
    assert_clean(r)
    assert r.returncode == 2
    assert "set-union" in r.stderr


# ---------------------------------------------------------------- in process

def test_csv_json(data):
    r = cli("set-union", str(data.dir / "data.csv"), *PARAMS, "--json", "--method", "count_gaussian")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["method"] == "count_gaussian"
    assert (doc["epsilon"], doc["delta"], doc["max_items"]) == (1.0, 1e-5, 10)
    assert doc["input"] == str(data.dir / "data.csv")
    assert doc["n_released"] == len(doc["items"])
    assert set(doc["items"]) <= data.items
    cal = doc["calibration"]
    assert cal["noise"] == "gaussian" and cal["scale"] > 0 and cal["threshold"] > 0
    assert doc["private"] is True


def test_json_calibration_matches_library(data):
    import dpsql

    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--json")
    cal = dpsql.calibrate(dpsql.DEFAULT_METHOD, epsilon=1.0, delta=1e-5, max_items=10)
    doc = json.loads(r.stdout)
    assert doc["method"] == dpsql.DEFAULT_METHOD
    assert doc["calibration"] == {"noise": cal.noise, "scale": cal.scale, "threshold": cal.threshold}


def test_duckdb_table_to_parquet(data, tmp_path):
    out = tmp_path / "out.parquet"
    r = cli("set-union", str(data.dir / "data.duckdb"), "--table", "events", "--user-col", "uid",
            "--item-col", "word", *PARAMS, "--output", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "items" not in doc and doc["output"] == str(out)
    written = pq.read_table(out)
    assert written.column_names == ["item"]
    assert written.num_rows == doc["n_released"]
    items = written.column("item").to_pylist()
    assert data.common <= set(items) <= data.items
    assert items == sorted(items)  # the file keeps the release's value order


def test_output_csv(data, tmp_path):
    out = tmp_path / "out.csv"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    written = pcsv.read_csv(out)
    assert written.column_names == ["item"]
    assert set(written.column("item").to_pylist()) <= data.items


@pytest.mark.parametrize("flags, parameter", [
    (["--epsilon", "0", "--delta", "1e-5", "--max-items", "10"], "epsilon"),
    (["--epsilon", "inf", "--delta", "1e-5", "--max-items", "10"], "epsilon"),
    (["--epsilon", "1", "--delta", "1.5", "--max-items", "10"], "delta"),
    (["--epsilon", "1", "--delta", "0", "--max-items", "10"], "delta"),
    (["--epsilon", "1", "--delta", "1e-5", "--max-items", "0"], "max_items"),
    (["--epsilon", "1", "--delta", "1e-5", "--max-items", "2.5"], "--max-items"),
    (["--epsilon", "x", "--delta", "1e-5", "--max-items", "10"], "--epsilon"),
    ([*PARAMS, "--method", "nope"], "--method"),
])
def test_bad_parameter_exits_2_naming_it(data, flags, parameter):
    r = cli("set-union", str(data.dir / "data.parquet"), *flags)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and parameter in lines[0]


@pytest.mark.parametrize("args, words", [
    (["data.duckdb", "--table", "no_such_table"], ["no_such_table", "events", "other"]),
    (["data.duckdb"], ["--table", "events", "other"]),
    (["data.parquet", "--user-col", "author"], ["--user-col", "author", "user_id"]),
    (["data.parquet", "--table", "events"], ["--table"]),
])
def test_bad_input_is_one_clear_line(data, args, words):
    r = cli("set-union", str(data.dir / args[0]), *args[1:], *PARAMS)
    assert r.returncode == 2
    line = r.stderr.strip()
    assert line.startswith("Error: ") and "\n" not in line
    for word in words:
        assert word in line


def test_seed_reproduces(data):
    first, second = (cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--seed", "11", "--json")
                     for _ in range(2))
    for r in (first, second):
        assert r.returncode == 0, r.stderr
        assert "NOT differentially private" in r.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["private"] is False
    # 20 items sit near the threshold, so two unseeded runs would differ with high probability.
    assert a["items"] == b["items"]


# ---------------------------------------------------------------- charged means delivered
# A release that fails after its charge spends budget and shows the user nothing (or only an error
# that depends on the data). Everything checkable is checked before the charge, and once charged
# the rows always reach the user. Each test reads the ledger the run was charged to.

def charges(ledger: Path) -> int:
    from dpsql.core.ledger import Ledger

    return len(Ledger(ledger).releases())


N_TYPED = 300
# (a struct without strings: a string inside a nested item is refused as a key, sql/00_core/15_checks.sql)
COMMON = {"list": [1, 2], "struct": {"a": 1, "b": 2}, "blob": b"\x00common,\"\n"}
# The common item as DuckDB writes it in CSV, and so on stdout (a BLOB's text is DuckDB's escaped form).
COMMON_TEXT = {"list": "[1, 2]", "struct": "{'a': 1, 'b': 2}", "blob": "\\x00common,\\x22\\x0A"}


def typed_items(kind: str) -> pa.Table:
    """Every user holds the common item (weight 300 against a threshold near 19: released) and one of its own."""
    own = {"list": lambda u: [u, -u], "struct": lambda u: {"a": u, "b": -u - 10},
           "blob": lambda u: f"own{u}".encode()}[kind]
    users, items = [], []
    for u in range(N_TYPED):
        users += [u, u]
        items += [COMMON[kind], own(u)]
    return pa.table({"user_id": users, "item": items})


@pytest.mark.parametrize("kind", ["list", "struct", "blob"])
@pytest.mark.parametrize("dest", ["stdout", "json", "parquet", "csv"])
def test_nested_and_binary_items_reach_the_user(tmp_path, kind, dest):
    table = typed_items(kind)
    pq.write_table(table, tmp_path / "typed.parquet")
    ledger = tmp_path / "l.dpsql-ledger"
    extra = {"stdout": [], "json": ["--json"], "parquet": ["--output", str(tmp_path / "out.parquet")],
             "csv": ["--output", str(tmp_path / "out.csv")]}[dest]
    r = cli("set-union", str(tmp_path / "typed.parquet"), *PARAMS, "--method", "weighted_gaussian",
            "--ledger", str(ledger), *extra)
    assert r.returncode == 0, r.stderr
    assert charges(ledger) == 1
    if dest == "stdout":
        assert COMMON_TEXT[kind] in r.stdout.splitlines()
    elif dest == "json":
        items = json.loads(r.stdout)["items"]
        assert (str(COMMON[kind]) if kind == "blob" else COMMON[kind]) in items
    elif dest == "parquet":
        written = pq.read_table(tmp_path / "out.parquet")
        assert written.schema.field("item").type == table.schema.field("item").type
        values = written.column("item").to_pylist()
        assert COMMON[kind] in values and len(values) >= 1
        assert all(v in table.column("item").to_pylist() for v in values)
    else:
        text = (tmp_path / "out.csv").read_text(encoding="utf-8").splitlines()
        assert text[0] == "item" and len(text) >= 2
        written = pcsv.read_csv(tmp_path / "out.csv", convert_options=pcsv.ConvertOptions(
            column_types={"item": pa.string()}))
        assert COMMON_TEXT[kind] in written.column("item").to_pylist()


def test_csv_whose_type_changes_after_the_sniffer_sample(tmp_path):
    # 30,000 integer items, then a word: DuckDB's default sniffer (20,480 rows) would type the
    # column BIGINT and fail on the word in the middle of the release, after the charge.
    lines = ["user_id,item"] + [f"u{i % 400},{i % 7}" for i in range(30_000)] + ["u1,word"]
    (tmp_path / "drift.csv").write_text("\n".join(lines) + "\n")
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(tmp_path / "drift.csv"), *PARAMS, "--ledger", str(ledger), "--json")
    assert r.returncode == 0, r.stderr
    assert charges(ledger) == 1
    items = json.loads(r.stdout)["items"]
    assert set(items) <= {str(i) for i in range(7)} | {"word"}
    assert {str(i) for i in range(7)} <= set(items)  # each held by all 400 users


def test_unreadable_csv_fails_before_the_charge(tmp_path):
    lines = ["user_id,item"] + [f"u{i % 400},{i % 7}" for i in range(30_000)] + ["u1,word,extra"]
    (tmp_path / "broken.csv").write_text("\n".join(lines) + "\n")
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(tmp_path / "broken.csv"), *PARAMS, "--ledger", str(ledger))
    assert r.returncode == 2
    assert r.stdout == ""
    assert "nothing was released or charged" in r.stderr and "\n" not in r.stderr.strip()
    # where, not the line's content
    assert "line 30002" in r.stderr and "word" not in r.stderr and "extra" not in r.stderr
    assert charges(ledger) == 0


@pytest.mark.parametrize("null_in, flag", [("user_id", "--user-col"), ("item", "--item-col")])
def test_null_user_or_item_fails_before_the_charge(tmp_path, null_in, flag):
    users = [f"u{i}" for i in range(300)]
    items = ["common"] * 300
    (users if null_in == "user_id" else items)[-1] = None
    pq.write_table(pa.table({"user_id": users, "item": items}), tmp_path / "nulls.parquet")
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(tmp_path / "nulls.parquet"), *PARAMS, "--ledger", str(ledger))
    assert r.returncode == 2
    assert flag in r.stderr and "NULL" in r.stderr and "nothing was released or charged" in r.stderr
    assert r.stdout == ""
    assert charges(ledger) == 0


def test_weighted_sample_null_key_fails_before_the_charge(tmp_path):
    pq.write_table(pa.table({"key": ["a"] * 50 + [None]}), tmp_path / "keys.parquet")
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("weighted-sample", str(tmp_path / "keys.parquet"), "--epsilon", "1", "--delta", "1e-5",
            "--ledger", str(ledger))
    assert r.returncode == 2
    assert "--key-col" in r.stderr and "NULL" in r.stderr
    assert charges(ledger) == 0


@pytest.mark.parametrize("output, words", [
    ("out.txt", ["--output", "*.parquet, *.csv or *.json"]),
    ("folder.parquet", ["--output", "is a folder"]),
    ("missing/out.parquet", ["--output", "does not exist"]),
])
def test_bad_output_fails_before_the_charge(data, tmp_path, output, words):
    (tmp_path / "folder.parquet").mkdir()
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger),
            "--output", str(tmp_path / output))
    assert r.returncode == 2
    for word in words:
        assert word in r.stderr
    assert charges(ledger) == 0


def failing_write(monkeypatch, *, probe: bool):
    """Make dpsql.frontends.cli._write fail with 'no space left' for the real output (and for the probe if ``probe``)."""
    import errno

    import dpsql.frontends.cli as cli_mod

    real = cli_mod._write

    def write(rows, output, metadata=None):
        if probe or not output.path.name.startswith(".dpsql-probe-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(rows, output, metadata)

    monkeypatch.setattr(cli_mod, "_write", write)


def test_output_that_cannot_be_written_fails_before_the_charge(data, tmp_path, monkeypatch):
    failing_write(monkeypatch, probe=True)
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger),
            "--output", str(tmp_path / "out.parquet"))
    assert r.returncode == 2
    assert "No space left on device" in r.stderr and "nothing was released or charged" in r.stderr
    assert charges(ledger) == 0
    assert list(tmp_path.glob(".dpsql-probe-*")) == []


@pytest.mark.parametrize("as_json", [False, True])
def test_failed_write_after_the_charge_prints_the_rows(data, tmp_path, monkeypatch, as_json):
    failing_write(monkeypatch, probe=False)
    ledger = tmp_path / "l.dpsql-ledger"
    out = tmp_path / "out.parquet"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger), "--output", str(out),
            *(["--json"] if as_json else []))
    assert r.returncode == 1
    assert charges(ledger) == 1
    assert "printed on stdout instead" in r.stderr and "No space left on device" in r.stderr
    items = json.loads(r.stdout)["items"] if as_json else r.stdout.splitlines()
    assert data.common <= set(items) <= data.items
    assert not out.exists()


def test_progress_stream_failing_does_not_lose_a_charged_release(data, tmp_path):
    class ClosedErr(io.StringIO):
        def write(self, text):
            raise OSError(5, "Input/output error")

    out = io.StringIO()
    ledger = tmp_path / "l.dpsql-ledger"
    code = main(["set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger), "--progress"],
                out=out, err=ClosedErr())
    assert code == 0
    assert charges(ledger) == 1
    assert data.common <= set(out.getvalue().splitlines()) <= data.items


def test_seeded_output_is_marked_not_private(data, tmp_path):
    out = tmp_path / "out.parquet"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--seed", "5", "--output", str(out),
            "--ledger", str(tmp_path / "l.dpsql-ledger"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["private"] is False and "NOT differentially private" in doc["warning"]
    meta = pq.read_schema(out).metadata
    assert meta[b"dpsql_private"] == b"false" and b"NOT differentially private" in meta[b"dpsql_warning"]

    private = tmp_path / "private.parquet"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--output", str(private),
            "--ledger", str(tmp_path / "l.dpsql-ledger"), "--json")
    doc = json.loads(r.stdout)
    assert doc["private"] is True and "warning" not in doc
    assert pq.read_schema(private).metadata[b"dpsql_private"] == b"true"


def test_budget_show_marks_seeded_releases(tmp_path):
    from dpsql.core.ledger import Ledger

    path = tmp_path / "l.dpsql-ledger"
    ledger = Ledger(path)
    try:
        ledger.charge("dp_set_union_weighted_gaussian", "user", "events", 1.0, 1e-5, seeded=True)
    except TypeError:
        pytest.skip("this ledger does not record whether a release was seeded")
    ledger.charge("dp_set_union_weighted_gaussian", "user", "other", 0.5, 1e-6)
    events, other = (r.table for r in ledger.releases())
    doc = json.loads(cli("budget", "show", str(path), "--json").stdout)
    scopes = {s["scope"]: (s["seeded_releases"], s["private"]) for s in doc["scopes"]}
    assert scopes == {"database": (1, False), events: (1, False), other: (0, True)}
    assert "NOT differentially private" in doc["note"]
    doc = json.loads(cli("budget", "releases", str(path), "--json").stdout)
    assert [(r["table"], r["seeded"], r["private"]) for r in doc["releases"]] == [(events, True, False),
                                                                                (other, False, True)]
    text = cli("budget", "show", str(path)).stdout
    assert "NOT PRIVATE" in text
    rows = {line.split()[0]: line.split()[-1] for line in text.splitlines()[2:] if not line.startswith("NOT")}
    assert rows == {"database": "1", events: "1", other: "0"}
    listing = cli("budget", "releases", str(path)).stdout.splitlines()
    assert "NO (seeded)" in listing[1] and "NO (seeded)" not in listing[2] and "NOT PRIVATE" in listing[-1]
    # without seeded releases nothing is marked
    clean = tmp_path / "clean.dpsql-ledger"
    Ledger(clean).charge("dp_set_union_weighted_gaussian", "user", "events", 1.0, 1e-5)
    assert "NOT PRIVATE" not in cli("budget", "show", str(clean)).stdout
    assert json.loads(cli("budget", "show", str(clean), "--json").stdout)["scopes"][0]["private"] is True


def test_seeded_cli_release_is_recorded_as_seeded(data, tmp_path):
    from dpsql.core.ledger import Release

    if "seeded" not in {f.name for f in __import__("dataclasses").fields(Release)}:
        pytest.skip("this ledger does not record whether a release was seeded")
    ledger = tmp_path / "l.dpsql-ledger"
    assert cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--seed", "5",
               "--ledger", str(ledger)).returncode == 0
    assert cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger)).returncode == 0
    doc = json.loads(cli("budget", "releases", str(ledger), "--json").stdout)
    assert [r["seeded"] for r in doc["releases"]] == [True, False]
    assert doc["scopes"][0]["seeded_releases"] == 1 and doc["scopes"][0]["private"] is False


def test_progress_takes_no_value(data, tmp_path):
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger), "--progress=yes")
    assert r.returncode == 2
    assert "--progress" in r.stderr and r.stderr.startswith("Error: ")
    assert charges(ledger) == 0


def test_duckdb_table_scope_budget_applies_to_cli_releases(data, tmp_path):
    import shutil

    db = tmp_path / "shop.duckdb"
    shutil.copy(data.dir / "data.duckdb", db)
    args = ["set-union", str(db), "--table", "events", "--user-col", "uid", "--item-col", "word",
            "--epsilon", "0.6", "--delta", "1e-6", "--max-items", "3", "--method", "weighted_gaussian"]
    assert cli("budget", "set", str(db), "--scope", "events", "--epsilon", "1", "--delta", "1e-4").returncode == 0
    assert cli(*args).returncode == 0
    refused = cli(*args)  # 0.6 + 0.6 > 1 in the table's scope
    assert refused.returncode == 1 and "exceeded" in refused.stderr and refused.stdout == ""
    doc = json.loads(cli("budget", "show", str(db), "--json").stdout)
    spent = {s["scope"]: (s["epsilon_spent"], s["releases"]) for s in doc["scopes"]}
    assert spent == {"database": (0.6, 1), "shop.main.events": (0.6, 1)}


def test_budget_set_below_what_is_spent_is_refused_and_changes_nothing(data, tmp_path):
    from dpsql.core.ledger import Ledger

    ledger = tmp_path / "l.dpsql-ledger"
    assert cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger)).returncode == 0
    assert cli("budget", "set", str(ledger), "--epsilon", "2", "--delta", "1e-4").returncode == 0
    r = cli("budget", "set", str(ledger), "--epsilon", "0.5", "--delta", "1e-4")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("Error: dpsql: budget of scope 'database'"), r.stderr
    assert "epsilon=0.5 is below the epsilon already spent (1)" in r.stderr and "epsilon >= 1" in r.stderr
    assert [(b.scope, b.epsilon, b.delta) for b in Ledger(ledger).budgets()] == [("database", 2.0, 1e-4)]
    # equal to what is spent: allowed, and the scope is closed
    assert cli("budget", "set", str(ledger), "--epsilon", "1", "--delta", "1e-5").returncode == 0
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger))
    assert r.returncode == 1 and "exceeded" in r.stderr and charges(ledger) == 1


def test_budget_set_scope_is_checked_against_the_database(data, tmp_path):
    import shutil

    from dpsql.core.ledger import Ledger, sidecar_path

    db = tmp_path / "shop.duckdb"
    shutil.copy(data.dir / "data.duckdb", db)
    duckdb.connect(str(db)).execute("CREATE VIEW recent AS FROM events").close()
    budget = ("--epsilon", "1", "--delta", "1e-4")
    r = cli("budget", "set", str(db), "--scope", "EVENTS", *budget)
    assert r.returncode == 0 and r.stderr == ""
    # a table that does not exist (yet: a budget may precede its table) is set, and said, with its scope
    r = cli("budget", "set", str(db), "--scope", "evnets", *budget)
    assert r.returncode == 0 and r.stderr.startswith("dpsql: warning: scope 'evnets' names no table or view")
    assert "'shop.main.evnets'" in r.stderr
    # a view is refused: its releases are charged to the tables it reads
    r = cli("budget", "set", str(db), "--scope", "recent", *budget)
    assert r.returncode == 2 and "scope 'recent' is a view" in r.stderr and "shop.main.events" in r.stderr
    assert [b.scope for b in Ledger(sidecar_path(db)).budgets()] == ["shop.main.events", "shop.main.evnets"]
    # through the ledger file, the database beside it is checked
    r = cli("budget", "set", str(sidecar_path(db)), "--scope", "other", *budget)
    assert r.returncode == 0 and r.stderr == ""
    # a data file has no tables: said, with where its releases are charged
    parquet = tmp_path / "events.parquet"
    shutil.copy(data.dir / "data.parquet", parquet)
    r = cli("budget", "set", str(parquet), "--scope", "events", *budget)
    assert r.returncode == 0 and "'events.main.events'; whether a table of that name exists was not checked" in r.stderr
    assert "parquet file, without tables" in r.stderr and str(parquet.resolve()) in r.stderr
    r = cli("budget", "set", str(parquet), "--scope", str(parquet), *budget)
    assert r.returncode == 0 and r.stderr == ""


def test_budget_remove_of_a_scope_without_budget_is_said(tmp_path):
    from dpsql.core.ledger import Ledger

    ledger = tmp_path / "l.dpsql-ledger"
    Ledger(ledger).set_budget(1.0, 1e-5, scope="t")
    r = cli("budget", "remove", str(ledger), "--scope", "u")
    assert r.returncode == 0 and "scope 'u' ('l.main.u') had no budget" in r.stderr
    r = cli("budget", "remove", str(ledger), "--scope", "t")
    assert r.returncode == 0 and r.stderr == "" and Ledger(ledger).budgets() == []


def test_budget_show_aligns_scopes_of_any_length(tmp_path):
    from dpsql.core.ledger import Ledger

    ledger = tmp_path / "l.dpsql-ledger"
    led = Ledger(ledger)
    names = ["t", "a_table_whose_name_is_longer_than_the_column_once_was", "mid_length_table"]
    for i, name in enumerate(names):
        led.charge("dp_set_union_weighted_gaussian", "user", name, 0.125 * (i + 1), 1e-6 * (i + 1))
    led.set_budget(12.5, 1e-3, scope=names[1])
    lines = cli("budget", "show", str(ledger)).stdout.splitlines()[1:]
    header, rows = lines[0], lines[1:]
    assert len(rows) == 4
    # every scope fits its column: the next column starts where its header does, on every line
    start = header.index("epsilon spent")
    assert [line[:start].rstrip() for line in rows] == ["database", "l.main." + names[1], "l.main." + names[2],
                                                        "l.main.t"]
    assert all(line[start - 2:start] == "  " for line in rows)
    # the slashes of 'spent / budget' line up, and the counts end under their headers
    assert len({tuple(i for i, c in enumerate(line) if c == "/") for line in rows}) == 1, rows
    assert {len(line) for line in rows} == {len(header)}
    releases_end = header.index("releases") + len("releases")
    assert all(line[:releases_end].endswith(count) for line, count in zip(rows, ["3", "1", "1", "1"]))


def test_budget_releases_json_has_iso_times_and_json_parameters(data, tmp_path):
    import datetime

    ledger = tmp_path / "l.dpsql-ledger"
    assert cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger)).returncode == 0
    (release,) = json.loads(cli("budget", "releases", str(ledger), "--json").stdout)["releases"]
    when = datetime.datetime.fromisoformat(release["released_at"].replace("Z", "+00:00"))
    assert release["released_at"].endswith("Z") and when.tzinfo == datetime.timezone.utc
    assert abs(datetime.datetime.now(datetime.timezone.utc) - when) < datetime.timedelta(minutes=10)
    assert "time" not in release
    assert release["parameters"]["max_items"] == 10 and isinstance(release["calibration"], dict)
    assert release["calibration"]["threshold"] > 0


# ---------------------------------------------------------------- defaults: the SQL macro's

README = Path(__file__).resolve().parents[2] / "README.md"
README_CLI = ("dpsql set-union events.duckdb --table user_items --user-col uid --item-col query "
              "--epsilon 1 --delta 1e-5 --json")


def events_db(folder: Path) -> Path:
    """events.duckdb with user_items(user_id, item) as in README's examples, and the same pairs as (uid, query)
    for the tests that name their columns."""
    db = folder / "events.duckdb"
    pairs = rows()
    con = duckdb.connect(str(db))
    try:
        con.register("staged", pa.table({"uid": [p[0] for p in pairs], "query": [p[1] for p in pairs]}))
        con.execute("CREATE TABLE user_items AS SELECT uid, query, uid AS user_id, query AS item FROM staged")
    finally:
        con.close()
    return db


def test_readme_cli_example_runs_with_the_sql_max_items_default(data, tmp_path):
    commands = [README_CLI]
    if README.exists():  # a source checkout: run README's own lines, so they cannot drift
        commands = [line.strip().rstrip("\\").strip() for line in README.read_text(encoding="utf-8").splitlines()
                    if line.strip().startswith("dpsql set-union events.duckdb")]
        assert commands, "README's CLI example on events.duckdb is gone"
    events_db(tmp_path)
    for command in commands:
        argv = command.split()[1:]
        r = subprocess.run([sys.executable, "-m", "dpsql", *argv], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
        assert_clean(r)
        assert r.returncode == 0, (command, r.stderr)
        doc = json.loads(r.stdout)
        assert (doc["epsilon"], doc["delta"], doc["max_items"]) == (1.0, 1e-5, 100)
        assert data.common <= set(doc["items"]) <= data.items


def test_left_out_flags_charge_what_the_sql_defaults_charge(tmp_path):
    import dpsql
    from dpsql.core.ledger import Ledger

    db = events_db(tmp_path)
    sql_ledger, cli_ledger = tmp_path / "sql.dpsql-ledger", tmp_path / "cli.dpsql-ledger"
    con = dpsql.connect(str(db), ledger=str(sql_ledger), read_only=True)
    try:
        con.sql("SELECT * FROM dp_set_union('user_items', epsilon := 1, delta := 1e-5, user_col := 'uid', "
                "item_col := 'query')").fetchall()
    finally:
        con.close()
    r = cli("set-union", str(db), "--table", "user_items", "--user-col", "uid", "--item-col", "query", *BUDGET,
            "--ledger", str(cli_ledger))
    assert r.returncode == 0, r.stderr
    (by_sql,), (by_cli,) = Ledger(sql_ledger).releases(), Ledger(cli_ledger).releases()
    assert (by_cli.mechanism, by_cli.epsilon, by_cli.delta) == (by_sql.mechanism, by_sql.epsilon, by_sql.delta)
    assert by_cli.parameters == by_sql.parameters  # max_items and the other macro parameters


def test_weighted_sample_requires_epsilon_and_delta_like_its_macro(data, tmp_path):
    pq.write_table(pa.table({"key": ["a"] * 50}), tmp_path / "keys.parquet")
    ledger = tmp_path / "l.dpsql-ledger"
    for flags, missing in ((["--delta", "1e-5"], "--epsilon"), (["--epsilon", "1"], "--delta")):
        r = cli("weighted-sample", str(tmp_path / "keys.parquet"), *flags, "--ledger", str(ledger))
        assert r.returncode == 2 and missing in r.stderr and r.stderr.startswith("Error: ")
    assert charges(ledger) == 0


@pytest.mark.parametrize("command", ["set-union", "top-k", "hitting-set"])
@pytest.mark.parametrize("flags, missing", [([], "--epsilon and --delta are required"),
                                            (["--delta", "1e-5"], "--epsilon is required"),
                                            (["--epsilon", "1"], "--delta is required")])
def test_releases_require_epsilon_and_delta_like_their_macros(data, tmp_path, command, flags, missing):
    ledger = tmp_path / "l.dpsql-ledger"
    k = [] if command == "set-union" else ["--k", "3"]
    r = cli(command, str(data.dir / "data.parquet"), *k, *flags, "--ledger", str(ledger))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {missing} (the SQL macro dp_"), lines
    assert lines[0].endswith("say how much privacy budget this release may spend")
    assert charges(ledger) == 0


# ---------------------------------------------------------------- top-k and hitting-set

@pytest.mark.parametrize("command", ["top-k", "hitting-set"])
def test_ranked_release_json_output_and_plain(data, tmp_path, command):
    ledger = tmp_path / "l.dpsql-ledger"
    base = [command, str(data.dir / "data.parquet"), "--k", "3", *BUDGET, "--ledger", str(ledger)]
    r = cli(*base, "--json", "--seed", "4")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mechanism"] == {"top-k": "dp_top_k", "hitting-set": "dp_hitting_set"}[command]
    assert (doc["k"], doc["epsilon"], doc["delta"], doc["max_items"]) == (3, 1.0, 1e-5, 100)
    assert doc["domain_method"] == "weighted_gaussian" and doc["private"] is False
    assert doc["n_released"] == len(doc["items"]) == 3 and set(doc["items"]) <= data.items
    if command == "top-k":  # held by every user, against at most 20 of 400 for any other item
        assert set(doc["items"]) <= data.common
    assert charges(ledger) == 1  # the domain step and the selection step: one release, one charge

    out = tmp_path / "ranked.parquet"
    r = cli(*base, "--output", str(out))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    written = pq.read_table(out)
    assert written.column_names == ["rank", "item"] and written.column("rank").to_pylist() == [1, 2, 3]
    assert pq.read_schema(out).metadata[b"dpsql_mechanism"] == doc["mechanism"].encode()

    plain = cli(*base, "--seed", "4")
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.splitlines() == doc["items"]  # rank order, one per line
    assert charges(ledger) == 3


@pytest.mark.parametrize("flags, word", [
    (BUDGET, "--k"),
    (["--k", "0", *BUDGET], "k must"),
    (["--k", "2", "--epsilon", "-1", "--delta", "1e-5"], "epsilon"),
    (["--k", "2", *BUDGET, "--domain-method", "nope"], "--domain-method"),
    (["--k", "2", *BUDGET, "--item-col", "nope"], "--item-col"),
    (["--k", "2", *BUDGET, "--delimiter", ";"], "--delimiter"),
])
@pytest.mark.parametrize("command", ["top-k", "hitting-set"])
def test_ranked_release_bad_arguments_charge_nothing(data, tmp_path, command, flags, word):
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli(command, str(data.dir / "data.parquet"), *flags, "--ledger", str(ledger))
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and word in lines[0]
    assert charges(ledger) == 0


# ---------------------------------------------------------------- CSV and JSON inputs

def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def plain_items(r: SimpleNamespace) -> set[str]:
    assert r.returncode == 0, r.stderr
    return set(r.stdout.splitlines())


def test_csv_reader_options(tmp_path):
    pairs = [(f"u{u}", str(100 + u % 3)) for u in range(300)] + [(f"u{u}", "2.50") for u in range(300)]
    semi = write_lines(tmp_path / "semi.csv", ["user_id;item"] + [f"{u};{i}" for u, i in pairs])
    ledger = ["--ledger", str(tmp_path / "l.dpsql-ledger")]
    # Sniffed, the items are numbers (DOUBLE): refused as keys (-0.0 = 0.0), with the cast that fixes it.
    sniffed = cli("set-union", str(semi), "--seed", "1", *BUDGET, *ledger)
    assert sniffed.returncode == 2 and "has type DOUBLE" in sniffed.stderr and "DECIMAL" in sniffed.stderr
    for flags in (["--csv-types", "item=VARCHAR"], ["--all-varchar"], ["--delimiter", ";", "--all-varchar"],
                  ["--csv-types", "user_id=VARCHAR", "--csv-types", "item=VARCHAR", "--sample-size", "-1"],
                  ["--csv-types", "user_id=VARCHAR,item=DECIMAL(10,2)"]):
        items = plain_items(cli("set-union", str(semi), "--seed", "1", *BUDGET, *ledger, *flags))
        assert "2.50" in items and "2.5" not in items, flags
    tabbed = write_lines(tmp_path / "tabbed.txt", ["user_id\titem"] + [f"{u}\t{i}" for u, i in pairs])
    assert "2.50" in plain_items(cli("set-union", str(tabbed), "--delimiter", "\\t", "--csv-types",
                                     "item=DECIMAL(10,2)", *BUDGET, *ledger))


@pytest.mark.parametrize("flags, words", [
    (["--csv-types", "item=BIGNT"], ["--csv-types", "BIGNT"]),
    (["--csv-types", "item"], ["--csv-types", "COLUMN=TYPE"]),
    (["--csv-types", "nope=INT"], ["--csv-types", "nope"]),
    (["--sample-size", "0"], ["--sample-size"]),
    (["--delimiter", ""], ["--delimiter"]),
])
def test_bad_csv_options_charge_nothing(tmp_path, flags, words):
    path = write_lines(tmp_path / "d.csv", ["user_id,item"] + [f"u{u},a" for u in range(50)])
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(path), *flags, *BUDGET, "--ledger", str(ledger))
    assert r.returncode == 2, r.stderr
    for word in words:
        assert word in r.stderr
    assert charges(ledger) == 0


def test_csv_options_are_refused_for_other_inputs(data):
    r = cli("set-union", str(data.dir / "data.parquet"), *BUDGET, "--all-varchar")
    assert r.returncode == 2 and "--all-varchar" in r.stderr and "parquet" in r.stderr


@pytest.mark.parametrize("name, text", [
    ("records.json", lambda recs: json.dumps(recs)),
    ("records.jsonl", lambda recs: "\n".join(json.dumps(r) for r in recs)),
    ("records.ndjson", lambda recs: "\n".join(json.dumps(r) for r in recs)),
])
def test_json_input_is_read_as_json(data, tmp_path, name, text):
    records = [{"user_id": u, "item": i} for u, i in rows()]
    (tmp_path / name).write_text(text(records), encoding="utf-8")
    r = cli("set-union", str(tmp_path / name), *BUDGET, "--json", "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 0, r.stderr
    assert data.common <= set(json.loads(r.stdout)["items"]) <= data.items


def test_broken_csv_is_named_as_such(tmp_path):
    path = write_lines(tmp_path / "broken.csv", ["user_id,item,extra", "u1,a,1", "u2,b,2", "u3,c,3,4", "u4,d"])
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(path), *BUDGET, "--ledger", str(ledger))
    assert r.returncode == 2
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("Error: dpsql: ")
    assert "not a well-formed CSV" in line and "line 4 has 4 fields, the header 3" in line
    assert "is not a column" not in line
    assert charges(ledger) == 0


@pytest.mark.parametrize("content", ["", "\n\n", "  \n"])
def test_empty_csv_says_so(tmp_path, content):
    (tmp_path / "empty.csv").write_text(content)
    r = cli("set-union", str(tmp_path / "empty.csv"), *BUDGET, "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 2
    assert "is empty" in r.stderr and "column0" not in r.stderr and r.stderr.startswith("Error: dpsql: ")


def test_headerless_csv_says_so(tmp_path):
    path = write_lines(tmp_path / "nohead.csv", [f"u{u},{u * 3}" for u in range(50)])
    r = cli("set-union", str(path), *BUDGET, "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 2
    assert "no header line" in r.stderr and "user_id,item" in r.stderr


def test_evaluate_reads_csv_with_options(tmp_path):
    path = write_lines(tmp_path / "d.csv", ["user_id;item"] + [f"u{u};{u % 4}" for u in range(40)])
    released = write_lines(tmp_path / "released.csv", ["item", "1", "2"])
    r = cli("evaluate", str(path), "--released", str(released), "--delimiter", ";", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hits"] == 20


# ---------------------------------------------------------------- plain output

ODD_ITEMS = ["two\nlines", "tab\there", "back\\slash", "bell\x07", "cr\rlf", "sep\u2028x", "plain"]


def test_plain_output_is_one_line_per_item(tmp_path):
    users = [u for u in range(300) for _ in ODD_ITEMS]
    pq.write_table(pa.table({"user_id": users, "item": ODD_ITEMS * 300}), tmp_path / "odd.parquet")
    r = cli("set-union", str(tmp_path / "odd.parquet"), "--method", "weighted_gaussian", *BUDGET,
            "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(ODD_ITEMS)  # every item released (300 users each)
    assert sorted(lines[:-1]) == sorted(["two\\nlines", "tab\\there", "back\\\\slash", "bell\\x07", "cr\\rlf",
                                         "sep\\u2028x", "plain"])
    decoded = {line.encode("ascii").decode("unicode_escape") for line in lines[:-1]}
    assert decoded == set(ODD_ITEMS)


@pytest.mark.parametrize("arrow_type", [pa.decimal128(12, 4), pa.bool_(), pa.timestamp("us")])
def test_plain_and_csv_output_write_values_alike(tmp_path, arrow_type):
    import datetime
    import decimal

    # (FLOAT and DOUBLE items are refused: test_float_items_are_refused_with_their_fix)
    values = {pa.decimal128(12, 4): [decimal.Decimal(x) for x in ("0.1", "2.5", "100", "7.1234", "3")],
              pa.bool_(): [True, False],
              pa.timestamp("us"): [datetime.datetime(2024, 1, 1, 12, 30, 0, 5), datetime.datetime(1999, 12, 31)],
              }[arrow_type]
    users = [u for u in range(300) for _ in values]
    pq.write_table(pa.table({"user_id": users, "item": pa.array(values * 300, arrow_type)}), tmp_path / "v.parquet")
    common = [str(tmp_path / "v.parquet"), "--method", "weighted_gaussian", *BUDGET,
              "--ledger", str(tmp_path / "l.dpsql-ledger")]
    plain = cli("set-union", *common)
    to_csv = cli("set-union", *common, "--output", str(tmp_path / "v.csv"))
    assert plain.returncode == 0 and to_csv.returncode == 0, plain.stderr + to_csv.stderr
    csv_lines = (tmp_path / "v.csv").read_text(encoding="utf-8").splitlines()
    assert csv_lines[0] == "item"
    assert plain.stdout.splitlines() == csv_lines[1:]  # every value released, in one order, written alike
    assert len(csv_lines) == len(values) + 1


@pytest.mark.parametrize("arrow_type, name", [(pa.float64(), "DOUBLE"), (pa.float32(), "FLOAT")])
def test_float_items_are_refused_with_their_fix(tmp_path, arrow_type, name):
    # -0.0 = 0.0 and NaNs compare equal but print differently: a float item is refused by type, before
    # anything is read or charged, with the cast that fixes it; no value is quoted
    users = [u for u in range(300) for _ in range(2)]
    pq.write_table(pa.table({"user_id": users, "item": pa.array([-0.0, 0.173] * 300, arrow_type)}),
                   tmp_path / "v.parquet")
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(tmp_path / "v.parquet"), *BUDGET, "--ledger", str(ledger))
    assert r.returncode == 2 and f"has type {name}" in r.stderr and "DECIMAL" in r.stderr
    assert "0.173" not in r.stderr + r.stdout
    assert not ledger.exists() or charges(ledger) == 0


# ---------------------------------------------------------------- Ctrl-C

def test_ctrl_c_during_a_long_release_stops_cleanly(tmp_path):
    import signal
    import time

    # A generated table of a billion rows (a view over range(), so the file is tiny): reading it
    # takes minutes, so Ctrl-C lands while DuckDB is busy with it, before anything is charged.
    db = tmp_path / "huge.duckdb"
    con = duckdb.connect(str(db))
    try:
        con.execute("CREATE VIEW user_items AS SELECT 'u' || (i % 100000) AS user_id, 'i' || (i % 5000) AS item "
                    "FROM range(1000000000) r(i)")
    finally:
        con.close()
    ledger = tmp_path / "l.dpsql-ledger"
    proc = subprocess.Popen([sys.executable, "-m", "dpsql", "set-union", str(db), "--table", "user_items",
                             *BUDGET, "--ledger", str(ledger), "--progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        first = proc.stderr.readline()
        assert first.startswith("dpsql: reading"), first
        time.sleep(0.2)
        started = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        stopped_in = time.perf_counter() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert_clean(result)
    assert "busy" not in stderr and "terminate" not in stderr and "FATAL" not in stderr
    assert proc.returncode == 130, stderr
    assert stdout == ""
    assert stderr.strip().splitlines()[-1] == "Error: dpsql: interrupted (Ctrl-C); nothing was released or charged"
    assert stopped_in < 20  # DuckDB stopped reading; it did not finish the billion rows
    assert not ledger.exists() or charges(ledger) == 0


def test_ctrl_c_after_the_charge_delivers_the_release(data, tmp_path, monkeypatch):
    import signal

    from dpsql.core.ledger import Ledger

    real = Ledger.charge

    def charge_then_interrupt(self, *args, **kwargs):
        release = real(self, *args, **kwargs)
        signal.raise_signal(signal.SIGINT)  # handled by the main thread, which waits for the release
        return release

    monkeypatch.setattr(Ledger, "charge", charge_then_interrupt)
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger))
    assert r.returncode == 130
    assert "finished and delivered" in r.stderr
    assert charges(ledger) == 1
    assert data.common <= set(r.stdout.splitlines()) <= data.items


def test_ctrl_c_before_the_charge_records_nothing(data, tmp_path, monkeypatch):
    import signal
    import time

    import dpsql.frontends.cli as cli_mod

    real = cli_mod._load_input

    def load_then_interrupt(*args, **kwargs):
        real(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.5)  # the main thread runs the handler meanwhile

    monkeypatch.setattr(cli_mod, "_load_input", load_then_interrupt)
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--ledger", str(ledger))
    assert r.returncode == 130
    assert r.stdout == "" and "nothing was released or charged" in r.stderr
    assert charges(ledger) == 0


def test_duckdb_draws_no_progress_bar_into_the_output():
    # DuckDB prints its progress bar on stdout once a query takes 2 s: it would land among the items.
    import dpsql.frontends.cli as cli_mod

    con = cli_mod._connect(None)
    try:
        assert con.execute("SELECT current_setting('enable_progress_bar_print')").fetchall() == [(False,)]
    finally:
        con.close()


def test_null_option_reaches_the_macro_as_null(data):
    """``--drop-margin NULL`` is SQL NULL (sips_cumulative without dropping), as ``drop_margin=None``
    in Python: the same seed gives the same items; a word that is neither a number nor NULL is refused."""
    import warnings

    import dpsql

    path = str(data.dir / "data.parquet")
    r = cli("set-union", path, *PARAMS, "--method", "sips_cumulative", "--drop-margin", "NULL", "--seed", "11",
            "--json")
    assert r.returncode == 0, r.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        con = dpsql.connect(seed=11)
    try:
        con.execute(f"CREATE VIEW t AS FROM read_parquet('{path}')")
        expected = dpsql.set_union(con, "t", "sips_cumulative", epsilon=1.0, delta=1e-5, max_items=10,
                                   drop_margin=None).column("item").to_pylist()
        params = con.execute("SELECT parameters FROM dp_releases()").fetchall()[0][0]
    finally:
        con.close()
    assert json.loads(r.stdout)["items"] == expected
    assert json.loads(params)["drop_margin"] is None
    bad = cli("set-union", path, *PARAMS, "--drop-margin", "none")
    assert bad.returncode == 2 and "expected a number or NULL" in bad.stderr


# ---------------------------------------------------------------- input errors never quote the data
# DuckDB's reader errors quote the private input (the CSV line, the JSON value); the CLI names the line,
# the column and the fix instead.

SECRET = "mauve_diagnosis_0413"


def assert_names_without_data(r: SimpleNamespace, *words: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    line = r.stderr.strip()
    assert line.startswith("Error: dpsql: ") and "\n" not in line, line
    for word in words:
        assert word in line, (word, line)
    assert SECRET not in r.stdout + r.stderr and "Original Line" not in r.stderr
    assert "nothing was released or charged" in line


def numbers_then_secret(tmp_path: Path, column: str, rows: int = 5_000) -> tuple[Path, int]:
    """A CSV whose ``column`` holds numbers, then the secret on the last line (its line number)."""
    lines = ["user_id,item"]
    for i in range(rows):
        lines.append(f"{i % 400},w{i % 7}" if column == "user_id" else f"u{i % 400},{i % 7}")
    lines.append(f"{SECRET},w1" if column == "user_id" else f"u1,{SECRET}")
    return write_lines(tmp_path / "numbers.csv", lines), len(lines)


@pytest.mark.parametrize("column, flag", [("item", "--item-col"), ("user_id", "--user-col")])
def test_csv_value_past_the_sniffed_sample_is_named_by_line_and_column(tmp_path, column, flag):
    path, line = numbers_then_secret(tmp_path, column)
    ledger = tmp_path / "l.dpsql-ledger"
    # --sample-size: the sniffer types the column from the first rows and the CLI does not re-sniff
    r = cli("set-union", str(path), *PARAMS, "--sample-size", "100", "--ledger", str(ledger))
    assert_names_without_data(r, f"line {line}", f"column '{column}'", "BIGINT", f"--csv-types {column}=VARCHAR",
                              "--all-varchar", "--sample-size -1")
    assert charges(ledger) == 0


def test_csv_types_that_do_not_fit_a_value_are_named_by_line_and_column(tmp_path):
    path, line = numbers_then_secret(tmp_path, "item", rows=300)
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(path), *PARAMS, "--csv-types", "item=INTEGER", "--ledger", str(ledger))
    assert_names_without_data(r, f"line {line}", "column 'item'", "--csv-types item=INTEGER does not fit",
                              "--csv-types item=VARCHAR")
    assert charges(ledger) == 0


@pytest.mark.parametrize("name, where", [("records.jsonl", "line 30001"), ("records.json", "record 30001")])
def test_json_type_conflict_is_named_by_line_and_column(tmp_path, name, where):
    # DuckDB infers the JSON types from the first 20,480 records: a later string in a number field
    records = [{"user_id": f"u{i % 400}", "item": i % 7} for i in range(30_000)]
    records.append({"user_id": "u1", "item": SECRET})
    text = json.dumps(records) if name.endswith(".json") else "\n".join(json.dumps(r) for r in records)
    (tmp_path / name).write_text(text, encoding="utf-8")
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(tmp_path / name), *BUDGET, "--ledger", str(ledger))
    assert_names_without_data(r, where, "column 'item'", "BIGINT", "one type in every record")
    assert charges(ledger) == 0


def test_evaluate_reads_the_input_with_the_same_care(tmp_path):
    path, line = numbers_then_secret(tmp_path, "item")
    released = write_lines(tmp_path / "released.csv", ["item", "1", "2"])
    r = cli("evaluate", str(path), "--released", str(released), "--sample-size", "100")
    assert_names_without_data(r, f"line {line}", "column 'item'", "--csv-types item=VARCHAR")
    # a comparison DuckDB cannot make (text items against numbers) shows no value either
    words = write_lines(tmp_path / "words.csv", ["user_id,item"] + [f"u{u},w{u % 3}" for u in range(40)]
                        + [f"u1,{SECRET}"])
    r = cli("evaluate", str(words), "--released", str(released))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("Error: Conversion Error: ") and SECRET not in r.stderr


def test_budget_exceeded_prints_the_dpsql_message_once(data, tmp_path):
    ledger = tmp_path / "l.dpsql-ledger"
    args = ("set-union", str(data.dir / "data.parquet"), "--method", "weighted_gaussian", "--epsilon", "0.8",
            "--delta", "1e-5", "--ledger", str(ledger))
    assert cli(*args).returncode == 0
    budget = cli("budget", "set", str(ledger), "--epsilon", "1", "--delta", "1e-3")
    assert budget.returncode == 0, budget.stderr
    r = cli(*args)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("Error: dpsql: privacy budget of scope 'database' exceeded"), r.stderr
    assert "BudgetExceededError" not in r.stderr and r.stderr.count("dpsql:") == 1
    assert charges(ledger) == 1


def test_csv_line_with_extra_fields_is_named_without_its_content(tmp_path):
    path = write_lines(tmp_path / "ragged.csv", ["user_id,item"] + [f"u{u % 400},w{u % 7}" for u in range(30_000)]
                       + [f"u1,{SECRET},{SECRET}"])
    ledger = tmp_path / "l.dpsql-ledger"
    r = cli("set-union", str(path), *BUDGET, "--ledger", str(ledger))
    assert_names_without_data(r, "line 30002 has 3 fields, the header 2", "--delimiter")
    assert charges(ledger) == 0


def test_headerless_text_csv_does_not_show_its_first_line(tmp_path):
    # every column is text, so DuckDB takes the first line, a row of data, for the header
    path = write_lines(tmp_path / "nohead.csv", [f"patient{u},{SECRET}" for u in range(50)])
    r = cli("set-union", str(path), *BUDGET, "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 2 and r.stdout == ""
    assert "--user-col 'user_id' is not a column" in r.stderr and "add a header line" in r.stderr
    assert SECRET not in r.stderr and "patient0" not in r.stderr


# ---------------------------------------------------------------- globs, folders, hive partitions
# INPUT may be what SQL's readers take: a glob, a folder of Parquet files, a hive-partitioned folder.

RELEASES = {"set-union": [], "top-k": ["--k", "3"], "hitting-set": ["--k", "3"], "group-by": [],
            "weighted-sample": ["--key-col", "item"]}


@pytest.fixture(scope="module")
def parts(data) -> SimpleNamespace:
    """data.parquet's rows as two files of a folder, and as a hive-partitioned folder whose item is only in
    the folder names (item=common0/...)."""
    table = pq.read_table(data.dir / "data.parquet")
    flat = data.dir / "flat"
    flat.mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), flat / "a.parquet")
    pq.write_table(table.slice(half), flat / "b.parquet")
    con = duckdb.connect()
    try:
        con.execute(f"COPY (FROM read_parquet('{data.dir / 'data.parquet'}')) TO '{data.dir / 'hive'}' "
                    f"(FORMAT parquet, PARTITION_BY (item))")
    finally:
        con.close()
    assert pq.read_schema(next((data.dir / "hive").glob("item=*/*.parquet"))).names == ["user_id", "extra"]
    return SimpleNamespace(flat=flat, hive=data.dir / "hive")


@pytest.mark.parametrize("command, sources", [
    ("set-union", ["flat/*.parquet", "flat", "hive", "hive/**/*.parquet"]),
    *((command, ["hive"]) for command in list(RELEASES)[1:]),  # every release reads INPUT alike
])
def test_glob_folder_and_hive_inputs_release_what_one_file_releases(data, parts, tmp_path, command, sources):
    base = [*BUDGET, "--seed", "7", "--ledger", str(tmp_path / "l.dpsql-ledger"), *RELEASES[command]]
    expected = cli(command, str(data.dir / "data.parquet"), *base)
    assert expected.returncode == 0, expected.stderr
    assert data.common & set(expected.stdout.replace("\t", "\n").splitlines())
    for source in (data.dir / name for name in sources):
        r = cli(command, str(source), *base)
        assert r.returncode == 0, (source, r.stderr)
        assert r.stdout == expected.stdout, source  # the same rows, read from several files: the same release


def test_evaluate_reads_a_glob(data, parts, tmp_path):
    released = write_lines(tmp_path / "released.csv", ["item", "common0", "mid01"])
    one, many = (cli("evaluate", str(source), "--released", str(released), "--json")
                 for source in (data.dir / "data.parquet", parts.flat / "*.parquet"))
    assert one.returncode == 0 and many.returncode == 0, one.stderr + many.stderr
    docs = [json.loads(r.stdout, parse_float=lambda text: round(float(text), 12)) | {"input": None}
            for r in (one, many)]  # (DuckDB's parallel sums may differ in the last bits from run to run)
    assert docs[0] == docs[1]


def test_glob_and_folder_inputs_are_charged_to_the_scopes_sql_gives_them(data, parts, tmp_path):
    import shutil
    import warnings

    import dpsql
    from dpsql.core.ledger import Ledger

    folder = tmp_path / "events"
    shutil.copytree(parts.flat, folder)
    sidecar = tmp_path / "events.dpsql-ledger"  # a folder's, and its globs': `dpsql budget show FOLDER` shows it
    for source in (folder / "*.parquet", folder, folder / "**" / "*.parquet"):
        sql_ledger = tmp_path / "sql.dpsql-ledger"
        sql_ledger.unlink(missing_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            con = dpsql.connect(ledger=str(sql_ledger))
        try:
            con.execute(f"CREATE VIEW v AS FROM read_parquet('{source}')")
            dpsql.set_union(con, "v", "weighted_gaussian", epsilon=1.0, delta=1e-5)
        finally:
            con.close()
        (by_sql,) = Ledger(sql_ledger).releases()
        r = cli("set-union", str(source), "--method", "weighted_gaussian", *BUDGET)
        assert r.returncode == 0, r.stderr
        assert Ledger(sidecar).releases()[-1].table == by_sql.table == os.path.realpath(source)
    # a budget on the glob's scope bounds the CLI's releases from that glob, not those from the folder
    glob = str(folder / "*.parquet")
    assert cli("budget", "set", str(folder), "--scope", glob, "--epsilon", "1.5", "--delta", "1e-3").returncode == 0
    refused = cli("set-union", glob, *BUDGET)
    assert refused.returncode == 1 and f"scope '{os.path.realpath(glob)}' exceeded" in refused.stderr
    assert cli("set-union", str(folder), *BUDGET).returncode == 0


@pytest.mark.parametrize("source, words", [
    ("nothing/*.parquet", ["INPUT", "matches no file"]),
    ("empty", ["INPUT", "folder without *.parquet"]),
])
def test_glob_or_folder_without_files_is_one_clear_line(tmp_path, source, words):
    (tmp_path / "empty").mkdir()
    (tmp_path / "nothing").mkdir()
    r = cli("set-union", str(tmp_path / source), *BUDGET, "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 2 and r.stdout == ""
    line = r.stderr.strip()
    assert line.startswith("Error: ") and "\n" not in line
    for word in words:
        assert word in line


def test_output_must_not_overwrite_a_file_of_a_glob(parts, tmp_path):
    r = cli("set-union", str(parts.flat / "*.parquet"), *BUDGET, "--ledger", str(tmp_path / "l.dpsql-ledger"),
            "--output", str(parts.flat / "a.parquet"))
    assert r.returncode == 2 and "--output must not be one of the input files" in r.stderr
    assert pq.read_table(parts.flat / "a.parquet").column_names == ["user_id", "item", "extra"]


# ---------------------------------------------------------------- JSON output, headers, the round trip

@pytest.mark.parametrize("name", ["out.json", "out.jsonl"])
def test_output_json_holds_the_rows_as_objects(data, tmp_path, name):
    out = tmp_path / name
    base = ["top-k", str(data.dir / "data.parquet"), "--k", "3", *BUDGET, "--seed", "4",
            "--ledger", str(tmp_path / "l.dpsql-ledger")]
    r = cli(*base, "--output", str(out))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    text = out.read_text(encoding="utf-8")
    rows = json.loads(text) if name.endswith(".json") else [json.loads(line) for line in text.splitlines()]
    items = json.loads(cli(*base, "--json").stdout)["items"]  # the same seed: the same items
    assert rows == [{"rank": rank, "item": item} for rank, item in enumerate(items, 1)]


def test_plain_output_of_several_columns_has_a_header_line(data, tmp_path):
    base = [str(data.dir / "data.parquet"), *BUDGET, "--seed", "3", "--ledger", str(tmp_path / "l.dpsql-ledger")]
    group_by = [*base, "--aggregates", "count,sum", "--value-col", "extra", "--lower", "0", "--upper", "10"]
    plain = cli("group-by", *group_by)
    assert plain.returncode == 0, plain.stderr
    assert cli("group-by", *group_by, "--output", str(tmp_path / "g.parquet")).returncode == 0
    written = pq.read_table(tmp_path / "g.parquet")
    lines = plain.stdout.splitlines()
    assert lines[0].split("\t") == written.column_names and len(written.column_names) > 1
    assert [line.split("\t")[0] for line in lines[1:]] == written.column("item").to_pylist()
    sample = cli("weighted-sample", *base, "--key-col", "item", "--with-frequencies").stdout.splitlines()
    assert sample[0] == "key\ttoken" and set(line.split("\t")[0] for line in sample[1:]) <= data.items
    # one column: a value a line, no header
    keys = cli("weighted-sample", *base, "--key-col", "item").stdout.splitlines()
    assert keys and set(keys) <= data.items


@pytest.mark.parametrize("command, written", [("set-union", ["released.csv", "released.json"]),
                                              ("top-k", []), ("group-by", [])])
def test_evaluate_reads_back_what_a_release_printed_or_wrote(data, tmp_path, command, written):
    base = [command, str(data.dir / "data.parquet"), *BUDGET, "--seed", "5",
            "--ledger", str(tmp_path / "l.dpsql-ledger"), *RELEASES[command]]
    plain = cli(*base)
    assert plain.returncode == 0, plain.stderr
    (tmp_path / "released.txt").write_text(plain.stdout, encoding="utf-8")
    files = [tmp_path / "released.txt"]
    for name in ("released.parquet", *written):
        assert cli(*base, "--output", str(tmp_path / name)).returncode == 0
        files.append(tmp_path / name)
    docs = []
    for path in files:
        r = cli("evaluate", str(data.dir / "data.parquet"), "--released", str(path), "--json")
        assert r.returncode == 0, (path.name, r.stderr)
        # (DuckDB's parallel sums may differ in the last bits from run to run)
        docs.append(json.loads(r.stdout, parse_float=lambda text: round(float(text), 12)) | {"released": None})
    assert docs[0]["released_items"] == pq.read_table(files[1]).num_rows > 0
    assert all(doc == docs[0] for doc in docs[1:])


@pytest.mark.parametrize("values", [ODD_ITEMS, [10, 200, 3000], [b"\x00a,\"\n", b"plain"],
                                    [decimal.Decimal(x) for x in ("1.50", "20", "300.25")]],
                         ids=["text", "int", "blob", "decimal"])
def test_plain_output_of_any_item_type_reads_back(tmp_path, values):
    items = pa.array(values)
    users = pa.array([u for u in range(300) for _ in range(len(items))])
    table = pa.table({"user_id": users, "item": pa.concat_arrays([items] * 300)})
    pq.write_table(table, tmp_path / "typed.parquet")
    base = ["set-union", str(tmp_path / "typed.parquet"), "--method", "weighted_gaussian", *BUDGET,
            "--ledger", str(tmp_path / "l.dpsql-ledger")]
    plain = cli(*base)
    assert plain.returncode == 0, plain.stderr
    (tmp_path / "released.txt").write_text(plain.stdout, encoding="utf-8")
    r = cli("evaluate", str(tmp_path / "typed.parquet"), "--released", str(tmp_path / "released.txt"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # every item is held by all 300 users: all released, each found again in the data
    assert doc["released_items"] == len(items) and doc["missing_mass_p"]["0"] == 0 and doc["hits"] == 300


# ---------------------------------------------------------------- evaluate --k

def test_evaluate_k_on_a_set_union_release_says_what_k_needs(data, tmp_path):
    out = tmp_path / "items.parquet"
    assert cli("set-union", str(data.dir / "data.parquet"), *PARAMS, "--seed", "2", "--output", str(out),
               "--ledger", str(tmp_path / "l.dpsql-ledger")).returncode == 0
    n = pq.read_table(out).num_rows
    assert n > 3
    r = cli("evaluate", str(data.dir / "data.parquet"), "--released", str(out), "--k", "3")
    assert r.returncode == 2 and r.stdout == ""
    line = r.stderr.strip()
    assert line.startswith("Error: dpsql: --k 3: ") and "\n" not in line
    assert f"holds {n} items and no rank column" in line and f"--k {n} or more" in line and "top-k" in line
    ok = cli("evaluate", str(data.dir / "data.parquet"), "--released", str(out), "--k", str(n), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["k"] == n


def test_evaluate_k_takes_the_first_k_of_a_ranked_release(data, tmp_path):
    ranked = tmp_path / "ranked.parquet"
    assert cli("top-k", str(data.dir / "data.parquet"), "--k", "5", *BUDGET, "--seed", "2", "--output", str(ranked),
               "--ledger", str(tmp_path / "l.dpsql-ledger")).returncode == 0
    table = pq.read_table(ranked).sort_by("rank")
    assert table.num_rows == 5
    first = tmp_path / "first.parquet"
    pq.write_table(table.slice(0, 3), first)
    whole, cut = (json.loads(cli("evaluate", str(data.dir / "data.parquet"), "--released", str(path), "--k", "3",
                                 "--json").stdout) for path in (ranked, first))
    assert whole["k"] == 3 and whole["top_k_missing_mass"] == cut["top_k_missing_mass"]
    assert whole["released_items"] == 5 and cut["released_items"] == 3  # the other measures: the whole release


# ---------------------------------------------------------------- NULL values, as SQL and Python

def test_group_by_skips_null_values_as_sql_and_python_do(tmp_path):
    import warnings

    import dpsql

    values = [None if u % 7 == 0 else float(u % 5) for u in range(300)]
    path = tmp_path / "spend.parquet"
    pq.write_table(pa.table({"user_id": [f"u{u}" for u in range(300)], "item": ["common"] * 300, "spend": values}),
                   path)
    r = cli("group-by", str(path), *BUDGET, "--aggregates", "count,sum,mean", "--value-col", "spend", "--lower", "0",
            "--upper", "5", "--seed", "9", "--json", "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 0, r.stderr
    released = []
    for run in ("python", "sql"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            con = dpsql.connect(seed=9)
        try:
            con.execute(f"CREATE VIEW t AS FROM read_parquet('{path}')")
            if run == "python":
                rows = dpsql.group_by(con, "t", epsilon=1.0, delta=1e-5, aggregates=["count", "sum", "mean"],
                                      value_col="spend", lower=0, upper=5).to_pylist()
            else:
                rows = con.sql("FROM dp_group_by('t', epsilon := 1.0, delta := 1e-5, aggregates := ['count', 'sum', "
                               "'mean'], value_col := 'spend', lower := 0, upper := 5)").to_arrow_table().to_pylist()
        finally:
            con.close()
        released.append(rows)
    assert json.loads(r.stdout)["rows"] == released[0] == released[1]
    assert [row["item"] for row in released[0]] == ["common"]


# ---------------------------------------------------------------- one line per message

@pytest.mark.parametrize("command", ["top-k", "group-by", "weighted-sample"])
def test_budget_exceeded_is_one_dpsql_line_for_every_release(data, tmp_path, command):
    from dpsql.core.ledger import Ledger

    ledger = tmp_path / "l.dpsql-ledger"
    Ledger(ledger).set_budget(0.5, 1e-3)
    r = cli(command, str(data.dir / "data.parquet"), *BUDGET, *RELEASES[command], "--ledger", str(ledger))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("Error: dpsql: privacy budget of scope 'database' exceeded"), r.stderr
    assert r.stderr.count("dpsql:") == 1 and "Error" not in r.stderr[len("Error"):]
    assert charges(ledger) == 0


@pytest.mark.parametrize("command, flags, macro", [
    ("set-union", ["--epsilon", "20", "--delta", "1e-5"], "dp_set_union_sips_cumulative"),
    ("set-union", ["--method", "mad2r", "--epsilon", "20", "--delta", "1e-5"], "dp_set_union_mad2r"),
    ("top-k", ["--k", "3", "--epsilon", "1", "--delta", "0.01"], "dp_top_k"),
    ("group-by", ["--epsilon", "20", "--delta", "1e-5"], "dp_group_by"),
])
def test_weak_parameters_are_one_warning_line(data, tmp_path, command, flags, macro):
    r = cli(command, str(data.dir / "data.parquet"), *flags, "--ledger", str(tmp_path / "l.dpsql-ledger"))
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith(f"dpsql: warning: weak privacy parameters of {macro}: ")
    assert "WeakPrivacyWarning" not in r.stderr and ".py" not in r.stderr


# ---------------------------------------------------------------- --output says what it wrote

@pytest.mark.parametrize("command, noun", [("set-union", "items"), ("top-k", "items"), ("hitting-set", "items"),
                                           ("group-by", "rows"), ("weighted-sample", "keys")])
def test_output_says_what_was_written(data, tmp_path, command, noun):
    out = tmp_path / "out.csv"
    base = [command, str(data.dir / "data.parquet"), *BUDGET, *RELEASES[command],
            "--ledger", str(tmp_path / "l.dpsql-ledger"), "--output", str(out)]
    r = cli(*base)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    n = len(pcsv.read_csv(out))
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"dpsql: released {n} {noun} to {out} (epsilon=1, delta=1e-05, ")
    what = {"set-union": "method=sips_cumulative)", "top-k": "mechanism=dp_top_k, k=3)",
            "hitting-set": "mechanism=dp_hitting_set, k=3)", "group-by": "mechanism=dp_group_by)",
            "weighted-sample": "mechanism=dp_weighted_sample)"}[command]
    assert line.endswith(what), line
    assert cli(*base, "--json").stderr == ""  # the JSON document says it ("output", "n_released")


# ---------------------------------------------------------------- --progress on every release command

def _release_commands() -> dict[str, set[str]]:
    """Each subcommand that writes released rows (it takes --output) and its options."""
    from dpsql.frontends.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.choices and "set-union" in a.choices]
    found = {}
    for name, sub in commands.choices.items():
        options = {o for a in sub._actions for o in a.option_strings}
        if "--output" in options:
            found[name] = options
    return found


def test_every_release_command_takes_progress():
    # --progress once missed top-k, hitting-set, group-by and weighted-sample: it is a release option now
    commands = _release_commands()
    assert set(RELEASES) <= set(commands)
    assert all("--progress" in options for options in commands.values()), commands


@pytest.mark.parametrize("command, noun", [("set-union", "items"), ("top-k", "items"), ("hitting-set", "items"),
                                           ("group-by", "rows"), ("weighted-sample", "keys")])
def test_progress_prints_progress_and_one_summary_line(data, tmp_path, command, noun):
    base = [command, str(data.dir / "data.parquet"), *BUDGET, *RELEASES[command],
            "--ledger", str(tmp_path / "l.dpsql-ledger"), "--seed", "3", "--progress"]
    r = cli(*base)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[1] == f"dpsql: reading {str(data.dir / 'data.parquet')!r}", lines  # after the seed warning
    assert lines[-2] == "progress: 100%", lines
    rows = r.stdout.splitlines()[1 if command == "group-by" else 0:]  # group-by's plain output has a header
    assert lines[-1].startswith(f"dpsql: released {len(rows)} {noun} (epsilon=1, delta=1e-05, "), lines
    assert lines[-1].endswith(" s") and " in " in lines[-1]
    assert all(line.startswith(("progress: ", "dpsql: ")) for line in lines[2:]), lines
    # with --output the one summary line says where the rows went, and how long the release took
    out = tmp_path / "out.csv"
    r = cli(*base, "--output", str(out))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    last = r.stderr.splitlines()[-1]
    assert last.startswith(f"dpsql: released {len(pcsv.read_csv(out))} {noun} to {out} (epsilon=1, ")
    assert " s; seeded: NOT private" in last


# ---------------------------------------------------------------- group-by: the declaration's parameters

def test_group_by_flags_are_the_declarations_parameters():
    """Every parameter of dp_group_by is a group-by flag of its name (INPUT is tbl, --items items_tbl), so a
    parameter the declaration gains is a flag without a hand-kept list."""
    from dpsql.core import registry

    options = _release_commands()["group-by"]
    declared = {p.name for p in registry.by_macro()["dp_group_by"].params} - {"tbl", "items_tbl"}
    assert {"group_cols", "max_rows", "max_groups", "noise", "aggregates"} <= declared
    assert {f"--{name.replace('_', '-')}" for name in declared} | {"--items"} <= options
    public = {p.name for p in registry.by_macro()["dp_group_by_public"].params} - {"tbl", "items_tbl"}
    assert public <= declared  # the public list's macro takes a subset of the flags


def _groups_file(folder: Path) -> Path:
    """300 users; user u has 1 + u % 3 rows in each of 2 (country, day) groups of 3 x 4, spend u % 11."""
    path = folder / "visits.parquet"
    con = duckdb.connect()
    try:
        con.execute(f"""COPY (SELECT 'u' || u AS user_id, ['fr', 'de', 'it'][1 + (u + j) % 3] AS country,
                                     ((u + 2 * j) % 4)::INTEGER AS day, (u % 11)::DOUBLE AS spend
                              FROM range(300) a(u), range(2) b(j), range(3) c(k) WHERE k <= u % 3)
                        TO '{path}' (FORMAT parquet)""")
    finally:
        con.close()
    return path


def test_group_by_group_cols_rows_and_noise_are_the_python_calls(tmp_path):
    """--group-cols, --aggregates with rows and median, --max-rows, --max-groups and --noise: the same release as
    dpsql.group_by with those parameters on the same rows under one seed, in plain, JSON and file output."""
    import warnings

    import dpsql

    path = _groups_file(tmp_path)
    ledger = tmp_path / "l.dpsql-ledger"
    flags = ["group-by", str(path), *BUDGET, "--max-items", "2", "--group-cols", "country,day",
             "--aggregates", "count,rows,median",
             "--max-rows", "2", "--max-groups", "2", "--value-col", "spend", "--lower", "0", "--upper", "10",
             "--noise", "laplace", "--seed", "11", "--ledger", str(ledger)]
    r = cli(*flags, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        con = dpsql.connect(seed=11)
    try:
        con.execute(f"CREATE VIEW v AS SELECT user_id, country, day, spend FROM read_parquet('{path}')")
        want = dpsql.group_by(con, "v", epsilon=1.0, delta=1e-5, max_items=2, aggregates=["count", "rows", "median"],
                              max_rows=2, max_groups=2, value_col="spend", lower=0, upper=10, noise="laplace",
                              group_cols=["country", "day"])
    finally:
        con.close()
    assert want.num_rows >= 6  # 12 groups of 50 users each
    assert doc["rows"] == want.to_pylist()
    assert list(doc["rows"][0])[:3] == ["country", "day", "count"]
    assert (doc["group_cols"], doc["max_rows"], doc["max_groups"], doc["noise"]) == (["country", "day"], 2, 2,
                                                                                      "laplace")
    assert doc["calibration"]["noise"] == "laplace" and doc["calibration"]["max_rows"] == 2
    assert doc["n_released"] == want.num_rows
    plain = cli(*flags)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert lines[0].split("\t") == want.column_names
    assert [line.split("\t")[:2] for line in lines[1:]] == [[c, str(d)] for c, d in
                                                            zip(want["country"].to_pylist(), want["day"].to_pylist())]
    assert cli(*flags, "--output", str(tmp_path / "g.parquet")).returncode == 0
    assert pq.read_table(tmp_path / "g.parquet").to_pylist() == want.to_pylist()
    assert charges(ledger) == 3


@pytest.mark.parametrize("flags, message", [
    (["--group-cols", "country,day", "--item-col", "country"], "--item-col and --group-cols: give one"),
    (["--group-cols", "country,nope"], "--group-cols 'nope' is not a column"),
    (["--group-cols", "country,user_id"], "--user-col and --group-cols and --group-cols must name different columns"),
    (["--group-cols", "country,count"], "a group column may not be named 'count'"),
    (["--aggregates", "count,rows", "--max-rows", "2.5"], "max_rows must be a whole number"),
    (["--max-rows", "2"], "max_rows is used only by the 'rows' aggregate"),
    (["--max-groups", "0"], "max_groups must be a whole number"),
    (["--aggregates", "count,mode"], "'mode' is not one of count, rows"),
    (["--items", "ITEMS", "--selection", "mad", "--noise", "gaussian"],
     "--noise, --selection do not apply to a public list without --delta"),
])
def test_group_by_refuses_before_reading_naming_the_flag(tmp_path, flags, message):
    path = _groups_file(tmp_path)
    items = tmp_path / "items.csv"
    items.write_text("item\nfr\n", encoding="utf-8")
    ledger = tmp_path / "l.dpsql-ledger"
    budget = ["--epsilon", "1"] if "--items" in flags else BUDGET
    r = cli("group-by", str(path), *budget, *[str(items) if f == "ITEMS" else f for f in flags],
            "--ledger", str(ledger))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("Error: ") and message in line, line
    assert not ledger.exists() or charges(ledger) == 0


def test_group_by_noise_is_a_declared_choice(tmp_path):
    r = cli("group-by", str(_groups_file(tmp_path)), *BUDGET, "--noise", "uniform")
    assert r.returncode == 2 and "invalid choice: 'uniform'" in r.stderr and "gaussian" in r.stderr
