"""How the command line fails (issue 23, item 4): one line `dnomad: error: ...` on stderr,
exit status 2, no traceback (unless -v), nothing written when an input or a setting is
refused; a stated timeout for a scheduler that never comes; TLS settings for resume."""
import json
import pathlib
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import dnomad
from dnomad.cli import main
from stores import unfinish


def fails(capsys, *argv):
    """Run ``dnomad *argv`` in process; it must exit 2 with one line and no traceback.
    Returns that line."""
    try:
        status = main(list(argv))
    except SystemExit as exc:         # argparse's errors
        status = exc.code
    out = capsys.readouterr()
    assert status == 2, (status, out.err)
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dnomad: error: "), out.err
    assert "Traceback" not in out.err
    return lines[0]


@pytest.fixture
def data(tmp_path):
    """A directory of good and bad inputs."""
    np.save(tmp_path / "X.npy", np.random.default_rng(0).normal(size=(30, 2)))
    np.save(tmp_path / "one_d.npy", np.arange(5.0))
    np.save(tmp_path / "objects.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
    np.save(tmp_path / "strings.npy", np.array([["a", "b"]]))
    (tmp_path / "words.txt").write_text("hello world\nfoo bar\n")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "header.csv").write_text("a,b\n1,2\n3,4\n")
    return tmp_path


@pytest.mark.parametrize("name,expected", [
    ("missing.npy", "does not exist"),
    ("missing.zarr", "does not exist"),
    ("one_d.npy", "holds an array of shape (5,); expected a 2-D array"),
    ("objects.npy", "cannot be read as a numeric 2-D array"),
    ("strings.npy", "holds a <U1 array"),
    ("words.txt", "cannot be read as a numeric 2-D array (could not convert string 'hello'"),
    ("empty.csv", "is empty"),
    ("empty.npy", "cannot be read as a numeric 2-D array"),
    ("header.csv", "without a header line"),
])
def test_refused_input_is_one_line_and_writes_nothing(data, capsys, name, expected):
    line = fails(capsys, "fit", "--input", str(data / name), "--n-clusters", "2", "--store",
                 str(data / "s.zarr"))
    assert f"input {str(data / name)!r}" in line and expected in line
    assert not (data / "s.zarr").exists()


def test_refused_input_raises_the_package_errors(data):
    from dnomad.cli import _read_input

    with pytest.raises(dnomad.errors.InputTypeError, match="strings.npy"):
        _read_input(str(data / "strings.npy"))
    with pytest.raises(dnomad.errors.InputValueError, match="one_d.npy"):
        _read_input(str(data / "one_d.npy"))
    np.testing.assert_array_equal(_read_input(str(data / "X.npy")), np.load(data / "X.npy"))
    (data / "column.txt").write_text("1\n2\n3\n")                   # one feature: 3 x 1, not refused
    assert _read_input(str(data / "column.txt")).shape == (3, 1)


@pytest.mark.parametrize("argv,expected", [
    (["fit", "--n-clusters", "x"], "argument --n-clusters/--rank: invalid int value: 'x'"),
    (["fit", "--method", "kmeans"], "argument --method: invalid choice: 'kmeans'"),
    (["fit", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["fit", "--input", "X.npy"], "missing --n-clusters, --store"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--params", "{{bad"],
     "--params must be a JSON object"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--params", "[1, 2]"],
     "--params must be a JSON object"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--method", "symnmf",
      "--device", "cpu"],
     "--device (or device in --config) does not apply to --method symnmf; it is for nomad"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--connect-timeout", "soon",
      "--scheduler-file", "x.json"],
     "argument --connect-timeout: must be a number of seconds > 0"),
    # flags that do not apply to the method, and counts out of range (issue 69)
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--method", "bregman", "--backend", "zarr"],
     "--backend (or backend in --config) does not apply to --method bregman; it is for nomad, symnmf, "
     "riemannian-kmeans, nlr"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--method", "hottopixx", "--dtype", "float64"],
     "--dtype (or dtype in --config) does not apply to --method hottopixx; it is for nomad, symnmf"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--method", "nlr", "--precomputed"],
     "--precomputed (or precomputed in --config) does not apply to --method nlr; it is for nomad, symnmf"),
    (["fit", "--input", "{X}", "--n-clusters", "0", "--store", "{s}"],
     "argument --n-clusters/--rank: must be an integer >= 1; got 0"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--local-workers", "0"],
     "argument --local-workers: must be an integer >= 1; got 0"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--local-workers", "-1"],
     "argument --local-workers: must be an integer >= 1; got -1"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--wait-for-workers", "-2"],
     "argument --wait-for-workers: must be an integer >= 1; got -2"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--slurm-jobs", "0"],
     "argument --slurm-jobs: must be an integer >= 1; got 0"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--connect-timeout", "-1"],
     "argument --connect-timeout: must be a number of seconds > 0"),
    (["info", "{s}", "--history", "-3"], "argument --history: must be a number of rows >= 0 or all; got -3"),
    (["demo", "--n-samples", "0"], "argument --n-samples: must be an integer >= 1; got 0"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--params", '{{"max_itr": 5}}'],
     "--params: 'max_itr' is not a parameter of --method nomad; did you mean 'max_iter'?"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--method", "hottopixx", "--params",
      '{{"n_epoch": 5}}'], "--params: 'n_epoch' is not a parameter of --method hottopixx; did you mean 'n_epochs'?"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--params", '{{"verbose": 7}}'],
     "NOMAD: verbose must be an int in [0, 2]; got 7"),
    (["demo", "--n-samples", "many"], "argument --n-samples: invalid int value: 'many'"),
    (["fit", "--input", "{X}", "--n-clusters", "2", "--store", "{s}", "--params", '{{"n_clusters": 3}}'],
     "--params: 'n_clusters' is set by its flag: give --n-clusters instead"),
    (["info"], "the following arguments are required: store"),
    (["fit", "--config", "{d}/run.ini"], "config file '{d}/run.ini' must end in .toml, .yaml or .yml"),
    (["fit", "--config", "{d}/none.toml"], "config file '{d}/none.toml' does not exist"),
    (["resume", "{d}/nothing.zarr"], "store '{d}/nothing.zarr' holds no dnomad run to resume"),
])
def test_bad_arguments_are_one_line(data, capsys, argv, expected):
    fmt = {"X": data / "X.npy", "s": data / "s.zarr", "d": data}
    line = fails(capsys, *[a.format(**fmt) for a in argv])
    assert expected.format(**fmt) in line
    assert not (data / "s.zarr").exists()


def test_a_dnomad_error_from_the_fit_is_one_line_and_its_traceback_only_with_v(data, capsys):
    """A StoreError raised inside dnomad.fit (the store's parent directory is missing)."""
    args = ["fit", "--input", str(data / "X.npy"), "--n-clusters", "2",
            "--store", str(data / "no" / "s.zarr")]
    line = fails(capsys, *args)
    assert "parent directory" in line and "s.zarr" in line
    assert main(["-v"] + args) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "StoreError" in err
    assert err.splitlines()[-1].startswith("dnomad: error: store ")


@pytest.mark.parametrize("suffix,text,expected", [
    (".toml", 'overwrite = "false"', "overwrite in {cfg!r} must be true or false; got 'false' (str) "
                                     "(write overwrite = true or overwrite = false, without quotes"),
    (".yaml", 'overwrite: "false"', "overwrite in {cfg!r} must be true or false; got 'false'"),
    (".toml", 'precomputed = "no"', "precomputed in {cfg!r} must be true or false; got 'no'"),
    (".yaml", "precomputed: no_thanks", "precomputed in {cfg!r} must be true or false"),
    (".toml", 'n_clusters = "3"', "n_clusters in {cfg!r} must be an integer >= 1; got '3' (str) (write "
                                  "n_clusters = 3, without quotes)"),
    (".toml", "n_clusters = 2.5", "n_clusters in {cfg!r} must be an integer >= 1; got 2.5"),
    (".toml", "n_clusters = true", "n_clusters in {cfg!r} must be an integer >= 1; got True"),
    (".yaml", "rank: 0", "rank in {cfg!r} must be an integer >= 1; got 0"),
    (".toml", "store = 3", "store in {cfg!r} must be a string; got 3 (int)"),
    (".toml", "input = [1, 2]", "input in {cfg!r} must be a string; got [1, 2]"),
    (".toml", 'method = "kmeans"', "method in {cfg!r} must be one of ['nomad',"),
    (".toml", 'dtype = "float16"', "dtype in {cfg!r} must be one of ['float32', 'float64']"),
    (".toml", "params = 3", "params in {cfg!r} must be a table"),
    (".toml", '[cluster]\nlocal = "yes"', "cluster.local in {cfg!r} must be true or false"),
    (".toml", '[cluster]\nn_workers = "2"', "cluster.n_workers in {cfg!r} must be an integer >= 1"),
    (".toml", "[cluster]\nconnect_timeout = -1", "cluster.connect_timeout in {cfg!r} must be a number of "
                                                 "seconds > 0"),
    (".toml", '[security]\nrequire_encryption = "true"', "security.require_encryption in {cfg!r} must be "
                                                          "true or false"),
    (".yaml", "cluster: [1]", "cluster in {cfg!r} must be a table"),
    (".yaml", "- 1\n- 2", "must hold a table of settings; got a list"),
    (".toml", "n_clusters = ", "cannot be parsed"),
    (".toml", "n_cluster = 3", "unknown keys ['n_cluster']"),
    (".toml", "n_clusters = 3\nrank = 3", "gives both n_clusters and rank"),
])
def test_config_values_of_the_wrong_type_are_refused(data, capsys, suffix, text, expected):
    cfg = data / f"run{suffix}"
    cfg.write_text(_config(data, suffix, text))
    line = fails(capsys, "fit", "--config", str(cfg))
    assert expected.format(cfg=str(cfg)) in line, line
    assert not (data / "s.zarr").exists()


def _config(data, suffix, extra):
    """A config file: input, store and n_clusters (those that ``extra`` does not set), then
    ``extra``; a YAML list (``- ...``) alone."""
    if extra.startswith("- "):
        return extra + "\n"
    given = {line.replace(":", "=").split("=")[0].strip() for line in extra.splitlines()}
    keys = {"input": str(data / "X.npy"), "store": str(data / "s.zarr")}
    if not given & {"n_clusters", "rank"}:
        keys["n_clusters"] = 2
    sep = " = " if suffix == ".toml" else ": "
    return "".join(f"{k}{sep}{json.dumps(v)}\n" for k, v in keys.items() if k not in given) + extra + "\n"


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_overwrite_as_a_string_does_not_replace_a_finished_run(data, capsys):
    """overwrite = "false" was truthy: it replaced the finished run.  Now it is refused and
    the run is left as it is."""
    store = data / "run.zarr"
    assert main(["fit", "--input", str(data / "X.npy"), "--n-clusters", "2", "--store", str(store),
                 "--backend", "local", "--params", json.dumps({"max_iter": 20})]) == 0
    capsys.readouterr()
    before = dnomad.blocks.store.read_json(str(store), "dnomad_run")["started"]
    cfg = data / "run.toml"
    cfg.write_text(f'input = "{data / "X.npy"}"\nn_clusters = 2\nstore = "{store}"\noverwrite = "false"\n'
                   f'backend = "local"\n[params]\nmax_iter = 50\n')
    line = fails(capsys, "fit", "--config", str(cfg))
    assert "overwrite in" in line
    assert dnomad.blocks.store.read_json(str(store), "dnomad_run")["started"] == before
    # overwrite = false (a boolean): refused by the store, as it should be, in one line.
    cfg.write_text(cfg.read_text().replace('overwrite = "false"', "overwrite = false"))
    line = fails(capsys, "fit", "--config", str(cfg))
    assert "already holds a dnomad run" in line
    assert dnomad.blocks.store.read_json(str(store), "dnomad_run")["started"] == before


# -- connecting --------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("flags,expected", [
    (["--scheduler-file", "{d}/missing.json"], "scheduler file '{d}/missing.json' does not exist after "
                                               "waiting 2 s (--connect-timeout)"),
    (["--scheduler-address", "tcp://127.0.0.1:{port}"], "cannot reach the scheduler at "
                                                        "'tcp://127.0.0.1:{port}' (--scheduler-address) "
                                                        "within 2 s (--connect-timeout)"),
])
def test_a_scheduler_that_never_comes_fails_within_the_timeout(data, flags, expected):
    """In a process of its own, as a user runs it: it used to wait forever."""
    fmt = {"d": data, "port": _free_port()}
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "dnomad.cli", "fit", "--input", str(data / "X.npy"),
                          "--n-clusters", "2", "--store", str(data / "s.zarr"), "--connect-timeout", "2",
                          *[f.format(**fmt) for f in flags]], capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 15, "the connect timeout was not kept"
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    last = res.stderr.splitlines()[-1]
    assert last.startswith("dnomad: error: ") and expected.format(**fmt) in last, res.stderr
    if "--scheduler-file" in flags:       # it said it was waiting, and for what
        assert "waiting up to 2 s for the scheduler file" in res.stderr
    assert not (data / "s.zarr").exists()


def test_connect_timeout_from_the_config(data, capsys):
    cfg = data / "run.toml"
    cfg.write_text(f'input = "{data / "X.npy"}"\nn_clusters = 2\nstore = "{data / "s.zarr"}"\n'
                   f'[cluster]\nscheduler_file = "{data / "none.json"}"\nconnect_timeout = 0.5\n')
    start = time.monotonic()
    try:
        status = main(["fit", "--config", str(cfg)])
    finally:
        elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert status == 2 and elapsed < 10
    assert "does not exist after waiting 0.5 s" in err.splitlines()[-1]


def test_scheduler_file_written_late_is_waited_for(tmp_path):
    """A batch job may start `dnomad fit` before its scheduler has written the file."""
    from dnomad.cli import _scheduler_file_address

    path = tmp_path / "scheduler.json"

    def write_later():
        time.sleep(0.5)
        path.write_text("")                                     # created, not yet written
        time.sleep(0.3)
        path.write_text(json.dumps({"address": "tcp://10.0.0.1:8786"}))

    writer = threading.Thread(target=write_later)
    writer.start()
    try:
        assert _scheduler_file_address(str(path), 10) == "tcp://10.0.0.1:8786"
    finally:
        writer.join()


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
def test_resume_under_tls_needs_the_config_and_works_with_it(tmp_path):
    """A run under TLS resumes under TLS with `dnomad resume STORE --config run.toml`
    ([security] used, the run's other keys ignored); without it, one clear line."""
    from distributed.security import Security

    from dnomad.cli import _connect, _security

    X = np.random.default_rng(0).normal(size=(30, 2))
    store = str(tmp_path / "run.zarr")
    dnomad.fit(X, n_clusters=2, sdp_k=2, store=store, backend="local", max_iter=20)
    unfinish(store)
    temp = Security.temporary()
    files = {}
    for key, pem in (("tls_ca_file", temp.tls_ca_file), ("tls_client_cert", temp.tls_client_cert),
                     ("tls_client_key", temp.tls_client_key)):
        files[key] = str(tmp_path / f"{key}.pem")
        pathlib.Path(files[key]).write_text(pem)
    cfg = tmp_path / "run.toml"
    cfg.write_text('input = "elsewhere.npy"\nn_clusters = 7\n[security]\n' +
                   "".join(f'{k} = "{v}"\n' for k, v in files.items()))
    client, cluster = _connect(local=True, n_workers=1, security=_security(files))
    try:
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        cli = [sys.executable, "-m", "dnomad.cli", "resume", store, "--scheduler-address", address,
               "--connect-timeout", "20"]
        res = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res.stderr
        assert res.stderr.splitlines() == [
            f"dnomad: error: the scheduler at {address!r} (--scheduler-address) speaks TLS, and no "
            f"certificates were given: pass --config with the run's [security] table (also `dnomad resume "
            f"STORE --config run.toml`)"]
        res = subprocess.run(cli + ["--config", str(cfg)], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stdout.startswith("resumed: ")
    finally:
        client.close()
        cluster.close()


def test_every_option_and_argument_has_help_text():
    import argparse

    from dnomad.cli import build_parser

    missing = []

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, sub)
            elif not action.help and action.dest != "help":
                missing.append((name, action.option_strings or action.dest))
    walk(build_parser(), "dnomad")
    assert not missing
