"""A matmat pass over n x n float32 blocks on the GPU against the device's copy bandwidth.

    python graphs/gpu_matmat.py                       # n = 32768, blocks of 8192, k = 1, 8, 32
    python graphs/gpu_matmat.py --n 16384 --block-size 4096 --out /tmp/results

Needs CuPy and a CUDA GPU (run it with the device tool; the project's CI has none).
In one run: the device-to-device copy bandwidth (cupy.copyto of a 4 GiB array,
bytes read + written per second, best of 10), and BlockMatrix.matmat on CuPy blocks
(on the GPU all b x b blocks are stored, one cuBLAS GEMM each) for a device V of k
columns: the blocks' bytes read per second, best of 10, and that rate over the copy
bandwidth (the issue asks >= 70%).
For reference, a single cuBLAS GEMM over the whole n x n matrix (one contiguous array,
not blocks) is timed too.  Writes gpu_matmat.json and gpu_matmat.png to --out.
"""
from __future__ import annotations

import argparse
import os

import numpy as np
from _bench import replot, write_result

HERE = os.path.dirname(os.path.abspath(__file__))


def best_seconds(cp, fn, repeat=10):
    fn()
    cp.cuda.Device().synchronize()
    best = np.inf
    for _ in range(repeat):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return best


def copy_bandwidth(cp, nbytes=1 << 32):
    """Device-to-device copy: bytes read + written per second (best of 10)."""
    a = cp.ones(nbytes // 8, dtype=cp.float64)
    b = cp.empty_like(a)
    return 2 * a.nbytes / best_seconds(cp, lambda: cp.copyto(b, a))


def run(n, block_size, ks):
    from dnomad.blocks import device, from_array

    cp = device.cupy()
    props = cp.cuda.runtime.getDeviceProperties(0)
    copy_bw = copy_bandwidth(cp)
    rng = np.random.default_rng(0)
    host = rng.random((n, n), dtype=np.float32)
    host += host.T                                        # symmetric, built on the host
    bm = from_array(host, block_size=block_size, dtype=np.float32, device="cuda", check=False)
    full = cp.asarray(host)
    del host
    layout = bm.group.layout
    stored = sum(bm.group.block_nbytes(key) for key in layout.keys)
    rows = []
    for k in ks:
        V = cp.asarray(rng.random((n, k), dtype=np.float32))
        t_pass = best_seconds(cp, lambda: bm.matmat(V))
        t_gemm = best_seconds(cp, lambda: full @ V)
        err = float(cp.abs(bm.matmat(V) - full @ V).max() / cp.abs(full @ V).max())
        row = {"k": k, "pass_seconds": t_pass, "pass_read_Bps": stored / t_pass,
               "pass_over_copy": stored / t_pass / copy_bw, "gemm_seconds": t_gemm,
               "gemm_read_Bps": full.nbytes / t_gemm, "gemm_over_copy": full.nbytes / t_gemm / copy_bw,
               "max_rel_error": err}
        rows.append(row)
        print(f"k={k:3d}  pass {t_pass * 1e3:7.2f} ms  reads {row['pass_read_Bps'] / 1e12:5.2f} TB/s = "
              f"{row['pass_over_copy']:5.1%} of copy   |   one GEMM over the whole matrix "
              f"{row['gemm_read_Bps'] / 1e12:5.2f} TB/s = {row['gemm_over_copy']:5.1%}   (rel. error {err:.1e})",
              flush=True)
    return {"device": props["name"].decode(), "n": n, "block_size": block_size, "stored_bytes": stored,
            "copy_Bps": copy_bw, "rows": rows}


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [r["k"] for r in result["rows"]]
    ax.plot(ks, [r["pass_read_Bps"] / 1e12 for r in result["rows"]], "o-", label="matmat pass over the blocks")
    ax.plot(ks, [r["gemm_read_Bps"] / 1e12 for r in result["rows"]], "s:", label="one cuBLAS GEMM, whole matrix")
    ax.axhline(result["copy_Bps"] / 1e12, color="k", ls="--", label="copy bandwidth (read + write)")
    ax.axhline(0.7 * result["copy_Bps"] / 1e12, color="gray", ls=":", label="70% of copy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k (columns of V)")
    ax.set_ylabel("TB/s read")
    ax.set_title(f"{result['device']}: n = {result['n']}, float32 blocks of {result['block_size']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--block-size", type=int, default=8192)
    ap.add_argument("--k", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(args.out, "gpu_matmat", plot)
        return
    write_result(args.out, "gpu_matmat", run(args.n, args.block_size, args.k), plot)


if __name__ == "__main__":
    main()
