"""A screenshot of the dask dashboard while a NOMAD fit runs on a 2-worker LocalCluster:
its /events page, where each pass the fit runs on the workers appears as it ends.

    python graphs/dashboard_screenshot.py          # needs Debian's chromium (apt install chromium)

The fit runs in a child process (cluster, scheduler and dashboard with it); this one
waits for its fifth outer iteration, takes the page headless, prints the passes the
scheduler's event log held, and stops the child.  Writes graphs/dashboard_events.png.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# A dashboard page captured before bokeh drew anything (its menu bar only).
BLANK_PAGE_BYTES = 20_000

CHILD = r"""
import json, sys
from distributed import Client, LocalCluster
import dnomad
from dnomad.blocks.cluster import PASS_EVENTS
from dnomad.data import two_rings

if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster) as client:
        def report(row):
            passes = {}
            for _, msg in client.get_events(PASS_EVENTS):
                passes[msg["pass"]] = passes.get(msg["pass"], 0) + 1
            print(json.dumps({"link": client.dashboard_link, "iteration": row["iteration"], "passes": passes}),
                  flush=True)
        dnomad.NOMAD(16, backend="distributed", max_iter=100000, rmse_tol=0, min_tol=0, objective_tol=0,
                     callback=report).fit(two_rings(3000)[0])
"""


def screenshot(browser, url, path):
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1500,900",
                    "--virtual-time-budget=20000", f"--screenshot={path}", url],
                   check=True, capture_output=True, timeout=120)


def main():
    import json

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("no chromium: apt install chromium, then run this again")
        return 1
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, bufsize=1)
    try:
        for line in child.stdout:
            state = json.loads(line)
            if state["iteration"] >= 5:
                break
        else:
            print("the fit ended before its fifth outer iteration")
            return 1
        base = state["link"].rsplit("/", 1)[0]
        for page in ("events",):
            # Headless chromium sometimes captures a bokeh page before its plots are drawn
            # (the bare page is about 14 kB): try again, a few times.
            path = os.path.join(HERE, f"dashboard_{page}.png")
            for attempt in range(6):
                screenshot(browser, f"{base}/{page}", path)
                if os.path.getsize(path) > BLANK_PAGE_BYTES:
                    break
                time.sleep(2)
            print(f"{page}: {os.path.getsize(path)} bytes after {attempt + 1} attempts")
        time.sleep(0.5)
        print(f"at outer iteration {state['iteration']}: passes in the scheduler's event log by name "
              f"{state['passes']}")
    finally:
        child.kill()
        child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
