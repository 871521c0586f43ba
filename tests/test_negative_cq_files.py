"""Consume-queue files with negative names: a record whose QUEUEOFFSET is negative starts its queue in a file
named by UtilAll.offset2FileName (a minus sign before 20 digits). The broker's load maps it (MappedFileQueue.doLoad
sorts by name, MappedFile.init parses it with Long.parseLong); our readers list it too, in that order, so the
rebuild's output audits clean and info, lookups and the data source see its units."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from datasources.consumequeue_source import read_consumequeue
from jobs.audit import audit_store
from jobs.cli import main
from storelib.broker.index.lookup import lookup_queue
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.broker.settings.cqload import LoadedQueue
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeinfo import collect
from storelib.broker.settings.strayload import LOAD_FAILS, STRAY_LOADED, judge_queue
from storelib.broker.writer.writer import StoreWriter
from storelib.errors import StoreError
from storelib.format import consumequeue as cqfile
from storelib.format.consumequeue import parse_file_name
from storelib.format.record import Message

from .test_audit_partitioned import NOW, _same

SMALL = {"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 200}


def _rebuilt_store(root: Path, version: str, first_qo: int) -> tuple[Path, list[int]]:
    """Six messages over queues T/0 and T/1, the first one's QUEUEOFFSET patched to ``first_qo`` (negative),
    the consume queues rebuilt by ``rmqstore rebuild --in-place`` (as the broker's dispatch writes them)."""
    s = BrokerSettings.defaults(version).with_overrides(SMALL)
    with StoreWriter(root, s, clock=lambda: 1_700_000_000_000) as w:
        res = [w.append(Message("T", b"x" * 100, i % 2)) for i in range(6)]
        w.close(clean=True, dispatch=False)
    (root / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in SMALL.items()))
    seg = root / "commitlog" / f"{0:020d}"
    b = bytearray(seg.read_bytes())
    b[res[0].phy_offset + 20:res[0].phy_offset + 28] = struct.pack(">q", first_qo)
    seg.write_bytes(bytes(b))
    assert main(["rebuild", str(root), "--in-place", "--broker-conf", str(root / "broker.conf"),
                 "--broker-version", version, "--quiet"]) == 0
    return root, [r.phy_offset for r in res]


def _serious(rep: dict) -> list[tuple[str, str | None]]:
    return [(f["kind"], f["file"]) for f in rep["findings"] if f["severity"] in ("warning", "error", "critical")]


# QUEUEOFFSET -(2^56): its file starts above it (Java's remainder rounds toward 0), the record is dropped as a
# repeat and the next ones follow a filler; -(2^56) rounded to a file start: the record is the file's first unit
DROPPED = -(1 << 56)
FIRST = -(1 << 56) // 10 * 10


@pytest.mark.parametrize("version", ["4", "5"])
@pytest.mark.parametrize("first_qo", [DROPPED, FIRST])
def test_rebuilt_store_with_negative_queue_offset_audits_without_false_missing_entries(tmp_path, monkeypatch,
                                                                                     version, first_qo):
    """The audit reads the negative-named file the rebuild wrote: no stray_segment_loaded, no missing entries,
    no mismatch; only the QUEUEOFFSET jump the broker logs; the partitioned audit says the same."""
    root, _phy = _rebuilt_store(tmp_path / "s", version, first_qo)
    (name,) = [p.name for p in (root / "consumequeue" / "T" / "0").iterdir()]
    assert name.startswith("-") and len(name) == 21
    rep = audit_store(str(root), broker_conf=str(root / "broker.conf"), version=version, quiet=True, now_ms=NOW)
    assert _serious(rep) == [("queue_offset_gap", f"commitlog/{0:020d}")]
    _ref, parted = _same(root, monkeypatch, broker_conf=str(root / "broker.conf"), version=version)
    assert _serious(parted) == _serious(rep)


def test_info_lookup_and_data_source_see_the_negative_file_units(tmp_path):
    """4.9.8 serves the queue from the negative file's first unit (correctMinOffset) to its end; the data
    source lists those units at their negative offsets; a lookup gets the file's first unit, and null for the
    others (getIndexBuffer's (int) (offset % mappedFileSize) is negative there)."""
    root, phy = _rebuilt_store(tmp_path / "s", "4", FIRST)
    store = Store(str(root), broker_conf=str(root / "broker.conf"))
    (q0,) = [q for q in collect(store, scan=False)["queues"] if q["topic"] == "T" and q["queue_id"] == 0]
    assert (q0["cq_min_offset"], q0["cq_max_offset"]) == (FIRST, FIRST + 3)
    t = read_consumequeue(str(root), brokerConf=str(root / "broker.conf"), brokerVersion="4").to_pydict()
    got = [(o, p) for o, p, q in zip(t["queue_offset"], t["phy_offset"], t["queue_id"]) if q == 0]
    assert got == [(FIRST, phy[0]), (FIRST + 1, phy[2]), (FIRST + 2, phy[4])]
    assert lookup_queue(store, "T", 0, FIRST) == phy[0]
    with pytest.raises(StoreError) as e:
        lookup_queue(store, "T", 0, FIRST + 1)
    assert e.value.kind == "offset_found_null"


def test_5x_negative_queue_serves_nothing_its_min_stays_0(tmp_path):
    """5.3.3's correctMinOffset returns at once when the min (0 at start) is at or past the max, which the
    negative file puts below 0: the queue's min stays 0."""
    root, _phy = _rebuilt_store(tmp_path / "s", "5", DROPPED)
    store = Store(str(root), BrokerSettings.defaults("5").with_overrides(SMALL))
    (q0,) = [q for q in collect(store, scan=False)["queues"] if q["topic"] == "T" and q["queue_id"] == 0]
    base = -(-DROPPED * 20 // 200 * 200) // 20  # the file's start, as a queue offset
    assert (q0["cq_min_offset"], q0["cq_max_offset"]) == (0, base + 3)


# --- the listing: the names the broker writes and maps, in doLoad's order ----------------------------------


def test_parse_file_name_takes_offset2filename_negative_names_and_no_other_signed_name():
    """A minus sign and 20 digits (offset2FileName of a negative offset, down to Long.MIN_VALUE) is a
    segment; a name offset2FileName never writes, or Long.parseLong cannot read, is not."""
    assert parse_file_name("-00000000000000000200") == -200
    assert parse_file_name("-09223372036854775808") == -(2**63)  # offset2FileName(Long.MIN_VALUE)
    for name in ("-09223372036854775809",  # below Long.MIN_VALUE: Long.parseLong throws
                 "-00000000000000000000",  # offset2FileName(0) has no sign
                 "-0000000000000000200", "--0000000000000000200", "+00000000000000000200", "-0000000000000000020a"):
        assert parse_file_name(name) is None, name


def test_listing_follows_doload_name_order_negative_names_first_nearest_zero_first():
    """Comparator.comparing(File::getName): '-' sorts before digits, so negative files come first, and by
    their digits: the one nearest 0 first (the reverse of their offsets); other names are left out."""
    names = ["00000000000000000200", "-00000000000000000400", "x", "00000000000000000000", "-00000000000000000200",
             "+00000000000000000400"]
    assert cqfile.list_segment_names(names) == [("-00000000000000000200", -200), ("-00000000000000000400", -400),
                                         ("00000000000000000000", 0), ("00000000000000000200", 200)]


def test_queue_reads_negative_files_in_load_order_and_names_the_unreachable_one(tmp_path):
    """Two negative files (a queue that filled its first one): the broker maps them nearest-zero first, so
    the lower one lies below the first mapped file, where findMappedFileByOffset finds nothing; the reader keeps
    that order, names that file (no gap nor overlap: by offset the files run on), and still finds every unit by
    offset. A right-sized file with another name Long.parseLong takes stays the stray the broker maps beyond
    this model; one it cannot parse fails the load."""
    d = tmp_path / "q"
    d.mkdir()
    units = np.zeros(10, [("phy_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
    for base in (-400, -200, 0):
        units["phy_offset"] = np.arange(10) + 1000 + base
        units["size"] = 50
        (d / (f"{base:020d}" if base >= 0 else f"-{-base:020d}")).write_bytes(units.tobytes())
    for stray in ("+00000000000000000200", "-00000000000000000000", "-09223372036854775809"):
        (d / stray).write_bytes(units.tobytes())
    cq = LoadedQueue(d, segment_size=200)
    assert [s.base for s in cq.segments] == [-200, -400, 0]
    assert [s.base for s in cq.by_offset()] == [-400, -200, 0]
    assert cq.entry(-20)[0] == 1000 - 400 and cq.entry(-1)[0] == 1009 - 200 and cq.entry(0)[0] == 1000
    assert [(first, len(u)) for first, u in cq.entries()] == [(-20, 10), (-10, 10), (0, 10)]
    assert [(f.kind, f.file.rsplit("/", 1)[-1]) for f in cq.findings if f.severity == "error"] == [
        ("negative_file_unreachable", "-00000000000000000400")]
    judge_queue(cq, "4")
    strays = {f.file.rsplit("/", 1)[-1]: f.kind for f in cq.findings if f.kind in (LOAD_FAILS, STRAY_LOADED)}
    assert strays == {"+00000000000000000200": STRAY_LOADED, "-00000000000000000000": STRAY_LOADED,
                      "-09223372036854775809": LOAD_FAILS}
