#!/usr/bin/env python3
"""Before/after probe for issue 10 at the HTTP level: runs the soak's bad inputs and the transport
checks (slowloris, 401 on keep-alive, SIGTERM with an idle connection) against one `lilac serve`
binary (demo model, CPU) and prints one line per check. Run it against the old and the new binary.

  tests/soak/probe.py BINARY
"""
import http.client
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import soak  # noqa: E402


def main():
    binary = sys.argv[1]
    port = soak.free_port()
    env = dict(os.environ, LILAC_THREADS="1")

    def start():
        p = subprocess.Popen([binary, "serve", "--model", os.path.join(soak.ROOT, "models/demo"),
                              "--device", "cpu", "--port", str(port), "--api-key", soak.KEY,
                              "--log-level", "off", "--ctx-size", "2048"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for _ in range(240):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        return p

    srv = start()
    results = []

    def check(name, ok, detail):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)

    for name, data, expected in soak.bad_inputs(port):
        t0 = time.time()
        try:
            raw = soak.raw_exchange(port, data, timeout=6)
            st = soak.status_of(raw)
        except OSError as e:
            st = f"error {e!r}"
        alive = srv.poll() is None
        check(name, st in expected and alive,
              f"status {st} (expected {sorted(expected)}), {time.time() - t0:.1f}s"
              + ("" if alive else f", SERVER DIED (exit {srv.poll()})"))
        if not alive:
            srv = start()
    if srv.poll() is None:
        # 401 with a body on a keep-alive connection, then a good request on it.
        body = b'{"content":"hello"}'
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer wrong\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                  + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        out = b""
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except socket.timeout:
            pass
        s.close()
        n = out.count(b"HTTP/1.1 ")
        lines = [line for line in out.split(b"\r\n") if line.startswith(b"HTTP/1.1")]
        check("401 leaves no body behind", n == 1 and b"Connection: close" in out,
              f"{n} responses: {lines}")
        # Slowloris: 200 connections trickling a request head; /health must still answer.
        slow = []
        for _ in range(200):
            x = socket.create_connection(("127.0.0.1", port), timeout=5)
            x.sendall(b"P")
            slow.append(x)
        worst = 0.0
        for _ in range(3):
            for x in slow:
                try:
                    x.sendall(b"O")
                except OSError:
                    pass
            t0 = time.time()
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                st = c.getresponse().status
            except OSError:
                st = 0
            worst = max(worst, time.time() - t0 if st == 200 else 99)
            time.sleep(1)
        for x in slow:
            x.close()
        check("slowloris: /health with 200 slow connections", worst < 1.0,
              f"slowest /health {worst:.2f}s")
        # SIGTERM with an idle keep-alive connection.
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        c.getresponse().read()
        t0 = time.time()
        srv.send_signal(signal.SIGTERM)
        srv.wait(timeout=60)
        check("SIGTERM with an idle keep-alive connection", time.time() - t0 < 2.0,
              f"exit after {time.time() - t0:.2f}s")
    else:
        check("server alive after the bad inputs", False, "it died")
    if srv.poll() is None:
        srv.kill()
    print(f"{sum(results)}/{len(results)} checks pass")


if __name__ == "__main__":
    main()
