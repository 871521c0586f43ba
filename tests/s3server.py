"""A real S3-compatible server on the loopback interface for tests and benchmarks (moto's standalone server).

``s3_server`` (session fixture) starts ``python -m moto.server -H 127.0.0.1 -p PORT`` on a free port,
waits until it answers HTTP, yields an :class:`S3Server` (endpoint, credentials, helpers) and stops
the process by its PID at teardown, also when tests fail. Nothing here talks to a real cloud: the
fixture points pyarrow's and boto's environment variables at the loopback server for the session.

Outside pytest (benchmarks) use ``with running_s3_server() as s3: ...``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
import pytest

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


@dataclass
class S3Server:
    """A running loopback S3 server: where it listens and the options that reach it."""

    host: str
    port: int
    pid: int
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def fs_options(self) -> dict[str, str]:
        """Keyword options for ``storelib.fileio.bytesource.resolve`` / ``Store`` / ``pafs.S3FileSystem``."""
        return {"endpoint_override": f"{self.host}:{self.port}", "scheme": "http", "region": self.region,
                "access_key": self.access_key, "secret_key": self.secret_key}

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(allow_bucket_creation=True, allow_bucket_deletion=True, **self.fs_options())

    def env(self) -> dict[str, str]:
        """The environment variables by which pyarrow, boto3 and Spark find this server."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def cli_args(self) -> list[str]:
        """``rmqstore`` flags for this server (credentials come from ``env()``)."""
        return ["--s3-endpoint", self.endpoint, "--s3-region", self.region]

    def new_bucket(self, prefix: str = "t") -> str:
        """Create an empty bucket with a unique name and return the name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def upload(self, local_dir: str | os.PathLike, dest: str) -> str:
        """Copy a local directory tree to ``bucket/prefix`` (``pyarrow.fs.copy_files``); returns its s3:// URI."""
        dest = dest.removeprefix("s3://").strip("/")
        fs = self.filesystem()
        bucket = dest.split("/", 1)[0]
        if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            fs.create_dir(bucket)
        pafs.copy_files(os.fspath(local_dir), dest, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs, use_threads=True)
        return "s3://" + dest

    def download(self, src: str, local_dir: str | os.PathLike) -> Path:
        """Copy ``s3://bucket/prefix`` (a tree) to a local directory."""
        src = src.removeprefix("s3://").strip("/")
        os.makedirs(local_dir, exist_ok=True)
        pafs.copy_files(src, os.fspath(local_dir), source_filesystem=self.filesystem(),
                        destination_filesystem=pafs.LocalFileSystem())
        return Path(local_dir)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status < 500
    except urllib.error.HTTPError as e:
        return e.code < 500
    except OSError:
        return False


def _die_with_parent() -> None:
    """Linux: the server gets SIGTERM when the test process dies, even by SIGKILL (no teardown runs then)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the fixture's teardown is the only guard
        pass


def start_server_process(argv_for_port, probe_path: str, name: str, timeout: float, env: dict[str, str],
                         cwd: str | None = None, poll: float = 0.1) -> tuple[subprocess.Popen, int]:
    """Start a loopback server (``argv_for_port(port)``) on a free port and wait until
    ``http://127.0.0.1:PORT{probe_path}`` answers; tries three ports, then raises with the server's log."""
    last = ""
    for _ in range(3):
        port = _free_port()
        log = tempfile.TemporaryFile()
        proc = subprocess.Popen(argv_for_port(port), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _answers(f"http://127.0.0.1:{port}{probe_path}"):
                log.close()
                return proc, port
            time.sleep(poll)
        stop_s3_server(proc)
        log.seek(0)
        last = log.read()[-2000:].decode("utf-8", "replace")
        log.close()
    raise RuntimeError(f"{name} did not start on 127.0.0.1: {last}")


def start_s3_server(timeout: float = 60.0, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, S3Server]:
    """Start moto's server on a free loopback port and wait until it answers (tries three ports)."""
    proc, port = start_server_process(
        lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        "/moto-api/", "moto server", timeout, {**os.environ, **(extra_env or {})})
    return proc, S3Server("127.0.0.1", port, proc.pid)


def stop_s3_server(proc: subprocess.Popen) -> None:
    """Stop the server by its PID: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextlib.contextmanager
def running_s3_server(extra_env: dict[str, str] | None = None) -> Iterator[S3Server]:
    """A loopback S3 server for the duration of the block (always stopped by PID on exit)."""
    proc, server = start_s3_server(extra_env=extra_env)
    try:
        yield server
    finally:
        stop_s3_server(proc)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One loopback moto S3 server for the test session, with the AWS_* environment pointing at it."""
    with running_s3_server() as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
