//! drainit's own log lines on stderr: `drainit: …` in text, one JSON object per
//! line in json (with an RFC 3339 UTC timestamp, `"ts"`). A `log::Log` backend.
//!
//! Under journald (`JOURNAL_STREAM` names stderr's device and inode, sd-daemon(3)),
//! every line, the exit report's included, starts with its syslog priority
//! (`<3>` error, `<4>` warning, `<6>` info and the report, `<7>` debug): journald
//! strips the prefix and files the line at that priority, so `journalctl -p
//! warning` shows drainit's warnings.
//!
//! Owns: the only writes to stderr after start-up, the exit report's line included
//! ([`write_final`]), and the thread that makes them.
//!
//! Must not: block the caller. stderr is often a pipe that drainit shares with the
//! child (same open file description): when nobody reads it (a log shipper that
//! stalled, `drainit … | sleep 20`), write(2) blocks once the pipe is full. Had the
//! supervisor thread made that write, it would freeze in it: no forward, no SIGKILL
//! at the deadline, `/healthz` timing out. So a line is written at once only as far
//! as that cannot block: through fd 2 when it is a regular file or /dev/null, and
//! for a pipe (the container default) through a second open file description of
//! it, opened from `/proc/self/fd/2` with O_NONBLOCK (the flag lives in the open
//! file description: on fd 2 itself, which the child shares, it would hand the app
//! EAGAIN on its own writes). What cannot be written now (a full pipe, a terminal,
//! a socket, no `/proc`) goes through a bounded queue to a writer thread, started the first
//! time it is needed, and a full queue drops the line (counted, and announced as
//! "N log lines dropped" once there is room again). Nothing written directly ever
//! overtakes a queued line.
//!
//! Why its state is in statics (`DIRECT`, `QUEUE`, `FORMAT`, `JOURNAL`,
//! `EMITTING`, `FINAL_DONE`), all private to this module: the `log` facade takes
//! one `'static` logger for the whole process, and every thread's `log::info!`
//! reaches it there; [`write_final`] and [`flush`] must reach the same queue.
//! No other module reads or writes them; they hold only how to write a line.
//!
//! Invariant: write errors are ignored (a closed stderr must never panic drainit,
//! CONVENTIONS pitfall 9), and the exit report is the last line drainit writes: the
//! writer thread stops after it.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::config::LogFormat;

/// How many lines the queue holds before the logging call drops lines.
pub const QUEUE_LINES: usize = 256;

/// How long the exit report may wait for a stuck stderr (2 s): the most a stderr
/// nobody reads can delay drainit's exit.
pub const FINAL_WRITE_BOUND: Duration = Duration::from_secs(2);

/// How long a panic message may wait for a stuck stderr before unwinding goes on
/// (1 s).
const PANIC_WRITE_BOUND: Duration = Duration::from_secs(1);

/// What the writer thread is asked to do, in order.
enum Msg {
    /// A formatted line (or what of it was not written at once), newline included.
    Line(Vec<u8>),
    /// This many lines were dropped since the last notice.
    Dropped(u64),
    /// Acknowledge once everything before has been written.
    Flush(SyncSender<()>),
    /// The exit report (no newline): written, acknowledged, and nothing after it.
    Final(Vec<u8>, SyncSender<()>),
}

/// A bounded queue in front of a writer thread. One per process ([`init`]); tests
/// make their own around any writer.
pub struct Queue {
    tx: SyncSender<Msg>,
    /// Lines dropped because the queue was full and not yet announced.
    dropped: AtomicU64,
    /// Messages queued and not yet written: while 0, the caller may write itself
    /// (see [`direct`]) without passing a line still in the queue.
    backlog: std::sync::Arc<AtomicU64>,
}

impl Queue {
    /// Starts the writer thread over `out`, with room for `capacity` lines.
    ///
    /// The thread inherits the signal mask of the calling thread: call this after
    /// `signals::block_caught()`, or the kernel may deliver a process-directed
    /// signal to this thread (default action) instead of leaving it pending for the
    /// signalfd.
    ///
    /// # Errors
    /// The thread could not be created.
    pub fn start<W: Write + Send + 'static>(
        out: W,
        format: LogFormat,
        capacity: usize,
    ) -> std::io::Result<Queue> {
        let (tx, rx) = mpsc::sync_channel(capacity);
        let backlog = std::sync::Arc::new(AtomicU64::new(0));
        let written = backlog.clone();
        std::thread::Builder::new()
            .name("drainit-log".into())
            .spawn(move || {
                crate::signals::reblock();
                write_lines(out, format, rx, &written)
            })?;
        // The C library's `pthread_create` unblocks the signals it keeps for itself
        // (glibc 32 and 33; musl 33 and 34, glibc's SIGRTMIN) in the calling thread
        // and the new one: blocked again here and at the top of the new thread.
        crate::signals::reblock();
        Ok(Queue {
            tx,
            dropped: AtomicU64::new(0),
            backlog,
        })
    }

    /// Nothing is queued or being written.
    fn idle(&self) -> bool {
        self.backlog.load(Ordering::Acquire) == 0 && self.dropped.load(Ordering::Relaxed) == 0
    }

    /// `try_send` that keeps the backlog count.
    fn try_send(&self, msg: Msg) -> Result<(), TrySendError<Msg>> {
        self.backlog.fetch_add(1, Ordering::AcqRel);
        let r = self.tx.try_send(msg);
        if r.is_err() {
            self.backlog.fetch_sub(1, Ordering::AcqRel);
        }
        r
    }

    /// Queues a formatted line (newline included). Never blocks: when the queue is
    /// full the line is dropped and counted.
    pub fn push(&self, line: impl Into<Vec<u8>>) {
        let line = line.into();
        let pending = self.dropped.swap(0, Ordering::Relaxed);
        if pending > 0 && self.try_send(Msg::Dropped(pending)).is_err() {
            self.dropped.fetch_add(pending + 1, Ordering::Relaxed);
            return;
        }
        match self.try_send(Msg::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            // The writer stopped after the exit report: nothing may follow it.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Waits at most `within` until every line queued so far is written.
    /// Returns whether they were.
    pub fn flush_within(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        self.send_until(Msg::Flush(ack_tx), deadline)
            && ack_rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .is_ok()
    }

    /// Queues `line` (without newline) as the last line, after every line queued
    /// before, and waits at most `within` for it to be written. Returns whether it
    /// was. Lines pushed afterwards are discarded.
    pub fn write_final(&self, line: impl AsRef<[u8]>, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let pending = self.dropped.swap(0, Ordering::Relaxed);
        if pending > 0 {
            // Best effort: the count belongs before the report.
            let _ = self.send_until(Msg::Dropped(pending), deadline);
        }
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        self.send_until(Msg::Final(line.as_ref().to_vec(), ack_tx), deadline)
            && ack_rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .is_ok()
    }

    /// Sends `msg`, waiting for room until `deadline`. std's `SyncSender` has no
    /// `send_timeout` (unstable), so this polls every millisecond; it runs only at
    /// exit or after a panic, and only while the queue is full.
    fn send_until(&self, mut msg: Msg, deadline: Instant) -> bool {
        loop {
            match self.try_send(msg) {
                Ok(()) => return true,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(m)) => {
                    if Instant::now() >= deadline {
                        return false;
                    }
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}

/// The writer thread: writes each message in order, ignoring write errors; stops
/// after the exit report, or when the queue is gone.
fn write_lines<W: Write>(mut out: W, format: LogFormat, rx: Receiver<Msg>, backlog: &AtomicU64) {
    for msg in rx {
        let _written = Written(backlog);
        match msg {
            Msg::Line(line) => {
                let _ = out.write_all(&line);
            }
            Msg::Dropped(n) => {
                let what = if n == 1 { "line" } else { "lines" };
                let line = log_line(
                    format,
                    log::Level::Warn,
                    &format!("{n} log {what} dropped (stderr did not keep up)"),
                );
                let _ = out.write_all(line.as_bytes());
            }
            Msg::Flush(ack) => {
                let _ = out.flush();
                let _ = ack.try_send(());
            }
            Msg::Final(mut line, ack) => {
                // One write with its newline: nothing of another writer's can land
                // between the report and its end of line.
                line.push(b'\n');
                let _ = out.write_all(&line);
                let _ = out.flush();
                let _ = ack.try_send(());
                return;
            }
        }
    }
}

/// Counts a message as written when it goes out of scope (also on `return`).
struct Written<'a>(&'a AtomicU64);

impl Drop for Written<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The fast path, on the caller's thread: writes what of `bytes` can be written
/// now without blocking; returns how many bytes that was (the caller queues the
/// rest for the writer thread, so order is kept).
///
/// - stderr is a regular file or `/dev/null`: such writes never block; written
///   through fd 2 itself.
/// - stderr is a pipe (the container default): written through a second open file
///   description of the same pipe, opened from `/proc/self/fd/2` and made
///   non-blocking. O_NONBLOCK lives in the open file
///   description, so the child's fd 2 stays blocking; drainit gets EAGAIN instead
///   of blocking when nobody reads, and queues from there. A run whose stderr keeps
///   up never starts the writer thread.
/// - anything else (a terminal, a socket, which `/proc` cannot reopen; no `/proc`):
///   0, every line goes through the writer thread.
fn direct(bytes: &[u8]) -> usize {
    match DIRECT.get_or_init(direct_stderr) {
        Direct::NeverBlocks => {
            // Errors (a full disk) are ignored, like every write here.
            let _ = std::io::stderr().lock().write_all(bytes);
            bytes.len()
        }
        Direct::NonBlocking(f) => {
            let mut done = 0;
            while done < bytes.len() {
                match (&*f).write(&bytes[done..]) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    // Closed or broken: nothing can be written, by anyone.
                    Err(_) => return bytes.len(),
                }
            }
            done
        }
        Direct::Queue => 0,
    }
}

/// How [`direct`] writes.
enum Direct {
    /// fd 2 is a regular file or `/dev/null`.
    NeverBlocks,
    /// drainit's own non-blocking open file description of fd 2's pipe.
    NonBlocking(std::fs::File),
    /// Only through the writer thread.
    Queue,
}

fn direct_stderr() -> Direct {
    use nix::sys::stat::{SFlag, fstat};
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(st) = fstat(std::io::stderr()) else {
        return Direct::Queue;
    };
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let dev_null = kind == SFlag::S_IFCHR
        && nix::sys::stat::major(st.st_rdev) == 1
        && nix::sys::stat::minor(st.st_rdev) == 3;
    if kind == SFlag::S_IFREG || dev_null {
        return Direct::NeverBlocks;
    }
    // Pipes only: a write of up to PIPE_BUF (4 KiB) is all or nothing there, so a
    // line is never split and no other writer's bytes land inside it. A terminal
    // takes partial writes (and reopening `/dev/ptmx` would make a new terminal
    // altogether): it goes through the writer thread, like sockets.
    if kind != SFlag::S_IFIFO {
        return Direct::Queue;
    }
    let own = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/proc/self/fd/2");
    match own {
        // The same pipe, and truly a description of its own (not
        // fd 2's, which would be shared with the child).
        Ok(f) => match fstat(&f) {
            Ok(o) if o.st_dev == st.st_dev && o.st_ino == st.st_ino && o.st_rdev == st.st_rdev => {
                Direct::NonBlocking(f)
            }
            _ => Direct::Queue,
        },
        Err(_) => Direct::Queue,
    }
}

static DIRECT: OnceLock<Direct> = OnceLock::new();

/// Set once the exit report was handed over: [`flush`] then waits no more (the
/// report's own bound already covered a stuck stderr).
static FINAL_DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One log line in `format`, newline included, without timestamp or priority
/// prefix: the shape [`render_line`] adds them to (what the tests pin down).
#[cfg(test)]
fn format_line(format: LogFormat, level: log::Level, msg: &str) -> String {
    render_line(format, level, msg, None, false)
}

/// A log line as written now: JSON with the current time, and the priority
/// prefix when stderr is the journal.
fn log_line(format: LogFormat, level: log::Level, msg: &str) -> String {
    render_line(
        format,
        level,
        msg,
        Some(std::time::SystemTime::now()),
        JOURNAL.load(Ordering::Relaxed),
    )
}

/// One log line, newline included: `drainit: …` (text) or
/// `{"drainit":"log","ts":"2026-12-01T15:32:25.123Z","level":"info","msg":"…"}`
/// (json; `ts` only when `at` is given), after `<N>` (sd-daemon(3) priority) when
/// `journal`.
fn render_line(
    format: LogFormat,
    level: log::Level,
    msg: &str,
    at: Option<std::time::SystemTime>,
    journal: bool,
) -> String {
    let prefix = if journal {
        format!("<{}>", priority(level))
    } else {
        String::new()
    };
    match format {
        LogFormat::Text => {
            let msg = escape_controls(msg);
            text_line(&prefix, level, &msg)
        }
        LogFormat::Json => {
            let msg = serde_json::to_string(msg).unwrap_or_else(|_| "\"\"".into());
            let ts = at.map_or(String::new(), |t| format!(",\"ts\":\"{}\"", rfc3339(t)));
            format!(
                "{prefix}{{\"drainit\":\"log\"{ts},\"level\":\"{}\",\"msg\":{msg}}}\n",
                level.as_str().to_lowercase()
            )
        }
    }
}

/// A text line: `drainit: MSG`, `drainit: warning: MSG`, … after `prefix`.
fn text_line(prefix: &str, level: log::Level, msg: &str) -> String {
    match level {
        log::Level::Info => format!("{prefix}drainit: {msg}\n"),
        log::Level::Warn => format!("{prefix}drainit: warning: {msg}\n"),
        log::Level::Error => format!("{prefix}drainit: error: {msg}\n"),
        l => format!("{prefix}drainit: {}: {msg}\n", l.as_str().to_lowercase()),
    }
}

/// `msg` with every control character (C0, DEL, C1) written as an escape (`\n`,
/// `\u{1b}`), so a text line stays one line: messages carry what others chose
/// (a process's `comm`, which any process sets to any 15 bytes, paths, command
/// words), and a newline in one would start a line of its own that reads as
/// drainit's (`drainit: exit 0`; under journald with a `<N>` priority of its
/// choosing), an escape sequence would drive the operator's terminal. JSON lines
/// are escaped by JSON itself.
fn escape_controls(msg: &str) -> std::borrow::Cow<'_, str> {
    if !msg.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(msg);
    }
    let mut out = String::with_capacity(msg.len() + 8);
    for c in msg.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The syslog priority of a level (sd-daemon(3): `<3>` SD_ERR, `<4>` SD_WARNING,
/// `<6>` SD_INFO, `<7>` SD_DEBUG).
fn priority(level: log::Level) -> u8 {
    match level {
        log::Level::Error => 3,
        log::Level::Warn => 4,
        log::Level::Info => 6,
        log::Level::Debug | log::Level::Trace => 7,
    }
}

/// stderr is the journal: set by [`init`].
static JOURNAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `journal_stream` (the value of `JOURNAL_STREAM`, `DEV:INO` in decimal,
/// set by systemd for a unit whose output goes to the journal) names the file
/// whose device and inode are `dev` and `ino` (sd-daemon(3): a process must check
/// that its stderr is still that stream, it may have been redirected since).
pub fn is_journal_stream(journal_stream: &str, dev: u64, ino: u64) -> bool {
    journal_stream
        .split_once(':')
        .and_then(|(d, i)| Some((d.trim().parse::<u64>().ok()?, i.trim().parse::<u64>().ok()?)))
        == Some((dev, ino))
}

/// Whether this process's stderr is the journal stream `JOURNAL_STREAM` names.
fn stderr_is_journal() -> bool {
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    nix::sys::stat::fstat(std::io::stderr())
        .is_ok_and(|st| is_journal_stream(&stream, st.st_dev, st.st_ino))
}

/// `2026-12-01T15:32:25.123Z`: RFC 3339, UTC, milliseconds. Times before 1970
/// (a clock set wrong) show as 1970-01-01.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let sod = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        d.subsec_millis()
    )
}

/// (year, month, day) of the day `z` days after 1970-01-01, proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`, <https://howardhinnant.github.io/date_algorithms.html>).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The process's queue, once [`init`] ran.
static QUEUE: OnceLock<Queue> = OnceLock::new();

struct Logger {
    format: LogFormat,
}

impl log::Log for Logger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = log_line(self.format, record.level(), &record.args().to_string());
        emit(self.format, line);
    }

    fn flush(&self) {
        if let Some(q) = QUEUE.get() {
            q.flush_within(FINAL_WRITE_BOUND);
        }
    }
}

/// Installs the logger (once; later calls change nothing). Also routes panic
/// messages the same way, so that a panic (in a probe connection, say) never blocks
/// on a stuck stderr for more than 1 s.
///
/// Call it after `signals::block_caught()`: the writer thread, when one is started,
/// inherits the signal mask of the thread that logs, and must block the caught
/// signals like every thread of drainit, or the kernel could deliver a signal to it
/// instead of the signalfd.
pub fn init(format: LogFormat, level: log::LevelFilter) {
    let _ = FORMAT.set(format);
    JOURNAL.store(stderr_is_journal(), Ordering::Relaxed);
    let logger: &'static Logger = Box::leak(Box::new(Logger { format }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
        std::panic::set_hook(Box::new(move |info| {
            emit(
                format,
                log_line(format, log::Level::Error, &info.to_string()),
            );
            if let Some(q) = QUEUE.get() {
                q.flush_within(PANIC_WRITE_BOUND);
            }
        }));
    }
}

/// The process's queue, started on first use; `None` if its thread cannot be
/// created.
fn queue(format: LogFormat) -> Option<&'static Queue> {
    if let Some(q) = QUEUE.get() {
        return Some(q);
    }
    let q = Queue::start(std::io::stderr(), format, QUEUE_LINES).ok()?;
    Some(QUEUE.get_or_init(|| q))
}

/// The log format [`init`] was given (for lines the writer thread makes itself).
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// Writes `line` at once when that cannot block and nothing is queued before it;
/// otherwise queues it for the writer thread, which is started the first time it
/// is needed (so a run whose stderr keeps up never creates it). The thread is
/// started from the thread that logs, which blocks the caught signals, and
/// inherits that mask.
fn emit(format: LogFormat, line: String) {
    // One thread at a time from the idle check to the queueing of what was not
    // written: a line longer than a pipe's atomic write (4 KiB) may go out in
    // part, and another thread's line (the proxy's threads log too) written
    // directly before the rest is queued would land inside it. Nothing in here
    // blocks (the writes are non-blocking, the queue drops when full), so the
    // supervisor never waits long on it.
    let turn = EMITTING.lock().unwrap_or_else(PoisonError::into_inner);
    let queue = QUEUE.get();
    let mut line = line.into_bytes();
    if queue.is_none_or(Queue::idle) {
        let written = direct(&line);
        if written == line.len() {
            return;
        }
        // A part of a line written (a pipe with less room than the line): the rest
        // is queued, nothing may overtake it.
        line.drain(..written);
    }
    match self::queue(format) {
        Some(q) => q.push(line),
        // No writer thread (it could not be created): write directly, which may
        // block on a full pipe, as a last resort (not holding the turn, so that
        // only this thread waits).
        None => {
            drop(turn);
            let _ = std::io::stderr().lock().write_all(&line);
        }
    }
}

/// Held by [`emit`] while it writes or queues a line.
static EMITTING: Mutex<()> = Mutex::new(());

/// Waits at most `within` (use [`FINAL_WRITE_BOUND`]) until every line logged so
/// far is written to stderr. For exits that write no report (an error before the
/// spawn, `--check-config`): `std::process::exit` does not wait for the writer
/// thread, so a line still queued would be lost. Returns whether all were
/// written; `true` without [`init`] (lines were written directly).
pub fn flush(within: Duration) -> bool {
    // After the exit report, whose own bound already covered a stuck stderr, no
    // second wait: a stuck stderr delays the exit by one bound, not two.
    if FINAL_DONE.load(Ordering::Relaxed) {
        return QUEUE.get().is_none_or(Queue::idle);
    }
    QUEUE
        .get()
        .is_none_or(|q| q.idle() || q.flush_within(within))
}

/// Writes `line` (the exit report, without newline) as the last line of stderr,
/// after every log line queued before it, and waits at most `within` for the write
/// (use [`FINAL_WRITE_BOUND`]): a stderr nobody reads delays the exit by that much,
/// never forever. Without [`init`] (errors before the logger exists) the line is
/// written directly. Returns whether it was written; errors are ignored.
pub fn write_final(line: &str, within: Duration) -> bool {
    FINAL_DONE.store(true, Ordering::Relaxed);
    let prefixed;
    let mut line = if JOURNAL.load(Ordering::Relaxed) {
        prefixed = format!("<{}>{line}", priority(log::Level::Info));
        prefixed.as_bytes()
    } else {
        line.as_bytes()
    };
    if QUEUE.get().is_none_or(Queue::idle) {
        let whole = [line, b"\n"].concat();
        let written = direct(&whole);
        if written == whole.len() {
            return true;
        }
        // The rest goes after, through the writer thread (which adds the newline).
        line = &line[written..];
    }
    match queue(FORMAT.get().copied().unwrap_or(LogFormat::Text)) {
        Some(q) => q.write_final(line, within),
        None => {
            let mut err = std::io::stderr().lock();
            let ok = err.write_all(line).is_ok() && err.write_all(b"\n").is_ok();
            let _ = err.flush();
            ok
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer that blocks while the test holds `gate`, like a full pipe.
    #[derive(Clone)]
    struct Gated {
        gate: Arc<Mutex<()>>,
        out: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gated {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let _open = self.gate.lock().unwrap();
            self.out.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn text(out: &Arc<Mutex<Vec<u8>>>) -> String {
        String::from_utf8(out.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_stuck_writer_never_blocks_logging_and_bounds_the_report() {
        let w = Gated {
            gate: Arc::new(Mutex::new(())),
            out: Arc::new(Mutex::new(Vec::new())),
        };
        let q = Queue::start(w.clone(), LogFormat::Text, 8).unwrap();
        let held = w.gate.lock().unwrap();
        let started = Instant::now();
        for i in 0..100 {
            q.push(format!("line {i}\n"));
        }
        assert!(started.elapsed() < Duration::from_millis(500));
        // The report waits at most its bound for the stuck writer.
        let started = Instant::now();
        assert!(!q.write_final("{\"late\":1}", Duration::from_millis(200)));
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        drop(held);
    }

    #[test]
    fn dropped_lines_are_announced_and_the_report_comes_last() {
        let w = Gated {
            gate: Arc::new(Mutex::new(())),
            out: Arc::new(Mutex::new(Vec::new())),
        };
        let q = Queue::start(w.clone(), LogFormat::Text, 8).unwrap();
        let held = w.gate.lock().unwrap();
        for i in 0..100 {
            q.push(format!("line {i}\n"));
        }
        drop(held);
        assert!(q.flush_within(Duration::from_secs(5)));
        q.push("after\n");
        assert!(q.write_final("{\"report\":1}", Duration::from_secs(5)));
        q.push("too late\n");
        let out = text(&w.out);
        let lines: Vec<&str> = out.lines().collect();
        let written = lines.iter().filter(|l| l.starts_with("line ")).count();
        let notice = lines
            .iter()
            .position(|l| l.contains("log lines dropped"))
            .unwrap_or_else(|| panic!("no drop notice in:\n{out}"));
        let n: usize = lines[notice]
            .trim_start_matches("drainit: warning: ")
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(written + n, 100, "{out}");
        assert_eq!(lines[notice + 1], "after", "{out}");
        assert_eq!(lines.last(), Some(&"{\"report\":1}"), "{out}");
        assert!(!out.contains("too late"));
    }

    #[test]
    fn write_errors_are_ignored() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
        }
        let q = Queue::start(Closed, LogFormat::Json, 4).unwrap();
        q.push("x\n");
        assert!(q.write_final("{}", Duration::from_secs(5)));
    }

    #[test]
    fn json_lines_carry_a_utc_timestamp_and_journal_lines_a_priority() {
        let at = std::time::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(
            render_line(LogFormat::Json, log::Level::Info, "m", Some(at), false),
            "{\"drainit\":\"log\",\"ts\":\"2023-11-14T22:13:20.123Z\",\"level\":\"info\",\"msg\":\"m\"}\n"
        );
        assert_eq!(
            render_line(LogFormat::Text, log::Level::Warn, "w", Some(at), true),
            "<4>drainit: warning: w\n"
        );
        assert_eq!(
            render_line(LogFormat::Text, log::Level::Error, "e", None, true),
            "<3>drainit: error: e\n"
        );
        assert_eq!(
            render_line(LogFormat::Text, log::Level::Debug, "d", None, true),
            "<7>drainit: debug: d\n"
        );
    }

    #[test]
    fn rfc3339_dates() {
        let at = |s: u64| rfc3339(std::time::UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00.000Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59.000Z");
        assert_eq!(at(1_798_761_599), "2026-12-31T23:59:59.000Z");
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(is_journal_stream("8:1234", 8, 1234));
        assert!(!is_journal_stream("8:1234", 8, 1235));
        assert!(!is_journal_stream("garbage", 8, 1234));
        assert!(!is_journal_stream("", 8, 1234));
    }

    #[test]
    fn control_characters_never_break_a_text_line() {
        let evil = "12 (a\n<0>drainit: exit 0\u{1b}[2J\u{9b}\r)";
        let line = format_line(LogFormat::Text, log::Level::Warn, evil);
        assert_eq!(
            line,
            "drainit: warning: 12 (a\\n<0>drainit: exit 0\\u{1b}[2J\\u{9b}\\r)\n"
        );
        assert_eq!(line.lines().count(), 1);
        // Nothing else changes: ordinary text and Unicode pass as is.
        assert_eq!(
            format_line(LogFormat::Text, log::Level::Info, "é ✓ \"q\""),
            "drainit: é ✓ \"q\"\n"
        );
        let json = format_line(LogFormat::Json, log::Level::Info, evil);
        assert_eq!(json.lines().count(), 1);
    }

    #[test]
    fn formats_are_unchanged() {
        assert_eq!(
            format_line(LogFormat::Text, log::Level::Warn, "w"),
            "drainit: warning: w\n"
        );
        assert_eq!(
            format_line(LogFormat::Text, log::Level::Debug, "d"),
            "drainit: debug: d\n"
        );
        assert_eq!(
            format_line(LogFormat::Json, log::Level::Error, "a \"b\""),
            "{\"drainit\":\"log\",\"level\":\"error\",\"msg\":\"a \\\"b\\\"\"}\n"
        );
    }
}
