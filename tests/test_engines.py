"""One task layer, three schedulers: the same store through the in-process engine, the process pool and
Spark gives the same rebuild bytes, the same audit findings and the same recovery plan (the expiry grid:
tests/test_expiry.py); ``auto`` picks the pool for a store worth it; a worker's error reaches the caller
whole."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from jobs.audit import audit_store
from jobs.engines.schedulers import POOL_MIN_BYTES, LocalEngine, PoolEngine, make_engine, resolve_engine_name
from jobs.rebuild import RebuildConfig, rebuild
from storelib.broker.settings.storeroot import NotAStoreError
from storelib.errors import CorruptRecordError, StoreError


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    from jobs.cli import main

    root = tmp_path_factory.mktemp("engines") / "store"
    assert main(["gen", str(root), "--size", "3MB", "--segment-size", "512KB", "--seed", "7"]) == 0
    with open(root / "commitlog" / f"{512 * 1024:020d}", "r+b") as f:  # one body byte flipped: a finding
        f.seek(20_000)
        b = f.read(1)[0]
        f.seek(20_000)
        f.write(bytes([b ^ 0x40]))
    return root


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "manifest" not in p.name}


def _findings(rep: dict) -> list[tuple]:
    return sorted((f["kind"], f["severity"], f["file"], f["offset"]) for f in rep["findings"])


def _rebuild(store: Path, out: Path, engine: str, **kw) -> dict:
    return rebuild(RebuildConfig(store=str(store), out=str(out), engine=engine, progress=False, **kw))


def test_local_and_pool_engines_rebuild_the_same_bytes_and_audit_the_same_findings(store, tmp_path):
    a = _rebuild(store, tmp_path / "local", "local")
    b = _rebuild(store, tmp_path / "pool", "pool", workers=2)
    assert a["engine"] == "local" and b["engine"] == "pool"
    assert a["files"] == b["files"] and _tree(tmp_path / "local") == _tree(tmp_path / "pool")
    ra = audit_store(str(store), engine="local", quiet=True)
    rb = audit_store(str(store), engine="pool", workers=2, quiet=True)
    assert rb["run"]["engine"] == "pool"
    assert _findings(ra) == _findings(rb) and any(f[0] == "body_crc_mismatch" for f in _findings(ra))
    assert ra["queues"] == rb["queues"] and ra["summary"]["records"] == rb["summary"]["records"]


@pytest.mark.spark
def test_spark_engine_gives_the_same_bytes_and_findings(store, tmp_path, spark):
    _rebuild(store, tmp_path / "local", "local")
    s = rebuild(RebuildConfig(store=str(store), out=str(tmp_path / "spark"), engine="spark", progress=False),
                spark=spark)
    assert s["engine"] == "spark" and _tree(tmp_path / "local") == _tree(tmp_path / "spark")
    assert _findings(audit_store(str(store), engine="spark", spark=spark, quiet=True)) == \
        _findings(audit_store(str(store), engine="local", quiet=True))


def test_auto_picks_spark_with_a_master_the_pool_for_a_big_store_else_local(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert resolve_engine_name("auto", master="local[2]", store_bytes=1, segments=1) == "spark"
    assert resolve_engine_name("auto", store_bytes=POOL_MIN_BYTES, segments=2) == "pool"
    assert resolve_engine_name("auto", store_bytes=POOL_MIN_BYTES - 1, segments=9) == "local"
    assert resolve_engine_name("auto", store_bytes=10 * POOL_MIN_BYTES, segments=1) == "local"
    assert resolve_engine_name("pool", store_bytes=1, segments=1) == "pool"
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert resolve_engine_name(None, store_bytes=10 * POOL_MIN_BYTES, segments=9) == "local"
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "4040")
    assert resolve_engine_name("auto", store_bytes=1, segments=1) == "spark"


def test_the_cli_takes_engine_and_workers_on_audit_rebuild_and_recover(store, tmp_path, capsys):
    import json

    from jobs.cli import main

    assert main(["audit", str(store), "--engine", "pool", "--workers", "2", "--quiet"]) == 1
    assert "engine pool" in capsys.readouterr().err
    assert main(["rebuild", str(store), "--out", str(tmp_path / "o"), "--engine", "pool", "--workers", "2",
                 "--quiet"]) == 0
    assert "engine pool" in capsys.readouterr().out
    plans = []
    for engine in ("local", "pool"):
        assert main(["recover", str(store), "--engine", engine, "--workers", "2", "--json"]) == 0
        plans.append(json.loads(capsys.readouterr().out))
        plans[-1].pop("created_ms")
    assert plans[0] == plans[1]


@pytest.mark.parametrize("err", [StoreError("commitlog/0", 12, "bad_magic", "x"),
                                 CorruptRecordError("commitlog/0", None, "bad_size", "y"),
                                 NotAStoreError("/nope", None, "not_a_store", "z")])
def test_store_errors_cross_process_boundaries_whole(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and back.offset == err.offset


def _fail_on_two(x: int) -> int:
    if x == 2:
        raise StoreError("commitlog/2", 7, "bad_magic", "injected")
    return x * 10


def test_a_failing_task_fails_the_map_with_its_own_error():
    for eng in (LocalEngine(), PoolEngine(2)):
        try:
            assert eng.map(_fail_on_two, [0, 1, 3]) == [0, 10, 30]
            with pytest.raises(StoreError, match="commitlog/2 @ 7: bad_magic: injected"):
                eng.map(_fail_on_two, [0, 1, 2, 3])
        finally:
            eng.close()


def _pid(_: int) -> int:
    import os

    return os.getpid()


def test_a_released_pool_returns_at_once_and_close_waits_for_its_workers_to_exit():
    """release(): the workers exit while the caller goes on (the export's commit); close() joins them,
    and the engine (or a new one) forks afresh afterwards."""
    import os
    import threading

    eng = PoolEngine(2)
    try:
        pids = set(eng.map(_pid, list(range(6))))
        assert pids and os.getpid() not in pids
        eng.release()
        assert eng._pool is None and eng._exiting is not None
        eng.close()
        assert eng._exiting is None and not [t for t in threading.enumerate() if t.name == "rmqstore-pool-exit"]
        for pid in pids:  # exited and reaped: no such process any more
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
        assert not pids & set(eng.map(_pid, [0, 1]))  # a new pool after close
    finally:
        eng.close()
    for e in (LocalEngine(),):
        e.release()
        assert e.map(_fail_on_two, [1]) == [10]


def test_make_engine_refuses_an_unknown_name():
    with pytest.raises(ValueError, match="engine must be one of"):
        make_engine("threads")


def test_the_pool_forks_only_while_no_other_thread_runs(monkeypatch):
    import threading

    from jobs.engines.schedulers import _start_method, fork_hazards

    monkeypatch.delenv("RMQSTORE_POOL_START", raising=False)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    alone = not fork_hazards()  # this test process may have opened S3 already (other tests)
    other.start()
    try:
        assert _start_method() == "forkserver"
        eng = PoolEngine(2)  # and the forkserver pool runs tasks with that thread alive
        try:
            assert eng.map(_fail_on_two, [0, 1, 3]) == [0, 10, 30]
        finally:
            eng.close()
    finally:
        stop.set()
        other.join()
    if alone:
        assert _start_method() == "fork"
    monkeypatch.setenv("RMQSTORE_POOL_START", "spawn")
    assert _start_method() == "spawn"


def _pa_array_in_worker(x: int) -> tuple[int, bool]:
    import sys

    import pyarrow as pa

    return len(pa.array([x, x + 1])), "pandas" in sys.modules


def test_pool_workers_use_pyarrow_without_importing_pandas(tmp_path):
    """pyarrow imports pandas on a process's first pa.array (0.17 s a worker): a worker whose driver has not
    imported it runs without it, and pyarrow works."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("import sys\nfrom jobs.engines.schedulers import PoolEngine\nfrom tests.test_engines import _pa_array_in_worker\n"
            "e = PoolEngine(2)\ne.start()\nprint(e.map(_pa_array_in_worker, [0, 1, 2]), 'pandas' in sys.modules)\n"
            "e.close()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[(2, False), (2, False), (2, False)] False", p.stderr[-2000:]


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_the_pool_works_from_a_script_read_on_stdin(tmp_path, start):
    """A forkserver or spawned worker re-runs __main__ from its file; ``python -`` has none: the pool must
    not die of it."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    code = ("from jobs.engines.schedulers import PoolEngine\nfrom tests.test_engines import _fail_on_two\n"
            "e = PoolEngine(2)\nprint(e.map(_fail_on_two, [0, 1, 3]))\ne.close()\n")
    p = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(REPO), "RMQSTORE_POOL_START": start}, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[0, 10, 30]", p.stderr[-2000:]


def _plan_on(store: Path, engine) -> dict:
    from jobs.engines.schedulers import walk_on
    from storelib.broker.settings.store import Store
    from storelib.broker.startup.recoveryplan import plan_document
    from storelib.broker.startup.startup import simulate

    st = Store(str(store), None)
    try:
        doc = plan_document(simulate(st, walk_runner=walk_on(engine)))
    finally:
        engine.close()
    doc.pop("created_ms")
    return doc


@pytest.mark.spark
def test_the_recovery_plan_is_the_same_on_every_engine(store, tmp_path, spark):
    import shutil

    from jobs.engines.schedulers import SparkEngine

    crashed = tmp_path / "crashed"  # an abnormal exit: the walk checks every segment from the checkpoint's
    shutil.copytree(store, crashed)
    (crashed / "abort").write_bytes(b"")
    for root, crc_stop in ((store, False), (crashed, True)):
        plans = [_plan_on(root, e) for e in (LocalEngine(), PoolEngine(2), SparkEngine(spark))]
        assert plans[0] == plans[1] == plans[2]
        # clean: the window (last segments) is intact; crashed: the flipped byte ends the walk and the plan
        # truncates there, although the pool and Spark scanned every segment after it too
        failure = plans[0]["commitlog"]["failure"]
        assert (failure is not None and failure["reason"] == "crc_mismatch") == crc_stop
        assert plans[0]["changes"] == crc_stop


def _parent_pid(_: int) -> int:
    import os

    return os.getppid()


_ON_S3 = """
import json, os, sys
from jobs.engines import schedulers
from jobs.engines.schedulers import PoolEngine
from storelib.broker.settings.store import Store
from storelib.fileio.bytesource import resolve
from tests.test_engines import _parent_pid

opts = json.loads(sys.argv[2])
fork_hazards = getattr(schedulers, "fork_hazards", lambda: None)
before = fork_hazards()
store = Store(resolve(sys.argv[1], **opts), None)  # lists the remote store: the S3 client's threads start
segments = len(store.commitlog.segments)
e = PoolEngine(2)
e.start()
print(json.dumps({"before": before, "after": fork_hazards(), "segments": segments,
                  "method": getattr(e, "start_method", None),
                  "parents": e.map(_parent_pid, [0, 1, 2, 3]), "me": os.getpid()}))
e.close()
"""


def test_the_pool_does_not_fork_a_driver_that_opened_a_remote_store(store, tmp_path, s3_server):
    """Listing an s3:// store starts the AWS SDK's native threads, which threading.active_count() does not
    see; a worker forked from that process could inherit one of their locks held. The pool's workers then
    come from a forkserver (their parent is the server, not the driver), and a rebuild on the pool from
    S3 gives the local engine's bytes."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    uri = s3_server.upload(store, f"{s3_server.new_bucket('pool')}/store")
    p = subprocess.run([sys.executable, "-c", _ON_S3, uri, json.dumps(s3_server.fs_options())], capture_output=True,
                       text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["segments"] > 1 and got["me"] not in got["parents"]  # no worker is the driver's fork
    assert got["method"] == "forkserver" and got["before"] == []
    assert "a remote filesystem client" in got["after"] and any("AwsEventLoop" in w for w in got["after"])
    remote = _rebuild(uri, tmp_path / "s3pool", "pool", workers=2, fs_options=s3_server.fs_options())
    local = _rebuild(store, tmp_path / "local", "local")
    assert remote["files"] == local["files"] and remote["counts"] == local["counts"]
