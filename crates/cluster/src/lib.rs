//! Cluster mode: broker sets of one master and its replicas, RocketMQ 5's
//! controller mode with etcd as the controller (docs/cluster.md,
//! docs/decisions/0004-cluster-on-etcd.md).
//!
//! * [`controller`] — the node's lease, its registration, the set's state
//!   (master, epoch, sync state set) read and changed through etcd
//!   transactions, elections, fencing.
//! * [`stream`] — the CommitLog replication stream from master to replicas.
//! * here — what both share: the role, replica progress, the high
//!   watermark, and the task that keeps the store's read limit and
//!   acknowledgements at it.

pub mod config;
pub mod controller;
pub mod stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rokka_broker::cluster_view::ClusterView;
use rokka_broker::remote::Table;
use rokka_broker::Broker;
use rokka_store::MessageStore;

pub use config::{ClusterConfig, ReplicationMode};

/// This node's part in its set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not yet known (starting, or etcd unreachable).
    Unknown,
    Master {
        epoch: u32,
    },
    Replica {
        master: u32,
        epoch: u32,
    },
    /// Was master and lost its lease or its set elected another: takes no
    /// writes until the controller says what it is.
    Fenced,
}

impl Role {
    fn code(&self) -> f64 {
        match self {
            Role::Unknown => 0.0,
            Role::Master { .. } => 1.0,
            Role::Replica { .. } => 2.0,
            Role::Fenced => 3.0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Progress {
    /// Log end the replica acknowledged (its last fetch offset).
    end: u64,
    /// Last time it held everything the master's log had (Kafka's
    /// lastCaughtUpTime).
    caught_up_at: Instant,
    connected: bool,
    /// Which stream the replica's progress comes from (a replica that
    /// reconnects has a new one; the old stream's end does not touch it).
    stream: u64,
}

/// State the controller, the stream and the watermark task share.
pub struct Shared {
    pub cfg: ClusterConfig,
    pub store: Arc<MessageStore>,
    pub broker: Arc<Broker>,
    role: Mutex<Role>,
    /// The sync state set acknowledgements wait for (master included):
    /// etcd's, and on a master the replicas gated to join it.
    sss: Mutex<Vec<u32>>,
    /// The sync state set etcd names (who may be elected; Kafka's ISR,
    /// `min_insync_replicas`): `sss` may hold replicas gated to join it.
    named: Mutex<Vec<u32>>,
    /// The sync state set holds this node alone (read on every append).
    alone: std::sync::atomic::AtomicBool,
    replicas: Mutex<HashMap<u32, Progress>>,
    /// Replication streams opened (each replica stream's token).
    streams: AtomicU64,
    /// HELLO proofs taken within the last two proof lifetimes: one seen
    /// again is a replay.
    pub(crate) hellos: Mutex<HashMap<String, Instant>>,
    /// Live nodes' replication addresses.
    addrs: Mutex<HashMap<u32, String>>,
    hw: AtomicU64,
    /// Highest epoch seen from a replica (a master below it steps down).
    newer_epoch: AtomicU32,
    /// When this node's lease may have expired (ms since start).
    pub(crate) lease_valid_until: Mutex<Option<Instant>>,
    /// Woken by every append: replicas' waiting fetches answer at once.
    pub(crate) appended: tokio::sync::Notify,
    /// What each replica holds of the committed-offset table.
    pub(crate) offsets_acks: TableAcks,
    /// What each replica holds of the Kafka groups.
    pub(crate) groups_acks: TableAcks,
    /// Which Kafka transaction state each replica holds.
    pub(crate) txns_acks: TableAcks,
    /// Which queue starts (DeleteRecords) each replica has taken.
    pub(crate) starts_acks: TableAcks,
}

impl Shared {
    pub fn new(cfg: ClusterConfig, store: Arc<MessageStore>, broker: Arc<Broker>) -> Arc<Shared> {
        // Exported from the start, so dashboards and alerts have a series
        // (a master, or a replica not yet connected, lags by nothing known).
        // (Elections are rare: kept from being dropped as idle, so an
        // alert's increase() sees the first after a quiet hour.)
        rokka_store::hot_metrics::keep_exported(&[("rokka_cluster_elections_total", "", "")]);
        metrics::gauge!("rokka_replication_lag_bytes").set(0.0);
        Arc::new(Shared {
            cfg,
            store,
            broker,
            role: Mutex::new(Role::Unknown),
            sss: Mutex::new(Vec::new()),
            named: Mutex::new(Vec::new()),
            alone: std::sync::atomic::AtomicBool::new(true),
            replicas: Mutex::new(HashMap::new()),
            streams: AtomicU64::new(0),
            hellos: Mutex::new(HashMap::new()),
            addrs: Mutex::new(HashMap::new()),
            hw: AtomicU64::new(0),
            newer_epoch: AtomicU32::new(0),
            lease_valid_until: Mutex::new(None),
            appended: tokio::sync::Notify::new(),
            offsets_acks: TableAcks::default(),
            groups_acks: TableAcks::default(),
            txns_acks: TableAcks::default(),
            starts_acks: TableAcks::default(),
        })
    }

    pub fn role(&self) -> Role {
        *self.role.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the role and what the store allows with it.
    pub(crate) fn set_role(&self, role: Role) {
        let mut r = self.role.lock().unwrap_or_else(|p| p.into_inner());
        if *r == role {
            return;
        }
        tracing::warn!(from = ?*r, to = ?role, "cluster role changed");
        *r = role;
        metrics::gauge!("rokka_cluster_role").set(role.code());
        match role {
            Role::Master { epoch } => {
                metrics::gauge!("rokka_cluster_epoch").set(f64::from(epoch));
                self.replicas.lock().unwrap_or_else(|p| p.into_inner()).clear();
                self.offsets_acks.forget_all();
                self.groups_acks.forget_all();
                self.txns_acks.forget_all();
                self.starts_acks.forget_all();
                // What was visible as a replica stays visible; the watermark
                // moves on as the replicas reconnect and fetch.
                let visible = self.store.high_watermark().unwrap_or(0).min(self.store.log_end());
                self.hw.store(visible, Ordering::Release);
                // Acknowledgements start again from what is visible: a
                // value left from an earlier term (before a truncation)
                // would answer writes no replica holds.
                self.store.set_acked(visible);
                self.broker.became_master();
                self.store.require_replica_acks(match self.cfg.replication {
                    ReplicationMode::Sync => Some(self.cfg.replication_timeout_ms),
                    ReplicationMode::Async => None,
                });
                self.store.set_leader(true);
            }
            Role::Replica { epoch, .. } => {
                metrics::gauge!("rokka_cluster_epoch").set(f64::from(epoch));
                self.store.set_leader(false);
            }
            Role::Unknown | Role::Fenced => self.store.set_leader(false),
        }
        drop(r);
        // A replica again: the master's writes are taken.
        if matches!(role, Role::Replica { .. }) {
            self.store.follow_master();
        }
        if !matches!(role, Role::Master { .. }) {
            // Waits for the replicas to hold a table end now (no longer
            // master): a commit or a group change in flight is refused at
            // once, as Kafka's coordinator completes pending writes on
            // resignation, not after its whole timeout.
            self.offsets_acks.progress.notify_waiters();
            self.groups_acks.progress.notify_waiters();
            self.txns_acks.progress.notify_waiters();
            self.starts_acks.progress.notify_waiters();
        }
    }

    /// The set acknowledgements wait for: etcd's, and on a master the
    /// replicas gated to join it ([`plan_sss`]).
    pub(crate) fn set_sss(&self, sss: Vec<u32>) {
        self.alone.store(sss.len() <= 1, Ordering::Release);
        *self.sss.lock().unwrap_or_else(|p| p.into_inner()) = sss;
        self.offsets_acks.progress.notify_waiters();
        self.groups_acks.progress.notify_waiters();
        self.txns_acks.progress.notify_waiters();
        self.starts_acks.progress.notify_waiters();
    }

    /// Whether every in-sync replica holds the table `acks` tracks as of
    /// `version`.
    fn held_by_replicas(&self, acks: &TableAcks, version: u64) -> bool {
        let sss = self.sss();
        let h = acks.held.lock().unwrap_or_else(|p| p.into_inner());
        sss.iter()
            .filter(|id| **id != self.cfg.node_id)
            .all(|id| h.get(id).is_some_and(|v| *v >= version))
    }

    fn acks(&self, table: Table) -> &TableAcks {
        match table {
            Table::Offsets => &self.offsets_acks,
            Table::KafkaGroups => &self.groups_acks,
            Table::KafkaTxns => &self.txns_acks,
            Table::LogStarts => &self.starts_acks,
        }
    }

    pub(crate) fn sss(&self) -> Vec<u32> {
        self.sss.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The set etcd names, as this node last read or wrote it
    /// (`rokka_cluster_sync_state_set_size`).
    pub(crate) fn set_named(&self, sss: Vec<u32>) {
        metrics::gauge!("rokka_cluster_sync_state_set_size").set(sss.len() as f64);
        *self.named.lock().unwrap_or_else(|p| p.into_inner()) = sss;
        self.update_high_watermark();
    }

    pub(crate) fn named(&self) -> Vec<u32> {
        self.named.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set_addrs(&self, addrs: HashMap<u32, String>) {
        *self.addrs.lock().unwrap_or_else(|p| p.into_inner()) = addrs;
    }

    pub(crate) fn node_addr(&self, id: u32) -> Option<String> {
        self.addrs.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    /// Replica `id` has a new stream, its log ending at `end` once the
    /// handshake's cut or restart is done: the token its progress and its
    /// end are reported with (an older stream of the same replica, still
    /// ending, changes nothing after this). A member of the named set that
    /// holds the high watermark keeps its grace (`replica_lag_max_ms` from
    /// when it was last caught up; from now if it had no entry, as after an
    /// election); one that does not — it lost its tail or its disk — is
    /// caught up no more, so the next controller step takes it out of the
    /// set where it could be elected; a replica outside the set shows it
    /// is caught up on this stream.
    pub(crate) fn replica_connected(&self, id: u32, end: u64) -> u64 {
        let stream = self.streams.fetch_add(1, Ordering::AcqRel) + 1;
        let keeps_grace = self.named().contains(&id) && end >= self.high_watermark();
        let long_ago = Instant::now() - Duration::from_secs(3600);
        let mut r = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
        let e = r.entry(id).or_insert(Progress {
            end,
            caught_up_at: if keeps_grace { Instant::now() } else { long_ago },
            connected: true,
            stream,
        });
        e.connected = true;
        e.stream = stream;
        e.end = end;
        if !keeps_grace {
            e.caught_up_at = long_ago;
        }
        stream
    }

    /// Replica `id`, in the sync state set of a master just elected, counts
    /// as connected and caught up for `replica_lag_max_ms` while it
    /// connects — unless its stream is there already (it connected between
    /// the role change and this call): that stream is kept.
    pub(crate) fn expect_replica(&self, id: u32) {
        self.replicas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_insert(Progress {
                end: 0,
                caught_up_at: Instant::now(),
                connected: true,
                // No stream: the first real one takes its place.
                stream: 0,
            });
        self.update_high_watermark();
    }

    /// Stream `stream` of replica `id` ended (nothing if the replica has
    /// a newer one).
    pub(crate) fn replica_disconnected(&self, id: u32, stream: u64) {
        if let Some(p) = self.replicas.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&id) {
            if p.stream == stream {
                p.connected = false;
            }
        }
    }

    /// A fetch from `id` at `end` on stream `stream`; `caught_up`: when
    /// the replica last held everything the master's log had (None: not
    /// known by this fetch). The replica's newest stream reports; an older
    /// one still open reports once the newest has ended (it takes over).
    pub(crate) fn replica_progress(&self, id: u32, stream: u64, end: u64, caught_up: Option<Instant>) {
        {
            let mut r = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = r.get_mut(&id) {
                if p.stream != stream {
                    if p.connected {
                        return;
                    }
                    p.stream = stream;
                    p.connected = true;
                }
                p.end = end;
                if let Some(t) = caught_up {
                    p.caught_up_at = p.caught_up_at.max(t);
                }
            }
        }
        self.update_high_watermark();
    }

    pub(crate) fn saw_newer_epoch(&self, epoch: u32) {
        self.newer_epoch.fetch_max(epoch, Ordering::AcqRel);
    }

    pub(crate) fn newer_epoch(&self) -> u32 {
        self.newer_epoch.load(Ordering::Acquire)
    }

    pub(crate) fn set_replica_lag(&self, bytes: u64) {
        metrics::gauge!("rokka_replication_lag_bytes").set(bytes as f64);
    }

    /// Replicas that are connected and were caught up within
    /// `replica_lag_max_ms`, with the log end their last fetch showed and
    /// how long ago they were caught up: who may be in the sync state set
    /// ([`plan_sss`] decides).
    pub(crate) fn caught_up_replicas(&self) -> Vec<Caught> {
        let max = Duration::from_millis(self.cfg.replica_lag_max_ms);
        let r = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<Caught> = r
            .iter()
            .filter(|(_, p)| p.connected && p.caught_up_at.elapsed() <= max)
            .map(|(id, p)| Caught {
                id: *id,
                end: p.end,
                age: p.caught_up_at.elapsed(),
            })
            .collect();
        ids.sort_unstable_by_key(|c| c.id);
        ids
    }

    /// The master's high watermark: the least log end among the stored sync
    /// state set (the master's own end included).
    pub fn high_watermark(&self) -> u64 {
        self.hw.load(Ordering::Acquire)
    }

    /// Recomputes the high watermark on the master and hands it to the
    /// store (read limit, waiting acknowledgements).
    pub(crate) fn update_high_watermark(&self) {
        if !matches!(self.role(), Role::Master { .. }) {
            return;
        }
        let own = match self.store.config().flush_mode {
            rokka_store::FlushMode::Sync => self.store.commitlog_offsets().2,
            rokka_store::FlushMode::Async => self.store.log_end(),
        };
        let mut hw = own;
        // What counts toward min_insync_replicas is the named set (a
        // gated replica cannot be elected yet); acknowledgements and the
        // watermark wait for the gated ones too.
        let named = self.named.lock().unwrap_or_else(|p| p.into_inner()).len();
        let members = {
            let sss = self.sss.lock().unwrap_or_else(|p| p.into_inner());
            let r = self.replicas.lock().unwrap_or_else(|p| p.into_inner());
            for id in sss.iter().filter(|id| **id != self.cfg.node_id) {
                hw = hw.min(r.get(id).filter(|p| p.connected).map_or(0, |p| p.end));
            }
            if named == 0 {
                sss.len()
            } else {
                named.min(sss.len())
            }
        };
        let too_few = (members as u32) < self.cfg.min_insync_replicas;
        self.store.set_too_few_replicas(too_few);
        self.store.set_in_sync_replicas(members as u32);
        let prev = self.hw.fetch_max(hw, Ordering::AcqRel);
        let hw = hw.max(prev);
        self.store.set_high_watermark(Some(hw));
        if !too_few {
            self.store.set_acked(hw);
        }
        metrics::gauge!("rokka_cluster_high_watermark").set(hw as f64);
    }

    /// Publishes the cluster view the frontends answer from.
    pub(crate) fn publish_view(&self, view: ClusterView) {
        self.broker.set_cluster_view(view);
    }
}

/// A replica the master counts as caught up: its log end as of its last
/// fetch, and how long ago it was last caught up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caught {
    pub id: u32,
    pub end: u64,
    pub age: Duration,
}

/// The sync state set a master wants (`etcd`: what it writes there) and
/// the one its acknowledgements wait for (`local`), from the set etcd
/// names (`current`), the one acknowledgements waited for so far
/// (`gated`), the live nodes, the caught-up replicas and the high
/// watermark.
///
/// A member stays while it is caught up (within `replica_lag_max_ms`: the
/// list holds no other). A replica outside the set must have been caught
/// up within `fresh` (its fetches keep up now: one that fell behind since
/// would hold acknowledgements and the read limit back while it catches
/// up); it is gated first — acknowledgements wait for it too, so the high
/// watermark stops moving past it — and named in etcd (where it may be
/// elected) only once it holds the high watermark: everything acknowledged
/// without it (Apache's `maybeExpandInSyncStateSet` with its synchronizing
/// set). Without the gate a replica behind a busy master would chase a
/// watermark that moves with every append and never join.
pub(crate) fn plan_sss(
    me: u32,
    current: &[u32],
    gated: &[u32],
    live: &[u32],
    caught_up: &[Caught],
    hw: u64,
    fresh: Duration,
) -> (Vec<u32>, Vec<u32>) {
    let mut etcd = vec![me];
    let mut local = vec![me];
    for c in caught_up.iter().filter(|c| c.id != me && live.contains(&c.id)) {
        if current.contains(&c.id) {
            etcd.push(c.id);
            local.push(c.id);
        } else if c.age <= fresh {
            if gated.contains(&c.id) && c.end >= hw {
                etcd.push(c.id);
            }
            local.push(c.id);
        }
    }
    etcd.sort_unstable();
    local.sort_unstable();
    (etcd, local)
}

#[cfg(test)]
mod plan_tests {
    use super::{plan_sss, Caught};
    use std::time::Duration;

    const FRESH: Duration = Duration::from_secs(1);

    fn c(id: u32, end: u64, age_ms: u64) -> Caught {
        Caught {
            id,
            end,
            age: Duration::from_millis(age_ms),
        }
    }

    #[test]
    fn a_replica_joins_the_named_set_only_once_it_holds_the_watermark_after_its_gate() {
        let plan = |current: &[u32], gated: &[u32], live: &[u32], caught: &[Caught]| {
            plan_sss(1, current, gated, live, caught, 1000, FRESH)
        };
        // Caught up just now, behind the watermark, not gated yet: gated.
        assert_eq!(plan(&[1], &[1], &[1, 2], &[c(2, 900, 100)]), (vec![1], vec![1, 2]));
        // Gated, still behind: not named yet.
        assert_eq!(plan(&[1], &[1, 2], &[1, 2], &[c(2, 990, 100)]), (vec![1], vec![1, 2]));
        // Gated and holding the watermark: named.
        assert_eq!(
            plan(&[1], &[1, 2], &[1, 2], &[c(2, 1000, 100)]),
            (vec![1, 2], vec![1, 2])
        );
        // At the watermark but never gated (acknowledgements did not wait
        // for it: the watermark may have passed it meanwhile): gated first.
        assert_eq!(plan(&[1], &[1], &[1, 2], &[c(2, 1000, 100)]), (vec![1], vec![1, 2]));
        // Caught up seconds ago and no longer keeping up: neither gated
        // nor kept gated (it would hold acknowledgements back).
        assert_eq!(plan(&[1], &[1], &[1, 2], &[c(2, 900, 5_000)]), (vec![1], vec![1]));
        assert_eq!(plan(&[1], &[1, 2], &[1, 2], &[c(2, 900, 5_000)]), (vec![1], vec![1]));
        // A member stays while caught up (within replica_lag_max_ms, which
        // is all the list holds); one no longer listed, or not live, leaves
        // both sets.
        assert_eq!(
            plan(&[1, 2], &[1, 2], &[1, 2], &[c(2, 5, 5_000)]),
            (vec![1, 2], vec![1, 2])
        );
        assert_eq!(
            plan(&[1, 2, 3], &[1, 2, 3], &[1, 2, 3], &[c(3, 1000, 10)]),
            (vec![1, 3], vec![1, 3])
        );
        assert_eq!(plan(&[1, 2], &[1, 2], &[1], &[c(2, 1000, 10)]), (vec![1], vec![1]));
    }
}

/// What each replica holds of one state table shipped with the stream,
/// and the requests waiting for it.
#[derive(Debug, Default)]
pub(crate) struct TableAcks {
    /// Per replica: the table version it holds.
    held: Mutex<HashMap<u32, u64>>,
    /// Woken when a replica holds a newer table, or the set changed.
    progress: tokio::sync::Notify,
    /// Requests waiting for the table's replication: it ships at once
    /// rather than at its interval.
    waiters: std::sync::atomic::AtomicUsize,
}

impl TableAcks {
    /// Replica `id` holds the table as of `version`.
    pub(crate) fn held(&self, id: u32, version: u64) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let e = h.entry(id).or_insert(0);
        if version > *e {
            *e = version;
            drop(h);
            self.progress.notify_waiters();
        }
    }

    /// Replica `id` holds nothing of the table (yet).
    pub(crate) fn forget(&self, id: u32) {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// No replica holds anything of this node's table (it just became
    /// master: versions are its own from now on).
    fn forget_all(&self) {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Some request waits for the table to reach the replicas.
    pub(crate) fn awaited(&self) -> bool {
        self.waiters.load(Ordering::Acquire) > 0
    }
}

/// Offset commits and completed rebalances wait on the stream: see
/// [`TableAcks::held`].
#[derive(Debug)]
struct TableReplication(std::sync::Weak<Shared>);

impl rokka_broker::remote::ReplicatedTables for TableReplication {
    fn replicated(
        &self,
        table: Table,
        version: u64,
        within: Option<Duration>,
    ) -> rokka_broker::remote::RemoteCall<'_, ()> {
        Box::pin(async move {
            let sh = self.0.upgrade().ok_or("cluster mode stopped")?;
            let acks = sh.acks(table);
            let wait = Duration::from_millis(sh.cfg.replication_timeout_ms).min(within.unwrap_or(Duration::MAX));
            let deadline = tokio::time::Instant::now() + wait;
            // Counted while waiting, also when the request is dropped
            // mid-wait (its client gone).
            struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
            impl Drop for Waiting<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::AcqRel);
                }
            }
            acks.waiters.fetch_add(1, Ordering::AcqRel);
            let waiting = Waiting(&acks.waiters);
            let res = loop {
                let progress = acks.progress.notified();
                tokio::pin!(progress);
                progress.as_mut().enable();
                if !matches!(sh.role(), Role::Master { .. }) {
                    break Err("no longer master".to_string());
                }
                if sh.held_by_replicas(acks, version) {
                    break Ok(());
                }
                // Replicas' waiting fetches answer now, with the table.
                sh.appended.notify_waiters();
                if tokio::time::timeout_at(deadline, progress).await.is_err() {
                    break Err(format!("replicas did not confirm within {} ms", wait.as_millis()));
                }
            };
            drop(waiting);
            let result = if res.is_ok() { "replicated" } else { "failed" };
            match table {
                Table::Offsets => metrics::counter!("rokka_cluster_offset_commits_total", "result" => result),
                Table::KafkaGroups => metrics::counter!("rokka_cluster_group_syncs_total", "result" => result),
                Table::KafkaTxns => metrics::counter!("rokka_cluster_transaction_syncs_total", "result" => result),
                Table::LogStarts => metrics::counter!("rokka_cluster_delete_records_total", "result" => result),
            }
            .increment(1);
            res
        })
    }
}

/// Starts cluster mode: the controller, the replication listener and the
/// follower, and the watermark task. Client writes are refused until the
/// controller has made this node its set's master.
pub async fn start(
    cfg: ClusterConfig,
    store: Arc<MessageStore>,
    broker: Arc<Broker>,
    me: rokka_broker::cluster_view::NodeInfo,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, std::net::SocketAddr), String> {
    cfg.validate()?;
    // TLS on the replication stream: the same certificate serves replicas
    // (as master) and is shown to the master (as replica).
    let (acceptor, connector) = if cfg.replication_tls() {
        let (cert, key, ca) = (
            std::path::Path::new(&cfg.replication_certificate),
            std::path::Path::new(&cfg.replication_key),
            std::path::Path::new(&cfg.replication_ca),
        );
        let acceptor = rokka_broker::tls::acceptor(cert, key, Some(ca))
            .map_err(|e| format!("cluster.replication_certificate: {e}"))?;
        let connector =
            rokka_broker::tls::connector(cert, key, ca).map_err(|e| format!("cluster.replication_certificate: {e}"))?;
        (Some(acceptor), Some(connector))
    } else {
        (None, None)
    };
    store.set_leader(false);
    let listener = tokio::net::TcpListener::bind(cfg.replication_listen)
        .await
        .map_err(|e| format!("replication listener {}: {e}", cfg.replication_listen))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let host = if cfg.advertised_host.is_empty() {
        bound.ip().to_string()
    } else {
        cfg.advertised_host.clone()
    };
    let mut me = me;
    me.replication = format!("{host}:{}", bound.port());
    tracing::info!(
        listen = %bound,
        node = cfg.node_id,
        set = %cfg.broker_set,
        tls = cfg.replication_tls(),
        "cluster mode: replication listener"
    );
    broker.set_own_set(&cfg.broker_set);
    let shared = Shared::new(cfg, Arc::clone(&store), broker);
    let weak = Arc::downgrade(&shared);
    shared
        .broker
        .set_replicated_tables(Arc::new(TableReplication(Arc::downgrade(&shared))));
    store.set_append_listener(move || {
        if let Some(sh) = weak.upgrade() {
            sh.appended.notify_waiters();
            // Alone in the sync state set, the master's own end is the
            // high watermark: no fetch will come to move it.
            if sh.alone.load(Ordering::Acquire) {
                sh.update_high_watermark();
            }
        }
    });
    let controller = controller::Controller::connect(Arc::clone(&shared), me).await?;
    shared.broker.set_cluster_topics(Arc::new(controller.topic_creator()));
    shared.broker.users().changes().join_cluster();
    shared.broker.acls().join_cluster();
    shared.broker.sub_groups().changes().join_cluster();
    let mut tasks = Vec::new();
    tasks.push(tokio::spawn(stream::serve(
        listener,
        Arc::clone(&shared),
        acceptor,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(stream::follow(
        Arc::clone(&shared),
        connector,
        stop.clone(),
    )));
    tasks.push(tokio::spawn(controller.run(stop.clone())));
    let sh = Arc::clone(&shared);
    let mut st = stop.clone();
    tasks.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => sh.update_high_watermark(),
                _ = st.changed() => return,
            }
        }
    }));
    Ok((tasks, bound))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rokka_broker::remote::ReplicatedTables;

    /// A master whose in-sync replica never confirms: a wait bounded by
    /// `within` ends then (not at the replication timeout), is counted as
    /// a failure, and leaves no waiter behind; a replica's confirmation
    /// ends it at once.
    #[test]
    fn table_waits_end_at_the_shorter_bound() -> std::result::Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(MessageStore::open(rokka_store::StoreConfig {
            commitlog_segment_bytes: 8 << 20,
            ..rokka_store::StoreConfig::for_tests(dir.path())
        })?);
        let broker = Arc::new(Broker::new(Arc::clone(&store), Default::default())?);
        let cfg = ClusterConfig {
            node_id: 1,
            replication_timeout_ms: 20_000,
            ..Default::default()
        };
        let sh = Shared::new(cfg, store, broker);
        sh.set_role(Role::Master { epoch: 1 });
        sh.set_sss(vec![1, 2]);
        let tables = TableReplication(Arc::downgrade(&sh));
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        let t = std::time::Instant::now();
        let r = rt.block_on(tables.replicated(Table::Offsets, 1, Some(Duration::from_millis(300))));
        let took = t.elapsed();
        assert!(r.is_err(), "{r:?}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert!(!sh.offsets_acks.awaited(), "a waiter left behind");
        // Replica 2 confirms version 1 while the wait runs: it ends then.
        let confirm = {
            let sh = Arc::clone(&sh);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                sh.offsets_acks.held(2, 1);
            })
        };
        let t = std::time::Instant::now();
        let r = rt.block_on(tables.replicated(Table::Offsets, 1, Some(Duration::from_secs(10))));
        let took = t.elapsed();
        confirm.join().map_err(|_| "confirming thread panicked")?;
        assert!(r.is_ok() && took < Duration::from_secs(5), "{r:?} after {took:?}");
        assert!(!sh.offsets_acks.awaited());
        // A wait dropped midway (its client gone) leaves no waiter either.
        let dropped = rt.block_on(async {
            tokio::time::timeout(
                Duration::from_millis(50),
                tables.replicated(Table::Offsets, 2, Some(Duration::from_secs(10))),
            )
            .await
        });
        assert!(dropped.is_err(), "{dropped:?}");
        assert!(!sh.offsets_acks.awaited(), "a dropped wait left its waiter");
        // Deposed while a wait runs: it ends then, refused.
        let depose = {
            let sh = Arc::clone(&sh);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                sh.set_role(Role::Fenced);
            })
        };
        let t = std::time::Instant::now();
        let r = rt.block_on(tables.replicated(Table::Offsets, 3, Some(Duration::from_secs(10))));
        let took = t.elapsed();
        depose.join().map_err(|_| "deposing thread panicked")?;
        assert!(r.is_err() && took < Duration::from_secs(5), "{r:?} after {took:?}");
        Ok(())
    }
}
