"""Checkpoints of a multi-start run (Riemannian K-means' starts and stages, NLR's starts):
the running run's own state wrapped with where the run is (its tags: start, stage), the
generator, the rows of the runs done and the best start so far; and unwrapped on resume."""
from __future__ import annotations

import numpy as np

from .._checks import generator_from_state


def wrap(run_state, *, tags, rng, done, best, best_fields, best_arrays, **extra):
    """The multi-start state around ``run_state``: its history rows tagged with ``tags``
    after the rows ``done``; ``best`` (a result with history rows tagged "init") by its
    ``best_fields`` and ``best_arrays`` (saved as ``best_<name>``); ``extra`` scalars."""
    state = dict(run_state)
    state["history"] = [dict(row) for row in done] + [dict(row, **tags) for row in run_state["history"]]
    state.update(tags, rng=rng.bit_generator.state, best_init=None, **extra)
    if best is not None:
        state.update(best_init=int(best.history[0]["init"]), best={k: getattr(best, k) for k in best_fields},
                     **{f"best_{name}": getattr(best, name) for name in best_arrays})
    return state


def unwrap(state, *, match, tag_keys, run_keys):
    """(generator, running run's state with untagged rows, rows done, the best start's
    saved fields and arrays or None; arrays the row chunks wrote are not read).
    ``match``: the tag keys that name the running run (its rows are those with the
    state's values); ``tag_keys``: all the keys ``wrap`` added to a row; ``run_keys``:
    the running run's own state keys."""
    rows = [dict(row) for row in state["history"]]
    running = [all(row[k] == state[k] for k in match) for row in rows]
    run_state = {k: state[k] for k in run_keys}
    run_state["history"] = [{k: v for k, v in row.items() if k not in tag_keys}
                            for row, mine in zip(rows, running) if mine]
    done = [row for row, mine in zip(rows, running) if not mine]
    best = None
    if state.get("best_init") is not None:
        # An array the row chunks wrote (StoredRows) stays unread: the chunks read it back.
        best = dict(state["best"], history=[row for row in done if row["init"] == state["best_init"]],
                    **{k[len("best_"):]: v if hasattr(v, "rows") else np.asarray(v) for k, v in state.items()
                       if k.startswith("best_") and k != "best_init"})
    return generator_from_state(state["rng"]), run_state, done, best
