"""Java ``.properties`` text as ``java.util.Properties.load`` reads it (broker.conf is one).

Kept apart from the broker settings so every reader of such files (broker.conf, ``rmqstore expiry``
policy files, the store's key listing) uses the same parse.
"""

from __future__ import annotations

import re

from storelib.errors import StoreError

_WS = " \t\f"


def properties_text(data: bytes) -> str:
    """The text ``Properties.load(InputStream)`` reads from ``data``: one ISO-8859-1 char per byte (its
    LineReader's ``(char) (0xff & b)``), so a char offset is a byte offset and UTF-8 bytes become one char
    each, as the broker has them. Both lines load broker.conf that way (BrokerStartup: 4.9.8 :119-121,
    5.3.3 SystemConfigFileHelper.loadConfig :296-299); non-ASCII text belongs in ``\\uXXXX`` escapes."""
    return data.decode("latin-1")


def _unescape(s: str, file: str | None, line: int, offset: int | None) -> str:
    if "\\" not in s:
        return s
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= n:
            break  # a lone trailing backslash is dropped (Java: continuation at end of file)
        c = s[i]
        if c == "u":
            hexd = s[i + 1 : i + 5]
            if len(hexd) != 4 or not all(h in "0123456789abcdefABCDEF" for h in hexd):
                raise StoreError(file, offset, "bad_config", f"line {line}: malformed \\uxxxx encoding")
            out.append(chr(int(hexd, 16)))
            i += 5
            continue
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(c, c))
        i += 1
    return "".join(out)


def _logical_lines(text: str) -> list[tuple[str, int, int]]:
    """(logical line, 1-based line number, char offset of its start) per Properties.load rules.

    Java 8's LineReader.readLine (the broker's JDK; 9+ differs only where noted): leading blanks of every
    natural line dropped, blank lines skipped, ``#``/``!`` first on a line a comment (never continued; a
    continued line is not a new line, so a ``#`` there is text: 9+ takes it as a comment when nothing was
    read before it), an odd run of trailing backslashes continues the line. A line end (or the file's end)
    reached with nothing read, after a lone backslash line, ends nothing: reading starts over as on a new line.
    """
    natural = [(m.group(1), m.start()) for m in re.finditer(r"([^\r\n]*)(?:\r\n|\r|\n|$)", text)]
    if natural and natural[-1][1] == len(text) and natural[-1][0] == "":
        natural.pop()  # the empty match at end of text
    out: list[tuple[str, int, int]] = []
    i = 0
    while i < len(natural):
        first, start = i, natural[i][1]
        buf = natural[i][0].lstrip(_WS)
        i += 1
        if not buf or buf[0] in "#!":
            continue  # blank or comment: a comment never continues
        while (len(buf) - len(buf.rstrip("\\"))) % 2 == 1:
            buf = buf[:-1]
            if i >= len(natural):
                break
            more = natural[i][0].lstrip(_WS)
            i += 1
            if not buf and not more:  # a line end with nothing read (len == 0): no line, as on a new one
                buf = None
                break
            buf += more
        if buf is not None:
            out.append((buf, first + 1, start))
    return out


def parse_properties_text(text: str, *, file: str | None = None) -> dict[str, tuple[str, int, int]]:
    """Java ``Properties.load`` semantics: key -> (value, line number, char offset of the line).

    Handles ``=``, ``:`` and whitespace separators, ``#``/``!`` comments, backslash continuations,
    ``\\uXXXX`` and the other escapes. Later duplicates win. Values are not trimmed here.
    """
    out: dict[str, tuple[str, int, int]] = {}
    for line, lineno, off in _logical_lines(text):
        i, n = 0, len(line)
        while i < n:
            c = line[i]
            if c == "\\":
                i += 2
                continue
            if c in "=:" or c in _WS:
                break
            i += 1
        key_raw = line[:i]
        j = i
        while j < n and line[j] in _WS:
            j += 1
        if j < n and line[j] in "=:":
            j += 1
            while j < n and line[j] in _WS:
                j += 1
        key = _unescape(key_raw, file, lineno, off)
        out[key] = (_unescape(line[j:], file, lineno, off), lineno, off)
    return out
