"""fastjson text, leniently: the parser, the salvage of damaged files, and the writer (store-format §8).

fastjson writes Integer-keyed maps (queue ids, delay levels) with bare keys, ``{0:250,-1:5}``, which
no strict JSON parser accepts; numbers reach Long.MAX_VALUE. The parser here quotes exactly the bare
keys that follow ``{`` or ``,`` outside string literals (store-format §8.3 recipe; a regex over the whole
text would also rewrite ``,1:`` inside a filter expression), lets the C json parser do the rest, and
hands bare keys back as ``int``. Files, ``.bak`` fallback and typed tables: :mod:`storelib.format.configjson`.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from storelib.errors import StoreError

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


def _commit(fr: _Frame) -> None:
    if fr.has_pending:
        if fr.is_dict:
            fr.obj[fr.key] = fr.pending
        else:
            fr.obj.append(fr.pending)
        fr.has_pending = False


# one character-driven state machine over a shared stack and position: per-state functions would
# only pass both around
def salvage_prefix_detail(text: str, *, file: str | None = None) -> SalvageResult:
    """Recover the complete entries of a truncated or NUL-padded file.

    An entry counts only when its value is followed by a delimiter (``,`` ``}`` ``]``): a number cut
    mid-way ("10017" -> "100") cannot be told from a whole one, so it is dropped. Objects cut short
    keep their complete entries; arrays cut short are dropped (a shorter array is a wrong value).
    """
    sv = _Salvager(text, file)
    while sv.step():
        pass
    stopped = sv.pos
    complete = not sv.stack and sv.root is not None and sv.skip_ws(stopped) >= len(text)
    result = SalvageResult(sv.root if sv.root is not None else {}, complete, _byte_offset(text, stopped))
    _unwind_at_cut(sv.stack, result)
    return result


class _Salvager:
    """The character-level state machine of :func:`salvage_prefix_detail`: the scan position, the frame
    stack and the root; :meth:`step` takes one token (False: stop at ``pos``)."""

    def __init__(self, text: str, file: str | None) -> None:
        self.text, self.file, self.n = text, file, len(text)
        self.pos = 1 if text[:1] == "\ufeff" else 0
        self.stack: list[_Frame] = []
        self.root: dict | None = None

    def skip_ws(self, p: int) -> int:
        while p < self.n and self.text[p] in _WS:
            p += 1
        return p

    def attach(self, value: Any) -> None:
        fr = self.stack[-1]
        fr.pending = value
        fr.has_pending = True
        fr.state = "sep"

    def step(self) -> bool:
        self.pos = self.skip_ws(self.pos)
        if self.pos >= self.n:
            return False
        c = self.text[self.pos]
        if not self.stack:
            if self.root is not None or c != "{":
                return False
            self.root = {}
            self.stack.append(_Frame(self.root, True, ""))
            self.pos += 1
            return True
        fr = self.stack[-1]
        st = fr.state
        if st in ("key_or_end", "key") and fr.is_dict:
            return self._key(fr, c, st)
        if st == "colon":
            if c != ":":
                return False
            self.pos += 1
            fr.state = "value"
            return True
        if st in ("value", "value_or_end"):
            return self._value(fr, c, st)
        if st == "sep":
            return self._sep(fr, c)
        return False

    def _close(self, fr: _Frame) -> bool:
        """The frame's closing bracket taken: its value into its parent (False: the root is complete)."""
        self.pos += 1
        self.stack.pop()
        if self.stack:
            self.attach(fr.obj)
            return True
        return False

    def _key(self, fr: _Frame, c: str, st: str) -> bool:
        text, pos = self.text, self.pos
        if c == "}" and st == "key_or_end":
            return self._close(fr)
        if c == '"':
            try:
                key, end = json.decoder.scanstring(text, pos + 1, False)
            except json.JSONDecodeError:
                return False
            if key == "$ref":
                raise _bad(self.file, text, pos, 'fastjson "$ref" reference: refusing to guess what it points to')
            fr.key, self.pos, fr.state = key, end, "colon"
            return True
        m = _NUMBER.match(text, pos) if c == "-" or c.isdigit() else None
        if m and "." not in m.group() and "e" not in m.group().lower() and m.end() < self.n:
            fr.key, self.pos, fr.state = int(m.group()), m.end(), "colon"
            return True
        return False

    def _value(self, fr: _Frame, c: str, st: str) -> bool:
        text, pos = self.text, self.pos
        if c == "]" and st == "value_or_end" and not fr.is_dict:
            self.pos += 1
            self.stack.pop()
            self.attach(fr.obj)
            return True
        if c in "{[":
            self.stack.append(_Frame({} if c == "{" else [], c == "{", _child_path(fr)))
            self.pos += 1
            return True
        if c == '"':
            try:
                s, end = json.decoder.scanstring(text, pos + 1, False)
            except json.JSONDecodeError:
                return False
            self.attach(s)
            self.pos = end
            return True
        m = _NUMBER.match(text, pos)
        if m:
            tok = m.group()
            self.attach(int(tok) if re.fullmatch(r"-?[0-9]+", tok) else float(tok))
            self.pos = m.end()
            return True
        lit = next((w for w in _LITERALS if text.startswith(w, pos)), None)
        if lit is not None:
            self.attach(_LITERALS[lit])
            self.pos += len(lit)
            return True
        return False

    def _sep(self, fr: _Frame, c: str) -> bool:
        if c == ",":
            _commit(fr)
            self.pos += 1
            fr.state = "key" if fr.is_dict else "value"
            return True
        if (c == "}" and fr.is_dict) or (c == "]" and not fr.is_dict):
            _commit(fr)
            return self._close(fr)
        return False


def _unwind_at_cut(stack: list[_Frame], result: SalvageResult) -> None:
    """Keep or drop what is still open at the cut, innermost first (see salvage_prefix_detail)."""
    while stack:
        fr = stack.pop()
        if fr.has_pending and _whole_at_cut(fr.pending):
            _commit(fr)  # a closed string/object/array or a literal cannot have been cut short
        elif fr.has_pending or fr.state in ("colon", "value"):
            result.dropped.append(_child_path(fr))
            fr.has_pending = False
        if not stack:
            result.incomplete.append("/")
            break
        parent = stack[-1]
        if fr.is_dict and fr.obj:
            parent.pending, parent.has_pending = fr.obj, True
            _commit(parent)
            result.incomplete.append(fr.path)
        else:
            result.dropped.append(fr.path)
        parent.state = "sep"


def _whole_at_cut(v: Any) -> bool:
    """Only a number can be cut into another valid value ("10017" -> "100")."""
    return isinstance(v, bool) or not isinstance(v, (int, float))


def salvage_prefix(text: str, *, file: str | None = None) -> dict:
    """The complete entries of a truncated/NUL-padded config text (see salvage_prefix_detail)."""
    return salvage_prefix_detail(text, file=file).data


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


