//! When the network thread may write to the page cache itself (see
//! `StorageHandler::write_now`): a write there saves four thread hand-offs (network thread,
//! runtime, blocking pool and back), but one that waits (the kernel throttling dirty pages
//! under a bulk load, a checksum page read from disk) holds up every datagram behind it. So
//! a write that took longer than [`SLOW`] pauses inline writes for [`PAUSE`]: under such a
//! load the blocking pool absorbs the waits, and a quiet server answers small writes at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// An inline write taking longer than this waited for something besides memory.
pub(crate) const SLOW: Duration = Duration::from_millis(1);
/// How long inline writes stay off after a slow one.
pub(crate) const PAUSE: Duration = Duration::from_millis(50);

/// Whether inline writes are paused, and how many were done and found slow.
#[derive(Debug)]
pub(crate) struct InlineWrites {
    epoch: Instant,
    /// Microseconds since `epoch` until which inline writes are off.
    paused_until_us: AtomicU64,
    /// Writes answered inline.
    pub(crate) done: AtomicU64,
    /// Inline writes (or attempts) slower than [`SLOW`].
    pub(crate) slow: AtomicU64,
}

impl Default for InlineWrites {
    fn default() -> Self {
        InlineWrites {
            epoch: Instant::now(),
            paused_until_us: AtomicU64::new(0),
            done: AtomicU64::new(0),
            slow: AtomicU64::new(0),
        }
    }
}

impl InlineWrites {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Whether a write should go to the blocking pool because a recent one was slow.
    pub(crate) fn paused(&self) -> bool {
        self.now_us() < self.paused_until_us.load(Ordering::Relaxed)
    }

    /// Notes how long an inline write (or attempt) took, and whether it was `done`; a slow
    /// one pauses inline writes.
    pub(crate) fn took(&self, took: Duration, done: bool) {
        if done {
            self.done.fetch_add(1, Ordering::Relaxed);
        }
        if took > SLOW {
            self.slow.fetch_add(1, Ordering::Relaxed);
            let until = self.now_us() + PAUSE.as_micros() as u64;
            self.paused_until_us.fetch_max(until, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_write_pauses_inline_writes_and_a_fast_one_does_not() {
        let writes = InlineWrites::default();
        assert!(!writes.paused());
        writes.took(Duration::from_micros(200), true);
        assert!(!writes.paused());
        writes.took(SLOW + Duration::from_micros(1), false);
        assert!(writes.paused());
        assert_eq!(writes.slow.load(Ordering::Relaxed), 1);
        assert_eq!(writes.done.load(Ordering::Relaxed), 1);
        // The pause ends.
        writes
            .paused_until_us
            .store(writes.now_us(), Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1));
        assert!(!writes.paused());
    }
}
