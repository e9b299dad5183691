//! Idempotent-producer state (KIP-98): per (producer id, topic, partition)
//! the producer epoch, the last sequence, and the last five batches, so a
//! retried batch is acknowledged with its original offset instead of being
//! appended twice, and a gap in sequences is refused.
//!
//! State is rebuilt lazily from the log: the first batch of a producer on a
//! partition after a restart looks at that partition's newest batches.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use rokka_store::record::kafka::BatchInfo;
use rokka_store::{Entry, MessageStore};

/// Batches remembered per producer and partition (as Kafka).
const CACHED_BATCHES: usize = 5;
/// Newest entries scanned to rebuild a producer's state after a restart.
const REBUILD_SCAN: u64 = 256;

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
    states: Mutex<HashMap<(i64, String, u32), PartitionState>>,
    next_id: AtomicI64,
}

impl Default for ProducerStates {
    fn default() -> Self {
        // Ids unique across restarts without persisting a counter: start from
        // the clock (ms × 1024), which moves faster than ids are handed out.
        ProducerStates {
            states: Mutex::new(HashMap::new()),
            next_id: AtomicI64::new(rokka_store::now_ms() * 1024),
        }
    }
}

impl ProducerStates {
    /// A fresh producer id (InitProducerId without a transactional id).
    pub fn allocate_id(&self) -> i64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
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
        if info.producer_id < 0 || info.base_sequence < 0 {
            return append().map(|o| (SequenceCheck::Append, Some(o)));
        }
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let key = (info.producer_id, topic.to_string(), partition);
        if !states.contains_key(&key) {
            let rebuilt = rebuild(store, topic, partition, info.producer_id);
            states.insert(key.clone(), rebuilt);
        }
        let st = states.entry(key).or_default();
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
        Ok((SequenceCheck::Append, Some(base)))
    }
}

/// The producer's last batches on this partition, from the newest entries.
fn rebuild(store: &MessageStore, topic: &str, partition: u32, producer_id: i64) -> PartitionState {
    let mut st = PartitionState::default();
    let Some(cq) = store.queue(topic, partition) else {
        return st;
    };
    let end = cq.entry_count();
    let start = end.saturating_sub(REBUILD_SCAN);
    let mut found = Vec::new();
    for idx in start..end {
        let Some(e) = cq.entry(idx) else { continue };
        let r = store.read(topic, partition, e.base_offset.max(cq.min_offset()), 1, 1);
        let Some(entry) = r.entries.first() else { continue };
        if let Ok(Entry::KafkaBatch(b)) = entry.decode() {
            if let Ok(i) = b.info() {
                if i.producer_id == producer_id && i.base_sequence >= 0 {
                    found.push((
                        i.producer_epoch,
                        i.base_sequence,
                        next_seq(i.base_sequence, i.record_count.max(1) - 1),
                        b.queue_offset,
                    ));
                }
            }
        }
    }
    if let Some(&(epoch, ..)) = found.last() {
        st.epoch = epoch;
        for (e, first_seq, last_seq, base_offset) in found {
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
    st
}
