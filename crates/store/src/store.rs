//! `MessageStore`: append with synchronous dispatch, reads, queries, flush
//! waits and shutdown. Opening (recovery) lives in `recovery.rs`, the
//! background threads in `tasks.rs`.
//!
//! Concurrency: appends serialize on `writer` (one CommitLog writer, queue
//! offsets assigned under it); the index has its own mutex, always taken after
//! `writer`. Reads take no store-wide lock: they follow atomically published
//! positions (see `mapped.rs`). Durability waits block on `flush` only.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use crate::checkpoint::Checkpoint;
use crate::commitlog::{CommitLog, CommitLogWriter};
use crate::config::{FlushMode, StoreConfig};
use crate::consume_queue::{ConsumeQueue, CqEntry};
use crate::error::{Result, StoreError};
use crate::index::IndexService;
use crate::metrics::StoreMetrics;
use crate::offsets::ConsumerOffsets;
use crate::record::{self, kafka, message, properties, DispatchInfo, Entry, MessageInput};
use crate::{now_ms, validate_topic};

/// Told of each (topic, queue) a replicated append wrote to, with the
/// log's end after it.
pub type ReplicatedListener = Box<dyn Fn(&str, u32, u64) + Send + Sync>;

/// Where an append landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendResult {
    /// First logical offset taken (0 for prepared transaction records).
    pub queue_offset: u64,
    /// Logical offsets taken (1 per message, N per Kafka batch, 0 for
    /// prepared / rolled-back transaction records).
    pub count: u32,
    /// CommitLog offset of the entry (the message id's offset part).
    pub phys_offset: u64,
    pub size: u32,
    pub store_timestamp: i64,
    /// CommitLog end after this entry: pass to [`MessageStore::wait_durable`].
    pub end_offset: u64,
}

/// Outcome of a queue read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadStatus {
    /// At least one entry returned.
    Found,
    /// The offset is the queue's end: nothing yet.
    NoNewMessages,
    /// The offset is below the queue's first offset (deleted by retention):
    /// continue at `min_offset`.
    OffsetMoved,
    /// The offset is past the queue's end.
    OffsetOverflow,
    /// No such topic or queue.
    NoSuchQueue,
    /// The entry at `next_offset` failed its check (CRC, or it is not the
    /// record its ConsumeQueue entry points at): it is not served. Counted
    /// in `rokka_store_damaged_entries_total`; `rokka store check` and a
    /// restart's recovery repair what can be repaired.
    Damaged,
}

/// One entry returned by a read: a RocketMQ message or a Kafka batch.
#[derive(Debug, Clone)]
pub struct ReadEntry {
    pub cq: CqEntry,
    /// The whole stored entry, a view of the mapped segment (no copy).
    pub data: Bytes,
}

impl ReadEntry {
    pub fn decode(&self) -> std::result::Result<Entry, record::DecodeError> {
        record::decode_entry(&self.data)
    }

    /// Whether this entry is a stored Kafka batch (by its magic, without
    /// decoding it).
    pub fn is_kafka_batch(&self) -> bool {
        self.data.get(4..8) == Some(&record::kafka::KAFKA_BATCH_MAGIC.to_be_bytes()[..])
    }
}

/// A compacted queue's ranges (see [`MessageStore::dirty_range`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyRange {
    /// The queue's first offset.
    pub start: u64,
    /// Offsets below are in the clean log (`start` when there is none).
    pub clean_end: u64,
    /// The queue's visible end.
    pub end: u64,
    pub clean_bytes: u64,
    /// Stored bytes and entries in `[clean_end, end)`.
    pub dirty_bytes: u64,
    pub dirty_entries: u64,
    /// Store time of the oldest dirty entry.
    pub oldest_dirty_store_ms: Option<i64>,
}

/// Result of [`MessageStore::read`].
#[derive(Debug, Clone)]
pub struct QueueRead {
    pub status: ReadStatus,
    pub entries: Vec<ReadEntry>,
    /// Where the next read should start.
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
}

type QueueMap = HashMap<Arc<str>, HashMap<u32, Arc<ConsumeQueue>>>;

pub(crate) struct Writer {
    pub cl: CommitLogWriter,
    pub queues: QueueMap,
    pub last_store_ts: i64,
    pub last_record: u64,
}

/// Sync-flush bookkeeping: waiters ask, the flusher threads sync and wake
/// the waiters their syncs covered (only those).
pub(crate) struct FlushSync {
    pub requested: Mutex<FlushRequests>,
    pub wake_flusher: Condvar,
}

/// A sync-mode waiter: woken once the flushed position reaches `end`
/// (or the store fails or stops).
pub(crate) struct Waiting {
    pub end: u64,
    pub wake: Wake,
}

pub(crate) enum Wake {
    Task(tokio::sync::oneshot::Sender<()>),
    Thread(std::thread::Thread),
}

impl Waiting {
    fn wake(self) {
        match self.wake {
            // A waiter that gave up (timed out) dropped its receiver.
            Wake::Task(tx) => {
                let _ = tx.send(());
            }
            Wake::Thread(t) => t.unpark(),
        }
    }
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

// Ordered so that a `BinaryHeap` (a max-heap) yields the lowest end first.
impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.end == other.end
    }
}
impl Eq for Waiting {}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.end.cmp(&self.end)
    }
}

/// What the last open found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The previous stop was clean and verified: no scan.
    pub clean: bool,
    /// Where the CommitLog scan started, if one ran.
    pub scanned_from: Option<u64>,
    /// The scan started at the CommitLog's beginning (no usable checkpoint).
    pub full_scan: bool,
    /// Entries re-dispatched to ConsumeQueues and the index.
    pub redispatched: u64,
    /// Where a torn or corrupt tail was cut, if one was.
    pub truncated_at: Option<u64>,
    /// ConsumeQueues found shorter than the last checkpoint recorded (or
    /// missing), after which every queue was rebuilt from the CommitLog.
    pub queues_rebuilt: u64,
    /// Where the last entry the scan found starts (what the next clean
    /// checkpoint names as its last record), if a scan found any.
    pub last_record: Option<u64>,
}

/// What waiters have asked the sync-mode flushers for, and the syncs in
/// flight (see `tasks::sync_flusher`).
#[derive(Debug, Default)]
pub(crate) struct FlushRequests {
    /// Highest CommitLog offset a waiter needs durable.
    pub target: u64,
    /// Waiters that asked since the last sync started.
    pub arrivals: u64,
    /// When the first of them asked.
    pub first_arrival: Option<Instant>,
    /// End of the last range handed to a sync.
    pub issued: u64,
    /// Syncs in flight, oldest first.
    pub in_flight: std::collections::VecDeque<InFlightSync>,
    /// Waiters each recent sync could have covered (its own arrivals plus
    /// those of the syncs in flight when it started): the batch a sync
    /// gathers is their largest, split over the syncs allowed in flight.
    pub recent_waiters: [u64; 4],
    pub recent_next: usize,
    /// Waiters by the end they wait for, lowest first.
    pub waiting: std::collections::BinaryHeap<Waiting>,
    /// Size of `waiting` at which waiters that gave up are dropped from it.
    pub prune_at: usize,
    /// What recent syncs took, µs (a moving average; 0 before the first).
    pub sync_micros: u64,
}

/// Below this many waiters the heap is never pruned.
const PRUNE_FLOOR: usize = 1024;

/// One sync in flight.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InFlightSync {
    pub end: u64,
    /// How far it marks flushed when it and every older one succeeded: its
    /// end, or lower once a cut (`truncate_log`) took bytes it covered.
    pub mark: u64,
    pub waiters: u64,
    /// Finished and succeeded (it may still wait for an older one).
    pub done: bool,
}

impl FlushRequests {
    /// Adds a waiter. Waiters that timed out stay until a sync passes their
    /// end; while syncs stall (a hung disk, no failure) every request that
    /// gives up would leave one behind, so once the heap doubles since the
    /// last pass, tasks that dropped their receiver are dropped from it
    /// (amortised O(1) per waiter; at most twice the live waiters kept).
    pub(crate) fn register(&mut self, w: Waiting) {
        if self.waiting.len() >= self.prune_at.max(PRUNE_FLOOR) {
            self.waiting
                .retain(|w| !matches!(&w.wake, Wake::Task(tx) if tx.is_closed()));
            self.prune_at = self.waiting.len() * 2;
        }
        self.waiting.push(w);
    }

    /// Wakes every waiter whose end is at or below `flushed`.
    pub(crate) fn wake_through(&mut self, flushed: u64) {
        while self.waiting.peek().is_some_and(|w| w.end <= flushed) {
            if let Some(w) = self.waiting.pop() {
                w.wake();
            }
        }
    }

    /// Wakes every waiter (the store failed or stops: each sees why).
    pub(crate) fn wake_all(&mut self) {
        for w in std::mem::take(&mut self.waiting) {
            w.wake();
        }
    }

    /// Records a waiter; true if a flusher should look now (the first
    /// waiter of a batch, which starts the gather window, or the one that
    /// completes the batch), so a batch of N waiters wakes a flusher about
    /// twice rather than N times.
    fn ask(&mut self, end_offset: u64, depth: usize) -> bool {
        self.target = self.target.max(end_offset);
        self.arrivals += 1;
        if self.first_arrival.is_none() {
            self.first_arrival = Some(Instant::now());
            return true;
        }
        self.arrivals == self.batch_goal(depth)
    }

    /// How many waiters a sync waits for (up to the gather window).
    pub(crate) fn batch_goal(&self, depth: usize) -> u64 {
        let most = self.recent_waiters.iter().copied().max().unwrap_or(0);
        most.div_ceil(depth.max(1) as u64).max(1)
    }
}

pub(crate) struct Inner {
    pub config: StoreConfig,
    pub dir: PathBuf,
    pub log: Arc<CommitLog>,
    pub writer: Mutex<Writer>,
    pub queues: RwLock<QueueMap>,
    pub index: Option<Mutex<IndexService>>,
    pub offsets: ConsumerOffsets,
    pub flush: FlushSync,
    pub stop: AtomicBool,
    pub sleep: (Mutex<()>, Condvar),
    pub metrics: StoreMetrics,
    pub closed: AtomicBool,
    pub _lock_file: File,
    pub recovery: RecoveryReport,
    /// Queue starts raised by DeleteRecords, "topic/queue" → offset.
    pub log_starts: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Changes of `log_starts` since open (what replication ships).
    pub log_starts_changes: AtomicU64,
    /// The change of `log_starts` last written to its file (writes take
    /// turns under it).
    pub log_starts_written: Mutex<u64>,
    /// Deleted topics → CommitLog end at deletion (queues.json).
    pub deleted: Mutex<std::collections::BTreeMap<String, u64>>,
    /// Checkpoints (periodic, explicit, at delete and close) take turns:
    /// each writes the same temp files.
    pub checkpoint_lock: Mutex<()>,
    /// Told when the flushed position moves (see `set_flush_listener`).
    pub flush_listener: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Told after each client append (see `set_append_listener`).
    pub append_listener: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Told of the queues a replicated append wrote to (see
    /// `set_replicated_listener`).
    pub replicated_listener: std::sync::OnceLock<ReplicatedListener>,
    /// Told when the high watermark rises (see `set_watermark_listener`).
    pub watermark_listener: std::sync::OnceLock<Box<dyn Fn(u64) + Send + Sync>>,
    /// Damaged reads and index failures, logged at most once a second.
    pub damage_log: crate::LogEvery,
    /// Compacted topics (`compacted/<topic>/COMPACT`).
    pub compacted: RwLock<std::collections::BTreeSet<String>>,
    /// Compacted queues whose dirty range held back a CommitLog segment
    /// retention wanted to delete: the broker compacts them first.
    pub compaction_wanted: Mutex<std::collections::BTreeSet<(String, u32)>>,
    /// Serialises compaction passes' switches with topic deletion.
    pub compaction_lock: Mutex<()>,
    /// Epoch history (cluster mode, `epochs.json`).
    pub epochs: Mutex<Vec<crate::replication::EpochStart>>,
    /// Read limit: the set's high watermark (u64::MAX = none).
    pub hw: std::sync::atomic::AtomicU64,
    /// Client appends are taken (cluster mode: only on the set's master).
    pub leader: AtomicBool,
    /// A master's writes are no longer taken (cluster mode): closed by
    /// `begin_epoch` — a node elected master must not apply a frame its
    /// old master answered late — and opened by `follow_master` when the
    /// node is a replica again.
    pub replica_writes_closed: AtomicBool,
    /// Cluster mode: how far the set's replicas acknowledged (the master's
    /// high watermark); `durable` waits for it when acks are required.
    pub acked: watch::Sender<u64>,
    /// None: `durable` needs no replica (single node, async replication);
    /// Some(ms): it waits that long for the replicas, then times out.
    pub ack_timeout_ms: std::sync::atomic::AtomicU64,
    /// The sync state set is smaller than `min_insync_replicas`: durable
    /// waits fail at once (NOT_ENOUGH_REPLICAS).
    pub too_few_replicas: AtomicBool,
    /// Members of the sync state set, master included (1 on a single
    /// node): what a topic's `min.insync.replicas` is held against.
    pub in_sync_replicas: std::sync::atomic::AtomicU32,
}

/// The store. See the crate docs.
pub struct MessageStore {
    pub(crate) inner: Arc<Inner>,
    pub(crate) threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for MessageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageStore").field("dir", &self.inner.dir).finish()
    }
}

impl Inner {
    /// Runs the append listener, if one is set (outside the writer lock).
    fn appended(&self) {
        if let Some(f) = self.append_listener.get() {
            f();
        }
    }

    pub(crate) fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checked under the writer lock by every append: a close that has
    /// fenced the writer, or a failed write-back, refuses the append before
    /// it takes an offset.
    pub(crate) fn check_writable(&self) -> Result<()> {
        if !self.leader.load(Ordering::Acquire) {
            return Err(StoreError::NotLeader);
        }
        self.check_open_writable()
    }

    /// As [`Inner::check_writable`] without the leader check (replicated
    /// appends on a replica).
    /// For the writes only a replica makes (a master's entries, its cut
    /// and restart points, its epoch history): refused once this node began
    /// an epoch of its own, until it follows a master again.
    pub(crate) fn check_following(&self) -> Result<()> {
        if self.replica_writes_closed.load(Ordering::Acquire) {
            return Err(StoreError::Config(
                "this node began an epoch of its own: a master's writes are no longer taken".into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn check_open_writable(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::ShutDown);
        }
        if let Some(why) = self.log.failure() {
            return Err(StoreError::StorageFailed(why.to_string()));
        }
        Ok(())
    }

    pub(crate) fn all_queues(&self) -> Vec<Arc<ConsumeQueue>> {
        let q = self.queues.read().unwrap_or_else(|p| p.into_inner());
        q.values().flat_map(|m| m.values().cloned()).collect()
    }

    fn max_entry(&self) -> usize {
        self.config.max_message_bytes as usize + 64 * 1024
    }

    /// The queue for (topic, queue), created on first use (writer only).
    pub(crate) fn queue_for(&self, w: &mut Writer, topic: &str, queue_id: u32) -> Arc<ConsumeQueue> {
        self.queue_for_with(w, topic, queue_id, None)
    }

    /// Gets the files the next append to (topic, queue) needs ready before
    /// the writer lock is taken (`ConsumeQueue::prepare`): a new queue is
    /// made here, its first file included, and then entered under the lock.
    pub(crate) fn prepare_queue(&self, topic: &str, queue_id: u32) -> Result<()> {
        self.check_writable()?;
        let existing = self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(topic)
            .and_then(|m| m.get(&queue_id))
            .cloned();
        match existing {
            Some(q) => q.prepare(),
            None => {
                let q = ConsumeQueue::new(
                    &self.dir.join("consumequeue"),
                    Arc::from(topic),
                    queue_id,
                    self.config.consume_queue_entries_per_file,
                );
                q.prepare()?;
                let mut w = self.writer();
                self.queue_for_with(&mut w, topic, queue_id, Some(q));
                Ok(())
            }
        }
    }

    fn queue_for_with(
        &self,
        w: &mut Writer,
        topic: &str,
        queue_id: u32,
        made: Option<ConsumeQueue>,
    ) -> Arc<ConsumeQueue> {
        if let Some(q) = w.queues.get(topic).and_then(|m| m.get(&queue_id)) {
            return Arc::clone(q);
        }
        let topic: Arc<str> = match w.queues.get_key_value(topic) {
            Some((k, _)) => Arc::clone(k),
            None => Arc::from(topic),
        };
        let q = Arc::new(made.unwrap_or_else(|| {
            ConsumeQueue::new(
                &self.dir.join("consumequeue"),
                Arc::clone(&topic),
                queue_id,
                self.config.consume_queue_entries_per_file,
            )
        }));
        w.queues
            .entry(Arc::clone(&topic))
            .or_default()
            .insert(queue_id, Arc::clone(&q));
        self.queues
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .entry(topic)
            .or_default()
            .insert(queue_id, Arc::clone(&q));
        q
    }

    /// Writes the ConsumeQueue entry and index keys of one entry.
    pub(crate) fn dispatch(
        &self,
        q: &ConsumeQueue,
        info: &DispatchInfo,
        topic: &str,
        props: Option<&[u8]>,
    ) -> Result<()> {
        if info.consumable {
            q.append(CqEntry {
                phys_offset: info.phys_offset,
                size: info.size,
                count: info.count,
                base_offset: info.queue_offset,
                tag_code: info.tag_code,
                store_timestamp: info.store_timestamp,
                msg_timestamp: info.msg_timestamp,
            })?;
        }
        if let (Some(index), Some(props), true) = (&self.index, props, info.indexable) {
            let mut idx = index.lock().unwrap_or_else(|p| p.into_inner());
            let max_keys = idx.max_keys();
            let mut n = 0;
            for (t, key) in record::index_keys(topic, props, max_keys) {
                n += 1;
                // The record is published and its offset given: an index
                // that cannot take the key (a new index file that cannot be
                // made) costs the key lookup, not the append. Counted and
                // logged at most once a second.
                if let Err(e) = idx.put(t, key, info.phys_offset, info.store_timestamp) {
                    metrics::counter!("rokka_store_index_failures_total").increment(1);
                    if self.damage_log.ready() {
                        tracing::error!(error = %e, "index entry not written: key lookups miss this message");
                    }
                    break;
                }
            }
            if n >= max_keys {
                let beyond = record::keys_beyond(props, max_keys);
                if beyond > 0 {
                    metrics::counter!("rokka_store_index_keys_dropped_total").increment(beyond as u64);
                }
            }
        }
        Ok(())
    }
}

impl MessageStore {
    /// Opens (and if needed recovers) the store in `config.data_dir`.
    pub fn open(config: StoreConfig) -> Result<MessageStore> {
        crate::fault::init_from_env().map_err(StoreError::Config)?;
        crate::recovery::open(config)
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// What opening the store found and did.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    /// The committed-offset table.
    pub fn offsets(&self) -> &ConsumerOffsets {
        &self.inner.offsets
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            Err(StoreError::ShutDown)
        } else {
            Ok(())
        }
    }

    fn validate_message(&self, m: &MessageInput<'_>) -> Result<()> {
        validate_topic(m.topic)?;
        let limit = self.inner.config.max_message_bytes as usize;
        if m.body.len() > limit {
            return Err(StoreError::MessageTooLarge {
                size: m.body.len(),
                limit,
            });
        }
        if m.properties.len() + message::PROP_CRC_LEN > i16::MAX as usize {
            return Err(StoreError::PropertiesTooLarge(m.properties.len()));
        }
        Ok(())
    }

    /// Appends one RocketMQ message. It is readable when this returns; call
    /// [`MessageStore::wait_durable`] for sync-flush durability.
    pub fn append_message(&self, m: &MessageInput<'_>) -> Result<AppendResult> {
        let mut r = self.append_messages(std::slice::from_ref(m))?;
        r.pop().ok_or(StoreError::ShutDown)
    }

    /// Appends messages in order under one lock (a RocketMQ batch send); each
    /// takes its own record and offset.
    pub fn append_messages(&self, msgs: &[MessageInput<'_>]) -> Result<Vec<AppendResult>> {
        self.check_open()?;
        for m in msgs {
            self.validate_message(m)?;
        }
        let inner = &*self.inner;
        let store_host = inner.config.store_host;
        // Queue files are made before the writer lock is taken.
        for m in msgs.iter().filter(|m| m.is_consumable()) {
            inner.prepare_queue(m.topic, m.queue_id)?;
        }
        // RocketMQ's record-CRC property on every record: recovery checks
        // every byte of a record, not only its body.
        let record_crc = true;
        // CRCs outside the lock, so concurrent producers compute them in parallel.
        let crcs: Vec<u32> = msgs.iter().map(|m| crc32fast::hash(m.body)).collect();
        let mut out = Vec::with_capacity(msgs.len());
        let mut bytes = 0u64;
        {
            let mut w = inner.writer();
            inner.check_writable()?;
            let store_ts = now_ms().max(w.last_store_ts);
            w.last_store_ts = store_ts;
            if msgs.len() > 1 {
                // A batch is stored whole or not at all: the steps that can
                // fail (a segment roll, a queue file to make) are taken
                // before its first record is written — else a producer told
                // of a failure retries a batch partly stored (duplicates).
                w.cl.make_room(
                    msgs.iter()
                        .map(|m| message::encoded_len(m, &store_host, record_crc))
                        .sum(),
                )?;
                let mut per_queue: Vec<(&str, u32, u64)> = Vec::new();
                for m in msgs.iter().filter(|m| m.is_consumable()) {
                    match per_queue.iter_mut().find(|(t, q, _)| *t == m.topic && *q == m.queue_id) {
                        Some(e) => e.2 += 1,
                        None => per_queue.push((m.topic, m.queue_id, 1)),
                    }
                }
                for (topic, queue_id, n) in per_queue {
                    inner.queue_for(&mut w, topic, queue_id).reserve_n(n)?;
                }
            }
            for (m, body_crc32) in msgs.iter().zip(crcs) {
                let q = inner.queue_for(&mut w, m.topic, m.queue_id);
                let consumable = m.is_consumable();
                if consumable {
                    // A queue file that cannot be made fails the append
                    // before its record exists (else recovery would find
                    // a record whose offset was handed out again).
                    q.reserve()?;
                }
                let queue_offset = if consumable { q.max_offset() } else { 0 };
                let size = message::encoded_len(m, &store_host, record_crc);
                let phys = w.cl.append(size, |buf, phys| {
                    let at = message::Placement {
                        queue_offset,
                        phys_offset: phys,
                        store_timestamp: store_ts,
                        body_crc32,
                        record_crc,
                    };
                    message::encode(buf, m, &store_host, at);
                })?;
                w.last_record = phys;
                let end = w.cl.position();
                inner.log.publish(end);
                let info = DispatchInfo {
                    queue_id: m.queue_id,
                    queue_offset,
                    count: u32::from(consumable),
                    phys_offset: phys,
                    size: size as u32,
                    tag_code: properties::tag_code(m.properties),
                    store_timestamp: store_ts,
                    msg_timestamp: m.born_timestamp,
                    consumable,
                    indexable: message::is_indexable(m.sys_flag),
                };
                inner.dispatch(&q, &info, m.topic, Some(m.properties))?;
                bytes += size as u64;
                out.push(AppendResult {
                    queue_offset,
                    count: info.count,
                    phys_offset: phys,
                    size: size as u32,
                    store_timestamp: store_ts,
                    end_offset: end,
                });
            }
        }
        inner.metrics.appends_message.increment(msgs.len() as u64);
        inner.appended();
        inner.metrics.append_bytes.increment(bytes);
        Ok(out)
    }

    /// Appends one Kafka record batch (magic 2) whole; it takes
    /// `lastOffsetDelta + 1` offsets and is stored with its base offset set to
    /// the first. The caller has checked the batch CRC.
    pub fn append_kafka_batch(&self, topic: &str, queue_id: u32, batch: &[u8]) -> Result<AppendResult> {
        self.check_open()?;
        validate_topic(topic)?;
        let limit = self.inner.config.max_message_bytes as usize;
        if batch.len() > limit {
            return Err(StoreError::MessageTooLarge {
                size: batch.len(),
                limit,
            });
        }
        let info =
            kafka::BatchInfo::parse(batch).map_err(|_| StoreError::InvalidBatch("not a magic-2 record batch"))?;
        let inner = &*self.inner;
        let size = kafka::encoded_len(topic, batch.len());
        inner.prepare_queue(topic, queue_id)?;
        let result = {
            let mut w = inner.writer();
            inner.check_writable()?;
            // The epoch it is appended under (0 on a single node; the
            // history changes under the writer lock).
            let epoch = inner
                .epochs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .last()
                .map_or(0, |e| e.epoch as i32);
            let store_ts = now_ms().max(w.last_store_ts);
            w.last_store_ts = store_ts;
            let q = inner.queue_for(&mut w, topic, queue_id);
            q.reserve()?;
            let queue_offset = q.max_offset();
            let count = info.offset_count();
            let phys = w.cl.append(size, |buf, phys| {
                let at = kafka::KafkaPlacement {
                    queue_id,
                    queue_offset,
                    phys_offset: phys,
                    store_timestamp: store_ts,
                    count,
                };
                kafka::encode_at_epoch(buf, topic, batch, at, Some(epoch));
            })?;
            w.last_record = phys;
            let end = w.cl.position();
            inner.log.publish(end);
            let d = DispatchInfo {
                queue_id,
                queue_offset,
                count,
                phys_offset: phys,
                size: size as u32,
                tag_code: 0,
                store_timestamp: store_ts,
                msg_timestamp: record::kafka_msg_timestamp(Some(&info), store_ts),
                consumable: true,
                indexable: true,
            };
            inner.dispatch(&q, &d, topic, None)?;
            AppendResult {
                queue_offset,
                count,
                phys_offset: phys,
                size: size as u32,
                store_timestamp: store_ts,
                end_offset: end,
            }
        };
        inner.metrics.appends_kafka.increment(1);
        inner.appended();
        inner.metrics.append_bytes.increment(size as u64);
        Ok(result)
    }

    /// Blocks until the CommitLog is on disk up to `end_offset` (sync flush
    /// mode); returns at once in async mode.
    pub fn wait_durable(&self, end_offset: u64) -> Result<()> {
        let inner = &*self.inner;
        if inner.config.flush_mode == FlushMode::Async || inner.log.flushed_pos() >= end_offset {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_millis(inner.config.sync_flush_timeout_ms);
        self.wait_for_flush(end_offset, Wake::Thread(std::thread::current()));
        loop {
            if inner.log.flushed_pos() >= end_offset {
                return Ok(());
            }
            if let Some(why) = inner.log.failure() {
                return Err(StoreError::StorageFailed(why.to_string()));
            }
            if inner.stop.load(Ordering::Acquire) {
                return Err(StoreError::ShutDown);
            }
            let now = Instant::now();
            if now >= deadline {
                inner.metrics.flush_timeouts.increment(1);
                return Err(StoreError::FlushTimeout(inner.config.sync_flush_timeout_ms));
            }
            std::thread::park_timeout(deadline - now);
        }
    }

    /// Registers a waiter for `end_offset` with the flushers (woken at once
    /// if it is already flushed, or the store failed or stops).
    fn wait_for_flush(&self, end_offset: u64, wake: Wake) {
        let inner = &*self.inner;
        let waiting = Waiting { end: end_offset, wake };
        let mut req = inner.flush.requested.lock().unwrap_or_else(|p| p.into_inner());
        // Checked under the lock the flushers mark and wake under: no
        // wake-up falls between the check and the registration.
        if inner.log.flushed_pos() >= end_offset || inner.log.failure().is_some() || inner.stop.load(Ordering::Acquire)
        {
            drop(req);
            waiting.wake();
            return;
        }
        req.register(waiting);
        if req.ask(end_offset, inner.config.sync_flush_depth) {
            inner.flush.wake_flusher.notify_one();
        }
    }

    /// Async form of [`MessageStore::wait_durable`].
    pub async fn durable(&self, end_offset: u64) -> Result<()> {
        self.flushed(end_offset).await?;
        self.replicated(end_offset).await
    }

    /// Cluster mode: waits until the set's replicas hold everything up to
    /// `end_offset` (the master's high watermark passed it), when acks are
    /// required; at once otherwise.
    pub async fn replicated(&self, end_offset: u64) -> Result<()> {
        let inner = &*self.inner;
        let timeout_ms = inner.ack_timeout_ms.load(Ordering::Acquire);
        if timeout_ms == u64::MAX {
            return Ok(());
        }
        let mut rx = inner.acked.subscribe();
        if *rx.borrow() >= end_offset {
            return Ok(());
        }
        if inner.too_few_replicas.load(Ordering::Acquire) {
            return Err(StoreError::NotEnoughReplicas);
        }
        let waited = tokio::time::timeout(Duration::from_millis(timeout_ms), async {
            rx.wait_for(|a| *a >= end_offset || !inner.leader.load(Ordering::Acquire))
                .await
                .map(|a| *a >= end_offset)
        })
        .await;
        match waited {
            Ok(Ok(true)) => Ok(()),
            // Lost its place while waiting (fenced, or a new master).
            Ok(Ok(false)) => Err(StoreError::NotLeader),
            Ok(Err(_)) => Err(StoreError::ShutDown),
            Err(_) if inner.too_few_replicas.load(Ordering::Acquire) || !inner.leader.load(Ordering::Acquire) => {
                Err(StoreError::NotEnoughReplicas)
            }
            Err(_) => Err(StoreError::ReplicationTimeout(timeout_ms)),
        }
    }

    /// Whether the set's replicas hold everything up to `end_offset` (always
    /// when acks need no replica).
    pub fn is_replicated(&self, end_offset: u64) -> bool {
        let inner = &*self.inner;
        inner.ack_timeout_ms.load(Ordering::Acquire) == u64::MAX || *inner.acked.borrow() >= end_offset
    }

    /// Sync flush mode: waits until the CommitLog is on disk up to
    /// `end_offset`; at once in async mode.
    pub async fn flushed(&self, end_offset: u64) -> Result<()> {
        let inner = &*self.inner;
        if inner.config.flush_mode == FlushMode::Async || inner.log.flushed_pos() >= end_offset {
            return Ok(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.wait_for_flush(end_offset, Wake::Task(tx));
        let timeout = Duration::from_millis(inner.config.sync_flush_timeout_ms);
        let waited = tokio::time::timeout(timeout, rx).await;
        let log = &inner.log;
        if log.flushed_pos() >= end_offset {
            return Ok(());
        }
        if let Some(why) = log.failure() {
            return Err(StoreError::StorageFailed(why.to_string()));
        }
        match waited {
            // Woken below its end: the store stops.
            Ok(_) => Err(StoreError::ShutDown),
            Err(_) => {
                inner.metrics.flush_timeouts.increment(1);
                Err(StoreError::FlushTimeout(inner.config.sync_flush_timeout_ms))
            }
        }
    }

    /// The ConsumeQueue of (topic, queue), if it exists.
    pub fn queue(&self, topic: &str, queue_id: u32) -> Option<Arc<ConsumeQueue>> {
        let q = self.inner.queues.read().unwrap_or_else(|p| p.into_inner());
        q.get(topic).and_then(|m| m.get(&queue_id)).cloned()
    }

    /// Deletes every queue of `topic`: its ConsumeQueues go at once, its
    /// CommitLog records stay until retention but can no longer be read. A
    /// checkpoint is written so recovery does not bring the queues back.
    /// Returns whether the topic had queues.
    pub fn delete_topic(&self, topic: &str) -> Result<bool> {
        self.check_open()?;
        {
            // The checkpoint's turn first (it takes the writer inside): the
            // tombstone below goes into the queue manifest on disk, which
            // only a checkpoint writes otherwise.
            let turn = self.inner.checkpoint_lock.lock().unwrap_or_else(|p| p.into_inner());
            // Under the writer lock throughout: an append racing the delete
            // either lands before it (and is deleted with the topic) or
            // after it, in a queue made afresh whose files this does not
            // remove.
            let mut w = self.inner.writer();
            let Some(removed) = w.queues.remove(topic) else {
                return Ok(false);
            };
            let end = self.inner.log.write_pos();
            // Records written so far stay deleted if queues are ever
            // rebuilt — durably so before any file goes: a crash between
            // removing the queue files and the next checkpoint rebuilt the
            // topic from the CommitLog at the next start, records and all.
            // The manifest on disk gets the tombstone (its queue ends stay
            // the last checkpoint's: those are what is durable).
            // (One that is there but cannot be read is not overwritten with
            // only this tombstone: the delete is refused until a checkpoint
            // writes it whole again.)
            let mut manifest = match crate::manifest::Manifest::load(&self.inner.dir) {
                Some(m) => m,
                None if !crate::manifest::Manifest::exists(&self.inner.dir) => Default::default(),
                None => {
                    w.queues.insert(Arc::from(topic), removed);
                    return Err(StoreError::Config(
                        "the queue manifest cannot be read: the topic is not deleted until a checkpoint writes it again"
                            .into(),
                    ));
                }
            };
            manifest.deleted.insert(topic.to_string(), end);
            manifest
                .queues
                .retain(|key, _| crate::manifest::Manifest::parse_key(key).is_none_or(|(t, _)| t != topic));
            if let Err(e) = manifest.store(&self.inner.dir) {
                // Nothing removed: the topic stays as it was.
                w.queues.insert(Arc::from(topic), removed);
                return Err(e);
            }
            drop(turn);
            self.inner
                .queues
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(topic);
            self.inner
                .deleted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(topic.to_string(), end);
            crate::fault::check("delete-topic-files").map_err(StoreError::io("remove", &self.inner.dir))?;
            for q in removed.values() {
                q.destroy()?;
            }
            let dir = self.inner.dir.join("consumequeue").join(topic);
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(StoreError::io("remove", &dir))?;
            }
            let _g = self.inner.compaction_lock.lock().unwrap_or_else(|p| p.into_inner());
            let dir = crate::compacted::topic_dir(&self.inner.dir, topic);
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(StoreError::io("remove", &dir))?;
            }
            self.inner
                .compacted
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(topic);
        }
        // Its queue starts go with it: a topic made again under the name
        // starts at 0, and a replica without its queues is not waited for.
        self.change_log_starts(|starts| {
            let before = starts.len();
            starts.retain(|key, _| key.rsplit_once('/').is_none_or(|(t, _)| t != topic));
            starts.len() != before
        })?;
        crate::tasks::checkpoint(&self.inner, false)?;
        Ok(true)
    }

    /// The queue starts DeleteRecords raised ("topic/queue" → first
    /// offset), and how many changes they have had since open.
    pub fn log_starts(&self) -> (std::collections::BTreeMap<String, u64>, u64) {
        let starts = self.inner.log_starts.lock().unwrap_or_else(|p| p.into_inner());
        (starts.clone(), self.inner.log_starts_changes.load(Ordering::Acquire))
    }

    /// How many changes the queue starts DeleteRecords raised have had.
    pub fn log_starts_changes(&self) -> u64 {
        self.inner.log_starts_changes.load(Ordering::Acquire)
    }

    /// A replica takes its master's queue starts: each raises its queue's
    /// start (never lowers it). Returns those not yet reached — the queue
    /// not there yet, or ending below the start (entries still to come) —
    /// to be taken again once more of the log is in.
    pub fn adopt_log_starts(
        &self,
        starts: &std::collections::BTreeMap<String, u64>,
    ) -> Result<std::collections::BTreeMap<String, u64>> {
        let mut pending = std::collections::BTreeMap::new();
        for (key, start) in starts {
            let Some((topic, q)) = key.rsplit_once('/') else {
                continue;
            };
            let Ok(q) = q.parse::<u32>() else { continue };
            // Taken whole once the queue reaches it (a start moved a
            // frame at a time would rewrite the file with every frame).
            if self.queue(topic, q).map_or(0, |c| c.max_offset()) < *start {
                pending.insert(key.clone(), *start);
            } else {
                self.delete_records(topic, q, *start)?;
            }
        }
        Ok(pending)
    }

    /// Whether a queue this store holds is still below one of `pending`
    /// (starts [`MessageStore::adopt_log_starts`] has not taken yet). A
    /// start of a queue it does not hold — its topic deleted here, or its
    /// entries not come yet — does not count: a master waiting for its
    /// replicas to take its starts is not held back by queues they lack
    /// (the start is still taken if the queue comes).
    pub fn log_starts_waiting(&self, pending: &std::collections::BTreeMap<String, u64>) -> bool {
        pending.keys().any(|key| {
            key.rsplit_once('/')
                .and_then(|(t, q)| Some((t, q.parse::<u32>().ok()?)))
                .is_some_and(|(t, q)| self.queue(t, q).is_some())
        })
    }

    /// Makes offsets below `offset` of (topic, queue) unreadable (Kafka
    /// DeleteRecords): the queue's first offset becomes `offset` (clamped to
    /// the end), persisted in `log_starts.json`. Returns the new first offset.
    pub fn delete_records(&self, topic: &str, queue_id: u32, offset: u64) -> Result<u64> {
        self.check_open()?;
        let Some(q) = self.queue(topic, queue_id) else {
            return Ok(0);
        };
        let (start, below) = {
            let _w = self.inner.writer();
            // Where the records below the new start end in the log (read
            // before the start moves past them).
            let below = q.log_end_below(offset);
            (q.raise_min_offset(offset), below)
        };
        // Nothing moved (asked again): no rewrite and fsync of the file.
        let key = format!("{topic}/{queue_id}");
        let moved = self
            .inner
            .log_starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            != Some(&start);
        if moved {
            // The records below the new start are on disk before the start
            // is (async mode may not have flushed them yet): kept past what
            // a power loss leaves of the log, the start would later hide
            // records appended again below it. (Only as far as they reach:
            // usually flushed already.)
            if let Some(end) = below {
                self.inner.log.flush_to(end)?;
            }
        }
        self.change_log_starts(|starts| starts.insert(key, start) != Some(start))?;
        Ok(start)
    }

    /// Changes the queue-start table with `change` (which says whether it
    /// changed anything): a new version, and the file rewritten.
    fn change_log_starts(
        &self,
        change: impl FnOnce(&mut std::collections::BTreeMap<String, u64>) -> bool,
    ) -> Result<()> {
        // What is on disk, read before the table's lock: the writer of a
        // newer table holds `log_starts_written` across its fsync, which the
        // table's readers (the replication stream) must not wait for.
        let written_now = *self.inner.log_starts_written.lock().unwrap_or_else(|p| p.into_inner());
        let (json, version) = {
            let mut starts = self.inner.log_starts.lock().unwrap_or_else(|p| p.into_inner());
            let changed = change(&mut starts);
            let current = self.inner.log_starts_changes.load(Ordering::Acquire);
            let unwritten = written_now < current;
            // Unchanged and on disk: nothing to write. Unchanged but a
            // change before failed to be written (ENOSPC), a retry of it
            // writes it now rather than answering success with the file
            // behind (a crash would bring the deleted records back).
            if !changed && !unwritten {
                return Ok(());
            }
            let version = if changed {
                self.inner.log_starts_changes.fetch_add(1, Ordering::AcqRel) + 1
            } else {
                current
            };
            let json = serde_json::to_vec_pretty(&*starts)
                .map_err(|e| StoreError::bad_file(self.inner.dir.join("log_starts.json"), e.to_string()))?;
            (json, version)
        };
        // Written (and fsynced) outside the table's lock, which readers
        // (the replication stream) take; a newer table already written is
        // not overwritten by this older one.
        let mut written = self.inner.log_starts_written.lock().unwrap_or_else(|p| p.into_inner());
        if *written < version {
            crate::checkpoint::write_atomically(&self.inner.dir.join("log_starts.json"), &json)?;
            *written = version;
        }
        Ok(())
    }

    /// Marks `topic` compacted or not (persisted in
    /// `compacted/<topic>/COMPACT`). Retention keeps every CommitLog segment
    /// holding a compacted queue's dirty range; reads below a clean log's
    /// end are served from it whatever the mark.
    pub fn set_compacted(&self, topic: &str, on: bool) -> Result<()> {
        validate_topic(topic)?;
        // The lock orders changes of the mark; the set readers take (every
        // RocketMQ send asks) is only locked to apply a change already on
        // disk, never across the fsyncs.
        let _g = self.inner.compaction_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_compacted(topic) == on {
            return Ok(());
        }
        let dir = crate::compacted::topic_dir(&self.inner.dir, topic);
        let marker = dir.join(crate::compacted::MARKER);
        if on {
            std::fs::create_dir_all(&dir).map_err(StoreError::io("create dir", &dir))?;
            File::create(&marker)
                .and_then(|f| f.sync_all())
                .map_err(StoreError::io("create", &marker))?;
        } else {
            std::fs::remove_file(&marker).map_err(StoreError::io("remove", &marker))?;
        }
        crate::sys::fsync_dir(&dir)?;
        let mut set = self.inner.compacted.write().unwrap_or_else(|p| p.into_inner());
        if on {
            set.insert(topic.to_string());
        } else {
            set.remove(topic);
        }
        Ok(())
    }

    /// Whether `topic` is marked compacted.
    pub fn is_compacted(&self, topic: &str) -> bool {
        self.inner
            .compacted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(topic)
    }

    /// Compacted topics, sorted.
    pub fn compacted_topics(&self) -> Vec<String> {
        let set = self.inner.compacted.read().unwrap_or_else(|p| p.into_inner());
        set.iter().cloned().collect()
    }

    /// What a compaction pass of (topic, queue) would work on, if the
    /// queue exists: its clean log and the entries after it.
    pub fn dirty_range(&self, topic: &str, queue_id: u32) -> Option<DirtyRange> {
        let q = self.queue(topic, queue_id)?;
        let clean = q.clean();
        let mut d = DirtyRange {
            start: q.min_offset(),
            clean_end: clean.as_ref().map_or(q.min_offset(), |c| c.end()),
            end: self.visible_max(&q),
            clean_bytes: clean.as_ref().map_or(0, |c| c.bytes()),
            dirty_bytes: 0,
            dirty_entries: 0,
            oldest_dirty_store_ms: None,
        };
        if let Some(first) = q.first_dirty() {
            for idx in first..q.entry_count() {
                let Some(e) = q.entry(idx) else { break };
                if e.base_offset >= d.end {
                    break;
                }
                d.oldest_dirty_store_ms.get_or_insert(e.store_timestamp);
                d.dirty_bytes += u64::from(e.size);
                d.dirty_entries += 1;
            }
        }
        Some(d)
    }

    /// Starts the next generation of (topic, queue)'s clean log. Fill it
    /// with the survivors of `[writer.start(), end)`, read with
    /// [`MessageStore::read`], then [`MessageStore::install_clean`] it.
    pub fn clean_writer(&self, topic: &str, queue_id: u32) -> Result<crate::compacted::CleanWriter> {
        self.check_open()?;
        let q = self
            .queue(topic, queue_id)
            .ok_or_else(|| StoreError::Config(format!("no queue {topic}/{queue_id}")))?;
        let dir = crate::compacted::topic_dir(&self.inner.dir, topic).join(queue_id.to_string());
        let generation = crate::compacted::next_generation(q.clean().as_ref());
        crate::compacted::CleanWriter::create(dir, generation, q.min_offset())
    }

    /// Makes a filled clean log durable and switches (topic, queue) to it:
    /// offsets in `[start, end)` are read from it from now on. `end` must
    /// not be below the current clean log's end nor above the queue's end.
    pub fn install_clean(
        &self,
        topic: &str,
        queue_id: u32,
        w: crate::compacted::CleanWriter,
        end: u64,
    ) -> Result<Arc<crate::compacted::CleanLog>> {
        self.check_open()?;
        // The new generation's files are written and fsynced before the
        // lock: topic deletion waits on it under the writer lock, so no
        // append ever waits for a clean log's fsync.
        let start = w.start();
        let sealed = w.seal()?;
        // The log the clean generation was made from is on disk first
        // (async mode may not have flushed its newest entries): a clean
        // log durable past what a power loss leaves of the log would hide
        // the records appended again at those offsets. (As far as the
        // entries below `end` reach: not the other topics' newest writes.)
        let covered = self
            .queue(topic, queue_id)
            .and_then(|q| q.log_end_below(end))
            .unwrap_or_else(|| self.inner.log.write_pos());
        self.inner.log.flush_to(covered)?;
        let _g = self.inner.compaction_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(q) = self.queue(topic, queue_id) else {
            // Deleted during the pass.
            let _ = std::fs::remove_dir_all(sealed.dir());
            return Err(StoreError::Config(format!("no queue {topic}/{queue_id}")));
        };
        let current_end = q.clean().map_or(0, |c| c.end());
        if end < current_end || end > q.max_offset() {
            return Err(StoreError::Config(format!(
                "clean end {end} of {topic}/{queue_id} is outside [{current_end}, {}]",
                q.max_offset()
            )));
        }
        let log = Arc::new(sealed.switch(end)?);
        // DeleteRecords during the pass moved the start on.
        log.raise_start(q.min_offset().max(start));
        q.set_clean(Some(Arc::clone(&log)));
        self.inner.metrics.compactions.increment(1);
        Ok(log)
    }

    /// Compacted queues whose dirty range held back a CommitLog segment
    /// that retention would have deleted (cleared by the call).
    pub fn take_compaction_wanted(&self) -> Vec<(String, u32)> {
        let mut w = self.inner.compaction_wanted.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *w).into_iter().collect()
    }

    /// Topics that have at least one queue, sorted.
    pub fn topics(&self) -> Vec<String> {
        let q = self.inner.queues.read().unwrap_or_else(|p| p.into_inner());
        let mut t: Vec<String> = q.keys().map(|k| k.to_string()).collect();
        t.sort();
        t
    }

    /// Queue ids of `topic`, sorted.
    pub fn queue_ids(&self, topic: &str) -> Vec<u32> {
        let q = self.inner.queues.read().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<u32> = q.get(topic).map(|m| m.keys().copied().collect()).unwrap_or_default();
        ids.sort_unstable();
        ids
    }

    /// First readable offset of a queue (0 if it does not exist).
    pub fn min_offset(&self, topic: &str, queue_id: u32) -> u64 {
        self.queue(topic, queue_id).map_or(0, |q| q.min_offset())
    }

    /// The end offset consumers see (0 if the queue does not exist): the
    /// next offset to be written, or in sync-flush mode the end of what is
    /// on disk — consumers never see a message a crash could still take.
    pub fn max_offset(&self, topic: &str, queue_id: u32) -> u64 {
        self.queue(topic, queue_id).map_or(0, |q| self.visible_max(&q))
    }

    /// The end offset of everything written to a queue (0 if it does not
    /// exist): past the high watermark and, in sync mode, past what is
    /// flushed. For state rebuilt from the log, with [`MessageStore::read_written`].
    pub fn written_max_offset(&self, topic: &str, queue_id: u32) -> u64 {
        self.queue(topic, queue_id).map_or(0, |q| q.max_offset())
    }

    fn visible_max(&self, q: &ConsumeQueue) -> u64 {
        let limit = match self.inner.config.flush_mode {
            FlushMode::Async => u64::MAX,
            FlushMode::Sync => self.inner.log.flushed_pos(),
        };
        let limit = limit.min(self.inner.hw.load(Ordering::Acquire));
        if limit == u64::MAX {
            q.max_offset()
        } else {
            q.visible_max(limit)
        }
    }

    /// Called by the flusher thread each time the flushed position moves
    /// (sync mode: after each group commit), so readers waiting for
    /// messages that just became visible can be woken.
    pub fn set_flush_listener(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.inner.flush_listener.set(Box::new(f));
    }

    /// Called after a replicated append with each (topic, queue) it wrote
    /// to and the log's end after it (a replica: wakes the long polls of
    /// those queues once the high watermark reaches it). Set once.
    pub fn set_replicated_listener(&self, f: impl Fn(&str, u32, u64) + Send + Sync + 'static) {
        let _ = self.inner.replicated_listener.set(Box::new(f));
    }

    /// Called with the new high watermark each time it rises (cluster
    /// mode: wakes the long polls waiting for records it makes visible).
    /// Set once.
    pub fn set_watermark_listener(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.inner.watermark_listener.set(Box::new(f));
    }

    /// Called after each client append (cluster mode: wakes the
    /// replication stream's waiting fetches). Set once.
    pub fn set_append_listener(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.inner.append_listener.set(Box::new(f));
    }

    /// First offset stored at or after `ts` (store time); the max offset when
    /// nothing is that recent.
    pub fn offset_by_store_time(&self, topic: &str, queue_id: u32, ts: i64) -> u64 {
        self.queue(topic, queue_id).map_or(0, |q| q.offset_by_store_time(ts))
    }

    /// Reads up to `max_offsets` offsets (whole entries; at least one entry
    /// even if larger than `max_bytes`) from `offset`.
    pub fn read(&self, topic: &str, queue_id: u32, offset: u64, max_offsets: u32, max_bytes: usize) -> QueueRead {
        self.read_within(topic, queue_id, offset, max_offsets, max_bytes, true)
    }

    /// As [`MessageStore::read`], up to everything written: past the high
    /// watermark and, in sync mode, past what is flushed. Not for
    /// consumers — for state rebuilt from the log (idempotent producers),
    /// which must count what a failover may still keep.
    pub fn read_written(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_offsets: u32,
        max_bytes: usize,
    ) -> QueueRead {
        self.read_within(topic, queue_id, offset, max_offsets, max_bytes, false)
    }

    fn read_within(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_offsets: u32,
        max_bytes: usize,
        visible_only: bool,
    ) -> QueueRead {
        let Some(q) = self.queue(topic, queue_id) else {
            return QueueRead {
                status: ReadStatus::NoSuchQueue,
                entries: Vec::new(),
                next_offset: 0,
                min_offset: 0,
                max_offset: 0,
            };
        };
        let max = if visible_only {
            self.visible_max(&q)
        } else {
            q.max_offset()
        };
        let min = q.min_offset();
        let status_only = |status, next| QueueRead {
            status,
            entries: Vec::new(),
            next_offset: next,
            min_offset: min,
            max_offset: max,
        };
        if offset < min {
            return status_only(ReadStatus::OffsetMoved, min);
        }
        if offset == max {
            return status_only(ReadStatus::NoNewMessages, max);
        }
        if offset > max {
            // Written but not yet visible (above the high watermark or, in
            // sync mode, not yet flushed): nothing yet, as a Kafka broker
            // answers an offset between its high watermark and its log end;
            // a replica behind its master's high watermark, where a
            // consumer was pointed (KIP-392), waits the same way.
            if visible_only && offset <= q.max_offset() {
                return status_only(ReadStatus::NoNewMessages, offset);
            }
            return status_only(ReadStatus::OffsetOverflow, max);
        }
        let mut offset = offset;
        if let Some(clean) = q.clean().filter(|c| offset < c.end()) {
            let mut entries = clean.read(offset, max_offsets, max_bytes);
            if self.inner.config.verify_reads {
                if let Some(bad) = entries.iter().position(|e| self.damaged(e, topic, queue_id, false)) {
                    entries.truncate(bad);
                    if entries.is_empty() {
                        return status_only(ReadStatus::Damaged, offset);
                    }
                }
            }
            if let Some(last) = entries.last() {
                return QueueRead {
                    status: ReadStatus::Found,
                    next_offset: last.cq.end_offset(),
                    entries,
                    min_offset: min,
                    max_offset: max,
                };
            }
            // Nothing survives from `offset` to the clean end: read on
            // from the dirty range.
            offset = clean.end();
            if offset >= max {
                return status_only(ReadStatus::NoNewMessages, max);
            }
        }
        let Some(mut idx) = q.find(offset) else {
            // Retention moved the start between our two loads.
            return status_only(ReadStatus::OffsetMoved, q.min_offset());
        };
        let mut cqs = Vec::new();
        let (mut offsets, mut bytes) = (0u64, 0usize);
        while let Some(e) = q.entry(idx) {
            if e.base_offset >= max {
                break; // not yet on disk (sync flush)
            }
            if !cqs.is_empty() && (offsets >= u64::from(max_offsets) || bytes + e.size as usize > max_bytes) {
                break;
            }
            offsets += e.end_offset() - offset.max(e.base_offset);
            bytes += e.size as usize;
            cqs.push(e);
            idx += 1;
        }
        let mut entries = self.views(&cqs);
        if self.inner.config.verify_reads {
            if let Some(bad) = entries.iter().position(|e| self.damaged(e, topic, queue_id, true)) {
                entries.truncate(bad);
                if entries.is_empty() {
                    return status_only(ReadStatus::Damaged, cqs[0].base_offset.max(offset));
                }
            }
        }
        if entries.is_empty() {
            // Nothing readable where the first entry points. Retention
            // removed the CommitLog under it (the queue's start catches up
            // later): continue past the entries whose records are gone.
            let log_min = self.inner.log.min_offset();
            if let Some(first) = cqs.first().filter(|e| e.phys_offset < log_min) {
                // The first entry whose record is still there (a binary
                // search of the queue), not only past this read's batch.
                let past = q.offset_at_phys(log_min);
                return status_only(
                    ReadStatus::OffsetMoved,
                    past.max(q.min_offset()).max(first.end_offset()),
                );
            }
            if q.min_offset() > offset {
                return status_only(ReadStatus::OffsetMoved, q.min_offset());
            }
            // Else the entry points where no record is (past the log's
            // end, across a segment's end: a damaged ConsumeQueue). Not a
            // moved start: that answer would send consumers back over the
            // queue to the same entry, round and round.
            self.inner.metrics.damaged_entries.increment(1);
            let at = cqs.first().map_or(offset, |e| e.base_offset.max(offset));
            return status_only(ReadStatus::Damaged, at);
        }
        let next = entries.last().map_or(offset, |e| e.cq.end_offset());
        QueueRead {
            status: ReadStatus::Found,
            entries,
            next_offset: next,
            min_offset: min,
            max_offset: max,
        }
    }

    /// Of an entry a read of `offset` answered Damaged for: where it ends
    /// in the queue, and whether its own stored bytes fail their check (no
    /// copy of that record can be served again) — false when the record is
    /// intact and the ConsumeQueue entry points wrong or nowhere (a rebuild
    /// of the queue from the CommitLog repairs that). The clean log's own
    /// entry where it holds `offset`. None: no such entry.
    pub fn damaged_entry(&self, topic: &str, queue_id: u32, offset: u64) -> Option<(u64, bool)> {
        let q = self.queue(topic, queue_id)?;
        if let Some(clean) = q.clean().filter(|c| offset < c.end()) {
            let e = clean.read(offset, 1, usize::MAX).into_iter().next()?;
            return Some((e.cq.end_offset(), record::verify_entry(&e.data).is_err()));
        }
        let cq = q.entry(q.find(offset)?)?;
        let data_bad = self
            .views(&[cq])
            .first()
            .is_some_and(|e| record::verify_entry(&e.data).is_err());
        Some((cq.end_offset(), data_bad))
    }

    /// Whether a read entry fails its check: its CRC(s), or its own header
    /// says it is another record than its ConsumeQueue entry points at.
    /// Logged at most once a second (a client re-reading a damaged offset
    /// must not flood the log).
    fn damaged(&self, e: &ReadEntry, topic: &str, queue_id: u32, in_commitlog: bool) -> bool {
        let why = match record::verify_entry(&e.data) {
            Err(err) => err.to_string(),
            Ok(r) if in_commitlog && r.phys_offset != e.cq.phys_offset => format!("records position {}", r.phys_offset),
            Ok(r) if r.queue_offset != e.cq.base_offset => format!("records queue offset {}", r.queue_offset),
            Ok(r) if r.queue_id != queue_id || r.topic != topic.as_bytes() => {
                format!("belongs to {}/{}", String::from_utf8_lossy(r.topic), r.queue_id)
            }
            Ok(_) => return false,
        };
        self.inner.metrics.damaged_entries.increment(1);
        if self.inner.damage_log.ready() {
            tracing::error!(
                topic,
                queue = queue_id,
                offset = e.cq.base_offset,
                position = e.cq.phys_offset,
                why,
                "damaged entry not served"
            );
        }
        true
    }

    /// Maps CQ entries to views, one view per run of entries in one segment.
    fn views(&self, cqs: &[CqEntry]) -> Vec<ReadEntry> {
        let mut out = Vec::with_capacity(cqs.len());
        let mut i = 0;
        while i < cqs.len() {
            let start = cqs[i].phys_offset;
            let mut j = i;
            let mut end = start + u64::from(cqs[i].size);
            // Extend the run while entries are contiguous in the CommitLog.
            while j + 1 < cqs.len() && cqs[j + 1].phys_offset == end {
                j += 1;
                end += u64::from(cqs[j].size);
            }
            let run = self.inner.log.read(start, (end - start) as usize).or_else(|| {
                // The run crossed a segment end: fall back to one view each.
                if j > i {
                    j = i;
                    end = start + u64::from(cqs[i].size);
                    self.inner.log.read(start, cqs[i].size as usize)
                } else {
                    None
                }
            });
            let Some(run) = run else {
                break;
            };
            for e in &cqs[i..=j] {
                let a = (e.phys_offset - start) as usize;
                out.push(ReadEntry {
                    cq: *e,
                    data: run.slice(a..a + e.size as usize),
                });
            }
            i = j + 1;
        }
        out
    }

    /// As [`MessageStore::read_at`], an entry as large as any the log may
    /// hold ([`StoreConfig::max_stored_entry`]): for offsets the broker
    /// itself recorded (a timer's), never for ones a client names.
    pub fn read_stored_at(&self, phys: u64) -> Option<Bytes> {
        self.read_entry_within(phys, self.inner.config.max_stored_entry())
    }

    /// The stored entry at CommitLog offset `phys` (VIEW_MESSAGE_BY_ID, a
    /// send-back, a query by key), if an entry really starts there: within
    /// today's `max_message_bytes` (a client names the offset) and wholly
    /// where consumers may read — in sync mode on disk, in cluster mode
    /// below the high watermark, as [`MessageStore::read`] serves: a crash
    /// or a failover could still take an entry past it.
    pub fn read_at(&self, phys: u64) -> Option<Bytes> {
        let b = self.read_entry_within(phys, self.inner.max_entry())?;
        let limit = match self.inner.config.flush_mode {
            FlushMode::Async => u64::MAX,
            FlushMode::Sync => self.inner.log.flushed_pos(),
        }
        .min(self.inner.hw.load(Ordering::Acquire));
        (phys.saturating_add(b.len() as u64) <= limit).then_some(b)
    }

    /// As [`MessageStore::read_at`], up to everything written: for the
    /// broker's own lookups of entries it wrote (a half message a producer
    /// ends, whose send was answered).
    pub fn read_written_at(&self, phys: u64) -> Option<Bytes> {
        self.read_entry_within(phys, self.inner.max_entry())
    }

    /// The whole entry starting at `phys`, if one of at most `max` bytes
    /// that says it is at `phys` starts there.
    fn read_entry_within(&self, phys: u64, max: usize) -> Option<Bytes> {
        let b = self.inner.log.read_entry_at(phys, max)?;
        match record::decode_entry(&b) {
            Ok(e) if e.phys_offset() == phys => Some(b),
            _ => None,
        }
    }

    /// Messages of `topic` whose KEYS contain `key` or whose UNIQ_KEY is
    /// `key`, stored within `[begin_ts, end_ts]`, at most `max`, oldest first.
    pub fn query_by_key(&self, topic: &str, key: &str, max: usize, begin_ts: i64, end_ts: i64) -> Vec<Bytes> {
        let Some(index) = &self.inner.index else {
            return Vec::new();
        };
        let mut candidates = {
            let idx = index.lock().unwrap_or_else(|p| p.into_inner());
            idx.query(topic, key.as_bytes(), max, begin_ts, end_ts)
        };
        candidates.sort_unstable();
        candidates.dedup();
        let mut out = Vec::new();
        for phys in candidates {
            let Some(b) = self.read_at(phys) else {
                continue;
            };
            let Ok(Entry::Message(m)) = record::decode_entry(&b) else {
                continue;
            };
            let matches = m.topic_str() == topic
                // (Every token: the index holds what the cap let in when
                // the message was written, whatever the cap is now.)
                && record::index_keys(topic, &m.properties, usize::MAX).any(|(_, k)| k == key.as_bytes());
            if matches {
                out.push(b);
            }
        }
        out
    }

    /// CommitLog bounds: (first offset on disk, end of data, flushed end).
    pub fn commitlog_offsets(&self) -> (u64, u64, u64) {
        let log = &self.inner.log;
        (log.min_offset(), log.write_pos(), log.flushed_pos())
    }

    /// CommitLog flushes that wrote data since open (in sync mode, one per
    /// group commit).
    pub fn flush_count(&self) -> u64 {
        self.inner.log.flush_count()
    }

    /// Waits until the CommitLog's allocator has prepared what it was asked
    /// for (benchmarks and tests: a measurement that should not include
    /// preparing pages starts after it). Holds the writer lock while it
    /// waits: appends wait too (the allocator itself never takes it).
    pub fn settle_preparation(&self) {
        let _ = self.inner.writer().cl.settle_preparation();
    }

    /// Number of CommitLog segments.
    pub fn segment_count(&self) -> usize {
        self.inner.log.segments().len()
    }

    /// Runs one retention pass now (normally periodic).
    pub fn run_retention(&self) -> Result<usize> {
        crate::tasks::retention(&self.inner)
    }

    /// Flushes everything and writes a checkpoint now (normally periodic).
    pub fn checkpoint(&self) -> Result<()> {
        crate::tasks::checkpoint(&self.inner, false).map(|_| ())
    }

    /// Clean shutdown: stops background work, flushes everything, writes a
    /// clean checkpoint and removes the abort marker, so the next open needs
    /// no scan. Appends after this fail with `ShutDown`.
    pub fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Fence: an append that passed its first check holds the writer
        // lock until it has published; every later one sees `closed` under
        // the lock. The checkpoint below then covers every acknowledged
        // record.
        drop(self.inner.writer());
        self.stop_threads();
        let inner = &*self.inner;
        let cp = match crate::tasks::checkpoint(inner, true) {
            Ok(cp) => cp,
            Err(e) if e.is_no_space() && inner.log.failure().is_none() => {
                // Everything is flushed; only the file that says so found no
                // room. The abort marker stays: the next start recovers from
                // the last checkpoint, as after a crash, and loses nothing.
                tracing::warn!(error = %e, "no room for the clean checkpoint: the next start recovers");
                inner.offsets.persist_at_close()?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        inner.offsets.persist_at_close()?;
        let abort = inner.dir.join("abort");
        if let Err(e) = std::fs::remove_file(&abort) {
            if e.kind() != std::io::ErrorKind::NotFound {
                return Err(StoreError::Io {
                    op: "remove",
                    path: abort,
                    source: e,
                });
            }
        }
        tracing::info!(end = cp.safe_offset, "store closed cleanly");
        Ok(())
    }

    fn stop_threads(&self) {
        let inner = &*self.inner;
        inner.stop.store(true, Ordering::Release);
        {
            let mut req = inner.flush.requested.lock().unwrap_or_else(|p| p.into_inner());
            inner.flush.wake_flusher.notify_all();
            req.wake_all();
        }
        {
            let _g = inner.sleep.0.lock().unwrap_or_else(|p| p.into_inner());
            inner.sleep.1.notify_all();
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for MessageStore {
    /// Dropping without [`MessageStore::close`] stops the background threads
    /// but leaves the abort marker: the next open recovers as after a crash.
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Used by checkpoint: a consistent (end, index mark, last record) snapshot.
pub(crate) fn snapshot(inner: &Inner) -> (u64, Option<crate::index::IndexMark>, u64, crate::manifest::Manifest) {
    let w = inner.writer();
    let end = inner.log.write_pos();
    let mark = inner
        .index
        .as_ref()
        .and_then(|i| i.lock().unwrap_or_else(|p| p.into_inner()).mark());
    let mut manifest = crate::manifest::Manifest::default();
    for (topic, qs) in &w.queues {
        for (q, cq) in qs {
            manifest
                .queues
                .insert(crate::manifest::Manifest::key(topic, *q), cq.max_offset());
        }
    }
    manifest.deleted = inner.deleted.lock().unwrap_or_else(|p| p.into_inner()).clone();
    (end, mark, w.last_record, manifest)
}

pub(crate) fn write_checkpoint(inner: &Inner, cp: &Checkpoint) -> Result<()> {
    cp.store(&inner.dir.join("checkpoint"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests that gave up while syncs stall do not pile up: the heap is
    /// pruned of abandoned waiters, and live ones are all kept and woken.
    #[test]
    fn abandoned_waiters_do_not_pile_up_while_syncs_stall() {
        let mut req = FlushRequests::default();
        let mut live = Vec::new();
        for i in 0..100_000u64 {
            let (tx, rx) = tokio::sync::oneshot::channel();
            req.register(Waiting {
                end: i + 1,
                wake: Wake::Task(tx),
            });
            // One in a hundred still waits; the rest timed out.
            if i % 100 == 0 {
                live.push(rx);
            }
        }
        assert!(
            req.waiting.len() <= 2 * PRUNE_FLOOR.max(2 * live.len()),
            "{} entries kept for {} live waiters",
            req.waiting.len(),
            live.len()
        );
        req.wake_through(u64::MAX);
        for mut rx in live {
            assert!(rx.try_recv().is_ok(), "a live waiter was dropped");
        }
    }
}
