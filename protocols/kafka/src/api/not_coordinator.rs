//! Cluster mode: requests for a group or transactional id this node does
//! not coordinate (it is not the master of the broker set the key hashes
//! to, or not a master at all) are answered NOT_COORDINATOR, as a Kafka
//! broker answers after its coordinator moved: the client finds the
//! coordinator again. Without this a replica, or the master of the wrong
//! set, would start a second copy of the group.

use kafka_protocol::messages::*;

use crate::Kafka;

/// Kafka's NOT_COORDINATOR.
pub const NOT_COORDINATOR: i16 = 16;

fn elsewhere(k: &Kafka, key: &str) -> bool {
    k.broker.cluster_view().is_some_and(|v| !v.coordinates(key))
}

/// The NOT_COORDINATOR answer to `req` when it names a key this node does
/// not coordinate; None to handle it here.
pub fn check(k: &Kafka, req: &RequestKind, version: i16) -> Option<ResponseKind> {
    k.broker.cluster_view()?;
    const E: i16 = NOT_COORDINATOR;
    match req {
        RequestKind::JoinGroup(r) if elsewhere(k, r.group_id.as_str()) => Some(ResponseKind::JoinGroup(
            JoinGroupResponse::default().with_error_code(E).with_generation_id(-1),
        )),
        RequestKind::SyncGroup(r) if elsewhere(k, r.group_id.as_str()) => {
            Some(ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(E)))
        }
        RequestKind::Heartbeat(r) if elsewhere(k, r.group_id.as_str()) => {
            Some(ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(E)))
        }
        RequestKind::LeaveGroup(r) if elsewhere(k, r.group_id.as_str()) => Some(ResponseKind::LeaveGroup(
            LeaveGroupResponse::default().with_error_code(E),
        )),
        RequestKind::ConsumerGroupHeartbeat(r) if elsewhere(k, r.group_id.as_str()) => Some(
            ResponseKind::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatResponse::default().with_error_code(E)),
        ),
        RequestKind::OffsetCommit(r) if elsewhere(k, r.group_id.as_str()) => {
            Some(ResponseKind::OffsetCommit(offset_commit_refused(r, E)))
        }
        RequestKind::OffsetFetch(r) if version < 8 && elsewhere(k, r.group_id.as_str()) => Some(
            ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_error_code(E)),
        ),
        RequestKind::OffsetFetch(r) if version >= 8 && r.groups.iter().any(|g| elsewhere(k, g.group_id.as_str())) => {
            use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup;
            // One group per request is what clients send; each group is
            // answered for itself when several are asked.
            if r.groups.iter().all(|g| elsewhere(k, g.group_id.as_str())) {
                let groups = r
                    .groups
                    .iter()
                    .map(|g| {
                        OffsetFetchResponseGroup::default()
                            .with_group_id(g.group_id.clone())
                            .with_error_code(E)
                    })
                    .collect();
                return Some(ResponseKind::OffsetFetch(
                    OffsetFetchResponse::default().with_groups(groups),
                ));
            }
            None
        }
        RequestKind::InitProducerId(r)
            if r.transactional_id
                .as_ref()
                .is_some_and(|t| !t.is_empty() && elsewhere(k, t.as_str())) =>
        {
            Some(ResponseKind::InitProducerId(
                InitProducerIdResponse::default()
                    .with_error_code(E)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            ))
        }
        RequestKind::EndTxn(r) if elsewhere(k, r.transactional_id.as_str()) => {
            Some(ResponseKind::EndTxn(EndTxnResponse::default().with_error_code(E)))
        }
        RequestKind::AddOffsetsToTxn(r) if elsewhere(k, r.transactional_id.as_str()) => Some(
            ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default().with_error_code(E)),
        ),
        RequestKind::AddPartitionsToTxn(r) if version < 4 && elsewhere(k, r.v3_and_below_transactional_id.as_str()) => {
            use kafka_protocol::messages::add_partitions_to_txn_response::*;
            let results = r
                .v3_and_below_topics
                .iter()
                .map(|t| {
                    let parts = t
                        .partitions
                        .iter()
                        .map(|p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(*p)
                                .with_partition_error_code(E)
                        })
                        .collect();
                    AddPartitionsToTxnTopicResult::default()
                        .with_name(t.name.clone())
                        .with_results_by_partition(parts)
                })
                .collect();
            Some(ResponseKind::AddPartitionsToTxn(
                AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results),
            ))
        }
        RequestKind::TxnOffsetCommit(r) if elsewhere(k, r.group_id.as_str()) => {
            Some(ResponseKind::TxnOffsetCommit(txn_offset_commit_refused(r, E)))
        }
        _ => None,
    }
}

/// An OffsetCommit answered `code` for every partition it names.
pub(super) fn offset_commit_refused(r: &OffsetCommitRequest, code: i16) -> OffsetCommitResponse {
    use kafka_protocol::messages::offset_commit_response::*;
    let topics = r
        .topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(parts)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// A TxnOffsetCommit answered `code` for every partition it names.
pub(super) fn txn_offset_commit_refused(r: &TxnOffsetCommitRequest, code: i16) -> TxnOffsetCommitResponse {
    use kafka_protocol::messages::txn_offset_commit_response::*;
    let topics = r
        .topics
        .iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect();
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(parts)
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}
