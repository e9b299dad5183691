//! Message semantics over the store, shared by both protocol frontends:
//! the topic table (creation, auto-creation policy, partition counts) and
//! appends that wake the long polls waiting on their queue.
//!
//! Frontends call this layer; neither reaches into the store's files.

pub mod acl;
pub mod arrivals;
pub mod cluster_view;
pub mod compaction;
pub mod config;
pub mod convert;
pub mod dynamic;
pub mod error;
pub use rokka_store::hot_metrics;
pub mod internal;
pub mod json_file;
pub mod kafka_txn;
pub mod limits;
pub mod membership;
pub mod pop;
pub mod producers;
pub mod remote;
pub mod schedule;
pub mod scrape;
pub mod sub_groups;
pub mod timer;
pub mod tls;
pub mod topic_config;
pub mod topics;
pub mod traffic;
pub mod transaction;
pub mod users;
pub mod validate;
pub mod watermark;

use std::sync::Arc;

use rokka_store::{AppendResult, MessageInput, MessageStore};

pub use arrivals::Arrivals;
pub use config::BrokerConfig;
pub use error::{BrokerError, Result};
pub use producers::{ProducerLimits, ProducerStates, SequenceCheck};
pub use topics::{Located, Placed, QueueRef, TopicInfo, TopicTable};

/// Topics one node created, changed (partitions added, configs) or
/// deleted, for the cluster controller.
#[derive(Debug, Default, Clone)]
pub struct TopicChanges {
    pub created: std::collections::BTreeSet<String>,
    pub changed: std::collections::BTreeSet<String>,
    pub deleted: std::collections::BTreeSet<String>,
    /// The topic id of each deleted topic: the incarnation every node
    /// drops the stored queues of (a tombstone in etcd).
    pub deleted_ids: std::collections::BTreeMap<String, [u8; 16]>,
}

/// Topics the broker writes itself and reads back as its own state (delay
/// levels, the timer wheel, transactions) or that RocketMQ reserves: no
/// client may send to them, whatever its protocol — RocketMQ's
/// `TopicValidator.isNotAllowedSendTopic` (answered NO_PERMISSION), as Kafka
/// refuses appends to its internal topics. A record sent there would be
/// read back as the broker's own (an op record marking other producers'
/// half messages resolved, a delay record with any real topic).
pub fn is_send_forbidden_topic(name: &str) -> bool {
    [
        schedule::SCHEDULE_TOPIC,
        transaction::HALF_TOPIC,
        transaction::OP_TOPIC,
        transaction::CHECK_MAX_TOPIC,
        timer::TIMER_TOPIC,
        timer::TIMER_OP_TOPIC,
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
    ]
    .contains(&name)
}

/// Topics each broker set holds whole for itself, as every Apache broker
/// makes its own: the broker's own topics (delay levels, the timer wheel,
/// transactions' half and op records) and a group's retry and dead-letter
/// topics, written on the set that took the message. With several sets
/// each set holds all of such a topic's queues (its Kafka partitions are
/// every set's in turn); see [`Broker::ensure_own_topic`].
pub fn is_per_set_topic(name: &str) -> bool {
    is_send_forbidden_topic(name) || name.starts_with("%RETRY%") || name.starts_with("%DLQ%")
}

/// Topics only the broker reads and writes (its own state: delay levels,
/// the timer wheel, transactions' half and op records, and every
/// `rmq_sys_` name, as RocketMQ's `TopicValidator.isSystemTopic`): a
/// client of any protocol gets at them only through an ACL naming them —
/// `allow_everyone_if_no_acl_found` does not open them (they hold other
/// topics' pending, delayed and uncommitted messages) — and the gRPC
/// service refuses them outright (Apache's proxy: ILLEGAL_TOPIC, "cannot
/// access system topic").
pub fn is_system_topic(name: &str) -> bool {
    is_send_forbidden_topic(name) || name.starts_with("rmq_sys_")
}

/// Consumer groups the broker keeps its own progress under (the
/// transaction check's `CID_RMQ_SYS_TRANS` and every `CID_RMQ_SYS_` name,
/// as RocketMQ's `MixAll.isSysConsumerGroup`; the delay levels'
/// `%SCHEDULE%`): a client committing under one would move the broker's
/// progress (unchecked transactions, skipped delays). Treated as
/// [`is_system_topic`] topics are.
pub fn is_system_group(name: &str) -> bool {
    name.starts_with("CID_RMQ_SYS_") || name == schedule::PROGRESS_GROUP
}

/// Runs `f`, which may block on the disk (file creation, fsync, a topic
/// table write), without stalling the async tasks that share its worker
/// thread: on a multi-threaded runtime the worker hands its other tasks
/// off first (`block_in_place`); elsewhere (tests, a current-thread
/// runtime) it simply runs. Appends need not be wrapped: the store offloads
/// its own slow steps ([`rokka_store::offload`]).
pub fn offload<R>(f: impl FnOnce() -> R) -> R {
    rokka_store::offload(f)
}

/// How long a topic deleted here is not looked up in etcd's table (its
/// deletion reaches etcd with the controller's next sync).
const DELETED_LATELY: std::time::Duration = std::time::Duration::from_secs(30);

/// Why [`Broker::look_up_cluster_topic`] has no record for a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupMiss {
    /// etcd's table does not hold it (or holds it without a placement in a
    /// cluster of several sets).
    Absent,
    /// Reading etcd failed.
    Error,
    /// Reading etcd took longer than allowed.
    Timeout,
    /// Every lookup permit was taken: nothing was read.
    Busy,
}

impl LookupMiss {
    /// The `result` label of the lookup metrics for an outcome of
    /// [`Broker::look_up_cluster_topic`]: `found`, or the miss's.
    pub fn outcome_label(outcome: &std::result::Result<TopicInfo, LookupMiss>) -> &'static str {
        match outcome {
            Ok(_) => "found",
            Err(miss) => miss.label(),
        }
    }

    /// The `result` label of the lookup metrics.
    pub fn label(self) -> &'static str {
        match self {
            LookupMiss::Absent => "absent",
            LookupMiss::Error => "error",
            LookupMiss::Timeout => "timeout",
            LookupMiss::Busy => "busy",
        }
    }

    /// No further lookups are worth making for the same request: none can
    /// start, or its time is up.
    pub fn ends_request(self) -> bool {
        matches!(self, LookupMiss::Timeout | LookupMiss::Busy)
    }
}

/// The broker: store + topic table + wake-ups.
/// What the lag scrapes show: per queue and summed per (group, topic).
#[derive(Debug, Default)]
struct LagSeries {
    queues: Vec<(String, String, u32, u64)>,
    sums: Vec<(String, String, u64)>,
}

#[derive(Debug)]
pub struct Broker {
    store: Arc<MessageStore>,
    topics: TopicTable,
    arrivals: Arc<Arrivals>,
    producers: ProducerStates,
    membership: membership::Membership,
    transactions: transaction::Transactions,
    timers: timer::Timers,
    kafka_txns: kafka_txn::KafkaTxns,
    /// Where transaction checks go (each frontend's producers).
    txn_sinks: std::sync::RwLock<Vec<Arc<dyn transaction::TxnCheckSink>>>,
    users: users::Users,
    acls: acl::Acls,
    /// RocketMQ subscription-group configs an operator set.
    sub_groups: sub_groups::SubscriptionGroups,
    /// The configs of a topic without overrides.
    default_topic_config: std::sync::RwLock<topic_config::Effective>,
    /// Dynamic broker configs (defaults of topic configs).
    dynamic: dynamic::DynamicConfigs,
    /// Cluster mode: the cluster as last seen (None on a single node).
    cluster: std::sync::RwLock<Option<Arc<cluster_view::ClusterView>>>,
    /// Cluster mode, before the first view: leadership is not known yet.
    cluster_pending: std::sync::atomic::AtomicBool,
    /// Cluster mode: topics this node created, changed or deleted that
    /// the controller has not yet written to etcd.
    topic_changes: std::sync::Mutex<TopicChanges>,
    /// Cluster mode: topics deleted here lately (until etcd surely has
    /// the deletion), which lookups in etcd's table must not bring back.
    deleted_lately: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Cluster mode: this node's broker set (set once at start).
    own_set: std::sync::OnceLock<String>,
    /// Cluster mode: other sets' committed offsets (set once at start).
    remote_offsets: std::sync::OnceLock<Arc<dyn remote::RemoteOffsets>>,
    /// Cluster mode: the secret this cluster's own calls between sets are
    /// signed with (shared through etcd).
    cluster_secret: std::sync::OnceLock<internal::ClusterSecret>,
    remote_txns: std::sync::OnceLock<Arc<dyn remote::RemoteTxns>>,
    /// Cluster mode: where new topics are created first (etcd).
    cluster_topics: std::sync::OnceLock<Arc<dyn remote::ClusterTopics>>,
    replicated_groups: std::sync::OnceLock<Arc<dyn remote::ReplicatedGroups>>,
    /// Per-topic traffic counters' handles, made once per topic.
    traffic: traffic::Traffic,
    /// Cluster mode: committed offsets' replication to the set's replicas.
    replicated_tables: std::sync::OnceLock<Arc<dyn remote::ReplicatedTables>>,
    /// The last [`Broker::consumer_lag`], rendered at each scrape.
    lag: std::sync::Mutex<LagSeries>,
    /// Delay levels delivered past their committed progress, waiting for
    /// the set's replicas to hold the deliveries: level -> (delivered up
    /// to, log end the deliveries reach). See `Broker::deliver_due`.
    delay_pending: std::sync::Mutex<std::collections::HashMap<u32, (u64, u64)>>,
    /// Kafka batches decoded for RocketMQ readers that took part of them.
    decoded_batches: convert::DecodedBatches,
    config: BrokerConfig,
}

impl Broker {
    /// Loads the topic table and adopts topics the store has but the table
    /// lacks (e.g. written before the table existed), with their queue count.
    pub fn new(store: Arc<MessageStore>, config: BrokerConfig) -> Result<Broker> {
        if config.delay_levels_ms.is_empty()
            || config.delay_levels_ms.len() > 255
            || config.delay_levels_ms.contains(&0)
        {
            return Err(BrokerError::InvalidPartitions(
                "broker.delay_levels_ms must list 1 to 255 delays, each above 0".into(),
            ));
        }
        let topics = TopicTable::load(&store.config().data_dir)?;
        for t in store.topics() {
            if topics.get(&t).is_none() {
                let n = store.queue_ids(&t).last().map_or(1, |q| q + 1);
                topics.create(&t, n)?;
            }
        }
        let arrivals = match store.config().flush_mode {
            rokka_store::config::FlushMode::Async => Arc::new(Arrivals::default()),
            rokka_store::config::FlushMode::Sync => {
                let a = Arc::new(Arrivals::deferred());
                let w = Arc::downgrade(&a);
                store.set_flush_listener(move || {
                    if let Some(a) = w.upgrade() {
                        a.flushed();
                    }
                });
                a
            }
        };
        // Cluster mode: readers see what the high watermark covers; a
        // queue written past it is woken when the watermark reaches it (on
        // a master after its replicas took the records, on a replica when
        // the master's watermark comes) — not at the end of the poll.
        {
            let w = Arc::downgrade(&arrivals);
            store.set_watermark_listener(move |hw| {
                if let Some(a) = w.upgrade() {
                    a.visible_up_to(hw);
                }
            });
            let w = Arc::downgrade(&arrivals);
            let st = Arc::downgrade(&store);
            store.set_replicated_listener(move |topic, queue, end| {
                if let Some(a) = w.upgrade() {
                    a.hold(topic, queue, end, || st.upgrade().and_then(|s| s.high_watermark()));
                }
            });
        }
        let kafka_txns = kafka_txn::KafkaTxns::open(
            &store.config().data_dir,
            kafka_txn::TxnConfig {
                max_timeout_ms: config.transaction_max_timeout_ms as i64,
                id_expiration_ms: config.transactional_id_expiration_ms as i64,
                max_ids: config.max_transactional_ids as usize,
                max_groups_per_txn: config.max_groups_per_transaction.max(1) as usize,
            },
        )?;
        let dynamic = dynamic::DynamicConfigs::load(&store.config().data_dir)?;
        let users = users::Users::open(&store.config().data_dir, config.max_users as usize)?;
        let acls = acl::Acls::open(&store.config().data_dir)?;
        let sub_groups =
            sub_groups::SubscriptionGroups::open(&store.config().data_dir, config.max_subscription_groups as usize)?;
        let b = Broker {
            sub_groups,
            kafka_txns,
            txn_sinks: std::sync::RwLock::new(Vec::new()),
            users,
            acls,
            default_topic_config: std::sync::RwLock::new(topic_config::Effective::resolve(
                &Default::default(),
                store.config(),
            )),
            dynamic,
            cluster: std::sync::RwLock::new(None),
            cluster_pending: std::sync::atomic::AtomicBool::new(false),
            topic_changes: std::sync::Mutex::new(TopicChanges::default()),
            deleted_lately: std::sync::Mutex::new(std::collections::HashMap::new()),
            own_set: std::sync::OnceLock::new(),
            remote_offsets: std::sync::OnceLock::new(),
            cluster_secret: std::sync::OnceLock::new(),
            remote_txns: std::sync::OnceLock::new(),
            cluster_topics: std::sync::OnceLock::new(),
            replicated_groups: std::sync::OnceLock::new(),
            replicated_tables: std::sync::OnceLock::new(),
            store,
            topics,
            arrivals,
            producers: ProducerStates::new(ProducerLimits {
                expiration_ms: config.producer_id_expiration_ms,
                max_states: config.max_producer_states as usize,
            }),
            membership: membership::Membership::default(),
            transactions: transaction::Transactions::default(),
            timers: timer::Timers::default(),
            lag: std::sync::Mutex::new(LagSeries::default()),
            delay_pending: std::sync::Mutex::default(),
            decoded_batches: convert::DecodedBatches::new(config.crossing_cache_bytes),
            traffic: traffic::Traffic::new(config.max_topic_metric_handles as usize),
            config,
        };
        b.rebuild_open_transactions();
        b.refresh_default_topic_config();
        // The store's compacted marks follow the topic table (a crash
        // between the two writes, or a table restored from elsewhere).
        for (name, info) in b.topics.all() {
            let compact =
                !info.configs.is_empty() && topic_config::Effective::resolve(&info.configs, b.store.config()).compact;
            if compact != b.store.is_compacted(&name) {
                b.store.set_compacted(&name, compact)?;
            }
        }
        metrics::gauge!("rokka_topics").set(b.topics.count() as f64);
        Ok(b)
    }

    /// Consumer-group members of both protocols (mixed groups).
    pub fn membership(&self) -> &membership::Membership {
        &self.membership
    }

    pub fn store(&self) -> &Arc<MessageStore> {
        &self.store
    }

    /// Kafka batches decoded for RocketMQ readers that took part of them
    /// ([`convert::kafka_batch_to_rocketmq_cached`]).
    pub fn decoded_batches(&self) -> &convert::DecodedBatches {
        &self.decoded_batches
    }

    /// Per-topic traffic counters (cached handles) for the frontends.
    pub fn traffic(&self) -> &traffic::Traffic {
        &self.traffic
    }

    pub fn topics(&self) -> &TopicTable {
        &self.topics
    }

    /// Wakes the long polls of (topic, queue) after an append to it — in
    /// cluster mode also once the high watermark covers the append.
    pub(crate) fn arrived(&self, topic: &str, queue: u32) {
        self.arrivals.notify(topic, queue);
        if self.store.high_watermark().is_some() {
            // Held whatever the watermark now (hold reads it again once
            // held: a rise between here and there is not missed).
            let store = &self.store;
            self.arrivals
                .hold(topic, queue, self.store.log_end(), || store.high_watermark());
        }
    }

    pub fn arrivals(&self) -> &Arrivals {
        &self.arrivals
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// Creates a topic; `TopicExists` if it is there already.
    pub fn create_topic(&self, name: &str, partitions: u32) -> Result<TopicInfo> {
        self.create_topic_with(name, partitions, Default::default())
    }

    /// Creates a topic with config overrides (already validated by
    /// [`topic_config::validate_all`]).
    pub fn create_topic_with(
        &self,
        name: &str,
        partitions: u32,
        configs: std::collections::BTreeMap<String, String>,
    ) -> Result<TopicInfo> {
        rokka_store::validate_topic(name)?;
        // (The broker's own topics, made on first use — delay levels,
        // transactions, the timer wheel — are not clients' names: never
        // refused, else a transaction could be committed and not marked.)
        let max = self.config.max_topics;
        let capped = max > 0 && !is_send_forbidden_topic(name);
        if capped && self.topics.count() >= max as usize && self.topics.get(name).is_none() {
            metrics::counter!("rokka_topics_refused_total").increment(1);
            return Err(BrokerError::TooManyTopics(max));
        }
        if partitions == 0 || partitions > self.config.max_partitions {
            return Err(BrokerError::InvalidPartitions(format!(
                "{partitions} is outside 1..={}",
                self.config.max_partitions
            )));
        }
        let compact = self.resolve_topic_config(&configs).compact;
        // Several broker sets: the partitions are placed over the sets
        // that take placements; this node holds its own set's queues.
        let (local, placement) = match (self.own_set(), self.cluster_view()) {
            (Some(own), Some(view)) if !view.sets.is_empty() => {
                let sets = view.placeable_sets();
                if sets.is_empty() {
                    return Err(BrokerError::InvalidPartitions(
                        "no broker set takes new topics (every set is draining)".into(),
                    ));
                }
                let mut placement = Vec::with_capacity(partitions as usize);
                if is_per_set_topic(name) {
                    // Every set holds all its queues.
                    let mut sets = sets.clone();
                    sets.sort();
                    sets.dedup();
                    if !sets.iter().any(|s| s == own) {
                        sets.push(own.to_string());
                    }
                    for set in &sets {
                        placement.extend((0..partitions).map(|queue| QueueRef {
                            set: set.clone(),
                            queue,
                        }));
                    }
                } else {
                    TopicInfo::place(name, &mut placement, partitions, &sets);
                }
                let local = placement.iter().filter(|r| r.set == own).count() as u32;
                (local, placement)
            }
            // Cluster mode before the first look at etcd: where the
            // partitions go is not known yet.
            (Some(_), None) => return Err(BrokerError::ClusterNotReady),
            _ => (partitions, Vec::new()),
        };
        let info = TopicTable::new_info(local, configs, placement);
        // Cluster mode: the cluster's table decides first; a topic another
        // node created meanwhile is taken as it is there.
        let mut created_in_cluster = false;
        if let (Some(own), Some(cluster)) = (self.own_set(), self.cluster_topics.get()) {
            match offload(|| cluster.create(name, &info.cluster_form())) {
                Ok(None) => created_in_cluster = true,
                Ok(Some(existing)) => {
                    let existing = existing.local_form(own);
                    if self.topics.get(name).as_ref() != Some(&existing) {
                        self.apply_topic(name, existing)?;
                    }
                    return Err(BrokerError::TopicExists(name.to_string()));
                }
                Err(e) => {
                    tracing::warn!(topic = name, error = e, "creating a topic in the cluster failed");
                    return Err(BrokerError::ClusterNotReady);
                }
            }
        }
        // (The controller may have taken this node's own new record from
        // etcd already: it is still this request's topic.)
        // Checked again under the table's lock (creations at once cannot
        // pass the cap together); not once the cluster's table took it.
        let cap = match capped && !created_in_cluster {
            true => max as usize,
            false => usize::MAX,
        };
        let inserted = offload(|| self.topics.insert_new_within(name, info, cap)).inspect_err(|e| {
            if matches!(e, BrokerError::TooManyTopics(_)) {
                metrics::counter!("rokka_topics_refused_total").increment(1);
            }
        })?;
        if !inserted && !created_in_cluster {
            return Err(BrokerError::TopicExists(name.to_string()));
        }
        if compact {
            offload(|| self.store.set_compacted(name, true))?;
        }
        tracing::info!(topic = name, partitions, here = local, "topic created");
        metrics::gauge!("rokka_topics").set(self.topics.count() as f64);
        if self.cluster_view().is_some() {
            let mut c = self.topic_changes.lock().unwrap_or_else(|p| p.into_inner());
            c.deleted.remove(name);
            c.created.insert(name.to_string());
            drop(c);
            self.deleted_lately
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name);
        }
        self.topics
            .get(name)
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_string()))
    }

    /// Cluster mode: this node's broker set.
    pub fn own_set(&self) -> Option<&str> {
        self.own_set.get().map(String::as_str)
    }

    /// Cluster mode: names this node's broker set (once, at start).
    pub fn set_own_set(&self, set: &str) {
        let _ = self.own_set.set(set.to_string());
    }

    /// Cluster mode: the cluster's topic table new topics go to first.
    pub fn set_cluster_topics(&self, t: Arc<dyn remote::ClusterTopics>) {
        let _ = self.cluster_topics.set(t);
    }

    /// Cluster mode: where `name`'s queues are, as (broker set, queue
    /// count) pairs in placement order, from this node's table; `None`
    /// outside cluster mode or when this node does not know the topic.
    pub fn topic_sets(&self, name: &str) -> Option<Vec<(String, u32)>> {
        let own = self.own_set()?;
        let info = self.topics.get(name)?;
        // A topic without a placement is all on one set: this one only
        // when it is the cluster's only set.
        if info.placement.is_empty() && self.cluster_view().is_none_or(|v| v.sets.len() > 1) {
            return None;
        }
        Some(TopicInfo::sets_of(&info.placement, own, info.partitions))
    }

    /// Cluster mode: a topic this node has not taken from etcd yet (its
    /// table follows etcd every `cluster.poll_interval_ms`), read from the
    /// cluster's table now for a frontend asked about it — a topic created
    /// on another node a moment ago is answered as it is. In this node's
    /// form; a record without a placement (made before sets existed) only
    /// in a one-set cluster. At most as many reads at once as `permits`
    /// has (never waited for: `busy`), each within `within`.
    ///
    /// `None`: not looked up (not cluster mode, no view of the cluster yet,
    /// an invalid name, or a topic deleted here lately that etcd may still
    /// hold); else the record or why not.
    pub async fn look_up_cluster_topic(
        &self,
        name: &str,
        permits: &tokio::sync::Semaphore,
        within: std::time::Duration,
    ) -> Option<std::result::Result<TopicInfo, LookupMiss>> {
        let (Some(own), Some(cluster), Some(view)) = (self.own_set(), self.cluster_topics.get(), self.cluster_view())
        else {
            return None;
        };
        if rokka_store::validate_topic(name).is_err() {
            return None;
        }
        if let Some(at) = self.deleted_lately.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            if at.elapsed() < DELETED_LATELY {
                return None;
            }
        }
        let Ok(_permit) = permits.try_acquire() else {
            return Some(Err(LookupMiss::Busy));
        };
        Some(match tokio::time::timeout(within, cluster.get(name)).await {
            Ok(Ok(Some(info))) if !info.placement.is_empty() || view.sets.len() <= 1 => Ok(info.local_form(own)),
            Ok(Ok(_)) => Err(LookupMiss::Absent),
            Ok(Err(e)) => {
                tracing::debug!(topic = name, error = e, "reading etcd's topic table failed");
                Err(LookupMiss::Error)
            }
            Err(_) => Err(LookupMiss::Timeout),
        })
    }

    /// The Kafka frontend's groups, as replication ships them.
    pub fn set_replicated_groups(&self, g: Arc<dyn remote::ReplicatedGroups>) {
        let _ = self.replicated_groups.set(g);
    }

    /// The Kafka groups to replicate (None: no Kafka frontend).
    pub fn replicated_groups(&self) -> Option<&Arc<dyn remote::ReplicatedGroups>> {
        self.replicated_groups.get()
    }

    /// Cluster mode: how committed offsets and Kafka groups reach the
    /// set's replicas.
    pub fn set_replicated_tables(&self, r: Arc<dyn remote::ReplicatedTables>) {
        let _ = self.replicated_tables.set(r);
    }

    /// Returns once every committed offset so far is held by the set's
    /// in-sync replicas (at once on a single node); an error when they did
    /// not confirm in time (the replication timeout, or `within` when
    /// shorter) or this node is no longer master.
    pub async fn offsets_durable(&self, within: Option<std::time::Duration>) -> std::result::Result<(), String> {
        match self.replicated_tables.get() {
            Some(r) => {
                r.replicated(remote::Table::Offsets, self.store.offsets().changes(), within)
                    .await
            }
            None => Ok(()),
        }
    }

    /// Returns once the Kafka transaction state as of now is held by the
    /// set's in-sync replicas (at once on a single node), as Kafka writes
    /// its transaction log with acks=all; an error as for
    /// [`Broker::offsets_durable`].
    pub async fn txns_durable(&self) -> std::result::Result<(), String> {
        match self.replicated_tables.get() {
            Some(r) => {
                r.replicated(remote::Table::KafkaTxns, self.kafka_txns.changes(), None)
                    .await
            }
            None => Ok(()),
        }
    }

    /// Returns once the queue starts DeleteRecords raised, as of `version`
    /// (the store's count of their changes), are taken by the set's
    /// in-sync replicas (at once on a single node), as Kafka's
    /// DelayedDeleteRecords waits for the followers' low watermarks: a
    /// failover does not bring deleted records back. An error as for
    /// [`Broker::offsets_durable`].
    pub async fn log_starts_durable(
        &self,
        version: u64,
        within: Option<std::time::Duration>,
    ) -> std::result::Result<(), String> {
        match self.replicated_tables.get() {
            Some(r) => r.replicated(remote::Table::LogStarts, version, within).await,
            None => Ok(()),
        }
    }

    /// Returns once the Kafka groups as of now (every rebalance completed
    /// so far) are held by the set's in-sync replicas (at once on a single
    /// node); an error as for [`Broker::offsets_durable`].
    pub async fn groups_durable(&self, within: Option<std::time::Duration>) -> std::result::Result<(), String> {
        match (self.replicated_tables.get(), self.replicated_groups.get()) {
            (Some(r), Some(g)) => r.replicated(remote::Table::KafkaGroups, g.changes(), within).await,
            _ => Ok(()),
        }
    }

    /// Cluster mode: how other sets' committed offsets are reached.
    /// Cluster mode: the secret calls between sets are signed with (set
    /// once, when the node joins).
    pub fn set_cluster_secret(&self, secret: internal::ClusterSecret) {
        let _ = self.cluster_secret.set(secret);
    }

    pub fn cluster_secret(&self) -> Option<&internal::ClusterSecret> {
        self.cluster_secret.get()
    }

    pub fn set_remote_offsets(&self, r: Arc<dyn remote::RemoteOffsets>) {
        let _ = self.remote_offsets.set(r);
    }

    /// Other sets' committed offsets (None: single node, or not wired).
    pub fn remote_offsets(&self) -> Option<&Arc<dyn remote::RemoteOffsets>> {
        self.remote_offsets.get()
    }

    /// Users and their credentials (both protocols).
    pub fn users(&self) -> &users::Users {
        &self.users
    }

    /// RocketMQ subscription-group configs.
    pub fn sub_groups(&self) -> &sub_groups::SubscriptionGroups {
        &self.sub_groups
    }

    /// The ACL table both protocols are authorized against.
    pub fn acls(&self) -> &acl::Acls {
        &self.acls
    }

    /// Cluster mode: how transactions reach other sets' masters.
    pub fn set_remote_txns(&self, r: Arc<dyn remote::RemoteTxns>) {
        let _ = self.remote_txns.set(r);
    }

    /// Other sets' transaction participants (None: single node, or not wired).
    pub fn remote_txns(&self) -> Option<&Arc<dyn remote::RemoteTxns>> {
        self.remote_txns.get()
    }

    /// Where Kafka partition `p` of `topic` lives for this node; None: no
    /// such topic.
    pub fn locate(&self, topic: &str, p: i32) -> Option<Located> {
        self.topics.locate(topic, p, self.own_set())
    }

    fn topic_changed(&self, name: &str) {
        if self.cluster_view().is_some() {
            let mut c = self.topic_changes.lock().unwrap_or_else(|p| p.into_inner());
            c.changed.insert(name.to_string());
        }
    }

    /// Cluster mode: whether a change of `name` waits to be written to etcd
    /// (etcd's older record is not applied over it meanwhile).
    pub fn topic_change_pending(&self, name: &str) -> bool {
        let c = self.topic_changes.lock().unwrap_or_else(|p| p.into_inner());
        c.created.contains(name) || c.changed.contains(name) || c.deleted.contains(name)
    }

    /// Cluster mode: gives a topic created before placements existed (or
    /// before this node knew its cluster) the placement it has in fact:
    /// every partition `p` is queue `p` of this node's set.
    pub fn place_here(&self, name: &str) -> Result<()> {
        let (Some(own), Some(mut info)) = (self.own_set(), self.topics.get(name)) else {
            return Ok(());
        };
        if !info.placement.is_empty() {
            return Ok(());
        }
        info.placement = (0..info.partitions)
            .map(|queue| QueueRef {
                set: own.to_string(),
                queue,
            })
            .collect();
        offload(|| self.topics.upsert(name, info))?;
        self.topic_changed(name);
        Ok(())
    }

    /// The topic, created with `partitions` (or the default) when
    /// auto-creation is on and `allow_create`; `None` otherwise.
    pub fn topic_or_create(
        &self,
        name: &str,
        allow_create: bool,
        partitions: Option<u32>,
    ) -> Result<Option<TopicInfo>> {
        if let Some(t) = self.topics.get(name) {
            return Ok(Some(t));
        }
        if !(allow_create && self.config.auto_create_topics) {
            return Ok(None);
        }
        let n = partitions
            .unwrap_or(self.config.default_partitions)
            .clamp(1, self.config.max_partitions.max(1));
        match self.create_topic(name, n) {
            Ok(t) => Ok(Some(t)),
            Err(BrokerError::TopicExists(_)) => Ok(self.topics.get(name)),
            Err(e) => Err(e),
        }
    }

    /// Deletes a topic and its queues.
    pub fn delete_topic(&self, name: &str) -> Result<()> {
        let id = self.topics.get(name).map(|t| t.topic_id);
        if !self.topics.remove(name)? {
            return Err(BrokerError::UnknownTopic(name.to_string()));
        }
        self.drop_topic_data(name)?;
        tracing::info!(topic = name, "topic deleted");
        metrics::gauge!("rokka_topics").set(self.topics.count() as f64);
        if self.cluster_view().is_some() {
            let mut c = self.topic_changes.lock().unwrap_or_else(|p| p.into_inner());
            c.created.remove(name);
            c.deleted.insert(name.to_string());
            if let Some(id) = id {
                c.deleted_ids.insert(name.to_string(), id);
            }
            drop(c);
            let mut d = self.deleted_lately.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            d.retain(|_, at| now.duration_since(*at) < DELETED_LATELY);
            // Deletions are an operator's (ACL-guarded) requests; a bound
            // all the same.
            if d.len() < 100_000 {
                d.insert(name.to_string(), now);
            }
        }
        Ok(())
    }

    /// Cluster mode: a topic deleted at another node (its incarnation's
    /// tombstone is in etcd) goes here too, with its stored queues and
    /// committed offsets, so a topic made again under the name starts
    /// empty on every set, as a Kafka topic made again does.
    pub fn drop_deleted_topic(&self, name: &str, id: [u8; 16]) -> Result<()> {
        // Only that incarnation: one made anew here since is kept.
        if offload(|| self.topics.remove_if_id(name, id))? {
            offload(|| self.drop_topic_data(name))?;
            tracing::info!(
                topic = name,
                "topic deleted in the cluster: its queues and offsets dropped here"
            );
            metrics::counter!("rokka_cluster_deleted_topics_dropped_total").increment(1);
            metrics::gauge!("rokka_topics").set(self.topics.count() as f64);
        }
        Ok(())
    }

    /// A deleted topic's queues, committed offsets, transaction parts and
    /// traffic counters.
    fn drop_topic_data(&self, name: &str) -> Result<()> {
        self.store.delete_topic(name)?;
        // Its committed offsets go with it (Kafka's coordinator and
        // RocketMQ's deleteTopic drop them): a topic made again under the
        // name starts its groups afresh, not at offsets of the old one.
        let dropped = self.store.offsets().delete_topic(name);
        if dropped > 0 {
            tracing::info!(
                topic = name,
                offsets = dropped,
                "committed offsets of the deleted topic dropped"
            );
        }
        self.forget_topic_transactions(name);
        self.traffic.forget(name);
        Ok(())
    }

    /// Cluster mode: topics created and deleted here since the last call
    /// (the controller writes them to etcd).
    pub fn take_topic_changes(&self) -> TopicChanges {
        std::mem::take(&mut *self.topic_changes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A topic's effective configs (its overrides over the store's).
    /// (Resolved once for topics without overrides, the common case: every
    /// Produce asks.)
    pub fn topic_config(&self, name: &str) -> Option<topic_config::Effective> {
        self.topics.get(name).map(|i| {
            if i.configs.is_empty() {
                self.default_topic_config
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            } else {
                self.resolve_topic_config(&i.configs)
            }
        })
    }

    /// A topic config's value for a topic without its own: this broker's
    /// dynamic value, the cluster's dynamic default, `config/rokka.toml`,
    /// Kafka's default — with where it came from.
    pub fn topic_default(&self, name: &str) -> (String, topic_config::Source) {
        let dynamic = topic_config::spec_of(name)
            .and_then(|s| s.broker_name)
            .and_then(|b| self.dynamic.value(b));
        dynamic.unwrap_or_else(|| topic_config::default_of(name, self.store.config()))
    }

    /// Effective configs of a topic with these overrides.
    pub fn resolve_topic_config(
        &self,
        overrides: &std::collections::BTreeMap<String, String>,
    ) -> topic_config::Effective {
        topic_config::Effective::resolve_with(overrides, |n| self.topic_default(n).0)
    }

    fn refresh_default_topic_config(&self) {
        let eff = self.resolve_topic_config(&Default::default());
        *self.default_topic_config.write().unwrap_or_else(|p| p.into_inner()) = eff;
    }

    /// Cluster mode: sets a topic to what etcd holds (another node
    /// created or changed it). Never deletes stored messages: a topic gone
    /// from etcd leaves this node's table by [`Broker::forget_topic`].
    pub fn apply_topic(&self, name: &str, info: TopicInfo) -> Result<()> {
        if !offload(|| self.topics.upsert(name, info.clone()))? {
            return Ok(());
        }
        let compact = !info.configs.is_empty() && self.resolve_topic_config(&info.configs).compact;
        if compact != self.store.is_compacted(name) {
            offload(|| self.store.set_compacted(name, compact))?;
        }
        tracing::info!(
            topic = name,
            partitions = info.partitions,
            "topic taken from the cluster"
        );
        Ok(())
    }

    /// Cluster mode: drops a topic etcd no longer has from the table (its
    /// queues stay until retention; the master deleted the topic).
    pub fn forget_topic(&self, name: &str) -> Result<()> {
        if offload(|| self.topics.remove(name))? {
            tracing::info!(topic = name, "topic dropped: deleted in the cluster");
        }
        Ok(())
    }

    /// Cluster mode: this node has just become its set's master.
    /// Idempotent producers' states are kept: as a replica it recorded the
    /// batches it replicated ([`ProducerStates::observe`]), as a Kafka
    /// follower does; one it does not hold is rebuilt from the log on
    /// first use.
    pub fn became_master(&self) {
        // Producer ids come from the clock (ms × 1024): ids this node hands
        // out from now on start past any the old master can have given.
        self.producers.reseed_ids();
        // Open transactions' first offsets, from the state the old master
        // shipped and the log it replicated.
        self.rebuild_open_transactions();
        // Timer messages waiting and RocketMQ halves resolved: from the
        // whole log as it is now (a replica's early load missed what it
        // replicated since).
        self.reload_timers();
        self.reload_transaction_state();
    }

    /// Cluster mode: the cluster as last seen (None on a single node).
    pub fn cluster_view(&self) -> Option<Arc<cluster_view::ClusterView>> {
        self.cluster.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the cluster view (crates/cluster, on every change).
    pub fn set_cluster_view(&self, view: cluster_view::ClusterView) {
        let mut v = self.cluster.write().unwrap_or_else(|p| p.into_inner());
        if v.as_deref() != Some(&view) {
            *v = Some(Arc::new(view));
        }
        self.cluster_pending.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Cluster mode starts with no view: until the first one, this node
    /// leads nothing (clients are told to look again, as a Kafka broker
    /// without controller metadata serves no partition).
    pub fn await_cluster_view(&self) {
        if self.cluster_view().is_none() {
            self.cluster_pending.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Whether this node may answer for its partitions as their leader
    /// (ListOffsets, OffsetForLeaderEpoch; Kafka's fetchOnlyFromLeader):
    /// on a single node always; in cluster mode once a view names this
    /// node its set's master.
    pub fn leads_here(&self) -> bool {
        match self.cluster_view() {
            Some(v) => v.is_master(),
            None => !self.cluster_pending.load(std::sync::atomic::Ordering::Acquire),
        }
    }

    /// Cluster mode before the first view (see [`Broker::await_cluster_view`]).
    pub fn cluster_view_pending(&self) -> bool {
        self.cluster_pending.load(std::sync::atomic::Ordering::Acquire) && self.cluster_view().is_none()
    }

    /// Dynamic broker configs (AlterConfigs on a BROKER resource).
    pub fn dynamic_configs(&self) -> &dynamic::DynamicConfigs {
        &self.dynamic
    }

    /// Replaces one set of dynamic broker configs (validated already);
    /// topics without their own value follow at once.
    pub fn set_dynamic_configs(
        &self,
        scope: dynamic::Scope,
        configs: std::collections::BTreeMap<String, String>,
    ) -> Result<()> {
        offload(|| self.dynamic.set(scope, configs))?;
        self.refresh_default_topic_config();
        tracing::info!(?scope, "dynamic broker configs changed");
        Ok(())
    }

    /// Sets a topic's RocketMQ permission and queue counts
    /// (UPDATE_AND_CREATE_TOPIC); None: every queue, read and write.
    pub fn set_rocketmq_topic(&self, name: &str, rocketmq: Option<topics::RocketMqTopic>) -> Result<()> {
        offload(|| self.topics.set_rocketmq(name, rocketmq))?;
        self.topic_changed(name);
        Ok(())
    }

    /// Replaces a topic's config overrides (validated already).
    pub fn set_topic_configs(&self, name: &str, configs: std::collections::BTreeMap<String, String>) -> Result<()> {
        let compact = self.resolve_topic_config(&configs).compact;
        offload(|| self.topics.set_configs(name, configs))?;
        offload(|| self.store.set_compacted(name, compact))?;
        self.topic_changed(name);
        tracing::info!(topic = name, "topic configs changed");
        Ok(())
    }

    /// Applies topics' own `retention.ms` / `retention.bytes` (those
    /// stricter than the store's): each partition's log start moves past
    /// what they exclude, as Kafka deletes a partition's old segments. The
    /// space comes back when the shared CommitLog's segments expire.
    /// Returns how many partitions moved.
    pub fn apply_topic_retention(&self, now_ms: i64) -> usize {
        let store_cfg = self.store.config();
        let mut moved = 0;
        for (name, info) in self.topics.all() {
            let eff = match self.topic_config(&name) {
                Some(e) => e,
                None => continue,
            };
            if !eff.own_retention(store_cfg) {
                continue;
            }
            for q in 0..info.partitions {
                let Some(cq) = self.store.queue(&name, q) else {
                    continue;
                };
                let min = cq.min_offset();
                let mut start = min;
                if eff.retention_ms >= 0 {
                    start = start.max(cq.offset_by_store_time(now_ms.saturating_sub(eff.retention_ms)));
                }
                if eff.retention_bytes >= 0 {
                    start = start.max(start_within_bytes(&cq, eff.retention_bytes as u64));
                }
                if start > min {
                    match self.store.delete_records(&name, q, start) {
                        Ok(_) => {
                            moved += 1;
                            metrics::counter!("rokka_topic_retention_moves_total").increment(1);
                        }
                        Err(e) => tracing::warn!(topic = name, queue = q, error = %e, "topic retention failed"),
                    }
                }
            }
        }
        moved
    }

    /// Raises a topic's partition count.
    pub fn add_partitions(&self, name: &str, partitions: u32) -> Result<()> {
        if partitions > self.config.max_partitions {
            return Err(BrokerError::InvalidPartitions(format!(
                "{partitions} is above max_partitions {}",
                self.config.max_partitions
            )));
        }
        let sets = self.cluster_view().map(|v| v.placeable_sets()).unwrap_or_default();
        offload(|| self.topics.set_partitions(name, partitions, self.own_set(), &sets))?;
        self.topic_changed(name);
        Ok(())
    }

    /// Makes sure `name` (see [`is_per_set_topic`]) has at least `queues`
    /// queues on this node's set: made if missing, grown if short — with
    /// several sets by this set's own queues only (a set that joined after
    /// the topic was made, or a topic placed before it was per set).
    pub fn ensure_own_topic(&self, name: &str, queues: u32) -> Result<()> {
        let have = match self.topics.get(name) {
            Some(t) => t,
            None => match self.create_topic(name, queues) {
                Ok(t) => t,
                Err(BrokerError::TopicExists(_)) => self
                    .topics
                    .get(name)
                    .ok_or_else(|| BrokerError::UnknownTopic(name.to_string()))?,
                Err(e) => return Err(e),
            },
        };
        if have.partitions >= queues {
            return Ok(());
        }
        match self.own_set() {
            Some(own) if !have.placement.is_empty() => {
                let total = have.kafka_partitions() + (queues - have.partitions);
                offload(|| self.topics.set_partitions(name, total, Some(own), &[own.to_string()]))?;
                self.topic_changed(name);
                Ok(())
            }
            _ => self.add_partitions(name, queues),
        }
    }

    fn check_partition(&self, topic: &str, partition: u32) -> Result<()> {
        match self.topics.get(topic) {
            Some(t) if partition < t.partitions => Ok(()),
            Some(_) => Err(BrokerError::UnknownPartition {
                topic: topic.to_string(),
                partition,
            }),
            None => Err(BrokerError::UnknownTopic(topic.to_string())),
        }
    }

    /// Appends one Kafka record batch and wakes readers of its queue.
    pub fn append_kafka_batch(&self, topic: &str, partition: u32, batch: &[u8]) -> Result<AppendResult> {
        self.check_partition(topic, partition)?;
        let r = self.store.append_kafka_batch(topic, partition, batch)?;
        self.arrived(topic, partition);
        Ok(r)
    }

    pub fn producers(&self) -> &ProducerStates {
        &self.producers
    }

    /// Appends a batch after the idempotent-producer sequence check: a
    /// duplicate returns its original base offset without appending.
    /// Returns the verdict, the base offset (None when refused) and the
    /// CommitLog end to wait on for durability (0 when nothing was appended).
    pub fn append_kafka_batch_checked(
        &self,
        topic: &str,
        partition: u32,
        batch: &[u8],
    ) -> Result<(SequenceCheck, Option<u64>, u64)> {
        self.check_partition(topic, partition)?;
        let info = rokka_store::record::kafka::BatchInfo::parse(batch)
            .map_err(|_| BrokerError::Store(rokka_store::StoreError::InvalidBatch("not a magic-2 record batch")))?;
        let mut end = 0;
        let (verdict, base) = self
            .producers
            .check_and_append(&self.store, topic, partition, &info, || {
                let r = self.store.append_kafka_batch(topic, partition, batch)?;
                end = r.end_offset;
                Ok::<u64, BrokerError>(r.queue_offset)
            })?;
        if end > 0 {
            self.arrived(topic, partition);
        } else if matches!(verdict, SequenceCheck::Duplicate(_)) {
            // A retry acknowledged with its original's offset waits, like
            // the original, until that is durable: the original's own answer
            // may not have gone out (or may have failed) yet.
            end = self.store.commitlog_offsets().1;
        }
        Ok((verdict, base, end))
    }

    /// Whether `queue` still starts at offset 0 and that first message is
    /// within the newest `max_ratio_percent` % of physical memory's worth of
    /// CommitLog (Apache's `checkInMemByConsumeOffset`): where a group with
    /// nothing committed starts reading from the start.
    pub fn first_message_in_memory(&self, topic: &str, queue: u32, max_ratio_percent: u32) -> bool {
        let store = &self.store;
        if store.min_offset(topic, queue) != 0 {
            return false;
        }
        let Some(first) = store
            .queue(topic, queue)
            .and_then(|cq| cq.find(0).and_then(|i| cq.entry(i)))
        else {
            return false;
        };
        let (_, end, _) = store.commitlog_offsets();
        let memory = rokka_store::sys::total_memory_bytes().unwrap_or(8 << 30) as f64
            * f64::from(max_ratio_percent.min(100))
            / 100.0;
        (end.saturating_sub(first.phys_offset) as f64) <= memory
    }

    /// Appends RocketMQ messages (all to existing queues) and wakes readers.
    /// Consumer lag of every committed (group, topic, queue): messages between
    /// the committed offset and the queue's end. Kafka and RocketMQ groups
    /// alike (one offset table). Topics that no longer exist are skipped.
    pub fn consumer_lag(&self) -> Vec<(String, String, u32, u64)> {
        self.store
            .offsets()
            .all()
            .into_iter()
            .filter(|(_, t, q, _)| self.topics.get(t).is_some_and(|i| *q < i.partitions))
            .map(|(g, t, q, committed)| {
                let end = self.store.max_offset(&t, q);
                (g, t, q, end.saturating_sub(committed))
            })
            .collect()
    }

    /// Recomputes [`Broker::consumer_lag`] for the next scrapes
    /// (`rokka_consumer_lag`, `rokka_consumer_group_lag`): a deleted group
    /// or topic leaves no series behind.
    /// At most `max_series` of them (0 = all): the largest lags (groups
    /// and their commits come from clients; every one a series, a million
    /// committed offsets made scrapes of hundreds of MB).
    /// The per-topic sums are taken over every queue, before the cut (and
    /// cut to the largest `max_series` themselves).
    pub fn refresh_lag(&self, max_series: usize) {
        let mut queues = self.consumer_lag();
        let mut per_topic: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
        for (g, t, _, n) in &queues {
            *per_topic.entry((g, t)).or_default() += n;
        }
        let mut sums: Vec<(String, String, u64)> = per_topic
            .into_iter()
            .map(|((g, t), n)| (g.to_string(), t.to_string(), n))
            .collect();
        let mut dropped = 0;
        if max_series > 0 && queues.len() > max_series {
            queues.select_nth_unstable_by(max_series - 1, |a, b| b.3.cmp(&a.3));
            dropped += queues.len() - max_series;
            queues.truncate(max_series);
            queues.sort_unstable();
        }
        if max_series > 0 && sums.len() > max_series {
            sums.select_nth_unstable_by(max_series - 1, |a, b| b.2.cmp(&a.2));
            dropped += sums.len() - max_series;
            sums.truncate(max_series);
            sums.sort_unstable();
        }
        metrics::gauge!("rokka_consumer_lag_series_dropped").set(dropped as f64);
        *self.lag.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = LagSeries { queues, sums };
    }

    pub fn append_messages(&self, msgs: &[MessageInput<'_>]) -> Result<Vec<AppendResult>> {
        for m in msgs {
            self.check_partition(m.topic, m.queue_id)?;
        }
        let r = self.store.append_messages(msgs)?;
        for m in msgs {
            self.arrived(m.topic, m.queue_id);
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rokka_store::StoreConfig;

    fn broker(dir: &std::path::Path) -> Result<Broker> {
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
        Broker::new(store, BrokerConfig::default())
    }

    #[test]
    fn cluster_mode_leads_nothing_until_a_view_names_this_node_master() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let b = broker(dir.path())?;
        assert!(b.leads_here() && !b.cluster_view_pending(), "a single node leads");
        b.await_cluster_view();
        assert!(!b.leads_here() && b.cluster_view_pending());
        let mut v = cluster_view::ClusterView {
            self_id: 2,
            master: Some(1),
            ..Default::default()
        };
        b.set_cluster_view(v.clone());
        assert!(!b.leads_here() && !b.cluster_view_pending(), "a replica");
        v.master = Some(2);
        b.set_cluster_view(v);
        assert!(b.leads_here());
        Ok(())
    }

    #[test]
    fn creations_at_once_do_not_pass_max_topics_together() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Arc::new(Broker::new(
            store,
            BrokerConfig {
                max_topics: 40,
                ..BrokerConfig::default()
            },
        )?);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let b = Arc::clone(&b);
                std::thread::spawn(move || {
                    (0..20)
                        .filter(|i| b.create_topic(&format!("race-{t}-{i}"), 1).is_ok())
                        .count()
                })
            })
            .collect();
        let made: usize = threads.into_iter().map(|t| t.join().unwrap_or(usize::MAX)).sum();
        assert!(b.topics().count() <= 40, "{} topics", b.topics().count());
        assert!(made > 0 && made <= 40, "{made}");
        Ok(())
    }

    #[test]
    fn topics_beyond_max_topics_are_refused_until_one_goes() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(
            store,
            BrokerConfig {
                max_topics: 3,
                ..BrokerConfig::default()
            },
        )?;
        let have = b.topics().count();
        for i in have..3 {
            b.create_topic(&format!("t{i}"), 1)?;
        }
        assert!(matches!(
            b.create_topic("one-more", 1),
            Err(BrokerError::TooManyTopics(3))
        ));
        assert!(matches!(
            b.topic_or_create("auto-more", true, None),
            Err(BrokerError::TooManyTopics(3))
        ));
        // An existing name is still "exists", not "too many".
        let existing = b
            .topics()
            .names()
            .into_iter()
            .find(|n| !is_send_forbidden_topic(n))
            .unwrap_or_default();
        assert!(matches!(b.create_topic(&existing, 1), Err(BrokerError::TopicExists(_))));
        b.delete_topic(&existing)?;
        b.create_topic("one-more", 1)?;
        // The broker's own topics, made on first use, are never refused.
        if b.topics().get(transaction::OP_TOPIC).is_none() {
            b.create_topic(transaction::OP_TOPIC, 1)?;
        }
        Ok(())
    }

    #[test]
    fn topics_persist_and_auto_create_follows_policy() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        {
            let b = broker(dir.path())?;
            let t = b.create_topic("orders", 6)?;
            assert_eq!(t.partitions, 6);
            assert!(matches!(b.create_topic("orders", 6), Err(BrokerError::TopicExists(_))));
            assert!(b.topic_or_create("auto", false, None)?.is_none());
            assert_eq!(b.topic_or_create("auto", true, None)?.map(|t| t.partitions), Some(1));
            assert!(matches!(
                b.append_kafka_batch("orders", 6, b"x"),
                Err(BrokerError::UnknownPartition { .. })
            ));
            b.add_partitions("orders", 8)?;
            b.store().close()?;
        }
        let b = broker(dir.path())?;
        assert_eq!(b.topics().get("orders").map(|t| t.partitions), Some(8));
        assert!(b.topics().get("auto").is_some());
        b.delete_topic("auto")?;
        assert!(b.topics().get("auto").is_none());
        Ok(())
    }

    /// etcd's topic table, as a map; counts its reads.
    #[derive(Debug, Default)]
    struct Table {
        topics: std::sync::Mutex<std::collections::HashMap<String, TopicInfo>>,
        gets: std::sync::atomic::AtomicUsize,
    }

    impl remote::ClusterTopics for Table {
        fn create(&self, name: &str, info: &TopicInfo) -> std::result::Result<Option<TopicInfo>, String> {
            let mut t = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            Ok(match t.get(name) {
                Some(existing) => Some(existing.clone()),
                None => {
                    t.insert(name.to_string(), info.clone());
                    None
                }
            })
        }

        fn get<'a>(&'a self, name: &'a str) -> remote::RemoteCall<'a, Option<TopicInfo>> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let found = self.topics.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned();
            Box::pin(async move { Ok(found) })
        }
    }

    /// A node asked about a topic it has not taken from etcd yet reads
    /// etcd's table: in its own form, records without a placement only in
    /// a one-set cluster, bounded by the permits, never for an invalid
    /// name or a topic it deleted itself a moment ago.
    #[test]
    fn topics_not_taken_yet_are_looked_up_in_the_cluster_table() -> std::result::Result<(), Box<dyn std::error::Error>>
    {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = tempfile::tempdir()?;
        let b = broker(dir.path())?;
        b.create_topic("gone", 2)?;
        let table = Arc::new(Table::default());
        let q = |set: &str, queue| QueueRef { set: set.into(), queue };
        let placed = TopicTable::new_info(3, Default::default(), vec![q("a", 0), q("b", 0), q("a", 1)]);
        let unplaced = TopicTable::new_info(4, Default::default(), Vec::new());
        for (name, info) in [("placed", &placed), ("unplaced", &unplaced), ("gone", &unplaced)] {
            table
                .topics
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(name.into(), info.clone());
        }
        let permits = tokio::sync::Semaphore::new(1);
        let within = std::time::Duration::from_secs(1);
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
        let look = |name: &str| rt.block_on(b.look_up_cluster_topic(name, &permits, within));
        // Not in cluster mode: nothing is read.
        assert_eq!(look("placed"), None);
        b.set_own_set("a");
        b.set_cluster_topics(Arc::clone(&table) as Arc<dyn remote::ClusterTopics>);
        let set = |name: &str| cluster_view::SetView {
            name: name.into(),
            ..Default::default()
        };
        b.set_cluster_view(cluster_view::ClusterView {
            set: "a".into(),
            sets: vec![set("a"), set("b")],
            ..Default::default()
        });
        let found = look("placed").ok_or("not looked up")?.map_err(|e| e.label())?;
        assert_eq!((found.partitions, found.kafka_partitions()), (2, 3), "this node's form");
        assert_eq!(
            look("unplaced"),
            Some(Err(LookupMiss::Absent)),
            "no placement, two sets"
        );
        assert_eq!(look("nowhere"), Some(Err(LookupMiss::Absent)));
        assert_eq!(look("bad/name"), None);
        // Deleted here: etcd may hold it until the next sync; not read.
        b.delete_topic("gone")?;
        let reads = table.gets.load(Relaxed);
        assert_eq!(look("gone"), None);
        assert_eq!(table.gets.load(Relaxed), reads);
        // No permit free: busy, nothing read.
        let held = permits.try_acquire()?;
        assert_eq!(look("placed"), Some(Err(LookupMiss::Busy)));
        assert_eq!(table.gets.load(Relaxed), reads);
        drop(held);
        // One set: a record without a placement is all on it.
        b.set_cluster_view(cluster_view::ClusterView {
            set: "a".into(),
            sets: vec![set("a")],
            ..Default::default()
        });
        let found = look("unplaced").ok_or("not looked up")?.map_err(|e| e.label())?;
        assert_eq!(found.kafka_partitions(), 4);
        Ok(())
    }
}

/// The first offset such that the entries from it to the end take at most
/// `limit` bytes.
fn start_within_bytes(cq: &rokka_store::consume_queue::ConsumeQueue, limit: u64) -> u64 {
    let end = cq.max_offset();
    let Some(first) = cq.find(cq.min_offset()) else {
        return end;
    };
    let mut total = 0u64;
    let mut idx = cq.entry_count();
    while idx > first {
        let Some(e) = cq.entry(idx - 1) else { break };
        total += u64::from(e.size);
        if total > limit {
            return cq.entry(idx).map_or(end, |n| n.base_offset);
        }
        idx -= 1;
    }
    cq.min_offset()
}

impl scrape::Collect for Broker {
    fn collect(&self, out: &mut Vec<scrape::Family>) {
        let lag = self.lag.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut per_queue = scrape::Family::gauge(
            "rokka_consumer_lag",
            "queue end offset minus the group's committed offset (Kafka and RocketMQ groups)",
        );
        for (g, t, q, n) in lag.queues.iter() {
            per_queue.push(
                vec![("group", g.clone()), ("topic", t.clone()), ("queue", q.to_string())],
                *n as f64,
            );
        }
        let mut sums = scrape::Family::gauge("rokka_consumer_group_lag", "consumer lag summed over a topic's queues");
        for (g, t, n) in lag.sums.iter() {
            sums.push(vec![("group", g.clone()), ("topic", t.clone())], *n as f64);
        }
        out.push(per_queue);
        out.push(sums);
    }
}

#[cfg(test)]
mod lag_tests {
    use super::*;
    use rokka_store::StoreConfig;

    #[test]
    fn lag_is_queue_end_minus_committed_for_any_group() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("L", 2)?;
        for i in 0..5u8 {
            b.append_messages(&[MessageInput::new("L", 0, &[i], b"")])?;
        }
        store.offsets().commit("kafka-g", "L", 0, 2, "");
        store.offsets().commit("rmq-g", "L", 1, 0, "");
        store.offsets().commit("gone", "Nope", 0, 1, "");
        let mut lag = b.consumer_lag();
        lag.sort();
        assert_eq!(
            lag,
            vec![("kafka-g".into(), "L".into(), 0, 3), ("rmq-g".into(), "L".into(), 1, 0)]
        );
        b.refresh_lag(0);
        let mut fams = Vec::new();
        scrape::Collect::collect(&b, &mut fams);
        let per_queue: Vec<_> = fams[0].samples.iter().map(|(l, v)| (l[0].1.clone(), *v)).collect();
        assert_eq!(fams[0].name, "rokka_consumer_lag");
        assert_eq!(per_queue.len(), 2);
        assert!(per_queue.contains(&("kafka-g".to_string(), 3.0)));
        // A deleted group's series are gone at the next refresh.
        store.offsets().delete_group("kafka-g");
        b.refresh_lag(0);
        let mut fams = Vec::new();
        scrape::Collect::collect(&b, &mut fams);
        assert_eq!(fams[0].samples.len(), 1);
        assert_eq!(fams[1].samples.len(), 1, "per-topic sums follow");
        Ok(())
    }

    /// Past `max_series` only the largest lags are exported.
    #[test]
    fn lag_series_past_the_cap_keep_the_largest() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("L", 1)?;
        for i in 0..50u8 {
            b.append_messages(&[MessageInput::new("L", 0, &[i], b"")])?;
        }
        for g in 0..40u64 {
            store.offsets().commit(&format!("g{g:02}"), "L", 0, g, "");
        }
        b.refresh_lag(3);
        let mut fams = Vec::new();
        scrape::Collect::collect(&b, &mut fams);
        let mut groups: Vec<_> = fams[0].samples.iter().map(|(l, v)| (l[0].1.clone(), *v)).collect();
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            groups,
            vec![("g00".into(), 50.0), ("g01".into(), 49.0), ("g02".into(), 48.0)]
        );
        // The sums over every queue of a topic, cut to the largest too.
        b.create_topic("M", 4)?;
        for q in 0..4 {
            for i in 0..20u8 {
                b.append_messages(&[MessageInput::new("M", q, &[i], b"")])?;
            }
            store.offsets().commit("m", "M", q, 0, "");
        }
        b.refresh_lag(3);
        let mut fams = Vec::new();
        scrape::Collect::collect(&b, &mut fams);
        let sums: Vec<_> = fams[1].samples.iter().map(|(l, v)| (l[0].1.clone(), *v)).collect();
        assert_eq!(sums.len(), 3, "{sums:?}");
        let queues: Vec<_> = fams[0].samples.iter().map(|(l, _)| l[0].1.clone()).collect();
        assert!(
            !queues.contains(&"m".to_string()),
            "no queue of m among the largest: {queues:?}"
        );
        assert!(
            sums.contains(&("m".to_string(), 80.0)),
            "all four queues summed: {sums:?}"
        );
        Ok(())
    }
}
