"""``recover`` on DLedger-mode stores: the plan replays DLedgerMmapFileStore's load and recover and
DLedgerCommitLog's recovery (4.9.8 and 5.3.3) and is checked against the broker's own numbers on the
crashed sample (expected/recovery.json, export_summary.json) and the clean one; apply, restore and
salvage work as for the default store; damaged generated stores take DLedger's exact paths (start file,
term order across files, index rewrite and rebuild, System.exit, #9084)."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from storelib.broker.settings.store import Store
from storelib.broker.startup.recoverapply import apply, restore
from storelib.broker.startup.recoveryplan import plan_document
from storelib.broker.startup.salvage import salvage
from storelib.broker.startup.startup import simulate
from storelib.format.consumequeue import CQ_DTYPE
from storelib.format.dledger.entries import BODY_OFFSET, INDEX_UNIT_SIZE, decode_index_units

from .conftest import run_cli
from .dledger_files import (
    IDX,
    SEG,
    data_file_at,
    dledger_entries,
    gen_dledger,
    index_unit_at,
    open_store,
    patch_bytes,
)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _plan(root: Path, version: str | None = None, **kw) -> dict:
    return plan_document(simulate(open_store(root), version, **kw))


# ---------------------------------------------------------------------------------------------
# the samples against the broker's own numbers


def test_the_crashed_sample_plan_is_the_brokers_load_field_by_field(sample_dledger_crashed, capsys):
    root = sample_dledger_crashed / "store"
    before = _tree(root)
    rec = json.loads((sample_dledger_crashed / "expected" / "recovery.json").read_text())
    summ = json.loads((sample_dledger_crashed / "expected" / "export_summary.json").read_text())
    rc, out, err = run_cli(capsys, "recover", root, "--json")
    assert rc == 1, err
    plan = json.loads(out)
    assert _tree(root) == before  # --plan writes nothing
    al, dl = rec["afterLoad"], plan["dledger"]
    exp = al["dledger"]
    assert (dl["ledger_begin_index"], dl["ledger_end_index"], dl["ledger_end_term"]) == \
        (exp["ledgerBeginIndex"], exp["ledgerEndIndex"], exp["ledgerEndTerm"])
    assert (dl["committed_index"], dl["committed_pos"]) == (exp["committedIndex"], exp["committedPos"])
    assert dl["data_end"] == exp["writePos"] == exp["dataMaxWrotePosition"] == al["dataFiles"][0]["wrotePosition"]
    assert dl["index_end"] == exp["indexMaxWrotePosition"] == al["indexFiles"][0]["wrotePosition"]
    assert plan["commitlog"]["process_offset"] == al["storeMaxPhyOffset"] == summ["afterLoad_maxPhyOffset"] == 1243691
    assert dl["min_offset"] == al["storeMinPhyOffset"] == summ["afterLoad_minPhyOffset"]
    assert dl["ledger_end_index"] - dl["ledger_begin_index"] + 1 == summ["dledgerEntries"]
    assert dl["index_delete"] == [] and dl["index_rewrite_from"] is None and dl["data_delete"] == []
    assert dl["load_failure"] is None and plan["commitlog"]["delete_segments"] == []
    # IndexService.load deletes the only index file; no consume queue is cut (their max < the data's end)
    assert ["store/index/" + n for n in plan["index"]["deleted"]] == al["indexFilesDeletedByLoad"]
    assert not plan["consume_queues"]["truncate_at_process_offset"]
    for q in plan["consume_queues"]["queues"]:
        e = al["queues"][q["topic"]][str(q["queue_id"])]
        assert (q["final_min_offset"], q["final_max_offset"], q["final_max_phy_offset"]) == \
            (e["minOffset"], e["maxOffset"], e["maxPhysicOffset"]), q
        e2 = summ["afterLoad_queues"][q["topic"]][str(q["queue_id"])]
        assert q["final_max_offset"] == e2["maxOffset"]
    # 4.9.8 start(): the reput waits at the consume queues' end, past the committed position
    assert plan["dispatch"]["reput"]["from"] == 2096059 and plan["dispatch"]["reput_records"] == 0
    assert dl["uncommitted"]["from_index"] == exp["committedIndex"] + 1
    assert dl["uncommitted"]["to_phy_offset"] == exp["writePos"]
    # once DLedger commits again the reput dispatches the two entries afterStart shows in two queues
    ar = dl["after_recommit"]
    assert (ar["from"], ar["to"]) == (2096059, rec["afterStart"]["dledger"]["committedPos"])
    t = open_store(root).commitlog.read_table(from_offset=ar["from"], to_offset=ar["to"], with_properties=False)
    got = {f"{tp}/{q}": p + s for tp, q, p, s in zip(t.column("topic").to_pylist(), t.column("queue_id").to_pylist(),
                                                     t.column("phy_offset").to_pylist(), t.column("size").to_pylist())}
    assert got == {k: v["afterStart"]["maxPhysicOffset"] for k, v in rec["afterStart"]["queuesChangedByStart"].items()}
    assert plan["lost"]["totals"]["messages"] == 0  # DLedger keeps every entry
    assert "uncommitted: entries 1006..1718" in run_cli(capsys, "recover", root)[1]


def test_the_clean_sample_plan_changes_nothing_and_ends_at_the_brokers_offset(sample_dledger, capsys):
    root = sample_dledger / "store"
    summ = json.loads((sample_dledger / "expected" / "export_summary.json").read_text())
    before = _tree(root)
    rc, out, err = run_cli(capsys, "recover", root, "--json")
    plan = json.loads(out)
    assert rc == 0 and not plan["changes"], err
    assert _tree(root) == before  # --plan writes nothing
    dl = plan["dledger"]
    assert plan["commitlog"]["process_offset"] == summ["afterLoad_maxPhyOffset"] == dl["data_end"] == 4960165
    assert (dl["ledger_begin_index"], dl["ledger_end_index"]) == (summ["dledger"]["ledgerBeginIndex"],
                                                                 summ["dledger"]["ledgerEndIndex"])
    assert dl["committed_pos"] == summ["dledger"]["committedPos"] and dl["uncommitted"] is None
    assert dl["index_end"] == summ["dledger"]["indexMaxWrotePosition"]
    assert [f["dledger_end_kind"] for f in dl["files"]] == ["blank", "end_of_data"]
    assert plan["index"]["deleted"] == [] and plan["consume_queues"]["totals"]["entries_truncated"] == 0


def test_apply_on_the_crashed_sample_re_indexes_what_the_broker_loses_and_restore_undoes_it(
        tmp_path, sample_dledger_crashed, capsys):
    root = tmp_path / "store"
    shutil.copytree(sample_dledger_crashed / "store", root)
    before = _tree(root)
    rc, out, err = run_cli(capsys, "recover", root, "--apply", "--backup", tmp_path / "bk", "--json")
    assert rc == 0, err
    after = _tree(root)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    new_index = [k for k in after if k.startswith("index/")]
    assert changed == {"abort", "checkpoint", "index/20261126194122348", *new_index}
    # the broker loses every key of the deleted file (#7477); the apply re-adds them from the entries it kept
    store = open_store(root)
    from storelib.broker.index.lookup import key_candidates

    t = store.commitlog.read_table(with_properties=False, to_offset=2096059)
    rows = [(tp, k.split(" ")[0], p) for tp, k, p in zip(t.column("topic").to_pylist(), t.column("keys").to_pylist(),
                                                        t.column("phy_offset").to_pylist()) if k][::97]
    assert rows and all(p in key_candidates(store, tp, k) for tp, k, p in rows)
    rc, out, err = run_cli(capsys, "recover", root)
    assert rc == 0, out  # nothing left to do
    run_cli(capsys, "recover", "--restore", tmp_path / "bk")
    assert _tree(root) == before


def test_broker_exact_index_deletes_the_index_file_and_writes_none(tmp_path, sample_dledger_crashed):
    sim = simulate(open_store(sample_dledger_crashed / "store"), complete_index=False)
    assert sim.index_delete == ["20261126194122348"] and sim.index_images == [] and sim.index_keys_added == 0


def test_salvage_exports_the_uncommitted_entries_of_the_crashed_sample(tmp_path, sample_dledger_crashed):
    rep = salvage(simulate(open_store(sample_dledger_crashed / "store")), tmp_path / "out")
    assert rep["by_why"] == {"uncommitted": 1718 - 1005} and rep["messages"] == 713
    rows = [json.loads(x) for x in (tmp_path / "out" / "messages.jsonl").read_text().splitlines()]
    exp = {m["dledgerIndex"]: m for m in
           (json.loads(x) for x in (sample_dledger_crashed / "expected" / "messages.jsonl").read_text().splitlines())}
    assert sorted(r["dledger_index"] for r in rows) == list(range(1006, 1719))
    assert all(r["phy_offset"] == exp[r["dledger_index"]]["dledgerPos"] + BODY_OFFSET for r in rows)


# ---------------------------------------------------------------------------------------------
# generated stores: DLedger's paths


def test_a_torn_last_entry_is_kept_by_dledger_and_its_index_unit_rewritten(tmp_path):
    root = gen_dledger(tmp_path, committed_lag=20, undispatched=3, torn_at=60)
    ents = dledger_entries(root)
    torn = ents[-1][0] + 1  # the scan stops at the torn entry; DLedger's header walk keeps it
    plan = _plan(root, "4")
    dl = plan["dledger"]
    assert dl["ledger_end_index"] == torn and dl["index_rewrite_from"] == torn
    assert "magic 0 != entry magic 1" in dl["index_rewrite_why"]
    assert dl["committed_index"] == torn - 20 and plan["commitlog"]["process_offset"] == dl["committed_pos"]
    assert [x[2] for x in dl["reput_skips"]] == ["reput_skips_rest_of_file"]
    res = apply(open_store(root), tmp_path / "bk")
    assert res.file_changes >= 3
    path, at = index_unit_at(root, torn)
    with open(path, "rb") as f:
        f.seek(at)
        u = decode_index_units(f.read(32))[0]
    p, off = data_file_at(root, ents[-1][1] + ents[-1][2])
    head = p.read_bytes()[off: off + 48]
    assert (int(u["magic"]), int(u["index"]), int(u["pos"]), int(u["size"])) == \
        (1, torn, ents[-1][1] + ents[-1][2], struct.unpack_from(">i", head, 4)[0])
    assert _plan(root, "4")["dledger"]["index_rewrite_from"] is None
    restore(tmp_path / "bk")
    with open(path, "rb") as f:
        f.seek(at)
        assert f.read(32) == bytes(32)


def test_a_term_that_goes_down_in_a_later_file_ends_dledgers_data_and_salvage_keeps_the_entries(tmp_path):
    root = gen_dledger(tmp_path, n=900)
    ents = dledger_entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    assert len(files) >= 4
    # the first entry of the second-last file claims term -5: the walk, from the third-last, stops there
    cut = files[-2]
    path, _ = data_file_at(root, cut)
    patch_bytes(path, 16, struct.pack(">q", -5))
    plan = _plan(root, "4")
    dl = plan["dledger"]
    last_before = max(i for i, p, _ in ents if p < cut)
    assert dl["data_end"] == cut and dl["ledger_end_index"] == last_before
    assert "term -5 is lower" in dl["stop"] or "does not follow" in dl["stop"]
    assert list(dl["data_delete"]) == [f"{b:020d}" for b in files[-1:]]
    assert plan["commitlog"]["truncate"]["segment"] == f"{cut:020d}"
    assert plan["consume_queues"]["totals"]["entries_truncated"] > 0  # the queues' max reaches past the data's end
    # the index list ends at the ledger's end; nothing after the cut is dispatched any more
    assert dl["index_end"] == (last_before + 1) * INDEX_UNIT_SIZE
    dropped = [i for i, p, _ in ents if p >= cut]
    assert plan["lost"]["totals"]["messages"] == len(dropped)
    rep = salvage(simulate(open_store(root), "4"), tmp_path / "salv")
    assert rep["by_why"] == {"dledger_truncated": len(dropped)}


def test_the_start_file_is_the_third_last_unless_its_first_entry_disagrees_with_the_index(tmp_path):
    root = gen_dledger(tmp_path, n=900)
    ents = dledger_entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    n = len(files)
    assert _plan(root, "4")["dledger"]["start_file"].endswith(f"{files[n - 3]:020d}")
    # the third-last file's first unit says another size: recover() tries the file before it
    first = next(i for i, p, _ in ents if p == files[n - 3])
    path, at = index_unit_at(root, first)
    patch_bytes(path, at + 12, struct.pack(">i", 7))
    dl = _plan(root, "4")["dledger"]
    assert dl["start_file"].endswith(f"{files[n - 4]:020d}") and "index unit size 7" in dl["start_reason"]
    # that unit is walked and found wrong, so the index is rewritten from there; data is untouched
    assert dl["index_rewrite_from"] == first and dl["data_end"] == ents[-1][1] + ents[-1][2]


def test_a_missing_last_index_file_is_made_again_from_the_entries(tmp_path):
    root = gen_dledger(tmp_path, n=900)
    idx = sorted((root / "dledger-n0" / "index").iterdir())
    assert len(idx) >= 2
    last = idx[-1]
    last.unlink()
    ents = dledger_entries(root)
    first_missing = int(last.name) // INDEX_UNIT_SIZE
    dl = _plan(root, "4")["dledger"]
    # the walk's comparison fails at the first unit no file holds: the list ends exactly there, so recover()
    # appends the units from the entries into a new file (rebuildWithPos is not needed)
    assert dl["index_rewrite_from"] == first_missing and "no index file holds" in dl["index_rewrite_why"]
    assert list(dl["index_delete"]) == [] and list(dl["index_create"]) == [last.name]
    assert dl["committed_index"] == ents[-1][0]  # the committed entry is the last: no unit read needed
    res = apply(open_store(root), tmp_path / "bk")
    assert res.file_changes and last.stat().st_size == IDX
    units = decode_index_units(last.read_bytes())
    k = len(ents) - first_missing
    assert units["index"][:k].tolist() == list(range(first_missing, len(ents)))
    assert units["pos"][:k].tolist() == [p for _, p, _ in ents[first_missing:]]
    assert _plan(root, "4")["dledger"]["index_rewrite_from"] is None
    restore(tmp_path / "bk")
    assert not last.exists()


def test_index_list_changes_follow_mmapfilelist(tmp_path):
    from storelib.broker.recovery.dledgerfacts import IndexFiles
    from storelib.broker.recovery.dledgerwalk import index_changes
    from storelib.fileio.bytesource import resolve
    from storelib.scan.commitlog import Segment

    F = 1024

    def files(*bases):
        return IndexFiles(tuple(Segment(b, f"{b:020d}", resolve(str(tmp_path / f"{b:020d}")), F) for b in bases), F)

    # a mismatch past the list's end with a gap: rebuildWithPos drops every file and makes the offset's one
    assert index_changes(files(0), 2 * F // 32 + 3, 2 * F // 32 + 10, 0, True) == ([0], [2 * F])
    # a mismatch in the first file: truncateOffset deletes the later files, the appended units make F anew
    assert index_changes(files(0, F, 2 * F), 5, 40, 0, True) == ([F, 2 * F], [F])
    # a mismatch in the last file: the units are rewritten in place
    assert index_changes(files(0, F, 2 * F), 2 * F // 32 + 1, 2 * F // 32 + 4, 0, True) == ([], [])
    # the ledger's begin past whole files (after expiry): resetOffset drops them
    assert index_changes(files(0, F, 2 * F), None, 2 * F // 32 + 1, F // 32, True) == ([0], [])
    # no data at all: everything after offset 0 goes
    assert index_changes(files(0, F), None, -1, -1, False) == ([F], [])


def test_dledger_stops_the_jvm_when_its_data_ends_more_than_a_file_below_the_last(tmp_path):
    root = gen_dledger(tmp_path, n=900)
    ents = dledger_entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    # every file's first unit wrong from the third-last down to file 1: the walk starts at file 0 ...
    for b in files[1: len(files) - 2]:
        path, at = index_unit_at(root, next(i for i, p, _ in ents if p == b))
        patch_bytes(path, at, struct.pack(">i", 9))
    # ... and the second entry of file 0 has a bad pos field: its data would end in file 0
    patch_bytes(data_file_at(root, ents[1][1])[0], ents[1][1] + 24, struct.pack(">q", 12345))
    plan = _plan(root, "4")
    dl = plan["dledger"]
    assert dl["data_end"] == ents[1][1] and "System.exit(-1)" in dl["load_failure"]
    assert not plan["commitlog"]["supported"]
    with pytest.raises(Exception, match="cannot be reproduced"):
        apply(open_store(root), tmp_path / "bk")


def test_5x_abnormal_recovery_redispatches_and_cuts_the_queues_at_9084s_short_offset(tmp_path):
    for n in range(900, 1300, 23):  # a store whose last file holds enough entries for the short offset to bite
        root = gen_dledger(tmp_path, f"s{n}", n=n, version="5", committed_lag=10, crashed=True)
        ents = dledger_entries(root)
        last_file = ents[-1][1] - ents[-1][1] % SEG
        in_last = [e for e in ents if e[1] >= last_file]
        true_end = ents[-1][1] + ents[-1][2]
        buggy = true_end - BODY_OFFSET * len(in_last)
        if sum(1 for _, p, _ in ents if p + BODY_OFFSET >= buggy) > 1:
            break
    plan = _plan(root, "5")
    a = plan["dledger"]["abnormal_533"]
    assert a["process_offset_without_bug"] == true_end and a["process_offset"] == buggy
    assert plan["dispatch"]["recovery_records"] == a["records"] > 0
    # every queue unit whose record starts at or after the short offset is cut (#7355 / PR #7599)
    cut = sum(1 for _, p, _ in ents if p + BODY_OFFSET >= buggy)
    assert plan["consume_queues"]["truncate_at_process_offset"]
    assert plan["consume_queues"]["totals"]["entries_truncated"] == cut > 0
    assert plan["dledger"]["cq_truncate_offset"] == buggy
    # 5.3.3's reput starts at the committed position, not at the queues
    assert plan["dispatch"]["reput"]["from"] == plan["commitlog"]["process_offset"] == plan["dledger"]["committed_pos"]
    # the same store after a clean shutdown: DLedger's recovery only, no queue cut (their end = the data's end)
    (root / "abort").unlink()
    plan = _plan(root, "5")
    assert plan["dledger"]["abnormal_533"] is None and plan["dispatch"]["recovery_records"] == 0
    assert plan["consume_queues"]["totals"]["entries_truncated"] == 0


def test_498_abnormal_recovery_of_the_same_store_dispatches_nothing_and_keeps_the_queues(tmp_path):
    root = gen_dledger(tmp_path, n=900, version="4", committed_lag=10, undispatched=4, crashed=True)
    plan = _plan(root, "4")
    dl = plan["dledger"]
    assert dl["abnormal_533"] is None and plan["dispatch"]["recovery_records"] == 0
    ents = dledger_entries(root)
    cq_end = ents[-5][1] + ents[-5][2]
    # reput from the consume queues' end, which is past the committed position: nothing until a re-commit
    assert plan["dispatch"]["reput"]["from"] == cq_end > plan["commitlog"]["process_offset"]
    assert dl["after_recommit"]["from"] == cq_end and dl["after_recommit"]["to"] == ents[-1][1] + ents[-1][2]
    assert plan["consume_queues"]["totals"]["entries_truncated"] == 0


def test_a_bad_record_inside_a_good_entry_is_kept_by_dledger_and_skipped_by_the_reput(tmp_path):
    root = gen_dledger(tmp_path, n=900)
    ents = dledger_entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    victim = [e for e in ents if files[1] <= e[1] < files[2]][1]
    nxt = ents[ents.index(victim) + 1]
    path, off = data_file_at(root, victim[1])
    patch_bytes(path, off + BODY_OFFSET + 4, b"\0\0\0\0")  # the record's magic: the header still passes
    plan = _plan(root, "4")
    dl = plan["dledger"]
    assert dl["data_end"] == ents[-1][1] + ents[-1][2] and dl["stop"] is None  # DLedger keeps everything
    assert [(b, o) for b, o, _ in dl["reput_skips"]] == [(files[1], victim[1] - files[1])]
    # the lifetime walk (rebuild) dispatches file 1 up to the bad record, then every later file
    from storelib.broker.recovery.walk import rebuild_target

    res = rebuild_target(open_store(root))
    got = [(d.base, d.start, d.end) for d in res.dispatch]
    assert (files[1], 0, victim[1] - files[1]) in got and any(d[0] == files[2] for d in got)
    lost = [m for m in plan["lost"]["messages"] if m["why"] == "reput_skips_rest_of_file"]
    assert lost and lost[0]["phy_offset"] == nxt[1] + BODY_OFFSET


def test_a_missing_or_unparseable_checkpoint_decides_the_committed_position(tmp_path):
    root = gen_dledger(tmp_path, n=300, committed_lag=5)
    (root / "dledger-n0" / "checkpoint").unlink()
    dl = _plan(root, "4")["dledger"]
    assert dl["committed_index"] == -1 and dl["committed_pos"] == -1
    assert dl["max_offset"] == 0  # getMaxOffset: no committed position, the data's min offset is 0
    (root / "dledger-n0" / "checkpoint").write_text("committedIndex=x1\nendIndex=3\n")
    plan = _plan(root, "4")
    assert "Long.valueOf" in plan["dledger"]["load_failure"] and not plan["commitlog"]["supported"]


def test_533_reputs_from_the_committed_position_unless_recheck_reput_offset_from_cq(tmp_path):
    root = gen_dledger(tmp_path, n=600, version="5", undispatched=6)
    (root / "abort").unlink()  # a clean shutdown before the reput caught up
    ents = dledger_entries(root)
    cq_end = ents[-7][1] + ents[-7][2]
    plan = _plan(root, "5")
    # 5.3.3 start(): reputFromOffset = getConfirmOffset() = the committed position (the data's end here)
    assert plan["dispatch"]["reput"]["from"] == plan["commitlog"]["process_offset"] == ents[-1][1] + ents[-1][2]
    assert plan["dispatch"]["reput_records"] == 0 and plan["consume_queues"]["totals"]["entries_added"] == 0
    # recheckReputOffsetFromCq=true: from the consume queues' end, as 4.9.8 does: the six entries are dispatched
    from storelib.broker.settings.store import load_settings
    from storelib.fileio.bytesource import resolve

    loc = resolve(str(root))
    st = load_settings(None, None, {"recheckReputOffsetFromCq": "true"}, loc)
    plan = plan_document(simulate(Store(loc, st), "5"))
    assert plan["dispatch"]["reput"]["from"] == cq_end and plan["dispatch"]["reput_records"] == 6
    assert plan["consume_queues"]["totals"]["entries_added"] == 6


def test_498_reput_from_past_a_bad_record_scans_on_and_from_inside_an_entry_skips_the_file(tmp_path):
    root = gen_dledger(tmp_path, n=900, version="4", undispatched=5)
    (root / "abort").unlink()  # a clean stop before the reput caught up: no index file is deleted
    ents = dledger_entries(root)
    last_file = ents[-1][1] - ents[-1][1] % SEG
    in_last = [e for e in ents if e[1] >= last_file]
    assert len(in_last) > 7
    r = ents[-6][1] + ents[-6][2]  # the consume queues end here: five entries to dispatch
    # a record damaged before that point (its entry header intact): the scan of the file stops there, the
    # reput, starting after it, reads on
    victim = in_last[1]
    path, off = data_file_at(root, victim[1])
    patch_bytes(path, off + BODY_OFFSET + 4, b"\0\0\0\0")
    plan = _plan(root, "4")
    assert plan["dispatch"]["reput"]["from"] == r and plan["dispatch"]["reput_records"] == 5
    assert [(d["from"], d["to"]) for d in plan["dispatch"]["reput"]["ranges"]] == [(r, ents[-1][1] + ents[-1][2])]
    # a queue whose last unit ends one byte later: the reput starts inside an entry, reads nothing there and
    # skips the rest of the file (the broker's [BUG] path)
    q = max((p for p in (root / "consumequeue").rglob("0000*")),
            key=lambda p: max(np.frombuffer(p.read_bytes(), CQ_DTYPE)["phy_offset"]))
    units = np.frombuffer(q.read_bytes(), CQ_DTYPE).copy()
    k = int(np.argmax(units["phy_offset"]))
    units["size"][k] += 1
    q.write_bytes(units.tobytes())
    plan = _plan(root, "4")
    assert plan["dispatch"]["reput"]["from"] == r + 1 and plan["dispatch"]["reput_records"] == 0
    assert any(f["kind"] == "reput_inside_entry" for f in plan["findings"])


@pytest.mark.parametrize("node", ["n0", "n1", "n2"])
def test_each_node_of_the_group_sample_plans_its_own_load(sample_dledger_group, node, capsys):
    """The three-node group (rocketmq-4.9.8-dledger-group-small): each node's plan against the Java view after
    load() on a copy (export_summary-<node>.json); n2, the killed old leader, keeps its 208 entries past the
    others' log but commits only 997 from its stale checkpoint."""
    root = sample_dledger_group / f"store-{node}"
    exp = json.loads((sample_dledger_group / "expected" / f"export_summary-{node}.json").read_text())
    rc, out, err = run_cli(capsys, "recover", root, "--json")
    plan = json.loads(out)
    d, e = plan["dledger"], exp["dledger"]
    assert plan["commitlog"]["process_offset"] == exp["afterLoad_maxPhyOffset"]
    assert d["min_offset"] == exp["afterLoad_minPhyOffset"]
    assert (d["ledger_begin_index"], d["ledger_end_index"], d["committed_index"], d["committed_pos"]) == \
        (e["ledgerBeginIndex"], e["ledgerEndIndex"], e["committedIndex"], e["committedPos"])
    assert (d["data_end"], d["index_end"]) == (e["writePos"], e["indexMaxWrotePosition"])
    assert rc == (1 if exp["abortFileBeforeLoad"] else 0), err


def test_533_abnormal_recovery_starts_at_the_newest_file_older_than_the_checkpoint(tmp_path):
    """5.3.3's dledgerRecoverAbnormally picks its start file by isMmapFileMatchedRecover (the newest data file
    whose first record is a V1 message stored at or before the checkpoint's min timestamp) and re-dispatches
    from there; with forceVerifyPropCRC its walk stops at the first record (DLedger records carry no
    __CRC32#): processOffset is that file's start, while DLedger's own header walk (the data's end) is
    unchanged."""
    root = gen_dledger(tmp_path, n=900, version="5", committed_lag=10, crashed=True)
    t = open_store(root).commitlog.read_table(with_properties=False)
    pos, ts = t.column("dledger_pos").to_pylist(), t.column("store_timestamp").to_pylist()
    files = sorted({p - p % SEG for p in pos})
    first_time = [next(tm for p, tm in zip(pos, ts) if p == b) for b in files]
    k = len(files) - 3
    limit = first_time[k]
    want = max(j for j, tm in enumerate(first_time) if tm <= limit)
    cp = root / "checkpoint"
    page = bytearray(cp.read_bytes())
    for at in (0, 8, 16):
        struct.pack_into(">q", page, at, limit + 3000)  # min(physic, logics) - 3 s = the file's first record time
    cp.write_bytes(bytes(page))
    plan = _plan(root, "5")
    a, dl = plan["dledger"]["abnormal_533"], plan["dledger"]
    assert a["start_file"].endswith(f"{files[want]:020d}") and "newest data file" in a["start_reason"]
    assert a["records"] == sum(1 for p in pos if p >= files[want]) == plan["dispatch"]["recovery_records"]
    from storelib.broker.settings.store import load_settings
    from storelib.fileio.bytesource import resolve

    loc = resolve(str(root))
    forced = plan_document(simulate(Store(loc, load_settings(None, None, {"forceVerifyPropCRC": "true"}, loc)), "5"))
    f = forced["dledger"]
    assert (f["abnormal_533"]["records"], f["abnormal_533"]["process_offset"]) == (0, files[want])
    assert f["data_end"] == dl["data_end"] and f["ledger_end_index"] == dl["ledger_end_index"]
    assert forced["dispatch"]["recovery_records"] == 0
    assert forced["consume_queues"]["totals"]["entries_truncated"] == sum(1 for p in pos if p >= files[want])


def test_533_abnormal_recovery_past_a_damaged_header_is_named_and_not_applied(tmp_path):
    """5.3.3's own walk reads records, not entry headers: past a header DLedger rejects whose record is intact it
    reads on, which rmqstore does not replay: the plan says so, and apply refuses."""
    root = gen_dledger(tmp_path, n=900, version="5", committed_lag=10, crashed=True)
    ents = dledger_entries(root)
    files = sorted({p - p % SEG for _, p, _ in ents})
    victim = [e for e in ents if files[-2] <= e[1] < files[-1]][3]
    path, off = data_file_at(root, victim[1])
    patch_bytes(path, off + 24, struct.pack(">q", victim[1] + 7))  # its pos field: DLedger's data ends here
    plan = _plan(root, "5")
    assert plan["dledger"]["data_end"] == victim[1] and plan["dledger"]["abnormal_533"]["supported"] is False
    named = [f for f in plan["findings"] if f["kind"] == "dledger_533_reads_past_entry"]
    assert len(named) == 1 and named[0]["file"] == f"dledger-n0/data/{files[-2]:020d}" and named[0]["offset"] == off
    assert not plan["commitlog"]["supported"]
    with pytest.raises(Exception, match="cannot be reproduced"):
        apply(open_store(root), tmp_path / "bk")
