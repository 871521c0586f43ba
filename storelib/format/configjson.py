"""The broker's ``config/*.json`` files: load with ``.bak`` fallback, write, typed tables (store-format §8).

Loading mirrors ``ConfigManager.load``: a missing, empty or unparseable file falls back to ``.bak``,
and the result says which file was used and why. The text itself is fastjson's
(:mod:`storelib.format.fastjson`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from storelib.errors import Finding, StoreError
from storelib.fileio.bytesource import Location
from storelib.fileio.smallfile_io import (
    PathOrLocation,
    as_location,
    atomic_write,
    local_path,
    read_small,
    write_file_fsync,
)
from storelib.format.fastjson import dump_fastjson, parse_fastjson
from storelib.format.properties import java_string

CONFIG_DIR = "config"
TOPICS = "topics.json"
CONSUMER_OFFSET = "consumerOffset.json"
LMQ_CONSUMER_OFFSET = "lmqConsumerOffset.json"
SUBSCRIPTION_GROUP = "subscriptionGroup.json"
DELAY_OFFSET = "delayOffset.json"
CONSUMER_FILTER = "consumerFilter.json"
TOPIC_GROUP_SEPARATOR = "@"
MAX_CONFIG_SIZE = 512 * 1024 * 1024

# ---- loading ----------------------------------------------------------------------------------


@dataclass
class ConfigLoad:
    """Result of loading one config file the way the broker does.

    ``source`` is "file", "bak", "tmp" or None (nothing loadable: the broker would start with an
    empty table, or refuse to start when the .bak is corrupt); ``path`` is the file actually used.
    """

    name: str
    data: dict | None
    source: str | None
    path: str | None
    findings: list[Finding] = field(default_factory=list)


def _decode(raw: bytes, path: str, findings: list[Finding]) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        findings.append(
            Finding(
                "config_not_utf8",
                "warning",
                path,
                e.start,
                "not valid UTF-8; decoded with replacement characters as the JVM would",
            )
        )
        return java_string(raw)  # MixAll.file2String: new String(data, UTF-8)


def _try(loc: Location, findings: list[Finding]) -> tuple[str, dict | None, StoreError | None, bytes | None]:
    """('missing'|'empty'|'bad'|'ok', data, error, raw)."""
    try:
        raw = read_small(loc, MAX_CONFIG_SIZE)
    except StoreError as e:
        return "bad", None, e, None
    if raw is None:
        return "missing", None, None, None
    if len(raw) == 0:
        return "empty", None, None, raw
    text = _decode(raw, loc.path, findings)
    try:
        return "ok", parse_fastjson(text, file=loc.path), None, raw
    except StoreError as e:
        return "bad", None, e, raw


def config_location(root: PathOrLocation, name: str) -> Location:
    """``<root>/config/<name>``."""
    return as_location(root).join(CONFIG_DIR, name)


def load_config(root: PathOrLocation, name: str, *, use_tmp: bool = False) -> ConfigLoad:
    """Load ``config/<name>`` of a store root like ConfigManager.load, saying what happened.

    Missing, empty or unparseable file -> ``.bak`` (a finding says so). A 4.x ``.tmp`` leftover is
    reported; the broker never reads it, but with ``use_tmp=True`` a parseable ``.tmp`` is preferred
    to the ``.bak`` when the file itself is unusable (a crash between delete and rename leaves the
    newest complete text there).
    """
    loc = config_location(root, name)
    bak = Location(loc.fs, loc.path + ".bak", loc.local)
    tmp = Location(loc.fs, loc.path + ".tmp", loc.local)
    findings: list[Finding] = []

    state, data, err, raw = _try(loc, findings)
    tmp_state, tmp_data, tmp_err, tmp_raw = _try(tmp, findings)
    if tmp_state != "missing":
        same = tmp_raw is not None and raw is not None and tmp_raw == raw
        what = {"ok": "parses", "empty": "is empty", "bad": f"does not parse ({tmp_err})"}[tmp_state]
        findings.append(
            Finding(
                "config_tmp_leftover",
                "warning",
                tmp.path,
                None,
                f"leftover .tmp from an interrupted 4.x persist; it {what}"
                + ("; same content as the file" if same else ""),
                {"parses": tmp_state == "ok", "same_as_file": same},
            )
        )
    if state == "ok":
        return ConfigLoad(name, data, "file", loc.path, findings)

    why = {"missing": "config_missing", "empty": "config_empty", "bad": "config_unparseable"}[state]
    detail = {"missing": "file does not exist", "empty": "file is empty"}.get(state) or (
        err.detail if err else "unreadable"
    )
    primary = Finding(why, "warning", loc.path, err.offset if err else None, detail)
    findings.append(primary)

    if use_tmp and tmp_state == "ok":
        primary.detail += "; loaded the .tmp leftover instead (use_tmp)"
        primary.extra["fallback"] = "tmp"
        return ConfigLoad(name, tmp_data, "tmp", tmp.path, findings)

    bstate, bdata, berr, _ = _try(bak, findings)
    if bstate == "ok":
        primary.detail += "; loaded .bak instead, as the broker does"
        primary.extra["fallback"] = "bak"
        return ConfigLoad(name, bdata, "bak", bak.path, findings)
    primary.extra["fallback"] = None
    if bstate == "bad":
        findings.append(
            Finding(
                "config_bak_unparseable",
                "error",
                bak.path,
                berr.offset if berr else None,
                f"{berr.detail if berr else 'unreadable'}; the broker would fail to start",
            )
        )
    elif state == "missing" and bstate == "missing":
        primary.severity = "info"
        primary.detail += " and there is no .bak: the broker starts with an empty table"
    else:
        findings.append(
            Finding(
                "config_bak_" + bstate,
                "error",
                bak.path,
                None,
                f".bak is {bstate}: the broker would start with an empty table, losing this file's state",
            )
        )
    return ConfigLoad(name, None, None, None, findings)


def write_config(path: str | os.PathLike | Location, data: Mapping[str, Any], pretty: bool = True) -> str:
    """Persist like 4.9.8's MixAll.string2File: text -> ``<file>.tmp``, old content -> ``<file>.bak``,
    then ``<file>.tmp`` renamed over ``<file>`` (os.replace, so there is no moment without a file).

    Returns the path written.
    """
    target = local_path(path)
    try:
        payload = dump_fastjson(data, pretty).encode("utf-8")
    except UnicodeEncodeError as e:
        raise StoreError(target, None, "bad_value", f"text is not encodable as UTF-8: {e.reason}") from e
    tmp = target + ".tmp"
    write_file_fsync(tmp, payload)
    try:
        with open(target, "rb") as f:
            prev = f.read()
    except FileNotFoundError:
        prev = None
    except OSError as e:
        raise StoreError(target, None, "unreadable", str(e)) from e
    if prev is not None:
        atomic_write(target + ".bak", prev)
    try:
        os.replace(tmp, target)
    except OSError as e:
        raise StoreError(target, None, "write_failed", str(e)) from e
    return target


# ---- typed accessors --------------------------------------------------------------------------


def split_topic_group(key: str) -> tuple[str, str] | None:
    """Split an offset-table key ``<topic>@<group>``; None when there is no '@'.

    Topic names cannot contain '@' (the broker validates topics against ``[%|a-zA-Z0-9_-]``), while a
    group name is only checked by the Java client, so the split is at the FIRST '@'. The one case where
    that is wrong is a retry/DLQ topic of such a group (``%RETRY%a@b@a@b``): a split whose topic is
    ``%RETRY%<group>`` or ``%DLQ%<group>`` is preferred.
    """
    if TOPIC_GROUP_SEPARATOR not in key:
        return None
    parts = key.split(TOPIC_GROUP_SEPARATOR)
    if len(parts) > 2:
        for i in range(1, len(parts)):
            topic, group = "@".join(parts[:i]), "@".join(parts[i:])
            if topic in ("%RETRY%" + group, "%DLQ%" + group):
                return topic, group
    topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
    return topic, group


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?[0-9]+", v):
        return int(v)
    return None


def _note(findings: list[Finding] | None, kind: str, detail: str, file: str | None) -> None:
    if findings is not None:
        findings.append(Finding(kind, "warning", file, None, detail))


def consumer_offsets(
    data: Mapping[str, Any] | None,
    *,
    include_lmq: bool = False,
    findings: list[Finding] | None = None,
    file: str | None = None,
) -> dict[tuple[str, str], dict[int, int]]:
    """``offsetTable`` of consumerOffset.json / lmqConsumerOffset.json as {(topic, group): {queue: offset}}.

    Accepts our parse (int queue keys) or strict JSON (string keys). ``include_lmq`` adds
    ``lmqOffsetTable`` entries as queue 0 (LMQ queues have the single queue id 0). Malformed entries are
    skipped and reported in ``findings``.
    """
    out: dict[tuple[str, str], dict[int, int]] = {}
    if not data:
        return out
    table = data.get("offsetTable") or {}
    for key, queues in table.items():
        tg = split_topic_group(str(key))
        if tg is None:
            _note(findings, "bad_offset_key", f"offsetTable key {key!r} has no '@'", file)
            continue
        if str(key).count(TOPIC_GROUP_SEPARATOR) > 1:
            _note(
                findings,
                "ambiguous_offset_key",
                f"offsetTable key {key!r} has several '@'; read as {tg}",
                file,
            )
        if not isinstance(queues, Mapping):
            _note(findings, "bad_offset_entry", f"offsetTable[{key!r}] is not a map", file)
            continue
        m: dict[int, int] = {}
        for q, off in queues.items():
            qi, oi = _as_int(q), _as_int(off)
            if qi is None or oi is None:
                _note(
                    findings, "bad_offset_entry", f"offsetTable[{key!r}][{q!r}]={off!r} is not int:int", file
                )
                continue
            m[qi] = oi
        out.setdefault(tg, {}).update(m)
    if include_lmq:
        for key, off in (data.get("lmqOffsetTable") or {}).items():
            tg = split_topic_group(str(key))
            oi = _as_int(off)
            if tg is None or oi is None:
                _note(findings, "bad_offset_entry", f"lmqOffsetTable[{key!r}]={off!r} is not usable", file)
                continue
            out.setdefault(tg, {})[0] = oi
    return out


def delay_offsets(
    data: Mapping[str, Any] | None, *, findings: list[Finding] | None = None, file: str | None = None
) -> dict[int, int]:
    """delayOffset.json's ``offsetTable``: {delay level: next SCHEDULE_TOPIC_XXXX queue offset to deliver}."""
    out: dict[int, int] = {}
    for lvl, off in ((data or {}).get("offsetTable") or {}).items():
        li, oi = _as_int(lvl), _as_int(off)
        if li is None or oi is None:
            _note(findings, "bad_delay_offset", f"offsetTable[{lvl!r}]={off!r} is not int:int", file)
            continue
        out[li] = oi
    return out


PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1


@dataclass(frozen=True)
class TopicConfig:
    """One ``topicConfigTable`` entry; defaults are the Java TopicConfig field defaults."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def attribute(self, name: str) -> str | None:
        """A 5.x topic attribute (``queue.type``, ``cleanup.policy``...), with or without the '+' prefix."""
        return self.attributes.get(name, self.attributes.get("+" + name))

    @property
    def queue_type(self) -> str:
        """ "SimpleCQ" (consumequeue/) or "BatchCQ" (batchconsumequeue/, 5.x)."""
        return self.attribute("queue.type") or "SimpleCQ"


def topic_configs(
    data: Mapping[str, Any] | None, *, findings: list[Finding] | None = None, file: str | None = None
) -> dict[str, TopicConfig]:
    """topics.json's ``topicConfigTable`` as {topic: TopicConfig} (missing fields take Java defaults)."""
    out: dict[str, TopicConfig] = {}
    for name, tc in ((data or {}).get("topicConfigTable") or {}).items():
        if not isinstance(tc, Mapping):
            _note(findings, "bad_topic_config", f"topicConfigTable[{name!r}] is not an object", file)
            continue
        kw: dict[str, Any] = {}
        for src, dst, conv in (
            ("readQueueNums", "read_queue_nums", _as_int),
            ("writeQueueNums", "write_queue_nums", _as_int),
            ("perm", "perm", _as_int),
            ("topicSysFlag", "topic_sys_flag", _as_int),
        ):
            if src in tc:
                v = conv(tc[src])
                if v is None:
                    _note(findings, "bad_topic_config", f"{name}.{src}={tc[src]!r} is not an integer", file)
                    continue
                kw[dst] = v
        if isinstance(tc.get("topicFilterType"), str):
            kw["topic_filter_type"] = tc["topicFilterType"]
        if isinstance(tc.get("order"), bool):
            kw["order"] = tc["order"]
        if isinstance(tc.get("attributes"), Mapping):
            kw["attributes"] = {str(k): str(v) for k, v in tc["attributes"].items()}
        topic = tc.get("topicName") if isinstance(tc.get("topicName"), str) else str(name)
        if topic != name:
            _note(
                findings,
                "topic_name_mismatch",
                f"topicConfigTable key {name!r} holds topicName {topic!r}",
                file,
            )
        out[str(name)] = TopicConfig(topic_name=topic, **kw)
    return out
