//! The cost of crossing: `cargo bench -p rokka-broker --bench convert`.
//! Converts a stored Kafka batch (100 records of 100 B, with a key and two
//! headers each; uncompressed and lz4) into pull-body messages, and stored
//! RocketMQ messages into one-record Kafka batches; prints ns per message.
//! Also the full batch check Produce runs before storing a batch
//! (`rokka_broker::validate`), on 16 x 1 KiB and 100 x 100 B batches,
//! uncompressed and lz4, in MB/s of batch bytes.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use rokka_broker::convert::{
    kafka_batch_to_rocketmq, kafka_batch_to_rocketmq_cached, rocketmq_to_kafka_batch, Crossed, DecodedBatches,
};
use rokka_store::record::{kafka, message, properties};

fn stored_batch(compression: Compression) -> Result<rokka_store::KafkaBatchView, String> {
    stored_batch_of(100, compression)
}

fn stored_batch_of(n: i64, compression: Compression) -> Result<rokka_store::KafkaBatchView, String> {
    let records: Vec<Record> = (0..n)
        .map(|i| {
            let mut headers = IndexMap::new();
            headers.insert(StrBytes::from_static_str("trace"), Some(Bytes::from(format!("t-{i}"))));
            headers.insert(
                StrBytes::from_static_str("rocketmq.tags"),
                Some(Bytes::from_static(b"TagA")),
            );
            Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset: i,
                sequence: i as i32,
                timestamp: 1_700_000_000_000 + i,
                key: Some(Bytes::from(format!("key-{i}"))),
                value: Some(Bytes::from(vec![b'v'; 100])),
                headers,
            }
        })
        .collect();
    let mut raw = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut raw,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )
    .map_err(|e| e.to_string())?;
    let mut entry = vec![0u8; kafka::encoded_len("Bench", raw.len())];
    kafka::encode(
        &mut entry,
        "Bench",
        &raw,
        kafka::KafkaPlacement {
            queue_id: 0,
            queue_offset: 0,
            phys_offset: 0,
            store_timestamp: 1_700_000_000_000,
            count: n as u32,
        },
    );
    kafka::decode(&Bytes::from(entry)).map_err(|e| e.to_string())
}

fn validate_bench() -> Result<(), String> {
    for (records, size) in [(16usize, 1024usize), (100, 100)] {
        for (name, c) in [("uncompressed", Compression::None), ("lz4", Compression::Lz4)] {
            let recs: Vec<Record> = (0..records)
                .map(|i| Record {
                    transactional: false,
                    control: false,
                    delete_horizon: false,
                    partition_leader_epoch: 0,
                    producer_id: -1,
                    producer_epoch: -1,
                    timestamp_type: TimestampType::Creation,
                    offset: i as i64,
                    sequence: i as i32,
                    timestamp: 1_700_000_000_000 + i as i64,
                    key: None,
                    value: Some(Bytes::from((0..size).map(|b| (b * 7 + i) as u8).collect::<Vec<u8>>())),
                    headers: IndexMap::new(),
                })
                .collect();
            let mut raw = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut raw,
                &recs,
                &RecordEncodeOptions {
                    version: 2,
                    compression: c,
                },
            )
            .map_err(|e| e.to_string())?;
            let rounds = 20_000;
            let t = Instant::now();
            for _ in 0..rounds {
                black_box(rokka_broker::validate::validate(black_box(&raw), 64 << 20).map_err(|e| e.to_string())?);
            }
            let secs = t.elapsed().as_secs_f64();
            let payload = (records * size * rounds) as f64;
            println!(
                "validate {records} x {size} B ({name}, {} B batch): {:.0} ns/batch, {:.0} MB/s of record values",
                raw.len(),
                secs * 1e9 / rounds as f64,
                payload / secs / 1e6
            );
        }
    }
    Ok(())
}

/// A 10 000-record batch (100 B values) drained 32 messages at a time, as
/// RocketMQ 5 receives take it: decoded at every receive, and kept decoded
/// between them (`kafka_batch_to_rocketmq_cached`).
fn drain_bench(host: SocketAddr) -> Result<(), String> {
    for (name, c) in [("uncompressed", Compression::None), ("lz4", Compression::Lz4)] {
        let view = stored_batch_of(10_000, c)?;
        for cached in [false, true] {
            let cache = DecodedBatches::new(if cached { 32 << 20 } else { 0 });
            let mut out = BytesMut::with_capacity(64 * 1024);
            let t = Instant::now();
            let (mut from, mut reads) = (0, 0);
            loop {
                out.clear();
                let c = kafka_batch_to_rocketmq_cached(
                    &cache,
                    &view,
                    from,
                    None,
                    host,
                    64 << 20,
                    (usize::MAX, 32),
                    false,
                    &mut out,
                )?;
                reads += 1;
                match c.stopped_at {
                    Some(at) => from = at,
                    None => break,
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / 10_000.0;
            let how = if cached { "kept decoded" } else { "decoded per read" };
            println!(
                "Kafka batch ({name}, 10 000 x 100 B) drained 32 a time ({reads} reads), {how}: {ns:.0} ns/message"
            );
        }
    }
    Ok(())
}

fn main() -> Result<(), String> {
    validate_bench()?;
    let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
    for (name, c) in [("uncompressed", Compression::None), ("lz4", Compression::Lz4)] {
        let view = stored_batch(c)?;
        let rounds = 2_000;
        let mut out = BytesMut::with_capacity(64 * 1024);
        let t = Instant::now();
        for _ in 0..rounds {
            out.clear();
            black_box(kafka_batch_to_rocketmq(&view, 0, None, host, 64 << 20, &mut out)?);
        }
        let ns = t.elapsed().as_nanos() as f64 / (rounds * 100) as f64;
        println!("Kafka batch ({name}, 100 x 100 B) -> RocketMQ messages: {ns:.0} ns/message");
    }
    drain_bench(host)?;
    let props = properties::encode([
        ("KEYS", "key-1"),
        ("TAGS", "TagA"),
        ("trace", "t-1"),
        ("UNIQ_KEY", "0A0B"),
    ]);
    let body = vec![b'v'; 100];
    let input = message::MessageInput::new("Bench", 0, &body, props.as_bytes());
    let mut rec = vec![0u8; message::encoded_len(&input, &host, true)];
    message::encode(
        &mut rec,
        &input,
        &host,
        message::Placement {
            queue_offset: 7,
            phys_offset: 0,
            store_timestamp: 1,
            body_crc32: crc32fast::hash(&body),
            record_crc: true,
        },
    );
    let view = message::decode(&Bytes::from(rec)).map_err(|e| format!("{e:?}"))?;
    let rounds = 200_000;
    let t = Instant::now();
    for _ in 0..rounds {
        black_box(rocketmq_to_kafka_batch(black_box(&view), 0, &mut Crossed::default()));
    }
    let ns = t.elapsed().as_nanos() as f64 / rounds as f64;
    println!("RocketMQ message (100 B, 4 properties) -> Kafka batch: {ns:.0} ns/message");
    Ok(())
}
