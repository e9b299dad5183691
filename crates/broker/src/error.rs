//! The broker's error type; each frontend maps it to its wire codes.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(transparent)]
    Store(#[from] rokka_store::StoreError),
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] std::io::Error),
    #[error("damaged file {path}: {reason}")]
    BadFile { path: PathBuf, reason: String },
    #[error("unknown topic {0}")]
    UnknownTopic(String),
    #[error("topic {topic} has no partition {partition}")]
    UnknownPartition { topic: String, partition: u32 },
    #[error("topic {0} already exists")]
    TopicExists(String),
    #[error("invalid partition count: {0}")]
    InvalidPartitions(String),
}

pub type Result<T, E = BrokerError> = std::result::Result<T, E>;
