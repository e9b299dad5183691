//! Helpers shared by the store's integration tests.
#![allow(dead_code)]

use rokka_store::record::properties;
use rokka_store::{Entry, MessageInput, MessageStore, ReadStatus, StoreConfig};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Deterministic body of message `i` in stream `seed`, 1..=600 bytes.
pub fn body(seed: u64, i: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let len = 1 + (x % 600) as usize;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn props(i: u64) -> String {
    properties::encode([
        ("TAGS", if i.is_multiple_of(2) { "even" } else { "odd" }),
        ("KEYS", &format!("key-{i} all")),
        ("UNIQ_KEY", &format!("UNIQ{i:016}")),
    ])
}

pub fn append(
    store: &MessageStore,
    topic: &str,
    queue: u32,
    seed: u64,
    i: u64,
) -> rokka_store::Result<rokka_store::AppendResult> {
    let b = body(seed, i);
    let p = props(i);
    store.append_message(&MessageInput::new(topic, queue, &b, p.as_bytes()))
}

/// Reads every message of (topic, queue) from its min offset.
pub fn read_all(store: &MessageStore, topic: &str, queue: u32) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut off = store.min_offset(topic, queue);
    loop {
        let r = store.read(topic, queue, off, 64, 1 << 20);
        if r.status != ReadStatus::Found {
            break;
        }
        for e in &r.entries {
            match e.decode() {
                Ok(Entry::Message(m)) => out.push((m.queue_offset, m.body.to_vec())),
                Ok(Entry::KafkaBatch(k)) => out.push((k.queue_offset, k.batch.to_vec())),
                Err(err) => panic!("undecodable entry at {}: {err}", e.cq.phys_offset),
            }
        }
        off = r.next_offset;
    }
    out
}

pub fn small_config(dir: &std::path::Path) -> StoreConfig {
    let mut c = StoreConfig::for_tests(dir);
    // Small segments so tests roll several times.
    c.commitlog_segment_bytes = 256 * 1024;
    c.max_message_bytes = 64 * 1024;
    c
}
