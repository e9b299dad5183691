//! `[broker]` configuration (documented in `config/rokka.toml`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Create a topic the first time a producer or metadata request names it.
    pub auto_create_topics: bool,
    /// Partitions (queues) of a topic created without a count.
    pub default_partitions: u32,
    /// Most partitions (queues) one topic may have.
    pub max_partitions: u32,
    /// Most topics the broker holds (0 = no limit): names come from
    /// clients (auto-creation, retry topics of consumer groups); creating
    /// one more is refused (counted in `rokka_topics_refused_total`).
    pub max_topics: u32,
    /// Delay of each RocketMQ delay level, 1 … n, in ms (`messageDelayLevel`).
    pub delay_levels_ms: Vec<u64>,
    /// Most bytes one Kafka record batch may decompress to: a Produce whose
    /// batch decompresses to more is refused (MESSAGE_TOO_LARGE), and a
    /// stored batch is never opened past it.
    pub max_batch_decompressed_bytes: u64,
    /// An idempotent producer's state for a partition not written for this
    /// long is forgotten (Kafka `producer.id.expiration.ms`).
    pub producer_id_expiration_ms: u64,
    /// Most (producer, topic, partition) states kept; the least recently
    /// written is forgotten first (a client can choose any producer id).
    pub max_producer_states: u32,
    /// Longest delay a timer message may ask for (RocketMQ
    /// `timerMaxDelaySec`, 3 days); never more than the store's retention.
    pub timer_max_delay_ms: u64,
    /// Largest `transaction.timeout.ms` a Kafka transactional producer may
    /// ask for (Kafka `transaction.max.timeout.ms`); more is
    /// INVALID_TRANSACTION_TIMEOUT.
    pub transaction_max_timeout_ms: u64,
    /// A transactional id with no open transaction for this long is
    /// forgotten (Kafka `transactional.id.expiration.ms`, 7 days).
    pub transactional_id_expiration_ms: u64,
    /// Most Kafka transactional ids held; InitProducerId for a new one
    /// beyond it is answered COORDINATOR_NOT_AVAILABLE (clients retry).
    pub max_transactional_ids: u32,
    /// Most consumer groups one Kafka transaction may add offsets for
    /// (AddOffsetsToTxn beyond it is INVALID_REQUEST).
    pub max_groups_per_transaction: u32,
    /// How often compacted partitions are checked for a compaction pass.
    pub compaction_interval_ms: u64,
    /// Most distinct keys one compaction pass maps (a partition with more
    /// is cleaned up to where the map filled, the rest in later passes).
    pub compaction_max_keys: u32,
    /// Most users with credentials (AlterUserScramCredentials beyond it is
    /// POLICY_VIOLATION).
    pub max_users: u32,
    /// Most RocketMQ subscription-group configs kept
    /// (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP of a new group beyond it is
    /// refused; groups without a config need no entry).
    pub max_subscription_groups: u32,
    /// Most topics whose per-topic traffic counters (messages and bytes in
    /// and out) keep cached handles; past it the cache starts over.
    pub max_topic_metric_handles: u32,
    /// Most bytes of Kafka batches kept decoded for RocketMQ readers that
    /// took only part of one (a pull's byte cap, a receive's message
    /// count), so the next read does not decode the batch again (0 = none).
    pub crossing_cache_bytes: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            auto_create_topics: true,
            default_partitions: 1,
            max_partitions: 1024,
            max_topics: 100_000,
            delay_levels_ms: crate::schedule::LEVELS_MS.iter().map(|l| *l as u64).collect(),
            max_batch_decompressed_bytes: 64 * 1024 * 1024,
            producer_id_expiration_ms: 24 * 3600 * 1000,
            max_producer_states: 100_000,
            timer_max_delay_ms: 3 * 24 * 3600 * 1000,
            transaction_max_timeout_ms: 900_000,
            transactional_id_expiration_ms: 7 * 24 * 3600 * 1000,
            max_transactional_ids: 100_000,
            max_groups_per_transaction: 64,
            compaction_interval_ms: 15_000,
            compaction_max_keys: 4_000_000,
            max_users: 10_000,
            max_subscription_groups: 10_000,
            max_topic_metric_handles: 65_536,
            crossing_cache_bytes: 32 * 1024 * 1024,
        }
    }
}
