//! The proxy's line to the supervisor's thread: that a client asked `/readyz`
//! or the health path ([`ReadyzAsked`]), and the health path's questions about
//! readiness ([`ReadinessAsks`]). drainit's `published.rs` re-exports them: the
//! probe server notes [`ReadyzAsked`] too, and the driver receives it as an
//! event.
//!
//! Must not: hold logic.

use tokio::sync::{mpsc, oneshot, watch};

/// Tells the driver that something routes by drainit's readiness: a client
/// asked `GET|HEAD /readyz` (or the proxy's health path), so the default
/// pre-drain delay applies (docs/processes-and-signals.md). The driver receives it as an event
/// (`Event::Routed`) on the watch's receiver. Cheap to clone; `Send`, since the
/// proxy's threads note it too.
#[derive(Clone, Debug)]
pub struct ReadyzAsked(watch::Sender<bool>);

impl ReadyzAsked {
    /// The noting end and the driver's receiving end (`true` once asked).
    pub fn channel() -> (ReadyzAsked, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        (ReadyzAsked(tx), rx)
    }

    /// Records that a client asked. Only the first ask wakes the driver; later
    /// ones take a read lock and nothing else.
    pub fn note(&self) {
        if !*self.0.borrow() {
            self.0
                .send_if_modified(|asked| !std::mem::replace(asked, true));
        }
    }
}

/// A question from another thread (the admission proxy's health path): what
/// would `/readyz` answer now? Answered with `(ready, status word)`.
pub type ReadinessAsk = oneshot::Sender<(bool, String)>;

/// The proxy's end of its line to the supervisor's thread: asks what `/readyz`
/// would answer (answered by `probe::answer_readiness`), and notes that its
/// health path was asked.
#[derive(Clone, Debug)]
pub struct ReadinessAsks {
    asks: mpsc::Sender<ReadinessAsk>,
    asked: ReadyzAsked,
}

impl ReadinessAsks {
    /// Asks go to `asks`; the health path's asks are noted on `asked`.
    pub fn new(asks: mpsc::Sender<ReadinessAsk>, asked: ReadyzAsked) -> ReadinessAsks {
        ReadinessAsks { asks, asked }
    }

    /// Sends one question; waits while 64 are queued.
    ///
    /// # Errors
    /// The supervisor's thread no longer answers (its receiver is gone).
    pub async fn send(
        &self,
        ask: ReadinessAsk,
    ) -> Result<(), mpsc::error::SendError<ReadinessAsk>> {
        self.asks.send(ask).await
    }

    /// The health path was asked: something routes by drainit's readiness.
    pub fn note_asked(&self) {
        self.asked.note();
    }
}
