//! What the tasks of drainit tell one another: the phase the supervisor publishes
//! for the probes and what the app announced over sd_notify ([`Published`]),
//! that a client asked `/readyz` ([`ReadyzAsked`]), and the proxy's questions
//! about readiness ([`ReadinessAsks`]).
//!
//! Owns: these types, no state: each channel is made by `main` and its ends are
//! handed to the tasks that use them. Writers of [`Published`]: the supervisor
//! (`phase`), `notify.rs` (the app's fields). [`ReadyzAsked`] is noted by the
//! probe server and the proxy's health path, and received by the driver as an
//! event.
//!
//! Must not: hold logic. Invariant: each field has one writer.

use crate::drain::Phase;
// The proxy's line to the supervisor lives in the proxy's crate (proxy/), which
// imports nothing from drainit; the probe server and the driver use it here.
pub use drainit_proxy::readiness::{ReadinessAsk, ReadinessAsks, ReadyzAsked};

/// What the supervisor publishes for the probes. The supervisor writes `phase`;
/// `notify.rs` writes the app's fields (sd_notify).
#[derive(Clone, Debug, PartialEq)]
pub struct Published {
    /// The lifecycle phase (docs/processes-and-signals.md).
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
