"""What the jobs tell people and schedulers: the audit's verdict and pages, the expiry reports, metrics."""
