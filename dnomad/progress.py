"""Progress of a fit, the same for every iterative method: each history row the solver
hands its callback updates one report (what scikit-learn, dask-ml and cuML users know as
``verbose``).

- ``verbose=0``: nothing.
- ``verbose=1``: one live line on a terminal (tqdm), rewritten in place: the method, the
  iteration, the objective, each stopping residual against its target, the passes over
  the data, the time so far and an estimate of what remains.  Where stderr is not a
  terminal (a SLURM log, a pipe) the same text as a plain line every ``every`` seconds.
- ``verbose=2``: that line for every iteration.

At ``verbose=0`` the same text goes to the method package's logger at INFO every
``every`` seconds (for a program that configures logging rather than a terminal);
each solver's per-iteration and per-pass lines are at DEBUG.

The estimate of what remains follows the residuals: the stopping rule is met when
log(residual / target) reaches 0 for every residual, and the estimate extrapolates the
rate at which the largest of them fell over the last rows (none while it does not fall).
A method with a fixed count of iterations and no residual target (HOTTOPIXX's epochs) is
estimated from its pace instead.
"""
from __future__ import annotations

import logging
import math
import sys
import time

from ._checks import params_unchecked


# Rows the estimate of what remains looks back over.
TREND_ROWS = 10


class Progress:
    """The report of one fit (see the module's docstring); call it with each history row.

    Parameters
    ----------
    name : str
        What runs, e.g. "NOMAD (conditional gradient)".
    verbose : int
        0, 1 or 2.
    targets : dict, optional
        Row key -> the value the stopping rule needs it at or below.
    show : tuple of str
        Other row keys to show (the objective first).
    iteration_key : str
        The row's iteration count ("iteration"; HOTTOPIXX: "epoch").
    max_iter : int, optional
        The iteration cap: with no ``targets``, the estimate of what remains is the pace
        times the iterations left.
    passes : {"total", "per_row", None}
        Whether the row's "passes" counts from the start, per iteration, or is absent.
    stream : file, optional
        Default sys.stderr.
    every : float
        Seconds between plain lines at ``verbose=1`` off a terminal.
    clock : callable
        Seconds, as time.perf_counter (the tests give their own).
    logger : str
        The logger of the INFO summaries at ``verbose=0`` (the method's package).
    """

    def __init__(self, name, *, verbose=0, targets=None, show=(), iteration_key="iteration", max_iter=None,
                 passes="total", stream=None, every=5.0, clock=time.perf_counter, logger="dnomad"):
        self.name = name
        self.verbose = int(verbose)
        self.targets = dict(targets or {})
        self.show = tuple(show)
        self.iteration_key = iteration_key
        self.max_iter = max_iter
        self.passes_mode = passes
        self.stream = sys.stderr if stream is None else stream
        self.every = float(every)
        self.clock = clock
        self.logger = logging.getLogger(logger)
        self.rows = 0
        self.passes = 0
        self._t0 = clock()
        self._last_line = -math.inf
        self._trend = []
        self._text = ""
        self._bar = None
        if self.verbose == 1 and _is_terminal(self.stream):
            from tqdm.auto import tqdm

            self._bar = tqdm(file=self.stream, desc=f"{name}: starting", bar_format="{desc}", dynamic_ncols=True,
                             leave=True)

    def __call__(self, row):
        """Report ``row``; returns None (a report never stops the run)."""
        if self.verbose <= 0 and not self.logger.isEnabledFor(logging.INFO):
            return None
        self.rows += 1
        if self.passes_mode == "total":
            self.passes = int(row.get("passes", self.passes))
        elif self.passes_mode == "per_row":
            self.passes += int(row.get("passes", 0))
        now = self.clock() - self._t0
        self._text = self._describe(row, now)
        if self.verbose <= 0:
            if now - self._last_line >= self.every:
                self._last_line = now
                self.logger.info("%s: %s", self.name, self._text)
        elif self._bar is not None:
            self._bar.set_description_str(f"{self.name}: {self._text}")
        elif self.verbose >= 2 or now - self._last_line >= self.every:
            self._last_line = now
            print(f"{self.name}: {self._text}", file=self.stream, flush=True)
        return None

    def close(self, stop_reason=None):
        """End the report: the live line stays as it last read, and a last line says how
        the run ended."""
        if self.verbose <= 0:
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elapsed = self.clock() - self._t0
        how = f"stopped ({stop_reason})" if stop_reason else "done"
        print(f"{self.name}: {how} after {self.rows} iterations, {self.passes} passes, {_seconds(elapsed)}",
              file=self.stream, flush=True)

    def _describe(self, row, now):
        parts = [f"it {row.get(self.iteration_key, self.rows)}"]
        for key in self.show:
            if row.get(key) is not None:
                parts.append(f"{key} {_number(row[key])}")
        for key, target in self.targets.items():
            if row.get(key) is not None:
                parts.append(f"{key} {float(row[key]):.2e}/{target:.0e}")
        if self.passes_mode is not None:
            parts.append(f"passes {self.passes}")
        parts.append(_seconds(now))
        remaining = self._remaining(row, now)
        if remaining == 0:
            parts.append("at the targets")
        elif remaining is not None:
            parts.append(f"~{_seconds(remaining)} left")
        return "  ".join(parts)

    def _remaining(self, row, now):
        if not self.targets:
            if self.max_iter is None or self.rows == 0:
                return None
            done = row.get(self.iteration_key, self.rows)
            return now / max(done, 1) * max(self.max_iter - done, 0)
        scores = [math.log(max(float(row[key]), 1e-300) / target) for key, target in self.targets.items()
                  if row.get(key) is not None and target > 0 and math.isfinite(float(row[key]))]
        if not scores:
            return None
        score = max(scores)
        self._trend = (self._trend + [(now, score)])[-TREND_ROWS:]
        if score <= 0:
            return 0.0
        (t_old, s_old), (t_new, s_new) = self._trend[0], self._trend[-1]
        if len(self._trend) < 3 or s_new >= s_old or t_new <= t_old:
            return None
        return s_new / ((s_old - s_new) / (t_new - t_old))


def with_progress(callback, progress):
    """A solver callback that reports each row to ``progress`` and then asks ``callback``
    (if any) whether to stop."""

    def report(row, *args):
        progress(row)
        if callback is None:
            return None
        with params_unchecked():          # the user's code: a solver it calls checks its parameters
            return callback(row, *args)
    return report


def _is_terminal(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _number(value):
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return str(value)
    value = float(value)
    return f"{value:.6g}" if 1e-3 <= abs(value) < 1e6 or value == 0 else f"{value:.2e}"


def _seconds(s):
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
