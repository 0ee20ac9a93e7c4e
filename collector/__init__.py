"""The controller-side collector: reads a run's results and computes the speedup table."""
