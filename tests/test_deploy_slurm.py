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
