/*
 * bench/helper.c — the timing-sensitive parts of the drainit benchmark.
 *
 * One multi-call binary, compiled on the fly by bench/run.sh
 * (`gcc -O2 -o helper helper.c`). Every time is CLOCK_MONOTONIC, in
 * nanoseconds, printed one number per line so that bench.py can aggregate.
 * Nothing here is part of drainit's test suite: tests never depend on timing.
 *
 *   helper spawn N CMD...            start CMD N times (posix_spawn + waitpid),
 *                                    print each start→exit wall time (ns);
 *                                    print "fail N" on stderr for non-zero exits.
 *   helper spawnmix N SEP CMD1... SEP CMD2...
 *                                    the same for several commands taking turns run
 *                                    by run; prints "<index> <ns>".
 *   helper sigchild FIFO             the child of the signal benchmark: on SIGUSR1
 *                                    it writes the time of receipt to FIFO; on
 *                                    SIGUSR2 it exits 0.
 *   helper siglat N FIFO CMD...      the sender: spawn CMD (an init wrapping
 *                                    `helper sigchild FIFO`), then N times: read the
 *                                    clock, kill(init, SIGUSR1), wait for the child's
 *                                    time stamp; print the difference (ns).
 *   helper orphans N [TIMEOUT_S]     run as the init's child in a fresh PID namespace:
 *                                    create N orphans (re-parented to PID 1) that all
 *                                    exit at once, then time how long until PID 1 has
 *                                    reaped every one of them.
 *   helper ignterm FIFO              ignore SIGTERM, write our pid to FIFO, sleep
 *                                    forever (the only way out is SIGKILL).
 *   helper deadline FIFO ERRFILE TERM_DELAY_MS CMD...
 *                                    spawn CMD (drainit wrapping `helper ignterm
 *                                    FIFO`) with stderr to ERRFILE, send it SIGTERM,
 *                                    and print "<ns from kill() to the child's death>
 *                                    <exit code of CMD>". The child's death is seen
 *                                    as EOF on the FIFO: the kernel closes a dying
 *                                    process's files before its parent can reap it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static void die(const char *what) {
    fprintf(stderr, "helper: %s failed: %s\n", what, strerror(errno));
    exit(1);
}

/* Spawn argv with stdout (and stderr unless errfile) redirected. */
static pid_t spawn_quiet(char **argv, const char *errfile) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, errfile ? errfile : "/dev/null",
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    /* The init under test gets a clean signal state, whatever ours is. */
    posix_spawnattr_t at;
    posix_spawnattr_init(&at);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (rc != 0) {
        errno = rc;
        die("posix_spawn");
    }
    return pid;
}

/* waitpid with a deadline; SIGKILL on expiry. Returns the exit code, 128+sig. */
static int wait_bounded(pid_t pid, long timeout_ms) {
    int64_t deadline = now_ns() + timeout_ms * 1000000LL;
    int st;
    /* A pidfd becomes readable the moment the process exits: the wait is as precise
     * as a blocking waitpid, yet bounded. (Polling waitpid with 1 ms sleeps would
     * round every start-up time up to the sleep's granularity, about 1.1 ms here.) */
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd >= 0) {
        struct pollfd p = {pfd, POLLIN, 0};
        int r;
        do {
            long left = (long)((deadline - now_ns()) / 1000000LL);
            r = poll(&p, 1, left > 0 ? (int)left : 0);
        } while (r == -1 && errno == EINTR);
        close(pfd);
        if (r == 1) {
            while (waitpid(pid, &st, 0) == -1)
                if (errno != EINTR) die("waitpid");
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
    }
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (r == -1 && errno != EINTR) die("waitpid");
        if (now_ns() > deadline) {
            fprintf(stderr, "helper: pid %d still running after %ld ms, killing it\n",
                    (int)pid, timeout_ms);
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        sleep_ms(1);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Read one int64 record from fd within timeout. 1 = got it, 0 = EOF, -1 = timeout. */
static int read_record(int fd, int64_t *out, int timeout_ms) {
    size_t got = 0;
    char *p = (char *)out;
    int64_t deadline = now_ns() + (int64_t)timeout_ms * 1000000LL;
    while (got < sizeof *out) {
        int left = (int)((deadline - now_ns()) / 1000000LL);
        if (left < 0) return -1;
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, left);
        if (r == -1 && errno == EINTR) continue;
        if (r == -1) die("poll");
        if (r == 0) return -1;
        ssize_t n = read(fd, p + got, sizeof *out - got);
        if (n == -1 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n == -1) die("read");
        if (n == 0) {
            /* Linux reports POLLHUP on a FIFO only after a writer came and went. */
            if (pfd.revents & POLLHUP) return 0;
            sleep_ms(1);
            continue;
        }
        got += (size_t)n;
    }
    return 1;
}

static int open_fifo(const char *path) {
    unlink(path);
    if (mkfifo(path, 0600) == -1) die("mkfifo");
    /* Non-blocking so that a child that never opens it cannot hang us. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd == -1) die("open fifo");
    return fd;
}

/* ---- spawn ---------------------------------------------------------------- */

static int cmd_spawn(int argc, char **argv) {
    if (argc < 2) return 64;
    long n = atol(argv[0]);
    long failed = 0;
    for (long i = 0; i < n; i++) {
        int64_t t0 = now_ns();
        pid_t pid = spawn_quiet(argv + 1, NULL);
        int code = wait_bounded(pid, 10000);
        int64_t t1 = now_ns();
        if (code != 0) failed++;
        printf("%lld\n", (long long)(t1 - t0));
    }
    if (failed) fprintf(stderr, "fail %ld\n", failed);
    return 0;
}

/* spawnmix N SEP CMD1... SEP CMD2...: like spawn, but the commands take turns run
 * by run (1, 2, 3, 1, 2, 3, …), so that drift of the machine hits all of them
 * alike. Prints "<index> <ns>" per run; "fail <index> <count>" on stderr. */
static int cmd_spawnmix(int argc, char **argv) {
    if (argc < 3) return 64;
    long n = atol(argv[0]);
    const char *sep = argv[1];
    char **cmds[64];
    int ncmd = 0;
    for (int i = 2; i < argc && ncmd < 64; i++) {
        if (!strcmp(argv[i], sep)) {
            argv[i] = NULL; /* terminates the previous command's argv */
            if (i + 1 < argc) cmds[ncmd++] = argv + i + 1;
        }
    }
    long failed[64] = {0};
    for (long r = 0; r < n; r++) {
        for (int k = 0; k < ncmd; k++) {
            int c = (int)((k + r) % ncmd); /* rotate who goes first */
            int64_t t0 = now_ns();
            pid_t pid = spawn_quiet(cmds[c], NULL);
            int code = wait_bounded(pid, 10000);
            int64_t t1 = now_ns();
            if (code != 0) failed[c]++;
            printf("%d %lld\n", c, (long long)(t1 - t0));
        }
    }
    for (int c = 0; c < ncmd; c++)
        if (failed[c]) fprintf(stderr, "fail %d %ld\n", c, failed[c]);
    return 0;
}

/* ---- signal latency -------------------------------------------------------- */

static int sig_out = -1;

static void on_usr1(int sig) {
    (void)sig;
    int64_t t = now_ns(); /* clock_gettime and write are async-signal-safe */
    ssize_t r = write(sig_out, &t, sizeof t);
    (void)r;
}

static void on_usr2(int sig) {
    (void)sig;
    _exit(0);
}

static int cmd_sigchild(int argc, char **argv) {
    if (argc < 1) return 64;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = on_usr2;
    sigaction(SIGUSR2, &sa, NULL);
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    sigaddset(&s, SIGUSR2);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
    sig_out = open(argv[0], O_WRONLY);
    if (sig_out == -1) die("open fifo for writing");
    int64_t ready = -(int64_t)getpid();
    if (write(sig_out, &ready, sizeof ready) != sizeof ready) die("write");
    for (;;) pause();
}

static int cmd_siglat(int argc, char **argv) {
    if (argc < 3) return 64;
    long n = atol(argv[0]);
    const char *fifo = argv[1];
    int fd = open_fifo(fifo);
    pid_t init = spawn_quiet(argv + 2, NULL);
    int64_t rec;
    if (read_record(fd, &rec, 5000) != 1 || rec >= 0) {
        fprintf(stderr, "helper: child never became ready\n");
        kill(init, SIGKILL);
        wait_bounded(init, 5000);
        return 1;
    }
    pid_t child = (pid_t)-rec;
    sleep_ms(50); /* let the init settle after the spawn */
    long lost = 0;
    for (long i = 0; i < n; i++) {
        int64_t t0 = now_ns();
        kill(init, SIGUSR1);
        int r = read_record(fd, &rec, 2000);
        if (r != 1) {
            lost++;
            if (r == 0) break;
            continue;
        }
        printf("%lld\n", (long long)(rec - t0));
        sleep_ms(2); /* an idle init between signals, as in production */
    }
    kill(init, SIGUSR2); /* forwarded → the child exits 0 → the init exits */
    int code = wait_bounded(init, 5000);
    if (kill(child, 0) == 0) kill(child, SIGKILL);
    if (lost) fprintf(stderr, "lost %ld\n", lost);
    if (code != 0) fprintf(stderr, "exit %d\n", code);
    close(fd);
    unlink(fifo);
    return 0;
}

/* ---- orphans ------------------------------------------------------------- */

/* Count processes in /proc other than PID 1 and us; also count zombies. */
static long count_procs(long *zombies) {
    DIR *d = opendir("/proc");
    if (!d) die("opendir /proc");
    long n = 0, z = 0;
    pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 1 || pid == self) continue;
        n++;
        if (zombies) {
            char path[64], buf[256];
            snprintf(path, sizeof path, "/proc/%ld/stat", pid);
            int fd = open(path, O_RDONLY);
            if (fd == -1) continue;
            ssize_t r = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (r <= 0) continue;
            buf[r] = 0;
            char *rp = strrchr(buf, ')');
            if (rp && rp[1] == ' ' && rp[2] == 'Z') z++;
        }
    }
    closedir(d);
    if (zombies) *zombies = z;
    return n;
}

/* CPU time (ns) that PID 1 has used, summed over its threads. */
static int64_t init_cpu_ns(void) {
    DIR *d = opendir("/proc/1/task");
    if (!d) return -1;
    int64_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/1/task/%s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        long long run = 0;
        if (fscanf(f, "%lld", &run) == 1) sum += run;
        fclose(f);
    }
    closedir(d);
    return sum;
}

static int cmd_orphans(int argc, char **argv) {
    if (argc < 1) return 64;
    long n = atol(argv[0]);
    long timeout_s = argc > 1 ? atol(argv[1]) : 60;
    if (getpid() != 2)
        fprintf(stderr, "helper: warning: orphans expects to be PID 2 in a new PID "
                        "namespace (unshare --pid --fork --mount-proc), is %d\n",
                (int)getpid());
    int p[2];
    if (pipe(p) == -1) die("pipe");
    const long batch = 100;
    long made = 0;
    int64_t c0 = now_ns();
    while (made < n) {
        long k = n - made < batch ? n - made : batch;
        pid_t mid = fork();
        if (mid == -1) die("fork");
        if (mid == 0) {
            /* Intermediate: fork k grandchildren, then exit so they are orphans. */
            close(p[1]);
            int fails = 0;
            for (long j = 0; j < k; j++) {
                pid_t g = fork();
                if (g == 0) {
                    char c;
                    /* Block until the write end closes, then all exit at once. */
                    while (read(p[0], &c, 1) == -1 && errno == EINTR) {
                    }
                    _exit(0);
                }
                if (g == -1) fails++;
            }
            _exit(fails > 255 ? 255 : fails);
        }
        int st;
        while (waitpid(mid, &st, 0) == -1 && errno == EINTR) {
        }
        long fails = WIFEXITED(st) ? WEXITSTATUS(st) : k;
        made += k - fails;
        if (fails) {
            fprintf(stderr, "helper: %ld forks failed, stopping at %ld orphans\n", fails,
                    made);
            break;
        }
    }
    int64_t c1 = now_ns();
    close(p[0]);
    int64_t cpu0 = init_cpu_ns();
    int64_t t0 = now_ns();
    close(p[1]); /* every orphan reads EOF and exits: PID 1 must reap them all */
    int64_t t1 = -1, deadline = t0 + timeout_s * 1000000000LL;
    long left = -1;
    while (now_ns() < deadline) {
        int64_t s0 = now_ns();
        left = count_procs(NULL);
        int64_t s1 = now_ns();
        if (left == 0) {
            t1 = s1;
            break;
        }
        /* A scan of /proc with 20k entries costs ~8 ms of CPU: sleep at least as
         * long as the scan took, so we never use more than half of one core while
         * the init under test is reaping. */
        long scan_ms = (long)((s1 - s0) / 1000000LL);
        sleep_ms(scan_ms > 5 ? scan_ms : 5);
    }
    int64_t cpu1 = init_cpu_ns();
    long zombies = 0;
    left = count_procs(&zombies);
    printf("orphans=%ld create_ns=%lld reap_ns=%lld init_cpu_ns=%lld left=%ld "
           "zombies=%ld\n",
           made, (long long)(c1 - c0), (long long)(t1 < 0 ? -1 : t1 - t0),
           (long long)(cpu0 < 0 || cpu1 < 0 ? -1 : cpu1 - cpu0), left, zombies);
    fflush(stdout);
    return 0;
}

/* ---- deadline precision --------------------------------------------------- */

static int cmd_ignterm(int argc, char **argv) {
    if (argc < 1) return 64;
    signal(SIGTERM, SIG_IGN);
    int fd = open(argv[0], O_WRONLY); /* not CLOEXEC: held until we die */
    if (fd == -1) die("open fifo for writing");
    int64_t ready = -(int64_t)getpid();
    if (write(fd, &ready, sizeof ready) != sizeof ready) die("write");
    for (;;) pause();
}

static int cmd_deadline(int argc, char **argv) {
    if (argc < 4) return 64;
    const char *fifo = argv[0];
    const char *errfile = argv[1];
    long settle_ms = atol(argv[2]);
    int fd = open_fifo(fifo);
    pid_t init = spawn_quiet(argv + 3, errfile);
    int64_t rec;
    if (read_record(fd, &rec, 5000) != 1 || rec >= 0) {
        fprintf(stderr, "helper: child never became ready\n");
        kill(init, SIGKILL);
        wait_bounded(init, 5000);
        return 1;
    }
    pid_t child = (pid_t)-rec;
    sleep_ms(settle_ms);
    int64_t t0 = now_ns();
    kill(init, SIGTERM);
    /* Wait for EOF: the child (the only writer) died. Bounded at 30 s. */
    int r = read_record(fd, &rec, 30000);
    int64_t t1 = now_ns();
    int code = wait_bounded(init, 10000);
    if (kill(child, 0) == 0) kill(child, SIGKILL);
    close(fd);
    unlink(fifo);
    printf("%lld %d\n", r == 0 ? (long long)(t1 - t0) : -1LL, code);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: helper spawn|spawnmix|sigchild|siglat|orphans|ignterm|deadline ...\n");
        return 64;
    }
    const char *c = argv[1];
    if (!strcmp(c, "spawn")) return cmd_spawn(argc - 2, argv + 2);
    if (!strcmp(c, "spawnmix")) return cmd_spawnmix(argc - 2, argv + 2);
    if (!strcmp(c, "sigchild")) return cmd_sigchild(argc - 2, argv + 2);
    if (!strcmp(c, "siglat")) return cmd_siglat(argc - 2, argv + 2);
    if (!strcmp(c, "orphans")) return cmd_orphans(argc - 2, argv + 2);
    if (!strcmp(c, "ignterm")) return cmd_ignterm(argc - 2, argv + 2);
    if (!strcmp(c, "deadline")) return cmd_deadline(argc - 2, argv + 2);
    fprintf(stderr, "helper: unknown command %s\n", c);
    return 64;
}
