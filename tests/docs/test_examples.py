"""Every script under examples/ runs, as a user runs it (a subprocess, on a small input), so none can drift.

An example added without a run here fails :func:`test_every_example_is_run`. ``pws_figures.py`` and the dbt
project are run by their own tests (tests/pws/test_pws_figures.py, tests/frontends/test_dbt.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_ELSEWHERE = {"pws_figures.py": "tests/pws/test_pws_figures.py"}
RUN_HERE = {"coverage_by_frequency.py", "make_demo_dataset.py", "spark_mad2r.py"}


def _need_examples() -> None:
    if not EXAMPLES.is_dir():
        pytest.skip("examples/ is not next to the tests folder")


def _user_items(path: Path, users: int = 300) -> Path:
    """(user_id, item) pairs: user u holds items w0 .. w(u % 17), distinct pairs, string users."""
    pairs = [(f"user{u:04d}", f"w{j}") for u in range(users) for j in range(u % 17 + 1)]
    pq.write_table(pa.table({"user_id": [u for u, _ in pairs], "item": [i for _, i in pairs]}), path)
    return path


def _run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_every_example_is_run():
    _need_examples()
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts == RUN_HERE | set(RUN_ELSEWHERE), "run the new example in this file (or name its test)"


def test_coverage_by_frequency_plots_every_method(tmp_path):
    _need_examples()
    pytest.importorskip("matplotlib", reason="matplotlib (the plot extra) is not installed")
    data, out = _user_items(tmp_path / "data.parquet"), tmp_path / "coverage.png"
    done = _run([str(EXAMPLES / "coverage_by_frequency.py"), str(data), "--output", str(out), "--seed", "3"],
                tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"wrote {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_make_demo_dataset_pseudonymises_the_users(tmp_path):
    _need_examples()
    source, out = _user_items(tmp_path / "source.parquet", users=50), tmp_path / "demo.parquet"
    done = _run([str(EXAMPLES / "make_demo_dataset.py"), str(source), "--output", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = pq.read_table(source), pq.read_table(out)
    assert after.num_rows == before.num_rows and after.column_names == ["user_id", "item"]
    assert not set(after["user_id"].to_pylist()) & set(before["user_id"].to_pylist())  # no author name kept
    # the same multiset of user degrees and the same items: only the ids changed
    degrees = lambda t: sorted(t.group_by("user_id").aggregate([("item", "count")])["item_count"].to_pylist())  # noqa: E731
    assert degrees(after) == degrees(before)
    assert sorted(after["item"].to_pylist()) == sorted(before["item"].to_pylist())
    assert f"rows {before.num_rows:,}; users 50; distinct items 17" in done.stdout


@pytest.mark.xdist_group("spark")  # one JVM at a time beside the Spark tests
def test_spark_mad2r_releases_the_common_items(tmp_path):
    _need_examples()
    pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")
    pytest.importorskip("sqlglot", reason="sqlglot (the spark extra) is not installed")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no java: the Spark example needs Java 17+")
    data = _user_items(tmp_path / "data.parquet", users=2000)
    done = _run([str(EXAMPLES / "spark_mad2r.py"), str(data), "--epsilon", "1", "--delta", "1e-5",
                 "--max-items", "20", "--master", "local[1]"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    # w0 .. w16 are held by 2000 down to ~118 users: far above MAD2R's threshold at epsilon 1 (about 100
    # standard deviations of its noise for w0), so every run releases at least the most common ones
    assert lines[-2].startswith("MAD2R at (epsilon=1.0, delta=1e-05, max_items=20) released ")
    released = lines[-1].split(", ")
    assert {"w0", "w1", "w2"} <= set(released) <= {f"w{j}" for j in range(17)}
