"""``config/`` compared across the replicas of one group (apache/rocketmq#9804).

A slave copies its master's topics, subscription groups, consumer and delay offsets by polling
(SlaveSynchronize.syncAll: every 60 s for a classic slave in 5.x, 10 s in 4.9.8 and in controller mode),
and a master never copies from a slave. So after a switch the new master's tables are up to one period
old: a topic or group created on the old master in that window exists there only, and its consumer offsets
lag, so consumers read again what they had already consumed.
"""

from __future__ import annotations

from typing import Any

from storelib.broker.replicas.facts import StoreFacts


def _presence(names: list[str], tables: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """(entries present on some stores only, entries whose values differ between the stores that hold them)."""
    only, differ = [], []
    for key in sorted(set().union(*[set(t) for t in tables])):
        on = [n for n, t in zip(names, tables) if key in t]
        if len(on) < len(names):
            only.append({"name": key, "on": on, "missing_on": [n for n in names if n not in on]})
            continue
        values = [t[key] for t in tables]
        if any(v != values[0] for v in values[1:]):
            differ.append({"name": key, "values": dict(zip(names, values))})
    return only, differ


def compare_config(facts: list[StoreFacts]) -> dict[str, Any]:
    """What each replica's ``config/`` holds that another's lacks or holds differently.

    ``consumer_offsets``: every (group, topic, queue) whose committed offset differs between stores, with
    ``behind``: per store, how many messages a group resuming from that store's offsets reads again
    compared with the most advanced store (0 for that one).
    """
    names = [f.name for f in facts]
    topics_only, topics_differ = _presence(names, [f.config.topics for f in facts])
    groups_only, groups_differ = _presence(names, [f.config.groups for f in facts])
    offsets = []
    keys = set()
    for f in facts:
        for (topic, group), qmap in f.config.offsets.items():
            keys.update((group, topic, q) for q in qmap)
    for group, topic, q in sorted(keys):
        vals = {f.name: f.config.offsets.get((topic, group), {}).get(q) for f in facts}
        present = [v for v in vals.values() if v is not None]
        if len(present) == len(names) and len(set(present)) == 1:
            continue
        top = max(present)
        offsets.append({"group": group, "topic": topic, "queue_id": q, "offsets": vals,
                        "behind": {n: (None if v is None else top - v) for n, v in vals.items()}})
    delay = []
    for lvl in sorted(set().union(*[set(f.config.delay) for f in facts])):
        vals = {f.name: f.config.delay.get(lvl) for f in facts}
        if len({v for v in vals.values()}) > 1:
            delay.append({"level": lvl, "offsets": vals})
    return {
        "topics": {"only_on_some": topics_only, "differ": topics_differ},
        "subscription_groups": {"only_on_some": groups_only, "differ": groups_differ},
        "consumer_offsets": offsets,
        "delay_offsets": delay,
        "data_versions": {f.name: f.config.data_versions for f in facts},
        "files_read": {f.name: f.config.files for f in facts},
    }


def config_summary(cfg: dict[str, Any]) -> dict[str, int]:
    """How many differences of each kind (the report's and the console's one line)."""
    return {"topics_only_on_some": len(cfg["topics"]["only_on_some"]), "topics_differ": len(cfg["topics"]["differ"]),
            "groups_only_on_some": len(cfg["subscription_groups"]["only_on_some"]),
            "groups_differ": len(cfg["subscription_groups"]["differ"]),
            "consumer_offsets_differ": len(cfg["consumer_offsets"]), "delay_offsets_differ": len(cfg["delay_offsets"])}


__all__ = ["compare_config", "config_summary"]
