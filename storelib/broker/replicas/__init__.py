"""Replica groups: where the stores of one broker group part, what a failover or a rejoin drops, and what
only one store holds (classic HA byte copies, 5.x controller-mode epochs, DLedger terms)."""
