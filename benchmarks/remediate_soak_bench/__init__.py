"""The remediation service's chaos soak (benchmarks/remediate_soak.py), split by concern:

    rig.py       the real parts and the faults between them: the service, Alertmanager, the dropping
                 webhook proxy, the failing scontrol wrapper, Prometheus' sender
    episodes.py  the alert episodes the driver plays, in the default rules' mix
    driver.py    the run: episodes, faults at seeded moments, the operators, the end
    checks.py    what the logs say: doubled actions, operators' nodes touched, the budget, stuck nodes
"""
