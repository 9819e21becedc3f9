"""A siege of `baton serve`: 20 000 half-sent connections from 256 source addresses of
127.0.0.0/8 plus connections trickling their heads and their bodies a byte at a time,
while a client on an address that holds nothing else probes `/healthz` and an
authenticated `GET /runs` every 100 ms and the server's peak memory (VmHWM) is read every
100 ms.

Usage: siege.py HOST:PORT TOKEN SERVER_PID HEADER_TIMEOUT_S OUT.json

Prints nothing; writes what it saw to OUT.json for the Rust test to judge:
probes (each latency and status), the peak memory, and every slow connection's last byte
sent and when the server closed it (or that it never did).
"""

import asyncio
import json
import multiprocessing
import resource
import socket
import sys
import time

CONNECTIONS = 20_000
ATTACKERS = 2
SOURCES_PER_ATTACKER = 128
RAMP_S = 15.0
TRICKLERS = 100
TRICKLE_EVERY_S = 0.5


def raise_open_files(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        raise SystemExit(f"this process may open {soft} files (RLIMIT_NOFILE) and needs {needed}")


async def connect(host, port, source):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.bind((source, 0))
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 10)
    except BaseException:
        sock.close()
        raise
    return sock


async def until_closed(sock):
    """Reads until the server closes; returns when it did and what it sent."""
    loop = asyncio.get_running_loop()
    got = b""
    while True:
        try:
            chunk = await loop.sock_recv(sock, 4096)
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic(), got
        if not chunk:
            return time.monotonic(), got
        got += chunk[: max(0, 512 - len(got))]


async def slow(host, port, source, kind, token, end, out):
    """One slow connection: `half` sends part of a head and stops; `head` trickles a head
    that never ends; `body` sends a whole authenticated head and trickles its body."""
    loop = asyncio.get_running_loop()
    record = {"kind": kind, "last": None, "closed": None, "status": None}
    out.append(record)
    try:
        sock = await connect(host, port, source)
    except (OSError, asyncio.TimeoutError) as e:
        record["error"] = f"connect: {e}"
        return
    if kind == "body":
        first = (
            f"POST /scenarios/validate HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: text/plain\r\n"
            "Content-Length: 100000\r\n\r\nid: x\n"
        )
    else:
        first = f"POST /runs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: appl"
    closing = asyncio.ensure_future(until_closed(sock))
    try:
        await loop.sock_sendall(sock, first.encode())
        record["last"] = time.monotonic()
        if kind != "half":
            while time.monotonic() < end and not closing.done():
                await asyncio.sleep(TRICKLE_EVERY_S)
                if closing.done():
                    break
                await loop.sock_sendall(sock, b"a")
                record["last"] = time.monotonic()
    except OSError:
        pass
    closed_at, got = await closing
    record["closed"] = closed_at
    if got.startswith(b"HTTP/1.1 "):
        record["status"] = int(got[9:12])
    sock.close()


async def attack(index, host, port, token, start, patience):
    end = start + RAMP_S
    out = []
    sources = [f"127.77.{index}.{i + 1}" for i in range(SOURCES_PER_ATTACKER)]
    tasks = []
    for i in range(TRICKLERS):
        kind = "head" if i % 2 == 0 else "body"
        tasks.append(asyncio.ensure_future(slow(host, port, sources[i % len(sources)], kind, token, end, out)))
    mine = CONNECTIONS // ATTACKERS
    for i in range(mine):
        # A steady ramp over RAMP_S: the server is at its cap throughout.
        due = start + RAMP_S * i / mine
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(
            asyncio.ensure_future(slow(host, port, sources[i % len(sources)], "half", token, end, out))
        )
    done, pending = await asyncio.wait(tasks, timeout=max(1.0, end + patience - time.monotonic()))
    for t in pending:
        t.cancel()
    return out


def attacker(index, host, port, token, start, patience, results):
    raise_open_files(CONNECTIONS // ATTACKERS + TRICKLERS + 64)
    out = asyncio.run(attack(index, host, port, token, start, patience))
    results.put(out)


async def probe(host, port, path, token):
    began = time.monotonic()
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, local_addr=("127.0.0.1", 0)), 5
    )
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}Connection: close\r\n\r\n".encode())
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return int(head[9:12]), time.monotonic() - began


async def watch(host, port, token, pid, start, until):
    probes = []
    peak_kib = 0
    while time.monotonic() < until:
        tick = time.monotonic()
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak_kib = max(peak_kib, int(line.split()[1]))
        for path, auth in (("/healthz", None), ("/runs?limit=1", token)):
            try:
                status, took = await probe(host, port, path, auth)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                status, took = f"error: {e!r}", time.monotonic() - tick
            probes.append({"path": path, "status": status, "s": took, "at": tick - start})
        await asyncio.sleep(max(0.0, 0.1 - (time.monotonic() - tick)))
    return probes, peak_kib


def main():
    addr, token, pid, header_timeout, out_path = sys.argv[1:6]
    host, port = addr.rsplit(":", 1)
    port = int(port)
    header_timeout = float(header_timeout)
    patience = header_timeout + 3.0
    start = time.monotonic() + 1.0
    results = multiprocessing.get_context("fork").Queue()
    attackers = [
        multiprocessing.get_context("fork").Process(
            target=attacker, args=(i, host, port, token, start, patience, results)
        )
        for i in range(ATTACKERS)
    ]
    for a in attackers:
        a.start()
    probes, peak_kib = asyncio.run(watch(host, port, token, pid, start, start + RAMP_S + patience))
    slow = []
    for _ in attackers:
        slow.extend(results.get(timeout=60))
    for a in attackers:
        a.join(timeout=10)
    with open(out_path, "w") as f:
        json.dump({"probes": probes, "peak_kib": peak_kib, "slow": slow, "start": start}, f)


if __name__ == "__main__":
    main()
