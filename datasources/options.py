"""What every source's options share: the store to open (:class:`StoreOpen`), option value parsing, and
the Spark DDL of an Arrow schema. No Spark import: readers run on plain Python too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from storelib.fileio.bytesource import Location, resolve
from storelib.scan.messagecols import TIME_TYPE

_ARROW_DDL = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT",
              pa.bool_(): "BOOLEAN", pa.string(): "STRING", pa.binary(): "BINARY", pa.float64(): "DOUBLE",
              TIME_TYPE: "TIMESTAMP"}



def spark_ddl(schema: pa.Schema) -> str:
    """A Spark DDL string for an Arrow schema of the types used here."""

    def t(typ: pa.DataType) -> str:
        if pa.types.is_map(typ):
            return f"MAP<{t(typ.key_type)}, {t(typ.item_type)}>"
        if pa.types.is_list(typ):
            return f"ARRAY<{t(typ.value_type)}>"
        if typ in _ARROW_DDL:
            return _ARROW_DDL[typ]
        raise TypeError(f"no Spark type for {typ}")

    return ", ".join(f"`{f.name}` {t(f.type)}" for f in schema)


def norm_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Option names case- and underscore-insensitive (``withBody`` == ``with_body`` == ``withbody``)."""
    return {str(k).lower().replace("_", ""): v for k, v in options.items() if v is not None}


def parse_bool(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"option {name}: expected true/false, got {v!r}")


def parse_int(name: str, v: Any) -> int:
    try:
        return int(str(v).strip())
    except ValueError:
        raise ValueError(f"option {name}: expected an integer, got {v!r}") from None


def parse_time(name: str, v: Any) -> int:
    """Epoch milliseconds from an integer or an ISO-8601 date/time (UTC unless it carries a zone)."""
    from storelib.units import parse_time_ms

    try:
        return parse_time_ms(v)
    except ValueError:
        raise ValueError(f"option {name}: expected epoch ms or an ISO date/time, got {v!r}") from None


def parse_bytes(name: str, v: Any) -> int:
    """A positive byte count: plain or with a unit (``128k``, ``64MB``; storelib.units.parse_size)."""
    from storelib.units import parse_size

    try:
        n = parse_size(v)
    except ValueError:
        raise ValueError(f"option {name}: expected a size such as 128k or 64MB, got {v!r}") from None
    if n <= 0:
        raise ValueError(f"option {name}: must be positive, got {v!r}")
    return n


@dataclass(frozen=True)
class StoreOpen:
    """How to reach a store from any process, and whose settings apply: the same way in as the CLI's
    STORE, ``--broker-conf``, ``--broker-version`` and ``--set`` (options ``path``, ``brokerConf``,
    ``brokerVersion`` = 4/5/auto, ``set.KEY`` = value, ``fs.KEY`` = filesystem option)."""

    path: str
    broker_conf: str | None = None
    fs_options: tuple[tuple[str, str], ...] = ()
    broker_version: str | None = None  # "4" or "5"; None detects (storelib.broker.settings.brokerline)
    overrides: tuple[tuple[str, str], ...] = ()

    NAMES = frozenset({"path", "brokerconf", "brokerversion"})

    @classmethod
    def is_option(cls, norm_key: str) -> bool:
        """Whether a normalised option name (see ``norm_options``) is one of the store's own."""
        return norm_key in cls.NAMES or norm_key.startswith(("fs.", "set."))

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> StoreOpen:
        from storelib.broker.settings.brokerline import normalise_version

        o = norm_options(options)
        path = o.get("path")
        if not path:
            raise ValueError("the store path is required: spark.read.format(...).load(STORE)")
        fs = tuple(sorted((k[len("fs."):], str(v)) for k, v in options.items() if str(k).lower().startswith("fs.")))
        sets = tuple(sorted((str(k)[len("set."):], str(v)) for k, v in options.items()
                            if str(k).lower().startswith("set.") and v is not None))
        return cls(str(path), o.get("brokerconf"), fs, normalise_version(o.get("brokerversion")), sets)

    def location(self) -> Location:
        return resolve(self.path, **dict(self.fs_options))

    def settings(self):
        """The broker settings (storelib.broker.settings.store.load_settings), computed once per process."""
        return _settings(self)

    def at_cut(self):
        """The store read as at a cut taken now (a store a broker is writing: each query plans on its own cut,
        storelib.broker.settings.livecut; a store at rest reads as it is)."""
        from storelib.broker.settings.store import Store

        store = Store(self.location(), self.settings(), uri=self.path)
        store.take_cut()
        return store


@functools.lru_cache(maxsize=8)
def _settings(store: StoreOpen):
    from storelib.broker.settings.store import load_settings
    from storelib.broker.settings.storeroot import require_store_root

    require_store_root(store.location(), store.path)  # planning fails with one line on what is not a store
    return load_settings(store.broker_conf, store.broker_version, dict(store.overrides), store.location())

