"""Pictures from any result: ``dnomad plot STORE`` and ``dnomad.plot(estimator)`` draw what
the method has, each axis labelled."""
import pytest

import dnomad
from dnomad.cli import main
from dnomad.data import gaussian_blobs, separable_nmf, two_rings


BLOBS = gaussian_blobs(60, n_centers=3, separation=8.0, random_state=0)[0] + 5.0

# method -> (parameters, data, the panels' titles, beginnings)
CASES = {
    "nomad": ({"n_clusters": 6, "sdp_k": 6}, two_rings(120)[0],
              ["data by predicted label", "Q sorted by label", "2-D embedding", "history"]),
    "nomad-bm": ({"n_clusters": 6, "sdp_k": 6, "solver": "bm", "rank": 8}, two_rings(120)[0],
                 ["data by predicted label", "Q sorted by label", "2-D embedding", "history"]),
    "symnmf": ({"n_clusters": 3, "max_iter": 30}, BLOBS, ["data by predicted label", "W, rows", "history"]),
    "hottopixx": ({"rank": 3, "n_epochs": 4}, separable_nmf(12, 60, 3, random_state=0)["X"],
                  ["C's diagonal", "history"]),
    "riemannian-kmeans": ({"n_clusters": 3}, BLOBS, ["data by predicted label", "history"]),
    "nlr": ({"n_clusters": 3}, BLOBS, ["data by predicted label", "history"]),
    "bregman": ({"n_clusters": 3, "max_iter": 40}, BLOBS, ["data by predicted label", "history"]),
}


def titles(fig):
    return [ax.get_title() for ax in fig.axes if ax.get_title()]


@pytest.mark.filterwarnings("ignore::dnomad.ConvergenceWarning")
@pytest.mark.parametrize("case", list(CASES))
def test_plot_of_a_store_and_of_an_estimator_for_every_method(case, tmp_path, capsys):
    params, X, want = CASES[case]
    method = "nomad" if case.startswith("nomad") else case
    store = str(tmp_path / "run.zarr")
    est = dnomad.fit(X, method=method, store=store, random_state=0, **params)

    assert main(["plot", store]) == 0
    png = tmp_path / "run.png"
    assert capsys.readouterr().out.strip() == f"plot: {png}"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    for source, kw in ((store, {}), (est, {"X": X if method != "hottopixx" else None})):
        fig = dnomad.plot(source, **kw)
        got = titles(fig)
        for prefix in want:
            if prefix.startswith("data") and source is store and method not in ("nomad", "symnmf"):
                continue          # the K-means and Bregman stores do not keep X: no data panel from them
            assert any(t.startswith(prefix) for t in got), (prefix, got)
        for ax in fig.axes:
            if ax.get_title():
                assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()


def test_a_store_without_a_finished_run_is_refused_in_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "none.zarr")]) == 2
    assert capsys.readouterr().err.startswith("dnomad: error: store ")


def test_plot_leaves_pyplot_alone_and_skips_what_a_result_lacks(tmp_path):
    """No backend switch and no pyplot figure (a notebook's stay as they are); a
    one-dimensional embedding has no 2-D panel."""
    import matplotlib.pyplot as plt

    open_before = plt.get_fignums()
    X = two_rings(100)[0]
    est = dnomad.NOMAD(4, sdp_k=4, n_components=1).fit(X)
    fig = dnomad.plot(est, str(tmp_path / "one.png"), X=X)
    assert plt.get_fignums() == open_before
    assert not any(t.startswith("2-D embedding") for t in titles(fig))
    assert (tmp_path / "one.png").stat().st_size > 10_000


def test_plot_checks_its_arguments_as_an_estimator_does():
    """Not an estimator, not fitted, the data passed as ``path``, an X of another length,
    dimension or dtype: a DnomadError that names the argument, never AttributeError or
    IndexError from a panel."""
    import numpy as np

    from dnomad.errors import InputTypeError, InputValueError

    est = dnomad.NLR(3, random_state=0).fit(BLOBS)
    cases = [((42,), {}, InputTypeError, "result must be a fitted dnomad estimator"),
             ((dnomad.NOMAD(2),), {}, InputValueError, "not fitted"),
             ((est, BLOBS), {}, InputTypeError, "path must be a file name"),
             ((est,), {"X": BLOBS[:10]}, InputValueError, "X has 10 rows but the result has 60 labels"),
             ((est,), {"X": BLOBS[None]}, InputValueError, "X must be 2-D"),
             ((est,), {"X": BLOBS.astype(str)}, InputTypeError, "X must hold real numbers"),
             ((est,), {"X": np.where(BLOBS > 6, np.nan, BLOBS)}, InputValueError, "NaN")]
    for args, kwargs, err, match in cases:
        with pytest.raises(err, match=match):
            dnomad.plot(*args, **kwargs)
    assert dnomad.plot(est, X=BLOBS[:, :1]) is not None             # one feature: drawn on a line
