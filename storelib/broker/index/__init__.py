"""IndexFiles as the broker's dispatch writes them: built whole, streamed from per-segment runs, merged across
segments, written out; and the broker's lookups by queue position and key."""
