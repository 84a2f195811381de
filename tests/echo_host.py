"""Echo backends in one process, for a test host (tests/backend_hosts.py): reads a JSON list of
`EchoServer` arguments (`"grpc": true`: a `GrpcEchoServer`'s) on its first line of input, prints `ready` once every one listens, and serves
until its input closes or SIGTERM."""

from __future__ import annotations

import json
import signal
import sys
import threading
from typing import Any

from gwpolicy.gateway.echo import EchoServer
from gwpolicy.gateway.grpcecho import GrpcEchoServer


def main() -> None:
    specs = json.loads(sys.stdin.readline())
    servers: list[Any] = [(GrpcEchoServer if s.get("grpc") else EchoServer)(
        s["pod"], s["namespace"], address=s["address"], port=s["port"], cert=s.get("cert"), key=s.get("key")).start()
        for s in specs]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("ready", flush=True)
    done.wait()
    for s in servers:
        s.stop()


if __name__ == "__main__":
    main()
