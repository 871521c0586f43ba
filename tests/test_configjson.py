"""storelib.format.configjson and storelib.format.fastjson against the real fastjson-written samples (samples/fastjson-config)."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow.fs as pafs
import pytest

from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.format.configjson import (
    TopicConfig,
    consumer_offsets,
    delay_offsets,
    load_config,
    split_topic_group,
    topic_configs,
    write_config,
)
from storelib.format.fastjson import dump_fastjson, parse_fastjson, salvage_prefix, salvage_prefix_detail
from tests.conftest import SAMPLES as _SHARED_SAMPLES

SAMPLES = _SHARED_SAMPLES / "fastjson-config"
EXPECTED = json.loads((SAMPLES / "expected.json").read_text())["files"]
PARSEABLE = sorted(k for k, v in EXPECTED.items() if v["parses"])
BROKEN = sorted(k for k, v in EXPECTED.items() if not v["parses"])


def _ordered(o):
    """Content as nested (str(key), value) lists, so key order and int-vs-"int" keys are compared too."""
    if isinstance(o, dict):
        return [(str(k), _ordered(v)) for k, v in o.items()]
    if isinstance(o, list):
        return [_ordered(x) for x in o]
    return o


def _maps_at(data, pattern: str):
    """The maps an ``integer_key_maps`` entry names ("/offsetTable" or "/offsetTable/*")."""
    parts = [p for p in pattern.split("/") if p]
    nodes = [data]
    for p in parts:
        nxt = []
        for n in nodes:
            nxt.extend(n.values() if p == "*" else [n[p]])
        nodes = nxt
    return nodes


def _all_maps(o, path=""):
    if isinstance(o, dict):
        yield path, o
        for k, v in o.items():
            yield from _all_maps(v, f"{path}/{k}")
    elif isinstance(o, list):
        for x in o:
            yield from _all_maps(x, path)


@pytest.fixture
def sample_copy(tmp_path):
    dst = tmp_path / "fastjson-config"
    shutil.copytree(SAMPLES, dst)
    for p in dst.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return dst


@pytest.mark.parametrize("rel", PARSEABLE)
def test_sample_parses_to_expected_content_in_file_order(rel):
    data = parse_fastjson((SAMPLES / rel).read_text(encoding="utf-8"), file=rel)
    assert _ordered(data) == _ordered(EXPECTED[rel]["content"])


@pytest.mark.parametrize("rel", PARSEABLE)
def test_bare_keys_come_back_as_int_and_quoted_keys_as_str(rel):
    data = parse_fastjson((SAMPLES / rel).read_text(encoding="utf-8"), file=rel)
    int_maps = {id(m) for pat in EXPECTED[rel]["integer_key_maps"] for m in _maps_at(data, pat)}
    for path, m in _all_maps(data):
        if id(m) in int_maps:
            assert all(type(k) is int for k in m), path
        else:
            assert all(type(k) is str for k in m), path


@pytest.mark.parametrize("rel", PARSEABLE)
def test_writer_reproduces_sample_byte_for_byte_and_round_trips(rel):
    raw = (SAMPLES / rel).read_bytes()
    data = parse_fastjson(raw.decode("utf-8"))
    pretty = EXPECTED[rel]["layout"] == "pretty"
    text = dump_fastjson(data, pretty=pretty)
    assert text.encode("utf-8") == raw
    assert parse_fastjson(text) == data
    assert parse_fastjson(dump_fastjson(data, pretty=not pretty)) == data


def test_edge_values_are_exact_including_negative_keys_and_long_max():
    data = parse_fastjson((SAMPLES / "edge/config/consumerOffset.json").read_text())
    table = data["offsetTable"]
    assert list(table["NegTopic@GID_NEG"].items()) == [(-1, 5), (1000, 6)]
    assert table["BigTopic@GID_BIG"] == {0: 2**53 + 1, 1: 2**63 - 1, 2: 0, 3: -1}


@pytest.mark.parametrize("rel", BROKEN)
def test_powercut_files_fail_with_file_and_byte_offset(rel):
    with pytest.raises(StoreError) as ei:
        parse_fastjson((SAMPLES / rel).read_bytes().decode("utf-8"), file=rel)
    err = ei.value
    assert err.kind == "bad_json" and err.file == rel
    assert err.offset == EXPECTED[rel]["truncated_at_byte"]
    assert rel in str(err) and "@ 231" in str(err)


@pytest.mark.parametrize("rel", BROKEN)
def test_powercut_salvage_keeps_complete_entries_only(rel):
    text = (SAMPLES / rel).read_bytes().decode("utf-8")
    want = EXPECTED[rel]["salvageable_prefix"]["complete_entries"]
    got = salvage_prefix(text)
    assert _ordered(got) == _ordered(want)
    order_events = got["offsetTable"]["OrderEvents@GID_ORDER_CONSUMER"]
    assert 10 not in order_events  # "10017" cut to "100" must not be reported
    detail = salvage_prefix_detail(text)
    assert not detail.complete
    assert "/offsetTable/OrderEvents@GID_ORDER_CONSUMER/10" in detail.dropped


@pytest.mark.parametrize("case", ["powercut", "powercut-nul"])
def test_load_config_falls_back_to_bak_and_says_so(sample_copy, case):
    res = load_config(sample_copy / case, "consumerOffset.json")
    rel = f"{case}/config/consumerOffset.json"
    assert res.source == "bak"
    assert res.path.endswith("consumerOffset.json.bak")
    assert _ordered(res.data) == _ordered(EXPECTED[rel]["correct_parser_result"]["content"])
    (f,) = [f for f in res.findings if f.kind == "config_unparseable"]
    assert f.offset == 231 and f.file.endswith(rel) and f.extra["fallback"] == "bak"
    assert ".bak" in f.detail


def test_load_config_reads_primary_when_it_parses(sample_copy):
    res = load_config(sample_copy / "pretty", "topics.json")
    assert res.source == "file" and res.findings == []
    assert res.data["dataVersion"]["counter"] == 11


def test_load_config_missing_file_uses_bak_and_missing_both_means_empty_table(sample_copy):
    cfg = sample_copy / "pretty" / "config"
    (cfg / "delayOffset.json").unlink()
    res = load_config(sample_copy / "pretty", "delayOffset.json")
    assert res.source == "bak" and [f.kind for f in res.findings] == ["config_missing"]
    (cfg / "delayOffset.json.bak").unlink()
    res = load_config(sample_copy / "pretty", "delayOffset.json")
    assert res.source is None and res.data is None
    assert res.findings[0].severity == "info" and "empty table" in res.findings[0].detail


def test_load_config_empty_file_uses_bak(sample_copy):
    (sample_copy / "pretty/config/topics.json").write_bytes(b"")
    res = load_config(sample_copy / "pretty", "topics.json")
    assert res.source == "bak" and res.data["dataVersion"]["counter"] == 10
    assert res.findings[0].kind == "config_empty"


def test_load_config_corrupt_bak_is_an_error_finding(sample_copy):
    cfg = sample_copy / "powercut/config"
    bad = '{"offsetTable":{"a@b":{0:1,}}}'
    (cfg / "consumerOffset.json.bak").write_text(bad)
    res = load_config(sample_copy / "powercut", "consumerOffset.json")
    assert res.source is None and res.data is None
    bak = [f for f in res.findings if f.kind == "config_bak_unparseable"]
    assert bak and bak[0].severity == "error" and bak[0].offset == bad.index(",}") + 1


def test_load_config_reports_tmp_leftover_and_can_use_it(sample_copy):
    cfg = sample_copy / "powercut/config"
    good = (SAMPLES / "pretty/config/consumerOffset.json").read_bytes()
    (cfg / "consumerOffset.json.tmp").write_bytes(good)
    res = load_config(sample_copy / "powercut", "consumerOffset.json")
    assert res.source == "bak"
    tmp = [f for f in res.findings if f.kind == "config_tmp_leftover"]
    assert tmp and tmp[0].extra["parses"] is True
    res = load_config(sample_copy / "powercut", "consumerOffset.json", use_tmp=True)
    assert res.source == "tmp" and res.data == parse_fastjson(good.decode())


def test_load_config_through_a_non_local_filesystem(sample_copy):
    fs = pafs.SubTreeFileSystem(str(sample_copy), pafs.LocalFileSystem())
    res = load_config(Location(fs, "powercut-nul", False), "consumerOffset.json")
    assert res.source == "bak" and res.path == "powercut-nul/config/consumerOffset.json.bak"
    assert res.findings[0].offset == 231


def test_tv12_bare_keys_and_string_with_comma_digit_colon():
    text = (
        '{\n\t"offsetTable":{\n\t\t"TopicTest@group_a":{0:250,1:250,2:249,3:251\n\t\t},'
        '\n\t\t"%RETRY%group_a@group_a":{0:0\n\t\t}\n\t}\n}'
    )
    assert parse_fastjson(text) == {
        "offsetTable": {
            "TopicTest@group_a": {0: 250, 1: 250, 2: 249, 3: 251},
            "%RETRY%group_a@group_a": {0: 0},
        }
    }
    assert parse_fastjson('{"x":"a,5:b","m":{7:1}}') == {"x": "a,5:b", "m": {7: 1}}


def test_comma_digit_colon_inside_filter_expression_is_left_alone():
    data = parse_fastjson((SAMPLES / "pretty/config/consumerFilter.json.bak").read_text())
    expr = data["filterDataByTopic"]["OrderEvents"]["groupFilterData"]["GID_SQL_FILTER"]["expression"]
    assert expr.endswith("memo <> 'x,1:y'")


def test_quoted_numeric_key_stays_a_string():
    assert parse_fastjson('{"0":1, 1 :2}') == {"0": 1, 1: 2}


def test_ref_is_rejected_with_its_offset():
    text = '{"a":{"b":1},"c":{"$ref":"$.a"}}'
    with pytest.raises(StoreError) as ei:
        parse_fastjson(text, file="topics.json")
    assert ei.value.kind == "bad_json" and ei.value.offset == text.index('"$ref"') and "$ref" in str(ei.value)
    with pytest.raises(StoreError):
        salvage_prefix(text)


def test_error_offset_is_in_bytes_of_the_original_text():
    text = '{"主":{0:1,1:2},"b":tru}'
    with pytest.raises(StoreError) as ei:
        parse_fastjson(text, file="x.json")
    assert ei.value.file == "x.json"
    assert ei.value.offset == len(text[: text.index("tru")].encode())


@pytest.mark.parametrize("text", ["", "  \n", "[1,2]", '{"a":NaN}', '{"a":1} x', '{"a":1}\x00'])
def test_invalid_texts_raise_store_error(text):
    with pytest.raises(StoreError):
        parse_fastjson(text)


def test_write_config_follows_tmp_bak_rename_sequence(tmp_path):
    path = tmp_path / "consumerOffset.json"
    first = {"offsetTable": {"T@g": {0: 1}}}
    second = {"offsetTable": {"T@g": {0: 2, -1: 2**63 - 1}}}
    write_config(path, first)
    assert not (tmp_path / "consumerOffset.json.bak").exists()
    write_config(path, second)
    assert parse_fastjson(path.read_text()) == second
    assert parse_fastjson((tmp_path / "consumerOffset.json.bak").read_text()) == first
    assert not (tmp_path / "consumerOffset.json.tmp").exists()
    assert path.read_text() == '{\n\t"offsetTable":{\n\t\t"T@g":{0:2,-1:9223372036854775807\n\t\t}\n\t}\n}'


def test_writer_escapes_like_fastjson():
    s = "q\" b\\ / \n\t\b\f\r \x0b \x1f \x7f \x85 \u2028 \u2029 < > & ' 主 😀 \ufeff"
    out = dump_fastjson({"e": s}, pretty=False)
    assert out == (
        '{"e":"q\\" b\\\\ / \\n\\t\\b\\f\\r \\u000B \\u001F \\u007F \\u0085 \\u2028 \\u2029 < > & \' 主 😀 \ufeff"}'
    )
    assert parse_fastjson(out) == {"e": s}


def test_writer_drops_nulls_and_keeps_empty_maps_inline():
    assert dump_fastjson({"a": None, "b": {}, "c": [1, None]}) == '{\n\t"b":{},\n\t"c":[1,null]\n}'


def test_consumer_offsets_typed_view_of_pretty_sample():
    data = parse_fastjson((SAMPLES / "pretty/config/consumerOffset.json").read_text())
    offs = consumer_offsets(data)
    assert offs[("TopicTest", "please_rename_unique_group_name_4")][7] == 521
    assert offs[("ReadOnlyTopic", "GID_SLAVE_READER")] == {
        0: 123456789012,
        1: 123456789013,
        2: 123456789014,
        3: 123456789015,
    }
    assert offs[("%RETRY%GID_ORDER_CONSUMER", "GID_ORDER_CONSUMER")] == {0: 5}
    assert len(offs) == 6
    strict = consumer_offsets(EXPECTED["pretty/config/consumerOffset.json"]["content"])
    assert strict == offs  # strict-JSON input with "0" keys gives the same typed result


def test_consumer_offsets_includes_lmq_table_as_queue_zero():
    data = parse_fastjson((SAMPLES / "lmq/config/lmqConsumerOffset.json").read_text())
    offs = consumer_offsets(data, include_lmq=True)
    assert offs[("%LMQ%chat-room-9", "%LMQ%chat-room-9")] == {0: 1210}
    assert offs[("TopicTest", "GID_MQTT_BRIDGE")] == {0: 10, 1: 11}
    assert ("%LMQ%order-123", "%LMQ%order-123") not in consumer_offsets(data)


def test_topic_group_split_rule_and_findings():
    assert split_topic_group("T@g") == ("T", "g")
    assert split_topic_group("T@g@x") == ("T", "g@x")
    assert split_topic_group("%RETRY%a@b@a@b") == ("%RETRY%a@b", "a@b")
    assert split_topic_group("nosep") is None
    findings = []
    offs = consumer_offsets(
        {"offsetTable": {"nosep": {0: 1}, "T@g@x": {0: 2}, "U@h": {"x": 1}}}, findings=findings
    )
    assert offs == {("T", "g@x"): {0: 2}, ("U", "h"): {}}
    assert sorted(f.kind for f in findings) == ["ambiguous_offset_key", "bad_offset_entry", "bad_offset_key"]


def test_delay_offsets_of_pretty_sample():
    data = parse_fastjson((SAMPLES / "pretty/config/delayOffset.json").read_text())
    d = delay_offsets(data)
    assert list(d) == list(range(1, 19)) and d[3] == 1023 and d[18] == 128


def test_topic_configs_of_pretty_sample():
    tcs = topic_configs(parse_fastjson((SAMPLES / "pretty/config/topics.json").read_text()))
    assert len(tcs) == 20
    ro = tcs["ReadOnlyTopic"]
    assert (ro.perm, ro.read_queue_nums, ro.write_queue_nums, ro.readable, ro.writable) == (
        4,
        4,
        2,
        True,
        False,
    )
    oe = tcs["OrderEvents"]
    assert oe.order and oe.topic_filter_type == "MULTI_TAG" and oe.read_queue_nums == 16
    assert tcs["UnitTopic"].topic_sys_flag == 1
    assert tcs["BenchmarkTest"].read_queue_nums == 1024
    assert tcs["TopicTest"].queue_type == "SimpleCQ"


def test_topic_config_attributes_5x():
    tcs = topic_configs(
        {"topicConfigTable": {"B": {"topicName": "B", "attributes": {"+queue.type": "BatchCQ"}}}}
    )
    assert tcs["B"] == TopicConfig("B", attributes={"+queue.type": "BatchCQ"})
    assert tcs["B"].queue_type == "BatchCQ"


@pytest.mark.parametrize(
    ("text", "want", "dropped"),
    [
        ('{"a":{"b":1},"c":{"d":2}', {"a": {"b": 1}, "c": {"d": 2}}, []),
        ('{"a":{"b":1},"s":"abc"', {"a": {"b": 1}, "s": "abc"}, []),
        ('{"a":{"b":1},"t":true', {"a": {"b": 1}, "t": True}, []),
        ('{"a":{"b":1},"n":12', {"a": {"b": 1}}, ["/n"]),
        ('{"a":{"b":1},"s":"ab', {"a": {"b": 1}}, ["/s"]),
        ('{"a":{"b":1},"l":[1,2', {"a": {"b": 1}}, ["/l/1", "/l"]),
        ('{"a":{"b":1},"m":{', {"a": {"b": 1}}, ["/m"]),
        ('{"a":{"b":1},"k', {"a": {"b": 1}}, []),
        ('{"m":{0:1,1:2,2', {"m": {0: 1, 1: 2}}, []),
    ],
)
def test_salvage_keeps_values_that_cannot_have_been_cut(text, want, dropped):
    res = salvage_prefix_detail(text)
    assert res.data == want and res.dropped == dropped and not res.complete


def test_salvage_of_a_whole_file_is_the_parse():
    text = (SAMPLES / "pretty/config/topics.json").read_text()
    res = salvage_prefix_detail(text)
    assert res.complete and res.data == parse_fastjson(text) and res.stopped_at == len(text.encode())


@pytest.mark.parametrize("rel", ["pretty/config/consumerFilter.json.bak", "edge/config/consumerOffset.json"])
def test_fast_key_quoting_equals_the_scanning_recipe_on_every_prefix(rel):
    from storelib.format.fastjson import _quote_bare_keys, _quote_bare_keys_slow

    text = (SAMPLES / rel).read_text()
    for i in range(len(text) + 1):
        assert _quote_bare_keys(text[:i]) == _quote_bare_keys_slow(text[:i])[0], i
