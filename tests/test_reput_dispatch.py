"""The in-process reput (dispatch_store: rebuild --incremental, the StoreWriter) follows the one model of
4.9.8's doReput (storelib.broker.recovery.reputpath) around a length mismatch; the reput reads records with
checkMessageAndReturnSize(buf, false, false) (readBody=false: the body skipped by position, so a BODYLENGTH
past TOTALSIZE is a length mismatch there and -1 to recovery); its getData buffer ends at the read position,
so a record a drifted read finds running across processOffset fails (-1) instead of being dispatched."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.recovery.walk import RecoveryInputs, recovery_walk
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.store import Store
from storelib.format.record import check_record
from tests.conftest import run_cli
from tests.rebuild_storegen import CraftedStore, msg
from tests.test_totalsize_mismatch import S, _blank_at, _cq_phys, _seg, _set_total, _spans
from tests.test_totalsize_mismatch import five_segments as _five


def _tree(root: Path, sub: str) -> dict[str, bytes]:
    d = root / sub
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _full_rebuild(capsys, root, out) -> None:
    rc, _, err = run_cli(capsys, "rebuild", root, "--out", out, "--engine", "local", "--broker-version", "4",
                         "--set", f"mappedFileSizeCommitLog={S}", "--quiet")
    assert rc == 0, err


def _settings(**kw) -> BrokerSettings:
    return BrokerSettings.defaults("4").with_overrides({"mappedFileSizeCommitLog": S, **kw})


@pytest.mark.parametrize("case", ["plus_one", "past_end", "minus_one_landing"])
def test_dispatch_store_follows_the_4x_reput_around_a_mismatch_as_a_full_rebuild_does(tmp_path, capsys, case):
    cs = _five()
    bad = _seg(cs, 0)[2]
    if case == "plus_one":
        _set_total(cs, bad, bad.size + 1)
    elif case == "past_end":
        _set_total(cs, bad, S - bad.file_offset + 100)
    else:  # a -1 after it: a master lands sum(TOTALSIZE) past the file's end, on a record of segment 1
        _set_total(cs, bad, bad.size + 1)
        cs.corrupt(_seg(cs, 0)[5].phy, 5)
    root = Path(cs.write(tmp_path / "store"))
    full = tmp_path / "full"
    _full_rebuild(capsys, root, full)
    d = dispatch_store(root, _settings(), out_root=tmp_path / "disp")
    assert not d.unsupported
    assert [f.offset for f in d.findings if f.kind == "reput_length_mismatch"] == [bad.file_offset]
    assert _tree(tmp_path / "disp", "consumequeue") == _tree(full, "consumequeue")
    assert _tree(tmp_path / "disp", "index") == _tree(full, "index")
    # what the broker's reput dispatches (the walk's ranges): not the mismatched record, and in each case
    # some of the records after it are never dispatched
    r = recovery_walk(Store(root, _settings()), RecoveryInputs.from_settings(_settings(), cq_max_phy_offset=-1))
    want = sorted(p.phy for p in cs.placed if any(x.base + x.start <= p.phy < x.base + x.end for x in r.dispatch))
    assert _cq_phys(tmp_path / "disp") == want and bad.phy not in want
    assert d.end_offset == r.process_offset


def test_incremental_rebuild_equals_the_full_rebuild_on_a_4x_mismatch(tmp_path, capsys):
    cs = _five()
    bad = _seg(cs, 0)[2]
    _set_total(cs, bad, S - bad.file_offset + 100)  # the drift skips segment 1 at the blank
    root = Path(cs.write(tmp_path / "store"))
    full = tmp_path / "full"
    _full_rebuild(capsys, root, full)
    inc = tmp_path / "inc"
    rc, _, err = run_cli(capsys, "rebuild", root, "--out", inc, "--incremental", "--broker-version", "4",
                         "--set", f"mappedFileSizeCommitLog={S}", "--quiet")
    assert rc == 0, err
    assert _tree(inc, "consumequeue") == _tree(full, "consumequeue")
    assert _tree(inc, "index") == _tree(full, "index")
    assert bad.phy not in _cq_phys(inc) and not set(p.phy for p in _seg(cs, 1)) & set(_cq_phys(inc))


def _body_past_total(cs: CraftedStore, p) -> int:
    """Make ``p``'s BODYLENGTH larger than its TOTALSIZE, the bytes where the skipped body ends reading as an
    empty topic and no properties: the fields add up to more than TOTALSIZE. Returns calMsgLength."""
    seg = cs.segments[p.segment]
    blen = p.size + 40
    at = p.file_offset + cs.body_pos(p)
    seg[at - 4:at] = struct.pack(">i", blen)
    seg[at + blen:at + blen + 3] = b"\x00\x00\x00"  # topic length 0, properties length 0
    return cs.body_pos(p) + blen + 3


def test_a_bodylength_past_totalsize_is_a_mismatch_to_the_reput_and_minus_one_to_recovery(tmp_path):
    cs = _five()
    bad = _seg(cs, 0)[2]
    L = _body_past_total(cs, bad)
    buf = bytes(cs.segments[0])
    rec = check_record(buf, bad.file_offset, check_crc=True, line="4")
    assert (rec.kind, rec.size) == ("invalid", -1) and "BODYLENGTH" in rec.reason
    reput = check_record(buf, bad.file_offset, check_crc=False, line="4", read_body=False)
    assert (reput.kind, reput.size, reput.read_length) == ("invalid", bad.size, L)
    root = Path(cs.write(tmp_path / "store"))
    # 4.9.8 normal: segment 0 lies before the window: the reput reads it and drifts
    r = recovery_walk(Store(root, _settings()), RecoveryInputs.from_settings(_settings(), cq_max_phy_offset=-1))
    f = [x for x in r.findings if x.kind == "reput_length_mismatch"]
    assert [(x.offset, x.extra["total_size"], x.extra["read_length"]) for x in f] == [(bad.file_offset, bad.size, L)]
    assert _spans(r)[0] == (0, 0, bad.file_offset)
    d = dispatch_store(root, _settings(), out_root=tmp_path / "disp")
    assert [(x.offset, x.extra["read_length"]) for x in d.findings if x.kind == "reput_length_mismatch"] == [
        (bad.file_offset, L)]
    # in the window (abnormal: every segment), recovery reads the body: -1, the truncation point
    cs2 = _five()
    bad2 = _seg(cs2, 3)[1]
    _body_past_total(cs2, bad2)
    store2 = Store(cs2.write(tmp_path / "s2"), _settings())
    r2 = recovery_walk(store2, RecoveryInputs.from_settings(_settings(), cq_max_phy_offset=-1))
    assert r2.process_offset == bad2.phy and r2.failure.reason == "parse_error" and r2.failure.size is None


def test_a_record_a_drifted_reput_finds_across_processoffset_is_not_dispatched(tmp_path, capsys):
    """A drift lands inside the last record's body, on a record image whose body runs past processOffset: the
    getData buffer ends at processOffset, so the check fails there (-1) and nothing of it is dispatched."""
    cs = _five()
    seg1 = _seg(cs, 1)
    # the last record, in segment 4: its body holds a record header whose body crosses the record's end
    proto = msg("T", 0, body=b"x" * 300, keys="last")
    size = cs.append(proto).size  # the one written now is overwritten below: same layout, same size
    last = cs.placed.pop()
    cs.pos -= size
    P = last.file_offset + size  # processOffset in segment 4
    o = last.file_offset + cs.body_pos(last) + 10  # where the image starts (file offset)
    blen = P + 20 - (o + 88)  # its body runs 20 bytes past processOffset
    head = struct.pack(">iiiiiqqiq", 88 + blen + 3, -626843481, 0, 1, 0, 7, 0, 0, 1) + bytes(8)
    head += struct.pack(">q", 1) + bytes(8) + struct.pack(">iqi", 0, 0, blen)
    body = b"x" * 10 + head + b"x" * (300 - 10 - len(head))
    p_last = cs.append(msg("T", 0, body=body, keys="last"))
    assert (p_last.file_offset, p_last.size) == (last.file_offset, size)
    # a mismatch in segment 1, then a -1: the master lands sum(TOTALSIZE) after segment 1, at the image
    bad, broken = seg1[2], seg1[5]
    _set_total(cs, bad, 4 * S + o - 2 * S)
    cs.corrupt(broken.phy, 5)
    root = Path(cs.write(tmp_path / "store"))
    r = recovery_walk(Store(root, _settings()), RecoveryInputs.from_settings(_settings(), cq_max_phy_offset=-1))
    assert r.process_offset == 4 * S + P
    drift = [f for f in r.findings if f.kind == "reput_drift_skip"]
    assert [f.extra["next"] for f in drift] == [4 * S + o]
    assert not [x for x in r.dispatch if x.base == 4 * S]  # the image is not read as a record
    assert _spans(r)[-1] == (S, bad.file_offset + bad.size, broken.file_offset)
    d = dispatch_store(root, _settings(), out_root=tmp_path / "disp")
    assert 4 * S + o not in _cq_phys(tmp_path / "disp", qids=(0, 1, 2)) and d.end_offset == 4 * S + P
    full = tmp_path / "full"
    _full_rebuild(capsys, root, full)
    assert _tree(tmp_path / "disp", "consumequeue") == _tree(full, "consumequeue")
    assert _blank_at(cs, 0) > 0
