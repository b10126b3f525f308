#!/usr/bin/env python3
"""Abusive clients of the rendezvous store (the multihost 'abuse' test): opens N connections to
ADDR:PORT at once and sends, before any handshake, garbage or frames larger than a handshake may
be, then waits until the server has closed every connection (end of file or reset) or DEADLINE
seconds have passed. Prints one JSON object: how many connected, how many the server closed,
how many it left open, and how long the slowest close took after the connection's last byte.

The frames (store/wire.h: a 4-byte big-endian length, then the payload), by connection index:
  even      'oversized': length 64 MiB (below the store's largest frame, far above a handshake's)
            and 256 KiB of its body: a server that buffers pre-handshake frames holds it all
  i % 6 = 1 'garbage': 64 random bytes
  i % 6 = 3 'huge': length 0xffffffff, then 1 KiB
  i % 6 = 5 'not_hello': a well-sized frame whose opcode is SET (the first request must be HELLO)
Random bytes come from a fixed seed: every run sends the same.

usage: store_abuse.py ADDR PORT N DEADLINE
"""
import errno
import json
import random
import select
import socket
import struct
import sys
import time

OVERSIZED_LEN = 64 << 20
OVERSIZED_SENT = 256 << 10


def frames(i, rng):
    if i % 2 == 0:
        return "oversized", struct.pack(">I", OVERSIZED_LEN) + rng.randbytes(OVERSIZED_SENT)
    kind = i % 6
    if kind == 1:
        return "garbage", rng.randbytes(64)
    if kind == 3:
        return "huge", struct.pack(">I", 0xFFFFFFFF) + rng.randbytes(1024)
    body = bytes([2]) + struct.pack(">I", 8) + b"mt/abuse" + struct.pack(">I", 80) + rng.randbytes(80)
    return "not_hello", struct.pack(">I", len(body)) + body


def main():
    addr, port, n, deadline_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    rng = random.Random(18)
    conns = {}
    start = time.monotonic()
    refused = 0
    for i in range(n):
        kind, data = frames(i, rng)
        s = socket.socket()
        s.setblocking(False)
        err = s.connect_ex((addr, port))
        if err not in (0, errno.EINPROGRESS):
            refused += 1
            s.close()
            continue
        conns[s.fileno()] = {"sock": s, "kind": kind, "out": memoryview(data), "connected": False,
                             "last_send": time.monotonic(), "closed": None, "refused": False}
    poller = select.poll()
    for fd, c in conns.items():
        poller.register(fd, select.POLLIN | select.POLLOUT)
    open_fds = set(conns)
    end = time.monotonic() + deadline_s
    while open_fds and time.monotonic() < end:
        for fd, ev in poller.poll(100):
            c = conns[fd]
            if c["closed"] is not None:
                continue
            closed = False
            if ev & select.POLLOUT and not c["connected"]:
                err = c["sock"].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err in (errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH):
                    c["refused"] = True
                    closed = True
                else:
                    c["connected"] = True
            if not closed and ev & select.POLLOUT and len(c["out"]):
                try:
                    sent = c["sock"].send(c["out"])
                    c["out"] = c["out"][sent:]
                    c["last_send"] = time.monotonic()
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    closed = True
            if not closed and ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    # a reply (the server saying why) is read and dropped; the close is what counts
                    if not c["sock"].recv(65536):
                        closed = True
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    closed = True
            if closed:
                c["closed"] = time.monotonic()
                poller.unregister(fd)
                open_fds.discard(fd)
            elif not len(c["out"]):
                poller.modify(fd, select.POLLIN)
    by_kind = {}
    for c in conns.values():
        k = by_kind.setdefault(c["kind"], {"sent": 0, "closed": 0, "open": 0, "refused": 0})
        k["sent"] += 1
        k["refused" if c["refused"] else "closed" if c["closed"] is not None else "open"] += 1
    waits = [c["closed"] - c["last_send"] for c in conns.values()
             if c["closed"] is not None and not c["refused"]]
    summary = {
        "connections": n,
        "refused": refused + sum(1 for c in conns.values() if c["refused"]),
        "closed_by_server": sum(1 for c in conns.values()
                                if c["closed"] is not None and not c["refused"]),
        "left_open": len(open_fds),
        "slowest_close_s": round(max(waits), 3) if waits else None,
        "elapsed_s": round(time.monotonic() - start, 3),
        "by_kind": by_kind,
    }
    for c in conns.values():
        c["sock"].close()
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
