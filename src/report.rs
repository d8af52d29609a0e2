//! The exit report (README, The exit report), built from the drain machine's record and the
//! process ledger the tree keeps ([`crate::tree::ProcessLedger`]).
//!
//! Owns: the JSON object written as the last line of stderr and to
//! `--report-file` (atomically, temp file + rename, when it is a regular file; in
//! place when it is a device, fifo, symlink or mount).
//!
//! Must not: decide anything. The exit code and reason come from `drain.rs`, the
//! counts from the ledger; this module only shapes and writes.
//!
//! Invariant: the report names processes by pid and `comm` only, never a command
//! line or environment.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::proxy::ledger::{Streams, Totals};

use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::drain::{ChildExit, Outcome, Record, StepEnd, Timeline};
use crate::logging;
use crate::tree::{Abandoned, ProcessLedger};

/// `{"code":N}` or `{"signal":"SIGKILL"}`.
#[derive(Serialize, Debug, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum ExitJson {
    Code(i32),
    Signal(String),
}

impl From<ChildExit> for ExitJson {
    fn from(e: ChildExit) -> ExitJson {
        match e {
            ChildExit::Code(n) => ExitJson::Code(n),
            ChildExit::Signal(s) => ExitJson::Signal(s.to_string()),
        }
    }
}

#[derive(Serialize, Debug)]
pub struct ChildJson {
    pub pid: i32,
    pub exit: Option<ExitJson>,
}

/// The `drain` (or `stop`) object. Times in ms since T0.
#[derive(Serialize, Debug)]
pub struct DrainJson {
    pub in_flight_at_start: usize,
    pub completed: usize,
    pub abandoned: usize,
    /// Processes drainit could not signal (`EPERM`).
    pub unkillable: usize,
    pub pre_drain_delay_ms: u64,
    /// When the drain signal was sent.
    pub forwarded_at_ms: Option<u64>,
    /// When the SIGKILL was sent; null when nothing was killed.
    pub killed_at_ms: Option<u64>,
    pub finished_at_ms: Option<u64>,
    pub deadline_ms: Option<u64>,
}

#[derive(Serialize, Debug)]
pub struct TeardownJson {
    pub name: String,
    pub ok: bool,
    pub duration_ms: u64,
    /// `exit status 1`, `timed out after 5s`, `killed by a second signal`,
    /// `skipped`, `not found`; absent when ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One drain phase in the report (docs/drain-phases.md): its outcome (`ok`, `failed`,
/// `timed_out`, `canceled`, `abandoned`, `skipped`), what it ended with, and its
/// start and duration in ms since T0.
#[derive(Serialize, Debug)]
pub struct PhaseJson {
    pub name: String,
    pub outcome: &'static str,
    /// A `command` phase's exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that killed a `command` phase (`SIGTERM`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// A `post` phase's HTTP status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why there is neither: `connection refused`, `request dropped`, `could not
    /// be started: not found`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub start_ms: u64,
    pub duration_ms: u64,
}

/// The exit report (one JSON object), final or partial (docs/report.md: written to
/// the report file at T0 and at the forward, `"final":false`, so that a platform
/// SIGKILL of drainit still leaves evidence).
#[derive(Serialize, Debug)]
pub struct Report {
    pub drainit: &'static str,
    /// `false` in a partial report (the drain is under way), `true` at exit.
    #[serde(rename = "final")]
    pub is_final: bool,
    /// drainit's exit code (in a partial report: none yet, shown as `null`).
    #[serde(skip)]
    pub exit_code: i32,
    /// What the JSON shows as `exit_code`: `exit_code`, or `null` when partial.
    #[serde(rename = "exit_code")]
    exit_code_json: Option<i32>,
    /// `drained`, `abandoned`, …; `draining` or `stopping` in a partial report.
    pub reason: &'static str,
    /// The first drain signal received (before rewriting); null without one.
    pub signal: Option<String>,
    pub child: Option<ChildJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub drain: Option<DrainJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<DrainJson>,
    pub abandoned: Vec<Abandoned>,
    /// Processes drainit could not signal (`EPERM`): pid and comm.
    pub unkillable: Vec<Abandoned>,
    pub teardown: Vec<TeardownJson>,
    /// The drain phases reached, in order; absent when none is configured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseJson>,
    /// Processes re-parented to drainit and reaped by it (not its main child).
    pub orphans_reaped: u64,
    /// With `--proxy`: the request ledger (docs/proxy.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<Totals>,
    /// With `--proxy`: upgraded connections (WebSocket) passed through.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streams: Option<Streams>,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Builds the `drain`/`stop` object from the timeline and the ledger.
pub fn drain_json(t: &Timeline, ledger: &ProcessLedger) -> DrainJson {
    let t0 = t.t0.unwrap_or_default();
    let since = |at: Option<Duration>| at.map(|a| ms(a.saturating_sub(t0)));
    DrainJson {
        in_flight_at_start: ledger.in_flight(),
        completed: ledger.completed(),
        abandoned: ledger.abandoned().len(),
        unkillable: ledger.unkillables().len(),
        pre_drain_delay_ms: ms(t.pre_drain_delay),
        forwarded_at_ms: since(t.forwarded_at),
        killed_at_ms: since(t.killed_at),
        finished_at_ms: since(t.finished_at),
        deadline_ms: since(t.deadline),
    }
}

/// Everything the driver knows at exit, or so far: the drain machine's record
/// and the ledger of processes.
pub struct Facts<'a> {
    /// `None` for a partial report: the drain is under way, in `phase`.
    pub outcome: Option<Outcome>,
    /// The phase now (for a partial report's `reason`).
    pub phase: crate::drain::Phase,
    /// The drain signal, the main child's exit, the timeline.
    pub record: &'a Record,
    pub child_pid: i32,
    pub ledger: &'a ProcessLedger,
    pub teardown: Vec<TeardownJson>,
    pub phases: Vec<PhaseJson>,
    pub orphans: u64,
    /// With `--proxy`: the request ledger and the streams now.
    pub requests: Option<(Totals, Streams)>,
}

impl Report {
    /// The report of a run whose child was spawned: final when `f.outcome` is
    /// known, partial (`"final":false`, `exit_code` null, `reason` the phase)
    /// otherwise.
    pub fn from_facts(f: Facts<'_>) -> Report {
        let body = drain_json(&f.record.timeline, f.ledger);
        let (drain, stop) = if f.record.drain_signal.is_some() {
            (Some(body), None)
        } else {
            (None, Some(body))
        };
        Report {
            drainit: "exit",
            is_final: f.outcome.is_some(),
            exit_code: f.outcome.map_or(0, |o| o.code),
            exit_code_json: f.outcome.map(|o| o.code),
            reason: f.outcome.map_or(f.phase.as_str(), |o| o.reason.as_str()),
            signal: f.record.drain_signal.map(|s| s.to_string()),
            child: Some(ChildJson {
                pid: f.child_pid,
                exit: f.record.child_exit.map(Into::into),
            }),
            error: None,
            drain,
            stop,
            abandoned: f.ledger.abandoned().to_vec(),
            unkillable: f.ledger.unkillables().to_vec(),
            teardown: f.teardown,
            phases: f.phases,
            orphans_reaped: f.orphans,
            streams: f.requests.as_ref().map(|r| r.1.clone()),
            requests: f.requests.map(|r| r.0),
        }
    }

    /// The report of a command that could not be started.
    pub fn spawn_failed(code: i32, error: String) -> Report {
        Report {
            drainit: "exit",
            is_final: true,
            exit_code: code,
            exit_code_json: Some(code),
            reason: "spawn_failed",
            signal: None,
            child: None,
            error: Some(error),
            drain: None,
            stop: None,
            abandoned: Vec::new(),
            unkillable: Vec::new(),
            teardown: Vec::new(),
            phases: Vec::new(),
            orphans_reaped: 0,
            requests: None,
            streams: None,
        }
    }

    /// One line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            format!("{{\"drainit\":\"exit\",\"exit_code\":{}}}", self.exit_code)
        })
    }

    /// Writes the report: to `--report-file` if given ([`write_file`]), then as the
    /// last line of stderr, through the logger's queue, waiting at most
    /// [`logging::FINAL_WRITE_BOUND`] (2 s) for a stderr nobody reads. Write errors
    /// are logged, never fatal: the exit code is what matters most.
    pub fn write(&self, file: Option<&Path>) {
        let line = self.to_json();
        if let Some(path) = file
            && let Err(e) = write_file(path, line.as_bytes())
        {
            log::error!("writing the report to {} failed: {e}", path.display());
        }
        logging::write_final(&line, logging::FINAL_WRITE_BOUND);
    }

    /// Writes a partial report to the report file `path`, replacing the previous
    /// one, and nothing to stderr. Only a regular file (or one that does not exist
    /// yet, or a symlink to one) gets it: a fifo or a device such as
    /// `/dev/stderr` is a stream whose reader expects one report, the final one.
    /// Not synced to disk: it is evidence against a SIGKILL of drainit, not
    /// against a power loss, and the loop must not wait on the disk mid-drain.
    /// Errors are logged at debug level (the final write logs its own).
    pub fn write_partial(&self, path: &Path) {
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => return,
            _ => {}
        }
        if let Err(e) = write_file_with(path, self.to_json().as_bytes(), false) {
            log::debug!(
                "writing the partial report to {} failed: {e}",
                path.display()
            );
        }
    }
}

/// Writes `bytes` and a newline to the report file `path`.
///
/// A regular file, or a path that does not exist yet, is replaced atomically
/// ([`write_atomic`]). A character or block device such as `/dev/stderr` or
/// `/dev/null`, or a fifo, is opened and written in place. A symlink is followed
/// (written in place) only when it belongs to drainit's own user, as the
/// operator's `/dev/termination-log -> …` does; one that belongs to anyone else
/// (an app started with `--user` can plant one in a directory it may write) is
/// replaced by the rename, never followed, so a report can never overwrite a file
/// the app could not write itself. When the rename is refused because the target
/// is a mount point (a bind-mounted file such as Kubernetes' `/dev/termination-log`:
/// `EBUSY`), on another filesystem (`EXDEV`) or not ours to replace (`EPERM`), or
/// when no temporary file can be created next to an existing target, or the
/// temporary file's path would be longer than the kernel takes (a report path
/// within a few bytes of `PATH_MAX`), the file is written in place as well,
/// without following a symlink.
///
/// # Errors
/// Both ways failed; the error is the last one's.
pub fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_file_with(path, bytes, true)
}

/// [`write_file`], synced to disk or not.
fn write_file_with(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let existing = std::fs::symlink_metadata(path).ok();
    let follow = existing
        .as_ref()
        .is_some_and(|m| m.file_type().is_symlink() && m.uid() == nix::unistd::geteuid().as_raw());
    if follow {
        return write_in_place(path, bytes, sync, true);
    }
    if existing
        .as_ref()
        .is_some_and(|m| !m.file_type().is_file() && !m.file_type().is_symlink())
    {
        return write_in_place(path, bytes, sync, false);
    }
    match atomic(path, bytes, sync) {
        Err(e)
            if (existing.is_some() && may_write_in_place(&e))
                || e.raw_os_error() == Some(libc::ENAMETOOLONG) =>
        {
            write_in_place(path, bytes, sync, false)
        }
        r => r,
    }
}

/// Whether an atomic write failed in a way a write in place may not.
fn may_write_in_place(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBUSY | libc::EXDEV | libc::EPERM | libc::EACCES | libc::EROFS)
    )
}

/// Opens `path` for writing (truncating; following a symlink, and creating the
/// target of a dangling one, only when `follow`) and writes `bytes` and a newline.
///
/// The open is non-blocking so that a fifo with no reader fails at once (`ENXIO`)
/// instead of hanging drainit's exit; the write itself is blocking again.
fn write_in_place(path: &Path, bytes: &[u8], sync: bool, follow: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | nofollow)
        .open(path)?;
    let flags = OFlag::from_bits_truncate(fcntl(&f, FcntlArg::F_GETFL)?);
    fcntl(&f, FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    let mut all = Vec::with_capacity(bytes.len() + 1);
    all.extend_from_slice(bytes);
    all.push(b'\n');
    f.write_all(&all)?;
    if sync && f.metadata()?.file_type().is_file() {
        f.sync_all()?;
    }
    Ok(())
}

/// Writes `bytes` and a newline to `path` through a temporary file in the same
/// directory and a rename, so a reader sees the old file or the whole new one,
/// never half of it. Replaces whatever `path` names (a symlink itself, not its
/// target), so callers use [`write_file`].
///
/// The temporary file is created exclusively (`O_CREAT | O_EXCL`, which never
/// follows a symlink) under a name with the pid and a clock-derived suffix; a
/// name somebody planted is skipped, never opened.
///
/// # Errors
/// Creating, writing, syncing or renaming the temporary file failed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    atomic(path, bytes, true)
}

fn atomic(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    use std::os::unix::ffi::OsStrExt;
    let name = path.file_name().map_or(&b"report"[..], |n| n.as_bytes());
    let mut attempt = 0u32;
    let (tmp, mut f) = loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let tmp = dir.join(temp_name(
            name,
            std::process::id(),
            nanos ^ attempt.wrapping_mul(0x9e37_79b9),
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    let result = (|| {
        f.write_all(bytes)?;
        f.write_all(b"\n")?;
        if sync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The temporary file's name for a report file named `name`:
/// `.NAME.PID.SUFFIX.tmp`, with `NAME` cut short (at a byte, the name may be any
/// bytes) so that the whole stays within the 255 bytes a file name may have: a
/// report name of up to 255 bytes is valid, and its temporary name must be too.
fn temp_name(name: &[u8], pid: u32, suffix: u32) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let tail = format!(".{pid}.{suffix:08x}.tmp");
    let room = crate::config::NAME_MAX - 1 - tail.len();
    let mut out = Vec::with_capacity(crate::config::NAME_MAX);
    out.push(b'.');
    out.extend_from_slice(&name[..name.len().min(room)]);
    out.extend_from_slice(tail.as_bytes());
    std::ffi::OsString::from_vec(out)
}

/// The text form of how a teardown step ended.
pub fn step_error(end: StepEnd, exit: Option<ChildExit>, timeout: Duration) -> Option<String> {
    match end {
        StepEnd::Ok => None,
        StepEnd::Failed => Some(match exit {
            Some(ChildExit::Code(n)) => format!("exit status {n}"),
            Some(ChildExit::Signal(s)) => format!("killed by {s}"),
            None => "could not be started".into(),
        }),
        StepEnd::TimedOut => Some(format!(
            "timed out after {}",
            humantime::format_duration(timeout)
        )),
        StepEnd::Cut => Some("killed by a second drain signal".into()),
        StepEnd::Skipped => Some("skipped".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::Signal;

    #[test]
    fn exit_json_shapes() {
        assert_eq!(
            serde_json::to_string(&ExitJson::Code(3)).unwrap(),
            r#"{"code":3}"#
        );
        assert_eq!(
            serde_json::to_string(&ExitJson::from(ChildExit::Signal(Signal::KILL))).unwrap(),
            r#"{"signal":"SIGKILL"}"#
        );
    }

    fn tmp_dir(tag: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("drainit-report-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn atomic_write_replaces_the_file() {
        let d = tmp_dir("atomic");
        let p = d.join("report.json");
        write_file(&p, b"{\"a\":1}").unwrap();
        write_file(&p, b"{\"a\":2}").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "{\"a\":2}\n");
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "a temp file was left"
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_report_name_of_any_valid_length_is_written() {
        // 255 bytes is the longest name; the temporary file's name must fit too.
        let d = tmp_dir("longname");
        for n in [1, 200, 233, 234, 250, 255] {
            let p = d.join("r".repeat(n));
            write_file(&p, b"{}").unwrap_or_else(|e| panic!("{n} bytes: {e}"));
            assert_eq!(std::fs::read_to_string(&p).unwrap(), "{}\n");
            std::fs::remove_file(&p).unwrap();
        }
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            0,
            "a temp file was left"
        );
        let t = temp_name(&[b'r'; 255], 4_194_304, u32::MAX);
        assert_eq!(t.len(), crate::config::NAME_MAX);
        assert_eq!(temp_name(b"r.json", 7, 1), ".r.json.7.00000001.tmp");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_symlink_is_written_through_not_replaced() {
        use std::os::unix::fs::symlink;
        let d = tmp_dir("symlink");
        let real = d.join("real.json");
        let link = d.join("link.json");
        std::fs::write(&real, "old contents, longer than the new\n").unwrap();
        symlink(&real, &link).unwrap();
        write_file(&link, b"{}").unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "{}\n");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn a_device_stays_a_device() {
        use std::os::unix::fs::FileTypeExt;
        let dev = Path::new("/dev/null");
        write_file(dev, b"{}").unwrap();
        let t = std::fs::symlink_metadata(dev).unwrap().file_type();
        assert!(
            t.is_char_device(),
            "/dev/null is no longer a character device"
        );
    }

    #[test]
    fn a_fifo_without_reader_fails_at_once_and_with_one_is_written() {
        use std::os::unix::fs::FileTypeExt;
        let d = tmp_dir("fifo");
        let fifo = d.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = write_file(&fifo, b"{}").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENXIO), "{e}");
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo()
        );
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        // The reader opens the fifo at some point: retry until it has.
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while write_file(&fifo, b"{\"x\":1}").is_err() {
            assert!(
                std::time::Instant::now() < end,
                "the reader never opened the fifo"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(reader.join().unwrap(), "{\"x\":1}\n");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn refused_renames_fall_back_to_a_write_in_place() {
        for errno in [libc::EBUSY, libc::EXDEV, libc::EPERM] {
            assert!(may_write_in_place(&std::io::Error::from_raw_os_error(
                errno
            )));
        }
        assert!(!may_write_in_place(&std::io::Error::from_raw_os_error(
            libc::ENOENT
        )));
    }
}
