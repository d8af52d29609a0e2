//! The drill's processes: each replica (drainit --proxy in front of the user's
//! command) and HAProxy, the ports they use, and their end.
//!
//! What it owns: spawning (own process group, a parent-death signal), the ports
//! (free ones, or consecutive from `--port-base`, each checked), and stopping:
//! SIGTERM and a bounded wait ([`Fleet::stop_all`]), or SIGKILL to a process and
//! all its descendants ([`Fleet::kill_all`], also on drop). Invariant: once a
//! [`Fleet`] is gone, nothing it started is running.

use std::io::Read as _;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{DrillError, Settings};

/// A running replica.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) app_port: u16,
    pub(super) proxy_port: u16,
    pub(super) probe_port: u16,
    pub(super) report_path: PathBuf,
    pub(super) log_path: PathBuf,
    pub(super) boot: Instant,
    pub(super) ready: Option<Instant>,
    pub(super) signal: Option<Instant>,
    pub(super) exit: Option<Instant>,
}

/// Every process the drill started; [`Fleet::kill_all`] (and its drop) leave
/// none running.
pub(super) struct Fleet {
    pub(super) procs: Vec<Proc>,
    pub(super) haproxy: Option<Child>,
}

/// The pids of `root`'s descendants (children first found, any depth), from
/// `/proc/*/stat`.
pub(super) fn descendants(root: i32) -> Vec<i32> {
    let mut parent: Vec<(i32, i32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid …: comm may hold spaces and parentheses.
            if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..])
                && let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok())
            {
                parent.push((pid, ppid));
            }
        }
    }
    let mut out = vec![];
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

pub(super) fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

pub(super) fn kill_tree(child: &mut Child) {
    if child.try_wait().ok().flatten().is_some() {
        return;
    }
    let pid = child.id() as i32;
    let below = descendants(pid);
    signal(pid as u32, nix::sys::signal::Signal::SIGKILL);
    for p in below {
        signal(p as u32, nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.wait();
}

impl Fleet {
    pub(super) fn kill_all(&mut self) {
        for p in &mut self.procs {
            kill_tree(&mut p.child);
        }
        if let Some(h) = &mut self.haproxy {
            kill_tree(h);
        }
    }

    /// SIGTERM to every replica still running, then waits for each (at most
    /// `timeout`); one still running then is killed with its processes.
    pub(super) fn stop_all(&mut self, timeout: Duration) {
        for p in &mut self.procs {
            if p.child.try_wait().ok().flatten().is_none() {
                signal(p.child.id(), nix::sys::signal::Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + timeout;
        for p in &mut self.procs {
            while p.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if p.exit.is_none() {
                p.exit = Some(Instant::now());
            }
            kill_tree(&mut p.child);
        }
        if let Some(h) = &mut self.haproxy {
            signal(h.id(), nix::sys::signal::Signal::SIGUSR1); // soft stop
            let until = Instant::now() + Duration::from_secs(2);
            while h.try_wait().ok().flatten().is_none() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(10));
            }
            kill_tree(h);
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// The ports the drill uses: `n` of them, from `base` on (each checked free) or
/// free ones the kernel picks.
pub(super) fn ports(n: usize, base: Option<u16>) -> Result<Vec<u16>, DrillError> {
    match base {
        Some(b) => (0..n)
            .map(|i| {
                let p = b.checked_add(i as u16).ok_or_else(|| {
                    DrillError(format!(
                        "--port-base {b}: the drill needs {n} ports, past 65535"
                    ))
                })?;
                TcpListener::bind(("127.0.0.1", p)).map(|_| p).map_err(|e| {
                    DrillError(format!(
                        "port {p} (of --port-base {b}..{}) is taken: {e}",
                        u32::from(b) + n as u32 - 1
                    ))
                })
            })
            .collect(),
        None => {
            // Hold every listener until all are picked, so no two are the same.
            let held: Vec<TcpListener> = (0..n)
                .map(|_| TcpListener::bind("127.0.0.1:0"))
                .collect::<Result<_, _>>()
                .map_err(|e| DrillError(format!("no free port on 127.0.0.1: {e}")))?;
            Ok(held
                .iter()
                .map(|l| l.local_addr().map_or(0, |a| a.port()))
                .collect())
        }
    }
}

pub(super) fn spawn_replica(
    s: &Settings,
    dir: &Path,
    index: u32,
    app_port: u16,
    proxy_port: u16,
    probe_port: u16,
) -> Result<Proc, DrillError> {
    let name = format!("W{index}");
    let report_path = dir.join(format!("{name}.report.json"));
    let log_path = dir.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| DrillError(format!("creating {} failed: {e}", log_path.display())))?;
    let log2 = log
        .try_clone()
        .map_err(|e| DrillError(format!("{}: {e}", log_path.display())))?;
    let cmd: Vec<String> = s
        .cmd
        .iter()
        .map(|a| a.replace("{port}", &app_port.to_string()))
        .collect();
    let mut c = Command::new(&s.drainit);
    c.arg("--probe-addr")
        .arg(format!("127.0.0.1:{probe_port}"))
        .arg("--proxy")
        .arg(format!("127.0.0.1:{proxy_port}=127.0.0.1:{app_port}"))
        .arg("--report-file")
        .arg(&report_path)
        .args(
            s.drainit_args
                .iter()
                .map(|a| a.replace("{port}", &app_port.to_string())),
        )
        .arg("--")
        .args(&cmd)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .process_group(0);
    // The parent-death signal fires when the spawning *thread* ends: the fleet is
    // spawned from the main thread and the replacement from a runtime worker, both
    // alive until the drill stops its replicas itself.
    // SAFETY: prctl(2) takes integers and touches no memory; it is
    // async-signal-safe, as pre_exec requires.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = c.spawn().map_err(|e| {
        DrillError(format!(
            "starting {name} ({}) failed: {e}",
            s.drainit.display()
        ))
    })?;
    Ok(Proc {
        name,
        child,
        app_port,
        proxy_port,
        probe_port,
        report_path,
        log_path,
        boot: Instant::now(),
        ready: None,
        signal: None,
        exit: None,
    })
}

/// The last lines of a replica's output, for a message.
pub(super) fn tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n    ")
}
