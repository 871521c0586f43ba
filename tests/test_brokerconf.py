"""storelib.broker.settings.brokerconf: broker.conf parsing, defaults per version, getter rules."""

from __future__ import annotations

import dataclasses

import pyarrow.fs as pafs
import pytest

from storelib.broker.settings.brokerconf import BrokerSettings, load_broker_conf
from storelib.errors import StoreError
from storelib.fileio.bytesource import Location
from storelib.format.delaylevel import parse_delay_levels
from storelib.format.javaprops import parse_properties_text
from tests.conftest import SAMPLES

CONF_498 = str(SAMPLES / "rocketmq-4.9.8-small.broker.conf")
CONF_533 = str(SAMPLES / "rocketmq-5.3.3-small.broker.conf")

TV10_MS = (
    1000,
    5000,
    10000,
    30000,
    60000,
    120000,
    180000,
    240000,
    300000,
    360000,
    420000,
    480000,
    540000,
    600000,
    1200000,
    1800000,
    3600000,
    7200000,
)


def test_sample_498_conf_geometry():
    s = load_broker_conf(CONF_498)
    assert s.version == "4" and s.source == CONF_498
    assert s.mapped_file_size_commit_log == 524288
    assert s.mapped_file_size_consume_queue == 2000
    assert (s.max_hash_slot_num, s.max_index_num) == (200, 800)
    assert s.index_file_size == 16840  # the size of the sample's index files
    assert s.extra == {}
    assert s.enabled_append_prop_crc is False
    assert s.delay_levels_ms == TV10_MS and s.max_delay_level == 18


def test_sample_533_conf_as_5x_and_as_4x():
    s5 = load_broker_conf(CONF_533, version="5")
    assert s5.enabled_append_prop_crc is True and s5.auto_message_version_on_topic_len is True
    assert s5.mapper_file_size_batch_consume_queue == 13_800_000
    s4 = load_broker_conf(CONF_533, version="4")
    assert s4.enabled_append_prop_crc is False  # 4.9.8 has no such key
    assert s4.extra == {"enabledAppendPropCRC": "true"}


def test_load_through_location(tmp_path):
    (tmp_path / "broker.conf").write_text("maxIndexNum=10\n")
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert load_broker_conf(Location(fs, "broker.conf", False)).max_index_num == 10


def test_defaults_differ_by_version():
    d4, d5 = BrokerSettings.defaults("4"), BrokerSettings.defaults("5")
    assert d4.mapped_file_size_commit_log == d5.mapped_file_size_commit_log == 1 << 30
    assert d4.mapped_file_size_consume_queue == 6_000_000
    assert d4.index_file_size == 420_000_040
    assert d4.disk_space_warning_level_ratio is None and d5.disk_space_warning_level_ratio == 90
    assert d4.disk_space_warning_ratio == 0.90 and d5.disk_space_warning_ratio == 0.90
    assert d4.disk_space_force_ratio == 0.85 and d5.disk_space_force_ratio == 0.85
    assert d5.enable_compaction and not d4.enable_compaction
    assert BrokerSettings.defaults("4") == BrokerSettings()


def test_properties_syntax():
    text = (
        "# comment\n  ! bang comment\n"
        "a=1\nb : 2\nc 3\n"
        "d\\\n   ontinued = x\\\n   y\n"
        "e=\\u0041\\tB\n"
        "f\\ g=h\r\n"
        "# not continued \\\n"
        "k=v\\\\\n"
        "dup=1\ndup=2\n"
        "last=end\\"
    )
    p = {k: v[0] for k, v in parse_properties_text(text).items()}
    assert p == {
        "a": "1",
        "b": "2",
        "c": "3",
        "dontinued": "xy",
        "e": "A\tB",
        "f g": "h",
        "k": "v\\",
        "dup": "2",
        "last": "end",
    }
    assert parse_properties_text(text)["e"][1] == 9  # line numbers are 1-based, of the logical line start


def test_whitespace_trimming_and_unknown_keys_kept(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("  mappedFileSizeConsumeQueue =  1001  \nbrokerName=broker-a\nbrokerClusterName: c\n")
    s = load_broker_conf(conf)
    assert s.mapped_file_size_consume_queue_config == 1001
    assert s.mapped_file_size_consume_queue == 1020  # rounded up to a multiple of 20
    assert s.extra == {"brokerName": "broker-a", "brokerClusterName": "c"}


def test_invalid_number_names_file_and_line(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("# x\nmaxIndexNum=800\nmaxHashSlotNum=12k\n")
    with pytest.raises(StoreError) as ei:
        load_broker_conf(conf)
    err = ei.value
    assert err.file == str(conf) and "line 3" in err.detail and err.offset == len("# x\nmaxIndexNum=800\n")
    conf.write_text("mappedFileSizeCommitLog=3000000000\n")
    with pytest.raises(StoreError, match="Java int"):
        load_broker_conf(conf)


def test_malformed_unicode_escape_is_an_error(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text("deleteWhen=\\u00zz\n")
    with pytest.raises(StoreError, match="line 1"):
        load_broker_conf(conf)


def test_booleans_follow_java_parse_boolean():
    s = BrokerSettings.from_properties(
        {"messageIndexEnable": "TRUE", "enableLmq": "yes", "duplicationEnable": "true"}
    )
    assert s.message_index_enable is True and s.enable_lmq is False and s.duplication_enable is True


def test_disk_ratio_clamps_per_version():
    assert BrokerSettings.from_properties({"diskMaxUsedSpaceRatio": "5"}).disk_max_used_space_ratio == 10
    assert BrokerSettings.from_properties({"diskMaxUsedSpaceRatio": "99"}).disk_max_used_space_ratio == 95
    s5 = BrokerSettings.from_properties(
        {"diskSpaceWarningLevelRatio": "95", "diskSpaceCleanForciblyRatio": "10"}, version="5"
    )
    assert s5.disk_space_warning_ratio == 0.90 and s5.disk_space_force_ratio == 0.30
    s5p = s5.with_overrides({"rocketmq.broker.diskSpaceWarningLevelRatio": "0.5"})
    assert s5p.disk_space_warning_ratio == 0.5  # system property overrides the config
    s4 = BrokerSettings.defaults("4").with_overrides({"rocketmq.broker.diskSpaceWarningLevelRatio": "0.99"})
    assert s4.disk_space_warning_ratio == 0.99  # 4.9.8 does not clamp


def test_with_overrides_accepts_keys_attrs_and_typed_values():
    base = load_broker_conf(CONF_498)
    s = base.with_overrides({"maxIndexNum": 1000, "max_hash_slot_num": "300", "fooBar": "x"})
    assert (s.max_index_num, s.max_hash_slot_num) == (1000, 300)
    assert s.index_file_size == 40 + 300 * 4 + 1000 * 20
    assert s.extra == {"fooBar": "x"} and base.max_index_num == 800
    with pytest.raises(StoreError):
        base.with_overrides({"maxIndexNum": "many"})


def test_delay_level_parsing_like_the_broker():
    assert parse_delay_levels("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h") == TV10_MS
    assert parse_delay_levels("2d 1h ") == (172_800_000, 3_600_000)
    for bad in ("1s  5s", "1x", "s", "1.5s"):
        with pytest.raises(StoreError):
            parse_delay_levels(bad)
    with pytest.raises(StoreError, match="messageDelayLevel"):
        BrokerSettings.from_properties({"messageDelayLevel": "1s 2w"})


def test_to_properties_lists_non_defaults():
    s = load_broker_conf(CONF_498)
    assert s.to_properties() == {
        "mappedFileSizeCommitLog": "524288",
        "mappedFileSizeConsumeQueue": "2000",
        "maxHashSlotNum": "200",
        "maxIndexNum": "800",
    }
    assert BrokerSettings.from_properties(s.to_properties()) == dataclasses.replace(s, source=None)


def test_commit_log_dirs_default_and_multi_path():
    s = BrokerSettings.from_properties({"storePathRootDir": "/data/store"})
    assert s.commit_log_dirs == ["/data/store/commitlog"]
    s = s.with_overrides({"storePathCommitLog": "/d1/commitlog,/d2/commitlog"})
    assert s.commit_log_dirs == ["/d1/commitlog", "/d2/commitlog"]


def test_broker_conf_bytes_are_iso_8859_1_as_properties_load_reads_them(tmp_path):
    """BrokerStartup loads broker.conf with Properties.load(InputStream) (4.9.8 :119-121, 5.3.3 :296-299): one
    char per byte. UTF-8 text is read as its ISO-8859-1 chars, as the broker has it; \\uXXXX is the way to
    write other chars; a byte offset is still where the line starts."""
    conf = tmp_path / "broker.conf"
    conf.write_bytes(b"brokerName=broker-\xc3\xa9\nbrokerClusterName=c-\\u00e9\nmaxHashSlotNum=x\n")  # valid UTF-8
    with pytest.raises(StoreError) as ei:
        load_broker_conf(conf)
    assert ei.value.offset == conf.read_bytes().index(b"maxHashSlotNum") and "line 3" in ei.value.detail
    conf.write_bytes(conf.read_bytes().replace(b"maxHashSlotNum=x\n", b""))
    s = load_broker_conf(conf)
    assert s.extra["brokerName"] == "broker-\u00c3\u00a9"  # the two UTF-8 bytes of é, one char each
    assert s.extra["brokerClusterName"] == "c-\u00e9"


def test_a_utf8_bom_is_part_of_the_first_key_so_the_broker_ignores_that_setting(tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_bytes(b"\xef\xbb\xbfmappedFileSizeCommitLog=4096\nmaxHashSlotNum=100\n")
    s = load_broker_conf(conf)
    assert s.mapped_file_size_commit_log == 1 << 30 and s.max_hash_slot_num == 100
    unknown = [f for f in s.conf_findings if f.kind == "broker_conf_unknown_key"]
    assert [(f.offset, f.extra["key"], f.extra["suggestion"]) for f in unknown] == [
        (0, "\u00ef\u00bb\u00bfmappedFileSizeCommitLog", "mappedFileSizeCommitLog")]


def test_a_line_end_with_nothing_read_after_a_lone_backslash_ends_no_line():
    """Java 8's LineReader: a line end reached with nothing read (len == 0) starts over, even after a continued
    lone backslash: no empty key. A continued line is not a new line, so '#' there is text."""
    def props(text: str) -> dict[str, str]:
        return {k: v[0] for k, v in parse_properties_text(text).items()}

    assert props("\\\n\nk=v\n  \\\n   \n\\\n#x=y\n") == {"k": "v", "#x": "y"}
    assert props("k=v\n\\") == props("k=v\n\\\n") == {"k": "v", "": ""}  # the file ends: an empty line
