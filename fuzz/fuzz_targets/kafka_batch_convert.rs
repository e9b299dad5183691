//! Messages crossing between the protocols, from bytes a client or the disk
//! could hold. The first input byte picks what the rest is:
//!
//! * **a producer's records** (modes 0 and 3): split and validated by
//!   Produce's own `split_batches`; every batch it accepts is stored as the
//!   store encodes it, and must then decode and pass the store's CRC checks,
//!   convert to RocketMQ messages (`kafka_batch_to_rocketmq`, as a pull
//!   does), each of which must decode as a stored message and convert back
//!   to a batch that Produce's validator accepts. Whatever Produce accepts
//!   must never fail or explode in a reader.
//! * **a stored Kafka batch entry** (mode 1): `record::kafka::decode`, then
//!   the pull conversion; errors are fine.
//! * **a stored RocketMQ message record** (mode 2): `record::message::decode`,
//!   then the fetch conversion (`rocketmq_to_kafka_batch`), whose batch must
//!   pass Produce's validator.
//!
//! Flag bits of the first byte fix up lengths and CRCs (bit 2: lengths,
//! bit 3: CRCs) so mutations reach the record parsers instead of dying at
//! a checksum; bit 4 applies a tag filter. The second byte moves the pull's
//! start offset into the batch.
#![no_main]

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use rokka_broker::convert::{kafka_batch_to_rocketmq, rocketmq_to_kafka_batch, Crossed};
use rokka_broker::validate::validate;
use rokka_store::record::kafka::{self as kbatch, KafkaBatchView, KafkaPlacement};
use rokka_store::record::{message, properties, Entry};

/// Decompression budget here (the broker's default is 64 MiB).
const MAX_DECOMPRESSED: usize = 1 << 20;
const TOPIC: &str = "fuzz-topic";
const QUEUE_OFFSET: u64 = 1000;

fn host() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 7], 10911))
}

/// Kafka batch header fields: length at 8, CRC-32C at 17 over 21.. .
fn fix_batch(b: &mut [u8], lengths: bool, crcs: bool) {
    if lengths && b.len() >= 12 {
        let n = (b.len() - 12) as u32;
        b[8..12].copy_from_slice(&n.to_be_bytes());
    }
    if crcs && b.len() >= 21 {
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }
}

/// A RocketMQ message's converted batch must be one Produce would accept.
fn to_kafka(m: &message::MessageView) {
    let mut c = Crossed::default();
    // Any epoch the set's history can hold: the stamp must not change what
    // Produce accepts.
    let epoch = (m.queue_offset % 1024) as i32;
    let batch = rocketmq_to_kafka_batch(m, epoch, &mut c);
    if let Err(e) = validate(&batch, MAX_DECOMPRESSED) {
        panic!("rocketmq_to_kafka_batch made a batch Produce refuses: {e}\nmessage: {m:?}");
    }
}

fn pull(view: &KafkaBatchView, from: u64, codes: Option<&[i32]>) -> Result<BytesMut, String> {
    let mut out = BytesMut::new();
    kafka_batch_to_rocketmq(view, from, codes, host(), MAX_DECOMPRESSED, &mut out)?;
    Ok(out)
}

fn producer_records(records: &[u8], from: u64, codes: Option<&[i32]>) {
    let Ok(batches) = rokka_kafka::api::split_batches(&Bytes::copy_from_slice(records), MAX_DECOMPRESSED) else {
        return;
    };
    for batch in batches {
        let info = match validate(&batch, MAX_DECOMPRESSED) {
            Ok(i) => i,
            Err(e) => panic!("split_batches accepted a batch validate refuses: {e}"),
        };
        // Stored as `append_kafka_batch` stores it.
        let mut entry = vec![0u8; kbatch::encoded_len(TOPIC, batch.len())];
        kbatch::encode(
            &mut entry,
            TOPIC,
            &batch,
            KafkaPlacement {
                queue_id: 3,
                queue_offset: QUEUE_OFFSET,
                phys_offset: 1 << 20,
                store_timestamp: 1_700_000_000_000,
                count: info.offset_count(),
            },
        );
        let entry = Bytes::from(entry);
        let view = match rokka_store::record::decode_checked(&entry) {
            Ok(Entry::KafkaBatch(v)) => v,
            other => panic!("a stored, validated batch does not read back: {other:?}"),
        };
        let out = match pull(&view, from, codes) {
            Ok(out) => out,
            Err(e) => panic!("a batch Produce accepted cannot be converted for a RocketMQ pull: {e}"),
        };
        // The pull body: stored-message records back to back.
        let mut at = 0;
        while at < out.len() {
            let size = out
                .get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
                .unwrap_or(0);
            assert!(size > 0 && at + size <= out.len(), "pull body misframed at {at}");
            let rec = Bytes::copy_from_slice(&out[at..at + size]);
            let m = match message::decode(&rec) {
                Ok(m) => m,
                Err(e) => panic!("converted message does not decode: {e}"),
            };
            assert!(m.crc_ok(), "converted message has a wrong body CRC");
            to_kafka(&m);
            at += size;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // Decompression is bounded by MAX_DECOMPRESSED; what converts from it
    // grows by a bounded factor per record (message header, properties).
    let _budget = rokka_fuzz::budget(data.len(), 64 * MAX_DECOMPRESSED, 1024);
    let mut input = rokka_fuzz::Input(data);
    let flags = input.u8();
    let from = QUEUE_OFFSET + u64::from(input.u8() % 16);
    let (lengths, crcs) = (flags & 4 != 0, flags & 8 != 0);
    let tag_codes = [properties::java_string_hash(b"TagA"), 0];
    let codes = (flags & 16 != 0).then_some(&tag_codes[..]);
    let mut rest = input.rest().to_vec();
    match flags & 3 {
        0 | 3 => {
            if rest.len() >= 61 {
                fix_batch(&mut rest, lengths, crcs);
            }
            producer_records(&rest, from, codes);
        }
        1 => {
            // A stored entry: total size at 0, topic length at 44, the
            // batch after the topic.
            if lengths && rest.len() >= 4 {
                let n = rest.len() as u32;
                rest[0..4].copy_from_slice(&n.to_be_bytes());
            }
            if rest.len() >= kbatch::HEADER_LEN {
                let t_end = kbatch::HEADER_LEN + usize::from(u16::from_be_bytes([rest[44], rest[45]]));
                if let Some(b) = rest.get_mut(t_end..) {
                    fix_batch(b, lengths, crcs);
                }
            }
            if let Ok(view) = kbatch::decode(&Bytes::from(rest)) {
                let _ = pull(&view, from, codes);
            }
        }
        _ => {
            if lengths && rest.len() >= 4 {
                let n = rest.len() as u32;
                rest[0..4].copy_from_slice(&n.to_be_bytes());
            }
            if let Ok(m) = message::decode(&Bytes::from(rest)) {
                to_kafka(&m);
            }
        }
    }
});
