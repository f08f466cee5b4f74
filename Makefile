# The two commands a fresh machine needs: `make run` and `make test`.
ARGS ?=
PY := .venv/bin/python

.PHONY: run test lint bench golden readme rules
run:
	scripts/install-deps.sh
	.venv/bin/gpunode-exporter $(ARGS)

test:
	scripts/install-deps.sh --test
	.venv/bin/ruff check exporter tests benchmarks scripts
	$(PY) -m pytest

lint:
	.venv/bin/ruff check exporter tests benchmarks scripts

bench:  # GPU collector vs naive pynvml (~40 s), NFS vs node_exporter, GPU processes vs process-exporter (root, ~2.5 min)
	scripts/install-deps.sh --test
	$(PY) benchmarks/gpu_scrape.py
	$(PY) benchmarks/scrape_latency.py
	$(PY) benchmarks/gpu_processes.py
	$(PY) benchmarks/xid.py

golden:  # regenerate tests/golden/ after an intended change; review the diff
	GOLDEN_UPDATE=1 $(PY) -m pytest tests/test_golden.py

readme:  # regenerate the flag and metric tables in README.md
	$(PY) -m exporter.docs README.md

rules:  # regenerate rules/prometheus and rules/vmalert from the spec and templates
	.venv/bin/gpunode-exporter rules render --target prometheus --out rules/prometheus
	.venv/bin/gpunode-exporter rules render --target vmalert --out rules/vmalert
