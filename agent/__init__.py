"""The host agent: one server per config, timed requests, results on disk (`python -m agent`).

This package is what is copied to every benchmarked host, so it uses the standard library alone and
runs on Python 3.9+: an air-gapped GPU host needs nothing installed beyond an interpreter. The
controller (`controller/`, `collector/`) imports its engine commands, records and parsers.
"""
