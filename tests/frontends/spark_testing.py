"""The local Spark session of the Spark test modules: one definition of how it starts and when it skips.

CI sets DPSQL_REQUIRE_SPARK=1 (or DPSQL_REQUIRE=spark): there a missing pyspark, sqlglot or Java is a failure, not a skip.
"""
from __future__ import annotations

import os
import shutil
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

import pytest

REQUIRED = ("spark" in os.environ.get("DPSQL_REQUIRE", "").split(",")
            or os.environ.get("DPSQL_REQUIRE_SPARK") == "1")

# Starts this interpreter with duckdb and dpsql unimportable (None in sys.modules), as on an
# executor that has neither installed.
BLOCK = "import sys\nsys.modules['duckdb'] = None\nsys.modules['dpsql'] = None\n"


def need(module: str):
    """``module`` imported; a skip without it (a failure where Spark is required)."""
    return __import__(module) if REQUIRED else pytest.importorskip(module)


def java_or_skip() -> None:
    home = os.environ.get("JAVA_HOME")
    if not (shutil.which("java") or (home and os.path.exists(os.path.join(home, "bin", "java")))):
        if REQUIRED:
            pytest.fail("Java is not available (pyspark needs a JVM; set JAVA_HOME)")
        pytest.skip("Java is not available (pyspark needs a JVM; set JAVA_HOME)")


def python_without_dpsql(folder) -> str:
    """A command that runs this Python with ``duckdb`` and ``dpsql`` blocked (a POSIX shell script)."""
    if os.name != "posix":
        pytest.skip("the worker interpreter shim is a POSIX shell script")
    block = folder / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCK)
    shim = folder / "python-without-dpsql"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{block}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    return str(shim)


@contextmanager
def local_session(app: str, *, worker_python: Optional[str] = None, log_level: str = "ERROR") -> Iterator:
    """A ``local[2]`` session (pyspark, sqlglot and Java required, else a skip), stopped on exit.

    ``worker_python``: the Python workers' interpreter (read once, when the SparkContext is created; the
    environment is restored after); else this interpreter unless PYSPARK_PYTHON names one.
    """
    need("pyspark")
    need("sqlglot")
    java_or_skip()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    previous = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = worker_python or previous or sys.executable
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            session = (SparkSession.builder.master("local[2]").appName(app)
                       .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                       .config("spark.sql.shuffle.partitions", "2")
                       .config("spark.default.parallelism", "2").getOrCreate())
    finally:
        if previous is None:
            del os.environ["PYSPARK_PYTHON"]
        else:
            os.environ["PYSPARK_PYTHON"] = previous
    session.sparkContext.setLogLevel(log_level)
    if worker_python is not None:  # a session made before this one would keep its own workers
        assert session.sparkContext.pythonExec == worker_python
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(autouse=True)
def quiet_spark_warnings():
    """Autouse in every Spark test module that imports it: pyspark's notice about pandas 3 (FutureWarning) and the
    expected NOT-private warning of seeded releases (UserWarning) are not the tests' subject."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield
