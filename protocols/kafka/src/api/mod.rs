//! One module per Kafka API; `dispatch` routes a decoded request to it.

mod admin;
mod api_versions;
mod consumer_group;
mod fetch;
mod find_coordinator;
mod groups;
mod init_producer_id;
mod leader_epoch;
mod list_offsets;
mod log_dirs;
mod metadata;
mod not_coordinator;
mod offsets;
mod produce;
mod replicas;
mod scram;
mod topics;
mod txn;

use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use crate::conn::Close;
use crate::Kafka;

/// What a handler answers.
#[derive(Debug)]
pub enum Response {
    Kind(ResponseKind),
    /// A fetch, encoded by `fetch::encode` so its batches are not copied.
    Fetch(fetch::FetchReply),
}

pub use fetch::encode as encode_fetch;
pub use produce::split_batches;

/// Kafka partition `p` of a topic (`info` None: no such topic) as this
/// node's queue, or the error to answer: UNKNOWN_TOPIC_OR_PARTITION, or
/// NOT_LEADER_OR_FOLLOWER for another broker set's partition (the client
/// refreshes its metadata and goes to that set's master).
pub(crate) fn queue_of(k: &Kafka, info: Option<&rokka_broker::TopicInfo>, p: i32) -> Result<u32, i16> {
    match info.map(|i| i.locate(p, k.broker.own_set())) {
        Some(rokka_broker::Located::Here(q)) => Ok(q),
        Some(rokka_broker::Located::OtherSet) => Err(crate::errors::NOT_LEADER_OR_FOLLOWER),
        _ => Err(crate::errors::UNKNOWN_TOPIC_OR_PARTITION),
    }
}

pub(crate) fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

pub async fn dispatch(
    k: &Kafka,
    header: &RequestHeader,
    req: RequestKind,
    version: i16,
    peer: std::net::SocketAddr,
    at: &crate::Endpoint,
    principal: Option<&str>,
) -> Result<Option<Response>, Close> {
    let client_id = header.client_id.as_ref().map_or("", |c| c.as_str());
    if let RequestKind::Fetch(r) = req {
        return Ok(Some(Response::Fetch(fetch::handle(k, r, version).await)));
    }
    if let Some(resp) = not_coordinator::check(k, &req, version) {
        metrics::counter!("rokka_kafka_not_coordinator_total").increment(1);
        return Ok(Some(Response::Kind(resp)));
    }
    Ok(Some(Response::Kind(match req {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions::handle(crate::errors::NONE)),
        RequestKind::Metadata(r) => ResponseKind::Metadata(metadata::handle(k, r, version, at)),
        RequestKind::Produce(r) => match produce::handle(k, r, version).await {
            Some(resp) => ResponseKind::Produce(resp),
            None => return Ok(None),
        },
        RequestKind::OffsetForLeaderEpoch(r) => ResponseKind::OffsetForLeaderEpoch(leader_epoch::handle(k, r)),
        RequestKind::ListOffsets(r) => ResponseKind::ListOffsets(list_offsets::handle(k, r, version)),
        RequestKind::FindCoordinator(r) => ResponseKind::FindCoordinator(find_coordinator::handle(k, r, version, at)),
        RequestKind::InitProducerId(r) => ResponseKind::InitProducerId(init_producer_id::handle(k, r).await),
        RequestKind::AddPartitionsToTxn(r) => ResponseKind::AddPartitionsToTxn(txn::add_partitions(k, r).await),
        RequestKind::AddOffsetsToTxn(r) => ResponseKind::AddOffsetsToTxn(txn::add_offsets(k, r).await),
        RequestKind::TxnOffsetCommit(r) => ResponseKind::TxnOffsetCommit(txn::offset_commit(k, r, version).await),
        RequestKind::EndTxn(r) => ResponseKind::EndTxn(txn::end(k, r).await),
        RequestKind::DescribeTransactions(r) => ResponseKind::DescribeTransactions(txn::describe(k, r)),
        RequestKind::ListTransactions(r) => ResponseKind::ListTransactions(txn::list(k, r)),
        RequestKind::DescribeProducers(r) => ResponseKind::DescribeProducers(txn::describe_producers(k, r)),
        RequestKind::OffsetCommit(r) => ResponseKind::OffsetCommit(offsets::commit(k, r, version).await),
        RequestKind::JoinGroup(r) => ResponseKind::JoinGroup(groups::join(k, r, version, client_id, peer).await),
        RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(groups::sync(k, r, version).await),
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(groups::heartbeat(k, r)),
        RequestKind::ConsumerGroupHeartbeat(r) => {
            ResponseKind::ConsumerGroupHeartbeat(consumer_group::heartbeat(k, r, client_id, peer))
        }
        RequestKind::ConsumerGroupDescribe(r) => ResponseKind::ConsumerGroupDescribe(consumer_group::describe(k, r)),
        RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(groups::leave(k, r, version)),
        RequestKind::ListGroups(r) => ResponseKind::ListGroups(groups::list(k, r, version)),
        RequestKind::DescribeGroups(r) => ResponseKind::DescribeGroups(groups::describe(k, r, version)),
        RequestKind::DeleteGroups(r) => ResponseKind::DeleteGroups(groups::delete(k, r)),
        RequestKind::DescribeConfigs(r) => ResponseKind::DescribeConfigs(admin::describe_configs(k, r, version)),
        RequestKind::AlterConfigs(r) => {
            ResponseKind::AlterConfigs(rokka_broker::offload(|| admin::alter_configs(k, r)))
        }
        RequestKind::IncrementalAlterConfigs(r) => {
            ResponseKind::IncrementalAlterConfigs(rokka_broker::offload(|| admin::incremental_alter_configs(k, r)))
        }
        RequestKind::DescribeTopicPartitions(r) => {
            ResponseKind::DescribeTopicPartitions(log_dirs::describe_topic_partitions(k, r))
        }
        RequestKind::DescribeLogDirs(r) => {
            ResponseKind::DescribeLogDirs(rokka_broker::offload(|| log_dirs::describe_log_dirs(k, r)))
        }
        RequestKind::AlterReplicaLogDirs(r) => {
            ResponseKind::AlterReplicaLogDirs(log_dirs::alter_replica_log_dirs(k, r))
        }
        RequestKind::ElectLeaders(r) => ResponseKind::ElectLeaders(replicas::elect_leaders(k, r)),
        RequestKind::AlterPartitionReassignments(r) => {
            ResponseKind::AlterPartitionReassignments(replicas::alter_reassignments(k, r))
        }
        RequestKind::ListPartitionReassignments(r) => {
            ResponseKind::ListPartitionReassignments(replicas::list_reassignments(k, r))
        }
        RequestKind::DescribeCluster(r) => ResponseKind::DescribeCluster(admin::describe_cluster(k, r, at)),
        RequestKind::DescribeUserScramCredentials(r) => {
            ResponseKind::DescribeUserScramCredentials(scram::describe(k, r))
        }
        RequestKind::AlterUserScramCredentials(r) => {
            // Until the ACL table: over a SASL listener only super users
            // change credentials.
            let allowed = !at.sasl || principal.is_some_and(|p| k.config.super_users.iter().any(|s| s == p));
            ResponseKind::AlterUserScramCredentials(match allowed {
                true => rokka_broker::offload(|| scram::alter(k, r)),
                false => scram::refused(r),
            })
        }
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(rokka_broker::offload(|| admin::delete_records(k, r)))
        }
        RequestKind::OffsetDelete(r) => ResponseKind::OffsetDelete(admin::offset_delete(k, r)),
        RequestKind::OffsetFetch(r) => ResponseKind::OffsetFetch(offsets::fetch(k, r, version).await),
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(rokka_broker::offload(|| topics::create(k, r, version)))
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(rokka_broker::offload(|| topics::delete(k, r, version)))
        }
        RequestKind::CreatePartitions(r) => {
            ResponseKind::CreatePartitions(rokka_broker::offload(|| topics::create_partitions(k, r)))
        }
        other => return Err(Close(format!("no handler for {other:?}"))),
    })))
}

/// The response to a request whose version Rokka does not serve, for APIs
/// whose response has a top-level error code; `None` for the others (the
/// connection is then closed — clients only send advertised versions).
pub fn unsupported_version_response(key: ApiKey, version: i16) -> Option<ResponseKind> {
    use crate::errors::UNSUPPORTED_VERSION as E;
    use kafka_protocol::messages::*;
    let valid = key.valid_versions();
    if version < valid.min || version > valid.max {
        // Not even encodable at that version: only ApiVersions has a rule
        // for this (answer in v0).
        return (key == ApiKey::ApiVersions).then(|| ResponseKind::ApiVersions(api_versions::handle(E)));
    }
    Some(match key {
        ApiKey::ApiVersions => ResponseKind::ApiVersions(api_versions::handle(E)),
        ApiKey::FindCoordinator => ResponseKind::FindCoordinator(FindCoordinatorResponse::default().with_error_code(E)),
        ApiKey::JoinGroup => ResponseKind::JoinGroup(JoinGroupResponse::default().with_error_code(E)),
        ApiKey::SyncGroup => ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(E)),
        ApiKey::Heartbeat => ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(E)),
        ApiKey::LeaveGroup => ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(E)),
        ApiKey::ListGroups => ResponseKind::ListGroups(ListGroupsResponse::default().with_error_code(E)),
        ApiKey::InitProducerId => ResponseKind::InitProducerId(InitProducerIdResponse::default().with_error_code(E)),
        ApiKey::AddOffsetsToTxn => ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default().with_error_code(E)),
        ApiKey::EndTxn => ResponseKind::EndTxn(EndTxnResponse::default().with_error_code(E)),
        ApiKey::ListTransactions => {
            ResponseKind::ListTransactions(ListTransactionsResponse::default().with_error_code(E))
        }
        ApiKey::SaslHandshake => ResponseKind::SaslHandshake(SaslHandshakeResponse::default().with_error_code(E)),
        ApiKey::DescribeCluster => ResponseKind::DescribeCluster(DescribeClusterResponse::default().with_error_code(E)),
        ApiKey::Fetch if version >= 7 => ResponseKind::Fetch(FetchResponse::default().with_error_code(E)),
        ApiKey::OffsetFetch if version >= 2 => {
            ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_error_code(E))
        }
        _ => return None,
    })
}
