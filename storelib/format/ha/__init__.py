"""Byte formats of the broker's high-availability metadata: the 5.x controller-mode epoch file
(``epochFileCheckpoint`` and its ``.bak``)."""
