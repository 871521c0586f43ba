"""The write path: append messages as the broker does, roll segments, dispatch and checkpoint."""
