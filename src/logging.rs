//! drainit's own log lines on stderr: `drainit: …` in text, one JSON object per
//! line in json. A `log::Log` backend.
//!
//! Owns: the only writes to stderr after start-up, the exit report's line included
//! ([`write_final`]), and the thread that makes them.
//!
//! Must not: block the caller. stderr is often a pipe that drainit shares with the
//! child (same open file description): when nobody reads it (a log shipper that
//! stalled, `drainit … | sleep 20`), write(2) blocks once the pipe is full. Had the
//! supervisor thread made that write, it would freeze in it: no forward, no SIGKILL
//! at the deadline, `/healthz` timing out. So every line goes through a bounded
//! queue to a dedicated writer thread, and a full queue drops the line (counted, and
//! announced as "N log lines dropped" once there is room again). O_NONBLOCK on fd 2
//! is not an option: the flag lives in the open file description, which the child
//! shares, and would hand it EAGAIN on its own writes.
//!
//! Invariant: write errors are ignored (a closed stderr must never panic drainit,
//! CONVENTIONS pitfall 9), and the exit report is the last line drainit writes: the
//! writer thread stops after it.

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
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
    /// A formatted line, newline included.
    Line(String),
    /// This many lines were dropped since the last notice.
    Dropped(u64),
    /// Acknowledge once everything before has been written.
    Flush(SyncSender<()>),
    /// The exit report (no newline): written, acknowledged, and nothing after it.
    Final(String, SyncSender<()>),
}

/// A bounded queue in front of a writer thread. One per process ([`init`]); tests
/// make their own around any writer.
pub struct Queue {
    tx: SyncSender<Msg>,
    /// Lines dropped because the queue was full and not yet announced.
    dropped: AtomicU64,
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
        std::thread::Builder::new()
            .name("drainit-log".into())
            .spawn(move || write_lines(out, format, rx))?;
        Ok(Queue {
            tx,
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues a formatted line (newline included). Never blocks: when the queue is
    /// full the line is dropped and counted.
    pub fn push(&self, line: String) {
        let pending = self.dropped.swap(0, Ordering::Relaxed);
        if pending > 0 && self.tx.try_send(Msg::Dropped(pending)).is_err() {
            self.dropped.fetch_add(pending + 1, Ordering::Relaxed);
            return;
        }
        match self.tx.try_send(Msg::Line(line)) {
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
    pub fn write_final(&self, line: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let pending = self.dropped.swap(0, Ordering::Relaxed);
        if pending > 0 {
            // Best effort: the count belongs before the report.
            let _ = self.send_until(Msg::Dropped(pending), deadline);
        }
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        self.send_until(Msg::Final(line.to_string(), ack_tx), deadline)
            && ack_rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .is_ok()
    }

    /// Sends `msg`, waiting for room until `deadline`. std's `SyncSender` has no
    /// `send_timeout` (unstable), so this polls every millisecond; it runs only at
    /// exit or after a panic, and only while the queue is full.
    fn send_until(&self, mut msg: Msg, deadline: Instant) -> bool {
        loop {
            match self.tx.try_send(msg) {
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
fn write_lines<W: Write>(mut out: W, format: LogFormat, rx: Receiver<Msg>) {
    for msg in rx {
        match msg {
            Msg::Line(line) => {
                let _ = out.write_all(line.as_bytes());
            }
            Msg::Dropped(n) => {
                let what = if n == 1 { "line" } else { "lines" };
                let line = format_line(
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
            Msg::Final(line, ack) => {
                let _ = out.write_all(line.as_bytes());
                let _ = out.write_all(b"\n");
                let _ = out.flush();
                let _ = ack.try_send(());
                return;
            }
        }
    }
}

/// One log line in `format`, newline included.
fn format_line(format: LogFormat, level: log::Level, msg: &str) -> String {
    match format {
        LogFormat::Text => match level {
            log::Level::Info => format!("drainit: {msg}\n"),
            log::Level::Warn => format!("drainit: warning: {msg}\n"),
            log::Level::Error => format!("drainit: error: {msg}\n"),
            l => format!("drainit: {}: {msg}\n", l.as_str().to_lowercase()),
        },
        LogFormat::Json => {
            let msg = serde_json::to_string(msg).unwrap_or_else(|_| "\"\"".into());
            format!(
                "{{\"drainit\":\"log\",\"level\":\"{}\",\"msg\":{msg}}}\n",
                level.as_str().to_lowercase()
            )
        }
    }
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
        let line = format_line(self.format, record.level(), &record.args().to_string());
        match QUEUE.get() {
            Some(q) => q.push(line),
            // No writer thread (it could not be created): write directly, which
            // may block on a full pipe, as a last resort.
            None => {
                let _ = std::io::stderr().lock().write_all(line.as_bytes());
            }
        }
    }

    fn flush(&self) {
        if let Some(q) = QUEUE.get() {
            q.flush_within(FINAL_WRITE_BOUND);
        }
    }
}

/// Installs the logger and starts its writer thread (once; later calls change
/// nothing). Also routes panic messages through the queue, so that a panic (in a
/// probe connection, say) never blocks on a stuck stderr for more than 1 s.
///
/// Call it after `signals::block_caught()`: the writer thread inherits the calling
/// thread's signal mask, and must block the caught signals like every thread of
/// drainit, or the kernel could deliver a signal to it instead of the signalfd.
pub fn init(format: LogFormat, level: log::LevelFilter) {
    if QUEUE.get().is_none()
        && let Ok(q) = Queue::start(std::io::stderr(), format, QUEUE_LINES)
    {
        let _ = QUEUE.set(q);
    }
    let logger: &'static Logger = Box::leak(Box::new(Logger { format }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level);
        if QUEUE.get().is_some() {
            std::panic::set_hook(Box::new(move |info| {
                if let Some(q) = QUEUE.get() {
                    q.push(format_line(format, log::Level::Error, &info.to_string()));
                    q.flush_within(PANIC_WRITE_BOUND);
                }
            }));
        }
    }
}

/// Waits at most `within` (use [`FINAL_WRITE_BOUND`]) until every line logged so
/// far is written to stderr. For exits that write no report (an error before the
/// spawn, `--check-config`): `std::process::exit` does not wait for the writer
/// thread, so a line still queued would be lost. Returns whether all were
/// written; `true` without [`init`] (lines were written directly).
pub fn flush(within: Duration) -> bool {
    QUEUE.get().is_none_or(|q| q.flush_within(within))
}

/// Writes `line` (the exit report, without newline) as the last line of stderr,
/// after every log line queued before it, and waits at most `within` for the write
/// (use [`FINAL_WRITE_BOUND`]): a stderr nobody reads delays the exit by that much,
/// never forever. Without [`init`] (errors before the logger exists) the line is
/// written directly. Returns whether it was written; errors are ignored.
pub fn write_final(line: &str, within: Duration) -> bool {
    match QUEUE.get() {
        Some(q) => q.write_final(line, within),
        None => {
            let mut err = std::io::stderr().lock();
            let ok = err.write_all(line.as_bytes()).is_ok() && err.write_all(b"\n").is_ok();
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
        q.push("after\n".into());
        assert!(q.write_final("{\"report\":1}", Duration::from_secs(5)));
        q.push("too late\n".into());
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
        q.push("x\n".into());
        assert!(q.write_final("{}", Duration::from_secs(5)));
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
