"""Connection reuse of the blocking client: one kept-alive connection per thread, replaced
when the other side closes it."""

import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, List

from test_fake_service import P1, FakeService, json_answer

from proxy_allocator import Assignment, Client

ASSIGNED = json_answer(200, {"pool": "web", "proxy": P1, "assignments": 1})


class KeepAlive(unittest.TestCase):
    def setUp(self) -> None:
        self.fake = FakeService({
            ("POST", "/pools/web/assign"): ASSIGNED,
            ("POST", "/pools/last/assign"): (200, {"Connection": "close",
                                                   "Content-Type": "application/json"},
                                             b'{"pool":"last","proxy":"p","assignments":1}'),
        })
        self.addCleanup(self.fake.stop)

    def test_calls_from_one_thread_share_one_connection(self) -> None:
        with Client(self.fake.base) as client:
            for _ in range(5):
                self.assertEqual(client.assign("web"),
                                 Assignment(pool="web", proxy=P1, assignments=1))
        self.assertEqual(len(self.fake.ports), 5)
        self.assertEqual(len(set(self.fake.ports)), 1)

    def test_each_thread_gets_its_own_connection(self) -> None:
        client = Client(self.fake.base)
        self.addCleanup(client.close)
        client.assign("web")

        def twice() -> None:
            client.assign("web")
            client.assign("web")

        thread = threading.Thread(target=twice)
        thread.start()
        thread.join()
        client.assign("web")
        main, other = self.fake.ports[0], self.fake.ports[1]
        self.assertEqual(self.fake.ports, [main, other, other, main])
        self.assertNotEqual(main, other)

    def test_an_answer_that_closes_the_connection_makes_the_next_call_open_a_new_one(
            self) -> None:
        with Client(self.fake.base) as client:
            client.assign("last")
            client.assign("web")
            client.assign("web")
        first, second, third = self.fake.ports
        self.assertNotEqual(first, second)
        self.assertEqual(second, third)

    def test_a_connection_idle_for_longer_than_idle_timeout_is_not_reused(self) -> None:
        with Client(self.fake.base, idle_timeout=0.2) as client:
            client.assign("web")
            client.assign("web")
            # Time passing is what is tested: longer idle than the client keeps connections.
            time.sleep(0.3)
            client.assign("web")
        first, second, third = self.fake.ports
        self.assertEqual(first, second)
        self.assertNotEqual(second, third)

    def test_close_closes_the_connection_and_a_later_call_opens_a_new_one(self) -> None:
        client = Client(self.fake.base)
        client.assign("web")
        client.close()
        client.assign("web")
        client.close()
        self.assertNotEqual(self.fake.ports[0], self.fake.ports[1])


class IdleClose(unittest.TestCase):
    """A server (or a load balancer) that closes a kept-alive connection while it is idle,
    without saying so in the answer: the next call notices and opens a new one."""

    def setUp(self) -> None:
        self.ports: List[int] = []
        self.closed = threading.Semaphore(0)
        test = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                test.ports.append(self.client_address[1])
                body = b'{"pool":"web","proxy":"p","assignments":1}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                # Closed after the answer, as an idle timeout would.
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def shutdown_request(self, request: Any) -> None:
                super().shutdown_request(request)
                test.closed.release()

        self.server = Server(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        thread.start()

        def stop() -> None:
            self.server.shutdown()
            self.server.server_close()
            thread.join()

        self.addCleanup(stop)

    def test_a_connection_closed_while_idle_is_replaced_without_a_failed_call(self) -> None:
        base = "http://127.0.0.1:{}".format(self.server.server_address[1])
        with Client(base) as client:
            for _ in range(3):
                self.assertEqual(client.assign("web"),
                                 Assignment(pool="web", proxy="p", assignments=1))
                # The next call starts once the server has closed this connection.
                self.assertTrue(self.closed.acquire(timeout=5))
        self.assertEqual(len(set(self.ports)), 3)


if __name__ == "__main__":
    unittest.main()
