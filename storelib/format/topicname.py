"""Topic names as the broker's store treats them: any string, one directory entry under consumequeue/.

The store does not validate topic names: older clients, proxies and other writers put names such as
``订单事件_テスト_ñ`` or ``Emoji🚀Topic`` into real stores, and the broker's dispatch made them
directories. So a rebuild (and every lookup) uses the name as it is, and refuses only a name that
cannot safely be one directory entry (empty, ``.``/``..``, a path separator, NUL, longer than a
directory entry holds): such a topic is a finding and is skipped, never a write outside the output.
"""

from __future__ import annotations

import os
import re

from storelib.errors import Finding, StoreError

MAX_TOPIC_DIR_BYTES = 255  # NAME_MAX of ext4/xfs/btrfs and the S3-style stores we write to
# TopicValidator (both tags): ^[%|a-zA-Z0-9_-]+$ ; '+' for 5.x POP retry topics (%RETRY%group+topic)
_STANDARD = re.compile(r"[%|a-zA-Z0-9_+\-]+")
_SEPARATORS = {"/", os.sep} | ({os.altsep} if os.altsep else set())


def unsafe_reason(topic: object) -> str | None:
    """Why ``topic`` cannot be one directory entry on the output filesystem (None when it can)."""
    if not isinstance(topic, str):
        return "not a string"
    if topic in ("", ".", ".."):
        return "empty, '.' or '..'"
    if any(sep in topic for sep in _SEPARATORS):
        return "contains a path separator"
    if "\x00" in topic:
        return "contains NUL"
    n = len(topic.encode("utf-8", "surrogatepass"))
    if n > MAX_TOPIC_DIR_BYTES:
        return f"{n} bytes in UTF-8, more than a directory entry holds ({MAX_TOPIC_DIR_BYTES})"
    return None


def safe_topic_dirname(topic: str) -> str:
    """``topic`` itself when it can be one directory entry, else ``StoreError(kind="unsafe_topic_name")``."""
    why = unsafe_reason(topic)
    if why is not None:
        raise StoreError(None, None, "unsafe_topic_name", f"topic {escape_topic(topic)} cannot be a directory: {why}")
    return topic


def is_standard_topic(topic: str) -> bool:
    """Whether the broker's TopicValidator would accept the name (others are legal on disk, just unusual)."""
    return bool(_STANDARD.fullmatch(topic)) and len(topic) <= MAX_TOPIC_DIR_BYTES


def escape_topic(topic: object, limit: int = 120) -> str:
    """A printable, quoted, bounded form of an untrusted name for findings and errors."""
    text = ascii(topic) if not isinstance(topic, str) else topic.encode("unicode_escape").decode("ascii")
    return "'" + (text[:limit] + "..." if len(text) > limit else text) + "'"


def unsafe_topic_finding(topic: str, file: str | None, offset: int | None, records: int | None,
                         first_phy: int | None = None) -> Finding:
    """One finding for a topic a rebuild skipped: where its (first) records are, the name escaped."""
    count = f"{records} record(s)" if records is not None else "records"
    return Finding("unsafe_topic_name", "error", file, offset,
                   f"topic {escape_topic(topic)} ({unsafe_reason(topic)}): no consume queue can hold its {count} (the "
                   "name cannot be one directory); a rebuild skips it, rebuilds every other topic and keeps "
                   "its index entries",
                   {"topic_escaped": escape_topic(topic, 1000), "records": records, "first_phy_offset": first_phy})
