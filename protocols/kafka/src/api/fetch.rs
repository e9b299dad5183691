//! Fetch with long polling: serves stored batches as they were produced (no
//! re-encoding); waits up to `max_wait_ms` for `min_bytes`, woken by appends
//! to the fetched partitions only.

use rokka_broker::Located;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, ProducerId};
use rokka_store::{Entry, ReadStatus};
use tokio::sync::Notify;

use crate::errors;
use crate::Kafka;

/// A fetch response whose records are kept as the stored batches (views of
/// the segments), written to the socket without being copied into one buffer.
#[derive(Debug)]
pub struct FetchReply {
    /// Everything but the records (each partition's `records` is `None`).
    pub resp: FetchResponse,
    /// Per partition, in response order: the batches to send (empty = none).
    pub records: Vec<Vec<Bytes>>,
}

/// `who`: the caller, when authorization is on (topics it may not READ are
/// answered TOPIC_AUTHORIZATION_FAILED, the rest served).
pub async fn handle(k: &Kafka, mut r: FetchRequest, version: i16, who: Option<&crate::authz::Caller>) -> FetchReply {
    // KIP-227: an incremental request stands for its whole session.
    let mode = match k.fetch_sessions.begin(&mut r, version) {
        Ok(m) => m,
        Err(code) => {
            metrics::counter!("rokka_kafka_errors_total", "api" => "Fetch", "code" => crate::errors::label(code))
                .increment(1);
            return FetchReply {
                resp: FetchResponse::default().with_error_code(code).with_session_id(0),
                records: Vec::new(),
            };
        }
    };
    let denied = match who {
        Some(who) => super::guard::fetch(k, who, &mut r, version),
        None => Vec::new(),
    };
    let mut reply = if denied.is_empty() || !r.topics.is_empty() {
        fetch(k, &r, version).await
    } else {
        FetchReply {
            resp: FetchResponse::default(),
            records: Vec::new(),
        }
    };
    for t in denied {
        let parts: Vec<PartitionData> = t
            .partitions
            .iter()
            .map(|p| {
                PartitionData::default()
                    .with_partition_index(p.partition)
                    .with_error_code(crate::authz::TOPIC_AUTHORIZATION_FAILED)
                    .with_high_watermark(-1)
                    .with_last_stable_offset(-1)
                    .with_log_start_offset(-1)
                    .with_preferred_read_replica(BrokerId(-1))
            })
            .collect();
        reply.records.extend(parts.iter().map(|_| Vec::new()));
        reply.resp.responses.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic)
                .with_topic_id(t.topic_id)
                .with_partitions(parts),
        );
    }
    in_session(k, reply, &mode, version)
}

/// The session's part: its id in the response and, in an incremental
/// fetch, only the partitions with something new.
fn in_session(k: &Kafka, mut reply: FetchReply, mode: &crate::sessions::Mode, version: i16) -> FetchReply {
    use crate::sessions::Mode;
    let (id, incremental) = match mode {
        Mode::Sessionless => return reply,
        Mode::New(id) => (*id, false),
        Mode::Incremental(id) => (*id, true),
    };
    k.fetch_sessions
        .trim(id, incremental, version, &mut reply.resp, &mut reply.records);
    reply
}

async fn fetch(k: &Kafka, r: &FetchRequest, version: i16) -> FetchReply {
    let asked = r.max_wait_ms.max(0) as u64;
    if asked > k.config.max_fetch_wait_ms {
        metrics::counter!("rokka_kafka_fetch_waits_capped_total").increment(1);
    }
    let deadline = Instant::now() + Duration::from_millis(asked.min(k.config.max_fetch_wait_ms));
    let min_bytes = r.min_bytes.max(0) as usize;
    // v13+ names topics by id: resolved once (an unknown id stays None).
    let names: Vec<Option<String>> = if version >= 13 {
        r.topics
            .iter()
            .map(|t| k.broker.topics().name_of_id(t.topic_id.as_bytes()))
            .collect()
    } else {
        r.topics.iter().map(|t| Some(t.topic.0.to_string())).collect()
    };
    loop {
        // Register before reading so an append between the read and the wait
        // still wakes us.
        let waiter = Arc::new(Notify::new());
        for (t, name) in r.topics.iter().zip(&names) {
            let Some(name) = name else { continue };
            for p in &t.partitions {
                if let Some(Located::Here(q)) = k.broker.locate(name, p.partition) {
                    k.broker.arrivals().register(name, q, &waiter);
                }
            }
        }
        let (resp, bytes, any_error) = collect(k, r, version, &names);
        let now = Instant::now();
        // As Kafka's ReplicaManager: answered at once when nothing is asked
        // for or `min_bytes` are there (min_bytes 0: at once).
        if r.topics.is_empty() || bytes >= min_bytes || any_error || now >= deadline {
            return served(k, resp, bytes);
        }
        let _ = tokio::time::timeout(deadline - now, waiter.notified()).await;
        if Instant::now() >= deadline {
            let (resp, bytes, _) = collect(k, r, version, &names);
            return served(k, resp, bytes);
        }
    }
}

/// Counts a consumer fetch a replica answered with records (KIP-392).
fn served(k: &Kafka, resp: FetchReply, bytes: usize) -> FetchReply {
    if bytes > 0 && k.broker.cluster_view().is_some_and(|v| !v.is_master()) {
        metrics::counter!("rokka_cluster_replica_reads_total", "protocol" => "kafka").increment(1);
    }
    resp
}

fn collect(k: &Kafka, r: &FetchRequest, version: i16, names: &[Option<String>]) -> (FetchReply, usize, bool) {
    let broker = k.broker.as_ref();
    let store = broker.store();
    // The set's epoch history (empty on a single node: epoch 0 throughout),
    // taken at the first RocketMQ-written message the fetch converts.
    let epochs = std::cell::OnceCell::new();
    let mut total = 0usize;
    // The client's max_bytes, within the broker's own cap (Kafka
    // fetch.max.bytes): one response never holds more than that (but at
    // least one batch, as Kafka answers a batch larger than the limit).
    let cap = k.config.max_fetch_bytes.max(1) as usize;
    let max_total = if r.max_bytes <= 0 {
        cap
    } else {
        (r.max_bytes as usize).min(cap)
    };
    let mut any_error = false;
    // READ_COMMITTED (isolation level 1): only offsets below the last stable one.
    let read_committed = r.isolation_level == 1;
    // Cluster mode: the master may point a consumer at a replica in its
    // rack (KIP-392); a replica serves consumers up to the high watermark,
    // but only those that can be pointed back (v11+), as Kafka's followers.
    // One look at the view per collect (its epoch too).
    let view = broker.cluster_view();
    let epoch = view.as_ref().map_or(0, |v| v.epoch as i32);
    let preferred = match &view {
        Some(v) if version >= 11 => v.preferred_read_replica(r.rack_id.as_str()),
        _ => None,
    };
    // (No view yet in cluster mode: nothing is known to lead here.)
    let not_leader = broker.cluster_view_pending() || (version < 11 && view.as_ref().is_some_and(|v| !v.is_master()));
    let mut redirected = false;
    let mut topics = Vec::with_capacity(r.topics.len());
    let mut all_records: Vec<Vec<Bytes>> = Vec::new();
    for (t, name) in r.topics.iter().zip(names) {
        let id_unknown = name.is_none();
        let name = name.as_deref().unwrap_or("");
        let info = if id_unknown { None } else { broker.topics().get(name) };
        // A topic whose compression.type is zstd, to a fetch before v10
        // (which cannot carry zstd): UNSUPPORTED_COMPRESSION_TYPE, as
        // Kafka's maybeConvertFetchedData answers.
        let zstd_too_new =
            version < 10 && info.is_some() && broker.topic_config(name).is_some_and(|c| c.compression == Some(4));
        let mut parts = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let mut pd = PartitionData::default()
                .with_partition_index(p.partition)
                .with_high_watermark(-1)
                .with_last_stable_offset(-1)
                .with_log_start_offset(-1)
                .with_preferred_read_replica(BrokerId(-1))
                .with_aborted_transactions(Some(Vec::new()));
            let at = info
                .as_ref()
                .map_or(Located::Unknown, |i| i.locate(p.partition, broker.own_set()));
            let known = at != Located::Unknown;
            let fenced = match at {
                // Another broker set's partition: its master serves it.
                Located::OtherSet => Some(errors::NOT_LEADER_OR_FOLLOWER),
                _ => errors::check_leader_epoch(epoch, p.current_leader_epoch),
            };
            if !known || fenced.is_some() {
                pd.error_code = match fenced {
                    _ if !known && id_unknown => errors::UNKNOWN_TOPIC_ID,
                    _ if !known => errors::UNKNOWN_TOPIC_OR_PARTITION,
                    Some(code) => code,
                    None => errors::UNKNOWN_TOPIC_OR_PARTITION,
                };
                any_error = true;
                parts.push(pd);
                all_records.push(Vec::new());
                continue;
            }
            let Located::Here(q) = at else {
                continue;
            };
            if not_leader || zstd_too_new {
                pd.error_code = if not_leader {
                    errors::NOT_LEADER_OR_FOLLOWER
                } else {
                    errors::UNSUPPORTED_COMPRESSION_TYPE
                };
                any_error = true;
                parts.push(pd);
                all_records.push(Vec::new());
                continue;
            }
            if let Some(replica) = preferred {
                // No records: the consumer fetches from `replica` next.
                let max = store.max_offset(name, q);
                pd.preferred_read_replica = BrokerId(replica as i32);
                pd.high_watermark = max as i64;
                pd.last_stable_offset = broker.kafka_txns().last_stable_offset(name, q, max) as i64;
                if version >= 5 {
                    pd.log_start_offset = store.min_offset(name, q) as i64;
                }
                redirected = true;
                any_error = true; // answered at once
                parts.push(pd);
                all_records.push(Vec::new());
                continue;
            }
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
            // The read already looked the queue up; only a read that did not
            // happen needs the bounds fetched on their own.
            let (min, max) = match &read {
                Ok(Some(r)) if r.status != ReadStatus::NoSuchQueue => (r.min_offset, r.max_offset),
                _ => (store.min_offset(name, q), store.max_offset(name, q)),
            };
            pd.high_watermark = max as i64;
            // Open Kafka transactions hold the last stable offset back; a
            // read_committed fetch gets nothing at or past it.
            let lso = broker.kafka_txns().last_stable_offset(name, q, max);
            pd.last_stable_offset = lso as i64;
            if version >= 5 {
                pd.log_start_offset = min as i64;
            }
            let mut pieces = Vec::new();
            match read {
                Err(()) => {
                    pd.error_code = errors::OFFSET_OUT_OF_RANGE;
                    any_error = true;
                }
                Ok(None) => {}
                Ok(Some(read)) => match read.status {
                    ReadStatus::Found => {
                        let entries = if read_committed {
                            let stable = read.entries.iter().take_while(|e| e.cq.base_offset < lso).count();
                            &read.entries[..stable]
                        } else {
                            &read.entries[..]
                        };
                        let append_time = std::cell::OnceCell::new();
                        pieces = batches(
                            entries,
                            || epochs.get_or_init(|| store.epochs()),
                            || {
                                *append_time
                                    .get_or_init(|| broker.topic_config(name).is_some_and(|c| c.log_append_time))
                            },
                            part_max.max(1),
                            total == 0,
                        );
                        if read_committed {
                            let end = entries
                                .iter()
                                .take(pieces.len())
                                .last()
                                .map_or(offset, |e| e.cq.base_offset + u64::from(e.cq.count.max(1)));
                            let aborted = broker.kafka_txns().aborted_in(name, q, offset, end);
                            pd.aborted_transactions = Some(
                                aborted
                                    .into_iter()
                                    .map(|a| {
                                        AbortedTransaction::default()
                                            .with_producer_id(ProducerId(a.producer_id))
                                            .with_first_offset(a.first_offset as i64)
                                    })
                                    .collect(),
                            );
                        }
                        let bytes = pieces.iter().map(Bytes::len).sum::<usize>();
                        total += bytes;
                        if !pieces.is_empty() {
                            let n: u64 = entries
                                .iter()
                                .take(pieces.len())
                                .map(|e| u64::from(e.cq.count.max(1)))
                                .sum();
                            k.broker.traffic().kafka_out.record(name, n, bytes as u64);
                        }
                    }
                    ReadStatus::NoNewMessages => {}
                    // A queue nothing was written to yet is empty at 0.
                    ReadStatus::NoSuchQueue if offset == 0 => {}
                    // Past the end of a log (an empty one here): out of
                    // range at once, as Kafka's log read, so the consumer
                    // resets now, not after the first records arrive (when
                    // `latest` would skip them).
                    ReadStatus::NoSuchQueue | ReadStatus::OffsetMoved | ReadStatus::OffsetOverflow => {
                        tracing::debug!(topic = name, queue = q, offset, min, max, "fetch out of range");
                        pd.error_code = errors::OFFSET_OUT_OF_RANGE;
                        any_error = true;
                    }
                    // Never served; the client retries (as on a broker
                    // whose log directory failed) while operators repair.
                    // (Before v6 a client may not know KAFKA_STORAGE_ERROR
                    // and take it as fatal: NOT_LEADER_OR_FOLLOWER, which
                    // it retries after a metadata refresh — Kafka's
                    // maybeDownConvertStorageError.)
                    ReadStatus::Damaged => {
                        pd.error_code = if version <= 5 {
                            errors::NOT_LEADER_OR_FOLLOWER
                        } else {
                            errors::KAFKA_STORAGE_ERROR
                        };
                        any_error = true;
                    }
                },
            }
            parts.push(pd);
            all_records.push(pieces);
        }
        topics.push(
            FetchableTopicResponse::default()
                .with_topic(t.topic.clone())
                .with_topic_id(t.topic_id)
                .with_partitions(parts),
        );
    }
    if redirected {
        metrics::counter!("rokka_cluster_read_redirects_total", "protocol" => "kafka").increment(1);
    }
    let reply = FetchReply {
        resp: FetchResponse::default().with_responses(topics),
        records: all_records,
    };
    (reply, total, any_error)
}

/// The stored batches to send (RocketMQ messages converted to one-record
/// batches stamped with the leader epoch they were written in, from the
/// set's epoch history, which `epochs` gives when one is, and with their
/// store time when `log_append_time` says the topic's records carry it), up to `limit`
/// bytes; the first always goes in when `first`.
fn batches<'a>(
    entries: &[rokka_store::ReadEntry],
    epochs: impl Fn() -> &'a [rokka_store::replication::EpochStart],
    log_append_time: impl Fn() -> bool,
    limit: usize,
    first: bool,
) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(entries.len());
    let mut len = 0usize;
    let mut crossed = rokka_broker::convert::Crossed::default();
    for e in entries {
        let piece = match e.decode() {
            Ok(Entry::KafkaBatch(b)) => b.batch, // a view of the segment: no copy
            Ok(Entry::Message(m)) => {
                let epoch = epochs()
                    .iter()
                    .rev()
                    .find(|h| h.start <= e.cq.phys_offset)
                    .map_or(0, |h| h.epoch as i32);
                rokka_broker::convert::rocketmq_to_kafka_batch_timed(&m, epoch, log_append_time(), &mut crossed)
            }
            Err(err) => {
                tracing::error!(phys = e.cq.phys_offset, error = %err, "undecodable entry in fetch");
                break;
            }
        };
        if len + piece.len() > limit && !(first && out.is_empty()) {
            break;
        }
        len += piece.len();
        out.push(piece);
    }
    if crossed.messages > 0 {
        rokka_broker::convert::record_metrics("rocketmq_to_kafka", &crossed);
    }
    out
}

/// Encodes a whole Fetch response frame (length prefix, header, body) for
/// versions 4–17 as pieces: small fields and batches are gathered into
/// buffers, large batches are passed through as the segment views they are.
/// Byte-identical to kafka-protocol's encoding (tested below).
pub fn encode(reply: &FetchReply, version: i16, correlation_id: i32) -> Vec<Bytes> {
    const INLINE: usize = 16 * 1024;
    let flexible = version >= 12;
    let mut out: Vec<Bytes> = Vec::new();
    let mut cur = BytesMut::with_capacity(1024);
    let mut total = 0usize;
    fn uvarint(b: &mut BytesMut, mut v: u64) {
        while v >= 0x80 {
            b.put_u8((v as u8) | 0x80);
            v >>= 7;
        }
        b.put_u8(v as u8);
    }
    let array_len = |b: &mut BytesMut, n: usize| {
        if flexible {
            uvarint(b, n as u64 + 1);
        } else {
            b.put_i32(n as i32);
        }
    };
    cur.put_i32(0); // length, patched below
    cur.put_i32(correlation_id);
    if flexible {
        uvarint(&mut cur, 0); // header tagged fields
    }
    let r = &reply.resp;
    cur.put_i32(r.throttle_time_ms);
    if version >= 7 {
        cur.put_i16(r.error_code);
        cur.put_i32(r.session_id);
    }
    array_len(&mut cur, r.responses.len());
    let mut idx = 0;
    for t in &r.responses {
        if version >= 13 {
            cur.put_slice(t.topic_id.as_bytes());
        } else {
            let name = t.topic.0.as_bytes();
            if flexible {
                uvarint(&mut cur, name.len() as u64 + 1);
            } else {
                cur.put_i16(name.len() as i16);
            }
            cur.put_slice(name);
        }
        array_len(&mut cur, t.partitions.len());
        for p in &t.partitions {
            cur.put_i32(p.partition_index);
            cur.put_i16(p.error_code);
            cur.put_i64(p.high_watermark);
            cur.put_i64(p.last_stable_offset);
            if version >= 5 {
                cur.put_i64(p.log_start_offset);
            }
            match &p.aborted_transactions {
                None if flexible => uvarint(&mut cur, 0),
                None => cur.put_i32(-1),
                Some(a) => {
                    array_len(&mut cur, a.len());
                    for x in a {
                        cur.put_i64(x.producer_id.0);
                        cur.put_i64(x.first_offset);
                        if flexible {
                            uvarint(&mut cur, 0);
                        }
                    }
                }
            }
            if version >= 11 {
                cur.put_i32(p.preferred_read_replica.0);
            }
            let pieces = reply.records.get(idx).map(Vec::as_slice).unwrap_or(&[]);
            idx += 1;
            let len: usize = pieces.iter().map(Bytes::len).sum();
            if flexible {
                uvarint(&mut cur, len as u64 + 1);
            } else {
                cur.put_i32(len as i32);
            }
            for piece in pieces {
                if piece.len() < INLINE {
                    cur.put_slice(piece);
                } else {
                    total += cur.len();
                    out.push(std::mem::replace(&mut cur, BytesMut::with_capacity(1024)).freeze());
                    total += piece.len();
                    out.push(piece.clone());
                }
            }
            if flexible {
                uvarint(&mut cur, 0); // partition tagged fields
            }
        }
        if flexible {
            uvarint(&mut cur, 0); // topic tagged fields
        }
    }
    if flexible {
        uvarint(&mut cur, 0); // body tagged fields
    }
    total += cur.len();
    out.push(cur.freeze());
    let n = (total - 4) as i32;
    if let Some(first) = out.first_mut() {
        let mut b = BytesMut::from(&first[..]);
        b[0..4].copy_from_slice(&n.to_be_bytes());
        *first = b.freeze();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::AbortedTransaction;
    use kafka_protocol::messages::{ProducerId, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    #[test]
    fn matches_kafka_protocol_encoding() {
        let big = Bytes::from(vec![7u8; 40_000]);
        let small = Bytes::from_static(b"small-batch");
        let reply = |records: bool| {
            let pd = |i: i32| {
                PartitionData::default()
                    .with_partition_index(i)
                    .with_high_watermark(100 + i as i64)
                    .with_last_stable_offset(90)
                    .with_preferred_read_replica(BrokerId(-1))
                    .with_aborted_transactions(Some(vec![AbortedTransaction::default()
                        .with_producer_id(ProducerId(5))
                        .with_first_offset(6)]))
            };
            let mut parts = vec![pd(0), pd(1), pd(2)];
            if records {
                parts[0].records = Some([small.clone(), big.clone()].concat().into());
                parts[1].records = Some(Bytes::new());
                parts[2].records = Some(small.clone());
            }
            FetchResponse::default()
                .with_session_id(0)
                .with_responses(vec![FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_static_str("topic")))
                    .with_topic_id(uuid::Uuid::from_bytes([9; 16]))
                    .with_partitions(parts)])
        };
        for version in [4i16, 5, 7, 11, 12, 13, 15, 16, 17] {
            let mut want = BytesMut::new();
            want.put_i32(0);
            ResponseHeader::default()
                .with_correlation_id(42)
                .encode(&mut want, if version >= 12 { 1 } else { 0 })
                .unwrap_or_else(|e| panic!("{e}"));
            let mut expected = reply(true);
            if version < 5 {
                for p in &mut expected.responses[0].partitions {
                    p.log_start_offset = -1;
                }
            }
            expected.encode(&mut want, version).unwrap_or_else(|e| panic!("{e}"));
            let n = (want.len() - 4) as i32;
            want[0..4].copy_from_slice(&n.to_be_bytes());
            let mut r = reply(false);
            if version < 5 {
                for p in &mut r.responses[0].partitions {
                    p.log_start_offset = -1;
                }
            }
            let got = encode(
                &FetchReply {
                    resp: r,
                    records: vec![vec![small.clone(), big.clone()], vec![], vec![small.clone()]],
                },
                version,
                42,
            );
            assert!(got.len() >= 3, "the big batch is passed through");
            assert_eq!(got.concat(), want.to_vec(), "v{version}");
        }
    }
}
