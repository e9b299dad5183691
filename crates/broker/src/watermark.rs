//! How far the cluster's copy (etcd) holds a table's changes: each change
//! made on this node gets a sequence number; the controller advances the
//! watermark once etcd holds every change up to one; a request that made a
//! change waits for it before it is answered (as Kafka answers an ACL or
//! credential change once its metadata log has it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a request that changed a cluster-wide table (users, ACLs)
/// waits for etcd before it is answered as not replicated yet (the change
/// stays queued and is written when etcd is back).
pub const CLUSTER_WAIT: Duration = Duration::from_secs(10);
/// The message of that answer.
pub const NOT_IN_CLUSTER: &str = "stored on this node; the cluster's table (etcd) does not hold it yet (retried)";

#[derive(Debug, Default)]
pub struct Watermark {
    written: AtomicU64,
    grew: tokio::sync::Notify,
}

impl Watermark {
    /// Etcd holds every change up to `seq`.
    pub fn advance(&self, seq: u64) {
        self.written.fetch_max(seq, Ordering::AcqRel);
        self.grew.notify_waiters();
    }

    /// Whether etcd holds every change up to `seq` within `within`.
    pub async fn reached(&self, seq: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let grew = self.grew.notified();
            tokio::pin!(grew);
            grew.as_mut().enable();
            if self.written.load(Ordering::Acquire) >= seq {
                return true;
            }
            if tokio::time::timeout_at(deadline, grew).await.is_err() {
                return self.written.load(Ordering::Acquire) >= seq;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_until_advanced_or_the_time_is_up() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build();
        let Ok(rt) = rt else { return };
        let w = std::sync::Arc::new(Watermark::default());
        assert!(rt.block_on(w.reached(0, Duration::ZERO)));
        assert!(!rt.block_on(w.reached(2, Duration::from_millis(20))));
        w.advance(1);
        assert!(!rt.block_on(w.reached(2, Duration::from_millis(20))));
        let w2 = std::sync::Arc::clone(&w);
        let got = rt.block_on(async move {
            let wait = tokio::spawn(async move { w2.reached(2, Duration::from_secs(10)).await });
            tokio::time::sleep(Duration::from_millis(10)).await;
            w.advance(3);
            wait.await
        });
        assert!(matches!(got, Ok(true)));
    }
}
