# The commands a fresh machine needs: `make demo` (the whole stack on a simulated node),
# `make run` (the exporter on a real node) and `make test`. Each target installs what it needs
# (scripts/install-deps.sh) and no more: tests/test_fresh_install.py runs run's and demo's that way.
ARGS ?=
PY := .venv/bin/python

.PHONY: demo run test lint bench bench-rules bench-report golden readme rules dashboards fleet
demo:  # root: network namespaces, a tmpfs; ARGS="--scenario healthy", "--duration 0" (until Ctrl-C)
	scripts/install-deps.sh --demo
	$(PY) -m demo $(ARGS)

run:
	scripts/install-deps.sh
	.venv/bin/gpunode-exporter $(ARGS)

# The tests side by side (pytest-xdist: most of the slow ones wait on servers and installs), those
# that share a resource in one group each (--dist loadgroup), then the ones marked `alone`.
TEST_WORKERS ?= 4
test:
	scripts/install-deps.sh --test
	.venv/bin/ruff check common exporter rulepack report remediate tests benchmarks scripts demo fleet
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not alone"
	$(PY) -m pytest -m alone

lint:
	scripts/install-deps.sh --test
	.venv/bin/ruff check common exporter rulepack report remediate tests benchmarks scripts demo fleet

bench:  # GPU collector vs naive pynvml (~40 s), NFS vs node_exporter, GPU processes vs process-exporter, bursts of scrapes vs node_exporter (root, ~3.5 min), the reference node: series, a full scrape and where it goes (~1.5 min), its checkpoint clock against none (~3 min), the remediation service on a real slurmctld (root, ~5 s)
	scripts/install-deps.sh --test
	$(PY) benchmarks/gpu_scrape.py
	$(PY) benchmarks/scrape_latency.py
	$(PY) benchmarks/gpu_processes.py
	$(PY) benchmarks/xid.py
	$(PY) benchmarks/workload.py
	$(PY) benchmarks/burst.py
	$(PY) benchmarks/series_budget.py --out benchmarks/results/series_budget.json
	$(PY) benchmarks/reference_scrape.py
	$(PY) benchmarks/scrape_profile.py
	$(PY) benchmarks/checkpoint_clock.py
	$(PY) benchmarks/remediate_latency.py

bench-rules:  # rule evaluation at 1,000 nodes (the single-server pack), then the fleet tier on 10,000 nodes' recordings, on Prometheus and VictoriaMetrics + vmalert (~60 min)
	scripts/install-deps.sh --test
	$(PY) benchmarks/rules_eval.py
	$(PY) benchmarks/rules_eval.py --tier fleet --nodes 10000 --output benchmarks/results/rules_eval_fleet.json

bench-report:  # `gpunode-exporter report` over 63 nodes x 14 days on VictoriaMetrics and Prometheus: load, report time, memory, where the time goes (~16 min on 2 CPUs)
	scripts/install-deps.sh --test
	$(PY) benchmarks/weekly_report.py

golden:  # regenerate tests/golden/ after an intended change; review the diff
	scripts/install-deps.sh --test
	GOLDEN_UPDATE=1 $(PY) -m pytest tests/test_golden.py

readme:  # regenerate the flag and metric tables in README.md
	scripts/install-deps.sh
	$(PY) -m gpunode_exporter.docs README.md

rules:  # regenerate rules/prometheus and rules/vmalert from the spec and templates
	scripts/install-deps.sh --rules
	.venv/bin/gpunode-exporter rules render --target prometheus --out rules/prometheus
	.venv/bin/gpunode-exporter rules render --target vmalert --out rules/vmalert

dashboards:  # regenerate dashboards/ from the code in rulepack/dashboards and the rule pack's spec (Grafana's SDK: the [test] install has it)
	scripts/install-deps.sh --test
	.venv/bin/gpunode-exporter dashboards render --out dashboards
	$(PY) -m gpunode_rulepack.dashboards.doc docs/dashboards.md

fleet:  # detection quality: simulate the standard, Lablup-shaped and mixed fleets, the stragglers, the distractors, the node past its GPUs and the fabric, replay the rule pack on Prometheus and VictoriaMetrics, write docs/fleet-results.md (~100 min on 2 CPUs)
	scripts/install-deps.sh --test
	$(PY) -m fleet --scenario standard --scenario lablup --scenario mixed --scenario stragglers --scenario distractors --scenario beyond-gpu --scenario fabric --out docs/fleet-results.md
