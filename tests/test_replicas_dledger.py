"""``rmqstore replicas`` on the three-node DLedger group written by RocketMQ 4.9.8 over DLedger 0.3.1.2
(rocketmq-4.9.8-dledger-group-small): every number checked against what DLedger itself did when the old
leader rejoined (expected/rejoin.json, the manifest's divergence and after-rejoin facts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from storelib.broker.replicas.facts import StoreSpec
from storelib.broker.replicas.group import compare_group
from storelib.broker.settings.store import load_settings
from storelib.fileio.bytesource import resolve
from tests.test_remote import run_cli

NODES = ("n0", "n1", "n2")


@pytest.fixture(scope="module")
def group(sample_dledger_group):
    root = sample_dledger_group
    return {"root": root, "rejoin": json.loads((root / "expected" / "rejoin.json").read_text()),
            "manifest": json.loads((root / "manifest.json").read_text())}


def specs(root: Path, nodes=NODES, dirs=None):
    out = []
    for n in nodes:
        u = str((dirs or {}).get(n, root / f"store-{n}"))
        out.append(StoreSpec(n, u, load_settings(None, None, None, resolve(u))))
    return out


def test_group_answers_as_dledger_did(group):
    res = compare_group(specs(group["root"]))
    div = group["manifest"]["divergence"]
    only = group["rejoin"]["entriesOnlyOnOneNodeBeforeRejoin"]
    assert res["mode"] == "dledger" and res["reference"] == group["rejoin"]["newLeader"]
    assert res["diverged_at"] == div["firstDroppedMessagePhyOffset"]
    st = {s["name"]: s for s in res["stores"]}
    assert [s["name"] for s in res["stores"]] == list(NODES)
    assert {n: st[n]["only_here"] for n in NODES} == {n: only[n]["count"] for n in NODES}
    assert st["n2"]["truncated_at"] == div["firstDroppedMessagePhyOffset"]
    assert st["n0"]["truncated_at"] is None and st["n1"]["truncated_at"] is None
    walk = st["n2"]["rejoin"]["dledger"]
    assert walk["index"] == div["truncateIndexOnRejoin"] and walk["outcome"] == "truncate"
    assert walk["first_dropped_index"] == div["indexRangeOnlyOnOldLeader"][0]
    assert st["n2"]["rejoin"]["drops"]["messages"] == div["droppedEntries"]
    assert st["n0"]["rejoin"]["dledger"]["outcome"] == "append"


def test_each_ledger_as_load_left_it(group):
    res = compare_group(specs(group["root"]))
    for s in res["stores"]:
        want = group["rejoin"]["nodesBeforeRejoin"][s["name"]]["fromSavedStoreLoad"]
        got = s["ledger"]
        assert (got["begin_index"], got["end_index"], got["end_term"], got["committed_index"], got["write_pos"]) == (
            want["ledgerBeginIndex"], want["ledgerEndIndex"], want["ledgerEndTerm"], want["committedIndex"],
            want["writePos"])
        assert got["term"] == group["rejoin"]["nodesBeforeRejoin"][s["name"]]["currTerm"]


def test_what_only_the_old_leader_holds_per_queue(group):
    res = compare_group(specs(group["root"]))
    n2 = next(s for s in res["stores"] if s["name"] == "n2")["held_only_here"]
    entries = group["rejoin"]["entriesOnlyOnOneNodeBeforeRejoin"]["n2"]["entries"]
    want: dict = {}
    for e in entries:
        k = (e["topic"], e["queueId"])
        n, lo, hi = want.get(k, (0, e["queueOffset"], e["queueOffset"]))
        want[k] = (n + 1, min(lo, e["queueOffset"]), max(hi, e["queueOffset"]))
    got = {(q["topic"], q["queue_id"]): (q["messages"], q["first_queue_offset"], q["last_queue_offset"])
           for q in n2["queues"]}
    assert got == want
    assert (n2["first_offset"], n2["last_offset"]) == (entries[0]["phyOffset"], entries[-1]["phyOffset"])
    assert n2["bytes"] == sum(e["entrySize"] - 48 for e in entries)


def _rejoined(group, dest: Path) -> Path:
    """The old leader as DLedger's rejoin leaves it (DLedgerMmapFileStore.truncate after entry 1042, then the
    leader's entries 1043..1192 appended): write positions moved back, nothing zeroed, the new bytes written
    over the old ones, the stale rest kept; checkpoint and currterm as the manifest gives them after the rejoin."""
    div, after = group["manifest"]["divergence"], group["manifest"]["dledgerPerNodeAfterRejoin"]["n2"]
    shutil.copytree(group["root"] / "store-n2", dest)
    name = "00000000000000000000"
    cut, end = div["dataTruncatedAtPos"], after["writePos"]
    src_data = (group["root"] / "store-n1" / "dledger-n1" / "data" / name).read_bytes()
    src_index = (group["root"] / "store-n1" / "dledger-n1" / "index" / name).read_bytes()
    with open(dest / "dledger-n2" / "data" / name, "r+b") as f:
        f.seek(cut)
        f.write(src_data[cut:end])
    lo, hi = (div["truncateIndexOnRejoin"] + 1) * 32, (after["ledgerEndIndex"] + 1) * 32
    with open(dest / "dledger-n2" / "index" / name, "r+b") as f:
        f.seek(lo)
        f.write(src_index[lo:hi])
    (dest / "dledger-n2" / "checkpoint").write_text(after["checkpointFileText"])
    (dest / "dledger-n2" / "currterm").write_text(after["currtermFileText"])
    return dest


def test_stale_entries_after_the_rejoin_are_flagged(group, tmp_path):
    n2 = _rejoined(group, tmp_path / "store-n2")
    res = compare_group(specs(group["root"], dirs={"n2": n2}))
    st = {s["name"]: s for s in res["stores"]}
    after = group["manifest"]["dledgerPerNodeAfterRejoin"]["n2"]
    assert res["consistent"] and res["diverged_at"] is None
    assert st["n2"]["ledger"]["end_index"] == after["ledgerEndIndex"] and st["n2"]["end"] == after["writePos"]
    assert all(s["only_here"] == 0 and s["truncated_at"] is None for s in res["stores"])
    tail = st["n2"]["stale_tail"]
    old_end = group["manifest"]["divergence"]["oldLeaderDataEndBeforeTruncate"]
    assert tail["from"] == after["writePos"] and tail["until"] == old_end
    assert tail["last_index"] == group["manifest"]["divergence"]["indexRangeOnlyOnOldLeader"][1]
    assert tail["index_units_past_end"] == 1250 - 1192  # units 1193..1250 of the dropped entries
    assert [f["kind"] for f in res["findings"] if f["file"] and f["file"].startswith("n2/")] == ["stale_entries_past_end"]


def test_cli_and_salvage_on_the_group(group, tmp_path):
    roots = [group["root"] / f"store-{n}" for n in NODES]
    rc, out, _ = run_cli(["replicas", *roots, "--json", "--salvage", tmp_path / "saved", "--engine", "local"])
    doc = json.loads(out)
    assert rc == 1 and [s["name"] for s in doc["stores"]] == [f"store-{n}" for n in NODES]
    assert [s["truncated_at"] for s in doc["stores"]] == [None, None, 1376654]
    saved = tmp_path / "saved" / "store-n2" / "only_here"
    lines = [json.loads(x) for x in (saved / "messages.jsonl").read_text().splitlines()]
    entries = group["rejoin"]["entriesOnlyOnOneNodeBeforeRejoin"]["n2"]["entries"]
    assert [x["uniq_key"] for x in lines] == [e["uniqKey"] for e in entries]
    rc, _, _ = run_cli(["audit", saved / "store"])
    assert rc == 0


def test_same_answer_on_every_engine_and_from_s3(group, spark, s3_server, tmp_path):
    from jobs.engines.schedulers import PoolEngine, SparkEngine
    from jobs.replicas import Group, run_groups

    want = compare_group(specs(group["root"]))
    g = Group("g", specs(group["root"]))
    pool = PoolEngine(2)
    try:
        got = [run_groups([g], pool)[0], run_groups([g], SparkEngine(spark))[0]]
    finally:
        pool.close()
    for r in got:
        r.pop("group")
        assert r == want
    # on S3: copies whose 160 MiB index files are cut to the 64 KiB the 1,251 units need (a quick upload)
    local = {}
    for n in NODES:
        d = tmp_path / f"store-{n}"
        shutil.copytree(group["root"] / f"store-{n}", d, ignore=shutil.ignore_patterns("00000000000000000000"))
        shutil.copyfile(group["root"] / f"store-{n}" / f"dledger-{n}" / "data" / "00000000000000000000",
                        d / f"dledger-{n}" / "data" / "00000000000000000000")
        with open(group["root"] / f"store-{n}" / f"dledger-{n}" / "index" / "00000000000000000000", "rb") as f:
            (d / f"dledger-{n}" / "index" / "00000000000000000000").write_bytes(f.read(64 << 10))
        local[n] = d
    bucket = s3_server.new_bucket("dledger-group")
    uris = {n: s3_server.upload(local[n], f"{bucket}/g/store-{n}") for n in NODES}
    near = compare_group(specs(group["root"], dirs=local))
    remote = compare_group([StoreSpec(n, u, load_settings(None, None, None, resolve(u))) for n, u in uris.items()])
    for doc in (remote, near):
        for s in doc["stores"]:
            s.pop("uri")
    assert remote == near
    assert remote["diverged_at"] == want["diverged_at"]
    assert [s["truncated_at"] for s in remote["stores"]] == [s["truncated_at"] for s in want["stores"]]


def test_one_root_holding_every_node(group, tmp_path):
    """A group copied into one root (dledger-n0/, dledger-n1/, dledger-n2/): the root once per node, --node each."""
    root = tmp_path / "together"
    root.mkdir()
    for n in NODES:
        (root / f"dledger-{n}").symlink_to(group["root"] / f"store-{n}" / f"dledger-{n}")
    argv = ["replicas", root, root, root, *(x for n in NODES for x in ("--node", n)), "--json", "--engine", "local"]
    rc, out, _ = run_cli(argv)
    doc = json.loads(out)
    assert rc == 1 and [s["name"] for s in doc["stores"]] == ["together:n0", "together:n1", "together:n2"]
    assert doc["diverged_at"] == 1376654 and [s["only_here"] for s in doc["stores"]] == [0, 0, 208]
    rc, _, err = run_cli(["replicas", root, root, "--engine", "local"])
    assert rc == 2 and "Traceback" not in err


def test_a_follower_behind_is_a_prefix(group, tmp_path):
    """A follower that stopped at entry 1100 (n1's files up to that entry, zeros after, its checkpoint): consistent,
    nothing cut (the walk finds the follower's last entry equal: DLedger appends)."""
    import struct

    stop = 1100
    dest = tmp_path / "store-n0"
    shutil.copytree(group["root"] / "store-n1", dest)
    (dest / "dledger-n1").rename(dest / "dledger-n0")
    name = "00000000000000000000"
    raw = (dest / "dledger-n0" / "index" / name).read_bytes()
    cut = struct.unpack_from(">q", raw, (stop + 1) * 32 + 4)[0]  # the unit of entry 1101: magic i32, pos i64
    with open(dest / "dledger-n0" / "data" / name, "r+b") as f:
        f.seek(cut)
        f.write(bytes(4 * 1024 * 1024 - cut))
    with open(dest / "dledger-n0" / "index" / name, "r+b") as f:
        f.seek((stop + 1) * 32)
        f.write(bytes(len(raw) - (stop + 1) * 32))
    (dest / "dledger-n0" / "checkpoint").write_text(f"committedIndex={stop}\nendIndex={stop}\n")
    res = compare_group(specs(group["root"], ("n1", "n0"), dirs={"n0": dest}))
    st = {s["name"]: s for s in res["stores"]}
    assert res["consistent"] and res["diverged_at"] is None and res["reference"] == "n1"
    assert st["n0"]["ledger"]["end_index"] == stop and st["n0"]["end"] == cut
    assert st["n0"]["truncated_at"] is None and st["n0"]["rejoin"]["dledger"]["outcome"] == "append"
    assert st["n1"]["only_here"] == 1192 - stop and st["n1"]["held_only_here"]["first_offset"] == cut + 48
    assert st["n0"]["only_here"] == 0 and st["n0"]["stale_tail"] is None
