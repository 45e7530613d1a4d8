"""scikit-learn's estimator contract, checked by scikit-learn itself: every estimator
runs ``parametrize_with_checks``; the checks it fails are listed below, each with the
reason the method differs (the list is exact: a listed check that starts passing fails
the run, as an unlisted one that fails does)."""
import pickle

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import parametrize_with_checks

import dnomad
from dnomad.data import gaussian_blobs

ESTIMATORS = [
    dnomad.NOMAD(n_clusters=3, sdp_k=3, max_iter=50, random_state=0),
    dnomad.SymNMF(n_clusters=3, random_state=0),
    dnomad.RiemannianKMeans(n_clusters=3, random_state=0),
    dnomad.NLR(n_clusters=3, random_state=0),
    dnomad.BregmanClustering(n_clusters=3, random_state=0),
    dnomad.Hottopixx(rank=3, n_epochs=5, random_state=0),
]

# A complex or object X is refused with a TypeError (dnomad's InputTypeError: X's type
# is wrong, not a value in it); scikit-learn's checks expect ValueError.
_TYPE_ERRORS = {
    "check_complex_data": "complex X refused with TypeError (InputTypeError), not ValueError",
    "check_dtype_object": "object X refused with TypeError (InputTypeError), not ValueError",
}
# These checks set n_clusters = 1, which every clustering method here refuses: the SDP's
# only feasible point is then 1 1^T / n (one cluster), there is nothing to solve.
_ONE_CLUSTER = {name: "sets n_clusters = 1, refused (n_clusters >= 2)" for name in (
    "check_dont_overwrite_parameters", "check_methods_subset_invariance", "check_fit2d_predict1d",
    "check_fit2d_1sample", "check_fit2d_1feature")}
# HOTTOPIXX factors a nonnegative f x n X whose rows are scaled to sum 1 (the paper's
# convention: rows are features, the hott rows among them).
_HOTTOPIXX = {
    "check_positive_only_tag_during_fit": "negative X refused in dnomad's words, not scikit-learn's",
    "check_estimators_dtypes": "the check's X has an all-zero row, which cannot be scaled to sum 1",
    "check_fit2d_1feature": "the check's X has an all-zero row, which cannot be scaled to sum 1",
    "check_estimator_sparse_tag": "sparse X is streamed by its nonzeros, but the check's has all-zero rows",
    "check_estimator_sparse_array": "sparse X is streamed by its nonzeros, but the check's has all-zero rows",
    "check_estimator_sparse_matrix": "sparse X is streamed by its nonzeros, but the check's has all-zero rows",
    "check_estimators_empty_data_messages": "rows are features: a (12, 0) X has 0 samples, not 0 features",
    "check_fit2d_1sample": "rows are features: a 1 x d X has rank <= 1 hott rows, so rank=3 is refused",
}


def _expected_failures(estimator):
    if isinstance(estimator, dnomad.Hottopixx):
        return {**_TYPE_ERRORS, **_HOTTOPIXX}
    return {**_TYPE_ERRORS, **_ONE_CLUSTER}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failures)
def test_scikit_learn_estimator_checks(estimator, check):
    check(estimator)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")     # short runs
@pytest.mark.parametrize("estimator", ESTIMATORS[:5], ids=lambda e: type(e).__name__)
def test_a_fitted_clusterer_pickles_to_the_same_labels_and_counts_its_features(estimator):
    X, y = gaussian_blobs(90, n_centers=3, separation=8.0, random_state=0)
    est = clone(estimator)
    assert not hasattr(est, "n_features_in_")
    labels = est.fit_predict(X)
    assert est.n_features_in_ == X.shape[1]
    loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.labels_, labels)
    assert loaded.get_params() == est.get_params()


def test_convergence_warning_is_scikit_learns():
    from sklearn.exceptions import ConvergenceWarning

    X, _ = gaussian_blobs(60, n_centers=3, random_state=0)
    with pytest.warns(ConvergenceWarning):
        dnomad.NOMAD(n_clusters=3, sdp_k=3, max_iter=1, random_state=0).fit(X)
