//! What the CommitLog holds: RocketMQ message records, Kafka batch entries and
//! BLANK fillers, and how the store reads the facts it dispatches from each.

pub mod kafka;
pub mod message;
pub mod properties;

use bytes::Bytes;

pub use kafka::{BatchInfo, KafkaBatchView};
pub use message::{MessageInput, MessageView};

/// Magic of the 8-byte BLANK filler that closes a segment.
pub const BLANK_MAGIC: u32 = 0xCBD4_3194;

/// Why bytes are not a valid entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("entry truncated")]
    Truncated,
    #[error("entry size does not match its fields")]
    SizeMismatch,
    #[error("unknown magic {0:#010x}")]
    BadMagic(u32),
    #[error("bad record batch: {0}")]
    BadBatch(&'static str),
    #[error("CRC mismatch")]
    Crc,
}

/// One decoded CommitLog entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Message(MessageView),
    KafkaBatch(KafkaBatchView),
}

impl Entry {
    pub fn queue_offset(&self) -> u64 {
        match self {
            Entry::Message(m) => m.queue_offset,
            Entry::KafkaBatch(k) => k.queue_offset,
        }
    }

    pub fn phys_offset(&self) -> u64 {
        match self {
            Entry::Message(m) => m.phys_offset,
            Entry::KafkaBatch(k) => k.phys_offset,
        }
    }

    pub fn queue_id(&self) -> u32 {
        match self {
            Entry::Message(m) => m.queue_id,
            Entry::KafkaBatch(k) => k.queue_id,
        }
    }

    pub fn topic_str(&self) -> &str {
        match self {
            Entry::Message(m) => m.topic_str(),
            Entry::KafkaBatch(k) => k.topic_str(),
        }
    }
}

/// Decodes a whole entry of either kind.
pub fn decode_entry(rec: &Bytes) -> Result<Entry, DecodeError> {
    if rec.len() < 8 {
        return Err(DecodeError::Truncated);
    }
    let magic = u32::from_be_bytes([rec[4], rec[5], rec[6], rec[7]]);
    match magic {
        message::MAGIC_V1 | message::MAGIC_V2 => message::decode(rec).map(Entry::Message),
        kafka::KAFKA_BATCH_MAGIC => kafka::decode(rec).map(Entry::KafkaBatch),
        other => Err(DecodeError::BadMagic(other)),
    }
}

/// Checks a whole entry of either kind without building a view (CRCs
/// included) and returns who it says it is.
pub fn verify_entry(rec: &[u8]) -> Result<message::Identity<'_>, DecodeError> {
    if rec.len() < 8 {
        return Err(DecodeError::Truncated);
    }
    if u32::from_be_bytes([rec[4], rec[5], rec[6], rec[7]]) == kafka::KAFKA_BATCH_MAGIC {
        kafka::verify(rec)
    } else {
        message::verify(rec)
    }
}

/// Decodes an entry and checks its CRC(s).
pub fn decode_checked(rec: &Bytes) -> Result<Entry, DecodeError> {
    let e = decode_entry(rec)?;
    let ok = match &e {
        Entry::Message(m) => m.record_crc_ok(rec),
        Entry::KafkaBatch(k) => k.crc_ok(rec),
    };
    if ok {
        Ok(e)
    } else {
        Err(DecodeError::Crc)
    }
}

/// What dispatch needs to know about an appended entry: enough to write its
/// ConsumeQueue entry and its index keys. Built from the input on append and
/// from the stored bytes on recovery, so both paths dispatch identically.
#[derive(Debug, Clone)]
pub(crate) struct DispatchInfo {
    pub queue_id: u32,
    pub queue_offset: u64,
    pub count: u32,
    pub phys_offset: u64,
    pub size: u32,
    pub tag_code: i64,
    pub store_timestamp: i64,
    /// Born time (messages) or the batch's max timestamp (Kafka).
    pub msg_timestamp: i64,
    /// False for prepared / rolled-back transaction records.
    pub consumable: bool,
    /// False for rolled-back transaction records only.
    pub indexable: bool,
}

impl DispatchInfo {
    pub(crate) fn from_entry(e: &Entry) -> DispatchInfo {
        match e {
            Entry::Message(m) => DispatchInfo {
                queue_id: m.queue_id,
                queue_offset: m.queue_offset,
                count: 1,
                phys_offset: m.phys_offset,
                size: m.total_size,
                tag_code: properties::tag_code(&m.properties),
                store_timestamp: m.store_timestamp,
                msg_timestamp: m.born_timestamp,
                consumable: message::is_consumable(m.sys_flag),
                indexable: message::is_indexable(m.sys_flag),
            },
            Entry::KafkaBatch(k) => {
                let info = k.info().ok();
                DispatchInfo {
                    queue_id: k.queue_id,
                    queue_offset: k.queue_offset,
                    count: k.count,
                    phys_offset: k.phys_offset,
                    size: k.total_size,
                    tag_code: 0,
                    store_timestamp: k.store_timestamp,
                    msg_timestamp: kafka_msg_timestamp(info.as_ref(), k.store_timestamp),
                    consumable: true,
                    indexable: true,
                }
            }
        }
    }
}

/// The timestamp a Kafka batch is searched by: its max timestamp, or the store
/// time for LogAppendTime batches.
pub(crate) fn kafka_msg_timestamp(info: Option<&BatchInfo>, store_timestamp: i64) -> i64 {
    match info {
        Some(i) if !i.is_log_append_time() => i.max_timestamp,
        _ => store_timestamp,
    }
}

/// Index keys of a message: `topic#UNIQ_KEY` and `topic#k` for each of the
/// first `max_keys` tokens of KEYS.
pub(crate) fn index_keys<'a>(
    topic: &'a str,
    props: &'a [u8],
    max_keys: usize,
) -> impl Iterator<Item = (&'a str, &'a [u8])> + 'a {
    let uniq = properties::get(props, properties::UNIQ_KEY)
        .into_iter()
        .filter(|k| !k.is_empty());
    let keys = properties::get(props, properties::KEYS)
        .into_iter()
        .flat_map(|k| k.split(|b| *b == b' '))
        .filter(|k| !k.is_empty())
        .take(max_keys);
    uniq.chain(keys).map(move |k| (topic, k))
}

/// KEYS tokens of a message past the first `max_keys` (not indexed).
pub(crate) fn keys_beyond(props: &[u8], max_keys: usize) -> usize {
    properties::get(props, properties::KEYS).map_or(0, |k| {
        k.split(|b| *b == b' ')
            .filter(|k| !k.is_empty())
            .count()
            .saturating_sub(max_keys)
    })
}
