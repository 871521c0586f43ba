"""The recovery plan document (schema ``rmqstore.recover.plan/1``): what a simulated broker start-up
(:func:`storelib.broker.startup.startup.simulate`) would change, as JSON for ``--plan`` and ``--apply``
(its human summary is the ``recover`` command's). Every number comes from the Simulation (and the
lost-message scan). A DLedger-mode store adds a ``dledger`` section (DLedger's load and recover: start
file, data end, ledger, committed index and position, index rewrite, 5.3.3's own walk, the uncommitted
entries); its ``commitlog.process_offset`` is the broker's max offset after load(), the committed position.
"""

from __future__ import annotations

import time
from typing import Any

from storelib.broker.recovery.walk import DispatchRange, RecoveryInputs, RecoveryResult
from storelib.broker.startup.startup import IndexFileOnLoad, Reput, Simulation
from storelib.broker.startup.startuplost import scan_lost
from storelib.format.checkpoint import RECOVERY_SAFETY_MS, Checkpoint
from storelib.scan.commitlog import Segment, offset_to_file_name

PLAN_SCHEMA = "rmqstore.recover.plan/1"


def plan_document(sim: Simulation, *, lost: bool = True) -> dict:
    """The plan of ``sim``; ``lost=False`` leaves out the scan of the messages a start-up drops."""
    store, walk, abort, lock, new_cp = sim.store, sim.walk, sim.abort, sim.lock, sim.checkpoint_after
    queues_doc = _consume_queue_doc(sim, walk)
    lost_doc = scan_lost(sim, with_body=False) if lost else None
    plan = {
        "schema": PLAN_SCHEMA,
        "store": store.loc.path,
        "version": "5.x" if sim.version == "5" else "4.9.x",
        "broker_line": store.settings.line.to_json() if store.settings.line else None,
        "created_ms": int(time.time() * 1000),
        "last_exit": {
            "clean": abort.last_exit_ok, "abort_file": abort.exists, "abort_content": abort.content,
            "recovery": walk.mode,
            "lock": {"exists": lock.exists, "held_by_other": lock.held_by_other, "holder_pid": lock.holder_pid},
        },
        "live": store.cut.to_dict() if store.live else None,  # a broker runs it: the plan is of a crash now
        "checkpoint": _checkpoint_doc(sim.checkpoint, sim.inputs),
        "commitlog": _commitlog_doc(sim),
        "consume_queues": queues_doc,
        "dispatch": {
            "recovery": [_range_dict(d) for d in walk.dispatch if d.by == "recovery"],
            "recovery_records": sim.recovery_records,
            "delay_levels_quirk": walk.delay_levels_quirk,
            "reput": _reput_doc(sim.reput),
            "reput_records": sim.reput_records,
        },
        "index": {
            "files": [_index_file_dict(f) for f in sim.index_files],
            "deleted": sim.index_delete,
            "written": [im.name for im in sim.index_images],
            "entries_added": sim.index_keys_added,
            "complete_index": sim.complete_index,
            "extra_records_indexed": sim.index_extra_records,
            "entries_the_broker_would_lose": sim.index_keys_extra,
        },
        "checkpoint_after": {
            "physic_msg_timestamp": new_cp.physic_msg_timestamp, "logics_msg_timestamp": new_cp.logics_msg_timestamp,
            "index_msg_timestamp": new_cp.index_msg_timestamp, "confirm_phy_offset": new_cp.confirm_phy_offset,
        },
        "abort_remove": abort.exists,
        "lost": lost_doc,
        "timer_store": sim.timer.to_json() if sim.timer is not None else None,
        "dledger": _dledger_doc(sim),
        "findings": [f.to_dict() for f in sim.findings],
        # the broker's load fails on these entries (it does not start) or maps files this model does not read
        "load_failures": [f.to_dict() for f in sim.load_failures],
        "supported": sim.walk.supported and not sim.load_failures and not _mixed(sim),
    }
    plan["changes"] = bool(
        plan["commitlog"]["delete_segments"] or sim.commitlog_zero_from or queues_doc["files"] or sim.index_delete
        or sim.index_images or abort.exists or (lost_doc and lost_doc["totals"]["messages"])
        or (sim.timer is not None and sim.timer.changes_anything()) or (sim.dledger is not None and sim.dledger.any))
    return plan


def _mixed(sim: Simulation) -> bool:
    """A mixed store: the plan models the DLedger part only (dledgerlayout.mixed_finding)."""
    return sim.store.dledger is not None and sim.store.dledger.old is not None


def _dledger_doc(sim: Simulation) -> dict[str, Any] | None:
    """DLedger's load and recover and DLedgerCommitLog's recovery (None for a default store)."""
    dl = sim.walk.dledger
    if dl is None or sim.dledger is None:
        return None
    out = dl.to_json()
    out.update(sim.dledger.to_json())
    d, st = sim.store.dledger, sim.store.dledger_state
    out["node"] = None if d is None else d.to_json()
    if st is not None and st.currterm is not None:
        out["term"], out["voted_for"] = st.currterm.curr_term, st.currterm.vote_leader
    out["uncommitted"] = None if dl.committed_index >= dl.ledger_end_index else {
        "from_index": dl.committed_index + 1, "to_index": dl.ledger_end_index,
        "from_phy_offset": max(dl.committed_pos, dl.min_offset), "to_phy_offset": dl.last_entry_end,
        "note": "on disk past the committed index: consumers see them once DLedger commits them again (a leader "
                "re-commits its whole log; a follower takes the leader's, and a rejoin truncates what the leader "
                "does not have)"}
    out["after_recommit"] = _after_recommit(sim)
    return out


def _after_recommit(sim: Simulation) -> dict[str, Any] | None:
    """Where the reput goes on once DLedger commits the whole log (a leader; not part of this start-up)."""
    dl = sim.walk.dledger
    assert dl is not None
    frm = max(sim.reput.start or 0, sim.reput.end, dl.min_offset)  # where the reput stands after the start
    if frm >= dl.last_entry_end:
        return None
    return {"from": frm, "to": dl.last_entry_end,
            "note": "the reput dispatches these once the entries are committed again; 5.3.3's reput starts at the "
                    "committed position, so entries the consume queues already hold are skipped there"}


def _checkpoint_doc(cp: Checkpoint, inputs: RecoveryInputs) -> dict[str, Any]:
    """The checkpoint as the start-up reads it, and up to when it trusts the store."""
    return {
        "physic_msg_timestamp": cp.physic_msg_timestamp, "logics_msg_timestamp": cp.logics_msg_timestamp,
        "index_msg_timestamp": cp.index_msg_timestamp, "master_flushed_offset": cp.master_flushed_offset,
        "confirm_phy_offset": cp.confirm_phy_offset, "safety_margin_ms": RECOVERY_SAFETY_MS,
        "min_timestamp": cp.min_timestamp(), "min_timestamp_index": cp.min_timestamp_index(),
        "message_index_enable": inputs.message_index_enable, "message_index_safe": inputs.message_index_safe,
        "trusted_up_to": cp.min_timestamp_index() if inputs.message_index_enable and inputs.message_index_safe
        else cp.min_timestamp(),
    }


def _commitlog_doc(sim: Simulation) -> dict[str, Any]:
    """The commitlog walk: where it starts and why, the CRC window, processOffset, what is deleted or cut."""
    walk, cl = sim.walk, sim.store.commitlog
    S = cl.segment_size
    fail = walk.failure
    segs_max = max([s.base + s.file_size for s in cl.segments] + [0])
    return {
        "folder": cl.folder,
        "segment_size": S,
        "segments": [_segment_dict(s) for s in cl.segments],
        "min_offset": cl.segments[0].base if cl.segments else 0,
        "start_segment": None if walk.start_base is None else offset_to_file_name(walk.start_base),
        "start_base": walk.start_base,
        "start_reason": walk.start_reason,
        "crc_window": {"from": walk.window_start, "to": walk.process_offset, "crc_checked": walk.crc_checked,
                       "segments": [o.name for o in walk.segments if o.crc_checked]},
        "process_offset": walk.process_offset,
        "failure": None if fail is None else {
            "segment": fail.name, "file_offset": fail.end_offset, "phy_offset": fail.base + fail.end_offset,
            "reason": fail.reason, "detail": fail.detail},
        "delete_segments": sim.commitlog_delete,
        "truncate": None if walk.truncate is None else {
            "segment": offset_to_file_name(walk.truncate[0]), "wrote_position": walk.truncate[1],
            "bytes_after": S - walk.truncate[1],
            "zero_tail": sim.commitlog_zero_from is not None},
        "bytes_dropped": max(0, segs_max - (walk.process_offset if walk.dledger is None else walk.dledger.data_end))
        if cl.segments else 0,
        "supported": walk.supported,
    }


def _consume_queue_doc(sim: Simulation, walk: RecoveryResult) -> dict[str, Any]:
    """Each queue's recovery report and the CQ files written or deleted."""
    qreps = [r.__dict__.copy() for r in sim.queue_reports]
    files = [{"path": rel, "action": "write" if data is not None else "delete"}
             for q in sim.queues.values() for rel, data in q.outputs()]
    return {
        "max_phy_offset": walk.cq_max_phy_offset,
        "truncate_at_process_offset": walk.truncate_consume_queues,
        "queues": qreps,
        "batch_queues": sim.batch.docs() if sim.batch is not None else [],  # 5.3.3's, modelled, never written
        "files": files,
        "totals": {
            "queues": len(qreps),
            "entries_truncated": sum(r["entries_truncated"] for r in qreps),
            "entries_added": sum(r["entries_added"] for r in qreps),
            "files_written": sum(1 for f in files if f["action"] == "write"),
            "files_deleted": sum(1 for f in files if f["action"] == "delete"),
        },
    }


def _range_dict(d: DispatchRange) -> dict:
    """A dispatched range in the plan."""
    return {"segment": d.name, "from": d.phy_start, "to": d.phy_end, "by": d.by,
            "only_physical_offset_above": d.after, "only_ending_at_or_before": d.confirm,
            "only_physical_offset_below": d.below}


def _reput_doc(r: Reput) -> dict[str, Any]:
    return {"from": r.start, "to": r.end, "ranges": [_range_dict(d) for d in r.ranges]}


def _index_file_dict(f: IndexFileOnLoad) -> dict[str, Any]:
    return {"name": f.name, "end_timestamp": f.end_timestamp, "end_phy_offset": f.end_phy_offset,
            "index_count": f.index_count, "action": "delete" if f.delete else "keep"}


def _segment_dict(s: Segment) -> dict:
    return {"name": s.name, "base": s.base, "size": s.file_size}
