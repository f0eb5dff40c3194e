"""`dpsql demo` and the embedded demo dataset."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from importlib import resources

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.tools import demo
from dpsql.frontends.cli import main


@pytest.fixture(scope="module")
def dataset():
    with demo.dataset_path() as path:
        return pq.read_table(path)


def test_demo_command_prints_every_method(tmp_path):
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    r = subprocess.run([sys.executable, "-m", "dpsql", "demo"], capture_output=True, text=True,
                       encoding="utf-8", cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    for method in dpsql.METHODS:
        assert re.search(rf"^{method}\s+\d+\s+[\d.]+ %\s+[\d.]+ %$", r.stdout, re.M), r.stdout
    assert "78,735" in r.stdout and "3,486 users" in r.stdout
    assert "Gopi et al." in r.stdout and "MIT" in r.stdout  # attribution line
    assert "NON-PRIVATE" in r.stdout


def test_demo_json_rows_are_consistent(dataset):
    out, err = io.StringIO(), io.StringIO()
    assert main(["demo", "--json", "--seed", "5"], out=out, err=err) == 0
    assert "NOT differentially private" in err.getvalue()
    doc = json.loads(out.getvalue())
    size = doc["dataset"]
    assert (size["entries"], size["users"], size["items"]) == (
        dataset.num_rows, len(pc.unique(dataset["user_id"])), len(pc.unique(dataset["item"])))
    assert doc["private"] is False
    assert [row["method"] for row in doc["rows"]] == list(dpsql.METHODS)
    for row in doc["rows"]:
        assert 0 <= row["released"] <= size["items"]
        assert 0 <= row["users_covered"] <= size["users"]
        assert 0 <= row["entries_covered"] <= size["entries"]
        assert 0.0 <= row["user_share"] <= 1.0 and 0.0 <= row["entry_share"] <= 1.0
        assert row["user_share"] == pytest.approx(row["users_covered"] / size["users"])
        assert (row["released"] == 0) == (row["entries_covered"] == 0)
        assert set(row) == {"method", "released", "users_covered", "user_share", "entries_covered",
                            "entry_share", "noise", "scale", "threshold"}  # nothing per item, no weights


def test_weighted_gaussian_releases_words():
    # Reference point: about 100 words at (1, 1e-5, 100); 30 is far below any plausible run.
    [row] = demo.run_demo(methods=["weighted_gaussian"])
    assert row["released"] > 30 and row["user_share"] > 0.5


def test_embedded_dataset_is_pseudonymised(dataset):
    assert dataset.column_names == ["user_id", "item"]
    assert (dataset.num_rows, len(pc.unique(dataset["user_id"])), len(pc.unique(dataset["item"]))) == (
        78_735, 3_486, 10_889)
    users = pc.unique(dataset["user_id"]).to_pylist()
    assert all(re.fullmatch(r"u\d+", u) for u in users)
    assert dataset.group_by(["user_id", "item"]).aggregate([]).num_rows == dataset.num_rows  # distinct pairs
    assert pc.all(pc.not_equal(dataset["item"], "")).as_py() and dataset["item"].null_count == 0


def test_dataset_ships_with_its_readme():
    readme = (resources.files("dpsql") / "data" / "README.md").read_text(encoding="utf-8")
    assert "MIT" in readme and "smartnoise-sdk" in readme and "pseudonym" in readme
