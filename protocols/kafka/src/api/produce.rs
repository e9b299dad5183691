//! Produce: each partition's records are split into magic-2 batches, each
//! checked (length, magic, CRC-32C) and stored whole with assigned offsets.
//! acks=0 gets no response; acks=-1 waits for the flush in sync mode.

use bytes::Bytes;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use rokka_broker::validate::BatchError;
use rokka_broker::{Located, SequenceCheck};

use crate::errors;
use crate::Kafka;

/// Splits a records blob into batches, validating each completely
/// (`rokka_broker::validate`); an error code for the first bad one.
pub fn split_batches(records: &Bytes, max_decompressed: usize) -> Result<Vec<Bytes>, i16> {
    split_batches_up_to(records, max_decompressed, usize::MAX)
}

/// As [`split_batches`], refusing (INVALID_RECORD) more than `most`
/// batches before any is decompressed: from v3 a partition carries one
/// batch (Kafka's ProduceRequest.validateRecords), and checking each of a
/// request's many compressed batches first cost their decompression.
pub fn split_batches_up_to(records: &Bytes, max_decompressed: usize, most: usize) -> Result<Vec<Bytes>, i16> {
    let mut count = 0usize;
    let mut at = 0usize;
    while at + 12 <= records.len() {
        let len = i32::from_be_bytes([records[at + 8], records[at + 9], records[at + 10], records[at + 11]]);
        count += 1;
        if count > most {
            metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "several_batches").increment(1);
            return Err(errors::INVALID_RECORD);
        }
        if len < 49 {
            break;
        }
        at = at.saturating_add(12 + len as usize);
    }
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < records.len() {
        if records.len() - at < 17 {
            return Err(errors::CORRUPT_MESSAGE);
        }
        let len = i32::from_be_bytes([records[at + 8], records[at + 9], records[at + 10], records[at + 11]]);
        if len < 49 {
            return Err(errors::CORRUPT_MESSAGE);
        }
        let end = at + 12 + len as usize;
        if end > records.len() {
            return Err(errors::CORRUPT_MESSAGE);
        }
        if records[at + 16] != 2 {
            return Err(errors::UNSUPPORTED_FOR_MESSAGE_FORMAT);
        }
        let mut batch = records.slice(at..end);
        match rokka_broker::validate::validate_timed(&batch, max_decompressed) {
            Ok((info, records_max)) => {
                // CreateTime batches: the header's max timestamp is what the
                // records carry, as Kafka's LogValidator takes it for its
                // time index (a header claiming i64::MAX led every later
                // lookup by time to this batch and read the partition to its
                // end). LogAppendTime and control batches are the broker's.
                let broker_time = info.attributes & 0x08 != 0 || info.attributes & 0x20 != 0;
                if !broker_time && info.max_timestamp != records_max {
                    metrics::counter!("rokka_kafka_batch_max_timestamps_corrected_total").increment(1);
                    batch = rokka_broker::validate::set_max_timestamp(&batch, records_max)
                        .map_err(|_| errors::CORRUPT_MESSAGE)?;
                }
            }
            Err(BatchError::TooLarge(_)) => {
                metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "too_large").increment(1);
                return Err(errors::MESSAGE_TOO_LARGE);
            }
            Err(e @ BatchError::Corrupt(_)) => {
                metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "corrupt").increment(1);
                tracing::debug!(error = %e, "Produce batch refused");
                return Err(errors::CORRUPT_MESSAGE);
            }
            // Whole, CRC right, records wrong: INVALID_RECORD, which
            // clients give up on (CORRUPT_MESSAGE they retry until their
            // delivery timeout), as Kafka's InvalidRecordException.
            Err(e @ BatchError::Invalid(_)) => {
                metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "invalid").increment(1);
                tracing::debug!(error = %e, "Produce batch refused");
                return Err(errors::INVALID_RECORD);
            }
        }
        out.push(batch);
        at = end;
    }
    if out.is_empty() {
        return Err(errors::CORRUPT_MESSAGE);
    }
    Ok(out)
}

/// Applies the topic's configs to its batches as Kafka does on append:
/// recompression to `compression.type`, the LogAppendTime stamp, and
/// `max.message.bytes` on the batch as stored.
fn shape(
    batches: Vec<Bytes>,
    cfg: Option<&rokka_broker::topic_config::Effective>,
    max_decompressed: usize,
    append_time: &mut i64,
) -> Result<Vec<Bytes>, i16> {
    let Some(cfg) = cfg else {
        return Ok(batches);
    };
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let codec = (u16::from_be_bytes([b[21], b[22]]) & 0x07) as u8;
        let control = u16::from_be_bytes([b[21], b[22]]) & 0x20 != 0;
        let mut b = match cfg.compression {
            Some(c) if c != codec && !control => {
                rokka_broker::validate::recompress(&b, c, max_decompressed).map_err(|e| {
                    tracing::debug!(error = %e, "recompression failed");
                    errors::CORRUPT_MESSAGE
                })?
            }
            _ => b,
        };
        if cfg.compact && !control {
            // Kafka: "Compacted topic cannot accept message without key".
            let keyless = rokka_broker::validate::decode(&b, max_decompressed)
                .map_err(|_| errors::CORRUPT_MESSAGE)?
                .records
                .iter()
                .any(|r| r.key.is_none());
            if keyless {
                metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "no_key").increment(1);
                return Err(errors::INVALID_RECORD);
            }
        }
        if !cfg.log_append_time
            && !control
            && (cfg.timestamp_before_max_ms < i64::MAX || cfg.timestamp_after_max_ms < i64::MAX)
        {
            // Kafka's LogValidator.validateTimestamp: a CreateTime record
            // outside [now - before.max, now + after.max] is INVALID_TIMESTAMP.
            let now = rokka_store::now_ms();
            let records = rokka_broker::validate::decode(&b, max_decompressed).map_err(|_| errors::INVALID_RECORD)?;
            let out_of_range = records.records.iter().any(|r| {
                // Only -1 (NO_TIMESTAMP) is exempt, as Kafka.
                r.timestamp != -1
                    && (now.saturating_sub(r.timestamp) > cfg.timestamp_before_max_ms
                        || r.timestamp.saturating_sub(now) > cfg.timestamp_after_max_ms)
            });
            if out_of_range {
                metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "timestamp").increment(1);
                return Err(errors::INVALID_TIMESTAMP);
            }
        }
        if cfg.log_append_time {
            let now = rokka_store::now_ms();
            b = rokka_broker::validate::stamp_log_append_time(&b, now).map_err(|_| errors::CORRUPT_MESSAGE)?;
            *append_time = now;
        }
        if b.len() as u64 > cfg.max_message_bytes {
            metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "max_message_bytes").increment(1);
            return Err(errors::MESSAGE_TOO_LARGE);
        }
        out.push(b);
    }
    Ok(out)
}

/// Whether any v2 batch in `records` is zstd-compressed (codec 4 in its
/// attributes), read off the batch headers.
fn has_zstd_batch(records: &[u8]) -> bool {
    let mut at = 0usize;
    while let Some(head) = records.get(at..at + 23) {
        let len = i32::from_be_bytes([head[8], head[9], head[10], head[11]]);
        if head[16] == 2 && u16::from_be_bytes([head[21], head[22]]) & 0x07 == 4 {
            return true;
        }
        let Ok(len) = usize::try_from(len) else {
            return false;
        };
        at = at.saturating_add(12).saturating_add(len);
    }
    false
}

/// The answer to a Produce; for acks=0 it is not sent (the caller closes
/// the connection when it carries an error, as Kafka does).
pub async fn handle(k: &Kafka, r: ProduceRequest, version: i16) -> ProduceResponse {
    let broker = k.broker.as_ref();
    let store = broker.store();
    let mut durable_up_to = 0u64;
    let max_decompressed = broker.config().max_batch_decompressed_bytes as usize;
    let mut responses = Vec::with_capacity(r.topic_data.len());
    let txn_id = r.transactional_id.as_ref().map(|t| t.0.as_str());
    // (topic, partition) pairs named more than once in the request (across
    // topic entries too): looked for only when there are several pairs,
    // without copying a name (the common request names each once).
    let pairs: usize = r.topic_data.iter().map(|t| t.partition_data.len()).sum();
    let repeated: std::collections::HashSet<(String, i32)> = if pairs > 1 {
        let mut seen = std::collections::HashSet::with_capacity(pairs.min(1024));
        r.topic_data
            .iter()
            .flat_map(|t| t.partition_data.iter().map(move |p| (t.name.0.as_str(), p.index)))
            .filter(|k| !seen.insert(*k))
            .map(|(t, p)| (t.to_string(), p))
            .collect()
    } else {
        std::collections::HashSet::new()
    };
    // A repeated pair: every occurrence after the first is refused.
    let mut answered = std::collections::HashSet::new();
    for t in r.topic_data {
        let topic = t.name.0.to_string();
        let cfg = broker.topic_config(&topic);
        let exists = cfg.is_some();
        let mut parts = Vec::with_capacity(t.partition_data.len());
        for p in t.partition_data {
            let mut resp = PartitionProduceResponse::default()
                .with_index(p.index)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            let mut append_time = -1;
            // The partition's queue here; another broker set's partition is
            // its master's to take.
            let at = match broker.locate(&topic, p.index) {
                Some(Located::Here(q)) => Ok(q),
                Some(Located::OtherSet) => Err(errors::NOT_LEADER_OR_FOLLOWER),
                _ => Err(errors::UNKNOWN_TOPIC_OR_PARTITION),
            };
            let q = at.unwrap_or(0);
            let result = if !repeated.is_empty()
                && repeated.contains(&(topic.clone(), p.index))
                && !answered.insert((topic.clone(), p.index))
            {
                // A partition named again in one request: its records are
                // not looked at (each would be decompressed and checked;
                // Kafka keeps one entry per partition).
                Err(errors::INVALID_RECORD)
            } else if !matches!(r.acks, -1..=1) {
                // Kafka takes acks of -1, 0 or 1 only (nothing is stored).
                Err(errors::INVALID_REQUIRED_ACKS)
            } else if !store.is_leader() {
                // Cluster mode, not the set's master: before any sequence
                // check, so a retry goes to the master with its sequence
                // intact (an OUT_OF_ORDER answer here would make an
                // idempotent producer bump its epoch and write again what
                // the master already has).
                Err(errors::NOT_LEADER_OR_FOLLOWER)
            } else if rokka_broker::is_send_forbidden_topic(&topic) {
                // The broker's own topics (Kafka: "Cannot append to
                // internal topic").
                Err(errors::INVALID_TOPIC_EXCEPTION)
            } else if !exists || p.index < 0 {
                Err(errors::UNKNOWN_TOPIC_OR_PARTITION)
            } else if let Err(code) = at {
                Err(code)
            } else if r.acks == -1
                && (store.too_few_replicas()
                    || cfg
                        .as_ref()
                        .is_some_and(|c| c.min_insync_replicas > store.in_sync_replicas() as i32))
            {
                // acks=all needs the topic's min.insync.replicas in sync
                // (the set's sync state set; one replica on a single node)
                // and the set's own `cluster.min_insync_replicas`, refused
                // before appending as Kafka's appendRecordsToLeader: a
                // refusal after the append (NOT_ENOUGH_REPLICAS_AFTER_APPEND)
                // is retried by a producer without idempotence, which then
                // stores the records twice.
                Err(errors::NOT_ENOUGH_REPLICAS)
            } else if version < 7 && p.records.as_ref().is_some_and(|r| has_zstd_batch(r)) {
                // zstd before v7 (the client could not have asked for it
                // there): UNSUPPORTED_COMPRESSION_TYPE, as Kafka's
                // ProduceRequest.validateRecords — before anything is
                // decompressed.
                Err(errors::UNSUPPORTED_COMPRESSION_TYPE)
            } else {
                let shaped = p
                    .records
                    .as_ref()
                    .map(|r| split_batches_up_to(r, max_decompressed, if version >= 3 { 1 } else { usize::MAX }))
                    .map(|r| r.and_then(|b| shape(b, cfg.as_ref(), max_decompressed, &mut append_time)));
                match shaped {
                    None => Err(errors::CORRUPT_MESSAGE),
                    Some(Err(code)) => Err(code),
                    // One batch per partition from v3 on, refused before
                    // anything is appended (Kafka's
                    // ProduceRequest.validateRecords): a later batch failing
                    // would leave the earlier ones written under an error.
                    Some(Ok(batches)) if batches.len() > 1 && version >= 3 => {
                        metrics::counter!("rokka_kafka_batches_refused_total", "reason" => "several_batches")
                            .increment(1);
                        Err(errors::INVALID_RECORD)
                    }
                    Some(Ok(batches)) => {
                        let mut base = None;
                        let mut err = None;
                        for b in &batches {
                            let attributes = u16::from_be_bytes([b[21], b[22]]);
                            if attributes & 0x20 != 0 {
                                // Control batches are the coordinator's to write.
                                err = Some(errors::INVALID_RECORD);
                                break;
                            }
                            let appended = if attributes & 0x10 != 0 {
                                let pid = i64::from_be_bytes([b[43], b[44], b[45], b[46], b[47], b[48], b[49], b[50]]);
                                let epoch = i16::from_be_bytes([b[51], b[52]]);
                                match rokka_broker::offload(|| {
                                    broker.append_transactional_batch(txn_id, &topic, q, b, pid, epoch)
                                }) {
                                    Ok(r) => r,
                                    Err(code) => {
                                        err = Some(code);
                                        break;
                                    }
                                }
                            } else {
                                rokka_broker::offload(|| broker.append_kafka_batch_checked(&topic, q, b))
                            };
                            match appended {
                                Ok((verdict, Some(offset), end)) => {
                                    if verdict == SequenceCheck::Duplicate(offset) {
                                        metrics::counter!("rokka_kafka_duplicate_batches_total").increment(1);
                                    } else {
                                        // Kafka's MessagesInPerSec / BytesInPerSec.
                                        let records = i32::from_be_bytes([b[57], b[58], b[59], b[60]]).max(0);
                                        broker.traffic().kafka_in.record(&topic, records as u64, b.len() as u64);
                                    }
                                    base.get_or_insert(offset as i64);
                                    durable_up_to = durable_up_to.max(end);
                                }
                                Ok((SequenceCheck::FencedEpoch, None, _)) => {
                                    err = Some(errors::INVALID_PRODUCER_EPOCH);
                                    break;
                                }
                                Ok((_, None, _)) => {
                                    err = Some(errors::OUT_OF_ORDER_SEQUENCE_NUMBER);
                                    break;
                                }
                                Err(e) => {
                                    err = Some(errors::code(&e));
                                    break;
                                }
                            }
                        }
                        match (err, base) {
                            (Some(code), _) => Err(code),
                            (None, Some(b)) => Ok(b),
                            (None, None) => Err(errors::CORRUPT_MESSAGE),
                        }
                    }
                }
            };
            match result {
                Ok(base) => {
                    resp.base_offset = base;
                    resp.log_append_time_ms = append_time;
                    if version >= 5 {
                        resp.log_start_offset = store.min_offset(&topic, q) as i64;
                    }
                }
                Err(code) => {
                    metrics::counter!("rokka_kafka_errors_total", "api" => "Produce", "code" => crate::errors::label(code))
                        .increment(1);
                    resp.error_code = code;
                }
            }
            parts.push(resp);
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_partition_responses(parts),
        );
    }
    if r.acks == -1 && durable_up_to > 0 {
        if let Err(e) = store.durable(durable_up_to).await {
            // The records are in the log already: "not enough replicas
            // after append" (possibly persisted to librdkafka, which a
            // plain NOT_ENOUGH_REPLICAS would call not persisted).
            let code = match e {
                rokka_store::StoreError::NotEnoughReplicas | rokka_store::StoreError::ShutDown => {
                    errors::NOT_ENOUGH_REPLICAS_AFTER_APPEND
                }
                e => errors::store_code(&e),
            };
            for t in &mut responses {
                for p in &mut t.partition_responses {
                    if p.error_code == errors::NONE {
                        p.error_code = code;
                    }
                }
            }
        }
    }
    ProduceResponse::default().with_responses(responses)
}
