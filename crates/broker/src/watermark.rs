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

/// Cluster mode: the changes this node made to a cluster-wide table keyed
/// by name (users, subscription-group configs) that etcd may not hold yet:
/// the names changed since the controller last took them, each change's
/// sequence number, and how far etcd holds them. On a single node nothing
/// is queued and nothing waits.
#[derive(Debug, Default)]
pub struct KeyedChanges {
    changed: std::sync::Mutex<Changed>,
    in_cluster: std::sync::atomic::AtomicBool,
    written: Watermark,
}

#[derive(Debug, Default)]
struct Changed {
    names: std::collections::BTreeSet<String>,
    queued: u64,
    /// Names the controller took and has not written yet (counted against
    /// the limit: a write that keeps failing hands them back).
    taken: usize,
}

impl KeyedChanges {
    fn lock(&self) -> std::sync::MutexGuard<'_, Changed> {
        self.changed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The table is the cluster's from now on: changes are queued.
    pub fn join_cluster(&self) {
        self.in_cluster.store(true, Ordering::Release);
    }

    pub fn in_cluster(&self) -> bool {
        self.in_cluster.load(Ordering::Acquire)
    }

    /// `name` changed here (cluster mode: queued for etcd, numbered).
    pub fn note(&self, name: &str) {
        if self.in_cluster() {
            let mut c = self.lock();
            c.names.insert(name.to_string());
            c.queued += 1;
        }
    }

    /// Whether a change of `names` may be queued: fewer than `limit` names
    /// wait for etcd, or all of these already do (while etcd is away changes
    /// pile up here: a deletion of any name is queued, held here or not).
    /// One change of many names is let in whole below the limit, so the
    /// queue stays under twice it; always true on a single node.
    pub fn has_room(&self, names: &[String], limit: usize) -> bool {
        if !self.in_cluster() {
            return true;
        }
        let c = self.lock();
        c.names.len() + c.taken < limit || names.iter().all(|n| c.names.contains(n))
    }

    /// The names changed since the last call, and the sequence number of
    /// the last change (for [`KeyedChanges::written_up_to`]).
    pub fn take(&self) -> (std::collections::BTreeSet<String>, u64) {
        let mut c = self.lock();
        c.taken = c.names.len();
        (std::mem::take(&mut c.names), c.queued)
    }

    /// Names whose write to etcd failed, to try again.
    pub fn rechange(&self, names: impl IntoIterator<Item = String>) {
        let mut c = self.lock();
        c.names.extend(names);
        c.taken = 0;
    }

    /// Names changed here and not taken yet (the cluster's copy does not
    /// replace them meanwhile).
    pub fn pending(&self) -> std::collections::BTreeSet<String> {
        self.lock().names.clone()
    }

    /// Etcd holds every change up to sequence number `seq`.
    pub fn written_up_to(&self, seq: u64) {
        self.lock().taken = 0;
        self.written.advance(seq);
    }

    /// The sequence number of the last change made here (0 on a single
    /// node): what [`KeyedChanges::replicated`] waits for.
    pub fn last_change(&self) -> u64 {
        match self.in_cluster() {
            true => self.lock().queued,
            false => 0,
        }
    }

    /// Whether etcd holds every change up to `seq` within `within` (at
    /// once on a single node).
    pub async fn replicated(&self, seq: u64, within: Duration) -> bool {
        self.written.reached(seq, within).await
    }
}

/// Names changed and their records now (None: deleted).
pub type Changes<R> = Vec<(String, Option<R>)>;

/// A cluster-wide table keyed by name, kept on each node and in etcd
/// (`<cluster prefix><PREFIX><name>`, one JSON record per name; the last
/// writer wins per name), which the controller syncs each tick: the
/// changes made here go to etcd, then etcd's table replaces this node's.
pub trait KeyedClusterTable {
    type Record: serde::Serialize + serde::de::DeserializeOwned + Clone + Send;
    /// The etcd key prefix under the cluster's (`users/`).
    const PREFIX: &'static str;
    /// What a record is, for logs and errors (`user`).
    const WHAT: &'static str;
    fn changes(&self) -> &KeyedChanges;
    /// `name`'s record now (None: deleted).
    fn record(&self, name: &str) -> Option<Self::Record>;
    /// The cluster's table replaces this node's, but for names changed
    /// here and not written yet ([`KeyedChanges::pending`]); kept on disk.
    fn replace_from_cluster(
        &self,
        cluster: std::collections::BTreeMap<String, Self::Record>,
    ) -> crate::error::Result<()>;

    /// The names changed here since the last call, with their record now,
    /// for the controller to write, and the last change's sequence number.
    fn take_changes(&self) -> (Changes<Self::Record>, u64) {
        let (names, upto) = self.changes().take();
        let changes = names
            .into_iter()
            .map(|n| {
                let r = self.record(&n);
                (n, r)
            })
            .collect();
        (changes, upto)
    }
}

/// `cluster` with this node's own unwritten changes (`pending`, looked up
/// in `mine`) laid over it: what [`KeyedClusterTable::replace_from_cluster`]
/// installs.
pub fn with_pending<R: Clone>(
    mut cluster: std::collections::BTreeMap<String, R>,
    mine: &std::collections::BTreeMap<String, R>,
    pending: &std::collections::BTreeSet<String>,
) -> std::collections::BTreeMap<String, R> {
    for name in pending {
        match mine.get(name) {
            Some(r) => cluster.insert(name.clone(), r.clone()),
            None => cluster.remove(name),
        };
    }
    cluster
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
