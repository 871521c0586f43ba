"""The ``rmqstore`` subcommands: where each lives and its one-line help.

A command's module has ``add_arguments(parser)`` and ``run_args(args) -> exit code``, a docstring (or a
``DESCRIPTION``) for ``--help`` and optionally an ``EXAMPLE`` epilog. The jobs that also run under
spark-submit (audit, rebuild, export) are their own command modules. The table lives here so that
``rmqstore COMMAND ...`` imports only that command's module (and what it needs) while the parser still
lists every command.
"""

COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("jobs.commands.info", "summarise a store (segments, topics, queues, checkpoint, markers)"),
    "messages": ("jobs.commands.messages", "list the messages of a store in commitlog order"),
    "get": ("jobs.commands.get", "fetch messages by offset, msgId, queue position or key"),
    "gen": ("jobs.commands.gen", "generate a synthetic store (fast, realistic, broker-exact bytes)"),
    "rebuild": ("jobs.rebuild", "rebuild consume queues and index files from the commitlog"),
    "audit": ("jobs.audit", "integrity audit: CRCs, structure, CQ/index/checkpoint/config consistency"),
    "recover": ("jobs.commands.recover", "plan / apply / undo the broker's start-up recovery offline; salvage"),
    "expiry": ("jobs.commands.expiry", "simulate file expiry policies and the unconsumed messages they delete"),
    "export": ("jobs.export", "write the store as a Parquet snapshot (Hive partitions, incremental)"),
    "timers": ("jobs.commands.timers", "5.x timer store: pending/delivered timer messages, timerlog, wheel"),
    "replicas": ("jobs.commands.replicas", "compare a broker group's replicas: where they part, what each holds alone, "
                                           "what a rejoin cuts; salvage it"),
}
HELP: dict[str, str] = {name: help_ for name, (_, help_) in COMMANDS.items()}
