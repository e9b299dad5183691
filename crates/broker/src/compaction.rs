//! Compaction passes for compacted topics (`cleanup.policy=compact`): which
//! records survive. The store keeps the clean logs they produce
//! (`rokka_store::compacted`, docs/decisions/0003-compacted-topics.md).
//!
//! A pass over one partition first maps every key of its dirty range
//! `[clean end, bound)` to its last offset (at most
//! `broker.compaction_max_keys` keys: a larger range is cleaned in several
//! passes), then reads `[log start, bound)` and writes each record that is
//! the last for its key into the next clean log generation:
//!
//! * the key is the Kafka record key, or for a RocketMQ message its `KEYS`
//!   (the key a Kafka consumer sees for it); a record without a key is
//!   dropped, as Kafka's cleaner drops one;
//! * a tombstone (a Kafka record with a null value) is kept until
//!   `delete.retention.ms` after it was written, so a consumer reading
//!   from the start within that time sees the delete;
//! * records of aborted transactions are dropped; control batches (commit
//!   and abort markers) are kept, so `read_committed` consumers still see
//!   each transaction end;
//! * a Kafka batch keeps the offsets of its surviving records: it is
//!   re-encoded (same codec, producer id, epoch and base sequence) with its
//!   base offset at its first survivor and its last offset unchanged, as
//!   Kafka's cleaner writes one.
//!
//! The bound is never past the last stable offset (an open transaction's
//! records are never compacted), never into records younger than
//! `min.compaction.lag.ms`, and never includes the partition's newest
//! entry, so a consumer anywhere below the end always finds a record to
//! read (as Kafka never cleans the active segment).

use std::collections::HashMap;

use bytes::Bytes;
use rokka_store::record::kafka as stored;
use rokka_store::{CqEntry, Entry, ReadEntry, ReadStatus};

use crate::{Broker, Result};

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Offsets below this are now clean.
    pub clean_end: u64,
    /// Stored bytes read (each pass reads its range twice; counted once).
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_read: u64,
    pub records_kept: u64,
    /// The key map filled before the dirty range's end.
    pub key_map_full: bool,
}

/// One record's identity for compaction.
struct Rec {
    key: Option<Bytes>,
    offset: u64,
    tombstone: bool,
}

/// How an entry takes part in a pass.
enum Parts {
    /// Kept whole whatever the keys (control batches).
    Keep,
    /// Dropped whole (aborted transactions' records).
    Drop,
    /// Keyed records, in offset order; for a Kafka batch also the batch
    /// and its decoded records (re-encoded when only some are kept,
    /// without decoding it again).
    Records(Vec<Rec>, Option<Box<KafkaParts>>),
}

struct KafkaParts {
    view: rokka_store::KafkaBatchView,
    info: stored::BatchInfo,
    records: Vec<kafka_protocol::records::Record>,
}

impl Broker {
    /// Runs a pass on each compacted partition that is due: its dirty share
    /// of bytes reached `min.cleanable.dirty.ratio`, its oldest dirty
    /// record is older than `max.compaction.lag.ms`, or retention wants a
    /// segment its dirty records hold. Returns the passes run.
    pub fn compact_due(&self, now_ms: i64) -> usize {
        let wanted: std::collections::HashSet<(String, u32)> =
            self.store.take_compaction_wanted().into_iter().collect();
        let mut passes = 0;
        for topic in self.store.compacted_topics() {
            let Some(cfg) = self.topic_config(&topic) else {
                continue;
            };
            for q in self.store.queue_ids(&topic) {
                let Some(d) = self.store.dirty_range(&topic, q) else {
                    continue;
                };
                if d.dirty_entries < 2 {
                    continue; // the newest entry is never cleaned
                }
                let ratio = d.dirty_bytes as f64 / (d.clean_bytes + d.dirty_bytes).max(1) as f64;
                let overdue = d
                    .oldest_dirty_store_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) > cfg.max_compaction_lag_ms);
                if ratio < cfg.min_cleanable_dirty_ratio && !overdue && !wanted.contains(&(topic.clone(), q)) {
                    continue;
                }
                let started = std::time::Instant::now();
                match self.compact_partition(&topic, q, &cfg, now_ms) {
                    Ok(Some(s)) => {
                        passes += 1;
                        metrics::counter!("rokka_compaction_passes_total").increment(1);
                        metrics::counter!("rokka_compaction_bytes_read_total").increment(s.bytes_read);
                        metrics::counter!("rokka_compaction_bytes_written_total").increment(s.bytes_written);
                        metrics::counter!("rokka_compaction_records_removed_total")
                            .increment(s.records_read - s.records_kept);
                        metrics::histogram!("rokka_compaction_pass_seconds").record(started.elapsed().as_secs_f64());
                        if s.key_map_full {
                            metrics::counter!("rokka_compaction_key_map_full_total").increment(1);
                        }
                        tracing::info!(
                            topic,
                            partition = q,
                            clean_end = s.clean_end,
                            read = s.bytes_read,
                            written = s.bytes_written,
                            kept = s.records_kept,
                            of = s.records_read,
                            ms = started.elapsed().as_millis() as u64,
                            "partition compacted"
                        );
                    }
                    Ok(None) => {}
                    Err(e) => {
                        metrics::counter!("rokka_compaction_errors_total").increment(1);
                        tracing::warn!(topic, partition = q, error = %e, "compaction pass failed");
                    }
                }
            }
        }
        passes
    }

    /// One pass over (topic, partition); None when nothing can be cleaned
    /// yet.
    pub fn compact_partition(
        &self,
        topic: &str,
        partition: u32,
        cfg: &crate::topic_config::Effective,
        now_ms: i64,
    ) -> Result<Option<PassStats>> {
        let store = &self.store;
        let Some(cq) = store.queue(topic, partition) else {
            return Ok(None);
        };
        let Some(d) = store.dirty_range(topic, partition) else {
            return Ok(None);
        };
        let mut bound = self.kafka_txns.last_stable_offset(topic, partition, d.end).min(d.end);
        if let Some(last) = cq.entry_count().checked_sub(1).and_then(|i| cq.entry(i)) {
            bound = bound.min(last.base_offset);
        }
        if cfg.min_compaction_lag_ms > 0 {
            bound = bound.min(cq.offset_by_store_time(now_ms.saturating_sub(cfg.min_compaction_lag_ms)));
        }
        if bound <= d.clean_end {
            return Ok(None);
        }
        let mut stats = PassStats::default();
        let max_keys = self.config.compaction_max_keys.max(1) as usize;

        // Pass 1: the last offset of each key of the dirty range (as
        // Kafka's cleaner maps only the dirty section: a clean record
        // whose key is not in the map is already the latest of its key).
        let mut last: HashMap<Bytes, u64> = HashMap::new();
        let mut map_full_at = None;
        self.scan_range(topic, partition, d.clean_end, bound, false, |e| {
            if let Parts::Records(recs, _) = self.parts(topic, partition, e, false)? {
                if last.len() + recs.len() > max_keys && e.cq.base_offset > d.clean_end {
                    // Clean up to here; the rest in the next pass.
                    map_full_at = Some(e.cq.base_offset);
                    return Ok(false);
                }
                for rec in recs {
                    let Some(k) = rec.key else { continue };
                    // A key kept as its own copy: a view would hold the
                    // whole decompressed batch it came from in memory.
                    match last.get_mut(&k) {
                        Some(o) => *o = rec.offset,
                        None => {
                            last.insert(Bytes::copy_from_slice(&k), rec.offset);
                        }
                    }
                }
            }
            Ok(true)
        })?;
        if let Some(at) = map_full_at {
            bound = at;
            stats.key_map_full = true;
        }
        if bound <= d.clean_end {
            return Ok(None);
        }

        // Pass 2: write the survivors.
        let mut w = store.clean_writer(topic, partition)?;
        let deleted_before = now_ms.saturating_sub(cfg.delete_retention_ms);
        self.scan_range(topic, partition, w.start(), bound, true, |e| {
            stats.bytes_read += e.data.len() as u64;
            // (An entry kept whole is counted once: when it is first
            // cleaned, not at every pass over the clean log after.)
            let report = e.cq.base_offset >= d.clean_end;
            match self.parts(topic, partition, e, report)? {
                Parts::Keep => w.push(&e.data, &e.cq)?,
                Parts::Drop => {}
                Parts::Records(recs, batch) => {
                    stats.records_read += recs.len() as u64;
                    let keep: Vec<bool> = recs
                        .iter()
                        .map(|r| {
                            r.key
                                .as_ref()
                                .is_some_and(|k| last.get(k).is_none_or(|o| *o == r.offset))
                                && !(r.tombstone && e.cq.store_timestamp < deleted_before)
                        })
                        .collect();
                    let kept = keep.iter().filter(|k| **k).count();
                    stats.records_kept += kept as u64;
                    if kept == recs.len() {
                        w.push(&e.data, &e.cq)?;
                    } else if let (true, Some(batch)) = (kept > 0, batch) {
                        match self.filtered_batch(topic, partition, e, *batch, &keep) {
                            Ok((data, cq)) => w.push(&data, &cq)?,
                            // A batch that decodes but is inconsistent
                            // inside: kept whole, as an undecodable one.
                            Err(crate::BrokerError::Corrupt(why)) => {
                                if report {
                                    kept_whole(topic, partition, e, &why);
                                }
                                w.push(&e.data, &e.cq)?
                            }
                            Err(other) => return Err(other),
                        }
                    }
                }
            }
            Ok(true)
        })?;
        stats.bytes_written = w.bytes();
        stats.clean_end = bound;
        store.install_clean(topic, partition, w, bound)?;
        Ok(Some(stats))
    }

    /// Visits the stored entries of `[from, bound)` in order until `visit`
    /// answers false. A start moved by DeleteRecords or retention
    /// meanwhile: the scan goes on from the new start. An entry that fails
    /// its checksum (no reader is ever served it) is stepped over, counted
    /// and logged: the clean log goes on without it. (Failing the pass
    /// instead left the dirty range where it was, and a compacted queue's
    /// dirty range holds back the shared CommitLog's retention — one bad
    /// sector would have filled the disk for every topic.) Any other read
    /// that cannot go on before `bound` (the queue gone) fails the pass: a
    /// clean log installed up to `bound` over a scan that stopped short
    /// would hide every record between. `report`: a damaged entry is
    /// counted and logged (the pass's second scan; not twice).
    fn scan_range(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        bound: u64,
        report: bool,
        mut visit: impl FnMut(&ReadEntry) -> Result<bool>,
    ) -> Result<()> {
        let mut at = from;
        while at < bound {
            let r = self.store.read(topic, partition, at, 4096, 8 << 20);
            if r.status == ReadStatus::OffsetMoved && r.next_offset > at {
                at = r.next_offset;
                continue;
            }
            if r.status == ReadStatus::Damaged {
                // Only a record whose own bytes fail their checksum; a
                // ConsumeQueue entry pointing wrong over an intact record
                // fails the pass (a queue rebuild repairs it: dropped, the
                // record would be lost for good once retention freed it).
                let next = match self.store.damaged_entry(topic, partition, at) {
                    Some((end, true)) => Some(end),
                    _ => None,
                };
                if let Some(next) = next.filter(|n| *n > at) {
                    if !report {
                        at = next;
                        continue;
                    }
                    metrics::counter!("rokka_compaction_damaged_entries_total", "action" => "dropped").increment(1);
                    tracing::error!(
                        topic,
                        partition,
                        offset = at,
                        next,
                        "compaction: a damaged entry (checksum) is left out of the clean log"
                    );
                    at = next;
                    continue;
                }
            }
            if r.status != ReadStatus::Found {
                return Err(crate::BrokerError::Corrupt(format!(
                    "compaction read of {topic}/{partition} at {at} (cleaning up to {bound}): {:?}; the pass is given up",
                    r.status
                )));
            }
            for e in &r.entries {
                if e.cq.base_offset >= bound || !visit(e)? {
                    return Ok(());
                }
            }
            at = r.next_offset;
        }
        Ok(())
    }

    /// Splits a stored entry into what compaction decides on. An entry
    /// whose records cannot be read (past `max_batch_decompressed_bytes`
    /// now, or damaged inside where no checksum looks) is kept whole, as
    /// stored: its readers get what they got before, and the pass goes on
    /// (failing it would hold back the CommitLog's retention for good).
    /// `report`: counted and logged (once: the second scan, of the dirty
    /// range).
    fn parts(&self, topic: &str, partition: u32, e: &ReadEntry, report: bool) -> Result<Parts> {
        match self.split(topic, partition, e) {
            Err(crate::BrokerError::Corrupt(why)) => {
                if report {
                    kept_whole(topic, partition, e, &why);
                }
                Ok(Parts::Keep)
            }
            other => other,
        }
    }

    fn split(&self, topic: &str, partition: u32, e: &ReadEntry) -> Result<Parts> {
        match e.decode() {
            Ok(Entry::Message(m)) => Ok(Parts::Records(
                vec![Rec {
                    key: crate::convert::message_key(&m).map(Bytes::from),
                    offset: m.queue_offset,
                    tombstone: false,
                }],
                None,
            )),
            Ok(Entry::KafkaBatch(b)) => {
                let info = b.info().map_err(|e| crate::BrokerError::Corrupt(e.to_string()))?;
                if info.attributes & 0x20 != 0 {
                    return Ok(Parts::Keep);
                }
                if info.attributes & 0x10 != 0
                    && self
                        .kafka_txns
                        .is_aborted(topic, partition, info.producer_id, b.queue_offset)
                {
                    return Ok(Parts::Drop);
                }
                let set = crate::validate::decode(&b.batch, self.config.max_batch_decompressed_bytes as usize)
                    .map_err(crate::BrokerError::Corrupt)?;
                let recs = set
                    .records
                    .iter()
                    .map(|r| Rec {
                        key: r.key.clone(),
                        offset: r.offset as u64,
                        tombstone: r.value.is_none(),
                    })
                    .collect();
                Ok(Parts::Records(
                    recs,
                    Some(Box::new(KafkaParts {
                        view: b,
                        info,
                        records: set.records,
                    })),
                ))
            }
            Err(err) => Err(crate::BrokerError::Corrupt(format!(
                "entry at offset {} of {topic}/{partition}: {err}",
                e.cq.base_offset
            ))),
        }
    }

    /// A stored Kafka batch with only the records `keep` marks: base offset
    /// at the first kept record, last offset, codec, producer fields and
    /// base sequence as the original's.
    fn filtered_batch(
        &self,
        topic: &str,
        partition: u32,
        e: &ReadEntry,
        batch: KafkaParts,
        keep: &[bool],
    ) -> Result<(Vec<u8>, CqEntry)> {
        let corrupt = |why: String| crate::BrokerError::Corrupt(format!("{topic}/{partition}: {why}"));
        let KafkaParts { view: b, info, records } = batch;
        let Some(first) = records.iter().zip(keep).find_map(|(r, k)| k.then_some(r)) else {
            return Err(corrupt("no record kept".into()));
        };
        let new_base = first.offset as u64;
        // The kept records' bytes as they are (a record's repeated header
        // keys included: decoding and encoding again merged them).
        let mut batch =
            crate::validate::filter_records(&b.batch, keep, self.config.max_batch_decompressed_bytes as usize)
                .map_err(|e| corrupt(e.to_string()))?;
        if batch.len() < stored::BATCH_HEADER_LEN {
            return Err(corrupt("filtered batch too short".into()));
        }
        let last_offset = b.queue_offset + u64::from(info.last_offset_delta);
        let last_delta = last_offset
            .checked_sub(new_base)
            .and_then(|d| u32::try_from(d).ok())
            .ok_or_else(|| {
                corrupt(format!(
                    "a kept record at {new_base} is past the batch's last offset {last_offset}"
                ))
            })?;
        batch[23..27].copy_from_slice(&last_delta.to_be_bytes());
        batch[53..57].copy_from_slice(&info.base_sequence.to_be_bytes());
        if info.is_log_append_time() {
            let attributes = u16::from_be_bytes([batch[21], batch[22]]) | 0x08;
            batch[21..23].copy_from_slice(&attributes.to_be_bytes());
            batch[35..43].copy_from_slice(&info.max_timestamp.to_be_bytes());
        }
        let crc = crc32c::crc32c(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        let count = last_delta + 1;
        let mut data = vec![0u8; stored::encoded_len(topic, batch.len())];
        stored::encode(
            &mut data,
            topic,
            &batch,
            stored::KafkaPlacement {
                queue_id: partition,
                queue_offset: new_base,
                phys_offset: b.phys_offset,
                store_timestamp: b.store_timestamp,
                count,
            },
        );
        let cq = CqEntry {
            base_offset: new_base,
            count,
            ..e.cq
        };
        Ok((data, cq))
    }
}

/// An entry whose records cannot be read (or rewritten) is kept whole:
/// counted and logged (at most once a minute).
fn kept_whole(topic: &str, partition: u32, e: &ReadEntry, why: &str) {
    static LOG: crate::limits::LogEvery = crate::limits::LogEvery::new(60_000);
    if LOG.ready() {
        tracing::warn!(
            topic,
            partition,
            offset = e.cq.base_offset,
            error = why,
            "compaction: an entry whose records cannot be read is kept whole"
        );
    }
    metrics::counter!("rokka_compaction_damaged_entries_total", "action" => "kept").increment(1);
}

/// Runs due compaction passes every `broker.compaction_interval_ms` until
/// `shutdown`, on a blocking thread (a pass reads and writes files).
pub async fn run(broker: std::sync::Arc<Broker>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let every = std::time::Duration::from_millis(broker.config.compaction_interval_ms.max(100));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if broker.store.compacted_topics().is_empty() {
            continue;
        }
        let b = std::sync::Arc::clone(&broker);
        let _ = tokio::task::spawn_blocking(move || b.compact_due(rokka_store::now_ms())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BrokerConfig;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    use rokka_store::{MessageInput, MessageStore, StoreConfig};
    use std::sync::Arc;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// One batch of (key, value) records (None value = tombstone).
    fn batch(recs: &[(&str, Option<&str>)], compression: Compression) -> std::result::Result<Bytes, String> {
        let records: Vec<Record> = recs
            .iter()
            .enumerate()
            .map(|(i, (k, v))| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: 7,
                producer_epoch: 0,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: 100 + i as i32,
                timestamp: 1_700_000_000_000 + i as i64,
                key: Some(Bytes::copy_from_slice(k.as_bytes())),
                value: v.map(|v| Bytes::copy_from_slice(v.as_bytes())),
                headers: IndexMap::new(),
            })
            .collect();
        let mut out = bytes::BytesMut::new();
        RecordBatchEncoder::encode(
            &mut out,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .map_err(|e| e.to_string())?;
        Ok(out.freeze())
    }

    /// Every record of the partition: (offset, key, value).
    fn records(b: &Broker, topic: &str) -> std::result::Result<Vec<(u64, String, Option<String>)>, String> {
        let mut out = Vec::new();
        let mut at = b.store.min_offset(topic, 0);
        loop {
            let r = b.store.read(topic, 0, at, 100, 1 << 20);
            if r.status != ReadStatus::Found {
                return Ok(out);
            }
            for e in &r.entries {
                match e.decode().map_err(|e| e.to_string())? {
                    Entry::KafkaBatch(k) => {
                        if !stored::batch_crc_ok(&k.batch) {
                            return Err(format!("batch at {} fails its CRC", k.queue_offset));
                        }
                        let set = crate::validate::decode(&k.batch, 1 << 20)?;
                        for r in set.records {
                            let s = |b: Option<Bytes>| b.map(|b| String::from_utf8_lossy(&b).into_owned());
                            out.push((r.offset as u64, s(r.key).unwrap_or_default(), s(r.value)));
                        }
                    }
                    Entry::Message(m) => out.push((
                        m.queue_offset,
                        String::from_utf8_lossy(&crate::convert::message_key(&m).unwrap_or_default()).into_owned(),
                        Some(String::from_utf8_lossy(&m.body).into_owned()),
                    )),
                }
            }
            at = r.next_offset;
        }
    }

    /// A broker over a store in `dir` with compacted topic `t` of eight
    /// one-record batches (keys k0..k7): the batches' places.
    #[allow(clippy::type_complexity)]
    fn eight_batches(
        dir: &std::path::Path,
        t: &str,
    ) -> std::result::Result<(Arc<MessageStore>, Broker, Vec<rokka_store::AppendResult>), Box<dyn std::error::Error>>
    {
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        let mut cfg = std::collections::BTreeMap::new();
        cfg.insert("cleanup.policy".to_string(), "compact".to_string());
        b.create_topic_with(t, 1, cfg)?;
        let mut at = Vec::new();
        for i in 0..8 {
            let v = format!("{i}");
            at.push(b.append_kafka_batch(
                t,
                0,
                &batch(&[(&format!("k{i}"), Some(v.as_str()))], Compression::None)?,
            )?);
        }
        Ok((store, b, at))
    }

    /// A damaged entry (its checksum fails) in the dirty range is left
    /// out of the clean log and the pass goes on: the records after it
    /// stay readable and the dirty range moves past it. (A pass that
    /// stopped there and installed anyway hid every record after it; one
    /// that failed there held the CommitLog's retention back for good.)
    #[test]
    fn a_damaged_entry_is_left_out_and_the_pass_goes_on() -> TestResult {
        let dir = tempfile::tempdir()?;
        let (store, b, at) = eight_batches(dir.path(), "D")?;
        // Record 3's last byte flips on disk (a bad sector read back).
        let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&seg)?;
        let pos = at[3].phys_offset + u64::from(at[3].size) - 1;
        let mut byte = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut byte, pos)?;
        std::os::unix::fs::FileExt::write_all_at(&f, &[byte[0] ^ 0x5a], pos)?;
        let cfg = b.topic_config("D").ok_or("no config")?;
        assert_eq!(b.store.read("D", 0, 3, 1, 1 << 20).status, ReadStatus::Damaged);
        b.compact_partition("D", 0, &cfg, rokka_store::now_ms() + 10)?
            .ok_or("a pass")?;
        let d = store.dirty_range("D", 0).ok_or("no range")?;
        assert_eq!(d.clean_end, 7, "cleaned up to the last entry");
        let after = b.store.read("D", 0, 0, 100, 1 << 20);
        assert_eq!(after.status, ReadStatus::Found);
        let offsets: Vec<u64> = after.entries.iter().map(|e| e.cq.base_offset).collect();
        assert_eq!(offsets, vec![0, 1, 2, 4, 5, 6], "all but the damaged record served");
        let dirty = b.store.read("D", 0, 7, 100, 1 << 20);
        assert_eq!(dirty.entries.first().map(|e| e.cq.base_offset), Some(7));

        // Then record 5's copy in the clean log goes bad: the next pass,
        // which reads the clean log again, leaves it out and goes on.
        let mut entry5 = vec![0u8; at[5].size as usize];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut entry5, at[5].phys_offset)?;
        let clean_dir = dir.path().join("compacted/D/0");
        let clean_file = std::fs::read_dir(&clean_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("clean.")))
            .ok_or("no clean log file")?;
        let bytes = std::fs::read(&clean_file)?;
        let pos = bytes
            .windows(entry5.len())
            .position(|w| w == entry5.as_slice())
            .ok_or("record 5 not in the clean log")?;
        let cf = std::fs::OpenOptions::new().read(true).write(true).open(&clean_file)?;
        let last = (pos + entry5.len() - 1) as u64;
        std::os::unix::fs::FileExt::write_all_at(&cf, &[entry5[entry5.len() - 1] ^ 0x5a], last)?;
        drop(cf);
        drop(b);
        store.close()?;
        drop(store);
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        // Retention has moved the queue's own entries past the clean
        // range (what it does to a compacted queue's freed segments).
        store.queue("D", 0).ok_or("no queue")?.advance_min(at[7].phys_offset)?;
        assert_eq!(b.store.read("D", 0, 5, 1, 1 << 20).status, ReadStatus::Damaged);
        for i in 8..10 {
            let v = format!("{i}");
            b.append_kafka_batch(
                "D",
                0,
                &batch(&[(&format!("k{i}"), Some(v.as_str()))], Compression::None)?,
            )?;
        }
        let cfg = b.topic_config("D").ok_or("no config")?;
        b.compact_partition("D", 0, &cfg, rokka_store::now_ms() + 10)?
            .ok_or("a second pass")?;
        let d = store.dirty_range("D", 0).ok_or("no range")?;
        assert_eq!(d.clean_end, 9);
        let after = b.store.read("D", 0, 0, 100, 1 << 20);
        let offsets: Vec<u64> = after.entries.iter().map(|e| e.cq.base_offset).collect();
        assert_eq!(
            offsets,
            vec![0, 1, 2, 4, 6, 7, 8],
            "the clean log's damaged copy left out"
        );
        Ok(())
    }

    /// A ConsumeQueue entry pointing at another, intact record is Damaged
    /// to readers too, but its own record is whole in the CommitLog (a
    /// queue rebuild repairs it): the pass fails and installs nothing,
    /// rather than drop a record that can be had back.
    #[test]
    fn a_misdirected_queue_entry_fails_the_pass_and_drops_nothing() -> TestResult {
        let dir = tempfile::tempdir()?;
        let (store, b, at) = eight_batches(dir.path(), "M")?;
        let cq = dir.path().join("consumequeue/M/0/00000000000000000000");
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&cq)?;
        std::os::unix::fs::FileExt::write_all_at(&f, &at[2].phys_offset.to_be_bytes(), 3 * 48)?;
        drop(f);
        assert_eq!(b.store.read("M", 0, 3, 1, 1 << 20).status, ReadStatus::Damaged);
        let cfg = b.topic_config("M").ok_or("no config")?;
        assert!(b.compact_partition("M", 0, &cfg, rokka_store::now_ms() + 10).is_err());
        let d = store.dirty_range("M", 0).ok_or("no range")?;
        assert_eq!(d.clean_end, 0, "nothing installed");
        Ok(())
    }

    #[test]
    fn the_latest_record_per_key_survives_with_its_offset() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        let mut cfg = std::collections::BTreeMap::new();
        cfg.insert("cleanup.policy".to_string(), "compact".to_string());
        cfg.insert("delete.retention.ms".to_string(), "0".to_string());
        b.create_topic_with("C", 1, cfg)?;
        assert!(store.is_compacted("C"));
        // 0..3: a=1 b=1 c=1 (gzip); 3..5: a=2 b=tombstone; 5: a RocketMQ
        // message for c; 6..8: d=1 a=3 (the newest entry, never cleaned).
        b.append_kafka_batch(
            "C",
            0,
            &batch(
                &[("a", Some("1")), ("b", Some("1")), ("c", Some("1"))],
                Compression::Gzip,
            )?,
        )?;
        b.append_kafka_batch("C", 0, &batch(&[("a", Some("2")), ("b", None)], Compression::None)?)?;
        let props = rokka_store::record::properties::encode([("KEYS", "c")]);
        b.append_messages(&[MessageInput::new("C", 0, b"2", props.as_bytes())])?;
        b.append_kafka_batch(
            "C",
            0,
            &batch(&[("d", Some("1")), ("a", Some("3"))], Compression::None)?,
        )?;
        let cfg = b.topic_config("C").ok_or("no config")?;
        let now = rokka_store::now_ms() + 10;
        let s = b.compact_partition("C", 0, &cfg, now)?.ok_or("nothing compacted")?;
        assert_eq!(s.clean_end, 6, "the newest entry stays dirty");
        assert_eq!((s.records_read, s.records_kept), (6, 2));
        let got = records(&b, "C")?;
        let want = vec![
            (3, "a".to_string(), Some("2".to_string())),
            (5, "c".to_string(), Some("2".to_string())),
            (6, "d".to_string(), Some("1".to_string())),
            (7, "a".to_string(), Some("3".to_string())),
        ];
        assert_eq!(got, want);
        // The partly kept batch keeps its last offset: a read from offset 4
        // (its removed tombstone) gets that batch, and goes on at 5.
        let r = store.read("C", 0, 4, 1, 1 << 20);
        assert_eq!((r.entries[0].cq.base_offset, r.next_offset), (3, 5));
        let r = store.read("C", 0, 1, 1, 1 << 20);
        assert_eq!(r.entries[0].cq.base_offset, 3, "offsets 0..3 are gone");
        let r = store.read("C", 0, 3, 1, 1 << 20);
        assert_eq!((r.entries[0].cq.base_offset, r.next_offset), (3, 5));
        if let Ok(Entry::KafkaBatch(k)) = r.entries[0].decode() {
            let info = k.info()?;
            assert_eq!(
                (info.base_offset, info.last_offset_delta, info.base_sequence),
                (3, 1, 100)
            );
        }
        // Nothing more to clean until the newest entry has a successor.
        assert!(b.compact_partition("C", 0, &cfg, now)?.is_none());
        b.append_kafka_batch("C", 0, &batch(&[("e", Some("1"))], Compression::None)?)?;
        let s = b.compact_partition("C", 0, &cfg, now)?.ok_or("nothing compacted")?;
        assert_eq!(s.clean_end, 8);
        let keys: Vec<String> = records(&b, "C")?.into_iter().map(|r| r.1).collect();
        assert_eq!(keys, ["c", "d", "a", "e"]);
        Ok(())
    }

    #[test]
    fn a_full_key_map_cleans_in_several_passes() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let cfg = BrokerConfig {
            compaction_max_keys: 3,
            ..BrokerConfig::default()
        };
        let b = Broker::new(Arc::clone(&store), cfg)?;
        let mut configs = std::collections::BTreeMap::new();
        configs.insert("cleanup.policy".to_string(), "compact".to_string());
        b.create_topic_with("C", 1, configs)?;
        // Keys 0..8 twice, then a last entry.
        for round in 0..2 {
            for k in 0..8 {
                let props = rokka_store::record::properties::encode([("KEYS", format!("k{k}").as_str())]);
                let body = format!("{round}");
                b.append_messages(&[MessageInput::new("C", 0, body.as_bytes(), props.as_bytes())])?;
            }
        }
        b.append_kafka_batch("C", 0, &batch(&[("end", Some("x"))], Compression::None)?)?;
        let cfg = b.topic_config("C").ok_or("no config")?;
        let now = rokka_store::now_ms();
        let mut passes = 0;
        let mut full = 0;
        while let Some(s) = b.compact_partition("C", 0, &cfg, now)? {
            passes += 1;
            full += u32::from(s.key_map_full);
            assert!(passes < 20, "no progress");
        }
        assert!(passes > 1 && full > 0, "{passes} passes, {full} with a full map");
        let got = records(&b, "C")?;
        let mut want: Vec<(u64, String, Option<String>)> = (0..8)
            .map(|k| (8 + k, format!("k{k}"), Some("1".to_string())))
            .collect();
        want.push((16, "end".into(), Some("x".into())));
        assert_eq!(got, want);
        Ok(())
    }

    #[test]
    fn tombstones_stay_for_delete_retention_and_keyless_records_go() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
        b.create_topic("C", 1)?;
        // Written before the topic became compacted: one message without KEYS.
        b.append_messages(&[MessageInput::new("C", 0, b"keyless", b"")])?;
        let mut cfg = std::collections::BTreeMap::new();
        cfg.insert("cleanup.policy".to_string(), "compact,delete".to_string());
        b.set_topic_configs("C", cfg)?;
        assert!(store.is_compacted("C"));
        b.append_kafka_batch("C", 0, &batch(&[("a", Some("1")), ("a", None)], Compression::Lz4)?)?;
        b.append_kafka_batch("C", 0, &batch(&[("z", Some("1"))], Compression::None)?)?;
        let cfg = b.topic_config("C").ok_or("no config")?;
        assert!(cfg.compact && cfg.delete);
        let now = rokka_store::now_ms();
        b.compact_partition("C", 0, &cfg, now)?.ok_or("nothing compacted")?;
        assert_eq!(
            records(&b, "C")?,
            vec![(2, "a".to_string(), None), (3, "z".to_string(), Some("1".to_string()))],
            "a tombstone younger than delete.retention.ms (1 day) stays"
        );
        b.append_kafka_batch("C", 0, &batch(&[("y", Some("1"))], Compression::None)?)?;
        b.compact_partition("C", 0, &cfg, now + 86_400_001)?
            .ok_or("nothing compacted")?;
        let keys: Vec<String> = records(&b, "C")?.into_iter().map(|r| r.1).collect();
        assert_eq!(keys, ["z", "y"], "then it goes");
        // Compaction off again: the store stops holding its dirty range.
        b.set_topic_configs("C", Default::default())?;
        assert!(!store.is_compacted("C"));
        Ok(())
    }
}
