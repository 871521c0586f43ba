"""The directory-backed S3 server (``tests/s3dir.py``) as pyarrow's S3FileSystem and our commitlog reader see it.

One server subprocess per module over a tmp dir; every check goes through real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.fileio.bytesource import resolve
from storelib.generator.gen import generate
from storelib.generator.genplan import GenConfig
from storelib.scan.commitlog import CommitLog
from tests.s3dir import DirS3Server, running_dir_s3_server

N_MANY = 1100  # > 1000: ListObjectsV2 pages
SECRET = b"outside-the-root secret"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """root/ with bucket 'b': data files, a deep tree, 1100 tiny files, an empty dir; a secret beside root."""
    base = tmp_path_factory.mktemp("s3dir")
    (base / "secret.txt").write_bytes(SECRET)
    root = base / "root"
    b = root / "b"
    (b / "data").mkdir(parents=True)
    rng = np.random.default_rng(7)
    (b / "data" / "blob.bin").write_bytes(rng.integers(0, 256, 3_000_001, dtype=np.uint8).tobytes())
    (b / "data" / "small.txt").write_bytes(b"hello")
    (b / "data" / "empty").write_bytes(b"")
    (b / "deep" / "x" / "y").mkdir(parents=True)
    (b / "deep" / "x" / "y" / "z.txt").write_bytes(b"z")
    (b / "deep" / "a-b").write_bytes(b"dash")  # '-' sorts before '/': S3 order differs from a tree walk
    (b / "emptydir").mkdir()
    many = b / "many"
    many.mkdir()
    for i in range(N_MANY):
        (many / f"f{i:05d}").write_bytes(b"%d" % i)
    (many / "sub").mkdir()
    (many / "sub" / "inner").write_bytes(b"i")
    (b / "escape").symlink_to(base / "secret.txt")
    (b / "escdir").symlink_to(base)
    return root


@pytest.fixture(scope="module")
def s3(tree) -> DirS3Server:
    with running_dir_s3_server(tree) as server:
        yield server


@pytest.fixture(scope="module")
def fs(s3) -> pafs.S3FileSystem:
    return s3.filesystem()


def raw(s3: DirS3Server, method: str, path: str, headers: dict[str, str] | None = None,
        body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with the path sent exactly as given (http.client does not normalise it)."""
    c = http.client.HTTPConnection(s3.host, s3.port, timeout=10)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


# ------------------------------------------------------------------------------------------------
# metadata and listing


def test_file_info_of_files_dirs_buckets_and_missing_paths(fs):
    info = {p: fs.get_file_info(p) for p in ["b", "b/data", "b/data/blob.bin", "b/data/empty", "b/deep/x",
                                             "b/emptydir", "b/nope", "b/data/nope", "nobucket", "nobucket/k"]}
    T = pafs.FileType
    assert {p: i.type for p, i in info.items()} == {
        "b": T.Directory, "b/data": T.Directory, "b/data/blob.bin": T.File, "b/data/empty": T.File,
        "b/deep/x": T.Directory, "b/emptydir": T.Directory, "b/nope": T.NotFound, "b/data/nope": T.NotFound,
        "nobucket": T.NotFound, "nobucket/k": T.NotFound}
    assert info["b/data/blob.bin"].size == 3_000_001
    assert info["b/data/empty"].size == 0


def test_head_object_headers(s3, tree):
    status, h, body = raw(s3, "HEAD", "/b/data/small.txt")
    assert status == 200 and body == b""
    assert h["content-length"] == "5" and h["accept-ranges"] == "bytes"
    assert re.fullmatch(r'"[0-9a-f]{32}"', h["etag"])
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", h["last-modified"])


def test_non_recursive_listing_pages_past_1000_keys(fs, tree):
    got = fs.get_file_info(pafs.FileSelector("b/many", recursive=False))
    files = sorted(i.path for i in got if i.type == pafs.FileType.File)
    dirs = [i.path for i in got if i.type == pafs.FileType.Directory]
    assert files == [f"b/many/f{i:05d}" for i in range(N_MANY)]
    assert dirs == ["b/many/sub"]
    assert {i.size for i in got if i.path == "b/many/f01099"} == {4}


def test_recursive_listing_matches_the_directory_tree(fs, tree):
    got = {i.path: i.type for i in fs.get_file_info(pafs.FileSelector("b", recursive=True))}
    want: dict[str, pafs.FileType] = {}
    for dirpath, dirnames, filenames in os.walk(tree / "b"):
        rel = Path(dirpath).relative_to(tree)
        for d in dirnames:
            if not (Path(dirpath) / d).is_symlink():
                want[(rel / d).as_posix()] = pafs.FileType.Directory
        for f in filenames:
            if f != "escape":  # a symlink leaving the root is not served
                want[(rel / f).as_posix()] = pafs.FileType.File
    assert got == want


def test_list_objects_v2_xml_paging_and_common_prefixes(s3):
    status, _, body = raw(s3, "GET", "/b?list-type=2&prefix=many/&delimiter=/&max-keys=1000")
    text = body.decode()
    assert status == 200 and 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"' in text
    assert "<IsTruncated>true</IsTruncated>" in text and "<KeyCount>1000</KeyCount>" in text
    assert re.search(r"<LastModified>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z</LastModified>", text)
    assert "<StorageClass>STANDARD</StorageClass>" in text
    token = re.search(r"<NextContinuationToken>(.*?)</NextContinuationToken>", text).group(1)
    status, _, body = raw(s3, "GET", f"/b?list-type=2&prefix=many/&delimiter=/&continuation-token={token}")
    text = body.decode()
    keys = re.findall(r"<Key>(.*?)</Key>", text)
    assert keys == [f"many/f{i:05d}" for i in range(1000, N_MANY)]
    assert re.findall(r"<Prefix>(.*?)</Prefix>", text) == ["many/", "many/sub/"]  # Prefix, then CommonPrefixes
    assert "<IsTruncated>false</IsTruncated>" in text and f"<KeyCount>{N_MANY - 1000 + 1}</KeyCount>" in text


def test_listing_is_in_s3_key_order_and_start_after_works(s3):
    _, _, body = raw(s3, "GET", "/b?list-type=2&prefix=deep/")
    assert re.findall(r"<Key>(.*?)</Key>", body.decode()) == ["deep/a-b", "deep/x/y/z.txt"]
    _, _, body = raw(s3, "GET", "/b?list-type=2&prefix=deep/&start-after=deep/a-b")
    assert re.findall(r"<Key>(.*?)</Key>", body.decode()) == ["deep/x/y/z.txt"]
    _, _, body = raw(s3, "GET", "/b?prefix=deep/&max-keys=1&delimiter=/")  # V1
    text = body.decode()
    assert re.findall(r"<Key>(.*?)</Key>", text) == ["deep/a-b"] and "<NextMarker>deep/a-b</NextMarker>" in text


def test_keys_are_xml_escaped(s3, tree):
    (tree / "b" / "odd").mkdir(exist_ok=True)
    (tree / "b" / "odd" / "a&b<c>.txt").write_bytes(b"x")
    _, _, body = raw(s3, "GET", "/b?list-type=2&prefix=odd/")
    assert b"<Key>odd/a&amp;b&lt;c&gt;.txt</Key>" in body


# ------------------------------------------------------------------------------------------------
# reads


@pytest.mark.parametrize("offset,length", [(0, 1), (0, 65536), (123_457, 1_000_000), (2_999_990, 11),
                                           (1_500_000, 1_500_001)])
def test_ranged_reads_return_the_file_bytes(fs, tree, offset, length):
    want = (tree / "b" / "data" / "blob.bin").read_bytes()[offset:offset + length]
    with fs.open_input_file("b/data/blob.bin") as f:
        assert f.read_at(length, offset) == want


def test_read_at_the_end_is_empty_and_past_the_end_fails(fs):
    with fs.open_input_file("b/data/blob.bin") as f:
        assert f.read_at(10, 3_000_001) == b""
        assert f.read_at(100, 2_999_991) == f.read_at(10, 2_999_991)  # clipped at EOF
        with pytest.raises(OSError):
            f.read_at(10, 3_000_002)


def test_open_input_stream_reads_the_whole_file(fs, tree):
    with fs.open_input_stream("b/data/blob.bin") as f:
        assert f.read() == (tree / "b" / "data" / "blob.bin").read_bytes()
    with fs.open_input_stream("b/data/empty") as f:
        assert f.read() == b""


@pytest.mark.parametrize("rng,status,content_range,body", [
    ("bytes=1-3", 206, "bytes 1-3/5", b"ell"),
    ("bytes=2-", 206, "bytes 2-4/5", b"llo"),
    ("bytes=-2", 206, "bytes 3-4/5", b"lo"),
    ("bytes=-99", 206, "bytes 0-4/5", b"hello"),
    ("bytes=3-99", 206, "bytes 3-4/5", b"lo"),
    ("bytes=5-", 416, None, None),
    ("bytes=-0", 416, None, None),
    (None, 200, None, b"hello"),
])
def test_range_header_forms(s3, rng, status, content_range, body):
    got_status, h, got = raw(s3, "GET", "/b/data/small.txt", {"Range": rng} if rng else {})
    assert got_status == status
    assert h.get("content-range") == content_range
    if body is not None:
        assert got == body
    else:
        assert b"<Code>InvalidRange</Code>" in got


def test_missing_keys_and_buckets_give_s3_errors(s3):
    status, _, body = raw(s3, "GET", "/b/data/nope")
    assert status == 404 and b"<Code>NoSuchKey</Code>" in body
    status, _, body = raw(s3, "GET", "/nobucket/k")
    assert status == 404 and b"<Code>NoSuchBucket</Code>" in body
    status, _, body = raw(s3, "GET", "/nobucket?list-type=2")
    assert status == 404 and b"<Code>NoSuchBucket</Code>" in body
    assert raw(s3, "HEAD", "/b/data/nope")[::2] == (404, b"")
    assert raw(s3, "HEAD", "/nobucket")[::2] == (404, b"")
    assert raw(s3, "HEAD", "/b")[0] == 200
    assert raw(s3, "GET", "/b/data")[0] == 404  # a directory is not an object
    status, _, body = raw(s3, "GET", "/b/x?acl")
    assert status == 501 and b"<Code>NotImplemented</Code>" in body


@pytest.mark.parametrize("path", ["/b/../secret.txt", "/b/%2e%2e/secret.txt", "/b/%2E%2E/%2E%2E/secret.txt",
                                  "/../secret.txt", "/%2e%2e/secret.txt", "/b/data/..%2f..%2f..%2fsecret.txt",
                                  "/b/./data/small.txt", "/b//data/small.txt", "/b/data%00/small.txt",
                                  "/b/escape", "/b/escdir/secret.txt", "//secret.txt",
                                  "/b?list-type=2&prefix=escdir/", "/b?list-type=2&prefix=../"])
def test_paths_leaving_the_root_are_refused(s3, path):
    for method in ("GET", "HEAD"):
        status, _, body = raw(s3, method, path)
        assert SECRET not in body
        if "list-type" in path:
            assert status == 200 and b"<Key>" not in body
        else:
            assert status in (400, 403, 404), (method, path, status)


def test_put_outside_the_root_writes_nothing(s3, tree):
    for path in ["/b/../evil", "/b/%2e%2e/evil", "/%2e%2e/evil"]:
        status, _, _ = raw(s3, "PUT", path, body=b"x")
        assert status in (400, 403)
    assert not (tree.parent / "evil").exists() and not (tree / "evil").exists()


# ------------------------------------------------------------------------------------------------
# writes (conveniences) and the helper


def test_pyarrow_writes_land_as_files(s3, fs, tree):
    bucket = s3.new_bucket("w")
    fs.create_dir(f"{bucket}/d")
    assert (tree / bucket / "d").is_dir()
    payload = os.urandom(200_000)
    with fs.open_output_stream(f"{bucket}/d/x.bin") as out:  # multipart upload, aws-chunked parts
        out.write(payload)
    assert (tree / bucket / "d" / "x.bin").read_bytes() == payload
    status, _, _ = raw(s3, "PUT", f"/{bucket}/p/q.txt", body=b"plain")
    assert status == 200 and (tree / bucket / "p" / "q.txt").read_bytes() == b"plain"
    fs.delete_file(f"{bucket}/d/x.bin")
    assert not (tree / bucket / "d" / "x.bin").exists()
    assert not any(p.name.startswith(".s3dir-tmp-") and p.is_file() for p in tree.rglob("*"))


def test_upload_hard_links_into_the_root(s3, tree, tmp_path):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "f").write_bytes(b"data")
    uri = s3.upload(tmp_path / "src", "up/a/b")
    assert uri == "s3://up/a/b"
    assert (tree / "up" / "a" / "b" / "sub" / "f").read_bytes() == b"data"
    assert os.path.samefile(tree / "up" / "a" / "b" / "sub" / "f", tmp_path / "src" / "sub" / "f")


# ------------------------------------------------------------------------------------------------
# our reader over it


def test_commitlog_scan_over_s3dir_equals_the_local_scan(s3, tmp_path):
    segment = 1 << 20
    settings = dataclasses.replace(BrokerSettings.defaults("4"), mapped_file_size_commit_log=segment)
    generate(tmp_path / "store", GenConfig(size=3_500_000, version="4", seed=3, chunk_ops=4000), settings,
             dispatch=False, write_config_files=False)
    uri = s3.upload(tmp_path / "store" / "commitlog", f"{s3.new_bucket('cl')}/store/commitlog")

    def rows(loc) -> tuple[pa.Table, list]:
        ends: list = []
        t = pa.Table.from_batches(list(CommitLog(loc, segment).scan(verify_crc=True, ends=ends)))
        return t, [(e.kind, e.crc_errors) for e in ends]

    local, local_ends = rows(resolve(tmp_path / "store" / "commitlog"))
    remote, remote_ends = rows(resolve(uri, **s3.fs_options()))
    assert local.num_rows > 1000 and len(local_ends) >= 4
    assert remote_ends == local_ends
    assert remote.equals(local)
