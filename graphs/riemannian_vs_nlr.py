"""K-means by cubic-regularized Riemannian Newton (Xu, Hou, Chen, Zhang) against its
baseline NLR (Zhuang et al. 2024), the paper's Figs. 3 and 6, and against scikit-learn
on real data.

    python graphs/riemannian_vs_nlr.py                     # all parts (about 40 minutes)
    python graphs/riemannian_vs_nlr.py --parts race scaling --sizes 10000 100000

Parts, all measured in one run on one machine (single-threaded BLAS, chunks on a thread
per core, as dnomad runs them):
  fig3     the paper's Fig. 3 instance and protocol (GMM n = 100, K = 4, gamma = 0.8,
           Newton at mu = 0.1, 50 random starts) against NLR with its Lipschitz step (50
           starts) and with the authors' fixed step (the first 10: 75,000 to 200,000
           iterations each); each method to its own stopping rule; seconds, iterations,
           seconds to the run's final mis-clustering; ratios NLR / Newton.
  race     the paper's GMM (5) (K = 4, gamma = 1.2, d = K), n = 1000, 3 random starts:
           Newton (mu = 0.01, the paper's; and mu = 0.1 then 0.01, warm-started) against
           NLR with its step from the Lipschitz
           bound and NLR with the authors' fixed step (1e-6); iterations and seconds until
           (a) no mis-clustered point and (b) the membership U U^T is as close to the
           planted one as Newton's final point; ratios NLR / Newton.
  scaling  seconds per Newton step (and per NLR iteration) with X read from Zarr,
           n = 10^4 ... 10^6 (the paper's Fig. 3, right), the Schur pass's flop rate
           against the machine's single-core DGEMM rate times the threads, and the
           resident memory's peak rise against X's size.
  mu       the mu phase transition (Fig. 6, left) on the race instance at n = 500.
  rank     r = K + 1 ... 3K at mu = 0.01 (Fig. 6, right).
  real     pendigits, satimage, letter (A-E) and MNIST (0-4, 20 principal components):
           2,000 points drawn per set preserving class ratios, features scaled to unit
           variance; mis-clustering of Newton (mu from App. F, and continued to a tenth of
           it), NLR (labels from U by k-means on its rows for both), scikit-learn's KMeans
           (k-means++, 10 inits) and SpectralClustering (10-NN graph).  The paper's CyTOF
           set is shipped by no PyPI or Debian package, so it is not here.
Writes graphs/riemannian_vs_nlr.json and graphs/riemannian_vs_nlr.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import numpy as np
from _bench import ResidentPeak, replot, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
PARTS = ("fig3", "race", "scaling", "mu", "rank", "real")


def membership_distance(U, y):
    """||U U^T - Z*||_F / ||Z*||_F, Z* the planted normalized membership, in O(n r)."""
    labels = np.unique(y)
    UtU = U.T @ U
    cross = sum(np.sum(U[y == k].sum(axis=0) ** 2) / np.sum(y == k) for k in labels)
    return float(np.sqrt(max(np.sum(UtU ** 2) - 2 * cross + len(labels), 0.0) / len(labels)))


def misclustering(y, U, K):
    from dnomad.metrics import clustering_accuracy
    from dnomad.kmeans_sdp.riemannian import labels_from_u

    return 1.0 - clustering_accuracy(y, labels_from_u(U, K))


def trace_run(solve, y, K):
    """Run ``solve(callback)``; the callback records iteration, seconds, mis-clustering and
    membership distance (its own time is left out of the solver's seconds)."""
    rows = []

    def record(row, current_u):
        U = current_u()
        rows.append({"iteration": row["iteration"], "seconds": row["seconds"],
                     "misclustering": misclustering(y, U, K), "distance": membership_distance(U, y)})

    res = solve(record)
    return res, rows


def first_reaching(rows, key, target):
    for row in rows:
        if row[key] <= target:
            return row["iteration"], row["seconds"]
    return None, None


def race(n=1000, K=4, gamma=1.2, seeds=(0, 1, 2), nlr_cap=200_000):
    from dnomad.blocks import RowChunks, single_threaded_blas
    from dnomad.data import gmm_simplex
    from dnomad.kmeans_sdp.nlr import nlr
    from dnomad.kmeans_sdp.riemannian import KMeansManifold, KMeansProblem, random_start, riemannian_newton

    X, y = gmm_simplex(n, n_clusters=K, gamma=gamma, random_state=0)
    out = {"n": n, "K": K, "gamma": gamma, "runs": []}
    with single_threaded_blas():
        data = RowChunks(X)
        M = KMeansManifold(n, K + 1, K)
        for seed in seeds:
            P = KMeansProblem(M, data, 0.01)
            rn, rn_rows = trace_run(lambda cb: riemannian_newton(P, random_start(M, np.random.default_rng(seed)),
                                                                 callback=cb), y, K)
            target = rn_rows[-1]["distance"]
            entry = {"seed": seed, "target_distance": target, "newton": {
                "rows": rn_rows, "stop": rn.stop_reason, "iterations": rn.n_iter, "seconds": rn.seconds,
                "passes": rn.passes}}
            cont, cont_rows = trace_run(lambda cb: _continuation(data, M, [0.1, 0.01], seed, cb), y, K)
            entry["newton_mu_0.1_0.01"] = {"rows": cont_rows, "stop": cont.stop_reason,
                                           "iterations": cont_rows[-1]["iteration"],
                                           "seconds": cont_rows[-1]["seconds"], "passes": cont.passes}
            for name, step in (("nlr", None), ("nlr_authors_step", 1e-6)):
                # The authors' protocol: beta = 10 on the data as generated.
                res, rows = trace_run(lambda cb: nlr(data, K, beta=10.0, step=step, random_state=seed,
                                                     max_iter=nlr_cap, record_every=10, callback=cb), y, K)
                entry[name] = {"rows": rows, "stop": res.stop_reason, "iterations": res.n_iter,
                               "seconds": res.seconds, "passes": res.passes, "step": res.step}
            for name in METHODS:
                run = entry[name]
                run["to_zero_misclustering"] = first_reaching(run["rows"], "misclustering", 0.0)
                run["to_target_distance"] = first_reaching(run["rows"], "distance", target * (1 + 1e-9))
            out["runs"].append(entry)
    print(f"\n== race: GMM n = {n}, K = {K}, gamma = {gamma}; Newton mu = 0.01 ==")
    print(f"{'seed':>4} {'method':>17} {'iters to 0 err':>15} {'s to 0 err':>10} {'iters to dist':>14} "
          f"{'s to dist':>10} {'final dist':>11} {'x Newton (s, dist)':>19}")
    for entry in out["runs"]:
        base = entry["newton"]["to_target_distance"][1]
        for name in METHODS:
            run = entry[name]
            (i0, s0), (i1, s1) = run["to_zero_misclustering"], run["to_target_distance"]
            ratio = f"{s1 / base:.2f}" if s1 is not None and base else "not reached"
            print(f"{entry['seed']:>4} {name:>17} {_fmt(i0):>15} {_fmt(s0, '.3f'):>10} {_fmt(i1):>14} "
                  f"{_fmt(s1, '.3f'):>10} {run['rows'][-1]['distance']:>11.2e} {ratio:>19}")
    return out


METHODS = ("newton", "newton_mu_0.1_0.01", "nlr", "nlr_authors_step")


def fig3(n=100, K=4, gamma=0.8, mu=0.1, starts=50, authors_starts=10, nlr_cap=200_000):
    """The paper's Fig. 3 protocol: GMM n = 100, gamma = 0.8, Newton at mu = 0.1 against
    NLR (its step from the Lipschitz bound, and the authors' fixed step 1e-6), each from
    random starts (``starts``; NLR with the authors' step, 75,000 to 200,000 iterations a
    run, from the first ``authors_starts`` of them) and each to its own stopping rule;
    seconds and iterations to stop and to the run's final mis-clustering (Fig. 3's
    accuracy curves; NLR's recorded every 10 iterations, with the authors' step every
    1,000), ratios NLR / Newton per start."""
    from dnomad.blocks import RowChunks, single_threaded_blas
    from dnomad.data import gmm_simplex
    from dnomad.kmeans_sdp.nlr import nlr
    from dnomad.kmeans_sdp.riemannian import KMeansManifold, KMeansProblem, random_start, riemannian_newton

    X, y = gmm_simplex(n, n_clusters=K, gamma=gamma, random_state=0)
    out = {"n": n, "K": K, "gamma": gamma, "mu": mu, "starts": starts, "runs": []}
    names = ("newton", "nlr", "nlr_authors_step")
    with single_threaded_blas():
        data = RowChunks(X)
        M = KMeansManifold(n, K + 1, K)
        for seed in range(starts):
            P = KMeansProblem(M, data, mu)
            runs = {"newton": trace_run(lambda cb: riemannian_newton(
                P, random_start(M, np.random.default_rng(seed)), callback=cb, warn=False), y, K)}
            for name, step, every in (("nlr", None, 10), ("nlr_authors_step", 1e-6, 1000)):
                if step is None or seed < authors_starts:
                    runs[name] = trace_run(lambda cb: nlr(data, K, beta=10.0, step=step, random_state=seed,
                                                          max_iter=nlr_cap, record_every=every, callback=cb), y, K)
            entry = {"seed": seed}
            for name in runs:
                res, rows = runs[name]
                final = rows[-1]["misclustering"]
                entry[name] = {"stop": res.stop_reason, "iterations": res.n_iter, "seconds": res.seconds,
                               "misclustering": final, "distance": rows[-1]["distance"],
                               "to_final_misclustering": first_reaching(rows, "misclustering", final)}
            out["runs"].append(entry)
    print(f"\n== Fig. 3: GMM n = {n}, K = {K}, gamma = {gamma}; Newton mu = {mu}; {starts} random starts, each "
          f"method to its own stopping rule ==")
    print(f"{'method':>17} {'iterations (median, range)':>28} {'seconds (median, range)':>26} "
          f"{'s to final error':>17} {'mis-clust. (median, max)':>25} {'stops':>22}")
    summary = {}
    for name in names:
        runs = [e[name] for e in out["runs"] if name in e]
        its = np.array([r["iterations"] for r in runs])
        secs = np.array([r["seconds"] for r in runs])
        to_final = np.array([r["to_final_misclustering"][1] for r in runs])
        errs = np.array([r["misclustering"] for r in runs])
        stops = {k: sum(r["stop"] == k for r in runs) for k in sorted({r["stop"] for r in runs})}
        print(f"{name:>17} {int(np.median(its)):>10} ({its.min()}-{its.max()}) {np.median(secs):>12.3f} "
              f"({secs.min():.3f}-{secs.max():.3f}) {np.median(to_final):>17.3f} "
              f"{np.median(errs):>14.3f} {errs.max():>10.3f} {str(stops):>22}")
    for name in names[1:]:
        paired = [e for e in out["runs"] if name in e]
        ratio = np.array([e[name]["seconds"] / e["newton"]["seconds"] for e in paired])
        ratio_acc = np.array([e[name]["to_final_misclustering"][1] / max(e["newton"]["to_final_misclustering"][1],
                                                                          1e-9) for e in paired])
        summary[name] = {"seconds_ratio_to_newton": [float(np.min(ratio)), float(np.median(ratio)),
                                                     float(np.max(ratio))],
                         "to_final_misclustering_ratio_to_newton": [float(np.min(ratio_acc)),
                                                                    float(np.median(ratio_acc)),
                                                                    float(np.max(ratio_acc))]}
        print(f"{name} / Newton seconds to stop ({len(paired)} starts): median {np.median(ratio):.2f} (range "
              f"{ratio.min():.2f}-{ratio.max():.2f}); to its final mis-clustering: median {np.median(ratio_acc):.2f}")
    out["summary"] = summary
    return out


def _continuation(data, M, mus, seed, callback):
    """Newton through the mu stages (warm starts), iterations and seconds counted across
    stages in the callback's rows."""
    from dnomad.kmeans_sdp.riemannian import KMeansProblem, random_start, riemannian_newton

    x = random_start(M, np.random.default_rng(seed))
    done = {"iteration": 0, "seconds": 0.0}
    passes = 0
    for mu in mus:
        def shifted(row, current_u, base=dict(done)):
            return callback(dict(row, iteration=row["iteration"] + base["iteration"],
                                 seconds=row["seconds"] + base["seconds"]), current_u)

        res = riemannian_newton(KMeansProblem(M, data, mu), x, callback=shifted)
        done["iteration"] += res.n_iter
        done["seconds"] += res.seconds
        passes += res.passes
        x = res.point
    return dataclasses.replace(res, passes=passes)


def _fmt(v, spec="d"):
    return "-" if v is None else format(v, spec)


def dgemm_rate(size=512, repeat=5):
    """Single-thread DGEMM flops per second (the Schur pass's kernel is GEMM-bound)."""
    from dnomad.blocks import single_threaded_blas

    a = np.random.default_rng(0).standard_normal((size, size))
    best = np.inf
    with single_threaded_blas():
        for _ in range(repeat):
            t = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - t)
    return 2 * size ** 3 / best


def dense_schur_flops(n, K, width):
    """Flops of the Schur sums formed densely a row (r - 1 = K): sum L_i^T (D_i^-1 L_i)
    over rows of width coupled columns, the dnomad code before the Kronecker sums."""
    return n * (2 * K * width ** 2 + 2 * K * K * width)


def scaling(sizes, K=4, iterations=3):
    import zarr

    from dnomad.blocks import RowChunks, single_threaded_blas
    from dnomad.blocks.engine import _n_threads
    from dnomad.data import gmm_simplex
    from dnomad.kmeans_sdp.nlr import nlr
    from dnomad.kmeans_sdp.riemannian import (KMeansManifold, KMeansProblem, random_start, riemannian_newton,
                                              schur_pass_flops)

    peak_rate = dgemm_rate() * _n_threads()
    out = {"K": K, "dgemm_flops_all_threads": peak_rate, "rows": []}
    scratch = tempfile.mkdtemp(prefix="dnomad-rk-")
    print(f"\n== scaling: GMM K = {K}, X from Zarr (65,536-row chunks); a Newton step = its three passes "
          f"(Schur sums, back-substitution, retraction), timed after {iterations} iterations; DGEMM "
          f"{peak_rate / 1e9:.1f} GFLOP/s on {_n_threads()} threads ==")
    print(f"{'n':>9} {'s/Newton step':>14} {'s/Schur pass':>13} {'Schur GFLOP/s':>14} {'x DGEMM':>8} "
          f"{'s/NLR it':>9} {'step/NLR it':>12} {'us/row/step':>12} {'mem rise B/row':>15}")
    for n in sizes:
        X, _ = gmm_simplex(n, n_clusters=K, gamma=1.2, random_state=0)
        path = os.path.join(scratch, f"X{n}.zarr")
        z = zarr.open_array(store=path, mode="w", shape=X.shape, chunks=(65536, X.shape[1]), dtype=X.dtype)
        z[...] = X
        del X
        with single_threaded_blas(), ResidentPeak() as mem:
            data = RowChunks(path)
            M = KMeansManifold(n, K + 1, K)
            P = KMeansProblem(M, data, 0.01)
            res = riemannian_newton(P, random_start(M, np.random.default_rng(0)), max_iter=iterations,
                                    second_order=False)
            it = P.load(res.point)
            lam = res.history[-1]["lam"]
            t = time.perf_counter()
            sol = P.solve(it, lam)
            schur = time.perf_counter() - t
            step = P.back_substitute(it, sol)
            P.retract(it, step, min(1.0, 0.95 * step.t_max))
            per_step = time.perf_counter() - t
            nl = nlr(data, K, beta=10.0, max_iter=20, random_state=0)
            data.close()
        lay = P.layout
        flops = schur_pass_flops(n, K + 1, P.d)                 # the pass's GEMMs
        dense_flops = dense_schur_flops(n, K, lay.coupled)
        rate = flops / schur
        nlr_it = nl.seconds / nl.n_iter
        row = {"n": n, "seconds_per_newton_step": per_step, "schur_pass_seconds": schur,
               "schur_flops": flops, "dense_schur_flops": dense_flops, "schur_flops_per_second": rate,
               "nlr_seconds_per_iteration": nlr_it, "memory_rise_bytes": mem.peak_above_start}
        out["rows"].append(row)
        print(f"{n:>9} {per_step:>14.3f} {schur:>13.3f} {rate / 1e9:>14.2f} {rate / peak_rate:>8.2f} "
              f"{nlr_it:>9.4f} {per_step / nlr_it:>12.0f} {per_step / n * 1e6:>12.2f} "
              f"{mem.peak_above_start / n:>15.0f}")
    out["shapes"] = schur_shapes(peak_rate)
    return out


def schur_shapes(peak_rate, n=100_000, shapes=((4, 4), (10, 10), (10, 20), (16, 32))):
    """The Schur pass's flop rate as K (r = K + 1) and d grow (X in memory, n rows of a
    GMM padded with noise features to d): the GEMMs' share of the pass grows as
    r^2 (r + d)^2 against the O(r^2 + d r + d^2) elementwise work a row."""
    from dnomad.blocks import RowChunks, single_threaded_blas
    from dnomad.data import gmm_simplex
    from dnomad.kmeans_sdp.riemannian import KMeansManifold, KMeansProblem, random_start, schur_pass_flops

    rows = []
    print(f"\n== Schur pass by shape: n = {n:,} in memory ==")
    print(f"{'K':>3} {'d':>3} {'s/Schur pass':>13} {'GFLOP':>7} {'GFLOP/s':>8} {'x DGEMM':>8} {'dense GFLOP':>12}")
    for K, d in shapes:
        X, _ = gmm_simplex(n, n_clusters=K, gamma=1.2, random_state=0)
        X = np.hstack([X, 0.1 * np.random.default_rng(0).standard_normal((n, d - X.shape[1]))])
        with single_threaded_blas():
            data = RowChunks(X)
            M = KMeansManifold(n, K + 1, K)
            P = KMeansProblem(M, data, 0.01)
            it = P.load(random_start(M, np.random.default_rng(0)))
            lam = 1.0 + it.GVV / M.radius2                      # D_i's shift 1: every D_i positive definite
            P.solve(it, lam)                                    # warm-up
            t = time.perf_counter()
            P.solve(it, lam)
            seconds = time.perf_counter() - t
        flops = schur_pass_flops(n, K + 1, d)
        dense = dense_schur_flops(n, K, P.layout.coupled)
        rows.append({"K": K, "d": d, "n": n, "seconds": seconds, "flops": flops, "dense_flops": dense,
                     "flops_per_second": flops / seconds, "fraction_of_dgemm": flops / seconds / peak_rate})
        print(f"{K:>3} {d:>3} {seconds:>13.3f} {flops / 1e9:>7.1f} {flops / seconds / 1e9:>8.1f} "
              f"{flops / seconds / peak_rate:>8.2f} {dense / 1e9:>12.1f}")
    return rows


def sweep(param, values, n=500, K=4, gamma=1.2, mu=0.01):
    """Newton from 3 starts on the race instance at n points for each value of ``param``
    ("mu", with r = K + 1, or "r", with the given mu)."""
    from dnomad.blocks import RowChunks, single_threaded_blas
    from dnomad.data import gmm_simplex
    from dnomad.kmeans_sdp.riemannian import KMeansManifold, KMeansProblem, random_start, riemannian_newton

    X, y = gmm_simplex(n, n_clusters=K, gamma=gamma, random_state=0)
    out = {"n": n, "K": K, "gamma": gamma, "rows": []}
    fixed = "r = K + 1" if param == "mu" else f"mu = {mu}"
    print(f"\n== {param}: GMM n = {n}, K = {K}, gamma = {gamma}, {fixed}, 3 starts each ==")
    print(f"{param:>8} {'misclustering':>14} {'distance':>9} {'iterations':>11} {'seconds':>8} {'stop':>10}")
    with single_threaded_blas():
        data = RowChunks(X)
        for value in values:
            r, mu_value = (K + 1, value) if param == "mu" else (value, mu)
            M = KMeansManifold(n, r, K)
            for seed in range(3):
                res = riemannian_newton(KMeansProblem(M, data, mu_value),
                                        random_start(M, np.random.default_rng(seed)), max_iter=2000)
                row = {param: value, "seed": seed, "misclustering": misclustering(y, res.U, K),
                       "distance": membership_distance(res.U, y), "iterations": res.n_iter,
                       "seconds": res.seconds, "stop": res.stop_reason}
                out["rows"].append(row)
                print(f"{value:>8.3g} {row['misclustering']:>14.3f} {row['distance']:>9.2e} {res.n_iter:>11} "
                      f"{res.seconds:>8.2f} {res.stop_reason:>10}")
    return out


def real_sets(per_set=2000, seed=0):
    import dnomad
    from dnomad.data import letter, mnist, pendigits, satimage
    from dnomad.metrics import clustering_accuracy
    from sklearn.cluster import KMeans, SpectralClustering
    from sklearn.decomposition import PCA

    def sample(X, y):
        rng = np.random.default_rng(seed)
        keep = np.concatenate([rng.choice(np.flatnonzero(y == c), size=max(1, round(per_set * np.mean(y == c))),
                                          replace=False) for c in np.unique(y)])
        keep.sort()
        return X[keep], np.unique(y[keep], return_inverse=True)[1]

    def letters_a_to_e():
        X, y = letter()
        return X[y < 5], y[y < 5]

    def mnist_0_to_4():
        X, y = mnist(digits=[0, 1, 2, 3, 4])
        return X, y

    sets = {"pendigits": pendigits, "satimage": satimage, "letter A-E": letters_a_to_e, "MNIST 0-4": mnist_0_to_4}
    out = {"per_set": per_set, "rows": []}
    print(f"\n== real data: {per_set} points per set (class ratios kept), unit-variance features ==")
    print(f"{'set':>11} {'n':>5} {'d':>4} {'K':>3} {'Newton':>7} {'+mu/10':>7} {'NLR':>6} {'KMeans++':>9} "
          f"{'Spectral':>9} {'Newton s':>9} {'+mu/10 s':>9} {'NLR s':>7} {'Newton mu':>10}")
    for name, load in sets.items():
        X, y = sample(*load())
        if X.shape[1] > 50:
            X = PCA(20, random_state=0).fit_transform(X)      # d enters the Newton system as d (r - 1)
        X = (X - X.mean(axis=0)) / np.where(X.std(axis=0) > 0, X.std(axis=0), 1.0)
        K = len(np.unique(y))
        row = {"set": name, "n": len(X), "d": X.shape[1], "K": K}
        t = time.perf_counter()
        rn = dnomad.RiemannianKMeans(K, random_state=0, backend="local").fit(X)
        row["newton_seconds"] = time.perf_counter() - t
        row["newton_mu"], row["newton_stop"] = rn.mu_, rn.stop_reason_
        t = time.perf_counter()
        rn10 = dnomad.RiemannianKMeans(K, mu=[rn.mu_, rn.mu_ / 10], random_state=0, backend="local").fit(X)
        row["newton_cont_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        nl = dnomad.NLR(K, random_state=0, backend="local", max_iter=50000).fit(X)
        row["nlr_seconds"] = time.perf_counter() - t
        row["nlr_stop"] = nl.stop_reason_
        km = KMeans(K, init="k-means++", n_init=10, random_state=0).fit(X)
        sc = SpectralClustering(K, affinity="nearest_neighbors", n_neighbors=10, random_state=0).fit(X)
        for key, labels in (("newton", rn.labels_), ("newton_cont", rn10.labels_), ("nlr", nl.labels_),
                            ("kmeans", km.labels_), ("spectral", sc.labels_)):
            row[key] = 1.0 - clustering_accuracy(y, labels)
        out["rows"].append(row)
        print(f"{name:>11} {row['n']:>5} {row['d']:>4} {K:>3} {row['newton']:>7.3f} {row['newton_cont']:>7.3f} "
              f"{row['nlr']:>6.3f} {row['kmeans']:>9.3f} {row['spectral']:>9.3f} {row['newton_seconds']:>9.1f} "
              f"{row['newton_cont_seconds']:>9.1f} {row['nlr_seconds']:>7.1f} {row['newton_mu']:>10.3g}")
    return out


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(21, 9))
    if "fig3" in result:
        ax = axes[0, 3]
        f3 = result["fig3"]
        names = [name for name in ("newton", "nlr", "nlr_authors_step") if name in f3["runs"][0]]
        ax.boxplot([[e[name]["seconds"] for e in f3["runs"] if name in e] for name in names])
        ax.set_xticks(range(1, len(names) + 1))
        ax.set_xticklabels([f"{name}\n({sum(name in e for e in f3['runs'])} starts)" for name in names])
        ax.set_yscale("log")
        ax.set_ylabel("seconds to the stopping rule")
        ax.set_title(f"Fig. 3 instance: GMM n={f3['n']}, gamma={f3['gamma']}, mu={f3['mu']}")
    if "race" in result:
        entry = result["race"]["runs"][0]
        for ax, key, label in ((axes[0, 0], "misclustering", "mis-clustering"),
                               (axes[0, 1], "distance", "||UU^T - Z*||_F / ||Z*||_F")):
            for name, style in (("newton", "C0-"), ("newton_mu_0.1_0.01", "C3-"), ("nlr", "C1-"),
                                ("nlr_authors_step", "C2--")):
                rows = entry[name]["rows"]
                ax.plot([r["seconds"] for r in rows], [max(r[key], 1e-6) for r in rows], style, label=name)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("seconds")
            ax.set_ylabel(label)
            ax.legend()
        axes[0, 0].set_title(f"GMM n={result['race']['n']}, K={result['race']['K']}, "
                             f"gamma={result['race']['gamma']} (seed 0)")
    if "scaling" in result:
        ax = axes[0, 2]
        rows = result["scaling"]["rows"]
        ns = [r["n"] for r in rows]
        ax.loglog(ns, [r["seconds_per_newton_step"] for r in rows], "o-", label="Newton step (3 passes)")
        ax.loglog(ns, [r["nlr_seconds_per_iteration"] for r in rows], "s-", label="NLR iteration")
        ax.loglog(ns, [rows[-1]["seconds_per_newton_step"] * n / ns[-1] for n in ns], "k:", label="linear")
        before = result.get("scaling_before")
        if before:
            ax.loglog([r["n"] for r in before["rows"]], [r["seconds_per_newton_step"] for r in before["rows"]],
                      "o--", color="C0", alpha=0.4, label=f"Newton step, dense Schur sums ({before['commit']})")
        ax.set_xlabel("n (X read from Zarr)")
        ax.set_ylabel("seconds")
        ax.set_title("time per iteration")
        ax.legend()
    for ax, param, title in ((axes[1, 0], "mu", "mu phase transition"), (axes[1, 1], "r", "insensitivity to r")):
        rows = result.get("rank" if param == "r" else "mu", {}).get("rows", [])
        if rows:
            ax.plot([r[param] for r in rows], [r["misclustering"] for r in rows], "o", label="mis-clustering")
            ax.plot([r[param] for r in rows], [r["distance"] for r in rows], "x", label="distance to Z*")
            ax.set_xscale("log" if param == "mu" else "linear")
            ax.set_xlabel(param)
            ax.set_title(title)
            ax.legend()
    if "real" in result:
        ax = axes[1, 2]
        rows = result["real"]["rows"]
        methods = (("newton", "Newton, mu auto"), ("newton_cont", "Newton, then mu/10"), ("nlr", "NLR"),
                   ("kmeans", "KMeans++"), ("spectral", "Spectral"))
        width = 0.8 / len(methods)
        for i, (key, label) in enumerate(methods):
            ax.bar(np.arange(len(rows)) + (i - 2) * width, [r[key] for r in rows], width, label=label)
        ax.set_xticks(np.arange(len(rows)))
        ax.set_xticklabels([r["set"] for r in rows])
        ax.set_ylabel("mis-clustering")
        ax.set_title("real data")
        ax.legend()
    axes[1, 3].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--sizes", nargs="+", type=int, default=[10_000, 30_000, 100_000, 300_000, 1_000_000])
    ap.add_argument("--race-n", type=int, default=1000)
    ap.add_argument("--fig3-starts", type=int, default=50)
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, "riemannian_vs_nlr", plot)
        return
    # Parts not run this time keep their last results (the plot shows all of them).
    saved = os.path.join(HERE, "riemannian_vs_nlr.json")
    result = {}
    if set(args.parts) != set(PARTS) and os.path.exists(saved):
        import json

        with open(saved) as f:
            result = json.load(f)
    if "fig3" in args.parts:
        result["fig3"] = fig3(starts=args.fig3_starts)
    if "race" in args.parts:
        result["race"] = race(args.race_n)
    if "scaling" in args.parts:
        result["scaling"] = scaling(args.sizes)
    if "mu" in args.parts:
        result["mu"] = sweep("mu", [1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0])
    if "rank" in args.parts:
        result["rank"] = sweep("r", [5, 6, 8, 10, 12])
    if "real" in args.parts:
        result["real"] = real_sets()
    write_result(HERE, "riemannian_vs_nlr", result, plot)


if __name__ == "__main__":
    main()
