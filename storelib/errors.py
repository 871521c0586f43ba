"""Typed errors and findings: every problem names the file and byte offset it is about.

An operator must be able to act on one line, so both carry file, offset, kind and a short detail,
and ``str()`` renders exactly that line (the CLI prints it instead of a traceback).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "error", "critical")


class StoreError(Exception):
    """A store file could not be read or written as asked.

    ``file`` is the path (as given by the user, or relative to the store root), ``offset`` the byte
    offset inside that file (None when the problem is the file as a whole), ``kind`` a stable
    machine-readable name (e.g. ``bad_magic``, ``truncated``, ``bad_size``).
    """

    def __init__(self, file: str | None, offset: int | None, kind: str, detail: str):
        self.file = file
        self.offset = offset
        self.kind = kind
        self.detail = detail
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = self.file or "<store>"
        if self.offset is not None:
            where += f" @ {self.offset}"
        return f"{where}: {self.kind}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "kind": self.kind, "detail": self.detail}

    def __reduce__(self):  # crosses process boundaries (a worker's error reaches the caller whole)
        return type(self), (self.file, self.offset, self.kind, self.detail)


class CorruptRecordError(StoreError):
    """A commitlog record failed validation."""


class StoreLayoutError(StoreError):
    """The store directory itself is not usable (missing, unreadable, RocksDB CQ, ...)."""


@dataclass
class Finding:
    """One thing an audit, a scan or a loader noticed; never raised, always collected."""

    kind: str
    severity: str
    file: str | None
    offset: int | None
    detail: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["extra"]:
            d.pop("extra")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """The finding :meth:`to_dict` gave (state files, task results)."""
        return cls(d["kind"], d["severity"], d["file"], d["offset"], d["detail"], d.get("extra") or {})

    def __str__(self) -> str:
        where = self.file or "<store>"
        if self.offset is not None:
            where += f" @ {self.offset}"
        return f"[{self.severity}] {where}: {self.kind}: {self.detail}"
