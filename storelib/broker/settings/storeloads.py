"""The broker's load of the store's other directories (commitlog/ and consume queues: :mod:`strayload`):
``index/`` on both lines, and on 5.3.3 the timer store and ``batchconsumequeue/``. The readers keep reading
around what they skip; these findings say what the broker does with it.

index/: IndexService.load (4.9.8 :57-88, 5.3.3 :58-89) sorts the listing and makes an IndexFile of EVERY
entry; IndexFile's constructor maps it through MappedFile.init (4.9.8 MappedFile.java:162-188, 5.3.3
DefaultMappedFile.java:157-183):

* Long.parseLong(name) comes first (:166 / :161): its NumberFormatException, caught by IndexService.load
  (4.9.8 :81-83, 5.3.3 :82-84), skips the entry (file or directory) and leaves it in place;
* then RandomAccessFile "rw" and map(READ_WRITE, 0, configured size) (:172-173 / :167-168): a directory
  throws FileNotFoundException, an IOException, on which IndexService.load returns false at once (4.9.8
  :78-80, 5.3.3 :79-81), no later entry loaded. 4.9.8's DefaultMessageStore.load drops that result (:210):
  the broker starts without them. 5.3.3's keeps it (:362): the load fails, the broker does not start;
* a file of any length is mapped at the configured size (a shorter one grows with zeros): an index file
  (a 17-digit name's wrong length: the reader's ``index_size_mismatch``).

5.3.3's timer store, when timerWheelEnable (MessageStoreConfig :84, default true): BrokerController
.initializeMessageStore builds TimerCheckpoint and TimerMessageStore (:846-851) in a try whose catch fails
initialize (:853-856, :867-869), and BrokerStartup.createBrokerController exits on that (:248-251):

* TimerWheel (:51-80): a length neither 0 nor slots x 2 x 32 throws (:62-66); a directory fails
  RandomAccessFile (:61, :73-75); a zero-length file is set to the full length (:67);
* TimerCheckpoint (:51-58): a directory fails RandomAccessFile; any length is mapped at 4096 bytes;
* timerlog/: TimerLog's MappedFileQueue at mappedFileSizeTimerLog (TimerLog :47-54), loaded by
  TimerMessageStore.load (:237-244), whose result recoverAndInitService keeps (:889-891): doLoad's rules; a
  NumberFormatException escapes every caller to BrokerStartup's catch (:255-257), which exits.

batchconsumequeue/ (5.3.3): ConsumeQueueStore.load (:68-72) loads it as consumequeue/ (loadConsumeQueues
:204-237: each <topic>/<Integer.parseInt queueId> directory) with BatchConsumeQueue's MappedFileQueue (:105-111)
at mapperFileSizeBatchConsumeQueue (createConsumeQueueByType :247-253): doLoad's rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from storelib.broker.settings.batchcq import DEFAULT_BCQ_FILE_SIZE
from storelib.broker.settings.strayload import (
    LOAD_FAILS,
    OWN_FILE,
    dir_listing,
    java_long,
    mapped_dir_findings,
    version_of,
)
from storelib.errors import Finding
from storelib.fileio.bytesource import Location
from storelib.format.consumequeue import parse_queue_dir
from storelib.format.timerstore import SLOT_SIZE, SLOTS_TOTAL, timerlog_file_size

INDEX_STRAY = "foreign_index_file"  # the index reader's note on an entry it skips
TIMER_READER_SIZES = ("timerlog_file_size", "timerwheel_size")  # the timer reader's notes these findings restate
_LOAD = "IndexService.load (4.9.8 :57-88, 5.3.3 :58-89)"


def _index_entry(name: str, is_dir: bool, stop: str | None, later: list[str], version: str
                 ) -> tuple[str, str, str]:
    """(kind, severity, why) for one entry of index/ the readers skip, as IndexService.load meets it."""
    if stop is not None and name > stop:
        return "stray_entry_skipped", "info", f"{_LOAD} returned at index/{stop} before reaching it: not loaded"
    if java_long(name) is None:
        return ("stray_entry_skipped", "info", f"Long.parseLong fails on the name in MappedFile.init (4.9.8 :166, "
                f"5.3.3 DefaultMappedFile :161) before it is opened; {_LOAD} catches the NumberFormatException: "
                "the broker skips it and leaves it in place")
    if not is_dir:
        return ("stray_index_loaded", "warning", f"Long.parseLong takes the name: {_LOAD} maps it as an index file "
                "at the configured size (a shorter file grows with zeros) and queries keys through it; after an "
                "abnormal exit it is deleted if its header's endTimestamp is past the checkpoint's index time; "
                "this toolkit does not read it")
    why = (f"a directory with a numeric name: MappedFile.init's RandomAccessFile throws FileNotFoundException "
           f"(4.9.8 :172, 5.3.3 :167), an IOException on which {_LOAD} returns false")
    if version == "5":
        return LOAD_FAILS, "critical", why + ": DefaultMessageStore.load keeps it (5.3.3 :362), the load fails " \
            "and the broker does not start"
    return ("index_load_stops", "error" if later else "warning",
            why + f" and loads no later entry; 4.9.8's DefaultMessageStore.load ignores that (:210): the broker "
            f"starts without the {len(later)} index file(s) sorting after it"
            + (f" ({later[0]} ..): their keys are not found by queries" if later else ""))


def judge_index(findings: list[Finding], index_names: Iterable[str], version: str) -> None:
    """The index reader's notes on the entries it skips replaced (in place) by what IndexService.load does with
    them; ``index_names``: the index files the reader lists."""
    strays = sorted((f for f in findings if f.kind == INDEX_STRAY), key=lambda f: str(f.file))
    if not strays:
        return
    names = sorted(index_names)
    stops = [str(f.file)[len("index/"):] for f in strays
             if f.extra.get("directory") and java_long(str(f.file)[len("index/"):]) is not None]
    stop = stops[0] if stops else None
    judged = []
    for f in strays:
        name = str(f.file)[len("index/"):]
        later = [n for n in names if n > name] if name == stop else []
        kind, sev, why = _index_entry(name, bool(f.extra.get("directory")), stop, later, version)
        judged.append(Finding(kind, sev, f.file, None, why, {"supported": False} if sev == "critical" else {}))
    findings[:] = [f for f in findings if f.kind != INDEX_STRAY] + judged


def index_loaded(refs: list[Any], findings: list[Finding]) -> list[Any]:
    """The index files 4.9.8's IndexService.load reaches (those sorting before an ``index_load_stops`` entry:
    it returned there, :78-80, so the broker neither loads nor deletes the later ones)."""
    stop = next((str(f.file)[len("index/"):] for f in findings if f.kind == "index_load_stops"), None)
    return refs if stop is None else [r for r in refs if r.name < stop]


def broker_index_refs(refs: list[Any], findings: list[Finding], version: str) -> list[Any]:
    """The index files IndexService.load keeps (:func:`index_loaded`), the reader's notes on the entries it skips
    judged as the load meets them (:func:`judge_index`): what the plan, ``expire`` and the key lookups take
    (IndexService.deleteExpiredFile and queryOffset walk the loaded list only: 4.9.8 :90-141, :157-199)."""
    judge_index(findings, [r.name for r in refs], version)
    return index_loaded(refs, findings)


def timer_judged(settings: Any) -> bool:
    """Whether the broker loads a timer store: 5.x with timerWheelEnable."""
    return version_of(settings.version) == "5" and bool(getattr(settings, "timer_wheel_enable", True))


def _single_file(root: Location, rel: str, what: str, want: int | None) -> list[Finding]:
    """TimerWheel's or TimerCheckpoint's constructor on ``rel`` (``want``: the only length besides 0 it takes;
    None: any)."""
    info = root.fs.get_file_info(root.join(rel).path)
    kind = info.type.name
    if kind == "Directory":
        return [Finding(LOAD_FAILS, "critical", rel, None, f"a directory: {what}'s RandomAccessFile throws "
                        "FileNotFoundException; BrokerController.initializeMessageStore fails (5.3.3 :853-856) and "
                        "the broker does not start", {"supported": False})]
    size = int(info.size or 0)
    if kind != "File" or want is None or size == want:
        return []
    if size == 0:
        return [Finding("timerwheel_grown", "info", rel, None, f"zero-length: {what} sets it to {want} bytes "
                        "(TimerWheel :67), an empty wheel")]
    return [Finding(LOAD_FAILS, "critical", rel, None, f"{size} bytes, neither 0 nor {want}: {what} throws "
                    "\"Timer wheel length\" (TimerWheel :62-66); BrokerController.initializeMessageStore fails "
                    "(5.3.3 :853-856) and the broker does not start", dict(OWN_FILE))]


def timer_load_findings(root: Location, settings: Any) -> list[Finding]:
    """What 5.3.3's timer store load says of timerlog/, timerwheel and config/timercheck (none without it)."""
    if not timer_judged(settings):
        return []
    out = _single_file(root, "timerwheel", "TimerWheel", SLOTS_TOTAL * 2 * SLOT_SIZE)
    out += _single_file(root, "config/timercheck", "TimerCheckpoint", None)
    listed = dir_listing(root.join("timerlog"))
    seg = [z for n, z, d in listed if not d and len(str(n)) == 20 and str(n).isdigit()]
    size = timerlog_file_size(settings) if settings.mapped_file_size_timer_log or not seg else seg[0]
    for f in mapped_dir_findings(listed, size, "5", lambda n: f"timerlog/{n}"):
        f.detail = f.detail.replace("DefaultMessageStore.load fails", "escapes TimerMessageStore.load to "
                                    "BrokerStartup's catch (5.3.3 :255-257), which exits,")
        out.append(f)
    return out


def bcq_load_findings(root: Location, settings: Any) -> list[Finding]:
    """What 5.3.3's ConsumeQueueStore.load says of each batchconsumequeue/<topic>/<queueId> directory."""
    if version_of(settings.version) != "5" or getattr(settings, "store_type", "default") != "default":
        return []
    size = int(getattr(settings, "mapper_file_size_batch_consume_queue", None) or DEFAULT_BCQ_FILE_SIZE)
    out: list[Finding] = []
    for topic, _z, t_dir in dir_listing(root.join("batchconsumequeue")):
        if not t_dir:
            continue
        for qid, _z2, q_dir in dir_listing(root.join("batchconsumequeue", topic)):
            if q_dir and parse_queue_dir(qid) is not None:
                rel = f"batchconsumequeue/{topic}/{qid}"
                out += mapped_dir_findings(dir_listing(root.join("batchconsumequeue", topic, qid)), size, "5",
                                           lambda n, rel=rel: f"{rel}/{n}")
    return out


def store_load_findings(root: Location, settings: Any) -> list[Finding]:
    """The 5.x timer store's and BatchConsumeQueue directories' load findings (the audit, info and the plan)."""
    return timer_load_findings(root, settings) + bcq_load_findings(root, settings)


def timer_fails(findings: list[Finding]) -> bool:
    """Whether the timer store's load fails on one of its files (its recovery then never runs)."""
    return any(f.kind == LOAD_FAILS and (f.file in ("timerwheel", "config/timercheck")
                                         or str(f.file).startswith("timerlog/")) for f in findings)


def without_timer_reader_sizes(findings: list[Finding], settings: Any) -> list[Finding]:
    """The timer reader's findings less the size notes :func:`timer_load_findings` restates as the load judges."""
    if not timer_judged(settings):
        return findings
    return [f for f in findings if f.kind not in TIMER_READER_SIZES]


__all__ = ["bcq_load_findings", "broker_index_refs", "index_loaded", "judge_index", "store_load_findings", "timer_fails",
           "timer_judged", "timer_load_findings", "without_timer_reader_sizes"]
