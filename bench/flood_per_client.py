"""One client's flood against the others (driven by bench/flood_per_client.sh).

An attacker bound to 127.0.0.2 opens ATTACK idle connections to the API port and as many
to the gateway, sends nothing, and keeps them as long as the service lets it. Meanwhile a
client bound to 127.0.0.3 asks the API port for /livez on a fresh connection and opens an
authenticated CONNECT tunnel through the gateway (to a local echo target, through a local
CONNECT proxy that is the pool's one member), each every 20 ms, and times them. Prints how
many connections the attacker holds, and the other client's success rate and latencies;
the numbers are measurements, not pass/fail checks.
"""

import argparse
import asyncio
import base64
import json
import time
import urllib.request

ATTACKER, OTHER = "127.0.0.2", "127.0.0.3"


def percentile(values, fraction):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def relay(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def connect_proxy(reader, writer):
    """A minimal CONNECT proxy: the pool's member."""
    head = await reader.readuntil(b"\r\n\r\n")
    host, port = head.split(b" ")[1].decode().rsplit(":", 1)
    up_reader, up_writer = await asyncio.open_connection(host, int(port))
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await asyncio.gather(relay(reader, up_writer), relay(up_reader, writer))


async def echo(reader, writer):
    await relay(reader, writer)


def admin(api, token, method, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{api}{path}",
        method=method,
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status


async def open_from(source, port):
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def attack(port, count, held, stop):
    """Opens `count` idle connections from the attacker; `held[0]` counts those open."""

    async def one():
        try:
            reader, writer = await open_from(ATTACKER, port)
        except OSError:
            return
        held[0] += 1
        try:
            read = asyncio.ensure_future(reader.read(1))
            await asyncio.wait([read, asyncio.ensure_future(stop.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            if read.done():
                held[1] += 1  # closed by the service
            else:
                read.cancel()
        except OSError:
            held[1] += 1
        finally:
            held[0] -= 1
            writer.close()

    return [asyncio.ensure_future(one()) for _ in range(count)]


async def livez(api, results):
    started = time.monotonic()
    try:
        reader, writer = await open_from(OTHER, api)
        writer.write(b"GET /livez HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        ok = answer.startswith(b"HTTP/1.1 200")
    except (OSError, asyncio.TimeoutError):
        ok = False
    (results["livez_ms"] if ok else results["livez_failed"]).append(
        (time.monotonic() - started) * 1000)


async def tunnel(gateway, target, results):
    started = time.monotonic()
    credential = base64.b64encode(b"web:any").decode()
    try:
        reader, writer = await open_from(OTHER, gateway)
        writer.write(f"CONNECT 127.0.0.1:{target} HTTP/1.1\r\nhost: 127.0.0.1:{target}\r\n"
                     f"proxy-authorization: Basic {credential}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        ok = head.startswith(b"HTTP/1.1 200")
        if ok:
            writer.write(b"ping")
            ok = await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        writer.close()
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        ok = False
    (results["tunnel_ms"] if ok else results["tunnel_failed"]).append(
        (time.monotonic() - started) * 1000)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", type=int, required=True)
    parser.add_argument("--gateway", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--attack", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()

    target = await asyncio.start_server(echo, "127.0.0.1", 0)
    proxy = await asyncio.start_server(connect_proxy, "127.0.0.1", 0)
    target_port = target.sockets[0].getsockname()[1]
    proxy_port = proxy.sockets[0].getsockname()[1]
    admin(args.api, args.token, "PUT", "/pools/web", {"rules": {"allow_private": True}})
    admin(args.api, args.token, "POST", "/pools/web/members",
          {"members": [f"http://127.0.0.1:{proxy_port}"]})

    stop = asyncio.Event()
    api_held, gateway_held = [0, 0], [0, 0]
    opening = time.monotonic()
    attackers = await attack(args.api, args.attack, api_held, stop)
    attackers += await attack(args.gateway, args.attack, gateway_held, stop)
    # The connects land and the attacker reads the service's closes: the counts settle.
    last = None
    while last != (api_held[0], gateway_held[0]):
        last = (api_held[0], gateway_held[0])
        await asyncio.sleep(0.5)
    print(f"==> attacker {ATTACKER}: {args.attack} idle connections to each port, opened and "
          f"settled in {time.monotonic() - opening:.1f} s")

    results = {"livez_ms": [], "livez_failed": [], "tunnel_ms": [], "tunnel_failed": []}
    at_start = (api_held[0], gateway_held[0])
    started = time.monotonic()
    while time.monotonic() - started < args.seconds:
        await asyncio.gather(livez(args.api, results),
                             tunnel(args.gateway, target_port, results))
        await asyncio.sleep(0.02)
    print(f"==> held by the attacker at the start and the end of the {args.seconds:.0f} s "
          f"window: API port {at_start[0]} and {api_held[0]}, gateway {at_start[1]} and "
          f"{gateway_held[0]}; closed by the service: API {api_held[1]}, "
          f"gateway {gateway_held[1]}")
    for kind in ("livez", "tunnel"):
        ok, failed = results[f"{kind}_ms"], results[f"{kind}_failed"]
        total = len(ok) + len(failed)
        what = ("GET /livez on the API port (fresh connection)" if kind == "livez"
                else "authenticated CONNECT through the gateway + echo")
        print(f"==> {OTHER}: {what}: {len(ok)}/{total} succeeded "
              f"({100 * len(ok) / max(total, 1):.1f} %); p50 {percentile(ok, 0.5):.2f} ms, "
              f"p99 {percentile(ok, 0.99):.2f} ms, max {max(ok, default=float('nan')):.2f} ms")
    stop.set()
    await asyncio.gather(*attackers, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main())
