#!/usr/bin/env python3
"""The gateway against the same local upstream proxy used directly, in one run, alternating.

Started by bench/gateway.sh, which runs the service with GATEWAY_LISTEN and hands over its
addresses. This script starts, each in a process of its own, a local HTTP proxy (CONNECT
only, as a plain upstream member is) and the targets (a TLS target answering one request per
connection, a source that streams bytes, a sink that holds connections open), seeds a pool
with that proxy, then measures, each side in turn for ROUNDS rounds:

- new HTTPS tunnels per second with CONCURRENCY clients (connect, CONNECT, TLS handshake,
  one GET, close), and the setup latency of each tunnel (connect to the 200 of CONNECT);
- bytes per second over one long tunnel (BYTES bytes from the source);
- the service's memory per open tunnel (TUNNELS tunnels through the gateway, held open).

Ratios are gateway / direct, medians of the rounds.

    python3 bench/gateway.py   (through bench/gateway.sh)
"""

import asyncio
import json
import multiprocessing
import os
import socket
import ssl
import statistics
import sys
import time
import urllib.request

API = os.environ["API"]
GATEWAY = os.environ["GATEWAY"]
ADMIN = os.environ["ADMIN_TOKEN"]
WORKER = os.environ["WORKER_TOKEN"]
SERVICE_PID = int(os.environ["SERVICE_PID"])
CERT, KEY, CA = os.environ["CERT"], os.environ["KEY"], os.environ["CA"]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
DURATION = float(os.environ.get("DURATION", "5"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "64"))
BYTES = int(os.environ.get("BYTES", str(512 * 1024 * 1024)))
TUNNELS = int(os.environ.get("TUNNELS", "10000"))
CHUNK = 64 * 1024


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- servers, each run in a process of its own ------------------------------------------


async def pipe(reader, writer):
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def proxy_connection(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    host, port = head.split(b" ", 2)[1].decode().rsplit(":", 1)
    try:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
    except OSError:
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def tls_target(reader, writer):
    try:
        await reader.readuntil(b"\r\n\r\n")
        body = b"ok"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n" + body)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    writer.close()


async def source(reader, writer):
    chunk = b"x" * CHUNK
    left = BYTES
    try:
        while left > 0:
            writer.write(chunk[: min(CHUNK, left)])
            left -= CHUNK
            await writer.drain()
    except ConnectionError:
        pass
    writer.close()


async def hold(reader, writer):
    await reader.read()
    writer.close()


def serve(ports):
    async def main():
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(CERT, KEY)
        servers = [
            await asyncio.start_server(proxy_connection, "127.0.0.1", ports["proxy"], backlog=4096)
        ] if "proxy" in ports else [
            await asyncio.start_server(tls_target, "127.0.0.1", ports["tls"], ssl=context, backlog=4096),
            await asyncio.start_server(source, "127.0.0.1", ports["source"], backlog=4096),
            await asyncio.start_server(hold, "127.0.0.1", ports["hold"], backlog=4096),
        ]
        await asyncio.gather(*(s.serve_forever() for s in servers))

    asyncio.run(main())


# ---- the client --------------------------------------------------------------------------


def basic():
    import base64

    return "Basic " + base64.b64encode(f"bench:{WORKER}".encode()).decode()


async def open_tunnel(via, to, authorize):
    host, port = via.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    auth = f"Proxy-Authorization: {basic()}\r\n" if authorize else ""
    writer.write(f"CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n{auth}\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    return reader, writer


async def tunnels_per_second(via, authorize, tls_to, context):
    stop = time.perf_counter() + DURATION
    done, setups = 0, []

    async def worker():
        nonlocal done
        while time.perf_counter() < stop:
            started = time.perf_counter()
            reader, writer = await open_tunnel(via, tls_to, authorize)
            setups.append(time.perf_counter() - started)
            # TLS inside the tunnel, as a browser's HTTPS request.
            await writer.start_tls(context, server_hostname="127.0.0.1")
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await reader.read()
            writer.close()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return done / (time.perf_counter() - started), setups


async def bytes_per_second(via, authorize, source_to):
    reader, writer = await open_tunnel(via, source_to, authorize)
    started = time.perf_counter()
    got = 0
    while data := await reader.read(1 << 20):
        got += len(data)
    elapsed = time.perf_counter() - started
    writer.close()
    if got < BYTES:
        raise RuntimeError(f"only {got} of {BYTES} bytes arrived")
    return got / elapsed


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def memory_per_tunnel(hold_to):
    before = rss_kib(SERVICE_PID)
    held = []
    batch = 256
    for start in range(0, TUNNELS, batch):
        held += await asyncio.gather(
            *(open_tunnel(GATEWAY, hold_to, True) for _ in range(min(batch, TUNNELS - start)))
        )
    await asyncio.sleep(0.5)
    after = rss_kib(SERVICE_PID)
    for _, writer in held:
        writer.close()
    return (after - before) / TUNNELS, before, after


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def request(method, path, body):
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"http://{API}{path}", data=data, method=method)
    req.add_header("authorization", f"Bearer {ADMIN}")
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req) as answer:
        return answer.status


def main():
    ports = {"proxy": free_port(), "tls": free_port(), "source": free_port(), "hold": free_port()}
    servers = [
        multiprocessing.Process(target=serve, args=({"proxy": ports["proxy"]},), daemon=True),
        multiprocessing.Process(target=serve, args=({k: ports[k] for k in ("tls", "source", "hold")},), daemon=True),
    ]
    for server in servers:
        server.start()
    time.sleep(1)
    request("PUT", "/pools/bench", {"rules": {"allow_private": True}})
    request("POST", "/pools/bench/members", {"members": [f"http://127.0.0.1:{ports['proxy']}"]})
    proxy = f"127.0.0.1:{ports['proxy']}"
    context = ssl.create_default_context(cafile=CA)

    async def run():
        rates = {"gateway": [], "direct": []}
        speeds = {"gateway": [], "direct": []}
        setups = {"gateway": [], "direct": []}
        for round_ in range(ROUNDS):
            # Alternate which side goes first, so neither always runs on a warmer machine.
            order = [("gateway", GATEWAY, True), ("direct", proxy, False)]
            if round_ % 2:
                order.reverse()
            for side, via, authorize in order:
                rate, setup = await tunnels_per_second(via, authorize, f"127.0.0.1:{ports['tls']}", context)
                rates[side].append(rate)
                setups[side] += setup
                speeds[side].append(await bytes_per_second(via, authorize, f"127.0.0.1:{ports['source']}"))
            print(
                f"round {round_ + 1}: tunnels/s gateway {rates['gateway'][-1]:.0f} direct {rates['direct'][-1]:.0f}; "
                f"MB/s gateway {speeds['gateway'][-1] / 1e6:.0f} direct {speeds['direct'][-1] / 1e6:.0f}",
                flush=True,
            )
        per_tunnel, before, after = await memory_per_tunnel(f"127.0.0.1:{ports['hold']}")
        return rates, speeds, setups, per_tunnel, before, after

    rates, speeds, setups, per_tunnel, before, after = asyncio.run(run())
    med = statistics.median
    print()
    print("| measure | gateway | direct | ratio (goal) |")
    print("|---|---|---|---|")
    print(
        f"| new HTTPS tunnels/s, {CONCURRENCY} clients | {med(rates['gateway']):.0f} | {med(rates['direct']):.0f} "
        f"| {med(rates['gateway']) / med(rates['direct']):.2f} (≥ 0.7) |"
    )
    print(
        f"| bytes/s over one tunnel | {med(speeds['gateway']) / 1e6:.0f} MB/s | {med(speeds['direct']) / 1e6:.0f} MB/s "
        f"| {med(speeds['gateway']) / med(speeds['direct']):.2f} (≥ 0.9) |"
    )
    for name, p in (("p50", 0.5), ("p99", 0.99)):
        g, d = percentile(setups["gateway"], p) * 1e3, percentile(setups["direct"], p) * 1e3
        print(f"| tunnel setup {name} | {g:.2f} ms | {d:.2f} ms | +{g - d:.2f} ms |")
    print(
        f"| service memory per open tunnel, {TUNNELS} open | {per_tunnel:.1f} KiB | | (≤ 64 KiB; RSS {before} → {after} KiB) |"
    )
    for server in servers:
        server.terminate()


if __name__ == "__main__":
    sys.exit(main())
