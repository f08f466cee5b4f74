"""The remediation service's chaos soak (benchmarks/remediate_soak.py), split by concern:

    rig.py       the real parts and the faults between them: the service, Alertmanager, the dropping
                 webhook proxy, the failing scontrol and squeue wrappers, Prometheus' sender, the
                 cluster (backfill every 2 s)
    episodes.py  the alert episodes the driver plays, in the default rules' mix, and those a failing
                 job dies under
    jobs.py      the batch jobs that fail on cue, attempt by attempt, their kinds and abnormal ends
    jobplay.py   the jobs played: submitted, watched, released or cancelled by a person
    driver.py    the run: episodes, jobs, faults at seeded moments, the operators and people, the end
    checks.py    what the logs say of the nodes: doubled actions, operators' nodes touched, the budgets,
                 stuck nodes
    jobchecks.py and of the jobs: doubled and forbidden requeues, chains past their limit, runs on
                 excluded nodes
    summary.py   every check on one run, its figures and the evidence of each failed check
"""
