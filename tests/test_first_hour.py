"""What a new user trips over in the first hour: defaults that answer, one vocabulary, honest help."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from jobs.cli import COMMANDS, build_parser, main
from tests.conftest import broker_conf, run_cli


def test_expiry_answers_with_its_defaults_on_a_store_written_in_a_burst(capsys, sample_498):
    rc, out, err = run_cli(capsys, "expiry", sample_498 / "store")
    assert rc == 0, err
    assert re.search(r"^horizon .*shortened from 7 days", out, re.M)


def test_sizes_and_times_take_units_and_iso_everywhere(capsys, sample_498):
    rc, out, err = run_cli(capsys, "expiry", sample_498 / "store", "--disk-capacity", "2GB", "--disk-other-used",
                           "10MB", "--ingest", "5k", "--until", "2026-11-22T00:00:00Z", "--json")
    sim = json.loads(out)["simulation"]
    assert rc == 0, err
    assert sim["ingest_bytes_per_s"] == 5 * 2**10 and sim["until_ms"] == 1795305600000
    assert sim["horizon_source"] == "given (--until)"
    with pytest.raises(SystemExit):
        main(["expiry", str(sample_498 / "store"), "--disk-capacity", "lots"])


def test_data_source_sizes_use_the_same_parser(sample_498):
    from datasources.commitlog_reader import MessageReadOptions

    o = MessageReadOptions.parse({"path": str(sample_498 / "store"), "maxSplitBytes": "64MB",
                                  "fromTime": "2026-11-21T22:20:19Z"})
    assert o.max_split_bytes == 64 * 2**20 and o.from_time == 1795299619000


@pytest.fixture
def torn_store(tmp_path, sample_498):
    root = tmp_path / "store"
    shutil.copytree(sample_498 / "store", root)
    with open(root / "commitlog" / "00000000000001572864", "r+b") as f:
        f.seek(100_000)
        f.write(b"\xff" * 64)
    return root


def test_apply_and_restore_report_the_same_count_in_one_vocabulary(capsys, torn_store, tmp_path):
    conf = ["--broker-conf", broker_conf("4.9.8")]
    rc, out, _ = run_cli(capsys, "recover", torn_store, *conf, "--apply", "--backup", tmp_path / "b")
    applied = int(re.search(r"applied (\d+) file change\(s\)", out).group(1))
    rc2, out2, _ = run_cli(capsys, "recover", torn_store, "--restore", tmp_path / "b")
    undone = int(re.search(r"(\d+) file change\(s\) undone", out2).group(1))
    assert rc == rc2 == 0 and applied == undone > 0


def test_audit_agrees_with_recover_after_apply(capsys, torn_store, tmp_path):
    conf = ["--broker-conf", broker_conf("4.9.8")]
    run_cli(capsys, "recover", torn_store, *conf, "--apply", "--backup", tmp_path / "b")
    rc, out, _ = run_cli(capsys, "audit", torn_store, *conf, "--quiet", "--json")
    report = json.loads(out)
    past = [f for f in report["findings"] if f["kind"] == "index_entry_past_commitlog"]
    assert rc == 0 and past and all(f["severity"] == "warning" for f in past)
    assert "never truncates index files" in past[0]["detail"]


def test_version_and_help_without_markup(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["--version"])
    assert ei.value.code == 0 and re.fullmatch(r"rmqstore \S+\n", capsys.readouterr().out)
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in COMMANDS:
        text = sub.choices[name].format_help()
        assert "``" not in text and f"rmqstore {name}``" not in text, name


def test_a_command_imports_only_its_own_modules_and_still_lists_every_command():
    code = ("import json, sys; from jobs.cli import build_parser\n"
            "p = build_parser('info')\n"
            "sub = next(a for a in p._actions if a.dest == 'command')\n"
            f"print(sorted(sub.choices) == sorted({COMMANDS!r}))\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('jobs.') or m in ('pandas', 'pyarrow.dataset'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "True"
    loaded = json.loads(out[1])
    assert "jobs.commands.info" in loaded
    assert not [m for m in loaded if m.startswith("jobs.commands.") and m != "jobs.commands.info"]
    assert "jobs.export" not in loaded and "pandas" not in loaded and "pyarrow.dataset" not in loaded
    with pytest.raises(SystemExit) as ei:
        main(["--debug", "info", "--help"])
    assert ei.value.code == 0


def test_the_rmqstore_script_runs_without_pandas_with_the_same_results(capsys, sample_533, tmp_path):
    """The script (console_main) hides pandas, which no command uses; the pool's workers then run without
    it too. Same output as the library entry (main), which keeps pandas for its callers."""
    store = str(sample_533 / "store")
    code = ("import json, sys; from jobs.cli import console_main\n"
            "rc = console_main(sys.argv[1:])\n"
            "print(json.dumps({'rc': rc, 'pandas': 'pandas' in sys.modules}), file=sys.stderr)")
    for argv in (["info", store, "--json"], ["audit", store, "--engine", "pool", "--workers", "2", "--json", "--quiet"],
                 ["export", store, "--out", str(tmp_path / "snap"), "--json", "--quiet"]):
        got = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
        tail = json.loads(got.stderr.strip().splitlines()[-1])
        assert tail == {"rc": 0, "pandas": False}, got.stderr
        if argv[0] == "export":
            continue
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 0, err
        strip = ("generated_at_ms", "run", "created_ms")
        mine, lib = json.loads(got.stdout), json.loads(out)
        assert {k: v for k, v in mine.items() if k not in strip} == {k: v for k, v in lib.items() if k not in strip}


def test_every_gen_option_has_help_and_the_summary_has_headers(capsys, tmp_path):
    parser = build_parser()
    gen = next(a for a in parser._actions if a.dest == "command").choices["gen"]
    assert all(a.help for a in gen._actions if a.option_strings and a.dest != "help")
    rc, out, _ = run_cli(capsys, "gen", tmp_path / "g", "--messages", "50")
    assert rc == 0 and out.splitlines()[0].split() == ["generated", "value"]


def test_a_typo_in_broker_conf_is_a_warning_with_the_closest_key(capsys, tmp_path, sample_498):
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeComitLog=524288\nbrokerName=b1\n")
    rc, out, err = run_cli(capsys, "info", sample_498 / "store", "--broker-conf", conf, "--no-scan", "--json")
    kinds = [(f["kind"], f.get("extra", {}).get("suggestion")) for f in json.loads(out)["findings"]]
    assert rc == 0 and ("broker_conf_unknown_key", "mappedFileSizeCommitLog") in kinds
    assert "did you mean mappedFileSizeCommitLog?" in err and "brokerName" not in err


def test_a_json_file_given_as_broker_conf_is_called_out(capsys, tmp_path, sample_498):
    conf = tmp_path / "broker.json"
    conf.write_text('{"mappedFileSizeCommitLog": 524288}')
    rc, _, err = run_cli(capsys, "info", sample_498 / "store", "--broker-conf", conf, "--no-scan")
    assert rc == 0 and "looks like JSON, not a broker.conf" in err
