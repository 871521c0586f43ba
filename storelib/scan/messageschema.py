"""The message columns every scan yields (``rmqstore messages``, the ``rocketmq`` data source, exports)."""

from __future__ import annotations

import pyarrow as pa

MESSAGE_FIELDS: list[pa.Field] = [
    pa.field("phy_offset", pa.int64(), False),
    pa.field("size", pa.int32(), False),
    pa.field("magic_version", pa.int8(), False),
    pa.field("body_crc", pa.int32(), False),
    pa.field("crc_ok", pa.bool_()),
    pa.field("queue_id", pa.int32(), False),
    pa.field("flag", pa.int32(), False),
    pa.field("queue_offset", pa.int64(), False),
    pa.field("physical_offset_field", pa.int64(), False),
    pa.field("sys_flag", pa.int32(), False),
    pa.field("tran_type", pa.int8(), False),
    pa.field("born_timestamp", pa.int64(), False),
    pa.field("born_host", pa.string(), False),
    pa.field("store_timestamp", pa.int64(), False),
    pa.field("store_host", pa.string(), False),
    pa.field("reconsume_times", pa.int32(), False),
    pa.field("prepared_transaction_offset", pa.int64(), False),
    pa.field("body_len", pa.int32(), False),
    pa.field("topic", pa.string(), False),
    pa.field("tags", pa.string()),
    pa.field("keys", pa.string()),
    pa.field("uniq_key", pa.string()),
    pa.field("msg_id", pa.string(), False),
    pa.field("tags_code", pa.int64(), False),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("properties_raw", pa.string()),
    pa.field("prop_crc_ok", pa.bool_()),
    pa.field("delay_level", pa.int32()),
    pa.field("body", pa.binary()),
]
MESSAGE_SCHEMA = pa.schema(MESSAGE_FIELDS)

# a DLedger-mode commitlog's entries add their header's ledger fields (after the message columns);
# ``dledger_committed`` is null when the scan was not told the committed index
DLEDGER_FIELDS: list[pa.Field] = [
    pa.field("dledger_index", pa.int64(), False),
    pa.field("dledger_term", pa.int64(), False),
    pa.field("dledger_pos", pa.int64(), False),
    pa.field("dledger_committed", pa.bool_()),
]
DLEDGER_NAMES = frozenset(f.name for f in DLEDGER_FIELDS)


def message_schema(with_body: bool = False, with_properties: bool = True, dledger: bool = False) -> pa.Schema:
    """The scan schema for a choice of optional columns (``dledger``: with the DLedger entry columns)."""
    drop = set()
    if not with_body:
        drop.add("body")
    if not with_properties:
        drop.add("properties")
    return pa.schema([f for f in MESSAGE_FIELDS if f.name not in drop] + (DLEDGER_FIELDS if dledger else []))
