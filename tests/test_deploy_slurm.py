"""deploy/slurm on a real single-node SLURM: the README's commands, run as written.

The batch-job path (dnomad.sbatch: scheduler, srun workers and `dnomad fit` in one
allocation) and the SLURMCluster path (dask-jobqueue, client here) each run NOMAD and
must give the Q of a LocalCluster run of the same configuration.
"""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from slurm_node import SlurmNode, Unavailable, install

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "deploy" / "slurm" / "README.md"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        install()
        node = SlurmNode(tmp_path_factory.mktemp("slurm")).start()
    except Unavailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no SLURM here: {exc}")
    yield node
    node.stop()


def readme_commands():
    """The commands of the README's end-to-end example (its ```bash block)."""
    text = README.read_text()
    block = re.search(r"## The example, end to end.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_example_runs_on_slurm_and_matches_a_local_cluster(slurm, tmp_path):
    import dnomad

    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    bindir = os.path.dirname(sys.executable)
    env = dict(slurm.env, PATH=f"{bindir}:{os.environ['PATH']}", DNOMAD_PYTHON=sys.executable)
    commands = readme_commands()
    assert any(c.startswith("sbatch ") for c in commands)
    assert any("--slurm-jobs" in c for c in commands)
    outputs = []
    for command in commands:
        res = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=600)
        job_out = "".join(p.read_text()[-3000:] for p in tmp_path.glob("dnomad-*.out"))
        logs = "".join(p.read_text()[-3000:] for p in tmp_path.glob("dnomad-*/*.log"))
        assert res.returncode == 0, (command, res.stdout[-2000:], res.stderr[-3000:], job_out, logs,
                                     slurm.log_tail())
        outputs.append(res.stdout)
    info = outputs[[i for i, c in enumerate(commands) if c.startswith("dnomad info")][0]]
    assert "status      finished" in info and "history     20 rows" in info

    stores = {name: tmp_path / f"{name}.zarr" for name in ("rings", "rings-jobqueue", "rings-local")}
    Q = {name: np.asarray(dnomad.blocks.from_zarr(str(s), "result/Q")) for name, s in stores.items()}
    assert Q["rings"].shape == (300, 300)
    np.testing.assert_allclose(Q["rings"].sum(axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(Q["rings"], Q["rings-local"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(Q["rings-jobqueue"], Q["rings-local"], rtol=0, atol=1e-10)
    # The runs really used SLURM's workers: the batch job ran scheduler + 2 srun tasks.
    workers_log = next(tmp_path.glob("dnomad-*/workers.log")).read_text()
    assert workers_log.count("Registered to:") == 2
    # dask-jobqueue writes its defaults into a DASK_CONFIG directory: never into deploy/.
    assert sorted(p.name for p in (ROOT / "deploy" / "slurm").iterdir()) == [
        "README.md", "dask.yaml", "dnomad.sbatch", "run.toml"]
    for name in ("rings", "rings-jobqueue", "rings-local"):
        meta = dnomad.blocks.store.read_json(str(stores[name]), "result")
        assert meta["n_iter"] == 20 and meta["passes"]["passes"] > 0


def test_cancelled_batch_job_resumes_in_a_new_allocation(slurm, tmp_path):
    """A job cancelled mid-run (scancel, as a preemption) keeps its last checkpoint;
    `sbatch dnomad.sbatch resume STORE` (README step 6) ends where an uninterrupted run
    ends."""
    import time

    import dnomad
    from dnomad.blocks import store as run_store
    from dnomad.data import two_rings

    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    X = two_rings(300)[0]
    np.save(tmp_path / "rings.npy", X)
    env = dict(slurm.env, PATH=f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               DNOMAD_PYTHON=sys.executable)
    size = ["--ntasks=2", "--cpus-per-task=1", "--mem-per-cpu=2G"]

    def sbatch(*args):
        return subprocess.run(["sbatch", *size, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)

    sub = sbatch("--parsable", "deploy/slurm/dnomad.sbatch", "fit", "--config", "deploy/slurm/run.toml",
                 "--store", "pre.zarr", "--params", '{"checkpoint_every": 2}')
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    store = str(tmp_path / "pre.zarr")
    checkpoints = run_store.Checkpoints(store, "nomad_checkpoint")
    deadline = time.time() + 300
    while time.time() < deadline:
        ck = run_store.read_json(store, "nomad_checkpoint") if os.path.exists(store) else None
        if ck is not None and ck["iteration"] >= 4:
            break
        time.sleep(0.05)
    subprocess.run(["scancel", job], env=env, check=True, timeout=60)
    while subprocess.run(["squeue", "-h", "-j", job], env=env, capture_output=True, text=True,
                         timeout=60).stdout.strip():
        time.sleep(0.2)
    cancelled_at = checkpoints.latest()["iteration"]
    assert 4 <= cancelled_at < 20, "the job finished before it could be cancelled"
    assert run_store.read_json(store, "result") is None

    res = sbatch("--wait", "deploy/slurm/dnomad.sbatch", "resume", "pre.zarr")
    job_out = "".join(p.read_text()[-3000:] for p in tmp_path.glob("dnomad-*.out"))
    assert res.returncode == 0, (res.stderr, job_out, slurm.log_tail())
    assert "resumed: 20 iterations" in job_out
    with pytest.warns(dnomad.ConvergenceWarning):
        ref = dnomad.NOMAD(n_clusters=2, sdp_k=8, dtype=np.float64, max_iter=20, block_size=100).fit(X)
    Q = np.asarray(dnomad.blocks.from_zarr(store, "result/Q"))
    np.testing.assert_allclose(Q, np.asarray(ref.Q_), rtol=0, atol=1e-10)
