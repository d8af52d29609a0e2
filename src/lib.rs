//! drainit: a container init that drains.
//!
//! # Theory of operation
//!
//! **The process tree.** drainit runs as PID 1 of a container (or as the main
//! process of a systemd unit, or under a test script). It spawns one *main child*,
//! the application, as the leader of a new process group. Everything the child
//! starts is a *descendant*; when a process's parent dies, the kernel re-parents it
//! to PID 1, or, when drainit is not PID 1, to drainit, which makes itself a *child
//! subreaper* (`PR_SET_CHILD_SUBREAPER`). So every process drainit is responsible
//! for has a parent chain that leads to drainit, and `/proc` finds them all, daemons
//! that called `setsid` or double-forked included ([`procs`]).
//!
//! **Who waits.** Exactly one module calls `waitpid`: the [`reaper`], looped until
//! nothing is left to reap each time the loop reads SIGCHLD, in batches (the next
//! batch runs after the other wake-ups had their turn, so thousands of orphans
//! re-parented at once hold no deadline and no signal). Anything else that waits for a
//! process (the main child, exec checks, teardown steps) registers the pid first
//! and gets the status on a channel. Anything reaped that nobody registered is an
//! orphan and is counted in the report. (A child whose `exec` failed is reaped by
//! `reaper::reap_failed_spawn` before its pid is known to anyone.)
//!
//! **Signals.** drainit installs no signal handler. At start — in a constructor
//! the C library runs before `main`, so that a SIGTERM sent right after exec is
//! neither fatal nor (as PID 1) discarded — it blocks every catchable signal but
//! the fault signals and SIGPIPE, and reads them from a `signalfd` ([`signals`]): in
//! the loop's turn until the first signal forwarded at once, then on a thread of its
//! own that sends at once what needs no decision ([`tree::AtOnce`]) and hands every
//! read to the loop. The child is started (`clone(CLONE_VM | CLONE_VFORK)`,
//! as `posix_spawn` does, [`spawn`]) with everything still blocked and restores,
//! before `exec`, the mask drainit inherited; drainit changed no disposition but
//! SIGPIPE's and, at their default, 32–34's (the C libraries' own: ignored for
//! itself, given back as inherited), so the child inherits
//! drainit's inherited dispositions as they were (`nohup drainit -- app` keeps
//! ignoring HUP). Signals that are not drain signals are forwarded at once to the
//! child (or its group), after `--rewrite`; 32 and 33, the C libraries' own, are
//! dropped.
//!
//! **Who kills.** Only the [`tree`] module decides who gets a signal and sends it
//! (the one `kill(2)` call is private to it): its `AppTree` forwards to the main
//! child or its group, gives the leftovers the drain signal once each, SIGKILLs
//! at the deadline and chases what forks while the kill settles, and keeps what
//! those decisions need (who was signalled, whether processes from outside the
//! namespace are left, the process ledger the report reads); a teardown step's
//! and a timed-out exec check's SIGKILL go through it too. The drain machine
//! decides *when*; the [`driver`] asks the tree in the step the machine orders it,
//! on the one runtime thread that also reaps, and turns the counts the tree
//! returns (killed, unkillable) into events. The tree signals only processes it
//! has just seen alive and unreaped, in that same synchronous step: a pid is
//! never signalled after it was reaped (the signals' thread forwards to the main
//! child holding the lock the reaper holds around its `waitpid`,
//! [`reaper::Unreaped`]).
//! `kill(-1, SIGKILL)` is used only when drainit is PID 1, where it means "every
//! process of this PID namespace". Signal first, account after: the forward and the
//! SIGKILL are sent before any `/proc` walk that only counts (in a tree of
//! thousands, a walk takes tens of milliseconds), descendants found by a walk are
//! signalled as it finds them, and the report's times are the instants the signals
//! were sent; a signal the machine forwards in every phase goes out as it is read,
//! ahead of the loop's turn (`Drain::forwarded_at_once`), unless the same read
//! holds a SIGCHLD or a drain signal. A process drainit may not signal (`EPERM`) is *unkillable*: recorded
//! apart from the abandoned ones, logged once, and the drain is not clean.
//!
//! **The drain timeline.** T0 is the first drain signal (TERM, INT, QUIT by
//! default). Beat 1, in the same step that read the signal: the phase becomes
//! `draining` (so `/readyz` answers 503) and the in-flight descendants are counted.
//! Beat 2: the app keeps serving for the pre-drain delay while load balancers
//! catch up (by default only when something routes by readiness: Kubernetes, or a
//! client that asked `/readyz`, which reached the driver as an event before T0;
//! else 0). Then the drain phases (`[[drain.phase]]`, [`phases`]), if any: one
//! after another on one budget, while the app still serves and the proxy still
//! admits; each a helper process in its own group (or a POST to the app) that the
//! tree cancels and kills when the machine says. Beat 3, when the delay and the
//! phases are over (T0 + delay without phases; the deadline then counts from
//! there): the drain signal is forwarded once to the main
//! child (or its group); when the child has exited, every remaining descendant gets
//! it too, once; at T0 + delay + drain timeout whatever is left is SIGKILLed and
//! counted *abandoned*. While beat 3 waits, a progress line each second says what
//! is left; with `--report-file`, a partial report (`"final":false`) is written at
//! T0 and at the forward, so a SIGKILL of drainit itself still leaves evidence.
//! Then `stopping`: teardown steps, the exit report, the exit code (0 clean, 2
//! abandoned, unkillable or teardown failed). The policy is the pure state machine
//! in [`drain`]; the [`driver`] only drives it.
//!
//! **"No descendant left" is proven.** A `/proc` walk can miss a process forked
//! just as its parent exits (the walk lists the parent, the parent is gone by the
//! time it is read, the successor was never listed), so a walk that finds nothing
//! proves nothing. The drain ends early only when drainit has no child but its
//! helpers (the reaper's `ECHILD`, or its own list of children in `/proc`, which
//! loses an entry only when drainit reaps it): every live descendant is reached
//! through one of drainit's children, since an exiting parent's children are
//! re-parented to drainit. As PID 1 the namespace is read as well, for processes
//! that entered it from outside and are nobody's children here, and drainit's
//! children read again after it. While the SIGKILL settles, what is found alive is
//! killed too, so a tree that forks as it exits does not outlive drainit.
//!
//! **Probes and readiness.** The supervisor publishes the phase on a
//! `tokio::sync::watch`; the [`probe`] server, the [`checks`] and the sd_notify
//! tasks of [`notify`] are other tasks of the same thread that read it (notify also
//! writes the app's own fields: `STATUS=`, `STOPPING=1`, the watchdog) and never
//! hold anything the loop needs. No input starves the loop: the notify task reads
//! at most a batch of datagrams per wake-up, and a stranger flooding the (abstract,
//! reachable) notify socket costs one `recvmsg` per datagram and one `/proc` check
//! per sender per batch. Readiness first passes when every check and, with
//! `--ready-notify`, the app's `READY=1` have passed; from then on `/readyz`
//! re-evaluates the checks per request, concurrent requests sharing one evaluation.
//! The first `/readyz` asked (or the proxy's health path) is an event: the probe
//! server, or the proxy's thread, notes it on a watch channel
//! (`published::ReadyzAsked`) that the driver selects on, and the drain machine
//! remembers it for the pre-drain delay. The probe server also answers `/metrics`
//! (Prometheus text): the counters the supervisor and the probe server record in
//! a [`metrics::Metrics`] handle, the checks' own run counts, and the phase,
//! readiness and live descendants read at scrape time.
//!
//! **Nothing shared through globals.** `main` makes every handle and channel (the
//! metrics, the readiness channels, the [`spawn::Launcher`] that gives every
//! process drainit starts the mask, SIGPIPE disposition and directory drainit
//! started with) and hands each to the modules that use it; the graph of the
//! modules has no cycle, inside `proxy/` too (its files stand on `shared.rs`,
//! and the ways to the app are handed down to the request path). What stays process-wide is so by nature and private to its module:
//! the logger (the `log` facade installs one `'static` logger), and the signal
//! mask found by the constructor that runs before `main` ([`signals`]).
//!
//! **Threads.** One: the supervisor, the reaper, the probe server, the checks and
//! the notify socket are tasks of a single-threaded tokio runtime. A second thread
//! exists only if stderr falls behind ([`logging`]): log lines then go to a writer
//! thread through a bounded queue, so a stderr nobody reads never blocks the loop.
//! With `--proxy`, the admission proxy has threads of its own ([`proxy`],
//! `--proxy-threads`), each with a current-thread runtime of its own.
//! Every thread blocks the caught signals (they inherit the block made before
//! `main`).
//!
//! **The two error regimes.** Before the spawn, everything fallible happens (flags,
//! config file, probe socket, signalfd) and a failure exits at once with a message
//! "`<action> failed: <cause>`" and the documented code (64, 78, 1), so bad input
//! never leaves a half-started app. After the spawn nothing leaves the event loop
//! but the planned exit: errors are logged and the loop carries on.

#![deny(unsafe_code)]

pub mod checks;
pub mod config;
pub mod drain;
pub mod driver;
pub mod exit;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod phases;
pub mod probe;
pub mod probe_client;
pub mod procs;
/// The admission proxy (`--proxy`), a crate of its own (proxy/, built for
/// speed), under the name the rest of drainit uses.
pub use drainit_proxy as proxy;
pub mod published;
pub mod reaper;
pub mod report;
pub mod signals;
pub mod spawn;
pub mod teardown;
pub mod tree;
pub mod user;
pub mod util;
