"""Time zones: one reader (storelib.units.parse_zone) for every ``--tz``, and rebuilt index files named in
the zone the broker's JVM names its own in.

UtilAll.timeMillisToHumanString formats with ``Calendar.getInstance()``: the JVM's default zone
(4.9.8 UtilAll.java:118, 5.3.3 UtilAll.java:138), and IndexService sorts the files by name
(``Arrays.sort(files)``, IndexService.java:62/63) and deletes expired ones from the front. A rebuild that
named files in UTC on a broker west of UTC would leave them sorting after the files the broker creates
next; so it names them in this host's zone by default, as a JVM here would, or in ``--tz``.
"""

from __future__ import annotations

import json
from datetime import timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from jobs.cli import main as cli_main
from storelib.format.indexdir import index_file_name, list_index_files
from tests.rebuild_storegen import CraftedStore, msg


@pytest.mark.parametrize("text,want", [
    ("Z", timezone.utc), ("UTC", timezone.utc), ("gmt", timezone.utc), ("Etc/UTC", timezone.utc),
    ("+08:00", timezone(timedelta(hours=8))), ("-0500", timezone(timedelta(hours=-5))),
    ("GMT+8", timezone(timedelta(hours=8))), ("UTC-05:30", timezone(timedelta(hours=-5, minutes=-30))),
    ("Asia/Shanghai", ZoneInfo("Asia/Shanghai")), ("America/Los_Angeles", ZoneInfo("America/Los_Angeles")),
])
def test_parse_zone_reads_what_users_and_jvms_write(text, want):
    from storelib.units import parse_zone

    assert parse_zone(text) == want


@pytest.mark.parametrize("bad", ["Mars/Olympus", "+25:00", "", "UTC+8:99"])
def test_parse_zone_refuses_what_is_no_zone(bad):
    from storelib.units import parse_zone

    with pytest.raises(ValueError, match="time zone"):
        parse_zone(bad)


@pytest.mark.parametrize("tz", ["America/Los_Angeles", ":America/Los_Angeles", "/usr/share/zoneinfo/America/Los_Angeles"])
def test_local_zone_follows_tz_first_as_a_jvm_does(monkeypatch, tz):
    from storelib.units import local_zone, parse_zone

    monkeypatch.setenv("TZ", tz)
    assert local_zone() == ZoneInfo("America/Los_Angeles")
    assert parse_zone("local") == ZoneInfo("America/Los_Angeles")


def _store(root) -> int:
    cs = CraftedStore(8192, start_ts=1_700_000_000_000)  # 2023-11-14 22:13:20 UTC = 14:13:20 in Los Angeles
    for i in range(20):
        cs.append(msg("T", i % 2, keys=f"k{i}", uniq=f"U{i}"))
    cs.write(root)
    return cs.placed[0].msg.store_timestamp


def _rebuild(tmp_path, name: str, *extra: str) -> tuple[int, list[str], dict]:
    out = tmp_path / name
    rc = cli_main(["rebuild", str(tmp_path / "store"), "--out", str(out), "--quiet", "--json", *extra])
    names = [r.name for r in list_index_files(out)] if out.exists() else []
    man = json.loads((out / "rebuild-manifest.json").read_text()) if out.exists() else {}
    return rc, names, man


def test_rebuild_names_index_files_in_the_hosts_zone_by_default(tmp_path, monkeypatch, capsys):
    first = _store(tmp_path / "store")
    monkeypatch.setenv("TZ", "America/Los_Angeles")  # a broker host west of UTC
    rc, names, man = _rebuild(tmp_path, "local")
    assert rc == 0 and names == [index_file_name(first, "America/Los_Angeles")] == ["20231114141320001"]
    assert "America/Los_Angeles" in man["settings"]["index_name_policy"]
    rc, names, _ = _rebuild(tmp_path, "utc", "--tz", "UTC")  # the broker's JVM ran in UTC
    assert rc == 0 and names == [index_file_name(first, "UTC")] == ["20231114221320001"]
    rc, names, _ = _rebuild(tmp_path, "east", "--tz", "+08:00")
    assert rc == 0 and names == ["20231115061320001"]


def test_rebuild_with_a_bad_zone_stops_before_any_work(tmp_path, capsys):
    _store(tmp_path / "store")
    rc, names, _ = _rebuild(tmp_path, "bad", "--tz", "Mars/Olympus")
    assert rc == 2 and not (tmp_path / "bad").exists()
    assert "not a time zone: 'Mars/Olympus'" in capsys.readouterr().err
