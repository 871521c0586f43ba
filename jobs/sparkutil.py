"""One way to get a SparkSession configured from ``spark-conf/spark-defaults.conf``."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPARK_CONF = REPO / "spark-conf"


def check_java() -> None:
    """Fail with a clear message when no Java runtime is available (Spark needs one)."""
    if os.environ.get("JAVA_HOME") and Path(os.environ["JAVA_HOME"], "bin", "java").exists():
        return
    if shutil.which("java") is None:
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
    b = SparkSession.builder.appName(app_name)
    if master:
        b = b.master(master)
    for k, v in session_settings(conf, batch_job=batch_job).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


_SHIPPED: set[str] = set()


PYFILES_PREFIX = "rmqstore-pyfiles-"


def _sweep_pyfiles(tmpdir: str) -> None:
    """Remove the shipped-code directories of runs whose process is gone (killed before its exit hook)."""
    for name in os.listdir(tmpdir):
        if not name.startswith(PYFILES_PREFIX):
            continue
        pid = name[len(PYFILES_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(tmpdir, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _package_zip() -> str:
    """storelib + datasources + jobs as one zip for ``addPyFile`` (executors on other hosts import it)."""
    import tempfile
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
    """Ship our packages to the executors once per Spark application (a real cluster has no checkout)."""
    app = sc.applicationId
    if app not in _SHIPPED:
        sc.addPyFile(_package_zip())
        _SHIPPED.add(app)
