//! Rokka's durable store, laid out like RocketMQ's `DefaultMessageStore`:
//!
//! * [`commitlog`] — one append stream of entries over mmap'd segments:
//!   RocketMQ message records ([`record::message`]) and whole Kafka record
//!   batches ([`record::kafka`]), with BLANK fillers at segment ends.
//! * [`consume_queue`] — per (topic, queue) index: logical offset → entry.
//! * [`index`] — IndexFile: `topic#key` / unique id → offsets, by time.
//! * [`checkpoint`] + the abort marker — what recovery can trust.
//! * [`offsets`] — the committed-offset table both protocols share.
//! * [`MessageStore`] — ties them together: append with synchronous dispatch,
//!   flush (async interval or sync group commit), recovery, retention.
//!
//! The CommitLog is the only source of truth; ConsumeQueues and the index are
//! rebuilt from it after a crash.

pub mod check;
pub mod checkpoint;
pub mod commitlog;
pub mod compacted;
pub mod config;
pub mod consume_queue;
pub mod error;
pub mod fault;
pub mod hot_metrics;
pub mod index;
mod log_every;
mod manifest;
mod mapped;
mod metrics;
pub mod msgid;
pub mod offsets;
pub mod record;
mod recovery;
pub mod replication;
mod store;
pub mod sys;
mod tasks;

pub use config::{FlushMode, StoreConfig};
pub use consume_queue::CqEntry;
pub use error::{Result, StoreError};
pub use log_every::LogEvery;
pub use offsets::{CommittedOffset, ConsumerOffsets};
pub use record::{decode_entry, Entry, KafkaBatchView, MessageInput, MessageView};
pub use store::{AppendResult, DirtyRange, MessageStore, QueueRead, ReadEntry, ReadStatus, RecoveryReport};

use std::ffi::OsStr;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Runs `f`, which may block on the disk (creating a file, starting a
/// CommitLog segment), without stalling the async tasks that share its
/// runtime worker: on a multi-threaded tokio runtime the worker hands its
/// other tasks off first (`block_in_place`); elsewhere (a plain thread, a
/// current-thread runtime) it simply runs. The store calls it around its
/// own slow steps, so the frontends can append on their tasks and pay the
/// hand-off (a thread wake-up and two context switches, ~30 % of the
/// broker's CPU on small remoting sends, docs/benchmarks.md) only when a
/// step may block, not on every append.
pub fn offload<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A store file name: `n` as 20 zero-padded digits.
pub(crate) fn file_name(n: u64) -> String {
    format!("{n:020}")
}

/// Parses a 20-digit store file name.
pub(crate) fn parse_file_name(name: &OsStr) -> Option<u64> {
    let s = name.to_str()?;
    if s.len() != 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Longest topic name accepted (RocketMQ allows 127 bytes with v1 records and
/// more with v2; Kafka 249).
pub const MAX_TOPIC_LEN: usize = 255;

/// Topic names double as directory names: ASCII letters, digits and `._-%|`,
/// not `.` or `..`, at most [`MAX_TOPIC_LEN`] bytes.
pub fn validate_topic(topic: &str) -> Result<()> {
    let ok = !topic.is_empty()
        && topic.len() <= MAX_TOPIC_LEN
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'%' | b'|'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidTopic(topic.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_topics() {
        assert_eq!(file_name(1_073_741_824), "00000000001073741824");
        assert_eq!(parse_file_name(OsStr::new("00000000001073741824")), Some(1_073_741_824));
        assert_eq!(parse_file_name(OsStr::new("0000000000107374182")), None);
        assert_eq!(parse_file_name(OsStr::new("0000000000107374182x")), None);
        assert!(validate_topic("TopicTest").is_ok());
        assert!(validate_topic("%RETRY%group-1").is_ok());
        assert!(validate_topic("a.b_c").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "ä"] {
            assert!(validate_topic(bad).is_err(), "{bad:?}");
        }
        assert!(validate_topic(&"x".repeat(256)).is_err());
    }
}
