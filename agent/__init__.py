"""The host-side benchmark agent: one server per config, timed requests, results on disk.

Runs on the benchmarked host with the standard library alone, so an air-gapped GPU host needs
nothing installed beyond a Python 3.9+ interpreter. The controller imports `matrix` and
`engines` from here to validate and render the same configs the agent will run.
"""

SCHEMA_VERSION = 1
