//! Opening the store over arbitrary CommitLog bytes: the input becomes one
//! or two segment files (and, as its header bytes say, a checkpoint and an
//! abort marker) in a fresh data directory on tmpfs, then
//! `MessageStore::open` runs its checks and recovery. Refusing with an
//! error is fine; a panic or an abort is a crash.
//!
//! Input: `flags | safe:u32 | last:u32 | segment bytes`. Flags: bit 0 writes
//! a checkpoint (CRC made valid, offsets `safe`/`last` taken modulo the log
//! length), bit 1 marks it clean, bit 2 leaves an abort marker, bit 3 splits
//! the bytes into two segments, bit 4 enables the IndexFile, bit 5 starts
//! the log at 64 KiB instead of 0, bit 6 goes on after a successful open:
//! every recovered queue must read back without a damaged entry, an append
//! must succeed, and after a clean close a reopen must be clean and serve
//! that append.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rokka_store::{MessageInput, MessageStore, ReadStatus, StoreConfig};

/// Segments shorter than this are refused by the store; inputs are padded.
const MIN_SEGMENT: usize = 4096;

/// The data directory of this process, on tmpfs when there is one.
fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        base.join(format!("rokka-fuzz-recovery-{}", std::process::id()))
    })
}

fn config(dir: &Path, index: bool) -> StoreConfig {
    let mut c = StoreConfig::for_tests(dir);
    c.max_message_bytes = 16 * 1024;
    c.commitlog_segment_bytes = 128 * 1024;
    c.consume_queue_entries_per_file = 64;
    c.index_enabled = index;
    c.index_slots = 64;
    c.index_entries = 256;
    // Background work never runs during an iteration.
    c.flush_interval_ms = 3_600_000;
    c.checkpoint_interval_ms = 3_600_000;
    c.retention_check_interval_ms = 3_600_000;
    c.offsets_flush_interval_ms = 3_600_000;
    c.disk_max_used_percent = 0;
    c.preallocate = false;
    c
}

/// The store's checkpoint layout (crates/store/src/checkpoint.rs), with a
/// valid CRC-32C.
fn checkpoint(safe: u64, clean: bool, last: u64) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..4].copy_from_slice(b"RKCP");
    b[4..8].copy_from_slice(&1u32.to_be_bytes());
    b[8..16].copy_from_slice(&safe.to_be_bytes());
    b[16] = u8::from(clean);
    b[24..32].copy_from_slice(&last.to_be_bytes());
    b[32..40].copy_from_slice(&u64::MAX.to_be_bytes()); // no index mark
    let crc = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_be_bytes());
    b
}

fn padded(b: &[u8]) -> Vec<u8> {
    let mut v = b.to_vec();
    if v.len() < MIN_SEGMENT {
        v.resize(MIN_SEGMENT, 0);
    }
    v
}

/// Every queue the store has, read through to its end: recovery dispatched
/// only entries that passed their checks, so none may read as damaged.
fn read_all(store: &MessageStore) -> Vec<(String, u32, u64)> {
    let mut ends = Vec::new();
    for topic in store.topics() {
        for q in store.queue_ids(&topic) {
            let (mut at, end) = (store.min_offset(&topic, q), store.max_offset(&topic, q));
            while at < end {
                let r = store.read(&topic, q, at, 64, 1 << 20);
                match r.status {
                    ReadStatus::Found => at = r.next_offset,
                    other => panic!("recovered queue {topic}/{q} reads {other:?} at {at} (end {end})"),
                }
            }
            ends.push((topic.clone(), q, end));
        }
    }
    ends
}

fn after_open(store: MessageStore, cfg: StoreConfig) {
    let ends = read_all(&store);
    let body = b"appended after recovery";
    let m = MessageInput::new("fuzz-after", 0, body, b"KEYS\x01k1\x02");
    let appended = match store.append_message(&m) {
        Ok(a) => a,
        Err(e) => panic!("a store that opened refuses an append: {e}"),
    };
    if let Err(e) = store.close() {
        panic!("close failed: {e}");
    }
    drop(store);
    let again = match MessageStore::open(cfg) {
        Ok(s) => s,
        Err(e) => panic!("reopen after a clean close failed: {e}"),
    };
    assert!(
        again.recovery_report().clean,
        "reopen after a clean close was not clean"
    );
    let r = again.read("fuzz-after", 0, appended.queue_offset, 1, 1 << 20);
    let found = r.entries.first().and_then(|e| e.decode().ok()).and_then(|e| match e {
        rokka_store::Entry::Message(m) => Some(m.body),
        rokka_store::Entry::KafkaBatch(_) => None,
    });
    assert_eq!(
        found.as_deref(),
        Some(&body[..]),
        "the acknowledged append is gone after a clean reopen"
    );
    // (An empty queue may come or go: only where messages end matters.)
    let nonempty = |v: Vec<(String, u32, u64)>| -> Vec<_> {
        v.into_iter()
            .filter(|(t, _, end)| *end > 0 && t != "fuzz-after")
            .collect()
    };
    assert_eq!(
        nonempty(read_all(&again)),
        nonempty(ends),
        "queue ends moved across a clean close and reopen"
    );
}

fuzz_target!(|data: &[u8]| {
    // Nothing the store allocates scales with a count it read.
    let _budget = rokka_fuzz::budget(data.len(), 16 << 20, 64);
    let mut input = rokka_fuzz::Input(data);
    let flags = input.u8();
    let (safe, last) = (input.u32(), input.u32());
    let bytes = input.rest();
    let dir = dir();
    let _ = std::fs::remove_dir_all(dir);
    let log = dir.join("commitlog");
    if std::fs::create_dir_all(&log).is_err() {
        return;
    }
    let start: u64 = if flags & 32 != 0 { 64 * 1024 } else { 0 };
    let segments: Vec<Vec<u8>> = if flags & 8 != 0 && bytes.len() > MIN_SEGMENT {
        let cut = (bytes.len() / 2).max(MIN_SEGMENT);
        vec![padded(&bytes[..cut]), padded(&bytes[cut..])]
    } else {
        vec![padded(bytes)]
    };
    let mut at = start;
    for s in &segments {
        if std::fs::write(log.join(format!("{at:020}")), s).is_err() {
            return;
        }
        at += s.len() as u64;
    }
    let total = at - start;
    if flags & 1 != 0 {
        let cp = checkpoint(
            start + u64::from(safe) % (total + 1),
            flags & 2 != 0,
            start + u64::from(last) % (total + 1),
        );
        if std::fs::write(dir.join("checkpoint"), cp).is_err() {
            return;
        }
    }
    if flags & 4 != 0 && std::fs::write(dir.join("abort"), b"1\n").is_err() {
        return;
    }
    let cfg = config(dir, flags & 16 != 0);
    if let Ok(store) = MessageStore::open(cfg.clone()) {
        if flags & 64 != 0 {
            after_open(store, cfg);
        }
    }
});
