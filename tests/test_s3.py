"""Object stores: input and run store as s3:// URLs against a local S3 server (moto's
server mode on loopback), credentials from the environment as users pass them; none
may end up in the store or in the logs."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dnomad
from dnomad.data import two_rings
from stores import moto_s3_server

KEY_ID = "AKIADNOMADTESTKEY42"
SECRET = "dnomad-test-secret-Zx9Qw7Lp3"
BUCKET = "dnomad-runs"


@pytest.fixture(scope="module")
def s3_env():
    """A moto S3 server on a free loopback port, and the environment that reaches it."""
    yield from moto_s3_server(KEY_ID, SECRET)


@pytest.fixture
def s3(s3_env, monkeypatch):
    import s3fs

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


def test_fit_reads_and_writes_s3_on_a_cluster_without_leaking_credentials(s3, s3_env, tmp_path):
    X = two_rings(200)[0]
    with s3.open(f"{BUCKET}/data/rings.npy", "wb") as f:
        np.save(f, X)
    store = f"s3://{BUCKET}/runs/rings.zarr"
    params = {"sdp_k": 6, "max_iter": 3, "block_size": 100, "checkpoint_every": 2, "rmse_tol": 0, "min_tol": 0,
              "objective_tol": 0}
    env = dict(os.environ, **s3_env)
    fit = subprocess.run(
        [sys.executable, "-m", "dnomad.cli", "-v", "fit", "--input", f"s3://{BUCKET}/data/rings.npy",
         "--n-clusters", "6", "--dtype", "float64", "--backend", "zarr", "--local-workers", "2",
         "--store", store, "--params", json.dumps(params)],
        capture_output=True, text=True, timeout=600, env=env)
    assert fit.returncode == 0, fit.stderr[-3000:]
    info = subprocess.run([sys.executable, "-m", "dnomad.cli", "info", store], capture_output=True,
                          text=True, timeout=120, env=env)
    assert info.returncode == 0 and "status      finished" in info.stdout, info.stderr[-2000:]

    # The workers kept the state in the S3 store (zarr backend) and wrote the result there.
    assert s3.exists(f"{BUCKET}/runs/rings.zarr/state/P/zarr.json")
    Q = np.asarray(dnomad.blocks.from_zarr(store, "result/Q"))
    with pytest.warns(dnomad.ConvergenceWarning):
        ref = dnomad.NOMAD(n_clusters=6, dtype=np.float64, **params).fit(X)
    np.testing.assert_allclose(Q, np.asarray(ref.Q_), rtol=0, atol=1e-10)

    # No credential in any object of the bucket, nor in what the commands printed.
    objects = [p for p in s3.find(BUCKET)]
    assert len(objects) > 20
    for path in objects:
        body = s3.cat_file(path)
        assert KEY_ID.encode() not in body and SECRET.encode() not in body, path
    for text in (fit.stdout, fit.stderr, info.stdout, info.stderr):
        assert KEY_ID not in text and SECRET not in text


def test_credentials_in_a_url_are_not_written_to_the_store(tmp_path):
    from dnomad.blocks import store as run_store

    store = str(tmp_path / "run.zarr")
    run_store.check_store(store, "r")
    run_store.write_json(store, "x", {"input": {"url": f"s3://{KEY_ID}:{SECRET}@bucket/X.zarr"},
                                      "list": [f"https://user:{SECRET}@host.example/a"]})
    text = (tmp_path / "run.zarr" / "zarr.json").read_text()
    assert SECRET not in text and KEY_ID not in text
    assert run_store.read_json(store, "x") == {"input": {"url": "s3://bucket/X.zarr"},
                                               "list": ["https://host.example/a"]}
