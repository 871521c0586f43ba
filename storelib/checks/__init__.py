"""The checks of ``rmqstore audit`` as plain functions over a segment (:mod:`.segment`) and over the
whole log (:mod:`.logview`, :mod:`.queues`, :mod:`.index`, :mod:`.metadata`); the jobs only schedule them."""
