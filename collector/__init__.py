"""The controller-side collector: reads a run's results and computes the speedup table."""

# The report's other CSVs, beside report.csv, each written only when it has rows:
VS_FILE = "report-ddtree-vs-dflash.csv"  # every DDTree budget against every DFlash config of a cell
PACK_FILE = "report-pack-check.csv"  # each packed phase's baseline measured alone against measured packed
HTML_FILE = "report.html"  # the self-contained page: environment, tables, plots, failures
PLOTS_DIR = "plots"  # PNG and SVG of each plot
