"""Dispatch as ReputMessageService does it: ConsumeQueue and IndexFile from commitlog records, and the
rebuild's tasks and rules about its source store."""
