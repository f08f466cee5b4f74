"""The soak's jobs played: submitted, watched attempt by attempt, cancelled and released by people."""


from __future__ import annotations

import time

from demo.slurm import _tool, parse
from gpunode_remediate.scheduler.slurm import expand_hostlist
from remediate_soak_bench.clock import (
    CANCEL_AFTER,
    MAX_ATTEMPTS,
    RELEASE_DELAY,
)
from remediate_soak_bench.episodes import job_fault
from remediate_soak_bench.jobs import SoakJob, draw_job
from remediate_soak_bench.rig import read_new


class JobPlayer:
    """Soak's job half (a mixin: the attributes are Soak's)."""

    def _new_job(self) -> None:
        """A batch job of the mix (jobs.py), failing on cue; while slurmctld is stopped none is submitted."""
        if self.controller_down or self.ending:
            return
        job = draw_job(self.job_rng, len(self.run.jobs) + 1, self.first_kinds[0] if self.first_kinds else "")
        submitted = self.cluster.run(_tool("sbatch"), "--parsable", f"--nodes={job.nodes}", f"--job-name={job.name}",
                                     f"--partition={self.cluster.partition}", "--output=/dev/null", *job.options,
                                     f"--wrap={job.script(self.run.job_runs)}", timeout=10)
        if submitted.returncode != 0:
            self.say(f"sbatch of {job.name} failed: {submitted.stderr.strip()[:200]}")
            return
        job.id, job.submitted_at = submitted.stdout.strip().split(";")[0], time.time()
        if self.first_kinds and job.kind == self.first_kinds[0]:
            self.first_kinds.pop(0)
        self.run.jobs.append(job)
        self.by_id[job.id] = job
        self.say(f"job {job.id} {job.name}: {job.kind}, {job.nodes} node(s), {job.seconds:.1f} s an attempt, "
                 f"exit {job.code} for attempts below {job.fails}{', alerts ' + str(job.alerts) if job.alerts else ''}")

    def _read_runs(self) -> None:
        """The jobs' log since the last look: an attempt that fails under an alert gets it on one of its nodes;
        a job of kind `cancelled` is cancelled by a person a moment after it starts."""
        text, self.runs_read = read_new(self.run.job_runs, self.runs_read, whole_lines=True)
        for line in text.splitlines():
            words = line.split()
            job = self.by_id.get(words[1]) if len(words) >= 5 else None
            if job is None:
                continue
            attempt = int(words[2])
            if words[0] == "end":
                if len(words) > 5 and words[5] != "0":
                    self.failed_attempts[job.id] = self.failed_attempts.get(job.id, 0) + 1
                continue
            if self.ending:
                continue
            if attempt < len(job.alerts):
                self._job_alert(job, attempt, expand_hostlist(words[3]))
            if job.kind == "cancelled" and attempt == 0:
                self.at(time.time() + self.job_rng.uniform(*CANCEL_AFTER), f"cancel job {job.id}",
                        lambda job=job: self._cancel(job, 1))

    def _job_alert(self, job: SoakJob, attempt: int, nodes: list[str]) -> None:
        free = [n for n in nodes if n not in self.active and n not in self.run.roles]
        if not free:
            job.notes.append(f"attempt {attempt}: no node of {','.join(nodes)} free of another episode: no alert")
            return
        episode = job_fault(self.job_rng, self._number(), self.job_rng.choice(free), job.alerts[attempt], job.id)
        job.notes.append(f"attempt {attempt}: episode {episode.id}, {episode.alertname} on {episode.node}")
        self._start(episode)

    def _cancel(self, job: SoakJob, tries: int) -> None:
        """A person's scancel, straight to Slurm; tried again while slurmctld does not answer."""
        done = self.cluster.run(_tool("scancel"), job.id, timeout=10)
        if done.returncode == 0:
            self.run.job_people.append((time.time(), job.id, "cancel"))
            self.say(f"a person: scancel {job.id}")
        elif tries < 40 and not self.ending:
            self.at(time.time() + 2, f"cancel job {job.id} again", lambda: self._cancel(job, tries + 1))

    def _observe_jobs(self, now: float) -> None:
        """Every soak job as `scontrol -o show job` shows it, each change kept (run.job_seen); a person releases
        a hopeless job's chain RELEASE_DELAY after seeing it held by the service (once a job)."""
        if self.controller_down:
            return
        out = self.cluster.scontrol("-o", "show", "job", timeout=5)
        if out.returncode != 0:
            return
        seen_at = time.time()
        for line in out.stdout.splitlines():
            if not line.startswith("JobId="):
                continue
            info = parse(line)
            job_id = info.get("JobId", "")
            if job_id not in self.by_id:
                continue
            try:
                restarts = int(info.get("Restarts", "0"))
            except ValueError:
                restarts = -1
            row = (seen_at, info.get("JobState", ""), info.get("Reason", ""), restarts, info.get("NodeList", ""),
                   info.get("ExcNodeList", ""), info.get("AdminComment", ""))
            timeline = self.run.job_seen.setdefault(job_id, [])
            if not timeline or timeline[-1][1:] != row[1:]:
                timeline.append(row)
            self.job_states[job_id] = row[1]
            self._maybe_release(self.by_id[job_id], row, now)

    def _maybe_release(self, job: SoakJob, row: tuple[float, str, str, int, str, str, str], now: float) -> None:
        _, state, reason, _, _, _, comment = row
        held = (state == "PENDING" and reason == "job_requeued_in_held_state" and comment.startswith("gpunode: held")
                and self.failed_attempts.get(job.id, 0) >= MAX_ATTEMPTS)
        if not (job.release and held and job.id not in self.released and not self.ending):
            self.release_seen.pop(job.id, None)
            return
        if now - self.release_seen.setdefault(job.id, now) < RELEASE_DELAY:
            return
        done = self.cluster.scontrol("release", job.id, timeout=10)
        self.say(f"a person: scontrol release {job.id} (its chain held: {comment[:80]}): exit {done.returncode}")
        if done.returncode == 0:
            self.released.add(job.id)
            self.run.job_people.append((time.time(), job.id, "release"))

    # The scripted parts

