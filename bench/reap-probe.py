# python3 bench/reap-probe.py BIN PORT   (root)
# /healthz latency (every 10 ms for 6 s) while drainit reaps 20,000 orphans
# re-parented to it at once (a child of the app that never reaped them exits).
import os, socket, subprocess, sys, time, signal
bin_, port = sys.argv[1], int(sys.argv[2])
app = r'''
import os, time
if os.fork() == 0:
    kids = []
    for _ in range(20000):
        p = os.fork()
        if p == 0: os._exit(0)
        kids.append(p)
    for p in kids:
        while open("/proc/%d/stat" % p).read().rsplit(") ", 1)[1][0] != "Z": time.sleep(0.001)
    open(os.environ["OUT"], "w").write("go")
    time.sleep(0.5)
    os._exit(0)   # 20,000 zombies re-parented to drainit at once
time.sleep(120)
'''
out = "/tmp/h13-go"
try: os.unlink(out)
except OSError: pass
d = subprocess.Popen([bin_, "--probe-addr", "127.0.0.1:%d" % port, "--", "python3", "-c", app], env=dict(os.environ, OUT=out), stderr=subprocess.DEVNULL)
while not os.path.exists(out): time.sleep(0.05)
def probe():
    t = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    while s.recv(4096): pass
    return (time.time() - t) * 1000
lat = []
end = time.time() + 6
while time.time() < end:
    lat.append(probe()); time.sleep(0.01)
lat.sort()
print("/healthz during the reap of 20,000 orphans: n=%d p50 %.1f ms, p99 %.1f ms, max %.1f ms" % (len(lat), lat[len(lat)//2], lat[int(len(lat)*0.99)], lat[-1]))
d.send_signal(signal.SIGTERM); d.wait()
