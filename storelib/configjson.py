"""The broker's ``config/*.json`` files: fastjson text, ``.bak`` fallback, salvage and writing (store-format §8).

fastjson writes Integer-keyed maps (queue ids, delay levels) with bare keys, ``{0:250,-1:5}``, which
no strict JSON parser accepts; numbers reach Long.MAX_VALUE. The parser here quotes exactly the bare
keys that follow ``{`` or ``,`` outside string literals (store-format §8.3 recipe; a regex over the whole
text would also rewrite ``,1:`` inside a filter expression), lets the C json parser do the rest, and
hands bare keys back as ``int``. Loading mirrors ``ConfigManager.load``: a missing, empty or
unparseable file falls back to ``.bak``, and the result says which file was used and why.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .bytesource import Location
from .errors import Finding, StoreError
from .smallfile_io import (
    PathOrLocation,
    as_location,
    atomic_write,
    local_path,
    read_small,
    write_file_fsync,
)

CONFIG_DIR = "config"
TOPICS = "topics.json"
CONSUMER_OFFSET = "consumerOffset.json"
LMQ_CONSUMER_OFFSET = "lmqConsumerOffset.json"
SUBSCRIPTION_GROUP = "subscriptionGroup.json"
DELAY_OFFSET = "delayOffset.json"
CONSUMER_FILTER = "consumerFilter.json"
TOPIC_GROUP_SEPARATOR = "@"
MAX_CONFIG_SIZE = 512 * 1024 * 1024

_KEY_MARK = "\x00"  # cannot occur in valid input: raw NUL is rejected before parsing
_WS = " \t\n\r"
# A string literal (skipped as a whole) or a bare integer key right after '{' or ','.
_SCAN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(?<=[{,])([ \t\n\r]*)(-?[0-9]+)(?=[ \t\n\r]*:)')
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_STRING_SPLIT = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")')
_BARE_KEY = re.compile(r"([{,][ \t\n\r]*)(-?[0-9]+)(?=[ \t\n\r]*:)")
_SEG = "\x01"  # joins the outside-of-string segments for one C-level substitution


class _RefFound(Exception):
    pass


def _byte_offset(text: str, char_pos: int) -> int:
    return len(text[:char_pos].encode("utf-8", "surrogatepass"))


def _bad(file: str | None, text: str, char_pos: int | None, detail: str) -> StoreError:
    off = None if char_pos is None else _byte_offset(text, max(0, min(char_pos, len(text))))
    return StoreError(file, off, "bad_json", detail)


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict:
    d = dict(pairs)  # later duplicates win, as in fastjson's map put
    if not d:
        return d
    if "$ref" in d:
        raise _RefFound
    if min(d)[:1] != _KEY_MARK:  # marked (bare) keys sort first: one C-level check per object
        return d
    return {(int(k[1:]) if k[:1] == _KEY_MARK else k): v for k, v in d.items()}


def _quote_bare_keys_slow(text: str) -> tuple[str, list[int]]:
    """Same result as _quote_bare_keys, plus where keys were widened (to map error positions back)."""
    shifts: list[int] = []  # transformed positions after which 3 more chars were inserted
    parts: list[str] = []
    last = 0
    added = 0
    for m in _SCAN.finditer(text):
        if m.group(2) is None:
            continue
        parts.append(text[last : m.start(2)])
        parts.append('"' + _KEY_MARK + m.group(2) + '"')
        last = m.end(2)
        added += 3
        shifts.append(m.end(2) + added)
    parts.append(text[last:])
    return "".join(parts), shifts


def _quote_bare_keys(text: str) -> str:
    """Wrap every bare integer key outside string literals in quotes, marked with a NUL prefix.

    String literals are split out (C regex), the remaining segments are joined with a separator that
    cannot follow '{'/',' or precede ':' and rewritten by one C-level substitution.
    """
    if _SEG in text:
        return _quote_bare_keys_slow(text)[0]
    parts = _STRING_SPLIT.split(text)
    outside = _BARE_KEY.sub('\\1"' + _KEY_MARK + '\\2"', _SEG.join(parts[0::2])).split(_SEG)
    parts[0::2] = outside
    return "".join(parts)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _find_ref(text: str) -> int | None:
    for m in _STRING.finditer(text):
        if m.group() == '"$ref"':
            j = m.end()
            while j < len(text) and text[j] in _WS:
                j += 1
            if j < len(text) and text[j] == ":":
                return m.start()
    return None


def parse_fastjson(text: str, *, file: str | None = None) -> dict:
    """Parse one config file's text; bare integer keys come back as ``int``, all else as strict JSON.

    Raises StoreError(file, byte offset, "bad_json", detail) on any syntax error, on a NUL byte, on a
    fastjson ``$ref`` (circular-reference marker, never expected in these files) and when the top
    level is not an object.
    """
    if text[:1] == "\ufeff":  # fastjson's scanner skips a BOM; none is written, but tolerate it
        text = text[1:]
    nul = text.find("\x00")
    if nul >= 0:
        raise _bad(file, text, nul, "NUL byte (a file whose size reached disk before its data?)")
    first = len(text) - len(text.lstrip(_WS))
    if first == len(text):
        raise _bad(file, text, first, "empty text")
    if text[first] != "{":
        raise _bad(file, text, first, f"top level must be an object, found {text[first]!r}")

    quoted = _quote_bare_keys(text)
    try:
        data = json.loads(
            quoted, strict=False, object_pairs_hook=_pairs_hook, parse_constant=_reject_constant
        )
    except _RefFound:
        pos = _find_ref(text)
        raise _bad(
            file, text, pos, 'fastjson "$ref" reference: refusing to guess what it points to'
        ) from None
    except json.JSONDecodeError:
        # error path only: redo the rewrite keeping track of insertions to map the position back
        slow, shifts = _quote_bare_keys_slow(text)
        try:
            json.loads(slow, strict=False, object_pairs_hook=_pairs_hook, parse_constant=_reject_constant)
        except json.JSONDecodeError as e:
            raise _bad(file, text, e.pos - 3 * bisect.bisect_right(shifts, e.pos), e.msg) from None
        except (_RefFound, ValueError, RecursionError):
            pass
        raise _bad(file, text, None, "invalid JSON") from None
    except (ValueError, RecursionError) as e:
        raise _bad(file, text, None, str(e) or type(e).__name__) from None
    if not isinstance(data, dict):
        raise _bad(file, text, first, "top level is not an object")
    return data


# ---- salvage ------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = {"true": True, "false": False, "null": None}


@dataclass
class SalvageResult:
    """What a best-effort salvage recovered from a damaged file."""

    data: dict
    complete: bool  # the whole text parsed
    stopped_at: int  # byte offset where the usable text ends
    incomplete: list[str] = field(default_factory=list)  # paths of containers cut short (partially kept)
    dropped: list[str] = field(default_factory=list)  # paths of entries lost at the cut


class _Frame:
    __slots__ = ("obj", "is_dict", "key", "pending", "has_pending", "state", "path")

    def __init__(self, obj: Any, is_dict: bool, path: str):
        self.obj = obj
        self.is_dict = is_dict
        self.key: Any = None
        self.pending: Any = None
        self.has_pending = False
        self.state = "key_or_end" if is_dict else "value_or_end"
        self.path = path


def _child_path(fr: _Frame) -> str:
    return f"{fr.path}/{fr.key if fr.is_dict else len(fr.obj)}"


def salvage_prefix_detail(text: str, *, file: str | None = None) -> SalvageResult:
    """Recover the complete entries of a truncated or NUL-padded file.

    An entry counts only when its value is followed by a delimiter (``,`` ``}`` ``]``): a number cut
    mid-way ("10017" -> "100") cannot be told from a whole one, so it is dropped. Objects cut short
    keep their complete entries; arrays cut short are dropped (a shorter array is a wrong value).
    """
    pos = 0
    n = len(text)
    if text[:1] == "\ufeff":
        pos = 1
    stack: list[_Frame] = []
    root: dict | None = None

    def skip_ws(p: int) -> int:
        while p < n and text[p] in _WS:
            p += 1
        return p

    def attach(value: Any) -> None:
        fr = stack[-1]
        fr.pending = value
        fr.has_pending = True
        fr.state = "sep"

    def commit(fr: _Frame) -> None:
        if fr.has_pending:
            if fr.is_dict:
                fr.obj[fr.key] = fr.pending
            else:
                fr.obj.append(fr.pending)
            fr.has_pending = False

    stopped = n
    while True:
        pos = skip_ws(pos)
        if pos >= n:
            stopped = pos
            break
        c = text[pos]
        fr = stack[-1] if stack else None
        if fr is None:
            if root is not None or c != "{":
                stopped = pos
                break
            root = {}
            stack.append(_Frame(root, True, ""))
            pos += 1
            continue
        st = fr.state
        if st in ("key_or_end", "key") and fr.is_dict:
            if c == "}" and st == "key_or_end":
                pos += 1
                stack.pop()
                if stack:
                    attach(fr.obj)
                    continue
                stopped = pos
                break
            if c == '"':
                try:
                    key, end = json.decoder.scanstring(text, pos + 1, False)
                except json.JSONDecodeError:
                    stopped = pos
                    break
                if key == "$ref":
                    raise _bad(
                        file, text, pos, 'fastjson "$ref" reference: refusing to guess what it points to'
                    )
                fr.key, pos, fr.state = key, end, "colon"
                continue
            m = _NUMBER.match(text, pos) if c == "-" or c.isdigit() else None
            if m and "." not in m.group() and "e" not in m.group().lower() and m.end() < n:
                fr.key, pos, fr.state = int(m.group()), m.end(), "colon"
                continue
            stopped = pos
            break
        if st == "colon":
            if c != ":":
                stopped = pos
                break
            pos += 1
            fr.state = "value"
            continue
        if st in ("value", "value_or_end"):
            if c == "]" and st == "value_or_end" and not fr.is_dict:
                pos += 1
                stack.pop()
                attach(fr.obj)
                continue
            if c == "{":
                stack.append(_Frame({}, True, _child_path(fr)))
                pos += 1
                continue
            if c == "[":
                stack.append(_Frame([], False, _child_path(fr)))
                pos += 1
                continue
            if c == '"':
                try:
                    s, end = json.decoder.scanstring(text, pos + 1, False)
                except json.JSONDecodeError:
                    stopped = pos
                    break
                attach(s)
                pos = end
                continue
            m = _NUMBER.match(text, pos)
            if m:
                tok = m.group()
                attach(int(tok) if re.fullmatch(r"-?[0-9]+", tok) else float(tok))
                pos = m.end()
                continue
            lit = next((w for w in _LITERALS if text.startswith(w, pos)), None)
            if lit is not None:
                attach(_LITERALS[lit])
                pos += len(lit)
                continue
            stopped = pos
            break
        if st == "sep":
            if c == ",":
                commit(fr)
                pos += 1
                fr.state = "key" if fr.is_dict else "value"
                continue
            if (c == "}" and fr.is_dict) or (c == "]" and not fr.is_dict):
                commit(fr)
                pos += 1
                stack.pop()
                if stack:
                    attach(fr.obj)
                    continue
                stopped = pos
                break
            stopped = pos
            break
        stopped = pos
        break

    complete = not stack and root is not None and skip_ws(stopped) >= n
    result = SalvageResult(root if root is not None else {}, complete, _byte_offset(text, stopped))
    # unwind what is still open at the cut, innermost first
    while stack:
        fr = stack.pop()
        if fr.has_pending and _whole_at_cut(fr.pending):
            commit(fr)  # a closed string/object/array or a literal cannot have been cut short
        elif fr.has_pending or fr.state in ("colon", "value"):
            result.dropped.append(_child_path(fr))
            fr.has_pending = False
        if not stack:
            result.incomplete.append("/")
            break
        parent = stack[-1]
        if fr.is_dict and fr.obj:
            parent.pending, parent.has_pending = fr.obj, True
            commit(parent)
            result.incomplete.append(fr.path)
        else:
            result.dropped.append(fr.path)
        parent.state = "sep"
    return result


def _whole_at_cut(v: Any) -> bool:
    """Only a number can be cut into another valid value ("10017" -> "100")."""
    return isinstance(v, bool) or not isinstance(v, (int, float))


def salvage_prefix(text: str, *, file: str | None = None) -> dict:
    """The complete entries of a truncated/NUL-padded config text (see salvage_prefix_detail)."""
    return salvage_prefix_detail(text, file=file).data


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
        return raw.decode("utf-8", "replace")


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


# ---- writing ----------------------------------------------------------------------------------

_ESCAPES = {i: f"\\u{i:04X}" for i in list(range(0x20)) + list(range(0x7F, 0xA0)) + [0x2028, 0x2029]}
_ESCAPES.update(
    {ord('"'): '\\"', ord("\\"): "\\\\", 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r"}
)


def _quote(s: str) -> str:
    return '"' + s.translate(_ESCAPES) + '"'


def _scalar(v: Any) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise StoreError(None, None, "bad_value", f"{v} cannot be written as JSON")
        return repr(v)
    if isinstance(v, str):
        return _quote(v)
    raise StoreError(None, None, "bad_value", f"cannot write a {type(v).__name__} as fastjson text")


def _dump(v: Any, level: int, pretty: bool, out: list[str]) -> None:
    if isinstance(v, Mapping):
        items = [(k, x) for k, x in v.items() if x is not None]  # fastjson drops null values
        if not items:
            out.append("{}")
            return
        out.append("{")
        indent = "\n" + "\t" * (level + 1)
        for i, (k, x) in enumerate(items):
            if i:
                out.append(",")
            if isinstance(k, str):
                if pretty:
                    out.append(indent)  # only string keys start a new line (MapSerializer)
                out.append(_quote(k))
            elif isinstance(k, int) and not isinstance(k, bool):
                out.append(str(k))
            else:
                raise StoreError(None, None, "bad_value", f"map key {k!r} is neither str nor int")
            out.append(":")
            _dump(x, level + 1, pretty, out)
        if pretty:
            out.append("\n" + "\t" * level)
        out.append("}")
    elif isinstance(v, (list, tuple, set, frozenset)):
        out.append("[")  # arrays stay on one line, also in pretty format
        for i, x in enumerate(v):
            if i:
                out.append(",")
            if x is None:
                out.append("null")
            else:
                _dump(x, level, pretty, out)
        out.append("]")
    else:
        out.append(_scalar(v))


def dump_fastjson(data: Mapping[str, Any], pretty: bool = True) -> str:
    """fastjson-style text: tabs, bare int keys, string keys on their own line, no trailing newline."""
    out: list[str] = []
    _dump(data, 0, pretty, out)
    return "".join(out)


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
