"""A whole broker start-up replayed read-only, and ``recover`` over it: the plan, the journaled apply with
backup and restore, and salvage of what a start-up would drop."""
