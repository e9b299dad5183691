//! The store side of replication: a replica fed the master's raw entries
//! ends up with the same CommitLog positions and the same queues; an old
//! master that wrote past the new master's history truncates to their last
//! shared epoch and follows; the high watermark bounds what readers see; a
//! node that is not the master refuses client writes.

mod common;

use common::*;
use rokka_store::replication::divergence;
use rokka_store::{MessageStore, ReadStatus, StoreError};

/// Copies what `from` has past `to`'s end into `to`.
fn follow(from: &MessageStore, to: &MessageStore) -> rokka_store::Result<()> {
    while to.log_end() < from.log_end() {
        let Some(entries) = from.read_log(to.log_end(), 64 * 1024)? else {
            break;
        };
        to.append_replicated(&entries)?;
    }
    Ok(())
}

fn kafka_batch(store: &MessageStore, topic: &str, n: usize) -> rokka_store::Result<()> {
    let values: Vec<Vec<u8>> = (0..n).map(|i| vec![b'k'; 100 + i]).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| &v[..]).collect();
    let batch = rokka_store::record::kafka::build_test_batch(&refs, 1_700_000_000_000);
    store.append_kafka_batch(topic, 1, &batch).map(|_| ())
}

#[test]
fn a_replica_holds_the_same_log_and_queues_and_an_old_master_truncates_to_follow() -> TestResult {
    let (dm, dr) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let master = MessageStore::open(small_config(dm.path()))?;
    let replica = MessageStore::open(small_config(dr.path()))?;
    replica.set_leader(false);
    master.begin_epoch(1)?;
    // Several segments of RocketMQ messages and Kafka batches.
    for i in 0..1500u64 {
        append(&master, "T", (i % 3) as u32, 1, i)?;
        if i % 100 == 0 {
            kafka_batch(&master, "K", 5)?;
        }
    }
    assert!(master.segment_count() >= 3);
    follow(&master, &replica)?;
    replica.adopt_epochs(&master.epochs())?;
    assert_eq!(replica.log_end(), master.log_end());
    for (t, q) in [("T", 0), ("T", 1), ("T", 2), ("K", 1)] {
        assert_eq!(read_all(&replica, t, q), read_all(&master, t, q), "{t}/{q}");
    }
    // A replica takes no client writes.
    assert!(matches!(append(&replica, "T", 0, 1, 0), Err(StoreError::NotLeader)));

    // The master writes on without the replica (never acknowledged), then
    // the replica is elected under epoch 2 and writes its own.
    let shared_end = master.log_end();
    for i in 0..50u64 {
        append(&master, "T", 0, 2, i)?;
    }
    replica.set_leader(true);
    replica.begin_epoch(2)?;
    for i in 0..80u64 {
        append(&replica, "T", 0, 3, i)?;
    }
    // The old master comes back: it keeps what both hold and follows.
    let cut = divergence(&replica.epochs(), replica.log_end(), &master.epochs(), master.log_end());
    assert_eq!(cut, shared_end);
    master.set_leader(false);
    // Its own epoch closed the old master's writes: it follows again.
    assert!(master.truncate_log(cut).is_err());
    master.follow_master();
    master.truncate_log(cut)?;
    assert_eq!(master.log_end(), shared_end);
    follow(&replica, &master)?;
    master.adopt_epochs(&replica.epochs())?;
    assert_eq!(master.epochs(), replica.epochs());
    assert_eq!(read_all(&master, "T", 0), read_all(&replica, "T", 0));
    // And after a crash and a restart it is still the same.
    drop(master);
    let master = MessageStore::open(small_config(dm.path()))?;
    assert_eq!(master.log_end(), replica.log_end());
    assert_eq!(read_all(&master, "T", 0), read_all(&replica, "T", 0));
    assert_eq!(master.epochs(), replica.epochs());
    Ok(())
}

#[test]
fn readers_see_nothing_past_the_high_watermark() -> TestResult {
    let d = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(d.path()))?;
    let mut ends = Vec::new();
    for i in 0..10u64 {
        ends.push(append(&store, "T", 0, 1, i)?.end_offset);
    }
    store.set_high_watermark(Some(ends[3]));
    assert_eq!(store.max_offset("T", 0), 4);
    assert_eq!(read_all(&store, "T", 0).len(), 4);
    // Between the high watermark and the log end: nothing yet, not out of
    // range (a consumer there waits, as on a Kafka broker); past the log
    // end: out of range.
    let r = store.read("T", 0, 7, 32, 1 << 20);
    assert_eq!(
        (r.status, r.next_offset, r.entries.len()),
        (ReadStatus::NoNewMessages, 7, 0)
    );
    let r = store.read("T", 0, 11, 32, 1 << 20);
    assert_eq!((r.status, r.next_offset), (ReadStatus::OffsetOverflow, 4));
    store.set_high_watermark(None);
    assert_eq!(store.max_offset("T", 0), 10);
    Ok(())
}

#[test]
fn a_replicated_entry_that_would_land_elsewhere_is_refused() -> TestResult {
    let (dm, dr) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let master = MessageStore::open(small_config(dm.path()))?;
    let mut other = small_config(dr.path());
    other.commitlog_segment_bytes = 128 * 1024;
    let replica = MessageStore::open(other)?;
    for i in 0..1000u64 {
        append(&master, "T", 0, 1, i)?;
    }
    let err = follow(&master, &replica).err();
    assert!(
        matches!(&err, Some(StoreError::Config(why)) if why.contains("commitlog_segment_bytes")),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn acknowledgements_left_from_before_a_truncation_do_not_answer_new_writes() -> TestResult {
    let d = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(d.path()))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    store.require_replica_acks(Some(100));
    let mut ends = Vec::new();
    for i in 0..10u64 {
        ends.push(append(&store, "T", 0, 1, i)?.end_offset);
    }
    // The replicas held everything of the earlier term.
    store.set_acked(ends[9]);
    rt.block_on(store.durable(ends[9]))?;
    // Demoted, truncated, master again: the same positions are written anew.
    store.set_leader(false);
    store.truncate_log(ends[4])?;
    store.set_leader(true);
    let again = append(&store, "T", 0, 2, 0)?;
    assert!(again.end_offset <= ends[9]);
    assert!(
        matches!(
            rt.block_on(store.durable(again.end_offset)),
            Err(StoreError::ReplicationTimeout(100))
        ),
        "a write no replica holds must not be acknowledged"
    );
    Ok(())
}

/// A write waiting for its replicas on a master that loses its place is
/// answered at once (NotLeader: the client retries at the new master), not
/// at the end of its wait.
#[test]
fn a_deposed_master_answers_its_waiting_writes_at_once() -> TestResult {
    let d = tempfile::tempdir()?;
    let store = std::sync::Arc::new(MessageStore::open(small_config(d.path()))?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    store.require_replica_acks(Some(30_000));
    let end = append(&store, "T", 0, 1, 0)?.end_offset;
    let s = std::sync::Arc::clone(&store);
    let waiting = rt.spawn(async move { s.durable(end).await });
    std::thread::sleep(std::time::Duration::from_millis(100));
    store.set_leader(false);
    // (At the end of its wait it would be NotEnoughReplicas.)
    let r = rt.block_on(waiting)?;
    assert!(matches!(r, Err(StoreError::NotLeader)), "{r:?}");
    Ok(())
}

/// An epoch below the history's last is refused (writes under it would
/// share a number with another master's); the same epoch again is a no-op.
#[test]
fn an_epoch_below_the_history_is_refused() -> TestResult {
    let d = tempfile::tempdir()?;
    let s = MessageStore::open(small_config(d.path()))?;
    s.begin_epoch(3)?;
    s.begin_epoch(3)?;
    assert!(s.begin_epoch(1).is_err());
    assert_eq!(s.epochs().last().map(|e| e.epoch), Some(3));
    s.begin_epoch(4)?;
    assert_eq!(s.epochs().len(), 2);
    Ok(())
}

/// An epoch recorded before the log was flushed that far (power lost with
/// the tail): at the next open the history goes no further than the log
/// recovered, and an epoch begun then follows on in order — not a history
/// claiming records the log does not hold, which a rejoining replica's
/// comparison would read as shared.
#[test]
fn epochs_past_the_recovered_log_end_are_dropped_at_open() -> TestResult {
    let d = tempfile::tempdir()?;
    {
        let s = MessageStore::open(small_config(d.path()))?;
        s.begin_epoch(1)?;
        for i in 0..10u64 {
            append(&s, "T", 0, 1, i)?;
        }
    }
    let end = {
        let s = MessageStore::open(small_config(d.path()))?;
        s.log_end()
    };
    // As after a power loss: epoch 2 was recorded at a position the log
    // never reached on disk.
    let ahead = format!(r#"[{{"epoch":1,"start":0}},{{"epoch":2,"start":{}}}]"#, end + 4096);
    std::fs::write(d.path().join("epochs.json"), ahead)?;
    let s = MessageStore::open(small_config(d.path()))?;
    assert_eq!(
        s.epochs().iter().map(|e| (e.epoch, e.start)).collect::<Vec<_>>(),
        vec![(1, 0)]
    );
    s.begin_epoch(3)?;
    assert_eq!(
        s.epochs().iter().map(|e| (e.epoch, e.start)).collect::<Vec<_>>(),
        vec![(1, 0), (3, end)]
    );
    drop(s);
    let reopened = MessageStore::open(small_config(d.path()))?;
    assert_eq!(reopened.epochs().len(), 2, "the trimmed history is what is on disk");
    Ok(())
}

fn age_all_but_newest(dir: &std::path::Path, keep: usize) -> std::io::Result<()> {
    let mut segs: Vec<_> = std::fs::read_dir(dir.join("commitlog"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    segs.sort();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(100 * 3600);
    for p in &segs[..segs.len().saturating_sub(keep)] {
        std::fs::File::options().write(true).open(p)?.set_modified(old)?;
    }
    Ok(())
}

/// A master whose first segments retention deleted: a new replica, and
/// one that was away with an older prefix, cannot be sent what lies below
/// the master's start; each drops its log, continues at that start, and
/// then holds what the master holds — queues starting where the master's
/// do — also after a reopen.
#[test]
fn a_replica_behind_the_masters_start_restarts_its_log_there() -> TestResult {
    let (dm, dn, dp) = (tempfile::tempdir()?, tempfile::tempdir()?, tempfile::tempdir()?);
    let master = MessageStore::open(small_config(dm.path()))?;
    let stale = MessageStore::open(small_config(dp.path()))?;
    stale.set_leader(false);
    master.begin_epoch(1)?;
    for i in 0..600u64 {
        append(&master, "T", (i % 2) as u32, 4, i)?;
    }
    // A queue written only in the first segments: idle after them.
    for i in 0..30u64 {
        append(&master, "I", 0, 4, i)?;
    }
    follow(&master, &stale)?;
    stale.adopt_epochs(&master.epochs())?;
    for i in 600..3000u64 {
        append(&master, "T", (i % 2) as u32, 4, i)?;
    }
    kafka_batch(&master, "K", 3)?;
    master.checkpoint()?;
    age_all_but_newest(dm.path(), 2)?;
    assert!(master.run_retention()? > 0);
    let (start, _, _) = master.commitlog_offsets();
    assert!(start > stale.log_end(), "{start} vs {}", stale.log_end());
    // What the master cannot send: the stale replica's end is gone there.
    assert!(master.read_log(stale.log_end(), 1 << 16).is_err());
    let fresh = MessageStore::open(small_config(dn.path()))?;
    fresh.set_leader(false);
    for replica in [&fresh, &stale] {
        let continue_at = master.queue_offsets_at(start);
        if replica.log_end() > 0 {
            assert!(
                replica.restart_log_at(replica.log_end() - 1, &continue_at).is_err(),
                "below its end"
            );
        }
        replica.restart_log_at(start, &continue_at)?;
        assert_eq!(replica.log_end(), start);
        follow(&master, replica)?;
        replica.adopt_epochs(&master.epochs())?;
        assert_eq!(replica.log_end(), master.log_end());
        for (t, q) in [("T", 0), ("T", 1), ("K", 1), ("I", 0)] {
            assert_eq!(replica.min_offset(t, q), master.min_offset(t, q), "{t}/{q}");
            assert_eq!(replica.max_offset(t, q), master.max_offset(t, q), "{t}/{q}");
            assert_eq!(read_all(replica, t, q), read_all(&master, t, q), "{t}/{q}");
        }
    }
    // The idle queue's offsets do not go back: it ends where the master's does.
    assert_eq!(master.max_offset("I", 0), 30);
    assert_eq!(master.min_offset("I", 0), 30);
    // Reopened, the restarted log is what it was.
    let want = read_all(&stale, "T", 1);
    stale.close()?;
    drop(stale);
    let stale = MessageStore::open(small_config(dp.path()))?;
    assert_eq!(stale.log_end(), master.log_end());
    assert_eq!(read_all(&stale, "T", 1), want);
    assert_eq!((stale.min_offset("I", 0), stale.max_offset("I", 0)), (30, 30));
    // More for the idle queue lands where it continues.
    append(&master, "I", 0, 4, 30)?;
    stale.set_leader(false);
    follow(&master, &stale)?;
    assert_eq!(read_all(&stale, "I", 0), read_all(&master, "I", 0));
    assert_eq!(stale.max_offset("I", 0), 31);
    Ok(())
}

/// A restart of the log cut short by a crash (its marker left, the drop
/// half done) is finished at the next open: the store opens empty.
#[test]
fn a_restart_cut_short_is_finished_at_open() -> TestResult {
    let d = tempfile::tempdir()?;
    {
        let s = MessageStore::open(small_config(d.path()))?;
        for i in 0..1500u64 {
            append(&s, "T", (i % 2) as u32, 4, i)?;
        }
        s.close()?;
    }
    // The marker written, then the crash: segments and queues still there.
    std::fs::write(d.path().join("restarting"), b"999999")?;
    let s = MessageStore::open(small_config(d.path()))?;
    assert_eq!(s.log_end(), 0);
    assert_eq!(s.max_offset("T", 0), 0);
    assert!(!d.path().join("restarting").exists());
    append(&s, "T", 0, 4, 1)?;
    assert_eq!(s.max_offset("T", 0), 1);
    Ok(())
}

/// A log restarted at an offset and closed (or killed) before its first
/// entry opens again there, its queues where they continue.
#[test]
fn a_restarted_log_reopens_before_its_first_entry() -> TestResult {
    let d = tempfile::tempdir()?;
    let cfg = small_config(d.path());
    let start = 4 * cfg.commitlog_segment_bytes;
    let continue_at = std::collections::BTreeMap::from([("T/0".to_string(), 77u64)]);
    {
        let s = MessageStore::open(cfg.clone())?;
        s.set_leader(false);
        s.restart_log_at(start, &continue_at)?;
        s.close()?;
    }
    let s = MessageStore::open(cfg.clone())?;
    assert_eq!(s.log_end(), start);
    assert_eq!((s.min_offset("T", 0), s.max_offset("T", 0)), (77, 77));
    // Killed rather than closed (no clean checkpoint): the same.
    s.restart_log_at(start + cfg.commitlog_segment_bytes, &continue_at)?;
    drop(s);
    let _ = std::fs::write(d.path().join("abort"), b"");
    let s = MessageStore::open(cfg)?;
    assert_eq!(s.log_end(), start + small_config(d.path()).commitlog_segment_bytes);
    assert_eq!((s.min_offset("T", 0), s.max_offset("T", 0)), (77, 77));
    Ok(())
}

/// After a cut (a replica truncating its divergent tail), the records
/// written from the cut on are found by key — the index had seen offsets
/// past them and skipped them — and a clean stop right after the cut opens
/// without a full scan (its checkpoint named record 0 as the last).
#[test]
fn records_written_after_a_cut_are_indexed_and_a_clean_stop_after_it_needs_no_scan() -> TestResult {
    let d = tempfile::tempdir()?;
    let cfg = small_config(d.path());
    let store = MessageStore::open(cfg.clone())?;
    let mut ends = Vec::new();
    for i in 0..10u64 {
        ends.push(append(&store, "T", 0, 1, i)?.end_offset);
    }
    store.set_leader(false);
    store.truncate_log(ends[4])?;
    store.close()?;
    drop(store);
    let store = MessageStore::open(cfg.clone())?;
    assert!(
        store.recovery_report().clean,
        "a clean stop after the cut was recovered as unclean"
    );
    assert_eq!(read_all(&store, "T", 0).len(), 5);
    // Written anew where the cut records were: key-7 is new here.
    for i in 5..10u64 {
        append(&store, "T", 0, 2, i)?;
    }
    let found = store.query_by_key("T", "key-7", 16, 0, i64::MAX);
    assert_eq!(found.len(), 1, "a record written after the cut is not found by key");
    Ok(())
}

/// An old master deleted a topic in writes the new master never had; it
/// cuts its log to follow, and the new master's records of that topic come
/// at positions below the old tombstone. They stay, across a crash: the
/// cut lowers the tombstone to the cut (a start would otherwise drop them
/// as the deleted incarnation's).
#[test]
fn a_deletion_past_the_cut_does_not_drop_the_new_masters_records() -> TestResult {
    let (dm, dr) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let old = MessageStore::open(small_config(dm.path()))?;
    let new = MessageStore::open(small_config(dr.path()))?;
    new.set_leader(false);
    old.begin_epoch(1)?;
    for i in 0..20u64 {
        append(&old, "T", 0, 1, i)?;
    }
    follow(&old, &new)?;
    new.adopt_epochs(&old.epochs())?;
    let shared_end = old.log_end();
    // The old master writes on and deletes T (never replicated).
    for i in 0..200u64 {
        append(&old, "Other", 0, 2, i)?;
    }
    assert!(old.delete_topic("T")?);
    // The new master, elected, writes T on (far less than the old wrote).
    new.set_leader(true);
    new.begin_epoch(2)?;
    for i in 20..25u64 {
        append(&new, "T", 0, 1, i)?;
    }
    let cut = divergence(&new.epochs(), new.log_end(), &old.epochs(), old.log_end());
    assert_eq!(cut, shared_end);
    old.set_leader(false);
    old.follow_master();
    old.truncate_log(cut)?;
    follow(&new, &old)?;
    old.adopt_epochs(&new.epochs())?;
    // (The records below the cut that its own deletion dropped from its
    // queue are not indexed again: a deletion a cut undoes is not undone
    // here — left as a known gap.) What the new master wrote from the cut
    // on is there ...
    let before = read_all(&old, "T", 0);
    assert_eq!(before, read_all(&new, "T", 0)[20..].to_vec());
    // ... and still after a crash (no close) and a start.
    drop(old);
    let old = MessageStore::open(small_config(dm.path()))?;
    assert_eq!(read_all(&old, "T", 0), before);
    Ok(())
}

/// Whether the set's replicas hold an offset: always without acks to wait
/// for; with them, once the acknowledged end passes it.
#[test]
fn replicated_is_what_the_replicas_acknowledged() -> TestResult {
    let d = tempfile::tempdir()?;
    let s = MessageStore::open(small_config(d.path()))?;
    append(&s, "T", 0, 1, 0)?;
    let end = s.log_end();
    assert!(s.is_replicated(end));
    s.require_replica_acks(Some(50));
    assert!(!s.is_replicated(end));
    s.set_acked(end);
    assert!(s.is_replicated(end));
    append(&s, "T", 0, 1, 1)?;
    assert!(!s.is_replicated(s.log_end()));
    Ok(())
}
