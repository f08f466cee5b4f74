#!/usr/bin/env python3
"""Rule pack evaluation cost at 1,000 nodes x 8 GPUs: Prometheus 2.42 vs VictoriaMetrics + vmalert.

    python benchmarks/rules_eval.py [--nodes 1000] [--warmup 300] [--measure 180]
    python benchmarks/rules_eval.py --tier fleet --nodes 10000   # the fleet tier, after a run as above
    python benchmarks/rules_eval.py --warmup 60 --measure 60 --nodes 100 --no-backfill   # a quick look

A synthetic fleet holds every node's series as gpunode-exporter (job="gpunode"), node_exporter
(job="node") and dcgm-exporter (job="dcgm") would serve them at the reference node's size
(docs/series-budget.md: 8 GPUs, 4 NFSv4.2 mounts with nconnect=8): the label sets of
tests/golden/*.prom and README's metric table, counters that rise, nodes in training jobs of
8-128 nodes (gpunode_node_workload_info, so the peer rules compare real groups), a few percent
of nodes deviating (Xids, lost GPUs, degraded links, remaps, precursor and fail-slow outliers,
NFS slot saturation, a checkpoint load, nodes out of service) so that the alerts have work.
Every metric the rule files read is found by parsing their expressions (promql_parser); the
run warns about any the generator does not produce.

Then, one after the other on identical input (2 CPUs: never both at once), each backend with
the rule pack loaded:

* Prometheus (/usr/bin/prometheus) with rules/prometheus/*.yml;
* VictoriaMetrics single-node (/usr/bin/victoria-metrics), /usr/bin/vmalert evaluating
  rules/vmalert/*.yml against it and writing recordings back to it.

--input prewritten (the default): before the rules start, every sample from a few minutes
back (as far as the rules read a raw series) to past the end of the measurement is written by
remote write, so that while measured the backend only evaluates rules: no generator, no
scrape. --input scrape: the backend scrapes this script's HTTP server every
--scrape-interval throughout, as a server in service scrapes its nodes.

--tier local|fleet: the pack's tiers (docs/scaling.md) instead of the single-server pack. An
all or local run saves what the fleet tier reads (the local recordings at the end of the
first backend's measurement) to --fleet-inputs; a fleet run copies it to --nodes nodes (each
copy its own nodes and jobs) and writes it, one sample per evaluation interval.

After --warmup (long-window inputs are backfilled, see --backfill-days; so are recordings read
further back than the warm-up, such as the 3 hours of 5-minute medians each fail-slow baseline
reads: from an evaluation of every group recording them whose range starts after the rules
have settled, at the value recorded, every interval of the group recording them, up to just
before the rules' first evaluation; the warm-up is lengthened to let that and one more
evaluation happen: 645 s for the baselines run every 30 s, as by default here, 1,125 s with
--max-group-interval 300) every group
evaluation during --measure is recorded: Prometheus' /api/v1/rules (evaluationTime, the value
of prometheus_rule_group_last_duration_seconds, per group and rule) and vmalert's
vmalert_iteration_duration_seconds (per-evaluation durations from the summary's _sum/_count
deltas, and its own quantiles). Also: iterations missed, backend CPU and RSS, series in the
TSDB, the series each recorded metric adds, the alerts that fire. Groups with an interval
longer than --max-group-interval (the hourly remap trend and Xid history) run at the
evaluation interval here, or they would not be evaluated at all in a few minutes; the report
says which.

Results: a table on stdout and benchmarks/results/rules_eval.json.
The code is in benchmarks/rules_eval_bench/, a module per concern; this file is its command line.
"""

import sys

from rules_eval_bench.cli import main  # benchmarks/ is on sys.path when run as a script

if __name__ == "__main__":
    sys.exit(main(description=(__doc__ or "").splitlines()[0]))
