"""A one-host Slurm cluster for the tests: munged, slurmctld and slurmd (Debian's slurm-wlm and munge) started in a
temp dir from a generated slurm.conf on 127.0.0.1 and free ports, and stopped (by their pid files) at the end.

What runs in this sandbox (and any container without systemd or a writable cgroup tree): proctrack/linuxproc
(a job's processes by parent pid), task/none, no cgroup plugin, no accounting daemon (a finished task's state and
exit code are read from slurmctld, which keeps them MinJobAge s), the node's CPUs declared larger than the
machine's (SlurmdParameters=config_overrides) so every task of a small array runs at once on a 2-core VM."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port, wait_for

CONF = """\
ClusterName=tunertest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={dir}/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SwitchType=switch/none
KillWait=30
MinJobAge=3600
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=tuner Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def available() -> str | None:
    """Why a cluster cannot be started here (None: it can)."""
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(b) is None
               and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/test.sh installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their user: the tests start it as root"
    return None


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]  # SLURM_CONF for the client commands

    def run(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {r.returncode} {r.stderr}\n{self.logs()}")
        return r.stdout

    def tasks(self, job: str) -> dict[int, dict[str, str]]:
        """The array's tasks as slurmctld keeps them: task id -> JobState, ExitCode, ..."""
        out = self.run("scontrol", "show", "job", "-o", job, check=False)
        tasks = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("ArrayTaskId", "").isdigit():
                tasks[int(fields["ArrayTaskId"])] = fields
        return tasks

    def queued(self, job: str) -> list[str]:
        return self.run("squeue", "-h", "-j", job, "-o", "%i %T", check=False).split("\n")[:-1]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.dir.glob("*.log")))


def start(d: Path) -> tuple[Cluster, list[Path]]:
    """(the cluster, the pid files of what was started) once slurmd's node is idle."""
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    conf = d / "slurm.conf"
    conf.write_text(CONF.format(host=host, dir=d, ctld_port=free_port(), d_port=free_port()))
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pids = [d / "munged.pid", d / "slurmctld.pid", d / "slurmd.pid"]
    subprocess.run([_bin("munged"), "--force", f"--key-file={key}", f"--socket={d}/munge.socket",
                    f"--pid-file={pids[0]}", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"],
                   check=True, capture_output=True, env=env)
    subprocess.run([_bin("slurmctld"), "-f", str(conf)], check=True, capture_output=True, env=env)
    subprocess.run([_bin("slurmd"), "-f", str(conf), "-N", host], check=True, capture_output=True, env=env)
    cluster = Cluster(d, env)
    wait_for(lambda: cluster.run("sinfo", "-h", "-o", "%t", check=False).strip() == "idle", timeout=120, every=0.5)
    return cluster, pids


def stop(pids: list[Path]) -> None:
    """The daemons this module started, by their pid files, slurmd first."""
    for p in reversed(pids):
        try:
            pid = int(p.read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        end = time.monotonic() + 30
        while time.monotonic() < end and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.1)


def processes_of(job: str) -> list[int]:
    """Pids of processes still running for this job (read from their environment)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_ARRAY_JOB_ID={job}".encode() in env or f"SLURM_JOB_ID={job}".encode() in env:
            pids.append(int(proc.name))
    return pids
