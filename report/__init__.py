"""The fleet's operational report (`gpunode-exporter report`, docs/report.md): where the GPU-hours
went, failures and the measured MTBF, checkpoint cost against the Young/Daly optimum, storage
during saves and loads, stragglers; read from the fleet's own Prometheus-compatible backend.

cli.py      the command line; run() and write(): report.md, its figures and report.json
source.py   the queries; build.py joins jobs.py, goodput.py, pace.py, failures.py, storage.py;
figures.py and markdown.py draw and write it
"""
