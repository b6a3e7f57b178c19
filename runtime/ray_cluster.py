"""Joining a Ray cluster without waiting forever: where Ray will connect and whether anything
answers there, whether the cluster has the resources each worker asks for, and the process's
signal handlers kept through ``ray.init`` (which sets its own SIGTERM handler).

Ray is imported only by the callers: nothing here imports it at module level.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any, Iterator

from norcal.core.errors import NorcalError, shown
from norcal.core.files.outputs import STOP_SIGNALS

CONNECT_TIMEOUT_S = 3.0  # Ray itself retries an unreachable address for minutes
ENV = "RAY_ADDRESS"


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` or ``SCHEME://HOST:PORT``; a NorcalError otherwise."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rstrip("/").rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise NorcalError(f"address {shown(address)}: expected HOST:PORT, ray://HOST:PORT or auto",
                          param="address")
    return host, int(port)


def check_reachable(address: str | None, timeout: float = CONNECT_TIMEOUT_S, source: str | None = None) -> None:
    """Refuse in one line a ``HOST:PORT`` or ``ray://HOST:PORT`` address where nothing accepts
    a connection within ``timeout`` seconds (None and "auto" are Ray's to resolve). source:
    where the address comes from when not the ``address`` parameter (named in the error)."""
    import socket

    if address is None or address == "auto":
        return
    param = () if source else "address"
    if source:
        try:
            host, port = host_port(address)
        except NorcalError:
            raise NorcalError(f"{source} {shown(address)}: expected HOST:PORT, ray://HOST:PORT or auto") from None
    else:
        host, port = host_port(address)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        where = f" (from {source})" if source else ""
        raise NorcalError(f"cannot reach the Ray cluster at {address}{where}: {why} (checked for "
                          f"{timeout:g} s); is it running?", param=param) from None


def cluster_address(address: str | None) -> tuple[str | None, str | None]:
    """The address ``ray.init(address)`` will join and where it comes from: (``address``, None)
    when given; else $RAY_ADDRESS (which Ray takes over None and "auto"), then the cluster
    ``ray start`` recorded on this machine; (``address``, None) when Ray will start its own
    or report itself that it found none."""
    if address not in (None, "auto"):
        return address, None
    env = os.environ.get(ENV, "")
    if env and env not in ("auto", "local"):
        return env, ENV
    if env == "local":
        return None, None
    try:  # Ray's own lookup (private: skipped where a Ray version lacks it)
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment(address, None)
    except Exception:  # noqa: BLE001 - none found ("auto"), or another Ray version: Ray reports it
        return address, None
    if found in (None, "auto", "local"):
        return address, None
    return found, "the cluster `ray start` recorded on this machine"


def check_cluster_address(address: str | None, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """:func:`check_reachable` for the address Ray will join, however it is found."""
    where, source = cluster_address(address)
    check_reachable(where, timeout, source)


def check_resources(ray, gpus_per_worker: float, cpus_per_worker: float) -> None:
    """Refuse workers that ask for more GPUs or CPUs than the whole cluster has: Ray would
    wait forever to schedule them."""
    have = ray.cluster_resources()
    for kind, need, param in (("GPU", gpus_per_worker, "gpus_per_worker"), ("CPU", cpus_per_worker, "cpus_per_worker")):
        total = have.get(kind, 0)
        if need and total < need:
            asks = f"a {kind}" if need == 1 else f"{need:g} {kind}s"
            raise NorcalError(f"{param} asks each Ray worker for {asks}; the cluster has "
                              f"{f'{total:g}' if total else 'none'}", param=param)


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """The process's SIGINT / SIGTERM / SIGHUP handlers as they were before the block
    (``ray.init`` replaces SIGTERM's with one that exits with status 15 and a stack dump)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved: dict[int, Any] = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: set outside Python; nothing to put back
                signal.signal(sig, handler)
