//! The ApiVersions table: exactly the APIs and versions Rokka implements.
//! A client picks the highest version both sides list, so a version is only
//! listed here once its handler implements every field of it.

use kafka_protocol::messages::ApiKey;

/// (api, min, max) advertised.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    // Produce from v0 as Kafka 4 does (KAFKA-18659: librdkafka only
    // compresses when v0 is listed); v0–v2 requests are refused.
    (ApiKey::Produce, 0, 12),
    (ApiKey::Fetch, 4, 17),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::ApiVersions, 0, 4),
    // v0: the mechanism's messages follow as raw size-prefixed tokens
    // (kafka-python up to 2.0.2); v1: in SaslAuthenticate.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 0),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::AlterReplicaLogDirs, 1, 2),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
];

/// Versions of `key` Rokka serves, if any.
pub fn range(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED.iter().find(|(k, _, _)| *k == key).map(|(_, a, b)| (*a, *b))
}

/// Whether a request of `key` at `version` is served.
pub fn served(key: ApiKey, version: i16) -> bool {
    match range(key) {
        // Listed for librdkafka's sake, not served (pre-2.1 message formats).
        Some(_) if key == ApiKey::Produce && version < 3 => false,
        Some((min, max)) => (min..=max).contains(&version),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_version_is_one_kafka_protocol_can_encode() {
        for (key, min, max) in SUPPORTED {
            let v = key.valid_versions();
            // Produce v0–v2 are listed but refused, so only served versions count.
            let served_min = if *key == ApiKey::Produce { 3 } else { *min };
            assert!(
                v.min <= served_min && *max <= v.max,
                "{key:?} {served_min}..={max} outside {v:?}"
            );
        }
    }

    #[test]
    fn kip_896_baseline_is_covered() {
        // Kafka 4 clients need at least these minimum versions served.
        for (key, min) in [
            (ApiKey::Produce, 3),
            (ApiKey::Fetch, 4),
            (ApiKey::ListOffsets, 1),
            (ApiKey::Metadata, 0),
            (ApiKey::OffsetCommit, 2),
            (ApiKey::OffsetFetch, 1),
        ] {
            assert!(served(key, min), "{key:?} v{min}");
        }
        assert!(!served(ApiKey::Produce, 2));
    }
}
