//! The HTTP/1 header read timeout ([`super::HEAD_TIMEOUT`], against a
//! slowloris) kept with one runtime timer per connection instead of one per
//! request.
//!
//! hyper's HTTP/1 server starts its header read timeout for every request head
//! it waits for (and right after each response, for the next head of a
//! keep-alive connection) and drops it once the head is read. With a runtime
//! timer (hyper-util's `TokioTimer`) that is an allocation, a timer registered
//! and a timer removed per request: about 2,100 instructions of a proxied
//! request's 59,500 (callgrind, `bench/proxy-instructions.sh`). Here hyper's
//! sleeps ([`HeadSleep`]) only note their deadline in the connection's
//! [`HeadClock`]; the connection's watchdog, one runtime timer re-armed at
//! most once per timeout ([`HeadClock::check`]), marks the deadline passed when
//! the head it was set for is still awaited then, and hyper's sleep for that
//! head is ready at its next poll: hyper closes the connection (without an
//! answer), as with its own timer.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::task::{Context, Poll};
use std::time::Duration;

// The runtime's clock (the std one, but for tests that pause it), as hyper's
// sleeps and the watchdog must agree.
use tokio::time::Instant;

/// One HTTP/1 client connection's header read deadline: hyper's
/// [`hyper::rt::Timer`] for that connection (through [`HeadTimer`]).
pub(super) struct HeadClock {
    /// The connection's start: deadlines are kept as nanoseconds after it.
    base: Instant,
    /// When the head awaited is due, in ns after `base` (at least 1); 0 when
    /// no head is awaited (a request is being answered).
    due: AtomicU64,
    /// Deadlines up to this one (ns after `base`) have passed with their head
    /// still awaited: their sleeps are ready.
    passed: AtomicU64,
}

impl HeadClock {
    /// A clock for a connection starting now.
    pub(super) fn new() -> Arc<HeadClock> {
        Arc::new(HeadClock {
            base: Instant::now(),
            due: AtomicU64::new(0),
            passed: AtomicU64::new(0),
        })
    }

    /// `at` in ns after the connection's start, at least 1 (0 is "none").
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The watchdog fired (`watchdog`, the connection's runtime timer): a head
    /// still awaited past its deadline has that deadline marked passed, and
    /// the watchdog is re-armed for the head awaited now (or `timeout` from
    /// now when none is). Returns true when a deadline passed: the caller
    /// polls the connection, whose hyper then sees its sleep ready.
    pub(super) fn check(&self, watchdog: Pin<&mut tokio::time::Sleep>, timeout: Duration) -> bool {
        let now = Instant::now();
        let due = self.due.load(SeqCst);
        if due != 0 && due <= self.nanos(now) {
            self.passed.fetch_max(due, SeqCst);
            watchdog.reset(now + timeout);
            return true;
        }
        let next = if due == 0 {
            now + timeout
        } else {
            self.base + Duration::from_nanos(due)
        };
        watchdog.reset(next);
        false
    }
}

/// hyper's timer for one HTTP/1 connection: its sleeps are [`HeadSleep`]s of
/// the connection's [`HeadClock`]. hyper's HTTP/1 server uses its timer for
/// the header read timeout only.
#[derive(Clone)]
pub(super) struct HeadTimer(pub(super) Arc<HeadClock>);

impl hyper::rt::Timer for HeadTimer {
    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }

    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let due = self.0.nanos(Instant::from_std(deadline));
        self.0.due.store(due, SeqCst);
        Box::pin(HeadSleep {
            clock: self.0.clone(),
            due,
        })
    }
}

/// hyper's header read timeout for one head: ready once the connection's
/// watchdog found its deadline passed ([`HeadClock::check`]). Dropped (the
/// head was read), the clock awaits no head until the next one.
struct HeadSleep {
    clock: Arc<HeadClock>,
    due: u64,
}

impl std::future::Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        // No waker kept: the watchdog runs in the connection's own task
        // (`serve_h1`'s `select!`), which polls hyper after it fires.
        if self.clock.passed.load(SeqCst) >= self.due {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl hyper::rt::Sleep for HeadSleep {}

impl Drop for HeadSleep {
    fn drop(&mut self) {
        // Only its own deadline: a newer head's may be set already.
        let _ = self.clock.due.compare_exchange(self.due, 0, SeqCst, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    #[derive(Default)]
    struct Woken(std::sync::atomic::AtomicBool);

    impl std::task::Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.store(true, SeqCst);
        }
    }

    fn poll(s: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        s.as_mut().poll(&mut cx)
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_still_awaited_at_its_deadline_times_out_and_a_read_one_never_does() {
        let clock = HeadClock::new();
        let timer = HeadTimer(clock.clone());
        let timeout = Duration::from_secs(10);
        let watchdog = tokio::time::sleep(timeout);
        tokio::pin!(watchdog);

        // A head read in time: its sleep is dropped, the watchdog re-arms.
        let read = timer.sleep(timeout);
        tokio::time::advance(Duration::from_secs(4)).await;
        drop(read);
        let mut awaited = timer.sleep(timeout); // due at 14 s
        (&mut watchdog).await; // 10 s: nothing passed yet
        assert!(!clock.check(watchdog.as_mut(), timeout));
        assert_eq!(poll(&mut awaited), Poll::Pending);
        // Re-armed for the head awaited (14 s): polled once after the reset,
        // as serve_h1 does, it wakes its task then.
        let woken = Arc::new(Woken::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(watchdog.as_mut().poll(&mut cx), Poll::Pending);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(
            woken.0.load(SeqCst),
            "the re-armed watchdog never woke its task"
        );
        assert_eq!(watchdog.as_mut().poll(&mut cx), Poll::Ready(()));
        assert!(clock.check(watchdog.as_mut(), timeout));
        assert_eq!(poll(&mut awaited), Poll::Ready(()));

        // The next head starts afresh.
        drop(awaited);
        let mut next = timer.sleep(timeout);
        assert_eq!(poll(&mut next), Poll::Pending);
        drop(next);
        assert_eq!(clock.due.load(SeqCst), 0);
    }
}
