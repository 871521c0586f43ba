"""Stores on remote filesystems: the same results from s3:// (a real loopback S3 server) as from the local path.

The S3 server is moto's standalone server (``tests/s3server.py``), started once per session. Stores are
uploaded with ``pyarrow.fs.copy_files``; every command is run in-process through ``jobs.cli.main``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pytest

from jobs.cli import main as cli_main
from storelib.broker.settings.store import Store
from storelib.errors import StoreError
from storelib.fileio.bytesource import (
    READ_AHEAD_RESERVE,
    ArrowFileSource,
    Location,
    filesystem_options,
    open_source,
    resolve,
)
from storelib.scan.scanner import SegmentScan
from tests.conftest import broker_conf

# ------------------------------------------------------------------------------------------------
# helpers and fixtures


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def _gen_store(dest: Path) -> tuple[Path, Path] | None:
    """A small generated 5.x store with 1 MiB segments (storelib.generator.gen), plus its broker.conf."""
    try:
        import dataclasses

        from storelib.broker.settings.brokerconf import BrokerSettings
        from storelib.generator.gen import generate
        from storelib.generator.genplan import GenConfig
    except ImportError:
        return None
    # small segments and index files: several segments per store, and no 400 MB sparse index to upload
    settings = dataclasses.replace(BrokerSettings.defaults("5"), mapped_file_size_commit_log=1 << 20,
                                   max_hash_slot_num=4096, max_index_num=16384,
                                   mapped_file_size_consume_queue_config=20 * 2000)
    generate(dest / "store", GenConfig(messages=4000, version="5", seed=11), settings)
    conf = dest / "broker.conf"
    conf.write_text("mappedFileSizeCommitLog=1048576\nmaxHashSlotNum=4096\nmaxIndexNum=16384\nmappedFileSizeConsumeQueue=40000\n")
    return dest / "store", conf


@pytest.fixture(scope="session")
def stores(s3_server, sample_498, sample_533, tmp_path_factory) -> dict[str, dict]:
    """name -> {local, uri, conf}: both shared samples and a generated store, each also on S3."""
    bucket = s3_server.new_bucket("stores")
    out = {
        "4.9.8": {"local": sample_498 / "store", "conf": broker_conf("4.9.8")},
        "5.3.3": {"local": sample_533 / "store", "conf": broker_conf("5.3.3")},
    }
    gen = _gen_store(tmp_path_factory.mktemp("gen"))
    if gen is not None:
        out["generated"] = {"local": gen[0], "conf": gen[1]}
    for name, d in out.items():
        d["uri"] = s3_server.upload(d["local"], f"{bucket}/dumps/{name}/store")
    return out


STORE_NAMES = ["4.9.8", "5.3.3", "generated"]


@pytest.fixture(params=STORE_NAMES)
def store_pair(request, stores) -> dict:
    if request.param not in stores:
        pytest.skip("storelib.generator.gen not available")
    return stores[request.param]


def _normalise(obj, roots: list[str]):
    """Drop what legitimately differs between a local and an S3 copy (root path, mtimes, lock probe)."""
    if isinstance(obj, dict):
        return {k: _normalise(v, roots) for k, v in obj.items() if k not in ("store", "local", "mtime_ms", "lock", "created_ms")}
    if isinstance(obj, list):
        return [_normalise(v, roots) for v in obj]
    if isinstance(obj, str):
        for r in roots:
            obj = obj.replace(r, "<root>")
        return obj
    return obj


def _same_audit(remote: dict, local: dict, store: dict) -> None:
    """Two audit reports of one store, from S3 and from its local path, equal but for the run's figures and
    where the store lies."""
    roots = [str(store["local"]), store["uri"].removeprefix("s3://"), store["uri"]]
    drop = ("generated_at_ms", "run")
    strip = lambda j: {k: v for k, v in _normalise(j, roots).items() if k not in drop}  # noqa: E731
    assert strip(remote) == strip(local)


# ------------------------------------------------------------------------------------------------
# rmqstore commands: s3:// gives the same answers as the local path


def test_info_json_same_from_s3_as_local(store_pair, s3_server):
    local, uri, conf = store_pair["local"], store_pair["uri"], store_pair["conf"]
    rc_l, out_l, err_l = run_cli(["info", local, "--json", "--broker-conf", conf])
    rc_r, out_r, err_r = run_cli(["info", uri, "--json", "--broker-conf", conf, *s3_server.cli_args()])
    assert rc_l == rc_r == 0, (err_l, err_r)
    jl, jr = json.loads(out_l), json.loads(out_r)
    assert jr["local"] is False and jr["store"] == uri
    assert [s["size"] for s in jr["segments"]] == [s["size"] for s in jl["segments"]]
    assert all(isinstance(s["mtime_ms"], int) and s["mtime_ms"] > 0 for s in jr["segments"])
    roots = [str(local), uri.removeprefix("s3://")]
    assert _normalise(jr, roots) == _normalise(jl, roots)


def test_info_finds_the_store_from_environment_endpoint_without_flags(stores, s3_server):
    """AWS_ENDPOINT_URL + AWS_* credentials (set by the fixture) are enough, as pyarrow documents."""
    d = stores["4.9.8"]
    rc, out, err = run_cli(["info", d["uri"], "--json", "--no-scan", "--broker-conf", d["conf"]])
    assert rc == 0, err
    assert len(json.loads(out)["segments"]) == len(os.listdir(d["local"] / "commitlog"))


@pytest.mark.parametrize("extra", [[], ["--with-body", "--no-crc"], ["--topic", "TopicTest", "--limit", "7"]])
def test_messages_jsonl_same_from_s3_as_local(store_pair, s3_server, extra):
    local, uri, conf = store_pair["local"], store_pair["uri"], store_pair["conf"]
    rc_l, out_l, _ = run_cli(["messages", local, "--broker-conf", conf, *extra])
    rc_r, out_r, err = run_cli(["messages", uri, "--broker-conf", conf, *s3_server.cli_args(), *extra])
    assert rc_r == rc_l == 0, err
    assert out_r == out_l
    if not extra:
        assert out_l.count("\n") > 100


def test_messages_parquet_from_s3_matches_local(stores, s3_server, tmp_path):
    import pyarrow.parquet as pq

    d = stores["5.3.3"]
    assert run_cli(["messages", d["local"], "--format", "parquet", "--out", tmp_path / "l.parquet"])[0] == 0
    assert run_cli(["messages", d["uri"], "--format", "parquet", "--out", tmp_path / "r.parquet",
                    *s3_server.cli_args()])[0] == 0
    assert pq.read_table(tmp_path / "r.parquet").equals(pq.read_table(tmp_path / "l.parquet"))


def _get_probes(local: Path, conf: Path) -> list[list[str]]:
    """get arguments for a few real messages of the store: by offset, msgId, queue position and key."""
    rc, out, _ = run_cli(["messages", local, "--broker-conf", conf])
    rows = [json.loads(line) for line in out.splitlines()]
    normal = [r for r in rows if not r["topic"].startswith(("RMQ_SYS", "SCHEDULE_TOPIC", "rmq_sys"))]
    picks = [normal[0], normal[len(normal) // 2], normal[-1]]
    probes: list[list[str]] = []
    for r in picks:
        probes.append(["--offset", str(r["phy_offset"])])
        probes.append(["--msg-id", r["msg_id"]])
        probes.append(["--queue", f"{r['topic']}:{r['queue_id']}:{r['queue_offset']}"])
    keyed = [r for r in normal if r["keys"]]
    for r in (keyed[:1] + keyed[-1:]):
        probes.append(["--key", r["keys"].split(" ")[0], "--topic", r["topic"]])
    uniq = [r for r in normal if r["uniq_key"]]
    if uniq:
        probes.append(["--key", uniq[len(uniq) // 3]["uniq_key"], "--topic", uniq[len(uniq) // 3]["topic"]])
    return probes


def test_get_same_from_s3_as_local(store_pair, s3_server):
    local, uri, conf = store_pair["local"], store_pair["uri"], store_pair["conf"]
    probes = _get_probes(local, conf)
    assert len(probes) >= 10
    for probe in probes:
        rc_l, out_l, err_l = run_cli(["get", local, "--broker-conf", conf, "--with-body", *probe])
        rc_r, out_r, err_r = run_cli(["get", uri, "--broker-conf", conf, "--with-body", *s3_server.cli_args(),
                                      *probe])
        assert rc_l == 0, (probe, err_l)
        assert (rc_r, out_r) == (rc_l, out_l), (probe, err_r)


def test_get_missing_offset_gives_same_one_line_error_from_s3(stores, s3_server):
    d = stores["4.9.8"]
    rc_l, _, err_l = run_cli(["get", d["local"], "--offset", "13"])
    rc_r, _, err_r = run_cli(["get", d["uri"], "--offset", "13", *s3_server.cli_args()])
    assert rc_l == rc_r == 2
    assert err_r.count("\n") == 1 and "Traceback" not in err_r
    assert re.sub(r"\S*store/", "", err_r) == re.sub(r"\S*store/", "", err_l)


# ------------------------------------------------------------------------------------------------
# storelib on S3


def test_store_scan_from_s3_equals_local_with_small_windows(store_pair, s3_server):
    """Whole-store scans through ranged reads (windows far smaller than a segment) match mmap scans."""
    local, uri = store_pair["local"], store_pair["uri"]
    s_l = Store(local)
    s_r = Store(uri, **s3_server.fs_options())
    assert not s_r.local
    for kw in ({"with_body": True}, {"verify_crc": True, "stop_on_crc": True}):
        t_l = s_l.commitlog.read_table(**kw)
        t_r = s_r.commitlog.read_table(window=256 * 1024, **kw)
        assert t_r.num_rows == t_l.num_rows > 0
        assert t_r.equals(t_l)


def test_segment_listing_sizes_and_mtimes_come_from_s3(stores, s3_server):
    d = stores["5.3.3"]
    cl = Store(d["uri"], **s3_server.fs_options()).commitlog
    names = sorted(os.listdir(d["local"] / "commitlog"))
    assert [s.name for s in cl.segments] == names
    assert [s.file_size for s in cl.segments] == [os.path.getsize(d["local"] / "commitlog" / n) for n in names]
    assert all(s.mtime_ms and s.mtime_ms > 1_600_000_000_000 for s in cl.segments)


def test_record_at_on_s3_reads_a_small_range_not_a_window(stores, s3_server, monkeypatch):
    """Random access (get) must not download a 64 MB scan window per message."""
    d = stores["4.9.8"]
    store = Store(d["uri"], **s3_server.fs_options())
    seg = store.commitlog.segments[0]
    sizes: list[int] = []
    orig = ArrowFileSource._read_at

    def spy(self, offset, length):
        sizes.append(length)
        return orig(self, offset, length)

    monkeypatch.setattr(ArrowFileSource, "_read_at", spy)
    row = store.commitlog.record_at(seg.base).to_pylist()[0]
    assert row["phy_offset"] == seg.base
    assert sizes and max(sizes) <= 1 << 20


def test_read_ahead_serves_windows_from_s3_in_the_background(stores, s3_server):
    d = stores["5.3.3"]
    store = Store(d["uri"], **s3_server.fs_options())
    seg = store.commitlog.segments[0]
    src = seg.open()
    try:
        scan = SegmentScan(src, seg.display, seg.base, window=16 * 1024)
        n = sum(b.num_rows for b in scan)
        ahead = src._ahead
        assert ahead is not None and ahead.prefetched >= 10 and ahead.direct <= 3
    finally:
        src.close()
    with open_source(Location(pafs.LocalFileSystem(), str(d["local"] / "commitlog" / seg.name), True)) as ls:
        assert n == sum(b.num_rows for b in SegmentScan(ls, seg.display, seg.base))


def test_in_place_writes_on_s3_store_give_one_line_error(stores, s3_server):
    store = Store(stores["4.9.8"]["uri"], **s3_server.fs_options())
    with pytest.raises(StoreError) as ei:
        store.require_local("recover --apply")
    msg = str(ei.value)
    assert "\n" not in msg and "local path" in msg and "recover --apply" in msg


def test_missing_s3_store_is_a_clear_error(s3_server):
    bucket = s3_server.new_bucket("empty")
    rc, _, err = run_cli(["info", f"s3://{bucket}/no/such/store", *s3_server.cli_args()])
    assert rc == 2 and "does not exist" in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------------
# byte sources without a server (LocalFileSystem behind the ranged-read path)


def _remote_local(path: Path) -> Location:
    """A local file reached through pyarrow ranged reads, as a remote one would be."""
    return Location(pafs.LocalFileSystem(), str(path), False)


@pytest.fixture
def pattern_file(tmp_path) -> tuple[Path, bytes]:
    data = np.random.default_rng(5).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    p = tmp_path / "blob"
    p.write_bytes(data)
    return p, data


def test_read_ahead_returns_exact_bytes_for_sequential_overlapping_windows(pattern_file):
    p, data = pattern_file
    with ArrowFileSource(pafs.LocalFileSystem(), str(p)) as src:
        src.read_ahead(10_000)
        pos, rng = 0, np.random.default_rng(1)
        while True:
            got = src.read(pos, 10_000)
            assert bytes(got) == data[pos : pos + 10_000]
            if pos + len(got) >= len(data):
                break
            pos += len(got) - int(rng.integers(0, 900))  # the next window starts at the straddling record
        assert src._ahead.prefetched >= 25 and src._ahead.direct == 1


def test_read_ahead_fills_a_window_with_one_ranged_request_per_fill_chunk(pattern_file, monkeypatch):
    import storelib.fileio.bytesource as bs

    p, data = pattern_file
    monkeypatch.setattr(bs, "FILL_CHUNK", 4096)
    sizes: list[int] = []
    real = bs._fill_from

    def spy(f, start, out):
        wrapped = _CountingFile(f, sizes)
        return real(wrapped, start, out)

    monkeypatch.setattr(bs, "_fill_from", spy)
    with ArrowFileSource(pafs.LocalFileSystem(), str(p)) as src:
        src.read_ahead(10_000)
        pos = 0
        while pos < len(data):
            got = src.read(pos, 10_000)
            assert bytes(got) == data[pos : pos + 10_000]
            pos += len(got)
        assert src._ahead.prefetched >= 25
    assert sizes and max(sizes) <= 4096 and sum(s > 0 for s in sizes) > 2 * 25


class _CountingFile:
    """A NativeFile stand-in that records how many bytes each readinto asked for."""

    def __init__(self, f, sizes: list[int]):
        self._f, self._sizes = f, sizes

    def seek(self, pos: int) -> None:
        self._f.seek(pos)

    def readinto(self, out) -> int:
        self._sizes.append(len(out))
        return self._f.readinto(out)


def test_read_ahead_falls_back_to_a_ranged_read_on_jumps_and_long_records(pattern_file):
    p, data = pattern_file
    with ArrowFileSource(pafs.LocalFileSystem(), str(p)) as src:
        src.read_ahead(10_000)
        for off, n in [(0, 10_000), (250_000, 10_000), (5, 10_000), (9_990, 40_000), (50_000, 10_000),
                       (59_999, 10_000), (299_990, 10_000), (299_999, 5)]:
            assert bytes(src.read(off, n)) == data[off : off + n]
        assert src.read(len(data), 10) == b""


def test_read_ahead_tail_longer_than_reserve_is_still_correct(tmp_path):
    w = READ_AHEAD_RESERVE // 2
    data = np.random.default_rng(2).integers(0, 256, READ_AHEAD_RESERVE * 3, dtype=np.uint8).tobytes()
    p = tmp_path / "big"
    p.write_bytes(data)
    with ArrowFileSource(pafs.LocalFileSystem(), str(p)) as src:
        src.read_ahead(w)
        a = src.read(0, READ_AHEAD_RESERVE + w)  # bigger than a window: direct
        b = src.read(10, READ_AHEAD_RESERVE + w)  # tail > reserve: direct again
        assert bytes(a) == data[: READ_AHEAD_RESERVE + w] and bytes(b) == data[10 : 10 + READ_AHEAD_RESERVE + w]


def test_ranged_source_reports_a_file_shorter_than_its_listing(pattern_file):
    p, data = pattern_file
    with ArrowFileSource(pafs.LocalFileSystem(), str(p), size=len(data) + 100) as src:
        with pytest.raises(StoreError) as ei:
            src.read(len(data) - 10, 50)
        assert ei.value.kind == "truncated" and str(p) in str(ei.value)


def test_scan_through_ranged_reads_equals_mmap_scan_on_samples(sample):
    root = sample / "store" / "commitlog"
    from storelib.scan.commitlog import CommitLog

    t_l = CommitLog(str(root)).read_table(with_body=True)
    for w in (20_000, 200_000):
        t_r = CommitLog(_remote_local(root)).read_table(with_body=True, window=w)
        assert t_r.equals(t_l)


# ------------------------------------------------------------------------------------------------
# resolving locations


def test_filesystem_options_normalise_cli_and_spark_spellings():
    assert filesystem_options({"endpoint": "http://127.0.0.1:9000", "region": "eu-west-1", "x": None}) == {
        "endpoint_override": "127.0.0.1:9000", "scheme": "http", "region": "eu-west-1"}
    assert filesystem_options({"fs.access_key_id": "A", "s3.secret_access_key": "B", "anonymous": "false",
                               "connect_timeout": "2.5"}) == {
        "access_key": "A", "secret_key": "B", "anonymous": False, "connect_timeout": 2.5}
    assert filesystem_options({"endpoint_url": "minio:9000"}) == {"endpoint_override": "minio:9000",
                                                                   "scheme": "https"}


def test_resolve_plain_paths_file_uris_and_explicit_filesystems(tmp_path):
    assert resolve(tmp_path) == Location(pafs.LocalFileSystem(), str(tmp_path), True)
    assert resolve(f"file://{tmp_path}").path == str(tmp_path)
    s3 = pafs.S3FileSystem(anonymous=True, region="us-east-1")
    loc = resolve("s3://bucket/dumps/store/", filesystem=s3)
    assert (loc.path, loc.local) == ("bucket/dumps/store", False)
    assert loc.join("commitlog", "0").path == "bucket/dumps/store/commitlog/0"


def test_resolve_bad_uri_is_a_store_error():
    with pytest.raises(StoreError):
        resolve("nosuchscheme://x/y")


def test_fsspec_filesystem_objects_are_wrapped(sample_498):
    fsspec = pytest.importorskip("fsspec")
    mem = fsspec.filesystem("memory")
    src = sample_498 / "store"
    for p in sorted(src.rglob("*")):
        if p.is_file():
            mem.pipe(f"/s498/{p.relative_to(src)}", p.read_bytes())
    store = Store("/s498", filesystem=mem)
    assert not store.local and isinstance(store.loc.fs, pafs.PyFileSystem)
    t_r = store.commitlog.read_table(window=8192)
    t_l = Store(src).commitlog.read_table()
    assert t_r.equals(t_l)


# ------------------------------------------------------------------------------------------------
# jobs and outputs on S3


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _rebuilt_s3_vs_local(s3_server, out_uri: str, local_out: Path, tmp_path: Path) -> dict[str, bytes]:
    """The files of the rebuild at ``out_uri`` (downloaded), asserted equal to ``local_out``'s but for
    the manifest (which names its source); returns them."""
    from storelib.fileio.publish import MANIFEST_NAME

    s3_server.download(out_uri, tmp_path / "s3-out")
    got, want = _tree_bytes(tmp_path / "s3-out"), _tree_bytes(local_out)
    got.pop(MANIFEST_NAME), want.pop(MANIFEST_NAME)
    assert sorted(got) == sorted(want) and any(k.startswith("consumequeue/") for k in want)
    assert got == want
    return got


def test_rebuild_from_s3_to_s3_is_byte_identical_to_a_local_rebuild(stores, s3_server, tmp_path):
    from storelib.fileio.publish import is_partial, is_published, read_manifest

    d = stores["generated"] if "generated" in stores else stores["5.3.3"]
    out_uri = f"s3://{s3_server.new_bucket('rebuilt')}/out/store"
    rc_l, _, err_l = run_cli(["rebuild", d["local"], "--out", tmp_path / "local-out", "--broker-conf", d["conf"],
                              "--quiet"])
    rc_r, _, err_r = run_cli(["rebuild", d["uri"], "--out", out_uri, "--broker-conf", d["conf"], "--quiet"])
    assert rc_l == 0 and rc_r == 0, (err_l, err_r)
    assert is_published(out_uri) and not is_partial(out_uri)
    _rebuilt_s3_vs_local(s3_server, out_uri, tmp_path / "local-out", tmp_path)
    m = read_manifest(out_uri)
    assert m is not None and m["counts"]["cq_records"] > 0
    # no staging prefix is left beside the output
    fs = s3_server.filesystem()
    bucket_root = out_uri.removeprefix("s3://").split("/", 1)[0]
    names = [i.base_name for i in fs.get_file_info(pafs.FileSelector(bucket_root + "/out"))]
    assert names == ["store"]


def test_a_rebuild_from_s3_in_units_on_a_pool_is_byte_identical_to_a_local_rebuild(stores, s3_server, tmp_path,
                                                                                    monkeypatch):
    """Phase A in units over ranged reads: the cuts, and where the young last segment's records end (the
    fine tail's place), are found on S3; the workers read their units' ranges from there."""
    from jobs.rebuild import RebuildConfig, rebuild
    from tests.test_rebuild_units import _units_seen

    d = stores["generated"] if "generated" in stores else stores["5.3.3"]
    joined = _units_seen(monkeypatch)  # per join: (units, segments joined, segments to redo)
    rebuild(RebuildConfig(store=str(d["local"]), out=str(tmp_path / "local-out"), broker_conf=str(d["conf"]),
                          progress=False))
    whole = joined.pop()
    out_uri = f"s3://{s3_server.new_bucket('rebuilt')}/units/store"
    m = rebuild(RebuildConfig(store=d["uri"], out=out_uri, broker_conf=str(d["conf"]), engine="pool", workers=2,
                              split_bytes=96 << 10, progress=False, fs_options=s3_server.fs_options()))
    units, segments, redo = joined.pop()
    assert m["engine"] == "pool" and segments == whole[1] and redo == 0
    assert units >= 4 * segments  # every segment in several units, the last bytes in finer ones
    _rebuilt_s3_vs_local(s3_server, out_uri, tmp_path / "local-out", tmp_path)


def test_interrupted_publish_to_s3_leaves_no_manifest_and_is_not_complete(s3_server, tmp_path, monkeypatch):
    from storelib.fileio import publish

    staging = tmp_path / "staging"
    for rel in ("consumequeue/T/0/00000000000000000000", "index/20240101000000000", "checkpoint"):
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(rel.encode() * 100)
    fsspec_arrow = pytest.importorskip("fsspec.implementations.arrow")
    # the S3 filesystem seen through a Python handler, so that one call can be made to fail
    wrapped = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec_arrow.ArrowFSWrapper(s3_server.filesystem())))
    loc = resolve(f"{s3_server.new_bucket('pub')}/out", filesystem=wrapped)
    publish.publish_tree(str(staging), loc, {"n": 1})
    assert publish.read_manifest(loc) == {"n": 1}

    (staging / "index" / "20240101000000000").unlink()  # the new output has one file less
    real_move = pafs.FSSpecHandler.move
    calls = []

    def dies_on_second_move(self, src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("connection reset (simulated)")
        return real_move(self, src, dst)

    monkeypatch.setattr(pafs.FSSpecHandler, "move", dies_on_second_move)
    with pytest.raises(OSError):
        publish.publish_tree(str(staging), loc, {"n": 2})
    assert not publish.is_published(loc) and publish.read_manifest(loc) is None
    assert publish.is_partial(loc)
    monkeypatch.undo()
    publish.publish_tree(str(staging), loc, {"n": 2})
    assert publish.read_manifest(loc) == {"n": 2} and not publish.is_partial(loc)
    files = publish.tree_files(loc)
    assert "index/20240101000000000" not in files  # a file of the previous output is not left behind
    assert sorted(files) == sorted(["consumequeue/T/0/00000000000000000000", "checkpoint", publish.MANIFEST_NAME])


def test_rebuild_in_place_on_s3_is_a_one_line_error(stores, s3_server):
    rc, _, err = run_cli(["rebuild", stores["4.9.8"]["uri"], "--in-place", "--quiet"])
    assert rc == 2 and err.count("\n") == 1 and "local" in err


def test_recover_apply_on_s3_is_a_one_line_error(stores, s3_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["recover", stores["4.9.8"]["uri"], "--apply", "--backup", tmp_path / "b"])
    assert rc == 2 and err.count("\n") == 1 and "local" in err


def test_recover_plan_same_from_s3_as_local(store_pair, s3_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a preview writes nothing (checked in test_leftovers)
    local, uri, conf = store_pair["local"], store_pair["uri"], store_pair["conf"]
    rc_l, out_l, err_l = run_cli(["recover", local, "--plan", "--json", "--broker-conf", conf])
    rc_r, out_r, err_r = run_cli(["recover", uri, "--plan", "--json", "--broker-conf", conf])
    assert rc_l == rc_r and rc_l in (0, 1), (err_l, err_r)
    roots = [str(local), uri.removeprefix("s3://"), uri]
    assert _normalise(json.loads(out_r), roots) == _normalise(json.loads(out_l), roots)


def test_audit_same_from_s3_as_local_and_report_to_s3(store_pair, s3_server, tmp_path):
    local, uri, conf = store_pair["local"], store_pair["uri"], store_pair["conf"]
    rep = f"s3://{s3_server.new_bucket('audit')}/reports/run1"
    rc_l, _, err_l = run_cli(["audit", local, "--broker-conf", conf, "--report-dir", tmp_path / "rl", "--quiet"])
    rc_r, _, err_r = run_cli(["audit", uri, "--broker-conf", conf, "--report-dir", rep, "--quiet",
                              *s3_server.cli_args()])
    assert rc_l == rc_r and rc_l in (0, 1), (err_l, err_r)
    s3_server.download(rep, tmp_path / "rr")
    jl = json.loads((tmp_path / "rl" / "audit.json").read_text())
    jr = json.loads((tmp_path / "rr" / "audit.json").read_text())
    _same_audit(jr, jl, store_pair)
    assert jr["run"]["segments_audited"] == jl["run"]["segments_audited"] > 0
    from storelib.fileio.publish import is_published

    assert is_published(resolve(rep), "audit-manifest.json")


def test_audit_from_s3_in_units_on_a_pool_reports_what_a_local_audit_does(stores, s3_server):
    """The audit's segment tasks in units over ranged reads (cuts and the fine tail found on S3) and its
    cross-file tasks on the pool's workers, which reopen the store with the same S3 options."""
    from jobs.audit import audit_store

    d = stores["generated"] if "generated" in stores else stores["5.3.3"]
    local = audit_store(str(d["local"]), broker_conf=str(d["conf"]), quiet=True, now_ms=1)
    remote = audit_store(d["uri"], broker_conf=str(d["conf"]), quiet=True, now_ms=1, engine="pool", workers=2,
                         split_bytes=96 << 10, fs_options=s3_server.fs_options())
    _same_audit(remote, local, d)
    assert remote["run"]["segments_audited"] == local["run"]["segments_audited"] > 1
    assert remote["run"]["engine"].startswith("pool")


@pytest.mark.spark
def test_audit_from_s3_in_units_on_spark_reports_what_a_local_audit_does(stores, s3_server, spark):
    """The same on Spark: the executors read the units and the consume queues from S3 themselves."""
    from jobs.audit import audit_store

    d = stores["generated"] if "generated" in stores else stores["5.3.3"]
    local = audit_store(str(d["local"]), broker_conf=str(d["conf"]), quiet=True, now_ms=1)
    remote = audit_store(d["uri"], broker_conf=str(d["conf"]), quiet=True, now_ms=1, engine="spark", spark=spark,
                         split_bytes=96 << 10, fs_options=s3_server.fs_options())
    _same_audit(remote, local, d)
    assert remote["run"]["engine"] == "spark" and "partitioned" in remote["run"]["cross_check_mode"]


def test_an_incremental_audit_from_s3_in_units_after_growth_reports_what_a_full_audit_does(stores, s3_server,
                                                                                             tmp_path):
    """``--since`` on an object store: the second run goes on from the first's carry (the queue streams
    resume over units kept open between runs) and reports what a full audit of the grown store does."""
    import shutil

    from jobs.audit import audit_store
    from storelib.broker.settings.store import load_settings
    from storelib.broker.writer.writer import StoreWriter
    from storelib.format.record import Message

    d = stores["generated"] if "generated" in stores else stores["5.3.3"]
    local = tmp_path / "store"
    shutil.copytree(d["local"], local)
    uri = s3_server.upload(local, f"{s3_server.new_bucket('inc')}/grown/store")
    kw = {"broker_conf": str(d["conf"]), "quiet": True, "now_ms": 1, "split_bytes": 96 << 10,
          "fs_options": s3_server.fs_options()}
    state = tmp_path / "audit.state"
    first = audit_store(uri, since=str(state), **kw)
    carry = json.loads(state.read_text())["carry"]
    assert "incremental" not in first["run"]["cross_check_mode"] and carry["queue_groups"]
    # a queue's listing serves its group task in this run only: never carried to the next
    assert all("files" not in q for g in carry["queue_groups"].values() for q in g["metas"])
    before = {p: p.read_bytes() for p in local.rglob("*") if p.is_file()}
    w = StoreWriter(str(local), load_settings(str(d["conf"]), None, None, None))
    try:  # grown the broker's way: records, consume queues and index entries
        for i in range(300):
            w.append(Message(topic=f"Grown{i % 3}", body=b"grown %d" % i, queue_id=i % 2,
                             properties={"KEYS": f"grown-{i}", "UNIQ_KEY": f"{i:032X}", "TAGS": "g"}))
    finally:
        w.close(dispatch=True)
    fs = s3_server.filesystem()  # only what the growth wrote is uploaded: an object's time is its upload's
    for p in local.rglob("*"):
        if p.is_file() and before.get(p) != p.read_bytes():
            with fs.open_output_stream(uri.removeprefix("s3://") + "/" + str(p.relative_to(local))) as out:
                out.write(p.read_bytes())
    inc = audit_store(uri, since=str(state), **kw)
    full = audit_store(uri, **kw)
    assert "incremental: " in inc["run"]["cross_check_mode"] and inc["run"]["segments_audited"] < \
        full["run"]["segments_audited"]
    for f in inc["findings"]:
        f["extra"].pop("carried_forward", None)
    drop = ("generated_at_ms", "run")
    assert {k: v for k, v in inc.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}


def test_an_audit_in_units_opens_and_reads_each_remote_consume_queue_file_at_most_twice(stores, s3_server,
                                                                                         monkeypatch):
    """Round trips: the queue checks read a queue's units in one run per commitlog unit; on an object
    store each file stays open between runs (a reopen is a metadata request) and short runs come from one
    block per file. Once for the queue summaries, once for the checks, however many units; and each queue's
    directory is listed once, its group task taking the summary's listing."""
    from collections import Counter

    import storelib.format.consumequeue as consumequeue
    from jobs.audit import audit_store
    from tests.test_consumequeue import count_ranged_requests

    d = stores["generated"] if "generated" in stores else stores["5.3.3"]
    opens, reads = count_ranged_requests(monkeypatch)
    listed: Counter = Counter()
    real_list = consumequeue._list

    def counted_list(loc):
        listed[loc.path] += 1
        return real_list(loc)

    monkeypatch.setattr(consumequeue, "_list", counted_list)
    remote = audit_store(d["uri"], broker_conf=str(d["conf"]), quiet=True, now_ms=1, split_bytes=48 << 10,
                         fs_options=s3_server.fs_options())
    cq = [p for p in {*opens, *reads} if "/consumequeue/" in p]
    assert len(cq) > 8
    assert max(opens[p] for p in cq) <= 2 and max(reads[p] for p in cq) <= 2
    queue_dirs = {p.rsplit("/", 1)[0] for p in cq}
    assert queue_dirs <= set(listed) and max(listed[q] for q in queue_dirs) == 1  # the group task reuses it
    local = audit_store(str(d["local"]), broker_conf=str(d["conf"]), quiet=True, now_ms=1)
    _same_audit(remote, local, d)


def test_expiry_same_from_s3_as_local_using_store_times(store_pair, s3_server):
    """S3 object times are upload times: with store-time mtimes both runs simulate the same thing."""
    local, uri, conf = store_pair["local"], store_pair["uri"], store_pair["conf"]
    args = ["--broker-conf", conf, "--json", "--mtimes", "store-time", "--ingest", "0", "--consumption", "0"]
    rc_l, out_l, err_l = run_cli(["expiry", local, *args])
    rc_r, out_r, err_r = run_cli(["expiry", uri, *args, *s3_server.cli_args()])
    # the policy on a pool worker, which reopens the store with the same S3 options
    rc_p, out_p, err_p = run_cli(["expiry", uri, *args, *s3_server.cli_args(), "--engine", "pool", "--workers", "2"])
    assert rc_l == rc_r == rc_p == 0, (err_l, err_r, err_p)
    roots = [str(local), uri.removeprefix("s3://"), uri]
    assert _normalise(json.loads(out_r), roots) == _normalise(json.loads(out_l), roots)
    assert _normalise(json.loads(out_p), roots) == _normalise(json.loads(out_l), roots)


def test_expiry_on_s3_says_upload_times_are_not_usable_and_uses_store_times(stores, s3_server):
    d = stores["4.9.8"]
    rc, out, err = run_cli(["expiry", d["uri"], "--broker-conf", d["conf"], "--json", "--ingest", "0",
                            "--consumption", "0", *s3_server.cli_args()])
    assert rc == 0, err
    sim = json.loads(out)["simulation"]
    assert "store_time" in json.dumps(sim.get("mtime_source"))
    assert "mtime_reconstructed" in out


@pytest.mark.spark
def test_spark_data_source_reads_s3_with_filesystem_options(stores, s3_server, spark):
    from datasources import register

    register(spark)
    d = stores["5.3.3"]
    o = s3_server.fs_options()
    opts = {"fs.endpoint": s3_server.endpoint, "fs.region": o["region"], "fs.access_key": o["access_key"],
            "fs.secret_key": o["secret_key"], "maxSplitBytes": "128k", "brokerConf": str(d["conf"])}
    got = spark.read.format("rocketmq").options(**opts).load(d["uri"]).drop("_corrupt")
    want = spark.read.format("rocketmq").options(maxSplitBytes="128k", brokerConf=str(d["conf"])).load(
        str(d["local"])).drop("_corrupt")
    assert got.count() == want.count() > 1000
    assert got.orderBy("phy_offset").collect() == want.orderBy("phy_offset").collect()


def test_commitlog_scan_hands_the_next_segments_first_window_over_without_a_stall(sample_533, monkeypatch):
    from storelib.scan.commitlog import CommitLog

    counts: list[tuple[int, int]] = []
    real_close = ArrowFileSource.close

    def counting_close(self):
        if self._ahead is not None:
            counts.append((self._ahead.prefetched, self._ahead.direct))
        real_close(self)

    monkeypatch.setattr(ArrowFileSource, "close", counting_close)
    root = sample_533 / "store" / "commitlog"
    cl = CommitLog(_remote_local(root))
    assert len(cl.segments) >= 3
    got = cl.read_table(window=64 * 1024)
    assert got.equals(CommitLog(str(root)).read_table())
    assert len(counts) == len(cl.segments)
    assert counts[0][1] == 1 and all(direct == 0 for _, direct in counts[1:])  # only the very first read waits


def test_index_image_written_to_a_remote_location_equals_the_local_file(tmp_path):
    import hashlib

    from storelib.broker.index.indexbuild import build_index_files
    from storelib.broker.index.indexwrite import write_index_image
    from storelib.format.indexfile import IndexGeometry

    g = IndexGeometry(7, 10)
    rows = {"key_hash": np.arange(25) * 7919, "phy_offset": np.arange(25) * 100,
            "store_timestamp": 1_700_000_000_000 + np.arange(25) * 900}
    for i, im in enumerate(build_index_files(rows, geometry=g, name_tz=None)):
        im.write(tmp_path / f"local-{i}")
        write_index_image(im, Location(pafs.LocalFileSystem(), str(tmp_path / f"remote-{i}"), False))
        a, b = (tmp_path / f"local-{i}").read_bytes(), (tmp_path / f"remote-{i}").read_bytes()
        assert len(a) == g.file_size and a == b and im.sha256() == hashlib.sha256(b).hexdigest()


@pytest.mark.spark
def test_spark_rebuild_from_s3_to_s3_equals_the_local_engine_and_its_manifest(stores, s3_server, tmp_path, spark):
    import hashlib

    from jobs.rebuild import RebuildConfig, rebuild
    from storelib.fileio.publish import read_manifest

    d = stores["generated"] if "generated" in stores else stores["5.3.3"]
    out_uri = f"s3://{s3_server.new_bucket('rebuilt')}/spark/store"
    rebuild(RebuildConfig(store=str(d["local"]), out=str(tmp_path / "local-out"), broker_conf=str(d["conf"]),
                          progress=False))
    m = rebuild(RebuildConfig(store=d["uri"], out=out_uri, broker_conf=str(d["conf"]), engine="spark",
                              progress=False, fs_options=s3_server.fs_options()), spark=spark)
    assert m["engine"] == "spark" and m["counts"]["index_keys"] > 0
    got = _rebuilt_s3_vs_local(s3_server, out_uri, tmp_path / "local-out", tmp_path)
    assert any(k.startswith("index/") for k in got)
    manifest = read_manifest(out_uri)
    for rel, body in got.items():  # every file's manifest hash is the hash of what was written
        assert manifest["files"][rel]["sha256"] == hashlib.sha256(body).hexdigest(), rel


def test_export_from_s3_to_s3_equals_a_local_export_and_reruns_incrementally(stores, s3_server, tmp_path):
    import datasources as ds

    d = stores["4.9.8"]
    out_uri = f"s3://{s3_server.new_bucket('snap')}/snapshots/store1"
    rc_l, _, err_l = run_cli(["export", d["local"], "--out", tmp_path / "local-snap", "--quiet"])
    rc_r, _, err_r = run_cli(["export", d["uri"], "--out", out_uri, "--quiet", *s3_server.cli_args()])
    assert rc_l == 0 and rc_r == 0, (err_l, err_r)
    fs = s3_server.filesystem()
    remote = pads.dataset(out_uri.removeprefix("s3://"), filesystem=fs, format="parquet", partitioning="hive")
    key = lambda r: r["phy_offset"]  # noqa: E731
    got = sorted(remote.to_table().drop_columns(["date"]).to_pylist(), key=key)
    want = sorted(ds.snapshot_dataset(str(tmp_path / "local-snap")).to_table().drop_columns(["date"]).to_pylist(),
                  key=key)
    assert got == want and len(got) == 2000
    names = {i.base_name for i in fs.get_file_info(pafs.FileSelector(out_uri.removeprefix("s3://")))}
    assert "_manifest.json" in names and not [n for n in names if n.startswith("_staging-")]
    rc, out, err = run_cli(["export", d["uri"], "--out", out_uri, "--incremental", *s3_server.cli_args()])
    assert rc == 0 and "snapshot up to date" in out, err
