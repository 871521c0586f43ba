"""Spark plumbing: the session, the local Python daemon, the driver JVM's class-data archive."""
