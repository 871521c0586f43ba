"""DLedger 0.3.1.2's files in a DLedger-mode store (``dledger-<selfId>/``): ``entries`` (data entries, blank
fillers, index units) and ``state`` (the checkpoint and currterm Properties files)."""
