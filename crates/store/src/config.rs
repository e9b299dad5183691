//! Store configuration: every key has a default and is documented in
//! `config/rokka.toml` under `[store]`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// When an append counts as durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// Appends return once written to the mapped segment; a background task
    /// flushes every `flush_interval_ms`.
    Async,
    /// `wait_durable` returns only after an fdatasync that covers the append;
    /// concurrent appends share one sync (group commit).
    Sync,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Root of all store files.
    pub data_dir: PathBuf,
    /// Size of each CommitLog segment in bytes.
    pub commitlog_segment_bytes: u64,
    /// Entries per ConsumeQueue file (48 bytes each).
    pub consume_queue_entries_per_file: u32,
    /// Build the IndexFile (keys and unique message ids).
    pub index_enabled: bool,
    /// Hash slots per IndexFile.
    pub index_slots: u32,
    /// Index entries per IndexFile.
    pub index_entries: u32,
    /// Most KEYS tokens of one message indexed (space-separated; the rest
    /// are not found by key): a client's KEYS of thousands of tokens made
    /// thousands of index writes under the writer lock per message.
    pub index_max_keys_per_message: u32,
    /// `async` or `sync`.
    pub flush_mode: FlushMode,
    /// Async mode: how often the CommitLog is flushed.
    pub flush_interval_ms: u64,
    /// Sync mode: how long an append waits for its flush before FlushTimeout.
    pub sync_flush_timeout_ms: u64,
    /// Sync mode: how many group-commit syncs may be in flight at once
    /// (appenders woken by one sync fill the next while it runs).
    pub sync_flush_depth: usize,
    /// Sync mode: the longest a group commit waits for the producers recent
    /// syncs served to append again (a third of a recent sync's time, at
    /// least 200 µs, at most this; 0 = a sync never waits), µs.
    pub sync_gather_max_us: u64,
    /// How often ConsumeQueues and index are flushed and the checkpoint written.
    pub checkpoint_interval_ms: u64,
    /// Largest message body (or Kafka batch) accepted.
    pub max_message_bytes: u32,
    /// Prepare the next CommitLog segment ahead of time and keep pages
    /// faulted in ahead of the writer.
    pub preallocate: bool,
    /// With `preallocate`: how many bytes ahead of the write position are
    /// kept faulted in (a sliding window, never whole segments).
    pub prefault_window_bytes: u64,
    /// Segments whose last write is older than this are deleted.
    pub retention_hours: u64,
    /// Cap on the CommitLog's total size; oldest segments go first (0 = none).
    pub retention_max_bytes: u64,
    /// Above this use of the data directory's file system, the oldest segments
    /// are deleted even if not expired (0 = off).
    pub disk_max_used_percent: u8,
    /// Above this use of the data directory's file system no new CommitLog
    /// segment is started, so appends are refused (DiskFull) before the disk
    /// is full (0 = off). Above `disk_max_used_percent`, which retention
    /// acts on first (RocketMQ's diskSpaceWarningLevelRatio, 90 %).
    pub disk_refuse_writes_percent: u8,
    /// How often retention runs.
    pub retention_check_interval_ms: u64,
    /// Address written into every record as its store host; message ids derive
    /// from it. Should be the broker's advertised address.
    pub store_host: SocketAddr,
    /// How often changed consumer offsets are persisted.
    pub offsets_flush_interval_ms: u64,
    /// Most (group, topic, queue) committed offsets kept (0 = no limit):
    /// group names come from clients, and the table is held in memory and
    /// rewritten whole. A commit that would add an entry beyond it is
    /// refused; commits to existing entries always succeed.
    pub max_committed_offsets: u64,
    /// Most bytes the committed-offset table may hold, about (names,
    /// metadata and a per-entry overhead; 0 = no limit): a client commit
    /// that would grow it past this is refused as one past
    /// `max_committed_offsets` is.
    pub max_committed_offset_bytes: u64,
    /// Check every entry a read returns (CRC, and that it is the record its
    /// ConsumeQueue entry points at: topic, queue, offset, position); a
    /// damaged entry is never served.
    pub verify_reads: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            data_dir: PathBuf::from("./data"),
            commitlog_segment_bytes: 1 << 30,
            consume_queue_entries_per_file: 300_000,
            index_enabled: true,
            index_slots: 5_000_000,
            index_entries: 20_000_000,
            index_max_keys_per_message: 64,
            flush_mode: FlushMode::Async,
            flush_interval_ms: 500,
            sync_flush_timeout_ms: 5_000,
            sync_flush_depth: 1,
            sync_gather_max_us: 5_000,
            checkpoint_interval_ms: 1_000,
            max_message_bytes: 4 * 1024 * 1024,
            preallocate: true,
            prefault_window_bytes: 32 << 20,
            retention_hours: 72,
            retention_max_bytes: 0,
            disk_max_used_percent: 85,
            disk_refuse_writes_percent: 95,
            retention_check_interval_ms: 10_000,
            store_host: SocketAddr::from(([127, 0, 0, 1], 10911)),
            offsets_flush_interval_ms: 5_000,
            max_committed_offsets: 1_000_000,
            max_committed_offset_bytes: 512 << 20,
            verify_reads: true,
        }
    }
}

impl StoreConfig {
    /// The largest entry the CommitLog may hold: an entry never spans two
    /// segments, and `max_message_bytes` (plus its header) may have been
    /// higher when older entries were written. What recovery, a replica
    /// and `rokka store check` bound an entry by; a client-named offset
    /// (a message id) is read within today's `max_message_bytes` instead.
    pub fn max_stored_entry(&self) -> usize {
        (self.commitlog_segment_bytes as usize).max(self.max_message_bytes as usize + 64 * 1024)
    }

    /// Checks values that serde's types alone cannot.
    pub fn validate(&self) -> Result<(), StoreError> {
        let min_segment = u64::from(self.max_message_bytes) + 64 * 1024;
        if self.commitlog_segment_bytes < min_segment {
            return Err(StoreError::Config(format!(
                "commitlog_segment_bytes ({}) must be at least max_message_bytes + 64 KiB ({min_segment})",
                self.commitlog_segment_bytes
            )));
        }
        if self.commitlog_segment_bytes > i64::MAX as u64 / 2 {
            return Err(StoreError::Config("commitlog_segment_bytes is too large".into()));
        }
        if self.preallocate && self.prefault_window_bytes < 4096 {
            return Err(StoreError::Config(
                "prefault_window_bytes must be at least 4096 with preallocate".into(),
            ));
        }
        if !(1..=16).contains(&self.sync_flush_depth) {
            return Err(StoreError::Config("sync_flush_depth must be 1..=16".into()));
        }
        if self.sync_gather_max_us > 1_000_000 {
            return Err(StoreError::Config(
                "sync_gather_max_us must be at most 1000000 (1 s)".into(),
            ));
        }
        if self.consume_queue_entries_per_file < 2 {
            return Err(StoreError::Config(
                "consume_queue_entries_per_file must be at least 2".into(),
            ));
        }
        if self.index_enabled && self.index_max_keys_per_message == 0 {
            return Err(StoreError::Config("index_max_keys_per_message must be > 0".into()));
        }
        if self.index_enabled && (self.index_slots == 0 || self.index_entries < 2) {
            return Err(StoreError::Config(
                "index_slots must be > 0 and index_entries >= 2".into(),
            ));
        }
        if self.disk_max_used_percent > 100 || self.disk_refuse_writes_percent > 100 {
            return Err(StoreError::Config(
                "disk_max_used_percent and disk_refuse_writes_percent must be 0..=100".into(),
            ));
        }
        for (name, v) in [
            ("flush_interval_ms", self.flush_interval_ms),
            ("checkpoint_interval_ms", self.checkpoint_interval_ms),
            ("retention_check_interval_ms", self.retention_check_interval_ms),
            ("offsets_flush_interval_ms", self.offsets_flush_interval_ms),
        ] {
            if v == 0 {
                return Err(StoreError::Config(format!("{name} must be > 0")));
            }
        }
        Ok(())
    }

    /// A configuration for tests: small files, quick timers.
    pub fn for_tests(data_dir: impl Into<PathBuf>) -> Self {
        StoreConfig {
            data_dir: data_dir.into(),
            commitlog_segment_bytes: 4 * 1024 * 1024 + 64 * 1024,
            consume_queue_entries_per_file: 1024,
            index_slots: 4096,
            index_entries: 16_384,
            flush_interval_ms: 50,
            checkpoint_interval_ms: 100,
            max_message_bytes: 4 * 1024 * 1024,
            retention_check_interval_ms: 60_000,
            offsets_flush_interval_ms: 100,
            preallocate: false,
            // Tests share the machine's disk with the build; how full it is
            // is not what they test (tests/faults.rs turns the guards on).
            disk_max_used_percent: 0,
            disk_refuse_writes_percent: 0,
            ..StoreConfig::default()
        }
    }
}
