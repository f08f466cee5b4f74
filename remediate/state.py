"""The service's state in one SQLite file (WAL): alerts as last notified, the nodes in its care,
every action with the alert fingerprints behind it, and the circuit breaker.

An action is written as pending before its call and marked done, failed or dry_run after it, so a
restart knows which calls were cut short (kill -9) and looks at the scheduler before trying again.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpunode_remediate.alerts import Alert
from gpunode_remediate.jobs import Decision, End
from gpunode_remediate.plan import RETURNING, History, Record, Step
from gpunode_remediate.policy import Policy

_SCHEMA = """
CREATE TABLE IF NOT EXISTS alerts (
  fingerprint TEXT PRIMARY KEY, node TEXT, alertname TEXT NOT NULL, labels TEXT NOT NULL,
  status TEXT NOT NULL, starts_at REAL NOT NULL, ends_at REAL, received_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS alerts_node ON alerts (node, status);
CREATE TABLE IF NOT EXISTS nodes (
  node TEXT PRIMARY KEY, phase TEXT NOT NULL, action TEXT NOT NULL, why TEXT NOT NULL,
  since REAL NOT NULL, gpus TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS actions (
  id INTEGER PRIMARY KEY, node TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
  why TEXT NOT NULL, reason TEXT NOT NULL, job TEXT NOT NULL, new_drain INTEGER NOT NULL,
  fingerprints TEXT NOT NULL, started_at REAL NOT NULL, finished_at REAL, error TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS actions_node ON actions (node, kind, started_at);
CREATE TABLE IF NOT EXISTS notes (node TEXT PRIMARY KEY, why TEXT NOT NULL, since REAL NOT NULL);
-- One circuit breaker per mode: what a dry run decides never opens the enforced one. paused: a
-- person opened it (every call stops); budget_from: drains before it no longer count (a reset).
CREATE TABLE IF NOT EXISTS breakers (
  mode TEXT PRIMARY KEY, open INTEGER NOT NULL, paused INTEGER NOT NULL, since REAL NOT NULL,
  why TEXT NOT NULL, budget_from REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- Job recovery: each abnormal end decided, written before its calls (pending), so a restart never
-- requeues an end twice; (job, restarts) is one end: Slurm's RestartCnt rises with each requeue.
-- waits_for: the NFS server a held requeue waits for; waited_until: when that wait ended.
CREATE TABLE IF NOT EXISTS job_ends (
  job TEXT NOT NULL, restarts INTEGER NOT NULL, ended_at REAL NOT NULL, nodes TEXT NOT NULL,
  branch TEXT NOT NULL, why TEXT NOT NULL, culprits TEXT NOT NULL, evidence TEXT NOT NULL,
  exclude TEXT NOT NULL, start_at REAL NOT NULL, attempts INTEGER NOT NULL, shared TEXT NOT NULL,
  status TEXT NOT NULL, decided_at REAL NOT NULL, finished_at REAL, error TEXT NOT NULL DEFAULT '',
  waits_for TEXT NOT NULL DEFAULT '', waited_until REAL,
  PRIMARY KEY (job, restarts));
-- When a person last released a held chain: its earlier ends no longer count.
CREATE TABLE IF NOT EXISTS chains (job TEXT PRIMARY KEY, released_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS returns (node TEXT NOT NULL, taken_at REAL NOT NULL, returned_at REAL NOT NULL);
-- A node ready to return but not yet fit to (its NVLink fabric not complete): since when it waits.
CREATE TABLE IF NOT EXISTS return_waits (node TEXT PRIMARY KEY, since REAL NOT NULL);
"""


# A Decision's columns in job_ends, in its fields' order.
_DECISION = ("job, restarts, ended_at, nodes, branch, why, culprits, evidence, exclude, start_at, attempts, shared, "
             "waits_for")


@dataclass(frozen=True)
class Breaker:
    open: bool = False
    paused: bool = False  # opened by a person: no call at all until a reset
    since: float = 0.0
    why: str = ""
    budget_from: float = 0.0


@dataclass(frozen=True)
class Action:
    id: int
    node: str
    kind: str
    status: str
    why: str
    started_at: float
    error: str


class State:
    def __init__(self, path: Path, readonly: bool = False) -> None:
        if readonly:
            if not path.exists():
                raise FileNotFoundError(f"no state file at {path}: has the service run?")
            self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(_SCHEMA)
            self._migrate()
        self.lock = threading.Lock()
        # `status` reads a file an earlier version wrote as it is: its job ends waited for no server.
        self._waits = "waits_for" in {row[1] for row in self.db.execute("PRAGMA table_info(job_ends)")}

    def _migrate(self) -> None:
        """A state file of an earlier version kept one breaker for both modes: it becomes the
        enforced one if it was open (closing it silently would be worse). Its job ends had no
        storage waits: the columns are added, empty."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(job_ends)")}
        for name, kind in (("waits_for", "TEXT NOT NULL DEFAULT ''"), ("waited_until", "REAL")):
            if name not in columns:
                self.db.execute(f"ALTER TABLE job_ends ADD COLUMN {name} {kind}")
        old = self.db.execute("SELECT name FROM sqlite_master WHERE name = 'breaker'").fetchone()
        if old:
            for since, why in self.db.execute("SELECT since, why FROM breaker WHERE open = 1").fetchall():
                self.db.execute("INSERT OR IGNORE INTO breakers VALUES ('enforce', 1, 0, ?, ?, 0)", (since, why))
            self.db.execute("DROP TABLE breaker")

    def close(self) -> None:
        self.db.close()

    def _rows(self, sql: str, *args: object) -> list[tuple]:
        with self.lock:
            return self.db.execute(sql, args).fetchall()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """Under the lock, all or nothing."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def _write(self, sql: str, *args: object) -> int:
        with self.lock:
            cursor = self.db.execute(sql, args)
            return cursor.lastrowid or cursor.rowcount

    # Alerts

    def record_alerts(self, alerts: Iterable[tuple[Alert, str | None]], now: float) -> int:
        """Take a notification's alerts; how many changed what is known. Out of order and repeated
        notifications change nothing: an episode (fingerprint, start) once resolved stays resolved,
        and an older episode never replaces a newer one."""
        changed = 0
        with self._transaction():
            for alert, node in alerts:
                row = self.db.execute("SELECT status, starts_at FROM alerts WHERE fingerprint = ?",
                                      (alert.fingerprint,)).fetchone()
                if row is not None:
                    status, starts = row
                    if alert.starts_at < starts - 1e-3:
                        continue  # an older episode
                    same = abs(alert.starts_at - starts) <= 1e-3
                    if same and (alert.status == status or status == "resolved"
                                 or (status == "released" and alert.status == "firing")):
                        continue  # repeated, firing after resolved, or firing while a person has the node
                # When it resolved: as Alertmanager says, never later than now.
                ends = min(alert.ends_at or now, now) if alert.status == "resolved" else None
                self.db.execute(
                    "INSERT OR REPLACE INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (alert.fingerprint, node, alert.name, json.dumps(alert.labels, sort_keys=True),
                     alert.status, alert.starts_at, ends, now))
                changed += 1
        return changed

    def firing(self) -> dict[str, list[Alert]]:
        out: dict[str, list[Alert]] = {}
        for fp, node, labels, starts in self._rows(
                "SELECT fingerprint, node, labels, starts_at FROM alerts WHERE status = 'firing' AND node IS NOT NULL"):
            out.setdefault(node, []).append(Alert(fp, "firing", json.loads(labels), starts, None))
        return out

    def alerts_at(self, nodes: Iterable[str], at: float, wait: float) -> dict[str, list[Alert]]:
        """node -> the alerts on these nodes that fired at `at` or began within `wait` after it (a job's
        end: the alert about the fault that ended it comes later)."""
        nodes = list(nodes)
        out: dict[str, list[Alert]] = {}
        for start in range(0, len(nodes), 500):  # SQLite's limit on parameters
            part = nodes[start:start + 500]
            for fp, node, labels, status, starts, ends in self._rows(
                    f"SELECT fingerprint, node, labels, status, starts_at, ends_at FROM alerts WHERE node IN "
                    f"({','.join('?' * len(part))}) AND status != 'released' AND starts_at <= ? "
                    "AND (ends_at IS NULL OR ends_at >= ?)", *part, at + wait, at):
                out.setdefault(node, []).append(Alert(fp, status, json.loads(labels), starts, ends))
        return out

    def unplaced_at(self, at: float, wait: float) -> list[Alert]:
        """The alerts that name no node (NfsServerNotResponding{server}) firing at `at` or begun within
        `wait` after it."""
        return [Alert(fp, status, json.loads(labels), starts, ends) for fp, labels, status, starts, ends in self._rows(
            "SELECT fingerprint, labels, status, starts_at, ends_at FROM alerts WHERE node IS NULL "
            "AND status != 'released' AND starts_at <= ? AND (ends_at IS NULL OR ends_at >= ?)", at + wait, at)]

    def firing_unplaced(self) -> list[Alert]:
        return [Alert(fp, "firing", json.loads(labels), starts, None) for fp, labels, starts in self._rows(
            "SELECT fingerprint, labels, starts_at FROM alerts WHERE status = 'firing' AND node IS NULL")]

    def outage(self, alertname: str, server: str) -> tuple[bool, float | None]:
        """(firing, when it last resolved) of a node-less alert about one server."""
        firing, resolved = False, None
        for labels, status, ends in self._rows("SELECT labels, status, ends_at FROM alerts WHERE node IS NULL "
                                               "AND alertname = ?", alertname):
            if json.loads(labels).get("server") != server:
                continue
            firing = firing or status == "firing"
            if status == "resolved" and ends is not None:
                resolved = max(resolved or ends, ends)
        return firing, resolved

    def last_resolved(self) -> dict[str, float]:
        return dict(self._rows("SELECT node, MAX(ends_at) FROM alerts WHERE status = 'resolved' "
                               "AND node IS NOT NULL GROUP BY node"))

    def forget_alerts(self, before: float) -> int:
        """Resolved alerts older than any window that reads them (released ones by when they came)."""
        return self._write("DELETE FROM alerts WHERE (status = 'resolved' AND ends_at < ?) "
                           "OR (status = 'released' AND received_at < ?)", before, before)

    def release(self, node: str) -> None:
        """A person took the node: forgotten, and its firing episodes no longer ask for anything (a new
        one will); both at once, or a restart between them would take the node back."""
        with self._transaction():
            self._set_record(node, None)
            self.db.execute("UPDATE alerts SET status = 'released' WHERE node = ? AND status = 'firing'", (node,))

    # Nodes in the service's care

    def records(self) -> dict[str, Record]:
        return {node: Record(node, phase, action, why, since, tuple(json.loads(gpus)))
                for node, phase, action, why, since, gpus in self._rows("SELECT * FROM nodes")}

    def set_record(self, node: str, phase: str | None, action: str, why: str, since: float,
                   gpus: tuple[str, ...]) -> None:
        with self.lock:
            self._set_record(node, Record(node, phase, action, why, since, gpus) if phase else None)

    def _set_record(self, node: str, record: Record | None) -> None:
        """Under the lock. A node leaving a phase that returns it ends its wait to return."""
        if record is None or not RETURNING.get(record.phase):
            self.db.execute("DELETE FROM return_waits WHERE node = ?", (node,))
        if record is None:
            self.db.execute("DELETE FROM nodes WHERE node = ?", (node,))
        else:
            self.db.execute("INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?, ?, ?)", (
                node, record.phase, record.action, record.why, record.since, json.dumps(list(record.gpus))))

    # Actions

    def begin(self, step: Step, now: float) -> int:
        return self._write(
            "INSERT INTO actions (node, kind, status, why, reason, job, new_drain, fingerprints, started_at) "
            "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?)", step.node, step.kind, step.why, step.reason, step.job,
            int(step.new_drain), json.dumps(list(step.fingerprints)), now)

    def finish(self, action_id: int, status: str, now: float, error: str = "",
               node: tuple[str, Record | None] | None = None) -> None:
        """The call's outcome and, in the same transaction, the node's record after it (node, None:
        forget it): a restart between the two would leave a drain done and its node in no one's care."""
        with self._transaction():
            self.db.execute("UPDATE actions SET status = ?, finished_at = ?, error = ? WHERE id = ?",
                            (status, now, error, action_id))
            if node is not None:
                self._set_record(*node)

    def interrupted(self, now: float) -> list[Action]:
        """Calls a previous run began and never finished (killed mid-call): marked interrupted."""
        rows = self._rows("SELECT id, node, kind, status, why, started_at, error FROM actions "
                          "WHERE status = 'pending'")
        self._write("UPDATE actions SET status = 'interrupted', finished_at = ? WHERE status = 'pending'", now)
        return [Action(*row) for row in rows]

    def failures(self, node: str, kind: str, since: float) -> tuple[int, float]:
        """Failed tries of one call since the last success: (how many, when the last ended)."""
        row = self._rows("SELECT COUNT(*), MAX(finished_at) FROM actions WHERE node = ? AND kind = ? "
                         "AND status = 'failed' AND started_at >= ? AND id > COALESCE((SELECT MAX(id) FROM "
                         "actions WHERE node = ? AND kind = ? AND status IN ('done', 'dry_run')), 0)",
                         node, kind, since, node, kind)[0]
        return row[0], row[1] or 0.0

    def actions(self, since: float) -> list[Action]:
        return [Action(*row) for row in self._rows(
            "SELECT id, node, kind, status, why, started_at, error FROM actions WHERE started_at >= ? ORDER BY id",
            since)]

    def history(self, policy: Policy, now: float) -> History:
        done = policy.done
        marks = ",".join("?" * len(done))
        drains = dict(self._rows(f"SELECT node, COUNT(*) FROM actions WHERE new_drain = 1 AND status IN ({marks}) "
                                 "AND started_at >= ? GROUP BY node", *done, now - policy.repeat_offender.window))
        reboots = dict(self._rows(f"SELECT node, COUNT(*) FROM actions WHERE kind = 'reboot' AND status IN "
                                  f"({marks}) AND started_at >= ? GROUP BY node", *done,
                                  now - policy.reboot_repeat_window))
        breaker = self.breaker(policy.mode)
        tried = policy.tried  # a drain that timed out or was cut short may have taken effect all the same
        used = self._rows(f"SELECT COUNT(DISTINCT node) FROM actions WHERE new_drain = 1 AND status IN "
                          f"({','.join('?' * len(tried))}) AND started_at >= ?", *tried,
                          max(now - policy.budget.window, breaker.budget_from))[0][0]
        requeues = {job: (count, last) for job, count, last in self._rows(
            f"SELECT job, COUNT(*), MAX(started_at) FROM actions WHERE kind = 'requeue' AND status IN ({marks}) "
            "GROUP BY job", *done)}
        return History(drains, reboots, used, breaker.open, requeues, breaker.why if breaker.paused else "")

    # The circuit breaker, one per mode

    def breaker(self, mode: str) -> Breaker:
        try:
            rows = self._rows("SELECT open, paused, since, why, budget_from FROM breakers WHERE mode = ?", mode)
        except sqlite3.OperationalError:  # `status` (read-only) on a file an earlier version wrote
            rows = self._rows("SELECT open, 0, since, why, 0 FROM breaker WHERE id = 1") if mode == "enforce" else []
        return Breaker(bool(rows[0][0]), bool(rows[0][1]), *rows[0][2:]) if rows else Breaker()

    def set_breaker(self, mode: str, breaker: Breaker) -> None:
        self._write("INSERT OR REPLACE INTO breakers VALUES (?, ?, ?, ?, ?, ?)", mode, int(breaker.open),
                    int(breaker.paused), breaker.since, breaker.why, breaker.budget_from)

    # Which mode used the file last: a dry run's records are not the scheduler's nodes

    def last_mode(self, mode: str) -> str | None:
        """The mode the file was used in before; from now on, `mode`."""
        rows = self._rows("SELECT value FROM meta WHERE key = 'mode'")
        self._write("INSERT OR REPLACE INTO meta VALUES ('mode', ?)", mode)
        return rows[0][0] if rows else None

    def counted(self) -> int | None:
        """The nodes the budget was a share of at the service's last look (plan.counted)."""
        rows = self._rows("SELECT value FROM meta WHERE key = 'counted'")
        return int(rows[0][0]) if rows else None

    def set_counted(self, nodes: int) -> None:
        self._write("INSERT OR REPLACE INTO meta VALUES ('counted', ?)", str(nodes))

    def forget_nodes(self) -> int:
        """Every record and note (a dry run's, when the service starts enforcing); how many records."""
        records = self._rows("SELECT COUNT(*) FROM nodes")[0][0]
        self._write("DELETE FROM notes")
        self._write("DELETE FROM nodes")
        self._write("DELETE FROM return_waits")
        return records

    # Returns to service: from the node's first action (its latest new drain) to its return

    def taken_at(self, node: str, statuses: tuple[str, ...]) -> float | None:
        marks = ",".join("?" * len(statuses))
        return self._rows(f"SELECT MAX(started_at) FROM actions WHERE node = ? AND new_drain = 1 "
                          f"AND status IN ({marks})", node, *statuses)[0][0]

    def returned(self, node: str, taken_at: float, now: float) -> None:
        self._write("INSERT INTO returns VALUES (?, ?, ?)", node, taken_at, now)

    def return_seconds(self) -> list[float]:
        return [row[0] for row in self._rows("SELECT returned_at - taken_at FROM returns")]

    # Waits to return: a node not yet fit to return (health.Trouble.bounded), since when

    def return_wait(self, node: str, now: float) -> float:
        """Since when the node waits to return; the wait begins now if it had not."""
        self._write("INSERT OR IGNORE INTO return_waits VALUES (?, ?)", node, now)
        return self._rows("SELECT since FROM return_waits WHERE node = ?", node)[0][0]

    def end_return_wait(self, node: str) -> None:
        self._write("DELETE FROM return_waits WHERE node = ?", node)

    # Notes: why a node with alerts was left alone (shown by status, logged once)

    def note(self, node: str, why: str | None, now: float) -> bool:
        """Set (or with None clear) a node's note; True when it changed."""
        rows = self._rows("SELECT why FROM notes WHERE node = ?", node)
        if why is None:
            return bool(rows) and self._write("DELETE FROM notes WHERE node = ?", node) >= 0
        if rows and rows[0][0] == why:
            return False
        self._write("INSERT OR REPLACE INTO notes VALUES (?, ?, ?)", node, why, now)
        return True

    def notes(self) -> dict[str, tuple[str, float]]:
        return {node: (why, since) for node, why, since in self._rows("SELECT node, why, since FROM notes")}

    # Job recovery

    def job_ends(self, since: float, statuses: tuple[str, ...]) -> list[End]:
        """Ends decided (with these statuses) since a time, each after its chain's last release."""
        marks = ",".join("?" * len(statuses))
        return [End(job, restarts, ended, tuple(json.loads(nodes)), branch, tuple(json.loads(culprits)), evidence)
                for job, restarts, ended, nodes, branch, culprits, evidence in self._rows(
                    "SELECT e.job, e.restarts, e.ended_at, e.nodes, e.branch, e.culprits, e.evidence FROM job_ends e "
                    "LEFT JOIN "
                    f"chains c ON c.job = e.job WHERE e.status IN ({marks}) AND e.ended_at >= ? "
                    "AND e.ended_at > COALESCE(c.released_at, -1) ORDER BY e.ended_at", *statuses, since)]

    def decided(self, job: str, restarts: int) -> bool:
        return bool(self._rows("SELECT 1 FROM job_ends WHERE job = ? AND restarts = ?", job, restarts))

    def begin_job_end(self, decision: Decision, status: str, now: float) -> None:
        self._write(f"INSERT INTO job_ends ({_DECISION}, status, decided_at, finished_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    decision.job, decision.restarts, decision.ended_at, json.dumps(list(decision.nodes)),
                    decision.branch, decision.why, json.dumps(list(decision.culprits)), decision.evidence,
                    json.dumps(list(decision.exclude)), decision.start_at, decision.attempts,
                    json.dumps(list(decision.shared)), decision.waits_for, status, now,
                    now if status != "pending" else None)

    def finish_job_end(self, job: str, restarts: int, status: str, now: float, error: str = "") -> None:
        self._write("UPDATE job_ends SET status = ?, finished_at = ?, error = ? WHERE job = ? AND restarts = ?",
                    status, now, error, job, restarts)

    def unfinished_job_ends(self) -> list[Decision]:
        """Decisions whose calls a previous run began and never finished (killed mid-call), or that failed."""
        return [self._decision(row) for row in self._rows(
            f"SELECT {self._columns()} FROM job_ends WHERE status IN ('pending', 'interrupted', 'failed') "
            "ORDER BY decided_at")]

    def interrupt_job_ends(self) -> int:
        with self.lock:
            return self.db.execute("UPDATE job_ends SET status = 'interrupted' WHERE status = 'pending'").rowcount

    def _columns(self, table: str = "") -> str:
        return ", ".join(table + name if self._waits or name != "waits_for" else "''"
                         for name in _DECISION.split(", "))

    @staticmethod
    def _decision(row: tuple) -> Decision:
        job, restarts, ended, nodes, branch, why, culprits, evidence, exclude, start_at, attempts, shared, waits = row
        return Decision(job, restarts, branch, why, ended, tuple(json.loads(nodes)), tuple(json.loads(culprits)),
                        evidence, tuple(json.loads(exclude)), start_at, attempts, tuple(json.loads(shared)), waits)

    def storage_waits(self, statuses: tuple[str, ...]) -> list[tuple[Decision, float]]:
        """(decision, when decided) of the requeues held for an NFS server that has not answered yet."""
        if not self._waits:
            return []
        marks = ",".join("?" * len(statuses))
        rows = self._rows(f"SELECT {_DECISION}, decided_at FROM job_ends WHERE waits_for != '' AND "
                          f"waited_until IS NULL AND status IN ({marks}) ORDER BY decided_at", *statuses)
        return [(self._decision(row[:-1]), row[-1]) for row in rows]

    def end_wait(self, job: str, restarts: int, now: float, error: str = "") -> None:
        self._write("UPDATE job_ends SET waited_until = ?, error = ? WHERE job = ? AND restarts = ?",
                    now, error, job, restarts)

    def requeues_since(self, since: float, statuses: tuple[str, ...]) -> int:
        marks = ",".join("?" * len(statuses))
        return self._rows(f"SELECT COUNT(*) FROM job_ends WHERE branch != 'held' AND status IN ({marks}) "
                          "AND decided_at >= ?", *statuses, since)[0][0]

    def held_chains(self, statuses: tuple[str, ...]) -> list[Decision]:
        """Each chain's latest hold, unless a person released it since."""
        marks = ",".join("?" * len(statuses))
        return [self._decision(row) for row in self._rows(
            f"SELECT {self._columns('e.')} FROM job_ends e LEFT JOIN chains c ON c.job = e.job WHERE e.branch = 'held' "
            f"AND e.status IN ({marks}) AND e.ended_at > COALESCE(c.released_at, -1) ORDER BY e.decided_at",
            *statuses)]

    def release_chain(self, job: str, now: float) -> None:
        self._write("INSERT OR REPLACE INTO chains VALUES (?, ?)", job, now)

    def lemon_taken(self, statuses: tuple[str, ...]) -> dict[str, float]:
        """node -> when this service last took it as a lemon: blames before then are spent."""
        marks = ",".join("?" * len(statuses))
        return dict(self._rows(f"SELECT node, MAX(started_at) FROM actions WHERE why LIKE 'lemon:%' AND status IN "
                               f"({marks}) GROUP BY node", *statuses))
