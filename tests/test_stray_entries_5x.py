"""5.3.3's loads beyond commitlog/ and consumequeue/: the timer store (TimerMessageStore.load's timerlog/
MappedFileQueue, the TimerWheel and TimerCheckpoint constructors) and batchconsumequeue/ (ConsumeQueueStore.load
:68-72). ``recover --plan`` says the broker does not start, the audit and info name the entry."""

from __future__ import annotations

import json

import pytest

from jobs.audit import audit_store
from storelib.broker.settings.brokerconf import load_broker_conf
from storelib.broker.settings.store import Store
from storelib.broker.settings.storeinfo import collect
from storelib.broker.settings.strayload import LOAD_FAILS
from storelib.broker.startup import recoverapply as ra
from storelib.broker.startup.recoveryplan import plan_document
from storelib.broker.startup.startup import simulate
from storelib.errors import StoreError
from tests.conftest import SAMPLES, extract_sample, run_cli

CONF = str(SAMPLES / "rocketmq-5.3.3-timer-small.broker.conf")


@pytest.fixture
def timer_root(tmp_path):
    return extract_sample("timer", tmp_path) / "store"


def _plan(root) -> dict:
    return plan_document(simulate(Store(str(root), load_broker_conf(CONF, "5"))), lost=False)


def _failed(plan: dict) -> dict[str, str]:
    return {f["file"]: f["kind"] for f in plan.get("load_failures", [])}


def _hits(findings: list[dict], rel: str) -> list[tuple[str, str]]:
    return [(f["kind"], f["severity"]) for f in findings if f["file"] == rel]


def test_timer_sample_loads(timer_root):
    plan = _plan(timer_root)
    assert plan.get("load_failures") == [] and plan["supported"] is True


def test_timerlog_stray_entries_are_judged_as_its_mapped_file_queue_loads_them(timer_root, capsys):
    """TimerLog's MappedFileQueue.doLoad (5.3.3 :246-281): a directory skipped, a wrong-length file fails."""
    (timer_root / "timerlog" / "backup").mkdir()
    (timer_root / "timerlog" / "00000000000000000000.bak").write_bytes(b"x" * 100)
    plan = _plan(timer_root)
    assert _failed(plan) == {"timerlog/00000000000000000000.bak": LOAD_FAILS} and plan["supported"] is False
    assert _hits(plan["findings"], "timerlog/backup") == [("stray_entry_skipped", "info")]
    rc, out, _ = run_cli(capsys, "recover", str(timer_root), "--broker-conf", CONF, "--broker-version", "5", "--plan")
    assert rc == 1 and "THE BROKER DOES NOT START: timerlog/00000000000000000000.bak" in out
    rep = audit_store(str(timer_root), broker_conf=CONF, version="5", quiet=True)
    assert _hits(rep["findings"], "timerlog/00000000000000000000.bak") == [(LOAD_FAILS, "critical")]
    assert rep["damage"]["next"][0]["command"] == f"mv {timer_root}/timerlog/00000000000000000000.bak MOVED_DIR/"
    with pytest.raises(StoreError, match="use --force"):
        ra.apply(Store(str(timer_root), load_broker_conf(CONF, "5")), str(timer_root.parent / "bk"))
    info = collect(Store(str(timer_root), load_broker_conf(CONF, "5")), scan=False)
    assert _hits(info["findings"], "timerlog/00000000000000000000.bak") == [(LOAD_FAILS, "critical")]
    assert info["timer_store"]["timerlog_files"] == 3  # the reader reads around them as before


def test_timerlog_segment_of_the_wrong_length_fails_and_a_zero_length_last_is_deleted(timer_root):
    first = timer_root / "timerlog" / "00000000000000000000"
    first.write_bytes(first.read_bytes()[:4096])
    (timer_root / "timerlog" / "00000000000000024576").write_bytes(b"")
    plan = _plan(timer_root)
    assert _failed(plan) == {"timerlog/00000000000000000000": LOAD_FAILS}
    rep = audit_store(str(timer_root), broker_conf=CONF, version="5", quiet=True)
    assert _hits(rep["findings"], "timerlog/00000000000000000000") == [(LOAD_FAILS, "critical")]
    assert _hits(rep["findings"], "timerlog/00000000000000024576") == [("empty_last_segment", "warning")]


@pytest.mark.parametrize("length,kind", [(1000, LOAD_FAILS), (0, "timerwheel_grown")])
def test_timerwheel_of_a_wrong_length_fails_the_load_and_an_empty_one_is_grown(timer_root, length, kind):
    """TimerWheel :62-66 throws on a length neither 0 nor the wheel's; :67 sets a zero-length one's."""
    with open(timer_root / "timerwheel", "r+b") as f:
        f.truncate(length)
    plan = _plan(timer_root)
    assert _failed(plan) == ({"timerwheel": LOAD_FAILS} if kind == LOAD_FAILS else {})
    rep = audit_store(str(timer_root), broker_conf=CONF, version="5", quiet=True)
    sev = "critical" if kind == LOAD_FAILS else "info"
    assert _hits(rep["findings"], "timerwheel") == [(kind, sev)]
    if kind == LOAD_FAILS:  # the broker's own file: not moved out (an empty wheel would lose the timers)
        steps = [s["command"] for s in rep["damage"]["next"]]
        assert not any(c.startswith("mv ") for c in steps) and any(c.startswith("rmqstore recover") for c in steps)


def test_timercheck_directory_fails_the_load(timer_root):
    """TimerCheckpoint :56: RandomAccessFile on a directory throws; initializeMessageStore fails (:853-856)."""
    (timer_root / "config" / "timercheck").unlink()
    (timer_root / "config" / "timercheck").mkdir()
    assert _failed(_plan(timer_root)) == {"config/timercheck": LOAD_FAILS}


def _configure_batch_topic(root, topic: str) -> None:
    """``topic`` with queue.type BatchCQ in config/topics.json, as 5.3.3 keeps a batch topic."""
    p = root / "config" / "topics.json"
    d = json.loads(p.read_text()) if p.exists() else {"topicConfigTable": {}}
    d["topicConfigTable"][topic] = {"topicName": topic, "attributes": {"queue.type": "BatchCQ"}}
    p.write_text(json.dumps(d))


def test_batch_consume_queue_directory_is_loaded_with_do_load_rules(timer_root):
    """ConsumeQueueStore.load loads batchconsumequeue/<topic>/<int queueId> with MappedFileQueue.doLoad."""
    q = timer_root / "batchconsumequeue" / "B" / "0"
    q.mkdir(parents=True)
    (q / ".old").mkdir()  # sorts first: the zero-length file stays the last of all entries
    (q / "00000000000000000000").write_bytes(b"\0" * 460)
    (q / "00000000000000000460").write_bytes(b"")  # zero-length and last of all: deleted
    (timer_root / "batchconsumequeue" / "B" / "x").mkdir()  # Integer.parseInt fails: not a queue
    (timer_root / "batchconsumequeue" / "B" / "x" / "junk").write_bytes(b"1")
    _configure_batch_topic(timer_root, "B")  # else queueTypeShouldBe fails the load on B's queue as well
    plan = _plan(timer_root)
    assert _failed(plan) == {"batchconsumequeue/B/0/00000000000000000000": LOAD_FAILS}
    assert _hits(plan["findings"], "batchconsumequeue/B/0/.old") == [("stray_entry_skipped", "info")]
    assert _hits(plan["findings"], "batchconsumequeue/B/0/00000000000000000460") == [("empty_last_segment", "warning")]
    rep = audit_store(str(timer_root), broker_conf=CONF, version="5", quiet=True)
    assert _hits(rep["findings"], "batchconsumequeue/B/0/00000000000000000000") == [(LOAD_FAILS, "critical")]
