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
    assert data.common <= set(written.column("item").to_pylist()) <= data.items


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
