//! Kafka record batches are checked whole before they are stored — header,
//! every record's length, varints, offsets and headers, after decompressing
//! within a budget — so nothing stored can later fail (or explode) in a
//! reader. Every place that opens a stored batch decompresses through
//! [`decompress`], with the same budget.

use std::io::Read;

use bytes::Bytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder, RecordSet};
use rokka_store::record::kafka::{batch_crc_ok, BatchInfo};

/// Offset of the first record in a magic-2 batch.
const RECORDS_AT: usize = 61;

/// Why a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Malformed: the client (or the disk) sent bytes that are not a batch.
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// Decompresses to more than the budget (`broker.max_batch_decompressed_bytes`).
    #[error("record batch decompresses to more than {0} bytes")]
    TooLarge(usize),
    /// Whole and its CRC right, but its records are not valid (a count
    /// that lies, a record that does not parse): Kafka's
    /// InvalidRecordException, which clients do not retry — unlike a
    /// corrupt batch (bytes damaged on the way).
    #[error("invalid record batch: {0}")]
    Invalid(String),
}

fn corrupt(why: impl Into<String>) -> BatchError {
    BatchError::Corrupt(why.into())
}

/// Reads all of `r` into a vector, refusing more than `limit` bytes.
fn read_bounded(mut r: impl Read, limit: usize, hint: usize) -> Result<Vec<u8>, BatchError> {
    let mut out = Vec::with_capacity(hint.min(limit).min(1 << 20));
    let n = (&mut r)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(format!("cannot decompress: {e}")))?;
    if n > limit {
        return Err(BatchError::TooLarge(limit));
    }
    Ok(out)
}

/// The xerial framing Kafka's Java client writes around snappy blocks.
const SNAPPY_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";

fn snappy(data: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    let block = |b: &[u8], out: &mut Vec<u8>| -> Result<(), BatchError> {
        let n = snap::raw::decompress_len(b).map_err(|e| corrupt(format!("snappy: {e}")))?;
        if out.len() + n > limit {
            return Err(BatchError::TooLarge(limit));
        }
        let start = out.len();
        out.resize(start + n, 0);
        snap::raw::Decoder::new()
            .decompress(b, &mut out[start..])
            .map_err(|e| corrupt(format!("snappy: {e}")))?;
        Ok(())
    };
    let mut out = Vec::new();
    if data.len() >= 16 && &data[..8] == SNAPPY_MAGIC {
        let mut at = 16;
        while at < data.len() {
            let len = data
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .ok_or_else(|| corrupt("snappy: truncated block length"))?;
            at += 4;
            let b = data
                .get(at..at + len)
                .ok_or_else(|| corrupt("snappy: block longer than the batch"))?;
            block(b, &mut out)?;
            at += len;
        }
    } else {
        block(data, &mut out)?;
    }
    Ok(out)
}

/// Decompresses a batch's records section (`codec` = attributes & 7) into at
/// most `limit` bytes.
pub fn decompress(codec: u8, data: &[u8], limit: usize) -> Result<Vec<u8>, BatchError> {
    let hint = data.len().saturating_mul(4);
    match codec {
        0 => {
            if data.len() > limit {
                return Err(BatchError::TooLarge(limit));
            }
            Ok(data.to_vec())
        }
        1 => read_bounded(flate2::read::GzDecoder::new(data), limit, hint),
        2 => snappy(data, limit),
        3 => {
            let d = lz4::Decoder::new(data).map_err(|e| corrupt(format!("lz4: {e}")))?;
            read_bounded(d, limit, hint)
        }
        4 => {
            let d = zstd::stream::read::Decoder::new(data).map_err(|e| corrupt(format!("zstd: {e}")))?;
            read_bounded(d, limit, hint)
        }
        c => Err(corrupt(format!("unknown compression codec {c}"))),
    }
}

/// A cursor over record bytes that never reads past its end.
struct Cur<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cur<'_> {
    fn byte(&mut self) -> Result<u8, BatchError> {
        let v = *self.b.get(self.at).ok_or_else(|| corrupt("record truncated"))?;
        self.at += 1;
        Ok(v)
    }

    /// A zig-zag varint of at most `max_bytes` bytes (5 for int32, 10 for int64).
    fn varint(&mut self, max_bytes: u32) -> Result<i64, BatchError> {
        let mut v: u64 = 0;
        for i in 0..max_bytes {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(((v >> 1) as i64) ^ -((v & 1) as i64));
            }
        }
        Err(corrupt("varint too long"))
    }

    fn varint32(&mut self) -> Result<i32, BatchError> {
        let v = self.varint(5)?;
        i32::try_from(v).map_err(|_| corrupt("varint out of int32 range"))
    }

    fn skip(&mut self, n: usize) -> Result<(), BatchError> {
        if n > self.b.len() - self.at {
            return Err(corrupt("length beyond the record"));
        }
        self.at += n;
        Ok(())
    }

    /// A varint length then that many bytes; -1 (null) allowed when `nullable`.
    fn bytes(&mut self, nullable: bool) -> Result<(), BatchError> {
        match self.varint32()? {
            -1 if nullable => Ok(()),
            n if n < 0 => Err(corrupt(format!("negative length {n}"))),
            n => self.skip(n as usize),
        }
    }

    /// A header key: a varint length then that many bytes of UTF-8 (a Kafka
    /// `String`; readers, [`decode`] among them, take it as text).
    fn header_key(&mut self) -> Result<(), BatchError> {
        let n = self.varint32()?;
        if n < 0 {
            return Err(corrupt(format!("negative header key length {n}")));
        }
        let start = self.at;
        self.skip(n as usize)?;
        std::str::from_utf8(&self.b[start..self.at]).map_err(|_| corrupt("header key is not UTF-8"))?;
        Ok(())
    }
}

/// Checks one magic-2 batch completely, as Kafka's log validator does for
/// what a producer sends: header lengths and CRC, a record count that
/// matches both `lastOffsetDelta` and the records present, each record's
/// declared length against its fields, offset deltas 0..n-1, key, value and
/// header lengths, header keys UTF-8, no trailing bytes; compressed records
/// decompressed within `max_decompressed` bytes. Returns the parsed header.
pub fn validate(batch: &[u8], max_decompressed: usize) -> Result<BatchInfo, BatchError> {
    validate_timed(batch, max_decompressed).map(|(info, _)| info)
}

/// [`validate`], and the highest record timestamp the records carry (the
/// base timestamp plus the largest delta): what Kafka's LogValidator takes
/// as the batch's max timestamp for its time index, whatever the header
/// says.
pub fn validate_timed(batch: &[u8], max_decompressed: usize) -> Result<(BatchInfo, i64), BatchError> {
    let info = BatchInfo::parse(batch).map_err(|e| corrupt(e.to_string()))?;
    if !batch_crc_ok(batch) {
        return Err(corrupt("CRC-32C mismatch"));
    }
    // Past the CRC the bytes are what the client meant to send: what is
    // wrong with them is invalid, not corrupt.
    let max_delta = check_records(batch, &info, max_decompressed).map_err(|e| match e {
        BatchError::Corrupt(why) => BatchError::Invalid(why),
        other => other,
    })?;
    Ok((info, info.base_timestamp.wrapping_add(max_delta)))
}

/// The batch with its header's max timestamp set to `max_timestamp` (the
/// CRC-32C recomputed): a header that claims a later time than its
/// records carry would otherwise lead every lookup by time to it.
pub fn set_max_timestamp(batch: &Bytes, max_timestamp: i64) -> Result<Bytes, BatchError> {
    if batch.len() < 61 {
        return Err(corrupt("batch shorter than its header"));
    }
    let mut b = batch.to_vec();
    b[35..43].copy_from_slice(&max_timestamp.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(Bytes::from(b))
}

/// Most records one batch may carry (librdkafka's largest
/// `batch.num.messages`; the Java client's batches are bounded by
/// `batch.size`, far below it for any record size).
pub const MAX_BATCH_RECORDS: u32 = 1_000_000;

/// The records of a batch whose header and CRC passed (see [`validate`]);
/// the largest timestamp delta among them.
fn check_records(batch: &[u8], info: &BatchInfo, max_decompressed: usize) -> Result<i64, BatchError> {
    let count = info.record_count;
    if count == 0 || count > i32::MAX as u32 {
        return Err(corrupt(format!("record count {count} out of range")));
    }
    // Every read that crosses it (a RocketMQ pull, a gRPC receive, a
    // lookup by time) holds its records decoded: a few KB of compressed
    // tiny records must not make millions of them.
    if count > MAX_BATCH_RECORDS {
        return Err(corrupt(format!(
            "{count} records in one batch: more than {MAX_BATCH_RECORDS}"
        )));
    }
    if info.last_offset_delta + 1 != count {
        return Err(corrupt(format!(
            "lastOffsetDelta {} does not match the record count {count}",
            info.last_offset_delta
        )));
    }
    let codec = (info.attributes & 0x07) as u8;
    let raw = batch
        .get(RECORDS_AT..)
        .ok_or_else(|| corrupt("batch shorter than its header"))?;
    let decompressed;
    let records: &[u8] = if codec == 0 {
        raw
    } else {
        decompressed = decompress(codec, raw, max_decompressed)?;
        &decompressed
    };
    // Every record takes at least 7 bytes: checked before looping on a count.
    if (count as usize).saturating_mul(7) > records.len() {
        return Err(corrupt(format!(
            "{count} records cannot fit in {} bytes",
            records.len()
        )));
    }
    let mut c = Cur { b: records, at: 0 };
    let mut max_delta = i64::MIN;
    for i in 0..count as i64 {
        let len = c.varint32()?;
        if len < 0 {
            return Err(corrupt(format!("record {i}: negative length {len}")));
        }
        let start = c.at;
        let end = start
            .checked_add(len as usize)
            .filter(|e| *e <= records.len())
            .ok_or_else(|| corrupt(format!("record {i}: length {len} beyond the batch")))?;
        let mut r = Cur {
            b: &records[..end],
            at: start,
        };
        r.byte()?; // attributes
        max_delta = max_delta.max(r.varint(10)?); // timestamp delta
        let offset_delta = r.varint32()?;
        if i64::from(offset_delta) != i {
            return Err(corrupt(format!("record {i}: offset delta {offset_delta}")));
        }
        r.bytes(true)?; // key
        r.bytes(true)?; // value
        let headers = r.varint32()?;
        if headers < 0 || headers as usize > end - r.at {
            return Err(corrupt(format!("record {i}: header count {headers}")));
        }
        for _ in 0..headers {
            r.header_key()?;
            r.bytes(true)?; // header value
        }
        if r.at != end {
            return Err(corrupt(format!("record {i}: {} bytes left over", end - r.at)));
        }
        c.at = end;
    }
    if c.at != records.len() {
        return Err(corrupt(format!("{} bytes after the last record", records.len() - c.at)));
    }
    Ok(max_delta)
}

/// Decodes a stored batch's records, decompressing within `max_decompressed`.
pub fn decode(batch: &Bytes, max_decompressed: usize) -> Result<RecordSet, String> {
    let mut buf = batch.clone();
    let bounded = |data: &mut Bytes, c: Compression| -> anyhow::Result<Bytes> {
        let out = decompress(c as u8, data, max_decompressed).map_err(anyhow::Error::from)?;
        Ok(Bytes::from(out))
    };
    RecordBatchDecoder::decode_with_custom_compression(&mut buf, Some(bounded)).map_err(|e| e.to_string())
}

/// A batch of `head` (its 61 header bytes) and `records` (a records
/// section's plain bytes) compressed with `codec` (Kafka's id); the
/// header's length, attributes and CRC are the caller's to set.
fn with_records(head: &[u8], codec: u8, records: &[u8]) -> Result<bytes::BytesMut, BatchError> {
    use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};
    let mut out = bytes::BytesMut::with_capacity(head.len() + records.len() / 2 + 64);
    out.extend_from_slice(head);
    let put = |b: &mut bytes::BytesMut| -> anyhow::Result<()> {
        b.extend_from_slice(records);
        Ok(())
    };
    match codec {
        1 => <Gzip as Compressor<bytes::BytesMut>>::compress(&mut out, put),
        2 => <Snappy as Compressor<bytes::BytesMut>>::compress(&mut out, put),
        3 => <Lz4 as Compressor<bytes::BytesMut>>::compress(&mut out, put),
        4 => <Zstd as Compressor<bytes::BytesMut>>::compress(&mut out, put),
        _ => put(&mut out),
    }
    .map_err(|e| corrupt(format!("compressing: {e}")))?;
    Ok(out)
}

/// The batch re-encoded with `codec` (Kafka's id: 0 none, 1 gzip, 2
/// snappy, 3 lz4, 4 zstd), every record and batch field kept: what Kafka
/// does when a topic's `compression.type` differs from the producer's.
pub fn recompress(batch: &Bytes, codec: u8, max_decompressed: usize) -> Result<Bytes, BatchError> {
    // The records section is recompressed as bytes: decoding every record
    // and encoding it again went through a header map, which merged a
    // record's repeated header keys (Kafka keeps each one).
    if codec > 4 {
        return Err(corrupt(format!("unknown compression codec {codec}")));
    }
    let (Some(head), Some(raw)) = (batch.get(..RECORDS_AT), batch.get(RECORDS_AT..)) else {
        return Err(corrupt("batch shorter than its header"));
    };
    let attributes = u16::from_be_bytes([head[21], head[22]]);
    let records = decompress((attributes & 0x07) as u8, raw, max_decompressed)?;
    let mut out = with_records(head, codec, &records)?;
    let length = i32::try_from(out.len() - 12).map_err(|_| corrupt("recompressed batch too large"))?;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    out[21..23].copy_from_slice(&((attributes & !0x07) | u16::from(codec)).to_be_bytes());
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(out.freeze())
}

/// Appends `v` as a zig-zag varint (Kafka's record fields).
fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// The batch with only the records `keep` marks, each record's bytes as
/// they were (headers, repeated keys included) but its offset delta taken
/// from the first kept record, in the batch's codec: header fields kept but
/// the base offset (moved to the first kept record), the record count, the
/// length and the CRC. `lastOffsetDelta` is the caller's to set (and the
/// CRC again after it). Err if no record is kept or `keep` is short.
pub fn filter_records(batch: &[u8], keep: &[bool], max_decompressed: usize) -> Result<Vec<u8>, BatchError> {
    let (Some(head), Some(raw)) = (batch.get(..RECORDS_AT), batch.get(RECORDS_AT..)) else {
        return Err(corrupt("batch shorter than its header"));
    };
    let attributes = u16::from_be_bytes([head[21], head[22]]);
    let codec = (attributes & 0x07) as u8;
    // (An uncompressed batch is already in memory whole: no budget.)
    let records = decompress(codec, raw, if codec == 0 { usize::MAX } else { max_decompressed })?;
    let count = i32::from_be_bytes([head[57], head[58], head[59], head[60]]).max(0) as usize;
    if keep.len() < count {
        return Err(corrupt(format!("{} keep flags for {count} records", keep.len())));
    }
    let mut kept = Vec::with_capacity(records.len());
    let first_ts = i64::from_be_bytes([
        head[27], head[28], head[29], head[30], head[31], head[32], head[33], head[34],
    ]);
    let mut max_ts = i64::MIN;
    let mut first_delta: Option<i64> = None;
    let mut n = 0i32;
    let mut c = Cur { b: &records, at: 0 };
    for keep_it in keep.iter().take(count) {
        let len = c.varint32()?;
        let start = c.at;
        let end = start
            .checked_add(usize::try_from(len).map_err(|_| corrupt("negative record length"))?)
            .filter(|e| *e <= records.len())
            .ok_or_else(|| corrupt("record length beyond the batch"))?;
        let mut r = Cur {
            b: &records[..end],
            at: start,
        };
        let attrs = r.byte()?;
        let ts_delta = r.varint(10)?;
        let offset_delta = i64::from(r.varint32()?);
        if *keep_it {
            let base = *first_delta.get_or_insert(offset_delta);
            max_ts = max_ts.max(first_ts.wrapping_add(ts_delta));
            let mut body = Vec::with_capacity(end - start);
            body.push(attrs);
            put_varint(&mut body, ts_delta);
            put_varint(&mut body, offset_delta - base);
            body.extend_from_slice(&records[r.at..end]);
            put_varint(&mut kept, body.len() as i64);
            kept.extend_from_slice(&body);
            n += 1;
        }
        c.at = end;
    }
    let Some(first_delta) = first_delta else {
        return Err(corrupt("no record kept"));
    };
    let mut out = with_records(head, codec, &kept)?;
    let base = i64::from_be_bytes([head[0], head[1], head[2], head[3], head[4], head[5], head[6], head[7]]);
    out[0..8].copy_from_slice(&base.wrapping_add(first_delta).to_be_bytes());
    let length = i32::try_from(out.len() - 12).map_err(|_| corrupt("filtered batch too large"))?;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    out[57..61].copy_from_slice(&n.to_be_bytes());
    if attributes & 0x08 == 0 {
        // CreateTime: the newest kept record's (LogAppendTime keeps the
        // batch's append time).
        out[35..43].copy_from_slice(&max_ts.to_be_bytes());
    }
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(out.to_vec())
}

/// The batch marked LogAppendTime at `now_ms` (timestamp-type bit and max
/// timestamp set, CRC-32C recomputed), as Kafka stamps batches of a topic
/// with `message.timestamp.type=LogAppendTime`; consumers then take every
/// record's time from the batch.
pub fn stamp_log_append_time(batch: &Bytes, now_ms: i64) -> Result<Bytes, BatchError> {
    if batch.len() < 61 {
        return Err(corrupt("batch shorter than its header"));
    }
    let mut b = batch.to_vec();
    let attributes = u16::from_be_bytes([b[21], b[22]]) | 0x08;
    b[21..23].copy_from_slice(&attributes.to_be_bytes());
    b[35..43].copy_from_slice(&now_ms.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(Bytes::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions};

    use crate::convert::tests::record;

    fn batch(n: usize, compression: Compression, value: &[u8]) -> Result<Vec<u8>, String> {
        let recs: Vec<Record> = (0..n)
            .map(|i| record(i as i64, Some(format!("k{i}").as_bytes()), Some(value), &[]))
            .collect();
        let mut out = BytesMut::new();
        let opts = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut out, &recs, &opts).map_err(|e| e.to_string())?;
        Ok(out.to_vec())
    }

    fn fix_crc(b: &mut [u8]) {
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn good_batches_of_every_codec_pass() -> Result<(), String> {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let b = batch(50, c, b"hello")?;
            let info = validate(&b, 1 << 20).map_err(|e| format!("{c:?}: {e}"))?;
            assert_eq!(info.record_count, 50);
            let set = decode(&Bytes::from(b), 1 << 20)?;
            assert_eq!(set.records.len(), 50);
        }
        Ok(())
    }

    #[test]
    fn a_lying_record_count_is_refused() -> Result<(), String> {
        let mut b = batch(3, Compression::None, b"v")?;
        b[57..61].copy_from_slice(&0x7FFF_FFF0u32.to_be_bytes());
        fix_crc(&mut b);
        assert!(matches!(validate(&b, 1 << 20), Err(BatchError::Invalid(_))));
        // With lastOffsetDelta agreeing, still refused: the records are not there.
        b[23..27].copy_from_slice(&0x7FFF_FFEFu32.to_be_bytes());
        fix_crc(&mut b);
        assert!(matches!(validate(&b, 1 << 20), Err(BatchError::Invalid(_))));
        // Fewer records claimed than present: trailing bytes.
        let mut b = batch(3, Compression::None, b"v")?;
        b[57..61].copy_from_slice(&2u32.to_be_bytes());
        b[23..27].copy_from_slice(&1u32.to_be_bytes());
        fix_crc(&mut b);
        assert!(matches!(validate(&b, 1 << 20), Err(BatchError::Invalid(_))));
        // And the stored-batch decoder refuses the lie without reserving for it.
        let mut b = batch(3, Compression::None, b"v")?;
        b[57..61].copy_from_slice(&0x7FFF_FFF0u32.to_be_bytes());
        fix_crc(&mut b);
        assert!(decode(&Bytes::from(b), 1 << 20).is_err());
        Ok(())
    }

    #[test]
    fn a_lying_record_length_or_field_is_refused() -> Result<(), String> {
        let good = batch(2, Compression::None, b"value")?;
        // Flip every byte of the records section in turn (CRC fixed up): the
        // validator never panics, and accepts only what still parses exactly.
        for at in RECORDS_AT..good.len() {
            for v in [0x00u8, 0x7f, 0xff, 0x01] {
                let mut b = good.clone();
                b[at] = v;
                fix_crc(&mut b);
                let _ = validate(&b, 1 << 20);
            }
        }
        // A record length one too long.
        let mut b = good.clone();
        b[RECORDS_AT] += 2; // zig-zag: +1
        fix_crc(&mut b);
        assert!(matches!(validate(&b, 1 << 20), Err(BatchError::Invalid(_))));
        Ok(())
    }

    /// An uncompressed batch of `n` records (keys k0, k1, ...), each with
    /// the header key "hk" twice — which kafka-protocol's encoder (a header
    /// map) cannot write, so a second key is renamed in the bytes.
    fn repeated_header_batch(n: i64) -> Result<Bytes, String> {
        let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        let recs: Vec<Record> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                record(
                    i as i64,
                    Some(k.as_bytes()),
                    Some(b"value"),
                    &[("hk", Some(b"1")), ("hx", Some(b"2"))],
                )
            })
            .collect();
        let mut out = BytesMut::new();
        let opts = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut out, &recs, &opts).map_err(|e| e.to_string())?;
        let mut plain = out.to_vec();
        for i in 0..plain.len() - 1 {
            if &plain[i..i + 2] == b"hx" {
                plain[i + 1] = b'k';
            }
        }
        fix_crc(&mut plain);
        Ok(Bytes::from(plain))
    }

    /// A record with one header key twice (tracing headers, baggage) keeps
    /// both through recompression to the topic's codec and back: the
    /// records section goes through as bytes, unchanged.
    #[test]
    fn recompression_keeps_every_record_byte_repeated_header_keys_included() -> Result<(), String> {
        let plain = repeated_header_batch(2)?;
        validate(&plain, 1 << 20).map_err(|e| e.to_string())?;
        for codec in 1..=4u8 {
            let packed = recompress(&plain, codec, 1 << 20).map_err(|e| e.to_string())?;
            assert_eq!(packed[22] & 0x07, codec);
            assert!(validate(&packed, 1 << 20).is_ok(), "codec {codec}");
            let back = recompress(&packed, 0, 1 << 20).map_err(|e| e.to_string())?;
            assert_eq!(back, plain, "codec {codec}: records byte-exact");
        }
        Ok(())
    }

    /// Compaction keeps records by filtering the batch's bytes: a kept
    /// record's repeated header keys survive, offsets move to the first
    /// kept record, and the batch validates in every codec.
    #[test]
    fn filtering_records_keeps_their_bytes_and_renumbers_from_the_first_kept() -> Result<(), String> {
        let plain = repeated_header_batch(3)?;
        for codec in [0u8, 1, 4] {
            let packed = recompress(&plain, codec, 1 << 20).map_err(|e| e.to_string())?;
            let mut kept = filter_records(&packed, &[false, true, true], 1 << 20).map_err(|e| e.to_string())?;
            // lastOffsetDelta is the caller's: 1 here (offsets 1 and 2 kept).
            kept[23..27].copy_from_slice(&1u32.to_be_bytes());
            fix_crc(&mut kept);
            let info = validate(&kept, 1 << 20).map_err(|e| e.to_string())?;
            assert_eq!(info.record_count, 2);
            assert_eq!(i64::from_be_bytes(kept[0..8].try_into().map_err(|_| "base")?), 1);
            let flat = recompress(&Bytes::from(kept), 0, 1 << 20).map_err(|e| e.to_string())?;
            let keys = flat.windows(2).filter(|w| *w == b"hk").count();
            assert_eq!(keys, 4, "two records, each with its two hk headers");
            assert!(flat.windows(2).any(|w| w == b"k1") && !flat.windows(2).any(|w| w == b"k0"));
        }
        Ok(())
    }

    #[test]
    fn a_header_key_that_is_not_utf8_is_refused() -> Result<(), String> {
        // Found by fuzz/ (kafka_batch_convert): Produce stored such a batch,
        // then every RocketMQ pull failed to convert it (the record decoder
        // takes header keys as text) and skipped its records.
        let rec = record(0, None, Some(b"v"), &[("hk", None)]);
        let mut out = BytesMut::new();
        let opts = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut out, &[rec], &opts).map_err(|e| e.to_string())?;
        let good = out.to_vec();
        assert!(validate(&good, 1 << 20).is_ok());
        assert!(decode(&Bytes::from(good.clone()), 1 << 20).is_ok());
        let at = good
            .windows(2)
            .rposition(|w| w == b"hk")
            .ok_or("header key not found")?;
        let mut bad = good.clone();
        bad[at] = 0xff;
        fix_crc(&mut bad);
        assert!(decode(&Bytes::from(bad.clone()), 1 << 20).is_err());
        assert_eq!(
            validate(&bad, 1 << 20),
            Err(BatchError::Invalid("header key is not UTF-8".into()))
        );
        Ok(())
    }

    #[test]
    fn timestamps_and_offsets_off_the_wire_wrap_instead_of_panicking() -> Result<(), String> {
        // Found by fuzz/ (kafka_batch_convert): a batch whose base timestamp
        // plus a record's delta overflows passes Produce (as in Kafka), and
        // the record decoder's `+` then panicked on every RocketMQ pull of
        // it where overflow checks are on (patched in third_party/).
        let mut b = batch(2, Compression::None, b"v")?;
        b[27..35].copy_from_slice(&i64::MAX.to_be_bytes());
        b[0..8].copy_from_slice(&i64::MAX.to_be_bytes());
        fix_crc(&mut b);
        assert!(validate(&b, 1 << 20).is_ok());
        let set = decode(&Bytes::from(b), 1 << 20)?;
        assert_eq!(set.records[1].timestamp, i64::MIN);
        assert_eq!(set.records[1].offset, i64::MIN);
        Ok(())
    }

    #[test]
    fn decompression_is_bounded() -> Result<(), String> {
        let big = vec![0u8; 4 << 20];
        for c in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let b = batch(1, c, &big)?;
            assert!(b.len() < 1 << 20, "{c:?} compresses zeros");
            assert_eq!(validate(&b, 1 << 20), Err(BatchError::TooLarge(1 << 20)), "{c:?}");
            assert!(decode(&Bytes::from(b.clone()), 1 << 20).is_err(), "{c:?}");
            assert!(validate(&b, 8 << 20).is_ok(), "{c:?}");
        }
        Ok(())
    }
}
