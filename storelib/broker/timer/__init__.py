"""The 5.x timer store's rules: its messages (pending, delivered), its recovery at start-up, its rebuild."""
