"""The ``rmqstore`` subcommands, one module each (``add_parser(sub)`` and ``run(args)``).

Their one-line help lives here so that ``rmqstore COMMAND ...`` imports only that command's module
(and what it needs) while the parser still lists every command.
"""

HELP: dict[str, str] = {
    "info": "summarise a store (segments, topics, queues, checkpoint, markers)",
    "messages": "list the messages of a store in commitlog order",
    "get": "fetch messages by offset, msgId, queue position or key",
    "gen": "generate a synthetic store (fast, realistic, broker-exact bytes)",
    "rebuild": "rebuild consume queues and index files from the commitlog",
    "audit": "integrity audit: CRCs, structure, CQ/index/checkpoint/config consistency",
    "recover": "plan / apply / undo the broker's start-up recovery offline; salvage",
    "expiry": "simulate file expiry policies and the unconsumed messages they delete",
    "export": "write the store as a Parquet snapshot (Hive partitions, incremental)",
    "timers": "5.x timer store: pending/delivered timer messages, timerlog, wheel",
}
