"""Frank-Wolfe SymNMF streaming a large affinity from disk.

    python graphs/symnmf_out_of_core.py                       # n = 60000, 100 iterations
    python graphs/symnmf_out_of_core.py --n 20000 --iters 10 --store /tmp/p.zarr

The affinity P (Gaussian, bandwidth 4, of 10 Gaussian blobs in 10-D; float32, blocks of
about 64 MB) is built blockwise into a Zarr store on local disk: its upper blocks, half
of the n^2 entries (n = 60000: 7.2 GB on disk, 14.4 GB as a dense matrix).  A 2-worker
LocalCluster runs the passes, one task per block, reading each block from the store.

The kernel's page cache would otherwise keep the store in memory after its first read;
before every pass this script evicts the store's files from the page cache
(posix_fadvise DONTNEED), so every pass reads from the disk.  In the same run it
measures the disk's cold read bandwidth (plain reads of the same files, evicted first),
and reports each pass's bandwidth against it, and the peak resident memory of every
process (client and workers).  Writes graphs/symnmf_out_of_core.json and .png.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time
import warnings

import numpy as np
from _bench import cold_read_bandwidth, evict, write_result

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60000)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--store", default="/tmp/dnomad_symnmf_ooc.zarr")
    ap.add_argument("--memory-limit", default="2GiB", help="per worker")
    args = ap.parse_args()

    from distributed import Client, LocalCluster

    from dnomad import blocks
    from dnomad.blocks.engine import _worker_peak_rss
    from dnomad.data import gaussian_blobs
    from dnomad.symnmf import solvers as S

    if os.path.exists(args.store):
        shutil.rmtree(args.store)
    X, y = gaussian_blobs(args.n, n_centers=args.k, n_features=10, separation=4.0, random_state=0)
    X = X[np.random.default_rng(0).permutation(args.n)]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      memory_limit=args.memory_limit) as cluster, Client(cluster) as client:
        t = time.perf_counter()
        P = blocks.gaussian_affinity(X, 4.0, dtype=np.float32, backend="zarr", store=args.store,
                                     client=client)
        build_s = time.perf_counter() - t
        nbytes = P.group.matrix_nbytes
        disk_bw, on_disk = cold_read_bandwidth(args.store)
        print(f"n={args.n}: P upper blocks {nbytes / 1e9:.2f} GB ({on_disk / 1e9:.2f} GB of chunk "
              f"files; {args.n ** 2 * 4 / 1e9:.1f} GB dense), block {P.block_size}, built in "
              f"{build_s:.1f} s; disk cold read {disk_bw / 1e9:.2f} GB/s", flush=True)
        evict(args.store)
        fro2 = P.summary()["fro"] ** 2
        W0 = S.random_simplex_rows(args.n, args.k, np.random.default_rng(0))
        evict(args.store)
        mark = P.group.passes.mark()
        first = len(P.group.passes.records)

        def before_next_pass(row):
            evict(args.store)
            if row["iteration"] % 10 == 0:
                print(f"  it {row['iteration']:4d}  f {row['objective']:.6g}  gap {row['gap']:.3g}  "
                      f"{row['seconds']:.0f} s", flush=True)

        t = time.perf_counter()
        with warnings.catch_warnings(), blocks.single_threaded_blas():
            warnings.simplefilter("ignore")
            res = S.frank_wolfe(P, W0, S.SymNMFParams(n_components=args.k, max_iter=args.iters, tol=0),
                                fro2=fro2, callback=before_next_pass)
        wall = time.perf_counter() - t
        done = P.group.passes.since(mark)
        recs = P.group.passes.records[first:]
        pass_s = np.array([r.seconds for r in recs if r.name == "label_sums"])
        worker_peaks = client.run(_worker_peak_rss)
    client_peak = _worker_peak_rss()
    result = {
        "n": args.n, "k": args.k, "block_size": P.block_size, "stored_bytes": nbytes,
        "chunk_file_bytes": on_disk, "dense_bytes": args.n ** 2 * 4, "build_seconds": build_s,
        "disk_read_GBps": disk_bw / 1e9, "iterations": res.n_iter, "wall_seconds": wall,
        "passes": done["passes"], "pass_seconds_median": float(np.median(pass_s)),
        "pass_GBps_median": nbytes / float(np.median(pass_s)) / 1e9,
        "pass_over_disk": nbytes / float(np.median(pass_s)) / disk_bw,
        "pass_seconds": pass_s.tolist(), "objective": [r["objective"] for r in res.history],
        "worker_peak_rss": worker_peaks, "client_peak_rss": client_peak,
        "total_memory": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}
    print(f"\n{res.n_iter} FW iterations in {wall / 60:.1f} min ({done['passes']} passes over P, "
          f"{done['bytes_read'] / 1e12:.2f} TB read)")
    print(f"per pass: median {result['pass_seconds_median']:.2f} s, {result['pass_GBps_median']:.2f} GB/s "
          f"= {result['pass_over_disk']:.2f} x the disk's cold read bandwidth")
    print("peak resident memory: client {:.2f} GB; workers {}; P is {:.1f} GB".format(
        client_peak / 1e9, ", ".join(f"{v / 1e9:.2f} GB" for v in worker_peaks.values()), nbytes / 1e9))
    write_result(HERE, "symnmf_out_of_core", result, plot)
    shutil.rmtree(args.store)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    s = np.array(result["pass_seconds"])
    axes[0].plot(np.arange(1, len(s) + 1), result["stored_bytes"] / s / 1e9, ".", ms=3,
                 label="FW pass over P")
    axes[0].axhline(result["disk_read_GBps"], color="k", ls="--", lw=1, label="disk cold read")
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("GB/s")
    axes[0].set_title(f"n={result['n']}: P {result['stored_bytes'] / 1e9:.1f} GB streamed from disk")
    axes[0].legend(fontsize=8)
    axes[1].semilogy(result["objective"])
    axes[1].set_xlabel("iteration")
    axes[1].set_ylabel("f")
    names = ["client"] + [f"worker {i}" for i in range(len(result["worker_peak_rss"]))]
    vals = [result["client_peak_rss"]] + list(result["worker_peak_rss"].values())
    axes[2].barh(names, np.array(vals) / 1e9)
    axes[2].axvline(result["stored_bytes"] / 1e9, color="C3", ls="--", lw=1, label="size of P (stored)")
    axes[2].set_xlabel("peak resident memory (GB)")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
