"""notebooks/explore_store.ipynb runs headless against a small store without a cell error."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import broker_conf

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_store.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert any("parameters" in c.metadata.get("tags", []) for c in code)


@pytest.fixture(scope="module")
def kernel_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernel-tmp")


@pytest.fixture(scope="module")
def executed(kernel_tmp) -> nbformat.NotebookNode:
    """The notebook as a new user runs it: its default store (the shared sample, extracted to a temp
    dir of its own), the kernel's temp dir isolated so what it leaves behind can be checked."""
    mp = pytest.MonkeyPatch()
    for k in ("RMQSTORE_NOTEBOOK_STORE", "RMQSTORE_NOTEBOOK_BROKER_CONF", "MPLBACKEND"):
        mp.delenv(k, raising=False)  # MPLBACKEND: the kernel's inline backend emits PNGs
    mp.setenv("RMQSTORE_NOTEBOOK_SPARK", "0")  # the SQL cell runs below on the test session
    mp.setenv("TMPDIR", str(kernel_tmp))
    try:
        nb = nbformat.read(NOTEBOOK, as_version=4)
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:
        mp.undo()
    return nb


def test_notebook_uses_only_the_public_api():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "import datasources as ds" in code
    for internal in ("from storelib", "import storelib", "Store(", "lookup_key", "decode_msg_id", ".scan("):
        assert internal not in code, internal
    assert "spark.stop()" in code


def test_notebook_removes_the_sample_it_extracted(executed, kernel_tmp):
    assert "removed " in _text(executed)
    assert not [p.name for p in kernel_tmp.iterdir() if p.name.startswith("rmqstore-nb-")]


def test_notebook_queries_a_snapshot_beside_the_live_readers(executed):
    text = _text(executed)
    assert "rmqstore export:" in text and "2000 rows" in text


def _text(nb) -> str:
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            out.append(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def test_notebook_executes_every_cell_on_the_sample(executed):
    text = _text(executed)
    assert "4 segment(s), 2000 message(s), 0 corrupt record(s)" in text
    assert "message(s)" in text and "msgId" in text
    assert any(o.get("data", {}).get("image/png") for c in executed.cells for o in c.get("outputs", []))


@pytest.mark.spark
def test_notebook_spark_sql_cell_runs_on_the_session(spark, sample_498):
    """The notebook's SQL cell, executed with the test session (the only SparkSession of the run)."""
    import datasources as ds

    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if "spark-sql" in c.metadata.get("tags", []))
    store = str(sample_498 / "store")
    msgs = ds.read_messages(store).to_pandas()
    shown = []
    env = {"spark": spark, "ds": ds, "STORE": store, "BROKER_CONF": str(broker_conf("4.9.8")),
           "good": msgs[msgs["_corrupt"].isna()], "display": shown.append}
    exec(compile(cell.source, "explore_store.ipynb[spark-sql]", "exec"), env)
    assert len(shown) == 1 and shown[0]["messages"].sum() == 2000
    assert (shown[0]["with_cq_unit"] == shown[0]["messages"]).all()


def test_notebook_timer_cell_on_the_5x_timer_sample(tmp_path):
    """The notebook's timer section, run on the real 5.3.3 timer sample (the default sample has none)."""
    import tarfile

    import datasources as ds
    from tests.conftest import SAMPLES

    with tarfile.open(SAMPLES / "rocketmq-5.3.3-timer-small.tar.gz") as tf:
        tf.extractall(tmp_path, filter="data")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if "timers" in c.metadata.get("tags", []))
    shown: list = []
    printed: list = []
    env = {"ds": ds, "Path": Path, "STORE": str(tmp_path / "rocketmq-5.3.3-timer-small" / "store"), "opts": {},
           "display": shown.append, "print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(cell.source, "explore_store.ipynb[timers]", "exec"), env)
    assert printed == ["{'pending': 182, 'delivered': 138}"]
    assert dict(shown[0]["pending"]) == {"CouponExpiry": 89, "ShipmentTracking": 93}
