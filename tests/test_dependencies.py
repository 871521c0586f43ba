"""What an install needs: reading a store needs no codec; LZ4 and ZSTD serve the generator only.

RocketMQ stores a compressed body as the producer sent it (sysFlag COMPRESSED_FLAG and the codec's
bits), with BODYCRC over those stored bytes, and the broker never decompresses it (CommitLog.
checkMessageAndReturnSize reads ``bodyLen`` bytes and CRCs them). So no reading path of ours does:
the scan, the data sources and the commands return the stored bytes. The 5.3.3 sample holds LZ4, ZSTD
and ZLIB bodies; it is read here in a process where lz4 and zstandard cannot be imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CODECS = ("lz4", "zstandard")

# a process where the codecs cannot be imported (and importlib.util.find_spec finds none)
_BLOCK = "import sys\nfor m in ('lz4', 'lz4.frame', 'zstandard'):\n    sys.modules[m] = None\n"


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", _BLOCK + code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_codecs_are_the_generators_extra_not_core_dependencies():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = " ".join(meta["dependencies"])
    assert not any(c in core for c in (*CODECS, "crcmod"))
    extras = meta["optional-dependencies"]
    assert all(any(d.startswith(c) for d in extras["gen"]) for c in CODECS)
    assert all(any(d.startswith(c) for d in extras["test"]) for c in (*CODECS, "crcmod"))


def test_the_sample_with_compressed_bodies_is_read_without_any_codec(sample_533):
    code = f"""
import hashlib, json
from storelib.broker.settings.store import Store
from storelib.scan.commitlog import CommitLog
root = {str(sample_533)!r}
want = {{}}
for line in open(root + "/expected/messages.jsonl"):
    e = json.loads(line)
    if e["type"] == "msg":
        want[e["phyOffset"]] = (e["sysFlag"], e["bodySha256"])
t = CommitLog(root + "/store/commitlog").read_table(with_body=True)
got = {{p: (f, hashlib.sha256(b).hexdigest()) for p, f, b in zip(t.column("phy_offset").to_pylist(),
       t.column("sys_flag").to_pylist(), t.column("body").to_pylist())}}
assert got == want
compressed = sum(1 for f, _ in want.values() if f & 1)
print("compressed", compressed)
Store(root + "/store").commitlog.read(0)
assert not any(m in sys.modules and sys.modules[m] is not None for m in ('lz4', 'zstandard'))
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) > 0  # the sample does hold compressed bodies


def test_generating_compressed_bodies_without_the_extra_says_which_extra(tmp_path):
    code = f"""
from storelib.generator.gen import generate
from storelib.generator.genplan import GenConfig
try:
    generate({str(tmp_path / "s")!r}, GenConfig(messages=400, compressed_ratio=0.5, seed=1))
except ImportError as e:
    print("MSG", e)
"""
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert "rmqstore[gen]" in r.stdout
    r = _run(f"""
from jobs.cli import main
print("RC", main(["gen", {str(tmp_path / "c")!r}, "--messages", "200"]))
print("RC0", main(["gen", {str(tmp_path / "d")!r}, "--messages", "200", "--compressed-ratio", "0", "--json"]))
""")
    assert "RC 2" in r.stdout and "pip install 'rmqstore[gen]'" in r.stderr and "Traceback" not in r.stderr
    assert "RC0 0" in r.stdout, r.stderr
