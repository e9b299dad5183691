//! Compaction throughput: `cargo bench -p rokka-broker --bench compaction`.
//! Fills one partition of a compacted topic with Kafka batches whose keys
//! cycle over a key space, then runs one compaction pass over it and
//! prints MB/s of log compacted (stored bytes of the range the pass
//! cleaned, per wall second) and the CPU seconds the process spent per GB.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use rokka_broker::{Broker, BrokerConfig};
use rokka_store::{MessageStore, StoreConfig};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// CPU seconds (user + system) this process has used.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    // After the command: state, ppid, ... utime and stime (fields 14, 15).
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// `len` bytes of a 16-letter alphabet (compresses about 2:1).
fn text(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'a' + (x % 16) as u8
        })
        .collect()
}

fn batch(first: u64, n: u64, keys: u64, value: usize, compression: Compression) -> Res<Bytes> {
    let records: Vec<Record> = (0..n)
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
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::from(format!("key-{:08}", (first + i) % keys))),
            value: Some(Bytes::from(text(first + i, value))),
            headers: IndexMap::new(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression,
        },
    )?;
    Ok(out.freeze())
}

fn case(name: &str, total_bytes: u64, per_batch: u64, value: usize, keys: u64, compression: Compression) -> Res<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-data");
    std::fs::create_dir_all(&root)?;
    let dir = tempfile::tempdir_in(&root)?;
    let cfg = StoreConfig {
        data_dir: dir.path().to_path_buf(),
        preallocate: false,
        ..StoreConfig::default()
    };
    let store = Arc::new(MessageStore::open(cfg)?);
    let b = Broker::new(Arc::clone(&store), BrokerConfig::default())?;
    let mut configs = BTreeMap::new();
    configs.insert("cleanup.policy".to_string(), "compact".to_string());
    b.create_topic_with("C", 1, configs)?;
    let batches = total_bytes / (per_batch * value as u64);
    let mut first = 0;
    for _ in 0..batches + 1 {
        b.append_kafka_batch("C", 0, &batch(first, per_batch, keys, value, compression)?)?;
        first += per_batch;
    }
    let cfg = b.topic_config("C").ok_or("no config")?;
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let s = b
        .compact_partition("C", 0, &cfg, rokka_store::now_ms())?
        .ok_or("nothing compacted")?;
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let gb = s.bytes_read as f64 / 1e9;
    println!(
        "{name:<44} {:>6.0} MB/s stored {:>6.0} MB/s payload  {:>5.2} CPU s/GB  ({:.0} MB in {:.2} s, {} of {} records kept, {:.1} MB written)",
        s.bytes_read as f64 / 1e6 / secs,
        (s.records_read * value as u64) as f64 / 1e6 / secs,
        cpu / gb,
        s.bytes_read as f64 / 1e6,
        secs,
        s.records_kept,
        s.records_read,
        s.bytes_written as f64 / 1e6,
    );
    store.close()?;
    Ok(())
}

fn main() -> Res<()> {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let cases: [(&str, u64, u64, usize, u64, Compression); 4] = [
        (
            "16 x 1 KiB batches, 10k keys, uncompressed",
            512 << 20,
            16,
            1024,
            10_000,
            Compression::None,
        ),
        (
            "16 x 1 KiB batches, 10k keys, lz4",
            512 << 20,
            16,
            1024,
            10_000,
            Compression::Lz4,
        ),
        (
            "100 x 100 B batches, 100k keys, uncompressed",
            256 << 20,
            100,
            100,
            100_000,
            Compression::None,
        ),
        (
            "16 x 1 KiB batches, all keys distinct",
            256 << 20,
            16,
            1024,
            u64::MAX,
            Compression::None,
        ),
    ];
    for (name, total, per, value, keys, c) in cases {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        case(name, total, per, value, keys, c)?;
    }
    Ok(())
}
