"""Helpers for the tests that start a real Triton server: loopback ports, process trees, readiness."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 120
SHUTDOWN_TIMEOUT_S = 60


def require_triton():
    """Skip (with the reason) unless PyTriton and tritonclient are importable."""
    pytest.importorskip("pytriton.triton", reason="server tests need nvidia-pytriton: pip install 'vitfast[serve]'")
    pytest.importorskip("tritonclient.http", reason="server tests need tritonclient[http,grpc]: pip install 'vitfast[serve]'")
    pytest.importorskip("tritonclient.grpc", reason="server tests need tritonclient[http,grpc]: pip install 'vitfast[serve]'")


def free_ports(n: int = 3) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces and parentheses
    return int(fields[1]), fields[0]


def descendants(pid: int) -> dict[int, str]:
    """{pid: command line} of every live process below `pid`."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (info := _ppid_and_state(int(entry))):
            children.setdefault(info[0], []).append(int(entry))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        try:
            found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        todo.extend(children.get(child, []))
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    info = _ppid_and_state(pid)
    return info is not None and info[1] != "Z"


def wait_until_gone(pids, timeout: float = 10.0) -> list[int]:
    """The pids still alive after waiting up to `timeout` seconds (reparented orphans need a moment)."""
    deadline = time.monotonic() + timeout
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def wait_ready(http_url: str, models: list[str], process=None, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll the server until it and `models` are ready; fail with the server's stderr if it exits first."""
    import tritonclient.http as httpclient

    deadline = time.monotonic() + timeout
    with_client = httpclient.InferenceServerClient(http_url.removeprefix("http://"), connection_timeout=2.0, network_timeout=2.0)
    try:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                pytest.fail(f"the server exited with {process.returncode}: {process.stderr.read()[-2000:]}")
            try:
                if with_client.is_server_ready() and all(with_client.is_model_ready(m) for m in models):
                    return
            except Exception:  # connection refused while it starts
                pass
            time.sleep(0.5)
        pytest.fail(f"the server at {http_url} was not ready after {timeout} s")
    finally:
        with_client.close()
