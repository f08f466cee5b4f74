"""The remediation service's chaos soak (benchmarks/remediate_soak.py), split by concern:

    rig.py       the real parts and the faults between them: the service, Alertmanager, the dropping
                 webhook proxy, the failing scontrol and squeue wrappers, Prometheus' sender, the
                 cluster (backfill every 2 s)
    episodes.py  the alert episodes the driver plays, in the default rules' mix, and those a failing
                 job dies under
    jobs.py      the batch jobs that fail on cue, attempt by attempt, and their kinds
    driver.py    the run: episodes, jobs, faults at seeded moments, the operators and people, the end
    checks.py    what the logs say: doubled actions, operators' nodes touched, the budgets, stuck nodes,
                 doubled and forbidden requeues, chains past their limit, runs on excluded nodes
"""
