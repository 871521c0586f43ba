"""The rebuild job: both engines byte-identical to the broker's files, to storelib's scalar oracles and
to each other; publishing, in-place, incremental, crash safety and a real standalone Spark cluster."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from jobs.rebuild import RebuildConfig, rebuild
from storelib.broker.settings.brokerconf import BrokerSettings, load_broker_conf
from storelib.broker.settings.store import Store
from storelib.errors import StoreError
from storelib.fileio.publish import MANIFEST_NAME, publish_tree, read_manifest
from storelib.format.consumequeue import CQ_DTYPE
from tests.conftest import REPO, broker_conf, load_expected
from tests.index_oracle import ScalarIndexService
from tests.rebuild_storegen import CraftedStore, msg
from tests.s3server import _die_with_parent

S = 64 * 1024


# ---------------------------------------------------------------------------------------------
# helpers


def files_of(root: Path, sub: str) -> dict[str, bytes]:
    d = root / sub
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def index_list(root: Path) -> list[bytes]:
    """Index files in name order (compared by order: names are a policy, not the broker's)."""
    d = root / "index"
    return [p.read_bytes() for p in sorted(d.iterdir())] if d.exists() else []


def assert_same_output(a: Path, b: Path) -> None:
    ca, cb = files_of(a, "consumequeue"), files_of(b, "consumequeue")
    assert sorted(ca) == sorted(cb)
    assert [k for k in ca if ca[k] != cb[k]] == []
    ia, ib = index_list(a), index_list(b)
    assert len(ia) == len(ib) and all(x == y for x, y in zip(ia, ib))
    assert sorted(os.listdir(a / "index")) == sorted(os.listdir(b / "index")) if (a / "index").exists() else True


_SPARK: dict = {}


def run(store: Path, out: Path | None, settings_conf: str | None = None, **kw) -> dict:
    """One rebuild (the spark engine uses the test session when ``with_spark`` is active)."""
    cfg = RebuildConfig(store=str(store), out=str(out) if out else None, broker_conf=settings_conf, progress=False,
                        **kw)
    return rebuild(cfg, spark=_SPARK.get("s"))


@pytest.fixture
def with_spark(spark):
    """The session `spark` fixture, handed to the spark engine."""
    _SPARK["s"] = spark
    yield spark
    _SPARK.pop("s", None)


def write_conf(tmp: Path, **props) -> str:
    p = tmp / "broker.conf"
    p.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return str(p)


def rich_store(root: Path, version: str = "4", n: int = 1200, seed: int = 7) -> CraftedStore:
    """Several segments with blank ends; many queues; tx prepared/commit/rollback; delay; unicode; huge
    keys; IPv6 hosts; V2 topics (5.x); records without properties; odd key spacing."""
    rng = np.random.default_rng(seed)
    cs = CraftedStore(S, version=version)
    v5 = version == "5"
    for i in range(n):
        kind = i % 10
        topic, qid = f"Topic{i % 7}", int(rng.integers(0, 5))
        kw: dict = {"uniq": f"U{i:08X}", "keys": f"K{i}", "body": bytes(rng.integers(0, 256, int(rng.integers(1, 600)),
                                                                                        dtype=np.uint8))}
        m = None
        if kind == 0:
            m = msg("RMQ_SYS_TRANS_HALF_TOPIC", 0, sys_flag=4, **kw)
        elif kind == 1:
            m = msg(topic, qid, sys_flag=8, **kw)
        elif kind == 2:
            m = msg(topic, qid, sys_flag=12, **kw)
        elif kind == 3:
            m = msg(topic, qid, delay=1 + i % 20, **kw)
        elif kind == 4:
            m = msg(topic, qid, tags="标签", uniq=f"U{i}", keys="键 ключ 🔑", body="данные".encode())
        elif kind == 5:
            m = msg(topic, qid, uniq=f"U{i}", keys=" ".join(f"K{i}_{j}" for j in range(300)))
        elif kind == 6:
            m = msg(topic, qid, born_host="[2001:db8::7]:4000", store_host="[fe80::1]:10911", **kw)
        elif kind == 7 and v5:
            m = msg("V2" + "x" * 198, qid, magic_version=2, **kw)
        elif kind == 8:
            m = msg(topic, qid, tags=None, body=b"np")
            m.properties = {}
        else:
            m = msg(topic, qid, uniq=f"U{i}", keys=f" a{i}  b{i} ")
        cs.append(m, prop_crc=v5)
    cs.write(root)
    return cs


def scan_table(store_root: Path, settings: BrokerSettings) -> pa.Table:
    return Store(store_root, settings).commitlog.read_table(verify_crc=False, delay_levels_ms=list(settings.delay_levels_ms))


def expected_cq(table: pa.Table) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    out: dict[tuple[str, int], list] = {}
    for r in table.select(["topic", "queue_id", "physical_offset_field", "size", "tags_code", "tran_type"]).to_pylist():
        if r["tran_type"] in (0, 2):
            out.setdefault((r["topic"], r["queue_id"]), []).append((r["physical_offset_field"], r["size"], r["tags_code"]))
    return out


def scalar_index(table: pa.Table, settings: BrokerSettings) -> list[bytes]:
    svc = ScalarIndexService(settings.index_geometry)
    for r in table.select(["topic", "uniq_key", "keys", "tran_type", "physical_offset_field",
                           "store_timestamp"]).to_pylist():
        svc.build_index(r["topic"], r["uniq_key"], r["keys"], r["tran_type"], r["physical_offset_field"],
                        r["store_timestamp"])
    return [f.to_bytes() for f in svc.files]


def cq_units(root: Path, topic: str, qid: int) -> list[tuple[int, int, int]]:
    d = root / "consumequeue" / topic / str(qid)
    raw = b"".join(p.read_bytes() for p in sorted(d.iterdir()))
    u = np.frombuffer(raw, CQ_DTYPE)
    u = u[(u["size"] > 0)]
    return [(int(a), int(b), int(c)) for a, b, c in zip(u["phy_offset"], u["size"], u["tags_code"])]


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------
# the samples: broker-written files


def _sample_args(sample: Path) -> tuple[Path, str]:
    version = "4.9.8" if "4.9.8" in str(sample) else "5.3.3"
    return sample / "store", str(broker_conf(version))


def test_sample_local_rebuild_is_byte_identical_to_the_broker_files(tmp_path, sample):
    store, conf = _sample_args(sample)
    m = run(store, tmp_path / "out", conf)
    out = tmp_path / "out"
    broker_cq = files_of(store, "consumequeue")
    assert files_of(out, "consumequeue") == broker_cq
    assert index_list(out) == index_list(store)
    expected = [r for r in load_expected(sample, "messages.jsonl") if r["type"] == "msg"]
    assert m["counts"]["records"] == len(expected)


@pytest.mark.spark
def test_sample_spark_engine_matches_local_and_broker(tmp_path, sample, with_spark):
    store, conf = _sample_args(sample)
    run(store, tmp_path / "local", conf)
    m = run(store, tmp_path / "spark", conf, engine="spark")
    assert m["engine"] == "spark"
    assert_same_output(tmp_path / "local", tmp_path / "spark")
    assert index_list(tmp_path / "spark") == index_list(store)
    assert files_of(tmp_path / "spark", "consumequeue") == files_of(store, "consumequeue")


# ---------------------------------------------------------------------------------------------
# generated stores


@pytest.mark.parametrize("version", ["4", "5"])
def test_generated_store_matches_cq_expectations_and_scalar_index_oracle(tmp_path, version):
    cs = rich_store(tmp_path / "store", version)
    assert len(cs.segments) >= 6
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=S, mappedFileSizeConsumeQueue=400, maxHashSlotNum=64,
                      maxIndexNum=500)
    settings = load_broker_conf(conf, version)
    m = run(tmp_path / "store", tmp_path / "out", conf, broker_version=version)
    table = scan_table(tmp_path / "store", settings)
    exp = expected_cq(table)
    assert any(t == "SCHEDULE_TOPIC_XXXX" for t, _ in exp) and ("RMQ_SYS_TRANS_HALF_TOPIC", 0) not in exp
    for (topic, qid), units in exp.items():
        assert cq_units(tmp_path / "out", topic, qid) == units
    assert m["counts"]["queues"] == len(exp)
    oracle = scalar_index(table, settings)
    assert len(oracle) >= 3
    assert index_list(tmp_path / "out") == oracle


@pytest.mark.spark
@pytest.mark.parametrize("version", ["4", "5"])
def test_generated_store_spark_engine_is_identical_to_local(tmp_path, version, with_spark):
    rich_store(tmp_path / "store", version, n=700)
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=S, mappedFileSizeConsumeQueue=400, maxHashSlotNum=64,
                      maxIndexNum=6000)
    a = run(tmp_path / "store", tmp_path / "local", conf, broker_version=version)
    b = run(tmp_path / "store", tmp_path / "spark", conf, broker_version=version, engine="spark", partitions=3)
    assert_same_output(tmp_path / "local", tmp_path / "spark")
    assert a["files"] == b["files"] and a["counts"] == b["counts"]


def _keys_store(root: Path, n_keyed: int, trailing: int, *, corrupt_phy: bool = False) -> CraftedStore:
    cs = CraftedStore(8192)
    for i in range(n_keyed):
        cs.append(msg("T", i % 2, keys=f"k{i}", tags=None))
    for _ in range(trailing):
        cs.append(msg("T", 0, keys=None, tags="x"))
    if corrupt_phy:  # PHYSICALOFFSET fields going backwards (not CRC-covered): the duplicate test fires
        for p in cs.placed[40:44]:
            cs.put_raw((p.phy - 3000).to_bytes(8, "big"), segment=p.segment, offset=p.file_offset + 28)
    cs.write(root)
    return cs


@pytest.mark.spark
@pytest.mark.parametrize("n_keyed,trailing,corrupt", [(99, 1, False), (99, 0, False), (0, 5, False), (150, 2, True)])
def test_index_rolling_edges_are_identical_in_both_engines(tmp_path, with_spark, n_keyed, trailing, corrupt):
    """Exactly full last file with/without a later record (empty successor), no keys at all (one empty
    file), and non-increasing PHYSICALOFFSET fields (the broker's duplicate test)."""
    _keys_store(tmp_path / "store", n_keyed, trailing, corrupt_phy=corrupt)
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=8192, maxHashSlotNum=16, maxIndexNum=34)  # 33 per file
    settings = load_broker_conf(conf, "4")
    run(tmp_path / "store", tmp_path / "local", conf, broker_version="4")
    run(tmp_path / "store", tmp_path / "spark", conf, broker_version="4", engine="spark")
    assert_same_output(tmp_path / "local", tmp_path / "spark")
    table = scan_table(tmp_path / "store", settings)
    assert index_list(tmp_path / "spark") == scalar_index(table, settings)
    n = len(index_list(tmp_path / "spark"))
    if n_keyed == 99:
        assert n == (4 if trailing else 3)
    if n_keyed == 0:
        assert n == 1


@pytest.mark.spark
def test_crc_failure_inside_the_window_ends_dispatch_in_both_engines(tmp_path, with_spark):
    cs = rich_store(tmp_path / "store", "5", n=400)
    victim = [p for p in cs.placed if p.segment == 1][3]
    cs.corrupt(victim.phy, cs.body_pos(victim) + 1)
    cs.write(tmp_path / "store")
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=S, enabledAppendPropCRC="true", maxHashSlotNum=64,
                      maxIndexNum=6000)
    a = run(tmp_path / "store", tmp_path / "local", conf, broker_version="5")
    run(tmp_path / "store", tmp_path / "spark", conf, broker_version="5", engine="spark")
    assert a["recovery"]["process_offset"] == victim.phy
    assert a["recovery"]["failure"]["reason"] == "crc_mismatch"
    assert a["counts"]["records"] == sum(1 for p in cs.placed if p.phy < victim.phy)
    assert_same_output(tmp_path / "local", tmp_path / "spark")


@pytest.mark.parametrize("engine", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_unsafe_topic_name_from_disk_is_one_finding_and_the_rest_is_rebuilt(tmp_path, engine, request):
    if engine == "spark":
        request.getfixturevalue("with_spark")
    cs = CraftedStore(8192)
    cs.append(msg("Fine", 0))
    cs.append(msg("../../etc", 0))
    cs.append(msg("Fine", 1))
    cs.write(tmp_path / "store")
    m = run(tmp_path / "store", tmp_path / "out", write_conf(tmp_path, mappedFileSizeCommitLog=8192), engine=engine)
    assert [s["topic_escaped"] for s in m["skipped_topics"]] == ["'../../etc'"]
    assert sum("unsafe_topic_name" in f for f in m["findings"]) == 1
    assert sorted(p.name for p in (tmp_path / "out" / "consumequeue").iterdir()) == ["Fine"]
    assert sorted(p.name for p in (tmp_path / "out" / "consumequeue" / "Fine").iterdir()) == ["0", "1"]
    assert not (tmp_path.parent / "etc").exists() and not (tmp_path / "etc").exists()
    assert [p for p in tmp_path.iterdir() if "staging" in p.name] == []


# ---------------------------------------------------------------------------------------------
# publishing, in place, incremental


def test_manifest_lists_every_file_with_its_sha256_and_a_rerun_replaces_the_output(tmp_path, sample_498):
    store, conf = _sample_args(sample_498)
    out = tmp_path / "out"
    m = run(store, out, conf)
    on_disk = {k: v for k, v in tree_digest(out).items() if k != MANIFEST_NAME}
    assert {k: v["sha256"] for k, v in m["files"].items()} == on_disk
    assert read_manifest(str(out))["source"]["digest"] == m["source"]["digest"]
    assert m["settings"]["max_index_num"] == 800 and m["recovery"]["process_offset"] == 1728172
    (out / "consumequeue" / "OrderEvents" / "0" / "00000000000000000000").write_bytes(b"junk")
    run(store, out, conf)
    assert {k: v for k, v in tree_digest(out).items() if k != MANIFEST_NAME} == on_disk
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging or old trees left


def test_refuses_a_foreign_nonempty_output_and_an_output_inside_the_store(tmp_path, sample_498):
    store, conf = _sample_args(sample_498)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "precious").write_text("x")
    with pytest.raises(StoreError, match="no rebuild manifest"):
        run(store, tmp_path / "foreign", conf)
    with pytest.raises(StoreError, match="inside the source store"):
        run(store, store / "rebuilt", conf)
    with pytest.raises(StoreError):
        rebuild(RebuildConfig(store=str(store), progress=False))  # neither --out nor --in-place


def test_publish_tree_to_another_filesystem_writes_the_manifest_last(tmp_path):
    staging = tmp_path / "staging"
    (staging / "a" / "b").mkdir(parents=True)
    (staging / "a" / "b" / "f").write_bytes(b"data")
    (tmp_path / "remote").mkdir()
    fs = pafs.SubTreeFileSystem(str(tmp_path / "remote"), pafs.LocalFileSystem())
    from storelib.fileio.bytesource import Location

    dest = Location(fs, "out", False)
    publish_tree(str(staging), dest, {"n": 1})
    assert (tmp_path / "remote" / "out" / "a" / "b" / "f").read_bytes() == b"data"
    assert read_manifest(dest) == {"n": 1}
    # a copy interrupted before the manifest is not complete; a re-publish completes it
    fs.delete_file("out/" + MANIFEST_NAME)
    assert read_manifest(dest) is None
    publish_tree(str(staging), dest, {"n": 2})
    assert read_manifest(dest) == {"n": 2}


def test_in_place_backs_up_what_it_replaces_and_never_touches_the_commitlog(tmp_path, sample_533):
    store = tmp_path / "store"
    shutil.copytree(sample_533 / "store", store)
    conf = str(broker_conf("5.3.3"))
    before_cl = tree_digest(store / "commitlog")
    before_cq = tree_digest(store / "consumequeue")
    before_idx = tree_digest(store / "index")
    # damage the queues: the rebuild must restore them
    shutil.rmtree(store / "consumequeue" / "OrderEvents")
    m = run(store, None, conf, in_place=True)
    assert tree_digest(store / "commitlog") == before_cl
    assert tree_digest(store / "consumequeue") == before_cq
    assert list(tree_digest(store / "index").values()) == list(before_idx.values())
    backup = Path(m["backup"])
    assert backup.parent == store and (backup / "index").is_dir()
    assert "OrderEvents" not in os.listdir(backup / "consumequeue")
    assert (store / MANIFEST_NAME).exists()
    assert not [p for p in store.iterdir() if "staging" in p.name]


def test_incremental_catches_up_like_reput_and_equals_a_full_rebuild(tmp_path):
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=S, mappedFileSizeConsumeQueue=400, maxHashSlotNum=64,
                      maxIndexNum=500)
    cs = rich_store(tmp_path / "store", "4", n=500)
    run(tmp_path / "store", None, conf, in_place=True, broker_version="4")
    old_cq = tree_digest(tmp_path / "store" / "consumequeue")
    rng = np.random.default_rng(3)
    for i in range(400):  # the broker kept writing; its queues fell behind
        cs.append(msg(f"Topic{i % 7}", int(rng.integers(0, 5)), uniq=f"X{i}", keys=f"more{i}"))
    cs.write(tmp_path / "store")
    m = run(tmp_path / "store", None, conf, in_place=True, incremental=True, broker_version="4")
    assert m["mode"] == "incremental" and 0 < m["counts"]["records"] <= 400 + 1
    changed = set(m["files"])
    assert changed and all(r.startswith(("consumequeue/", "index/")) for r in changed)
    assert any(k not in changed for k in old_cq)  # untouched files were not rewritten
    run(tmp_path / "store", tmp_path / "full", conf, broker_version="4")
    assert_same_output(tmp_path / "store", tmp_path / "full")


def test_cli_rebuild_prints_a_summary(tmp_path, sample_498, capsys):
    from jobs.cli import main

    store, conf = _sample_args(sample_498)
    rc = main(["rebuild", str(store), "--out", str(tmp_path / "o"), "--broker-conf", conf, "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "processOffset 1728172" in text and "2000 dispatched" in text
    rc = main(["rebuild", str(store), "--out", str(tmp_path / "o2"), "--what", "bogus", "--quiet"])
    assert rc == 2


# run as ``python -c`` with (text, cli args...): SIGKILL the process right after it reports a progress line
# holding ``text`` (a real step of the job, mid-way)
_KILL_AT_PROGRESS = """
import os, signal, sys
from jobs.common import Stage
orig = Stage.__call__
def report(self, text):
    orig(self, text)
    if sys.argv[1] in text:
        os.kill(os.getpid(), signal.SIGKILL)
Stage.__call__ = report
from jobs.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_killed_midway_leaves_the_source_untouched_nothing_published_and_a_rerun_succeeds(tmp_path):
    rich_store(tmp_path / "store", "4", n=1500)
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=S, maxHashSlotNum=64, maxIndexNum=6000)
    before = tree_digest(tmp_path / "store")
    out = tmp_path / "out"
    args = ["rebuild", str(tmp_path / "store"), "--out", str(out), "--broker-conf", conf]
    proc = subprocess.run([sys.executable, "-c", _KILL_AT_PROGRESS, "phase A: segments: 3/", *args], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    assert "phase A: segments: 3/" in proc.stderr
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if "staging" in p.name]  # it really died mid-way
    assert tree_digest(tmp_path / "store") == before
    run(tmp_path / "store", out, conf)
    assert (out / MANIFEST_NAME).exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]
    run(tmp_path / "store", tmp_path / "again", conf)
    assert_same_output(out, tmp_path / "again")


# ---------------------------------------------------------------------------------------------
# a real distributed run: Spark standalone master + two workers on 127.0.0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standalone_cluster(tmp_path):
    """Master + 2 workers started with spark-class; always stopped by PID (process group)."""
    import pyspark

    home = Path(pyspark.__file__).parent
    spark_class = home / "bin" / "spark-class"
    port = _free_port()
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               SPARK_LOG_DIR=str(tmp_path / "logs"), SPARK_WORKER_DIR=str(tmp_path / "work"),
               SPARK_NO_DAEMONIZE="1")
    procs: list[subprocess.Popen] = []
    logs = []

    def start(args: list[str], name: str) -> None:
        log = open(tmp_path / f"{name}.log", "w")
        logs.append(log)
        procs.append(subprocess.Popen([str(spark_class), *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, preexec_fn=_die_with_parent))

    try:
        start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(_free_port())], "master")
        url = f"spark://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.3)
        for i in range(2):
            start(["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "1", "--memory",
                   "1g", "--webui-port", str(_free_port())], f"worker{i}")
        deadline = time.time() + 60  # both workers registered?
        while time.time() < deadline:
            text = (tmp_path / "master.log").read_text()
            if text.count("Registering worker") >= 2:
                break
            time.sleep(0.3)
        else:
            pytest.fail("workers did not register:\n" + (tmp_path / "master.log").read_text()[-3000:])
        yield url, env
    finally:
        for p in procs:
            with _suppress():
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with _suppress():
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=15)
        for log in logs:
            log.close()


def _suppress():
    import contextlib

    return contextlib.suppress(ProcessLookupError, PermissionError)


@pytest.mark.slow
@pytest.mark.spark
def test_standalone_cluster_run_matches_local(tmp_path, standalone_cluster):
    url, env = standalone_cluster
    rich_store(tmp_path / "store", "5", n=900)
    conf = write_conf(tmp_path, mappedFileSizeCommitLog=S, mappedFileSizeConsumeQueue=400, maxHashSlotNum=64,
                      maxIndexNum=500, enabledAppendPropCRC="true")
    run(tmp_path / "store", tmp_path / "local", conf, broker_version="5")
    import pyspark

    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    cmd = [str(submit), "--master", url, "--properties-file", "spark-conf/spark-defaults.conf",
           "--conf", "spark.executor.memory=512m", "--conf", "spark.driver.memory=1g",
           "jobs/rebuild.py", str(tmp_path / "store"), "--out", str(tmp_path / "cluster"), "--broker-conf", conf,
           "--broker-version", "5", "--json"]
    r = subprocess.run(cmd, cwd=REPO, env=dict(env, PYSPARK_DRIVER_PYTHON=sys.executable), capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-4000:]
    m = json.loads(r.stdout[r.stdout.index("{"):])
    assert m["engine"] == "spark"
    assert_same_output(tmp_path / "local", tmp_path / "cluster")
    # the work really ran on the workers' executors
    apps = list((tmp_path / "work").glob("app-*/*"))
    assert len(apps) >= 2


def test_destination_of_an_interrupted_publish_is_replaced_but_a_foreign_directory_is_refused(tmp_path):
    from storelib.errors import StoreError
    from storelib.fileio.bytesource import resolve
    from storelib.fileio.publish import PUBLISHING_MARKER
    from storelib.fileio.staging import check_dest

    partial = tmp_path / "partial"
    (partial / "index").mkdir(parents=True)
    (partial / "index" / "20240101000000000").write_bytes(b"x")
    (partial / PUBLISHING_MARKER).write_bytes(b"")
    check_dest(resolve(str(partial)))  # no manifest, but marked as being published: a rerun completes it
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match="holds no rebuild manifest"):
        check_dest(resolve(str(foreign)))
