//! Injected I/O failures (EIO on msync, ENOSPC and EMFILE on file creation),
//! a crash between a segment's BLANK filler and the next segment, and a
//! close racing appends. Faults are process-wide, so this file's tests take
//! turns (`serial`) and each clears what it armed.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use rokka_store::config::FlushMode;
use rokka_store::{fault, MessageInput, MessageStore, StoreConfig, StoreError};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    let g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    fault::clear();
    g
}

fn sync_config(dir: &Path) -> StoreConfig {
    let mut c = small_config(dir);
    c.flush_mode = FlushMode::Sync;
    c.checkpoint_interval_ms = 3_600_000;
    c
}

#[test]
fn a_failed_msync_is_final_and_nothing_past_it_is_acknowledged() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(sync_config(dir.path()))?;
    let first = append(&store, "F", 0, 1, 0)?;
    store.wait_durable(first.end_offset)?;
    fault::inject("msync", libc::EIO, Some(1));
    let second = append(&store, "F", 0, 1, 1)?;
    match store.wait_durable(second.end_offset) {
        Err(StoreError::StorageFailed(why)) => assert!(why.contains("msync"), "{why}"),
        other => panic!("expected StorageFailed, got {other:?}"),
    }
    // The fault is used up; a retried sync would "succeed" now. It must not
    // be tried: the failure is final.
    assert!(matches!(
        store.wait_durable(second.end_offset),
        Err(StoreError::StorageFailed(_))
    ));
    assert!(matches!(
        append(&store, "F", 0, 1, 2),
        Err(StoreError::StorageFailed(_))
    ));
    let (_, _, flushed) = store.commitlog_offsets();
    assert!(flushed < second.end_offset, "flushed {flushed} passed the failure");
    // The async form too.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    assert!(matches!(
        rt.block_on(store.durable(second.end_offset)),
        Err(StoreError::StorageFailed(_))
    ));
    drop(store);
    fault::clear();
    // After a restart the store recovers from what is on disk and writes again.
    let store = MessageStore::open(sync_config(dir.path()))?;
    let all = read_all(&store, "F", 0);
    assert!(
        !all.is_empty() && all[0].1 == body(1, 0),
        "the acknowledged message survives"
    );
    let r = append(&store, "F", 0, 1, 9)?;
    store.wait_durable(r.end_offset)?;
    Ok(())
}

#[test]
fn a_failed_sync_among_overlapping_ones_acknowledges_nothing_past_it() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = sync_config(dir.path());
    cfg.sync_flush_depth = 4;
    let store = std::sync::Arc::new(MessageStore::open(cfg)?);
    let first = append(&store, "P", 0, 1, 0)?;
    store.wait_durable(first.end_offset)?;
    // The next two syncs are slow (and succeed), the third fails: with
    // four allowed in flight, it fails beside others.
    fault::inject_delay("msync", 20, Some(2));
    fault::inject("msync", libc::EIO, Some(1));
    let threads: Vec<_> = (0..16u32)
        .map(|t| {
            let s = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..40u64 {
                    let Ok(r) = append(&s, "P", t % 4, 2, i) else { break };
                    match s.wait_durable(r.end_offset) {
                        Ok(()) => acked.push(r.end_offset),
                        Err(StoreError::StorageFailed(_)) => break,
                        Err(e) => return Err(format!("unexpected {e}")),
                    }
                }
                Ok(acked)
            })
        })
        .collect();
    let mut acked = Vec::new();
    for t in threads {
        acked.extend(t.join().map_err(|_| "appender panicked")??);
    }
    assert!(
        matches!(append(&store, "P", 0, 3, 0), Err(StoreError::StorageFailed(_))),
        "the injected failure happened and is final"
    );
    let (_, _, flushed) = store.commitlog_offsets();
    let highest = acked.iter().copied().max().unwrap_or(0);
    assert!(highest <= flushed, "acknowledged {highest} past the flushed {flushed}");
    // Final: the flushed position does not move again.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(store.commitlog_offsets().2, flushed);
    Ok(())
}

#[test]
fn a_sync_that_finishes_first_waits_for_the_older_one_in_flight() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = sync_config(dir.path());
    cfg.sync_flush_depth = 2;
    let store = std::sync::Arc::new(MessageStore::open(cfg)?);
    let warm = append(&store, "O", 0, 1, 0)?;
    store.wait_durable(warm.end_offset)?;
    // The next sync is slow; the one after it is not.
    fault::inject_delay("msync", 300, Some(1));
    let first = append(&store, "O", 0, 1, 1)?;
    let s = std::sync::Arc::clone(&store);
    let older = std::thread::spawn(move || s.wait_durable(first.end_offset));
    std::thread::sleep(std::time::Duration::from_millis(50));
    let second = append(&store, "O", 1, 1, 2)?;
    let t = std::time::Instant::now();
    store.wait_durable(second.end_offset)?;
    let waited = t.elapsed();
    // Its own sync finished long before, but what lies below it was not
    // on disk until the slow one finished.
    assert!(
        waited >= std::time::Duration::from_millis(150),
        "released after {waited:?}, before the older sync finished"
    );
    assert!(store.commitlog_offsets().2 >= second.end_offset);
    older.join().map_err(|_| "waiter panicked")??;
    Ok(())
}

#[test]
fn a_full_disk_at_segment_creation_refuses_appends_without_losing_any() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    // The first append makes the segment and the queue's file.
    let mut acked = vec![append(&store, "D", 0, 2, 0)?];
    fault::inject("create", libc::ENOSPC, None);
    // Fill the first segment until the roll needs a new file.
    let mut refused = None;
    for i in 1..10_000 {
        match append(&store, "D", 0, 2, i) {
            Ok(r) => acked.push(r),
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let Some((failed_i, refused)) = refused else {
        return Err("never refused".into());
    };
    let refused = Some(refused);
    match refused {
        Some(StoreError::Io { op, source, .. }) => {
            assert_eq!(op, "create");
            assert_eq!(source.raw_os_error(), Some(libc::ENOSPC));
        }
        other => panic!("expected an ENOSPC create error, got {other:?}"),
    }
    assert!(acked.len() > 100, "refused at the roll, not before: {}", acked.len());
    // Still refused while the disk is full (the same message: a smaller one
    // may still fit in the segment), and reads still work.
    assert!(append(&store, "D", 0, 2, failed_i).is_err());
    assert_eq!(read_all(&store, "D", 0).len(), acked.len());
    // Space comes back: appends continue at the next offset.
    fault::clear();
    assert_eq!(failed_i, acked.len() as u64);
    let r = append(&store, "D", 0, 2, failed_i)?;
    assert_eq!(r.queue_offset, failed_i);
    store.close()?;
    drop(store);
    let store = MessageStore::open(cfg)?;
    let all = read_all(&store, "D", 0);
    assert_eq!(all.len(), acked.len() + 1);
    for (k, (off, b)) in all.iter().enumerate().take(acked.len()) {
        assert_eq!((*off, b), (k as u64, &body(2, k as u64)));
    }
    Ok(())
}

#[test]
fn a_disk_with_no_room_for_the_checkpoint_does_not_stop_a_start_or_lose_appends() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.checkpoint_interval_ms = 50;
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..10 {
        append(&store, "F", 0, 5, i)?;
    }
    store.close()?;
    drop(store);
    // The disk is full: no small file can be replaced (the checkpoint, the
    // offsets). The start used to fail writing its checkpoint; it opens on
    // the last one, marked unclean, and the segment's room still takes
    // appends.
    fault::inject("file-write", libc::ENOSPC, None);
    let store = MessageStore::open(cfg.clone())?;
    assert!(
        dir.path().join("abort").exists(),
        "no abort marker: a crash would trust the clean checkpoint"
    );
    assert_eq!(read_all(&store, "F", 0).len(), 10);
    for i in 10..20 {
        append(&store, "F", 0, 5, i)?;
    }
    // The periodic checkpoint keeps failing quietly, then works again once
    // there is room.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = std::fs::read(dir.path().join("checkpoint"))?;
    fault::clear();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_ne!(
        std::fs::read(dir.path().join("checkpoint"))?,
        before,
        "the checkpoint was not written again"
    );
    for i in 20..25 {
        append(&store, "F", 0, 5, i)?;
    }
    // A crash: the next start recovers every append.
    drop(store);
    let store = MessageStore::open(cfg.clone())?;
    let all = read_all(&store, "F", 0);
    assert_eq!(all.len(), 25);
    for (k, (off, b)) in all.iter().enumerate() {
        assert_eq!((*off, b), (k as u64, &body(5, k as u64)));
    }
    // And a crash while the disk is still full: recovery from the clean
    // checkpoint of the first stop finds the appends past it.
    store.close()?;
    drop(store);
    fault::inject("file-write", libc::ENOSPC, None);
    let store = MessageStore::open(cfg.clone())?;
    append(&store, "F", 0, 5, 25)?;
    // A clean stop with no room for its checkpoint (and no offsets newer
    // than the file's) stops, leaving the marker for the next start.
    store.close()?;
    drop(store);
    assert!(dir.path().join("abort").exists());
    let store = MessageStore::open(cfg.clone())?;
    append(&store, "F", 0, 5, 26)?;
    drop(store);
    fault::clear();
    let store = MessageStore::open(cfg)?;
    let all = read_all(&store, "F", 0);
    assert_eq!(all.len(), 27);
    assert_eq!(all[26], (26, body(5, 26)));
    Ok(())
}

#[test]
fn a_delete_records_retried_after_a_failed_write_is_written() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..10 {
        append(&store, "R", 0, 6, i)?;
    }
    fault::inject("file-write", libc::ENOSPC, Some(1));
    assert!(store.delete_records("R", 0, 5).is_err(), "the first try found no room");
    // The retry asks for the same start: it must write the file, not
    // answer success because the table in memory already says so.
    assert_eq!(store.delete_records("R", 0, 5)?, 5);
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(
        store.min_offset("R", 0),
        5,
        "the deleted records came back after a crash"
    );
    Ok(())
}

#[test]
fn emfile_creating_a_queue_file_fails_that_append_only() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    append(&store, "Old", 0, 3, 0)?;
    fault::inject("create", libc::EMFILE, Some(1));
    match append(&store, "New", 0, 3, 0) {
        Err(StoreError::Io { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EMFILE)),
        other => panic!("expected EMFILE, got {other:?}"),
    }
    // Other queues are unaffected, and the new one works once files can be made.
    append(&store, "Old", 0, 3, 1)?;
    let r = append(&store, "New", 0, 3, 1)?;
    assert_eq!(r.queue_offset, 0, "the refused append took no offset");
    assert_eq!(read_all(&store, "New", 0).len(), 1);
    assert_eq!(read_all(&store, "Old", 0).len(), 2);
    // And after a crash the store opens: no record of the refused append
    // was written, so none claims offset 0 of New/0 a second time.
    let cfg = store.config().clone();
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(read_all(&store, "New", 0).len(), 1);
    assert_eq!(read_all(&store, "Old", 0).len(), 2);
    Ok(())
}

#[test]
fn a_crash_after_a_blank_filler_before_the_next_segment_recovers_and_appends() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.checkpoint_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg.clone())?;
    append(&store, "B", 0, 4, 0)?;
    fault::inject("create", libc::ENOSPC, None);
    let mut n = 1u64;
    while append(&store, "B", 0, 4, n).is_ok() {
        n += 1;
    }
    assert!(n > 100, "refused at the roll, not before: {n}");
    // The BLANK filler is written; the next segment never was. Crash.
    drop(store);
    fault::clear();
    let store = MessageStore::open(cfg)?;
    assert_eq!(read_all(&store, "B", 0).len() as u64, n);
    let r = append(&store, "B", 0, 4, n)?;
    assert_eq!(r.queue_offset, n);
    assert_eq!(
        r.phys_offset % small_config(dir.path()).commitlog_segment_bytes,
        0,
        "a new segment"
    );
    Ok(())
}

#[test]
fn close_racing_appends_keeps_every_acknowledged_record() -> TestResult {
    let _g = serial();
    for round in 0..5 {
        let dir = tempfile::tempdir()?;
        let cfg = small_config(dir.path());
        let store = Arc::new(MessageStore::open(cfg.clone())?);
        let go = Arc::new(AtomicBool::new(true));
        let mut threads = Vec::new();
        for t in 0..4u32 {
            let s = Arc::clone(&store);
            let go = Arc::clone(&go);
            threads.push(std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut i = 0u64;
                while go.load(Ordering::Relaxed) {
                    match append(&s, "C", t, u64::from(t), i) {
                        Ok(r) => acked.push(r.queue_offset),
                        Err(StoreError::ShutDown) => break,
                        Err(e) => panic!("append: {e}"),
                    }
                    i += 1;
                }
                acked
            }));
        }
        std::thread::sleep(std::time::Duration::from_millis(30 + round * 10));
        store.close()?;
        go.store(false, Ordering::Relaxed);
        let acked: Vec<Vec<u64>> = threads
            .into_iter()
            .map(|t| t.join().map_err(|_| "appender panicked"))
            .collect::<Result<_, _>>()?;
        drop(store);
        let store = MessageStore::open(cfg)?;
        assert!(store.recovery_report().clean, "the close was clean");
        for (t, offsets) in acked.iter().enumerate() {
            let all = read_all(&store, "C", t as u32);
            assert!(
                all.len() >= offsets.len(),
                "round {round} queue {t}: {} acknowledged, {} after restart",
                offsets.len(),
                all.len()
            );
            for (k, (off, b)) in all.iter().enumerate().take(offsets.len()) {
                assert_eq!((*off, b), (k as u64, &body(t as u64, k as u64)));
            }
        }
    }
    Ok(())
}

#[test]
fn in_sync_mode_readers_see_only_what_is_on_disk() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(sync_config(dir.path()))?;
    let a = append(&store, "V", 0, 12, 0)?;
    store.wait_durable(a.end_offset)?;
    // Nothing more reaches the disk: B is appended but never durable.
    fault::inject("msync", libc::EIO, None);
    let b = append(&store, "V", 0, 12, 1)?;
    let _ = store.wait_durable(u64::MAX);
    assert_eq!(store.max_offset("V", 0), 1, "the end consumers see");
    // Named by its CommitLog offset (a message id, a query by key): the
    // same — only the broker's own lookups reach past it.
    assert!(store.read_at(a.phys_offset).is_some());
    assert!(store.read_at(b.phys_offset).is_none(), "not durable");
    assert!(store.read_written_at(b.phys_offset).is_some());
    assert_eq!(
        store.query_by_key("V", "all", 10, 0, i64::MAX).len(),
        1,
        "only the durable one by key"
    );
    let r = store.read("V", 0, 0, 10, 1 << 20);
    assert_eq!(r.entries.len(), 1, "only the durable message");
    assert_eq!(r.next_offset, 1);
    assert_eq!(
        store.read("V", 0, 1, 10, 1 << 20).status,
        rokka_store::ReadStatus::NoNewMessages
    );
    fault::clear();
    Ok(())
}

#[test]
fn a_nearly_full_disk_refuses_new_segments_before_it_is_full() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    // The first segment exists...
    let store = MessageStore::open(cfg.clone())?;
    append(&store, "F", 0, 15, 0)?;
    store.close()?;
    drop(store);
    // ...then the disk counts as nearly full: 1 %, which any disk this runs
    // on is past.
    cfg.disk_refuse_writes_percent = 1;
    let store = MessageStore::open(cfg.clone())?;
    let mut n = 1u64;
    let refused = loop {
        match append(&store, "F", 0, 15, n) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        if n > 100_000 {
            return Err("never refused".into());
        }
    };
    assert!(matches!(refused, StoreError::DiskFull { limit: 1, .. }), "{refused}");
    assert!(n > 100, "the first segment was used up first ({n})");
    assert_eq!(read_all(&store, "F", 0).len() as u64, n, "reads go on");
    drop(store);
    // With the threshold back at its default, appends continue.
    cfg.disk_refuse_writes_percent = 0;
    let store = MessageStore::open(cfg)?;
    assert_eq!(append(&store, "F", 0, 15, n)?.queue_offset, n);
    Ok(())
}

#[test]
fn a_slow_queue_file_creation_does_not_hold_up_other_queues() -> TestResult {
    // A new queue's first file is made before the writer lock is taken: a
    // slow creation (here 2 s) delays that queue's first append only.
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let store = Arc::new(MessageStore::open(small_config(dir.path()))?);
    append(&store, "Busy", 0, 1, 0)?;
    fault::inject_delay("create", 2_000, Some(1));
    let slow_done = Arc::new(AtomicBool::new(false));
    let (s, d) = (Arc::clone(&store), Arc::clone(&slow_done));
    let slow = std::thread::spawn(move || {
        let r = append(&s, "Fresh", 0, 1, 0).map(|_| ());
        d.store(true, Ordering::SeqCst);
        r.map_err(|e| e.to_string())
    });
    // Wait until the slow creation is under way (its fault used up).
    std::thread::sleep(std::time::Duration::from_millis(200));
    for i in 1..=20u64 {
        append(&store, "Busy", 0, 1, i)?;
    }
    assert!(
        !slow_done.load(Ordering::SeqCst),
        "the other queue's appends waited for the slow file creation"
    );
    slow.join().map_err(|_| "slow append panicked")??;
    assert_eq!(read_all(&store, "Fresh", 0).len(), 1);
    assert_eq!(read_all(&store, "Busy", 0).len(), 21);
    fault::clear();
    Ok(())
}

#[test]
fn an_append_that_reaches_the_writer_after_close_is_refused_not_lost() -> TestResult {
    // Deterministic form of the close race: an append is held (a slow
    // queue-file creation, before the writer lock) while close() fences the
    // writer and writes the final checkpoint. It must then be refused; if
    // it were acknowledged, the next start would trust the checkpoint's end
    // and lose it.
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = Arc::new(MessageStore::open(cfg.clone())?);
    append(&store, "Before", 0, 1, 0)?;
    fault::inject_delay("create", 1_000, Some(1));
    let s = Arc::clone(&store);
    let held = std::thread::spawn(move || append(&s, "Late", 0, 9, 0).map(|r| r.queue_offset));
    std::thread::sleep(std::time::Duration::from_millis(200));
    store.close()?;
    let outcome = held.join().map_err(|_| "append panicked")?;
    fault::clear();
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert!(store.recovery_report().clean, "the close was clean");
    match outcome {
        Err(StoreError::ShutDown) => assert!(read_all(&store, "Late", 0).is_empty()),
        Ok(off) => assert_eq!(
            read_all(&store, "Late", 0).first().map(|(o, _)| *o),
            Some(off),
            "acknowledged before close, so it must be there"
        ),
        Err(e) => return Err(format!("unexpected: {e}").into()),
    }
    assert_eq!(read_all(&store, "Before", 0).len(), 1);
    Ok(())
}

#[test]
fn a_failed_write_back_ahead_of_the_writer_loses_no_acknowledgement() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = sync_config(dir.path());
    cfg.preallocate = true;
    cfg.prefault_window_bytes = 8192;
    // Every write-back of the window ahead fails (it is done through a
    // descriptor of its own, so it cannot take an error the flusher's msync
    // must see): a missed preparation, counted, never a failure of the
    // messages the flusher acknowledges.
    fault::inject("prepare-msync", libc::EIO, None);
    let store = MessageStore::open(cfg.clone())?;
    let mut last = 0;
    for i in 0..400u64 {
        let r = append(&store, "W", 0, 1, i)?;
        store.wait_durable(r.end_offset)?;
        last = r.end_offset;
    }
    let (_, _, flushed) = store.commitlog_offsets();
    assert!(flushed >= last, "flushed {flushed} < acknowledged {last}");
    drop(store);
    fault::clear();
    let store = MessageStore::open(cfg)?;
    assert_eq!(read_all(&store, "W", 0).len(), 400);
    Ok(())
}

#[test]
fn a_batch_that_needs_a_segment_it_cannot_have_stores_nothing() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    // Fill the first segment (256 KiB) to within a batch of its end.
    let big = vec![7u8; 8 * 1024];
    let mut n = 0u64;
    while store.commitlog_offsets().1 + 40 * 1024 < 256 * 1024 {
        store.append_message(&MessageInput::new("B", 0, &big, b""))?;
        n += 1;
    }
    // A batch of 8 × 8 KiB crosses into the next segment, which cannot be
    // made: refused whole — none of its records readable, no offset taken.
    fault::inject("create", libc::ENOSPC, None);
    let batch: Vec<MessageInput<'_>> = (0..8).map(|_| MessageInput::new("B", 0, &big, b"")).collect();
    assert!(store.append_messages(&batch).is_err());
    assert_eq!(store.max_offset("B", 0), n, "part of the batch was stored");
    fault::clear();
    // Retried once the disk has room: stored once.
    let r = store.append_messages(&batch)?;
    assert_eq!(r.len(), 8);
    assert_eq!(r[0].queue_offset, n);
    assert_eq!(store.max_offset("B", 0), n + 8);
    assert_eq!(read_all(&store, "B", 0).len() as u64, n + 8);
    Ok(())
}

#[test]
fn a_failed_queue_or_index_write_back_is_final() -> TestResult {
    for step in ["cq-msync", "index-msync"] {
        let _g = serial();
        let dir = tempfile::tempdir()?;
        let store = MessageStore::open(small_config(dir.path()))?;
        append(&store, "Q", 0, 1, 0)?;
        store.checkpoint()?;
        append(&store, "Q", 0, 1, 1)?;
        fault::inject(step, libc::EIO, Some(1));
        assert!(store.checkpoint().is_err(), "{step}");
        // The fault is used up; a later checkpoint's msync would pass. It
        // must not record as durable what the failed one lost.
        match store.checkpoint() {
            Err(StoreError::StorageFailed(why)) => assert!(why.contains("write-back"), "{step}: {why}"),
            other => panic!("{step}: expected StorageFailed, got {other:?}"),
        }
        assert!(matches!(
            append(&store, "Q", 0, 1, 2),
            Err(StoreError::StorageFailed(_))
        ));
        fault::clear();
    }
    Ok(())
}

/// A crash inside a cut (after the log and its queues were cut, before the
/// checkpoint that records it): the next start finishes the cut and opens
/// with the records before it, instead of refusing over queues shorter than
/// the last checkpoint said.
#[test]
fn a_crash_inside_a_cut_finishes_it_at_the_next_start() -> TestResult {
    let _g = serial();
    let d = tempfile::tempdir()?;
    let cfg = small_config(d.path());
    let store = MessageStore::open(cfg.clone())?;
    let mut ends = Vec::new();
    for i in 0..10u64 {
        ends.push(append(&store, "T", 0, 1, i)?.end_offset);
    }
    store.checkpoint()?;
    store.set_leader(false);
    // The cut's own checkpoint fails: the process dies there.
    fault::inject("file-write", libc::ENOSPC, None);
    let cut = store.truncate_log(ends[4]);
    fault::clear();
    assert!(cut.is_err(), "the cut's checkpoint was to fail");
    drop(store);
    let store = MessageStore::open(cfg)?;
    let all = read_all(&store, "T", 0);
    assert_eq!(all.len(), 5, "the records before the cut, and only those");
    assert_eq!(store.commitlog_offsets().1, ends[4]);
    Ok(())
}

/// Sync mode, a replica cutting its log: what is written at the cut's
/// offsets since is synced before it is durable — the syncs issued before
/// the cut covered bytes that are no longer there, and a waiter below the
/// old end was taken as issued (no sync came: a flush timeout).
#[test]
fn in_sync_mode_writes_after_a_cut_are_synced() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = sync_config(dir.path());
    cfg.sync_flush_timeout_ms = 2000;
    let store = MessageStore::open(cfg)?;
    let mut ends = Vec::new();
    for i in 0..10u64 {
        let r = append(&store, "S", 0, 3, i)?;
        store.wait_durable(r.end_offset)?;
        ends.push(r.end_offset);
    }
    store.set_leader(false);
    store.truncate_log(ends[4])?;
    store.set_leader(true);
    let before = store.flush_count();
    let r = append(&store, "S", 0, 4, 5)?;
    store.wait_durable(r.end_offset)?;
    assert!(
        store.flush_count() > before,
        "the write after the cut was taken as synced"
    );
    Ok(())
}

/// A crash inside a topic deletion, after its tombstone is on disk and
/// before its queue files are gone (a fault stops it there; the store is
/// dropped without a close): the next start finishes the deletion — the
/// topic does not come back with its records, the others are untouched,
/// and the name is usable again from scratch.
#[test]
fn a_topic_deletion_a_crash_interrupted_is_finished_at_the_next_start() -> TestResult {
    let _serial = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..5 {
        append(&store, "Gone", 0, 10, i)?;
        append(&store, "Gone", 1, 10, i)?;
        append(&store, "Kept", 0, 10, i)?;
    }
    store.checkpoint()?;
    fault::inject("delete-topic-files", libc::EIO, Some(1));
    assert!(store.delete_topic("Gone").is_err());
    fault::clear();
    drop(store);
    assert!(
        dir.path().join("consumequeue/Gone").exists(),
        "the fault left the files"
    );
    let store = MessageStore::open(cfg.clone())?;
    assert!(read_all(&store, "Gone", 0).is_empty(), "the deleted topic came back");
    assert!(read_all(&store, "Gone", 1).is_empty());
    assert!(!dir.path().join("consumequeue/Gone").exists());
    assert_eq!(read_all(&store, "Kept", 0).len(), 5);
    assert_eq!(append(&store, "Gone", 0, 10, 100)?.queue_offset, 0);
    store.close()?;
    drop(store);
    // Made again after the delete: kept at the next start.
    let store = MessageStore::open(cfg)?;
    let gone = read_all(&store, "Gone", 0);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].1, body(10, 100));
    Ok(())
}

/// A crash leaves what was written past the checkpoint in the page cache
/// only: the next start reads it from there and must write it back before
/// its own checkpoint calls it durable — with the write-back failing, the
/// start fails instead of vouching for it.
#[test]
fn a_start_after_a_crash_writes_the_recovered_tail_back() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.flush_interval_ms = 3_600_000;
    cfg.checkpoint_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg.clone())?;
    append(&store, "R", 0, 1, 0)?;
    store.checkpoint()?;
    for i in 1..20u64 {
        append(&store, "R", 0, 1, i)?;
    }
    let before = store.commitlog_offsets();
    // A crash: no close, nothing flushed past the checkpoint.
    drop(store);
    fault::inject("msync", libc::EIO, None);
    let refused = MessageStore::open(cfg.clone());
    fault::clear();
    match refused {
        Err(StoreError::StorageFailed(why)) => assert!(why.contains("msync"), "{why}"),
        other => panic!(
            "the start vouched for a tail it could not write back: {:?}",
            other.map(|_| ())
        ),
    }
    let store = MessageStore::open(cfg)?;
    assert!(store.flush_count() >= 1, "the recovered tail was not written back");
    assert_eq!(store.commitlog_offsets().1, before.1);
    assert_eq!(read_all(&store, "R", 0).len(), 20);
    Ok(())
}

/// A cut marks everything below it flushed: what it keeps must be written
/// back first (a replica without waiting producers syncs only at its
/// checkpoints). A write-back that fails fails the cut.
#[test]
fn a_cut_writes_back_what_it_keeps_before_calling_it_flushed() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.flush_interval_ms = 3_600_000;
    cfg.checkpoint_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg)?;
    let mut ends = Vec::new();
    for i in 0..10u64 {
        ends.push(append(&store, "K", 0, 1, i)?.end_offset);
    }
    assert!(store.commitlog_offsets().2 < ends[6], "nothing was to be flushed yet");
    let syncs = store.flush_count();
    store.set_leader(false);
    store.truncate_log(ends[6])?;
    assert_eq!(store.commitlog_offsets().2, ends[6]);
    assert!(
        store.flush_count() > syncs,
        "the cut called bytes below it flushed without a sync"
    );
    Ok(())
}

#[test]
fn a_cut_whose_write_back_fails_is_refused() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.flush_interval_ms = 3_600_000;
    cfg.checkpoint_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg)?;
    let mut ends = Vec::new();
    for i in 0..10u64 {
        ends.push(append(&store, "C", 0, 1, i)?.end_offset);
    }
    let flushed = store.commitlog_offsets().2;
    assert!(flushed < ends[6], "nothing was to be flushed yet");
    store.set_leader(false);
    fault::inject("msync", libc::EIO, None);
    let cut = store.truncate_log(ends[6]);
    fault::clear();
    assert!(cut.is_err(), "the cut called unwritten bytes flushed");
    assert!(store.commitlog_offsets().2 < ends[6]);
    Ok(())
}

/// Sync mode: a sync in flight across a cut (the disk slow) ends after the
/// new master's records were written at the cut's offsets; it marks
/// flushed no further than the cut — those records were never synced.
#[test]
fn a_sync_in_flight_across_a_cut_does_not_cover_what_is_written_after_it() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = sync_config(dir.path());
    cfg.sync_flush_timeout_ms = 3000;
    let store = Arc::new(MessageStore::open(cfg)?);
    let mut ends = Vec::new();
    for i in 0..5u64 {
        let r = append(&store, "X", 0, 2, i)?;
        store.wait_durable(r.end_offset)?;
        ends.push(r.end_offset);
    }
    let cut = ends[4];
    fault::inject_delay("msync", 800, Some(1));
    let mut last = 0;
    for i in 5..10u64 {
        last = append(&store, "X", 0, 2, i)?.end_offset;
    }
    let waiter = {
        let s = Arc::clone(&store);
        std::thread::spawn(move || s.wait_durable(last))
    };
    // The slow sync of [cut, last) is in flight.
    std::thread::sleep(std::time::Duration::from_millis(200));
    store.set_leader(false);
    store.truncate_log(cut)?;
    store.set_leader(true);
    // Not waited for: nothing asks a sync of these.
    for i in 0..3u64 {
        append(&store, "X", 0, 3, i)?;
    }
    std::thread::sleep(std::time::Duration::from_millis(1200));
    fault::clear();
    let (_, end, flushed) = store.commitlog_offsets();
    assert!(end > cut);
    assert!(
        flushed <= cut,
        "flushed {flushed} covers records written after the cut at {cut}"
    );
    let _ = waiter.join();
    Ok(())
}

/// A cut that fails half-way (its zeroed tail cannot be written back) is
/// final: the store does not go on serving and taking writes from half a
/// cut; the next start finishes it from its marker.
#[test]
fn a_cut_that_fails_half_way_fails_the_store() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    let mut ends = Vec::new();
    for i in 0..10u64 {
        ends.push(append(&store, "H", 0, 1, i)?.end_offset);
    }
    store.checkpoint()?;
    store.set_leader(false);
    fault::inject("msync", libc::EIO, Some(1));
    let cut = store.truncate_log(ends[4]);
    fault::clear();
    assert!(matches!(cut, Err(StoreError::StorageFailed(_))), "{cut:?}");
    store.set_leader(true);
    assert!(matches!(
        append(&store, "H", 0, 1, 99),
        Err(StoreError::StorageFailed(_))
    ));
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(read_all(&store, "H", 0).len(), 5, "the next start finishes the cut");
    Ok(())
}

/// A full IndexFile is written back when the next one starts; a failure
/// there is final as every other write-back (the retry at the next record
/// would pass, Linux having reported the error once, and the checkpoint
/// only flushes the newest file).
#[test]
fn a_failed_write_back_of_a_full_index_file_is_final() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.index_slots = 4;
    cfg.index_entries = 4;
    let store = MessageStore::open(cfg)?;
    fault::inject("index-msync", libc::EIO, Some(1));
    for i in 0..20u64 {
        append(&store, "I", 0, 1, i)?;
    }
    fault::clear();
    match store.checkpoint() {
        Err(StoreError::StorageFailed(why)) => assert!(why.contains("IndexFile"), "{why}"),
        other => panic!("expected StorageFailed, got {other:?}"),
    }
    Ok(())
}

/// A new file whose directory entry could not be made durable is not left
/// behind: the append fails, and the retry makes the file again (and syncs
/// its name) instead of taking the half-made one as existing.
#[test]
fn a_failed_directory_sync_leaves_no_file_behind() -> TestResult {
    let _g = serial();
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    fault::inject("dir-fsync", libc::EIO, Some(1));
    let first = append(&store, "NewQ", 0, 3, 0);
    fault::clear();
    assert!(first.is_err(), "the queue's first file could not be made durable");
    let cq = dir.path().join("consumequeue/NewQ/0").join(format!("{:020}", 0));
    assert!(!cq.exists(), "no half-made file left");
    assert_eq!(append(&store, "NewQ", 0, 3, 0)?.queue_offset, 0);
    assert!(cq.exists());
    Ok(())
}
