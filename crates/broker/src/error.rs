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
    /// `broker.max_topics` topics exist already.
    #[error("too many topics: the broker holds {0} (broker.max_topics)")]
    TooManyTopics(u32),
    /// A timer message due later than the broker keeps messages (RocketMQ
    /// `timerMaxDelaySec`; Rokka also caps it at the retention period, so
    /// no timer message is deleted before it is delivered).
    #[error("timer message due in {due_in_ms} ms; at most {max_ms} ms is accepted")]
    TimerTooFar { due_in_ms: i64, max_ms: i64 },
    /// A stored entry a compaction pass cannot read.
    #[error("compaction: {0}")]
    Corrupt(String),
    /// Cluster mode: this node does not know the cluster yet (it has just
    /// started) or cannot reach etcd, so it cannot create a topic now.
    #[error("the cluster is not known yet or not reachable; retry")]
    ClusterNotReady,
    /// Several broker sets: another set's master did not do what this
    /// node asked (unreachable, failing over, or refused).
    #[error("another broker set: {0}")]
    Remote(String),
}

impl BrokerError {
    /// Whether retrying the same operation later may succeed (storage
    /// trouble, shutdown), as opposed to an input that will always fail.
    pub fn is_transient(&self) -> bool {
        use rokka_store::StoreError as S;
        match self {
            BrokerError::Store(
                S::MessageTooLarge { .. } | S::PropertiesTooLarge(_) | S::InvalidTopic(_) | S::InvalidBatch(_),
            ) => false,
            BrokerError::Store(_)
            | BrokerError::Io(..)
            | BrokerError::BadFile { .. }
            | BrokerError::Corrupt(_)
            | BrokerError::ClusterNotReady
            | BrokerError::Remote(_) => true,
            BrokerError::UnknownTopic(_)
            | BrokerError::UnknownPartition { .. }
            | BrokerError::TopicExists(_)
            | BrokerError::InvalidPartitions(_)
            | BrokerError::TooManyTopics(_)
            | BrokerError::TimerTooFar { .. } => false,
        }
    }
}

pub type Result<T, E = BrokerError> = std::result::Result<T, E>;
