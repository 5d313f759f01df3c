"""Following a ps job on Kubernetes until it ends: its pods' output, and how it ended.

Once a second the launcher lists the job's Jobs and pods (``kubectl get jobs,pods -l
ps-job=<n> -o json``). A poll, not ``--watch``: every answer is the whole state, so nothing
is lost when a watch connection drops (API servers close them every few minutes) and there
is no stream of JSON documents to split; one list a second is little load for a job's pods.
Every new pod, replacements included, gets a ``kubectl logs -f`` of its own, whose lines are
printed as ``[worker 1] ...`` like the other launchers' (``kubectl logs -f -l`` would never
pick up a replacement pod).

The end: every role's Job ``Complete`` (the workers' first; the scheduler and servers exit 0
once every worker closed its store) -> 0. A Job ``Failed`` (BackoffLimitExceeded,
FailedIndexes, PodFailurePolicy, ...) -> its reason and message and the failed pods'
termination messages, the job deleted, the last failed pod's exit status. A stop
(SIGINT/SIGTERM), ``--timeout``, or a cluster that stops answering -> the job deleted.
"""
from __future__ import annotations

import logging
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from .kubectl import DELETE_WAIT, Kubectl, KubectlError
from .kubernetes import INDEX_ANNOTATION, JOB_LABEL, ROLE_LABEL, KubeJob
from .output import Output
from .process import StopSignal, start_group, stop_group

logger = logging.getLogger(__name__)

POLL = 1.0            # seconds between two looks at the job
LOST_AFTER = 60.0     # seconds of failed looks before the launcher gives up on the cluster
END_GRACE = 60.0      # seconds the scheduler and servers get to complete after the workers did
LOG_DRAIN = 10.0      # seconds the log followers get to print what is left at the end
MESSAGE_LINES = 20    # lines of a failed pod's termination message shown
STARTING = ("ContainerCreating", "PodInitializing")   # waiting reasons not worth a line


@dataclass(frozen=True)
class Pod:
    """What the launcher reads of one pod."""

    uid: str
    name: str
    role: str
    index: str
    phase: str
    exit_code: int | None = None
    reason: str = ""              # of the termination: Error, OOMKilled, Completed...
    message: str = ""             # the termination message (the log's end: FallbackToLogsOnError)
    finished: str = ""            # RFC 3339, sorts as text
    waiting: str = ""             # why it does not run yet, when that is worth saying
    disrupted: bool = False       # evicted or preempted (DisruptionTarget): not counted

    @property
    def label(self) -> str:
        """The output prefix: ``worker 1`` (its rank), or ``scheduler`` as the other launchers show it."""
        return self.role if self.role == "scheduler" else f"{self.role} {self.index}"

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Pod:
        meta, status = obj.get("metadata") or {}, obj.get("status") or {}
        container = (status.get("containerStatuses") or [{}])[0]
        state = container.get("state") or {}
        ended = state.get("terminated") or {}
        conditions = status.get("conditions") or []
        waiting = ""
        if (state.get("waiting") or {}).get("reason") not in (None, *STARTING):
            waiting = f"waiting: {state['waiting']['reason']}: {state['waiting'].get('message', '')}".rstrip(": ")
        unscheduled = [c for c in conditions if c.get("type") == "PodScheduled" and c.get("status") == "False"]
        if unscheduled and not waiting:
            waiting = f"not scheduled: {unscheduled[0].get('reason', '')}: {unscheduled[0].get('message', '')}"
        return cls(uid=meta.get("uid", meta.get("name", "")), name=meta.get("name", "?"),
                   role=(meta.get("labels") or {}).get(ROLE_LABEL, "?"),
                   index=(meta.get("annotations") or {}).get(INDEX_ANNOTATION, "?"),
                   phase=status.get("phase", "Pending"), exit_code=ended.get("exitCode"),
                   reason=ended.get("reason", ""), message=ended.get("message", ""),
                   finished=ended.get("finishedAt", ""), waiting=waiting,
                   disrupted=any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                                 for c in conditions))

    def ending(self) -> str:
        how = f"exit {self.exit_code}" if self.exit_code is not None else "failed"
        how += f" ({self.reason})" if self.reason else ""
        return how + (" after an eviction or preemption: not counted" if self.disrupted else "")


def condition(job: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The Job's condition ``kind`` (Complete, Failed) if it holds."""
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


class LogFollowers:
    """One ``kubectl logs -f`` per pod instance, its lines prefixed with the pod's role and rank."""

    def __init__(self, kc: Kubectl, output: Output):
        self.kc, self.output = kc, output
        self.procs: dict[str, subprocess.Popen] = {}
        self.threads: list[threading.Thread] = []

    def __contains__(self, uid: str) -> bool:
        return uid in self.procs

    def add(self, pod: Pod) -> None:
        proc = start_group(self.kc.argv("logs", "-f", pod.name), self.kc.env, tied=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs[pod.uid] = proc
        for stream, err in ((proc.stdout, False), (proc.stderr, True)):
            t = threading.Thread(target=self._pump, args=(stream, pod, err), daemon=True,
                                 name=f"ps-launch-log[{pod.name}]")
            t.start()
            self.threads.append(t)

    def _pump(self, stream: IO[bytes], pod: Pod, err: bool) -> None:
        with stream:
            for raw in iter(stream.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\n")
                if err:
                    logger.warning("kubectl logs %s: %s", pod.name, text)
                else:
                    self.output.line(pod.label, text)

    def close(self, drain: float) -> None:
        """Let the followers print what is left for up to ``drain`` seconds, then stop them
        (idempotent: a closed follower is forgotten)."""
        procs, threads, self.procs, self.threads = list(self.procs.values()), self.threads, {}, []
        end = time.monotonic() + drain
        open_ = [p for p in procs if p.poll() is None]
        while open_ and time.monotonic() < end:
            time.sleep(0.1)
            open_ = [p for p in open_ if p.poll() is None]
        if open_ and drain:
            logger.info("stopped following %d pod log(s) still open after %gs", len(open_), drain)
        for proc in procs:
            stop_group(proc, grace=1.0)
        for t in threads:
            t.join(2.0)


class Watch:
    """What the launcher has seen and said of the job's pods."""

    def __init__(self, followers: LogFollowers):
        self.followers = followers
        self.seen: dict[str, Pod] = {}
        self.instances: dict[str, list[str]] = {}   # "worker 1" -> its pods' names, in order
        self.said: dict[str, str] = {}              # uid -> the last waiting note or ending said

    def update(self, pods: list[Pod]) -> None:
        for pod in pods:
            if pod.uid not in self.seen:
                earlier = self.instances.setdefault(pod.label, [])
                if earlier:
                    logger.info("%s: pod %s replaces %s (replacement %d)", pod.label, pod.name, earlier[-1],
                                len(earlier))
                earlier.append(pod.name)
            self.seen[pod.uid] = pod
            note = pod.ending() if pod.phase == "Failed" else pod.waiting
            if note and self.said.get(pod.uid) != note:
                self.said[pod.uid] = note
                logger.warning("%s: pod %s %s", pod.label, pod.name, note)
            if pod.phase in ("Running", "Succeeded", "Failed") and pod.uid not in self.followers:
                self.followers.add(pod)


def follow(kc: Kubectl, job: KubeJob, output: Output, stop: StopSignal, timeout: float | None) -> int:
    """Print the job's output until it ends; its exit status (docs/kubernetes.md)."""
    followers = LogFollowers(kc, output)
    watch = Watch(followers)
    started = time.monotonic()
    lost_since = complete_since = None
    missing = 0
    names = [f"{job.name}-{r.name}" for r in job.roles]
    try:
        while True:
            now = time.monotonic()
            if stop.is_set():
                logger.warning("stopping (signal %d): deleting the job", stop.signum)
                return _delete(kc, job, followers, stop.code)
            if timeout is not None and now - started > timeout:
                logger.error("--timeout %gs reached: deleting the job", timeout)
                return _delete(kc, job, followers, 124)
            try:
                items = kc.json("get", "jobs,pods", "-l", f"{JOB_LABEL}={job.name}", "--request-timeout=20s")["items"]
                lost_since = None
            except (KubectlError, KeyError, TypeError) as exc:
                if lost_since is None:
                    lost_since = now
                    logger.warning("%s (trying again for up to %gs)", exc, LOST_AFTER)
                elif now - lost_since > LOST_AFTER:
                    logger.error("the cluster has not answered for %gs: %s; the job may still run (`%s`)",
                                 LOST_AFTER, exc, kc.shown("get", "jobs,pods", "-l", f"{JOB_LABEL}={job.name}"))
                    return 1
                _sleep(stop, POLL)
                continue
            jobs = {o["metadata"]["name"]: o for o in items if o.get("kind") == "Job"}
            watch.update([Pod.of(o) for o in items if o.get("kind") == "Pod"])
            missing = 0 if job.root in jobs else missing + 1
            if missing >= 3:
                logger.error("job/%s is gone (deleted by someone else?): the job is over", job.root)
                followers.close(LOG_DRAIN)
                return 1
            workers_done = condition(jobs.get(f"{job.name}-worker"), "Complete") is not None
            failed = [(n, c) for n in names if (c := condition(jobs.get(n), "Failed"))]
            if failed and not workers_done:
                return _failed(kc, job, failed[0], watch, followers)
            if workers_done:
                pending = [n for n in names if condition(jobs.get(n), "Complete") is None]
                if not pending:
                    followers.close(LOG_DRAIN)
                    logger.info("job %s complete", job.name)
                    return 0
                complete_since = complete_since or now
                if now - complete_since > END_GRACE:
                    logger.warning("the workers completed but %s did not within %gs: the job's work is done; "
                                   "deleting the job", ", ".join(pending), END_GRACE)
                    return _delete(kc, job, followers, 0)
            _sleep(stop, POLL)
    finally:
        followers.close(0)


def _sleep(stop: StopSignal, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not stop.is_set() and time.monotonic() < end:
        time.sleep(0.05)


def _delete(kc: Kubectl, job: KubeJob, followers: LogFollowers, code: int) -> int:
    logger.warning("`%s` (waiting up to %ds for its pods to go)",
                   kc.shown("delete", "job", job.root, "--cascade=foreground"), DELETE_WAIT)
    try:
        kc.delete_job(job.root)
        logger.info("job %s deleted", job.name)
    except KubectlError as exc:
        logger.error("%s; see what is left with `%s`", exc,
                     kc.shown("get", "jobs,pods", "-l", f"{JOB_LABEL}={job.name}"))
    followers.close(2.0)
    return code


def _failed(kc: Kubectl, job: KubeJob, failed: tuple[str, dict[str, Any]], watch: Watch,
            followers: LogFollowers) -> int:
    """Say why the Job failed and how its pods ended, delete the job; the last failure's status."""
    name, cond = failed
    followers.close(LOG_DRAIN)          # their last lines first, then the verdict
    role = name.rsplit("-", 1)[1]
    pods = sorted((p for p in watch.seen.values() if p.role == role and p.phase == "Failed"), key=lambda p: p.finished)
    logger.error("job/%s failed: %s: %s", name, cond.get("reason", "?"), cond.get("message", ""))
    for pod in pods:
        logger.error("%s: pod %s %s", pod.label, pod.name, pod.ending())
        for line in pod.message.strip().splitlines()[-MESSAGE_LINES:]:
            logger.error("%s:   %s", pod.label, line)
    code = next((p.exit_code for p in reversed(pods) if p.exit_code), 1)
    return _delete(kc, job, followers, code)
