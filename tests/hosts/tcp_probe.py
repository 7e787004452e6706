#!/usr/bin/env python3
"""TCP probe for the test-host fixture's own test (tests/hosts/fixture_test.sh).

  tcp_probe.py serve ADDR PORT TIMEOUT_S   accepts one connection, prints
      "received N bytes in S seconds" (first byte to end of stream);
      exits 3 when nobody connects within TIMEOUT_S
  tcp_probe.py send ADDR PORT NBYTES TIMEOUT_S   connects (retrying until
      TIMEOUT_S: the server may not listen yet) and sends NBYTES
"""
import socket
import sys
import time


def serve(addr, port, timeout_s):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(1)
    s.settimeout(timeout_s)
    try:
        conn, _ = s.accept()
    except socket.timeout:
        print("nobody connected within %g s" % timeout_s)
        return 3
    conn.settimeout(timeout_s)
    n, start = 0, None
    while True:
        b = conn.recv(1 << 16)
        if not b:
            break
        start = start or time.monotonic()
        n += len(b)
    print("received %d bytes in %.3f seconds" % (n, time.monotonic() - (start or time.monotonic())))
    return 0


def send(addr, port, nbytes, timeout_s):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                print("cannot connect to %s:%d: %s" % (addr, port, e))
                return 3
            time.sleep(0.05)
    s.sendall(b"x" * nbytes)
    s.close()
    return 0


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) == 4 and a[0] == "serve":
        sys.exit(serve(a[1], int(a[2]), float(a[3])))
    if len(a) == 5 and a[0] == "send":
        sys.exit(send(a[1], int(a[2]), int(a[3]), float(a[4])))
    sys.exit("usage: tcp_probe.py serve ADDR PORT TIMEOUT_S | send ADDR PORT NBYTES TIMEOUT_S")
