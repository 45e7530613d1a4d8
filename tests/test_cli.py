"""The command line, the README's demo and the examples, run for real."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import dnomad
from dnomad.data import gaussian_blobs
from stores import unfinish

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dnomad.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=600, check=True)


@pytest.mark.parametrize("cluster", [False, True])
def test_demo_writes_store_and_png_and_says_what_it_does(tmp_path, cluster):
    """The README's first command (in this process) and the same job on an embedded
    LocalCluster (--cluster): it says what it runs before it runs it, shows its
    progress, keeps distributed's INFO chatter out of the terminal, and writes Q, the
    history and the PNG."""
    out = run("demo", "--output", str(tmp_path), "--n-samples", "160", "--n-clusters", "2",
              *(["--cluster"] if cluster else []))
    first = out.stdout.splitlines()[0]
    assert first.startswith("dnomad demo: NOMAD") and ("LocalCluster" in first) == cluster
    assert "ARI vs the rings 1.000" in out.stdout
    assert "NOMAD (conditional gradient): it 1 " in out.stderr
    assert "NOMAD (conditional gradient): stopped (tolerance) after" in out.stderr
    assert "distributed." not in out.stderr, out.stderr
    assert (tmp_path / "nomad_demo.png").stat().st_size > 10_000
    Q = dnomad.blocks.from_zarr(str(tmp_path / "nomad.zarr"), "result/Q")
    np.testing.assert_allclose(np.asarray(Q).sum(axis=1), 1, atol=1e-4)
    info = json.loads(run("info", "--json", str(tmp_path / "nomad.zarr")).stdout)
    assert info["run"]["method"] == "nomad" and info["result"]["stop_reason"] == "tolerance"
    assert info["run"]["estimator_params"]["backend"] == ("distributed" if cluster else "local")


def test_quiet_and_verbose_and_version(tmp_path):
    """-q: the summary only; -v (before or after the command): a line per iteration and
    distributed's INFO lines let in; --version."""
    quiet = run("demo", "-q", "--output", str(tmp_path / "q"), "--n-samples", "120")
    assert quiet.stderr == "" and "ARI vs the rings" in quiet.stdout
    loud = run("-v", "demo", "--output", str(tmp_path / "v"), "--n-samples", "120", "--cluster")
    iterations = json.loads(run("info", "--json", str(tmp_path / "v" / "nomad.zarr")).stdout)["result"]["n_iter"]
    assert loud.stderr.count("NOMAD (conditional gradient): it ") == iterations
    assert "distributed.scheduler" in loud.stderr
    assert run("--version").stdout.strip() == f"dnomad {dnomad.__version__}"


def test_fit_then_resume(tmp_path):
    X, _ = gaussian_blobs(60, n_centers=3)
    np.save(tmp_path / "X.npy", X)
    store = str(tmp_path / "run.zarr")
    run("fit", "--input", str(tmp_path / "X.npy"), "--n-clusters", "3", "--store", store,
        "--params", json.dumps({"max_iter": 500}))
    out = run("resume", store)
    assert "finished on" in out.stdout and "nothing to resume" in out.stdout
    unfinish(store)                         # as a crash after the last checkpoint leaves it
    out = run("resume", store)
    assert "resumed" in out.stdout
    info = json.loads(run("info", "--json", store).stdout)
    assert info["run"]["estimator_params"]["dtype"] == "float32"
    assert info["result"]["stop_reason"] == "tolerance" and info["status"] == "finished"
    history = dnomad.blocks.store.read_table(store, "result/history")
    assert history == info["history"] and len(history) == info["result"]["n_iter"]
    assert [r["iteration"] for r in history] == list(range(1, len(history) + 1))
    text = run("info", store, "--history", "3").stdout
    assert f"{len(history)} rows, the last 3:" in text
    header, *rows = text.splitlines()[-4:]
    assert header.split()[:2] == ["iteration", "objective"]
    assert [int(r.split()[0]) for r in rows] == [r["iteration"] for r in history[-3:]]


def test_fit_symnmf_from_the_command_line(tmp_path):
    X, _ = gaussian_blobs(80, n_centers=3, separation=6.0)
    np.save(tmp_path / "X.npy", X)
    store = str(tmp_path / "run.zarr")
    out = run("fit", "--method", "symnmf", "--input", str(tmp_path / "X.npy"), "--n-clusters", "3",
              "--store", store, "--params", json.dumps({"bandwidth": 4.0, "tol": 1e-3}))
    assert "symnmf:" in out.stdout
    info = json.loads(run("info", "--json", store).stdout)
    assert info["run"]["method"] == "symnmf" and info["result"]["stop_reason"] == "tolerance"
    W = dnomad.blocks.store.read_vector(store, "result/W")
    np.testing.assert_allclose(W.sum(axis=1), 1, atol=1e-12)


def test_fit_hottopixx_from_the_command_line(tmp_path):
    from dnomad.data import separable_nmf

    inst = separable_nmf(30, 300, 3, random_state=0)
    np.save(tmp_path / "X.npy", inst["X"])
    store = str(tmp_path / "run.zarr")
    out = run("fit", "--method", "hottopixx", "--input", str(tmp_path / "X.npy"), "--rank", "3",
              "--store", store, "--params", json.dumps({"random_state": 0}))
    assert "hottopixx: 50 epochs" in out.stdout, out.stderr
    info = json.loads(run("info", "--json", store).stdout)
    assert info["run"]["method"] == "hottopixx" and info["result"]["n_epochs"] == 50
    hott = dnomad.blocks.store.read_vector(store, "result/hott_rows")
    assert sorted(inst["copies"][hott]) == [0, 1, 2]


def test_examples_run():
    for script in sorted((ROOT / "examples").glob("*.py")):
        res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                             env=dict(os.environ))
        assert res.returncode == 0, (script.name, res.stderr[-2000:])


def test_fit_from_a_config_file_with_flags_overriding_it(tmp_path):
    X, _ = gaussian_blobs(60, n_centers=3, separation=6.0)
    np.save(tmp_path / "X.npy", X)
    store = tmp_path / "run.zarr"
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'input = "{tmp_path / "X.npy"}"\nmethod = "symnmf"\nn_clusters = 3\n'
                   f'store = "{tmp_path / "other.zarr"}"\n[params]\nbandwidth = 4.0\ntol = 1e-3\n')
    out = run("fit", "--config", str(cfg), "--store", str(store))
    assert "symnmf:" in out.stdout, out.stderr
    info = json.loads(run("info", "--json", str(store)).stdout)
    assert info["run"]["method"] == "symnmf"
    assert info["run"]["estimator_params"]["bandwidth"] == 4.0
    assert not (tmp_path / "other.zarr").exists()       # the flag won over the file


def test_config_file_typos_and_missing_settings_are_refused(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("input: X.npy\nn_cluster: 3\nstore: s.zarr\n")

    def fails(*args):
        res = subprocess.run([sys.executable, "-m", "dnomad.cli", *args], capture_output=True, text=True,
                             timeout=120)
        assert res.returncode != 0
        return res.stderr

    assert "unknown keys ['n_cluster']" in fails("fit", "--config", str(cfg))
    assert "missing --n-clusters, --store" in fails("fit", "--input", "X.npy")


def test_tls_cluster_refuses_a_client_without_certificates(tmp_path):
    """A TLS-only LocalCluster from [security] in the config: a fit runs through it; a client
    without the certificates is refused."""
    from distributed.security import Security

    from dnomad.cli import _connect, _security

    temp = Security.temporary()             # self-signed CA and certificate (in memory)
    files = {}
    for key, pem in (("tls_ca_file", temp.tls_ca_file), ("tls_client_cert", temp.tls_client_cert),
                     ("tls_client_key", temp.tls_client_key)):
        files[key] = str(tmp_path / f"{key}.pem")
        with open(files[key], "w") as fh:
            fh.write(pem)
    security = _security(files)
    client, cluster = _connect(local=True, n_workers=1, security=security)
    try:
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        X, y = gaussian_blobs(60, n_centers=3, separation=6.0)
        est = dnomad.SymNMF(3, bandwidth=4.0, tol=1e-3, backend="distributed", random_state=0).fit(X)
        assert est.backend_used_ == "distributed"
        assert dnomad.metrics.adjusted_rand_score(y, est.labels_) > 0.9
        # Clients without the certificates, each in a process of its own: a failed
        # Client left to the garbage collector can deadlock the next one's event-loop
        # start in this process (seen once: Client.__del__ inside LoopRunner.start).
        for target in (address, address.replace("tls://", "tcp://")):
            res = subprocess.run([sys.executable, "-c", "import sys; from distributed import Client; "
                                  "Client(sys.argv[1], timeout='3s')", target],
                                 capture_output=True, text=True, timeout=120)
            assert res.returncode != 0, f"a client without certificates reached {target}"
            assert "Error" in res.stderr
    finally:
        client.close()
        cluster.close()


def test_device_flag_reaches_nomad_and_is_refused_elsewhere(tmp_path):
    """--device (or device: in the config) goes to NOMAD and into the run's record; another
    method, or "cuda" where CuPy or a GPU is missing, is refused with the reason."""
    from dnomad.blocks.device import cuda_available

    X, _ = gaussian_blobs(40, n_centers=2)
    np.save(tmp_path / "X.npy", X)
    base = ("fit", "--input", str(tmp_path / "X.npy"), "--n-clusters", "2")
    run(*base, "--store", str(tmp_path / "a.zarr"), "--device", "cpu", "--params", '{"max_iter": 300}')
    info = json.loads(run("info", "--json", str(tmp_path / "a.zarr")).stdout)
    assert info["run"]["estimator_params"]["device"] == "cpu"

    def fails(*args):
        res = subprocess.run([sys.executable, "-m", "dnomad.cli", *args], capture_output=True, text=True,
                             timeout=120)
        assert res.returncode != 0
        return res.stderr

    assert "--device (or device in --config) does not apply to --method symnmf" in fails(*base, "--store", str(tmp_path / "b.zarr"), "--method", "symnmf",
                                          "--device", "cuda")
    if not cuda_available():
        assert "asks for 'cuda', but" in fails(*base, "--store", str(tmp_path / "c.zarr"), "--device", "cuda")
        assert not (tmp_path / "c.zarr").exists()          # refused before the store was written
