#!/usr/bin/env python3
"""A tiny web app that stops gracefully, for trying drainit out (standard library only).

    drainit --pre-drain-delay 2s --ready-http http://127.0.0.1:8080/health -- \\
        python3 examples/demo-app.py 8080

    GET /            "hello"
    GET /slow?ms=N   answers after N milliseconds (default 3000): an in-flight request
    GET /health      200 "ok" while serving
    POST /drain/handoff[?ms=N]
                     the app's drain phase (docs/drain-phases.md): hand its work to
                     another replica, here by waiting N ms (default 200, never longer
                     than the Drainit-Phase-Budget-Ms drainit sends), then 200

On SIGTERM (or SIGINT) the app stops accepting new connections, lets every request
already in flight finish, and exits 0. That is the app's half of a graceful stop;
drainit's half is to keep routing away from it first (/readyz answers 503 from the
signal on, and the app only sees the signal after the pre-drain delay) and to
SIGKILL what is still running at the drain deadline.
"""

import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/":
            self.reply(200, "hello\n")
        elif url.path == "/health":
            self.reply(200, "ok\n")
        elif url.path == "/slow":
            ms = int(parse_qs(url.query).get("ms", ["3000"])[0])
            time.sleep(ms / 1000)
            self.reply(200, f"done after {ms} ms\n")
        else:
            self.reply(404, "not found\n")

    def do_POST(self):
        url = urlparse(self.path)
        if url.path != "/drain/handoff":
            self.reply(404, "not found\n")
            return
        # drainit says how long this phase may take: fit the work into it.
        budget = int(self.headers.get("Drainit-Phase-Budget-Ms", "0") or 0)
        ms = int(parse_qs(url.query).get("ms", ["200"])[0])
        if budget:
            ms = min(ms, budget)
        sys.stdout.write(f"demo-app: handing off, budget {budget} ms, taking {ms} ms\n")
        sys.stdout.flush()
        time.sleep(ms / 1000)
        self.reply(200, f"handed off in {ms} ms\n")

    def reply(self, status, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        if self.path == "/health":
            return  # drainit's check runs on every /readyz: keep the log readable
        sys.stderr.write("demo-app: %s %s\n" % (self.address_string(), fmt % args))


class Server(ThreadingHTTPServer):
    # Request threads are joined by server_close(): that is the "finish in-flight
    # requests" step. (ThreadingHTTPServer's default makes them daemon threads, which
    # would be cut off at exit.)
    daemon_threads = False
    block_on_close = True


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8080
    server = Server(("127.0.0.1", port), Handler)
    stopping = threading.Event()

    def stop(signum, _frame):
        if stopping.is_set():
            return
        stopping.set()
        sys.stderr.write(f"demo-app: {signal.Signals(signum).name}: finishing in-flight requests\n")
        # shutdown() waits for serve_forever() to return, so it must not run on the
        # thread that is inside serve_forever() (the main thread, where handlers run).
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stderr.write(f"demo-app: listening on 127.0.0.1:{port}\n")
    server.serve_forever()
    server.server_close()  # stops listening, then joins the request threads
    sys.stderr.write("demo-app: all requests finished, exiting 0\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
