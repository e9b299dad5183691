//! A log line a client (or a damaged file) can cause on every request,
//! written at most once per period.

use std::sync::atomic::{AtomicI64, Ordering};

/// A log line written at most once per `every_ms` (all threads together;
/// what was not logged is counted by the caller's metric).
#[derive(Debug)]
pub struct LogEvery {
    last: AtomicI64,
    every_ms: i64,
}

impl LogEvery {
    pub const fn new(every_ms: i64) -> LogEvery {
        LogEvery {
            last: AtomicI64::new(i64::MIN),
            every_ms,
        }
    }

    /// Whether the line may be written now (then not again for `every_ms`).
    pub fn ready(&self) -> bool {
        let now = crate::now_ms();
        let last = self.last.load(Ordering::Relaxed);
        now.saturating_sub(last) >= self.every_ms
            && self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_ready_once_per_period() {
        let l = LogEvery::new(60_000);
        assert!(l.ready());
        assert!(!l.ready());
        assert!(LogEvery::new(0).ready());
    }
}
