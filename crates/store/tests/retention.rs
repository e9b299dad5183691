//! Retention: whole expired segments are deleted, queue starts move forward,
//! and reads below the start get "offset moved", never garbage.

mod common;

use std::time::{Duration, SystemTime};

use common::*;
use rokka_store::{MessageStore, ReadStatus};

fn age_segments(dir: &std::path::Path, keep_newest: usize) -> std::io::Result<usize> {
    let mut segs: Vec<_> = std::fs::read_dir(dir.join("commitlog"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    segs.sort();
    let old = SystemTime::now() - Duration::from_secs(100 * 3600);
    let n = segs.len().saturating_sub(keep_newest);
    for p in &segs[..n] {
        std::fs::File::options().write(true).open(p)?.set_modified(old)?;
    }
    Ok(n)
}

#[test]
fn expired_segments_are_deleted_and_reads_below_start_say_offset_moved() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    let mut results = Vec::new();
    for i in 0..3000u64 {
        results.push(append(&store, "T", (i % 2) as u32, 9, i)?);
    }
    store.checkpoint()?;
    let segs_before = store.segment_count();
    assert!(segs_before >= 5);
    // Age all but the newest two segments past the 72 h default.
    let aged = age_segments(dir.path(), 2)?;
    let deleted = store.run_retention()?;
    assert_eq!(deleted, aged.min(10));
    assert_eq!(store.segment_count(), segs_before - deleted);
    let (cl_min, _, _) = store.commitlog_offsets();
    for q in 0..2u32 {
        let min = store.min_offset("T", q);
        assert!(min > 0, "queue {q} start moved");
        // The first live message is the first whose record is still on disk.
        let first_live = results
            .iter()
            .enumerate()
            .filter(|(i, _)| *i as u64 % 2 == u64::from(q))
            .find(|(_, r)| r.phys_offset >= cl_min)
            .map(|(_, r)| r.queue_offset)
            .ok_or("nothing left")?;
        assert_eq!(min, first_live);
        let r = store.read("T", q, 0, 10, 1 << 20);
        assert_eq!(r.status, ReadStatus::OffsetMoved);
        assert_eq!(r.next_offset, min);
        // Everything from the new start is intact.
        let all = read_all(&store, "T", q);
        assert_eq!(all.first().map(|(o, _)| *o), Some(min));
        for (off, b) in &all {
            assert_eq!(*b, body(9, off * 2 + u64::from(q)));
        }
        assert_eq!(store.max_offset("T", q), 1500);
    }
    // Old keys are gone from queries; new ones resolve.
    assert!(store.query_by_key("T", "key-0", 4, 0, i64::MAX).is_empty());
    assert_eq!(store.query_by_key("T", "key-2999", 4, 0, i64::MAX).len(), 1);
    store.close()?;
    drop(store);
    // Starts survive a restart.
    let store = MessageStore::open(cfg)?;
    let min0 = store.min_offset("T", 0);
    assert!(min0 > 0);
    assert_eq!(store.read("T", 0, min0 - 1, 1, 1 << 20).status, ReadStatus::OffsetMoved);
    assert_eq!(store.max_offset("T", 0), 1500);
    Ok(())
}

#[test]
fn size_cap_deletes_oldest_segments_but_never_the_active_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.retention_max_bytes = 2 * cfg.commitlog_segment_bytes;
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..2000u64 {
        append(&store, "T", 0, 9, i)?;
    }
    let before = store.segment_count();
    let deleted = store.run_retention()?;
    assert!(deleted > 0);
    assert_eq!(store.segment_count(), before - deleted);
    assert!(
        store.segment_count() as u64 * cfg.commitlog_segment_bytes
            <= cfg.retention_max_bytes + cfg.commitlog_segment_bytes
    );
    // A queue drained by retention keeps its end offset; new appends continue.
    let r = append(&store, "T", 0, 9, 2000)?;
    assert_eq!(r.queue_offset, 2000);
    let all = read_all(&store, "T", 0);
    assert_eq!(all.last().map(|(o, _)| *o), Some(2000));
    Ok(())
}
