//! Partition count is not file-descriptor count: with a soft limit of 256
//! open files, a store takes 2,000 queues (each with its ConsumeQueue file)
//! and still opens files after. (Its own process: the limit is per process.)

mod common;

use common::*;
use rokka_store::MessageStore;

#[test]
fn thousands_of_queue_files_under_a_small_descriptor_limit() -> TestResult {
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    rlimit::setrlimit(rlimit::Resource::NOFILE, 256, hard)?;
    let dir = tempfile::tempdir()?;
    let mut cfg = small_config(dir.path());
    cfg.consume_queue_entries_per_file = 64;
    let store = MessageStore::open(cfg.clone())?;
    for q in 0..2_000u32 {
        append(&store, &format!("T{}", q % 40), q, 1, u64::from(q))?;
    }
    // Descriptors are still there for everything else.
    let probe = std::fs::File::open(dir.path().join("checkpoint"))?;
    drop(probe);
    store.close()?;
    drop(store);
    let store = MessageStore::open(cfg)?;
    assert_eq!(read_all(&store, "T7", 7).len(), 1);
    assert_eq!(store.topics().len(), 40);
    Ok(())
}
