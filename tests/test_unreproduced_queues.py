"""Consume queues a broker writes otherwise than our dispatch (ConsumeQueueExt: an ext address as the tags
code; multi-dispatch: LMQ copies in the queues a record lists) are never written without what the broker
adds: the rebuild refuses them on every engine and incrementally, before anything is written, and still
builds the index byte-identical; a recovery plan says so and its apply refuses; the audit says once what it
does not model, and checks light message queues' (%LMQ%) entries as the copies they are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from storelib.broker.dispatch.dispatch import dispatch_store
from storelib.broker.settings.brokerconf import BrokerSettings
from storelib.errors import StoreError
from tests.conftest import run_cli as cli

SETTINGS = ("enableMultiDispatch", "enableConsumeQueueExt")


def _index_files(root: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((root / "index").iterdir())]


@pytest.mark.parametrize("setting", SETTINGS)
def test_consume_queues_are_refused_on_every_engine_and_the_index_alone_is_built(setting, sample_498, tmp_path,
                                                                                 capsys):
    store = sample_498 / "store"
    plain = tmp_path / "plain"
    assert cli(capsys, "rebuild", store, "--out", plain, "--quiet")[0] == 0
    for how in (["--engine", "local"], ["--engine", "pool"], ["--incremental"]):
        out = tmp_path / f"out{'-'.join(how)}"
        rc, _, err = cli(capsys, "rebuild", store, "--out", out, "--set", f"{setting}=true", *how, "--quiet")
        assert rc == 2 and "unsupported" in err and f"{setting}=true" in err, (how, err)
        assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["plain"]  # nothing staged
    only = tmp_path / "index-only"
    rc, _, err = cli(capsys, "rebuild", store, "--out", only, "--set", f"{setting}=true", "--what", "index", "--quiet")
    assert rc == 0, err
    assert not (only / "consumequeue").exists() and _index_files(only) == _index_files(plain)


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_library_dispatch_refuses_the_same_consume_queues_and_builds_the_index(setting, sample_498, tmp_path):
    settings = BrokerSettings.defaults("4").with_overrides({setting: "true"})
    with pytest.raises(StoreError, match=f"{setting}=true") as e:
        dispatch_store(sample_498 / "store", settings, out_root=tmp_path / "cq")
    assert e.value.kind == "unsupported" and not (tmp_path / "cq").exists()
    res = dispatch_store(sample_498 / "store", settings, out_root=tmp_path / "ix", what=("index",))
    assert res.records > 0 and not (tmp_path / "ix" / "consumequeue").exists()
    assert len(_index_files(tmp_path / "ix")) >= 1


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_recovery_plan_says_its_queues_lack_the_copies_and_apply_refuses_unless_forced(sample_498, tmp_path,
                                                                                        capsys):
    store = tmp_path / "store"
    shutil.copytree(sample_498 / "store", store)
    shutil.rmtree(store / "consumequeue")  # the start then dispatches every record again
    multi = ("--set", "enableMultiDispatch=true")
    rc, out, _ = cli(capsys, "recover", store, *multi)
    assert rc == 1 and "[warning] consumequeue: cq_unreproduced: the start dispatches 2000 record(s)" in out
    assert "cq_unreproduced" not in cli(capsys, "recover", store)[1]
    before = _tree(store)
    rc, _, err = cli(capsys, "recover", store, *multi, "--apply", "--backup", tmp_path / "backup")
    assert rc == 2 and "enableMultiDispatch=true" in err and "--force" in err and _tree(store) == before


@pytest.mark.parametrize("engine", ["local", "pool"])
def test_the_audit_says_once_which_queue_entries_it_does_not_model(engine, sample_498, capsys):
    store = sample_498 / "store"
    for setting in SETTINGS:
        rc, out, _ = cli(capsys, "audit", store, "--set", f"{setting}=true", "--engine", engine, "--json", "--quiet")
        said = [f for f in json.loads(out)["findings"] if f["kind"] == "cq_unreproduced"]
        assert rc == 0 and len(said) == 1 and said[0]["severity"] == "warning" and f"{setting}=true" in said[0]["detail"]
    rc, out, _ = cli(capsys, "audit", store, "--engine", engine, "--json", "--quiet")
    assert rc == 0 and "cq_unreproduced" not in out


def test_light_message_queues_found_in_the_store_are_named_and_never_dropped_in_place(sample_498, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(sample_498 / "store", store)
    shutil.copytree(store / "consumequeue" / "OrderEvents" / "1", store / "consumequeue" / "%LMQ%orders" / "0")
    rc, out, _ = cli(capsys, "rebuild", store, "--out", tmp_path / "out")
    assert rc == 0 and "1 light message queue(s) ('%LMQ%orders')" in out
    before = _tree(store / "consumequeue")
    rc, _, err = cli(capsys, "rebuild", store, "--in-place", "--quiet")
    assert rc == 2 and "unsupported_layout" in err and "light message queue" in err
    assert _tree(store / "consumequeue") == before
    assert cli(capsys, "rebuild", store, "--in-place", "--what", "index", "--quiet")[0] == 0


def _unit(path: Path, i: int, *, size_delta: int = 0) -> None:
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[i * 20 + 8:i * 20 + 12], "big")
    data[i * 20 + 8:i * 20 + 12] = (size + size_delta).to_bytes(4, "big")
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("engine", ["local", "pool"])
def test_light_message_queue_entries_are_checked_as_copies_of_other_queues_records(engine, sample_498, tmp_path,
                                                                                   capsys):
    store = tmp_path / "store"
    shutil.copytree(sample_498 / "store", store)
    cq = store / "consumequeue"
    shutil.copytree(cq / "OrderEvents" / "1", cq / "%LMQ%orders" / "0")
    rc, out, _ = cli(capsys, "audit", store, "--engine", engine, "--json", "--quiet")
    findings = json.loads(out)["findings"]
    said = [f for f in findings if f["kind"] == "lmq_queues"]
    assert rc == 0 and len(said) == 1 and "1 light message queue(s) ('%LMQ%orders')" in said[0]["detail"]
    assert not [f for f in findings if f["severity"] in ("error", "critical")]
    # a copy is still held to its record: the size and tags code, at a record start
    _unit(cq / "%LMQ%orders" / "0" / "00000000000000000000", 3, size_delta=1)
    rc, out, _ = cli(capsys, "audit", store, "--engine", engine, "--json", "--quiet")
    bad = [f for f in json.loads(out)["findings"] if f["kind"] == "cq_entry_mismatch"]
    assert rc == 1 and len(bad) == 1 and bad[0]["extra"]["topic"] == "%LMQ%orders" and "size" in bad[0]["detail"]
    # only a light message queue's entries are copies: the same units under another name are wrong
    shutil.rmtree(cq / "%LMQ%orders")
    shutil.copytree(cq / "OrderEvents" / "1", cq / "Orders2" / "0")
    rc, out, _ = cli(capsys, "audit", store, "--engine", engine, "--json", "--quiet")
    assert rc == 1 and any(f["kind"] == "cq_entry_mismatch" and f["extra"]["topic"] == "Orders2"
                           for f in json.loads(out)["findings"])


def test_the_audits_next_steps_keep_its_settings_and_rebuild_only_what_can_be(sample_498, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(sample_498 / "store", store)
    _unit(store / "consumequeue" / "OrderEvents" / "1" / "00000000000000000000", 3, size_delta=1)  # derived damage

    def next_steps(*extra: str) -> list[str]:
        rc, out, _ = cli(capsys, "audit", store, *extra, "--json", "--quiet")
        assert rc == 1
        return [s["command"] for s in json.loads(out)["damage"]["next"] if s["command"].startswith("rmqstore rebuild")]

    assert next_steps() == [f"rmqstore rebuild {store} --out REBUILT_DIR"]
    assert next_steps("--set", "enableMultiDispatch=true") == [
        f"rmqstore rebuild {store} --set enableMultiDispatch=true --what index --out REBUILT_DIR"]
