"""One way to get a SparkSession configured from ``spark-conf/spark-defaults.conf``."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from jobs.spark.jvmcache import ArchivePlan, discard, finish_dump, java_binary, pid_alive, plan_archive

REPO = Path(__file__).resolve().parents[2]
SPARK_CONF = REPO / "spark-conf"


def is_local_master(master: str) -> bool:
    """Do the executors of this Spark master run on the driver's machine (and see its filesystem)?"""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def check_java() -> None:
    """Fail with a clear message when no Java runtime is available (Spark needs one)."""
    if java_binary() is None:
        raise SystemExit("rmqstore: Spark needs a Java runtime (17 or 21): install one (e.g. "
                         "'apt-get install openjdk-17-jre-headless') or set JAVA_HOME")


def read_defaults(path: Path = SPARK_CONF / "spark-defaults.conf") -> dict[str, str]:
    """spark-defaults.conf as a dict (whitespace-separated key/value, # comments)."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        k, _, v = line.partition(" ")
        out[k] = v.strip()
    return out


# JVM options of the batch jobs' own sessions (rebuild, audit), whose JVM only schedules tasks while
# the work runs in Python workers: the C1 compiler alone, without C2, spends a fraction of the JIT's
# CPU (audit of 2 GB on local[2]: JVM 0.23-0.37 -> 0.10-0.17 CPU-s a run, 1.15 -> 0.73 in a fresh
# session). Not for sessions that turn rows over in the JVM: the data source's count() took 1.5x as
# long with it, so the shared spark-defaults.conf leaves it out.
BATCH_JOB_JVM_OPTIONS = ["-XX:TieredStopAtLevel=1"]


def session_settings(conf: dict[str, str] | None = None, *, batch_job: bool = False) -> dict[str, str]:
    """spark-defaults.conf as a session started here applies it: the log4j config by absolute path
    (the file's relative one only works from the repo root), its other JVM options kept (plus
    :data:`BATCH_JOB_JVM_OPTIONS` for a ``batch_job``), ``conf`` last."""
    settings = read_defaults()
    log4j = SPARK_CONF / "log4j2.properties"
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        rest = re.sub(r"-Dlog4j2\.configurationFile=\S+", "", settings.get(key, "")).split()
        extra = [o for o in BATCH_JOB_JVM_OPTIONS if o not in rest] if batch_job else []
        settings[key] = " ".join([f"-Dlog4j2.configurationFile=file:{log4j}", *rest, *extra])
    # the driver's scratch files (block manager and shipped files under spark.local.dir's default,
    # native libraries such as lz4's) where this process keeps its own: TMPDIR is honoured as by every
    # other tool, not the JVM's fixed /tmp
    if "-Djava.io.tmpdir=" not in settings["spark.driver.extraJavaOptions"]:
        settings["spark.driver.extraJavaOptions"] += f" -Djava.io.tmpdir={tempfile.gettempdir()}"
    settings.update(conf or {})
    # keep the Python workers' imports working wherever the session starts
    settings.setdefault("spark.executorEnv.PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    if not os.environ.get("RMQSTORE_DEBUG"):  # executors on other hosts: errors as their one line (get_spark)
        settings.setdefault("spark.executorEnv.SPARK_HIDE_TRACEBACK", "1")
    return settings


def get_spark(master: str | None = None, app_name: str = "rmqstore", conf: dict[str, str] | None = None, *,
              batch_job: bool = False):
    """A SparkSession with the project's defaults (respects an already active session).

    ``batch_job``: the session of a rebuild or audit run (JVM options of :data:`BATCH_JOB_JVM_OPTIONS`).

    Under spark-submit the session is the one spark-submit configured (its --master, --properties-file
    and --conf win): re-applying spark-defaults.conf there would override the user's settings.
    """
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        from pyspark.sql import SparkSession

        b = SparkSession.builder.appName(app_name)
        if master:
            b = b.master(master)
        return b.getOrCreate()
    check_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # offline jobs: never bind a public interface
    if not os.environ.get("RMQSTORE_DEBUG"):
        # Python workers report an error as its one line (ours name file and offset), not a traceback that
        # buries it; RMQSTORE_DEBUG=1 brings the tracebacks back
        os.environ.setdefault("SPARK_HIDE_TRACEBACK", "1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    settings = session_settings(conf, batch_job=batch_job)
    if is_local_master(master or settings.get("spark.master") or "local"):
        # executors on this machine import our packages (spark.executorEnv.PYTHONPATH): their Python
        # daemon imports PySpark compiled once, not from Spark's zip at every start (jobs.spark.sparkdaemon)
        settings.setdefault("spark.python.daemon.module", "jobs.spark.sparkdaemon")
    cds = _start_jvm(master, app_name, settings)
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    # a session started here is stopped at exit: Spark then removes its scratch dirs (a JVM that only
    # sees its stdin close leaves blockmgr-*/spark-* behind)
    atexit.register(_stop_quietly, spark, cds)
    return spark


def _start_jvm(master: str | None, app_name: str, settings: dict[str, str]) -> ArchivePlan | None:
    """Launch the driver JVM, mapping the class-data archive (:mod:`jobs.spark.jvmcache`) unless the settings
    name one; a JVM that does not start with the archive is started again without it (dropped)."""
    java_opts = settings["spark.driver.extraJavaOptions"]
    from pyspark import SparkContext

    mine = not (os.environ.get("RMQSTORE_DEBUG") or SparkContext._gateway is not None
                or "SharedArchiveFile" in java_opts or "ArchiveClassesAtExit" in java_opts)
    cds = plan_archive() if mine else None
    if cds is None or not cds.options:
        _launch_quiet_gateway(master, app_name, settings)
        return None
    try:
        _launch_quiet_gateway(master, app_name, {**settings, "spark.driver.extraJavaOptions":
                                                 f"{java_opts} {' '.join(cds.options)}"})
        return cds
    except Exception:
        if cds.lock_fd is not None:
            os.close(cds.lock_fd)
        else:
            discard(cds)
        _launch_quiet_gateway(master, app_name, settings)
        return None


def _stop_quietly(spark, cds: ArchivePlan | None = None) -> None:
    """The exit hook of a session started here: stop it (the JVM removes its scratch dirs), without
    waiting for PySpark's accumulator server to notice (its serve loop polls: 0.9 s of every run's
    exit; the process is ending and the server's thread is a daemon), then finish a class-data dump."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None:
        sc._accumulatorServer = None  # type: ignore[union-attr]
    with contextlib.suppress(Exception):
        spark.stop()
    if server is not None:
        with contextlib.suppress(Exception):
            server.server_shutdown = True
            server.server_close()
    if cds is not None and cds.dump_to is not None:
        gateway = SparkContext._gateway
        finish_dump(cds, getattr(gateway, "proc", None))


# lines the JVM prints at every start that say nothing to a user: Spark 4's launcher adds
# --add-modules=jdk.incubator.vector unconditionally and the JVM warns about it on stderr
JVM_NOISE = ("WARNING: Using incubator modules:",)


def _forward_jvm_stderr(stream) -> None:
    """Copy the JVM's stderr to ours line by line, without the :data:`JVM_NOISE` lines."""
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    for line in iter(stream.readline, b""):
        if line.decode("utf-8", "replace").startswith(JVM_NOISE):
            continue
        if out is not None:
            out.write(line)
            out.flush()
        else:
            sys.stderr.write(line.decode("utf-8", "replace"))


def _launch_quiet_gateway(master: str | None, app_name: str, settings: dict[str, str]) -> None:
    """Start the Spark JVM with its stderr through :func:`_forward_jvm_stderr` (same command line as
    the builder would use: the same conf goes to spark-submit). ``RMQSTORE_DEBUG`` keeps it raw."""
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if os.environ.get("RMQSTORE_DEBUG") or SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setAppName(app_name)
    if master:
        conf.setMaster(master)
    for k, v in settings.items():
        conf.set(k, v)
    read_fd, write_fd = os.pipe()  # read from the start: a JVM that fails to start still says why
    threading.Thread(target=_forward_jvm_stderr, args=(os.fdopen(read_fd, "rb"),), name="spark-jvm-stderr",
                     daemon=True).start()
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_fd})
    finally:
        os.close(write_fd)
    SparkContext._ensure_initialized(gateway=gateway)


_SHIPPED: set[str] = set()


PYFILES_PREFIX = "rmqstore-pyfiles-"


def _sweep_pyfiles(tmpdir: str) -> None:
    """Remove the shipped-code directories of runs whose process is gone (killed before its exit hook)."""
    for name in os.listdir(tmpdir):
        if not name.startswith(PYFILES_PREFIX):
            continue
        pid = name[len(PYFILES_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(tmpdir, name), ignore_errors=True)


def _package_zip() -> str:
    """storelib + datasources + jobs as one zip for ``addPyFile`` (executors on other hosts import it)."""
    import zipfile

    _sweep_pyfiles(tempfile.gettempdir())
    tmp = tempfile.mkdtemp(prefix=f"{PYFILES_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, tmp, True)  # at exit, on failure too: Spark has read it by then
    path = os.path.join(tmp, "rmqstore_pkgs.zip")
    with zipfile.ZipFile(path, "w") as z:
        for pkg in ("storelib", "datasources", "jobs"):
            for dirpath, _, names in os.walk(REPO / pkg):
                for nm in names:
                    if nm.endswith(".py"):
                        full = os.path.join(dirpath, nm)
                        z.write(full, os.path.relpath(full, REPO))
    return path


def ship_code(sc) -> None:
    """Ship our packages to the executors once per Spark application (a real cluster has no checkout).
    Not to the executors of a local session that already import them from this checkout (the sessions
    :func:`get_spark` starts): from a zip, Python compiles them again in every worker."""
    app = sc.applicationId
    if is_local_master(sc.master) and str(REPO) in (
            sc.getConf().get("spark.executorEnv.PYTHONPATH") or "").split(os.pathsep):
        return
    if app not in _SHIPPED:
        sc.addPyFile(_package_zip())
        _SHIPPED.add(app)
