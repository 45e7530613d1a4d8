"""Helpers for tests that handle run stores."""
import zarr


def unfinish(store):
    """The store as a crash after the run's last checkpoint leaves it: no result record
    (a finished run is not resumed, and would need no cluster)."""
    group = zarr.open_group(store, mode="a")
    attrs = dict(group.attrs)
    attrs.pop("result")
    group.attrs.put(attrs)


def moto_s3_server(key_id, secret):
    """A moto S3 server on a free loopback port (a generator for a fixture): yields the
    environment that reaches it with these credentials; stopped after."""
    import socket

    import pytest

    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    # fsspec caches filesystems by their arguments, not by the environment: one made for an
    # earlier server (another test module in this process) would still point at its port.
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    yield {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    server.stop()
    s3fs.S3FileSystem.clear_instance_cache()
