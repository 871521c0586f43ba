"""Big files written past the page cache (O_DIRECT) hold exactly the bytes written, whatever the write
sizes; where the filesystem refuses O_DIRECT the same writer goes through the cache."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from storelib.fileio import direct_write
from storelib.fileio.direct_write import BLOCK, DirectFileWriter, atomic_direct_file, open_direct


def _pieces(seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes()
            for n in rng.choice([1, 19, BLOCK - 1, BLOCK, BLOCK + 3, 3 * BLOCK + 5, 70_000], 40)]


@pytest.mark.parametrize("buffer_size", [BLOCK, 3 * BLOCK, 1 << 20])
def test_file_holds_the_bytes_written_then_its_truncated_length(tmp_path, buffer_size):
    pieces = _pieces(buffer_size)
    path = tmp_path / "f"
    fd, w = open_direct(path, buffer_size=buffer_size)
    try:
        with w:
            for p in pieces:
                w.write(p)
            w.truncate(sum(map(len, pieces)) + 10_000)  # a zero tail, like an index file's
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(pieces) + bytes(10_000)


def test_close_without_truncate_ends_at_the_last_byte_written(tmp_path):
    path = tmp_path / "f"
    fd, w = open_direct(path)
    try:
        with w:
            w.write(b"x" * (BLOCK + 7))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * (BLOCK + 7)


def test_a_filesystem_refusing_o_direct_at_write_time_falls_back_to_the_cache(tmp_path, monkeypatch):
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd, data, pos):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, pos)

    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        w = DirectFileWriter(fd, direct=True, buffer_size=BLOCK)
        monkeypatch.setattr(direct_write.os, "pwrite", pwrite)
        with w:
            w.write(b"y" * (2 * BLOCK + 1))
        assert not w.direct
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b"y" * (2 * BLOCK + 1)


def test_writing_after_the_end_is_refused(tmp_path):
    fd, w = open_direct(tmp_path / "f")
    try:
        w.flush()
        with pytest.raises(ValueError, match="written once"):
            w.write(b"z")
        w.close()
    finally:
        os.close(fd)


def test_an_existing_file_is_never_overwritten(tmp_path):
    (tmp_path / "f").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        open_direct(tmp_path / "f")
    assert (tmp_path / "f").read_bytes() == b"keep"


def test_atomic_direct_file_replaces_the_target_only_when_complete_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "index" / "f"
    pieces = _pieces(3)
    with atomic_direct_file(path, buffer_size=BLOCK) as w:
        for p in pieces:
            w.write(p)
        assert not path.exists()  # nothing visible before the rename
        w.truncate(len(b"".join(pieces)) + 10_000)
    assert path.read_bytes() == b"".join(pieces) + bytes(10_000)
    assert os.listdir(path.parent) == ["f"]
    with pytest.raises(RuntimeError), atomic_direct_file(path) as w:
        w.write(b"new content")
        raise RuntimeError("the writer failed midway")
    assert path.read_bytes() == b"".join(pieces) + bytes(10_000)  # the old file is intact
    assert os.listdir(path.parent) == ["f"]
