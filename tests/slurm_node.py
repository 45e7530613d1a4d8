"""A real single-node SLURM for the deploy tests: Debian's slurmctld, slurmd and munge,
installed with apt when missing, started here and stopped by pid afterwards.

Facts of this kind of machine that the setup follows: munged refuses to run as root
(started with runuser as munge); the node is `hostname -s` at 127.0.0.1 with no more
RealMemory than `slurmd -C` reports; no cgroups (proctrack/linuxproc, task/none,
jobacct_gather/none); apt starts no services.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

from debian_packages import Unavailable, apt_install  # noqa: F401  (Unavailable: raised to the tests)

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def install():
    if all(shutil.which(p) for p in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    apt_install(PACKAGES, "SLURM")


def _free_ports(k):
    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _node_line():
    """NodeName=... with the CPUs and (no more) memory that slurmd detects."""
    out = _run(["slurmd", "-C"], timeout=60).stdout.split("\n")[0]
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    name = socket.gethostname().split(".")[0]
    memory = min(int(fields.get("RealMemory", 4096)), 16384)
    return (f"NodeName={name} NodeAddr=127.0.0.1 CPUs={fields.get('CPUs', os.cpu_count())} "
            f"RealMemory={memory} State=UNKNOWN")


class SlurmNode:
    """slurmctld + slurmd (+ munged if none runs) with their files under ``root``."""

    def __init__(self, root: pathlib.Path):
        self.root = pathlib.Path(root)
        self.conf = self.root / "slurm.conf"
        self.pidfiles = []
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def _munge(self):
        if _run(["munge", "-n"], timeout=30).returncode == 0:
            return                                   # a munged already runs
        key = pathlib.Path("/etc/munge/munge.key")
        if not key.exists():
            _run(["runuser", "-u", "munge", "--", "mungekey", "--create"], timeout=60)
        run_dir = pathlib.Path("/run/munge")
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        res = _run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], timeout=60)
        if res.returncode != 0:
            raise Unavailable(f"munged did not start: {res.stderr[-500:]}")
        self.pidfiles.append(run_dir / "munged.pid")

    def start(self):
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._munge()
        ctld_port, d_port = _free_ports(2)
        host = socket.gethostname().split(".")[0]
        r = self.root
        self.conf.write_text("\n".join([
            "ClusterName=dnomadtest",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
            f"SlurmctldPort={ctld_port}", f"SlurmdPort={d_port}",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log", f"SlurmdLogFile={r}/log/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "MailProg=/bin/true",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory", "ReturnToService=2",
            _node_line(),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            ""]))
        for daemon in ("slurmctld", "slurmd"):
            res = _run([daemon], env=self.env, timeout=60)
            if res.returncode != 0:
                raise Unavailable(f"{daemon} did not start: {res.stderr[-500:]}")
            self.pidfiles.append(r / f"{daemon}.pid")
        deadline = time.time() + 60
        while time.time() < deadline:
            state = _run(["sinfo", "-h", "-o", "%T"], env=self.env, timeout=30).stdout.strip()
            if state == "idle":
                return self
            time.sleep(0.5)
        raise Unavailable(f"the node did not become idle (state {state!r}); "
                          f"{(r / 'log' / 'slurmctld.log').read_text()[-1000:]}")

    def stop(self):
        for pidfile in reversed(self.pidfiles):
            try:
                pid = int(pidfile.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
            except (OSError, ValueError):
                continue
            for _ in range(100):
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.1)

    def log_tail(self):
        return "\n".join((self.root / "log" / f).read_text()[-2000:]
                         for f in ("slurmctld.log", "slurmd.log") if (self.root / "log" / f).exists())
