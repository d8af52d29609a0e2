//! drainit's entry point: it only wires (ripgrep's `main`).
//!
//! config → logger → probe socket → signalfd → spawn → loop → report → exit code.
//! Every fallible setup step happens before the spawn.
#![cfg_attr(not(test), no_main)]
// The test harness brings its own `main`; then nothing here is called.
#![cfg_attr(test, allow(dead_code))]

use std::cell::RefCell;
use std::ffi::OsString;
use std::io::Write;
use std::rc::Rc;

use tokio::sync::mpsc;

use drainit::checks::CheckKind;
use drainit::checks::Checks;
use drainit::config::{self, ProbeAddr, ProcessEnv};
use drainit::driver::{Driver, Readiness};
use drainit::exit;
use drainit::logging;
use drainit::metrics::Metrics;
use drainit::notify::{self, AppSocket, Systemd};
use drainit::probe;
use drainit::proxy::Proxy;
use drainit::published::{Published, ReadinessAsk, ReadinessAsks, ReadyzAsked};
use drainit::reaper::Reaper;
use drainit::report::Report;
use drainit::signals::{self, SignalStream};
use drainit::spawn::{self, ChildSpec};
use drainit::util::io_word_or_text;

/// `malloc`, with a cache of small blocks on the proxy's threads
/// (`proxy/src/alloc.rs`).
#[global_allocator]
static ALLOCATOR: drainit_proxy::alloc::Allocator = drainit_proxy::alloc::Allocator;

// drainit has its own C `main`: std's start-up (a stack-overflow handler found by
// reading /proc/self/maps, an alternate signal stack, the SIGSEGV/SIGBUS handlers,
// about twenty system calls and their teardown at exit) is start-up time an init
// should not spend. What of it drainit needs, `std_start` does. The arguments come
// from `argv` itself: without std's start-up, `std::env::args_os` is empty on musl.
//
// The caught signals are blocked before that, by `block_signals_first` below.
#[cfg(not(test))]
#[unsafe(no_mangle)]
#[allow(unsafe_code)]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    use std::os::unix::ffi::OsStrExt;
    let Ok(sigpipe_ignored) = std_start() else {
        return exit::INTERNAL;
    };
    // SAFETY: the C runtime passes `argc` valid NUL-terminated strings in `argv`.
    let args: Vec<OsString> = (0..usize::try_from(argc).unwrap_or(0))
        .map(|i| unsafe {
            let arg = std::ffi::CStr::from_ptr(*argv.add(i));
            std::ffi::OsStr::from_bytes(arg.to_bytes()).to_os_string()
        })
        .collect();
    // A panic outside the runtime's tasks is drainit failing (1), not an abort.
    let code = std::panic::catch_unwind(|| run(args, sigpipe_ignored)).unwrap_or(exit::INTERNAL);
    // Exits without a report (errors before the spawn, --check-config) must not
    // lose queued log lines; the wait is bounded, a stuck stderr cannot hold it.
    logging::flush(logging::FINAL_WRITE_BOUND);
    let _ = std::io::stdout().flush();
    code
}

/// Blocks the caught signals as the first code of drainit's that runs: an entry of
/// `.init_array` with the highest priority (`.init_array.00000` sorts first), run
/// by the C library before any other constructor of the executable and before
/// `main` — in glibc after the dynamic loader and the C library's own set-up, in
/// static musl right after `__init_libc`. A SIGTERM that arrives from here on
/// stays pending until the signalfd reads it; one that arrives earlier finds the
/// default disposition: it kills drainit, or, as PID 1 of a PID namespace, the
/// kernel discards it (bench/startrace.sh measures the window that is left, and
/// docs/processes-and-signals.md says how a launcher closes it). `.preinit_array`
/// would run a little earlier under glibc, but musl never runs it.
///
/// Only a system call (`rt_sigprocmask`) and a `OnceLock` store: nothing here
/// depends on the C library's or std's state. An error is not reported here:
/// `run` calls [`signals::block_caught`] again and reports it.
#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array.00000")]
static BLOCK_SIGNALS_FIRST: extern "C" fn() = block_signals_first;

#[cfg(not(test))]
extern "C" fn block_signals_first() {
    let _ = signals::block_caught();
}

/// The part of std's runtime start-up drainit keeps: fds 0–2 are open (a closed
/// one becomes /dev/null, so no socket or file of drainit's lands on it), and
/// SIGPIPE is ignored in drainit (a write to a closed pipe or socket is an error,
/// not death; what drainit starts gets the disposition drainit inherited, see
/// `spawn`). Returns whether SIGPIPE was ignored when drainit started.
///
/// # Errors
/// A closed fd 0–2 could not be reopened (no `/dev/null`): drainit must not run,
/// as std would have aborted (the caller exits 1; with no stderr, silently).
#[allow(unsafe_code)]
fn std_start() -> Result<bool, ()> {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // nix's `poll` and `fcntl` take a `BorrowedFd`, which must be open: the raw
    // calls ask whether 0–2 are open at all.
    // SAFETY: poll(2) reads and writes the local array of three pollfds.
    let polled = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } >= 0;
    for p in &fds {
        let closed = if polled {
            p.revents & libc::POLLNVAL != 0
        } else {
            // SAFETY: fcntl(2) F_GETFD takes and returns integers.
            let rc = unsafe { libc::fcntl(p.fd, libc::F_GETFD) };
            rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
        };
        // The lowest free fd is taken: this one, as 0..fd are open by now. Not
        // close-on-exec: the child inherits it as its own 0, 1 or 2.
        if closed {
            use std::os::fd::IntoRawFd;
            let fd = nix::fcntl::open(
                c"/dev/null",
                nix::fcntl::OFlag::O_RDWR,
                nix::sys::stat::Mode::empty(),
            );
            if fd.map(IntoRawFd::into_raw_fd) != Ok(p.fd) {
                return Err(());
            }
        }
    }
    // What drainit inherited is what its children get (`spawn::Launcher`).
    // SAFETY: signal(2) with SIG_IGN installs no handler.
    let inherited = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    Ok(inherited == libc::SIG_IGN)
}

/// The fds ≥ 3 drainit inherited (socket activation, or a leak of the caller's):
/// passed on to the child, then closed in drainit so it never holds them.
fn inherited_fds() -> Vec<i32> {
    use nix::fcntl::OFlag;
    use std::os::fd::AsRawFd;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(mut dir) = nix::dir::Dir::open("/proc/self/fd", flags, nix::sys::stat::Mode::empty())
    else {
        return Vec::new();
    };
    // The listing includes the directory's own fd: left out by number.
    let own = dir.as_raw_fd();
    dir.iter()
        .filter_map(|e| e.ok()?.file_name().to_str().ok()?.parse().ok())
        .filter(|fd| *fd > 2 && *fd != own)
        .collect()
}

/// Everything between the C `main` and the exit code; `sigpipe_ignored`: as
/// drainit found SIGPIPE at its start.
fn run(args: Vec<OsString>, sigpipe_ignored: bool) -> i32 {
    // The caught signals were blocked before `main` (`block_signals_first`); this
    // returns the mask found then, or blocks them now if that failed, and says why
    // if it fails again. Before any thread exists: every later thread inherits the
    // block, and nothing is lost before the signalfd is read.
    let mask = match signals::block_caught() {
        Ok(m) => m,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "drainit: error: blocking signals failed: {e}"
            );
            return exit::INTERNAL;
        }
    };
    let inherited = inherited_fds();
    let probe_mode = asks_probe(&args);
    let env = ProcessEnv::read();
    let mut cfg = match load_config(args, &env) {
        Ok(c) => c,
        // A health-check client answers 0 or 1 (Docker reserves 2, and other
        // codes mean nothing to it): a setting it does not need that fails to
        // resolve here (a `DRAINIT_USER` for a non-root health check, say) is
        // an unhealthy answer, said on stderr, not a 78. Usage errors stay 64.
        Err(code) if probe_mode && code != exit::USAGE => return 1,
        Err(code) => return code,
    };
    if let Some(path) = cfg.probe_client {
        // A health-check client: one request, no child, no logger (docs/probes.md, The health-check client).
        return drainit::probe_client::run(path, &cfg.probe_addr);
    }
    logging::init(cfg.log_format, cfg.log_level);
    warn_unrunnable(&cfg);
    let mut launcher = spawn::Launcher::new(mask, sigpipe_ignored);
    if let Some(dir) = anchor_paths(&mut cfg) {
        launcher = launcher.with_start_dir(dir);
    }
    if cfg.check_config {
        let _ = std::io::stdout().write_all(cfg.render().as_bytes());
        let budget = cfg.budget();
        if !budget.fits() {
            log::warn!("grace budget: {budget}");
        }
        return exit::CLEAN;
    }
    log_budget(&cfg);
    match prepare(cfg, env, launcher, inherited) {
        Ok(setup) => supervise(setup),
        Err(code) => code,
    }
}

/// Everything fallible of the start that is not configuration, done before the
/// spawn, and the channels `main` wires between the tasks.
struct Setup {
    cfg: config::Config,
    env: ProcessEnv,
    /// Starts the child, the exec checks and the teardown steps.
    launcher: spawn::Launcher,
    inherited: Vec<i32>,
    listener: Option<std::net::TcpListener>,
    proxy: Option<Proxy>,
    /// The proxy's health path asks here what `/readyz` would answer.
    ready_asks: Option<mpsc::Receiver<ReadinessAsk>>,
    /// Noted by the probe server (and the proxy): "a client asked `/readyz`".
    asked: ReadyzAsked,
    /// The driver's end of `asked`.
    asked_rx: tokio::sync::watch::Receiver<bool>,
    systemd: Option<Rc<Systemd>>,
    app_socket: Option<AppSocket>,
}

/// Binds the probe socket, starts the proxy and binds the notify socket, before
/// the spawn: a taken port or a refused thread never leaves a half-started app.
///
/// # Errors
/// The exit code, after logging why (78 for an address the user gave that is
/// taken, 1 for the rest).
fn prepare(
    cfg: config::Config,
    env: ProcessEnv,
    launcher: spawn::Launcher,
    inherited: Vec<i32>,
) -> Result<Setup, i32> {
    let listener = bind_probe(&cfg.probe_addr)?;
    let (asked, asked_rx) = ReadyzAsked::channel();
    let (proxy, ready_asks) = match &cfg.proxy {
        Some(spec) => {
            let (p, rx) = start_proxy(&cfg, spec, asked.clone())?;
            (Some(p), Some(rx))
        }
        None => (None, None),
    };
    // sd_notify: drainit's own service manager, and the child's socket (bound
    // before the spawn, like the probe socket).
    let systemd = Systemd::from_env().map(Rc::new);
    let app_socket = if cfg.ready_notify {
        match AppSocket::bind(systemd.as_ref().and_then(|s| s.watchdog())) {
            Ok(s) => Some(s),
            Err(e) => {
                log::error!("creating the notify socket failed: {e}");
                return Err(exit::INTERNAL);
            }
        }
    } else {
        None
    };
    Ok(Setup {
        cfg,
        env,
        launcher,
        inherited,
        listener,
        proxy,
        ready_asks,
        asked,
        asked_rx,
        systemd,
        app_socket,
    })
}

/// The admission proxy's socket, bound before the spawn like the probe's. Its
/// thread starts before the spawn too: no half-started child if it cannot.
/// Nothing of it is built without --proxy. Returns it with the receiving end of
/// its readiness asks.
///
/// # Errors
/// 78 when its address cannot be bound, 1 when its threads cannot start
/// (logged).
fn start_proxy(
    cfg: &config::Config,
    spec: &config::ProxySpec,
    asked: ReadyzAsked,
) -> Result<(Proxy, mpsc::Receiver<ReadinessAsk>), i32> {
    let l = match drainit::proxy::bind(spec.listen) {
        Ok(l) => l,
        Err(e) => {
            log::error!(
                "binding the proxy address {} ({}) failed: {}",
                spec.listen,
                cfg.proxy_given_by,
                drainit::util::io_word_or_text(&e)
            );
            return Err(exit::CONFIG);
        }
    };
    let (ready_ask, ready_asks) = mpsc::channel(64);
    // `auto` reads the affinity mask and the cgroup quota: once.
    let threads = cfg.proxy_threads();
    match Proxy::start(
        l,
        *spec,
        cfg.proxy_health.clone(),
        ReadinessAsks::new(ready_ask, asked),
        cfg.stream_spread(),
        threads,
        signals::reblock,
    ) {
        Ok(p) => {
            // Its threads' creation unblocked the C library's own signals here
            // (the first `pthread_create`): blocked again, as in those threads.
            signals::reblock();
            log::info!(
                "proxy: {} -> {} ({} thread(s))",
                spec.listen,
                spec.upstream,
                threads
            );
            Ok((p, ready_asks))
        }
        Err(e) => {
            log::error!("starting the proxy failed: {e}");
            Err(exit::INTERNAL)
        }
    }
}

/// Becomes a subreaper, starts the runtime and runs the supervisor to its exit
/// code.
fn supervise(setup: Setup) -> i32 {
    let is_pid1 = std::process::id() == 1;
    if !is_pid1 && let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        log::warn!("becoming a child subreaper failed: {e}; orphans will pass drainit by");
    }

    // At most 64 readiness events per epoll_wait (tokio's default 1024 is a 12 KiB
    // buffer, its own mmap and page faults at start): drainit watches a handful of
    // fds; under a flood of probe connections the rest come on the next turn.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_io_events_per_tick(64)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            log::error!("starting the runtime failed: {e}");
            return exit::INTERNAL;
        }
    };
    let local = tokio::task::LocalSet::new();
    // Boxed: the future holds the whole supervisor; on the heap it is built once
    // instead of being moved through the stack.
    local.block_on(&runtime, Box::pin(spawn_and_supervise(setup)))
}

/// On the runtime: the signalfd, the spawn, the tasks around the child (probe
/// server, readiness answers, notify), then the driver to its report.
async fn spawn_and_supervise(setup: Setup) -> i32 {
    let Setup {
        cfg,
        env,
        launcher,
        inherited,
        listener,
        proxy,
        ready_asks,
        asked,
        asked_rx,
        systemd,
        app_socket,
    } = setup;
    let signal_stream = match SignalStream::open() {
        Ok(s) => s,
        Err(e) => {
            log::error!("opening the signalfd failed: {e}");
            return exit::INTERNAL;
        }
    };
    let reaper = Rc::new(RefCell::new(Reaper::new()));
    let (state_tx, state_rx) = tokio::sync::watch::channel(Published::new());
    let checks = Checks::new(cfg.checks.clone(), reaper.clone(), launcher.clone());
    let metrics = Metrics::default();

    let notify_env = app_socket
        .as_ref()
        .map(AppSocket::child_env)
        .unwrap_or_default();
    let spec = child_spec(&cfg, env.into_vars(), notify_env);
    let pid = match launcher.spawn_child(&spec, spawn::owns_terminal()) {
        Ok(pid) => pid,
        Err(e) => {
            log::error!("{e}");
            let report = Report::spawn_failed(e.exit_code(), e.kind());
            report.write(cfg.report_file.as_deref());
            return e.exit_code();
        }
    };
    reaper.borrow_mut().set_main(pid);
    // The first thread now, while the app execs (see its doc).
    signals::become_threaded();
    log_started(&spec, pid);
    hold_nothing(&inherited);

    if let Some(ready_asks) = ready_asks {
        let answers = probe::answer_readiness(ready_asks, state_rx.clone(), checks.clone());
        tokio::task::spawn_local(answers);
    }
    if let Some(l) = listener {
        let proxy_stats = proxy.as_ref().map(drainit::proxy::Proxy::stats);
        let server = probe::serve(
            l,
            state_rx,
            checks.clone(),
            metrics.clone(),
            asked,
            proxy_stats,
        );
        tokio::task::spawn_local(server);
    }
    let report_file = cfg.report_file.clone();
    let app_ready = app_socket.map(|sock| {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let notify = sock.serve(pid, state_tx.clone(), ready_tx, systemd.clone());
        tokio::task::spawn_local(notify);
        ready_rx
    });
    if let Some(s) = systemd {
        // EXTEND_TIMEOUT_USEC at T0: the whole budget, plus the settle after SIGKILL.
        let extend = cfg.budget().total() + drainit::drain::KILL_SETTLE;
        let follow = notify::follow(s, state_tx.subscribe(), extend, app_ready.is_none());
        tokio::task::spawn_local(follow);
    }
    let readiness = Readiness { checks, app_ready };
    let mut supervisor = Driver::new(
        cfg,
        reaper,
        signal_stream,
        state_tx,
        readiness,
        launcher,
        pid,
    )
    .with_metrics(metrics)
    .with_readyz_asked(asked_rx);
    if let Some(p) = proxy {
        supervisor = supervisor.with_proxy(p);
    }
    let report = supervisor.run().await;
    report.write(report_file.as_deref());
    report.exit_code
}

/// The start line: the command, its pid, and the user it runs as.
fn log_started(spec: &ChildSpec, pid: i32) {
    match &spec.user {
        Some(u) => log::info!(
            "started {} as pid {pid}, user {} (uid {}, gid {})",
            spec.argv[0].to_string_lossy(),
            u.spec,
            u.uid,
            u.gid
        ),
        None => log::info!("started {} as pid {pid}", spec.argv[0].to_string_lossy()),
    }
}

/// The configuration, or the exit code after printing why not: `--help` and
/// `--version` on stdout (0), an error on stderr (64, 78, or 1).
fn load_config(args: Vec<OsString>, env: &ProcessEnv) -> Result<config::Config, i32> {
    match config::load_from(args, env) {
        Ok(c) => Ok(c),
        Err(e) if e.code == exit::CLEAN => {
            let _ = std::io::stdout().write_all(e.message.as_bytes());
            Err(exit::CLEAN)
        }
        Err(e) => {
            let msg = e.message.trim_end();
            let msg = msg.strip_prefix("error: ").unwrap_or(msg);
            let _ = writeln!(std::io::stderr(), "drainit: error: {msg}");
            Err(e.code)
        }
    }
}

/// Logs the grace budget at start: info when it fits, a warning when it does not.
fn log_budget(cfg: &config::Config) {
    let budget = cfg.budget();
    let delay_note = cfg.pre_drain_delay_note();
    let platform = cfg.platform_note();
    if budget.fits() {
        log::info!("grace budget: {budget}; {delay_note}; {platform}");
    } else {
        log::warn!(
            "grace budget: {budget}; {delay_note}; {platform}; the platform may SIGKILL mid-drain (raise --grace-period or shorten the drain)"
        );
    }
    // docs/drain-phases.md: a phase without `max` may take everything left of the budget.
    let n = cfg.phases.len();
    for p in cfg.phases.iter().take(n.saturating_sub(1)) {
        if p.max.is_none() {
            log::warn!(
                "drain phase '{}' has no max and comes before another: it may take the whole phase budget ({}) and leave the next ones nothing",
                p.name,
                drainit::util::fmt_ms(cfg.phase_budget)
            );
        }
    }
}

/// Whether the command line asks for the health-check client (`--probe` before
/// any `--`).
fn asks_probe(args: &[OsString]) -> bool {
    args.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--probe" || a.as_encoded_bytes().starts_with(b"--probe="))
}

/// The probe socket, bound before the spawn; `None` when off or when the default
/// address is taken (a warning).
///
/// # Errors
/// [`exit::CONFIG`] when an address the user gave cannot be bound (logged).
fn bind_probe(probe_addr: &ProbeAddr) -> Result<Option<std::net::TcpListener>, i32> {
    match probe_addr {
        ProbeAddr::Off => Ok(None),
        ProbeAddr::Listen { addr, given_by } => match probe::bind(*addr) {
            Ok(l) => Ok(Some(l)),
            Err(e) if given_by.is_some() => {
                log::error!(
                    "binding the probe address {addr} ({}) failed: {}",
                    given_by.as_deref().unwrap_or_default(),
                    io_word_or_text(&e)
                );
                Err(exit::CONFIG)
            }
            Err(e) => {
                log::warn!(
                    "binding the default probe address {addr} failed ({}); running without probes",
                    io_word_or_text(&e)
                );
                Ok(None)
            }
        },
    }
}

/// The child's argv and environment: drainit's environment (`vars`, as read at
/// start), without the
/// `NOTIFY_SOCKET` and `WATCHDOG_*` meant for drainit itself, plus `notify_env`
/// (the child's own socket with `--ready-notify`), with `LISTEN_PID` rewritten when
/// it names drainit (socket activation, sd_listen_fds(3)).
fn child_spec(
    cfg: &config::Config,
    vars: Vec<(OsString, OsString)>,
    notify_env: Vec<(OsString, OsString)>,
) -> ChildSpec {
    let me = std::process::id().to_string();
    let mut rewrite_listen_pid = false;
    let env: Vec<(OsString, OsString)> = vars
        .into_iter()
        .filter(|(k, v)| {
            if k == "LISTEN_PID" && v.to_str() == Some(me.as_str()) {
                rewrite_listen_pid = true;
            }
            k != "NOTIFY_SOCKET" && k != "WATCHDOG_USEC" && k != "WATCHDOG_PID"
        })
        // With --user, HOME is the user's (as gosu and su-exec set it).
        .filter(|(k, _)| cfg.user.is_none() || k != "HOME")
        .collect();
    let home = cfg
        .user
        .as_ref()
        .map(|u| (OsString::from("HOME"), OsString::from(&u.home)));
    let env = env.into_iter().chain(notify_env).chain(home).collect();
    ChildSpec {
        argv: cfg.command.clone(),
        env,
        rewrite_listen_pid,
        user: cfg.user.clone(),
    }
}

/// Teardown steps and exec checks run later, when a typo can no longer be fixed
/// (a drain that ends in `teardown_failed`, a check that never passes): a command
/// not found now is worth a warning at start. Not an error: it may yet appear (a
/// volume mounted later, a file the app writes).
fn warn_unrunnable(cfg: &config::Config) {
    let steps = cfg
        .teardown
        .iter()
        .map(|t| ("teardown step", t.name.as_str(), &t.argv));
    let checks = cfg.checks.iter().filter_map(|c| match &c.kind {
        CheckKind::Exec(argv) => Some(("exec check", c.name.as_str(), argv)),
        _ => None,
    });
    let phases = cfg.phases.iter().filter_map(|p| match &p.action {
        config::PhaseAction::Command(argv) => Some(("drain phase", p.name.as_str(), argv)),
        config::PhaseAction::Post(_) => None,
    });
    for (what, name, argv) in steps.chain(checks).chain(phases) {
        if let Some(program) = argv.first().filter(|p| !spawn::runnable(p)) {
            log::warn!("{what} '{name}': '{program}' is not an executable file here (yet)");
        }
    }
}

/// drainit moves to `/` after the spawn (it must pin no mount), so every relative
/// path it uses later is anchored now to the directory it was started in: the
/// report file, file checks, and the directory exec checks and teardown steps run in.
///
/// Returns the directory drainit was started in (`None` when it cannot be read).
fn anchor_paths(cfg: &mut config::Config) -> Option<std::path::PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    if let Some(p) = cfg.report_file.as_mut() {
        *p = cwd.join(&*p);
    }
    for c in &mut cfg.checks {
        if let CheckKind::File(p) = &mut c.kind {
            *p = cwd.join(&*p);
        }
    }
    Some(cwd)
}

/// After the spawn: close the inherited fds (the child has its copies) and leave
/// the working directory, so drainit never holds a socket open or pins a mount.
fn hold_nothing(inherited: &[i32]) {
    for &fd in inherited {
        let _ = nix::unistd::close(fd);
    }
    if let Err(e) = std::env::set_current_dir("/") {
        log::debug!("changing directory to / failed: {e}");
    }
}
