"""NOMAD on one GPU (CuPy blocks): two rings at n = 20,000 against the CPU path, and all
70,000 MNIST digits.

    python graphs/gpu_nomad.py --parts cpu                 # here (no GPU): the CPU figure at n = 20,000
    python graphs/gpu_nomad.py --parts copy,blocksteps,rings,mnist    # on the GPU (the device tool)
    python graphs/gpu_nomad.py --parts mnist --device cpu --mnist-n 1750 --mnist-seconds 20   # a check
    python graphs/gpu_nomad.py --parts blocksteps --device cpu --blocksteps-n 4000            # a check
    python graphs/gpu_nomad.py --parts densestep --device cpu     # the dense eigenstep, here and on the GPU
    python graphs/gpu_nomad.py --plot-only

Measured in one run on the GPU:
  * blocksteps: each piece of one block Frank-Wolfe step (the default direction) timed
    alone at n = 20,000 for LOBPCG blocks of k = 40 (rings, K = 16) and 520 (MNIST,
    K = 256): the fused pass that applies the rank-k step, the low-rank line search (the
    pair as blocks in a Zarr store run them, each forming the direction A U^T by GEMM, and
    as blocks in memory run them, the line search storing it in M for the fused pass to
    read), one product
    M U, LOBPCG's own work;
  * densestep: the block step's dense path (k >= (n - 1) / 5; on the 6,903 MNIST zeros
    from the 159th outer iteration) against the formulation it replaced, on either
    device (--device cpu here);
  * the device's copy bandwidth (cupy.copyto of 4 GiB, bytes read + written per second);
  * rings: two rings, n = 20,000, K = 16 (graphs/nomad_scaling.py's instance), float32,
    run to the stopping rule: seconds, outer iterations, seconds / passes / eigensolver
    matvecs per inner Frank-Wolfe step, adjusted Rand index of the labels; the inner
    fused pass and a matvec timed alone, as bytes moved per second over the copy
    bandwidth;
  * mnist: all 70,000 digits (dnomad.data.mnist, D = F F^T of the centered, scaled
    784-pixel images, never formed: NOMAD keeps F), K = 256, float32, with
    --mnist-solver's settings (graphs/mnist_outer_projection.py's: "block", dnomad's
    defaults, saved as mnist_block; "paper", Alg. 2's loop with 10 inner steps, saved as
    mnist_paper, whose row is from commit 8ba0478, which formed D per block by a GEMM in
    every pass), for --mnist-seconds (then stopped by the callback) or to the stopping rule:
    seconds, outer iterations, passes, the stopping rule's quantities per outer
    iteration, peak device memory (CuPy's pool, sampled every 20 ms), the 2-D embedding
    (NOMAD.embedding_) drawn in gpu_nomad.png coloured by digit, and the adjusted Rand
    index of 10 spectral groups against the digit labels.
The CPU figure (--parts cpu) is NOMAD's seconds per inner step at the same n on the
machine that runs it (in memory, float32, all cores), over 2 outer iterations after
a first one.  Parts merge into gpu_nomad.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _bench import code_commit, pass_rate, write_result  # noqa: E402

import dnomad  # noqa: E402

NAME = "gpu_nomad"
RINGS_N, RINGS_K = 20_000, 16
# K = 256 on 70,000 digits: about 270 images per cluster of Q, the neighbourhood scale at
# which the paper's K = 128 on 9,603 zeros (75 per cluster) organized one digit; with 10
# digits of about 7,000 images each, every digit is covered by about 26 clusters, enough
# for Q to follow each digit's manifold rather than merge digits.
MNIST_K = 256


class DevicePeak:
    """Peak bytes of live CuPy arrays (``pool_used_peak``), held by CuPy's memory pool with
    its cached free chunks (``pool_peak``; CuPy frees those when an allocation would fail,
    so this one overstates what a run needs) and of device memory in use, sampled every
    20 ms."""

    def __init__(self, cp):
        self.cp = cp

    def __enter__(self):
        self.pool_peak = self.pool_used_peak = self.used_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        pool = self.cp.get_default_memory_pool()
        while True:
            free, total = self.cp.cuda.runtime.memGetInfo()
            self.pool_peak = max(self.pool_peak, pool.total_bytes())
            self.pool_used_peak = max(self.pool_used_peak, pool.used_bytes())
            self.used_peak = max(self.used_peak, total - free)
            if self._stop.wait(0.02):
                return

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def copy_bandwidth(cp, nbytes=1 << 32, repeat=10):
    a = cp.ones(nbytes // 8, dtype=cp.float64)
    b = cp.empty_like(a)
    best = np.inf
    for _ in range(repeat + 1):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        cp.copyto(b, a)
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    del a, b
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / best


def per_step(history, n_inner):
    h = history[1:] if len(history) > 1 else history     # the first outer iteration compiles
    steps = len(h) * n_inner
    return {"seconds_per_inner_step": sum(r["seconds"] for r in h) / steps,
            "passes_per_inner_step": sum(r["passes"] for r in h) / steps,
            "matvecs_per_inner_step": sum(r["eig_matvecs"] for r in h) / steps}


def pass_rates(device, n, copy_Bps, repeat=5):
    """The inner fused pass and a matvec on float32 state of size n: bytes moved per second."""
    from dnomad import blocks
    from dnomad.nomad import passes as nomad_passes
    from dnomad.data import two_rings

    F = blocks.prepare_gram_data(two_rings(n)[0])
    group = blocks.new_group(n, dtype=np.float32, backend="local", device=device)
    data = blocks.DataPanels(group, F.astype(np.float32))
    blocks.zeros_like_layout(group, ["P", "Gamma"])
    v = np.random.default_rng(0).standard_normal(n)
    v /= np.linalg.norm(v)
    v = blocks.passes.group_vector(group, v).astype(np.float64)
    out = {}
    for label, run in [
        ("inner pass (P, G written)", lambda: nomad_passes.nomad_pass(
            group, v=v, step=0.01, vv_scale=RINGS_K - 1, gamma=1.0, tau=1.0, update_gamma=False,
            full_stats=False, data=data)),
        ("matvec G v", lambda: blocks.matmat(group, "G", v))]:
        sec, rate = pass_rate(group, run, repeat)
        out[label] = {"seconds": sec, "bytes_per_s": rate, "over_copy": rate / copy_Bps if copy_Bps else None}
        print(f"  {label}: {sec * 1e3:.2f} ms, {rate / 1e9:.0f} GB/s"
              + (f" = {rate / copy_Bps:.0%} of copy" if copy_Bps else ""), flush=True)
    group.close()
    return out


def block_step_rates(device, n, copy_Bps=None, ks=(2 * RINGS_K + 8, 2 * MNIST_K + 8), repeat=3):
    """Wall seconds of each piece of one block Frank-Wolfe step (dnomad's default
    direction) on float32 state of size n, for LOBPCG blocks of k columns: the fused pass
    that applies a rank-k step and writes M = P - G / L, the low-rank line search, one
    product M U, and the eigensolver's own work (lobpcg_top, 4 iterations, minus its
    products).  Where the step's time goes on this device; with the copy bandwidth, each
    streaming piece's bytes over it (float32: the fused pass reads P and Gamma and writes
    P and M, 16 bytes an entry, plus 8 for the rank-k GEMM's read and write of P; the
    line search reads P, Gamma and the direction's rows, which it writes first: 16; with
    the direction stored in M the line search reads P and Gamma and writes M, 12, and the
    fused pass also reads M, 20)."""
    from dnomad import blocks
    from dnomad.blocks import device as dev
    from dnomad.data import two_rings
    from dnomad.linalg.lobpcg import lobpcg_top
    from dnomad.nomad import passes as nomad_passes

    sync = (lambda: dev.cupy().cuda.get_current_stream().synchronize()) if device == "cuda" else (lambda: None)

    def wall(run):
        run()
        sync()
        t0 = time.perf_counter()
        for _ in range(repeat):
            run()
        sync()
        return (time.perf_counter() - t0) / repeat

    F = blocks.prepare_gram_data(two_rings(n)[0])
    group = blocks.new_group(n, dtype=np.float32, backend="local", device=device)
    data = blocks.DataPanels(group, F.astype(np.float32))
    blocks.zeros_like_layout(group, ["P", "Gamma", "M"])
    rng = np.random.default_rng(0)
    ones = np.ones((n, 1)) / np.sqrt(n)
    out = {"n": n, "block_size": group.layout.block_size}
    for k in ks:
        U = np.linalg.qr(rng.standard_normal((n, k)) - 1.0 / n)[0]
        A = 0.01 * U
        U_dev = dev.to_device(U, device)
        row = {
            "fused pass, rank-k step, M written": wall(lambda: nomad_passes.nomad_pass(
                group, v=None, step=0.01, vv_scale=0.0, lowrank=(A, U), gamma=1.0, tau=0.0, update_gamma=False,
                full_stats=False, shifted=True, out_p=1.0, out_g=-1.0, out_name="M", data=data, exclude_d=True)),
            "low-rank line search": wall(lambda: nomad_passes.lowrank_line_search_pass(group, A=A, U=U, shift=1.0)),
            # The default for blocks in memory: the line search stores A U^T in M, the fused pass reads it.
            "line search, direction stored in M": wall(lambda: nomad_passes.lowrank_line_search_pass(
                group, A=A, U=U, shift=1.0, store="M")),
            "fused pass, step read from M, M written": wall(lambda: nomad_passes.nomad_pass(
                group, v=None, step=0.01, vv_scale=0.0, direction="M", gamma=1.0, tau=0.0, update_gamma=False,
                full_stats=False, shifted=True, out_p=1.0, out_g=-1.0, out_name="M", data=data, exclude_d=True)),
            "product M U": wall(lambda: blocks.matmat(group, "M", U_dev)),
        }
        counted = [0]

        def product(V):
            counted[0] += 1
            return blocks.matmat(group, "M", V)

        eig = wall(lambda: lobpcg_top(product, U_dev, constraint=dev.to_device(ones, device), tol=0.0,
                                      maxiter=4))
        row["LOBPCG's own work, 4 iterations"] = eig - counted[0] / (repeat + 1) * row["product M U"]
        out[str(k)] = row
        print(f"  n = {n}, k = {k}: " + ", ".join(f"{key} {sec * 1e3:.1f} ms" for key, sec in row.items()),
              flush=True)
        formed = row["fused pass, rank-k step, M written"] + row["low-rank line search"]
        stored = row["fused pass, step read from M, M written"] + row["line search, direction stored in M"]
        out[f"{k}_step_passes"] = {"direction formed twice": formed, "direction stored in M": stored}
        print(f"    a step's two passes: direction formed twice {formed * 1e3:.1f} ms, stored in M "
              f"{stored * 1e3:.1f} ms ({formed / stored:.2f}x)", flush=True)
        if copy_Bps:
            at_copy = {"fused pass, rank-k step, M written": 24.0 * n * n / copy_Bps,
                       "low-rank line search": 16.0 * n * n / copy_Bps,
                       "line search, direction stored in M": 12.0 * n * n / copy_Bps,
                       "fused pass, step read from M, M written": 20.0 * n * n / copy_Bps}
            out[f"{k}_copy_fraction"] = {key: sec / row[key] for key, sec in at_copy.items()}
            print("    at the copy bandwidth: " + ", ".join(
                f"{key} {sec * 1e3:.1f} ms ({sec / row[key]:.2f} of it)" for key, sec in at_copy.items()),
                flush=True)
    group.close()
    return out


def dense_step_rates(device, n, k=2004, repeat=2):
    """The block step's dense path (taken once 5 k >= n - 1) timed at size n, as the solver
    runs it (``_BlockDirection._eigs``), against the code it replaced (47b9087's branch,
    kept below as it was), on float32 blocks in memory; and its pieces timed alone:
    forming J M J (by one product with the centred identity, an n^3 GEMM, against reading
    M's blocks, ``blocks.dense``) and the eigenpairs (all n by syevd, as NumPy's eigh and
    the solver do, and, on the host, only the top k by syevr, which the solver does not
    use: it was slower here).  k = 2,004 is the 6,903 MNIST zeros' k at their first dense
    step.  M is a synthetic rank-64 matrix plus a diagonal, not the solver's M: syevr's
    time depends on how the eigenvalues cluster."""
    import scipy.linalg

    from dnomad import blocks
    from dnomad.blocks import device as dev
    from dnomad.nomad.cgm import NomadParams, _BlockDirection

    sync = (lambda: dev.cupy().cuda.get_current_stream().synchronize()) if device == "cuda" else (lambda: None)
    xp = dev.cupy() if device == "cuda" else np

    def best(run):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            value = run()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times), value

    rng = np.random.default_rng(0)
    F = rng.standard_normal((n, 64)).astype(np.float32)
    M = F @ F.T / 64 + np.diag(rng.standard_normal(n)).astype(np.float32)
    group = blocks.from_array(M, name="M", dtype=np.float32, device=device).group
    k = min(k, n - 2)
    direction = _BlockDirection(group, None, NomadParams(n_clusters=64, block_rank=k), None)
    assert direction._dense()

    def mm(X):                                  # the replaced branch's product, without D
        X = X.reshape(n, -1).astype(np.float64, copy=False)
        X = X - X.mean(axis=0)
        Y = blocks.matmat(group, "M", X).astype(np.float64, copy=False).reshape(n, -1)
        return Y - Y.mean(axis=0)

    def replaced():                             # 47b9087's dense branch, as it was
        Md = mm(dev.to_device(np.eye(n), group.device))
        Md = 0.5 * (Md + Md.T)
        Md -= (2.0 * xp.abs(Md).sum(axis=1).max() + 1.0) / n
        w, U = xp.linalg.eigh(Md)
        return dev.to_host(w[::-1][:k]), dev.to_host(U[:, ::-1][:, :k])

    before, (w_before, _) = best(replaced)
    now, (w_now, _, _) = best(lambda: direction._eigs(1.0, True))
    form_old, _ = best(lambda: mm(dev.to_device(np.eye(n), group.device)))
    # The solver's own J M J (it also symmetrizes, which dense_step_cpu's 0.19 s at aa94006 did not).
    form_new, Md = best(lambda: direction._centred_dense(1.0))
    eig_all, _ = best(lambda: xp.linalg.eigh(Md))
    if device == "cpu":
        eig_top, _ = best(lambda: scipy.linalg.eigh(Md, subset_by_index=[n - k, n - 1], driver="evr"))
    else:
        eig_top = None
    out = {"n": n, "k": k, "device": device, "code": code_commit(), "cpu_count": len(os.sched_getaffinity(0)),
           "dense step, the replaced code (47b9087)": before, "dense step now": now,
           "form J M J: product with the centred identity": form_old, "form J M J: read M's blocks": form_new,
           "eigenpairs: all n (syevd)": eig_all, "eigenpairs: the top k only (syevr)": eig_top,
           "max |eigenvalue difference| now vs replaced": float(np.abs(w_now - w_before).max()),
           "largest eigenvalue": float(w_now[0])}
    for key, value in out.items():
        print(f"  {key}: {value:.4g}" if isinstance(value, float) else f"  {key}: {value}", flush=True)
    print(f"  the dense step: {before / now:.2f}x faster (forming J M J {form_old / form_new:.1f}x)"
          + (f"; syevr for the top k alone takes {eig_top / eig_all:.2f}x syevd's time" if eig_top else ""),
          flush=True)
    group.close()
    return out


def run_rings(device, max_outer=None, seconds=None):
    from dnomad.data import two_rings

    X, y = two_rings(RINGS_N)
    t0 = time.perf_counter()

    def stop(row):
        return (max_outer is not None and row["iteration"] >= max_outer) or \
            (seconds is not None and time.perf_counter() - t0 > seconds)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = dnomad.NOMAD(n_clusters=RINGS_K, device=device, backend="local", max_iter=100000,
                           callback=stop).fit(X)
    out = {"n": RINGS_N, "K": RINGS_K, "device": device, "code": code_commit(), "direction": est.direction,
           "n_inner": est.n_inner, "seconds": time.perf_counter() - t0,
           "solve_seconds": sum(r["seconds"] for r in est.history_), "outer_iterations": est.n_iter_,
           "stop_reason": est.stop_reason_, **per_step(est.history_, est.n_inner),
           "rmse_neg": est.history_[-1]["rmse_neg"], "max_violation": est.history_[-1]["max_violation"],
           "objective": est.objective_, "ari": dnomad.metrics.adjusted_rand_score(y, est.labels_)}
    print(json.dumps(out), flush=True)
    return out


def run_mnist(seconds, max_outer, solver, n=None, device="cuda"):
    """NOMAD on MNIST (all digits, or a stratified subset of n at the same 273 images per
    cluster) with mnist_outer_projection's settings for ``solver`` ("block": dnomad's
    defaults; "paper": Alg. 2's loop), for ``seconds`` or to the stopping rule."""
    from dnomad.blocks import device as dev
    from mnist_outer_projection import PER_CLUSTER, SOLVERS, stratified_subset

    cp = dev.cupy() if device == "cuda" else None
    X, y = dnomad.data.mnist()
    if n is not None and n < len(X):
        idx = stratified_subset(y, n)
        X, y = X[idx], y[idx]
    K = MNIST_K if len(X) == 70_000 else max(2, int(round(len(X) / PER_CLUSTER)))
    t0 = time.perf_counter()

    def stop(row):
        print(f"  it {row['iteration']:4d}  obj {row['objective']:.6g}  rmse_neg {row['rmse_neg']:.2e}  "
              f"max_viol {row['max_violation']:.2e}  passes {row['passes']}  matvecs {row['eig_matvecs']}  "
              f"{row['seconds']:.2f}s", flush=True)
        return time.perf_counter() - t0 > seconds or row["iteration"] >= max_outer

    with (DevicePeak(cp) if cp is not None else NoPeak()) as peak, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est = dnomad.NOMAD(n_clusters=K, device=device, backend="local", max_iter=100000, callback=stop,
                           **SOLVERS[solver],
                           label_method="spectral", n_groups=10, random_state=0).fit(X)
    h = est.history_
    solve = sum(r["seconds"] for r in h)
    out = {"n": len(X), "d": X.shape[1], "K": K, "solver": solver, "device": device, "n_inner": est.n_inner,
           "direction": est.direction, "block_size": est.Q_.block_size, "d_formed": False,
           "code": code_commit(),
           "seconds_total": time.perf_counter() - t0, "solve_seconds": solve,
           "outer_iterations": est.n_iter_, "stop_reason": est.stop_reason_,
           "seconds_per_outer": solve / len(h), **per_step(h, est.n_inner),
           "passes": est.passes_["passes"], "bytes_read": est.passes_["bytes_read"],
           "bytes_written": est.passes_["bytes_written"],
           "objective": est.objective_, "rmse_neg": h[-1]["rmse_neg"], "max_violation": h[-1]["max_violation"],
           "peak_pool_bytes": peak.pool_peak, "peak_live_bytes": peak.pool_used_peak,
           "peak_device_used_bytes": peak.used_peak,
           "device_total_bytes": cp.cuda.runtime.memGetInfo()[1] if cp is not None else None,
           "history": [{k: r[k] for k in ("iteration", "objective", "rmse_neg", "max_violation", "seconds",
                                          "eig_matvecs", "passes")} for r in h],
           "ari_spectral10": dnomad.metrics.adjusted_rand_score(y, est.labels_),
           "embedding": np.round(est.embedding_, 6).tolist(), "labels": y.tolist()}
    print(json.dumps({k: v for k, v in out.items() if k not in ("history", "embedding", "labels")}), flush=True)
    return out


class NoPeak:
    """DevicePeak's stand-in on the host (a check run): no device memory to sample."""

    pool_peak = pool_used_peak = used_peak = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def mnist_row(result):
    """(key, row) of the MNIST run the figure draws: dnomad's default steps where measured,
    else the paper's loop."""
    key = "mnist_block" if "mnist_block" in result else "mnist_paper"
    return key, result.get(key)


def row_device(result, key):
    """The GPU that measured ``result[key]`` (files before row_devices: the file's device)."""
    return result.get("row_devices", {}).get(key, result.get("device", "GPU"))


def _peak_gib(row):
    """The row's peak device memory in words: live arrays where recorded, else the pool."""
    if row.get("peak_live_bytes"):
        return f"{row['peak_live_bytes'] / 2**30:.1f} GiB live ({row['peak_pool_bytes'] / 2**30:.1f} in the pool)"
    return f"{row['peak_pool_bytes'] / 2**30:.1f} GiB in the pool"


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    ax = axes[0]
    key, m = mnist_row(result)
    if m:
        E, lab = np.asarray(m["embedding"]), np.asarray(m["labels"])
        for digit in range(10):
            sel = lab == digit
            ax.scatter(E[sel, 0], E[sel, 1], s=0.3, color=plt.cm.tab10(digit), label=str(digit), rasterized=True)
        ax.legend(markerscale=15, fontsize=7, ncol=2, title="digit")
        ax.set_title(f"NOMAD on all {m['n']:,} MNIST digits, K = {m['K']} ({row_device(result, key)}), "
                     f"{m.get('solver', 'paper')} steps\n"
                     f"{m['outer_iterations']} outer iterations ({m['stop_reason']}), "
                     f"{m['solve_seconds']:.0f} s, peak {_peak_gib(m)} on the device"
                     + ("\n(D formed per block by GEMM in every pass: commit 8ba0478)" if m.get("d_formed") else ""),
                     fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    ax = axes[1]
    bars = []          # (label, seconds per inner step, note)
    if result.get("cpu_rings"):
        r = result["cpu_rings"]
        bars.append((f"CPU ({r.get('cpu_count', '?')} cores)", r["seconds_per_inner_step"],
                     f"{r['outer_iterations']} outer (timed only)"))
    steps_of = {"rings_8ba0478": "paper's vertex steps",
                "rings_be3877b": "block steps,\narray expressions", "rings_da204a1": "block steps,\nCUDA kernels",
                "rings": "block steps, CUDA,\ndirection kept in M"}
    for key in steps_of:
        r = result.get(key)
        if r:
            steps = steps_of[key]
            gpu = row_device(result, key).replace("NVIDIA ", "").replace(" 80GB HBM3", "")
            bars.append((f"{gpu}, {r.get('code', '')}\n{steps}",
                         r["seconds_per_inner_step"],
                         f"{r['outer_iterations']} outer, {r['seconds']:.0f} s\n({r['stop_reason']})"))
    if bars:
        ax.bar([b[0] for b in bars], [b[1] for b in bars],
               color=["tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:olive"][:len(bars)])
        for i, (_, val, note) in enumerate(bars):
            ax.text(i, val, f"{val * 1e3:.1f} ms\n{note}", ha="center", va="bottom", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylim(top=max(b[1] for b in bars) * 8)
        ax.set_ylabel("seconds per inner Frank-Wolfe step")
        ax.set_title(f"two rings, n = {RINGS_N:,}, K = {RINGS_K}, float32 (the GPU rows run to the rule "
                     f"or a time cap)", fontsize=9)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="copy,rings,mnist")
    ap.add_argument("--mnist-seconds", type=float, default=480.0)
    ap.add_argument("--mnist-max-outer", type=int, default=100000)
    ap.add_argument("--mnist-solver", choices=("block", "paper"), default="block",
                    help="block: dnomad's defaults; paper: Alg. 2's loop (10 Frank-Wolfe steps per outer "
                         "iteration), as graphs/mnist_outer_projection.py runs them")
    ap.add_argument("--mnist-n", type=int, default=None,
                    help="a stratified subset of this many digits (a check on a small machine; the "
                         "json keeps only runs on all 70,000)")
    ap.add_argument("--blocksteps-n", type=int, default=RINGS_N,
                    help="n of the blocksteps part (the block step's pieces timed alone)")
    ap.add_argument("--dense-n", type=int, default=6903,
                    help="n of the densestep part (default: the 6,903 MNIST zeros of mnist_zero.py; "
                         "k = 2,004, their k at the first dense step, or n - 2)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check the script without a GPU")
    ap.add_argument("--rings-seconds", type=float, default=300.0)
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    path = os.path.join(args.out, f"{NAME}.json")
    result = {}
    for src in (os.path.join(HERE, f"{NAME}.json"), path):
        if os.path.exists(src):
            with open(src) as f:
                result.update(json.load(f))
    if "mnist" in result:        # rows before the solver choice ran the paper's loop
        result.setdefault("mnist_paper", result.pop("mnist"))
    if args.plot_only:
        plot(result, os.path.join(args.out, f"{NAME}.png"))
        return
    parts = args.parts.split(",")
    if "cpu" in parts:
        out = run_rings("cpu", max_outer=3)
        out["cpu_count"] = len(os.sched_getaffinity(0))
        result["cpu_rings"] = out
    if {"copy", "blocksteps", "densestep", "rings", "mnist"} & set(parts) and args.device == "cuda":
        from dnomad.blocks import device as dev

        cp = dev.cupy()
        result["device"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        # Which GPU measured each row (rows of several runs sit in one file).
        devices = result.setdefault("row_devices", {})
        for key in ("copy", "blocksteps", "densestep", "rings", "mnist"):
            if key in parts:
                devices.update({{"copy": "copy_Bps", "blocksteps": "block_step_cuda",
                                 "densestep": "dense_step_cuda", "rings": "rings",
                                 "mnist": f"mnist_{args.mnist_solver}"}[key]: result["device"]})
                if key == "rings":
                    devices["rings_passes"] = result["device"]
    if "copy" in parts:
        result["copy_Bps"] = copy_bandwidth(cp)
        print(f"copy bandwidth {result['copy_Bps'] / 1e12:.2f} TB/s", flush=True)
    if "blocksteps" in parts:
        result[f"block_step_{args.device}"] = block_step_rates(args.device, args.blocksteps_n,
                                                               result.get("copy_Bps") if "copy" in parts else None)
    if "densestep" in parts:
        result[f"dense_step_{args.device}"] = dense_step_rates(args.device, args.dense_n)
    if "rings" in parts:
        result["rings_passes"] = pass_rates("cuda", RINGS_N, result.get("copy_Bps"))
        if "rings" in result and "code" not in result["rings"]:   # the first GPU run's row, kept
            result["rings_8ba0478"] = dict(result.pop("rings"), code="8ba0478")
        result["rings"] = run_rings("cuda", seconds=args.rings_seconds)
    if "mnist" in parts:
        row = run_mnist(args.mnist_seconds, args.mnist_max_outer, args.mnist_solver, args.mnist_n, args.device)
        if row["n"] != 70_000 or args.device != "cuda":
            print("a check run: not saved", flush=True)
            return
        result[f"mnist_{args.mnist_solver}"] = row
    write_result(args.out, NAME, result, plot)


if __name__ == "__main__":
    main()
