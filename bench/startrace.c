/*
 * bench/startrace.c — the start-up race: what becomes of a SIGTERM sent in the
 * first instants after execve? Built and driven by bench/startrace.sh.
 *
 *   startrace TRIES TIMEOUT_MS DELAYS_US MODES :: CMD1 ARGS... [:: CMD2 ARGS...]
 *
 * DELAYS_US is a comma-separated list (0,50,200,1000), MODES "plain", "pid1" or
 * "plain,pid1"; CMDs are absolute paths (execve, no PATH search), separated by
 * "::" (not "--", which drainit's own command lines contain). For every try,
 * mode and delay, the commands take turns (order rotated every try), so that load
 * from elsewhere on the machine falls on each alike. Each try starts CMD with clone(CLONE_VM | CLONE_VFORK [| CLONE_NEWPID]): the
 * parent resumes at the very instant the child's execve has replaced its image
 * (vfork(2): "until the child ... performs a successful execve"), which is the
 * zero of DELAY_US. The parent sleeps until DELAY_US microseconds later
 * (clock_nanosleep, timer slack 1 ns; on CPU 0, the child on CPU 1, so that the
 * wait never takes the CPU the exec needs), sends SIGTERM, and waits TIMEOUT_MS
 * for CMD to end:
 *
 *   killed   CMD died of the SIGTERM (default disposition, not yet blocked);
 *   drained  CMD exited 0 (it received the signal and acted on it);
 *   lost     CMD was still running after TIMEOUT_MS: the signal was discarded
 *            (PID 1 of a PID namespace drops a signal whose disposition is the
 *            default and that is not blocked, even from the parent namespace);
 *            it is then SIGKILLed;
 *   other    any other ending (another exit code or signal).
 *
 * With pid1 CMD is PID 1 of a new PID namespace (killing it with SIGKILL ends the
 * namespace); with plain it is an ordinary child, and startrace is a subreaper so
 * that whatever CMD started is reaped and killed here too.
 *
 * Prints one line per cell: "CMD_INDEX MODE DELAY_US killed N drained N lost N
 * other N" (CMD_INDEX from 0, in the order given).
 *
 *   startrace floor
 *
 * The floor: a C program that blocks every signal as its first statement, then
 * waits (sigtimedwait, 10 s) for SIGTERM and exits 0 on it. What it loses is the
 * window exec itself leaves (the kernel's execve, the dynamic loader, the C
 * library's start-up) — no program can do better without help from its launcher.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int floor_main(void) {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    /* The first statement above is the point of the program; what follows only
     * tells the harness that the signal arrived. */
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    struct timespec ten = {10, 0};
    return sigtimedwait(&term, NULL, &ten) == SIGTERM ? 0 : 3;
}

static char **child_argv;

static int child_fn(void *arg) {
    (void)arg;
    /* The child on CPU 1, the parent on CPU 0 (when there are two): the parent's
     * wait must not take the CPU the exec needs. */
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(1, &one);
    sched_setaffinity(0, sizeof one, &one);
    execve(child_argv[0], child_argv, environ);
    _exit(127);
}

/* Kill and reap every child of ours (CMD's orphans, re-parented to us as a
 * subreaper), bounded. */
static void reap_all(void) {
    for (int i = 0; i < 2000; i++) {
        pid_t p = waitpid(-1, NULL, WNOHANG);
        if (p < 0)
            return; /* ECHILD: none left */
        if (p == 0) {
            /* Someone left alive: find and kill them through /proc. */
            char path[64];
            snprintf(path, sizeof path, "/proc/%d/task/%d/children", getpid(), getpid());
            FILE *f = fopen(path, "r");
            int c;
            if (f) {
                while (fscanf(f, "%d", &c) == 1)
                    kill(c, SIGKILL);
                fclose(f);
            }
            usleep(1000);
        }
    }
}

/* One try: start cmds[ci] (as PID 1 of a new PID namespace or not), SIGTERM it
 * delay_ns after its execve, classify the ending. */
enum outcome { KILLED, DRAINED, LOST, OTHER };

static enum outcome try_once(char **cmd, int pid1, int64_t delay_ns, int64_t timeout_ns) {
    static char stack[256 * 1024];
    child_argv = cmd;
    int flags = CLONE_VM | CLONE_VFORK | SIGCHLD | (pid1 ? CLONE_NEWPID : 0);
    pid_t pid = clone(child_fn, stack + sizeof stack, flags, NULL);
    int64_t exec_at = now_ns();
    if (pid < 0) {
        perror("clone");
        exit(1);
    }
    /* Sleep, not spin, until exec_at + delay (timer slack 1 ns, see main). */
    if (delay_ns > 0) {
        struct timespec at = {(exec_at + delay_ns) / 1000000000LL, (exec_at + delay_ns) % 1000000000LL};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
            ;
    }
    kill(pid, SIGTERM);
    int status = 0, done = 0;
    int64_t deadline = now_ns() + timeout_ns;
    while (now_ns() < deadline) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            done = 1;
            break;
        }
        usleep(200);
    }
    enum outcome o;
    if (!done) {
        o = LOST;
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) {
        o = KILLED;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        o = DRAINED;
    } else {
        o = OTHER;
        if (getenv("STARTRACE_VERBOSE"))
            fprintf(stderr, "other: %s status 0x%x\n", cmd[0], status);
    }
    reap_all();
    return o;
}

#define MAX_CMDS 8
#define MAX_DELAYS 8

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "floor") == 0)
        return floor_main();
    if (argc < 7 || strcmp(argv[5], "::") != 0) {
        fprintf(stderr,
                "usage: startrace TRIES TIMEOUT_MS DELAYS_US MODES :: CMD1... [:: CMD2...]\n"
                "       (DELAYS_US e.g. 0,50,200,1000; MODES plain,pid1)\n"
                "       startrace floor\n");
        return 64;
    }
    int tries = atoi(argv[1]);
    int64_t timeout_ns = (int64_t)atoi(argv[2]) * 1000000LL;
    int64_t delays[MAX_DELAYS];
    int ndelays = 0;
    for (char *d = strtok(argv[3], ","); d && ndelays < MAX_DELAYS; d = strtok(NULL, ","))
        delays[ndelays++] = (int64_t)atoi(d) * 1000;
    int modes[2], nmodes = 0;
    if (strstr(argv[4], "plain"))
        modes[nmodes++] = 0;
    if (strstr(argv[4], "pid1"))
        modes[nmodes++] = 1;
    char **cmds[MAX_CMDS];
    int ncmds = 0;
    for (int i = 5; i < argc && ncmds < MAX_CMDS; i++) {
        if (strcmp(argv[i], "::") == 0) {
            argv[i] = NULL; /* ends the previous command's argv */
            if (i + 1 < argc)
                cmds[ncmds++] = argv + i + 1;
        }
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    prctl(PR_SET_TIMERSLACK, 1UL);
    cpu_set_t zero;
    CPU_ZERO(&zero);
    CPU_SET(0, &zero);
    sched_setaffinity(0, sizeof zero, &zero);

    /* counts[cmd][mode][delay][outcome]; the commands take turns within each
     * (mode, delay) step, order rotated every try, so that load from elsewhere on
     * the machine falls on every command alike. */
    static int counts[MAX_CMDS][2][MAX_DELAYS][4];
    for (int t = 0; t < tries; t++)
        for (int m = 0; m < nmodes; m++)
            for (int d = 0; d < ndelays; d++)
                for (int k = 0; k < ncmds; k++) {
                    int c = (k + t) % ncmds;
                    enum outcome o = try_once(cmds[c], modes[m], delays[d], timeout_ns);
                    counts[c][m][d][o]++;
                }
    for (int c = 0; c < ncmds; c++)
        for (int m = 0; m < nmodes; m++)
            for (int d = 0; d < ndelays; d++)
                printf("%d %s %lld killed %d drained %d lost %d other %d\n", c,
                       modes[m] ? "pid1" : "plain", (long long)(delays[d] / 1000),
                       counts[c][m][d][KILLED], counts[c][m][d][DRAINED], counts[c][m][d][LOST],
                       counts[c][m][d][OTHER]);
    return 0;
}
