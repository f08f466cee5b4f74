"""The soak's compressed clock and its people's timings (the policy's minutes and hours as seconds)."""

# The compressed clock: the policy's minutes and hours as seconds.
QUIET = 4.0  # quiet_period (15 min)
STALE = 5.0  # alertmanager.stale_after (10 min)
IDLE_TIMEOUT = 40.0  # (24 h)
REBOOT_TIMEOUT = 30.0  # (30 min)
SCHEDULER_TIMEOUT = 5.0  # scheduler.timeout (30 s)
WINDOW = 40.0  # budget.window (24 h)
RESEND = 2.0  # Prometheus' resend_delay (1 min): well inside stale_after, as 1 min is inside 10
KEEP_RESOLVED = 15.0  # Prometheus goes on sending a resolved alert (15 min)
SETTLE = QUIET + STALE + 2  # an episode's node rests this long after it resolved before its next
APP_SETTLE = 2.0  # likewise after a job's application fault, which asks nothing of the node
CREW_DELAY = 15.0  # a held node is fixed and resumed by a person this long after it was held
BREAKER_DELAY = 8.0  # a person closes an open circuit breaker this long after it opened
SETTLE_TIMEOUT = 90.0  # at the end, every node final by then, or stuck
OPERATOR_PATIENCE = 45.0  # an operator's scripted part not begun by then is tried on another node
IN_SERVICE = {"IDLE", "ALLOCATED", "MIXED", "COMPLETING"}
# Job recovery on the compressed clock: jobs.culprit_wait (2 min), jobs.backoff (10, 20, 40 min),
# jobs.lemon.window (7 d); jobs.window (24 h) outlasts the run.
CULPRIT_WAIT = 2.0
BACKOFF = (3.0, 6.0)
MAX_ATTEMPTS = 4
JOB_WINDOW = 3600.0
LEMON_JOBS = 3
LEMON_WINDOW = 180.0
RELEASE_DELAY = 5.0  # a person releases a held chain (half of the hopeless ones) this long after seeing it held
CANCEL_AFTER = (1.0, 3.0)  # a person cancels a job of kind `cancelled` this long after it started
# jobs.budget: this many times the requeues the job mix asks for in a budget window, on average: a burst
# of failing chains reaches it now and then (at 0.6 times, 6 a window, it opened the breaker 32 times in
# 20 minutes, about every window).
JOB_BUDGET_SHARE = 1.25
