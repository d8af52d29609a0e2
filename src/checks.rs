//! Readiness checks: tcp, http, exec and file, each bounded by its own timeout,
//! run concurrently, with single flight (docs/probes.md).
//!
//! Owns: evaluating the configured checks, remembering the last evaluation, and
//! counting every run ([`RunCounts`], which `/metrics` reads at scrape time).
//! While starting, [`wait_ready`] polls every `--ready-interval` until all pass
//! once; from then on each `/readyz` request calls [`Checks::evaluate`], and
//! requests that arrive while an evaluation runs share it, so probe load never
//! multiplies check load.
//!
//! Must not: wait for a process itself, or signal one. Exec checks are spawned
//! through the one reaper and their status comes back on a channel; the tree
//! kills what a timed-out or finished check leaves ([`crate::tree::Helper`]). A check's `detail` names the
//! kind of failure only (`connection refused`, `timed out after 500ms`, `exit status
//! 1`, `http status 500`), never an error's text: that text carries hosts, users and
//! secrets, and probes are reachable by anything on the network.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::watch;

use crate::drain::ChildExit;
use crate::reaper::Reaper;
use crate::spawn::{HelperOutput, Launcher};
use crate::util::{entry, fmt_ms};

/// One readiness check, as configured.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// Shown in `/readyz` under `checks`.
    pub name: String,
    pub kind: CheckKind,
    /// Bound on one evaluation.
    pub timeout: Duration,
}

/// What a check looks at (docs/probes.md).
#[derive(Clone, Debug, PartialEq)]
pub enum CheckKind {
    /// `host:port`; passes when a connection is accepted.
    Tcp(String),
    /// `http://host:port/path`; passes on status 200–399.
    Http(String),
    /// argv, run without a shell; passes on exit status 0.
    Exec(Vec<String>),
    /// Passes when the path exists.
    File(PathBuf),
}

/// The result of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    /// The check's configured name (`tcp`, `tcp-2`, or a `[[check]]` name).
    pub name: String,
    /// The check passed.
    pub ok: bool,
    /// The kind of failure; `None` when ok.
    pub detail: Option<String>,
}

/// The results of one evaluation of every check, in configuration order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluation {
    pub results: Vec<CheckResult>,
}

impl Evaluation {
    /// Every check passed (true for no checks).
    pub fn all_ok(&self) -> bool {
        self.results.iter().all(|r| r.ok)
    }
}

/// Upper bounds of the check-duration histogram buckets, seconds (the Prometheus
/// client libraries' defaults, which span a 1 s default check timeout well).
pub const DURATION_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How long a check's runs took, seconds.
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// Non-cumulative counts per bucket of [`DURATION_BUCKETS`], then `+Inf`.
    pub buckets: [u64; DURATION_BUCKETS.len() + 1],
    pub sum: f64,
    pub count: u64,
}

/// Every run of every check so far, for `/metrics` (read at scrape time). Label
/// sets in the order first seen; plain vectors, not maps: a handful of entries.
#[derive(Clone, Debug, Default)]
pub struct RunCounts {
    /// `(check name, passed)` → runs.
    pub runs: Vec<((String, bool), u64)>,
    /// Check name → durations.
    pub durations: Vec<(String, Histogram)>,
}

impl RunCounts {
    /// One run of the check named `check` ended after `took`, passed or not (a
    /// timeout is a failure that took the timeout).
    pub fn record(&mut self, check: &str, passed: bool, took: Duration) {
        *entry(&mut self.runs, (check.to_string(), passed)) += 1;
        let h = entry(&mut self.durations, check.to_string());
        let secs = took.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(DURATION_BUCKETS.len());
        h.buckets[i] += 1;
        h.sum += secs;
        h.count += 1;
    }
}

/// The configured checks and the single-flight state.
pub struct Checks {
    specs: Vec<Check>,
    reaper: Rc<RefCell<Reaper>>,
    /// Starts exec checks.
    launcher: Launcher,
    running: RefCell<Option<watch::Receiver<Option<Rc<Evaluation>>>>>,
    last: RefCell<Option<Rc<Evaluation>>>,
    runs: std::cell::Cell<u64>,
    counts: Rc<RefCell<RunCounts>>,
}

impl Checks {
    /// The checks of the configuration, in order. `reaper` is the one waiter: exec
    /// checks register their pid with it, and their status arrives only when the
    /// supervisor reaps (without a reaping loop, an exec check ends by timing out).
    /// `launcher` starts the exec checks.
    pub fn new(specs: Vec<Check>, reaper: Rc<RefCell<Reaper>>, launcher: Launcher) -> Rc<Checks> {
        Rc::new(Checks {
            specs,
            reaper,
            launcher,
            running: RefCell::new(None),
            last: RefCell::new(None),
            runs: 0.into(),
            counts: Rc::default(),
        })
    }

    /// No check is configured.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// The last finished evaluation, if any.
    pub fn last(&self) -> Option<Rc<Evaluation>> {
        self.last.borrow().clone()
    }

    /// drainit's own helpers (exec checks, teardown steps) and the process
    /// groups of exec checks whose leftovers are not gone yet
    /// (`tree::helpers`): not the app's processes.
    pub fn helper_pids(&self) -> std::collections::HashSet<i32> {
        crate::tree::helpers(&self.reaper, &crate::tree::Real)
    }

    /// How many evaluations ran so far (single flight shows here).
    pub fn runs(&self) -> u64 {
        self.runs.get()
    }

    /// Every check run so far, by check and result, and how long they took.
    pub fn runs_by_result(&self) -> std::cell::Ref<'_, RunCounts> {
        self.counts.borrow()
    }

    /// Evaluates every check, or joins the evaluation already running. Returns
    /// within the largest check timeout plus scheduling.
    pub async fn evaluate(self: &Rc<Self>) -> Rc<Evaluation> {
        let mut rx = {
            let mut running = self.running.borrow_mut();
            match running.as_ref() {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    *running = Some(rx.clone());
                    let this = self.clone();
                    tokio::task::spawn_local(async move {
                        let ev = Rc::new(this.run_all().await);
                        this.runs.set(this.runs.get() + 1);
                        *this.last.borrow_mut() = Some(ev.clone());
                        *this.running.borrow_mut() = None;
                        let _ = tx.send(Some(ev));
                    });
                    rx
                }
            }
        };
        let finished = rx.wait_for(Option::is_some).await.map(|v| v.clone());
        match finished {
            Ok(v) => v.expect("wait_for returned a Some"),
            // The evaluating task panicked: report every check failed, and forget
            // the dead evaluation so that the next request starts a fresh one.
            Err(_) => {
                let mut running = self.running.borrow_mut();
                if running.as_ref().is_some_and(|r| r.same_channel(&rx)) {
                    *running = None;
                }
                Rc::new(Evaluation {
                    results: self
                        .specs
                        .iter()
                        .map(|c| CheckResult {
                            name: c.name.clone(),
                            ok: false,
                            detail: Some("internal error".into()),
                        })
                        .collect(),
                })
            }
        }
    }

    async fn run_all(self: &Rc<Self>) -> Evaluation {
        let mut set = tokio::task::JoinSet::new();
        for (i, spec) in self.specs.iter().enumerate() {
            let spec = spec.clone();
            let reaper = self.reaper.clone();
            let launcher = self.launcher.clone();
            let counts = self.counts.clone();
            set.spawn_local(async move {
                let started = tokio::time::Instant::now();
                let detail = match tokio::time::timeout(
                    spec.timeout,
                    run_one(&spec.kind, &reaper, &launcher),
                )
                .await
                {
                    Ok(r) => r.err(),
                    Err(_) => Some(format!("timed out after {}", fmt_ms(spec.timeout))),
                };
                counts
                    .borrow_mut()
                    .record(&spec.name, detail.is_none(), started.elapsed());
                (
                    i,
                    CheckResult {
                        name: spec.name.clone(),
                        ok: detail.is_none(),
                        detail,
                    },
                )
            });
        }
        let mut results: Vec<Option<CheckResult>> = vec![None; self.specs.len()];
        while let Some(r) = set.join_next().await {
            if let Ok((i, res)) = r {
                results[i] = Some(res);
            }
        }
        Evaluation {
            results: results
                .into_iter()
                .zip(&self.specs)
                .map(|(r, c)| {
                    r.unwrap_or(CheckResult {
                        name: c.name.clone(),
                        ok: false,
                        detail: Some("internal error".into()),
                    })
                })
                .collect(),
        }
    }
}

/// Runs one check to its end (the caller bounds it with the check's timeout).
/// `Err` holds the failure kind shown as `detail`.
async fn run_one(
    kind: &CheckKind,
    reaper: &Rc<RefCell<Reaper>>,
    launcher: &Launcher,
) -> Result<(), String> {
    match kind {
        CheckKind::Tcp(addr) => tcp(addr).await.map(drop),
        CheckKind::Http(url) => http(url).await,
        CheckKind::Exec(argv) => exec(argv, reaper, launcher).await,
        CheckKind::File(p) => {
            // On the loop thread: a hung filesystem (an NFS mount gone away) would
            // stall it. tokio's blocking pool would not, but its code alone costs
            // 64 KiB of resident set for every user (measured on the static musl
            // build, 1328 -> 1392 KiB), against the memory target.
            if p.exists() {
                Ok(())
            } else {
                Err("not found".into())
            }
        }
    }
}

fn connect_error(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::ConnectionReset | K::ConnectionAborted => "connection reset".into(),
        K::HostUnreachable | K::NetworkUnreachable => "host unreachable".into(),
        K::TimedOut => "timed out".into(),
        _ => "connection failed".into(),
    }
}

/// The addresses a check target names, without DNS: `IP:PORT` (`[v6]:PORT`) is
/// itself, `localhost:PORT` is `127.0.0.1:PORT` then `[::1]:PORT`. Any other name
/// is `None`.
///
/// Checks probe the app in drainit's own network namespace, so a name is not
/// needed, and not resolving one keeps readiness off DNS (a slow resolver would
/// fail every check) and works in an image without `/etc/hosts` or a resolver
/// configuration (`FROM scratch`), where glibc would not even know `localhost`.
pub fn target_addrs(hostport: &str) -> Option<Vec<std::net::SocketAddr>> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
    if let Ok(a) = hostport.parse::<SocketAddr>() {
        return Some(vec![a]);
    }
    let (host, port) = hostport.rsplit_once(':')?;
    let port = port.parse::<u16>().ok()?;
    host.eq_ignore_ascii_case("localhost").then(|| {
        vec![
            SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            SocketAddr::from((Ipv6Addr::LOCALHOST, port)),
        ]
    })
}

/// Connects to the first address of the target that accepts.
async fn tcp(hostport: &str) -> Result<tokio::net::TcpStream, String> {
    let addrs = target_addrs(hostport).ok_or("address not resolved")?;
    // The first address's failure is the one shown: with IPv6 off, `::1` fails with
    // "address not available", which would hide IPv4's "connection refused".
    let mut first = None;
    for a in addrs {
        match tokio::net::TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => {
                first.get_or_insert_with(|| connect_error(&e));
            }
        }
    }
    Err(first.unwrap_or_else(|| "address not resolved".into()))
}

struct Target<'a> {
    hostport: &'a str,
    path: String,
    userinfo: Option<&'a str>,
}

fn split_url(url: &str) -> Option<Target<'_>> {
    let rest = url.strip_prefix("http://")?;
    let (authority, target) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    // The fragment is never sent; a query without a path gets the root path.
    let target = target.split('#').next().unwrap_or("");
    let path = match target {
        "" => "/".to_string(),
        t if t.starts_with('?') => format!("/{t}"),
        t => t.to_string(),
    };
    Some(Target {
        hostport,
        path,
        userinfo,
    })
}

/// `%XX` escapes decoded (RFC 3986 §2.1): a URL's `user:password` is
/// percent-encoded (`u%40x` for `u@x`), Basic auth wants the bytes themselves. A
/// `%` not followed by two hex digits stays as it is.
fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// How much of a response head a check reads (bytes); past that, the status line
/// decides.
pub const MAX_RESPONSE_HEAD: usize = 16 * 1024;

/// `GET` with `Connection: close`; passes on status 200–399. Only the response head
/// is read (parsed by `httparse`, hyper's own parser); the body never is. A plain
/// request needs none of hyper's client machinery, which would add about 40 KiB
/// to the static binary (an init's size is a feature).
async fn http(url: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = split_url(url).ok_or("bad url")?;
    let hostport = if t.hostport.contains(':') && !t.hostport.ends_with(']') {
        t.hostport.to_string()
    } else {
        format!("{}:80", t.hostport)
    };
    let mut stream = tcp(&hostport).await?;
    // The URL was validated at start (`hyper::Uri`): no space or line break can be
    // in the path or the host.
    let mut req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: drainit-check\r\nConnection: close\r\n",
        t.path, t.hostport
    );
    if let Some(u) = t.userinfo {
        req.push_str(&format!(
            "Authorization: Basic {}\r\n",
            base64(&percent_decode(u))
        ));
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(|e| connect_error(&e))?;
    let mut head = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 1024];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| connect_error(&e))?;
        if n == 0 {
            return Err("no response".into());
        }
        head.extend_from_slice(&chunk[..n]);
        if let Some(verdict) = response_verdict(&mut head) {
            return verdict;
        }
    }
}

/// The length of the head at the start of `buf`, up to and including the empty
/// line that ends it (`\r\n\r\n`, or `\n\n` as httparse also accepts), or
/// `None` when it has not ended yet.
fn head_end(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find_map(|i| {
        let rest = &buf[i..];
        if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else if rest.starts_with(b"\n\r\n") {
            Some(i + 3)
        } else {
            None
        }
    })
}

/// The verdict of an HTTP check on the response head read so far (`head`, the
/// bytes received, at most [`MAX_RESPONSE_HEAD`] plus one read): `None` when more
/// bytes are needed; `Some(Ok)` for a final status 200–399; `Some(Err)` with
/// `http status N` or `bad response`. Interim responses (1xx but 101) are removed
/// from the front of `head` and skipped (RFC 9110 §15.2). Never panics, whatever
/// the bytes (fuzzed in tests/fuzz.rs).
pub fn response_verdict(head: &mut Vec<u8>) -> Option<Result<(), String>> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let status = match resp.parse(head) {
            // An interim response (1xx but 101, `103 Early Hints`) is skipped:
            // the answer follows it (RFC 9110 §15.2). 101 is final.
            Ok(httparse::Status::Complete(len))
                if resp.code.is_some_and(|c| c < 200 && c != 101) =>
            {
                head.drain(..len);
                continue;
            }
            // The same with more headers than room for them: its end is found
            // by hand (found by tests/fuzz.rs: it was taken for the answer).
            Err(httparse::Error::TooManyHeaders)
                if resp.code.is_some_and(|c| c < 200 && c != 101) =>
            {
                match head_end(head) {
                    Some(len) => {
                        head.drain(..len);
                        continue;
                    }
                    None if head.len() < MAX_RESPONSE_HEAD => return None,
                    None => resp.code,
                }
            }
            Ok(httparse::Status::Complete(_)) => resp.code,
            // More headers than room for them, or a head longer than a check
            // reads: the status line is all a check needs.
            Err(httparse::Error::TooManyHeaders) => resp.code,
            Ok(httparse::Status::Partial) if head.len() < MAX_RESPONSE_HEAD => return None,
            Ok(httparse::Status::Partial) => resp.code,
            Err(_) => None,
        };
        return Some(match status {
            Some(code) if (200..400).contains(&code) => Ok(()),
            Some(code) => Err(format!("http status {code}")),
            None => Err("bad response".into()),
        });
    }
}

async fn exec(
    argv: &[String],
    reaper: &Rc<RefCell<Reaper>>,
    launcher: &Launcher,
) -> Result<(), String> {
    let (pid, rx) = {
        let mut r = reaper.borrow_mut();
        let pid = launcher
            .spawn_helper(argv, HelperOutput::Null)
            .map_err(|e| crate::spawn::io_error_kind(&e))?;
        (pid, r.register_check(pid))
    };
    // Dropped before it was reaped (the check timed out): the tree kills its
    // process group.
    let helper = crate::tree::Helper::watch(pid, reaper.clone());
    let exit = rx.await.map_err(|_| "internal error".to_string())?;
    // The check is over: what it left running in its group goes too, and the
    // groups of earlier checks found empty are forgotten (one per check
    // otherwise, until the next walk of the tree).
    helper.finished();
    crate::tree::forget_empty_groups(reaper, &crate::tree::Real);
    match exit {
        ChildExit::Code(0) => Ok(()),
        ChildExit::Code(n) => Err(format!("exit status {n}")),
        ChildExit::Signal(s) => Err(format!("killed by {s}")),
    }
}

/// Polls the checks every `interval` until one evaluation passes.
pub async fn wait_ready(checks: Rc<Checks>, interval: Duration) {
    loop {
        if checks.evaluate().await.all_ok() {
            return;
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_percent_decoded() {
        assert_eq!(percent_decode("u%40x:p%3Aw"), b"u@x:p:w");
        assert_eq!(percent_decode("a%2"), b"a%2");
        assert_eq!(percent_decode("100%zz"), b"100%zz");
        assert_eq!(percent_decode("plain:pw"), b"plain:pw");
    }

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
    }

    #[test]
    fn targets_resolve_without_dns() {
        let v4: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6: std::net::SocketAddr = "[::1]:8080".parse().unwrap();
        assert_eq!(target_addrs("127.0.0.1:8080"), Some(vec![v4]));
        assert_eq!(target_addrs("[::1]:8080"), Some(vec![v6]));
        assert_eq!(target_addrs("localhost:8080"), Some(vec![v4, v6]));
        assert_eq!(target_addrs("LocalHost:8080"), Some(vec![v4, v6]));
        assert_eq!(target_addrs("db.internal:5432"), None);
        assert_eq!(target_addrs("localhost"), None);
        assert_eq!(target_addrs("localhost:http"), None);
    }

    #[test]
    fn url_parts() {
        let t = split_url("http://u:p@127.0.0.1:8080/health?x=1").unwrap();
        assert_eq!(
            (t.hostport, t.path.as_str(), t.userinfo),
            ("127.0.0.1:8080", "/health?x=1", Some("u:p"))
        );
        assert_eq!(split_url("http://h").unwrap().path, "/");
        let t = split_url("http://h:9?x=1#frag").unwrap();
        assert_eq!((t.hostport, t.path.as_str()), ("h:9", "/?x=1"));
    }
}
