# wsapp.py -- a WebSocket echo app that holds thousands of connections cheaply,
# for bench/streams.py. Python 3 stdlib only: one thread, selectors (epoll).
#
#   wsapp.py --port P [--log FILE]
#
# Every connection is a WebSocket (RFC 6455): the handshake (any request with a
# Sec-WebSocket-Key gets its 101; anything else 400 and a close), then text and
# binary frames are echoed, a ping gets its pong, a close frame is echoed and the
# connection ended. Fragmented messages are echoed frame by frame. No TLS, no
# extensions. tests/fixtures/proxyapp.py has a /ws route too and copes with 1,000
# (opened in 0.8 s, echo on all in 0.05 s), but with a thread each: 1,001 threads,
# 52.6 MB RSS, and their GIL hand-offs on the same 2 cores as drainit. This one
# is one thread.
#
# SIGTERM: logs "signal TERM mono=S t=MS" (CLOCK_MONOTONIC in seconds, as Python's
# time.monotonic(); epoch ms), closes what is left, exits 0.
# --log FILE also gets "listening port=P t=MS" and "exit 0 open=N t=MS" (N: the
# WebSockets still open at SIGTERM).
import argparse, base64, hashlib, os, selectors, signal, socket, struct, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--log")
opts = ap.parse_args()


def log(line):
    if opts.log:
        with open(opts.log, "a") as f:
            f.write("%s t=%d\n" % (line, int(time.time() * 1000)))


GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
sel = selectors.DefaultSelector()
term = []
signal.signal(signal.SIGTERM, lambda s, f: term.append((time.time(), time.monotonic())))
# The handler runs between select calls: the wakeup fd ends the wait at once.
wake_r, wake_w = socket.socketpair()
wake_r.setblocking(False)
wake_w.setblocking(False)
signal.set_wakeup_fd(wake_w.fileno())

lsn = socket.socket()
lsn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lsn.bind(("127.0.0.1", opts.port))
lsn.listen(1024)
lsn.setblocking(False)
sel.register(lsn, selectors.EVENT_READ, None)
sel.register(wake_r, selectors.EVENT_READ, "wake")
log("listening port=%d" % opts.port)


class Conn:
    def __init__(self, sock):
        self.sock, self.buf, self.upgraded, self.out = sock, b"", False, b""


def frame(op, data):
    n = len(data)
    if n < 126:
        return struct.pack(">BB", 0x80 | op, n) + data
    if n < 65536:
        return struct.pack(">BBH", 0x80 | op, 126, n) + data
    return struct.pack(">BBQ", 0x80 | op, 127, n) + data


def close(c):
    sel.unregister(c.sock)
    c.sock.close()


def send(c, data):
    # Small echoes on a local socket: a short write is finished blocking.
    c.sock.setblocking(True)
    try:
        c.sock.sendall(data)
    finally:
        c.sock.setblocking(False)


def serve(c):
    """Handles what is in c.buf; False when the connection is to be closed."""
    if not c.upgraded:
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            return len(c.buf) < 16384
        head, c.buf = c.buf[:end].decode("latin-1"), c.buf[end + 4 :]
        key = None
        for line in head.split("\r\n")[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "sec-websocket-key":
                key = v.strip().encode()
        if key is None:
            send(c, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return False
        acc = base64.b64encode(hashlib.sha1(key + GUID).digest())
        send(c, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
        c.upgraded = True
    while len(c.buf) >= 2:
        b0, b1 = c.buf[0], c.buf[1]
        op, ln, pos = b0 & 0x0F, b1 & 0x7F, 2
        if ln == 126:
            if len(c.buf) < 4:
                return True
            ln, pos = struct.unpack(">H", c.buf[2:4])[0], 4
        elif ln == 127:
            if len(c.buf) < 10:
                return True
            ln, pos = struct.unpack(">Q", c.buf[2:10])[0], 10
        mask = b""
        if b1 & 0x80:
            mask, pos = c.buf[pos : pos + 4], pos + 4
        if len(c.buf) < pos + ln:
            return True
        data = bytearray(c.buf[pos : pos + ln])
        c.buf = c.buf[pos + ln :]
        if mask:
            for i in range(len(data)):
                data[i] ^= mask[i % 4]
        if op == 0x8:
            send(c, frame(0x8, bytes(data[:2])))
            return False
        if op == 0x9:
            send(c, frame(0xA, bytes(data)))
        elif op in (0x0, 0x1, 0x2):
            send(c, frame(op, bytes(data)))
    return True


while not term:
    for key, _ in sel.select(timeout=0.1):
        if key.data == "wake":
            continue
        if key.data is None:
            try:
                s, _ = lsn.accept()
            except BlockingIOError:
                continue
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sel.register(s, selectors.EVENT_READ, Conn(s))
            continue
        c = key.data
        try:
            got = c.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            continue
        except OSError:
            got = b""
        if not got:
            close(c)
            continue
        c.buf += got
        try:
            keep = serve(c)
        except OSError:
            keep = False
        if not keep:
            close(c)

with open(opts.log or os.devnull, "a") as f:
    # the handler's time; mono: CLOCK_MONOTONIC in s, comparable across processes
    f.write("signal TERM mono=%.6f t=%d\n" % (term[0][1], term[0][0] * 1000))
left = [k.data for k in list(sel.get_map().values()) if isinstance(k.data, Conn)]
for c in left:
    close(c)
log("exit 0 open=%d" % len(left))
sys.exit(0)
