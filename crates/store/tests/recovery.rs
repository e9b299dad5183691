//! Recovery after unclean stops, torn and corrupt tails, damaged or foreign
//! files. An unclean stop is simulated by dropping the store without
//! `close()`: the abort marker stays, as after a crash, and page-cache data
//! is on "disk" as it would be after a process kill.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;
use rokka_store::{AppendResult, MessageStore, StoreConfig, StoreError};

/// No periodic checkpoint: everything appended after open is past the safe
/// offset, as data written since the last checkpoint is at a crash.
fn config(dir: &Path) -> StoreConfig {
    let mut c = small_config(dir);
    c.checkpoint_interval_ms = 3_600_000;
    c
}

fn segment_of(dir: &Path, cfg: &StoreConfig, phys: u64) -> (PathBuf, u64) {
    let start = phys - phys % cfg.commitlog_segment_bytes;
    (dir.join("commitlog").join(format!("{start:020}")), phys - start)
}

fn write_at(path: &Path, pos: u64, data: &[u8]) -> std::io::Result<()> {
    OpenOptions::new().write(true).open(path)?.write_all_at(data, pos)
}

fn read_at(path: &Path, pos: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    OpenOptions::new().read(true).open(path)?.read_exact_at(&mut b, pos)?;
    Ok(b)
}

/// Appends `n` messages to one queue and "crashes".
fn fill_and_crash(dir: &Path, n: u64) -> Result<Vec<AppendResult>, StoreError> {
    let store = MessageStore::open(config(dir))?;
    let rs = (0..n)
        .map(|i| append(&store, "R", 0, 7, i))
        .collect::<Result<Vec<_>, _>>()?;
    drop(store);
    Ok(rs)
}

fn assert_recovered_to(dir: &Path, n: u64) -> TestResult {
    let store = MessageStore::open(config(dir))?;
    let all = read_all(&store, "R", 0);
    assert_eq!(all.len() as u64, n, "messages after recovery");
    for (k, (off, b)) in all.iter().enumerate() {
        assert_eq!(*off, k as u64, "offsets contiguous");
        assert_eq!(*b, body(7, k as u64), "body {k} byte-exact");
    }
    // The store keeps working: the next append takes the next offset, and
    // key lookups of surviving messages still work.
    let r = append(&store, "R", 0, 7, n)?;
    assert_eq!(r.queue_offset, n);
    if n > 0 {
        assert_eq!(
            store.query_by_key("R", &format!("key-{}", n - 1), 4, 0, i64::MAX).len(),
            1
        );
    }
    store.close()?;
    drop(store);
    // And the repaired store reopens cleanly with the new message.
    let store = MessageStore::open(config(dir))?;
    assert!(store.recovery_report().clean);
    assert_eq!(read_all(&store, "R", 0).len() as u64, n + 1);
    Ok(())
}

#[test]
fn unclean_stop_keeps_everything_written() -> TestResult {
    let dir = tempfile::tempdir()?;
    fill_and_crash(dir.path(), 500)?;
    let store = MessageStore::open(config(dir.path()))?;
    let rep = store.recovery_report().clone();
    assert!(!rep.clean);
    assert_eq!(rep.redispatched, 500);
    assert_eq!(rep.truncated_at, None);
    drop(store);
    assert_recovered_to(dir.path(), 500)
}

/// Crash, recover, then stop cleanly with nothing appended in between: the
/// clean checkpoint names the record the log really ends with, so the next
/// start needs no scan (it named the old checkpoint's last record, and every
/// such restart scanned and rebuilt everything).
#[test]
fn a_clean_stop_right_after_a_recovery_needs_no_scan_next() -> TestResult {
    let dir = tempfile::tempdir()?;
    fill_and_crash(dir.path(), 300)?;
    let store = MessageStore::open(config(dir.path()))?;
    assert!(!store.recovery_report().clean);
    store.close()?;
    drop(store);
    let store = MessageStore::open(config(dir.path()))?;
    assert!(store.recovery_report().clean, "{:?}", store.recovery_report());
    assert_eq!(read_all(&store, "R", 0).len(), 300);
    Ok(())
}

#[test]
fn clean_stop_needs_no_scan() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(config(dir.path()))?;
    for i in 0..300 {
        append(&store, "R", 0, 7, i)?;
    }
    store.close()?;
    drop(store);
    let store = MessageStore::open(config(dir.path()))?;
    assert!(store.recovery_report().clean);
    assert_eq!(store.recovery_report().scanned_from, None);
    assert_eq!(read_all(&store, "R", 0).len(), 300);
    Ok(())
}

#[test]
fn record_cut_in_half_recovers_to_the_last_good_record() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 300)?;
    let last = rs[299];
    let (seg, pos) = segment_of(dir.path(), &cfg, last.phys_offset);
    let half = u64::from(last.size) / 2;
    write_at(&seg, pos + half, &vec![0u8; last.size as usize - half as usize])?;
    assert_recovered_to(dir.path(), 299)
}

#[test]
fn segment_file_cut_mid_record_recovers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 300)?;
    let last = rs[299];
    let (seg, pos) = segment_of(dir.path(), &cfg, last.phys_offset);
    OpenOptions::new()
        .write(true)
        .open(&seg)?
        .set_len(pos + u64::from(last.size) / 2)?;
    // Later (pre-allocated, empty) segments would otherwise follow the cut.
    for e in std::fs::read_dir(dir.path().join("commitlog"))? {
        let p = e?.path();
        if p > seg {
            std::fs::remove_file(p)?;
        }
    }
    assert_recovered_to(dir.path(), 299)
}

#[test]
fn flipped_byte_in_last_record_recovers_to_the_one_before() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 300)?;
    let last = rs[299];
    let (seg, pos) = segment_of(dir.path(), &cfg, last.phys_offset);
    // A byte in the body (the header is 91 bytes for IPv4).
    let at = pos + 95;
    let b = read_at(&seg, at, 1)?;
    write_at(&seg, at, &[b[0] ^ 0x5A])?;
    assert_recovered_to(dir.path(), 299)
}

#[test]
fn zero_filled_tail_recovers_to_the_last_good_record() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 300)?;
    // The last three records' pages never reached the disk.
    let from = rs[297];
    let (seg, pos) = segment_of(dir.path(), &cfg, from.phys_offset);
    let (seg_end, _) = segment_of(dir.path(), &cfg, rs[299].phys_offset);
    assert_eq!(seg, seg_end, "test assumes one segment");
    let len = rs[299].phys_offset + u64::from(rs[299].size) - from.phys_offset;
    write_at(&seg, pos, &vec![0u8; len as usize])?;
    assert_recovered_to(dir.path(), 297)
}

#[test]
fn garbage_in_consume_queue_tail_is_rebuilt() -> TestResult {
    let dir = tempfile::tempdir()?;
    fill_and_crash(dir.path(), 100)?;
    // Torn ConsumeQueue entries past the checkpoint.
    let cq = dir.path().join("consumequeue/R/0/00000000000000000000");
    write_at(&cq, 48 * 60, &[0xAB; 48 * 10])?;
    assert_recovered_to(dir.path(), 100)
}

#[test]
fn lost_consume_queues_and_index_are_rebuilt_from_the_commitlog() -> TestResult {
    let dir = tempfile::tempdir()?;
    fill_and_crash(dir.path(), 400)?;
    std::fs::remove_dir_all(dir.path().join("consumequeue"))?;
    std::fs::remove_dir_all(dir.path().join("index"))?;
    std::fs::remove_file(dir.path().join("checkpoint"))?;
    let store = MessageStore::open(config(dir.path()))?;
    assert!(store.recovery_report().full_scan);
    drop(store);
    assert_recovered_to(dir.path(), 400)
}

#[test]
fn damaged_checkpoint_falls_back_to_a_full_scan() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(config(dir.path()))?;
    for i in 0..200 {
        append(&store, "R", 0, 7, i)?;
    }
    store.close()?;
    drop(store);
    write_at(&dir.path().join("checkpoint"), 10, &[0xFF, 0xEE])?;
    let store = MessageStore::open(config(dir.path()))?;
    let rep = store.recovery_report().clone();
    assert!(!rep.clean && rep.full_scan);
    drop(store);
    assert_recovered_to(dir.path(), 200)
}

#[test]
fn damaged_middle_record_past_the_checkpoint_cuts_the_log_and_keeps_the_rest() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 200)?;
    let (seg, pos) = segment_of(dir.path(), &cfg, rs[150].phys_offset);
    let b = read_at(&seg, pos + 95, 1)?;
    write_at(&seg, pos + 95, &[b[0] ^ 1])?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.recovery_report().truncated_at, Some(rs[150].phys_offset));
    assert_eq!(store.max_offset("R", 0), 150);
    drop(store);
    // The cut bytes (the damaged record and the 49 after it) are kept.
    let saved = dir
        .path()
        .join("lost+found")
        .join(format!("{:020}", rs[150].phys_offset));
    let kept = std::fs::read(&saved)?;
    let expect = rs[199].phys_offset + u64::from(rs[199].size) - rs[150].phys_offset;
    assert_eq!(kept.len() as u64, expect);
    // A recovery killed while zeroing the tail it cut leaves part of it
    // zeroed: the next recovery cuts at the same offset and must not
    // replace the whole copy with the partly zeroed one.
    let mut partly = kept.clone();
    partly[..4096].fill(0);
    write_at(&seg, pos, &partly)?;
    let store = MessageStore::open(config(dir.path()))?;
    assert_eq!(store.max_offset("R", 0), 150);
    drop(store);
    assert_eq!(std::fs::read(&saved)?, kept, "the whole copy is kept");
    // A different tail cut at the same offset (another crash there): saved
    // under the offset's name, the first copy set aside, neither lost.
    let mut other = kept.clone();
    other[2000] ^= 0x5a;
    write_at(&seg, pos, &other)?;
    let store = MessageStore::open(config(dir.path()))?;
    drop(store);
    assert_eq!(std::fs::read(&saved)?, other, "the new tail is saved");
    let aside = saved.with_file_name(format!("{:020}.earlier-1", rs[150].phys_offset));
    assert_eq!(std::fs::read(&aside)?, kept, "the first copy is set aside");
    assert_recovered_to(dir.path(), 150)
}

#[test]
fn a_zeroed_header_past_the_checkpoint_cuts_the_log_and_keeps_the_rest() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 200)?;
    // A zeroed sector where record 150 starts: to a scan it looks like the
    // end of the log, with nothing damaged to say why.
    let (seg, pos) = segment_of(dir.path(), &cfg, rs[150].phys_offset);
    write_at(&seg, pos, &[0u8; 16])?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.max_offset("R", 0), 150);
    drop(store);
    // What was cut is kept (from record 150 to the end of record 199).
    let saved = dir
        .path()
        .join("lost+found")
        .join(format!("{:020}", rs[150].phys_offset));
    let kept = std::fs::read(&saved)?;
    let expect = rs[199].phys_offset + u64::from(rs[199].size) - rs[150].phys_offset;
    assert_eq!(kept.len() as u64, expect);
    assert_eq!(&kept[..16], &[0u8; 16]);
    assert_recovered_to(dir.path(), 150)
}

#[test]
fn a_torn_tail_that_cannot_be_copied_is_still_cut_and_the_store_starts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 50)?;
    // A torn last record (half of it zeroed), and a lost+found the store
    // cannot write into (a file where the directory would go).
    let (seg, pos) = segment_of(dir.path(), &cfg, rs[49].phys_offset);
    let half = u64::from(rs[49].size) / 2;
    write_at(&seg, pos + half, &vec![0u8; half as usize])?;
    std::fs::write(dir.path().join("lost+found"), b"not a directory")?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.max_offset("R", 0), 49);
    Ok(())
}

#[test]
fn a_clean_crash_keeps_nothing_in_lost_and_found() -> TestResult {
    let dir = tempfile::tempdir()?;
    fill_and_crash(dir.path(), 50)?;
    let store = MessageStore::open(config(dir.path()))?;
    assert_eq!(store.max_offset("R", 0), 50);
    drop(store);
    assert!(!dir.path().join("lost+found").exists());
    Ok(())
}

#[test]
fn damaged_middle_record_without_a_checkpoint_is_an_error_naming_the_file() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let rs = fill_and_crash(dir.path(), 100)?;
    std::fs::remove_file(dir.path().join("checkpoint"))?;
    let (seg, pos) = segment_of(dir.path(), &cfg, rs[10].phys_offset);
    let b = read_at(&seg, pos + 95, 1)?;
    write_at(&seg, pos + 95, &[b[0] ^ 1])?;
    match MessageStore::open(cfg) {
        Err(StoreError::BadFile { path, reason }) => {
            assert_eq!(path, seg);
            assert!(reason.contains("refusing"), "{reason}");
        }
        other => panic!("expected BadFile, got {other:?}"),
    }
    // Nothing was changed: undoing the damage lets the store open with everything.
    write_at(&seg, pos + 95, &b)?;
    assert_recovered_to(dir.path(), 100)
}

#[test]
fn foreign_files_are_errors_naming_them() -> TestResult {
    let dir = tempfile::tempdir()?;
    fill_and_crash(dir.path(), 10)?;
    let stray = dir.path().join("commitlog").join("notes.txt");
    std::fs::write(&stray, b"hello")?;
    match MessageStore::open(config(dir.path())) {
        Err(StoreError::BadFile { path, .. }) => assert_eq!(path, stray),
        other => panic!("expected BadFile, got {other:?}"),
    }
    std::fs::remove_file(&stray)?;
    let stray = dir.path().join("something-else");
    std::fs::write(&stray, b"x")?;
    match MessageStore::open(config(dir.path())) {
        Err(e @ StoreError::BadFile { .. }) => {
            assert!(e.to_string().contains("something-else"), "{e}")
        }
        other => panic!("expected BadFile, got {other:?}"),
    }
    std::fs::remove_file(&stray)?;
    // A segment whose name does not match its neighbours' sizes.
    let bogus = dir.path().join("commitlog").join(format!("{:020}", 12345));
    std::fs::write(&bogus, vec![0u8; 8192])?;
    assert!(matches!(
        MessageStore::open(config(dir.path())),
        Err(StoreError::BadFile { .. })
    ));
    std::fs::remove_file(&bogus)?;
    assert_recovered_to(dir.path(), 10)
}

#[test]
fn kafka_batches_recover_too() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(config(dir.path()))?;
    let mut offsets = Vec::new();
    for i in 0..50u64 {
        let values: Vec<Vec<u8>> = (0..(i % 5 + 1)).map(|j| body(i, j)).collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let b = rokka_store::record::kafka::build_test_batch(&refs, 1000 + i as i64);
        offsets.push(store.append_kafka_batch("KB", 1, &b)?);
    }
    let max = store.max_offset("KB", 1);
    drop(store);
    // Flip a byte inside the last batch's records: its CRC-32C catches it.
    let cfg = config(dir.path());
    let last = offsets[49];
    let (seg, pos) = segment_of(dir.path(), &cfg, last.phys_offset);
    let at = pos + u64::from(last.size) - 2;
    let b = read_at(&seg, at, 1)?;
    write_at(&seg, at, &[b[0] ^ 0x10])?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.max_offset("KB", 1), max - u64::from(last.count));
    assert_eq!(store.recovery_report().truncated_at, Some(last.phys_offset));
    Ok(())
}

#[test]
fn an_end_in_a_segments_last_bytes_still_takes_appends() -> TestResult {
    // Found by fuzz/ (recovery): a checkpoint whose durable end lies 3 bytes
    // before its segment's end (no room for a BLANK filler) recovered to
    // that end, and then every append panicked writing the filler.
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("commitlog");
    std::fs::create_dir_all(&log)?;
    std::fs::write(log.join(format!("{:020}", 65536)), vec![0u8; 4096])?;
    rokka_store::checkpoint::Checkpoint {
        safe_offset: 65536 + 4093,
        clean: true,
        last_record_offset: 65536,
        index: None,
    }
    .store(&dir.path().join("checkpoint"))?;
    std::fs::write(dir.path().join("abort"), "1\n")?;
    let store = MessageStore::open(config(dir.path()))?;
    let r = append(&store, "R", 0, 7, 0)?;
    assert_eq!(r.phys_offset, 65536 + 4096, "the next segment takes it");
    // A crash now: the scan from the checkpoint steps over the 3 bytes to
    // the new segment; then appends, a clean stop and a clean reopen.
    drop(store);
    assert_recovered_to(dir.path(), 1)
}

/// `max_message_bytes` lowered after larger messages were written: an
/// unclean restart keeps them (a record is bounded by its segment in the
/// scan, not by today's limit) — before, each read as damage and the log
/// was cut there.
#[test]
fn a_lowered_message_limit_does_not_cut_larger_records_already_written() -> TestResult {
    use rokka_store::MessageInput;
    let dir = tempfile::tempdir()?;
    let mut before = config(dir.path());
    before.max_message_bytes = 180 * 1024;
    let store = MessageStore::open(before)?;
    let big = vec![7u8; 100 * 1024];
    for _ in 0..5 {
        store.append_message(&MessageInput::new("Big", 0, &big, b""))?;
    }
    drop(store);
    let mut lowered = config(dir.path());
    lowered.max_message_bytes = 1024;
    let store = MessageStore::open(lowered)?;
    assert_eq!(store.recovery_report().truncated_at, None);
    assert_eq!(store.max_offset("Big", 0), 5);
    Ok(())
}

/// A torn tail at the end of one segment with the next segment's first
/// entries on disk (write-back is not in order; a group commit's msync of
/// two files is not atomic), past the checkpoint: the log is cut at the
/// torn entry and the later segment's entries kept in lost+found, as one
/// segment's are — the store refused to start ("valid entries follow").
#[test]
fn a_torn_tail_before_a_later_segments_entries_past_the_checkpoint_is_cut() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    let mut rs = Vec::new();
    let mut i = 0;
    while rs
        .last()
        .is_none_or(|r: &AppendResult| r.phys_offset < cfg.commitlog_segment_bytes + 10_000)
    {
        rs.push(append(&store, "R", 0, 7, i)?);
        i += 1;
    }
    drop(store);
    let last_in_first = rs
        .iter()
        .rposition(|r| r.phys_offset < cfg.commitlog_segment_bytes)
        .ok_or("no record in the first segment")?;
    let r = &rs[last_in_first];
    let (seg, pos) = segment_of(dir.path(), &cfg, r.phys_offset);
    let half = u64::from(r.size) / 2;
    write_at(&seg, pos + half, &vec![0u8; half as usize])?;
    let store = MessageStore::open(cfg.clone())?;
    assert_eq!(store.max_offset("R", 0), last_in_first as u64);
    drop(store);
    let saved = dir
        .path()
        .join("lost+found")
        .join(format!("{:020}", cfg.commitlog_segment_bytes));
    let kept = std::fs::read(&saved)?;
    let first_after = &rs[last_in_first + 1];
    assert_eq!(first_after.phys_offset, cfg.commitlog_segment_bytes);
    let expect = rs.last().map_or(0, |l| l.phys_offset + u64::from(l.size)) - cfg.commitlog_segment_bytes;
    assert_eq!(kept.len() as u64, expect, "the later segment's entries are kept");
    assert_recovered_to(dir.path(), last_in_first as u64)
}

/// Retention deleted the segment the checkpoint pointed into, and a power
/// loss took the queue's entries written after it: the queue's surviving
/// entries all name deleted records, and the first record left carries a
/// later offset. The queue continues past the gap (those records are
/// gone) — the store refused to start ("its ConsumeQueue ends at").
#[test]
fn a_queue_gap_behind_retention_is_continued_not_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    let mut rs = Vec::new();
    let mut i = 0;
    while rs
        .last()
        .is_none_or(|r: &AppendResult| r.phys_offset < 2 * cfg.commitlog_segment_bytes + 10_000)
    {
        rs.push(append(&store, "R", 0, 7, i)?);
        i += 1;
    }
    drop(store);
    // Retention took segment 0 ...
    std::fs::remove_file(dir.path().join("commitlog").join(format!("{:020}", 0)))?;
    // ... and the queue kept only the first half of the entries naming it
    // (the rest lost with the power).
    let in_first = rs
        .iter()
        .filter(|r| r.phys_offset < cfg.commitlog_segment_bytes)
        .count();
    let cq = dir.path().join("consumequeue/R/0").join(format!("{:020}", 0));
    let len = std::fs::metadata(&cq)?.len() as usize;
    let kept = in_first / 2;
    write_at(&cq, (kept * 48) as u64, &vec![0u8; len - kept * 48])?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(
        store.min_offset("R", 0),
        in_first as u64,
        "the queue starts past the gap"
    );
    assert_eq!(store.max_offset("R", 0), rs.len() as u64);
    let r = store.read("R", 0, in_first as u64, 1, 1 << 20);
    assert_eq!(r.entries.first().map(|e| e.cq.base_offset), Some(in_first as u64));
    Ok(())
}
