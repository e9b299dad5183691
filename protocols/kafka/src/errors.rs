//! Kafka error codes, and the one place internal errors become them.

use rokka_broker::BrokerError;
use rokka_store::StoreError;

/// The group coordinator's codes are Kafka's; one definition, in crates/group.
pub use rokka_group::code::{
    COORDINATOR_NOT_AVAILABLE, FENCED_INSTANCE_ID, GROUP_ID_NOT_FOUND, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL,
    INVALID_GROUP_ID, INVALID_SESSION_TIMEOUT, MEMBER_ID_REQUIRED, NONE, NON_EMPTY_GROUP, REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
};

pub const OFFSET_OUT_OF_RANGE: i16 = 1;
pub const CORRUPT_MESSAGE: i16 = 2;
pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
pub const MESSAGE_TOO_LARGE: i16 = 10;
/// A compression the request's version cannot carry (zstd before Produce v7 / Fetch v10).
pub const UNSUPPORTED_COMPRESSION_TYPE: i16 = 76;
pub const OFFSET_METADATA_TOO_LARGE: i16 = 12;
pub const REQUEST_TIMED_OUT: i16 = 7;
pub const INVALID_TOPIC_EXCEPTION: i16 = 17;
pub const INVALID_TIMESTAMP: i16 = 32;
pub const NOT_ENOUGH_REPLICAS: i16 = 19;
pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
pub const NOT_LEADER_OR_FOLLOWER: i16 = 6;
pub const LEADER_NOT_AVAILABLE: i16 = 5;
pub const UNSUPPORTED_VERSION: i16 = 35;
pub const TOPIC_ALREADY_EXISTS: i16 = 36;
pub const INVALID_PARTITIONS: i16 = 37;
pub const INVALID_REPLICATION_FACTOR: i16 = 38;
pub const INVALID_COMMIT_OFFSET_SIZE: i16 = 28;
pub const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
pub const INVALID_CONFIG: i16 = 40;
pub const INVALID_REQUEST: i16 = 42;
pub const INVALID_REQUIRED_ACKS: i16 = 21;
pub const POLICY_VIOLATION: i16 = 44;
pub const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
pub const INVALID_PRODUCER_EPOCH: i16 = 47;
pub const KAFKA_STORAGE_ERROR: i16 = 56;
pub const UNKNOWN_LEADER_EPOCH: i16 = 75;
pub const OFFSET_NOT_AVAILABLE: i16 = 78;
pub const FENCED_LEADER_EPOCH: i16 = 74;
pub const GROUP_SUBSCRIBED_TO_TOPIC: i16 = 86;
pub const INVALID_RECORD: i16 = 87;
pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
pub const UNKNOWN_TOPIC_ID: i16 = 100;
pub const UNKNOWN_SERVER_ERROR: i16 = -1;

/// An error code as a metric label without allocating: the number as
/// text for Kafka's codes (-1..=160), `other` beyond.
pub fn label(code: i16) -> &'static str {
    static LABELS: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (-1..=160).map(|c: i16| c.to_string()).collect());
    usize::try_from(i32::from(code) + 1)
        .ok()
        .and_then(|i| LABELS.get(i))
        .map_or("other", String::as_str)
}

/// Counts the error codes of a response whose errors are not counted where
/// they arise (Produce, Fetch and ConsumerGroupHeartbeat count their own):
/// top-level, per group, per topic and per partition codes of the group,
/// offset, topic and transaction APIs, under `rokka_kafka_errors_total`.
pub fn count(api: &'static str, resp: &kafka_protocol::messages::ResponseKind) {
    use kafka_protocol::messages::ResponseKind as R;
    let add = |c: i16| {
        if c != NONE {
            metrics::counter!("rokka_kafka_errors_total", "api" => api, "code" => label(c)).increment(1);
        }
    };
    let all = |it: &mut dyn Iterator<Item = i16>| it.for_each(add);
    match resp {
        R::JoinGroup(r) => add(r.error_code),
        R::SyncGroup(r) => add(r.error_code),
        R::Heartbeat(r) => add(r.error_code),
        R::LeaveGroup(r) => {
            add(r.error_code);
            all(&mut r.members.iter().map(|m| m.error_code));
        }
        R::OffsetCommit(r) => all(&mut r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code))),
        R::TxnOffsetCommit(r) => all(&mut r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code))),
        R::OffsetFetch(r) => {
            add(r.error_code);
            all(&mut r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)));
            for g in &r.groups {
                add(g.error_code);
                all(&mut g.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)));
            }
        }
        R::FindCoordinator(r) => {
            add(r.error_code);
            all(&mut r.coordinators.iter().map(|c| c.error_code));
        }
        R::DescribeGroups(r) => all(&mut r.groups.iter().map(|g| g.error_code)),
        R::DeleteGroups(r) => all(&mut r.results.iter().map(|g| g.error_code)),
        R::ListOffsets(r) => all(&mut r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code))),
        R::Metadata(r) => all(&mut r.topics.iter().map(|t| t.error_code)),
        R::CreateTopics(r) => all(&mut r.topics.iter().map(|t| t.error_code)),
        R::DeleteTopics(r) => all(&mut r.responses.iter().map(|t| t.error_code)),
        R::CreatePartitions(r) => all(&mut r.results.iter().map(|t| t.error_code)),
        R::InitProducerId(r) => add(r.error_code),
        R::AddPartitionsToTxn(r) => {
            add(r.error_code);
            all(&mut r
                .results_by_topic_v3_and_below
                .iter()
                .flat_map(|t| t.results_by_partition.iter().map(|p| p.partition_error_code)));
        }
        R::AddOffsetsToTxn(r) => add(r.error_code),
        R::EndTxn(r) => add(r.error_code),
        R::SaslHandshake(r) => add(r.error_code),
        R::SaslAuthenticate(r) => add(r.error_code),
        _ => {}
    }
}

/// The Kafka error code for a broker error.
pub fn code(e: &BrokerError) -> i16 {
    match e {
        BrokerError::Store(s) => store_code(s),
        BrokerError::UnknownTopic(_) | BrokerError::UnknownPartition { .. } => UNKNOWN_TOPIC_OR_PARTITION,
        BrokerError::TopicExists(_) => TOPIC_ALREADY_EXISTS,
        BrokerError::InvalidPartitions(_) => INVALID_PARTITIONS,
        // Retriable: the topic's leaders are not known yet.
        BrokerError::ClusterNotReady => LEADER_NOT_AVAILABLE,
        BrokerError::Remote(_) => COORDINATOR_NOT_AVAILABLE,
        BrokerError::Io(..) | BrokerError::BadFile { .. } | BrokerError::Corrupt(_) => KAFKA_STORAGE_ERROR,
        BrokerError::TimerTooFar { .. } => INVALID_REQUEST,
        // Kafka's answer to a creation its policy refuses.
        BrokerError::TooManyTopics(_) => POLICY_VIOLATION,
    }
}

pub fn store_code(e: &StoreError) -> i16 {
    match e {
        StoreError::MessageTooLarge { .. } => MESSAGE_TOO_LARGE,
        StoreError::InvalidTopic(_) => INVALID_TOPIC_EXCEPTION,
        StoreError::InvalidBatch(_) => CORRUPT_MESSAGE,
        StoreError::PropertiesTooLarge(_) => INVALID_REQUEST,
        StoreError::FlushTimeout(_) => REQUEST_TIMED_OUT,
        StoreError::ShutDown => NOT_ENOUGH_REPLICAS,
        StoreError::NotLeader => NOT_LEADER_OR_FOLLOWER,
        StoreError::NotEnoughReplicas => NOT_ENOUGH_REPLICAS,
        StoreError::ReplicationTimeout(_) => REQUEST_TIMED_OUT,
        StoreError::Io { .. }
        | StoreError::BadFile { .. }
        | StoreError::Locked(_)
        | StoreError::Config(_)
        | StoreError::StorageFailed(_)
        | StoreError::DiskFull { .. } => KAFKA_STORAGE_ERROR,
    }
}

/// The partition leader epoch this node answers with: its broker set's in
/// cluster mode, 0 on a single node (a partition's only leader epoch).
pub fn leader_epoch(k: &crate::Kafka) -> i32 {
    k.broker.cluster_view().map_or(0, |v| v.epoch as i32)
}

/// A client's `current_leader_epoch` against ours (KIP-320): newer is
/// UNKNOWN_LEADER_EPOCH (this node has not seen that election yet), older
/// FENCED_LEADER_EPOCH (the client missed one); -1 is not checked.
/// (`ours` from [`leader_epoch`], read once per request.)
pub fn check_leader_epoch(ours: i32, current: i32) -> Option<i16> {
    if current < 0 {
        return None;
    }
    match current.cmp(&ours) {
        std::cmp::Ordering::Greater => Some(UNKNOWN_LEADER_EPOCH),
        std::cmp::Ordering::Less => Some(FENCED_LEADER_EPOCH),
        std::cmp::Ordering::Equal => None,
    }
}
