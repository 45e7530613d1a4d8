"""Progress of a fit, the same for every method: ``verbose=0`` is silent, 1 a live line on
a terminal (plain lines every few seconds elsewhere), 2 a line per iteration; the line
shows the residuals against their stopping targets and an estimate of what remains."""
import io
import os
import re
import sys

import pytest

import dnomad
from dnomad.data import gaussian_blobs, separable_nmf, two_rings
from dnomad.progress import Progress


BLOBS = gaussian_blobs(60, n_centers=3, separation=8.0, random_state=0)[0] + 5.0
RINGS = two_rings(120)[0]

# method -> (estimator parameters, data, the report's name, a target it shows or None)
CASES = {
    "nomad-cgm": ({"n_clusters": 6, "sdp_k": 6}, RINGS, "NOMAD (conditional gradient)", "rmse_neg"),
    "nomad-bm": ({"n_clusters": 6, "sdp_k": 6, "solver": "bm", "rank": 8}, RINGS, "NOMAD (Burer-Monteiro)", "change"),
    "symnmf": ({"n_clusters": 3, "max_iter": 30}, BLOBS, "SymNMF (fw)", "gap"),
    "hottopixx": ({"rank": 3, "n_epochs": 6}, separable_nmf(12, 60, 3, random_state=0)["X"], "HOTTOPIXX", None),
    "riemannian-kmeans": ({"n_clusters": 3}, BLOBS, "Riemannian K-means", "grad_norm"),
    "nlr": ({"n_clusters": 3, "record_every": 5}, BLOBS, "NLR", "infeasibility"),
    "bregman": ({"n_clusters": 3, "model": "cond"}, BLOBS, "Bregman clustering (cond)", None),
    "bregman-jc": ({"n_clusters": 3, "max_iter": 40}, BLOBS, "Bregman clustering (cond-jc)", "primal_residual"),
}


def fit(case, verbose):
    params, X, _, _ = CASES[case]
    method = case.split("-")[0] if case.startswith(("nomad", "bregman")) else case
    return dnomad.fit(X, method=method, random_state=0, verbose=verbose, **params)


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_every_method_reports_at_verbose_1_and_2_and_is_silent_at_0(case, capsys):
    _, _, name, target = CASES[case]
    fit(case, 0)
    assert capsys.readouterr().err == ""

    est = fit(case, 2)
    lines = capsys.readouterr().err.splitlines()
    rows = [line for line in lines if line.startswith(f"{name}: it ")]
    # One line per history row the solver reported (a multi-start or multi-stage run
    # reports its every run; its history_ keeps the best start's).
    assert len(rows) >= len(est.history_) > 0, lines
    assert lines[-1].startswith(f"{name}: stopped ({est.stop_reason_}) after {len(rows)} iterations"), lines
    if target is not None:
        assert re.search(rf"{target} \d\.\d\de[+-]\d\d/\de[+-]\d\d", rows[-1]), rows[-1]

    fit(case, 1)           # off a terminal: the first row, then one every few seconds, and the end
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith(f"{name}: it ") and lines[-1].startswith(f"{name}: stopped")
    assert len(lines) < len(rows) + 1 or len(rows) <= 2


def test_the_live_line_is_rewritten_in_place_on_a_terminal(monkeypatch):
    """On a terminal (a pty here) verbose=1 is one tqdm line redrawn with carriage
    returns, not a line per iteration."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))    # 40 rows, 200 columns
    terminal = os.fdopen(slave, "w")
    monkeypatch.setattr(sys, "stderr", terminal)
    est = dnomad.NOMAD(6, sdp_k=6, verbose=1).fit(RINGS)
    terminal.flush()
    monkeypatch.undo()
    terminal.close()
    import select

    out = b""
    while select.select([master], [], [], 1.0)[0]:      # what the terminal got, never waiting long
        try:
            chunk = os.read(master, 65536)
        except OSError:                                 # every slave end closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    text = out.decode()
    assert text.count("\r") >= 2 and "NOMAD (conditional gradient): it " in text
    assert f"it {est.n_iter_} " in text and "stopped (tolerance)" in text
    assert text.count("\n") <= 3, text


def test_the_estimate_follows_the_residuals_rate():
    """Residuals halving every 0.1 s reach a target 2^-20 below the start in 2 s: after
    10 rows the estimate is the remaining 1 s; a fixed count of epochs is estimated from
    the pace; a residual that does not fall gives no estimate."""
    now = [0.0]
    stream = io.StringIO()
    report = Progress("demo", verbose=2, targets={"res": 0.5 ** 20}, stream=stream, clock=lambda: now[0])
    for k in range(1, 11):
        now[0] = 0.1 * k
        report({"iteration": k, "res": 0.5 ** k, "passes": 3 * k})
    assert report._text.endswith("~1.0 s left"), report._text
    assert "res 9.77e-04/1e-06" in report._text and "passes 30" in report._text
    now[0] = 1.1
    report({"iteration": 11, "res": 0.5 ** 21, "passes": 33})
    assert report._text.endswith("at the targets")

    epochs = Progress("epochs", verbose=2, iteration_key="epoch", max_iter=50, passes=None, stream=stream,
                      clock=lambda: now[0])
    now[0] = 1.1 + 2.0
    epochs({"epoch": 10})
    assert epochs._text.endswith("~8.0 s left"), epochs._text

    flat = Progress("flat", verbose=2, targets={"res": 1e-6}, stream=stream, clock=lambda: now[0])
    for k in range(5):
        now[0] += 0.1
        flat({"iteration": k + 1, "res": 1e-2 * (1 + 0.01 * k)})
    assert "left" not in flat._text and "targets" not in flat._text


def test_a_progress_report_never_stops_a_run_and_the_callback_still_can():
    stops = []

    def stop_at_3(row):
        stops.append(row["iteration"])
        return row["iteration"] == 3

    est = dnomad.NOMAD(6, sdp_k=6, verbose=1, callback=stop_at_3).fit(RINGS)
    assert est.stop_reason_ == "callback" and est.n_iter_ == 3 and stops == [1, 2, 3]
    assert "_fit_progress" not in vars(est) and "_fit_callback" not in vars(est)   # it pickles


def test_at_verbose_0_a_logging_program_gets_info_summaries_from_the_package_logger(caplog, capsys):
    """Silent on stderr, but a program that turns on INFO logging gets the same text from the
    method package's logger (the first row, then one every few seconds)."""
    import logging

    with caplog.at_level(logging.INFO, logger="dnomad"):
        dnomad.NOMAD(6, sdp_k=6).fit(RINGS)
    assert capsys.readouterr().err == ""
    summaries = [r for r in caplog.records if r.name == "dnomad.nomad"]
    assert summaries and summaries[0].getMessage().startswith("NOMAD (conditional gradient): it 1 ")
    assert not any("NOMAD it " in r.getMessage() for r in caplog.records)       # per iteration: DEBUG
