"""Linear programs by scipy's HiGHS, with a second method where the first gives up."""
from __future__ import annotations

import time

from .._checks import check_time_limit
from ..errors import InputValueError

# HiGHS's simplex (scipy's "highs" picks it for these LPs) can stop at model status
# Unknown on an LP that is feasible and bounded: AGKM's hull LP at f = 160, n = 1,600,
# eta = 0.95 (entries near 1e-3; scipy status 4, "HiGHS Status 15").  Interior point
# with crossover solves that LP, to the optimum of its inequality form, in 0.4 s where
# the simplex took 1.1 s to give up.
HIGHS_METHODS = ("highs", "highs-ipm")
# scipy's statuses that are the LP's answer (optimal, limit reached, infeasible,
# unbounded); any other (4: numerical trouble, and also HiGHS's "infeasible or
# unbounded", which the next method then settles) fails the method, and the next tries.
_ANSWERS = (0, 1, 2, 3)


def linprog_highs(c, *, methods=HIGHS_METHODS, time_limit=None, **constraints):
    """scipy.optimize.linprog by the HiGHS ``methods`` in turn, until one returns an answer
    (status 0-3); ``time_limit`` (seconds) covers them all, and a method that fails with
    none of it left ends the turn.  ``constraints``: linprog's A_ub, b_ub, A_eq, b_eq,
    bounds.  Returns the last method's OptimizeResult; where a method failed, its message
    says so: the answer's message followed by "(after <method>: <message>)", or, if no
    method answered, every method's failure."""
    from scipy.optimize import linprog

    if isinstance(methods, str) or not methods or any(m not in ("highs", "highs-ds", "highs-ipm") for m in methods):
        raise InputValueError(f"methods must name HiGHS methods ('highs', 'highs-ds', 'highs-ipm'); got {methods!r}")
    check_time_limit(time_limit)
    start, failures = time.perf_counter(), []
    for method in methods:
        options = {}
        if time_limit is not None:
            left = time_limit - (time.perf_counter() - start)
            if left <= 0 and failures:
                break
            options["time_limit"] = max(left, 1e-9)
        res = linprog(c, method=method, options=options, **constraints)
        if res.status in _ANSWERS:
            break
        failures.append(f"{method}: {res.message}")
    if failures and res.status not in _ANSWERS:
        res.message = "; ".join(failures)
    elif failures:
        res.message = f"{res.message} (after {'; '.join(failures)})"
    return res
