"""The controller-side collector: reads a run's results and computes the speedup table."""

VS_FILE = "report-ddtree-vs-dflash.csv"  # the DDTree/DFlash comparison's CSV beside report.csv, only when it has rows
