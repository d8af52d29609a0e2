//! The state shared between the tasks of the one runtime thread: what the
//! supervisor publishes for the probes (the phase) and what the app announced over
//! sd_notify, and whether a client has asked `/readyz`.
//!
//! Owns: [`Published`] and the `/readyz`-asked flag. Writers: the supervisor
//! (`phase`), `notify.rs` (the app's fields), the probe server (the flag). Readers:
//! the probe server, `notify.rs`, the supervisor (the flag, at T0).
//!
//! Must not: hold logic. Invariant: each field has one writer.

use crate::drain::Phase;

/// Set by the first `GET|HEAD /readyz`: something routes by drainit's readiness,
/// so the default pre-drain delay applies (DESIGN §2). One probe server per
/// process, and the supervisor only reads it: a flag, not a channel.
static READYZ_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records that a client asked `/readyz` (the probe server calls it).
pub fn note_readyz_asked() {
    READYZ_ASKED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether any client has asked `/readyz` (GET or HEAD) since drainit started.
pub fn readyz_asked() -> bool {
    READYZ_ASKED.load(std::sync::atomic::Ordering::Relaxed)
}

/// What the supervisor publishes for the probes. The supervisor writes `phase`;
/// `notify.rs` writes the app's fields (sd_notify).
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// The lifecycle phase (DESIGN §1).
    pub phase: Phase,
    /// `STATUS=` text from the app (sd_notify), shown in `/readyz`.
    pub status_text: Option<String>,
    /// The app announced its own drain (`STOPPING=1`): readiness fails.
    pub app_stopping: bool,
    /// `false` when the app's sd_notify watchdog stopped beating: `/healthz` 503.
    pub watchdog_ok: bool,
}

impl Published {
    /// `starting`, nothing from the app, watchdog fine.
    pub fn new() -> Published {
        Published {
            phase: Phase::Starting,
            status_text: None,
            app_stopping: false,
            watchdog_ok: true,
        }
    }
}

impl Default for Published {
    fn default() -> Self {
        Published::new()
    }
}
