"""A TCP probe run inside emulated hosts: round trips and bulk rate over a real connection.

    python -m bench.wan.probe serve PORT [--once]           # echo small messages, sink bulk data
    python -m bench.wan.probe rtt HOST PORT [--count N]     # prints JSON: connect_ms, rtts_ms
    python -m bench.wan.probe bulk HOST PORT --bytes N      # prints JSON: seconds, mbit

A connection starts with one byte: ``e`` (echo: 64-byte messages back and forth, one at a time,
``TCP_NODELAY``) or ``b`` (bulk: the client sends N bytes, closes its side, the server answers
one byte once it has read everything, so the time covers delivery, not just the send buffer).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time

MSG = 64


def _recv_exact(c: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        got = c.recv(n - len(buf))
        if not got:
            raise ConnectionError("closed mid-message")
        buf += got
    return bytes(buf)


def _handle(c: socket.socket) -> None:
    with c:
        kind = c.recv(1)
        if kind == b"e":
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                try:
                    msg = _recv_exact(c, MSG)
                except ConnectionError:
                    return
                c.sendall(msg)
        elif kind == b"b":
            while c.recv(1 << 20):
                pass
            c.sendall(b"k")


def serve(port: int, once: bool, timeout: float) -> None:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    s.settimeout(timeout)
    print("listening", flush=True)
    while True:
        c, _ = s.accept()
        c.settimeout(None)
        if once:
            _handle(c)
            return
        threading.Thread(target=_handle, args=(c,), daemon=True).start()


def rtt(host: str, port: int, count: int) -> dict:
    t0 = time.perf_counter()
    c = socket.create_connection((host, port), timeout=10)
    connect_ms = (time.perf_counter() - t0) * 1000
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.sendall(b"e")
    out = []
    for k in range(count):
        msg = k.to_bytes(MSG, "big")
        t = time.perf_counter()
        c.sendall(msg)
        if _recv_exact(c, MSG) != msg:
            raise ConnectionError("echo mismatch")
        out.append(round((time.perf_counter() - t) * 1000, 3))
    c.close()
    return {"connect_ms": round(connect_ms, 3), "rtts_ms": out}


def bulk(host: str, port: int, n: int) -> dict:
    c = socket.create_connection((host, port), timeout=30)
    c.settimeout(120)
    t0 = time.perf_counter()
    c.sendall(b"b")
    block = b"x" * (1 << 16)
    left = n
    while left > 0:
        c.sendall(block[: min(left, len(block))])
        left -= min(left, len(block))
    c.shutdown(socket.SHUT_WR)
    if c.recv(1) != b"k":
        raise ConnectionError("no acknowledgement")
    dt = time.perf_counter() - t0
    c.close()
    return {"bytes": n, "seconds": round(dt, 4), "mbit": round(n * 8 / dt / 1e6, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="probe", description=__doc__.strip().splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("port", type=int)
    s.add_argument("--once", action="store_true")
    s.add_argument("--timeout", type=float, default=120.0, help="longest wait for a connection (s)")
    r = sub.add_parser("rtt")
    r.add_argument("host")
    r.add_argument("port", type=int)
    r.add_argument("--count", type=int, default=20)
    b = sub.add_parser("bulk")
    b.add_argument("host")
    b.add_argument("port", type=int)
    b.add_argument("--bytes", type=int, required=True)
    args = p.parse_args(argv)
    if args.cmd == "serve":
        serve(args.port, args.once, args.timeout)
    elif args.cmd == "rtt":
        print(json.dumps(rtt(args.host, args.port, args.count)))
    else:
        print(json.dumps(bulk(args.host, args.port, args.bytes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
