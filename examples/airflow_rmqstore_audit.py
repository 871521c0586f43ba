"""Airflow DAG: a nightly integrity audit of a RocketMQ store with rmqstore, two ways.

* ``audit_local``: the default engine on the Airflow worker that sees the store (BashOperator);
* ``audit_spark``: the Spark engine through ``spark-submit jobs/audit.py`` (SparkSubmitOperator, needs
  ``apache-airflow-providers-apache-spark`` and a ``spark_default`` connection).

Both are incremental (``--since``: only new or changed segments), hold a lock beside the state file (a
run that finds the previous one still going exits 3, which Airflow marks skipped), write Prometheus
metrics for the node_exporter textfile collector, and fail the task on findings at or above ``error``
(exit 1). Copy this file into your DAG folder and set the paths below. See docs/scheduling.md.
"""

from __future__ import annotations

import shlex
from datetime import datetime, timedelta

STORE = "/data/rocketmq/store"  # the broker's storePathRootDir (read only)
STATE_DIR = "/var/lib/rmqstore"  # state, lock, reports; on the worker's local disk
TEXTFILE_DIR = "/var/lib/node_exporter/textfile"  # node_exporter --collector.textfile.directory
RMQSTORE = "/opt/rmqstore/.venv/bin/rmqstore"
AUDIT_PY = "/opt/rmqstore/jobs/audit.py"
EXIT_LOCKED = 3


def audit_command(store: str = STORE, state_dir: str = STATE_DIR, textfile_dir: str = TEXTFILE_DIR,
                  rmqstore: str = RMQSTORE) -> list[str]:
    """The local-engine command line (argv) of one scheduled run."""
    return [rmqstore, "audit", store, "--since", f"{state_dir}/audit.state",
            "--metrics-file", f"{textfile_dir}/rmqstore_audit.prom", "--report-dir", f"{state_dir}/report",
            "--fail-on", "error", "--quiet"]


def spark_audit_args(store: str = STORE, state_dir: str = STATE_DIR, textfile_dir: str = TEXTFILE_DIR) -> list[str]:
    """``jobs/audit.py``'s arguments for spark-submit (the driver runs where the state dir is)."""
    return [store, "--engine", "spark", "--since", f"{state_dir}/audit-spark.state",
            "--metrics-file", f"{textfile_dir}/rmqstore_audit_spark.prom", "--report-dir", f"{state_dir}/report-spark",
            "--fail-on", "error", "--quiet"]


try:  # the command lines above are usable (and tested) without Airflow
    from airflow import DAG

    try:
        from airflow.providers.standard.operators.bash import BashOperator  # Airflow 3
    except ImportError:
        from airflow.operators.bash import BashOperator  # Airflow 2
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ImportError:
    DAG = None

if DAG is not None:
    with DAG(
        dag_id="rmqstore_audit",
        schedule="30 2 * * *",
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,  # the lock refuses overlaps anyway; this keeps Airflow from queueing them
        default_args={"retries": 0, "execution_timeout": timedelta(hours=6)},
        tags=["rocketmq", "audit"],
    ) as dag:
        BashOperator(task_id="audit_local", bash_command=shlex.join(audit_command()),
                     skip_on_exit_code=EXIT_LOCKED)
        SparkSubmitOperator(task_id="audit_spark", application=AUDIT_PY, application_args=spark_audit_args(),
                            conn_id="spark_default", name="rmqstore-audit",
                            conf={"spark.sql.session.timeZone": "UTC"})
