"""Parameter checks shared by the solvers' ``validate`` methods: one message per kind,
and the rule that a solver called from an estimator's fit does not check again."""
from __future__ import annotations

import contextlib
import contextvars
import math

import numpy as np

from .errors import InputValueError


def _is_int(val):
    return isinstance(val, (int, np.integer)) and not isinstance(val, bool)


def check_ints(params, names, minimum=1):
    """Each attribute in ``names`` is an integer >= ``minimum``."""
    for name in names:
        val = getattr(params, name)
        if not _is_int(val) or val < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise InputValueError(f"{name} must be {kind}; got {val!r}")


def _is_finite_number(val, *, positive):
    return not isinstance(val, bool) and isinstance(val, (int, float, np.number)) \
        and math.isfinite(val) and (val > 0 if positive else val >= 0)


def check_numbers(params, names, *, positive):
    """Each attribute in ``names`` is a finite number, > 0 (``positive``) or >= 0."""
    for name in names:
        val = getattr(params, name)
        if not _is_finite_number(val, positive=positive):
            raise InputValueError(f"{name} must be a finite number {'>' if positive else '>='} 0; "
                                  f"got {val!r}")


def check_time_limit(time_limit):
    """``time_limit`` is None or a finite number of seconds > 0."""
    if time_limit is not None and not _is_finite_number(time_limit, positive=True):
        raise InputValueError(f"time_limit must be None or a positive number of seconds; got {time_limit!r}")


def check_choices(params, allowed_by_name):
    """Each attribute named in ``allowed_by_name`` is one of its allowed values."""
    for name, allowed in allowed_by_name.items():
        if getattr(params, name) not in allowed:
            raise InputValueError(f"{name} must be one of {allowed}; got {getattr(params, name)!r}")


def check_count(name, val, lo, hi, bound):
    """``val`` is an integer with lo <= val <= hi (``bound`` names hi in the message)."""
    if not _is_int(val) or not lo <= val <= hi:
        raise InputValueError(f"{name} must be an integer with {lo} <= {name} <= {bound} = {hi}; "
                              f"got {val!r}")


# Set while an estimator's fit runs: it checked its solver's parameters (``params.validate``)
# before reading any data, so the solvers it calls do not check them again (scikit-learn's
# skip of nested validation).  A solver called directly checks them itself.
_PARAMS_CHECKED = contextvars.ContextVar("dnomad_params_checked", default=False)


@contextlib.contextmanager
def params_checked():
    """Inside: :func:`check_solver_params` is a no-op (the caller checked already)."""
    token = _PARAMS_CHECKED.set(True)
    try:
        yield
    finally:
        _PARAMS_CHECKED.reset(token)


@contextlib.contextmanager
def params_unchecked():
    """Inside: solvers check their parameters again (a user's callback during a fit
    may call a solver directly)."""
    token = _PARAMS_CHECKED.set(False)
    try:
        yield
    finally:
        _PARAMS_CHECKED.reset(token)


def check_solver_params(params, size):
    """A solver's entry check: ``params.validate(size)``, unless an estimator's fit
    checked them already (see :func:`params_checked`)."""
    if not _PARAMS_CHECKED.get():
        params.validate(size)


def generator_from_state(state):
    """A NumPy Generator in the saved ``bit_generator.state`` (of any bit generator:
    PCG64, MT19937, Philox, ...), as a checkpoint holds it."""
    generator = np.random.Generator(getattr(np.random, state["bit_generator"])())
    generator.bit_generator.state = state
    return generator
