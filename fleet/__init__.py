"""The fleet simulator and the detection-quality harness.

fleet/simulate.py turns a scenario file (fleet/scenarios/*.yaml, docs/fleet.md) into the
series gpunode-exporter, node_exporter and dcgm-exporter would have scraped from N nodes of
8 GPUs every 30 s, with the jobs that share them (fleet/jobs.py), injected faults and
distractors, and the ground truth. fleet/harness.py loads them into a real backend, replays
every rule of the pack over the whole range with vmalert's replay mode, and fleet/score.py
compares the alerts with the truth: precision, recall, lead time, false alerts per 1,000
healthy node-days.
"""
