"""The Python daemon of the Spark sessions rmqstore starts on this machine (jobs.spark.sparkdaemon): PySpark
comes from its installed package, compiled once, not from Spark's zip; and a local session that imports
our packages from the checkout is not shipped a zip of them."""

from __future__ import annotations

import os
import sys

import pytest

from jobs.spark import sparkdaemon


def _fake_install(tmp_path):
    site = tmp_path / "site-packages"
    pkg = site / "pyspark"
    (pkg / "python" / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    return site, pkg / "python" / "lib" / "pyspark.zip", pkg / "python" / "lib" / "py4j-src.zip"


def test_the_installed_packages_own_zips_go_behind_it(tmp_path, monkeypatch):
    site, pz, py4j = _fake_install(tmp_path)
    other = tmp_path / "elsewhere" / "pyspark.zip"
    monkeypatch.setattr(sys, "path", ["", str(pz), str(py4j), str(other), str(site), "/repo"])
    assert sparkdaemon.prefer_installed_pyspark()
    assert sys.path == ["", str(other), str(site), "/repo", str(pz), str(py4j)]


def test_a_separate_spark_home_keeps_sparks_order(tmp_path, monkeypatch):
    site, _, _ = _fake_install(tmp_path)
    spark_home = tmp_path / "opt" / "spark" / "python" / "lib"
    path = [str(spark_home / "pyspark.zip"), str(spark_home / "py4j-src.zip"), str(site)]
    monkeypatch.setattr(sys, "path", list(path))
    assert not sparkdaemon.prefer_installed_pyspark()
    assert sys.path == path
    monkeypatch.setattr(sys, "path", [str(spark_home / "pyspark.zip")])  # no installed package at all
    assert not sparkdaemon.prefer_installed_pyspark()


def _where(_):
    import pyspark

    import storelib

    return pyspark.__file__, storelib.__file__


@pytest.mark.spark
def test_workers_of_a_local_session_import_pyspark_and_our_code_compiled_not_from_zips(spark):
    from jobs.engines.schedulers import SparkEngine
    from jobs.spark.sparkutil import REPO

    sc = spark.sparkContext
    assert sc.getConf().get("spark.python.daemon.module") == "jobs.spark.sparkdaemon"
    got = SparkEngine(spark).map(_where, [0, 1])
    import pyspark

    for pyspark_file, storelib_file in got:
        assert ".zip" not in pyspark_file and os.path.realpath(pyspark_file) == os.path.realpath(pyspark.__file__)
        assert os.path.realpath(storelib_file) == os.path.realpath(REPO / "storelib" / "__init__.py")


def test_only_local_sessions_get_the_daemon(monkeypatch):
    import jobs.spark.sparkutil as su

    seen = {}

    def fake_start(master, app_name, settings):
        seen[master] = dict(settings)
        raise RuntimeError("stop here")

    monkeypatch.setattr(su, "_start_jvm", fake_start)
    monkeypatch.setattr(su, "check_java", lambda: None)
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    for master in ("local[2]", None, "spark://host:7077", "yarn"):
        with pytest.raises(RuntimeError, match="stop here"):
            su.get_spark(master=master)
    assert seen["local[2]"]["spark.python.daemon.module"] == "jobs.spark.sparkdaemon"
    assert seen[None]["spark.python.daemon.module"] == "jobs.spark.sparkdaemon"
    assert "spark.python.daemon.module" not in seen["spark://host:7077"]
    assert "spark.python.daemon.module" not in seen["yarn"]
