"""rmqstore recover: plan (= the broker's recovery, computed independently here), apply, restore, kill -9
resumption, salvage. Crafted stores: CraftedStore commitlogs + CQ/index written by storelib.broker.dispatch.dispatch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jobs.audit import audit_store
from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.settings.brokerconf import load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.startup import recoverapply as ra
from storelib.broker.startup import recoveryplan as recover_plan
from storelib.broker.startup import salvage as sv
from storelib.broker.startup.startup import simulate
from storelib.errors import StoreError
from storelib.fileio.backup import Backup
from storelib.format.checkpoint import Checkpoint, write_checkpoint
from storelib.format.consumequeue import CQ_DTYPE
from storelib.format.indexfile import IndexHeader
from tests.conftest import REPO
from tests.rebuild_storegen import CraftedStore, msg

S = 8192  # commitlog segment
CQS = 20 * 40  # 40 units per CQ segment
CONF = {"mappedFileSizeCommitLog": S, "mappedFileSizeConsumeQueue": CQS, "maxHashSlotNum": 16, "maxIndexNum": 64}
QUEUES = 3


def _conf_file(tmp_path, version: str) -> str:
    p = tmp_path / f"broker{version}.conf"
    p.write_text("".join(f"{k}={v}\n" for k, v in CONF.items()))
    return str(p)


def _settings(tmp_path, version="4"):
    return load_broker_conf(_conf_file(tmp_path, version), version)


def _crafted(segments: int = 4, n: int | None = None) -> CraftedStore:
    cs = CraftedStore(S)
    i = 0
    while (n is None and cs.seg_index < segments) or (n is not None and i < n):
        cs.append(msg("T", i % QUEUES, body=bytes([65 + i % 26]) * (200 + i % 7), keys=f"k{i} x{i % 5}",
                      uniq=f"U{i:06d}"))
        i += 1
    return cs


def _write(tmp_path, cs: CraftedStore, *, version="4", dispatch_to=None, dispatch=True, abort=False, cp=None,
           preallocate=0) -> Store:
    root = tmp_path / "store"
    cs.write(root, preallocate=preallocate)
    settings = _settings(tmp_path, version)
    if dispatch:
        dispatch_store(str(root), settings, to_offset=dispatch_to)
    last = cs.placed[-1].msg.store_timestamp
    write_checkpoint(str(root), cp or Checkpoint(last, last, 0))
    (root / "lock").write_bytes(b"lock")
    if abort:
        (root / "abort").write_bytes(b"")
    return Store(str(root), settings)


def _tree(root) -> dict[str, bytes]:
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def _queue_max(store: Store, topic: str, qid: int) -> int:
    queues = recover_plan.plan_document(simulate(store), lost=False)["consume_queues"]["queues"]
    return next((q["final_max_offset"] for q in queues
                 if q["topic"] == topic and q["queue_id"] == qid), 0)


def _cq_units(root, topic, qid) -> np.ndarray:
    d = os.path.join(root, "consumequeue", topic, str(qid))
    parts = [np.fromfile(os.path.join(d, n), dtype=CQ_DTYPE) for n in sorted(os.listdir(d))]
    u = np.concatenate(parts)
    k = np.flatnonzero(u["size"] <= 0)
    return u[: k[0]] if len(k) else u


def _audit_clean(tmp_path, store: Store, version="4") -> None:
    rep = audit_store(store.loc.path, broker_conf=_conf_file(tmp_path, version), version=version, quiet=True)
    bad = [f for f in rep["findings"] if f["severity"] in ("warning", "error", "critical")]
    assert bad == []


def _apply(store: Store, bdir) -> ra.ApplyResult:
    return ra.apply(store, str(bdir))


def _reopen(store: Store) -> Store:
    return Store(store.loc.path, store.settings)


# ---------------------------------------------------------------------------------------------
# plans equal the broker's rules


def test_torn_last_record_plan_truncates_there_and_apply_zeroes_the_tail_then_audit_is_clean(tmp_path):
    cs = _crafted(3)
    last = cs.placed[-1]
    seg = cs.segments[last.segment]
    seg[last.file_offset + 40: last.file_offset + last.size] = bytes(last.size - 40)  # torn: only 40 bytes landed
    store = _write(tmp_path, cs)
    plan = recover_plan.plan_document(simulate(store))
    c = plan["commitlog"]
    assert c["process_offset"] == last.phy
    assert c["failure"]["phy_offset"] == last.phy
    assert c["truncate"] == {"segment": f"{last.segment * S:020d}", "wrote_position": last.file_offset,
                             "bytes_after": S - last.file_offset, "zero_tail": True}
    assert plan["lost"]["totals"]["messages"] == 0 and plan["lost"]["ranges"][0]["phy_start"] == last.phy
    assert plan["consume_queues"]["totals"]["entries_truncated"] == 0
    orig = _tree(store.loc.path)
    _apply(store, tmp_path / "bk")
    after = _reopen(store)
    with open(os.path.join(after.loc.path, "commitlog", f"{last.segment * S:020d}"), "rb") as f:
        data = f.read()
    assert not any(data[last.file_offset:])
    assert recover_plan.plan_document(simulate(after))["changes"] is False
    _audit_clean(tmp_path, after)
    ra.restore(tmp_path / "bk")
    assert _tree(store.loc.path) == orig


def test_abort_with_stale_checkpoint_and_cq_ahead_of_a_zeroed_tail(tmp_path):
    cs = _crafted(4)
    firsts = {p.segment: p for p in reversed(cs.placed)}  # first record of each segment
    cut = [p for p in cs.placed if p.segment == 3][5]
    root = tmp_path / "store"
    ts2 = firsts[2].msg.store_timestamp
    cp = Checkpoint(ts2 + 3000, ts2 + 4000, 0)  # stale: trusts only up to segment 2's first record
    store = _write(tmp_path, cs, abort=True, cp=cp)  # CQ + index hold every record
    # the page with the tail never reached the disk
    b = bytearray(open(root / "commitlog" / f"{3 * S:020d}", "rb").read())
    b[cut.file_offset:] = bytes(S - cut.file_offset)
    (root / "commitlog" / f"{3 * S:020d}").write_bytes(bytes(b))
    sim = simulate(_reopen(store))
    plan = recover_plan.plan_document(sim)
    # independent: abnormal start = last segment whose first record's store time <= min(physic, logics) - 3 s
    limit = min(cp.physic_msg_timestamp, cp.logics_msg_timestamp) - 3000
    exp_start = max(i for i, p in firsts.items() if p.msg.store_timestamp <= limit)
    assert plan["last_exit"]["recovery"] == "abnormal" and plan["commitlog"]["start_base"] == exp_start * S
    assert plan["commitlog"]["process_offset"] == cut.phy
    assert plan["consume_queues"]["truncate_at_process_offset"]
    for q in plan["consume_queues"]["queues"]:
        kept = sum(1 for p in cs.placed if p.msg.queue_id == q["queue_id"] and p.phy < cut.phy)
        total = sum(1 for p in cs.placed if p.msg.queue_id == q["queue_id"])
        assert q["recovered_max_offset"] == total and q["final_max_offset"] == kept
        assert q["entries_truncated"] == total - kept
    # every index file ends after checkpoint.indexMsgTimestamp = 0: all deleted, rebuilt from the start segment
    assert plan["index"]["deleted"] == sorted(os.listdir(root / "index"))
    exp_keys = sum(2 + 1 for p in cs.placed if exp_start * S <= p.phy < cut.phy)  # uniq + 2 tokens
    assert plan["index"]["entries_added"] == exp_keys
    lost_phys = [m["phy_offset"] for m in plan["lost"]["messages"]]
    assert lost_phys == [p.phy for p in cs.placed if p.segment > 3]  # the zeroed ones are gone for good
    assert plan["lost"]["ranges"] == []  # zeros are not counted as unreadable data
    _apply(store, tmp_path / "bk")
    after = _reopen(store)
    assert not os.path.exists(root / "abort")
    for qid in range(QUEUES):
        u = _cq_units(root, "T", qid)
        exp = [p.phy for p in cs.placed if p.msg.queue_id == qid and p.phy < cut.phy]
        assert u["phy_offset"].tolist() == exp
    assert recover_plan.plan_document(simulate(after))["changes"] is False
    _audit_clean(tmp_path, after)


def test_cq_behind_commitlog_reput_adds_the_missing_entries_like_a_full_dispatch(tmp_path):
    cs = _crafted(3)
    mid = cs.placed[len(cs.placed) // 2]
    store = _write(tmp_path, cs, dispatch_to=mid.phy)
    plan = recover_plan.plan_document(simulate(store))
    assert plan["dispatch"]["reput"]["from"] == mid.phy  # max CQ physical end = end of the record before
    assert plan["dispatch"]["reput_records"] == sum(1 for p in cs.placed if p.phy >= mid.phy)
    for q in plan["consume_queues"]["queues"]:
        n_before = sum(1 for p in cs.placed if p.msg.queue_id == q["queue_id"] and p.phy < mid.phy)
        n_all = sum(1 for p in cs.placed if p.msg.queue_id == q["queue_id"])
        assert (q["recovered_max_offset"], q["final_max_offset"]) == (n_before, n_all)
        assert q["entries_added"] == n_all - n_before and q["added_from"] == n_before
    _apply(store, tmp_path / "bk")
    # reference: one dispatch of the whole log into an empty directory
    ref = tmp_path / "ref"
    dispatch_store(store.loc.path, store.settings, out_root=str(ref))
    got = _tree(store.loc.path)
    want = _tree(ref)
    for rel, data in want.items():
        assert got[rel] == data, rel
    _audit_clean(tmp_path, _reopen(store))


def test_crc_error_inside_the_498_window_truncates_and_outside_it_is_kept(tmp_path):
    cs = _crafted(5)
    inside = [p for p in cs.placed if p.segment == 4][1]
    outside = [p for p in cs.placed if p.segment == 0][3]
    cs.corrupt(inside.phy, cs.body_pos(inside))
    cs.corrupt(outside.phy, cs.body_pos(outside))
    store = _write(tmp_path, cs, dispatch=False)
    plan = recover_plan.plan_document(simulate(store))
    c = plan["commitlog"]
    n = cs.seg_index + 1
    assert c["crc_window"]["from"] == (n - 3) * S  # third-last segment
    assert c["process_offset"] == inside.phy and c["failure"]["reason"] == "crc_mismatch"
    # empty CQ: reput from the first segment; the record outside the window is dispatched (no CRC in reput)
    assert plan["dispatch"]["reput"]["from"] == 0
    assert plan["dispatch"]["reput_records"] == sum(1 for p in cs.placed if p.phy < inside.phy)
    lost = plan["lost"]
    assert [m["phy_offset"] for m in lost["messages"]] == [p.phy for p in cs.placed if p.phy >= inside.phy]
    assert lost["totals"]["corrupt"] == 1 and lost["messages"][0]["intact"] is False
    # 5.x with an empty CQ checks CRCs from the first segment: the older error ends the log
    p5 = recover_plan.plan_document(simulate(store, "5"))
    assert p5["commitlog"]["process_offset"] == outside.phy
    assert p5["commitlog"]["delete_segments"] == [f"{i * S:020d}" for i in range(1, n)]
    assert p5["dispatch"]["recovery_records"] == sum(1 for p in cs.placed if p.phy < outside.phy)


def test_index_files_newer_than_the_checkpoint_are_deleted_on_an_abnormal_start(tmp_path):
    cs = _crafted(3)
    store = _write(tmp_path, cs)
    root = tmp_path / "store"
    names = sorted(os.listdir(root / "index"))
    assert len(names) >= 3
    ends = []
    for n in names:
        with open(root / "index" / n, "rb") as f:
            ends.append(IndexHeader.from_bytes(f.read(40)).end_timestamp)
    idx_ts = ends[1]
    last = cs.placed[-1].msg.store_timestamp
    write_checkpoint(str(root), Checkpoint(last, last, idx_ts))
    (root / "abort").write_bytes(b"")
    plan = recover_plan.plan_document(simulate(_reopen(store)))
    assert plan["index"]["deleted"] == [n for n, e in zip(names, ends) if e > idx_ts]
    assert [f["action"] for f in plan["index"]["files"]] == ["delete" if e > idx_ts else "keep" for e in ends]
    exact = recover_plan.plan_document(simulate(_reopen(store), complete_index=False))
    assert plan["index"]["complete_index"] is True and exact["index"]["complete_index"] is False
    assert exact["index"]["entries_added"] <= plan["index"]["entries_added"]


def test_empty_preallocated_last_segment_is_deleted_and_counts_in_the_window(tmp_path):
    cs = _crafted(3)
    store = _write(tmp_path, cs, preallocate=1)
    plan = recover_plan.plan_document(simulate(store))
    n = len(os.listdir(tmp_path / "store" / "commitlog"))
    assert plan["commitlog"]["start_base"] == (n - 3) * S
    assert plan["commitlog"]["process_offset"] == cs.placed[-1].phy + cs.placed[-1].size
    assert plan["commitlog"]["delete_segments"] == [f"{(n - 1) * S:020d}"]
    assert plan["lost"]["totals"]["messages"] == 0


def test_all_commitlog_segments_deleted_destroys_every_consume_queue(tmp_path):
    cs = _crafted(2)
    store = _write(tmp_path, cs)
    root = tmp_path / "store"
    shutil.rmtree(root / "commitlog")
    (root / "commitlog").mkdir()
    store = _reopen(store)
    plan = recover_plan.plan_document(simulate(store))
    assert plan["commitlog"]["process_offset"] == 0
    files = plan["consume_queues"]["files"]
    assert files and all(f["action"] == "delete" for f in files)
    assert all(q["final_max_offset"] == 0 for q in plan["consume_queues"]["queues"])
    _apply(store, tmp_path / "bk")
    assert not any(f for _, _, fs in os.walk(root / "consumequeue") for f in fs)


def test_cq_truncation_first_entry_rule_keeps_a_zero_first_unit(tmp_path):
    # a queue whose last CQ segment starts with an all-zero unit: phy 0 < processOffset, so the broker keeps it
    cs = _crafted(2)
    store = _write(tmp_path, cs, abort=True)
    root = tmp_path / "store"
    qdir = root / "consumequeue" / "T" / "0"
    names = sorted(os.listdir(qdir))
    extra = qdir / f"{int(names[-1]) + CQS:020d}"
    u = np.zeros(CQS // 20, dtype=CQ_DTYPE)
    u[1] = (10**9, 100, 0)  # beyond processOffset: makes the CQ "ahead", triggering truncation
    extra.write_bytes(u.tobytes())
    plan = recover_plan.plan_document(simulate(_reopen(store)))
    q0 = next(q for q in plan["consume_queues"]["queues"] if q["queue_id"] == 0)
    # CQ recover stops at the zero unit (valid units end in the previous file), so the extra file is deleted on load
    assert q0["files_deleted_on_load"] == [extra.name]


# ---------------------------------------------------------------------------------------------
# apply / restore / crash safety


def _scenario(tmp_path, name="s"):
    base = tmp_path / name
    base.mkdir()
    cs = _crafted(3)
    bad = [p for p in cs.placed if p.segment == 2][2]
    cs.corrupt(bad.phy, 4, 0)  # bad magic inside the window: later records lost, segment 3 deleted
    store = _write(base, cs, abort=True)
    return store, cs, bad


def _copy_store(store: Store, dst) -> Store:
    shutil.copytree(store.loc.path, dst, copy_function=shutil.copy2)
    return Store(str(dst), store.settings)


class _Crash(BaseException):
    pass


def _crash_points(monkeypatch, labels: list[str], at: int | None = None) -> None:
    """Count the points where a kill must leave a store that a rerun finishes, by wrapping the real
    functions apply calls: the plan written, each backup saved, each step's operation, each step journalled
    (and the ``staged`` event). The label of each point passed is appended to ``labels``; the ``at``-th
    raises _Crash right after the real call returned, as a kill there would."""

    def wrap(owner, name, label_of):
        orig = getattr(owner, name)

        def point(*a, **k):
            out = orig(*a, **k)
            label = label_of(*a, **k)
            if label is not None:
                labels.append(label)
                if len(labels) == at:
                    raise _Crash(label)
            return out

        monkeypatch.setattr(owner, name, point)

    wrap(ra, "atomic_write_json", lambda path, obj: "planned" if os.path.basename(path) == ra.PLAN_FILE else None)
    wrap(Backup, "save", lambda self, rel, **k: f"saved:{rel}")
    wrap(ra, "_run_step", lambda step, *a: f"op:{step['id']}")
    wrap(ra, "_journal", lambda bdir, obj: {"staged": "staged", "done": f"done:{obj.get('id')}"}.get(obj["event"]))


def test_crash_at_every_kind_of_point_then_rerun_gives_the_uninterrupted_result(tmp_path):
    proto, _, _ = _scenario(tmp_path, "proto")
    ref = _copy_store(proto, tmp_path / "ref")
    orig = _tree(ref.loc.path)
    labels: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        _crash_points(mp, labels)
        res = _apply(ref, tmp_path / "ref-bk")
    want = _tree(ref.loc.path)
    assert want != orig and res.steps > 6
    steps = json.load(open(tmp_path / "ref-bk" / ra.STEPS_FILE))
    by_id = {str(s["id"]): s["op"] + ":" + s["rel"].split("/")[0] for s in steps}
    by_rel = {s["rel"]: by_id[str(s["id"])] for s in steps if s["op"] != "marker_remove"}
    # one crash point per (operation kind, phase): after the backup, after the operation (+ the very last point)
    kinds: dict[str, int] = {}
    for n, label in enumerate(labels, 1):
        phase, _, arg = label.partition(":")
        kind = label if not arg else f"{by_rel[arg] if phase == 'saved' else by_id[arg]}:{phase}"
        if phase != "done" or n == len(labels):  # a step's "done" point is the next step's start
            kinds.setdefault(kind, n)
    assert len(kinds) >= 10

    for kind, k in sorted(kinds.items(), key=lambda kv: kv[1]):
        s = _copy_store(proto, tmp_path / f"k{k}")
        with pytest.MonkeyPatch.context() as mp:
            _crash_points(mp, [], at=k)
            with pytest.raises(_Crash):
                _apply(s, tmp_path / f"k{k}-bk")
        _apply(_reopen(s), tmp_path / f"k{k}-bk")
        assert _tree(s.loc.path) == want, f"crash at {kind}"
        ra.restore(tmp_path / f"k{k}-bk")
        assert _tree(s.loc.path) == orig, f"restore after a crash at {kind}"


# run as ``python -c`` with (k, cli args...): SIGKILL the process right after its k-th backup is saved
_KILL_AFTER_SAVE = """
import os, signal, sys
from storelib.fileio.backup import Backup
orig, seen = Backup.save, [0]
def save(self, *a, **k):
    out = orig(self, *a, **k)
    seen[0] += 1
    if seen[0] == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return out
Backup.save = save
from jobs.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_sigkill_during_apply_then_rerun_matches_and_restore_is_byte_identical(tmp_path):
    proto, _, _ = _scenario(tmp_path, "proto")
    ref = _copy_store(proto, tmp_path / "ref")
    _apply(ref, tmp_path / "ref-bk")
    want = _tree(ref.loc.path)
    s = _copy_store(proto, tmp_path / "victim")
    orig = _tree(s.loc.path)
    conf = _conf_file(tmp_path / "proto", "4")
    args = ["recover", s.loc.path, "--broker-conf", conf, "--apply", "--backup", str(tmp_path / "bk")]
    # mid-way: the marker and one step done, the next one backed up but not applied
    p = subprocess.run([sys.executable, "-c", _KILL_AFTER_SAVE, "3", *args], cwd=REPO, capture_output=True)
    assert p.returncode == -9, p.stderr
    assert _tree(s.loc.path) not in (want, orig)
    p = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "resumed" in p.stdout
    assert _tree(s.loc.path) == want
    p = subprocess.run([sys.executable, "-m", "jobs.cli", "recover", "--restore", str(tmp_path / "bk")], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert _tree(s.loc.path) == orig


def test_apply_refuses_a_store_locked_by_a_live_process(tmp_path):
    store, _, _ = _scenario(tmp_path)
    lock = os.path.join(store.loc.path, "lock")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl,os,sys,time\nfd=os.open(sys.argv[1],os.O_RDWR)\n"
        "fcntl.lockf(fd,fcntl.LOCK_EX,1,0,0)\nprint('ok',flush=True)\ntime.sleep(30)"), lock],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        before = _tree(store.loc.path)
        with pytest.raises(StoreError) as e:
            _apply(store, tmp_path / "bk")
        assert e.value.kind == "locked"
        assert _tree(store.loc.path) == before
    finally:
        holder.kill()
        holder.wait()


def test_second_apply_with_another_backup_dir_after_a_crash_is_refused(tmp_path, monkeypatch):
    store, _, _ = _scenario(tmp_path)
    labels: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        _crash_points(mp, labels)
        _apply(_copy_store(store, tmp_path / "dry"), tmp_path / "dry-bk")
    k = next(n for n, label in enumerate(labels, 1) if label.startswith("op:") and n > 5)
    _crash_points(monkeypatch, [], at=k)
    with pytest.raises(_Crash):
        _apply(store, tmp_path / "bk1")
    monkeypatch.undo()
    with pytest.raises(StoreError) as e:
        _apply(_reopen(store), tmp_path / "bk2")
    assert e.value.kind == "apply_in_progress"


# ---------------------------------------------------------------------------------------------
# salvage


def test_salvage_recovers_every_intact_message_after_a_mid_segment_corruption(tmp_path):
    cs = _crafted(3)
    seg_recs = [p for p in cs.placed if p.segment == 2]
    bad = seg_recs[3]
    for rel in range(8, 40):  # scribble over the record's header: resync must find the next one
        cs.corrupt(bad.phy, rel)
    store = _write(tmp_path, cs, dispatch=False)
    sim = simulate(store)
    # the broker keeps none of what follows
    assert recover_plan.plan_document(sim)["commitlog"]["process_offset"] == bad.phy
    after = [p for p in cs.placed if p.phy > bad.phy]
    assert after
    out = tmp_path / "salvage"
    rep = sv.salvage(sim, out)
    assert rep["messages"] == len(after)
    rows = [json.loads(line) for line in open(out / "messages.jsonl", encoding="utf-8")]
    import base64

    assert [r["phy_offset"] for r in rows] == [p.phy for p in after]
    assert [base64.b64decode(r["body_base64"]) for r in rows] == [p.msg.body for p in after]
    assert [r["properties"]["UNIQ_KEY"] for r in rows] == [p.msg.properties["UNIQ_KEY"] for p in after]
    assert all(r["resend_topic"] == "T" for r in rows)
    import pyarrow.parquet as pq

    t = pq.read_table(out / "messages.parquet")
    assert t.num_rows == len(after) and t.column("body").to_pylist() == [p.msg.body for p in after]
    r0 = rep["lost_ranges"][0]
    assert (r0["phy_start"], r0["end"] - r0["start"]) == (bad.phy, bad.size)


def test_salvage_config_picks_newest_valid_repairs_and_clamps_offsets(tmp_path):
    cs = _crafted(2)
    last = [p for p in cs.placed if p.segment == 1][4]
    cs.corrupt(last.phy, 4, 0)
    store = _write(tmp_path, cs)  # CQ ahead: truncated at `last`
    cfg = tmp_path / "store" / "config"
    cfg.mkdir()
    good = '{\n\t"offsetTable":{\n\t\t"T@g1":{0:999,1:2,2:0\n\t\t}\n\t}\n}'
    (cfg / "consumerOffset.json").write_text(good[:30])  # half-written
    (cfg / "consumerOffset.json.bak").write_text(good)
    (cfg / "topics.json").write_text('{"topicConfigTable":{"T":{"topicName":"T","readQueueNums":3}}, "dataVer')
    sim = simulate(_reopen(store))
    maxes = {q["queue_id"]: q["final_max_offset"] for q in recover_plan.plan_document(sim)["consume_queues"]["queues"]}
    rep = sv.salvage(sim, tmp_path / "out")
    co = next(c for c in rep["config"] if c["name"] == "consumerOffset.json")
    assert co["chosen"] == "consumerOffset.json.bak"
    assert co["changes"] == [{"key": "T@g1", "topic": "T", "group": "g1", "queue_id": 0, "old": 999,
                              "new": maxes[0], "queue_range": [0, maxes[0]], "why": "above the recovered max offset"}]
    tp = next(c for c in rep["config"] if c["name"] == "topics.json")
    assert tp["chosen"] == "topics.json" and tp["repaired"]
    assert "topicConfigTable" in (tmp_path / "out" / "config" / "topics.json").read_text()


def test_cli_plan_writes_json_and_exit_code_says_whether_anything_changes(tmp_path):
    store, _, bad = _scenario(tmp_path)
    conf = _conf_file(tmp_path / "s", "4")
    pf = tmp_path / "plan.json"
    p = subprocess.run([sys.executable, "-m", "jobs.cli", "recover", store.loc.path, "--broker-conf", conf,
                        "--plan-file", str(pf)], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert f"processOffset: {bad.phy}" in p.stdout
    plan = json.loads(pf.read_text())
    assert plan["schema"] == recover_plan.PLAN_SCHEMA and plan["commitlog"]["process_offset"] == bad.phy


def test_apply_without_a_backup_directory_is_refused_before_the_store_is_read(tmp_path, capsys, monkeypatch):
    from jobs.cli import main
    from storelib.broker.settings import store as store_mod

    monkeypatch.setattr(store_mod.Store, "__init__", lambda *a, **k: pytest.fail("the store was opened"))
    assert main(["recover", str(tmp_path / "nowhere"), "--apply", "--engine", "pool"]) == 2
    assert "--apply needs --backup DIR" in capsys.readouterr().err
