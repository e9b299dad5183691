//! Clean logs of compacted topics: reads below the clean end come from the
//! clean log with the compacted-away offsets as gaps; they survive clean
//! and unclean restarts; a pass that dies before its switch leaves the old
//! generation in force; retention keeps segments holding a dirty range and
//! asks for a pass.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use common::*;
use rokka_store::record::properties;
use rokka_store::{fault, Entry, MessageInput, MessageStore, ReadStatus};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    fault::clear();
    g
}

/// Appends message `i` with key `k{i % keys}` and body `v{i}`.
fn put(store: &MessageStore, topic: &str, i: u64, keys: u64) -> rokka_store::Result<rokka_store::AppendResult> {
    let p = properties::encode([("KEYS", format!("k{}", i % keys).as_str())]);
    let body = format!("v{i}").into_bytes();
    store.append_message(&MessageInput::new(topic, 0, &body, p.as_bytes()))
}

/// A pass as the broker runs one: the last message per KEYS of
/// `[start, end)` survives.
fn compact(store: &MessageStore, topic: &str, end: u64) -> rokka_store::Result<u64> {
    let mut last: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut w = store.clean_writer(topic, 0)?;
    let mut entries = Vec::new();
    let mut at = w.start();
    while at < end {
        let r = store.read(topic, 0, at, 100, 1 << 20);
        if r.status != ReadStatus::Found {
            break;
        }
        for e in r.entries {
            if e.cq.base_offset >= end {
                break;
            }
            if let Ok(Entry::Message(m)) = e.decode() {
                let key = m.property("KEYS").unwrap_or_default().to_vec();
                last.insert(key.clone(), m.queue_offset);
                entries.push((key, m.queue_offset, e));
            }
        }
        at = r.next_offset;
    }
    let mut kept = 0;
    for (key, offset, e) in entries {
        if last.get(&key) == Some(&offset) {
            w.push(&e.data, &e.cq)?;
            kept += 1;
        }
    }
    store.install_clean(topic, 0, w, end)?;
    Ok(kept)
}

fn bodies(store: &MessageStore, topic: &str) -> Vec<(u64, String)> {
    read_all(store, topic, 0)
        .into_iter()
        .map(|(o, b)| (o, String::from_utf8_lossy(&b).into_owned()))
        .collect()
}

#[test]
fn reads_below_the_clean_end_come_from_the_clean_log_and_survive_restarts() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    store.set_compacted("C", true)?;
    // 30 messages over 5 keys; compact the first 20.
    for i in 0..30 {
        put(&store, "C", i, 5)?;
    }
    assert_eq!(compact(&store, "C", 20)?, 5);
    let want: Vec<(u64, String)> = (15..20).chain(20..30).map(|i| (i, format!("v{i}"))).collect();
    assert_eq!(bodies(&store, "C"), want);
    assert_eq!(store.min_offset("C", 0), 0, "the log start does not move");
    assert_eq!(store.max_offset("C", 0), 30);
    // A read inside the removed range starts at the next survivor.
    let r = store.read("C", 0, 3, 1, 1 << 20);
    assert_eq!(r.status, ReadStatus::Found);
    assert_eq!(r.entries[0].cq.base_offset, 15);
    assert_eq!(r.next_offset, 16);
    let d = store.dirty_range("C", 0).ok_or("no range")?;
    assert_eq!((d.clean_end, d.end, d.dirty_entries), (20, 30, 10));

    // A second pass over the whole queue keeps one message per key.
    assert_eq!(compact(&store, "C", 30)?, 5);
    let want: Vec<(u64, String)> = (25..30).map(|i| (i, format!("v{i}"))).collect();
    assert_eq!(bodies(&store, "C"), want);
    put(&store, "C", 30, 5)?;

    // Clean restart, then a crash (no close): same reads, offsets go on.
    store.close()?;
    drop(store);
    let store = MessageStore::open(cfg.clone())?;
    assert!(store.is_compacted("C"));
    let mut want = want;
    want.push((30, "v30".into()));
    assert_eq!(bodies(&store, "C"), want);
    put(&store, "C", 31, 5)?;
    drop(store);
    let store = MessageStore::open(cfg.clone())?;
    want.push((31, "v31".into()));
    assert_eq!(bodies(&store, "C"), want);
    assert_eq!(put(&store, "C", 32, 5)?.queue_offset, 32);

    // DeleteRecords moves the start inside the clean log.
    store.delete_records("C", 0, 27)?;
    assert_eq!(store.min_offset("C", 0), 27);
    assert_eq!(store.read("C", 0, 26, 1, 1 << 20).status, ReadStatus::OffsetMoved);
    assert_eq!(bodies(&store, "C")[0], (27, "v27".into()));
    store.close()?;
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.min_offset("C", 0), 27);

    // Deleting the topic removes its clean logs and its mark.
    store.delete_topic("C")?;
    assert!(!store.is_compacted("C"));
    assert!(!dir.path().join("compacted").join("C").exists());
    Ok(())
}

#[test]
fn a_pass_that_fails_or_dies_before_its_switch_leaves_the_old_generation() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    store.set_compacted("C", true)?;
    for i in 0..10 {
        put(&store, "C", i, 2)?;
    }
    compact(&store, "C", 10)?;
    let before = bodies(&store, "C");
    assert_eq!(before, vec![(8, "v8".into()), (9, "v9".into())]);

    // fsync of the new generation fails: nothing switches.
    fault::inject("clean_log_sync", libc::EIO, Some(1));
    for i in 10..12 {
        put(&store, "C", i, 2)?;
    }
    assert!(compact(&store, "C", 12).is_err());
    let mut want = before.clone();
    want.extend([(10, "v10".to_string()), (11, "v11".to_string())]);
    assert_eq!(bodies(&store, "C"), want);

    // A pass that dies with its files written but before the switch.
    let mut w = store.clean_writer("C", 0)?;
    let r = store.read("C", 0, 11, 1, 1 << 20);
    w.push(&r.entries[0].data, &r.entries[0].cq)?;
    drop(w);
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(bodies(&store, "C"), want);
    let qdir = dir.path().join("compacted").join("C").join("0");
    let mut names: Vec<String> = std::fs::read_dir(&qdir)?
        .filter_map(|e| e.ok().and_then(|e| e.file_name().to_str().map(str::to_string)))
        .collect();
    names.sort();
    assert_eq!(names, ["clean.1", "index.1", "state.json"], "stray generations removed");
    Ok(())
}

#[test]
fn retention_keeps_segments_with_a_dirty_range_and_asks_for_a_pass() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg)?;
    store.set_compacted("C", true)?;
    for i in 0..20 {
        put(&store, "C", i, 4)?;
    }
    // Another topic fills several segments after it.
    for i in 0..3000u64 {
        append(&store, "T", 0, 3, i)?;
    }
    store.checkpoint()?;
    let segs = store.segment_count();
    assert!(segs >= 4, "{segs} segments");
    let old = SystemTime::now() - Duration::from_secs(100 * 3600);
    let mut paths: Vec<_> = std::fs::read_dir(dir.path().join("commitlog"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    for p in &paths[..paths.len() - 1] {
        std::fs::File::options().write(true).open(p)?.set_modified(old)?;
    }
    assert_eq!(store.run_retention()?, 0, "the first segment holds C's dirty range");
    assert_eq!(store.take_compaction_wanted(), vec![("C".to_string(), 0)]);
    compact(&store, "C", 20)?;
    assert!(store.run_retention()? > 0);
    assert!(store.take_compaction_wanted().is_empty());
    let want: Vec<(u64, String)> = (16..20).map(|i| (i, format!("v{i}"))).collect();
    assert_eq!(
        bodies(&store, "C"),
        want,
        "read from the clean log after its segments went"
    );
    assert_eq!(put(&store, "C", 20, 4)?.queue_offset, 20);
    Ok(())
}

#[test]
fn store_check_verifies_clean_logs_and_a_damaged_one_refuses_to_open() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    store.set_compacted("C", true)?;
    for i in 0..10 {
        put(&store, "C", i, 3)?;
    }
    compact(&store, "C", 9)?;
    store.close()?;
    drop(store);
    let max_entry = cfg.max_message_bytes as usize + 64 * 1024;
    let report = rokka_store::check::check_dir(dir.path(), max_entry)?;
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.clean_entries, 3);
    // One flipped byte in a survivor's body: the check names it.
    let data = dir.path().join("compacted/C/0/clean.1");
    let mut b = std::fs::read(&data)?;
    let last = b.len() - 3;
    b[last] ^= 0xff;
    std::fs::write(&data, &b)?;
    let report = rokka_store::check::check_dir(dir.path(), max_entry)?;
    assert!(
        report.problems.iter().any(|p| p.contains("clean log C/0")),
        "{:?}",
        report.problems
    );
    // Reads of it are refused as any damaged entry, not served.
    let store = MessageStore::open(cfg.clone())?;
    let r = store.read("C", 0, 8, 1, 1 << 20);
    assert_eq!(r.status, ReadStatus::Damaged);
    drop(store);
    // A truncated index is a damaged file: the store names it and does
    // not start.
    let index = dir.path().join("compacted/C/0/index.1");
    let b = std::fs::read(&index)?;
    std::fs::write(&index, &b[..b.len() - 5])?;
    match MessageStore::open(cfg) {
        Err(rokka_store::StoreError::BadFile { path, .. }) => assert!(path.ends_with("index.1"), "{path:?}"),
        other => panic!("expected BadFile, got {other:?}"),
    }
    Ok(())
}

/// Async mode, the flusher far off: a clean generation and a DeleteRecords
/// start are made durable only over a log flushed at least as far — either
/// kept past what a power loss leaves of the log would hide the records
/// appended again at those offsets.
#[test]
fn a_clean_log_and_a_moved_start_are_never_durable_past_the_log() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.flush_mode = rokka_store::FlushMode::Async;
    cfg.flush_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg)?;
    store.set_compacted("C", true)?;
    let c: Vec<_> = (0..30).map(|i| put(&store, "C", i, 5)).collect::<Result<_, _>>()?;
    let (_, written, flushed) = store.commitlog_offsets();
    assert!(
        flushed < written,
        "the test needs an unflushed tail ({flushed} of {written})"
    );
    compact(&store, "C", 29)?;
    let (_, written, flushed) = store.commitlog_offsets();
    let covered = c[28].phys_offset + u64::from(c[28].size);
    assert!(
        flushed >= covered,
        "installed over an unflushed log ({flushed}, the clean log covers up to {covered})"
    );
    assert!(
        flushed < written,
        "flushed as far as the clean log reaches, not the whole log ({flushed} of {written})"
    );
    let d: Vec<_> = (30..40).map(|i| put(&store, "D", i, 5)).collect::<Result<_, _>>()?;
    let below = d[4].phys_offset + u64::from(d[4].size);
    let (_, _, flushed) = store.commitlog_offsets();
    assert!(flushed < below, "the test needs D's records unflushed");
    store.delete_records("D", 0, 5)?;
    let (_, _, flushed) = store.commitlog_offsets();
    assert!(
        flushed >= below,
        "a start persisted over an unflushed log ({flushed} of {below})"
    );
    Ok(())
}
