//! Fetch with long polling: serves stored batches as they were produced (no
//! re-encoding); waits up to `max_wait_ms` for `min_bytes`, woken by appends
//! to the fetched partitions only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse};
use rokka_store::{Entry, ReadStatus};
use tokio::sync::Notify;

use crate::errors;
use crate::Kafka;

pub async fn handle(k: &Kafka, r: FetchRequest, version: i16) -> FetchResponse {
    let deadline = Instant::now() + Duration::from_millis(r.max_wait_ms.max(0) as u64);
    let min_bytes = r.min_bytes.max(0) as usize;
    loop {
        // Register before reading so an append between the read and the wait
        // still wakes us.
        let waiter = Arc::new(Notify::new());
        for t in &r.topics {
            for p in &t.partitions {
                k.broker
                    .arrivals()
                    .register(t.topic.0.as_str(), p.partition.max(0) as u32, &waiter);
            }
        }
        let (resp, bytes, any_error) = collect(k, &r, version);
        let now = Instant::now();
        if bytes >= min_bytes.max(1) || any_error || now >= deadline {
            return resp;
        }
        let _ = tokio::time::timeout(deadline - now, waiter.notified()).await;
        if Instant::now() >= deadline {
            return collect(k, &r, version).0;
        }
    }
}

fn collect(k: &Kafka, r: &FetchRequest, version: i16) -> (FetchResponse, usize, bool) {
    let broker = k.broker.as_ref();
    let store = broker.store();
    let mut total = 0usize;
    let max_total = if r.max_bytes <= 0 {
        usize::MAX
    } else {
        r.max_bytes as usize
    };
    let mut any_error = false;
    let mut topics = Vec::with_capacity(r.topics.len());
    for t in &r.topics {
        let name = t.topic.0.as_str();
        let info = broker.topics().get(name);
        let mut parts = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let mut pd = PartitionData::default()
                .with_partition_index(p.partition)
                .with_high_watermark(-1)
                .with_last_stable_offset(-1)
                .with_log_start_offset(-1)
                .with_preferred_read_replica(BrokerId(-1))
                .with_aborted_transactions(Some(Vec::new()));
            let known = info
                .as_ref()
                .is_some_and(|i| p.partition >= 0 && (p.partition as u32) < i.partitions);
            if !known {
                pd.error_code = errors::UNKNOWN_TOPIC_OR_PARTITION;
                any_error = true;
                parts.push(pd);
                continue;
            }
            let q = p.partition as u32;
            let room = max_total.saturating_sub(total);
            let part_max = (p.partition_max_bytes.max(0) as usize).min(room);
            let offset = p.fetch_offset.max(0) as u64;
            // Err: negative offset; Ok(None): over the response limit, so
            // positions only; Ok(Some): data.
            let read = if p.fetch_offset < 0 {
                Err(())
            } else if part_max == 0 && total > 0 {
                Ok(None)
            } else {
                Ok(Some(store.read(name, q, offset, u32::MAX, part_max.max(1))))
            };
            let (min, max) = (store.min_offset(name, q), store.max_offset(name, q));
            pd.high_watermark = max as i64;
            pd.last_stable_offset = max as i64;
            if version >= 5 {
                pd.log_start_offset = min as i64;
            }
            match read {
                Err(()) => {
                    pd.error_code = errors::OFFSET_OUT_OF_RANGE;
                    any_error = true;
                }
                Ok(None) => pd.records = Some(Bytes::new()),
                Ok(Some(read)) => match read.status {
                    ReadStatus::Found => {
                        let records = batches(&read.entries, part_max.max(1), total == 0);
                        total += records.len();
                        pd.records = Some(records);
                    }
                    ReadStatus::NoNewMessages | ReadStatus::NoSuchQueue => pd.records = Some(Bytes::new()),
                    ReadStatus::OffsetMoved | ReadStatus::OffsetOverflow => {
                        pd.error_code = errors::OFFSET_OUT_OF_RANGE;
                        any_error = true;
                    }
                },
            }
            parts.push(pd);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_partitions(parts),
        );
    }
    (FetchResponse::default().with_responses(topics), total, any_error)
}

/// Concatenates stored batches (RocketMQ messages converted to one-record
/// batches) up to `limit` bytes; the first always goes in when `first`.
fn batches(entries: &[rokka_store::ReadEntry], limit: usize, first: bool) -> Bytes {
    if entries.len() == 1 {
        if let Ok(Entry::KafkaBatch(b)) = entries[0].decode() {
            return b.batch; // a view of the segment: no copy at all
        }
    }
    let mut out = BytesMut::new();
    for e in entries {
        let piece = match e.decode() {
            Ok(Entry::KafkaBatch(b)) => b.batch,
            Ok(Entry::Message(m)) => message_batch(&m),
            Err(err) => {
                tracing::error!(phys = e.cq.phys_offset, error = %err, "undecodable entry in fetch");
                break;
            }
        };
        if out.len() + piece.len() > limit && !(first && out.is_empty()) {
            break;
        }
        out.put_slice(&piece);
    }
    out.freeze()
}

fn varint(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// A RocketMQ message as a one-record magic-2 batch: key from KEYS, value
/// from the body, timestamp from the born time. (The full mapping, with
/// headers, is the cross-protocol issue's; see docs/mapping.md when it lands.)
fn message_batch(m: &rokka_store::MessageView) -> Bytes {
    let key = m.property("KEYS").map(<[u8]>::to_vec);
    let mut rec = BytesMut::new();
    rec.put_u8(0);
    varint(&mut rec, 0);
    varint(&mut rec, 0);
    match &key {
        Some(k) => {
            varint(&mut rec, k.len() as i64);
            rec.put_slice(k);
        }
        None => varint(&mut rec, -1),
    }
    varint(&mut rec, m.body.len() as i64);
    rec.put_slice(&m.body);
    varint(&mut rec, 0);
    let mut records = BytesMut::new();
    varint(&mut records, rec.len() as i64);
    records.put_slice(&rec);
    let mut b = BytesMut::with_capacity(61 + records.len());
    b.put_i64(m.queue_offset as i64);
    b.put_i32((49 + records.len()) as i32);
    b.put_i32(0);
    b.put_u8(2);
    b.put_u32(0);
    b.put_i16(0);
    b.put_i32(0);
    b.put_i64(m.born_timestamp);
    b.put_i64(m.born_timestamp);
    b.put_i64(-1);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(1);
    b.put_slice(&records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}
