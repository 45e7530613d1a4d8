"""Credentials in URLs (issue 23, item 5): a password holding '@', ':' or '/' is removed
whole from the store's JSON attributes, from error messages and from what the command
line prints, including the errors of s3fs/botocore that quote the "bucket" string a URL
with a password in it turns into (s3fs does not read userinfo: it is part of the path).

Each test starts with an empty memory of seen secrets (dnomad.blocks.store._SECRETS), so
that a password is scrubbed only if the code under test itself redacted its URL."""
import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dnomad
from dnomad.blocks import store as run_store
from dnomad.cli import main
from stores import moto_s3_server

USER = "AKIAUSER7"
# Password shapes: '@', ':', '/' alone and combined, in every order; {0}, {1}, ... are
# fragments of 4 or more characters, made unique per test by _password.
SHAPES = ["{0}@{1}", "{0}:{1}", "{0}/{1}", "{0}@{1}/{2}", "{0}/{1}@{2}", "{0}:{1}@{2}/{3}",
          "{0}@{1}/{2}:{3}@{4}", "@{0}/:{1}@"]


def _password(shape, tag):
    return shape.format(*(f"{tag}{i}q{SHAPES.index(shape):02d}" for i in range(5)))


def _fragments(password):
    """The password and its pieces between '@', ':' and '/' longer than 2 characters."""
    return [password] + [p for p in re.split(r"[@:/]", password) if len(p) > 2]


def _assert_clean(text, password, where=""):
    for piece in _fragments(password):
        assert piece not in text, f"{piece!r} of the password in {where}: {text[-3000:]}"


@pytest.fixture(autouse=True)
def no_remembered_secrets(monkeypatch):
    monkeypatch.setattr(run_store, "_SECRETS", set())


def forget():
    run_store._SECRETS.clear()


@pytest.mark.parametrize("shape", SHAPES)
def test_redact_removes_the_whole_password_wherever_the_url_is_quoted(shape):
    pw = _password(shape, "Rd")
    url = f"s3://{USER}:{pw}@bucket/runs/run.zarr"
    for text, expected in [
            (url, "s3://bucket/runs/run.zarr"),
            (f"store {url!r} is not writable", "store 's3://bucket/runs/run.zarr' is not writable"),
            (json.dumps({"store": url}), '{"store": "s3://bucket/runs/run.zarr"}'),
            (f"a s3://x/y,{url} b", "a s3://x/y,s3://bucket/runs/run.zarr b"),
            (f"https://{USER}:{pw}@host.example:8443/a/b?c=d", "https://host.example:8443/a/b?c=d")]:
        forget()
        assert run_store.redact(text) == expected
    # A piece quoted outside any URL (botocore: 'Invalid bucket name "AKIAUSER7:pw..."'),
    # once the URL has been redacted, or when it is passed along.
    bucket = f"{USER}:{pw}@bucket/runs/run.zarr".split("/")[0]
    forget()
    message = f'Invalid bucket name "{bucket}": Bucket name must match ...'
    cleaned = run_store.redact(message, url)
    _assert_clean(cleaned, pw, "a botocore message")
    assert cleaned.startswith("Invalid bucket name ") and "Bucket name must match" in cleaned


def test_what_is_not_a_password_is_kept():
    cases = {"s3://bucket/model@v2.zarr": "s3://bucket/model@v2.zarr",              # '@' in a path
             "https://TOKEN123@github.com/org/repo@main": "https://github.com/org/repo@main",
             "tls://10.0.0.1:8786": "tls://10.0.0.1:8786",
             "/home/me/data@2024/X.npy": "/home/me/data@2024/X.npy",
             "redis://user:pwd@h:6379": "redis://h:6379"}
    for text, expected in cases.items():
        assert run_store.redact(text) == expected
    # A user name alone is not scrubbed from other text (it would garble paths): only
    # pieces holding some of the password are.
    assert run_store.redact("s3://admin:Xyz123@bucket/k /home/admin/k Xyz123") == \
        "s3://bucket/k /home/admin/k ***"


@pytest.mark.parametrize("shape", SHAPES)
def test_run_marker_and_cli_output_hold_no_password(shape, tmp_path, capsys):
    """A store URL with a password that fsspec can write to (memory://): the run marker
    and every other JSON attribute, and what `dnomad fit` and `dnomad info` print."""
    import zarr

    pw = _password(shape, "Mk")
    X = np.random.default_rng(0).normal(size=(24, 2))
    url = f"memory://{USER}:{pw}@bucket/api-{SHAPES.index(shape)}.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dnomad.ConvergenceWarning)
        dnomad.fit(X, n_clusters=2, sdp_k=2, store=url, max_iter=3, backend="local")
    forget()
    np.save(tmp_path / "X.npy", X)
    cli_url = f"memory://{USER}:{pw}@bucket/cli-{SHAPES.index(shape)}.zarr"
    assert main(["fit", "--input", str(tmp_path / "X.npy"), "--n-clusters", "2", "--store", cli_url,
                 "--backend", "local", "--params", '{"max_iter": 3}']) == 0
    forget()
    assert main(["info", "--json", cli_url]) == 0
    forget()
    assert main(["info", cli_url]) == 0
    out = capsys.readouterr()
    _assert_clean(out.out + out.err, pw, "the CLI's output")
    assert "memory://bucket/cli-" in out.out
    for store in (url, cli_url):
        attrs = json.dumps(dict(zarr.open_group(store=store, mode="r").attrs))
        assert '"dnomad_run"' in attrs and '"result"' in attrs
        _assert_clean(attrs, pw, "the store's attributes")


# -- s3 (a moto server on loopback, as tests/test_s3.py) ---------------------------------

@pytest.fixture(scope="module")
def s3_env():
    yield from moto_s3_server("AKIADNOMADREDACT1", "dnomad-redact-secret-9")


@pytest.fixture
def bucket(s3_env, monkeypatch):
    import s3fs

    for k, v in s3_env.items():
        monkeypatch.setenv(k, v)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if not fs.exists("dnomad-redact"):
        fs.mkdir("dnomad-redact")
        with fs.open("dnomad-redact/X.npy", "wb") as f:
            np.save(f, np.random.default_rng(0).normal(size=(24, 2)))
    return "dnomad-redact"


@pytest.mark.parametrize("shape", SHAPES)
def test_s3_errors_do_not_quote_the_password(shape, bucket, tmp_path, capsys):
    """s3fs takes `AKIAUSER7:pw...` for the bucket and botocore refuses it, quoting it:
    as --store, --input (.npy and Zarr), `info` and `resume`, with and without -v, the
    one line printed (and the traceback) hold no piece of the password."""
    pw = _password(shape, "Sf")
    url = f"s3://{USER}:{pw}@{bucket}"
    np.save(tmp_path / "X.npy", np.random.default_rng(1).normal(size=(10, 2)))
    fit = ["fit", "--n-clusters", "2"]
    commands = {  # the command, and how its one line starts
        "store": (fit + ["--input", str(tmp_path / "X.npy"), "--store", f"{url}/run.zarr"],
                  f"dnomad: error: store 's3://{bucket}/run.zarr' cannot be opened for writing"),
        "input npy": (fit + ["--input", f"{url}/X.npy", "--store", str(tmp_path / "a.zarr")],
                      f"dnomad: error: input 's3://{bucket}/X.npy' cannot be read"),
        "input zarr": (fit + ["--input", f"{url}/X.zarr", "--store", str(tmp_path / "b.zarr")],
                       f"dnomad: error: input 's3://{bucket}/X.zarr' cannot be opened"),
        "info": (["info", f"{url}/run.zarr"],
                 f"dnomad: error: store 's3://{bucket}/run.zarr' cannot be read"),
        "resume": (["resume", f"{url}/run.zarr"],
                   f"dnomad: error: store 's3://{bucket}/run.zarr' cannot be read")}
    for what, (command, start) in commands.items():
        for verbose in ([], ["-v"]):
            forget()
            assert main(verbose + command) == 2, what
            err = capsys.readouterr().err
            _assert_clean(err, pw, f"stderr of {what} {verbose}")
            assert err.splitlines()[-1].startswith(start), err
            assert ("Traceback" in err) == bool(verbose), err
    assert not (tmp_path / "a.zarr").exists() and not (tmp_path / "b.zarr").exists()


@pytest.mark.parametrize("shape", SHAPES[:4])
def test_fit_api_store_error_message_holds_no_password(shape, bucket):
    pw = _password(shape, "Ap")
    with pytest.raises(dnomad.errors.StoreError) as info:
        dnomad.fit(np.random.default_rng(1).normal(size=(10, 2)), n_clusters=2, sdp_k=2, store=f"s3://{USER}:{pw}@{bucket}/run.zarr")
    _assert_clean(str(info.value), pw, "the StoreError")
    assert "s3://dnomad-redact/run.zarr" in str(info.value)


def test_fit_api_store_error_cause_holds_no_password(bucket):
    pw = _password(SHAPES[0], "Ca")
    with pytest.raises(dnomad.errors.StoreError) as info:
        dnomad.fit(np.random.default_rng(1).normal(size=(10, 2)), n_clusters=2, sdp_k=2, store=f"s3://{USER}:{pw}@{bucket}/run.zarr")
    # nothing chained that a traceback would show: the backend's error quotes the bucket string
    assert info.value.__cause__ is None and info.value.__suppress_context__


@pytest.mark.parametrize("shape", SHAPES[:4])
def test_fit_api_input_error_holds_no_password(shape, bucket, tmp_path):
    pw = _password(shape, "In")
    with pytest.raises(dnomad.errors.InputValueError) as info:
        dnomad.fit(f"s3://{USER}:{pw}@{bucket}/X.zarr", n_clusters=2, sdp_k=2, store=str(tmp_path / "r.zarr"))
    _assert_clean(str(info.value), pw, "the error")
    # nothing chained that a traceback would show: the backend's error quotes the bucket string
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert f"s3://{bucket}/X.zarr" in str(info.value)
    assert not (tmp_path / "r.zarr").exists()


def test_issue_example_in_a_subprocess(bucket, s3_env, tmp_path):
    """The issue's URL, s3://AKIA:se@cr/et@bucket/run.zarr (fragments of 2 characters: the
    bucket string 'AKIA:se@cr' must not show), as --store and --input of a real process."""
    env = dict(os.environ, **s3_env)
    np.save(tmp_path / "X.npy", np.random.default_rng(1).normal(size=(10, 2)))
    url = f"s3://AKIA:se@cr/et@{bucket}"
    for args in (["--input", str(tmp_path / "X.npy"), "--store", f"{url}/run.zarr"],
                 ["--input", f"{url}/X.npy", "--store", str(tmp_path / "r.zarr")]):
        res = subprocess.run([sys.executable, "-m", "dnomad.cli", "-v", "fit", "--n-clusters", "2", *args],
                             capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 2, res.stderr[-2000:]
        for text in (res.stdout, res.stderr):
            assert "se@cr" not in text and "cr/et" not in text and "AKIA:se" not in text, text[-3000:]
        assert res.stderr.splitlines()[-1].startswith("dnomad: error: "), res.stderr[-2000:]


def test_a_port_is_not_a_password():
    for url in ("http://minio:9000/bucket/model@v2.zarr", "s3://bucket/model@v2.zarr", "http://host:8080/a"):
        assert run_store.redact(url) == url
    assert run_store.redact("s3://user:pw1@bucket/run.zarr") == "s3://bucket/run.zarr"
