"""Settings and detection: broker.conf with the broker's defaults, which line (4.x/5.x) wrote a store, the
geometry its files imply, the ``Store`` facade, a consume queue as the broker loads it, and what a store
looks like at a glance."""
