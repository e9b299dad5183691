//! The store's one error type. Frontends map these to their wire codes.

use std::path::PathBuf;

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error on a named file.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file in the data directory that the store did not write, or whose
    /// content or size makes no sense. The store refuses to start rather than
    /// silently dropping data.
    #[error("foreign or damaged file {path}: {reason}")]
    BadFile { path: PathBuf, reason: String },
    /// The data directory is in use by another process.
    #[error("data directory {0} is locked by another process")]
    Locked(PathBuf),
    /// A message is larger than `max_message_bytes`.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge { size: usize, limit: usize },
    /// Encoded properties are longer than RocketMQ's 32767-byte limit.
    #[error("properties of {0} bytes exceed 32767 bytes")]
    PropertiesTooLarge(usize),
    /// A topic name that is empty, too long or has characters we do not allow.
    #[error("invalid topic name {0:?}")]
    InvalidTopic(String),
    /// A Kafka record batch that is too short or not magic v2.
    #[error("invalid record batch: {0}")]
    InvalidBatch(&'static str),
    /// A sync append was written but not flushed within `sync_flush_timeout_ms`.
    #[error("flush did not complete within {0} ms")]
    FlushTimeout(u64),
    /// The store was closed.
    #[error("store is shut down")]
    ShutDown,
    /// A write-back to disk failed. The kernel may already have dropped the
    /// pages it could not write, so a later sync that "succeeds" proves
    /// nothing: the store refuses writes until restarted (recovery then
    /// trusts only what is on disk), and never acknowledges past the failure.
    #[error("storage failed ({0}); writes are refused until restart")]
    StorageFailed(String),
    /// The data directory's file system is fuller than
    /// `disk_refuse_writes_percent`: no new segment is started (retention
    /// frees space from `disk_max_used_percent` on).
    #[error("disk {used:.1} % full, above disk_refuse_writes_percent {limit} %: writes refused until space is freed")]
    DiskFull { used: f64, limit: u8 },
    /// Invalid configuration value.
    #[error("invalid store config: {0}")]
    Config(String),
    /// This node is not its broker set's master (cluster mode): client
    /// writes go to the master.
    #[error("not the master of its broker set")]
    NotLeader,
    /// Fewer replicas are in sync than `min_insync_replicas`.
    #[error("fewer replicas in sync than min_insync_replicas")]
    NotEnoughReplicas,
    /// The replicas did not acknowledge within the timeout.
    #[error("replicas did not acknowledge within {0} ms")]
    ReplicationTimeout(u64),
}

impl StoreError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.into();
        move |source| StoreError::Io { op, path, source }
    }

    /// An I/O error saying the file system has no room (ENOSPC) or the
    /// quota is spent (EDQUOT): the disk is full, not failing.
    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::Io { source, .. } => {
                matches!(source.raw_os_error(), Some(code) if code == libc::ENOSPC || code == libc::EDQUOT)
            }
            _ => false,
        }
    }

    pub(crate) fn bad_file(path: impl Into<PathBuf>, reason: impl Into<String>) -> StoreError {
        StoreError::BadFile {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
