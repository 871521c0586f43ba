"""Shared fixtures: the real sample stores (extracted once, copied per test when mutated), paths, Spark.

The samples in ../shared are read-only: tests extract them into temp dirs. There is exactly one
SparkSession for the whole run (``spark`` fixture), local[2] with the project's spark-conf.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from tests.s3server import s3_server  # noqa: F401  (the loopback S3 server fixture)

# the Spark JVM's class-data archive (jobs/spark/jvmcache.py) is a per-user cache: the test run neither reads
# nor writes the user's; tests/test_jvmcache.py turns it on with a cache dir of its own
os.environ["RMQSTORE_JVM_CDS"] = "0"

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RMQSTORE_SHARED", REPO.parent / "shared"))
SAMPLES = SHARED / "samples"
SAMPLE_NAMES = {"4.9.8": "rocketmq-4.9.8-small", "5.3.3": "rocketmq-5.3.3-small",
                "dledger": "rocketmq-4.9.8-dledger-small", "dledger-crashed": "rocketmq-4.9.8-dledger-crashed-small",
                "dledger-group": "rocketmq-4.9.8-dledger-group-small", "timer": "rocketmq-5.3.3-timer-small"}


def extract_sample(version: str, dest: Path) -> Path:
    """The sample ``version`` (a SAMPLE_NAMES key) extracted under ``dest``: its root."""
    name = SAMPLE_NAMES[version]
    with tarfile.open(SAMPLES / f"{name}.tar.gz") as tf:
        tf.extractall(dest, filter="data")
    return dest / name


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    if not SAMPLES.is_dir():
        pytest.fail(f"shared samples not found at {SAMPLES} (set RMQSTORE_SHARED)")
    return SAMPLES


@pytest.fixture(scope="session")
def sample_498(tmp_path_factory, samples_dir) -> Path:
    """Read-only extracted 4.9.8 sample (``store/``, ``expected/``). Copy it before modifying."""
    return extract_sample("4.9.8", tmp_path_factory.mktemp("s498"))


@pytest.fixture(scope="session")
def sample_533(tmp_path_factory, samples_dir) -> Path:
    """Read-only extracted 5.3.3 sample (``store/``, ``expected/``). Copy it before modifying."""
    return extract_sample("5.3.3", tmp_path_factory.mktemp("s533"))


@pytest.fixture(scope="session")
def sample_dledger(tmp_path_factory, samples_dir) -> Path:
    """Read-only extracted clean DLedger sample (4.9.8 over DLedger 0.3.1.2). Copy it before modifying."""
    return extract_sample("dledger", tmp_path_factory.mktemp("sdl"))


@pytest.fixture(scope="session")
def sample_dledger_crashed(tmp_path_factory, samples_dir) -> Path:
    """Read-only extracted crashed DLedger sample (JVM halted mid-write). Copy it before modifying."""
    return extract_sample("dledger-crashed", tmp_path_factory.mktemp("sdlc"))


@pytest.fixture(scope="session")
def sample_dledger_group(tmp_path_factory, samples_dir) -> Path:
    """Read-only extracted three-node DLedger group (store-n0/1/2, expected/rejoin.json). Copy it before modifying."""
    return extract_sample("dledger-group", tmp_path_factory.mktemp("sdlg"))


@pytest.fixture(params=["dledger", "dledger-crashed"])
def dledger_sample(request, sample_dledger, sample_dledger_crashed) -> Path:
    """Each DLedger sample in turn (read-only)."""
    return sample_dledger if request.param == "dledger" else sample_dledger_crashed


@pytest.fixture(params=["4.9.8", "5.3.3"])
def sample(request, sample_498, sample_533) -> Path:
    """Each sample in turn (read-only)."""
    return sample_498 if request.param == "4.9.8" else sample_533


@pytest.fixture
def sample_copy(tmp_path, sample) -> Path:
    """A private, writable copy of a sample's store root."""
    dst = tmp_path / "store"
    shutil.copytree(sample / "store", dst)
    return dst


def extract_members(tmp_path: Path, name: str, members: list[str]) -> Path:
    """Extract only some members of a sample tarball (``<name>/<member>``) into ``tmp_path``."""
    with tarfile.open(SAMPLES / f"{name}.tar.gz") as tf:
        for m in members:
            tf.extract(f"{name}/{m}", tmp_path, filter="data")
    return tmp_path / name


def load_expected(sample_root: Path, name: str) -> list[dict]:
    with open(sample_root / "expected" / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def broker_conf(version: str) -> Path:
    return SAMPLES / f"{SAMPLE_NAMES[version]}.broker.conf"


@pytest.fixture(scope="session")
def spark():
    """The one SparkSession of the test run (local[2], the project's spark-defaults)."""
    from jobs.spark.sparkutil import get_spark

    session = get_spark(master="local[2]", app_name="rmqstore-tests")
    yield session
    session.stop()


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """``rmqstore ARGV`` in this process: (exit code, stdout, stderr)."""
    from jobs.cli import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err
