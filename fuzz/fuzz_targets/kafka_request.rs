//! A Kafka request frame (what follows the 4-byte length) through the
//! listener's own decoder, `rokka_kafka::decode_request` (the path of
//! `conn::handle`: API key and version checked against the served table,
//! header and body decoded by the patched kafka-protocol); a Produce
//! request's records then go through Produce's own batch splitting and full
//! validation. Errors are fine; a panic (even one `handle` would catch), an
//! abort or an allocation larger than the frame justifies is a crash.
#![no_main]

use bytes::Bytes;
use kafka_protocol::messages::RequestKind;
use libfuzzer_sys::fuzz_target;

/// What Produce is allowed to decompress a batch to, here (the broker's
/// default is 64 MiB; the budget below scales with it).
const MAX_DECOMPRESSED: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // A decoder may reserve up to 1024 elements ahead (the patch's cap) of a
    // few hundred bytes each, and grow with what it decodes: far below this
    // unless it trusts a count or a length off the wire.
    let _budget = rokka_fuzz::budget(data.len(), 4 * MAX_DECOMPRESSED, 512);
    let Ok((_header, req)) = rokka_kafka::decode_request(Bytes::copy_from_slice(data)) else {
        return;
    };
    if let RequestKind::Produce(p) = req {
        for t in &p.topic_data {
            for part in &t.partition_data {
                if let Some(records) = &part.records {
                    let _ = rokka_kafka::api::split_batches(records, MAX_DECOMPRESSED);
                }
            }
        }
    }
});
