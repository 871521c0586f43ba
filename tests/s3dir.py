"""A small S3-compatible HTTP server over a local directory, for tests and benchmarks (stdlib only).

Why it exists: moto's standalone server (``tests/s3server.py``) answers every ranged GET by copying
the *whole object* (``moto/s3/models.py`` ``value`` reads it from its temp file, then
``responses.py`` slices the range), so a 1 MiB read from a 1 GiB object costs it ~1 GiB of copying
and a benchmark measures moto, not our client.
Real S3 and MinIO serve a range at the cost of the range; so does this server: the body goes out with
``socket.sendfile`` straight from the page cache.

Layout: ``ROOT/<bucket>/<key>`` (bucket = top-level directory, key = path relative to it). An empty
directory below a bucket is a directory marker ``dir/`` (what ``S3FileSystem.create_dir`` writes).
Served: ListBuckets, HeadBucket, GetBucketLocation, ListObjects (V1) and ListObjectsV2 (prefix,
delimiter, max-keys, continuation-token/marker, start-after, encoding-type=url), HeadObject, GetObject
with ``Range: bytes=a-b | a- | -n`` (206/416), and as conveniences CreateBucket, PutObject and
multipart uploads (temp file + ``os.replace``; plain, HTTP-chunked and ``aws-chunked`` bodies; parts
under ``ROOT/.s3dir-tmp-multipart/``) and DeleteObject.
Authentication is not checked (loopback only). Request paths are untrusted: ``..``/``.``/empty
components, NUL and anything resolving (via symlinks) outside ``--root`` are refused.

Run: ``python -m tests.s3dir --root DIR --host 127.0.0.1 --port N``; from Python use
``with running_dir_s3_server(root) as s3: ...`` (same interface as ``running_s3_server``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from tests.s3server import S3Server, start_server_process, stop_s3_server

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
TMP_PREFIX = ".s3dir-tmp-"  # in-progress uploads; never listed or served
UPLOADS_DIR = TMP_PREFIX + "multipart"  # ROOT/<this>/<upload id>/{target,part-NNNNN}
MAX_KEYS = 1000
# Query parameters that select another API than the plain object/bucket one; those we do not serve
# get 501 NotImplemented instead of being answered as a GET of the object or a listing.
_BUCKET_SUBRESOURCES = {"acl", "cors", "delete", "encryption", "lifecycle", "logging", "notification", "policy",
                        "replication", "tagging", "uploads", "versioning", "versions", "website",
                        "object-lock", "ownershipControls", "publicAccessBlock", "accelerate", "requestPayment"}
_OBJECT_SUBRESOURCES = {"acl", "tagging", "uploadId", "uploads", "retention", "legal-hold", "torrent",
                        "attributes", "restore", "select"}


class S3Error(Exception):
    """An S3 error response: HTTP status, S3 error code, message."""

    def __init__(self, status: int, code: str, message: str, resource: str = ""):
        super().__init__(message)
        self.status, self.code, self.message, self.resource = status, code, message, resource


def _iso(mtime: float) -> str:
    """S3's LastModified in listings: ISO-8601 UTC with milliseconds and Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mtime)) + f".{int(mtime * 1000) % 1000:03d}Z"


def _etag(st: os.stat_result) -> str:
    """A cheap, stable ETag (not the content MD5: that would cost a read of the whole file per HEAD)."""
    return '"' + hashlib.md5(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest() + '"'


def _check_part(part: str) -> None:
    if part in ("", ".", "..") or "\x00" in part or part.startswith(TMP_PREFIX):
        raise S3Error(400, "InvalidArgument", "invalid path component in request")


class Store:
    """The directory tree behind the server; every path that reaches the disk goes through here."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.path.realpath(root)

    def _inside(self, path: str) -> str:
        real = os.path.realpath(path)
        if real != self.root and not real.startswith(self.root + os.sep):
            raise S3Error(403, "AccessDenied", "path leaves the served root")
        return real

    def bucket_dir(self, bucket: str, must_exist: bool = True) -> str:
        _check_part(bucket)
        if "/" in bucket:
            raise S3Error(400, "InvalidBucketName", "invalid bucket name", bucket)
        path = self._inside(os.path.join(self.root, bucket))
        if must_exist and not os.path.isdir(path):
            raise S3Error(404, "NoSuchBucket", "The specified bucket does not exist", bucket)
        return path

    def key_path(self, bucket: str, key: str) -> tuple[str, bool]:
        """(filesystem path, is_marker) of an object key; a key ending in '/' is a directory marker."""
        base = self.bucket_dir(bucket)
        marker = key.endswith("/")
        parts = (key[:-1] if marker else key).split("/")
        for p in parts:
            _check_part(p)
        return self._inside(os.path.join(base, *parts)), marker

    def stat_object(self, bucket: str, key: str) -> os.stat_result:
        path, marker = self.key_path(bucket, key)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None:
            if marker and os.path.isdir(path) and not _has_entries(path):
                return st  # an empty directory is a directory marker object
            if not marker and os.path.isfile(path):
                return st
        raise S3Error(404, "NoSuchKey", "The specified key does not exist.", key)

    def keys(self, bucket: str, prefix: str) -> list[tuple[str, os.stat_result]]:
        """All (key, stat) under a prefix, sorted as S3 sorts (UTF-8 byte order = code point order)."""
        base = self.bucket_dir(bucket)
        # walk only the deepest directory the prefix names
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = base
        for p in head.split("/") if head else []:
            if p in ("", ".", "..") or "\x00" in p:
                return []
            start = os.path.join(start, p)
        try:
            start = self._inside(start)
        except S3Error:
            return []
        if not os.path.isdir(start):
            return []
        out: list[tuple[str, os.stat_result]] = []
        stack = [(start, head + "/" if head else "")]
        while stack:
            d, rel = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            if not entries and rel and rel.startswith(prefix):
                out.append((rel, os.stat(d)))  # empty directory: a marker
            for e in entries:
                if e.name.startswith(TMP_PREFIX):
                    continue
                key = rel + e.name
                if not (key.startswith(prefix) or prefix.startswith(key + "/")):
                    continue
                try:
                    if e.is_dir(follow_symlinks=True):
                        self._inside(e.path)
                        stack.append((e.path, key + "/"))
                    elif e.is_file(follow_symlinks=True) and key.startswith(prefix):
                        self._inside(e.path)
                        out.append((key, e.stat(follow_symlinks=True)))
                except (OSError, S3Error):
                    continue
        out.sort(key=lambda kv: kv[0])
        return out


def _has_entries(path: str) -> bool:
    with os.scandir(path) as it:
        return any(not e.name.startswith(TMP_PREFIX) for e in it)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """``bytes=a-b`` / ``a-`` / ``-n`` → (start, end inclusive); None = serve whole (unparsable or multi-range)."""
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    try:
        if first == "":
            n = int(last)
            if n <= 0 or size == 0:
                raise S3Error(416, "InvalidRange", "The requested range is not satisfiable")
            return max(0, size - n), size - 1
        a = int(first)
        b = int(last) if last else size - 1
    except ValueError:
        return None
    if a >= size:
        raise S3Error(416, "InvalidRange", "The requested range is not satisfiable")
    if a < 0 or b < a:
        return None
    return a, min(b, size - 1)


def _token(key: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"k": key}).encode()).decode()


def _untoken(tok: str) -> str:
    try:
        return json.loads(base64.urlsafe_b64decode(tok.encode()))["k"]
    except (ValueError, KeyError, TypeError) as e:
        raise S3Error(400, "InvalidArgument", "The continuation token provided is incorrect") from e


class Handler(BaseHTTPRequestHandler):
    """One connection (keep-alive): S3 REST, path-style addressing."""

    protocol_version = "HTTP/1.1"
    server_version = "s3dir"
    sys_version = ""
    disable_nagle_algorithm = True
    timeout = 600  # an idle keep-alive connection's thread ends after this
    store: Store  # set on the subclass made by make_server
    quiet = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (BaseHTTPRequestHandler's name)
        if not self.quiet:
            super().log_message(format, *args)

    # -- request parsing ---------------------------------------------------------------------------

    def _target(self) -> tuple[str, str, dict[str, str]]:
        """(bucket, key, query) of the request; refuses traversal and NUL before any path is built."""
        parts = urllib.parse.urlsplit(self.path)
        raw = parts.path
        if not raw.startswith("/"):
            raise S3Error(400, "InvalidURI", "Couldn't parse the specified URI.")
        path = urllib.parse.unquote(raw)
        if "\x00" in path:
            raise S3Error(400, "InvalidURI", "Couldn't parse the specified URI.")
        bucket, _, key = path[1:].partition("/")
        if not bucket and key:
            raise S3Error(400, "InvalidURI", "Couldn't parse the specified URI.")
        if bucket in (".", "..") or any(p in (".", "..") for p in key.split("/")):
            raise S3Error(400, "InvalidURI", "path traversal is not allowed")
        query = {k: v for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)}
        return bucket, key, query

    def _body_remaining(self) -> bool:
        return bool(int(self.headers.get("Content-Length") or 0)) or "chunked" in (
            self.headers.get("Transfer-Encoding") or "").lower()

    # -- responses ---------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/xml",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("x-amz-request-id", uuid.uuid4().hex[:16].upper())
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, e: S3Error) -> None:
        if self._body_remaining():
            self.close_connection = True  # the unread request body would poison the next request
        if self.command == "HEAD":
            self._send(e.status)  # HEAD errors carry no body
            return
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(e.code)}</Code><Message>{escape(e.message)}</Message>'
                f"<Resource>{escape(e.resource)}</Resource><RequestId>0</RequestId></Error>").encode()
        self._send(e.status, body)

    def _xml(self, xml: str) -> None:
        self._send(200, ('<?xml version="1.0" encoding="UTF-8"?>\n' + xml).encode())

    def _dispatch(self, fn) -> None:
        try:
            bucket, key, query = self._target()
            fn(bucket, key, query)
        except S3Error as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except OSError as e:
            self._error(S3Error(500, "InternalError", f"{type(e).__name__}: {e.strerror or e}"))

    def do_GET(self) -> None:
        self._dispatch(self._get)

    def do_HEAD(self) -> None:
        self._dispatch(self._head)

    def do_PUT(self) -> None:
        self._dispatch(self._put)

    def do_DELETE(self) -> None:
        self._dispatch(self._delete)

    def do_POST(self) -> None:
        self._dispatch(self._post)

    def _not_implemented(self) -> None:
        raise S3Error(501, "NotImplemented", "A header or query you provided implies functionality that is "
                      "not implemented by this server")

    # -- operations --------------------------------------------------------------------------------

    def _head(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if not bucket:
            raise S3Error(400, "InvalidRequest", "no bucket")
        if not key:
            self.store.bucket_dir(bucket)
            self._send(200, headers={"x-amz-bucket-region": "us-east-1"})
            return
        self._object(bucket, key, query, body=False)

    def _get(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if not bucket:
            self._list_buckets()
        elif not key:
            sub = set(query) & _BUCKET_SUBRESOURCES
            if "location" in query:
                self.store.bucket_dir(bucket)
                self._xml(f'<LocationConstraint xmlns="{S3_NS}"></LocationConstraint>')
            elif sub:
                self._not_implemented()
            else:
                self._list(bucket, query)
        else:
            self._object(bucket, key, query, body=True)

    def _object(self, bucket: str, key: str, query: dict[str, str], body: bool) -> None:
        if set(query) & _OBJECT_SUBRESOURCES:
            self._not_implemented()
        st = self.store.stat_object(bucket, key)
        path, marker = self.store.key_path(bucket, key)
        size = 0 if marker else st.st_size
        headers = {"Last-Modified": formatdate(st.st_mtime, usegmt=True), "ETag": _etag(st),
                   "Accept-Ranges": "bytes"}
        rng = self.headers.get("Range")
        start, end = 0, size - 1
        status = 200
        if rng and body:
            r = _parse_range(rng, size)
            if r is not None:
                start, end = r
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        count = end - start + 1
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(count))
        if not body or count == 0:
            self.end_headers()
            return
        with open(path, "rb") as f:
            sock = self.connection
            cork = hasattr(socket, "TCP_CORK")
            if cork:  # headers and the first body bytes in full packets
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            try:
                self.end_headers()
                sent = sock.sendfile(f, start, count)
            finally:
                if cork:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
        if sent != count:  # the file shrank under us: the response is broken, end the connection
            self.close_connection = True

    def _list_buckets(self) -> None:
        items = []
        for e in sorted(os.scandir(self.store.root), key=lambda e: e.name):
            if e.is_dir() and not e.name.startswith("."):
                items.append(f"<Bucket><Name>{escape(e.name)}</Name>"
                             f"<CreationDate>{_iso(e.stat().st_mtime)}</CreationDate></Bucket>")
        self._xml(f'<ListAllMyBucketsResult xmlns="{S3_NS}"><Owner><ID>s3dir</ID><DisplayName>s3dir'
                  f"</DisplayName></Owner><Buckets>{''.join(items)}</Buckets></ListAllMyBucketsResult>")

    def _list(self, bucket: str, q: dict[str, str]) -> None:
        v2 = q.get("list-type") == "2"
        prefix = q.get("prefix", "")
        delim = q.get("delimiter", "")
        try:
            max_keys = max(0, min(MAX_KEYS, int(q.get("max-keys", MAX_KEYS))))
        except ValueError as e:
            raise S3Error(400, "InvalidArgument", "max-keys is not an integer") from e
        url = q.get("encoding-type") == "url"
        if v2:
            after = _untoken(q["continuation-token"]) if q.get("continuation-token") else q.get("start-after", "")
        else:
            after = q.get("marker", "")
        keys = self.store.keys(bucket, prefix)
        contents: list[tuple[str, os.stat_result]] = []
        prefixes: list[str] = []
        truncated = False
        last = ""
        for key, st in keys:
            if key <= after or (delim and after.endswith(delim) and key.startswith(after)
                                and after[len(prefix):].find(delim) >= 0):
                continue  # before the resume point, or inside the common prefix that ended the last page
            cp = None
            if delim:
                i = key.find(delim, len(prefix))
                if i >= 0:
                    cp = key[:i + len(delim)]
                    if prefixes and prefixes[-1] == cp:
                        continue
            if len(contents) + len(prefixes) >= max_keys:
                truncated = True
                break
            if cp is not None:
                prefixes.append(cp)
                last = cp
            else:
                contents.append((key, st))
                last = key

        def enc(s: str) -> str:
            return escape(urllib.parse.quote(s, safe="/") if url else s)

        out = [f'<ListBucketResult xmlns="{S3_NS}"><Name>{escape(bucket)}</Name><Prefix>{enc(prefix)}</Prefix>']
        if v2:
            out.append(f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount>")
            if q.get("continuation-token"):
                out.append(f"<ContinuationToken>{escape(q['continuation-token'])}</ContinuationToken>")
            if q.get("start-after"):
                out.append(f"<StartAfter>{enc(q['start-after'])}</StartAfter>")
        else:
            out.append(f"<Marker>{enc(after)}</Marker>")
        out.append(f"<MaxKeys>{max_keys}</MaxKeys>")
        if delim:
            out.append(f"<Delimiter>{enc(delim)}</Delimiter>")
        if url:
            out.append("<EncodingType>url</EncodingType>")
        out.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
        if truncated:
            out.append(f"<NextContinuationToken>{_token(last)}</NextContinuationToken>" if v2
                       else f"<NextMarker>{enc(last)}</NextMarker>")
        for key, st in contents:
            size = 0 if key.endswith("/") else st.st_size
            out.append(f"<Contents><Key>{enc(key)}</Key><LastModified>{_iso(st.st_mtime)}</LastModified>"
                       f"<ETag>{escape(_etag(st))}</ETag><Size>{size}</Size>"
                       "<StorageClass>STANDARD</StorageClass></Contents>")
        for p in prefixes:
            out.append(f"<CommonPrefixes><Prefix>{enc(p)}</Prefix></CommonPrefixes>")
        out.append("</ListBucketResult>")
        self._xml("".join(out))

    def _read_body(self) -> Iterator[bytes]:
        """The request body in pieces: Content-Length or HTTP chunked, then aws-chunked decoded."""
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            raw = self._http_chunks()
        else:
            raw = self._fixed(int(self.headers.get("Content-Length") or 0))
        if "aws-chunked" in (self.headers.get("Content-Encoding") or "").lower():
            return self._aws_chunks(_Reader(raw))
        return raw

    def _fixed(self, n: int) -> Iterator[bytes]:
        while n > 0:
            b = self.rfile.read(min(n, 1 << 20))
            if not b:
                raise S3Error(400, "IncompleteBody", "request body ended early")
            n -= len(b)
            yield b

    def _http_chunks(self) -> Iterator[bytes]:
        while True:
            line = self.rfile.readline(1024)
            try:
                n = int(line.split(b";")[0].strip(), 16)
            except ValueError as e:
                raise S3Error(400, "IncompleteBody", "bad chunk header") from e
            if n == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return
            yield from self._fixed(n)
            self.rfile.readline(16)

    @staticmethod
    def _aws_chunks(r: _Reader) -> Iterator[bytes]:
        while True:
            line = r.readline()
            try:
                n = int(line.split(b";")[0].strip(), 16)
            except ValueError as e:
                raise S3Error(400, "IncompleteBody", "bad aws-chunked header") from e
            if n == 0:
                return  # trailers (checksums) follow; not verified
            data = r.read(n)
            if len(data) != n:
                raise S3Error(400, "IncompleteBody", "aws-chunked body ended early")
            yield data
            r.readline()

    def _put(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if not bucket:
            raise S3Error(400, "InvalidRequest", "no bucket")
        if not key:
            if set(query) & _BUCKET_SUBRESOURCES:
                self._not_implemented()
            path = self.store.bucket_dir(bucket, must_exist=False)
            for _ in self._read_body():  # CreateBucketConfiguration: ignored
                pass
            os.makedirs(path, exist_ok=True)
            self._send(200, headers={"Location": "/" + bucket})
            return
        if "uploadId" in query and "partNumber" in query and "x-amz-copy-source" not in self.headers:
            self._upload_part(bucket, key, query)
            return
        if set(query) & _OBJECT_SUBRESOURCES or "x-amz-copy-source" in self.headers:
            self._not_implemented()
        path, marker = self.store.key_path(bucket, key)
        if marker:
            for _ in self._read_body():
                pass
            os.makedirs(path, exist_ok=True)
            st = os.stat(path)
        else:
            parent = os.path.dirname(path)
            try:
                os.makedirs(parent, exist_ok=True)
            except (FileExistsError, NotADirectoryError) as e:
                raise S3Error(409, "InvalidRequest", "a parent of this key is an object here") from e
            if os.path.isdir(path):
                raise S3Error(409, "InvalidRequest", "this key is a prefix of other keys here")
            st = _write_replace(path, self._read_body())
        self._send(200, headers={"ETag": _etag(st)})

    # -- multipart upload (pyarrow's output streams always start one) ------------------------------

    def _upload_dir(self, bucket: str, key: str, upload_id: str) -> str:
        if not upload_id.isalnum():
            raise S3Error(404, "NoSuchUpload", "The specified upload does not exist.")
        d = os.path.join(self.store.root, UPLOADS_DIR, upload_id)
        try:
            with open(os.path.join(d, "target"), encoding="utf-8") as f:
                if f.read() != bucket + "/" + key:
                    raise S3Error(404, "NoSuchUpload", "The specified upload does not exist.")
        except FileNotFoundError as e:
            raise S3Error(404, "NoSuchUpload", "The specified upload does not exist.") from e
        return d

    def _post(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if not bucket or not key:
            self._not_implemented()
        path, marker = self.store.key_path(bucket, key)
        if marker:
            raise S3Error(400, "InvalidRequest", "multipart upload of a directory marker")
        if "uploads" in query:  # CreateMultipartUpload
            for _ in self._read_body():
                pass
            upload_id = uuid.uuid4().hex
            d = os.path.join(self.store.root, UPLOADS_DIR, upload_id)
            os.makedirs(d)
            with open(os.path.join(d, "target"), "w", encoding="utf-8") as f:
                f.write(bucket + "/" + key)
            self._xml(f'<InitiateMultipartUploadResult xmlns="{S3_NS}"><Bucket>{escape(bucket)}</Bucket>'
                      f"<Key>{escape(key)}</Key><UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>")
        elif "uploadId" in query:  # CompleteMultipartUpload
            d = self._upload_dir(bucket, key, query["uploadId"])
            body = b"".join(self._read_body())
            if len(body) > 1 << 20:
                raise S3Error(400, "MalformedXML", "completion request too large")
            try:
                numbers = [int(el.text or "") for el in ElementTree.fromstring(body).iter()
                           if el.tag.rsplit("}", 1)[-1] == "PartNumber"]
            except (ElementTree.ParseError, ValueError) as e:
                raise S3Error(400, "MalformedXML", "bad CompleteMultipartUpload body") from e
            for n in numbers:
                if not os.path.isfile(os.path.join(d, f"part-{n:05d}")):
                    raise S3Error(400, "InvalidPart", f"part {n} was not uploaded")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.isdir(path):
                raise S3Error(409, "InvalidRequest", "this key is a prefix of other keys here")

            def pieces() -> Iterator[bytes]:
                for n in numbers:
                    with open(os.path.join(d, f"part-{n:05d}"), "rb") as f:
                        while b := f.read(1 << 20):
                            yield b

            st = _write_replace(path, pieces())
            shutil.rmtree(d, ignore_errors=True)
            self._xml(f'<CompleteMultipartUploadResult xmlns="{S3_NS}"><Location>/{escape(bucket)}/'
                      f"{escape(key)}</Location><Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
                      f"<ETag>{escape(_etag(st))}</ETag></CompleteMultipartUploadResult>")
        else:
            self._not_implemented()

    def _upload_part(self, bucket: str, key: str, query: dict[str, str]) -> None:
        d = self._upload_dir(bucket, key, query["uploadId"])
        try:
            n = int(query["partNumber"])
        except ValueError as e:
            raise S3Error(400, "InvalidArgument", "bad partNumber") from e
        if not 1 <= n <= 10000:
            raise S3Error(400, "InvalidArgument", "partNumber must be 1..10000")
        md5 = hashlib.md5()

        def hashed() -> Iterator[bytes]:
            for b in self._read_body():
                md5.update(b)
                yield b

        _write_replace(os.path.join(d, f"part-{n:05d}"), hashed())
        self._send(200, headers={"ETag": f'"{md5.hexdigest()}"'})

    def _delete(self, bucket: str, key: str, query: dict[str, str]) -> None:
        if key and "uploadId" in query:  # AbortMultipartUpload
            shutil.rmtree(self._upload_dir(bucket, key, query["uploadId"]), ignore_errors=True)
            self._send(204)
            return
        if not key or set(query) & _OBJECT_SUBRESOURCES:
            self._not_implemented()
        path, marker = self.store.key_path(bucket, key)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError, OSError):
            if marker:
                os.rmdir(path)  # only when empty
            elif os.path.isfile(path):
                os.unlink(path)
        self._send(204)


def _write_replace(path: str, pieces: Iterator[bytes]) -> os.stat_result:
    """Write to a temp file beside ``path``, then ``os.replace`` (readers never see a partial object)."""
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return os.stat(path)


class _Reader:
    """A file-like view (readline/read) over an iterator of byte pieces."""

    def __init__(self, pieces: Iterator[bytes]):
        self._it = pieces
        self._buf = b""

    def _more(self) -> bool:
        b = next(self._it, b"")
        self._buf += b
        return bool(b)

    def readline(self) -> bytes:
        while b"\n" not in self._buf and len(self._buf) < 4096 and self._more():
            pass
        i = self._buf.find(b"\n")
        i = len(self._buf) if i < 0 else i + 1
        line, self._buf = self._buf[:i], self._buf[i:]
        return line

    def read(self, n: int) -> bytes:
        while len(self._buf) < n and self._more():
            pass
        out, self._buf = self._buf[:n], self._buf[n:]
        return out


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def make_server(root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0,
                quiet: bool = True) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) over ``root``; ``server.server_address`` has the bound port."""
    handler = type("BoundHandler", (Handler,), {"store": Store(root), "quiet": quiet})
    return _Server((host, port), handler)


# ------------------------------------------------------------------------------------------------
# test/benchmark helper: the same interface as tests/s3server.py


@dataclass
class DirS3Server(S3Server):
    """A running directory-backed S3 server; buckets and uploads are plain directory operations."""

    root: Path = field(default_factory=Path, kw_only=True)

    def new_bucket(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        (self.root / name).mkdir()
        return name

    def upload(self, local_dir: str | os.PathLike, dest: str) -> str:
        """Copy a local tree to ``bucket/prefix`` inside the root (hard links on the same filesystem)."""
        dest = dest.removeprefix("s3://").strip("/")
        parts = dest.split("/")
        for p in parts:
            _check_part(p)
        target = self.root.joinpath(*parts)
        (self.root / parts[0]).mkdir(exist_ok=True)
        shutil.copytree(local_dir, target, copy_function=_link_or_copy, dirs_exist_ok=True)
        return "s3://" + dest


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, dst)


def start_dir_s3_server(root: str | os.PathLike, timeout: float = 30.0) -> tuple[subprocess.Popen, DirS3Server]:
    """Start ``python -m tests.s3dir`` over ``root`` on a free loopback port; wait until it answers."""
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc, port = start_server_process(
        lambda port: [sys.executable, "-m", "tests.s3dir", "--root", os.fspath(root), "--host", "127.0.0.1",
                      "--port", str(port)],
        "/", "s3dir server", timeout, env, cwd=repo, poll=0.05)
    return proc, DirS3Server("127.0.0.1", port, proc.pid, root=Path(root))


@contextlib.contextmanager
def running_dir_s3_server(root: Path | None = None) -> Iterator[DirS3Server]:
    """A directory-backed loopback S3 server for the block (stopped by PID on exit).

    Without ``root`` a temporary directory is served and removed afterwards.
    """
    tmp = None if root is not None else tempfile.mkdtemp(prefix="s3dir-")
    proc, server = start_dir_s3_server(root if root is not None else tmp)
    try:
        yield server
    finally:
        stop_s3_server(proc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="S3-compatible HTTP server over a local directory (tests only)")
    ap.add_argument("--root", type=Path, required=True, help="served directory: ROOT/<bucket>/<key>")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = ap.parse_args(argv)
    if not args.root.is_dir():
        ap.error(f"--root {args.root} is not a directory")
    server = make_server(args.root, args.host, args.port, quiet=not args.verbose)
    print(f"s3dir serving {args.root} on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
