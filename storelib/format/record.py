"""CommitLog message record (V1 and V2) and end-of-file blank record: layout, decode, encode.

Scalar code for single records (random access, the writer, tests). Scans use the columnar decoder
(:mod:`storelib.scan.batchdecode`, behind :mod:`storelib.scan.scanner`), which must agree with :func:`check_record`
on every outcome.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

from storelib.errors import CorruptRecordError
from storelib.format.crc import body_crc
from storelib.format.properties import (
    CRC32,
    CRC32_RESERVED_LEN,
    DELAY,
    DUP_INFO,
    INNER_BASE,
    INNER_NUM,
    KEYS,
    PROPERTY_SEP,
    TAGS,
    UNIQ_KEY,
    crc_digits,
    crc_expected,
    dup_info_error,
    encode_properties,
    inner_batch_error,
    java_int,
    java_string,
    parse_properties,
)

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB
BLANK_MAGIC = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8

# SYSFLAG bits (MessageSysFlag)
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOST_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_MASK = 0x700
COMPRESSION_LZ4, COMPRESSION_ZSTD, COMPRESSION_ZLIB = 1, 2, 3

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"

MAX_PROPERTIES_LEN = 32767
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HDR = struct.Struct(">iiiiiqqiq")  # totalSize..bornTimestamp (48 bytes)


LINES = ("4", "5")  # a check's ``line``: 4.9.8's or 5.3.3's rules; None when the line is not known


def message_magics(line: str | None) -> tuple[int, ...]:
    """The MAGIC values the line's check takes for a message. 4.9.8's CommitLog.checkMessageAndReturnSize
    knows only V1 (a V2 record is an illegal magic: -1); 5.3.3 takes both. An unknown line (``None``) takes
    both: only 5.x writes V2, so a V2 record is itself the evidence that 5.x wrote the store."""
    return (MAGIC_V1,) if line == "4" else (MAGIC_V1, MAGIC_V2)


def blank_fits(total: int, left: int, line: str | None) -> bool:
    """Does the line's check take an end-of-file blank record with TOTALSIZE ``total``, ``left`` bytes
    before the end of the file? 5.3.3 checks ``remaining < totalSize - 4`` (Java int arithmetic) right
    after TOTALSIZE, before it reads the magic, so a blank longer than what is left is -1; 4.9.8 reads the
    magic first and takes any blank (0), as does an unknown line."""
    if line != "5":
        return True
    return ((total - 4 + 2**31) % 2**32) - 2**31 <= left - 4


def oversized_blank(total: int, left: int) -> str:
    """Why 5.3.3 fails a blank record (the detail of its ``bad_size``)."""
    return (f"blank record, TOTALSIZE {total} but {left} bytes left in the file: 5.3.3 checks the size "
            "before the magic (-1)")


def magic_text(magic: int, line: str | None) -> str:
    """A magic as a failure detail names it (a V2 magic under 4.9.8's rules says why it fails)."""
    if magic == MAGIC_V2 and line == "4":
        return "0xDAA320AB (V2: 4.9.8 knows only V1 0xDAA320A7, an illegal magic)"
    return f"0x{magic & 0xFFFFFFFF:08X}"


def tran_type(sys_flag: int) -> int:
    """Transaction type bits (0 NOT, 4 PREPARED, 8 COMMIT, 12 ROLLBACK) as 0..3."""
    return (sys_flag & 0xC) >> 2


def gets_cq_unit(tran: Any) -> Any:
    """Which records the broker's consume-queue dispatcher writes a unit for, by :func:`tran_type` (one value
    or a numpy array): NOT (0) and COMMIT (2); PREPARED and ROLLBACK get none
    (CommitLogDispatcherBuildConsumeQueue.dispatch, DefaultMessageStore 4.9.8 :1618-1633, 5.3.3 :2174-2189)."""
    return (tran == 0) | (tran == 2)


def host_width(sys_flag: int, v6_flag: int) -> int:
    return 20 if sys_flag & v6_flag else 8


def record_length(sys_flag: int, body_len: int, topic_len: int, props_len: int, version: int) -> int:
    """The length the broker recomputes (store-format §3.2) to validate TOTALSIZE."""
    bh = host_width(sys_flag, BORNHOST_V6_FLAG)
    sh = host_width(sys_flag, STOREHOST_V6_FLAG)
    tl = 2 if version == 2 else 1
    return 74 + bh + sh + tl + max(body_len, 0) + topic_len + max(props_len, 0)


def encode_host(host: str) -> bytes:
    """``"ip:port"`` or ``"[v6]:port"`` → 8 or 20 bytes (address, then port as i32)."""
    addr, port = _split_host(host)
    return ipaddress.ip_address(addr).packed + _I32.pack(port)


def _split_host(host: str) -> tuple[str, int]:
    if host.startswith("["):
        addr, _, port = host[1:].partition("]:")
    else:
        addr, _, port = host.rpartition(":")
    return addr, int(port)


V4_MAPPED_PREFIX = bytes(10) + b"\xff\xff"  # ::ffff:a.b.c.d


def v4_mapped(host: bytes) -> bool:
    """Is a 20-byte host field an IPv4-mapped IPv6 address? ``InetAddress.getByAddress(byte[16])`` returns an
    Inet4Address for those (IPAddressUtil.convertFromIPv4MappedAddress: ten zero bytes, then 0xFFFF), so
    MessageDecoder.decode (4.9.8 :323/:334, 5.3.3 :483/:494) holds such a host as IPv4."""
    return len(host) == 20 and host[:12] == V4_MAPPED_PREFIX


def decode_host(b: bytes | memoryview) -> str:
    """8 or 20 host bytes → ``"ip:port"`` as the broker's MessageExt holds it: IPv6 as ``"[addr]:port"`` with
    Inet6Address.getHostAddress's uncompressed text, an IPv4-mapped one as the IPv4 ``"a.b.c.d:port"``."""
    b = bytes(b)
    port = _I32.unpack_from(b, len(b) - 4)[0]
    if len(b) == 8 or v4_mapped(b):
        return f"{b[-8]}.{b[-7]}.{b[-6]}.{b[-5]}:{port}"
    groups = struct.unpack(">8H", b[:16])
    return "[" + ":".join(f"{g:x}" for g in groups) + f"]:{port}"  # Java getHostAddress style


def offset_msg_id(store_host_bytes: bytes, phy_offset: int) -> str:
    """Offset message id as MessageDecoder.decode makes it: hex of store address ‖ port ‖ PHYSICALOFFSET.

    The id's buffer is sized by the record's STOREHOST flag (4.9.8 :379, 5.3.3 :555: 28 bytes for an IPv6
    field) but filled from MessageExt.getStoreHostBytes, which writes 4 address bytes for the Inet4Address of
    an IPv4-mapped field; createMessageId (4.9.8 :65-73) then hexes the whole 28-byte array: the IPv4 id's 16
    bytes and 12 zero bytes (56 digits)."""
    b = bytes(store_host_bytes)
    if v4_mapped(b):
        return (b[12:] + _I64.pack(phy_offset) + bytes(12)).hex().upper()
    return (b + _I64.pack(phy_offset)).hex().upper()


def decode_msg_id(msg_id: str) -> tuple[str, int]:
    """Offset msgId → (store host ``"ip:port"``, physical offset). 32 hex chars IPv4, 56 IPv6."""
    s = msg_id.strip()
    if len(s) not in (32, 56):
        raise ValueError(f"offset msgId must be 32 or 56 hex characters, got {len(s)}")
    raw = bytes.fromhex(s)
    return decode_host(raw[:-8]), _I64.unpack_from(raw, len(raw) - 8)[0]


@dataclass
class Message:
    """One message record with every field; also the writer's input.

    ``properties`` keeps insertion order, which is the order they are serialised in. ``body`` is the
    stored (possibly compressed) bytes.
    """

    topic: str
    body: bytes = b""
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_timestamp: int = 0
    store_host: str = "127.0.0.1:10911"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    body_crc: int | None = None  # None: computed on encode
    magic_version: int = 1
    properties_raw: str | None = None  # the text as read (Java's decode; keeps order and trailing separators)

    @property
    def tags(self) -> str | None:
        return self.properties.get(TAGS)

    @property
    def keys(self) -> str | None:
        return self.properties.get(KEYS)

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(UNIQ_KEY)

    @property
    def tran_type(self) -> int:
        return tran_type(self.sys_flag)


@dataclass
class RecordCheck:
    """Outcome of validating one record, as CommitLog.checkMessageAndReturnSize reports it.

    ``kind``: ``message`` (valid), ``blank`` (end of segment), ``invalid``. ``size`` is TOTALSIZE for a
    message, -1 for a failure the broker reports as -1, or TOTALSIZE for a length mismatch (the only
    failure with a positive size). ``message`` is decoded for valid records only.
    """

    kind: str
    size: int
    reason: str | None = None
    message: Message | None = None
    prop_crc_ok: bool | None = None
    read_length: int | None = None  # a length mismatch: calMsgLength of the fields (where the reader stands after)


class RecordBytes(Protocol):
    """Bytes of a segment as :func:`check_record` reads them: ``len`` is where the segment ends,
    ``take(lo, hi)`` the bytes of ``[lo, hi)`` (short at the end), ``crc(lo, hi)`` their masked CRC-32.

    A plain buffer is one (:class:`BufferBytes`); a ranged source is another
    (:class:`storelib.scan.recordbytes.SourceBytes`: small reads, never the record's TOTALSIZE at once).
    """

    def __len__(self) -> int: ...

    def take(self, lo: int, hi: int) -> bytes | memoryview: ...

    def crc(self, lo: int, hi: int) -> int: ...


class BufferBytes:
    """:class:`RecordBytes` over an in-memory buffer (a mapped segment, a test image)."""

    def __init__(self, buf: bytes | bytearray | memoryview):
        self.buf = buf

    def __len__(self) -> int:
        return len(self.buf)

    def take(self, lo: int, hi: int) -> bytes | memoryview:
        return self.buf[lo:hi]

    def crc(self, lo: int, hi: int) -> int:
        return body_crc(self.buf[lo:hi])


FIXED_MAX = 112  # TOTALSIZE .. BODYLENGTH with both hosts IPv6: the most a record's fixed part holds


def check_record(
    buf: bytes | bytearray | memoryview | RecordBytes,
    pos: int,
    *,
    check_crc: bool = True,
    file: str | None = None,
    file_offset: int | None = None,
    line: str | None = None,
    read_body: bool = True,
    dup_info: bool = False,
) -> RecordCheck:
    """Validate and decode the record at ``pos`` of ``buf`` (which ends where the segment ends).

    Mirrors CommitLog.checkMessageAndReturnSize (5.3.3; 4.9.8 has the same steps but the ``remaining``
    checks), step by step and in its order: every read the broker makes past a length it has not
    checked throws there (-1), the body CRC is checked before the topic is read, DELAY of a
    SCHEDULE_TOPIC_XXXX record is an ``Integer.parseInt``, and only then the length (on 5.3.3 followed by
    setBatchSizeIfNeeded's parse of INNER_NUM/INNER_BASE, :func:`inner_batch_error`). It reads no more
    than the broker does: the fixed part and each length-prefixed field, never TOTALSIZE at once.
    ``line`` "4"/"5" applies what only that line does (:func:`message_magics`, :func:`blank_fits`, and
    5.3.3's ``remaining < totalSize - 4``: a TOTALSIZE past the segment's end is -1 there, where 4.9.8 reads
    the fields and, when they fit, reports the length mismatch with that TOTALSIZE, as does an unknown line;
    5.3.3's INNER_NUM/INNER_BASE parse, which an unknown line does not apply either);
    None when the line is not known. ``read_body`` False is the reput's call (``readBody=false``, never a CRC):
    the body is skipped by moving the position, bounded only by the buffer's end, not copied into
    ``new byte[totalSize]``, so a BODYLENGTH larger than TOTALSIZE is a length mismatch there, not -1.
    ``dup_info``: 5.3.3 recovery's checkDupInfo (duplicationEnable): a record with properties whose DUP_INFO
    fails :func:`dup_info_error` is -1, checked right after the properties are parsed (before DELAY).
    ``file``/``file_offset`` name the record in errors raised by callers.
    """
    acc: RecordBytes = buf if hasattr(buf, "crc") else BufferBytes(buf)  # type: ignore[assignment,arg-type]
    left = len(acc) - pos
    if left < 8:  # MAGIC cannot be read: the broker's getInt throws (-1)
        return RecordCheck("invalid", -1, f"truncated: {left} bytes left in the segment, no room for a record")
    head = bytes(acc.take(pos, pos + min(left, FIXED_MAX)))
    total = _I32.unpack_from(head, 0)[0]
    magic = _I32.unpack_from(head, 4)[0]
    if magic == BLANK_MAGIC:
        if blank_fits(total, left, line):
            return RecordCheck("blank", 0)
        return RecordCheck("invalid", -1, f"bad_size: {oversized_blank(total, left)}")
    if magic not in message_magics(line):
        if total == 0 and magic == 0:
            return RecordCheck("invalid", -1, "end_of_data: zeros (no record written here)")
        return RecordCheck("invalid", -1, f"bad_magic: {magic_text(magic, line)}")
    if total < 0:  # new byte[totalSize] throws NegativeArraySizeException (-1)
        return RecordCheck("invalid", -1, f"bad_size: TOTALSIZE {total} is negative")
    if allocation_fails(total, left, line):  # nothing of that size is read or allocated here
        return RecordCheck("invalid", -1, f"{OOM_REASON}: {oom_note(total)}")
    if total > left and line == "5":  # 5.3.3: remaining < totalSize - 4, before the magic (-1)
        return RecordCheck("invalid", -1, f"bad_size: TOTALSIZE {total} exceeds the {left} bytes left "
                                          "(5.3.3 checks the size first: -1)")
    try:
        chk = _check_fields(acc, head, pos, 2 if magic == MAGIC_V2 else 1, check_crc and read_body, read_body,
                            line, dup_info)
    except (struct.error, IndexError, ValueError) as e:
        if total > left:  # a record cut by the segment's end: its field reads run out of bytes (-1)
            return RecordCheck("invalid", -1, f"bad_size: TOTALSIZE {total} exceeds the {left} bytes left ({e})")
        return RecordCheck("invalid", -1, f"parse_error: {e}")
    if chk.kind == "invalid" and chk.size > 0 and total > left:  # 4.9.8 reads the fields whatever TOTALSIZE says
        chk.reason = f"{chk.reason}; it runs {total - left} bytes past the end of the segment. {alloc_note(total)}"
    return chk


# The largest ``new byte[n]`` a 64-bit HotSpot JVM makes: arrayOopDesc::max_array_length(T_BYTE) is
# max_jint minus the 2-word array header (compressed class pointers, the default below a 32 GiB heap).
# Any larger n throws OutOfMemoryError("Requested array size exceeds VM limit") whatever the heap. Below
# it the broker's default heap (runbroker.sh, both lines: -Xms8g -Xmx8g, G1 with 16 MiB regions) holds
# the array at start-up, when the heap is almost empty: the assumption behind taking this as the limit.
JVM_MAX_BYTE_ARRAY = 2**31 - 3
OOM_REASON = "out_of_memory"  # a scan's end reason where the line's check throws OutOfMemoryError
OOM_KIND = "broker_out_of_memory"  # the finding: the broker does not start (recovery) / its reput dies


def allocation_fails(total: int, left: int, line: str | None) -> bool:
    """Does the line's check of a message with TOTALSIZE ``total`` (``left`` bytes before the segment's end)
    throw OutOfMemoryError at ``new byte[totalSize]`` (CommitLog.checkMessageAndReturnSize: 4.9.8
    CommitLog.java:306, 5.3.3 :462), right after the magic? 4.9.8 allocates whatever TOTALSIZE says (and an
    unknown line reads as it does); 5.3.3 first fails (-1) a TOTALSIZE past what is left (:443), so only a
    segment of 2 GiB could get it there."""
    return total > JVM_MAX_BYTE_ARRAY and (line != "5" or total <= left)


def oom_note(total: int) -> str:
    """What the broker does with such a record (the detail of a scan's ``out_of_memory`` end)."""
    return (f"TOTALSIZE {total}: the broker's check first allocates new byte[{total}], past the JVM's largest array "
            f"({JVM_MAX_BYTE_ARRAY} bytes on 64-bit HotSpot): OutOfMemoryError, an Error that neither the check's "
            "catch (Exception) nor DefaultMessageStore.load's (4.9.8 :221, 5.3.3 :371) takes")


def alloc_note(total: int) -> str:
    """What 4.9.8 does first with a message's TOTALSIZE, unbounded: ``new byte[totalSize]``, before any field."""
    return f"4.9.8 first allocates new byte[{total}] ({total / 2**20:.1f} MiB of heap)"


def _check_fields(acc: RecordBytes, head: bytes, pos: int, version: int, check_crc: bool,
                  read_body: bool = True, line: str | None = None, dup_info: bool = False) -> RecordCheck:
    """The steps after MAGIC (see :func:`check_record`); raises ValueError where the broker's read throws."""
    n = len(acc)
    (total, _magic, crc, qid, flag, qoff, phy, sysf, born_ts) = _HDR.unpack_from(head, 0)
    bh = host_width(sysf, BORNHOST_V6_FLAG)
    sh = host_width(sysf, STOREHOST_V6_FLAG)
    if total < max(bh, sh):  # the hosts are read into new byte[totalSize]
        return RecordCheck("invalid", -1, f"bad_size: TOTALSIZE {total} cannot hold a {max(bh, sh)}-byte host")
    fixed = 48 + bh + 8 + sh + 16
    if fixed > len(head):
        raise ValueError("record header runs past the end of the segment")
    p = 48 + bh
    store_ts = _I64.unpack_from(head, p)[0]
    store_host = head[p + 8 : p + 8 + sh]
    p += 8 + sh
    reconsume = _I32.unpack_from(head, p)[0]
    prep = _I64.unpack_from(head, p + 4)[0]
    body_len = _I32.unpack_from(head, p + 12)[0]
    body_at = p = pos + fixed
    if body_len > 0:
        if (read_body and body_len > total) or body_len > n - p:  # get(new byte[totalSize]) / position(p + len)
            raise ValueError(f"BODYLENGTH {body_len} runs past the record")
        if check_crc:
            got = acc.crc(p, p + body_len)
            if got != crc:
                return RecordCheck("invalid", -1, f"crc_mismatch: BODYCRC {crc}, body hashes to {got}")
        p += body_len
    tl = 2 if version == 2 else 1
    topic_len = _signed(acc.take(p, p + tl), tl, "topic length")
    p += tl
    if topic_len < 0 or topic_len > total or p + topic_len > n:
        raise ValueError(f"bad topic length {topic_len}")
    topic = java_string(acc.take(p, p + topic_len))
    p += topic_len
    props_len = _signed(acc.take(p, p + 2), 2, "properties length")
    p += 2
    raw = ""
    props: dict[str, str] = {}
    if props_len > 0:
        if props_len > total or p + props_len > n:
            raise ValueError(f"PROPERTIESLENGTH {props_len} runs past the record")
        raw = java_string(acc.take(p, p + props_len))  # decoded before the split, as the broker does
        props = parse_properties(raw)
        if dup_info and (why := dup_info_error(props.get(DUP_INFO))) is not None:
            return RecordCheck("invalid", -1, f"dup_info: {why}")  # CommitLog.java:540-545, before DELAY
    if topic == SCHEDULE_TOPIC and DELAY in props and java_int(props[DELAY]) is None:
        raise ValueError(f"DELAY {props[DELAY]!r} is not a Java int")  # Integer.parseInt throws
    expect = record_length(sysf, body_len, topic_len, props_len, version)
    if expect != total:
        return RecordCheck("invalid", total, f"length_mismatch: TOTALSIZE {total}, fields add up to {expect}",
                           read_length=expect)
    if line == "5" and (why := inner_batch_error(props.get(INNER_NUM), props.get(INNER_BASE))) is not None:
        raise ValueError(why)  # setBatchSizeIfNeeded, after the length check (NumberFormatException: -1)
    body = bytes(acc.take(body_at, body_at + body_len)) if body_len > 0 else b""
    msg = Message(
        topic=topic, body=body, queue_id=qid, flag=flag, queue_offset=qoff, physical_offset=phy,
        sys_flag=sysf, born_timestamp=born_ts, born_host=decode_host(head[48 : 48 + bh]), store_timestamp=store_ts,
        store_host=decode_host(store_host), reconsume_times=reconsume, prepared_transaction_offset=prep,
        properties=props, body_crc=crc, magic_version=version, properties_raw=raw or None,
    )
    msg._store_host_bytes = store_host  # type: ignore[attr-defined]
    prop_crc_ok = None
    if CRC32 in props:  # 5.3.3 forceVerifyPropCRC: the value as the broker reads it (crc_expected)
        expected = crc_expected(props[CRC32])
        prop_crc_ok = expected >= 0 and expected == acc.crc(pos, pos + total - CRC32_RESERVED_LEN)
    return RecordCheck("message", total, None, msg, prop_crc_ok)


def _signed(b: bytes | memoryview, width: int, what: str) -> int:
    if len(b) < width:
        raise ValueError(f"{what} runs past the end of the segment")
    return int.from_bytes(b, "big", signed=True)


def encode_message(msg: Message, *, trailing_sep: bool = False, prop_crc: bool = False) -> bytes:
    """Encode ``msg`` as the broker stores it (fields as given: offsets and store time included).

    ``trailing_sep`` keeps the final 0x02 (5.x style); ``prop_crc`` appends the 5.x ``__CRC32#``
    property. ``magic_version`` 2 writes the 2-byte topic length. If ``msg.properties_raw`` is set it
    is written verbatim (round-trips exotic blobs).
    """
    topic_b = msg.topic.encode("utf-8")
    if msg.properties_raw is not None:
        props_s = msg.properties_raw
    else:
        props_s = encode_properties(msg.properties, trailing_sep)
    if prop_crc:
        if props_s and not props_s.endswith(PROPERTY_SEP):
            props_s += PROPERTY_SEP
        props_s += CRC32 + "\x01" + "0" * 10 + PROPERTY_SEP
    props_b = props_s.encode("utf-8", "surrogateescape")
    if len(props_b) > MAX_PROPERTIES_LEN:
        raise CorruptRecordError(None, None, "properties_too_long", f"{len(props_b)} bytes > {MAX_PROPERTIES_LEN}")
    version = msg.magic_version
    if version == 1 and len(topic_b) > 127:
        raise CorruptRecordError(None, None, "topic_too_long", "V1 topics hold at most 127 bytes; use magic_version=2")
    sysf = msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
    born = encode_host(msg.born_host)
    store = encode_host(msg.store_host)
    if len(born) == 20:
        sysf |= BORNHOST_V6_FLAG
    if len(store) == 20:
        sysf |= STOREHOST_V6_FLAG
    total = record_length(sysf, len(msg.body), len(topic_b), len(props_b), version)
    crc = body_crc(msg.body) if msg.body_crc is None else msg.body_crc
    out = bytearray()
    out += _HDR.pack(total, MAGIC_V2 if version == 2 else MAGIC_V1, crc, msg.queue_id, msg.flag, msg.queue_offset,
                     msg.physical_offset, sysf, msg.born_timestamp)
    out += born
    out += _I64.pack(msg.store_timestamp)
    out += store
    out += _I32.pack(msg.reconsume_times)
    out += _I64.pack(msg.prepared_transaction_offset)
    out += _I32.pack(len(msg.body))
    out += msg.body
    out += len(topic_b).to_bytes(2 if version == 2 else 1, "big", signed=True)
    out += topic_b
    out += len(props_b).to_bytes(2, "big", signed=True)
    out += props_b
    if prop_crc:
        value = body_crc(bytes(out[: total - CRC32_RESERVED_LEN]))
        digits = crc_digits(value).encode()
        out[total - 11 : total - 1] = digits
    assert len(out) == total
    return bytes(out)


def blank_record(free: int) -> bytes:
    """The 8 bytes of an end-of-file blank record covering ``free`` bytes."""
    return _I32.pack(free) + _I32.pack(BLANK_MAGIC)
