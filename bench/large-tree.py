# python3 bench/large-tree.py BIN ZOMBIES LIVE MODE [DELAY]   (MODE: subreaper or pid1; root)
# One drain of a large tree: the app forks LIVE sleeping children and
# ZOMBIES children it never reaps, ignores SIGTERM; drainit runs with
# --pre-drain-delay DELAY (default 0s) --drain-timeout 2s. Prints, from the kill of drainit: when
# the app got SIGTERM, when it died (polled every 2 ms), when drainit exited, and
# the report's times. Leaves its files in a temporary directory.
import json, os, signal, subprocess, sys, time, tempfile
BIG_TREE = r'''
import os, signal, time
mark = os.environ["MARK"]
def log(s):
    with open(mark, "a") as f:
        f.write("%s t=%d\n" % (s, int(time.time() * 1000)))
for _ in range(int(os.environ["LIVE"])):
    if os.fork() == 0:
        while True:
            time.sleep(60)
zombies = []
for _ in range(int(os.environ["ZOMBIES"])):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    zombies.append(pid)
for pid in zombies:
    while open("/proc/%d/stat" % pid).read().rsplit(") ", 1)[1][0] != "Z":
        time.sleep(0.001)
signal.signal(signal.SIGTERM, lambda s, f: log("app: got SIGTERM"))
log("app: started pid=%d" % os.getpid())
while True:
    time.sleep(0.05)
'''
bin_, z, l, mode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
delay = sys.argv[5] if len(sys.argv) > 5 else "0s"
d = tempfile.mkdtemp()
mark = os.path.join(d, "mark"); open(mark, "w").close()
err = open(os.path.join(d, "err"), "w")
env = dict(os.environ, MARK=mark, ZOMBIES=z, LIVE=l)
cmd = [bin_, "--probe-addr=off", "--pre-drain-delay", delay, "--drain-timeout", "2s", "--", "python3", "-c", BIG_TREE]
if mode == "pid1":
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"] + cmd
p = subprocess.Popen(cmd, env=env, stderr=err)
def children(pid):
    out = []
    for t in os.listdir("/proc/%d/task" % pid):
        out += [int(x) for x in open("/proc/%d/task/%s/children" % (pid, t)).read().split()]
    return out
while "app: started" not in open(mark).read():
    time.sleep(0.1)
drainit = p.pid if mode == "subreaper" else children(p.pid)[0]
app = [c for c in children(drainit)][0]
def alive(pid):
    try:
        return open("/proc/%d/stat" % pid).read().rsplit(") ", 1)[1][0] not in "ZX"
    except OSError:
        return False
t0 = time.time() * 1000
os.kill(drainit, signal.SIGTERM)
while alive(app):
    time.sleep(0.002)
died = time.time() * 1000
rc = p.wait()
exited = time.time() * 1000
got = [int(x.rsplit(" t=", 1)[1]) for x in open(mark) if x.startswith("app: got SIGTERM")]
rep = json.loads(open(os.path.join(d, "err")).read().strip().splitlines()[-1])
dr = rep["drain"]
print("%s zombies=%s live=%s rc=%d app got TERM +%d ms, app died +%d ms, exit +%d ms; report forwarded_at %s killed_at %s deadline %s finished_at %s abandoned %s in_flight %s orphans %s" % (
    mode, z, l, rc, got[0] - t0 if got else -1, died - t0, exited - t0, dr["forwarded_at_ms"], dr.get("killed_at_ms"), dr["deadline_ms"], dr["finished_at_ms"], dr["abandoned"], dr["in_flight_at_start"], rep["orphans_reaped"]))
