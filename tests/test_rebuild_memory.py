"""The rebuild's process memory setting: glibc keeps freed blocks for reuse unless the user chose otherwise."""

from __future__ import annotations

import ctypes
import sys

import pytest

import storelib.fileio.memory as rb


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


@pytest.fixture
def libc(monkeypatch):
    fake = _Libc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    monkeypatch.setattr(rb, "_malloc_kept", False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    return fake


@pytest.mark.skipif(sys.platform != "linux", reason="glibc mallopt")
def test_mmap_and_trim_thresholds_are_raised_once_per_process(libc):
    rb.keep_freed_memory()
    rb.keep_freed_memory()
    assert libc.calls == [(-3, rb.MALLOC_KEEP), (-1, rb.MALLOC_KEEP)]


@pytest.mark.parametrize("var", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_the_users_malloc_environment_wins(libc, monkeypatch, var):
    monkeypatch.setenv(var, "65536")
    rb.keep_freed_memory()
    assert libc.calls == []
