"""Connection flood against a running service (driven by bench/flood.sh).

Opens CONNECTIONS TCP connections to the API port that never send anything, watches each
until the service closes it, and meanwhile asks the probe port for /livez every 50 ms on a
fresh connection each time (as an orchestrator's probe does), timing every answer. Then
sends one request whose body never arrives in full and times the answer. Prints what it
saw; the numbers are measurements, not pass/fail checks.
"""

import argparse
import errno
import multiprocessing
import resource
import selectors
import socket
import statistics
import threading
import time


def percentile(values, fraction):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def probe_loop(addr, stop, latencies, failures):
    request = b"GET /livez HTTP/1.1\r\nhost: probe\r\nconnection: close\r\n\r\n"
    while not stop.is_set():
        started = time.monotonic()
        try:
            with socket.create_connection(addr, timeout=5) as sock:
                sock.sendall(request)
                answer = b""
                while b"\r\n\r\n" not in answer:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            if answer.startswith(b"HTTP/1.1 200"):
                latencies.append(time.monotonic() - started)
            else:
                failures.append(answer[:40])
        except OSError as error:
            failures.append(repr(error))
        stop.wait(0.05)


def flood(addr, count, bound):
    """Opens `count` idle connections; returns (seconds each closed connection was open,
    from its handshake to its close; connections still open after `bound` seconds;
    connections whose handshake never completed in that time)."""
    selector = selectors.DefaultSelector()
    established = {}
    connecting = set()
    closed = []

    def handle(timeout):
        for key, _ in selector.select(timeout=timeout):
            sock = key.fileobj
            if key.data == "connecting":
                connecting.discard(sock)
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    selector.unregister(sock)
                    sock.close()
                    continue
                established[sock] = time.monotonic()
                selector.modify(sock, selectors.EVENT_READ, "open")
                continue
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                closed.append(time.monotonic() - established.pop(sock))
                selector.unregister(sock)
                sock.close()

    for n in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        if sock.connect_ex(addr) not in (0, errno.EINPROGRESS):
            sock.close()
            continue
        selector.register(sock, selectors.EVENT_WRITE, "connecting")
        connecting.add(sock)
        # Handshakes and closes are timed while the flood goes on, not after it.
        if n % 100 == 99:
            handle(0)
    deadline = time.monotonic() + bound
    while (established or connecting) and time.monotonic() < deadline:
        handle(0.1)
    still_open, never_connected = len(established), len(connecting)
    for sock in list(established) + list(connecting):
        sock.close()
    return closed, still_open, never_connected


def flood_share(args):
    return flood(*args)


def flood_all(addr, count, bound):
    """`flood` spread over as many processes as this process's open-file limit requires
    (the limit is per process, and may not be raised above its hard value here)."""
    if count == 0:
        return [], 0, 0, 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    per_process = max(1, hard - 256)
    processes = -(-count // per_process)
    shares = [count // processes + (1 if i < count % processes else 0) for i in range(processes)]
    with multiprocessing.Pool(processes) as pool:
        results = pool.map(flood_share, [(addr, share, bound) for share in shares])
    closed = [seconds for result in results for seconds in result[0]]
    return closed, sum(r[1] for r in results), sum(r[2] for r in results), processes


def slow_body(addr):
    head = (
        b"POST /pools/p/assign HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n{"
    )
    with socket.create_connection(addr, timeout=60) as sock:
        started = time.monotonic()
        sock.sendall(head)
        answer = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
        return time.monotonic() - started, answer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--probe", required=True)
    parser.add_argument("--connections", type=int, default=20000)
    parser.add_argument("--bound", type=float, default=30.0)
    args = parser.parse_args()
    api = ("127.0.0.1", int(args.api))
    probe = ("127.0.0.1", int(args.probe))

    stop = threading.Event()
    latencies, failures = [], []
    prober = threading.Thread(target=probe_loop, args=(probe, stop, latencies, failures))
    prober.start()
    started = time.monotonic()
    closed, still_open, failed, processes = flood_all(api, args.connections, args.bound)
    took = time.monotonic() - started
    stop.set()
    prober.join()

    at_once = [s for s in closed if s < 1.0]
    timed_out = [s for s in closed if s >= 1.0]
    print(f"==> {args.connections} idle connections from {processes} processes, watched for {took:.1f} s")
    print(f"closed within 1 s (refused at the cap): {len(at_once)}")
    if timed_out:
        print(
            f"closed later (header timeout): {len(timed_out)}, after "
            f"min {min(timed_out):.3f} s, median {statistics.median(timed_out):.3f} s, "
            f"max {max(timed_out):.3f} s"
        )
    print(
        f"still open {args.bound:.0f} s after the last connect: {still_open}; "
        f"handshake never completed (SYNs dropped by a full backlog): {failed}"
    )
    ms = [1000 * s for s in latencies]
    print(
        f"==> /livez on the probe port during the flood: {len(ms)} answered, "
        f"{len(failures)} failed; p50 {percentile(ms, 0.5):.2f} ms, "
        f"p99 {percentile(ms, 0.99):.2f} ms, max {max(ms, default=float('nan')):.2f} ms"
    )
    for failure in failures[:5]:
        print(f"   failure: {failure}")
    seconds, answer = slow_body(api)
    status = answer.split(b"\r\n", 1)[0].decode()
    body = answer.split(b"\r\n\r\n", 1)[-1].decode()
    print(f"==> slow body (content-length 100, 1 byte sent): {status} after {seconds:.3f} s")
    print(body)


if __name__ == "__main__":
    main()
