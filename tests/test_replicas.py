"""``rmqstore replicas`` on groups made the broker's way (tests/replica_storegen.py): a lagging slave, a
failover in classic HA, the same failover in controller mode, and the controller-mode stale tail of
apache/rocketmq#10666. Every expected number comes from a plain scan of the stores' commitlogs."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storelib.broker.replicas.facts import StoreSpec
from storelib.broker.replicas.group import GroupComparison, compare_group
from storelib.broker.replicas.ranges import first_difference
from storelib.broker.settings.store import load_settings
from storelib.fileio.bytesource import resolve
from storelib.format.configjson import consumer_offsets, load_config, write_config
from storelib.format.ha.epochfile import EpochEntry, write_epoch_file
from tests import replica_storegen as rg
from tests.test_remote import run_cli

N = 3000  # master messages
CUT = 2000  # the slave got records [0, CUT)


def spec(root: Path, name: str | None = None, uri: str | None = None, fs=None) -> StoreSpec:
    u = uri or str(root)
    return StoreSpec(name or root.name, u, load_settings(None, None, None, resolve(u, **(fs or {}))), fs or {})


def count_from(root: Path, lo: int, hi: int | None = None) -> int:
    p = rg.offsets(root)
    return int(((p >= lo) & (p < (hi if hi is not None else 2**62))).sum())


def per_queue(root: Path, lo: int, hi: int | None = None) -> dict[tuple[str, int], tuple[int, int, int]]:
    """{(topic, queue): (messages, first queue offset, last queue offset)} of a store's records in [lo, hi)."""
    t = rg.records(root)
    phy = np.asarray(t.column("phy_offset"))
    m = (phy >= lo) & (phy < (hi if hi is not None else 2**62))
    out: dict = {}
    for topic, q, qoff, tt in zip(*(t.column(c).filter(pa.array(m)).to_pylist()
                                    for c in ("topic", "queue_id", "queue_offset", "tran_type"))):
        n, lo_q, hi_q = out.get((topic, q), (0, None, None))
        if tt in (1, 3):
            out[(topic, q)] = (n + 1, lo_q, hi_q)
        else:
            out[(topic, q)] = (n + 1, qoff if lo_q is None else min(lo_q, qoff), qoff if hi_q is None else max(hi_q, qoff))
    return out


def queue_ends(root: Path) -> dict[tuple[str, int], int]:
    t = rg.records(root)
    out: dict = {}
    for topic, q, qoff, tt in zip(*(t.column(c).to_pylist() for c in ("topic", "queue_id", "queue_offset", "tran_type"))):
        if tt not in (1, 3):
            out[(topic, q)] = max(out.get((topic, q), 0), qoff + 1)
    return out


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for d, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            p = os.path.join(d, f)
            h.update(p.encode())
            with open(p, "rb") as fh:
                h.update(fh.read())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------
# groups


@pytest.fixture(scope="module")
def lagging(tmp_path_factory):
    """4.9.8: a master and two slaves: one stopped at record CUT, one that connected late (from the start of
    the master's 4th file) and stopped inside a record (an HA chunk ends anywhere); its config/ is older."""
    d = tmp_path_factory.mktemp("lagging")
    a = rg.master(d / "master", N, version="4")
    phys = rg.offsets(a)
    b = rg.copy_log(a, d / "slave1", int(phys[CUT]), version="4")
    late = 3 * rg.SEGMENT
    stop = int(phys[CUT - 300])
    c = rg.copy_log(a, d / "slave2", stop, start=late, partial=37, version="4")
    topics = load_config(c, "topics.json").data
    gone = sorted(topics["topicConfigTable"])[0]
    del topics["topicConfigTable"][gone]
    write_config(c / "config" / "topics.json", topics)
    offs = load_config(c, "consumerOffset.json").data
    key = next(k for k in sorted(offs["offsetTable"]) if not k.startswith("%"))
    offs["offsetTable"][key] = {q: max(0, v - 5) for q, v in offs["offsetTable"][key].items()}
    write_config(c / "config" / "consumerOffset.json", offs)
    groups = {"subscriptionGroupTable": {g: {"groupName": g, "consumeEnable": True} for g in ("group_a", "group_b")}}
    for root in (a, b, c):
        write_config(root / "config" / "subscriptionGroup.json", groups)
        write_config(root / "config" / "delayOffset.json", {"offsetTable": {1: 10, 2: 5}})
    groups["subscriptionGroupTable"]["group_new"] = {"groupName": "group_new", "consumeEnable": True}
    write_config(a / "config" / "subscriptionGroup.json", groups)  # created on the master after the last sync
    write_config(c / "config" / "delayOffset.json", {"offsetTable": {1: 8}})
    return {"a": a, "b": b, "c": c, "cut": int(phys[CUT]), "stop": stop, "late": late, "gone": gone, "key": key}


@pytest.fixture(scope="module")
def failover(tmp_path_factory):
    """Classic HA: the master ``old`` failed after its slave ``new`` got records [0, S); ``new`` became master
    and took 300 messages of its own, ``old`` had taken 100 more before it died; ``slave`` follows ``new`` and
    has all but its last 50. The same three again with a controller's epoch files: ``old`` 1-0, ``new`` and
    ``slave`` 1-0, 2-S."""
    out = {}
    for mode in ("classic", "controller"):
        d = tmp_path_factory.mktemp(mode)
        old = rg.master(d / "old", N)
        s = int(rg.offsets(old)[CUT])
        new = rg.copy_log(old, d / "new", s)
        rg.append(new, rg.own_messages("new", 300), host="10.0.0.6:10911")
        rg.append(old, rg.own_messages("old", 100), host="10.0.0.5:10911")
        slave_end = int(rg.offsets(new)[-50])
        slave = rg.copy_log(new, d / "slave", slave_end)
        if mode == "controller":
            write_epoch_file(str(old), [EpochEntry(1, 0)])
            for r in (new, slave):
                write_epoch_file(str(r), [EpochEntry(1, 0)])
                write_epoch_file(str(r), [EpochEntry(1, 0), EpochEntry(2, s)])
        out[mode] = {"old": old, "new": new, "slave": slave, "s": s, "slave_end": slave_end}
    return out


def run(*roots: Path, **kw) -> dict:
    return compare_group([spec(r) for r in roots], **kw)


def by_name(res: dict) -> dict:
    return {s["name"]: s for s in res["stores"]}


# ------------------------------------------------------------------------------------------------
# classic HA


def test_lagging_slaves_are_prefixes(lagging):
    a, b, c = lagging["a"], lagging["b"], lagging["c"]
    res = run(a, b, c)
    st = by_name(res)
    assert res["mode"] == "classic" and res["consistent"] and res["diverged_at"] is None
    assert {s["version"][0] for s in res["stores"]} == {"4"}
    assert st["master"]["only_here"] == count_from(a, lagging["cut"])  # what neither slave got
    assert st["master"]["held_only_here"]["first_offset"] == lagging["cut"]
    assert st["slave1"]["only_here"] == st["slave2"]["only_here"] == 0
    assert all(s["truncated_at"] is None for s in res["stores"])
    assert st["slave2"]["min_offset"] == lagging["late"] and st["slave2"]["end"] == lagging["stop"]
    assert st["slave1"]["end"] == lagging["cut"]
    rel = {(p["a"], p["b"]): p["relation"] for p in res["pairs"]}
    assert rel[("master", "slave1")] == "b_behind" and rel[("slave1", "slave2")] == "b_behind"


def test_what_only_the_master_holds_per_queue(lagging):
    a = lagging["a"]
    st = by_name(run(a, lagging["b"]))
    got = {(q["topic"], q["queue_id"]): (q["messages"], q["first_queue_offset"], q["last_queue_offset"])
           for q in st["master"]["held_only_here"]["queues"]}
    assert got == per_queue(a, lagging["cut"])
    t = rg.records(a, ("phy_offset", "size"))
    phy = np.asarray(t.column("phy_offset"))
    m = phy >= lagging["cut"]
    assert st["master"]["held_only_here"]["bytes"] == int(np.asarray(t.column("size"))[m].sum())
    assert st["master"]["held_only_here"]["last_offset"] == int(phy[m][-1])


def test_consumer_groups_past_a_slaves_end(lagging):
    a, b = lagging["a"], lagging["b"]
    res = run(a, b)
    got = {(c["group"], c["topic"], c["queue_id"], c["committed"], c["other_end"])
           for c in res["consumers"] if c["kind"] == "past_end" and c["store"] == "master"}
    ends_b = queue_ends(b)
    want = set()
    for (topic, group), qmap in consumer_offsets(load_config(a, "consumerOffset.json").data).items():
        for q, c in qmap.items():
            e = ends_b.get((topic, q), 0)
            if c > e:
                want.add((group, topic, q, c, e))
    assert want and got == want


def test_older_config_on_a_slave(lagging):
    res = run(lagging["a"], lagging["b"], lagging["c"])
    only = res["config"]["topics"]["only_on_some"]
    assert [(e["name"], e["missing_on"]) for e in only] == [(lagging["gone"], ["slave2"])]
    topic, group = lagging["key"].split("@", 1)
    diffs = [e for e in res["config"]["consumer_offsets"] if (e["topic"], e["group"]) == (topic, group)]
    assert diffs and all(e["behind"]["slave2"] == min(5, e["offsets"]["master"]) and e["behind"]["master"] == 0
                         for e in diffs)
    assert [(e["name"], e["on"]) for e in res["config"]["subscription_groups"]["only_on_some"]] == [("group_new", ["master"])]
    assert res["config"]["delay_offsets"] == [{"level": 1, "offsets": {"master": 10, "slave1": 10, "slave2": 8}},
                                             {"level": 2, "offsets": {"master": 5, "slave1": 5, "slave2": None}}]


def test_classic_failover(failover):
    f = failover["classic"]
    old, new, slave, s = f["old"], f["new"], f["slave"], f["s"]
    res = run(old, new, slave)
    st = by_name(res)
    assert not res["consistent"] and res["diverged_at"] == s
    assert st["old"]["only_here"] == count_from(old, s) == N - CUT + 100
    assert st["new"]["only_here"] == count_from(new, f["slave_end"]) == 50
    assert st["slave"]["only_here"] == 0
    assert all(x["truncated_at"] is None for x in res["stores"])  # classic HA has no truncation rule
    got = {(q["topic"], q["queue_id"]): (q["messages"], q["first_queue_offset"], q["last_queue_offset"])
           for q in st["old"]["held_only_here"]["queues"]}
    assert got == per_queue(old, s)
    assert [x["kind"] for x in res["findings"] if x["kind"] == "classic_no_truncation"] == ["classic_no_truncation"] * 2


def test_consumers_past_the_divergence(failover):
    """A group that consumed the old master's own messages of a queue would skip the new master's messages at
    those queue offsets after a switch."""
    f = failover["classic"]
    res = run(f["old"], f["new"])
    got = {(c["group"], c["topic"], c["queue_id"]): c["messages"]
           for c in res["consumers"] if c["kind"] == "past_divergence" and c["store"] == "old"}
    first_old = {q: v[1] for q, v in per_queue(f["old"], f["s"]).items()}
    ends_new = queue_ends(f["new"])
    first_new = {q: v[1] for q, v in per_queue(f["new"], f["s"]).items()}
    want = {}
    for (topic, group), qmap in consumer_offsets(load_config(f["old"], "consumerOffset.json").data).items():
        for q, c in qmap.items():
            key = (topic, q)
            if key not in first_new:
                continue
            resume = min(first_old.get(key, first_new[key]), first_new[key])
            e = ends_new[key]
            if c <= e and c > resume and min(c, e) - resume > 0:
                want[(group, topic, q)] = min(c, e) - resume
    assert got == want


# ------------------------------------------------------------------------------------------------
# controller mode


def test_controller_failover_cuts_the_old_master_at_the_new_epoch(failover):
    f = failover["controller"]
    old, new, slave, s = f["old"], f["new"], f["slave"], f["s"]
    res = run(old, new, slave)
    st = by_name(res)
    assert res["mode"] == "controller" and res["reference"] == "new"
    assert res["diverged_at"] == s
    assert st["old"]["truncated_at"] == s and st["old"]["rejoin"]["outcome"] == "cut"
    assert st["old"]["rejoin"]["drops"]["messages"] == count_from(old, s) == st["old"]["only_here"]
    assert st["new"]["truncated_at"] is None and st["new"]["rejoin"] is None
    assert st["slave"]["truncated_at"] is None and st["slave"]["rejoin"]["outcome"] == "nothing_to_cut"
    assert st["new"]["epochs"] == [[1, 0], [2, s]] and st["new"]["epoch_file"] == "file"
    assert not [x for x in res["findings"] if x["severity"] in ("error", "critical")]


def test_stale_tail_the_epochs_do_not_cut(failover, tmp_path):
    """#10666: the old master (its own records past S end before the new master's do) was cut at S in memory,
    took epoch 2-S from the first heartbeat and restarted before anything overwrote its old records: they are
    valid again, and its epochs now claim them as epoch 2, so no rejoin cuts them."""
    f = failover["controller"]
    old_phys = rg.offsets(f["old"])
    x = int(old_phys[old_phys < rg.log_end(f["new"])][-1])
    old = rg.copy_log(f["old"], tmp_path / "old", x)
    write_epoch_file(str(old), [EpochEntry(1, 0), EpochEntry(2, f["s"])])
    res = run(old, f["new"])
    st = by_name(res)
    assert st["old"]["end"] == x and res["diverged_at"] == f["s"]
    assert st["old"]["truncated_at"] is None and st["old"]["rejoin"]["outcome"] == "nothing_to_cut"
    stale = [e for e in res["findings"] if e["kind"] == "stale_tail"]
    assert len(stale) == 1 and stale[0]["offset"] == f["s"] and stale[0]["severity"] == "critical"
    assert st["old"]["only_here"] == count_from(old, f["s"])


def test_stale_records_left_past_the_end(failover, tmp_path):
    """The old master after a cut at S (later segments deleted, consume queues cut) and part of the new
    master's bytes written over its old ones: a restart ends at the last new record, and the old records after
    it are still on disk, valid."""
    import shutil

    f = failover["controller"]
    old = tmp_path / "old"
    shutil.copytree(f["old"], old)
    old_phys = rg.offsets(f["old"])
    new_phys = rg.offsets(f["new"])
    base = f["s"] - f["s"] % rg.SEGMENT
    last_old = int(old_phys[old_phys < base + rg.SEGMENT][-1])  # the old records left after the new ones end
    k = next(i for i in range(int(np.searchsorted(new_phys, f["s"])) + 3, len(new_phys))
             if new_phys[i] not in set(old_phys.tolist()) and new_phys[i] < last_old)
    end = int(new_phys[k])
    with open(f["new"] / "commitlog" / f"{base:020d}", "rb") as src, open(old / "commitlog" / f"{base:020d}", "r+b") as dst:
        src.seek(f["s"] - base)
        dst.seek(f["s"] - base)
        dst.write(src.read(end - f["s"]))
    for name in os.listdir(old / "commitlog"):
        if int(name) > base:
            os.remove(old / "commitlog" / name)
    for d in ("consumequeue", "index"):
        shutil.rmtree(old / d)
    os.remove(old / "checkpoint")
    with rg.StoreWriter(str(old), rg.settings()) as w:
        w.dispatch()
    res = run(old, f["new"])
    st = by_name(res)
    assert st["old"]["end"] == end
    resume = int(old_phys[old_phys > end][0])
    tail = st["old"]["stale_tail"]
    assert tail["resumes_at"] == resume and tail["phy_match"]
    assert tail["records"] == int(((old_phys >= resume) & (old_phys < base + rg.SEGMENT)).sum())
    assert any(e["kind"] == "stale_records_past_end" for e in res["findings"])


# ------------------------------------------------------------------------------------------------
# the comparison's own rules


def test_shared_ranges_are_never_scanned(failover):
    f = failover["classic"]
    specs = [spec(f["old"]), spec(f["new"])]
    from storelib.broker.replicas.facts import store_facts
    from storelib.broker.replicas.ranges import block_crcs

    g = GroupComparison([store_facts(x) for x in specs], specs)
    g.take_blocks([block_crcs(t) for t in g.block_tasks()])
    tasks = g.hold_tasks()
    assert tasks and all(t.base + t.start >= f["s"] for t in tasks)
    g.close()


def test_first_difference_survives_a_crc_collision(monkeypatch):
    import storelib.broker.replicas.ranges as rmod

    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    for pos in (0, 4095, 4096, 700_001, (1 << 20) - 1):
        b = bytearray(a)
        b[pos] ^= 0x40
        b = bytes(b)
        assert first_difference(lambda o, n: a[o - 100:o - 100 + n], lambda o, n, b=b: b[o - 100:o - 100 + n],
                                100, 100 + len(a)) == 100 + pos
        monkeypatch.setattr(rmod, "crc32", lambda _x: 7)  # every half "equal": the bisection goes wrong
        assert first_difference(lambda o, n: a[o:o + n], lambda o, n, b=b: b[o:o + n], 0, len(a)) == pos
        monkeypatch.undo()
    assert first_difference(lambda o, n: a[:n], lambda o, n: a[:n], 0, 4096) is None


# ------------------------------------------------------------------------------------------------
# the command: --json, exit codes, report, salvage, remote stores, engines


def test_cli_json_and_exit_codes(lagging, failover, tmp_path):
    rc, out, _ = run_cli(["replicas", lagging["a"], lagging["b"], "--json", "--engine", "local"])
    doc = json.loads(out)
    assert rc == 0 and doc["diverged_at"] is None and [s["name"] for s in doc["stores"]] == ["master", "slave1"]
    assert set(doc["stores"][0]) >= {"only_here", "truncated_at"}
    f = failover["controller"]
    rc, out, _ = run_cli(["replicas", f["new"], f["old"], "--json", "--engine", "local"])
    doc = json.loads(out)
    assert rc == 1 and doc["diverged_at"] == f["s"]
    assert [(s["name"], s["truncated_at"]) for s in doc["stores"]] == [("new", None), ("old", f["s"])]
    rc, _, err = run_cli(["replicas", lagging["a"], tmp_path / "nope"])
    assert rc == 2 and "Traceback" not in err
    rc, _, err = run_cli(["replicas", lagging["a"]])
    assert rc == 2


def test_html_report_and_salvage_leave_inputs_untouched(failover, tmp_path):
    f = failover["controller"]
    before = [tree_digest(f[k]) for k in ("old", "new")]
    html = tmp_path / "report.html"
    rc, out, _ = run_cli(["replicas", f["old"], f["new"], "--html", html, "--salvage", tmp_path / "saved",
                          "--engine", "local"])
    assert rc == 1
    assert [tree_digest(f[k]) for k in ("old", "new")] == before
    page = html.read_text()
    for section in ('id="summary"', 'id="map"', 'id="pairs"', 'id="holdings"', 'id="consumers"', 'id="config"',
                    'id="findings"'):
        assert section in page
    assert json.loads((tmp_path / "report.json").read_text())["diverged_at"] == f["s"]
    saved = tmp_path / "saved" / "old" / "only_here"
    want = rg.records(f["old"], ("phy_offset", "topic", "body", "store_timestamp"))
    want = want.filter(pa.compute.greater_equal(want.column("phy_offset"), f["s"]))
    got = rg.records(saved / "store", ("phy_offset", "topic", "body", "store_timestamp", "queue_offset"))
    assert got.column("body").to_pylist() == want.column("body").to_pylist()
    assert got.column("store_timestamp").to_pylist() == want.column("store_timestamp").to_pylist()
    lines = (saved / "messages.jsonl").read_text().splitlines()
    assert [json.loads(x)["phy_offset"] for x in lines] == want.column("phy_offset").to_pylist()
    import pyarrow.parquet as pq

    assert pq.read_table(saved / "messages.parquet").column("phy_offset").to_pylist() == want.column("phy_offset").to_pylist()
    assert (tmp_path / "saved" / "old" / "dropped" / "messages.jsonl").read_text().splitlines() == lines
    rc, _, _ = run_cli(["audit", saved / "store"])
    assert rc == 0


def test_remote_stores_give_the_same_answer(failover, s3_server):
    f = failover["controller"]
    bucket = s3_server.new_bucket("replicas")
    uris = [s3_server.upload(f[k], f"{bucket}/group/{k}") for k in ("old", "new")]
    local = compare_group([spec(f["old"]), spec(f["new"])])
    remote = compare_group([spec(f[k], k, u) for k, u in zip(("old", "new"), uris)])
    for doc in (local, remote):
        for s in doc["stores"]:
            s.pop("uri")
    assert remote == local


def test_every_engine_gives_the_same_answer(failover, spark):
    from jobs.engines.schedulers import PoolEngine, SparkEngine
    from jobs.replicas import Group, run_groups

    f = failover["controller"]
    group = Group("g", [spec(f[k]) for k in ("old", "new", "slave")])
    want = compare_group(group.specs)
    pool = PoolEngine(2)
    try:
        got_pool = run_groups([group], pool)[0]
    finally:
        pool.close()
    got_spark = run_groups([group], SparkEngine(spark))[0]
    for got in (got_pool, got_spark):
        got.pop("group")
        assert got == want


def test_the_job_over_many_groups(lagging, failover, tmp_path):
    from jobs.replicas import main

    groups = tmp_path / "groups.txt"
    groups.write_text(f"# two groups\nlag {lagging['a']} {lagging['b']}\n"
                      f"fail {failover['classic']['old']} {failover['classic']['new']}  # a failover\n")
    assert main(["--groups", str(groups), "--out", str(tmp_path / "out"), "--engine", "local"]) == 1
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["groups"]
    assert [(g["group"], g["consistent"], g["diverged_at"]) for g in summary] == [
        ("lag", True, None), ("fail", False, failover["classic"]["s"])]
    assert (tmp_path / "out" / "fail.html").exists() and (tmp_path / "out" / "lag.json").exists()
    groups.write_text(f"lag {lagging['a']} {lagging['b']}\nbroken {lagging['a']} {tmp_path / 'missing'}\n")
    assert main(["--groups", str(groups), "--out", str(tmp_path / "out2"), "--engine", "local"]) == 2
    summary = json.loads((tmp_path / "out2" / "summary.json").read_text())["groups"]
    assert summary[0]["consistent"] and "error" in summary[1]
    dump = tmp_path / "dump"
    for group, stores in (("broker-a", (lagging["a"], lagging["b"])), ("broker-b", (failover["classic"]["old"],
                                                                                   failover["classic"]["new"]))):
        (dump / group).mkdir(parents=True)
        for k, st in enumerate(stores):
            os.symlink(st, dump / group / f"node{k}")
    assert main(["--dump-root", str(dump), "--out", str(tmp_path / "out3"), "--engine", "local"]) == 1
    summary = json.loads((tmp_path / "out3" / "summary.json").read_text())["groups"]
    assert [(g["group"], [s["name"] for s in g["stores"]], g["consistent"]) for g in summary] == [
        ("broker-a", ["node0", "node1"], True), ("broker-b", ["node0", "node1"], False)]
