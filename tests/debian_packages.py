"""Debian packages that tests need (SLURM daemons, data sets), installed with apt-get
when missing: CI's machine starts without them and the project's own files must
install what its tests use."""
from __future__ import annotations

import os
import shutil
import subprocess


class Unavailable(Exception):
    """The packages cannot be had here (the reason is the message)."""


def apt_install(packages, what):
    """``apt-get install`` ``packages`` (retrying after ``apt-get update``); raises
    Unavailable naming ``what`` when that cannot be done here."""
    if os.geteuid() != 0:
        raise Unavailable(f"installing {what} needs root (apt-get)")
    if shutil.which("apt-get") is None:
        raise Unavailable(f"no apt-get to install {what} with")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]

    def run(c):
        return subprocess.run(c, capture_output=True, text=True, env=env, timeout=900)

    res = run(cmd)
    if res.returncode != 0:
        run(["apt-get", "update", "-q"])
        res = run(cmd)
    if res.returncode != 0:
        raise Unavailable(f"apt-get install {' '.join(packages)} failed: {res.stderr[-500:]}")
