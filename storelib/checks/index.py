"""IndexFile checks: every file's structure, its entries against the records' keys both ways (an index
whose entries are exactly the log's keys in order skips the per-entry lookups: :class:`storelib.checks.keystream.KeyStream`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from storelib.broker.recovery.reputpath import SKIP_WHY, reput_skipped_at, stopping_gaps
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.strayload import version_of
from storelib.checks.indexgrowth import grown_file_clean, slots_crc
from storelib.checks.keystream import KeyStream, behind_finding
from storelib.checks.logview import (
    LogView,
    Unsettled,
    is_member,
    lookup_repeats,
    run_of,
    searchsorted_repeats,
)
from storelib.checks.queues import reput_master
from storelib.checks.segment import Capped
from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.fileio.sampledcrc import sampled_crc
from storelib.format.checkpoint import Checkpoint
from storelib.format.indexdir import IndexFileRef
from storelib.format.indexfile import IndexFile, IndexGeometry, IndexHeader, ProvenChains

if TYPE_CHECKING:
    from storelib.broker.settings.livecut import StoreCut


@dataclass
class IndexLoad:
    """The index files' headers and structural findings (:meth:`IndexFile.validate`), which need no
    record: loadable while the segments are still being audited. Entries are read again when compared."""

    findings: list[Finding] = field(default_factory=list)  # from listing index/
    files: list[tuple[IndexFileRef, IndexHeader | None, list[Finding] | None, Finding | None]] = field(
        default_factory=list)
    # per file: (ref, header, validate findings, or the finding that it could not be opened)
    live: bool = False  # read as at a live store's cut (headers of then, files created since left out)


def index_open_error(display: str, e: StoreError) -> Finding:
    return Finding("index_bad_size" if e.kind in ("bad_size", "truncated") else e.kind, "error", display,
                   e.offset, e.detail)


def load_index_files(root: Location, settings: BrokerSettings, carried: dict[str, dict] | None = None,
                     cut: StoreCut | None = None) -> IndexLoad:
    """List, open and validate every index file (headers and structure; entries are not kept).

    ``carried`` (an earlier run's :func:`check_index` ``snap``): files it checked that hold the same number
    of entries are not validated again (their findings are replayed, :func:`check_index`). ``cut``: a live
    store's, whose files are read as they stood at it; files the cleaner deleted since are said once."""
    res = IndexLoad(live=cut is not None and cut.live)
    refs = index_refs_at(root, res.findings, cut, version_of(settings.version))
    g = IndexGeometry(settings.max_hash_slot_num, settings.max_index_num)
    for ref in refs:
        size_note = ref.size_finding(g)
        if size_note is not None:
            res.findings.append(size_note)
        try:
            f = ref.open(g, strict=False, broker_size=True)
        except StoreError as e:
            if index_gone(ref, res.live):
                res.findings.extend(expired_index(ref))
            else:
                res.files.append((ref, None, None, index_open_error(f"index/{ref.name}", e)))
            continue
        c = (carried or {}).get(ref.name)
        try:
            ic = f.header.index_count
            same = c is not None and (ic == c["index_count"] or ic > c["index_count"] and "slots_crc" in c)
            res.files.append((ref, f.header, [] if same else f.validate(chunk_entries=1 << 18), None))
        finally:
            f.close()
    return res


def index_refs_at(root: Location, findings: list[Finding], cut: StoreCut | None, version: str | None = None
                  ) -> list[IndexFileRef]:
    """The index files, the listing's findings into ``findings``; a live store's as at its ``cut`` (files
    created since left out, those the cleaner deleted since said once). With the broker line's ``version``,
    the entries the listing skips are judged as IndexService.load meets them (:func:`judge_index`)."""
    from storelib.broker.settings.storeloads import judge_index
    from storelib.format.indexdir import list_index_files

    refs = list_index_files(root, findings)
    if version is not None:
        judge_index(findings, [r.name for r in refs], version)
    if cut is not None:
        listed = {r.name for r in refs}
        gone = [n for n, _ in cut.index_headers if n not in listed]
        refs = cut.index_refs(refs)
        if gone:
            findings.append(Finding("expired_during_run", "info", "index", None,
                                    f"{len(gone)} index file(s) deleted by the broker's cleaner after this run's "
                                    f"cut ({gone[0]}{' .. ' + gone[-1] if len(gone) > 1 else ''}): expired during "
                                    "the run", {"files": gone}))
    return refs


def expired_index(ref: IndexFileRef) -> list[Finding]:
    """A live store's index file that could not be opened because the cleaner deleted it during the run."""
    return [Finding("expired_during_run", "info", f"index/{ref.name}", None,
                    "deleted by the broker's cleaner during the run: not read")]


def index_gone(ref: IndexFileRef, live: bool) -> bool:
    """Is a file that could not be opened one a live store's cleaner deleted during the run?"""
    return live and not _exists(ref.loc)


@dataclass
class KeyCodes:
    """Every record key as one int64 code, (rank of its record by PHYSICALOFFSET field) << 31 | hash,
    -1 when its record is not in the table; what index entries are matched against."""

    kphy: np.ndarray  # record position of each key
    khash: np.ndarray
    rank: np.ndarray  # record row -> rank by PHYSICALOFFSET field
    kcode: np.ndarray
    kcode_sorted: np.ndarray
    kpos: np.ndarray  # the sorted codes >= 0 (keys whose record was found)


def key_codes(log: LogView) -> KeyCodes:
    kphy = log.keys.column("pos").to_numpy()
    khash = log.keys.column("key_hash").to_numpy().astype(np.int64)
    krow = searchsorted_repeats(log.phy, kphy) if len(kphy) else np.zeros(0, np.int64)
    if len(krow):
        krow = np.where(log.phy[np.clip(krow, 0, len(log.phy) - 1)] == kphy, krow, -1)
    if log.field_order is None:  # fields already sorted: a record's rank is its row
        rank = np.arange(len(log.field), dtype=np.int64)
    else:
        rank = np.empty(len(log.field_order), np.int64)
        rank[log.field_order] = np.arange(len(log.field_order))
    kcode = np.where(krow >= 0, (rank[np.clip(krow, 0, None)] << 31) | khash, -1) if len(krow) else np.zeros(0, np.int64)
    kcode_sorted = np.sort(kcode)
    return KeyCodes(kphy, khash, rank, kcode, kcode_sorted, kcode_sorted[np.searchsorted(kcode_sorted, 0):])


def _exists(loc: Location) -> bool:
    return loc.fs.get_file_info(loc.path).type.name != "NotFound"


def check_index(root: Location, log: LogView | None, settings: BrokerSettings, out: Capped, checkpoint: Checkpoint | None,
                abort: bool, loaded: IndexLoad | None = None, stream: KeyStream | None = None,
                carried: dict[str, dict] | None = None, snap: dict[str, dict] | None = None,
                cut: StoreCut | None = None, log_min: int | None = None) -> dict:
    """IndexFile headers, entries vs records, keys findable; files an abnormal start would delete.

    Needs nothing from the consume-queue checks, so it runs beside them (:func:`storelib.checks.crossfile.run_cross_checks`);
    ``loaded``: the files validated beforehand (:func:`load_index_files`); ``stream`` (``log`` None): the
    keys streamed segment by segment, where a file that is not exactly the next keys raises
    :class:`~storelib.checks.logview.Unsettled` instead of being looked up entry by entry. ``snap`` (streamed):
    filled with what a later run needs per file; ``carried``: an earlier run's ``snap``, whose files are
    not compared again where their entries still fingerprint the same (a grown file: only its new entries)."""
    from storelib.format.indexfile import IndexGeometry

    if loaded is None:
        loaded = load_index_files(root, settings, cut=cut)
    out.extend(loaded.findings)
    info: dict[str, Any] = {"files": []}
    if not loaded.files:
        return info
    g = IndexGeometry(settings.max_hash_slot_num, settings.max_index_num)
    keys = stream if stream is not None else KeyStream.of_view(log)
    k_: KeyCodes | None = None  # computed only when some file's entries are not the keys' sequence
    all_codes: list[np.ndarray] = []  # per file: its entries' codes (entries pointing at a record), sorted
    wrong_phy: list[np.ndarray] = []
    max_end_phy = -1
    idx_ts = checkpoint.index_msg_timestamp if checkpoint is not None else None
    _carried_all_present(carried, loaded)
    for ref, h, vf, err in loaded.files:
        display = f"index/{ref.name}"
        if err is not None:
            out.add(err)
            if snap is not None:
                raise Unsettled(f"{display} cannot be opened")
            continue
        try:
            f = ref.open(g, strict=False, broker_size=True)
        except StoreError as e:  # changed since it was validated
            if index_gone(ref, loaded.live):  # the cleaner took it during the run
                out.extend(expired_index(ref))
                continue
            out.add(index_open_error(display, e))
            if snap is not None:
                raise Unsettled(f"{display} cannot be opened") from e
            continue
        ent = None
        c = (carried or {}).get(ref.name)
        fc = Capped() if snap is not None else out  # the file's findings after its note (kept for ``snap``)
        try:
            ent = f.entries_array()  # a view of the mapped file: columns are copied a chunk at a time
            m = len(ent)
            file_info = {"name": ref.name, "entries": m, "begin_ts": h.begin_timestamp, "end_ts": h.end_timestamp,
                         "begin_phy": h.begin_phy_offset, "end_phy": h.end_phy_offset}
            info["files"].append(file_info)
            skip = carried_entries(c, ent, display)
            if c is None and log is None and log_min is not None:
                skip = expired_head(ent, log_min)  # what the whole view calls expired: nothing to match
            file_max = c["max_phy"] if c is not None else -1
            for lo in range(skip, m, 1 << 20):  # a chunk at a time: no whole-file copy of the column
                file_max = max(file_max, int(ent["phy_offset"][lo:lo + (1 << 20)].max()))
            max_end_phy = max(max_end_phy, file_max)
            abnormal_start_note(info, out, ref.name, h, idx_ts, abort)
            if c is not None and _resumed_file(c, f, ent, skip, keys, file_info, file_max, out, snap):
                continue
            if keys.next_are_entries(ent[skip:]):
                # the file holds exactly the next keys of the log, in order: every entry points at its
                # record with one of its keys' hashes, so no entry finding (the comparison would find none)
                wrong = np.zeros(0, np.int64)
            else:
                if log is None:
                    raise Unsettled(f"{display}: its entries are not the records' keys in order")
                if k_ is None:
                    k_ = key_codes(log)
                wrong = entries_against_records(log, k_, ent, g, display, out, all_codes, wrong_phy)
            # chain structure: the broker links each entry to the previous entry of its slot
            if m and not len(wrong):
                check_chains(ent, g, display, fc)
            add_validate_findings(vf, bool(len(wrong)), display, fc)
            if snap is not None:
                out.absorb(fc)
                snap[ref.name] = file_snapshot(f, ent, file_info, file_max, fc, ref is loaded.files[-1][0])
        finally:
            del ent
            f.close()
    # every keyed message findable
    if settings.message_index_enable and keys.n and not keys.all_matched():
        # a live store's cut can fall between two keys of one record (IndexService.buildIndex puts them one
        # by one): its keys not indexed yet are lag too
        if stream is not None:
            keys.behind(max_end_phy - 1 if loaded.live else max_end_phy, out)
        else:
            _keys_findable(log, k_ if k_ is not None else key_codes(log), keys, all_codes, wrong_phy, info,
                           max_end_phy, out, loaded.live, reput_master(settings))
    info["max_end_phy"] = max_end_phy
    return info


def add_validate_findings(vf: list[Finding], wrong: bool, display: str, out: Capped) -> None:
    """A file's structural findings, less those its wrong-hash entries (``wrong``) or a slot that does not
    hold its newest entry already explain."""
    consequences = (["slot_not_newest_entry", "prev_index_wrong_slot", "hash_slot_count_mismatch",
                     "index_chain_broken"] if wrong else [])
    for vfi in vf:
        if vfi.kind in consequences:
            continue
        vfi.file = display
        if vfi.kind == "slot_not_newest_entry" and not wrong:
            consequences.append("index_chain_broken")
        out.add(vfi)


def expired_head(ent: np.ndarray, log_min: int) -> int:
    """How many leading entries point below the commitlog's first offset (their records expired; the
    cleaner deletes an index file only once its last entry is below it)."""
    if not len(ent):
        return 0
    below = ent["phy_offset"][: 1 << 20].astype(np.int64) < log_min
    return int(np.argmin(below)) if not below.all() else (len(below) if len(below) == len(ent) else 0)


def _resumed_file(c: dict, f: IndexFile, ent: np.ndarray, skip: int, keys: KeyStream, file_info: dict,
                  file_max: int, out: Capped, snap: dict[str, dict] | None) -> bool:
    """A file an earlier run checked (``c``): unchanged, what it found then is found again; grown since a
    clean check, only its new entries (against the keys) and its slot table are checked
    (:mod:`storelib.checks.indexgrowth`). False: check the file in full."""
    display = f"index/{file_info['name']}"
    if skip == len(ent):
        out.replay_json(c["found"])
        snap[file_info["name"]] = c  # type: ignore[index]
        return True
    if "slots_crc" not in c:
        return False
    if not keys.next_are_entries(ent[skip:]):
        raise Unsettled(f"{display}: its new entries are not the records' keys in order")
    crc = grown_file_clean(f, skip, c["slots_crc"], c["distinct"])
    if crc is None:
        raise Unsettled(f"{display}: its new entries or slots need the whole file checked")
    snap[file_info["name"]] = {**c, "count": len(ent), "index_count": f.header.index_count,  # type: ignore[index]
                               "fp": entries_fingerprint(ent, len(ent)), "info": file_info, "max_phy": file_max,
                               "slots_crc": crc, "distinct": f.header.hash_slot_count}
    return True


def file_snapshot(f: IndexFile, ent: np.ndarray, file_info: dict, file_max: int, fc: Capped, last: bool) -> dict:
    """What a later run needs of a file checked in full: its entry count and fingerprint, what was found;
    for the last file (the one that grows) when clean, its slot table's CRC."""
    snap = {"count": len(ent), "index_count": f.header.index_count, "fp": entries_fingerprint(ent, len(ent)),
            "info": file_info, "max_phy": file_max, "found": fc.to_json()}
    if last and not fc.counts:
        snap.update(slots_crc=slots_crc(f.slots()), distinct=f.header.hash_slot_count)
    return snap


def _carried_all_present(carried: dict[str, dict] | None, loaded: IndexLoad) -> None:
    """An index file an earlier run checked and that is gone now (deleted with expired data, or by
    hand): the carried key positions no longer hold."""
    if carried and set(carried) - {ref.name for ref, *_ in loaded.files}:
        raise Unsettled("an index file checked by an earlier run is gone")


def carried_entries(c: dict | None, ent: np.ndarray, display: str) -> int:
    """How many leading entries of a file an earlier run checked (0 without ``c``); Unsettled when they
    do not fingerprint the same or the file holds fewer entries now."""
    if c is None:
        return 0
    n = c["count"]
    if len(ent) < n or entries_fingerprint(ent, n) != c["fp"]:
        raise Unsettled(f"{display}: entries checked by an earlier run have changed")
    return n


def entries_fingerprint(ent: np.ndarray, n: int) -> list[int]:
    """Sampled CRCs of the first ``n`` entries (:mod:`storelib.fileio.sampledcrc`) and their count."""
    head, tail = sampled_crc(lambda i, k: ent[i:i + k].tobytes(), n, ent.dtype.itemsize)
    return [head, tail, n]


def _keys_findable(log: LogView, k_: KeyCodes, keys: KeyStream, all_codes: list[np.ndarray],
                   wrong_phy: list[np.ndarray], info: dict, max_end_phy: int, out: Capped, live: bool = False,
                   master: bool = False) -> None:
    """Every record key is some entry's (by code): keys not indexed yet after the last indexed message, or
    missing for good (explained by lost data, expiry or an entry with the wrong hash, the broker's reput
    skipping their messages on a ``master``, or not)."""
    kphy, khash, kcode, kpos = k_.kphy, k_.khash, k_.kcode, k_.kpos
    # the files whose entries were the keys' sequence: their codes are those keys' codes
    all_codes.extend(np.sort(k_.kcode[a:b]) for a, b in keys.spans)
    if len(all_codes) == 1:
        have = all_codes[0]
    else:  # sorted runs: the stable sort (timsort) merges them
        have = np.sort(np.concatenate(all_codes), kind="stable") if all_codes else np.zeros(0, np.int64)
    if np.array_equal(kpos, have):  # every key's code is some entry's: none missing
        missing = np.zeros(0, np.int64)
    else:
        missing = np.flatnonzero(~is_member(kcode, have) & (kcode >= 0))
    if len(missing):
        mphy = kphy[missing]
        first_begin = min((fi["begin_phy"] for fi in info["files"]), default=0)
        explained = log.in_lost(mphy) | (mphy < log.log_min)
        if wrong_phy:
            wp = np.concatenate(wrong_phy)
            explained |= is_member(mphy, np.sort(wp))
        behind, real = split_missing(mphy, explained, max_end_phy, live)
        skipped = reput_skipped_keys(kphy, missing, real | behind, kcode >= 0, log.lost, log.segment_size, master,
                                     stopping_gaps(log.gaps, max_end_phy))
        behind &= ~skipped  # the reput never reads them: not "not indexed yet"
        if behind.any():
            out.add(behind_finding(int(behind.sum()), max_end_phy))
        missing_key_findings(mphy, khash[missing], real & ~skipped, skipped, first_begin, log.segment_size, out)


def reput_skipped_keys(kphy: np.ndarray, missing: np.ndarray, real: np.ndarray, known: np.ndarray,
                       lost: np.ndarray, segment_size: int, master: bool, gaps: np.ndarray | None = None
                       ) -> np.ndarray:
    """Of the keys no index file holds that no lost data, expiry or wrong entry explains (``real``, per key of
    ``missing``: missing for good or after the last indexed message alike), those of messages the broker's reput
    never dispatched, so IndexService.buildIndex (a dispatcher of that reput) never indexed them: where
    :func:`storelib.broker.recovery.reputpath.reput_skipped_at` says (the consume-queue audit's
    cq_reput_skipped), and none of their keys indexed (a message with one was dispatched).
    ``kphy``: every key's message position; ``known``: the keys whose message was found."""
    if not (master and len(lost)) and (gaps is None or not len(gaps)) or not real.any():
        return np.zeros(len(missing), bool)
    mphy = kphy[missing]
    skipped = real & reput_skipped_at(lost, mphy, segment_size, gaps, master)
    if skipped.any():
        kept = known.copy()
        kept[missing] = False
        skipped &= ~is_member(mphy, np.sort(kphy[kept]))
    return skipped


def missing_key_findings(mphy: np.ndarray, mhash: np.ndarray, real: np.ndarray, skipped: np.ndarray,
                         first_begin: int, segment_size: int, out: Capped) -> None:
    """The keys missing for good, in key order: each ``real`` one an index_key_missing; those a master's reput
    ``skipped`` one warning per commitlog segment, where its first one is (the same whichever path counts
    them, a segment's keys at a time or all at once)."""
    S = segment_size
    sk = np.flatnonzero(skipped)
    heads: dict[int, tuple[int, int]] = {}
    if len(sk):
        _segs, first, keys = np.unique(mphy[sk] // S, return_index=True, return_counts=True)
        msgs = np.unique(np.unique(mphy[sk]) // S, return_counts=True)[1]
        heads = {int(sk[f]): (int(k), int(m)) for f, k, m in zip(first, keys, msgs)}
    for j in np.sort(np.r_[np.flatnonzero(real), np.fromiter(heads, np.int64, len(heads))]).tolist():
        if j in heads:
            out.add(reput_skipped_finding(int(mphy[j]), *heads[j], S))
        else:
            out.add(key_missing_finding(int(mphy[j]), int(mhash[j]), first_begin, S))


def reput_skipped_finding(p: int, keys: int, messages: int, segment_size: int) -> Finding:
    """``keys`` keys of ``messages`` messages from the one at ``p`` that a master's reput skipped: after a
    record it cannot decode (size <= 0) DefaultMessageStore.doReput adds the rest of its buffer to
    reputFromOffset (4.9.8 and 5.3.3), so neither the consume queue nor the index dispatcher gets them."""
    S = segment_size
    return Finding("index_reput_skipped", "warning", f"{_KEY_SEGMENT}{p // S * S:020d}", p % S,
                   f"{keys} key(s) of {messages} message(s) from the one at {p} are in no index file; {SKIP_WHY}, "
                   "so the broker never indexes them (a query by key cannot find them)",
                   {"phy": p, "count": keys, "messages": messages})


def split_missing(mphy: np.ndarray, explained: np.ndarray, max_end_phy: int, live: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Keys no index file holds, by their messages' positions: (not indexed yet: after the last indexed
    message, missing for good); ``explained`` ones (lost data, expiry, an entry with the wrong hash) neither.
    ``live``: a live store's cut can fall between two keys of one record (IndexService.buildIndex puts them
    one by one), so the last indexed message's other keys are not indexed yet either."""
    behind = ~explained & ((mphy >= max_end_phy) if live else (mphy > max_end_phy))
    return behind, ~explained & ~behind


_KEY_SEGMENT = "commitlog/"  # an index_key_missing finding's file: its record's segment, commitlog/<base>


def key_missing_finding(p: int, key_hash: int, first_begin: int, segment_size: int) -> Finding:
    """A key of the message at ``p`` that no index file finds (a warning before the oldest file's range),
    filed under its record's commitlog segment (so the summary of those past the cap names it too)."""
    S = segment_size
    sev = "warning" if p < first_begin else "error"
    return Finding("index_key_missing", sev, f"{_KEY_SEGMENT}{p // S * S:020d}", p % S,
                   f"a key of the message at {p} (hash {key_hash}) is not findable through any index file",
                   {"phy": p, "key_hash": key_hash})


def key_missing_segment(file: str | None) -> int | None:
    """The base of the commitlog segment an index_key_missing finding's ``file`` names (None: not one)."""
    name = file[len(_KEY_SEGMENT):] if file and file.startswith(_KEY_SEGMENT) else ""
    return int(name) if name.isdigit() else None


def abnormal_start_note(info: dict, out: Capped, name: str, h: IndexHeader, idx_ts: int | None, abort: bool) -> None:
    """A file whose endTimestamp is after the checkpoint's indexMsgTimestamp: an abnormal start deletes it."""
    if idx_ts is not None and h.end_timestamp > idx_ts:
        info.setdefault("deleted_on_abnormal_start", []).append(name)
        out.add(Finding("index_deleted_on_abnormal_start", "info", f"index/{name}", 8,
                        f"endTimestamp {h.end_timestamp} > checkpoint indexMsgTimestamp {idx_ts}: "
                        + ("the abort file is present, so the next start deletes this file and re-indexes only "
                           "from the recovery start segment" if abort else
                           "an abnormal start (abort file) would delete this file"),
                        {"end_timestamp": h.end_timestamp, "index_msg_timestamp": idx_ts}))


def entries_against_records(log: LogView, k_: KeyCodes, ent: np.ndarray, g: IndexGeometry, display: str, out: Capped,
                             all_codes: list[np.ndarray], wrong_phy: list[np.ndarray]) -> np.ndarray:
    """Each entry of a file that is not the log's next keys looked up: the record it points at and whether
    its hash is one of that record's keys'. Returns the entries whose hash is wrong (0-based)."""
    e_phy = ent["phy_offset"].astype(np.int64)
    e_kh = ent["key_hash"].astype(np.int64)
    rows = lookup_repeats(log, e_phy)
    found = rows >= 0
    if len(k_.rank):
        codes = np.where(found, (k_.rank[np.clip(rows, 0, None)] << 31) | np.clip(e_kh, 0, None), -2)
    else:  # no record at all (every segment gone): no entry can point at one
        codes = np.full(len(rows), -2, dtype=np.int64)
    cs = np.sort(codes[found])
    all_codes.append(cs)
    if run_of(cs, k_.kpos):  # every entry's code is a key's code: nothing to look up one by one
        wrong = np.zeros(0, np.int64)
    else:
        wrong = np.flatnonzero(found & ~is_member(codes, k_.kcode_sorted))
    wrong_phy.append(e_phy[wrong])
    miss = np.flatnonzero(~found)
    mp = e_phy[miss]
    expired = mp < log.log_min
    lost = log.in_lost(mp)
    past = (mp >= log.log_end) & ~lost
    for k in miss[~(expired | lost | past)].tolist():
        out.add(Finding("index_entry_bad_offset", "error", display, g.entry_pos(int(k + 1)),
                        f"entry {int(k + 1)}: phyOffset {int(e_phy[k])} is not the start of a record",
                        {"entry": int(k + 1), "phy": int(e_phy[k])}))
    if past.any():
        k0 = int(miss[past][0])
        # the broker's recovery truncates the commitlog and the consume queues but never an index
        # file (IndexService.load keeps every entry after a clean exit; 4.9.8 and 5.3.3): such
        # entries are what a recovered store holds, so they are graded as the broker lives with them
        out.add(Finding("index_entry_past_commitlog", "warning", display, g.entry_pos(int(k0 + 1)),
                        f"{int(past.sum())} entries point past the end of the commitlog data ({log.log_end}): "
                        "the broker keeps them (its recovery never truncates index files); once new messages "
                        "are written there, a query by key may return them and the client drops those whose "
                        "key does not match; `rmqstore rebuild --what index` writes an index without them",
                        {"count": int(past.sum())}))
    for k in wrong.tolist():
        out.add(Finding("index_entry_wrong_hash", "error", display, g.entry_pos(int(k + 1)),
                        f"entry {int(k + 1)}: keyHash {int(e_kh[k])} is not the hash of any key of the record at "
                        f"{int(e_phy[k])}; a query for the real key cannot find it (slot chains disagree as a "
                        "consequence)", {"entry": int(k + 1), "phy": int(e_phy[k]), "key_hash": int(e_kh[k])}))
    return wrong


def check_chains(ent: np.ndarray, g: IndexGeometry, display: str, out: Capped, chunk: int = 1 << 17) -> None:
    """Every entry's prevIndex is the previous entry of its slot (0 for a slot's first).

    Entries are taken ``chunk`` at a time in entry order with the newest entry of each slot so far carried
    between chunks (one int32 per slot), so the memory is the slot tables and a chunk, not the file. A
    file whose chains hold is proved so without sorting (:func:`proven_chains`: a few gathers and scatters
    per chunk, ~7x less than sorting it); any other is checked by :func:`broken_chains`, which says
    which entries are off."""
    if proven_chains(ent, g.hash_slot_num, chunk) is None:
        broken_chains(ent, g, display, out, chunk)


def proven_chains(ent: np.ndarray, N: int, chunk: int = 1 << 17) -> ProvenChains | None:
    """Do all chains hold? Per chunk, with ``newest`` the newest entry of each slot before it: every link
    into the chunk goes to an earlier entry of the same slot, and no entry is linked to twice; every
    other link is its slot's ``newest``, and at most one per slot. Then, slot by slot, the chunk's first
    entry links to ``newest`` (it has no earlier one in the chunk) and, that link being taken, the second
    can only link to the first, the third to the second, and so on: each link is the previous entry.

    When they hold, what the proof read settles the rest of :meth:`IndexFile.validate`'s entry checks
    (:class:`storelib.format.indexfile.ProvenChains`); None when they do not."""
    newest = np.zeros(N + 1, np.int32)  # per slot (N: negative hashes)
    stamp = np.zeros(N + 1, np.int32)  # per slot, an entry number (unique: no reset between chunks)
    negatives, first_negative = 0, -1
    for lo in range(0, len(ent), chunk):
        part = ent[lo:lo + chunk]
        m = len(part)
        kh = part["key_hash"].astype(np.int64)
        slot = kh % N
        neg = np.flatnonzero(kh < 0)
        if len(neg):
            slot[neg] = N
            first_negative = lo + int(neg[0]) if first_negative < 0 else first_negative
            negatives += len(neg)
        p = part["prev_index"].astype(np.int64)
        inside = p > lo
        li = np.flatnonzero(inside)  # entries linked to one of this chunk (local indexes)
        pt = p[li] - (lo + 1)  # ... and the entry each is linked to
        if np.any(pt >= li) or np.any(slot[pt] != slot[li]):
            return None
        local = np.zeros(m, np.int32)
        local[pt] = li + 1
        if np.any(local[pt] != li + 1):  # an entry linked to twice
            return None
        lx = np.flatnonzero(~inside)
        so = slot[lx]
        if np.any(p[lx] != newest[so]):
            return None
        num = (lx + (lo + 1)).astype(np.int32)
        stamp[so] = num
        if np.any(stamp[so] != num):  # two links to the same slot's newest
            return None
        tail = np.ones(m, bool)  # a slot's last entry in the chunk: linked to by none
        tail[pt] = False
        ti = np.flatnonzero(tail)
        newest[slot[ti]] = ti + (lo + 1)
    return ProvenChains(newest, negatives, first_negative)


def broken_chains(ent: np.ndarray, g: IndexGeometry, display: str, out: Capped, chunk: int = 1 << 17) -> None:
    """The chains entry by entry (sorted by slot a chunk at a time): how many entries are off, and the
    first one a sort of all entries by (slot, entry number) meets."""
    N = g.hash_slot_num
    newest = np.zeros(N + 1, np.int32)  # per slot (N: negative hashes), the newest entry number so far
    broken = 0
    first: int | None = None  # (slot << 32 | entry number) of the first broken entry in (slot, n) order
    for lo in range(0, len(ent), chunk):
        part = ent[lo:lo + chunk]
        kh = part["key_hash"].astype(np.int64)
        slot = kh % N
        slot[kh < 0] = -1
        # (slot << 32 | entry number), sorted: the chunk's entries grouped by slot, in entry order
        sk = slot << 32
        sk |= np.arange(lo + 1, lo + 1 + len(part), dtype=np.int64)
        sk.sort()
        n_s = sk & 0xFFFFFFFF
        s_s = sk >> 32
        head = np.empty(len(sk), bool)
        head[0] = True
        np.not_equal(s_s[1:], s_s[:-1], out=head[1:])
        exp_prev = np.empty_like(n_s)
        exp_prev[1:] = n_s[:-1]
        exp_prev[head] = newest[s_s[head]]  # a slot's first entry in the chunk: the carried newest (slot -1: N)
        got = part["prev_index"].astype(np.int64)[n_s - 1 - lo]
        bad = np.flatnonzero(exp_prev != got)
        if len(bad):
            broken += len(bad)
            first = int(sk[bad[0]]) if first is None else min(first, int(sk[bad[0]]))
        tail = np.empty(len(sk), bool)
        tail[-1] = True
        np.not_equal(s_s[1:], s_s[:-1], out=tail[:-1])
        newest[s_s[tail]] = n_s[tail]
    if broken:
        n0 = first & 0xFFFFFFFF
        out.add(Finding("index_chain_broken", "error", display, g.entry_pos(n0) + 16,
                        f"{broken} entries whose prevIndex is not the previous entry of their slot (first: "
                        f"entry {n0}); entries off the chain cannot be found by queries",
                        {"count": broken}))
