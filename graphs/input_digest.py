"""What identifying a Zarr input by content costs: the first pass over the input with
and without its chunks' digest (dnomad.blocks.digest: the crc32c of every stored chunk's
bytes, noted as the pass reads them), from disk and from the page cache.

    python graphs/input_digest.py                    # Gram n = 12,000 (1.15 GB), rows 4e6 x 8
    python graphs/input_digest.py --n 4000 --rows 500000 --repeat 3

Three first passes, each in this process on the engine's thread pool, timed alternately
without and with the digest, ``--repeat`` times each (medians):

- ``gram in place``: a matvec pass over an n x n float64 Zarr Gram read in place (the
  zarr backend, as NOMAD and SymNMF read a precomputed Gram whose chunks match blocks);
- ``gram load``: the same Gram loaded into memory (the local backend's first pass);
- ``row chunks``: the construction pass of row chunks over a tall float64 Zarr X (as
  NOMAD's Burer-Monteiro path and the K-means solvers read X in Zarr).

"from disk": before every run the stores' files are evicted from the page cache
(posix_fadvise DONTNEED), so the pass reads the disk; the disk's cold read bandwidth
is measured in the same run.  Each row gives the medians' ratio (``overhead``: what a
user sees, within the runs' spread on a busy 2-core machine) and the digest's own work,
the crc32c of the stored bytes of the chunks the pass read, timed in memory (``crc_s``,
``crc_share`` of the plain pass).  Where the two differ, the rest is the crc running on
zarr's event-loop thread, which holds the GIL while the pass's own threads decode.
Writes graphs/input_digest.json and .png.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import time

import numpy as np
from _bench import cold_read_bandwidth, evict, write_result

HERE = os.path.dirname(os.path.abspath(__file__))


def make_inputs(root, n, rows, features, chunk, row_chunk):
    import zarr

    rng = np.random.default_rng(0)
    F = rng.standard_normal((n, 16))
    gram = zarr.create_array(store=os.path.join(root, "gram.zarr"), shape=(n, n), chunks=(chunk, chunk),
                             dtype="f8", overwrite=True)
    for r0 in range(0, n, chunk):
        gram[r0:r0 + chunk] = F[r0:r0 + chunk] @ F.T
    X = zarr.create_array(store=os.path.join(root, "rows.zarr"), shape=(rows, features),
                          chunks=(row_chunk, features), dtype="f8", overwrite=True)
    for r0 in range(0, rows, row_chunk):
        X[r0:r0 + row_chunk] = rng.standard_normal((min(row_chunk, rows - r0), features))
    os.sync()
    return os.path.join(root, "gram.zarr"), os.path.join(root, "rows.zarr")


def first_passes(gram_url, rows_url, scratch):
    """name -> run(on_digest): one first pass over an input."""
    from dnomad import blocks

    def in_place(on_digest):
        D = blocks.from_zarr(gram_url, backend="zarr", store=scratch, dtype=np.float64, on_digest=on_digest)
        D.matmat(np.ones((D.n, 1)))
        D.group.close()

    def load(on_digest):
        D = blocks.from_zarr(gram_url, backend="local", dtype=np.float64, on_digest=on_digest)
        D.group.close()

    def row_chunks(on_digest):
        with blocks.RowChunks(rows_url, on_digest=on_digest):
            pass

    return {"gram in place": (in_place, gram_url), "gram load": (load, gram_url),
            "row chunks": (row_chunks, rows_url)}


def crc_seconds(url, keys, repeat=3):
    """Seconds to take the crc32c of the stored bytes of the chunks ``keys`` (those the
    pass read), already in memory (the digest's own work; best of ``repeat``)."""
    from dnomad.blocks import digest

    chunks = [np.fromfile(os.path.join(url, key), np.uint8) for key in keys]
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        for chunk in chunks:
            digest.crc32c(chunk)
        best = min(best, time.perf_counter() - t)
    return best


def time_pass(run, url, on_digest, cold):
    if cold:
        evict(url)
    t = time.perf_counter()
    run(on_digest)
    return time.perf_counter() - t


def measure(args):
    root = args.store
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    gram_url, rows_url = make_inputs(root, args.n, args.rows, args.features, args.chunk, args.row_chunk)
    rows = []
    for name, (run, url) in first_passes(gram_url, rows_url, os.path.join(root, "scratch.zarr")).items():
        disk_bw, on_disk = cold_read_bandwidth(url)
        for cold in (True, False):
            run(None)                            # imports, handles, page cache (for the warm runs)
            plain, digested, seen = [], [], {}
            for _ in range(args.repeat):
                plain.append(time_pass(run, url, None, cold))
                digested.append(time_pass(run, url, seen.update, cold))
            plain_s, digest_s = float(np.median(plain)), float(np.median(digested))
            read = sum(v[1] for v in seen.values() if v)          # stored bytes of the chunks read
            crc_s = crc_seconds(url, sorted(k for k, v in seen.items() if v))
            row = {"pass": name, "from": "disk" if cold else "page cache", "bytes_on_disk": on_disk,
                   "bytes_read": read, "chunks": len(seen), "plain_s": plain_s, "digest_s": digest_s,
                   "plain_runs_s": plain, "digest_runs_s": digested,
                   "overhead": digest_s / plain_s - 1, "crc_s": crc_s, "crc_share": crc_s / plain_s,
                   "pass_bandwidth": read / plain_s,
                   "disk_cold_bandwidth": disk_bw}
            print(f"{name:14s} {row['from']:10s}  plain {plain_s:7.3f} s  digest {digest_s:7.3f} s  "
                  f"overhead {100 * row['overhead']:+6.1f}%  crc {100 * row['crc_share']:4.1f}% of the pass  ({read / 2**20:.0f} MiB read, {len(seen)} chunks, "
                  f"pass {row['pass_bandwidth'] / 1e9:.2f} GB/s, disk {disk_bw / 1e9:.2f} GB/s)", flush=True)
            rows.append(row)
    shutil.rmtree(root, ignore_errors=True)
    return rows


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    labels = [f"{r['pass']}\n({r['from']})" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["plain_s"] for r in rows], 0.4, label="first pass")
    ax.bar(x + 0.2, [r["digest_s"] for r in rows], 0.4, label="first pass with the input's digest")
    for i, r in enumerate(rows):
        ax.annotate(f"{100 * r['overhead']:+.1f}%\ncrc {100 * r['crc_share']:.1f}%", (i + 0.2, r["digest_s"]),
                    ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, 1.2 * max(max(r["plain_s"], r["digest_s"]) for r in rows))
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("seconds (median)")
    ax.legend(fontsize=8)
    env = result["environment"]
    ax.set_title(f"Digest of a Zarr input's chunks in its first pass ({env['machine']}; "
                 f"Gram n = {result['params']['n']}, rows {result['params']['rows']} x "
                 f"{result['params']['features']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12000, help="rows and columns of the Gram")
    ap.add_argument("--chunk", type=int, default=2000, help="the Gram's Zarr chunks (square)")
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows of the tall X")
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--row-chunk", type=int, default=250_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--store", default="/tmp/dnomad_input_digest")
    ap.add_argument("--plot-only", action="store_true")
    args = ap.parse_args()
    if args.plot_only:
        from _bench import replot

        replot(HERE, "input_digest", plot)
        return
    import dask
    import zarr

    import dnomad

    rows = measure(args)
    result = {"params": {k: v for k, v in vars(args).items() if k not in ("store", "plot_only")},
              "command": "python graphs/input_digest.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("store", "plot_only")),
              "environment": {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                              "python": platform.python_version(), "dnomad": dnomad.__version__,
                              "zarr": zarr.__version__, "dask": dask.__version__, "numpy": np.__version__},
              "rows": rows}
    write_result(HERE, "input_digest", result, plot)


if __name__ == "__main__":
    main()
