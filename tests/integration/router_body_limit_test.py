#!/usr/bin/env python3
"""A body over --max_body_bytes gets its 413 and the API's error body, which the client reads: not
a connection reset.

  router_body_limit_test.py FERRY_ROUTER MODEL_GGUF

ferry-router on the default model with --max_body_bytes=64KiB, its worker an address nothing
listens on (the HTTP server refuses an oversized body before anything else looks at it). To each
API's path, bodies of the limit plus one byte and of 2, 4, 8 and 16 times the limit, sent by
Python's http.client (with Content-Length, and chunked: refused mid-body) and by curl (with its
Expect: 100-continue, and without, the body sent at once): every client must read status 413 and
the error body in its API's shape (Anthropic's under /v1/messages, OpenAI's elsewhere). The
server answers, half-closes, and reads what the client still sends for a second at most, then
closes: a client that keeps sending is cut off. A body of exactly the limit is taken.
Every process started is killed at the end (PR_SET_PDEATHSIG).
"""
import http.client
import json
import os
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ferry_services import TMP, start, stop_all  # noqa: E402

ROUTER, MODEL = sys.argv[1:3]
LIMIT = 64 << 10
SIZES = [LIMIT + 1, 2 * LIMIT, 4 * LIMIT, 8 * LIMIT, 16 * LIMIT]
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]
PORT = 0


def body_of(size):
    """A JSON body of exactly `size` bytes."""
    head, tail = b'{"model":"smol","prompt":"', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def check_error_body(test, path, raw, what):
    body = json.loads(raw)
    if path == "/v1/messages":
        test.assertEqual(body["type"], "error", what)
        test.assertEqual(body["error"]["type"], "request_too_large", what)
        message = body["error"]["message"]
    else:
        test.assertEqual(body["error"]["type"], "invalid_request_error", what)
        message = body["error"]["message"]
    test.assertIn(f"request body too large (at most {LIMIT} bytes)", message, what)


def http_client_post(path, body, chunked):
    """(status, body) as http.client reads them; raises what the connection does (a reset)."""
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
    try:
        headers = {"Content-Type": "application/json"}
        if chunked:
            pieces = (body[i:i + 16384] for i in range(0, len(body), 16384))
            conn.request("POST", path, body=pieces, headers=headers, encode_chunked=True)
        else:
            conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def curl_post(path, body, expect):
    """(curl's exit code, status, body) of curl --data-binary; `expect`: curl's own
    Expect: 100-continue for large bodies, else none (the body is sent at once)."""
    data = os.path.join(TMP, "body.json")
    out = os.path.join(TMP, "answer.json")
    with open(data, "wb") as f:
        f.write(body)
    if os.path.exists(out):
        os.remove(out)
    args = ["curl", "-sS", "--max-time", "30", "-o", out, "-w", "%{http_code}",
            "-H", "Content-Type: application/json", "--data-binary", "@" + data,
            f"http://127.0.0.1:{PORT}{path}"]
    if not expect:
        args[1:1] = ["-H", "Expect:"]
    done = subprocess.run(args, capture_output=True, text=True)
    answer = b""
    if os.path.exists(out):
        with open(out, "rb") as f:
            answer = f.read()
    return done.returncode, done.stdout.strip(), answer, done.stderr


class BodyLimitTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        global PORT
        _, ports = start(ROUTER, [f"--model={MODEL}", "--served_model_name=smol",
                                  "--workers=127.0.0.1:1", f"--max_body_bytes={LIMIT}"],
                         "router_body_limit")
        PORT = ports["http_port"]

    @classmethod
    def tearDownClass(cls):
        stop_all()

    def test_http_client_reads_the_413(self):
        for path in PATHS:
            for size in SIZES:
                for chunked in (False, True):
                    what = f"http.client {path} {size} bytes{' chunked' if chunked else ''}"
                    status, raw = http_client_post(path, body_of(size), chunked)
                    self.assertEqual(status, 413, what)
                    check_error_body(self, path, raw, what)

    def test_curl_reads_the_413(self):
        for path in PATHS:
            for size in SIZES:
                for expect in (True, False):
                    what = f"curl {path} {size} bytes{'' if expect else ' without Expect'}"
                    rc, status, raw, err = curl_post(path, body_of(size), expect)
                    self.assertEqual(rc, 0, f"{what}: {err}")
                    self.assertEqual(status, "413", what)
                    check_error_body(self, path, raw, what)

    def test_a_body_of_the_limit_is_taken(self):
        status, raw = http_client_post("/v1/completions", body_of(LIMIT), False)
        self.assertNotEqual(status, 413, raw)  # past the HTTP server: no worker is up (503)

    def test_a_client_that_keeps_sending_is_cut_off(self):
        # A header that announces 1 GiB, then body bytes without end: the 413 and the end of the
        # answer (the half-close), then the server stops reading (its lingering close gives up
        # after a second or 128 MiB) and closes, so the client's sends fail.
        with socket.create_connection(("127.0.0.1", PORT), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: 1073741824\r\n\r\n")
            received = b""
            while True:
                piece = s.recv(65536)
                if not piece:
                    break  # the server's half-close: the answer is whole
                received += piece
            self.assertTrue(received.startswith(b"HTTP/1.1 413 "), received[:100])
            self.assertIn(b"request body too large", received)
            sent = 0
            with self.assertRaises((BrokenPipeError, ConnectionResetError)):
                while sent < (1 << 30):
                    s.sendall(b"x" * 65536)
                    sent += 65536

if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
