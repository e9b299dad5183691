//! Damage found by reads: a record whose bytes changed under the store, or
//! a ConsumeQueue entry pointing at another record, is never served — the
//! read stops before it and a read at it says `Damaged`.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;
use rokka_store::{MessageStore, ReadStatus};

fn flip(path: &Path, pos: u64) -> std::io::Result<()> {
    let f = OpenOptions::new().read(true).write(true).open(path)?;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos)?;
    b[0] ^= 0x5a;
    f.write_all_at(&b, pos)
}

#[test]
fn a_damaged_record_is_not_served() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    let rs: Vec<_> = (0..20)
        .map(|i| append(&store, "X", 0, 5, i))
        .collect::<Result<_, _>>()?;
    // One byte in the middle of record 10 changes on disk (shared mapping:
    // the store sees it at once, as it would a bad sector read back).
    let r = &rs[10];
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    flip(&seg, r.phys_offset + u64::from(r.size) / 2)?;
    let read = store.read("X", 0, 0, 100, 1 << 20);
    assert_eq!(read.status, ReadStatus::Found);
    assert_eq!(read.entries.len(), 10, "the read stops before the damaged record");
    assert_eq!(read.next_offset, 10);
    let at = store.read("X", 0, 10, 100, 1 << 20);
    assert_eq!(at.status, ReadStatus::Damaged);
    assert!(at.entries.is_empty());
    assert_eq!(at.next_offset, 10);
    // Past it, reads work.
    let after = store.read("X", 0, 11, 100, 1 << 20);
    assert_eq!((after.status, after.entries.len()), (ReadStatus::Found, 9));
    Ok(())
}

#[test]
fn a_queue_entry_pointing_at_another_record_is_not_served() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    let a: Vec<_> = (0..5).map(|i| append(&store, "A", 0, 6, i)).collect::<Result<_, _>>()?;
    let b: Vec<_> = (0..5).map(|i| append(&store, "B", 0, 6, i)).collect::<Result<_, _>>()?;
    // Entry 3 of A now points at B's record 3 (same size and offset field,
    // another topic): what a damaged or misdirected ConsumeQueue looks like.
    let cq = dir.path().join("consumequeue/A/0/00000000000000000000");
    let f = OpenOptions::new().read(true).write(true).open(&cq)?;
    f.write_all_at(&b[3].phys_offset.to_be_bytes(), 3 * 48)?;
    f.write_all_at(&b[3].size.to_be_bytes(), 3 * 48 + 8)?;
    drop(f);
    let read = store.read("A", 0, 0, 100, 1 << 20);
    assert_eq!(read.entries.len(), 3);
    assert_eq!(store.read("A", 0, 3, 100, 1 << 20).status, ReadStatus::Damaged);
    assert_eq!(a.len(), 5);
    Ok(())
}

#[test]
fn a_queue_entry_pointing_past_the_log_is_damaged_not_a_moved_start() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    for i in 0..5 {
        append(&store, "P", 0, 6, i)?;
    }
    // Entry 3 points far past the CommitLog's end: no record can be read
    // there. "Moved to the queue's start" (0) would send a consumer back
    // over entries 0..3 to this one again, round and round.
    let cq = dir.path().join("consumequeue/P/0/00000000000000000000");
    let f = OpenOptions::new().read(true).write(true).open(&cq)?;
    f.write_all_at(&(1u64 << 40).to_be_bytes(), 3 * 48)?;
    drop(f);
    let at = store.read("P", 0, 3, 100, 1 << 20);
    assert_eq!((at.status, at.next_offset), (ReadStatus::Damaged, 3));
    assert_eq!(store.read("P", 0, 0, 100, 1 << 20).entries.len(), 3);
    assert_eq!(store.read("P", 0, 4, 100, 1 << 20).status, ReadStatus::Found);
    Ok(())
}

#[test]
fn verification_can_be_turned_off() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.verify_reads = false;
    let store = MessageStore::open(cfg)?;
    let rs: Vec<_> = (0..3).map(|i| append(&store, "Y", 0, 7, i)).collect::<Result<_, _>>()?;
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    flip(&seg, rs[1].phys_offset + u64::from(rs[1].size) / 2)?;
    assert_eq!(store.read("Y", 0, 0, 100, 1 << 20).entries.len(), 3);
    Ok(())
}

fn zero(path: &Path, pos: u64, len: usize) -> std::io::Result<()> {
    OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all_at(&vec![0u8; len], pos)
}

#[test]
fn zeroed_queue_entries_after_a_clean_stop_are_rebuilt_not_reused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..30 {
        append(&store, "Z", 0, 8, i)?;
    }
    store.close()?;
    drop(store);
    // The last ten ConsumeQueue entries are zeroed (a lost write, a bad
    // sector): without a check the queue would end at 20 and hand out 20..29
    // again while the CommitLog holds them.
    zero(
        &dir.path().join("consumequeue/Z/0/00000000000000000000"),
        20 * 48,
        10 * 48,
    )?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.recovery_report().queues_rebuilt, 1);
    let all = read_all(&store, "Z", 0);
    assert_eq!(all.len(), 30);
    for (k, (off, b)) in all.iter().enumerate() {
        assert_eq!((*off, b), (k as u64, &body(8, k as u64)));
    }
    assert_eq!(append(&store, "Z", 0, 8, 30)?.queue_offset, 30);
    Ok(())
}

#[test]
fn a_deleted_queue_directory_is_rebuilt_not_restarted_at_zero() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..12 {
        append(&store, "Q", 3, 9, i)?;
        append(&store, "Other", 0, 9, i)?;
    }
    store.close()?;
    drop(store);
    std::fs::remove_dir_all(dir.path().join("consumequeue/Q"))?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.recovery_report().queues_rebuilt, 1);
    assert_eq!(read_all(&store, "Q", 3).len(), 12);
    assert_eq!(read_all(&store, "Other", 0).len(), 12);
    assert_eq!(append(&store, "Q", 3, 9, 12)?.queue_offset, 12);
    Ok(())
}

#[test]
fn a_deleted_topic_is_not_brought_back_by_a_rebuild() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..5 {
        append(&store, "Gone", 0, 10, i)?;
        append(&store, "Kept", 0, 10, i)?;
    }
    assert!(store.delete_topic("Gone")?);
    // Re-created after the delete: only what follows the delete counts.
    append(&store, "Gone", 0, 10, 100)?;
    store.close()?;
    drop(store);
    std::fs::remove_dir_all(dir.path().join("consumequeue/Kept"))?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.recovery_report().queues_rebuilt, 1);
    assert_eq!(read_all(&store, "Kept", 0).len(), 5);
    let gone = read_all(&store, "Gone", 0);
    assert_eq!(gone.len(), 1, "only the record written after the delete");
    assert_eq!(gone[0].1, body(10, 100));
    Ok(())
}

#[test]
fn a_damaged_last_record_after_a_clean_stop_is_never_served() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    let rs: Vec<_> = (0..10)
        .map(|i| append(&store, "L", 0, 11, i))
        .collect::<Result<_, _>>()?;
    store.close()?;
    drop(store);
    let last = &rs[9];
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    flip(&seg, last.phys_offset + u64::from(last.size) - 30)?;
    // Its offset was handed out: the store refuses to start rather than
    // serve the damage or give offset 9 to another message, and says where.
    match MessageStore::open(cfg) {
        Err(rokka_store::StoreError::BadFile { reason, .. }) => {
            assert!(reason.contains("L/0"), "{reason}");
        }
        Ok(s) => panic!(
            "opened; queue ends at {} and serves {} messages",
            s.max_offset("L", 0),
            read_all(&s, "L", 0).len()
        ),
        Err(e) => panic!("unexpected error {e}"),
    }
    Ok(())
}

#[test]
fn committed_offsets_past_the_recovered_end_are_pulled_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.checkpoint_interval_ms = 3_600_000;
    let store = MessageStore::open(cfg.clone())?;
    let rs: Vec<_> = (0..5)
        .map(|i| append(&store, "O", 0, 13, i))
        .collect::<Result<_, _>>()?;
    // A consumer committed up to 5; the crash then tears the last record,
    // so the recovered queue ends at 4.
    store.offsets().commit("g", "O", 0, 5, "meta");
    store.offsets().commit("h", "O", 0, 3, "");
    store.offsets().persist()?;
    drop(store);
    let seg = dir.path().join("commitlog").join(format!("{:020}", 0));
    zero(&seg, rs[4].phys_offset + 8, 16)?;
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.max_offset("O", 0), 4);
    let got = |g: &str| store.offsets().get(g, "O", 0).map(|o| (o.offset, o.metadata));
    assert_eq!(got("g"), Some((4, "meta".to_string())), "pulled back to the end");
    assert_eq!(got("h"), Some((3, String::new())), "offsets within the log are kept");
    Ok(())
}

#[test]
fn an_index_file_created_just_before_a_crash_is_dropped_not_fatal() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..10 {
        append(&store, "I", 0, 14, i)?;
    }
    drop(store); // crash
                 // A crash between creating the next IndexFile (allocated, all zeros) and
                 // writing its header (the crash test hit this once in CI).
    let idx = dir.path().join("index");
    let size = std::fs::read_dir(&idx)?
        .next()
        .ok_or("no index file")??
        .metadata()?
        .len();
    let f = std::fs::File::create(idx.join(format!("{:020}", 99_999_999u64)))?;
    f.set_len(size)?;
    drop(f);
    let store = MessageStore::open(cfg)?;
    assert_eq!(read_all(&store, "I", 0).len(), 10);
    assert_eq!(store.query_by_key("I", "key-3", 4, 0, i64::MAX).len(), 1);
    assert!(!idx.join(format!("{:020}", 99_999_999u64)).exists());
    Ok(())
}

/// A ConsumeQueue whose files are not what the store writes — an older
/// file cut short, a stray file among them — is set aside under
/// `damaged/` and rebuilt from the CommitLog: the store starts, and every
/// message keeps its offset (it refused to start before).
#[test]
fn a_queue_with_a_file_cut_short_or_a_stray_file_is_set_aside_and_rebuilt() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.consume_queue_entries_per_file = 8;
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..30 {
        append(&store, "W", 1, 9, i)?;
        append(&store, "S", 0, 9, i)?;
    }
    store.close()?;
    drop(store);
    // W/1's first file (entries 0..8, not the newest) cut to half.
    let first = dir.path().join("consumequeue/W/1/00000000000000000000");
    OpenOptions::new().write(true).open(&first)?.set_len(4 * 48)?;
    // S/0 gets a file that is no ConsumeQueue's.
    std::fs::write(dir.path().join("consumequeue/S/0/notes.txt"), b"hello")?;
    let store = MessageStore::open(cfg.clone())?;
    assert_eq!(store.recovery_report().queues_rebuilt, 2);
    for topic_queue in [("W", 1), ("S", 0)] {
        let all = read_all(&store, topic_queue.0, topic_queue.1);
        assert_eq!(all.len(), 30, "{topic_queue:?}");
        for (k, (off, b)) in all.iter().enumerate() {
            assert_eq!((*off, b), (k as u64, &body(9, k as u64)));
        }
    }
    assert_eq!(append(&store, "W", 1, 9, 30)?.queue_offset, 30);
    // What was set aside is kept for a look.
    assert!(dir
        .path()
        .join("damaged/consumequeue/W/1/00000000000000000000")
        .exists());
    assert!(dir.path().join("damaged/consumequeue/S/0/notes.txt").exists());
    store.close()?;
    drop(store);
    // And the next start is an ordinary one.
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.recovery_report().queues_rebuilt, 0);
    assert_eq!(read_all(&store, "W", 1).len(), 31);
    Ok(())
}

/// A start killed between setting a queue aside and checkpointing the
/// rebuild leaves `damaged/rebuild`: the next start rebuilds again, even
/// with no `queues.json` to miss the queue by.
#[test]
fn a_rebuild_cut_short_is_done_again_without_a_manifest() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..20 {
        append(&store, "R", 2, 9, i)?;
    }
    store.close()?;
    drop(store);
    // What the killed start left: the queue moved aside, the marker, and
    // (here) no manifest.
    std::fs::create_dir_all(dir.path().join("damaged/consumequeue/R"))?;
    std::fs::rename(
        dir.path().join("consumequeue/R/2"),
        dir.path().join("damaged/consumequeue/R/2"),
    )?;
    std::fs::write(dir.path().join("damaged/rebuild"), b"")?;
    std::fs::remove_file(dir.path().join("queues.json"))?;
    let store = MessageStore::open(cfg.clone())?;
    assert_eq!(read_all(&store, "R", 2).len(), 20);
    assert_eq!(append(&store, "R", 2, 9, 20)?.queue_offset, 20);
    assert!(
        !dir.path().join("damaged/rebuild").exists(),
        "cleared once checkpointed"
    );
    Ok(())
}

/// ConsumeQueue files all written with another
/// `consume_queue_entries_per_file` are a config change, refused with the
/// setting named — not damage to set aside and rebuild every queue from.
#[test]
fn another_entries_per_file_is_refused_not_set_aside() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.consume_queue_entries_per_file = 8;
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..20 {
        append(&store, "E", 0, 9, i)?;
    }
    store.close()?;
    drop(store);
    cfg.consume_queue_entries_per_file = 16;
    let err = MessageStore::open(cfg.clone())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("consume_queue_entries_per_file"), "{err}");
    assert!(!dir.path().join("damaged").exists(), "nothing set aside");
    // Set back, it starts with every message.
    cfg.consume_queue_entries_per_file = 8;
    let store = MessageStore::open(cfg)?;
    assert_eq!(read_all(&store, "E", 0).len(), 20);
    Ok(())
}

/// Power lost just after a queue moved into its next file, with write-back
/// having reached the new file's first page but not the previous file's
/// last entries (both past the checkpoint): the start finds the queue's
/// end at the hole, drops what follows it and re-dispatches the records
/// from the CommitLog, instead of refusing to start.
#[test]
fn a_queue_file_with_a_zero_tail_before_the_last_one_is_recovered() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.consume_queue_entries_per_file = 4;
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..2u64 {
        append(&store, "Z", 0, 1, i)?;
    }
    store.checkpoint()?;
    for i in 2..5u64 {
        append(&store, "Z", 0, 1, i)?;
    }
    // A crash: no close.
    drop(store);
    let file = dir.path().join("consumequeue/Z/0/00000000000000000000");
    zero(&file, 2 * 48, 2 * 48)?;
    let store = MessageStore::open(cfg)?;
    let all = read_all(&store, "Z", 0);
    assert_eq!(all.len(), 5);
    for (i, (_, b)) in all.iter().enumerate() {
        assert_eq!(*b, body(1, i as u64));
    }
    Ok(())
}
