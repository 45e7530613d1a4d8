"""Helpers for tests that handle run stores."""
import zarr


def unfinish(store):
    """The store as a crash after the run's last checkpoint leaves it: no result record
    (a finished run is not resumed, and would need no cluster)."""
    group = zarr.open_group(store, mode="a")
    attrs = dict(group.attrs)
    attrs.pop("result")
    group.attrs.put(attrs)
