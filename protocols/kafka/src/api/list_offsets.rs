//! ListOffsets: earliest (-2) = log start, latest (-1) = log end offset (the
//! next offset to be written), max timestamp (-3), or the first offset whose
//! record timestamp is at or after a given time.

use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use rokka_store::{Entry, MessageStore};

use crate::errors;
use crate::Kafka;

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
/// v8+: the first offset still on local disk (all of it, here).
const EARLIEST_LOCAL: i64 = -4;
/// v9+: the last offset moved to tiered storage (none, here).
const LATEST_TIERED: i64 = -5;

/// (offset, timestamp) of the first record at or after `ts`, or (-1, -1).
fn by_time(store: &MessageStore, topic: &str, q: u32, ts: i64, limit: usize) -> (i64, i64) {
    let Some(cq) = store.queue(topic, q) else {
        return (-1, -1);
    };
    let min = cq.min_offset();
    // The CQ's message time is a running max: the first entry reaching `ts`
    // holds the answer or precedes it; look inside batches for the record.
    let Some(mut idx) = cq.find(cq.entry_by_msg_time(ts).map_or(u64::MAX, |e| e.base_offset).max(min)) else {
        return (-1, -1);
    };
    while let Some(e) = cq.entry(idx) {
        let read = store.read(topic, q, e.base_offset.max(min), 1, 1);
        let Some(entry) = read.entries.first() else {
            break;
        };
        match entry.decode() {
            Ok(Entry::Message(m)) if m.born_timestamp >= ts => return (m.queue_offset as i64, m.born_timestamp),
            // LogAppendTime: every record of the batch has its append time
            // (the batch's max timestamp), whatever create times it carries:
            // the batch's first offset, with that time, as Kafka answers.
            Ok(Entry::KafkaBatch(b))
                if rokka_store::record::kafka::BatchInfo::parse(&b.batch).is_ok_and(|i| i.is_log_append_time()) =>
            {
                let at = rokka_store::record::kafka::BatchInfo::parse(&b.batch).map_or(-1, |i| i.max_timestamp);
                if at >= ts {
                    return (b.queue_offset.max(min) as i64, at);
                }
            }
            // (Only records at or past the log start: DeleteRecords may
            // have moved it into the middle of this batch — Kafka's
            // searchForTimestamp starts at the log start offset too.)
            Ok(Entry::KafkaBatch(b)) => {
                if let Ok(set) = rokka_broker::validate::decode(&b.batch, limit) {
                    if let Some(r) = set.records.iter().find(|r| r.timestamp >= ts && r.offset >= min as i64) {
                        return (r.offset, r.timestamp);
                    }
                }
            }
            _ => {}
        }
        idx += 1;
    }
    (-1, -1)
}

/// (offset, timestamp) of the record with the highest timestamp, the
/// first one on a tie (Kafka, KIP-734 and KAFKA-16310), or (-1, -1) when
/// the partition holds none.
fn max_timestamp(store: &MessageStore, topic: &str, q: u32, limit: usize) -> (i64, i64) {
    let Some(cq) = store.queue(topic, q) else {
        return (-1, -1);
    };
    let min = cq.min_offset();
    let Some(last) = cq.entry(cq.entry_count().wrapping_sub(1)) else {
        return (-1, -1);
    };
    // Message times in the ConsumeQueue are a running max: the first entry
    // reaching the last one's value holds the record with the highest time.
    let max = last.msg_timestamp;
    let Some(e) = cq.entry_by_msg_time(max) else {
        return (-1, -1);
    };
    let read = store.read(topic, q, e.base_offset.max(min), 1, 1);
    match read.entries.first().map(|entry| entry.decode()) {
        Some(Ok(Entry::Message(m))) => (m.queue_offset as i64, m.born_timestamp),
        // LogAppendTime: every record carries the batch's (append) time, so
        // the first record of the batch is the answer.
        Some(Ok(Entry::KafkaBatch(b)))
            if rokka_store::record::kafka::BatchInfo::parse(&b.batch).is_ok_and(|i| i.is_log_append_time()) =>
        {
            let ts = rokka_store::record::kafka::BatchInfo::parse(&b.batch).map_or(max, |i| i.max_timestamp);
            (b.queue_offset.max(min) as i64, ts)
        }
        // (Records below a log start DeleteRecords moved into the batch
        // are gone: not the answer.)
        Some(Ok(Entry::KafkaBatch(b))) => match rokka_broker::validate::decode(&b.batch, limit) {
            Ok(set) => {
                let live = || set.records.iter().filter(|r| r.offset >= min as i64);
                let best = live().map(|r| r.timestamp).max();
                match live().find(|r| Some(r.timestamp) == best) {
                    Some(r) => (r.offset, r.timestamp),
                    None => (-1, -1),
                }
            }
            Err(_) => (e.base_offset as i64, max),
        },
        _ => (-1, -1),
    }
}

pub fn handle(k: &Kafka, r: ListOffsetsRequest, version: i16) -> ListOffsetsResponse {
    let broker = k.broker.as_ref();
    let store = broker.store();
    let epoch = errors::leader_epoch(k);
    let leads = broker.leads_here();
    // A master elected moments ago whose high watermark has not reached
    // the start of its epoch yet (its replicas have not fetched since):
    // the latest offset and lookups by time are OFFSET_NOT_AVAILABLE,
    // which clients retry (Kafka's fetchOffsetForTimestamp) — the
    // watermark carried over may stand far behind what was committed.
    let behind_epoch = broker.cluster_view().is_some()
        && match (store.epochs().last().map(|e| e.start), store.high_watermark()) {
            (Some(start), Some(hw)) => start > hw,
            _ => false,
        };
    // A partition asked for more than once (librdkafka does, validating a
    // fetch from a follower) is looked up once per timestamp and the answer
    // repeated: each lookup by time may decode the partition's batches, and
    // one small request must not repeat that. (Kafka answers such repeats
    // INVALID_REQUEST; librdkafka's replica reads then started over from the
    // earliest offset.)
    let mut cache: std::collections::HashMap<(String, i32, i64, i32), ListOffsetsPartitionResponse> =
        std::collections::HashMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut twice = std::collections::HashSet::new();
    for t in &r.topics {
        for p in &t.partitions {
            if !seen.insert((t.name.0.as_str(), p.partition_index)) {
                twice.insert((t.name.0.to_string(), p.partition_index));
            }
        }
    }
    drop(seen);
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let info = broker.topics().get(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    // (The topic name copied only for a partition named more
                    // than once: the common request names each once.)
                    let key = (!twice.is_empty() && twice.contains(&(name.clone(), p.partition_index)))
                        .then(|| (name.clone(), p.partition_index, p.timestamp, p.current_leader_epoch));
                    if let Some(done) = key.as_ref().and_then(|k| cache.get(k)) {
                        return done.clone();
                    }
                    let answer = (|| {
                        let resp = ListOffsetsPartitionResponse::default()
                            .with_partition_index(p.partition_index)
                            .with_timestamp(-1)
                            .with_offset(-1);
                        let q = match super::queue_of(k, info.as_ref(), p.partition_index) {
                            Ok(q) => q,
                            Err(code) => return resp.with_error_code(code),
                        };
                        if let Some(code) = errors::check_leader_epoch(epoch, p.current_leader_epoch) {
                            return resp.with_error_code(code);
                        }
                        // Answered by the partition's leader only (Kafka's
                        // fetchOnlyFromLeader; replica id -2 is a debugging
                        // tool's, answered anywhere): a replica's view may lag,
                        // and a restarted node's may hold an untaken tail.
                        if r.replica_id.0 != -2 && !leads {
                            return resp.with_error_code(errors::NOT_LEADER_OR_FOLLOWER);
                        }
                        if behind_epoch && !matches!(p.timestamp, EARLIEST | EARLIEST_LOCAL | LATEST_TIERED) {
                            // OFFSET_NOT_AVAILABLE is defined from v5 on; older
                            // versions get LEADER_NOT_AVAILABLE (Kafka's choice).
                            return resp.with_error_code(if version >= 5 {
                                errors::OFFSET_NOT_AVAILABLE
                            } else {
                                errors::LEADER_NOT_AVAILABLE
                            });
                        }
                        // What the isolation level may read: READ_COMMITTED up
                        // to the last stable offset, else the high watermark.
                        let fetchable = || {
                            let hw = store.max_offset(&name, q);
                            match r.isolation_level {
                                1 => broker.kafka_txns().last_stable_offset(&name, q, hw) as i64,
                                _ => hw as i64,
                            }
                        };
                        let (offset, ts) = match p.timestamp {
                            LATEST => (fetchable(), -1),
                            EARLIEST | EARLIEST_LOCAL => (store.min_offset(&name, q) as i64, -1),
                            LATEST_TIERED => (-1, -1),
                            MAX_TIMESTAMP => {
                                max_timestamp(store, &name, q, k.broker.config().max_batch_decompressed_bytes as usize)
                            }
                            ts => by_time(
                                store,
                                &name,
                                q,
                                ts,
                                k.broker.config().max_batch_decompressed_bytes as usize,
                            ),
                        };
                        // A record found by time past what the isolation level
                        // reads is not found (Kafka's fetchOffsetForTimestamp):
                        // offset, timestamp and leader epoch -1.
                        let searched = p.timestamp >= 0 || p.timestamp == MAX_TIMESTAMP;
                        if offset < 0 || (searched && offset >= fetchable()) {
                            return resp;
                        }
                        resp.with_offset(offset)
                            .with_timestamp(ts)
                            .with_leader_epoch(if version >= 4 { epoch } else { -1 })
                    })();
                    if let Some(key) = key {
                        cache.insert(key, answer.clone());
                    }
                    answer
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}
