"""The vectorised Java hashes (inverse-power running sums, fixed-width matrix product, hashing each
distinct value once) against the scalar ``String.hashCode``, and ``index_keys`` against a scalar
reference of the broker's key rules."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from storelib.broker.index.indexbuild import index_keys
from storelib.format.javahash import (
    index_hash,
    java_hash_array,
    java_hashes,
    java_hashes_repeated,
    java_string_hash,
    utf16_lengths,
)
from storelib.format.properties import java_string

ALPHABET = list("abcXYZ019 -_#") + ["é", "ß", "中", "😀", "\x00", "\x7f"]


def _words(rng: random.Random, n: int, fixed: int | None = None, nulls: bool = True) -> list[str | None]:
    out: list[str | None] = []
    for _ in range(n):
        if nulls and rng.random() < 0.1:
            out.append(None)
        elif fixed is not None:
            out.append("".join(rng.choice("0123456789ABCDEF") for _ in range(fixed)))
        else:
            out.append("".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 40))))
    return out


def _check(words: list[str | None], arr: pa.Array | None = None) -> None:
    arr = pa.array(words, pa.string()) if arr is None else arr
    h, n = java_hashes(arr)
    want_h = [java_string_hash(w) if w is not None else 0 for w in words]
    want_n = [len(w.encode("utf-16-le")) // 2 if w is not None else 0 for w in words]
    assert h.tolist() == want_h
    assert n.tolist() == want_n
    assert java_hash_array(arr).tolist() == want_h
    assert utf16_lengths(arr).tolist() == want_n
    rh, rn = java_hashes_repeated(arr)
    assert rh.tolist() == want_h and rn.tolist() == want_n


def test_java_hashes_match_string_hashcode_on_mixed_text_nulls_and_empty():
    rng = random.Random(1)
    _check(_words(rng, 500))
    _check(["", "", None])
    _check([])
    _check(["x" * 5000, "a", "😀" * 3])


def test_fixed_width_rows_use_the_matrix_product_and_stay_exact():
    rng = random.Random(2)
    _check(_words(rng, 300, fixed=32))  # UNIQ_KEY-like, with nulls (empty rows skipped)
    _check(_words(rng, 300, fixed=32, nulls=False))
    _check(["ééé", "abcdef", "中中"])  # same byte width, non-ASCII rows recomputed over UTF-16
    _check(["x" * 300, "y" * 300])  # wider than the matrix path: running sums


def test_hashes_of_sliced_arrays_and_repeated_values():
    rng = random.Random(3)
    words = _words(rng, 200)
    arr = pa.array(words, pa.string())
    _check(words[17:150], arr.slice(17, 133))
    topics = [rng.choice(["TopicA", "TopicB", "%RETRY%g", "é"]) for _ in range(400)]
    _check(topics)
    fixed = _words(rng, 64, fixed=32)
    _check(fixed[5:40], pa.array(fixed, pa.string()).slice(5, 35))


def _reference_index_keys(topics, uniq, keys, tran) -> tuple[list[int], list[int]]:
    rows, hs = [], []
    for r, (t, u, k, tt) in enumerate(zip(topics, uniq, keys, tran)):
        if tt == 3:
            continue
        if u is not None:
            rows.append(r)
            hs.append(index_hash(f"{t}#{u}"))
        for tok in (k.split(" ") if k is not None else []):
            if tok:
                rows.append(r)
                hs.append(index_hash(f"{t}#{tok}"))
    return rows, hs


@pytest.mark.parametrize("ascii_keys", [False, True], ids=["mixed-keys", "ascii-keys"])
@pytest.mark.parametrize("topic_codes", [False, True], ids=["topic-names", "topic-codes"])
def test_index_keys_match_the_scalar_key_rules(ascii_keys, topic_codes):
    """ASCII-only and mixed KEYS (ASCII rows alone and beside rows decoded to UTF-16), with empty tokens
    (leading, trailing, doubled spaces), null and empty KEYS, and topics as names or as codes (a
    dictionary column: the rebuild's and the audit's batches)."""
    rng = random.Random(4)
    parts = ["a", "", "k1", "x" * 50, " "] + ([] if ascii_keys else ["é", "用户_9"])
    for fixed in (None, 32):
        n = 400
        topics = [rng.choice(["T", "order-events", "Ω", "%RETRY%cg"]) for _ in range(n)]
        uniq = _words(rng, n, fixed=fixed)
        keys = [None if rng.random() < 0.2 else " ".join(rng.choice(parts)
                                                            for _ in range(rng.randrange(0, 5))) for _ in range(n)]
        tran = [rng.choice([0, 0, 0, 1, 2, 3]) for _ in range(n)]
        topic_col = pa.array(topics, pa.string())
        batch = pa.RecordBatch.from_pydict({
            "topic": topic_col.dictionary_encode() if topic_codes else topic_col,
            "uniq_key": pa.array(uniq, pa.string()),
            "keys": pa.array(keys, pa.string()), "tran_type": pa.array(tran, pa.int8())})
        rows, hs = index_keys(batch)
        want_rows, want_hs = _reference_index_keys(topics, uniq, keys, tran)
        assert rows.tolist() == want_rows
        assert hs.tolist() == want_hs
        r2, h2 = index_keys(batch.slice(33, 200))
        wr, wh = _reference_index_keys(topics[33:233], uniq[33:233], keys[33:233], tran[33:233])
        assert r2.tolist() == wr and h2.tolist() == wh
    assert np.asarray(rows).dtype == np.int64


def test_long_inputs_are_hashed_in_blocks_with_the_same_result(monkeypatch):
    import storelib.format.javahash as jh

    rng = random.Random(5)
    words = _words(rng, 300)
    want = java_hashes(pa.array(words, pa.string()))
    monkeypatch.setattr(jh, "_BLOCK", 64)  # many blocks, and rows longer than a block
    got = java_hashes(pa.array(words + ["z" * 200], pa.string()))
    assert got[0][:-1].tolist() == want[0].tolist() and got[1][:-1].tolist() == want[1].tolist()
    assert int(got[0][-1]) == java_string_hash("z" * 200)


def _bytes_check(rows: list[bytes]) -> None:
    """java_hashes over raw UTF-8 (valid or not) == hashCode and length of the String the broker's
    decode (java_string) makes of it."""
    arr = pa.array(rows, pa.binary()).view(pa.string())
    h, n = java_hashes(arr)
    text = [java_string(r) for r in rows]
    assert h.tolist() == [java_string_hash(t) for t in text]
    assert n.tolist() == [len(t.encode("utf-16-le", "surrogatepass")) // 2 for t in text]


def test_non_ascii_rows_decoded_column_wise_hash_like_java_for_every_utf8_length():
    rng = random.Random(9)
    chars = ["a", "Z", " ", "\x7f", "é", "\u07ff", "\u0800", "中", "\ud7ff", "\ue000", "\uffff",
             "\U00010000", "😀", "\U0010ffff"]
    for _ in range(20):
        words = ["".join(rng.choice(chars) for _ in range(rng.randrange(0, 60))) for _ in range(200)]
        words += ["x" * 2000 + "é" + "y" * 10, "😀" * 300]
        _bytes_check([w.encode("utf-8") for w in words])
        bmp = [w for w in words if all(ord(c) < 0x10000 for c in w)]  # no surrogate pairs at all
        _bytes_check([w.encode("utf-8") for w in bmp])


def test_invalid_utf8_rows_fall_back_to_the_brokers_decoder():
    good = ["abc", "中文", "😀x"]
    bad = [b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xff",
           b"\x80abc", b"ab\xe4\xb8", b"\xf5\x80\x80\x80"]
    for b in bad:
        _bytes_check([g.encode() for g in good] + [b] + [g.encode() for g in good])
    # a character split across two rows: each row alone is invalid
    _bytes_check([b"x\xe4\xb8", b"\xadyz", "中".encode()])
