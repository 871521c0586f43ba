"""File expiry as the broker's cleaner does it: policies, the time model, the tick-exact simulation, grids."""
