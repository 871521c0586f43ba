"""Where tasks run: one interface, three schedulers, the same task functions and the same results.

* ``local``: in this process, one task after the other (tests, tiny stores, debugging);
* ``pool``: a process pool over this machine's cores (the default for a store of more than one
  segment when no Spark master is given: a 2-core laptop gets both cores without a JVM);
* ``spark``: a Spark session (``--master``, or the one spark-submit made).

A task is a module-level function and one picklable item; ``map`` returns the results in the items'
order. Workers exchange bulky intermediates through files (the callers' staging and sink
directories), never through the scheduler, so every engine moves the same few bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from functools import partial
from typing import Any, Protocol

from jobs.engines.nopandas import hide_pandas
from storelib.fileio.bytesource import remote_filesystem_opened
from storelib.scan.splits import FINE_SHARE, MIN_PARALLEL_SPLIT_BYTES, parallel_split_bytes

ENGINES = ("auto", "local", "pool", "spark")
# below this much commitlog a process pool's start-up costs more than it saves (measured on 2 cores: audit
# of 320 MB 2.1 s on the pool vs 1.7 s in-process; of 2 GB 3.4 s vs 4.9 s; rebuild of 2 GB 3.5 s vs 5.9 s)
POOL_MIN_BYTES = 512 << 20
# what a pool worker imports once, before it is forked for each worker
POOL_PRELOAD = ["numpy", "pyarrow", "storelib.scan.scanner", "storelib.broker.dispatch.dispatch", "storelib.checks.segment", "storelib.broker.dispatch.rebuildtasks"]

Say = Callable[[str], None]


class Engine(Protocol):
    name: str
    parallelism: int

    def map(self, fn: Callable[[Any], Any], items: list[Any], label: str = "tasks", say: Say | None = None) -> list:
        ...

    def describe(self) -> str:
        ...

    def release(self) -> None:
        ...

    def close(self) -> None:
        ...


def default_split_bytes(eng: Engine, audited: int) -> int:
    """Unit size of a parallel scan of ``audited`` bytes (the audit's segment tasks, the rebuild's phase A).
    A pool task starts in milliseconds, so a pool takes the smallest
    unit (128 MiB) whatever the store: a unit's tables, and so its worker's memory, grow with the unit
    (an 8 GB store in 512 MiB units took 380-400 MB a worker, in 128 MiB units 185 MB, as a 2 GB store
    does), and many units end the run together (whole 256 MiB segments plus an index file's check left
    one worker finishing alone). Spark keeps two units per core, at most 512 MiB: its Python tasks cost
    more to start."""
    if eng.name == "pool":
        return MIN_PARALLEL_SPLIT_BYTES
    return parallel_split_bytes(audited, eng.parallelism)


def fine_tail(eng: Engine, unit: int) -> int:
    """Bytes at the end of a parallel scan cut in short units (:func:`storelib.scan.splits.segment_cuts`):
    two per worker, so the workers end within a short unit of one another (on 2 cores a whole 128 MiB
    unit is ~0.45 s, half of which one worker idled on average)."""
    return 0 if eng.parallelism < 2 else 2 * eng.parallelism * (unit // FINE_SHARE)


class LocalEngine:
    """In this process, in order."""

    name = "local"
    parallelism = 1

    def map(self, fn, items, label="tasks", say=None):
        out = []
        for i, it in enumerate(items):
            out.append(fn(it))
            if say is not None:
                say(f"{label}: {i + 1}/{len(items)} done")
        return out

    def describe(self) -> str:
        return "local (1 process)"

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class PoolEngine:
    """A process pool (forkserver workers with the heavy imports done once)."""

    name = "pool"

    def __init__(self, workers: int | None = None):
        self.parallelism = max(1, workers or os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None
        self._exiting: threading.Thread | None = None  # waits for released workers to exit
        self.start_method: str | None = None  # how the workers were started (fork, forkserver, spawn)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            method = self.start_method = _start_method()
            ctx = multiprocessing.get_context(method)
            if method == "forkserver":
                ctx.set_forkserver_preload(POOL_PRELOAD)
            self._pool = ProcessPoolExecutor(self.parallelism, mp_context=ctx, initializer=_one_core_worker)
        return self._pool

    def start(self) -> None:
        """Start the workers now (forked while this process has no other thread yet: a caller that starts
        threads of its own after this still gets forked workers)."""
        with _no_unloadable_main():
            self._executor().submit(int).result()

    def map(self, fn, items, label="tasks", say=None):
        if not items:
            return []
        pool = self._executor()
        with _no_unloadable_main():  # the workers start on the first submit
            futures: list[Future] = [pool.submit(fn, it) for it in items]
        pending = set(futures)
        last = time.monotonic()
        while pending:
            done, pending = wait(pending, timeout=2.0, return_when=FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                for f in pending:
                    f.cancel()
                raise failed.exception()
            if say is not None and (time.monotonic() - last >= 2.0 or not pending):
                last = time.monotonic()
                say(f"{label}: {len(futures) - len(pending)}/{len(futures)} done")
        return [f.result() for f in futures]

    def describe(self) -> str:
        how = f", {self.start_method}" if self.start_method else ""
        return f"pool ({self.parallelism} worker processes{how})"

    def release(self) -> None:
        """No more tasks: the workers are told to exit and do so while the caller goes on (a run's
        commit: their exit took 33-47 ms of the export's wall time on 2 cores); :meth:`close` waits."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            self._exiting = threading.Thread(target=pool.shutdown, kwargs={"wait": True, "cancel_futures": True},
                                             name="rmqstore-pool-exit")
            self._exiting.start()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._exiting is not None:
            self._exiting.join()
            self._exiting = None


def engine_master(eng: Engine) -> str:
    """The Spark master whose executors run an engine's tasks ("local" for the in-process engine and the
    pool: this host)."""
    return eng.sc.master if isinstance(eng, SparkEngine) else "local"


def _start_method() -> str:
    """``fork`` while nothing but this interpreter's own threads runs (:func:`fork_hazards`): the workers
    start in milliseconds with what the driver has imported (a forkserver and its preload take ~0.3 s on
    2 cores, paid by every run; all workers are forked at the first submit, before the pool's own thread
    starts). Otherwise one of the other threads could hold a lock at fork time that the child would
    never see released: then ``forkserver`` (its server is forked from a clean process), else ``spawn``.
    RMQSTORE_POOL_START overrides."""
    methods = multiprocessing.get_all_start_methods()
    forced = os.environ.get("RMQSTORE_POOL_START")
    if forced in methods:
        return forced
    if "fork" in methods and not fork_hazards():
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


# native threads a fork is known to survive: jemalloc's background purger (Arrow's allocator); OpenBLAS's
# and Arrow's pools carry the main thread's name and reset themselves in the child (pthread_atfork)
_FORK_SAFE_NATIVE = frozenset({"jemalloc_bg_thd"})


def fork_hazards() -> list[str]:
    """Why forking this process now would be unsafe (empty: it is safe): other Python threads (a
    notebook's Spark gateway, a caller's), a remote filesystem client opened here (the AWS SDK's event
    loop, a JVM under libhdfs: native threads ``threading`` cannot see), or, on Linux, any OS thread
    (/proc/self/task) whose name is neither the main thread's nor a known fork-safe one."""
    out = []
    if threading.active_count() > 1:
        out.append(f"{threading.active_count() - 1} other Python thread(s)")
    if remote_filesystem_opened():
        out.append("a remote filesystem client")
    out += [f"native thread {name!r}" for name in _foreign_native_threads()]
    return out


def _foreign_native_threads() -> list[str]:
    try:
        with open("/proc/self/comm") as f:
            own = f.read().strip()
        names = []
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
    except OSError:  # not Linux (or no /proc): Python threads and the remote-filesystem mark decide
        return []
    return sorted({n for n in names if n != own and n not in _FORK_SAFE_NATIVE})


def _one_core_worker() -> None:
    """A pool worker is one core's share: Arrow's own thread pool would make N workers x N threads fight
    over N cores (RMQSTORE_WORKER_ARROW_THREADS overrides, for measuring). And it runs without pandas
    (jobs.engines.nopandas: 0.17 s of every worker's first task on 2 cores) unless the driver holds it already
    (a forked worker shares it for free)."""
    import pyarrow as pa

    pa.set_cpu_count(int(os.environ.get("RMQSTORE_WORKER_ARROW_THREADS", "1")))
    hide_pandas()


@contextlib.contextmanager
def _no_unloadable_main():
    """A worker re-runs ``__main__`` from its file; from stdin (``python -``) there is none to run, and the
    worker would die: hide the name while workers start (a notebook has no ``__file__`` at all)."""
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None)
    hide = f is not None and not os.path.exists(f)
    if hide:
        del main.__file__
    try:
        yield
    finally:
        if hide:
            main.__file__ = f


class SparkEngine:
    """A Spark session: one Spark task per item."""

    name = "spark"

    def __init__(self, spark: Any):
        self.spark = spark
        self.sc = spark.sparkContext
        self.parallelism = max(1, self.sc.defaultParallelism)
        from jobs.spark.sparkutil import ship_code

        ship_code(self.sc)

    def map(self, fn, items, label="tasks", say=None):
        if not items:
            return []
        import contextlib

        progress = _spark_progress(self.sc, say, label, len(items)) if say else contextlib.nullcontext()
        with progress:
            return spark_errors(self.sc.parallelize(items, len(items)).map(fn).collect)

    def describe(self) -> str:
        return f"spark ({self.sc.master}, {self.parallelism} cores)"

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


def spark_errors(fn):
    """Run a Spark action; a failed job becomes one StoreError line (the executor's last exception line)."""
    from storelib.errors import StoreError

    try:
        return fn()
    except Exception as e:  # py4j / pyspark exceptions: keep the Python error text, drop the JVM trace
        name = type(e).__name__
        if name not in ("Py4JJavaError", "PythonException", "SparkException") and "pyspark" not in type(e).__module__:
            raise
        text = str(e)
        lines = [ln.strip() for ln in text.splitlines() if "Error" in ln or "StoreError" in ln]
        detail = lines[-1] if lines else text.splitlines()[0] if text else name
        raise StoreError(None, None, "spark_job_failed", detail[:500]) from e


def _spark_progress(sc, say: Say, label: str, total: int, every: float = 2.0):
    """Report completed tasks of the running stage while a Spark action runs."""
    import contextlib
    import threading

    @contextlib.contextmanager
    def cm():
        stop = threading.Event()

        def loop() -> None:
            st = sc.statusTracker()
            last = -1
            while not stop.wait(every):
                done = 0
                for sid in st.getActiveStageIds():
                    info = st.getStageInfo(sid)
                    if info is not None:
                        done = max(done, info.numCompletedTasks)
                if done != last:
                    say(f"{label}: {done}/{total} done")
                    last = done

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        try:
            yield
        finally:
            stop.set()
            th.join(5)

    return cm()


def resolve_engine_name(name: str | None, *, master: str | None = None, store_bytes: int = 0,
                        segments: int = 0, tasks: int = 0) -> str:
    """``auto`` (or None): spark when a master is given or spark-submit started us; else pool when the
    work is worth it (a store of more than one segment and at least :data:`POOL_MIN_BYTES`, or more than
    one of ``tasks`` that each cost a store's read, like the expiry grid's) and there is more than one
    core; else local."""
    if name not in (None, "auto"):
        return name
    if master or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return "spark"
    if (os.cpu_count() or 1) > 1 and ((segments > 1 and store_bytes >= POOL_MIN_BYTES) or tasks > 1):
        return "pool"
    return "local"


def make_engine(name: str, *, spark: Any = None, master: str | None = None, workers: int | None = None,
                app_name: str = "rmqstore") -> Engine:
    """The engine of a resolved name (``spark``: the given session, else one for ``master``)."""
    if name == "local":
        return LocalEngine()
    if name == "pool":
        eng = PoolEngine(workers)
        eng.start()
        return eng
    if name == "spark":
        if spark is None:
            from jobs.spark.sparkutil import get_spark

            spark = get_spark(master=master, app_name=app_name, batch_job=True)
        return SparkEngine(spark)
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {name!r}")


def walk_on(engine: Engine) -> Callable[[Any, list[int]], dict[int, Any]]:
    """A recovery-walk runner (storelib.broker.recovery.walk.WalkRunner) that scans the walk's segments as
    tasks on ``engine``: the same ends as the serial walk for the segments the walk uses."""
    from storelib.broker.recovery.walk import walk_task

    def run(plan: Any, delay_levels_ms: list[int]) -> dict[int, Any]:
        return dict(engine.map(partial(walk_task, plan, delay_levels_ms), plan.tasks, "recovery walk: segments"))

    return run


def map_on(engine: Engine, label: str) -> Callable[[Callable[[Any], Any], list[Any]], list[Any]]:
    """A (task function, items) -> results runner on ``engine`` for storelib's task maps (the lost ranges'
    scans: storelib.broker.startup.startuplost.TaskMap)."""

    def run(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        return engine.map(fn, items, label)

    return run


def add_engine_args(p: argparse.ArgumentParser, what: str,
                    pool_when: str = "a store of more than one segment and 512 MB") -> None:
    """``--engine``, ``--workers`` and ``--master``, the same on every job."""
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help=f"where the {what} tasks run: local (this process), pool (a process per core), spark; "
                        f"auto (default): spark with --master or under spark-submit, else pool for {pool_when}, "
                        "else local (same results on every engine)")
    p.add_argument("--workers", type=int, metavar="N", help="pool engine: worker processes (default: all cores)")
    p.add_argument("--master", metavar="URL", help="Spark master for the spark engine, e.g. local[4], spark://host:7077")


__all__ = ["ENGINES", "Engine", "LocalEngine", "PoolEngine", "SparkEngine", "add_engine_args", "make_engine",
           "map_on", "resolve_engine_name", "spark_errors", "walk_on"]
