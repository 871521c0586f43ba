"""The first bytes of an open source, as a source of their own: a reader that must see no further than a
read position. The broker's reput reads a file through ``getData``, whose buffer ends at the file's read
position, so a record running past it fails there as it would at the file's end (-1, or a length
mismatch when only TOTALSIZE runs past); scanning a prefix gives the scan and the scalar check that end."""

from __future__ import annotations

from storelib.fileio.bytesource import LocalSource


class PrefixLocal(LocalSource):
    """The first ``size`` bytes of a :class:`LocalSource` (still a LocalSource: its mapping's fast path).
    The inner source stays open; its owner closes it."""

    def __init__(self, src: LocalSource, size: int):  # no super().__init__: the file is already mapped
        self.path = src.path
        self.size = max(0, min(int(size), src.size))
        self._mm = None
        self._view = src.view()[: self.size]

    def close(self) -> None:
        self._view = None


class PrefixRanged:
    """The first ``size`` bytes of a ranged source (``read``/``read_range`` cut at ``size``)."""

    def __init__(self, src, size: int):
        self._src = src
        self.path = getattr(src, "path", None)
        self.size = max(0, min(int(size), int(src.size)))

    def read(self, offset: int, length: int):
        return self._src.read(offset, max(0, min(length, self.size - offset)))

    def read_range(self, offset: int, length: int):
        return getattr(self._src, "read_range", self._src.read)(offset, max(0, min(length, self.size - offset)))

    def close(self) -> None:
        pass


def prefix(src, size: int | None):
    """``src`` itself when ``size`` is None or not below its size, else its first ``size`` bytes."""
    if size is None or size >= src.size:
        return src
    return PrefixLocal(src, size) if isinstance(src, LocalSource) else PrefixRanged(src, size)
