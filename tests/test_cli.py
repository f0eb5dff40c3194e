"""`dpsql set-union` end to end.

A few runs go through `python -m dpsql` in subprocesses, all started at once in
a module fixture (each process spends most of its time importing, so running
them side by side keeps the module fast); the other cases call
``dpsql.cli.main`` in this process, which is the same code without the import.
"""
from __future__ import annotations

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

from dpsql.cli import main

PARAMS = ["--epsilon", "1", "--delta", "1e-5", "--max-items", "10"]
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
    cal = dpsql.calibrate(dpsql.DEFAULT_METHOD, 1.0, 1e-5, 10)
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
    (["--delta", "1e-5", "--max-items", "10"], "--epsilon"),
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
    from dpsql.ledger import Ledger

    return len(Ledger(ledger).releases())


N_TYPED = 300
COMMON = {"list": [1, 2], "struct": {"a": 1, "b": "x"}, "blob": b"\x00common,\"\n"}


def typed_items(kind: str) -> pa.Table:
    """Every user holds the common item (weight 300 against a threshold near 19: released) and one of its own."""
    own = {"list": lambda u: [u, -u], "struct": lambda u: {"a": u, "b": f"u{u}"},
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
        assert str(COMMON[kind]) in r.stdout.splitlines()
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
    ("out.txt", ["--output", "*.parquet or *.csv"]),
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
    """Make dpsql.cli._write fail with 'no space left' for the real output (and for the probe if ``probe``)."""
    import errno

    import dpsql.cli as cli_mod

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
    from dpsql.ledger import Ledger

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
    from dpsql.ledger import Release

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
