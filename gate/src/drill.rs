//! The drill (docs/gate.md, `drainit-gate drill -- CMD`): the model's scenario with
//! real processes.
//!
//! # Theory of operation
//!
//! ```text
//!  client (one connection per attempt, X-Request-Id: drill-N.A)
//!     │
//!  router: built-in (in this process: least-loaded replica whose /readyz answered
//!     │     200 at the last check, at most --slots each, else a 503 never sent)
//!     │   or HAProxy (httpchk GET /readyz per replica, maxconn = --slots; its log
//!     │     says where each attempt went and how it ended)
//!     ▼
//!  W1…Wn: drainit --probe-addr 127.0.0.1:P --proxy 127.0.0.1:X=127.0.0.1:A
//!           --report-file DIR/Wi.json -- CMD (with {port} = A)
//! ```
//!
//! The drill starts the replicas (each under drainit, in its own process group,
//! with a parent-death signal so a killed drill never leaves one behind), waits
//! until every one answers `/readyz` 200 (bounded by `--ready-timeout`: a replica
//! that never gets ready, or exits, ends the drill with exit 2), and calls that
//! instant 0 s. Request #i is sent at `first_at + (i-1)·every`; W1 gets SIGTERM at
//! `signal_at` (and W(n+1) boots then with `--replacement`). Every scenario time
//! is multiplied by `--time-scale`; the app and drainit's own settings (its
//! `DRAINIT_*` environment, inherited) run in real time. When every request has an
//! answer, W1 has exited and the others are stopped with SIGTERM, their exit
//! reports are read, and each request's row joins both sides: what the client got
//! and what its replica's ledger says (a request drainit lists `abandoned` was
//! killed; `unknown` failed). Per replica, the client's counts and the ledger's
//! must agree; a disagreement is reported and fails the gate.
//!
//! Errors: before the clock starts, anything wrong (no `{port}`, no drainit, a
//! port taken, a replica never ready, HAProxy missing) is a [`DrillError`] (exit
//! 2), and everything started is stopped first. After, a replica that dies or a
//! Ctrl-C stops the sending: the requests not sent keep their rows as
//! `not_attempted`, and the verdict counts them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::check;

mod client;
mod fleet;
mod haproxy;
mod output;

use client::{attempt, readyz};
use fleet::{Fleet, ports, signal, spawn_replica, tail};
use haproxy::{HAPROXY_CFG, haproxy_runs, parse_haproxy_log};
pub use output::{replay, text};

/// Which router sits in front of the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Router {
    /// In this process: least-loaded ready replica, `slots` each, else 503.
    Builtin,
    /// A real HAProxy with `option httpchk GET /readyz` per replica.
    Haproxy,
}

/// The drill's settings, validated. Scenario times are seconds before
/// `time_scale` (so `signal_at_s = 30` with `time_scale = 0.1` signals at 3 s).
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Replicas started before 0 s (W1 is the one signalled).
    pub replicas: u32,
    /// Requests the router sends to one replica at once.
    pub slots: u32,
    /// Planned requests (#1…#N).
    pub requests: u32,
    pub every_s: f64,
    pub first_at_s: f64,
    pub signal_at_s: f64,
    /// Boot W(n+1) at the signal.
    pub replacement: bool,
    /// Retryable rejections accepted, percent of the requests.
    pub allow_503_pct: u32,
    /// The path each request asks for.
    pub path: String,
    /// Real seconds per scenario second.
    pub time_scale: f64,
    /// Scenario seconds between two readiness checks (0: before every request).
    pub check_interval_s: f64,
    pub router: Router,
    /// How many times the client retries a retryable 503 (0: never).
    pub retry: u32,
    /// drainit's binary.
    pub drainit: PathBuf,
    /// drainit flags before `--` for every replica (`{port}`: its app port).
    pub drainit_args: Vec<String>,
    /// HAProxy's binary (`--router haproxy`).
    pub haproxy: PathBuf,
    /// Real time a replica gets to answer `/readyz` 200 before the drill gives up.
    #[serde(with = "humantime_serde_secs")]
    pub ready_timeout: Duration,
    /// Real time a replica gets to exit after its SIGTERM (then it is SIGKILLed
    /// with its processes, and its report is partial or missing).
    #[serde(with = "humantime_serde_secs")]
    pub exit_timeout: Duration,
    /// Real time one attempt may take.
    #[serde(with = "humantime_serde_secs")]
    pub request_timeout: Duration,
    /// The first port of the ones the drill uses (consecutive), else free ones.
    pub port_base: Option<u16>,
    /// The user's command; `{port}` is each replica's app port.
    pub cmd: Vec<String>,
}

mod humantime_serde_secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
}

/// Why the drill could not run (exit 2). The message says what and which.
#[derive(Debug)]
pub struct DrillError(pub String);

impl std::fmt::Display for DrillError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One try at a request, as the client saw it (and, with HAProxy, its log).
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// When it was sent (scenario seconds, measured).
    pub at_s: f64,
    /// When its answer ended.
    pub end_s: f64,
    /// The replica it went to; `None` when the router answered it.
    pub replica: Option<String>,
    /// `committed` (the app's answer, whole), `rejected_router`,
    /// `rejected_drainit` (503 with drainit's `Proxy-Status`), `app_5xx`,
    /// `bad_gateway` (502/504 from the router), `reset` (no answer),
    /// `short_body`, `refused`, `timeout`.
    pub outcome: String,
    /// The HTTP status, if an answer came.
    pub status: Option<u16>,
    /// Body bytes received.
    pub bytes: u64,
    #[serde(skip)]
    retry_after_s: Option<f64>,
    #[serde(skip)]
    rid: String,
}

/// One planned request's row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub id: u32,
    /// When it was planned (scenario seconds, scaled back).
    pub planned_s: f64,
    pub attempts: Vec<Attempt>,
    /// The replica of the last attempt.
    pub worker: Option<String>,
    /// `committed`, `rejected`, `failed`, `killed` or `not_attempted`.
    pub status: String,
    /// What the replica's ledger says of it, when it names it (`abandoned`,
    /// `unknown`).
    pub ledger: Option<String>,
    /// When its outcome was decided.
    pub end_s: f64,
}

/// A replica's lane and its report, side by side with the client's counts.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaResult {
    pub name: String,
    pub app_port: u16,
    pub proxy_port: u16,
    pub probe_port: u16,
    pub boot_s: f64,
    pub ready_s: Option<f64>,
    pub signal_s: Option<f64>,
    pub exit_s: Option<f64>,
    /// Its exit report, as read by the fleet gate.
    pub report: check::Replica,
    /// What the client saw of it: attempts sent, whole answers from the app,
    /// drainit's 503s, answers lost (reset, short body, 502 through the router).
    pub client: ClientCounts,
    /// Where the two sides disagree (empty when they agree).
    pub mismatches: Vec<String>,
}

/// The client's side of one replica.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ClientCounts {
    pub sent: u64,
    pub whole: u64,
    pub rejected: u64,
    pub lost: u64,
}

/// The drill's ledger.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Ledger {
    pub committed: u32,
    pub rejected: u32,
    pub failed: u32,
    pub killed: u32,
    pub not_attempted: u32,
}

/// The whole result: settings, rows, replicas, ledger, verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Drill {
    pub settings: Settings,
    pub requests: Vec<Row>,
    pub replicas: Vec<ReplicaResult>,
    pub ledger: Ledger,
    pub allowance: u32,
    pub pass: bool,
    pub reasons: Vec<String>,
    /// Why the sending stopped early, if it did.
    pub stopped: Option<String>,
    /// What may make this run differ from the scenario: requests sent later than
    /// planned by more than a quarter of `--every` (a machine too loaded for the
    /// time scale). Not part of the verdict.
    pub warnings: Vec<String>,
}

/// How long a `/readyz` check may take (real time, at least; the check interval
/// when longer) before it counts as failed: a replica that answers slowly on a
/// loaded machine is not taken out of the rotation by a scaled-down interval.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);
const CHECK_TIMEOUT_MS: u64 = 1000;

/// Set by SIGINT/SIGTERM to the drill: stop sending, tear down, report.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_interrupts() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_interrupt),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// The `drainit` beside this executable, if there is one.
pub fn drainit_beside_me() -> Option<PathBuf> {
    let me = std::env::current_exe().ok()?;
    let p = me.parent()?.join("drainit");
    p.is_file().then_some(p)
}

/// The built-in router's view: per replica, alive, ready at the last check, and
/// attempts it is carrying.
#[derive(Default)]
struct RouterState {
    alive: Vec<bool>,
    ready: Vec<bool>,
    /// When each first answered 200 (the replacement's lane shows it).
    ready_at: Vec<Option<Instant>>,
    load: Vec<u32>,
    probe: Vec<u16>,
    proxy: Vec<u16>,
    names: Vec<String>,
}

impl RouterState {
    /// Least loaded among the alive, ready, not-full replicas; ties to the lowest
    /// index. Takes a slot.
    fn pick(&mut self, slots: u32) -> Option<usize> {
        let i = (0..self.alive.len())
            .filter(|&i| self.alive[i] && self.ready[i] && self.load[i] < slots)
            .min_by_key(|&i| (self.load[i], i))?;
        self.load[i] += 1;
        Some(i)
    }
}

fn secs(t0: Instant, t: Instant) -> f64 {
    (t.saturating_duration_since(t0).as_secs_f64() * 1000.0).round() / 1000.0
}

/// Runs the drill. `Err` when it could not run (exit 2); the verdict otherwise.
pub fn run(s: Settings) -> Result<Drill, DrillError> {
    if !s.cmd.iter().any(|a| a.contains("{port}")) {
        return Err(DrillError(format!(
            "the command has no {{port}}: each replica's app must listen on its own port, e.g. `-- python3 app.py --port {{port}}` (got: {})",
            s.cmd.join(" ")
        )));
    }
    if !s.drainit.is_file() {
        return Err(DrillError(format!(
            "drainit not found at {} (give its path with --drainit)",
            s.drainit.display()
        )));
    }
    if s.router == Router::Haproxy && !haproxy_runs(&s.haproxy) {
        return Err(DrillError(format!(
            "--router haproxy: HAProxy not found ({}): install it (Debian: apt-get install haproxy) or give --haproxy PATH",
            s.haproxy.display()
        )));
    }
    catch_interrupts();
    let total = (s.replicas + u32::from(s.replacement)) as usize;
    let ps = ports(total * 3 + 1, s.port_base)?;
    let dir = std::env::temp_dir().join(format!("drainit-drill-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| DrillError(format!("creating {} failed: {e}", dir.display())))?;
    let result = run_in(&s, &dir, &ps);
    let _ = std::fs::remove_dir_all(&dir);
    result.map(|(rows, replicas, stopped)| verdict(s, rows, replicas, stopped))
}

type Outcome = (Vec<Row>, Vec<ReplicaResult>, Option<String>);

fn run_in(s: &Settings, dir: &Path, ps: &[u16]) -> Result<Outcome, DrillError> {
    let total = (s.replicas + u32::from(s.replacement)) as usize;
    let mut fleet = Fleet {
        procs: vec![],
        haproxy: None,
    };
    for i in 0..s.replicas as usize {
        let p = spawn_replica(
            s,
            dir,
            i as u32 + 1,
            ps[3 * i],
            ps[3 * i + 1],
            ps[3 * i + 2],
        )?;
        fleet.procs.push(p);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| DrillError(format!("the async runtime failed to start: {e}")))?;

    // Every replica answers /readyz 200, or the drill cannot run.
    wait_ready(s, &mut fleet, &rt)?;

    let ts = s.time_scale;
    let scale = move |scenario_s: f64| Duration::from_secs_f64((scenario_s * ts).max(0.0));
    let front_port = ps[total * 3];
    let haproxy_log = dir.join("haproxy.log");
    if s.router == Router::Haproxy {
        start_haproxy(s, dir, &haproxy_log, ps, total, front_port, &mut fleet)?;
    }

    // The clock starts: 0 s.
    let t0 = Instant::now();
    let state = Arc::new(Mutex::new(RouterState {
        alive: vec![true; s.replicas as usize],
        ready: vec![true; s.replicas as usize],
        ready_at: fleet.procs.iter().map(|p| p.ready).collect(),
        load: vec![0; s.replicas as usize],
        probe: fleet.procs.iter().map(|p| p.probe_port).collect(),
        proxy: fleet.procs.iter().map(|p| p.proxy_port).collect(),
        names: fleet.procs.iter().map(|p| p.name.clone()).collect(),
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let stopped: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let fleet = Arc::new(Mutex::new(fleet));

    let rows = rt.block_on(async {
        // Readiness checks: the built-in router's view; behind HAProxy (which checks
        // on its own) they only time the lanes.
        if s.router == Router::Haproxy || s.check_interval_s > 0.0 {
            spawn_checks(s, state.clone(), stop.clone());
        }
        // The watcher: exits, interrupts.
        spawn_watcher(
            fleet.clone(),
            state.clone(),
            stop.clone(),
            stopped.clone(),
            t0,
            s.time_scale,
        );
        // The signal (and the replacement).
        spawn_signal(
            fleet.clone(),
            state.clone(),
            stop.clone(),
            t0 + scale(s.signal_at_s),
            s.clone(),
            dir.to_path_buf(),
            ps.to_vec(),
        );
        // The requests.
        let mut tasks = Vec::new();
        for id in 1..=s.requests {
            let planned = s.first_at_s + f64::from(id - 1) * s.every_s;
            let (state, stop, s2) = (state.clone(), stop.clone(), s.clone());
            tasks.push(tokio::spawn(request(
                id, planned, state, stop, s2, t0, front_port,
            )));
        }
        let mut rows = Vec::new();
        for t in tasks {
            if let Ok(r) = t.await {
                rows.push(r);
            }
        }
        stop.store(true, Ordering::SeqCst);
        rows
    });

    finish(s, rt, fleet, &state, &stopped, &haproxy_log, t0, rows)
}

/// Waits until every replica answers /readyz 200: an error when one exits first,
/// when `--ready-timeout` passes, or on an interrupt.
fn wait_ready(
    s: &Settings,
    fleet: &mut Fleet,
    rt: &tokio::runtime::Runtime,
) -> Result<(), DrillError> {
    let deadline = Instant::now() + s.ready_timeout;
    loop {
        if INTERRUPTED.load(Ordering::SeqCst) {
            return Err(DrillError(
                "interrupted before the replicas were ready".into(),
            ));
        }
        for p in &mut fleet.procs {
            if let Ok(Some(st)) = p.child.try_wait() {
                return Err(DrillError(format!(
                    "{} exited before it was ready ({st}); its output ends:\n    {}",
                    p.name,
                    tail(&p.log_path)
                )));
            }
            if p.ready.is_none() && rt.block_on(readyz(p.probe_port, Duration::from_millis(500))) {
                p.ready = Some(Instant::now());
            }
        }
        if fleet.procs.iter().all(|p| p.ready.is_some()) {
            break;
        }
        if Instant::now() >= deadline {
            let not: Vec<&str> = fleet
                .procs
                .iter()
                .filter(|p| p.ready.is_none())
                .map(|p| p.name.as_str())
                .collect();
            return Err(DrillError(format!(
                "{} never answered /readyz 200 within --ready-timeout {}; {}'s output ends:\n    {}",
                not.join(", "),
                humantime::format_duration(s.ready_timeout),
                not[0],
                tail(
                    &fleet
                        .procs
                        .iter()
                        .find(|p| p.ready.is_none())
                        .map_or(PathBuf::new(), |p| p.log_path.clone())
                )
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Starts HAProxy in front of every replica (the replacement's server listed from
/// the start) and waits until its frontend accepts and its first checks ran.
fn start_haproxy(
    s: &Settings,
    dir: &Path,
    haproxy_log: &Path,
    ps: &[u16],
    total: usize,
    front_port: u16,
    fleet: &mut Fleet,
) -> Result<(), DrillError> {
    // Every server is listed from the start, the replacement's too: its checks
    // fail (DOWN) until it boots and answers /readyz 200 (rise 1).
    let inter_ms = (s.check_interval_s * s.time_scale * 1000.0)
        .round()
        .max(10.0) as u64;
    let mut cfg = HAPROXY_CFG
        .replace("{front}", &front_port.to_string())
        .replace("{client}", &format!("{}ms", s.request_timeout.as_millis()))
        .replace("{server}", &format!("{}ms", s.request_timeout.as_millis()))
        .replace(
            "{check_timeout}",
            &format!("{}ms", inter_ms.max(CHECK_TIMEOUT_MS)),
        )
        .replace("{inter}", &format!("{inter_ms}ms"))
        .replace("{slots}", &s.slots.to_string());
    for i in 0..total {
        let _ = writeln!(
            cfg,
            "    server w{} 127.0.0.1:{} check port {}",
            i + 1,
            ps[3 * i + 1],
            ps[3 * i + 2],
        );
    }
    let cfg_path = dir.join("haproxy.cfg");
    std::fs::write(&cfg_path, cfg)
        .map_err(|e| DrillError(format!("writing {} failed: {e}", cfg_path.display())))?;
    let out = std::fs::File::create(haproxy_log)
        .map_err(|e| DrillError(format!("creating {} failed: {e}", haproxy_log.display())))?;
    let err = out.try_clone().map_err(|e| DrillError(e.to_string()))?;
    let mut c = Command::new(&s.haproxy);
    c.arg("-db")
        .arg("-f")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    // SAFETY: as in spawn_replica.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    fleet.haproxy = Some(
        c.spawn()
            .map_err(|e| DrillError(format!("starting HAProxy failed: {e}")))?,
    );
    // Its frontend accepts, and its first checks have run.
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(Ok(Some(st))) = fleet.haproxy.as_mut().map(Child::try_wait) {
            return Err(DrillError(format!(
                "HAProxy exited ({st}); its output ends:\n    {}",
                tail(haproxy_log)
            )));
        }
        if std::net::TcpStream::connect(("127.0.0.1", front_port)).is_ok() {
            break;
        }
        if Instant::now() > until {
            return Err(DrillError(format!(
                "HAProxy did not listen on 127.0.0.1:{front_port} within 5s; its output ends:\n    {}",
                tail(haproxy_log)
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(3 * inter_ms + 50));
    Ok(())
}

/// The watcher: marks each replica's exit (and its lane dead), and stops the
/// drill on an interrupt or a replica that exited without a signal.
fn spawn_watcher(
    fleet: Arc<Mutex<Fleet>>,
    state: Arc<Mutex<RouterState>>,
    stop: Arc<AtomicBool>,
    stopped: Arc<Mutex<Option<String>>>,
    t0: Instant,
    ts: f64,
) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if INTERRUPTED.load(Ordering::SeqCst) {
                stopped
                    .lock()
                    .expect("not poisoned")
                    .get_or_insert_with(|| "interrupted (SIGINT/SIGTERM)".into());
                stop.store(true, Ordering::SeqCst);
            }
            let mut f = fleet.lock().expect("not poisoned");
            let mut st = state.lock().expect("not poisoned");
            for (i, p) in f.procs.iter_mut().enumerate() {
                if p.exit.is_none() && matches!(p.child.try_wait(), Ok(Some(_))) {
                    p.exit = Some(Instant::now());
                    if let Some(a) = st.alive.get_mut(i) {
                        *a = false;
                    }
                    if p.signal.is_none() {
                        stopped
                            .lock()
                            .expect("not poisoned")
                            .get_or_insert_with(|| {
                                format!(
                                    "{} exited at {:.2}s without a signal; output ends:\n    {}",
                                    p.name,
                                    secs(t0, Instant::now()) / ts,
                                    tail(&p.log_path)
                                )
                            });
                        stop.store(true, Ordering::SeqCst);
                    }
                }
            }
            drop(st);
            drop(f);
        }
    });
}

/// At `at`, SIGTERM to W1, and with `--replacement` the new replica's start.
fn spawn_signal(
    fleet: Arc<Mutex<Fleet>>,
    state: Arc<Mutex<RouterState>>,
    stop: Arc<AtomicBool>,
    at: Instant,
    s2: Settings,
    dir: PathBuf,
    ps: Vec<u16>,
) {
    tokio::spawn(async move {
        wait_until(at, &stop).await;
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut f = fleet.lock().expect("not poisoned");
        let now = Instant::now();
        f.procs[0].signal = Some(now);
        signal(f.procs[0].child.id(), nix::sys::signal::Signal::SIGTERM);
        if s2.replacement {
            let i = s2.replicas as usize;
            match spawn_replica(
                &s2,
                &dir,
                i as u32 + 1,
                ps[3 * i],
                ps[3 * i + 1],
                ps[3 * i + 2],
            ) {
                Ok(p) => {
                    let mut st = state.lock().expect("not poisoned");
                    st.alive.push(true);
                    st.ready.push(false);
                    st.ready_at.push(None);
                    st.load.push(0);
                    st.probe.push(p.probe_port);
                    st.proxy.push(p.proxy_port);
                    st.names.push(p.name.clone());
                    f.procs.push(p);
                }
                Err(e) => eprintln!("drainit-gate: {e}"),
            }
        }
    });
}

/// One planned request: sent at its time through the router, retried while the
/// answer is retryable and `--retry` allows; its attempts.
async fn request(
    id: u32,
    planned: f64,
    state: Arc<Mutex<RouterState>>,
    stop: Arc<AtomicBool>,
    s2: Settings,
    t0: Instant,
    front_port: u16,
) -> (u32, f64, Vec<Attempt>) {
    wait_until(t0 + scaled(s2.time_scale, planned), &stop).await;
    let mut attempts: Vec<Attempt> = Vec::new();
    loop {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let n = attempts.len() + 1;
        let rid = format!("drill-{id}.{n}");
        let at = Instant::now();
        let a = match s2.router {
            Router::Builtin => {
                if s2.check_interval_s == 0.0 {
                    check_all(&state, CHECK_TIMEOUT).await;
                }
                let pick = {
                    let mut st = state.lock().expect("not poisoned");
                    st.pick(s2.slots)
                        .map(|i| (i, st.proxy[i], st.names[i].clone()))
                };
                match pick {
                    None => Attempt {
                        at_s: secs(t0, at),
                        end_s: secs(t0, at),
                        replica: None,
                        outcome: "rejected_router".into(),
                        status: Some(503),
                        bytes: 0,
                        retry_after_s: Some(1.0),
                        rid,
                    },
                    Some((i, port, name)) => {
                        let (outcome, status, bytes, ra) =
                            attempt(port, &s2.path, &rid, s2.request_timeout).await;
                        state.lock().expect("not poisoned").load[i] -= 1;
                        Attempt {
                            at_s: secs(t0, at),
                            end_s: secs(t0, Instant::now()),
                            replica: Some(name),
                            outcome,
                            status,
                            bytes,
                            retry_after_s: ra,
                            rid,
                        }
                    }
                }
            }
            Router::Haproxy => {
                let (outcome, status, bytes, ra) =
                    attempt(front_port, &s2.path, &rid, s2.request_timeout).await;
                Attempt {
                    at_s: secs(t0, at),
                    end_s: secs(t0, Instant::now()),
                    replica: None,
                    outcome,
                    status,
                    bytes,
                    retry_after_s: ra,
                    rid,
                }
            }
        };
        let retryable = a.outcome.starts_with("rejected")
            || (s2.router == Router::Haproxy && a.status == Some(503) && a.outcome == "app_5xx");
        let wait = a.retry_after_s.unwrap_or(1.0).clamp(0.0, 1.0);
        attempts.push(a);
        if !retryable || attempts.len() > s2.retry as usize {
            break;
        }
        wait_until(Instant::now() + scaled(s2.time_scale, wait), &stop).await;
    }
    (id, planned, attempts)
}

/// Runs the readiness checks every `--check-interval` (1 s behind HAProxy) until
/// the drill stops.
fn spawn_checks(s: &Settings, state: Arc<Mutex<RouterState>>, stop: Arc<AtomicBool>) {
    let interval = if s.check_interval_s > 0.0 {
        s.check_interval_s
    } else {
        1.0
    };
    let every = scaled(s.time_scale, interval).max(Duration::from_millis(5));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if stop.load(Ordering::SeqCst) {
                break;
            }
            check_all(&state, every.max(CHECK_TIMEOUT)).await;
        }
    });
}

/// After the requests: W1 may exit on its own (bounded), the others are
/// stopped, and both sides are joined.
#[allow(clippy::too_many_arguments)]
fn finish(
    s: &Settings,
    rt: tokio::runtime::Runtime,
    fleet: Arc<Mutex<Fleet>>,
    state: &Mutex<RouterState>,
    stopped: &Mutex<Option<String>>,
    haproxy_log: &Path,
    t0: Instant,
    rows: Vec<(u32, f64, Vec<Attempt>)>,
) -> Result<Outcome, DrillError> {
    // W1 exits on its own (bounded), then the others are stopped. The runtime's
    // shutdown drops its tasks, and with them their handles on the fleet.
    drop(rt);
    let Ok(mutex) = Arc::try_unwrap(fleet) else {
        return Err(DrillError("internal: a task outlived the runtime".into()));
    };
    let mut f = mutex
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if f.procs[0].signal.is_some() {
        let until = Instant::now() + s.exit_timeout;
        while f.procs[0].child.try_wait().ok().flatten().is_none()
            && Instant::now() < until
            && !INTERRUPTED.load(Ordering::SeqCst)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        if f.procs[0].exit.is_none() && f.procs[0].child.try_wait().ok().flatten().is_some() {
            f.procs[0].exit = Some(Instant::now());
        }
    }
    f.stop_all(s.exit_timeout);
    let ready_at = state.lock().expect("not poisoned").ready_at.clone();
    for (p, r) in f.procs.iter_mut().zip(ready_at) {
        p.ready = p.ready.or(r);
    }
    let log = std::fs::read_to_string(haproxy_log).unwrap_or_default();
    let routed = parse_haproxy_log(&log);
    let stopped = stopped.lock().expect("not poisoned").clone();
    Ok(join(s, t0, rows, &f, &routed, stopped))
}

/// A scenario time in seconds as a wall-clock duration at time scale `ts`.
fn scaled(ts: f64, scenario_s: f64) -> Duration {
    Duration::from_secs_f64((scenario_s * ts).max(0.0))
}

/// Sleeps until `deadline`, or until the drill stops (checked every 20 ms), so a
/// Ctrl-C does not wait for the last planned request's time.
async fn wait_until(deadline: Instant, stop: &AtomicBool) {
    loop {
        let now = Instant::now();
        if now >= deadline || stop.load(Ordering::SeqCst) {
            return;
        }
        tokio::time::sleep((deadline - now).min(Duration::from_millis(20))).await;
    }
}

async fn check_all(state: &Arc<Mutex<RouterState>>, timeout: Duration) {
    let probes: Vec<(usize, u16)> = {
        let st = state.lock().expect("not poisoned");
        (0..st.alive.len())
            .filter(|&i| st.alive[i])
            .map(|i| (i, st.probe[i]))
            .collect()
    };
    let mut results = Vec::new();
    for (i, port) in probes {
        results.push((i, tokio::spawn(readyz(port, timeout))));
    }
    for (i, h) in results {
        let ok = h.await.unwrap_or(false);
        let mut st = state.lock().expect("not poisoned");
        st.ready[i] = ok;
        if ok && st.ready_at[i].is_none() {
            st.ready_at[i] = Some(Instant::now());
        }
    }
}

/// Joins both sides: the client's attempts (placed on replicas by the HAProxy log
/// when HAProxy routed) and each replica's report.
fn join(
    s: &Settings,
    t0: Instant,
    raw: Vec<(u32, f64, Vec<Attempt>)>,
    f: &Fleet,
    routed: &BTreeMap<String, (Option<String>, u16, String)>,
    stopped: Option<String>,
) -> Outcome {
    let (reports, lost) = read_reports(f);
    let mut rows = Vec::new();
    let mut counts: BTreeMap<String, ClientCounts> = BTreeMap::new();
    let mut got: BTreeMap<u32, (f64, Vec<Attempt>)> =
        raw.into_iter().map(|(id, p, a)| (id, (p, a))).collect();
    for id in 1..=s.requests {
        let planned = s.first_at_s + f64::from(id - 1) * s.every_s;
        let (_, mut attempts) = got.remove(&id).unwrap_or((planned, vec![]));
        for a in &mut attempts {
            place(s, routed, &lost, &mut counts, a);
        }
        let last = attempts.last();
        let ledger = last.and_then(|a| lost.get(&a.rid)).map(|(_, o)| o.clone());
        let status = match (last, ledger.as_deref()) {
            (None, _) => "not_attempted",
            (Some(_), Some("abandoned")) => "killed",
            (Some(a), _) => match a.outcome.as_str() {
                "committed" => "committed",
                "rejected_router" | "rejected_drainit" => "rejected",
                _ => "failed",
            },
        };
        rows.push(Row {
            id,
            planned_s: planned,
            worker: last.and_then(|a| a.replica.clone()),
            status: status.into(),
            ledger,
            end_s: last.map_or(planned, |a| a.end_s / s.time_scale),
            attempts,
        });
    }
    let mut replicas = Vec::new();
    for (p, (report, _)) in f.procs.iter().zip(reports) {
        let client = counts.get(&p.name).copied().unwrap_or_default();
        let mismatches = report
            .requests
            .as_ref()
            .map_or_else(Vec::new, |l| disagreements(&p.name, &client, l));
        let at = |t: Option<Instant>| t.map(|t| secs(t0, t) / s.time_scale);
        replicas.push(ReplicaResult {
            name: p.name.clone(),
            app_port: p.app_port,
            proxy_port: p.proxy_port,
            probe_port: p.probe_port,
            boot_s: if p.boot < t0 {
                -(secs(p.boot, t0) / s.time_scale)
            } else {
                secs(t0, p.boot) / s.time_scale
            },
            ready_s: p.ready.map(|r| {
                if r < t0 {
                    0.0
                } else {
                    secs(t0, r) / s.time_scale
                }
            }),
            signal_s: at(p.signal),
            exit_s: at(p.exit),
            report,
            client,
            mismatches,
        });
    }
    for r in &mut rows {
        for a in &mut r.attempts {
            a.at_s /= s.time_scale;
            a.end_s /= s.time_scale;
        }
    }
    (rows, replicas, stopped)
}

/// The requests the replicas' reports list as lost: request id → (replica,
/// ledger outcome).
type Lost = BTreeMap<String, (String, String)>;

/// Each replica's exit report (its summary and the JSON), and the requests the
/// reports list as lost: request id → (replica, ledger outcome).
fn read_reports(f: &Fleet) -> (Vec<(check::Replica, Value)>, Lost) {
    let reports: Vec<(check::Replica, Value)> = f
        .procs
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p.report_path)
                .map_err(|e| format!("{}: {e}", p.report_path.display()));
            let src = check::Source {
                name: p.name.clone(),
                text: text.clone(),
            };
            let v = text
                .ok()
                .and_then(|t| check::find_report(&t))
                .unwrap_or(Value::Null);
            (check::read_replica(&src), v)
        })
        .collect();
    // request id → (replica, ledger outcome) from the reports' lost lists.
    let mut lost = Lost::new();
    for (p, (_, v)) in f.procs.iter().zip(&reports) {
        if let Some(list) = v.pointer("/requests/lost").and_then(Value::as_array) {
            for l in list {
                if let (Some(rid), Some(o)) = (
                    l.get("request_id").and_then(Value::as_str),
                    l.get("outcome").and_then(Value::as_str),
                ) {
                    lost.insert(rid.to_string(), (p.name.clone(), o.to_string()));
                }
            }
        }
    }
    (reports, lost)
}

/// Places one attempt on the replica that saw it (by HAProxy's log when HAProxy
/// routed, or a report's lost list) and counts it on that replica's client side.
fn place(
    s: &Settings,
    routed: &BTreeMap<String, (Option<String>, u16, String)>,
    lost: &Lost,
    counts: &mut BTreeMap<String, ClientCounts>,
    a: &mut Attempt,
) {
    if s.router == Router::Haproxy
        && let Some((server, _, term)) = routed.get(&a.rid)
    {
        a.replica = server.clone();
        // HAProxy's own 503: no server (<NOSRV>) or a queue timeout (sQ).
        // Queued for a server and never sent: no replica saw it.
        if a.status == Some(503) && (server.is_none() || term.starts_with('s')) {
            a.outcome = "rejected_router".into();
            a.replica = None;
        }
    }
    if let Some((replica, _)) = lost.get(&a.rid) {
        a.replica = Some(replica.clone());
    }
    if let Some(r) = &a.replica {
        let c = counts.entry(r.clone()).or_default();
        match a.outcome.as_str() {
            "refused" => {}
            "rejected_router" => {}
            "rejected_drainit" => {
                c.sent += 1;
                c.rejected += 1;
            }
            "committed" | "app_5xx" => {
                c.sent += 1;
                c.whole += 1;
            }
            _ => {
                c.sent += 1;
                c.lost += 1;
            }
        }
    }
}

/// Where a replica's two sides disagree: the client's counts of what reached it
/// against its exit report's ledger (received, completed, rejected, lost).
pub fn disagreements(name: &str, client: &ClientCounts, l: &check::Ledger) -> Vec<String> {
    [
        ("attempts reach it (received)", client.sent, l.received),
        (
            "whole answers from the app (completed)",
            client.whole,
            l.completed,
        ),
        ("drainit 503s (rejected)", client.rejected, l.rejected),
        (
            "lost answers (unknown + abandoned)",
            client.lost,
            l.unknown + l.abandoned,
        ),
    ]
    .into_iter()
    .filter(|(_, c, r)| c != r)
    .map(|(what, c, r)| format!("{name}: the client saw {c} {what}, the ledger says {r}"))
    .collect()
}

fn verdict(
    s: Settings,
    rows: Vec<Row>,
    replicas: Vec<ReplicaResult>,
    stopped: Option<String>,
) -> Drill {
    let mut ledger = Ledger::default();
    let mut by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in &rows {
        match r.status.as_str() {
            "committed" => ledger.committed += 1,
            "rejected" => ledger.rejected += 1,
            "failed" => ledger.failed += 1,
            "killed" => ledger.killed += 1,
            _ => ledger.not_attempted += 1,
        }
        by.entry(r.status.as_str())
            .or_default()
            .push(format!("#{}", r.id));
    }
    let list = |k: &str| by.get(k).map_or(String::new(), |v| v.join(", "));
    let allowance = s.allow_503_pct * s.requests / 100;
    let mut reasons = Vec::new();
    if let Some(why) = &stopped {
        reasons.push(format!("the drill stopped early: {why}"));
    }
    if ledger.killed > 0 {
        reasons.push(format!(
            "{} killed in flight ({})",
            ledger.killed,
            list("killed")
        ));
    }
    if ledger.failed > 0 {
        reasons.push(format!("{} failed ({})", ledger.failed, list("failed")));
    }
    if ledger.not_attempted > 0 {
        reasons.push(format!(
            "{} not attempted ({})",
            ledger.not_attempted,
            list("not_attempted")
        ));
    }
    if u64::from(ledger.rejected) * 100 > u64::from(s.allow_503_pct) * u64::from(s.requests) {
        reasons.push(format!(
            "{} rejected ({}) > allowance {allowance}",
            ledger.rejected,
            list("rejected")
        ));
    }
    for r in &replicas {
        if r.report.state != "final" {
            reasons.push(format!(
                "{}'s exit report is {} ({})",
                r.name,
                r.report.state,
                r.report
                    .error
                    .as_deref()
                    .unwrap_or("drainit did not finish")
            ));
        }
        for m in &r.mismatches {
            reasons.push(format!("ledger disagreement: {m}"));
        }
    }
    let pass = reasons.is_empty();
    if pass {
        reasons.push(format!(
            "every request committed or was rejected within the allowance ({} committed, {} rejected, allowance {allowance})",
            ledger.committed, ledger.rejected
        ));
    }
    let mut warnings = Vec::new();
    let late: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let first = r.attempts.first()?;
            let by = first.at_s - r.planned_s;
            (by > s.every_s / 4.0 && by > 0.05 / s.time_scale)
                .then(|| format!("#{} by {by:.2}s", r.id))
        })
        .collect();
    if !late.is_empty() {
        warnings.push(format!(
            "sent later than planned ({}): the machine was too loaded for --time-scale {}; a larger scale keeps the schedule",
            late.join(", "),
            s.time_scale
        ));
    }
    Drill {
        settings: s,
        requests: rows,
        replicas,
        ledger,
        allowance,
        pass,
        reasons,
        stopped,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_that_disagrees_with_the_client_is_named() {
        let client = ClientCounts {
            sent: 5,
            whole: 4,
            rejected: 0,
            lost: 1,
        };
        let agree = check::Ledger {
            received: 5,
            completed: 4,
            abandoned: 1,
            ..Default::default()
        };
        assert!(disagreements("W1", &client, &agree).is_empty());
        // A request the client lost that the ledger counted completed.
        let wrong = check::Ledger {
            received: 5,
            completed: 5,
            ..Default::default()
        };
        assert_eq!(
            disagreements("W1", &client, &wrong),
            [
                "W1: the client saw 4 whole answers from the app (completed), the ledger says 5",
                "W1: the client saw 1 lost answers (unknown + abandoned), the ledger says 0",
            ]
        );
    }

    #[test]
    fn the_haproxy_log_says_where_each_attempt_went() {
        let log = "[NOTICE] started\n\
                   drill {drill-3.1} w2 200 ---- 5\n\
                   drill {drill-17.1} <NOSRV> 503 sQ-- 0\n";
        let m = parse_haproxy_log(log);
        assert_eq!(m["drill-3.1"], (Some("W2".into()), 200, "----".into()));
        assert_eq!(m["drill-17.1"], (None, 503, "sQ--".into()));
    }
}
