"""The audit's cross-file checks as partitioned tasks on any engine: a task per queue group (offsets,
consume-queue units, lag, the report's series), per index file (entries against the keys of its
commitlog range), the timer store on its own, and, for damaged index files only, lookups per file and
key coverage per commitlog segment. The driver plans them and merges their findings and small summaries
(:mod:`storelib.checks.tasks.crossplan`); every judgement is the one :mod:`storelib.checks.crossfile`'s
checks make."""
