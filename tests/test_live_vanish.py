"""Reading commands on a live store whose broker's cleaner deletes a file after the run listed it (the
cleaner unlinks whole files, oldest first): each command says "expired during the run" once and goes on,
never exit 2. The deletion is injected at the moment the command first opens the file (the opener deletes
it first), so each case is deterministic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cli import main
from storelib.broker.settings.store import Store
from storelib.fileio import bytesource
from tests.livewriter import LiveConfig, LiveWriter, settings_overrides

_HOLDER = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
           "fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0); print('locked', flush=True); sys.stdin.read()")


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, LiveConfig]:
    """A 5.x store the live writer wrote for a moment (several segments, queues, index files, timers)."""
    root = tmp_path_factory.mktemp("vanish") / "store"
    cfg = LiveConfig(root=str(root), version="5", seconds=2.0, rate=800, body_max=3000, segment_size=256 << 10,
                     cq_units=40, index_slots=200, index_num=800, keep_segments=100_000, pause_at_s=None,
                     timer_ratio=0.1, timer_ms=500)
    with LiveWriter(cfg) as w:
        w.wait()
    return root, cfg


@pytest.fixture
def live(written, tmp_path):
    """A copy of the written store whose lock another process holds (a running broker, to the commands)."""
    src, cfg = written
    root = tmp_path / "store"
    shutil.copytree(src, root)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(root / "lock")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    try:
        yield root, [x for k, v in settings_overrides(cfg).items() for x in ("--set", f"{k}={v}")]
    finally:
        proc.stdin.close()
        proc.wait()


def _cleaner_at_open(monkeypatch, target: Path) -> list[str]:
    """Delete ``target`` the first time a reader opens it after the run's cut listed it (as if the cleaner
    had just run)."""
    deleted: list[str] = []
    armed: list[bool] = []
    take_cut = Store.take_cut

    def cut_then_arm(self, *a, **kw):
        c = take_cut(self, *a, **kw)
        armed.append(True)
        return c

    def before(path: str) -> None:
        if (armed and not deleted and os.path.realpath(path) == os.path.realpath(target)
                and os.path.exists(path)):
            os.unlink(path)
            deleted.append(path)

    local, arrow = bytesource.LocalSource.__init__, bytesource.ArrowFileSource.__init__

    def local_init(self, path, *a, **kw):
        before(path)
        local(self, path, *a, **kw)

    def arrow_init(self, fs, path, *a, **kw):
        before(path)
        arrow(self, fs, path, *a, **kw)

    monkeypatch.setattr(Store, "take_cut", cut_then_arm)
    monkeypatch.setattr(bytesource.LocalSource, "__init__", local_init)
    monkeypatch.setattr(bytesource.ArrowFileSource, "__init__", arrow_init)
    return deleted


def _oldest(root: Path, folder: str = "commitlog") -> Path:
    return sorted((root / folder).iterdir())[0]


def _said_once(err: str) -> None:
    lines = [x for x in err.splitlines() if "expired during the run" in x]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "No such file" not in err, err


def test_info_goes_on_when_the_cleaner_deletes_a_segment_under_it(live, monkeypatch, capsys):
    root, sets = live
    seg = _oldest(root)
    deleted = _cleaner_at_open(monkeypatch, seg)
    assert main(["info", str(root), "--json", *sets]) == 0
    out, err = capsys.readouterr()
    assert deleted
    _said_once(err)
    info = json.loads(out)
    assert seg.name not in [s["name"] for s in info["segments"]] and info["messages"] > 0


def test_info_goes_on_when_the_cleaner_deletes_an_index_file_under_it(live, monkeypatch, capsys):
    root, sets = live
    idx = _oldest(root, "index")
    deleted = _cleaner_at_open(monkeypatch, idx)
    assert main(["info", str(root), "--json", *sets]) == 0
    out, err = capsys.readouterr()
    assert deleted and "Traceback" not in err
    info = json.loads(out)
    said = [f for f in info["findings"] if f["kind"] == "expired_during_run"]
    assert len(said) == 1 and said[0]["severity"] == "info" and said[0]["extra"]["files"] == [idx.name], said
    assert [i["name"] for i in info["index_files"]] == sorted(p.name for p in (root / "index").iterdir())


def test_messages_skips_a_segment_the_cleaner_deletes_under_its_scan(live, monkeypatch, capsys):
    root, sets = live
    segs = sorted((root / "commitlog").iterdir())
    assert main(["messages", str(root), *sets]) == 0
    every = [json.loads(x)["phy_offset"] for x in capsys.readouterr().out.splitlines()]
    deleted = _cleaner_at_open(monkeypatch, segs[0])
    assert main(["messages", str(root), *sets]) == 0
    out, err = capsys.readouterr()
    assert deleted
    _said_once(err)
    got = [json.loads(x)["phy_offset"] for x in out.splitlines()]
    assert got == [p for p in every if p >= int(segs[1].name)]  # the rest, each once, in order


def test_get_of_a_message_whose_segment_the_cleaner_deletes_under_it_says_it_expired(live, monkeypatch, capsys):
    root, sets = live
    segs = sorted((root / "commitlog").iterdir())
    assert main(["messages", str(root), "--limit", "2", *sets]) == 0
    phy = json.loads(capsys.readouterr().out.splitlines()[1])["phy_offset"]
    deleted = _cleaner_at_open(monkeypatch, segs[0])
    code = main(["get", str(root), "--offset", str(phy), *sets])
    out, err = capsys.readouterr()
    assert deleted
    _said_once(err)
    assert code == 1 and out == "" and "no message found" in err, err  # (not exit 2: the message expired)


def test_get_by_queue_position_goes_on_when_the_cleaner_deletes_a_consume_queue_file(live, monkeypatch, capsys):
    root, sets = live
    qdir = root / "consumequeue" / "LiveTopic1" / "1"
    files = sorted(qdir.iterdir())
    assert len(files) > 1
    last_first = int(files[-1].name) // 20  # a position in the queue's last file
    deleted = _cleaner_at_open(monkeypatch, files[0])
    code = main(["get", str(root), "--queue", f"LiveTopic1:1:{last_first}", *sets])
    out, err = capsys.readouterr()
    assert code == 0 and deleted, err
    _said_once(err)
    assert json.loads(out.splitlines()[0])["queue_offset"] == last_first


def test_expiry_goes_on_when_the_cleaner_deletes_a_segment_under_it(live, monkeypatch, capsys):
    root, sets = live
    seg = _oldest(root)
    deleted = _cleaner_at_open(monkeypatch, seg)
    code = main(["expiry", str(root), "--json", *sets])
    out, err = capsys.readouterr()
    assert code in (0, 1) and deleted, err
    _said_once(err)
    assert json.loads(out)


def test_timers_goes_on_when_the_cleaner_deletes_a_segment_under_it(live, monkeypatch, capsys):
    root, sets = live
    seg = _oldest(root)
    deleted = _cleaner_at_open(monkeypatch, seg)
    code = main(["timers", str(root), "--json", *sets])
    out, err = capsys.readouterr()
    assert code == 0 and deleted, err
    _said_once(err)
    assert "pending" in json.loads(out)


def test_recover_plan_goes_on_when_the_cleaner_deletes_a_segment_under_it(live, monkeypatch, capsys):
    root, sets = live
    seg = _oldest(root)
    deleted = _cleaner_at_open(monkeypatch, seg)
    code = main(["recover", str(root), "--plan", "--json", *sets])
    out, err = capsys.readouterr()
    assert code in (0, 1) and deleted, err
    _said_once(err)
    assert json.loads(out)
