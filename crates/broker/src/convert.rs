//! Messages crossing between the protocols (docs/mapping.md): a stored Kafka
//! record batch read by a RocketMQ pull becomes stored-message records (the
//! pull body format), a stored RocketMQ message read by a Kafka fetch becomes
//! a one-record v2 batch. Nothing is converted at append time: the cost is
//! paid by cross reads only.
//!
//! | Kafka record | RocketMQ message |
//! |---|---|
//! | value (null → empty) | body (a body its producer compressed — COMPRESSED flag, zlib/LZ4/Zstandard — decompressed) |
//! | key | `KEYS` (the whole string); a key that is not UTF-8 or holds 0x01/0x02 goes to `KAFKA_KEY_HEX` |
//! | headers | user properties (1:1; unsafe or reserved names dropped, counted) |
//! | header `rocketmq.tags` | `TAGS` (and so tag filters) |
//! | timestamp | born timestamp (store timestamp = the batch's append time) |
//! | offset | queue offset |

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::records::RecordSet;
use rokka_store::record::message::{self as rmsg, MessageInput, Placement};
use rokka_store::record::properties::{self, java_string_hash};
use rokka_store::{KafkaBatchView, MessageView};

/// The Kafka header carrying a RocketMQ message's tag, both ways.
pub const TAGS_HEADER: &str = "rocketmq.tags";
/// Property holding a Kafka key that `KEYS` cannot hold (lowercase hex).
pub const KAFKA_KEY_HEX: &str = "KAFKA_KEY_HEX";

/// RocketMQ's reserved property names (`MessageConst.STRING_HASH_SET` and
/// the broker's bookkeeping): never Kafka headers, never taken from them.
pub const SYSTEM_PROPERTIES: &[&str] = &[
    "KEYS",
    "TAGS",
    "WAIT",
    "DELAY",
    "RETRY_TOPIC",
    "REAL_TOPIC",
    "REAL_QID",
    "TRAN_MSG",
    "PGROUP",
    "MIN_OFFSET",
    "MAX_OFFSET",
    "BUYER_ID",
    "ORIGIN_MESSAGE_ID",
    "TRANSFER_FLAG",
    "CORRECTION_FLAG",
    "MQ2_FLAG",
    "RECONSUME_TIME",
    "MSG_REGION",
    "TRACE_ON",
    "UNIQ_KEY",
    "EXTEND_UNIQ_INFO",
    "MAX_RECONSUME_TIMES",
    "CONSUME_START_TIME",
    "INNER_NUM",
    "INNER_BASE",
    "DUP_INFO",
    "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "TRAN_PREPARED_QUEUE_OFFSET",
    "__transactionId__",
    "TRANSACTION_CHECK_TIMES",
    "INSTANCE_ID",
    "CORRELATION_ID",
    "REPLY_TO_CLIENT",
    "TTL",
    "ARRIVE_TIME",
    "PUSH_REPLY_TIME",
    "MSG_TYPE",
    "CLUSTER",
    "POP_CK",
    "POP_CK_OFFSET",
    "1ST_POP_TIME",
    "INNER_MULTI_DISPATCH",
    "INNER_MULTI_QUEUE_OFFSET",
    "TRACE_CONTEXT",
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "TIMER_DELIVER_MS",
    "TIMER_ENQUEUE_MS",
    "TIMER_DEQUEUE_MS",
    "TIMER_ROLL_TIMES",
    "TIMER_OUT_MS",
    "TIMER_DEL_UNIQKEY",
    "TIMER_DELAY_LEVEL",
    "__BORNHOST",
    "BORN_TIMESTAMP",
    "__CRC32#",
    "DLQ_ORIGIN_TOPIC",
    "DLQ_ORIGIN_MESSAGE_ID",
    "__STARTDELIVERTIME",
    KAFKA_KEY_HEX,
];

fn is_system(name: &[u8]) -> bool {
    SYSTEM_PROPERTIES.iter().any(|s| s.as_bytes() == name)
}

/// What a conversion did, for the caller's metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Crossed {
    /// Messages (records) produced.
    pub messages: u64,
    /// Bytes produced.
    pub bytes: u64,
    /// Headers or properties that could not cross (dropped).
    pub dropped: u64,
    /// Records filtered out by the tag filter.
    pub filtered: u64,
    /// Records too large to cross ([`MAX_CROSSED_MESSAGE`]): skipped.
    pub too_large: u64,
    /// The offset of the first record left out for the byte budget
    /// ([`kafka_batch_to_rocketmq_within`]); None when the batch was done.
    pub stopped_at: Option<u64>,
}

/// Counts conversions (callers converting message by message add up and
/// record once per request).
pub fn record_metrics(direction: &'static str, c: &Crossed) {
    if c.messages > 0 {
        crate::hot_metrics::count("rokka_cross_conversions_total", "direction", direction, c.messages);
        crate::hot_metrics::count("rokka_cross_conversion_bytes_total", "direction", direction, c.bytes);
    }
    if c.dropped > 0 {
        crate::hot_metrics::count("rokka_cross_dropped_fields_total", "direction", direction, c.dropped);
    }
    if c.too_large > 0 {
        crate::hot_metrics::count(
            "rokka_cross_records_too_large_total",
            "direction",
            direction,
            c.too_large,
        );
    }
}

/// Most bytes of properties a crossed message carries (RocketMQ's message
/// layout: a 16-bit length, read as signed by the Java client).
pub const MAX_CROSSED_PROPERTIES: usize = 32767;

/// Room kept for `UNIQ_KEY` (32 hex digits) and its separators.
const UNIQ_KEY_ROOM: usize = 8 + 32 + 2;

/// Largest message a Kafka record crosses as: what a RocketMQ client's
/// frame (16 MiB in the Java client) holds with the pull answer's header.
pub const MAX_CROSSED_MESSAGE: usize = (16 << 20) - (64 << 10);

/// Whether `name`=`value` fits in `props` leaving `reserve` bytes.
fn fits(props: &[u8], name: &[u8], value: &[u8], reserve: usize) -> bool {
    props.len() + name.len() + value.len() + 2 + reserve <= MAX_CROSSED_PROPERTIES
}

/// A record too large to cross, logged at most once a minute.
fn too_large_logged(topic: &str, queue: u32, offset: i64, len: usize) {
    static LOG: crate::limits::LogEvery = crate::limits::LogEvery::new(60_000);
    if LOG.ready() {
        tracing::warn!(
            topic,
            queue,
            offset,
            bytes = len,
            "a Kafka record too large for RocketMQ clients is skipped for them (rokka_cross_records_too_large_total)"
        );
    }
}

fn prop_safe(b: &[u8]) -> bool {
    !b.contains(&properties::NAME_VALUE_SEPARATOR)
        && !b.contains(&properties::PROPERTY_SEPARATOR)
        && std::str::from_utf8(b).is_ok()
}

fn hex(b: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(D[(x >> 4) as usize] as char);
        s.push(D[(x & 15) as usize] as char);
    }
    s
}

/// The 16 bytes of a unique id in upper-case hex, on the stack (one per
/// crossed record).
fn hex_upper(b: &[u8; 16]) -> [u8; 32] {
    const D: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = [0u8; 32];
    for (i, x) in b.iter().enumerate() {
        out[2 * i] = D[(x >> 4) as usize];
        out[2 * i + 1] = D[(x & 15) as usize];
    }
    out
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let v = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.chunks(2).map(|p| Some(v(p[0])? << 4 | v(p[1])?)).collect()
}

/// A record header's value by name (last one wins, as the map keeps it).
fn header<'r>(r: &'r kafka_protocol::records::Record, name: &str) -> Option<&'r Bytes> {
    r.headers
        .iter()
        .find(|(k, _)| k.as_bytes() == name.as_bytes())
        .and_then(|(_, v)| v.as_ref())
}

fn push_prop(out: &mut Vec<u8>, k: &[u8], v: &[u8]) {
    out.extend_from_slice(k);
    out.push(properties::NAME_VALUE_SEPARATOR);
    out.extend_from_slice(v);
    out.push(properties::PROPERTY_SEPARATOR);
}

/// Appends to `out`, in the stored-message layout a pull body carries, every
/// record of the Kafka batch `view` at or after `from`, whose tag passes
/// `codes` (tag hash codes; `None` = all). Control records (transaction
/// markers) are skipped. Errors when the batch cannot be decoded or
/// decompresses to more than `max_decompressed` bytes.
pub fn kafka_batch_to_rocketmq(
    view: &KafkaBatchView,
    from: u64,
    codes: Option<&[i32]>,
    store_host: SocketAddr,
    max_decompressed: usize,
    out: &mut BytesMut,
) -> Result<Crossed, String> {
    kafka_batch_to_rocketmq_within(view, from, codes, store_host, max_decompressed, usize::MAX, out)
}

/// As [`kafka_batch_to_rocketmq`], appending at most `budget` bytes: it
/// stops before the first record that would pass it (`stopped_at` names
/// that record's offset) — except when `out` is still empty, whose first
/// record is always taken, so a pull makes progress. A compressed batch of
/// small records grows several-fold as messages: a pull answer must stay
/// under the clients' frame limit (the Java client's 16 MiB).
pub fn kafka_batch_to_rocketmq_within(
    view: &KafkaBatchView,
    from: u64,
    codes: Option<&[i32]>,
    store_host: SocketAddr,
    max_decompressed: usize,
    budget: usize,
    out: &mut BytesMut,
) -> Result<Crossed, String> {
    kafka_batch_to_rocketmq_limited(
        view,
        from,
        codes,
        store_host,
        max_decompressed,
        (budget, usize::MAX),
        out,
    )
}

/// As [`kafka_batch_to_rocketmq_within`], also stopping after `most`
/// messages (`stopped_at` names the next record): a reader that takes a
/// few messages at a time converts no more of a large batch than it takes.
pub fn kafka_batch_to_rocketmq_limited(
    view: &KafkaBatchView,
    from: u64,
    codes: Option<&[i32]>,
    store_host: SocketAddr,
    max_decompressed: usize,
    (budget, most): (usize, usize),
    out: &mut BytesMut,
) -> Result<Crossed, String> {
    let set = crate::validate::decode(&view.batch, max_decompressed)
        .map_err(|e| format!("Kafka batch at {}: {e}", view.phys_offset))?;
    Ok(convert_set(view, &set, from, codes, store_host, (budget, most), out))
}

/// As [`kafka_batch_to_rocketmq_limited`], keeping in `cache` a batch the
/// conversion stopped inside (a byte budget or a message count), so the
/// reads that take the rest of it decode it once, not once per read: a
/// 10 000-record batch drained 32 messages at a time was decoded whole
/// ~300 times. `soft_most`: the count binds only over a batch kept decoded
/// (a remoting pull, whose client takes more than it asked for): one too
/// large to keep is converted as far as the byte budget reaches rather
/// than decoded whole again for every few messages.
#[allow(clippy::too_many_arguments)]
pub fn kafka_batch_to_rocketmq_cached(
    cache: &DecodedBatches,
    view: &KafkaBatchView,
    from: u64,
    codes: Option<&[i32]>,
    store_host: SocketAddr,
    max_decompressed: usize,
    limits: (usize, usize),
    soft_most: bool,
    out: &mut BytesMut,
) -> Result<Crossed, String> {
    let key = BatchKey::of(view);
    if let Some(set) = cache.get(key) {
        crate::hot_metrics::count("rokka_cross_decoded_batch_hits_total", "", "", 1);
        #[cfg(test)]
        cache.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(convert_set(view, &set, from, codes, store_host, limits, out));
    }
    let decode = |batch: &Bytes| {
        crate::validate::decode(batch, max_decompressed)
            .map_err(|e| format!("Kafka batch at {}: {e}", view.phys_offset))
    };
    let set = decode(&view.batch)?;
    // What keeping it would cost, if it fits (walked at most once, and
    // only when needed: a soft count to decide on, or a read that stopped
    // inside the batch).
    let mut kept_cost: Option<Option<usize>> = None;
    let mut fits = |set: &RecordSet| {
        *kept_cost
            .get_or_insert_with(|| Some(DecodedBatches::cost(set)).filter(|c| cache.enabled() && *c <= cache.max_bytes))
    };
    // A soft count binds only where the rest will be read from the cache:
    // the batch fits it and this read starts the batch (a miss resuming
    // one means it was kept and evicted since — queues drained in turn, or
    // batches larger together than the cache: counted, each would be
    // decoded whole again for every few messages).
    let limits = if soft_most {
        let resumed = set
            .records
            .first()
            .is_some_and(|r| r.offset >= 0 && (r.offset as u64) < from);
        if resumed || fits(&set).is_none() {
            (limits.0, usize::MAX)
        } else {
            limits
        }
    } else {
        limits
    };
    let c = convert_set(view, &set, from, codes, store_host, limits, out);
    let cost = c.stopped_at.and_then(|_| fits(&set));
    if let Some(cost) = cost {
        // An uncompressed batch's records are views of the mapped segment:
        // kept, they would keep the segment mapped (and its disk space
        // taken after retention deletes it) — decoded again from a copy.
        // (Kept at best: the messages are in `out` already.)
        let set = if set.compression == kafka_protocol::records::Compression::None {
            decode(&Bytes::copy_from_slice(&view.batch)).ok()
        } else {
            Some(set)
        };
        if let Some(set) = set {
            cache.put(key, set, cost);
        }
    }
    Ok(c)
}

/// Which stored batch a decode is of: its CommitLog offset, length and
/// CRC (compaction rewrites a batch at the same offset with fewer records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BatchKey {
    phys: u64,
    len: usize,
    crc: u32,
}

impl BatchKey {
    fn of(view: &KafkaBatchView) -> BatchKey {
        let crc = view
            .batch
            .get(17..21)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        BatchKey {
            phys: view.phys_offset,
            len: view.batch.len(),
            crc,
        }
    }
}

/// Most batches [`DecodedBatches`] holds, whatever their size (a lookup
/// scans them).
const MAX_DECODED_BATCHES: usize = 64;

/// Bytes a decoded record costs besides its key, value and headers.
const DECODED_RECORD_OVERHEAD: usize = 192;

/// Kafka batches decoded for cross reads that took only part of them,
/// most recently used last, at most `broker.crossing_cache_bytes` of them
/// (their records' bytes and per-record overhead) and 64 batches.
/// Concurrency: one mutex, held for a lookup or an insert (a scan of at
/// most 64 keys), never while decoding or converting.
#[derive(Debug)]
pub struct DecodedBatches {
    max_bytes: usize,
    inner: std::sync::Mutex<DecodedInner>,
    /// Reads answered from the cache (the tests count them).
    #[cfg(test)]
    hits: std::sync::atomic::AtomicUsize,
}

#[derive(Debug, Default)]
struct DecodedInner {
    entries: std::collections::VecDeque<(BatchKey, std::sync::Arc<RecordSet>, usize)>,
    bytes: usize,
}

impl DecodedBatches {
    /// A cache of at most `max_bytes` (0 = none kept).
    pub fn new(max_bytes: u64) -> DecodedBatches {
        DecodedBatches {
            max_bytes: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            inner: Default::default(),
            #[cfg(test)]
            hits: Default::default(),
        }
    }

    fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DecodedInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: BatchKey) -> Option<std::sync::Arc<RecordSet>> {
        if !self.enabled() {
            return None;
        }
        let mut g = self.lock();
        let at = g.entries.iter().position(|(k, _, _)| *k == key)?;
        let hit = g.entries.remove(at)?;
        let set = hit.1.clone();
        g.entries.push_back(hit);
        Some(set)
    }

    /// The memory a decoded batch is counted for.
    fn cost(set: &RecordSet) -> usize {
        set.records
            .iter()
            .map(|r| {
                DECODED_RECORD_OVERHEAD
                    + r.key.as_ref().map_or(0, |k| k.len())
                    + r.value.as_ref().map_or(0, |v| v.len())
                    + r.headers
                        .iter()
                        .map(|(n, v)| n.len() + v.as_ref().map_or(0, |v| v.len()) + 32)
                        .sum::<usize>()
            })
            .sum::<usize>()
    }

    /// Keeps `set` (its [`DecodedBatches::cost`] within the cache's size).
    fn put(&self, key: BatchKey, set: RecordSet, cost: usize) {
        if cost > self.max_bytes {
            return;
        }
        let bytes = {
            let mut g = self.lock();
            if g.entries.iter().any(|(k, _, _)| *k == key) {
                return;
            }
            g.entries.push_back((key, std::sync::Arc::new(set), cost));
            g.bytes += cost;
            while g.bytes > self.max_bytes || g.entries.len() > MAX_DECODED_BATCHES {
                match g.entries.pop_front() {
                    Some((_, _, c)) => g.bytes -= c,
                    None => break,
                }
            }
            g.bytes
        };
        crate::hot_metrics::count("rokka_cross_decoded_batches_kept_total", "", "", 1);
        crate::hot_metrics::gauge_set("rokka_cross_decoded_batch_bytes", "", "", bytes as f64);
    }

    /// Bytes held (the gauge's value).
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

/// Converts the decoded records of `view` (see [`kafka_batch_to_rocketmq`]).
fn convert_set(
    view: &KafkaBatchView,
    set: &RecordSet,
    from: u64,
    codes: Option<&[i32]>,
    store_host: SocketAddr,
    (budget, most): (usize, usize),
    out: &mut BytesMut,
) -> Crossed {
    let start = out.len();
    // A LogAppendTime batch: its records' time is the broker's append time
    // (the header's max timestamp), not the create time they carry, as
    // Kafka consumers see it.
    let append_time = rokka_store::record::kafka::BatchInfo::parse(&view.batch)
        .ok()
        .filter(|i| i.attributes & 0x08 != 0)
        .map(|i| i.max_timestamp);
    let topic = view.topic_str();
    let mut c = Crossed::default();
    let mut props = Vec::with_capacity(256);
    // Offsets ascend in a stored batch (deltas 0..n-1 checked at produce,
    // compaction keeps a subset in order): the records before `from` are
    // skipped by a search, not one by one (a batch drained in parts).
    let first = set
        .records
        .partition_point(|r| r.offset < 0 || (r.offset as u64) < from);
    for r in set.records[first..].iter() {
        if r.control || r.offset < 0 || (r.offset as u64) < from {
            continue;
        }
        props.clear();
        let tag = header(r, TAGS_HEADER);
        if let Some(codes) = codes {
            let code = tag.map_or(0, |t| java_string_hash(t));
            if tag.is_none() || !has_code(codes, code) {
                c.filtered += 1;
                continue;
            }
        }
        // The properties stay within what RocketMQ's message layout holds
        // (a length the Java client reads as a signed short: past 32767 it
        // dropped the properties and misread the rest of the pull, and
        // past 65535 the length wrapped): room kept for the tag and the
        // unique id; a key or header that does not fit is dropped, counted.
        let tag_room = tag.map_or(0, |t| t.len() + properties::TAGS.len() + 2);
        let reserve = UNIQ_KEY_ROOM + tag_room;
        if let Some(k) = &r.key {
            if prop_safe(k) && !k.is_empty() {
                if fits(&props, properties::KEYS.as_bytes(), k, reserve) {
                    push_prop(&mut props, properties::KEYS.as_bytes(), k);
                } else {
                    c.dropped += 1;
                }
            } else if props.len() + KAFKA_KEY_HEX.len() + 2 * k.len() + 2 + reserve <= MAX_CROSSED_PROPERTIES {
                // (Sized before it is written out: a key too large to
                // cross is not hex-encoded only to be dropped.)
                push_prop(&mut props, KAFKA_KEY_HEX.as_bytes(), hex(k).as_bytes());
            } else {
                c.dropped += 1;
            }
        }
        match tag {
            Some(t) if prop_safe(t) && !t.is_empty() && fits(&props, properties::TAGS.as_bytes(), t, UNIQ_KEY_ROOM) => {
                push_prop(&mut props, properties::TAGS.as_bytes(), t)
            }
            Some(_) => c.dropped += 1,
            None => {}
        }
        // A unique id per record: the batch's CommitLog offset and the
        // record's offset (the batch shares one physical offset). Not its
        // index in the batch: compaction rewrites a batch at the same
        // physical offset with fewer records, and a record's index (so an
        // id a consumer deduplicated by) would move to another record.
        let mut uniq = [0u8; 16];
        uniq[..8].copy_from_slice(&view.phys_offset.to_be_bytes());
        uniq[8..].copy_from_slice(&(r.offset as u64).to_be_bytes());
        push_prop(&mut props, properties::UNIQ_KEY.as_bytes(), &hex_upper(&uniq));
        for (name, value) in &r.headers {
            let n = name.as_bytes();
            if n == TAGS_HEADER.as_bytes() {
                continue;
            }
            match value {
                Some(v)
                    if !n.is_empty()
                        && !v.is_empty()
                        && prop_safe(n)
                        && prop_safe(v)
                        && !is_system(n)
                        // (A header cannot make a message FIFO: the message
                        // group is RocketMQ 5's own property. The other way
                        // a message group crosses as a header.)
                        && n != b"__SHARDINGKEY"
                        && fits(&props, n, v, 0) =>
                {
                    push_prop(&mut props, n, v)
                }
                _ => c.dropped += 1,
            }
        }
        let body: &[u8] = r.value.as_deref().unwrap_or(&[]);
        let input = MessageInput {
            topic,
            queue_id: view.queue_id,
            flag: 0,
            body,
            properties: &props,
            sys_flag: 0,
            born_timestamp: append_time.unwrap_or(r.timestamp),
            born_host: store_host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        let len = rmsg::encoded_len(&input, &store_host, false);
        if len > MAX_CROSSED_MESSAGE {
            // No RocketMQ client takes a frame this large (the Java client's
            // limit is 16 MiB: it closed the connection and pulled the same
            // offset again, for ever): skipped, counted and logged — Kafka
            // consumers still read it.
            c.too_large += 1;
            too_large_logged(topic, view.queue_id, r.offset, len);
            continue;
        }
        let full =
            c.messages as usize >= most.max(1) || (!out.is_empty() && (out.len() - start).saturating_add(len) > budget);
        if full {
            c.stopped_at = Some(r.offset as u64);
            break;
        }
        let at = out.len();
        out.resize(at + len, 0);
        rmsg::encode(
            &mut out[at..],
            &input,
            &store_host,
            Placement {
                queue_offset: r.offset as u64,
                phys_offset: view.phys_offset,
                store_timestamp: view.store_timestamp,
                body_crc32: crc32fast::hash(body),
                record_crc: false,
            },
        );
        c.messages += 1;
        c.bytes += len as u64;
    }
    record_metrics("kafka_to_rocketmq", &c);
    c
}

fn varint(out: &mut BytesMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn put_bytes(out: &mut BytesMut, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            varint(out, b.len() as i64);
            out.put_slice(b);
        }
        None => varint(out, -1),
    }
}

/// The key a Kafka consumer sees for a stored RocketMQ message (`KEYS`, or
/// `KAFKA_KEY_HEX` decoded): what a compacted topic keeps the latest of.
pub fn message_key(m: &MessageView) -> Option<Vec<u8>> {
    properties_key(&m.properties).map(std::borrow::Cow::into_owned)
}

/// Whether encoded RocketMQ properties carry a key (non-empty `KEYS`, or
/// `KAFKA_KEY_HEX`).
pub fn has_key(props: &[u8]) -> bool {
    properties_key(props).is_some_and(|k| !k.is_empty())
}

/// The first `KEYS` (borrowed), or the last valid `KAFKA_KEY_HEX` decoded.
fn properties_key(props: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
    let mut key = None;
    for (k, v) in properties::iter(props) {
        if k == properties::KEYS.as_bytes() {
            key.get_or_insert(std::borrow::Cow::Borrowed(v));
        } else if k == KAFKA_KEY_HEX.as_bytes() {
            if let Some(raw) = unhex(v) {
                key = Some(std::borrow::Cow::Owned(raw));
            }
        }
    }
    key
}

/// RocketMQ's compression bits in a message's sysFlag: 0 (RocketMQ 4's
/// zlib), 1 LZ4 (frame), 2 Zstandard, 3 zlib.
const COMPRESSION_TYPE: i32 = 0x7 << 8;

/// Most bytes a stored body is decompressed to (a hostile body must not
/// make one message take more; RocketMQ's own limit on a message is 4 MiB
/// as sent).
pub const MAX_PLAIN_BODY: usize = 16 << 20;

/// A stored RocketMQ message's body as its producer gave it: RocketMQ
/// producers compress bodies over 4 KiB (zlib unless told otherwise) and
/// set the COMPRESSED flag, which only remoting consumers undo themselves —
/// a Kafka record's value and a gRPC message (sent as IDENTITY) carry the
/// body uncompressed. None when the body cannot be decompressed (or would
/// exceed [`MAX_PLAIN_BODY`]).
pub fn plain_body(m: &MessageView) -> Option<std::borrow::Cow<'_, [u8]>> {
    use std::io::Read;
    if m.sys_flag & rmsg::sysflag::COMPRESSED == 0 {
        return Some(std::borrow::Cow::Borrowed(&m.body[..]));
    }
    let mut out = Vec::new();
    let limit = MAX_PLAIN_BODY as u64 + 1;
    let read = match (m.sys_flag & COMPRESSION_TYPE) >> 8 {
        0 | 3 => flate2::read::ZlibDecoder::new(&m.body[..])
            .take(limit)
            .read_to_end(&mut out),
        1 => lz4::Decoder::new(&m.body[..]).and_then(|d| d.take(limit).read_to_end(&mut out)),
        2 => zstd::stream::read::Decoder::new(&m.body[..]).and_then(|d| d.take(limit).read_to_end(&mut out)),
        _ => return None,
    };
    match read {
        Ok(_) if out.len() <= MAX_PLAIN_BODY => Some(std::borrow::Cow::Owned(out)),
        _ => None,
    }
}

/// A stored RocketMQ message as a one-record magic-2 batch at its queue
/// offset: value = body, key = `KEYS` (or `KAFKA_KEY_HEX` decoded), headers =
/// user properties plus `rocketmq.tags`, CreateTime = born timestamp. Adds
/// to `c` (the caller records the metrics once per request). The batch
/// carries `leader_epoch`, the epoch the message was written in (Kafka
/// consumers check their position against it after a leader change).
pub fn rocketmq_to_kafka_batch(m: &MessageView, leader_epoch: i32, c: &mut Crossed) -> Bytes {
    rocketmq_to_kafka_batch_timed(m, leader_epoch, false, c)
}

/// [`rocketmq_to_kafka_batch`] for a topic whose `message.timestamp.type`
/// is LogAppendTime when `log_append_time`: the batch says so and carries
/// the message's store time as its max timestamp (what Kafka consumers
/// read as the record's time), as Kafka stamps every batch appended there.
pub fn rocketmq_to_kafka_batch_timed(
    m: &MessageView,
    leader_epoch: i32,
    log_append_time: bool,
    c: &mut Crossed,
) -> Bytes {
    let mut key: Option<Vec<u8>> = None;
    let mut headers: Vec<(&[u8], &[u8])> = Vec::new();
    for (k, v) in properties::iter(&m.properties) {
        if k == properties::KEYS.as_bytes() {
            key.get_or_insert_with(|| v.to_vec());
        } else if k == KAFKA_KEY_HEX.as_bytes() {
            match unhex(v) {
                Some(raw) => key = Some(raw),
                None => c.dropped += 1,
            }
        } else if k == properties::TAGS.as_bytes() {
            headers.push((TAGS_HEADER.as_bytes(), v));
        } else if is_system(k) || k.is_empty() {
            // Bookkeeping: never a header.
        } else if std::str::from_utf8(k).is_ok() {
            headers.push((k, v));
        } else {
            // A Kafka header key is a String: readers refuse other bytes.
            c.dropped += 1;
        }
    }
    // The value as the producer sent it (a compressed body decompressed;
    // one that cannot be is passed on as stored, and counted).
    let body = match plain_body(m) {
        Some(b) => b,
        None => {
            c.dropped += 1;
            std::borrow::Cow::Borrowed(&m.body[..])
        }
    };
    let mut rec = BytesMut::with_capacity(32 + body.len() + m.properties.len());
    rec.put_u8(0); // attributes
    varint(&mut rec, 0); // timestamp delta
    varint(&mut rec, 0); // offset delta
    put_bytes(&mut rec, key.as_deref());
    put_bytes(&mut rec, Some(&body));
    varint(&mut rec, headers.len() as i64);
    for (k, v) in &headers {
        put_bytes(&mut rec, Some(k));
        put_bytes(&mut rec, Some(v));
    }
    let mut b = BytesMut::with_capacity(61 + 5 + rec.len());
    b.put_i64(m.queue_offset as i64);
    b.put_i32(0); // batch length, set below
    b.put_i32(leader_epoch);
    b.put_u8(2);
    b.put_u32(0); // CRC, set below
                  // Attributes: no compression; CreateTime, or LogAppendTime (bit 3).
    b.put_i16(if log_append_time { 0x08 } else { 0 });
    b.put_i32(0); // last offset delta
    b.put_i64(m.born_timestamp);
    b.put_i64(if log_append_time {
        m.store_timestamp
    } else {
        m.born_timestamp
    });
    b.put_i64(-1); // producer id
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(1); // records
    varint(&mut b, rec.len() as i64);
    b.put_slice(&rec);
    let batch_len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&batch_len.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    c.messages += 1;
    c.bytes += b.len() as u64;
    b.freeze()
}

/// Tag codes of a TAG expression: `*`/empty = all (None); tokens are split
/// on `||` and trimmed before hashing (some clients send untrimmed codes).
/// Sorted and without repeats: looked up with [`has_code`] (an expression
/// is as long as the request allows, and every message scanned asks).
pub fn tag_codes(expr: &str) -> Option<Vec<i32>> {
    let mut codes: Vec<i32> = tag_names(expr)?
        .map(|t| properties::java_string_hash(t.as_bytes()))
        .collect();
    codes.sort_unstable();
    codes.dedup();
    Some(codes)
}

/// The tags of a TAG expression (`*`/empty: None), as [`tag_codes`] reads it.
pub fn tag_names(expr: &str) -> Option<impl Iterator<Item = &str>> {
    let e = expr.trim();
    if e.is_empty() || e == "*" {
        return None;
    }
    Some(e.split("||").map(str::trim).filter(|t| !t.is_empty()))
}

/// Whether `code` is one of [`tag_codes`]' (sorted) codes.
pub fn has_code(codes: &[i32], code: i32) -> bool {
    codes.binary_search(&code).is_ok()
}

/// A TAG expression as a RocketMQ 5 receive filters by it: the tag codes
/// first (what the ConsumeQueue holds), then the tag itself — two tags
/// whose Java hashes collide ("Aa" and "BB") are told apart, as Apache's
/// proxy (PopMessageResultFilterImpl, FilterUtils.isTagMatched) does; a
/// remoting client does that check itself.
#[derive(Debug, Clone)]
pub struct TagFilter {
    codes: Vec<i32>,
    tags: std::collections::HashSet<String>,
}

impl TagFilter {
    /// None: every message (`*` or empty).
    pub fn new(expr: &str) -> Option<TagFilter> {
        Some(TagFilter {
            codes: tag_codes(expr)?,
            tags: tag_names(expr)?.map(str::to_string).collect(),
        })
    }

    /// Whether a message with these properties passes.
    pub fn matches(&self, props: &[u8]) -> bool {
        let code = properties::tag_code(props) as i32;
        has_code(&self.codes, code)
            && properties::get(props, properties::TAGS)
                .and_then(|t| std::str::from_utf8(t).ok())
                .is_some_and(|t| self.tags.contains(t))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::RecordBatchDecoder;
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    /// A plain record at `offset` (the test batches' builder, the validate
    /// tests' too).
    pub(crate) fn record(
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
    ) -> Record {
        let mut h = IndexMap::new();
        for (k, v) in headers {
            h.insert(StrBytes::from_string(k.to_string()), v.map(Bytes::copy_from_slice));
        }
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            // The encoder splits batches where offset - sequence changes.
            sequence: offset as i32,
            timestamp: 1_700_000_000_000 + offset,
            key: key.map(Bytes::copy_from_slice),
            value: value.map(Bytes::copy_from_slice),
            headers: h,
        }
    }

    fn stored_batch(records: &[Record], compression: Compression) -> Result<KafkaBatchView, String> {
        stored_batch_at(records, compression, 10)
    }

    /// The batch stored at queue offset `queue_offset` (its first record's).
    fn stored_batch_at(
        records: &[Record],
        compression: Compression,
        queue_offset: u64,
    ) -> Result<KafkaBatchView, String> {
        let mut raw = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut raw,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .map_err(|e| e.to_string())?;
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let len = rokka_store::record::kafka::encoded_len("T", raw.len());
        let mut entry = vec![0u8; len];
        rokka_store::record::kafka::encode(
            &mut entry,
            "T",
            &raw,
            rokka_store::record::kafka::KafkaPlacement {
                queue_id: 2,
                queue_offset,
                phys_offset: 4096,
                store_timestamp: 1_700_000_009_999,
                count: records.len() as u32,
            },
        );
        let _ = host;
        rokka_store::record::kafka::decode(&Bytes::from(entry)).map_err(|e| e.to_string())
    }

    fn pulled(out: &BytesMut) -> Result<Vec<MessageView>, String> {
        let mut v = Vec::new();
        let all = Bytes::copy_from_slice(out);
        let mut at = 0;
        while at < all.len() {
            let total = u32::from_be_bytes([all[at], all[at + 1], all[at + 2], all[at + 3]]) as usize;
            v.push(rmsg::decode(&all.slice(at..at + total)).map_err(|e| format!("{e:?}"))?);
            at += total;
        }
        Ok(v)
    }

    /// A batch drained a few messages at a time through the cache gives
    /// exactly the messages one whole conversion gives, and is decoded
    /// once: kept after the first read that stopped inside it, and its
    /// records no view of the stored entry (an uncompressed batch's are).
    #[test]
    fn a_batch_drained_in_parts_is_decoded_once_and_converted_alike() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        for compression in [Compression::None, Compression::Lz4] {
            let records: Vec<Record> = (0..50)
                .map(|i| {
                    record(
                        i,
                        Some(format!("k{i}").as_bytes()),
                        Some(&[b'v'; 40]),
                        &[("h", Some(b"x"))],
                    )
                })
                .collect();
            let view = stored_batch(&records, compression)?;
            let mut whole = BytesMut::new();
            kafka_batch_to_rocketmq(&view, 10, None, host, 1 << 20, &mut whole)?;
            let cache = DecodedBatches::new(1 << 20);
            let mut parts = BytesMut::new();
            let mut from = 10;
            let mut reads = 0;
            loop {
                let c = kafka_batch_to_rocketmq_cached(
                    &cache,
                    &view,
                    from,
                    None,
                    host,
                    1 << 20,
                    (usize::MAX, 7),
                    false,
                    &mut parts,
                )?;
                reads += 1;
                assert!(cache.bytes() > 0, "kept after the first partial read ({compression:?})");
                match c.stopped_at {
                    Some(at) => from = at,
                    None => break,
                }
            }
            assert_eq!(reads, 8, "50 records, 7 a time");
            assert_eq!(
                cache.hits.load(std::sync::atomic::Ordering::Relaxed),
                7,
                "decoded once, then answered from the cache ({compression:?})"
            );
            assert_eq!(pulled(&parts)?, pulled(&whole)?, "{compression:?}");
            let kept = cache.get(BatchKey::of(&view)).ok_or("kept")?;
            for r in &kept.records {
                let v = r.value.as_ref().ok_or("a value")?;
                let inside = view.batch.as_ptr_range().contains(&v.as_ptr());
                assert!(!inside, "a kept record is a view of the stored entry ({compression:?})");
            }
        }
        Ok(())
    }

    /// A soft count over batches read in turn that the cache cannot hold
    /// together: a read resuming a batch evicted since fills the answer
    /// instead of decoding the whole batch again for every few messages.
    #[test]
    fn a_soft_count_does_not_bind_over_a_batch_evicted_since() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let all: Vec<Record> = (0..20).map(|i| record(i, Some(b"k"), Some(b"v"), &[])).collect();
        let a = stored_batch_at(&all, Compression::None, 0)?;
        let b = stored_batch_at(&all, Compression::Lz4, 0)?;
        let mut out = BytesMut::new();
        let probe = DecodedBatches::new(1 << 20);
        kafka_batch_to_rocketmq_cached(&probe, &a, 0, None, host, 1 << 20, (usize::MAX, 1), true, &mut out)?;
        let one = DecodedBatches::new((probe.bytes() + 8) as u64);
        let read = |batch: &KafkaBatchView, from: u64, out: &mut BytesMut| {
            kafka_batch_to_rocketmq_cached(&one, batch, from, None, host, 1 << 20, (usize::MAX, 1), true, out)
                .map(|c| (c.messages, c.stopped_at))
        };
        assert_eq!(read(&a, 0, &mut out)?, (1, Some(1)), "a kept: the count binds");
        assert_eq!(read(&b, 0, &mut out)?, (1, Some(1)), "b kept, a evicted");
        assert_eq!(
            read(&a, 1, &mut out)?,
            (19, None),
            "a resumed from a miss: the rest at once"
        );
        assert_eq!(read(&b, 1, &mut out)?, (1, Some(2)), "b still kept: the count binds");
        Ok(())
    }

    /// A batch compaction rewrote at the same CommitLog offset is not the
    /// one kept; a cache of 0 bytes keeps nothing; the budget evicts the
    /// least recently used first.
    #[test]
    fn the_decoded_batch_cache_tells_rewrites_apart_and_keeps_its_budget() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let all: Vec<Record> = (0..20).map(|i| record(i, Some(b"k"), Some(b"old"), &[])).collect();
        let view = stored_batch_at(&all, Compression::None, 0)?;
        let cache = DecodedBatches::new(1 << 20);
        let mut out = BytesMut::new();
        kafka_batch_to_rocketmq_cached(&cache, &view, 0, None, host, 1 << 20, (usize::MAX, 1), false, &mut out)?;
        assert!(cache.bytes() > 0);
        // The rewrite: every other record, new values, same place.
        let fewer: Vec<Record> = (0..20)
            .step_by(2)
            .map(|i| record(i, Some(b"k"), Some(b"new"), &[]))
            .collect();
        let rewritten = stored_batch_at(&fewer, Compression::None, 0)?;
        assert_eq!(rewritten.phys_offset, view.phys_offset);
        out.clear();
        kafka_batch_to_rocketmq_cached(
            &cache,
            &rewritten,
            1,
            None,
            host,
            1 << 20,
            (usize::MAX, 100),
            false,
            &mut out,
        )?;
        let got = pulled(&out)?;
        assert_eq!(got.len(), 9, "records 2, 4 … 18");
        assert!(got.iter().all(|m| &m.body[..] == b"new"), "the rewrite's records");

        let none = DecodedBatches::new(0);
        out.clear();
        kafka_batch_to_rocketmq_cached(&none, &view, 0, None, host, 1 << 20, (usize::MAX, 1), false, &mut out)?;
        assert_eq!(none.bytes(), 0, "0 keeps nothing");
        // A soft count (a remoting pull) binds over a batch kept, not over
        // one that cannot be: that one fills the answer instead of being
        // decoded again for every message.
        out.clear();
        let c = kafka_batch_to_rocketmq_cached(&none, &view, 0, None, host, 1 << 20, (usize::MAX, 1), true, &mut out)?;
        assert_eq!((c.messages, c.stopped_at), (20, None), "not kept: the whole batch");
        out.clear();
        let keeps = DecodedBatches::new(1 << 20);
        let c = kafka_batch_to_rocketmq_cached(&keeps, &view, 0, None, host, 1 << 20, (usize::MAX, 1), true, &mut out)?;
        assert_eq!((c.messages, c.stopped_at), (1, Some(1)), "kept: one");

        // Room for about one batch: the second evicts the first.
        let one = cache.bytes() + 8;
        let small = DecodedBatches::new(one as u64);
        kafka_batch_to_rocketmq_cached(&small, &view, 0, None, host, 1 << 20, (usize::MAX, 1), false, &mut out)?;
        let other = stored_batch_at(&all, Compression::Lz4, 0)?;
        kafka_batch_to_rocketmq_cached(&small, &other, 0, None, host, 1 << 20, (usize::MAX, 1), false, &mut out)?;
        assert!(small.bytes() <= one, "{} held of {one}", small.bytes());
        assert!(small.get(BatchKey::of(&view)).is_none(), "the older one evicted");
        assert!(small.get(BatchKey::of(&other)).is_some());
        Ok(())
    }

    /// Headers and a key larger than RocketMQ's properties can hold cross
    /// without them (dropped, counted): the properties stay within 32767
    /// bytes with the tag and the unique id kept, and the records after it
    /// cross too. A record larger than any RocketMQ client's frame is
    /// skipped (counted), the rest of the batch not.
    #[test]
    fn oversized_fields_and_records_do_not_break_a_crossing() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let big = vec![b'h'; 40_000];
        let huge = vec![b'v'; MAX_CROSSED_MESSAGE + 1];
        let records = vec![
            record(
                0,
                Some(&big),
                Some(b"v0"),
                &[
                    ("big", Some(&big)),
                    ("rocketmq.tags", Some(b"T")),
                    ("small", Some(b"s")),
                ],
            ),
            record(1, Some(b"k1"), Some(&huge), &[]),
            record(2, Some(b"k2"), Some(b"v2"), &[]),
        ];
        let view = stored_batch(&records, Compression::None)?;
        let mut out = BytesMut::new();
        let c = kafka_batch_to_rocketmq(&view, 0, None, host, 64 << 20, &mut out)?;
        assert_eq!((c.messages, c.too_large), (2, 1), "{c:?}");
        assert_eq!(c.dropped, 2, "the key and the big header");
        let got = pulled(&out)?;
        assert_eq!(
            got.iter().map(|m| m.queue_offset).collect::<Vec<_>>(),
            vec![10, 12],
            "the batch sits at 10"
        );
        let m = &got[0];
        assert!(m.properties.len() <= MAX_CROSSED_PROPERTIES);
        assert_eq!(m.property(properties::TAGS), Some(&b"T"[..]));
        assert!(m.property(properties::UNIQ_KEY).is_some());
        assert_eq!(m.property("small"), Some(&b"s"[..]));
        assert!(m.property(properties::KEYS).is_none() && m.property("big").is_none());
        Ok(())
    }

    /// A receive's tag filter tells apart tags whose Java hashes collide
    /// ("Aa" and "BB" both hash to 2112), as Apache's proxy does; the codes
    /// alone (a remoting pull: its client checks the tag) do not.
    #[test]
    fn a_tag_filter_tells_colliding_tags_apart() {
        let aa = properties::encode([("TAGS", "Aa")]);
        let bb = properties::encode([("TAGS", "BB")]);
        assert_eq!(properties::tag_code(aa.as_bytes()), properties::tag_code(bb.as_bytes()));
        let f = TagFilter::new(" Aa || C ").expect("a filter");
        assert!(f.matches(aa.as_bytes()));
        assert!(!f.matches(bb.as_bytes()));
        assert!(!f.matches(properties::encode([("k", "v")]).as_bytes()), "no tag");
        assert!(TagFilter::new("*").is_none() && TagFilter::new(" ").is_none());
        let codes = tag_codes("Aa||BB||C||Aa").expect("codes");
        assert_eq!(codes.len(), 2, "sorted, repeats dropped: {codes:?}");
        assert!(has_code(&codes, properties::java_string_hash(b"C")));
        assert!(!has_code(&codes, properties::java_string_hash(b"D")));
    }

    /// A LogAppendTime batch's records cross with the append time (the
    /// header's max timestamp), not the create time they carry.
    #[test]
    fn log_append_time_records_cross_with_the_append_time() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let mut raw = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut raw,
            &[record(0, None, Some(b"v"), &[])],
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .map_err(|e| e.to_string())?;
        let stamped =
            crate::validate::stamp_log_append_time(&raw.freeze(), 1_700_000_123_456).map_err(|e| e.to_string())?;
        let len = rokka_store::record::kafka::encoded_len("T", stamped.len());
        let mut entry = vec![0u8; len];
        rokka_store::record::kafka::encode(
            &mut entry,
            "T",
            &stamped,
            rokka_store::record::kafka::KafkaPlacement {
                queue_id: 0,
                queue_offset: 0,
                phys_offset: 0,
                store_timestamp: 1_700_000_123_456,
                count: 1,
            },
        );
        let view = rokka_store::record::kafka::decode(&Bytes::from(entry)).map_err(|e| e.to_string())?;
        let mut out = BytesMut::new();
        kafka_batch_to_rocketmq(&view, 0, None, host, 1 << 20, &mut out)?;
        let m = pulled(&out)?;
        assert_eq!(m[0].born_timestamp, 1_700_000_123_456);
        Ok(())
    }

    /// A record's UNIQ_KEY is its own through compaction: the batch
    /// rewritten at the same physical offset with fewer records keeps each
    /// survivor's id (by its offset; by its index it took another's).
    #[test]
    fn a_records_unique_key_survives_compaction() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let body = b"v".as_slice();
        let ids = |recs: &[Record], at: u64| -> Result<Vec<String>, String> {
            let view = stored_batch_at(recs, Compression::None, at)?;
            let mut out = BytesMut::new();
            kafka_batch_to_rocketmq(&view, 0, None, host, 1 << 20, &mut out)?;
            Ok(pulled(&out)?
                .iter()
                .map(|m| {
                    let p = m.user_properties();
                    String::from_utf8_lossy(properties::get(&p, properties::UNIQ_KEY).unwrap_or_default()).into_owned()
                })
                .collect())
        };
        let whole: Vec<Record> = (0..10i64).map(|i| record(i, Some(b"k"), Some(body), &[])).collect();
        let kept: Vec<Record> = [5i64, 8]
            .iter()
            .map(|i| record(*i, Some(b"k"), Some(body), &[]))
            .collect();
        // (Compaction keeps the survivors' offsets: the rewritten batch's
        // first record is offset 15 of the queue.)
        let before = ids(&whole, 10)?;
        let after = ids(&kept, 15)?;
        assert_eq!(after.len(), 2);
        assert_eq!(after, vec![before[5].clone(), before[8].clone()]);
        Ok(())
    }

    /// A pull answer's byte budget stops the conversion inside a batch
    /// (the next pull starts at the record left out); an empty answer
    /// always takes the first record, however large.
    #[test]
    fn a_byte_budget_stops_a_batch_at_a_record() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let body = [7u8; 1000];
        let recs: Vec<_> = (0..10i64).map(|i| record(100 + i, None, Some(&body), &[])).collect();
        let view = stored_batch(&recs, Compression::Lz4)?;
        let mut whole = BytesMut::new();
        let all = kafka_batch_to_rocketmq(&view, 0, None, host, 1 << 20, &mut whole)?;
        assert_eq!((all.messages, all.stopped_at), (10, None));
        let one = whole.len() / 10;
        // Room for three and a half: three taken, the fourth named (the
        // batch's records are numbered from its base offset).
        let mut out = BytesMut::new();
        let c = kafka_batch_to_rocketmq_within(&view, 0, None, host, 1 << 20, one * 7 / 2, &mut out)?;
        let Some(fourth) = c.stopped_at else {
            return Err("no record left out".into());
        };
        assert_eq!((c.messages, out.len()), (3, 3 * one));
        // From the fourth on, with something already in the answer.
        let c = kafka_batch_to_rocketmq_within(&view, fourth, None, host, 1 << 20, one, &mut out)?;
        assert_eq!((c.messages, c.stopped_at), (1, Some(fourth + 1)));
        // An empty answer takes its first record even over the budget.
        let mut out = BytesMut::new();
        let c = kafka_batch_to_rocketmq_within(&view, fourth + 2, None, host, 1 << 20, 10, &mut out)?;
        assert_eq!((c.messages, c.stopped_at), (1, Some(fourth + 3)));
        Ok(())
    }

    #[test]
    fn kafka_records_become_messages_and_back() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        for compression in [
            Compression::None,
            Compression::Gzip,
            Compression::Zstd,
            Compression::Lz4,
            Compression::Snappy,
        ] {
            let recs = [
                record(
                    10,
                    Some(b"order-1"),
                    Some(b"v0"),
                    &[("h1", Some(b"x")), (TAGS_HEADER, Some(b"TagA"))],
                ),
                record(11, Some(&[0xff, 0x01]), None, &[("bad", None), ("KEYS", Some(b"no"))]),
                record(12, None, Some(b"v2"), &[("h2", Some("é".as_bytes()))]),
            ];
            let view = stored_batch(&recs, compression)?;
            let mut out = BytesMut::new();
            let c = kafka_batch_to_rocketmq(&view, 11, None, host, 1 << 20, &mut out)?;
            assert_eq!((c.messages, c.dropped), (2, 2), "{compression:?}");
            let msgs = pulled(&out)?;
            assert_eq!(msgs[0].queue_offset, 11);
            assert_eq!(msgs[0].queue_id, 2);
            assert!(msgs[0].body.is_empty(), "null value → empty body");
            assert_eq!(msgs[0].property(KAFKA_KEY_HEX), Some(&b"ff01"[..]));
            assert_eq!(msgs[0].property("KEYS"), None);
            assert_eq!(&msgs[1].body[..], b"v2");
            assert_eq!(msgs[1].born_timestamp, 1_700_000_000_012);
            assert_eq!(msgs[1].store_timestamp, 1_700_000_009_999);
            assert_eq!(msgs[1].property("h2"), Some("é".as_bytes()));
            assert!(msgs[1].crc_ok());
            assert_ne!(msgs[0].property("UNIQ_KEY"), msgs[1].property("UNIQ_KEY"));

            // Back to Kafka: key, value, headers byte-exact.
            let batch = rocketmq_to_kafka_batch(&msgs[0], 0, &mut Crossed::default());
            let set = RecordBatchDecoder::decode(&mut batch.clone()).map_err(|e| e.to_string())?;
            assert_eq!(set.records[0].key.as_deref(), Some(&[0xff, 0x01][..]));
            assert_eq!(set.records[0].offset, 11);
            let batch = rocketmq_to_kafka_batch(&msgs[1], 7, &mut Crossed::default());
            // The epoch it was written in (a consumer validates its position
            // with it after a leader change).
            assert_eq!(i32::from_be_bytes([batch[12], batch[13], batch[14], batch[15]]), 7);
            let set = RecordBatchDecoder::decode(&mut batch.clone()).map_err(|e| e.to_string())?;
            let r = &set.records[0];
            assert_eq!((r.offset, r.timestamp), (12, 1_700_000_000_012));
            assert_eq!(r.key, None);
            assert_eq!(r.value.as_deref(), Some(&b"v2"[..]));
            assert_eq!(r.headers.len(), 1);
            assert_eq!(header(r, "h2").map(|b| &b[..]), Some("é".as_bytes()));
        }
        Ok(())
    }

    #[test]
    fn tag_header_filters_and_crosses() -> Result<(), String> {
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let recs = [
            record(10, Some(b"k a"), Some(b"a"), &[(TAGS_HEADER, Some(b"TagA"))]),
            record(11, None, Some(b"b"), &[(TAGS_HEADER, Some(b"TagB"))]),
            record(12, None, Some(b"c"), &[]),
        ];
        let view = stored_batch(&recs, Compression::None)?;
        let mut out = BytesMut::new();
        let code = java_string_hash(b"TagA");
        let c = kafka_batch_to_rocketmq(&view, 0, Some(&[code]), host, 1 << 20, &mut out)?;
        assert_eq!((c.messages, c.filtered), (1, 2));
        let m = &pulled(&out)?[0];
        assert_eq!(m.property("TAGS"), Some(&b"TagA"[..]));
        assert_eq!(m.property("KEYS"), Some(&b"k a"[..]));
        let set = RecordBatchDecoder::decode(&mut rocketmq_to_kafka_batch(m, 0, &mut Crossed::default()))
            .map_err(|e| e.to_string())?;
        let r = &set.records[0];
        assert_eq!(r.key.as_deref(), Some(&b"k a"[..]));
        assert_eq!(header(r, TAGS_HEADER).map(|b| &b[..]), Some(&b"TagA"[..]));
        assert!(header(r, "UNIQ_KEY").is_none(), "system properties stay internal");
        Ok(())
    }

    #[test]
    fn a_property_name_that_is_not_utf8_does_not_cross() -> Result<(), String> {
        // Found by fuzz/ (kafka_batch_convert): the batch made for a Kafka
        // fetch carried it as a header key, which readers refuse.
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let props = b"\xff\x80\x01v\x02ok\x01w\x02";
        let m = MessageInput::new("t", 0, b"body", props);
        let mut rec = vec![0u8; rmsg::encoded_len(&m, &host, false)];
        let at = Placement {
            queue_offset: 5,
            phys_offset: 0,
            store_timestamp: 1,
            body_crc32: crc32fast::hash(b"body"),
            record_crc: false,
        };
        rmsg::encode(&mut rec, &m, &host, at);
        let m = rmsg::decode(&Bytes::from(rec)).map_err(|e| e.to_string())?;
        let mut c = Crossed::default();
        let batch = rocketmq_to_kafka_batch(&m, 0, &mut c);
        assert_eq!(c.dropped, 1);
        assert!(crate::validate::validate(&batch, 1 << 20).is_ok());
        let set = RecordBatchDecoder::decode(&mut batch.clone()).map_err(|e| e.to_string())?;
        assert_eq!(set.records[0].headers.len(), 1);
        assert_eq!(header(&set.records[0], "ok").map(|b| &b[..]), Some(&b"w"[..]));
        Ok(())
    }

    /// RocketMQ producers' compressed bodies (the COMPRESSED flag; zlib as
    /// RocketMQ 4, LZ4 frames, Zstandard, zlib by type) cross as their
    /// producer gave them; a body that does not decompress is passed on as
    /// stored and counted.
    #[test]
    fn compressed_rocketmq_bodies_cross_uncompressed() -> Result<(), String> {
        use kafka_protocol::records::{Compression, RecordBatchDecoder};
        use std::io::Write;
        let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
        let view = stored_batch(&[record(0, Some(b"k"), Some(b"v"), &[])], Compression::None)?;
        let mut out = BytesMut::new();
        kafka_batch_to_rocketmq(&view, 0, None, host, 1 << 20, &mut out)?;
        let base = pulled(&out)?.remove(0);
        let plain: Vec<u8> = (0..20_000u32).flat_map(|i| (i % 251).to_be_bytes()).collect();
        let zlib = {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(5));
            e.write_all(&plain).map_err(|e| e.to_string())?;
            e.finish().map_err(|e| e.to_string())?
        };
        let lz4 = {
            let mut e = lz4::EncoderBuilder::new()
                .build(Vec::new())
                .map_err(|e| e.to_string())?;
            e.write_all(&plain).map_err(|e| e.to_string())?;
            let (v, r) = e.finish();
            r.map_err(|e| e.to_string())?;
            v
        };
        let zstd = zstd::encode_all(&plain[..], 3).map_err(|e| e.to_string())?;
        for (kind, body) in [(0, &zlib), (3, &zlib), (1, &lz4), (2, &zstd)] {
            let mut m = base.clone();
            m.sys_flag |= rmsg::sysflag::COMPRESSED | (kind << 8);
            m.body = Bytes::copy_from_slice(body);
            assert_eq!(plain_body(&m).as_deref(), Some(&plain[..]), "type {kind}");
            let mut c = Crossed::default();
            let batch = rocketmq_to_kafka_batch(&m, 0, &mut c);
            let set = RecordBatchDecoder::decode(&mut batch.clone()).map_err(|e| e.to_string())?;
            assert_eq!(set.records[0].value.as_deref(), Some(&plain[..]), "type {kind}");
            assert_eq!(c.dropped, 0);
        }
        // Not what its flag says: passed on as stored, counted.
        let mut m = base.clone();
        m.sys_flag |= rmsg::sysflag::COMPRESSED;
        m.body = Bytes::from_static(b"not zlib");
        assert_eq!(plain_body(&m), None);
        let mut c = Crossed::default();
        let batch = rocketmq_to_kafka_batch(&m, 0, &mut c);
        let set = RecordBatchDecoder::decode(&mut batch.clone()).map_err(|e| e.to_string())?;
        assert_eq!(set.records[0].value.as_deref(), Some(&b"not zlib"[..]));
        assert_eq!(c.dropped, 1);
        // Uncompressed: borrowed as stored.
        assert!(matches!(plain_body(&base), Some(std::borrow::Cow::Borrowed(_))));
        Ok(())
    }
}
