/* bench/forward-floor.c — the smallest signal forwarders, to tell what an init's
 * forward costs from what its way of waiting costs (bench/README.md, "Signal
 * forwarding"). Usage: forward-floor MODE CMD [ARGS...]: blocks every signal,
 * starts CMD, forwards each signal to it until it exits. MODE:
 *   sigwait         sigwaitinfo(2), as tini and dumb-init wait
 *   signalfd-epoll  a non-blocking signalfd read after epoll_wait(2), as drainit
 *                   waits (through tokio)
 *   sigwait-setsid  sigwaitinfo, the child in a session of its own (setsid(2)),
 *                   as dumb-init starts it
 * Built and run by forward-floor.py. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 64;
    int use_fd = !strcmp(argv[1], "signalfd-epoll");
    int own_session = !strcmp(argv[1], "sigwait-setsid");
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    pid_t c = fork();
    if (c == 0) {
        if (own_session) setsid();
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvp(argv[2], argv + 2);
        _exit(127);
    }
    int sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, sfd, &ev);
    for (;;) {
        int sig;
        if (use_fd) {
            struct epoll_event e;
            struct signalfd_siginfo si;
            epoll_wait(ep, &e, 1, -1);
            if (read(sfd, &si, sizeof si) != sizeof si) continue;
            sig = (int)si.ssi_signo;
        } else {
            siginfo_t si;
            sig = sigwaitinfo(&all, &si);
        }
        if (sig == SIGCHLD) {
            int st;
            if (waitpid(c, &st, WNOHANG) == c) return 0;
            continue;
        }
        kill(c, sig);
    }
}
