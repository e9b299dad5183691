//! In-process tests of the store's public API: append, read, batches,
//! queries, reopen, sync flush.

mod common;

use std::sync::Arc;

use common::*;
use rokka_store::record::kafka::build_test_batch;
use rokka_store::record::properties;
use rokka_store::{msgid, Entry, FlushMode, MessageInput, MessageStore, ReadStatus, StoreError};

#[test]
fn append_read_roll_and_reopen_cleanly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..2000u64 {
        let r = append(&store, "T", (i % 3) as u32, 1, i)?;
        assert_eq!(r.queue_offset, i / 3);
        // Readable as soon as the append returns.
        let got = store.read("T", (i % 3) as u32, r.queue_offset, 1, 1 << 20);
        assert_eq!(got.status, ReadStatus::Found);
    }
    assert!(store.segment_count() > 3, "segments rolled: {}", store.segment_count());
    let before: Vec<_> = (0..3).map(|q| read_all(&store, "T", q)).collect();
    assert_eq!(before.iter().map(Vec::len).sum::<usize>(), 2000);
    for q in 0..3u32 {
        for (k, (off, b)) in before[q as usize].iter().enumerate() {
            assert_eq!(*off, k as u64);
            assert_eq!(*b, body(1, k as u64 * 3 + u64::from(q)));
        }
    }
    store.close()?;
    drop(store);
    // The abort marker is gone after a clean close.
    assert!(!dir.path().join("abort").exists());
    let store = MessageStore::open(cfg)?;
    let after: Vec<_> = (0..3).map(|q| read_all(&store, "T", q)).collect();
    assert_eq!(before, after);
    // Appends continue at the right offsets.
    let r = append(&store, "T", 0, 1, 9999)?;
    assert_eq!(r.queue_offset, 667);
    Ok(())
}

#[test]
fn read_statuses_and_limits() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    assert_eq!(store.read("none", 0, 0, 10, 1000).status, ReadStatus::NoSuchQueue);
    for i in 0..10 {
        append(&store, "T", 0, 2, i)?;
    }
    assert_eq!(store.read("T", 0, 10, 10, 1 << 20).status, ReadStatus::NoNewMessages);
    assert_eq!(store.read("T", 0, 11, 10, 1 << 20).status, ReadStatus::OffsetOverflow);
    let r = store.read("T", 0, 2, 3, 1 << 20);
    assert_eq!(r.entries.len(), 3);
    assert_eq!(r.next_offset, 5);
    assert_eq!((r.min_offset, r.max_offset), (0, 10));
    // max_bytes smaller than one message still returns one.
    let r = store.read("T", 0, 0, 10, 1);
    assert_eq!(r.entries.len(), 1);
    Ok(())
}

#[test]
fn kafka_batches_take_count_offsets_and_interleave_with_messages() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    let b1 = build_test_batch(&[b"a", b"b", b"c"], 1_000);
    let r1 = store.append_kafka_batch("K", 0, &b1)?;
    assert_eq!((r1.queue_offset, r1.count), (0, 3));
    let r2 = append(&store, "K", 0, 3, 0)?;
    assert_eq!(r2.queue_offset, 3);
    let b2 = build_test_batch(&[b"d", b"e"], 2_000);
    let r3 = store.append_kafka_batch("K", 0, &b2)?;
    assert_eq!((r3.queue_offset, r3.count), (4, 2));
    assert_eq!(store.max_offset("K", 0), 6);
    // A read from the middle of a batch returns the whole batch.
    let r = store.read("K", 0, 1, 100, 1 << 20);
    assert_eq!(r.entries.len(), 3);
    assert_eq!(r.entries[0].cq.base_offset, 0);
    match r.entries[2].decode()? {
        Entry::KafkaBatch(k) => {
            assert_eq!(k.info()?.base_offset, 4);
            assert_eq!(&k.batch[8..], &b2[8..]);
            assert!(rokka_store::record::kafka::batch_crc_ok(&k.batch));
        }
        other => panic!("expected a Kafka batch, got {other:?}"),
    }
    assert_eq!(store.read("K", 0, 5, 1, 1 << 20).entries[0].cq.base_offset, 4);
    // Not a batch: refused.
    assert!(matches!(
        store.append_kafka_batch("K", 0, b"short"),
        Err(StoreError::InvalidBatch(_))
    ));
    store.close()?;
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.max_offset("K", 0), 6);
    assert_eq!(store.read("K", 0, 5, 1, 1 << 20).entries[0].cq.base_offset, 4);
    Ok(())
}

#[test]
fn query_by_key_and_message_id() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    let mut phys = Vec::new();
    for i in 0..50 {
        phys.push(append(&store, "Q", 0, 4, i)?.phys_offset);
    }
    let hits = store.query_by_key("Q", "key-7", 32, 0, i64::MAX);
    assert_eq!(hits.len(), 1);
    let Entry::Message(m) = rokka_store::decode_entry(&hits[0])? else {
        panic!("not a message")
    };
    assert_eq!(m.body.to_vec(), body(4, 7));
    assert_eq!(store.query_by_key("Q", "all", 32, 0, i64::MAX).len(), 32);
    assert_eq!(
        store.query_by_key("Q", "UNIQ0000000000000009", 32, 0, i64::MAX).len(),
        1
    );
    assert!(store.query_by_key("Other", "key-7", 32, 0, i64::MAX).is_empty());
    assert!(store.query_by_key("Q", "key-7", 32, 0, 1000).is_empty());
    // Offset message ids resolve to the record.
    let id = msgid::message_id(store.config().store_host, phys[9]);
    let (host, p) = msgid::parse_message_id(&id).ok_or("bad id")?;
    assert_eq!(host, store.config().store_host);
    let rec = store.read_at(p).ok_or("no record")?;
    let Entry::Message(m) = rokka_store::decode_entry(&rec)? else {
        panic!("not a message")
    };
    assert_eq!(m.body.to_vec(), body(4, 9));
    // An offset inside a record is not a record.
    assert!(store.read_at(phys[9] + 1).is_none());
    Ok(())
}

#[test]
fn bad_input_is_refused_cleanly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    let big = vec![0u8; 64 * 1024 + 1];
    let err = store.append_message(&MessageInput::new("T", 0, &big, b"")).err();
    assert!(matches!(err, Some(StoreError::MessageTooLarge { .. })));
    let err = store.append_message(&MessageInput::new("../x", 0, b"a", b"")).err();
    assert!(matches!(err, Some(StoreError::InvalidTopic(_))));
    let props = "x".repeat(40_000);
    let err = store
        .append_message(&MessageInput::new("T", 0, b"a", props.as_bytes()))
        .err();
    assert!(matches!(err, Some(StoreError::PropertiesTooLarge(_))));
    // A second open of the same directory is refused.
    let err = MessageStore::open(small_config(dir.path())).err();
    assert!(matches!(err, Some(StoreError::Locked(_))));
    store.close()?;
    assert!(matches!(append(&store, "T", 0, 0, 0), Err(StoreError::ShutDown)));
    Ok(())
}

#[test]
fn prepared_transactions_take_no_offset() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    let mut m = MessageInput::new("TX", 0, b"half", b"");
    m.sys_flag = rokka_store::record::message::sysflag::TRANSACTION_PREPARED;
    let r = store.append_message(&m)?;
    assert_eq!((r.queue_offset, r.count), (0, 0));
    assert_eq!(store.max_offset("TX", 0), 0);
    assert!(store.read_at(r.phys_offset).is_some());
    Ok(())
}

#[test]
fn sync_flush_group_commit_with_concurrent_appenders() -> TestResult {
    for depth in [1, 3] {
        group_commit_with_concurrent_appenders(depth)?;
    }
    Ok(())
}

fn group_commit_with_concurrent_appenders(depth: usize) -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.flush_mode = FlushMode::Sync;
    cfg.sync_flush_depth = depth;
    let store = Arc::new(MessageStore::open(cfg)?);
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let s = Arc::clone(&store);
            std::thread::spawn(move || -> rokka_store::Result<()> {
                for i in 0..200u64 {
                    let r = append(&s, "S", t, 5, i)?;
                    s.wait_durable(r.end_offset)?;
                    let (_, _, flushed) = s.commitlog_offsets();
                    assert!(flushed >= r.end_offset);
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "appender panicked")??;
    }
    for t in 0..8 {
        assert_eq!(store.max_offset("S", t), 200);
    }
    // The async form, from a runtime.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let r = append(&store, "S", 0, 5, 1000)?;
    rt.block_on(store.durable(r.end_offset))?;
    assert!(store.commitlog_offsets().2 >= r.end_offset);
    // Many tasks on two workers, as the frontends wait: each is woken only
    // once what it appended is on disk, and every one of them is.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let syncs_before = store.flush_count();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..64u32 {
            let s = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                for i in 0..50u64 {
                    let r = append(&s, "A", t % 8, 7, i)?;
                    s.durable(r.end_offset).await?;
                    let (_, _, flushed) = s.commitlog_offsets();
                    assert!(flushed >= r.end_offset, "woken at {flushed} before {}", r.end_offset);
                }
                Ok::<(), rokka_store::StoreError>(())
            }));
        }
        for t in tasks {
            t.await.map_err(|_| rokka_store::StoreError::ShutDown)??;
        }
        Ok::<(), rokka_store::StoreError>(())
    })?;
    let syncs = store.flush_count() - syncs_before;
    assert!(
        syncs > 0 && syncs < 64 * 50,
        "{syncs} syncs for 3200 appends: no group commit"
    );
    for q in 0..8 {
        assert_eq!(store.max_offset("A", q), 400);
    }
    Ok(())
}

#[test]
fn consumer_offsets_survive_restart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    store.offsets().commit("g", "T", 3, 42, "meta");
    store.close()?;
    drop(store);
    let store = MessageStore::open(cfg)?;
    let o = store.offsets().get("g", "T", 3).ok_or("offset lost")?;
    assert_eq!((o.offset, o.metadata.as_str()), (42, "meta"));
    Ok(())
}

#[test]
fn tag_codes_are_stored_in_the_consume_queue() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    let p = properties::encode([("TAGS", "TagA")]);
    store.append_message(&MessageInput::new("T", 0, b"x", p.as_bytes()))?;
    store.append_message(&MessageInput::new("T", 0, b"y", b""))?;
    let r = store.read("T", 0, 0, 10, 1 << 20);
    assert_eq!(
        r.entries[0].cq.tag_code,
        i64::from(properties::java_string_hash(b"TagA"))
    );
    assert_eq!(r.entries[1].cq.tag_code, 0);
    Ok(())
}

#[test]
fn time_lookups() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(small_config(dir.path()))?;
    let mut m = MessageInput::new("TS", 0, b"a", b"");
    m.born_timestamp = 100;
    store.append_message(&m)?;
    let t1 = rokka_store::now_ms();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let t2 = rokka_store::now_ms();
    m.born_timestamp = 200;
    store.append_message(&m)?;
    assert_eq!(store.offset_by_store_time("TS", 0, 0), 0);
    assert_eq!(store.offset_by_store_time("TS", 0, t2), 1);
    assert!(store.offset_by_store_time("TS", 0, t1) <= 1);
    assert_eq!(store.offset_by_store_time("TS", 0, i64::MAX), 2);
    let q = store.queue("TS", 0).ok_or("no queue")?;
    assert_eq!(q.entry_by_msg_time(150).map(|e| e.base_offset), Some(1));
    assert_eq!(q.entry_by_msg_time(201), None);
    Ok(())
}

#[test]
fn deleted_topics_stay_deleted_across_restarts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..20 {
        append(&store, "gone", (i % 2) as u32, 1, i)?;
        append(&store, "kept", 0, 1, i)?;
    }
    assert!(store.delete_topic("gone")?);
    assert!(!store.delete_topic("gone")?);
    assert_eq!(store.read("gone", 0, 0, 10, 1 << 20).status, ReadStatus::NoSuchQueue);
    // Re-created, it starts again at 0.
    assert_eq!(append(&store, "gone", 0, 1, 100)?.queue_offset, 0);
    assert!(store.delete_topic("gone")?);
    drop(store); // unclean
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.topics(), vec!["kept".to_string()]);
    assert_eq!(store.max_offset("kept", 0), 20);
    Ok(())
}

#[test]
fn preallocated_segments_survive_clean_and_unclean_restarts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.preallocate = true;
    for round in 0..4u64 {
        let store = MessageStore::open(cfg.clone())?;
        for i in 0..700 {
            let r = append(&store, "P", 0, round, i)?;
            assert_eq!(r.queue_offset, round * 700 + i);
        }
        // Let the allocator prepare the next segment before stopping.
        std::thread::sleep(std::time::Duration::from_millis(200));
        if round % 2 == 0 {
            store.close()?;
        }
        drop(store);
    }
    let store = MessageStore::open(cfg)?;
    let all = read_all(&store, "P", 0);
    assert_eq!(all.len(), 2800);
    for (k, (off, b)) in all.iter().enumerate() {
        assert_eq!(*off, k as u64);
        assert_eq!(*b, body(k as u64 / 700, k as u64 % 700));
    }
    Ok(())
}

#[test]
fn delete_records_raises_the_start_and_survives_restarts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(dir.path());
    let store = MessageStore::open(cfg.clone())?;
    for i in 0..10 {
        append(&store, "D", 0, 1, i)?;
    }
    let b = build_test_batch(&[b"a", b"b", b"c"], 5);
    store.append_kafka_batch("D", 0, &b)?; // offsets 10..13
    assert_eq!(store.delete_records("D", 0, 4)?, 4);
    assert_eq!(store.read("D", 0, 3, 10, 1 << 20).status, ReadStatus::OffsetMoved);
    assert_eq!(store.read("D", 0, 4, 1, 1 << 20).entries[0].cq.base_offset, 4);
    // Inside a batch: the start is mid-batch, the read returns the batch.
    assert_eq!(store.delete_records("D", 0, 11)?, 11);
    assert_eq!(store.delete_records("D", 0, 2)?, 11, "never lowered");
    let r = store.read("D", 0, 11, 10, 1 << 20);
    assert_eq!(r.entries[0].cq.base_offset, 10);
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(store.min_offset("D", 0), 11);
    assert_eq!(store.delete_records("D", 0, 99)?, 13, "clamped to the end");
    // Deleting the topic drops its starts: made again under the name, it
    // starts at 0, also after a restart.
    let version = store.log_starts_changes();
    assert!(store.delete_topic("D")?);
    assert!(store.log_starts_changes() > version);
    assert_eq!(store.log_starts().0.get("D/0"), None);
    for i in 0..3 {
        append(&store, "D", 0, 1, i)?;
    }
    assert_eq!(store.min_offset("D", 0), 0);
    drop(store);
    let store = MessageStore::open(small_config(dir.path()))?;
    assert_eq!(store.min_offset("D", 0), 0);
    assert_eq!(store.read("D", 0, 0, 10, 1 << 20).entries.len(), 3);
    Ok(())
}

/// Appends made on runtime tasks (as the frontends make them, not wrapped
/// in a hand-off) roll segments and make queue and index files on the way:
/// the store offloads those steps itself, on a multi-threaded runtime, and
/// simply runs them on a current-thread one (where a hand-off would panic).
#[test]
fn appends_on_runtime_tasks_roll_segments_and_make_files() -> TestResult {
    for multi in [true, false] {
        let dir = tempfile::tempdir()?;
        let mut cfg = small_config(dir.path());
        cfg.preallocate = true;
        cfg.prefault_window_bytes = 1 << 20;
        let store = Arc::new(MessageStore::open(cfg)?);
        let rt = if multi {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?
        } else {
            tokio::runtime::Builder::new_current_thread().enable_all().build()?
        };
        let body = vec![0x42u8; 2048];
        rt.block_on(async {
            let mut tasks = Vec::new();
            for t in 0..4u32 {
                let s = Arc::clone(&store);
                let body = body.clone();
                tasks.push(tokio::spawn(async move {
                    for i in 0..2500u32 {
                        let key = format!("k{t}-{i}");
                        let props = rokka_store::record::properties::encode([("KEYS", key.as_str())]);
                        s.append_message(&MessageInput::new("R", t, &body, props.as_bytes()))?;
                        if i % 100 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    Ok::<(), rokka_store::StoreError>(())
                }));
            }
            for t in tasks {
                t.await.map_err(|_| rokka_store::StoreError::ShutDown)??;
            }
            Ok::<(), rokka_store::StoreError>(())
        })?;
        assert!(store.segment_count() >= 4, "{} segments", store.segment_count());
        for q in 0..4 {
            assert_eq!(store.max_offset("R", q), 2500);
        }
        drop(rt);
        Arc::try_unwrap(store).map_err(|_| "store still shared")?.close()?;
    }
    Ok(())
}

/// A message's KEYS tokens past `index_max_keys_per_message` are not
/// indexed (a client's thousands of tokens were thousands of index writes
/// per message under the writer lock); the first ones are found.
#[test]
fn keys_past_the_per_message_cap_are_not_indexed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.index_max_keys_per_message = 8;
    let store = MessageStore::open(cfg)?;
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let props = rokka_store::record::properties::encode([("KEYS", keys.join(" ").as_str()), ("UNIQ_KEY", "U1")]);
    store.append_message(&rokka_store::MessageInput::new("K", 0, b"body", props.as_bytes()))?;
    assert_eq!(store.query_by_key("K", "k0", 10, 0, i64::MAX).len(), 1);
    assert_eq!(store.query_by_key("K", "k7", 10, 0, i64::MAX).len(), 1);
    assert!(
        store.query_by_key("K", "k8", 10, 0, i64::MAX).is_empty(),
        "past the cap"
    );
    assert_eq!(
        store.query_by_key("K", "U1", 10, 0, i64::MAX).len(),
        1,
        "the unique id always"
    );
    Ok(())
}
