"""Reading commands against a DLedger-mode store a broker-like writer PROCESS is writing (tests/livewriter.py,
its DLedger mode): entries copied in with their index units after them (one entry paused halfway), the
committed index trailing the ledger end and the reput trailing it, DLedger's checkpoint rewritten the way
IOUtils.string2File does (a moment without the file), DLedger's cleaner deleting the oldest data file and the
index files below the ledger's begin. Audits (full and --since alternating) must be clean and say the store is
live; incremental exports must hold each written message exactly once, those whose data file went included."""

from __future__ import annotations

import collections
import os

import pyarrow.dataset as ds

from jobs.audit import audit_store
from jobs.reports.audit_summary import exit_code
from tests.livewriter import LiveConfig, LiveWriter, exports_while_writing, journal, settings_overrides

WARN = {"warning", "error", "critical"}


def _cfg(tmp_path, version="4", **kw) -> LiveConfig:
    base = dict(root=str(tmp_path / "store"), version=version, seconds=6.0, rate=1000, body_max=3000,
                segment_size=128 << 10, keep_segments=4, clean_ms=1000, pause_at_s=1.2, pause_ms=250,
                cq_units=1000, index_slots=200, index_num=800, timer_ms=1000, dledger=True,
                dledger_checkpoint_ms=700, dledger_index_file_size=32 * 128)
    base.update(kw)
    return LiveConfig(**base)


def test_audits_of_a_dledger_store_being_written_are_clean_and_say_it_is_live(tmp_path):
    cfg = _cfg(tmp_path)
    state = str(tmp_path / "audit.state")
    runs = []
    with LiveWriter(cfg) as w:
        i = 0
        while w.running() or i < 2:
            rep = audit_store(cfg.root, overrides=settings_overrides(cfg), quiet=True, since=state if i % 2 else None)
            runs.append((w.pid, rep))
            i += 1
        summary = w.wait()
    live = [(pid, r) for pid, r in runs if r["live"]["live"]]
    assert len(live) >= 2, "the audits did not overlap the writer"
    kinds = collections.Counter()
    for pid, r in live:
        bad = [(f["kind"], f["severity"], f["file"], f["detail"][:160]) for f in r["findings"] if f["severity"] in WARN]
        assert not bad and exit_code(r, "warning") == 0, bad
        assert r["live"]["pid"] == pid and r["live"]["cut_offset"] is not None
        assert r["dledger"]["data_end"] <= r["live"]["cut_offset"]
        kinds.update(f["kind"] for f in r["findings"])
    assert kinds["broker_running"] == kinds["abort_present"] == kinds["index_deleted_at_startup"] == 0
    assert summary["done"]["deleted_segments"] >= 2  # DLedger's cleaner ran during the audits
    assert any(n.isdigit() for n in os.listdir(tmp_path / "store" / "dledger-n0" / "index"))
    assert min(int(n) for n in os.listdir(tmp_path / "store" / "dledger-n0" / "index")) > 0  # index files went too
    # the store at rest (the writer killed: abort left) is judged as a crash: not live, the start-up's deletion said
    rest = audit_store(cfg.root, overrides=settings_overrides(cfg), quiet=True)
    assert not rest["live"]["live"] and any(f["kind"] == "abort_present" for f in rest["findings"])


def test_incremental_exports_of_a_live_dledger_store_hold_every_message_once(tmp_path):
    # the cleaner keeps about 3 s of traffic (a run under load takes seconds), deleting one file a second
    cfg = _cfg(tmp_path, seconds=8.0, rate=500, clean_ms=1000, keep_segments=12)
    snap = str(tmp_path / "snap")
    runs = exports_while_writing(cfg, snap)
    assert sum(1 for m in runs if m["live"]["live"]) >= 3
    want = [j["phy"] for j in journal(cfg)]
    t = ds.dataset(snap, format="parquet", partitioning="hive").to_table(columns=["phy_offset", "dledger_index"])
    got = collections.Counter(t.column("phy_offset").to_pylist())
    assert sorted(got) == sorted(want) and max(got.values()) == 1
    # the ledger's indexes, one per entry, none missing, none twice
    assert sorted(t.column("dledger_index").to_pylist()) == list(range(len(want)))
    first_now = min(int(n) for n in os.listdir(tmp_path / "store" / "dledger-n0" / "data"))
    expired = [p for p in want if p < first_now]
    assert expired and all(got[p] == 1 for p in expired)  # the archive kept what DLedger's cleaner deleted


def test_an_incremental_export_goes_on_after_dledgers_cleaner_deleted_the_first_data_files(tmp_path):
    # the carried data files' DLedger facts are in the manifest: the ledger's begin is read from the new first
    # file's, so the next run's walk reaches the same end as a fresh export (not the first file's start)
    from jobs.export import ExportConfig, export
    from storelib.broker.settings.brokerconf import BrokerSettings
    from storelib.generator.dledgergen import DLedgerGen
    from storelib.generator.gen import GenConfig, generate

    root = tmp_path / "store"
    sets = {"mappedFileSizeCommitLog": 64 << 10}
    generate(root, GenConfig(messages=1500, seed=7), BrokerSettings.defaults("4").with_overrides(sets),
             dledger=DLedgerGen())
    first = export(ExportConfig(store=str(root), out=str(tmp_path / "snap"), overrides=sets, engine="local",
                                incremental=True, progress=False))
    data = root / "dledger-n0" / "data"
    for n in sorted(os.listdir(data))[:2]:
        os.unlink(data / n)
    again = export(ExportConfig(store=str(root), out=str(tmp_path / "snap"), overrides=sets, engine="local",
                                incremental=True, progress=False))
    fresh = export(ExportConfig(store=str(root), out=str(tmp_path / "fresh"), overrides=sets, engine="local",
                                progress=False))
    assert again["process_offset"] == fresh["process_offset"] == first["process_offset"] and not again["skipped"]
    assert all("dledger_facts" in s["end"] for s in again["segments"].values())
