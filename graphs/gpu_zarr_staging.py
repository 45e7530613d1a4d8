"""Zarr reads and writes of GPU blocks: staged through host memory (what the engine does,
``dnomad.blocks.engine._zarr_write`` / ``_load_blocks``) against zarr's GPU buffers
(``zarr.config.enable_gpu()``: CuPy arrays in and out of the codec pipeline).

    python graphs/gpu_zarr_staging.py                    # on the GPU (the device tool)
    python graphs/gpu_zarr_staging.py --device cpu       # the host path alone (a check of the script)

In one run, for an n x n float32 matrix in b x b blocks, uncompressed (the engine's
scratch layout), written to a fresh local Zarr store and read back, best of --repeat:
  * host staging: block.get() then arr[...] = block; arr[...] then cupy.asarray;
  * GPU buffers: arr[...] = block (CuPy) and arr[...] -> CuPy inside enable_gpu();
  * for scale: device -> host and host -> device copies of one block (pageable memory)
    and a plain numpy write + read of the same bytes to the same disk (np.save / np.load).
Each path's result is checked equal to the blocks.  Writes land in the page cache: the
rates are what a checkpoint or a Zarr pass sees on an idle machine, not the disk's.
Writes gpu_zarr_staging.json and .png to --out.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np
from _bench import replot, write_result

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "gpu_zarr_staging"


def best(fn, repeat, sync=lambda: None):
    fn()
    sync()
    t = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        t = min(t, time.perf_counter() - t0)
    return t


def run(n, block_size, repeat, device, folder):
    import zarr

    from dnomad.blocks import device as dev
    from dnomad.blocks.engine import create_zarr_array

    xp = dev.cupy() if device == "cuda" else np
    sync = (lambda: xp.cuda.Device().synchronize()) if device == "cuda" else (lambda: None)
    rng = np.random.default_rng(0)
    nb = -(-n // block_size)
    bounds = [(i * block_size, min(n, (i + 1) * block_size)) for i in range(nb)]
    keys = [(i, j) for i in range(nb) for j in range(nb)]
    blocks = {k: xp.asarray(rng.random((bounds[k[0]][1] - bounds[k[0]][0],
                                        bounds[k[1]][1] - bounds[k[1]][0]), dtype=np.float32)) for k in keys}
    nbytes = sum(b.nbytes for b in blocks.values())
    out = {"device": device, "n": n, "block_size": block_size, "bytes": nbytes, "rows": []}
    if device == "cuda":
        out["device_name"] = xp.cuda.runtime.getDeviceProperties(0)["name"].decode()

    def add(label, seconds):
        out["rows"].append({"path": label, "seconds": seconds, "GB_per_s": nbytes / seconds / 1e9})
        print(f"{label:45s} {seconds:7.3f} s  {nbytes / seconds / 1e9:6.2f} GB/s", flush=True)

    def store(tag):
        url = os.path.join(folder, f"{tag}.zarr")
        shutil.rmtree(url, ignore_errors=True)
        return create_zarr_array(url, "A", n, block_size, np.float32)

    def write(arr, to_host):
        for (i, j), b in blocks.items():
            arr[slice(*bounds[i]), slice(*bounds[j])] = b.get() if to_host else b

    def read(arr, from_host):
        got = {}
        for (i, j) in keys:
            a = arr[slice(*bounds[i]), slice(*bounds[j])]
            got[(i, j)] = xp.asarray(a) if from_host else a
        return got

    def check(got):
        for k in keys:
            assert type(got[k]) is type(blocks[k]) and bool((got[k] == blocks[k]).all()), k

    arr = store("host")
    staged = device == "cuda"
    add("host staging: write" if staged else "numpy blocks: write", best(lambda: write(arr, staged), repeat, sync))
    add("host staging: read" if staged else "numpy blocks: read", best(lambda: read(arr, True), repeat, sync))
    check(read(arr, True))
    if device == "cuda":
        with zarr.config.enable_gpu():
            arr = store("gpu")
            add("zarr GPU buffers: write", best(lambda: write(arr, False), repeat, sync))
            add("zarr GPU buffers: read", best(lambda: read(arr, False), repeat, sync))
            check(read(arr, False))
        one = blocks[keys[0]]
        host = one.get()
        scale = nbytes / one.nbytes
        add("device -> host copies (scaled to all blocks)", scale * best(lambda: one.get(), repeat, sync))
        add("host -> device copies (scaled to all blocks)", scale * best(lambda: xp.asarray(host), repeat, sync))
    host_all = np.concatenate([(b.get() if device == "cuda" else b).ravel() for b in blocks.values()])
    path = os.path.join(folder, "plain.npy")
    add("numpy save, same bytes, same disk", best(lambda: np.save(path, host_all), repeat))
    add("numpy load, same bytes, same disk", best(lambda: np.load(path), repeat))
    return out


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    ax.barh([r["path"] for r in rows][::-1], [r["GB_per_s"] for r in rows][::-1], color="tab:blue")
    ax.set_xlabel("GB/s (all blocks)")
    ax.set_title(f"{result.get('device_name', result['device'])}: n = {result['n']}, float32 blocks of "
                 f"{result['block_size']}, {result['bytes'] / 2**30:.1f} GiB", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--block-size", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temporary folder)")
    ap.add_argument("--out", default=HERE)
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        replot(args.out, NAME, plot)
        return
    folder = args.dir or tempfile.mkdtemp(prefix="dnomad-zarr-staging-")
    try:
        result = run(args.n, args.block_size, args.repeat, args.device, folder)
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    write_result(args.out, NAME, result, plot)


if __name__ == "__main__":
    main()
