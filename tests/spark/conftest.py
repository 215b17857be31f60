"""One local Spark session per test module (the ``broker`` fixture is in ``tests/conftest.py``).

Spark binds to 127.0.0.1 (``SPARK_LOCAL_IP``) and runs ``local[2]``; executors' Python workers
use this interpreter. The whole directory is skipped when pyspark (the ``spark`` extra) or Java
is missing, with the reason shown.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

if shutil.which("java") is None:
    pytest.skip("Spark needs Java (make test installs it)", allow_module_level=True)
pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytest.importorskip("pyarrow", reason="the spark extra is not installed")


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("automq-ref-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
