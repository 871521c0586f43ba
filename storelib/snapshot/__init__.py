"""Columnar snapshots (``rmqstore export``): a store as Hive-partitioned Parquet for repeated SQL. The
snapshot directory and its atomic commit (``directory``), the per-segment export task (``exporttask``) and
what an incremental run exports again (``incremental``); the data sources read it
(:mod:`datasources.snapshot`), the job schedules the tasks (jobs/export.py)."""
