//! Kafka transactions (KIP-98): the transaction coordinator and the
//! per-partition transaction state the log needs.
//!
//! * **Coordinator state** per transactional id: producer id and epoch,
//!   state (Empty → Ongoing → PrepareCommit/PrepareAbort →
//!   CompleteCommit/CompleteAbort), the partitions and groups in the
//!   transaction, offsets committed in it (TxnOffsetCommit, applied at
//!   commit), timeout and start time. Kept in an append-only log,
//!   `<data_dir>/config/kafka-transactions.log` (one JSON line per change,
//!   fsynced before the change is answered; rewritten compact at open), as
//!   Kafka keeps `__transaction_state`.
//! * **Markers**: ending a transaction writes a control batch (COMMIT or
//!   ABORT) into every partition of it; a transaction left in Prepare* by a
//!   crash is completed at the next start.
//! * **Per partition**: the first offset of each open transaction (the last
//!   stable offset is the lowest of them, else the high watermark) and the
//!   aborted transactions (producer id, first offset, marker offset) that
//!   `read_committed` fetches are told about. Aborted entries are logged
//!   before their markers are written; open transactions' first offsets are
//!   found again after a restart by scanning from the transaction's start.
//!
//! Error answers are Kafka's codes (`code`): this module exists for the
//! Kafka frontend, and the RocketMQ side only reads the stable offset and
//! the aborted list.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::BytesMut;
use serde::{Deserialize, Serialize};

use crate::error::{BrokerError, Result};
use crate::Broker;

/// Kafka error codes the coordinator answers with.
pub mod code {
    pub const NONE: i16 = 0;
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub const INVALID_TXN_STATE: i16 = 48;
    pub const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
    pub const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
    pub const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
    pub const CONCURRENT_TRANSACTIONS: i16 = 51;
    pub const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
    pub const OPERATION_NOT_ATTEMPTED: i16 = 55;
    pub const KAFKA_STORAGE_ERROR: i16 = 56;
    pub const PRODUCER_FENCED: i16 = 90;
    pub const INVALID_REQUEST: i16 = 42;
}

/// A transaction's state (Kafka's `TransactionState` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl TxnState {
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
        }
    }

    fn is_prepare(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// An offset committed inside a transaction (applied when it commits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingOffset {
    pub group: String,
    pub topic: String,
    pub partition: u32,
    pub offset: u64,
    pub metadata: String,
    pub leader_epoch: i32,
    /// The broker set holding the queue when it is not this node's
    /// (several broker sets: committed there when the transaction commits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
}

/// One transactional id's coordinator state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnMeta {
    pub id: String,
    pub producer_id: i64,
    pub epoch: i16,
    pub timeout_ms: i64,
    pub state: TxnState,
    pub partitions: BTreeSet<(String, u32)>,
    pub groups: BTreeSet<String>,
    pub offsets: Vec<PendingOffset>,
    /// When the open transaction began (ms since the epoch; -1 none).
    pub start_ms: i64,
    pub update_ms: i64,
    /// Several broker sets: the transaction's partitions on other sets
    /// (set, topic, queue), whose masters take part in it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub remote: BTreeSet<(String, String, u32)>,
    /// Several broker sets: other sets that hold a part of the transaction
    /// without its partitions (the coordinators of its groups, holding
    /// its offsets), ended with it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub participants: BTreeSet<String>,
    /// The epoch before a fencing abort bumped it (KIP-360: the producer
    /// retrying its InitProducerId names that one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_epoch: Option<i16>,
    /// Several broker sets: set when this is not a transaction this node
    /// coordinates but its part on this set (partitions of this set, or
    /// offsets of a group this set coordinates) — the coordinator's set.
    /// Keyed by [`participation_id`]; ended by that coordinator, never
    /// timed out here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<String>,
}

impl TxnMeta {
    /// A transactional id with no transaction open (`coordinator`: the
    /// set coordinating it when this is another set's transaction's part).
    fn new(id: &str, producer_id: i64, epoch: i16, timeout_ms: i64, now: i64, coordinator: Option<String>) -> TxnMeta {
        TxnMeta {
            id: id.to_string(),
            producer_id,
            epoch,
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            offsets: Vec::new(),
            start_ms: -1,
            update_ms: now,
            remote: BTreeSet::new(),
            participants: BTreeSet::new(),
            last_epoch: None,
            coordinator,
        }
    }
}

/// The key under which producer `producer_id`'s part in a transaction
/// another set coordinates is held (not a name a client can use: those
/// starting so are refused).
pub fn participation_id(producer_id: i64) -> String {
    format!("{PARTICIPATION}{producer_id}")
}

const PARTICIPATION: &str = "\u{0}rokka-participation-";

/// An aborted transaction on one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: u64,
    /// The ABORT marker's offset (None until it is written).
    pub last_offset: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Line {
    /// A transactional id's state now.
    T(TxnMeta),
    /// A transactional id forgotten (expired).
    X(String),
    /// An aborted transaction on (topic, partition).
    A(String, u32, AbortedTxn),
}

/// Budgets and timeouts (`[kafka]` keys in `config/rokka.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnConfig {
    /// Largest `transaction.timeout.ms` a producer may ask for (Kafka
    /// `transaction.max.timeout.ms`).
    pub max_timeout_ms: i64,
    /// A transactional id idle (no open transaction) this long is forgotten
    /// (Kafka `transactional.id.expiration.ms`).
    pub id_expiration_ms: i64,
    /// Most transactional ids held.
    pub max_ids: usize,
    /// Most consumer groups one transaction may add offsets for (Kafka's
    /// are bounded by the 50 partitions of `__consumer_offsets`).
    pub max_groups_per_txn: usize,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            max_timeout_ms: 900_000,
            id_expiration_ms: 7 * 24 * 3600 * 1000,
            max_ids: 100_000,
            max_groups_per_txn: 64,
        }
    }
}

#[derive(Debug, Default)]
struct PartTxns {
    /// Open transactions: producer id → first offset.
    ongoing: BTreeMap<i64, u64>,
    aborted: AbortedList,
}

/// A partition's aborted transactions, indexed for what reads ask of them:
/// whether an offset of a producer is aborted (every transactional batch a
/// RocketMQ or gRPC consumer reads) and which overlap a range (every
/// read_committed fetch) — neither scans the whole list, which a producer
/// that aborts often makes long.
#[derive(Debug, Default, Clone)]
struct AbortedList {
    /// Each producer's, in first-offset order (one producer's transactions
    /// on a partition follow each other, never overlap).
    by_producer: HashMap<i64, Vec<AbortedTxn>>,
    /// Every entry by (first offset, producer id).
    by_first: BTreeSet<(u64, i64)>,
    /// Entries whose ABORT marker is not written yet (a few at most).
    open: BTreeSet<(u64, i64)>,
    /// No closed entry spans more offsets than this (last - first): a
    /// range query starts this far before its range.
    max_span: u64,
    /// The log start the last prune dropped everything below: until the
    /// start moves past it there is nothing more to drop (an entry closes
    /// at the log's end), so the once-a-second prune does not walk every
    /// entry again under the lock fetches take.
    pruned_at: u64,
}

impl AbortedList {
    fn len(&self) -> usize {
        self.by_first.len()
    }

    fn iter(&self) -> impl Iterator<Item = &AbortedTxn> {
        self.by_producer.values().flatten()
    }

    /// The entry of `producer_id` starting at `first`, if any.
    fn find(&self, producer_id: i64, first: u64) -> Option<&AbortedTxn> {
        let v = self.by_producer.get(&producer_id)?;
        v.binary_search_by_key(&first, |a| a.first_offset).ok().map(|i| &v[i])
    }

    fn contains(&self, a: &AbortedTxn) -> bool {
        self.find(a.producer_id, a.first_offset) == Some(a)
    }

    /// Adds `a`, or replaces the entry of its producer starting at its
    /// first offset.
    fn upsert(&mut self, a: AbortedTxn) {
        if a.last_offset.is_some_and(|l| l < self.pruned_at) {
            // (An old entry, replayed: the next prune looks at all again.)
            self.pruned_at = 0;
        }
        let v = self.by_producer.entry(a.producer_id).or_default();
        match v.binary_search_by_key(&a.first_offset, |x| x.first_offset) {
            Ok(i) => v[i] = a,
            Err(i) => v.insert(i, a),
        }
        let key = (a.first_offset, a.producer_id);
        self.by_first.insert(key);
        match a.last_offset {
            Some(l) => {
                self.open.remove(&key);
                self.max_span = self.max_span.max(l.saturating_sub(a.first_offset));
            }
            None => {
                self.open.insert(key);
            }
        }
    }

    /// Closes `producer_id`'s open entries at the ABORT marker's offset;
    /// the entries closed.
    fn close(&mut self, producer_id: i64, last: u64) -> Vec<AbortedTxn> {
        // Its open entries are in `open` (a few), not found by a walk over
        // every transaction it ever aborted.
        let firsts: Vec<u64> = self
            .open
            .iter()
            .filter(|(_, p)| *p == producer_id)
            .map(|(f, _)| *f)
            .collect();
        let mut closed = Vec::with_capacity(firsts.len());
        for first in firsts {
            self.open.remove(&(first, producer_id));
            let Some(v) = self.by_producer.get_mut(&producer_id) else {
                continue;
            };
            if let Ok(i) = v.binary_search_by_key(&first, |a| a.first_offset) {
                v[i].last_offset = Some(last);
                closed.push(v[i]);
                self.max_span = self.max_span.max(last.saturating_sub(first));
            }
        }
        closed
    }

    /// Whether `offset` of a batch by `producer_id` is in one of its
    /// aborted transactions.
    fn is_aborted(&self, producer_id: i64, offset: u64) -> bool {
        let Some(v) = self.by_producer.get(&producer_id) else {
            return false;
        };
        let i = v.partition_point(|a| a.first_offset <= offset);
        i > 0 && v[i - 1].last_offset.is_none_or(|l| offset < l)
    }

    /// Entries overlapping offsets `from..to`, in first-offset order.
    fn overlapping(&self, from: u64, to: u64) -> Vec<AbortedTxn> {
        let lo = from.saturating_sub(self.max_span).min(to);
        let mut keys: Vec<(u64, i64)> = self.by_first.range((lo, i64::MIN)..(to, i64::MIN)).copied().collect();
        // Open ones may start anywhere before the range.
        keys.extend(self.open.iter().filter(|(f, _)| *f < lo));
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
            .filter_map(|(first, pid)| self.find(pid, first).copied())
            .filter(|a| a.first_offset < to && a.last_offset.is_none_or(|l| l >= from))
            .collect()
    }

    /// Drops entries wholly below `start`; how many.
    fn prune(&mut self, start: u64) -> usize {
        if start <= self.pruned_at {
            return 0;
        }
        self.pruned_at = start;
        let before = self.len();
        let mut dropped = Vec::new();
        // The longest span is taken again over what stays (one long
        // transaction pruned no longer widens every range query).
        let mut max_span = 0;
        self.by_producer.retain(|_, v| {
            v.retain(|a| {
                let keep = a.last_offset.is_none_or(|l| l >= start);
                if !keep {
                    dropped.push((a.first_offset, a.producer_id));
                } else if let Some(l) = a.last_offset {
                    max_span = max_span.max(l.saturating_sub(a.first_offset));
                }
                keep
            });
            !v.is_empty()
        });
        for k in &dropped {
            self.by_first.remove(k);
        }
        self.max_span = max_span;
        before - self.len()
    }
}

/// Per-partition transaction state, by topic then partition: looked up by
/// `&str` on every fetch and pull, so without building a key.
#[derive(Debug, Default)]
struct Parts(HashMap<String, HashMap<u32, PartTxns>>);

impl Parts {
    fn get(&self, topic: &str, partition: u32) -> Option<&PartTxns> {
        self.0.get(topic)?.get(&partition)
    }

    /// The partition's state, made if absent (a topic name is copied only
    /// the first time).
    fn entry(&mut self, topic: &str, partition: u32) -> Option<&mut PartTxns> {
        if !self.0.contains_key(topic) {
            self.0.insert(topic.to_string(), HashMap::new());
        }
        self.0.get_mut(topic).map(|m| m.entry(partition).or_default())
    }

    fn iter(&self) -> impl Iterator<Item = (&String, u32, &PartTxns)> {
        self.0
            .iter()
            .flat_map(|(t, m)| m.iter().map(move |(p, pt)| (t, *p, pt)))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&String, u32, &mut PartTxns)> {
        self.0
            .iter_mut()
            .flat_map(|(t, m)| m.iter_mut().map(move |(p, pt)| (&*t, *p, pt)))
    }
}

#[derive(Debug, Default)]
struct Inner {
    txns: HashMap<String, TxnMeta>,
    by_pid: HashMap<i64, String>,
    /// How many of `txns` are parts of other sets' transactions (their
    /// own budget: they never crowd out this set's transactional ids).
    parts: usize,
}

impl Inner {
    fn new(txns: HashMap<String, TxnMeta>) -> Inner {
        let by_pid = txns.values().map(|m| (m.producer_id, m.id.clone())).collect();
        let parts = txns.values().filter(|m| m.coordinator.is_some()).count();
        Inner { txns, by_pid, parts }
    }

    /// This set's own transactional ids.
    fn ids(&self) -> usize {
        self.txns.len() - self.parts
    }
}

/// The coordinator and the per-partition transaction state.
#[derive(Debug)]
pub struct KafkaTxns {
    inner: Mutex<Inner>,
    parts: Mutex<Parts>,
    log: Mutex<TxnLog>,
    config: TxnConfig,
    /// Changes persisted (cluster mode: shipped to replicas when it moves).
    changes: AtomicU64,
    /// Open transactions' partitions whose first batch the log did not
    /// have yet (a replica's state can run ahead of its log).
    unresolved: Mutex<Vec<Unresolved>>,
    /// Transactions whose markers are being written now (an EndTxn, the
    /// retry of a prepared one, a coordinator's end on a participant): one
    /// at a time each.
    finishing: Mutex<std::collections::HashSet<String>>,
}

#[derive(Debug)]
struct Unresolved {
    producer_id: i64,
    topic: String,
    partition: u32,
    start_ms: i64,
}

#[derive(Debug)]
struct TxnLog {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// Lines in the file (since it was last compacted).
    lines: u64,
}

impl TxnLog {
    fn append(&mut self, lines: &[Line]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for l in lines {
            serde_json::to_writer(&mut buf, l).map_err(|e| BrokerError::BadFile {
                path: self.path.clone(),
                reason: e.to_string(),
            })?;
            buf.push(b'\n');
        }
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| BrokerError::Io(dir.to_path_buf(), e))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| BrokerError::Io(self.path.clone(), e))?;
            // A line torn by an earlier failed append ends here: close it,
            // so it stays a line of its own (skipped at load) instead of
            // running into the next one.
            let len = f.metadata().map_err(|e| BrokerError::Io(self.path.clone(), e))?.len();
            if len > 0 {
                use std::io::{Read as _, Seek as _};
                let mut last = [0u8; 1];
                f.seek(std::io::SeekFrom::Start(len - 1))
                    .and_then(|_| f.read_exact(&mut last))
                    .map_err(|e| BrokerError::Io(self.path.clone(), e))?;
                if last[0] != b'\n' {
                    buf.insert(0, b'\n');
                }
            }
            self.file = Some(f);
        }
        let path = self.path.clone();
        let f = self
            .file
            .as_mut()
            .ok_or_else(|| BrokerError::Io(path.clone(), std::io::ErrorKind::NotFound.into()))?;
        let before = f.metadata().map(|m| m.len()).ok();
        // Answered only once on disk, as Kafka's transaction log is.
        let written = f.write_all(&buf).and_then(|()| f.sync_data());
        if let Err(e) = written {
            // A failed append (ENOSPC part-way, EIO on the sync) leaves
            // nothing behind for the next one to be joined to: cut back,
            // and the handle (whose sync state is unknown) is dropped.
            if let Some(len) = before {
                let _ = f.set_len(len);
            }
            self.file = None;
            return Err(BrokerError::Io(path, e));
        }
        self.lines += lines.len() as u64;
        Ok(())
    }
}

type Parsed = (HashMap<String, TxnMeta>, HashMap<(String, u32), AbortedList>);

/// The state a transaction log (or a master's snapshot of it) holds.
fn parse_lines(r: impl BufRead, path: &Path) -> Result<Parsed> {
    let mut txns: HashMap<String, TxnMeta> = HashMap::new();
    let mut aborted: HashMap<(String, u32), AbortedList> = HashMap::new();
    for (n, line) in r.lines().enumerate() {
        let line = line.map_err(|e| BrokerError::Io(path.to_path_buf(), e))?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Line>(&line) {
            Ok(Line::T(m)) => {
                txns.insert(m.id.clone(), m);
            }
            Ok(Line::X(id)) => {
                txns.remove(&id);
            }
            Ok(Line::A(t, p, a)) => {
                aborted.entry((t, p)).or_default().upsert(a);
            }
            // A torn last line (a crash mid-append): its change was never
            // answered. Anything else is damage.
            Err(e) => {
                tracing::warn!(path = %path.display(), line = n + 1, error = %e, "skipping an unreadable transaction-log line");
            }
        }
    }
    Ok((txns, aborted))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl KafkaTxns {
    /// Loads the transaction log of `data_dir` (absent = none), rewriting
    /// it compact.
    pub fn open(data_dir: &Path, config: TxnConfig) -> Result<KafkaTxns> {
        let path = data_dir.join("config").join("kafka-transactions.log");
        let (txns, aborted) = match std::fs::File::open(&path) {
            Ok(f) => parse_lines(std::io::BufReader::new(f), &path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
            Err(e) => return Err(BrokerError::Io(path, e)),
        };
        let mut parts = Parts::default();
        for ((t, p), list) in aborted {
            if let Some(pt) = parts.entry(&t, p) {
                pt.aborted = list;
            }
        }
        let me = KafkaTxns {
            inner: Mutex::new(Inner::new(txns)),
            parts: Mutex::new(parts),
            log: Mutex::new(TxnLog {
                path: path.clone(),
                file: None,
                lines: 0,
            }),
            config,
            changes: AtomicU64::new(0),
            unresolved: Mutex::default(),
            finishing: Mutex::default(),
        };
        me.compact()?;
        Ok(me)
    }

    /// Rewrites the log as one line per live id and aborted entry. The log
    /// lock is held throughout, so a change persisted meanwhile lands after
    /// the snapshot, in the new file.
    fn compact(&self) -> Result<()> {
        let mut log = lock(&self.log);
        let (buf, lines) = self.encoded(&log.path)?;
        if let Some(dir) = log.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| BrokerError::Io(dir.to_path_buf(), e))?;
        }
        rokka_store::checkpoint::write_atomically(&log.path, &buf)?;
        log.file = None;
        log.lines = lines;
        Ok(())
    }

    /// The whole state as log lines (one per live id and aborted entry),
    /// and how many.
    fn encoded(&self, path: &Path) -> Result<(Vec<u8>, u64)> {
        let mut lines = Vec::new();
        for m in lock(&self.inner).txns.values() {
            lines.push(Line::T(m.clone()));
        }
        for (t, p, pt) in lock(&self.parts).iter() {
            for a in pt.aborted.iter() {
                lines.push(Line::A(t.clone(), p, *a));
            }
        }
        let mut buf = Vec::new();
        for l in &lines {
            serde_json::to_writer(&mut buf, l).map_err(|e| BrokerError::BadFile {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
            buf.push(b'\n');
        }
        Ok((buf, lines.len() as u64))
    }

    /// Cluster mode, master: the state to ship to replicas (the compact
    /// log's form), taken under the log lock so no change is half in it.
    pub fn snapshot(&self) -> Result<Vec<u8>> {
        let log = lock(&self.log);
        let (mut buf, _) = self.encoded(&log.path)?;
        if buf.is_empty() {
            // An empty table still goes out (a zero length means
            // "unchanged" on the stream): one blank line, read as nothing.
            buf.push(b'\n');
        }
        Ok(buf)
    }

    /// Changes persisted so far: a replica's copy is current while this
    /// has not moved since it was shipped.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Cluster mode, replica: takes the master's snapshot as this node's
    /// state and log. Open transactions' first offsets are found again
    /// from the log ([`Broker::replace_kafka_txns`]).
    fn replace_with(&self, snapshot: &[u8], first: impl Fn(&TxnMeta, &str, u32) -> Option<u64>) -> Result<()> {
        let mut log = lock(&self.log);
        let (txns, aborted) = parse_lines(snapshot, &log.path)?;
        // The whole new state, open transactions' first offsets included,
        // is built before it replaces the old: readers never see a table
        // without them (an LSO that would let open records through).
        let mut parts = Parts::default();
        for ((t, p), list) in aborted {
            if let Some(pt) = parts.entry(&t, p) {
                pt.aborted = list;
            }
        }
        // First offsets the previous copy found for the same transaction
        // (producer, epoch, start) are kept: a scan of the log for every
        // partition of every open transaction at every shipped table held
        // replication up (the master's transactional calls wait for it).
        let known: std::collections::HashMap<(i64, i16, i64, String, u32), u64> = {
            let inner = lock(&self.inner);
            let old = lock(&self.parts);
            inner
                .txns
                .values()
                .filter(|m| m.state == TxnState::Ongoing || m.state.is_prepare())
                .flat_map(|m| {
                    let old = &old;
                    m.partitions.iter().filter_map(move |(t, p)| {
                        old.get(t, *p)
                            .and_then(|pt| pt.ongoing.get(&m.producer_id))
                            .map(|o| ((m.producer_id, m.epoch, m.start_ms, t.clone(), *p), *o))
                    })
                })
                .collect()
        };
        let mut unresolved = Vec::new();
        // Prepared ones too: a crash or failover between the decision and
        // its markers leaves them to be ended, and an abort records its
        // aborted entries from these first offsets (without them the
        // aborted records reached read_committed readers).
        for m in txns
            .values()
            .filter(|m| m.state == TxnState::Ongoing || m.state.is_prepare())
        {
            for (topic, partition) in &m.partitions {
                let was = known.get(&(m.producer_id, m.epoch, m.start_ms, topic.clone(), *partition));
                match was.copied().or_else(|| first(m, topic, *partition)) {
                    Some(offset) => {
                        if let Some(pt) = parts.entry(topic, *partition) {
                            pt.ongoing.insert(m.producer_id, offset);
                        }
                    }
                    // (A prepared one's partition without a batch after its
                    // last marker is ended there already.)
                    None if m.state.is_prepare() => {}
                    None => unresolved.push(Unresolved {
                        producer_id: m.producer_id,
                        topic: topic.clone(),
                        partition: *partition,
                        start_ms: m.start_ms,
                    }),
                }
            }
        }
        if let Some(dir) = log.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| BrokerError::Io(dir.to_path_buf(), e))?;
        }
        rokka_store::checkpoint::write_atomically(&log.path, snapshot)?;
        log.file = None;
        log.lines = snapshot.iter().filter(|b| **b == b'\n').count() as u64;
        *lock(&self.unresolved) = unresolved;
        *lock(&self.inner) = Inner::new(txns);
        *lock(&self.parts) = parts;
        Ok(())
    }

    /// Compacts the log once it holds many more lines than there are live
    /// states (every transaction appends a few): the file stays bounded by
    /// the ids and aborted entries held, not by the transactions run.
    pub fn maybe_compact(&self) -> Result<bool> {
        let live =
            lock(&self.inner).txns.len() + lock(&self.parts).iter().map(|(_, _, p)| p.aborted.len()).sum::<usize>();
        let written = lock(&self.log).lines;
        if written <= 10_000 + 4 * live as u64 {
            return Ok(false);
        }
        crate::offload(|| self.compact())?;
        Ok(true)
    }

    fn persist(&self, lines: &[Line]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        crate::offload(|| lock(&self.log).append(lines))?;
        self.changes.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    pub fn config(&self) -> &TxnConfig {
        &self.config
    }

    /// Every transactional id's state (DescribeTransactions,
    /// ListTransactions); parts of other sets' transactions are not listed.
    pub fn all(&self) -> Vec<TxnMeta> {
        let mut v: Vec<TxnMeta> = lock(&self.inner)
            .txns
            .values()
            .filter(|m| m.coordinator.is_none())
            .cloned()
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    pub fn get(&self, id: &str) -> Option<TxnMeta> {
        lock(&self.inner)
            .txns
            .get(id)
            .filter(|m| m.coordinator.is_none())
            .cloned()
    }

    /// Producer `producer_id`'s part in a transaction another set
    /// coordinates, if this set holds one.
    pub fn participation(&self, producer_id: i64) -> Option<TxnMeta> {
        lock(&self.inner).txns.get(&participation_id(producer_id)).cloned()
    }

    /// The last stable offset of a partition whose high watermark is `hw`:
    /// the first offset of its oldest open transaction, else `hw`.
    pub fn last_stable_offset(&self, topic: &str, partition: u32, hw: u64) -> u64 {
        let parts = lock(&self.parts);
        match parts.get(topic, partition) {
            Some(p) => p.ongoing.values().copied().min().map_or(hw, |f| f.min(hw)),
            None => hw,
        }
    }

    /// Aborted transactions of a partition overlapping offsets `from..to`
    /// (what a read_committed fetch of that range is told).
    pub fn aborted_in(&self, topic: &str, partition: u32, from: u64, to: u64) -> Vec<AbortedTxn> {
        let parts = lock(&self.parts);
        parts
            .get(topic, partition)
            .map(|p| p.aborted.overlapping(from, to))
            .unwrap_or_default()
    }

    /// The first offset of `producer_id`'s open transaction on a
    /// partition, if it has one there.
    pub fn open_first_offset(&self, topic: &str, partition: u32, producer_id: i64) -> Option<u64> {
        lock(&self.parts)
            .get(topic, partition)
            .and_then(|p| p.ongoing.get(&producer_id).copied())
    }

    /// Whether a stored Kafka batch belongs to an aborted Kafka transaction
    /// (other protocols' readers skip it, as read_committed does).
    pub fn is_aborted_batch(
        &self,
        topic: &str,
        partition: u32,
        b: &rokka_store::record::kafka::KafkaBatchView,
    ) -> bool {
        match rokka_store::record::kafka::BatchInfo::parse(&b.batch) {
            Ok(info) if info.attributes & 0x10 != 0 => {
                self.is_aborted(topic, partition, info.producer_id, b.queue_offset)
            }
            _ => false,
        }
    }

    /// Whether `offset` of a batch by `producer_id` belongs to an aborted
    /// transaction (RocketMQ consumers skip those records).
    pub fn is_aborted(&self, topic: &str, partition: u32, producer_id: i64, offset: u64) -> bool {
        let parts = lock(&self.parts);
        parts
            .get(topic, partition)
            .is_some_and(|p| p.aborted.is_aborted(producer_id, offset))
    }

    /// Drops aborted entries wholly below each partition's log start
    /// (`start(topic, partition)`); returns how many went.
    pub fn prune_aborted(&self, start: impl Fn(&str, u32) -> u64) -> usize {
        let mut parts = lock(&self.parts);
        let mut n = 0;
        for (t, p, pt) in parts.iter_mut() {
            let s = start(t, p);
            n += pt.aborted.prune(s);
        }
        let held: usize = parts.iter().map(|(_, _, pt)| pt.aborted.len()).sum();
        metrics::gauge!("rokka_kafka_aborted_transactions").set(held as f64);
        n
    }

    fn forget_partition(&self, topic: &str) {
        lock(&self.parts).0.remove(topic);
    }
}

/// A transaction being ended: what the markers need.
#[derive(Debug, Clone)]
struct Ending {
    meta: TxnMeta,
    commit: bool,
}

/// Starts a transaction on `m` unless one is open (the first
/// AddPartitionsToTxn or AddOffsetsToTxn after the last ended).
fn begin(m: &mut TxnMeta, now: i64) {
    if m.state != TxnState::Ongoing {
        m.state = TxnState::Ongoing;
        m.start_ms = now;
        m.partitions.clear();
        m.remote.clear();
        m.participants.clear();
        m.groups.clear();
        m.offsets.clear();
    }
}

/// The other broker sets taking part in a transaction this node
/// coordinates: those of its partitions, and those coordinating its
/// groups (holding its offsets until it ends), as recorded when they
/// joined.
fn participant_sets(m: &TxnMeta) -> BTreeSet<String> {
    let mut sets: BTreeSet<String> = m.remote.iter().map(|(s, _, _)| s.clone()).collect();
    sets.extend(m.participants.iter().cloned());
    sets
}

/// Removes a transaction from the ones being ended when its ending is done
/// (or fails).
struct Finishing<'a>(&'a KafkaTxns, String);

impl Drop for Finishing<'_> {
    fn drop(&mut self) {
        lock(&self.0.finishing).remove(&self.1);
    }
}

/// The answer when a transaction's ending failed: another set not reached
/// leaves it prepared and completed later (the client retries until it
/// is); anything else is this node's storage.
fn finish_code(e: &BrokerError) -> i16 {
    match e {
        BrokerError::Remote(_) => code::CONCURRENT_TRANSACTIONS,
        _ => code::KAFKA_STORAGE_ERROR,
    }
}

/// Counts and times a transaction's call to another set's master.
fn remote_done(op: &'static str, started: std::time::Instant, ok: bool) {
    metrics::histogram!("rokka_cluster_remote_txn_seconds", "op" => op).record(started.elapsed().as_secs_f64());
    if !ok {
        metrics::counter!("rokka_cluster_remote_txn_errors_total", "op" => op).increment(1);
    }
}

/// A call to another set's master, tried again for about three seconds
/// (its set may be failing over); then the error (the caller leaves the
/// transaction prepared, and it is tried again later).
async fn retrying<'a, T>(
    op: &'static str,
    set: &str,
    call: impl Fn() -> crate::remote::RemoteCall<'a, T>,
) -> Result<T> {
    let mut delay = std::time::Duration::from_millis(100);
    let first = std::time::Instant::now();
    loop {
        let started = std::time::Instant::now();
        let r = call().await;
        remote_done(op, started, r.is_ok());
        match r {
            Ok(v) => return Ok(v),
            Err(e) if first.elapsed() + delay > std::time::Duration::from_secs(3) => {
                return Err(BrokerError::Remote(format!("{set}: {e}")));
            }
            Err(e) => {
                tracing::debug!(
                    set,
                    op,
                    error = e,
                    "a transaction's call to another broker set failed; retrying"
                );
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
        }
    }
}

/// What InitProducerId gives the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Initialized {
    pub producer_id: i64,
    pub epoch: i16,
}

/// A control batch (COMMIT or ABORT marker) of `producer_id` / `epoch`.
pub fn marker_batch(producer_id: i64, epoch: i16, commit: bool, now_ms: i64) -> Result<bytes::Bytes> {
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    let mut key = BytesMut::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    key.extend_from_slice(&(i16::from(commit)).to_be_bytes());
    let mut value = BytesMut::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&0i32.to_be_bytes()); // coordinator epoch
    let r = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id,
        producer_epoch: epoch,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: now_ms,
        key: Some(key.freeze()),
        value: Some(value.freeze()),
        headers: Default::default(),
    };
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        std::iter::once(&r),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| BrokerError::Store(rokka_store::StoreError::Config(format!("marker: {e}"))))?;
    Ok(out.freeze())
}

impl Broker {
    pub fn kafka_txns(&self) -> &KafkaTxns {
        &self.kafka_txns
    }

    /// Cluster mode, replica: the master's transaction state (shipped with
    /// the replication stream) replaces this node's, and open transactions'
    /// first offsets are found in the replicated log, so read_committed
    /// readers here and this node as the next master hold them back.
    pub fn replace_kafka_txns(&self, snapshot: &[u8]) -> Result<()> {
        crate::offload(|| {
            self.kafka_txns.replace_with(snapshot, |m, topic, partition| {
                self.first_batch_of(topic, partition, m.producer_id, m.start_ms)
            })
        })
    }

    /// After a restart: finds the first offsets of transactions still open
    /// (scanning each of their partitions from the transaction's start).
    pub(crate) fn rebuild_open_transactions(&self) {
        // Prepared ones too (see `replace_with`): their markers are still
        // to be written, an abort's aborted entries from these offsets.
        let open: Vec<TxnMeta> = lock(&self.kafka_txns.inner)
            .txns
            .values()
            .filter(|m| m.state == TxnState::Ongoing || m.state.is_prepare())
            .cloned()
            .collect();
        let mut unresolved = Vec::new();
        for m in open {
            for (topic, partition) in &m.partitions {
                let pending = Unresolved {
                    producer_id: m.producer_id,
                    topic: topic.clone(),
                    partition: *partition,
                    start_ms: m.start_ms,
                };
                if !self.resolve(&pending) && m.state == TxnState::Ongoing {
                    unresolved.push(pending);
                }
            }
        }
        *lock(&self.kafka_txns.unresolved) = unresolved;
        let store = &self.store;
        let pruned = self.kafka_txns.prune_aborted(|t, p| store.min_offset(t, p));
        if pruned > 0 {
            tracing::info!(
                entries = pruned,
                "aborted-transaction entries below the log start dropped"
            );
        }
    }

    /// Records the first offset of an open transaction's batches in one
    /// partition if the log has it; whether it did.
    fn resolve(&self, u: &Unresolved) -> bool {
        let Some(first) = self.first_batch_of(&u.topic, u.partition, u.producer_id, u.start_ms) else {
            return false;
        };
        if let Some(pt) = lock(&self.kafka_txns.parts).entry(&u.topic, u.partition) {
            pt.ongoing.entry(u.producer_id).or_insert(first);
        }
        true
    }

    /// Cluster mode, replica, after each replicated append: open
    /// transactions whose first batch in a partition had not arrived when
    /// the master's state did are looked for again (before the high
    /// watermark lets readers past them).
    pub fn resolve_open_transactions(&self) {
        let mut pending = lock(&self.kafka_txns.unresolved);
        if !pending.is_empty() {
            pending.retain(|u| !self.resolve(u));
        }
    }

    /// The offset of the first batch of `producer_id`'s open transaction in
    /// a partition: its first transactional batch after its last marker,
    /// scanning from shortly before `since_ms` (store time; the same
    /// producer's earlier transactions may end just before it began).
    fn first_batch_of(&self, topic: &str, partition: u32, producer_id: i64, since_ms: i64) -> Option<u64> {
        let cq = self.store.queue(topic, partition)?;
        let mut offset = cq
            .offset_by_store_time(since_ms.saturating_sub(60_000))
            .max(cq.min_offset());
        let end = cq.max_offset();
        let mut first = None;
        while offset < end {
            // Everything written, above the high watermark too: a replica
            // must know an open transaction's first batch before readers
            // may see it.
            let read = self.store.read_written(topic, partition, offset, 256, 4 << 20);
            if read.entries.is_empty() {
                break;
            }
            for e in &read.entries {
                let Ok(rokka_store::Entry::KafkaBatch(b)) = e.decode() else {
                    continue;
                };
                let Ok(info) = rokka_store::record::kafka::BatchInfo::parse(&b.batch) else {
                    continue;
                };
                if info.producer_id != producer_id || info.attributes & 0x10 == 0 {
                    continue;
                }
                if info.attributes & 0x20 != 0 {
                    first = None; // a marker ends whatever came before
                } else if first.is_none() {
                    first = Some(b.queue_offset);
                }
            }
            if read.next_offset <= offset {
                break;
            }
            offset = read.next_offset;
        }
        first
    }

    /// Completes transactions left in PrepareCommit / PrepareAbort for at
    /// least `min_age_ms` (a crash, a failover, another set not reached)
    /// that no one is ending now.
    pub async fn complete_prepared_transactions(&self, min_age_ms: i64) -> Result<()> {
        let now = rokka_store::now_ms();
        let prepared: Vec<TxnMeta> = {
            let finishing = lock(&self.kafka_txns.finishing);
            lock(&self.kafka_txns.inner)
                .txns
                .values()
                .filter(|m| m.state.is_prepare() && now - m.update_ms >= min_age_ms && !finishing.contains(&m.id))
                .cloned()
                .collect()
        };
        let mut failed = Ok(());
        for meta in prepared {
            let commit = meta.state == TxnState::PrepareCommit;
            if min_age_ms == 0 {
                tracing::info!(
                    transactional_id = meta.id,
                    commit,
                    "completing a transaction left prepared"
                );
            } else {
                tracing::debug!(
                    transactional_id = meta.id,
                    commit,
                    "completing a prepared transaction again"
                );
            }
            if let Err(e) = self.finish(Ending { meta, commit }).await {
                failed = Err(e);
            }
        }
        failed
    }

    /// InitProducerId with a transactional id: a producer id and a new
    /// epoch; an open transaction of an earlier incarnation is aborted first
    /// (fencing it).
    pub async fn txn_init_producer_id(
        &self,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> std::result::Result<Initialized, i16> {
        if timeout_ms <= 0 || i64::from(timeout_ms) > self.kafka_txns.config.max_timeout_ms {
            return Err(code::INVALID_TRANSACTION_TIMEOUT);
        }
        if id.starts_with(PARTICIPATION) {
            return Err(code::INVALID_REQUEST);
        }
        let now = rokka_store::now_ms();
        let (ending, line, out) = {
            let mut inner = lock(&self.kafka_txns.inner);
            let is_new = !inner.txns.contains_key(id);
            if is_new && inner.ids() >= self.kafka_txns.config.max_ids {
                metrics::counter!("rokka_kafka_transactional_ids_refused_total").increment(1);
                return Err(code::COORDINATOR_NOT_AVAILABLE);
            }
            if is_new {
                let pid = self.producers.allocate_id();
                let m = TxnMeta::new(id, pid, 0, i64::from(timeout_ms), now, None);
                inner.by_pid.insert(pid, id.to_string());
                inner.txns.insert(id.to_string(), m.clone());
                (
                    None,
                    Line::T(m),
                    Initialized {
                        producer_id: pid,
                        epoch: 0,
                    },
                )
            } else {
                let Some(m) = inner.txns.get(id).cloned() else {
                    return Err(code::COORDINATOR_NOT_AVAILABLE);
                };
                if m.state.is_prepare() {
                    return Err(code::CONCURRENT_TRANSACTIONS);
                }
                if let Some((pid, epoch)) = expected {
                    // KIP-360: a producer re-initialising names itself (or
                    // the epoch before a fencing abort it is retrying).
                    if pid != m.producer_id || (epoch != m.epoch && Some(epoch) != m.last_epoch) {
                        return Err(code::PRODUCER_FENCED);
                    }
                    if epoch != m.epoch && m.state != TxnState::Ongoing {
                        // A retry of a bump it was given (its answer lost):
                        // the current epoch again, not bumped twice (Kafka's
                        // prepareIncrementProducerEpoch). No other producer
                        // came in between: one would have cleared the last
                        // epoch.
                        return Ok(Initialized {
                            producer_id: m.producer_id,
                            epoch: m.epoch,
                        });
                    }
                }
                let mut next = m.clone();
                // The epoch before this bump, which a retry of this call may
                // name — only for the producer itself (KIP-360); a new
                // incarnation fences every earlier epoch (Kafka sets the
                // last epoch to -1).
                next.last_epoch = expected.map(|_| m.epoch);
                let (new_pid, new_epoch) = if m.epoch >= i16::MAX - 1 {
                    (self.producers.allocate_id(), 0)
                } else {
                    (m.producer_id, m.epoch + 1)
                };
                let ending = if m.state == TxnState::Ongoing {
                    // The earlier incarnation's transaction is aborted
                    // under the new epoch, which fences it.
                    // (A producer at the last epoch handed out is fenced
                    // with i16::MAX, as Kafka's prepareFenceProducerEpoch;
                    // its next initialisation gets a new producer id.)
                    next.epoch = m.epoch.saturating_add(1);
                    next.state = TxnState::PrepareAbort;
                    next.update_ms = now;
                    Some(Ending {
                        meta: next.clone(),
                        commit: false,
                    })
                } else {
                    next.producer_id = new_pid;
                    next.epoch = new_epoch;
                    next.state = TxnState::Empty;
                    next.timeout_ms = i64::from(timeout_ms);
                    next.update_ms = now;
                    None
                };
                inner.by_pid.remove(&m.producer_id);
                inner.by_pid.insert(next.producer_id, id.to_string());
                inner.txns.insert(id.to_string(), next.clone());
                (
                    ending,
                    Line::T(next.clone()),
                    Initialized {
                        producer_id: next.producer_id,
                        epoch: next.epoch,
                    },
                )
            }
        };
        if ending.is_none() {
            self.kafka_txns
                .persist(&[line])
                .map_err(|_| code::KAFKA_STORAGE_ERROR)?;
            return Ok(out);
        }
        if let Some(e) = ending {
            self.kafka_txns
                .persist(&[line])
                .map_err(|_| code::KAFKA_STORAGE_ERROR)?;
            self.finish(e).await.map_err(|e| finish_code(&e))?;
            // The aborted transaction is complete: hand out the next epoch.
            let (line, out) = {
                let mut inner = lock(&self.kafka_txns.inner);
                let Some(m) = inner.txns.get_mut(id) else {
                    return Err(code::COORDINATOR_NOT_AVAILABLE);
                };
                if m.epoch >= i16::MAX - 1 {
                    let old = m.producer_id;
                    m.producer_id = self.producers.allocate_id();
                    m.epoch = 0;
                    let (pid, idc) = (m.producer_id, m.id.clone());
                    inner.by_pid.remove(&old);
                    inner.by_pid.insert(pid, idc);
                } else {
                    m.epoch += 1;
                }
                let m = inner.txns.get_mut(id).ok_or(code::COORDINATOR_NOT_AVAILABLE)?;
                m.state = TxnState::Empty;
                m.timeout_ms = i64::from(timeout_ms);
                m.update_ms = rokka_store::now_ms();
                (
                    Line::T(m.clone()),
                    Initialized {
                        producer_id: m.producer_id,
                        epoch: m.epoch,
                    },
                )
            };
            self.kafka_txns
                .persist(&[line])
                .map_err(|_| code::KAFKA_STORAGE_ERROR)?;
            return Ok(out);
        }
        Ok(out)
    }

    /// Checks a request's (transactional id, producer id, epoch) against
    /// the coordinator: the id's state, or Kafka's error.
    fn txn_checked<'a>(
        inner: &'a mut Inner,
        id: &str,
        producer_id: i64,
        epoch: i16,
    ) -> std::result::Result<&'a mut TxnMeta, i16> {
        let m = inner.txns.get_mut(id).ok_or(code::INVALID_PRODUCER_ID_MAPPING)?;
        if m.producer_id != producer_id || m.coordinator.is_some() {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        }
        if epoch < m.epoch {
            return Err(code::PRODUCER_FENCED);
        }
        if epoch > m.epoch {
            return Err(code::INVALID_PRODUCER_EPOCH);
        }
        if m.state.is_prepare() {
            return Err(code::CONCURRENT_TRANSACTIONS);
        }
        Ok(m)
    }

    /// AddPartitionsToTxn: per partition, NONE or why not (all or nothing,
    /// as Kafka: one unknown partition makes the others OPERATION_NOT_ATTEMPTED).
    /// Partitions of other broker sets make those sets' masters
    /// participants ([`crate::remote::RemoteTxns::join`]); they are recorded
    /// first (and reach this set's replicas), so whatever happens to a join
    /// the transaction's end reaches that set.
    pub async fn txn_add_partitions(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, crate::Placed)],
    ) -> std::result::Result<Vec<i16>, i16> {
        use crate::Placed;
        let unknown: Vec<bool> = partitions
            .iter()
            .map(|(t, p)| match p {
                Placed::Here(q) => self.topics.get(t).is_none_or(|i| *q >= i.partitions),
                Placed::Set(..) => false,
                Placed::Unknown => true,
            })
            .collect();
        if unknown.iter().any(|u| *u) {
            let mut inner = lock(&self.kafka_txns.inner);
            Self::txn_checked(&mut inner, id, producer_id, epoch)?;
            return Ok(unknown
                .iter()
                .map(|u| {
                    if *u {
                        code::UNKNOWN_TOPIC_OR_PARTITION
                    } else {
                        code::OPERATION_NOT_ATTEMPTED
                    }
                })
                .collect());
        }
        let mut by_set: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
        for (t, p) in partitions {
            if let Placed::Set(set, q) = p {
                by_set.entry(set.clone()).or_default().push((t.clone(), *q));
            }
        }
        let line = {
            let mut inner = lock(&self.kafka_txns.inner);
            let m = Self::txn_checked(&mut inner, id, producer_id, epoch)?;
            let before = (m.state, m.partitions.len(), m.remote.len());
            let now = rokka_store::now_ms();
            begin(m, now);
            for (t, p) in partitions {
                match p {
                    Placed::Here(q) => {
                        m.partitions.insert((t.clone(), *q));
                    }
                    Placed::Set(set, q) => {
                        m.remote.insert((set.clone(), t.clone(), *q));
                    }
                    Placed::Unknown => {}
                }
            }
            m.update_ms = now;
            ((m.state, m.partitions.len(), m.remote.len()) != before).then(|| Line::T(m.clone()))
        };
        if let Some(line) = line {
            self.kafka_txns
                .persist(&[line])
                .map_err(|_| code::KAFKA_STORAGE_ERROR)?;
        }
        self.join_sets(id, producer_id, epoch, by_set).await?;
        Ok(vec![code::NONE; partitions.len()])
    }

    /// Waits until this set's replicas hold the transaction state as it is
    /// now (as Kafka writes its transaction log with acks=all), then makes
    /// each set in `by_set` a participant for its queues (none: the part
    /// holding a group's offsets). Kafka error codes, retriable when a set
    /// was not reached.
    async fn join_sets(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        by_set: BTreeMap<String, Vec<(String, u32)>>,
    ) -> std::result::Result<(), i16> {
        if let Err(e) = self.txns_durable().await {
            tracing::debug!(transactional_id = id, error = e, "transaction state not replicated");
            return Err(code::COORDINATOR_NOT_AVAILABLE);
        }
        if by_set.is_empty() {
            return Ok(());
        }
        let (Some(remote), Some(own)) = (self.remote_txns(), self.own_set()) else {
            return Err(code::COORDINATOR_NOT_AVAILABLE);
        };
        for (set, parts) in &by_set {
            let started = std::time::Instant::now();
            let r = remote.join(set, own, producer_id, epoch, parts).await;
            remote_done("join", started, matches!(r, Ok(Ok(()))));
            match r {
                Ok(Ok(())) => {}
                // Retriable codes pass; anything else the participant says
                // is about this producer (fenced, unknown partition).
                Ok(Err(c)) => return Err(c),
                Err(e) => {
                    tracing::info!(
                        transactional_id = id,
                        set,
                        error = e,
                        "a broker set did not join a transaction"
                    );
                    return Err(code::COORDINATOR_NOT_AVAILABLE);
                }
            }
        }
        Ok(())
    }

    /// AddOffsetsToTxn: the group's offsets will commit with the
    /// transaction. A group another set coordinates makes that set a
    /// participant (holding the offsets its TxnOffsetCommit brings).
    pub async fn txn_add_offsets(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        group: &str,
    ) -> std::result::Result<(), i16> {
        let elsewhere = match (self.cluster_view(), self.own_set()) {
            (Some(v), Some(own)) => v
                .coordinator_set(group)
                .filter(|s| s.name != own)
                .map(|s| s.name.clone()),
            _ => None,
        };
        let line = {
            let mut inner = lock(&self.kafka_txns.inner);
            let m = Self::txn_checked(&mut inner, id, producer_id, epoch)?;
            let now = rokka_store::now_ms();
            begin(m, now);
            // A transaction's groups are kept and logged with it: bounded
            // (Kafka's are, by the 50 partitions of __consumer_offsets).
            if !m.groups.contains(group) && m.groups.len() >= self.kafka_txns.config.max_groups_per_txn {
                return Err(code::INVALID_REQUEST);
            }
            m.groups.insert(group.to_string());
            if let Some(set) = &elsewhere {
                m.participants.insert(set.clone());
            }
            m.update_ms = now;
            Line::T(m.clone())
        };
        self.kafka_txns
            .persist(&[line])
            .map_err(|_| code::KAFKA_STORAGE_ERROR)?;
        let by_set = elsewhere.map(|s| (s, Vec::new())).into_iter().collect();
        self.join_sets(id, producer_id, epoch, by_set).await
    }

    /// The committed-offset table's budget applies when transactional
    /// offsets are held, not at commit (this set's queues; another set's
    /// are its own).
    fn offsets_fit(&self, offsets: &[PendingOffset]) -> std::result::Result<(), i16> {
        let table = self.store.offsets();
        let here = offsets
            .iter()
            .filter(|o| o.set.is_none())
            .map(|o| (o.group.as_str(), o.topic.as_str(), o.partition, o.metadata.as_str()));
        if !table.has_room_for_all(here) {
            metrics::counter!("rokka_offset_commits_refused_total").increment(1);
            return Err(code::INVALID_COMMIT_OFFSET_SIZE);
        }
        Ok(())
    }

    /// TxnOffsetCommit: offsets held until the transaction commits.
    pub fn txn_commit_offsets(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        offsets: Vec<PendingOffset>,
    ) -> std::result::Result<(), i16> {
        let line = {
            let mut inner = lock(&self.kafka_txns.inner);
            let m = Self::txn_checked(&mut inner, id, producer_id, epoch)?;
            if m.state != TxnState::Ongoing || offsets.iter().any(|o| !m.groups.contains(&o.group)) {
                return Err(code::INVALID_TXN_STATE);
            }
            self.offsets_fit(&offsets)?;
            for o in offsets {
                m.offsets
                    .retain(|x| !(x.group == o.group && x.topic == o.topic && x.partition == o.partition));
                m.offsets.push(o);
            }
            m.update_ms = rokka_store::now_ms();
            Line::T(m.clone())
        };
        self.kafka_txns.persist(&[line]).map_err(|_| code::KAFKA_STORAGE_ERROR)
    }

    /// The partitions `group` has transactional offsets for that are not
    /// applied yet (TxnOffsetCommit taken, the transaction not complete):
    /// (topic, broker set of the queue — `None` this node's —, queue). An
    /// OffsetFetch with `require_stable` answers UNSTABLE_OFFSET_COMMIT for
    /// them (KIP-447), as Kafka's group coordinator does until the marker.
    pub fn pending_txn_offsets(&self, group: &str) -> BTreeSet<(String, Option<String>, u32)> {
        let inner = lock(&self.kafka_txns.inner);
        inner
            .txns
            .values()
            .filter(|m| matches!(m.state, TxnState::Ongoing) || m.state.is_prepare())
            .flat_map(|m| m.offsets.iter())
            .filter(|o| o.group == group)
            .map(|o| (o.topic.clone(), o.set.clone(), o.partition))
            .collect()
    }

    /// Several broker sets, participant side: producer `producer_id`'s part
    /// on this set of the transaction set `coordinator` coordinates, made
    /// Ongoing under `epoch` (made only when `create`: a coordinator's
    /// join; a TxnOffsetCommit finds the part its AddOffsetsToTxn made).
    /// A part still open under an earlier epoch is an orphan (the
    /// coordinator hands out a new epoch only once it has ended every
    /// transaction of the earlier one it knew of): it is marked for abort
    /// (`lines`), and the client retries.
    fn participation_mut<'a>(
        &self,
        inner: &'a mut Inner,
        coordinator: &str,
        producer_id: i64,
        epoch: i16,
        create: bool,
        lines: &mut Vec<Line>,
    ) -> std::result::Result<&'a mut TxnMeta, i16> {
        let id = participation_id(producer_id);
        let now = rokka_store::now_ms();
        if !inner.txns.contains_key(&id) {
            if !create {
                return Err(code::INVALID_TXN_STATE);
            }
            if inner.by_pid.contains_key(&producer_id) {
                // An id this set handed out to a transactional id of its
                // own: not another set's producer.
                return Err(code::INVALID_PRODUCER_ID_MAPPING);
            }
            if inner.parts >= self.kafka_txns.config.max_ids {
                metrics::counter!("rokka_kafka_transaction_parts_refused_total").increment(1);
                return Err(code::COORDINATOR_NOT_AVAILABLE);
            }
            inner.by_pid.insert(producer_id, id.clone());
            inner.parts += 1;
            inner.txns.insert(
                id.clone(),
                TxnMeta::new(&id, producer_id, epoch, 0, now, Some(coordinator.to_string())),
            );
        }
        let m = inner.txns.get_mut(&id).ok_or(code::COORDINATOR_NOT_AVAILABLE)?;
        if epoch < m.epoch {
            return Err(code::PRODUCER_FENCED);
        }
        if m.state.is_prepare() {
            return Err(code::CONCURRENT_TRANSACTIONS);
        }
        if epoch > m.epoch && m.state == TxnState::Ongoing {
            m.state = TxnState::PrepareAbort;
            // Aborted by the next retry pass, not two seconds later.
            m.update_ms = now - 2_000;
            lines.push(Line::T(m.clone()));
            tracing::info!(
                producer_id,
                epoch = m.epoch,
                "aborting an orphaned part of another set's transaction"
            );
            return Err(code::CONCURRENT_TRANSACTIONS);
        }
        if epoch > m.epoch || m.state != TxnState::Ongoing {
            if !create {
                return Err(code::INVALID_TXN_STATE);
            }
            m.epoch = epoch;
            begin(m, now);
        }
        m.coordinator = Some(coordinator.to_string());
        m.update_ms = now;
        Ok(m)
    }

    /// Several broker sets, participant side: this set's `partitions`
    /// (topic, queue; none for the part holding a group's offsets) join
    /// producer `producer_id`'s transaction, which set `coordinator`
    /// coordinates; its transactional batches are taken here from now
    /// until the coordinator ends it. Answered once the set's replicas
    /// hold the part.
    pub async fn txn_participate(
        &self,
        coordinator: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, u32)],
    ) -> std::result::Result<(), i16> {
        if partitions
            .iter()
            .any(|(t, q)| self.topics.get(t).is_none_or(|i| *q >= i.partitions))
        {
            return Err(code::UNKNOWN_TOPIC_OR_PARTITION);
        }
        let mut lines = Vec::new();
        let r = {
            let mut inner = lock(&self.kafka_txns.inner);
            self.participation_mut(&mut inner, coordinator, producer_id, epoch, true, &mut lines)
                .map(|m| {
                    for (t, q) in partitions {
                        m.partitions.insert((t.clone(), *q));
                    }
                    lines.push(Line::T(m.clone()));
                })
        };
        self.kafka_txns.persist(&lines).map_err(|_| code::KAFKA_STORAGE_ERROR)?;
        r?;
        self.txns_durable().await.map_err(|_| code::COORDINATOR_NOT_AVAILABLE)
    }

    /// Several broker sets, group coordinator side: a TxnOffsetCommit of a
    /// transaction another set (`coordinator`) coordinates, into the part
    /// its AddOffsetsToTxn made here; the offsets are held until that
    /// coordinator ends it (applied on commit).
    pub fn txn_participate_offsets(
        &self,
        coordinator: &str,
        producer_id: i64,
        epoch: i16,
        offsets: Vec<PendingOffset>,
    ) -> std::result::Result<(), i16> {
        self.offsets_fit(&offsets)?;
        let mut lines = Vec::new();
        let r = {
            let mut inner = lock(&self.kafka_txns.inner);
            let max_groups = self.kafka_txns.config.max_groups_per_txn;
            match self.participation_mut(&mut inner, coordinator, producer_id, epoch, false, &mut lines) {
                Ok(m) => {
                    let mut r = Ok(());
                    for o in offsets {
                        if !m.groups.contains(&o.group) {
                            if m.groups.len() >= max_groups {
                                r = Err(code::INVALID_REQUEST);
                                break;
                            }
                            m.groups.insert(o.group.clone());
                        }
                        m.offsets.retain(|x| {
                            !(x.group == o.group && x.topic == o.topic && x.partition == o.partition && x.set == o.set)
                        });
                        m.offsets.push(o);
                    }
                    lines.push(Line::T(m.clone()));
                    r
                }
                Err(c) => Err(c),
            }
        };
        self.kafka_txns.persist(&lines).map_err(|_| code::KAFKA_STORAGE_ERROR)?;
        r
    }

    /// Several broker sets, participant side: the coordinator ends producer
    /// `producer_id`'s transaction — this set writes its markers (under
    /// `epoch`) and applies or drops the offsets it held, then forgets its
    /// part. Done at once when it holds no part of it (ended before, or
    /// the part is a later transaction's). A commit under a later epoch
    /// than the part's is not the part's transaction: the part, an orphan,
    /// is aborted.
    pub async fn txn_participant_end(&self, producer_id: i64, epoch: i16, commit: bool) -> Result<()> {
        let ending = {
            let mut inner = lock(&self.kafka_txns.inner);
            let id = participation_id(producer_id);
            let Some(m) = inner.txns.get_mut(&id) else {
                return Ok(());
            };
            if m.epoch > epoch {
                return Ok(());
            }
            let commit = commit && m.epoch == epoch;
            let want = if commit {
                TxnState::PrepareCommit
            } else {
                TxnState::PrepareAbort
            };
            if m.state.is_prepare() && m.state != want {
                return Err(BrokerError::Remote(format!(
                    "producer {producer_id}: asked to {} a transaction being {}",
                    if commit { "commit" } else { "abort" },
                    m.state.name()
                )));
            }
            if m.state != want {
                m.epoch = epoch;
                m.state = want;
                m.update_ms = rokka_store::now_ms();
            }
            Ending {
                meta: m.clone(),
                commit,
            }
        };
        self.kafka_txns.persist(&[Line::T(ending.meta.clone())])?;
        self.finish(ending).await
    }

    /// EndTxn: writes the markers, applies or drops the transaction's
    /// offsets, and answers once all of it is durable.
    pub async fn txn_end(&self, id: &str, producer_id: i64, epoch: i16, commit: bool) -> std::result::Result<(), i16> {
        let (ending, line) = {
            let mut inner = lock(&self.kafka_txns.inner);
            let m = match Self::txn_checked(&mut inner, id, producer_id, epoch) {
                Ok(m) => m,
                Err(code::CONCURRENT_TRANSACTIONS) => return Err(code::CONCURRENT_TRANSACTIONS),
                Err(e) => return Err(e),
            };
            match (m.state, commit) {
                (TxnState::Ongoing, _) => {}
                // A retry of an EndTxn already done.
                (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => return Ok(()),
                // Nothing was added: nothing to end (Kafka answers so too
                // for an abort; a commit of nothing is equally harmless).
                (TxnState::Empty, _) => return Ok(()),
                _ => return Err(code::INVALID_TXN_STATE),
            }
            m.state = if commit {
                TxnState::PrepareCommit
            } else {
                TxnState::PrepareAbort
            };
            m.update_ms = rokka_store::now_ms();
            (
                Ending {
                    meta: m.clone(),
                    commit,
                },
                Line::T(m.clone()),
            )
        };
        self.kafka_txns
            .persist(&[line])
            .map_err(|_| code::KAFKA_STORAGE_ERROR)?;
        // The decision reaches the set's replicas before any marker is
        // written (a new master completes it as decided); not confirmed:
        // retried (the prepared transaction completes meanwhile).
        if let Err(e) = self.txns_durable().await {
            tracing::debug!(transactional_id = id, error = e, "transaction decision not replicated");
            return Err(code::COORDINATOR_NOT_AVAILABLE);
        }
        self.finish(ending).await.map_err(|e| {
            tracing::warn!(transactional_id = id, error = %e, "ending a transaction failed");
            finish_code(&e)
        })
    }

    /// Writes the markers of a prepared transaction and completes it.
    async fn finish(&self, e: Ending) -> Result<()> {
        if !lock(&self.kafka_txns.finishing).insert(e.meta.id.clone()) {
            return Err(BrokerError::Remote(format!(
                "producer {}: its transaction is being ended already",
                e.meta.producer_id
            )));
        }
        let _finishing = Finishing(&self.kafka_txns, e.meta.id.clone());
        // The state as it is now: a copy taken earlier may be stale (ended
        // meanwhile, or a later transaction's), and what an earlier try
        // did is not done again.
        let Some(mut m) = self.still_ending(&e.meta) else {
            return Ok(());
        };
        let now = rokka_store::now_ms();
        // 1. This set's partitions: markers, durable. Aborted entries are
        //    on disk before any ABORT marker is.
        if !m.partitions.is_empty() {
            let mut opened = Vec::new();
            if !e.commit {
                let mut parts = lock(&self.kafka_txns.parts);
                for (t, p) in &m.partitions {
                    if let Some(first) = parts.get(t, *p).and_then(|pt| pt.ongoing.get(&m.producer_id)).copied() {
                        let a = AbortedTxn {
                            producer_id: m.producer_id,
                            first_offset: first,
                            last_offset: None,
                        };
                        if let Some(pt) = parts.entry(t, *p) {
                            if !pt.aborted.contains(&a) {
                                pt.aborted.upsert(a);
                            }
                        }
                        opened.push(Line::A(t.clone(), *p, a));
                    }
                }
            }
            self.kafka_txns.persist(&opened)?;
            let marker = marker_batch(m.producer_id, m.epoch, e.commit, now)?;
            let mut end = 0u64;
            let mut closed = Vec::new();
            for (t, p) in &m.partitions {
                if self.topics.get(t).is_none_or(|i| *p >= i.partitions) {
                    continue; // deleted since
                }
                let r = crate::offload(|| self.store.append_kafka_batch(t, *p, &marker))?;
                end = end.max(r.end_offset);
                self.arrived(t, *p);
                let mut parts = lock(&self.kafka_txns.parts);
                let Some(pt) = parts.entry(t, *p) else { continue };
                pt.ongoing.remove(&m.producer_id);
                if !e.commit {
                    for a in pt.aborted.close(m.producer_id, r.queue_offset) {
                        closed.push(Line::A(t.clone(), *p, a));
                    }
                }
            }
            self.kafka_txns.persist(&closed)?;
            if end > 0 {
                self.store.durable(end).await?;
            }
            m = self.progress(&m, |c| c.partitions.clear())?;
        }
        // 2. Several broker sets: the coordinator ends the transaction on
        //    every other set taking part (its partitions there, and the
        //    offsets its groups' coordinators there hold) before it is
        //    complete; a set not reached leaves it prepared, retried.
        if m.coordinator.is_none() {
            for set in participant_sets(&m) {
                let remote = self
                    .remote_txns()
                    .ok_or_else(|| BrokerError::Remote("no route to other broker sets".into()))?;
                retrying("end", &set, || remote.end(&set, m.producer_id, m.epoch, e.commit)).await?;
                m = self.progress(&m, |c| {
                    c.remote.retain(|(s, _, _)| *s != set);
                    c.participants.remove(&set);
                })?;
            }
        }
        // 3. The offsets are part of what the commit acknowledges: on disk
        //    (this set's queues) or committed on their set's master (other
        //    sets') before the transaction is complete and EndTxn answered.
        if e.commit && !m.offsets.is_empty() {
            if m.offsets.iter().any(|o| o.set.is_none()) {
                let offsets = self.store.offsets();
                for o in m.offsets.iter().filter(|o| o.set.is_none()) {
                    offsets.commit_acknowledged(&o.group, &o.topic, o.partition, o.offset, &o.metadata, o.leader_epoch);
                }
                crate::offload(|| offsets.persist())?;
                // ... and held by the set's in-sync replicas before the
                // transaction forgets them: the transaction state ships at
                // once, the offset table every 200 ms — a failover between
                // the two left a completed commit whose input offsets the
                // new master never had (exactly-once reprocessed). Kafka
                // writes them to __consumer_offsets with acks=all first.
                // Not confirmed: retried (the transaction stays prepared).
                self.offsets_durable(None)
                    .await
                    .map_err(|e| BrokerError::Remote(format!("transaction offsets not replicated: {e}")))?;
                m = self.progress(&m, |c| c.offsets.retain(|o| o.set.is_some()))?;
            }
            for o in m.offsets.clone() {
                let Some(set) = &o.set else { continue };
                let remote = self
                    .remote_offsets()
                    .ok_or_else(|| BrokerError::Remote("no route to other broker sets".into()))?;
                let committed = crate::remote::RemoteOffset {
                    offset: o.offset,
                    metadata: o.metadata.clone(),
                    leader_epoch: o.leader_epoch,
                };
                retrying("offset", set, || {
                    remote.commit(set, &o.group, &o.topic, o.partition, committed.clone())
                })
                .await?;
                m = self.progress(&m, |c| c.offsets.retain(|x| *x != o))?;
            }
        }
        // 4. Complete: a participant forgets its part (the coordinator's
        //    state says how the transaction ended).
        let line = {
            let mut inner = lock(&self.kafka_txns.inner);
            let Some(cur) = inner.txns.get_mut(&m.id) else {
                return Ok(());
            };
            if cur.epoch != m.epoch || cur.state != m.state {
                return Ok(()); // not this transaction any more
            }
            if cur.coordinator.is_some() {
                inner.txns.remove(&m.id);
                inner.by_pid.remove(&m.producer_id);
                inner.parts = inner.parts.saturating_sub(1);
                Line::X(m.id.clone())
            } else {
                cur.state = if e.commit {
                    TxnState::CompleteCommit
                } else {
                    TxnState::CompleteAbort
                };
                cur.partitions.clear();
                cur.remote.clear();
                cur.participants.clear();
                cur.groups.clear();
                cur.offsets.clear();
                cur.start_ms = -1;
                cur.update_ms = rokka_store::now_ms();
                Line::T(cur.clone())
            }
        };
        self.kafka_txns.persist(&[line])?;
        let result = if e.commit { "commit" } else { "abort" };
        if m.coordinator.is_some() {
            metrics::counter!("rokka_kafka_transaction_parts_total", "result" => result).increment(1);
        } else {
            metrics::counter!("rokka_kafka_transactions_total", "result" => result).increment(1);
        }
        Ok(())
    }

    /// The transaction `meta` names as it is now, if it is still being
    /// ended as `meta` says (same producer, epoch and state).
    fn still_ending(&self, meta: &TxnMeta) -> Option<TxnMeta> {
        lock(&self.kafka_txns.inner)
            .txns
            .get(&meta.id)
            .filter(|c| c.producer_id == meta.producer_id && c.epoch == meta.epoch && c.state == meta.state)
            .cloned()
    }

    /// Records a step of ending `m` (what is done is not done again after
    /// a failure); the state now.
    fn progress(&self, m: &TxnMeta, step: impl FnOnce(&mut TxnMeta)) -> Result<TxnMeta> {
        let line = {
            let mut inner = lock(&self.kafka_txns.inner);
            match inner.txns.get_mut(&m.id) {
                Some(c) if c.epoch == m.epoch && c.state == m.state => {
                    step(c);
                    c.clone()
                }
                _ => {
                    let mut gone = m.clone();
                    step(&mut gone);
                    return Ok(gone);
                }
            }
        };
        self.kafka_txns.persist(&[Line::T(line.clone())])?;
        Ok(line)
    }

    /// Aborts transactions open longer than their timeout, bumping the
    /// epoch so their producer is fenced; forgets ids idle past
    /// `id_expiration_ms`. Returns how many were aborted.
    pub async fn txn_expire(&self, now_ms: i64) -> usize {
        let (due, gone) = {
            let mut inner = lock(&self.kafka_txns.inner);
            let mut due = Vec::new();
            for m in inner.txns.values_mut() {
                // Another set's transaction is timed out by its coordinator.
                if m.coordinator.is_none()
                    && m.state == TxnState::Ongoing
                    && m.start_ms >= 0
                    && now_ms - m.start_ms > m.timeout_ms
                {
                    // (i16::MAX fences the last epoch handed out, as Kafka.)
                    m.epoch = m.epoch.saturating_add(1);
                    // A fence: no earlier epoch may re-initialise.
                    m.last_epoch = None;
                    m.state = TxnState::PrepareAbort;
                    m.update_ms = now_ms;
                    due.push(m.clone());
                }
            }
            let exp = self.kafka_txns.config.id_expiration_ms;
            let gone: Vec<(String, i64)> = inner
                .txns
                .values()
                .filter(|m| !matches!(m.state, TxnState::Ongoing) && !m.state.is_prepare())
                .filter(|m| m.coordinator.is_none() && now_ms - m.update_ms > exp)
                .map(|m| (m.id.clone(), m.producer_id))
                .collect();
            for (id, pid) in &gone {
                inner.txns.remove(id);
                inner.by_pid.remove(pid);
            }
            (due, gone)
        };
        if !gone.is_empty() {
            let lines: Vec<Line> = gone.into_iter().map(|(id, _)| Line::X(id)).collect();
            if let Err(e) = self.kafka_txns.persist(&lines) {
                tracing::warn!(error = %e, "transaction log write failed");
            }
        }
        let n = due.len();
        for m in due {
            tracing::info!(transactional_id = m.id, "transaction timed out: aborting");
            metrics::counter!("rokka_kafka_transactions_timed_out_total").increment(1);
            if let Err(e) = self.kafka_txns.persist(&[Line::T(m.clone())]) {
                tracing::warn!(error = %e, "transaction log write failed");
                continue;
            }
            if let Err(e) = self.finish(Ending { meta: m, commit: false }).await {
                tracing::warn!(error = %e, "aborting a timed-out transaction failed");
            }
        }
        {
            let inner = lock(&self.kafka_txns.inner);
            metrics::gauge!("rokka_kafka_transactional_ids").set(inner.ids() as f64);
            metrics::gauge!("rokka_kafka_transaction_parts").set(inner.parts as f64);
        }
        // Aborted entries wholly below their partition's log start are
        // never asked for again; the log is rewritten when it has grown.
        let store = &self.store;
        self.kafka_txns.prune_aborted(|t, p| store.min_offset(t, p));
        if let Err(e) = self.kafka_txns.maybe_compact() {
            tracing::warn!(error = %e, "compacting the transaction log failed");
        }
        n
    }

    /// Appends a transactional batch: its producer must hold the partition
    /// in an open transaction under its current epoch, and be the producer
    /// of `transactional_id`, the request's (the one its WRITE was checked
    /// on: Kafka's verification compares the transaction's producer id with
    /// the batch's — a principal may not write into another's transaction
    /// by naming its producer id). Records the transaction's first offset
    /// in the partition.
    pub fn append_transactional_batch(
        &self,
        transactional_id: Option<&str>,
        topic: &str,
        partition: u32,
        batch: &[u8],
        producer_id: i64,
        epoch: i16,
    ) -> std::result::Result<Result<(crate::SequenceCheck, Option<u64>, u64)>, i16> {
        let inner = lock(&self.kafka_txns.inner);
        let Some(id) = inner.by_pid.get(&producer_id) else {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        };
        // (Another set's part is known here by its producer id only: its
        // coordinator checked the id when it made this set a participant.)
        if !id.starts_with(PARTICIPATION) && transactional_id != Some(id.as_str()) {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        }
        let Some(m) = inner.txns.get(id) else {
            return Err(code::INVALID_PRODUCER_ID_MAPPING);
        };
        // Only the coordinator's epoch (Kafka's verification, KIP-890): an
        // older one is a zombie; a newer one the coordinator never gave
        // would fence the real producer's next batches and the markers of
        // its transaction, which would then never end on this partition.
        if epoch != m.epoch {
            return Err(code::INVALID_PRODUCER_EPOCH);
        }
        if m.state != TxnState::Ongoing || !m.partitions.contains(&(topic.to_string(), partition)) {
            return Err(code::INVALID_TXN_STATE);
        }
        // Under the coordinator's lock: an EndTxn cannot slip its marker
        // in between the check and the append. The transaction's first
        // batch here is readable (and long polls are woken) once appended,
        // and a read_committed fetch takes the last stable offset after
        // its read: before appending, the partition's next offset stands
        // in for the first batch's (the batch lands there or later, so the
        // LSO is held back, never ahead), then the real offset replaces it
        // (or it goes, when nothing was appended). Not held across the
        // append: every fetch takes this lock.
        let placeholder = {
            let mut parts = lock(&self.kafka_txns.parts);
            match parts.entry(topic, partition) {
                Some(pt) if !pt.ongoing.contains_key(&producer_id) => {
                    pt.ongoing
                        .insert(producer_id, self.store.written_max_offset(topic, partition));
                    true
                }
                _ => false,
            }
        };
        let r = self.append_kafka_batch_checked(topic, partition, batch);
        if placeholder {
            let mut parts = lock(&self.kafka_txns.parts);
            if let Some(pt) = parts.entry(topic, partition) {
                match &r {
                    Ok((crate::SequenceCheck::Append, Some(base), _)) => {
                        pt.ongoing.insert(producer_id, *base);
                    }
                    _ => {
                        pt.ongoing.remove(&producer_id);
                    }
                }
            }
        }
        drop(inner);
        Ok(r)
    }

    /// A deleted topic's transaction state goes with it.
    pub(crate) fn forget_topic_transactions(&self, topic: &str) {
        self.kafka_txns.forget_partition(topic);
    }
}

#[cfg(test)]
mod aborted_list_tests {
    use super::{AbortedList, AbortedTxn};
    use rand::{Rng, SeedableRng};

    /// The indexed list answers as the plain scan did, over random
    /// histories of producers opening, aborting and closing transactions,
    /// with pruning.
    #[test]
    fn the_index_answers_as_a_scan_of_every_entry() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        for _ in 0..40 {
            let mut list = AbortedList::default();
            let mut model: Vec<AbortedTxn> = Vec::new();
            let mut next = 0u64;
            let mut open: std::collections::HashMap<i64, u64> = Default::default();
            let mut start = 0u64;
            for _ in 0..300 {
                let pid = rng.gen_range(0..6i64);
                next += rng.gen_range(1..20u64);
                match rng.gen_range(0..10) {
                    // An abort begins: its entry, open.
                    0..=3 if !open.contains_key(&pid) => {
                        let first = next;
                        open.insert(pid, first);
                        let a = AbortedTxn {
                            producer_id: pid,
                            first_offset: first,
                            last_offset: None,
                        };
                        if !list.contains(&a) {
                            list.upsert(a);
                        }
                        model.push(a);
                    }
                    // Its marker: closed.
                    4..=6 if open.contains_key(&pid) => {
                        open.remove(&pid);
                        list.close(pid, next);
                        for a in model
                            .iter_mut()
                            .filter(|a| a.producer_id == pid && a.last_offset.is_none())
                        {
                            a.last_offset = Some(next);
                        }
                    }
                    7 => {
                        start = start.max(next.saturating_sub(rng.gen_range(0..400u64)));
                        let before = model.len();
                        model.retain(|a| a.last_offset.is_none_or(|l| l >= start));
                        assert_eq!(list.prune(start), before - model.len());
                    }
                    _ => {}
                }
                assert_eq!(list.len(), model.len());
                for _ in 0..5 {
                    let off = rng.gen_range(0..next + 10);
                    let p = rng.gen_range(0..6i64);
                    let want = model
                        .iter()
                        .any(|a| a.producer_id == p && a.first_offset <= off && a.last_offset.is_none_or(|l| off < l));
                    assert_eq!(list.is_aborted(p, off), want, "pid {p} offset {off}");
                    let from = rng.gen_range(0..next + 10);
                    let to = from + rng.gen_range(0..200u64);
                    let mut want: Vec<AbortedTxn> = model
                        .iter()
                        .filter(|a| a.first_offset < to && a.last_offset.is_none_or(|l| l >= from))
                        .copied()
                        .collect();
                    want.sort_by_key(|a| (a.first_offset, a.producer_id));
                    assert_eq!(list.overlapping(from, to), want, "{from}..{to}");
                }
            }
            let mut all: Vec<AbortedTxn> = list.iter().copied().collect();
            all.sort_by_key(|a| (a.first_offset, a.producer_id));
            model.sort_by_key(|a| (a.first_offset, a.producer_id));
            assert_eq!(all, model);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line torn by a failed append (ENOSPC part-way) must not swallow
    /// the next, acknowledged one: it is closed off before the next write.
    #[test]
    fn an_append_after_a_torn_line_is_read_back() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let path = dir.path().join("kafka-transactions.log");
        std::fs::write(&path, b"{\"A\":[\"t\",0,{\"producer_id\":7,\"first_off")
            .map_err(|e| BrokerError::Io(path.clone(), e))?;
        let mut log = TxnLog {
            path: path.clone(),
            file: None,
            lines: 0,
        };
        let a = AbortedTxn {
            producer_id: 9,
            first_offset: 3,
            last_offset: Some(5),
        };
        log.append(&[Line::A("t".into(), 0, a)])?;
        let f = std::fs::File::open(&path).map_err(|e| BrokerError::Io(path.clone(), e))?;
        let (_, aborted) = parse_lines(std::io::BufReader::new(f), &path)?;
        assert_eq!(
            aborted
                .get(&("t".to_string(), 0))
                .map(|l| l.iter().copied().collect::<Vec<_>>()),
            Some(vec![a])
        );
        Ok(())
    }
    use crate::BrokerConfig;
    use rokka_store::{MessageStore, StoreConfig};
    use std::sync::Arc;

    /// A coordinator's Kafka error code as the test's error type.
    fn kafka_err(c: i16) -> BrokerError {
        BrokerError::InvalidPartitions(format!("Kafka error {c}"))
    }

    /// A broker in a fresh directory with topic T (one partition).
    fn fresh() -> Result<(tempfile::TempDir, Broker)> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let b = broker(dir.path())?;
        b.create_topic("T", 1)?;
        Ok((dir, b))
    }

    fn lines(path: &Path) -> Result<usize> {
        let text = std::fs::read_to_string(path).map_err(|e| BrokerError::Io(path.to_path_buf(), e))?;
        Ok(text.lines().count())
    }

    fn broker(dir: &Path) -> Result<Broker> {
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
        Broker::new(store, BrokerConfig::default())
    }

    fn batch(pid: i64, epoch: i16, seq: i32, values: &[&str]) -> Result<bytes::Bytes> {
        use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
        let recs: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: pid,
                producer_epoch: epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: seq + i as i32,
                timestamp: 1_000,
                key: None,
                value: Some(bytes::Bytes::copy_from_slice(v.as_bytes())),
                headers: Default::default(),
            })
            .collect();
        let mut out = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut out,
            recs.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .map_err(|e| BrokerError::Store(rokka_store::StoreError::Config(e.to_string())))?;
        Ok(out.freeze())
    }

    /// Several broker sets, participant side: another set's producer writes
    /// here once its coordinator made this set a participant; the LSO
    /// holds until the coordinator's end; the group offsets held for it
    /// apply on commit; the part is forgotten once ended, survives a
    /// restart while open, and is never listed as a transactional id; a
    /// part left open under an earlier epoch (an orphan) is aborted.
    #[tokio::test]
    async fn another_sets_transaction_takes_part_here_until_its_coordinator_ends_it() -> Result<()> {
        let (dir, b) = fresh()?;
        let pid = 4242;
        let offset = |o: u64| PendingOffset {
            group: "g".into(),
            topic: "T".into(),
            partition: 0,
            offset: o,
            metadata: "m".into(),
            leader_epoch: -1,
            set: None,
        };
        let r = b.append_transactional_batch(None, "T", 0, &batch(pid, 0, 0, &["x"])?, pid, 0);
        assert_eq!(r.err(), Some(code::INVALID_PRODUCER_ID_MAPPING), "not joined yet");
        assert_eq!(
            b.txn_participate_offsets("set-b", pid, 0, vec![offset(1)]),
            Err(code::INVALID_TXN_STATE),
            "offsets only into a part its coordinator made"
        );
        assert_eq!(
            b.txn_participate("set-b", pid, 0, &[("T".into(), 9)]).await,
            Err(code::UNKNOWN_TOPIC_OR_PARTITION)
        );
        b.txn_participate("set-b", pid, 0, &[("T".into(), 0)])
            .await
            .map_err(kafka_err)?;
        let r = b.append_transactional_batch(None, "T", 0, &batch(pid, 0, 0, &["a", "b"])?, pid, 0);
        assert!(matches!(r, Ok(Ok((_, Some(0), _)))), "{r:?}");
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, 2), 0);
        b.txn_participate_offsets("set-b", pid, 0, vec![offset(2)])
            .map_err(kafka_err)?;
        assert!(
            b.kafka_txns().all().is_empty(),
            "a part is not a transactional id of this set"
        );
        assert!(b.kafka_txns().get(&participation_id(pid)).is_none());
        assert_eq!(
            b.txn_init_producer_id(&participation_id(pid), 1000, None).await.err(),
            Some(code::INVALID_REQUEST)
        );
        assert_eq!(
            b.txn_end(&participation_id(pid), pid, 0, true).await,
            Err(code::INVALID_PRODUCER_ID_MAPPING)
        );
        // Open across a restart: still held, still the LSO.
        drop(b);
        let b = broker(dir.path())?;
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, 2), 0);
        b.txn_participant_end(pid, 0, true).await?;
        assert_eq!(b.store().max_offset("T", 0), 3, "two records and the COMMIT marker");
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, 3), 3);
        assert!(b.kafka_txns().aborted_in("T", 0, 0, 3).is_empty());
        assert_eq!(
            b.store().offsets().get("g", "T", 0).map(|c| c.offset),
            Some(2),
            "held offset applied"
        );
        assert!(b.kafka_txns().participation(pid).is_none(), "forgotten once ended");
        b.txn_participant_end(pid, 0, true).await?; // a repeated end is done
        assert_eq!(b.store().max_offset("T", 0), 3, "no second marker");
        // The next transaction under a later epoch; an older one is fenced.
        b.txn_participate("set-b", pid, 2, &[("T".into(), 0)])
            .await
            .map_err(kafka_err)?;
        assert_eq!(
            b.txn_participate("set-b", pid, 1, &[("T".into(), 0)]).await,
            Err(code::PRODUCER_FENCED)
        );
        let r = b.append_transactional_batch(None, "T", 0, &batch(pid, 2, 0, &["c"])?, pid, 2);
        assert!(matches!(r, Ok(Ok((_, Some(3), _)))), "{r:?}");
        b.txn_participate_offsets("set-b", pid, 2, vec![offset(4)])
            .map_err(kafka_err)?;
        // Its end never came; the producer's next epoch finds it: aborted
        // (the client retries meanwhile), held offsets dropped.
        assert_eq!(
            b.txn_participate("set-b", pid, 3, &[("T".into(), 0)]).await,
            Err(code::CONCURRENT_TRANSACTIONS)
        );
        b.complete_prepared_transactions(2_000).await?;
        assert!(b.kafka_txns().is_aborted("T", 0, pid, 3));
        assert_eq!(b.store().offsets().get("g", "T", 0).map(|c| c.offset), Some(2));
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, 5), 5);
        b.txn_participate("set-b", pid, 3, &[("T".into(), 0)])
            .await
            .map_err(kafka_err)?;
        let r = b.append_transactional_batch(None, "T", 0, &batch(pid, 3, 0, &["d"])?, pid, 3);
        assert!(matches!(r, Ok(Ok((_, Some(5), _)))), "{r:?}");
        // A stale end (earlier epoch) leaves it; a commit under a later
        // epoch than the part's is not its transaction: it is aborted.
        b.txn_participant_end(pid, 2, true).await?;
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, 6), 5, "still open");
        b.txn_participant_end(pid, 4, true).await?;
        assert!(b.kafka_txns().is_aborted("T", 0, pid, 5));
        assert!(b.kafka_txns().participation(pid).is_none());
        Ok(())
    }

    /// A transaction at the last epoch handed out that times out is fenced
    /// all the same (with i16::MAX): the zombie's next call is refused,
    /// not a new transaction whose commit hides the aborted part.
    #[tokio::test]
    async fn the_last_epoch_is_fenced_on_a_timeout() -> Result<()> {
        let (_dir, b) = fresh()?;
        let id = b.txn_init_producer_id("tx", 1_000, None).await.map_err(kafka_err)?;
        let pid = id.producer_id;
        let last = i16::MAX - 1;
        if let Some(m) = lock(&b.kafka_txns().inner).txns.get_mut("tx") {
            m.epoch = last;
        }
        b.txn_add_partitions("tx", pid, last, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let r = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, last, 0, &["a"])?, pid, last);
        assert!(matches!(r, Ok(Ok((_, Some(0), _)))), "{r:?}");
        assert_eq!(b.txn_expire(rokka_store::now_ms() + 60_000).await, 1);
        assert!(b.kafka_txns().is_aborted("T", 0, pid, 0));
        let again = b
            .txn_add_partitions("tx", pid, last, &[("T".into(), crate::Placed::Here(0))])
            .await;
        assert_eq!(again, Err(code::PRODUCER_FENCED));
        Ok(())
    }

    /// A replica taking the master's table again and again finds an open
    /// transaction's first offsets once, not at every table (each a scan
    /// of the partition's log).
    #[tokio::test]
    async fn a_replica_finds_an_open_transactions_first_offset_once() -> Result<()> {
        let (_dir, b) = fresh()?;
        let id = b.txn_init_producer_id("tx", 60_000, None).await.map_err(kafka_err)?;
        let (pid, ep) = (id.producer_id, id.epoch);
        b.txn_add_partitions("tx", pid, ep, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let r = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, ep, 0, &["a"])?, pid, ep);
        assert!(matches!(r, Ok(Ok((_, Some(0), _)))), "{r:?}");
        let snap = b.kafka_txns().snapshot()?;
        let (_dir2, replica) = fresh()?;
        let scans = std::sync::atomic::AtomicUsize::new(0);
        let first = |_: &TxnMeta, _: &str, _: u32| {
            scans.fetch_add(1, Ordering::Relaxed);
            Some(0)
        };
        replica.kafka_txns().replace_with(&snap, first)?;
        replica.kafka_txns().replace_with(&snap, first)?;
        replica.kafka_txns().replace_with(&snap, first)?;
        assert_eq!(scans.load(Ordering::Relaxed), 1);
        assert_eq!(replica.kafka_txns().last_stable_offset("T", 0, 1), 0);
        Ok(())
    }

    /// An idempotent producer's retry after a restart is known as a
    /// duplicate however many other producers' batches landed since it was
    /// written (within the rebuild window): only the newest 256 entries
    /// were scanned, and a retry behind them was appended twice.
    #[test]
    fn a_retry_after_a_restart_is_a_duplicate_behind_many_batches() -> Result<()> {
        let (dir, b) = fresh()?;
        let (v, base, _) = b.append_kafka_batch_checked("T", 0, &batch(77, 0, 0, &["x"])?)?;
        assert_eq!((v, base), (crate::SequenceCheck::Append, Some(0)));
        for i in 0..300 {
            b.append_kafka_batch_checked("T", 0, &batch(1000 + i, 0, 0, &["y"])?)?;
        }
        drop(b);
        let b = broker(dir.path())?;
        let (v, _, _) = b.append_kafka_batch_checked("T", 0, &batch(77, 0, 0, &["x"])?)?;
        assert_eq!(v, crate::SequenceCheck::Duplicate(0));
        assert_eq!(b.store().max_offset("T", 0), 301, "not appended again");
        Ok(())
    }

    /// A crash after an abort was decided (PrepareAbort on disk) and
    /// before its aborted entries and markers: the restart ends it with
    /// the aborted entry recorded from the transaction's first batch, so
    /// read_committed readers skip its records (they were served before).
    #[tokio::test]
    async fn an_abort_decided_before_a_crash_is_recorded_at_the_restart() -> Result<()> {
        let (dir, b) = fresh()?;
        let id = b.txn_init_producer_id("tx", 60_000, None).await.map_err(kafka_err)?;
        let (pid, ep) = (id.producer_id, id.epoch);
        b.txn_add_partitions("tx", pid, ep, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let r = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, ep, 0, &["a", "b"])?, pid, ep);
        assert!(matches!(r, Ok(Ok((_, Some(0), _)))), "{r:?}");
        let Some(mut m) = b.kafka_txns().get("tx") else {
            return Err(BrokerError::InvalidPartitions("no transaction".into()));
        };
        m.state = TxnState::PrepareAbort;
        b.kafka_txns().persist(&[Line::T(m)])?;
        drop(b);
        let b = broker(dir.path())?;
        b.complete_prepared_transactions(0).await?;
        assert_eq!(b.store().max_offset("T", 0), 3, "two records and the ABORT marker");
        assert!(
            b.kafka_txns().is_aborted("T", 0, pid, 0),
            "the aborted records are marked aborted"
        );
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, 3), 3);
        Ok(())
    }

    #[tokio::test]
    async fn commit_abort_fence_and_restart() -> Result<()> {
        let (dir, b) = fresh()?;
        let id = b.txn_init_producer_id("tx", 60_000, None).await.map_err(kafka_err)?;
        assert_eq!(id.epoch, 0);
        let (pid, ep) = (id.producer_id, id.epoch);
        // Producing before AddPartitionsToTxn is refused.
        let early = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, ep, 0, &["x"])?, pid, ep);
        assert_eq!(early.err(), Some(code::INVALID_TXN_STATE));
        assert_eq!(
            b.txn_add_partitions("tx", pid, ep, &[("T".into(), crate::Placed::Here(0))])
                .await,
            Ok(vec![0])
        );
        // Named under another transactional id (one the writer may WRITE),
        // or none: not this producer's.
        for other in [Some("not-tx"), None] {
            let r = b.append_transactional_batch(other, "T", 0, &batch(pid, ep, 0, &["a", "b"])?, pid, ep);
            assert_eq!(r.err(), Some(code::INVALID_PRODUCER_ID_MAPPING), "{other:?}");
        }
        let r = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, ep, 0, &["a", "b"])?, pid, ep);
        assert!(matches!(r, Ok(Ok((_, Some(0), _)))));
        assert_eq!(
            b.kafka_txns().last_stable_offset("T", 0, 2),
            0,
            "open transaction holds the LSO"
        );
        b.txn_end("tx", pid, ep, false).await.map_err(kafka_err)?;
        assert_eq!(b.store().max_offset("T", 0), 3, "two records and the ABORT marker");
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, 3), 3);
        let ab = b.kafka_txns().aborted_in("T", 0, 0, 3);
        assert_eq!(
            ab,
            vec![AbortedTxn {
                producer_id: pid,
                first_offset: 0,
                last_offset: Some(2)
            }]
        );
        assert!(b.kafka_txns().is_aborted("T", 0, pid, 1));
        // Commit a second one, then fence it with a new incarnation.
        b.txn_add_partitions("tx", pid, ep, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let r = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, ep, 2, &["c"])?, pid, ep);
        assert!(matches!(r, Ok(Ok((_, Some(3), _)))));
        b.txn_end("tx", pid, ep, true).await.map_err(kafka_err)?;
        assert!(!b.kafka_txns().is_aborted("T", 0, pid, 3));
        b.txn_add_partitions("tx", pid, ep, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let r = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, ep, 3, &["zombie"])?, pid, ep);
        assert!(matches!(r, Ok(Ok((_, Some(5), _)))));
        let next = b.txn_init_producer_id("tx", 60_000, None).await.map_err(kafka_err)?;
        assert!(next.epoch > ep, "a new incarnation gets a higher epoch");
        assert!(
            b.kafka_txns().is_aborted("T", 0, pid, 5),
            "the zombie's open transaction was aborted"
        );
        assert_eq!(b.txn_end("tx", pid, ep, true).await, Err(code::PRODUCER_FENCED));
        let z = b.append_transactional_batch(Some("tx"), "T", 0, &batch(pid, ep, 4, &["late"])?, pid, ep);
        assert_eq!(z.err(), Some(code::INVALID_PRODUCER_EPOCH));
        // After a restart the state is as it was; an open transaction after
        // committed ones holds the stable offset at its own first batch.
        let (npid, nep) = (next.producer_id, next.epoch);
        b.txn_add_partitions("tx", npid, nep, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let open = b.append_transactional_batch(Some("tx"), "T", 0, &batch(npid, nep, 0, &["o"])?, npid, nep);
        let Ok(Ok((_, Some(open_at), _))) = open else {
            return Err(BrokerError::InvalidPartitions(format!("{open:?}")));
        };
        let state = b.kafka_txns().get("tx");
        drop(b);
        let b = broker(dir.path())?;
        assert_eq!(b.kafka_txns().get("tx"), state);
        let hw = b.store().max_offset("T", 0);
        assert_eq!(b.kafka_txns().last_stable_offset("T", 0, hw), open_at);
        assert!(b.kafka_txns().is_aborted("T", 0, pid, 0));
        assert!(!b.kafka_txns().is_aborted("T", 0, pid, 3));
        Ok(())
    }

    #[tokio::test]
    async fn the_transaction_log_stays_bounded_by_what_it_holds() -> Result<()> {
        let (dir, b) = fresh()?;
        let id = b.txn_init_producer_id("many", 60_000, None).await.map_err(kafka_err)?;
        let (pid, ep) = (id.producer_id, id.epoch);
        let path = dir.path().join("config").join("kafka-transactions.log");
        for seq in 0..4_000 {
            b.txn_add_partitions("many", pid, ep, &[("T".into(), crate::Placed::Here(0))])
                .await
                .map_err(kafka_err)?;
            let _ = b.append_transactional_batch(Some("many"), "T", 0, &batch(pid, ep, seq, &["v"])?, pid, ep);
            b.txn_end("many", pid, ep, true).await.map_err(kafka_err)?;
        }
        let before = lines(&path)?;
        assert!(before > 10_000, "{before} lines written");
        b.txn_expire(rokka_store::now_ms()).await;
        let after = lines(&path)?;
        assert_eq!(after, 1, "one id, nothing aborted");
        // And the compacted log reloads to the same state.
        let state = b.kafka_txns().get("many");
        drop(b);
        let b = broker(dir.path())?;
        assert_eq!(b.kafka_txns().get("many"), state);
        Ok(())
    }

    #[tokio::test]
    async fn a_committed_transactions_offsets_are_on_disk_when_end_txn_answers() -> Result<()> {
        let (dir, b) = fresh()?;
        let id = b.txn_init_producer_id("o", 60_000, None).await.map_err(kafka_err)?;
        let (pid, ep) = (id.producer_id, id.epoch);
        b.txn_add_offsets("o", pid, ep, "grp").await.map_err(kafka_err)?;
        let o = PendingOffset {
            group: "grp".into(),
            topic: "T".into(),
            partition: 0,
            offset: 42,
            metadata: String::new(),
            leader_epoch: -1,
            set: None,
        };
        b.txn_commit_offsets("o", pid, ep, vec![o]).map_err(kafka_err)?;
        b.txn_end("o", pid, ep, true).await.map_err(kafka_err)?;
        // Read back from the file, as a crash right now would.
        let path = dir.path().join("offsets.json");
        let text = std::fs::read_to_string(&path).map_err(|e| BrokerError::Io(path.clone(), e))?;
        assert!(text.contains("\"grp\"") && text.contains("42"), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn a_transaction_adds_offsets_for_a_bounded_number_of_groups() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| BrokerError::Io("tmp".into(), e))?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let cfg = BrokerConfig {
            max_groups_per_transaction: 2,
            ..BrokerConfig::default()
        };
        let b = Broker::new(store, cfg)?;
        let id = b.txn_init_producer_id("g", 60_000, None).await.map_err(kafka_err)?;
        let (pid, ep) = (id.producer_id, id.epoch);
        for g in ["a", "b", "a"] {
            b.txn_add_offsets("g", pid, ep, g).await.map_err(kafka_err)?;
        }
        assert_eq!(b.txn_add_offsets("g", pid, ep, "c").await, Err(code::INVALID_REQUEST));
        Ok(())
    }

    #[tokio::test]
    async fn a_timed_out_transaction_is_aborted_and_its_producer_fenced() -> Result<()> {
        let (_dir, b) = fresh()?;
        let id = b.txn_init_producer_id("slow", 1_000, None).await.map_err(kafka_err)?;
        let (pid, ep) = (id.producer_id, id.epoch);
        b.txn_add_partitions("slow", pid, ep, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let _ = b.append_transactional_batch(Some("slow"), "T", 0, &batch(pid, ep, 0, &["a"])?, pid, ep);
        assert_eq!(b.txn_expire(rokka_store::now_ms()).await, 0);
        assert_eq!(b.txn_expire(rokka_store::now_ms() + 5_000).await, 1);
        assert!(b.kafka_txns().is_aborted("T", 0, pid, 0));
        assert_eq!(b.txn_end("slow", pid, ep, true).await, Err(code::PRODUCER_FENCED));
        // The fence is final: the timed-out epoch cannot re-initialise.
        assert_eq!(
            b.txn_init_producer_id("slow", 1_000, Some((pid, ep))).await.err(),
            Some(code::PRODUCER_FENCED)
        );
        Ok(())
    }

    /// KIP-360 as Kafka's prepareIncrementProducerEpoch: a producer bumping
    /// its own epoch (after an abortable error) may retry the call whose
    /// answer it lost and gets the same epoch, not a second bump; a new
    /// incarnation (no producer id given) fences every earlier epoch, so
    /// neither the old epoch nor the one before may re-initialise.
    #[tokio::test]
    async fn a_lost_bump_answer_is_retried_and_a_new_incarnation_fences_for_good() -> Result<()> {
        let (_dir, b) = fresh()?;
        let first = b.txn_init_producer_id("r", 60_000, None).await.map_err(kafka_err)?;
        let (pid, e0) = (first.producer_id, first.epoch);
        // The producer bumps its epoch itself; the answer is lost, it retries.
        let bumped = b
            .txn_init_producer_id("r", 60_000, Some((pid, e0)))
            .await
            .map_err(kafka_err)?;
        assert_eq!((bumped.producer_id, bumped.epoch), (pid, e0 + 1));
        let again = b
            .txn_init_producer_id("r", 60_000, Some((pid, e0)))
            .await
            .map_err(kafka_err)?;
        assert_eq!(
            (again.producer_id, again.epoch),
            (pid, e0 + 1),
            "a retry is not bumped again"
        );
        // Naming the current epoch bumps.
        let next = b
            .txn_init_producer_id("r", 60_000, Some((pid, e0 + 1)))
            .await
            .map_err(kafka_err)?;
        assert_eq!(next.epoch, e0 + 2);
        // A zombie with an open transaction, then a new incarnation.
        b.txn_add_partitions("r", pid, e0 + 2, &[("T".into(), crate::Placed::Here(0))])
            .await
            .map_err(kafka_err)?;
        let fresh_one = b.txn_init_producer_id("r", 60_000, None).await.map_err(kafka_err)?;
        assert!(fresh_one.epoch > e0 + 2);
        for old in [e0 + 1, e0 + 2] {
            assert_eq!(
                b.txn_init_producer_id("r", 60_000, Some((pid, old))).await.err(),
                Some(code::PRODUCER_FENCED),
                "epoch {old} re-initialised after a new incarnation"
            );
        }
        Ok(())
    }
}
