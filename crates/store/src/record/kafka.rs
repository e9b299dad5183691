//! The store's second entry kind: one whole Kafka RecordBatch (magic 2),
//! stored as the producer sent it with its base offset set to the assigned
//! queue offset, covering `count` consecutive offsets.
//!
//! ```text
//! 0  total size        u32
//! 4  magic             u32  = KAFKA_BATCH_MAGIC
//! 8  header crc        u32  CRC-32C of bytes 12 .. 12+HEADER+topic+21 (our header
//!                           and the batch fields outside the batch's own CRC)
//! 12 queue id          u32
//! 16 queue offset      u64  (= the batch's base offset)
//! 24 physical offset   u64
//! 32 store timestamp   i64
//! 40 count             u32  offsets covered (lastOffsetDelta + 1)
//! 44 topic length      u16
//! 46 topic
//! .. record batch      (batchLength + 12 bytes)
//! ```
//! The batch's own CRC-32C (attributes .. end) protects the rest, so recovery
//! checks both CRCs and no byte of the entry goes unchecked.

use bytes::Bytes;

use super::DecodeError;

/// Magic of a Kafka batch entry; distinct from RocketMQ's record and BLANK magics.
pub const KAFKA_BATCH_MAGIC: u32 = 0xDAA3_20B5;
/// Bytes before the topic.
pub const HEADER_LEN: usize = 46;
/// Record-batch header bytes (baseOffset .. recordCount).
pub const BATCH_HEADER_LEN: usize = 61;
/// Bytes of the batch not covered by the batch CRC (baseOffset, batchLength,
/// partitionLeaderEpoch, magic, crc).
const BATCH_UNCHECKED: usize = 21;

/// Facts about a record batch read from its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchInfo {
    pub base_offset: i64,
    pub attributes: u16,
    pub last_offset_delta: u32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: u32,
    pub crc: u32,
}

impl BatchInfo {
    /// Parses and sanity-checks the header of one magic-2 batch occupying all
    /// of `batch`.
    pub fn parse(batch: &[u8]) -> Result<BatchInfo, DecodeError> {
        if batch.len() < BATCH_HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        let be32 = |at: usize| u32::from_be_bytes([batch[at], batch[at + 1], batch[at + 2], batch[at + 3]]);
        let be64 = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&batch[at..at + 8]);
            i64::from_be_bytes(a)
        };
        let batch_length = be32(8) as usize;
        if batch_length + 12 != batch.len() {
            return Err(DecodeError::SizeMismatch);
        }
        if batch[16] != 2 {
            return Err(DecodeError::BadBatch("record batch magic is not 2"));
        }
        let last_offset_delta = be32(23);
        if last_offset_delta >= i32::MAX as u32 {
            return Err(DecodeError::BadBatch("lastOffsetDelta out of range"));
        }
        Ok(BatchInfo {
            base_offset: be64(0),
            crc: be32(17),
            attributes: u16::from_be_bytes([batch[21], batch[22]]),
            last_offset_delta,
            base_timestamp: be64(27),
            max_timestamp: be64(35),
            producer_id: be64(43),
            producer_epoch: i16::from_be_bytes([batch[51], batch[52]]),
            base_sequence: be32(53) as i32,
            record_count: be32(57),
        })
    }

    /// Offsets the batch covers.
    pub fn offset_count(&self) -> u32 {
        self.last_offset_delta + 1
    }

    /// Timestamp type bit: LogAppendTime.
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & 0x08 != 0
    }
}

/// Whether the batch's CRC-32C (attributes .. end) matches.
pub fn batch_crc_ok(batch: &[u8]) -> bool {
    match BatchInfo::parse(batch) {
        Ok(info) => crc32c::crc32c(&batch[BATCH_UNCHECKED..]) == info.crc,
        Err(_) => false,
    }
}

/// Total entry size for a batch of `batch_len` bytes in `topic`.
pub fn encoded_len(topic: &str, batch_len: usize) -> usize {
    HEADER_LEN + topic.len() + batch_len
}

/// Values fixed at append time.
#[derive(Debug, Clone, Copy)]
pub struct KafkaPlacement {
    pub queue_id: u32,
    pub queue_offset: u64,
    pub phys_offset: u64,
    pub store_timestamp: i64,
    pub count: u32,
}

/// Encodes an entry into `buf` (exactly [`encoded_len`] bytes); the stored
/// batch gets `queue_offset` as its base offset.
pub fn encode(buf: &mut [u8], topic: &str, batch: &[u8], at: KafkaPlacement) {
    encode_at_epoch(buf, topic, batch, at, None);
}

/// [`encode`], with the batch's partitionLeaderEpoch set to the leader
/// epoch it is appended under (as a Kafka leader stamps it): consumers
/// commit and validate positions with it (KIP-320), so a failover must
/// not see epochs the history does not know. The field is outside the
/// batch's CRC.
pub fn encode_at_epoch(buf: &mut [u8], topic: &str, batch: &[u8], at: KafkaPlacement, leader_epoch: Option<i32>) {
    let total = buf.len();
    buf[0..4].copy_from_slice(&(total as u32).to_be_bytes());
    buf[4..8].copy_from_slice(&KAFKA_BATCH_MAGIC.to_be_bytes());
    buf[12..16].copy_from_slice(&at.queue_id.to_be_bytes());
    buf[16..24].copy_from_slice(&at.queue_offset.to_be_bytes());
    buf[24..32].copy_from_slice(&at.phys_offset.to_be_bytes());
    buf[32..40].copy_from_slice(&at.store_timestamp.to_be_bytes());
    buf[40..44].copy_from_slice(&at.count.to_be_bytes());
    buf[44..46].copy_from_slice(&(topic.len() as u16).to_be_bytes());
    let t_end = HEADER_LEN + topic.len();
    buf[HEADER_LEN..t_end].copy_from_slice(topic.as_bytes());
    buf[t_end..].copy_from_slice(batch);
    buf[t_end..t_end + 8].copy_from_slice(&at.queue_offset.to_be_bytes());
    if let Some(epoch) = leader_epoch {
        buf[t_end + 12..t_end + 16].copy_from_slice(&epoch.to_be_bytes());
    }
    let crc = crc32c::crc32c(&buf[12..t_end + BATCH_UNCHECKED]);
    buf[8..12].copy_from_slice(&crc.to_be_bytes());
}

/// A stored Kafka batch entry, decoded without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaBatchView {
    pub total_size: u32,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub phys_offset: u64,
    pub store_timestamp: i64,
    pub count: u32,
    pub topic: Bytes,
    /// The record batch exactly as served to Kafka consumers.
    pub batch: Bytes,
    header_crc: u32,
    header_crc_span: usize,
}

impl KafkaBatchView {
    pub fn topic_str(&self) -> &str {
        std::str::from_utf8(&self.topic).unwrap_or("")
    }

    pub fn info(&self) -> Result<BatchInfo, DecodeError> {
        BatchInfo::parse(&self.batch)
    }

    /// Both CRCs (our header, the batch's own) match.
    pub fn crc_ok(&self, entry: &[u8]) -> bool {
        entry.len() >= 12 + self.header_crc_span
            && crc32c::crc32c(&entry[12..12 + self.header_crc_span]) == self.header_crc
            && batch_crc_ok(&self.batch)
    }
}

/// Checks a whole stored batch entry without building a view (the read
/// path's check): size, magic, layout, our header CRC and the batch's own
/// CRC-32C. Returns who the entry says it is.
pub fn verify(rec: &[u8]) -> Result<super::message::Identity<'_>, DecodeError> {
    let l = layout(rec)?;
    if crc32c::crc32c(&rec[12..12 + l.header_crc_span]) != l.header_crc || !batch_crc_ok(&rec[l.topic.end..]) {
        return Err(DecodeError::Crc);
    }
    Ok(super::message::Identity {
        phys_offset: l.phys_offset,
        queue_id: l.queue_id,
        queue_offset: l.queue_offset,
        topic: &rec[l.topic],
    })
}

/// An entry's fields and where its topic lies (the batch follows it):
/// what both [`decode`] and [`verify`] read, parsed in one place.
struct Layout {
    total_size: u32,
    header_crc: u32,
    queue_id: u32,
    queue_offset: u64,
    phys_offset: u64,
    store_timestamp: i64,
    count: u32,
    topic: std::ops::Range<usize>,
    header_crc_span: usize,
}

fn layout(rec: &[u8]) -> Result<Layout, DecodeError> {
    if rec.len() < HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    let be32 = |at: usize| u32::from_be_bytes([rec[at], rec[at + 1], rec[at + 2], rec[at + 3]]);
    let be64 = |at: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&rec[at..at + 8]);
        u64::from_be_bytes(a)
    };
    let total_size = be32(0);
    if total_size as usize != rec.len() {
        return Err(DecodeError::SizeMismatch);
    }
    if be32(4) != KAFKA_BATCH_MAGIC {
        return Err(DecodeError::BadMagic(be32(4)));
    }
    let topic_len = usize::from(u16::from_be_bytes([rec[44], rec[45]]));
    let t_end = HEADER_LEN + topic_len;
    if rec.len() < t_end + BATCH_HEADER_LEN {
        return Err(DecodeError::Truncated);
    }
    BatchInfo::parse(&rec[t_end..])?;
    Ok(Layout {
        total_size,
        header_crc: be32(8),
        queue_id: be32(12),
        queue_offset: be64(16),
        phys_offset: be64(24),
        store_timestamp: be64(32) as i64,
        count: be32(40),
        topic: HEADER_LEN..t_end,
        header_crc_span: t_end + BATCH_UNCHECKED - 12,
    })
}

/// Decodes a whole entry (`rec` holds exactly its total size).
pub fn decode(rec: &Bytes) -> Result<KafkaBatchView, DecodeError> {
    let l = layout(rec)?;
    Ok(KafkaBatchView {
        total_size: l.total_size,
        header_crc: l.header_crc,
        queue_id: l.queue_id,
        queue_offset: l.queue_offset,
        phys_offset: l.phys_offset,
        store_timestamp: l.store_timestamp,
        count: l.count,
        batch: rec.slice(l.topic.end..),
        topic: rec.slice(l.topic),
        header_crc_span: l.header_crc_span,
    })
}

/// Builds a valid, uncompressed magic-2 batch of `values` (no keys, no
/// headers). For tests and benchmarks; real batches come from Kafka clients.
pub fn build_test_batch(values: &[&[u8]], base_timestamp: i64) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let b = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
    }
    let mut records = Vec::new();
    for (i, v) in values.iter().enumerate() {
        let mut rec = vec![0u8]; // attributes
        varint(&mut rec, 0); // timestamp delta
        varint(&mut rec, i as i64); // offset delta
        varint(&mut rec, -1); // null key
        varint(&mut rec, v.len() as i64);
        rec.extend_from_slice(v);
        varint(&mut rec, 0); // headers
        varint(&mut records, rec.len() as i64);
        records.extend_from_slice(&rec);
    }
    let mut b = Vec::with_capacity(BATCH_HEADER_LEN + records.len());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((BATCH_HEADER_LEN - 12 + records.len()) as u32).to_be_bytes());
    b.extend_from_slice(&0i32.to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes()); // crc, filled below
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&(values.len().saturating_sub(1) as u32).to_be_bytes());
    b.extend_from_slice(&base_timestamp.to_be_bytes());
    b.extend_from_slice(&base_timestamp.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&(values.len() as u32).to_be_bytes());
    b.extend_from_slice(&records);
    let crc = crc32c::crc32c(&b[BATCH_UNCHECKED..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_roundtrip_and_crc() -> Result<(), DecodeError> {
        let batch = build_test_batch(&[b"a", b"bb", b"ccc"], 1234);
        assert!(batch_crc_ok(&batch));
        let info = BatchInfo::parse(&batch)?;
        assert_eq!(info.offset_count(), 3);
        assert_eq!(info.record_count, 3);
        let len = encoded_len("kt", batch.len());
        let mut buf = vec![0u8; len];
        let at = KafkaPlacement {
            queue_id: 2,
            queue_offset: 77,
            phys_offset: 4096,
            store_timestamp: 99,
            count: 3,
        };
        encode(&mut buf, "kt", &batch, at);
        let rec = Bytes::from(buf.clone());
        let v = decode(&rec)?;
        assert_eq!(v.topic_str(), "kt");
        assert_eq!(v.queue_offset, 77);
        assert_eq!(v.count, 3);
        assert_eq!(v.info()?.base_offset, 77);
        assert_eq!(&v.batch[8..], &batch[8..]);
        assert!(v.crc_ok(&rec));
        // Any flipped byte is caught by one of the two CRCs (or the parser).
        for i in 8..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x40;
            let bad = Bytes::from(bad);
            let caught = match decode(&bad) {
                Ok(v) => !v.crc_ok(&bad),
                Err(_) => true,
            };
            assert!(caught, "flip at {i} not detected");
        }
        Ok(())
    }
}
