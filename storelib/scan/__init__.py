"""Scanning into Arrow batches: commitlog segments discovered and walked, records decoded column-wise by the one batch decoder, split planning."""
