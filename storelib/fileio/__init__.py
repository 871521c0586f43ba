"""Byte sources and atomic output: mmap or ranged reads through pyarrow.fs, whole small files, temp-file-then-rename writes, O_DIRECT for big new files, backups with manifests."""
