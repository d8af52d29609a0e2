//! sd_notify: the socket the child reports on, and drainit's own reports to systemd
//! (docs/probes.md `notify`, sd_notify(3)).
//!
//! Owns two halves of the notification protocol:
//!
//! - [`AppSocket`] (`--ready-notify`): a private datagram socket, bound before the
//!   spawn and named to the child in `NOTIFY_SOCKET`. `READY=1` passes readiness
//!   (once, through a channel into the supervisor), `STOPPING=1` fails `/readyz`,
//!   `STATUS=` is shown in `/readyz`, and `WATCHDOG=1` beats drive `/healthz`. The
//!   socket is abstract (`@drainit-notify-<pid>-<random>`): it leaves nothing on the
//!   filesystem to remove, even when drainit is SIGKILLed, and works on a read-only
//!   root filesystem.
//! - [`Systemd`] (drainit's own `NOTIFY_SOCKET`, systemd `Type=notify`): `READY=1`
//!   once the phase is `ready`, `STOPPING=1` with `EXTEND_TIMEOUT_USEC` covering the
//!   drain budget at T0, and the app's `STATUS=` and watchdog messages relayed.
//!
//! Must not: publish the phase (only the supervisor does, so beat 1 stays one
//! synchronous step; this module edits only the app's fields of [`Published`]), or
//! trust a datagram it cannot attribute. `SO_PASSCRED` makes the kernel attach the
//! sender's pid (translated into drainit's PID namespace; 0 when the sender is not
//! visible there) to every datagram, and a datagram is accepted only when that pid
//! is the main child or one of its descendants: an abstract socket is reachable by
//! anything in the network namespace.
//!
//! **Floods.** Since anything in the network namespace can reach the socket (it is
//! listed in `/proc/net/unix`), a stranger may flood it. No input may starve the
//! loop this task shares with the supervisor and the probes: at most
//! [`MAX_BATCH`] datagrams are read per wake-up, then the task yields (and, after
//! a batch from strangers only, pauses for a millisecond); a sender
//! outside drainit's PID namespace (credentials pid 0) is rejected without
//! reading `/proc`, and the parent-chain verdict for a sender pid is computed
//! once per batch, so a flood from one process costs one `recvmsg` per datagram
//! and one `/proc` walk per batch. The socket stays abstract, a deliberate
//! choice: a path in a private directory would keep out other users only (root
//! and the same uid reach any path), needs a writable filesystem and leaves a
//! node behind when drainit is SIGKILLed, while `NOTIFY_SOCKET` semantics are
//! the same for both forms.
//!
//! **The watchdog.** `WATCHDOG_USEC` for the child is the one systemd gave drainit
//! (when `WATCHDOG_PID` is unset or names drainit); otherwise the child gets none and
//! the watchdog is off until the app sends `WATCHDOG_USEC=N` itself (`N` = 0 turns it
//! off again). Once armed (at `READY=1` or the first beat for systemd's interval, as
//! systemd does; at the message otherwise), `/healthz` answers 503 when no `WATCHDOG=1` arrived for one interval,
//! or at once on `WATCHDOG=trigger`, and 200 again at the next beat. It is disarmed
//! when the drain starts or the app sends `STOPPING=1` (systemd stops a unit's
//! watchdog when it stops), so a draining app is never restarted for going quiet.
//! No timer runs while the watchdog is off.

use std::ffi::OsString;
use std::io;
use std::io::IoSliceMut;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::rc::Rc;
use std::time::Duration;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixAddr, recvmsg, setsockopt, sockopt};
use tokio::io::Interest;
use tokio::sync::{oneshot, watch};

use crate::drain::Phase;
use crate::published::Published;
use crate::util::{fmt_ms, sleep_until};

/// The largest datagram read; longer ones are truncated by the kernel and ignored.
/// systemd reads at most this much too (`NOTIFY_BUFFER_MAX`, `PIPE_BUF`).
pub const MAX_DATAGRAM: usize = 4096;
/// `STATUS=` text kept for `/readyz`, bytes: probe bodies stay small (the kubelet
/// reads at most 10 KiB).
pub const MAX_STATUS_BYTES: usize = 256;
/// How deep a sender's parent chain is followed to find drainit.
const MAX_TREE_DEPTH: usize = 256;
/// The most datagrams read per wake-up before the task yields to the others on
/// its thread (the supervisor, the probes): a flood costs them at most one batch
/// of latency (a few hundred microseconds), never a starved loop.
pub const MAX_BATCH: usize = 64;
/// After a full batch of datagrams from outside the child's tree, how long the
/// task waits before reading on: a flood then costs drainit a batch per pause.
const FLOOD_PAUSE: Duration = Duration::from_millis(1);

/// What one datagram says (sd_notify(3): newline-separated `KEY=VALUE` pairs;
/// unknown keys are ignored).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// `READY=1`.
    pub ready: bool,
    /// `STOPPING=1`.
    pub stopping: bool,
    /// `STATUS=…`, cut to [`MAX_STATUS_BYTES`] on a character boundary.
    pub status: Option<String>,
    /// `WATCHDOG=1`.
    pub beat: bool,
    /// `WATCHDOG=trigger`: the app says its watchdog failed.
    pub trigger: bool,
    /// `WATCHDOG_USEC=N`: a new interval; `Some(None)` for `0` (off).
    pub watchdog: Option<Option<Duration>>,
}

impl Message {
    /// Parses one datagram. Never fails: what is not understood is ignored.
    pub fn parse(datagram: &[u8]) -> Message {
        let mut m = Message::default();
        for line in datagram.split(|b| *b == b'\n') {
            let Some(eq) = line.iter().position(|b| *b == b'=') else {
                continue;
            };
            let (key, value) = (&line[..eq], &line[eq + 1..]);
            match (key, value) {
                (b"READY", b"1") => m.ready = true,
                (b"STOPPING", b"1") => m.stopping = true,
                (b"WATCHDOG", b"1") => m.beat = true,
                (b"WATCHDOG", b"trigger") => m.trigger = true,
                (b"STATUS", text) => {
                    m.status = Some(cut(&String::from_utf8_lossy(text), MAX_STATUS_BYTES))
                }
                (b"WATCHDOG_USEC", n) => {
                    if let Some(usec) = std::str::from_utf8(n)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                    {
                        m.watchdog = Some((usec > 0).then(|| Duration::from_micros(usec)));
                    }
                }
                _ => {}
            }
        }
        m
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// `NOTIFY_SOCKET`'s value as a socket address: a path, or `@name` for the abstract
/// namespace. `None` for anything else (systemd's `vsock:` addresses included).
fn parse_address(value: &str) -> Option<SocketAddr> {
    if let Some(name) = value.strip_prefix('@') {
        SocketAddr::from_abstract_name(name.as_bytes()).ok()
    } else if value.starts_with('/') {
        SocketAddr::from_pathname(value).ok()
    } else {
        None
    }
}

/// The watchdog interval systemd set for drainit: `WATCHDOG_USEC`, when
/// `WATCHDOG_PID` is unset or names drainit (sd_watchdog_enabled(3)).
fn own_watchdog(usec: Option<&str>, watchdog_pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(pid) = watchdog_pid
        && pid.parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    let usec: u64 = usec?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// drainit's own service manager, from `NOTIFY_SOCKET` in drainit's environment.
pub struct Systemd {
    sock: UnixDatagram,
    addr: SocketAddr,
    watchdog: Option<Duration>,
}

impl Systemd {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`. `None` when there is
    /// no usable `NOTIFY_SOCKET` (logged at warning level when it is set but not
    /// usable).
    pub fn from_env() -> Option<Systemd> {
        let value = std::env::var_os("NOTIFY_SOCKET")?;
        let Some(addr) = value.to_str().and_then(parse_address) else {
            log::warn!(
                "NOTIFY_SOCKET {value:?} is not a unix socket address; not notifying the service manager"
            );
            return None;
        };
        let sock = match UnixDatagram::unbound().and_then(|s| s.set_nonblocking(true).map(|()| s)) {
            Ok(s) => s,
            Err(e) => {
                log::warn!(
                    "creating a socket for NOTIFY_SOCKET failed: {e}; not notifying the service manager"
                );
                return None;
            }
        };
        let env = |k: &str| std::env::var(k).ok();
        let watchdog = own_watchdog(
            env("WATCHDOG_USEC").as_deref(),
            env("WATCHDOG_PID").as_deref(),
            std::process::id(),
        );
        Some(Systemd {
            sock,
            addr,
            watchdog,
        })
    }

    /// The watchdog interval systemd expects drainit to keep; `None` when off.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends one notification. Never blocks: a full or vanished receiver loses it
    /// (logged at debug level), as sd_notify(3) does.
    pub fn send(&self, message: &str) {
        if let Err(e) = self.sock.send_to_addr(message.as_bytes(), &self.addr) {
            log::debug!("notifying the service manager failed: {e}");
        }
    }
}

/// Tells systemd about drainit's phase: `READY=1` once `ready`; `STOPPING=1` and
/// `EXTEND_TIMEOUT_USEC=<extend>` when the phase first becomes `draining` or
/// `stopping`. `extend` is the most the rest of the run may take from T0 (pre-drain
/// delay + drain timeout + teardown timeouts, plus a margin). With a systemd watchdog
/// and no app socket to relay beats from (`beat_self`), drainit beats at half the
/// interval itself until it stops: its loop being alive is then the liveness.
/// Spawn it with `spawn_local`; it ends after `STOPPING=1`.
pub async fn follow(
    systemd: Rc<Systemd>,
    mut state: watch::Receiver<Published>,
    extend: Duration,
    beat_self: bool,
) {
    let beat_every = systemd.watchdog().filter(|_| beat_self).map(|d| d / 2);
    let mut sent_ready = false;
    loop {
        let phase = state.borrow_and_update().phase;
        match phase {
            Phase::Starting => {}
            Phase::Ready => {
                if !sent_ready {
                    systemd.send("READY=1");
                    sent_ready = true;
                }
            }
            Phase::Draining | Phase::Stopping => {
                systemd.send(&format!(
                    "STOPPING=1\nEXTEND_TIMEOUT_USEC={}",
                    extend.as_micros()
                ));
                return;
            }
        }
        match beat_every {
            Some(every) => {
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep(every) => systemd.send("WATCHDOG=1"),
                }
            }
            None => {
                if state.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The child's notification socket (`--ready-notify`), bound but not yet served.
pub struct AppSocket {
    sock: UnixDatagram,
    /// `NOTIFY_SOCKET` for the child: `@drainit-notify-<pid>-<random>`.
    name: String,
    /// The interval passed to the child as `WATCHDOG_USEC`; `None`: not set.
    watchdog: Option<Duration>,
}

impl AppSocket {
    /// Creates the abstract datagram socket with `SO_PASSCRED` on (close-on-exec, as
    /// every fd of drainit's own). `watchdog` is the interval to give the child (the
    /// one systemd gave drainit, see the module docs).
    ///
    /// # Errors
    /// `socket(2)`, `bind(2)` (a name collision three times in a row) or
    /// `setsockopt(2)` failed.
    pub fn bind(watchdog: Option<Duration>) -> io::Result<AppSocket> {
        let mut last = io::Error::from(io::ErrorKind::AddrInUse);
        for _ in 0..3 {
            let name = format!("drainit-notify-{}-{:016x}", std::process::id(), random());
            let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
            match UnixDatagram::bind_addr(&addr) {
                Ok(sock) => {
                    setsockopt(&sock, sockopt::PassCred, &true).map_err(io::Error::from)?;
                    sock.set_nonblocking(true)?;
                    return Ok(AppSocket {
                        sock,
                        name: format!("@{name}"),
                        watchdog,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// The socket's `NOTIFY_SOCKET` value (`@…`, the abstract form).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The variables the child gets: `NOTIFY_SOCKET`, and `WATCHDOG_USEC` when a
    /// watchdog interval is set (never `WATCHDOG_PID`: the child's pid is not known
    /// before the spawn, and sd_watchdog_enabled(3) accepts its absence).
    pub fn child_env(&self) -> Vec<(OsString, OsString)> {
        let mut env = vec![("NOTIFY_SOCKET".into(), self.name.clone().into())];
        if let Some(w) = self.watchdog {
            env.push(("WATCHDOG_USEC".into(), w.as_micros().to_string().into()));
        }
        env
    }

    /// Reads notifications until the runtime stops. Spawn it with `spawn_local`
    /// right after the spawn of `child_pid`. `ready_tx` gets `()` at the first
    /// `READY=1`; `state_tx` is the supervisor's channel, of which only the app's
    /// fields are written; `systemd` receives the relayed `STATUS=` and, when its
    /// watchdog is the child's, `WATCHDOG=` messages.
    pub async fn serve(
        self,
        child_pid: i32,
        state_tx: watch::Sender<Published>,
        ready_tx: oneshot::Sender<()>,
        systemd: Option<Rc<Systemd>>,
    ) {
        let sock = match tokio::net::UnixDatagram::from_std(self.sock) {
            Ok(s) => s,
            Err(e) => {
                log::error!("serving the notify socket failed: {e}");
                return;
            }
        };
        let relay_beats = systemd
            .as_ref()
            .is_some_and(|s| s.watchdog().is_some() && s.watchdog() == self.watchdog);
        let mut app = App {
            child_pid,
            me: std::process::id() as i32,
            state_tx,
            ready_tx: Some(ready_tx),
            systemd,
            relay_beats,
            interval: self.watchdog,
            // Armed at READY=1 (or the first beat), not at the spawn: systemd's
            // watchdog "is activated when the start-up is completed"
            // (systemd.service(5), WatchdogSec=).
            deadline: None,
        };
        let mut phase_rx = app.state_tx.subscribe();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            tokio::select! {
                ready = sock.readable() => {
                    if let Err(e) = ready {
                        log::error!("reading the notify socket failed: {e}");
                        return;
                    }
                    // One wake-up may stand for many datagrams: read up to a batch,
                    // then let the other tasks run (a sender that keeps the queue
                    // full must not keep them waiting).
                    let mut verdicts = Verdicts::default();
                    let mut full = true;
                    let mut taken = false;
                    for _ in 0..MAX_BATCH {
                        match sock.try_io(Interest::READABLE, || receive(sock.as_raw_fd(), &mut buf)) {
                            Ok(Some((pid, len))) => {
                                if verdicts.in_tree(pid, app.child_pid, app.me) {
                                    app.on_datagram(&buf[..len]);
                                    taken = true;
                                }
                            }
                            Ok(None) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                full = false;
                                break;
                            }
                            Err(e) => {
                                log::debug!("reading the notify socket failed: {e}");
                                full = false;
                                break;
                            }
                        }
                    }
                    if full && !taken {
                        // A whole batch from strangers: a flood. Pause before the
                        // next one, so that the flood costs drainit a bounded share
                        // of the CPU (the app and the probes need it too); the
                        // queue waits in the kernel meanwhile.
                        tokio::time::sleep(FLOOD_PAUSE).await;
                    } else if full {
                        tokio::task::yield_now().await;
                    }
                }
                () = sleep_until(app.deadline) => app.on_watchdog_expired(),
                changed = phase_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let phase = phase_rx.borrow_and_update().phase;
                    if !watchdog_applies(phase) && app.deadline.take().is_some() {
                        log::debug!("the drain started: the app's watchdog is off");
                    }
                }
            }
        }
    }
}

/// A random number for the socket name: the name must not be guessable ahead of
/// time (a process could bind it first), though the pid check, not the name, is
/// what keeps strangers out. std's `RandomState` is seeded from the kernel.
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// One `recvmsg(2)`: `Some((sender pid, length))`, or `None` for a datagram to
/// ignore (truncated, or without credentials). Any fds passed along (`FDSTORE=1`)
/// are closed: drainit keeps no fd of the app's.
fn receive(fd: i32, buf: &mut [u8]) -> io::Result<Option<(i32, usize)>> {
    // Room for the credentials and SCM_MAX_FD (253) descriptors, the most the
    // kernel passes in one datagram: a control message is then never truncated
    // (MSG_CTRUNC would make nix refuse to list it, and the fds the kernel did
    // install would leak into drainit). Every fd received is closed below.
    let mut cmsg = nix::cmsg_space!(libc::ucred, [i32; 253]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<UnixAddr>(
        fd,
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut pid = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        match c {
            ControlMessageOwned::ScmCredentials(cred) => pid = Some(cred.pid()),
            ControlMessageOwned::ScmRights(fds) => {
                for fd in fds {
                    let _ = nix::unistd::close(fd);
                }
            }
            _ => {}
        }
    }
    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
        log::debug!("ignoring a notification longer than {MAX_DATAGRAM} bytes");
        return Ok(None);
    }
    Ok(pid.map(|p| (p, msg.bytes)))
}

/// The sender verdicts of one batch: a flood from one process is judged once per
/// batch, not once per datagram. Kept for one batch only, so a pid reused later
/// is judged afresh.
#[derive(Default)]
struct Verdicts(Vec<(i32, bool)>);

impl Verdicts {
    fn in_tree(&mut self, pid: i32, child_pid: i32, root: i32) -> bool {
        if let Some(&(_, ok)) = self.0.iter().find(|(p, _)| *p == pid) {
            return ok;
        }
        let ok = in_tree(pid, child_pid, root);
        if !ok {
            log::debug!("ignoring notifications from pid {pid}, not in the child's process tree");
        }
        self.0.push((pid, ok));
        ok
    }
}

/// Whether `pid` is drainit's main child or one of its descendants: its parent chain
/// in `/proc` leads to `root` (drainit; as a subreaper or PID 1 it adopts the tree's
/// orphans, so the chain never breaks). Zombies count: `systemd-notify` may have
/// exited, unreaped, by the time its datagram is read.
fn in_tree(pid: i32, child_pid: i32, root: i32) -> bool {
    if pid == child_pid {
        return true;
    }
    // Pid 0: the sender is not visible in drainit's PID namespace (the kernel
    // translates credentials into the receiver's); no /proc read needed.
    if pid <= 0 {
        return false;
    }
    let mut at = pid;
    for _ in 0..MAX_TREE_DEPTH {
        if at <= 1 || at == root {
            return at == root && at != pid;
        }
        let Some(p) = std::fs::read_to_string(format!("/proc/{at}/stat"))
            .ok()
            .and_then(|t| crate::procs::parse_stat(&t))
        else {
            return false;
        };
        at = p.ppid;
    }
    false
}

/// The app-side state of [`AppSocket::serve`].
struct App {
    child_pid: i32,
    me: i32,
    state_tx: watch::Sender<Published>,
    ready_tx: Option<oneshot::Sender<()>>,
    systemd: Option<Rc<Systemd>>,
    /// systemd's watchdog is the child's: relay its beats.
    relay_beats: bool,
    interval: Option<Duration>,
    /// When `/healthz` turns 503 unless a beat comes first; `None`: disarmed.
    deadline: Option<tokio::time::Instant>,
}

impl App {
    /// A datagram from the child's tree (the sender was checked).
    fn on_datagram(&mut self, datagram: &[u8]) {
        let m = Message::parse(datagram);
        if m.ready
            && let Some(tx) = self.ready_tx.take()
        {
            log::info!("the app sent READY=1");
            let _ = tx.send(());
            if let Some(w) = self.interval
                && self.deadline.is_none()
                && watchdog_applies(self.state_tx.borrow().phase)
                && !self.state_tx.borrow().app_stopping
            {
                self.deadline = Some(tokio::time::Instant::now() + w);
            }
        }
        if let Some(w) = m.watchdog {
            self.interval = w;
            // Never armed during a drain: /healthz must not fail because of one.
            let applies = watchdog_applies(self.state_tx.borrow().phase)
                && !self.state_tx.borrow().app_stopping;
            self.deadline = w
                .filter(|_| applies)
                .map(|w| tokio::time::Instant::now() + w);
            log::info!(
                "the app set its watchdog to {}",
                w.map_or("off".into(), fmt_ms)
            );
        }
        if m.beat
            && let Some(w) = self.interval
            && watchdog_applies(self.state_tx.borrow().phase)
            && !self.state_tx.borrow().app_stopping
        {
            self.deadline = Some(tokio::time::Instant::now() + w);
            self.set_watchdog_ok(true);
        }
        if m.trigger {
            log::warn!("the app sent WATCHDOG=trigger: /healthz fails");
            self.set_watchdog_ok(false);
        }
        if m.stopping {
            log::info!("the app sent STOPPING=1: /readyz fails");
            self.deadline = None;
            self.state_tx
                .send_if_modified(|p| !std::mem::replace(&mut p.app_stopping, true));
        }
        if let Some(text) = &m.status {
            self.state_tx.send_if_modified(|p| {
                let changed = p.status_text.as_deref() != Some(text.as_str());
                p.status_text = Some(text.clone());
                changed
            });
        }
        if let Some(systemd) = &self.systemd {
            if let Some(text) = &m.status {
                systemd.send(&format!("STATUS={text}"));
            }
            if self.relay_beats && m.beat {
                systemd.send("WATCHDOG=1");
            }
            // The app changed its interval: systemd's must follow, or it would kill
            // drainit on its own old interval.
            if self.relay_beats
                && let Some(w) = m.watchdog
            {
                systemd.send(&format!("WATCHDOG_USEC={}", w.map_or(0, |w| w.as_micros())));
            }
            if self.relay_beats && m.trigger {
                systemd.send("WATCHDOG=trigger");
            }
        }
    }

    fn on_watchdog_expired(&mut self) {
        self.deadline = None;
        log::warn!(
            "the app's watchdog expired: no WATCHDOG=1 for {}; /healthz fails",
            self.interval.map_or("?".into(), fmt_ms)
        );
        self.set_watchdog_ok(false);
    }

    fn set_watchdog_ok(&self, ok: bool) {
        self.state_tx.send_if_modified(|p| {
            let changed = p.watchdog_ok != ok;
            p.watchdog_ok = ok;
            changed
        });
    }
}

/// Whether the app's watchdog applies in this phase (not once a drain started).
fn watchdog_applies(phase: Phase) -> bool {
    matches!(phase, Phase::Starting | Phase::Ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_keys_drainit_understands() {
        let m = Message::parse(b"READY=1\nSTATUS=warming up\nWATCHDOG=1\nMAINPID=7\nbogus\n");
        assert!(m.ready && m.beat && !m.stopping && !m.trigger);
        assert_eq!(m.status.as_deref(), Some("warming up"));
        let m = Message::parse(b"STOPPING=1\nWATCHDOG=trigger\nWATCHDOG_USEC=250000");
        assert!(m.stopping && m.trigger && !m.ready);
        assert_eq!(m.watchdog, Some(Some(Duration::from_millis(250))));
        assert_eq!(Message::parse(b"WATCHDOG_USEC=0").watchdog, Some(None));
        assert_eq!(Message::parse(b"WATCHDOG_USEC=x").watchdog, None);
        // Values other than "1" are not READY.
        assert!(!Message::parse(b"READY=0").ready);
    }

    #[test]
    fn status_is_cut_on_a_character_boundary() {
        let long = format!("STATUS={}", "é".repeat(200));
        let s = Message::parse(long.as_bytes()).status.unwrap();
        assert!(s.len() <= MAX_STATUS_BYTES && s.chars().all(|c| c == 'é'));
    }

    #[test]
    fn addresses_and_watchdog_env() {
        assert!(parse_address("@x").unwrap().as_abstract_name().is_some());
        assert!(
            parse_address("/run/systemd/notify")
                .unwrap()
                .as_pathname()
                .is_some()
        );
        assert!(parse_address("vsock:2:1").is_none());
        assert_eq!(
            own_watchdog(Some("500000"), None, 7),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            own_watchdog(Some("500000"), Some("7"), 7),
            Some(Duration::from_millis(500))
        );
        assert_eq!(own_watchdog(Some("500000"), Some("8"), 7), None);
        assert_eq!(own_watchdog(Some("0"), None, 7), None);
        assert_eq!(own_watchdog(None, None, 7), None);
    }

    #[test]
    fn the_tree_check_accepts_descendants_only() {
        let me = std::process::id() as i32;
        let parent = nix::unistd::getppid().as_raw();
        assert!(in_tree(me, 0, parent), "a child of root is in the tree");
        assert!(!in_tree(parent, 0, me), "an ancestor is not");
        assert!(!in_tree(me, 0, me), "root itself is not");
        assert!(!in_tree(0, 5, me), "an unmapped sender (pid 0) is not");
        assert!(in_tree(5, 5, me), "the main child is, without a lookup");
    }
}
