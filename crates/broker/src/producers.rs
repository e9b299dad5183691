//! Idempotent-producer state (KIP-98): per (producer id, topic, partition)
//! the producer epoch, the last sequence, and the last five batches, so a
//! retried batch is acknowledged with its original offset instead of being
//! appended twice, and a gap in sequences is refused.
//!
//! State is rebuilt lazily from the log: the first batch of a producer on a
//! partition after a restart looks at that partition's newest batches.
//!
//! Producer ids are chosen by clients (any id ≥ 0 in a batch header makes a
//! state), so the table has a budget ([`ProducerLimits`]): a state not
//! written for `expiration_ms` is forgotten (Kafka's
//! `producer.id.expiration.ms`, a day), and past `max_states` the least
//! recently written one is forgotten first. Forgetting is safe: a producer
//! whose state went is rebuilt from the log at its next batch like after a
//! restart, and a producer the log no longer shows is accepted as new (as
//! Kafka does since KIP-360).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use rokka_store::record::kafka::BatchInfo;
use rokka_store::{Entry, MessageStore};

/// Batches remembered per producer and partition (as Kafka).
const CACHED_BATCHES: usize = 5;
/// Newest entries always scanned to rebuild a producer's state after a
/// restart (or once it was evicted from the table).
const REBUILD_SCAN: u64 = 256;
/// Further back, entries stored within this long are scanned too: a
/// producer retries a batch within its delivery timeout (Java 2 min,
/// librdkafka 5 min), however many other producers' batches landed since.
const REBUILD_WINDOW_MS: i64 = 10 * 60_000;
/// The most entries one rebuild scans.
const REBUILD_SCAN_MAX: u64 = 65_536;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CachedBatch {
    first_seq: i32,
    last_seq: i32,
    base_offset: u64,
}

#[derive(Debug, Default)]
struct PartitionState {
    epoch: i16,
    batches: VecDeque<CachedBatch>,
    /// Its key in [`Table::by_age`]: (last write, tie-break).
    stamp: (u64, u64),
}

/// (producer id, topic, partition).
type Key = (i64, String, u32);

/// A producer with state on a partition: (producer id, epoch, last
/// sequence, last write in ms).
pub type ProducerRow = (i64, i16, i32, u64);

/// The budget of the producer-state table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerLimits {
    /// A (producer, partition) state not written for this long is forgotten
    /// (Kafka `producer.id.expiration.ms`).
    pub expiration_ms: u64,
    /// At most this many (producer, topic, partition) states; the least
    /// recently written is forgotten first.
    pub max_states: usize,
}

impl Default for ProducerLimits {
    fn default() -> Self {
        ProducerLimits {
            expiration_ms: 24 * 3600 * 1000,
            max_states: 100_000,
        }
    }
}

/// The states and their age order, under one lock.
#[derive(Debug, Default)]
struct Table {
    states: HashMap<Key, PartitionState>,
    /// Partitions (by topic) whose recent entries were read for every
    /// producer's state since the start (see `rebuild_all`).
    scanned: HashMap<String, std::collections::HashSet<u32>>,
    /// Every state's stamp → its key, oldest first: expiry and eviction
    /// take from the front without scanning the table.
    by_age: BTreeMap<(u64, u64), Key>,
    /// Tie-break of stamps written in the same millisecond.
    seq: u64,
}

impl Table {
    /// Moves `key`'s state to the young end of the age order.
    fn touch(&mut self, key: &Key, now_ms: u64) {
        self.seq += 1;
        let stamp = (now_ms, self.seq);
        if let Some(st) = self.states.get_mut(key) {
            self.by_age.remove(&st.stamp);
            st.stamp = stamp;
            self.by_age.insert(stamp, key.clone());
        }
    }

    fn insert(&mut self, key: Key, st: PartitionState, now_ms: u64) {
        self.states.insert(key.clone(), st);
        self.touch(&key, now_ms);
    }

    /// Forgets the oldest state; false when there is none.
    fn pop_oldest(&mut self) -> bool {
        match self.by_age.pop_first() {
            Some((_, key)) => {
                self.states.remove(&key);
                true
            }
            None => false,
        }
    }

    /// Forgets the states not written since `now_ms - expiration_ms`.
    fn expire(&mut self, now_ms: u64, expiration_ms: u64) -> u64 {
        let mut n = 0;
        while self
            .by_age
            .first_key_value()
            .is_some_and(|(&(last, _), _)| last.saturating_add(expiration_ms) <= now_ms)
        {
            self.pop_oldest();
            n += 1;
        }
        n
    }
}

/// What the sequence check says about a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceCheck {
    /// Not idempotent, or the next in sequence: append it.
    Append,
    /// Already appended at this base offset: acknowledge without appending.
    Duplicate(u64),
    /// A gap or a replay out of order.
    OutOfOrder,
    /// An epoch older than the producer's current one.
    FencedEpoch,
}

fn next_seq(seq: i32, n: u32) -> i32 {
    // Sequences wrap at i32::MAX to 0.
    ((i64::from(seq) + i64::from(n)) % (i64::from(i32::MAX) + 1)) as i32
}

#[derive(Debug)]
pub struct ProducerStates {
    table: Mutex<Table>,
    limits: ProducerLimits,
    next_id: AtomicI64,
    /// This node's share of the id space (cluster mode: its node id), in
    /// the low bits of every id it hands out, so two nodes started in the
    /// same millisecond never give one id to two producers.
    id_salt: AtomicI64,
}

impl Default for ProducerStates {
    fn default() -> Self {
        ProducerStates::new(ProducerLimits::default())
    }
}

impl ProducerStates {
    pub fn new(limits: ProducerLimits) -> ProducerStates {
        // Ids unique across restarts without persisting a counter: start from
        // the clock (ms × 1024), which moves faster than ids are handed out.
        ProducerStates {
            table: Mutex::new(Table::default()),
            limits: ProducerLimits {
                max_states: limits.max_states.max(1),
                ..limits
            },
            next_id: AtomicI64::new(rokka_store::now_ms() * 1024),
            id_salt: AtomicI64::new(0),
        }
    }

    /// (producer, topic, partition) states held now.
    pub fn len(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The producers with state on every partition in `wanted` (topic ->
    /// partitions): (producer id, epoch, last sequence, last write in ms),
    /// by producer id, in one walk of the table: a DescribeProducers
    /// naming a thousand partitions walked it a thousand times under the
    /// lock every idempotent produce takes.
    pub fn on_partitions(
        &self,
        wanted: &HashMap<String, std::collections::HashSet<u32>>,
    ) -> HashMap<(String, u32), Vec<ProducerRow>> {
        let mut out: HashMap<(String, u32), Vec<ProducerRow>> = HashMap::new();
        if wanted.is_empty() {
            return out;
        }
        {
            let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
            for ((pid, tp, q), st) in t.states.iter() {
                if !wanted.get(tp).is_some_and(|ps| ps.contains(q)) {
                    continue;
                }
                let last = st.batches.back().map_or(-1, |b| b.last_seq);
                out.entry((tp.clone(), *q))
                    .or_default()
                    .push((*pid, st.epoch, last, st.stamp.0));
            }
        }
        for v in out.values_mut() {
            v.sort_unstable();
        }
        out
    }

    /// Forgets every state: each is rebuilt from the log on its producer's
    /// next batch. Cluster mode calls it when this node becomes master (a
    /// state made while it was a replica — a produce it refused — misses
    /// what it replicated since).
    pub fn clear(&self) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.states.clear();
        t.by_age.clear();
        // The next write to each partition reads every producer's state
        // from the log's last minutes again: rebuilt one by one from the
        // newest entries only, a retry of a batch written further back
        // (by the old master, before a failover) was taken as new.
        t.scanned.clear();
        metrics::gauge!("rokka_kafka_producer_states").set(0.0);
    }

    /// Moves the next producer id up to the clock's (ms × 1024) if it is
    /// behind: a node that becomes master hands out no id the old master
    /// (started at another time) may have given.
    pub fn reseed_ids(&self) {
        self.next_id.fetch_max(rokka_store::now_ms() * 1024, Ordering::Relaxed);
    }

    /// Bits of the id space this node's ids are alone in.
    const SALT_BITS: u32 = 10;

    /// Cluster mode: ids handed out here carry `node` (mod 1024) in their
    /// low bits — unique across the cluster's nodes, whatever their start
    /// times (every set's masters hand out ids for producers that write to
    /// every set).
    pub fn set_id_salt(&self, node: u32) {
        self.id_salt
            .store(i64::from(node) & ((1 << Self::SALT_BITS) - 1), Ordering::Relaxed);
    }

    /// A fresh producer id (InitProducerId without a transactional id).
    pub fn allocate_id(&self) -> i64 {
        (self.next_id.fetch_add(1, Ordering::Relaxed) << Self::SALT_BITS) | self.id_salt.load(Ordering::Relaxed)
    }

    /// Checks `info` against the producer's state and, when it is to be
    /// appended, runs `append` (returning the base offset) and records it —
    /// all under one lock so two retries cannot both pass.
    pub fn check_and_append<E>(
        &self,
        store: &MessageStore,
        topic: &str,
        partition: u32,
        info: &BatchInfo,
        append: impl FnOnce() -> Result<u64, E>,
    ) -> Result<(SequenceCheck, Option<u64>), E> {
        let now = u64::try_from(rokka_store::now_ms()).unwrap_or(0);
        self.check_and_append_at(now, store, topic, partition, info, append)
    }

    /// [`ProducerStates::check_and_append`] at `now_ms`: expires, evicts and
    /// stamps states on that clock.
    pub fn check_and_append_at<E>(
        &self,
        now_ms: u64,
        store: &MessageStore,
        topic: &str,
        partition: u32,
        info: &BatchInfo,
        append: impl FnOnce() -> Result<u64, E>,
    ) -> Result<(SequenceCheck, Option<u64>), E> {
        if info.producer_id < 0 || info.base_sequence < 0 {
            return append().map(|o| (SequenceCheck::Append, Some(o)));
        }
        let key = (info.producer_id, topic.to_string(), partition);
        // A producer this table does not hold is rebuilt from the log with
        // the table's lock let go (a scan of up to minutes of entries must
        // not hold up every other produce); a batch of the same producer
        // that got there first wins. A known one (nearly every batch) takes
        // the lock once.
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut all = None;
        let mut rebuilt = None;
        if !guard.states.contains_key(&key) {
            let scanned = guard.scanned.get(topic).is_some_and(|ps| ps.contains(&partition));
            drop(guard);
            // The first write to a partition since the start reads every
            // producer's state from the entries of the last minutes, once;
            // after it an unknown producer is looked for in the newest
            // entries.
            if scanned {
                rebuilt = Some(rebuild(store, topic, partition, info.producer_id));
            } else {
                all = Some(rebuild_all(store, topic, partition));
            }
            guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        }
        let table = &mut *guard;
        let expired = table.expire(now_ms, self.limits.expiration_ms);
        if expired > 0 {
            metrics::counter!("rokka_kafka_producer_states_dropped_total", "reason" => "expired").increment(expired);
        }
        if let Some(mut all) = all {
            if table.scanned.entry(topic.to_string()).or_default().insert(partition) {
                rebuilt = Some(all.remove(&info.producer_id).unwrap_or_default());
                // The others found, as room allows (none evicted for them).
                for (pid, st) in all {
                    let k = (pid, topic.to_string(), partition);
                    if table.states.len() < self.limits.max_states && !table.states.contains_key(&k) {
                        table.insert(k, st, now_ms);
                    }
                }
            }
        }
        if !table.states.contains_key(&key) {
            let mut evicted = 0;
            while table.states.len() >= self.limits.max_states && table.pop_oldest() {
                evicted += 1;
            }
            if evicted > 0 {
                metrics::counter!("rokka_kafka_producer_states_dropped_total", "reason" => "capacity")
                    .increment(evicted);
            }
            // (Expired or evicted since the look above: rebuilt here.)
            let st = rebuilt
                .take()
                .unwrap_or_else(|| rebuild(store, topic, partition, info.producer_id));
            table.insert(key.clone(), st, now_ms);
        }
        metrics::gauge!("rokka_kafka_producer_states").set(table.states.len() as f64);
        let Some(st) = table.states.get_mut(&key) else {
            return append().map(|o| (SequenceCheck::Append, Some(o)));
        };
        let n = info.record_count.max(1);
        let first = info.base_sequence;
        let last = next_seq(first, n - 1);
        let verdict = if st.batches.is_empty() {
            // Unknown producer here (new, or its batches expired): accept,
            // as Kafka does since KIP-360.
            SequenceCheck::Append
        } else if info.producer_epoch < st.epoch {
            SequenceCheck::FencedEpoch
        } else if info.producer_epoch > st.epoch {
            if first == 0 {
                SequenceCheck::Append
            } else {
                SequenceCheck::OutOfOrder
            }
        } else if let Some(b) = st.batches.iter().find(|b| b.first_seq == first && b.last_seq == last) {
            SequenceCheck::Duplicate(b.base_offset)
        } else if st.batches.back().is_some_and(|b| next_seq(b.last_seq, 1) == first) {
            SequenceCheck::Append
        } else {
            SequenceCheck::OutOfOrder
        };
        {
            tracing::debug!(
                producer = info.producer_id,
                epoch = info.producer_epoch,
                first,
                last,
                state_epoch = st.epoch,
                cached = ?st.batches.iter().map(|b| (b.first_seq, b.last_seq)).collect::<Vec<_>>(),
                ?verdict,
                topic,
                partition,
                "producer sequence check"
            );
        }
        match verdict {
            SequenceCheck::Append => {}
            SequenceCheck::Duplicate(base) => return Ok((verdict, Some(base))),
            SequenceCheck::OutOfOrder | SequenceCheck::FencedEpoch => return Ok((verdict, None)),
        }
        let base = append()?;
        if info.producer_epoch != st.epoch {
            st.batches.clear();
            st.epoch = info.producer_epoch;
        }
        st.batches.push_back(CachedBatch {
            first_seq: first,
            last_seq: last,
            base_offset: base,
        });
        while st.batches.len() > CACHED_BATCHES {
            st.batches.pop_front();
        }
        table.touch(&key, now_ms);
        Ok((SequenceCheck::Append, Some(base)))
    }
}

impl ProducerStates {
    /// A replica: records a batch its master appended at `base_offset`, as
    /// a Kafka follower's ProducerStateManager does, so the master this
    /// node may become knows each producer's last batches — a retry after
    /// a failover is answered with its offset, not appended twice (a state
    /// rebuilt from the newest entries misses a producer whose batches
    /// others' writes pushed back).
    pub fn observe(&self, topic: &str, partition: u32, info: &BatchInfo, base_offset: u64) {
        if info.producer_id < 0 || info.base_sequence < 0 {
            return;
        }
        let now_ms = u64::try_from(rokka_store::now_ms()).unwrap_or(0);
        let mut guard = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let table = &mut *guard;
        table.expire(now_ms, self.limits.expiration_ms);
        let key = (info.producer_id, topic.to_string(), partition);
        if !table.states.contains_key(&key) {
            while table.states.len() >= self.limits.max_states && table.pop_oldest() {}
            table.insert(key.clone(), PartitionState::default(), now_ms);
        }
        let Some(st) = table.states.get_mut(&key) else {
            return;
        };
        let first = info.base_sequence;
        let last = next_seq(first, info.record_count.max(1) - 1);
        if info.producer_epoch != st.epoch {
            st.batches.clear();
            st.epoch = info.producer_epoch;
        }
        // The same batch seen again (an entry re-sent after a reconnect) is
        // kept once.
        if !st.batches.iter().any(|b| b.base_offset == base_offset) {
            st.batches.push_back(CachedBatch {
                first_seq: first,
                last_seq: last,
                base_offset,
            });
            while st.batches.len() > CACHED_BATCHES {
                st.batches.pop_front();
            }
        }
        table.touch(&key, now_ms);
    }
}

/// The producer's last batches on this partition, from the newest
/// [`REBUILD_SCAN`] entries (a producer this table lost, or a new one).
fn rebuild(store: &MessageStore, topic: &str, partition: u32, producer_id: i64) -> PartitionState {
    scan(store, topic, partition, false, Some(producer_id))
        .remove(&producer_id)
        .unwrap_or_default()
}

/// Every producer's last batches on this partition from the entries stored
/// within [`REBUILD_WINDOW_MS`] (at least the newest [`REBUILD_SCAN`], at
/// most [`REBUILD_SCAN_MAX`]): the first time a partition is written after
/// a start, so a retry of a batch written before the restart is known
/// however many other producers' batches landed since.
fn rebuild_all(store: &MessageStore, topic: &str, partition: u32) -> HashMap<i64, PartitionState> {
    scan(store, topic, partition, true, None)
}

fn scan(
    store: &MessageStore,
    topic: &str,
    partition: u32,
    window: bool,
    only: Option<i64>,
) -> HashMap<i64, PartitionState> {
    let mut out = HashMap::new();
    let Some(cq) = store.queue(topic, partition) else {
        return out;
    };
    let end = cq.entry_count();
    let mut start = end.saturating_sub(REBUILD_SCAN);
    if window {
        let floor = end.saturating_sub(REBUILD_SCAN_MAX);
        let since = rokka_store::now_ms().saturating_sub(REBUILD_WINDOW_MS);
        while start > floor && cq.entry(start - 1).is_some_and(|e| e.store_timestamp >= since) {
            start -= 1;
        }
    }
    let Some(first) = (start..end).find_map(|i| cq.entry(i)) else {
        return out;
    };
    // (producer id → (epoch, first and last sequence, base offset)), in log order.
    let mut found: HashMap<i64, Vec<(i16, i32, i32, u64)>> = HashMap::new();
    // Everything written, not only what consumers may see: a batch past
    // the high watermark (a failover's new master has it, the old one
    // never acknowledged it) is still a batch a retry must not repeat.
    let mut offset = first.base_offset.max(cq.min_offset());
    let stop = cq.max_offset();
    while offset < stop {
        let r = store.read_written(topic, partition, offset, 256, 4 << 20);
        if r.entries.is_empty() || r.next_offset <= offset {
            break;
        }
        offset = r.next_offset;
        for entry in &r.entries {
            let Ok(Entry::KafkaBatch(b)) = entry.decode() else {
                continue;
            };
            let Ok(i) = b.info() else {
                continue;
            };
            if i.producer_id < 0 || i.base_sequence < 0 || only.is_some_and(|p| p != i.producer_id) {
                continue;
            }
            let list = found.entry(i.producer_id).or_default();
            list.push((
                i.producer_epoch,
                i.base_sequence,
                // The last offset, not the record count: a compacted batch
                // keeps its sequence span.
                next_seq(i.base_sequence, i.last_offset_delta),
                b.queue_offset,
            ));
            // Only the newest few are kept.
            if list.len() > 4 * CACHED_BATCHES {
                list.drain(..list.len() - CACHED_BATCHES);
            }
        }
    }
    for (pid, list) in found {
        let mut st = PartitionState::default();
        if let Some(&(epoch, ..)) = list.last() {
            st.epoch = epoch;
            for (e, first_seq, last_seq, base_offset) in list {
                if e == epoch {
                    st.batches.push_back(CachedBatch {
                        first_seq,
                        last_seq,
                        base_offset,
                    });
                }
            }
            while st.batches.len() > CACHED_BATCHES {
                st.batches.pop_front();
            }
        }
        out.insert(pid, st);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use rokka_store::StoreConfig;

    use super::*;

    fn batch(producer_id: i64, base_sequence: i32) -> BatchInfo {
        BatchInfo {
            base_offset: 0,
            attributes: 0,
            last_offset_delta: 0,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id,
            producer_epoch: 0,
            base_sequence,
            record_count: 1,
            crc: 0,
        }
    }

    /// A producer table over a store without the topic (nothing to rebuild
    /// from): what it knows is only what it holds.
    struct H {
        _dir: tempfile::TempDir,
        store: MessageStore,
        p: ProducerStates,
        next_offset: u64,
    }

    impl H {
        fn new(limits: ProducerLimits) -> Result<H, Box<dyn std::error::Error>> {
            let dir = tempfile::tempdir()?;
            let store = MessageStore::open(StoreConfig::for_tests(dir.path()))?;
            Ok(H {
                _dir: dir,
                store,
                p: ProducerStates::new(limits),
                next_offset: 0,
            })
        }

        fn send(&mut self, now: u64, producer: i64, seq: i32) -> SequenceCheck {
            let offset = self.next_offset;
            let r = self
                .p
                .check_and_append_at(now, &self.store, "T", 0, &batch(producer, seq), || {
                    Ok::<u64, Infallible>(offset)
                });
            match r {
                Ok((v, _)) => {
                    if v == SequenceCheck::Append {
                        self.next_offset += 1;
                    }
                    v
                }
                Err(e) => match e {},
            }
        }
    }

    #[test]
    fn sequences_are_checked_per_producer() -> Result<(), Box<dyn std::error::Error>> {
        let mut h = H::new(ProducerLimits::default())?;
        assert_eq!(h.send(0, 7, 0), SequenceCheck::Append);
        assert_eq!(h.send(1, 7, 0), SequenceCheck::Duplicate(0));
        assert_eq!(h.send(2, 7, 5), SequenceCheck::OutOfOrder);
        assert_eq!(h.send(3, 7, 1), SequenceCheck::Append);
        assert_eq!(h.p.len(), 1);
        Ok(())
    }

    /// A replica records the batches it replicates: as master it knows a
    /// retry of one (Duplicate with its offset) and the next sequence, where
    /// a table without them would accept the retry as new.
    #[test]
    fn batches_observed_as_a_replica_are_known_as_master() -> Result<(), Box<dyn std::error::Error>> {
        let now = u64::try_from(rokka_store::now_ms())?;
        let mut h = H::new(ProducerLimits::default())?;
        for (seq, offset) in [(0, 40), (1, 41), (2, 42)] {
            h.p.observe("T", 0, &batch(9, seq), offset);
        }
        // The same entry re-sent: kept once.
        h.p.observe("T", 0, &batch(9, 2), 42);
        h.next_offset = 43;
        assert_eq!(h.send(now, 9, 1), SequenceCheck::Duplicate(41));
        assert_eq!(h.send(now, 9, 2), SequenceCheck::Duplicate(42));
        assert_eq!(h.send(now, 9, 4), SequenceCheck::OutOfOrder);
        assert_eq!(h.send(now, 9, 3), SequenceCheck::Append);
        // Without them (cleared, as after a truncation), the retry would
        // have been taken as a new producer's first batch.
        h.p.clear();
        assert_eq!(h.send(now, 9, 1), SequenceCheck::Append);
        Ok(())
    }

    /// A producer silent past the expiration is forgotten; one that keeps
    /// writing is not.
    #[test]
    fn states_of_silent_producers_expire() -> Result<(), Box<dyn std::error::Error>> {
        let mut h = H::new(ProducerLimits {
            expiration_ms: 1_000,
            max_states: 100,
        })?;
        assert_eq!(h.send(0, 1, 0), SequenceCheck::Append);
        assert_eq!(h.send(0, 2, 0), SequenceCheck::Append);
        assert_eq!(h.send(900, 2, 1), SequenceCheck::Append);
        assert_eq!(h.p.len(), 2);
        // At 1 s producer 1 has been silent for its whole expiration.
        assert_eq!(h.send(1_000, 2, 2), SequenceCheck::Append);
        assert_eq!(h.p.len(), 1, "producer 1's state outlived its expiration");
        // Forgotten (and not in the log): its next batch is a new producer's.
        assert_eq!(h.send(1_001, 1, 5), SequenceCheck::Append);
        assert_eq!(h.send(1_899, 2, 3), SequenceCheck::Append, "producer 2 kept writing");
        Ok(())
    }

    /// Past the cap the least recently written state goes first; the
    /// producers still writing keep their duplicate detection.
    #[test]
    fn the_number_of_states_is_capped_least_recently_written_first() -> Result<(), Box<dyn std::error::Error>> {
        let mut h = H::new(ProducerLimits {
            expiration_ms: u64::MAX,
            max_states: 3,
        })?;
        for (t, producer) in (1..=3).enumerate() {
            assert_eq!(h.send(t as u64, producer, 0), SequenceCheck::Append);
        }
        // Producer 1 writes again: producer 2 is now the least recent.
        assert_eq!(h.send(10, 1, 1), SequenceCheck::Append);
        // A flood of new producer ids never grows the table past the cap.
        for producer in 100..1_100 {
            assert_eq!(h.send(20, producer, 0), SequenceCheck::Append);
            assert!(h.p.len() <= 3, "{} states", h.p.len());
        }
        assert_eq!(h.p.len(), 3);
        let mut h = H::new(ProducerLimits {
            expiration_ms: u64::MAX,
            max_states: 3,
        })?;
        for (t, producer) in (1..=3).enumerate() {
            h.send(t as u64, producer, 0);
        }
        h.send(10, 1, 1);
        h.send(11, 4, 0);
        // Producer 2 was evicted (its gap is now accepted as a new producer);
        // producer 1's duplicate is still recognised.
        assert_eq!(h.send(12, 1, 1), SequenceCheck::Duplicate(3));
        assert_eq!(h.send(13, 3, 7), SequenceCheck::OutOfOrder, "producer 3 was kept");
        assert_eq!(h.send(14, 2, 9), SequenceCheck::Append, "producer 2 was not evicted");
        Ok(())
    }

    /// After `clear` (a node becoming master), the first write to a
    /// partition reads the producers' states from the log's last minutes:
    /// a retry of a batch 300 entries back is still a duplicate (rebuilt
    /// alone from the newest 256 entries, it was stored again).
    #[test]
    fn after_a_clear_a_retry_from_far_back_is_still_a_duplicate() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = MessageStore::open(StoreConfig::for_tests(dir.path()))?;
        let p = ProducerStates::new(ProducerLimits::default());
        let send = |pid: i64, seq: i32| -> Result<SequenceCheck, Box<dyn std::error::Error>> {
            let mut b = rokka_store::record::kafka::build_test_batch(&[b"v"], 1_000);
            b[43..51].copy_from_slice(&pid.to_be_bytes());
            b[51..53].copy_from_slice(&0i16.to_be_bytes());
            b[53..57].copy_from_slice(&seq.to_be_bytes());
            let crc = crc32c::crc32c(&b[21..]);
            b[17..21].copy_from_slice(&crc.to_be_bytes());
            let info = BatchInfo::parse(&b)?;
            let (v, _) = p.check_and_append(&store, "T", 0, &info, || {
                store.append_kafka_batch("T", 0, &b).map(|r| r.queue_offset)
            })?;
            Ok(v)
        };
        assert_eq!(send(7, 0)?, SequenceCheck::Append);
        for pid in 1000..1300 {
            assert_eq!(send(pid, 0)?, SequenceCheck::Append);
        }
        p.clear();
        assert_eq!(send(7, 0)?, SequenceCheck::Duplicate(0));
        Ok(())
    }
}
