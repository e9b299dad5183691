//! One module per Kafka API; `dispatch` routes a decoded request to it.

mod acls;
mod admin;
mod api_versions;
mod consumer_group;
mod fetch;
mod find_coordinator;
mod groups;
mod guard;
mod id_len;
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

use crate::authz::Caller;
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
    who: &Caller,
) -> Result<Option<Response>, Close> {
    let client_id = header.client_id.as_ref().map_or("", |c| c.as_str());
    if let RequestKind::Fetch(r) = req {
        let who = who.checked(k).then_some(who);
        return Ok(Some(Response::Fetch(fetch::handle(k, r, version, who).await)));
    }
    if let Some(resp) = id_len::check(k, &req) {
        return Ok(Some(Response::Kind(resp)));
    }
    if let Some(resp) = not_coordinator::check(k, &req, version) {
        metrics::counter!("rokka_kafka_not_coordinator_total").increment(1);
        return Ok(Some(Response::Kind(resp)));
    }
    guarded(k, req, version, peer, at, who, client_id).await
}

/// Each API's checks (`guard`; with authorization off they all pass),
/// then its handler on what is allowed, then the refused parts' answers.
async fn guarded(
    k: &Kafka,
    req: RequestKind,
    version: i16,
    peer: std::net::SocketAddr,
    at: &crate::Endpoint,
    who: &Caller,
    client_id: &str,
) -> Result<Option<Response>, Close> {
    use kafka_protocol::messages::*;
    use rokka_broker::acl::Operation as Op;
    Ok(Some(Response::Kind(match req {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions::handle(crate::errors::NONE, version)),
        RequestKind::Metadata(r) => {
            let learned = metadata::from_cluster(k, &r, who).await;
            let (ops_topics, ops_cluster) = (
                r.include_topic_authorized_operations,
                r.include_cluster_authorized_operations,
            );
            let mut resp = guard::metadata(k, who, r, version, at, &learned);
            if version >= 8 && ops_topics {
                for t in resp.topics.iter_mut().filter(|t| t.error_code == 0) {
                    if let Some(n) = &t.name {
                        t.topic_authorized_operations =
                            who.authorized_operations(k, rokka_broker::acl::ResourceType::Topic, n.0.as_str());
                    }
                }
            }
            if (8..=10).contains(&version) && ops_cluster {
                resp.cluster_authorized_operations = who.cluster_operations(k);
            }
            ResponseKind::Metadata(resp)
        }
        RequestKind::Produce(mut r) => {
            let acks = r.acks;
            let denied = guard::produce(k, who, &mut r);
            let mut resp = if r.topic_data.is_empty() {
                ProduceResponse::default()
            } else {
                produce::handle(k, r, version).await
            };
            guard::produce_denied(&mut resp, denied);
            if acks == 0 {
                // No answer; but a failed partition closes the connection,
                // as Kafka's broker does, so the producer refreshes its
                // metadata rather than writing on into the void (a former
                // master, a topic gone, a refusal).
                let failed = resp
                    .responses
                    .iter()
                    .flat_map(|t| &t.partition_responses)
                    .find(|p| p.error_code != crate::errors::NONE);
                if let Some(p) = failed {
                    metrics::counter!("rokka_kafka_acks0_failures_closed_total").increment(1);
                    return Err(Close(format!(
                        "an acks=0 produce failed (error {}): closing, as Kafka does, so the producer refreshes its metadata",
                        p.error_code
                    )));
                }
                return Ok(None);
            }
            ResponseKind::Produce(resp)
        }
        RequestKind::OffsetForLeaderEpoch(mut r) => {
            let denied = guard::leader_epoch(k, who, &mut r);
            let mut resp = leader_epoch::handle(k, r);
            guard::leader_epoch_denied(&mut resp, denied);
            ResponseKind::OffsetForLeaderEpoch(resp)
        }
        RequestKind::ListOffsets(mut r) => {
            let denied = guard::list_offsets(k, who, &mut r);
            let mut resp = list_offsets::handle(k, r, version);
            guard::list_offsets_denied(&mut resp, denied);
            ResponseKind::ListOffsets(resp)
        }
        RequestKind::FindCoordinator(mut r) => match guard::find_coordinator(k, who, &mut r, version) {
            Err(resp) => ResponseKind::FindCoordinator(*resp),
            Ok(denied) => {
                let key_type = r.key_type;
                let mut resp = if version >= 4 && r.coordinator_keys.is_empty() {
                    FindCoordinatorResponse::default()
                } else {
                    find_coordinator::handle(k, r, version, at)
                };
                guard::find_coordinator_denied(&mut resp, denied, key_type);
                ResponseKind::FindCoordinator(resp)
            }
        },
        RequestKind::InitProducerId(r) => match guard::init_producer_id(k, who, &r) {
            Some(code) => ResponseKind::InitProducerId(
                InitProducerIdResponse::default()
                    .with_error_code(code)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            ),
            None => {
                let mut resp = init_producer_id::handle(k, r).await;
                resp.error_code = fenced_as(resp.error_code, version < 4);
                ResponseKind::InitProducerId(resp)
            }
        },
        RequestKind::AddPartitionsToTxn(r) => match guard::add_partitions_to_txn(k, who, &r) {
            Some(resp) => ResponseKind::AddPartitionsToTxn(resp),
            None => {
                let mut resp = txn::add_partitions(k, r).await;
                for t in &mut resp.results_by_topic_v3_and_below {
                    for p in &mut t.results_by_partition {
                        p.partition_error_code = fenced_as(p.partition_error_code, version < 2);
                    }
                }
                ResponseKind::AddPartitionsToTxn(resp)
            }
        },
        RequestKind::AddOffsetsToTxn(r) => match guard::add_offsets_to_txn(k, who, &r) {
            Some(code) => ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default().with_error_code(code)),
            None => {
                let mut resp = txn::add_offsets(k, r).await;
                resp.error_code = fenced_as(resp.error_code, version < 2);
                ResponseKind::AddOffsetsToTxn(resp)
            }
        },
        RequestKind::TxnOffsetCommit(mut r) => {
            let denied = guard::txn_offset_commit(k, who, &mut r);
            let mut resp = if r.topics.is_empty() {
                TxnOffsetCommitResponse::default()
            } else {
                txn::offset_commit(k, r, version).await
            };
            guard::txn_offset_commit_denied(&mut resp, denied);
            ResponseKind::TxnOffsetCommit(resp)
        }
        RequestKind::EndTxn(r) => {
            match who.may(
                k,
                rokka_broker::acl::ResourceType::TransactionalId,
                r.transactional_id.0.as_str(),
                Op::Write,
            ) {
                true => {
                    let mut resp = txn::end(k, r).await;
                    resp.error_code = fenced_as(resp.error_code, version < 2);
                    ResponseKind::EndTxn(resp)
                }
                false => ResponseKind::EndTxn(EndTxnResponse::default().with_error_code(guard::TXN_DENIED)),
            }
        }
        RequestKind::DescribeTransactions(mut r) => {
            let denied = guard::describe_transactions(k, who, &mut r);
            let mut resp = txn::describe(k, r);
            guard::describe_transactions_denied(k, who, &mut resp, denied);
            ResponseKind::DescribeTransactions(resp)
        }
        RequestKind::ListTransactions(r) => {
            let mut resp = txn::list(k, r);
            guard::list_transactions(k, who, &mut resp);
            ResponseKind::ListTransactions(resp)
        }
        RequestKind::DescribeProducers(mut r) => {
            let denied = guard::describe_producers(k, who, &mut r);
            let mut resp = txn::describe_producers(k, r);
            guard::describe_producers_denied(&mut resp, denied);
            ResponseKind::DescribeProducers(resp)
        }
        RequestKind::OffsetCommit(mut r) => {
            let denied = guard::offset_commit(k, who, &mut r);
            let mut resp = if r.topics.is_empty() {
                OffsetCommitResponse::default()
            } else {
                offsets::commit(k, r, version).await
            };
            guard::offset_commit_denied(&mut resp, denied);
            ResponseKind::OffsetCommit(resp)
        }
        RequestKind::JoinGroup(r) => match guard::group_member(k, who, &r.group_id) {
            true => ResponseKind::JoinGroup(groups::join(k, r, version, client_id, peer).await),
            false => ResponseKind::JoinGroup(
                JoinGroupResponse::default()
                    .with_error_code(guard::GROUP_DENIED)
                    .with_generation_id(-1),
            ),
        },
        RequestKind::SyncGroup(r) => match guard::group_member(k, who, &r.group_id) {
            true => ResponseKind::SyncGroup(groups::sync(k, r, version).await),
            false => ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(guard::GROUP_DENIED)),
        },
        RequestKind::Heartbeat(r) => match guard::group_member(k, who, &r.group_id) {
            true => ResponseKind::Heartbeat(groups::heartbeat(k, r)),
            false => ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(guard::GROUP_DENIED)),
        },
        RequestKind::LeaveGroup(r) => match guard::group_member(k, who, &r.group_id) {
            true => ResponseKind::LeaveGroup(groups::leave(k, r, version)),
            false => ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(guard::GROUP_DENIED)),
        },
        RequestKind::ConsumerGroupHeartbeat(r) => match guard::group_member(k, who, &r.group_id) {
            true => ResponseKind::ConsumerGroupHeartbeat(consumer_group::heartbeat(k, r, client_id, peer).await),
            false => ResponseKind::ConsumerGroupHeartbeat(
                ConsumerGroupHeartbeatResponse::default().with_error_code(guard::GROUP_DENIED),
            ),
        },
        RequestKind::ConsumerGroupDescribe(mut r) => {
            let denied = guard::groups(k, who, &mut r.group_ids, Op::Describe);
            let ops = r.include_authorized_operations;
            let mut resp = consumer_group::describe(k, r);
            if ops {
                for g in resp.groups.iter_mut().filter(|g| g.error_code == 0) {
                    g.authorized_operations =
                        who.authorized_operations(k, rokka_broker::acl::ResourceType::Group, g.group_id.0.as_str());
                }
            }
            for g in denied {
                resp.groups.push(
                    consumer_group_describe_response::DescribedGroup::default()
                        .with_group_id(g)
                        .with_error_code(guard::GROUP_DENIED),
                );
            }
            ResponseKind::ConsumerGroupDescribe(resp)
        }
        RequestKind::ListGroups(r) => {
            let mut resp = groups::list(k, r, version);
            guard::list_groups(k, who, &mut resp);
            ResponseKind::ListGroups(resp)
        }
        RequestKind::DescribeGroups(mut r) => {
            let denied = guard::groups(k, who, &mut r.groups, Op::Describe);
            let ops = version >= 3 && r.include_authorized_operations;
            let mut resp = groups::describe(k, r, version);
            if ops {
                for g in resp.groups.iter_mut().filter(|g| g.error_code == 0) {
                    g.authorized_operations =
                        who.authorized_operations(k, rokka_broker::acl::ResourceType::Group, g.group_id.0.as_str());
                }
            }
            for g in denied {
                resp.groups.push(
                    describe_groups_response::DescribedGroup::default()
                        .with_group_id(g)
                        .with_error_code(guard::GROUP_DENIED),
                );
            }
            ResponseKind::DescribeGroups(resp)
        }
        RequestKind::DeleteGroups(mut r) => {
            let denied = guard::groups(k, who, &mut r.groups_names, Op::Delete);
            let drops_configs = who.sees(
                k,
                rokka_broker::acl::ResourceType::Cluster,
                rokka_broker::acl::CLUSTER_NAME,
                Op::Alter,
            );
            let mut resp = groups::delete(k, r, drops_configs).await;
            for g in denied {
                resp.results.push(
                    delete_groups_response::DeletableGroupResult::default()
                        .with_group_id(g)
                        .with_error_code(guard::GROUP_DENIED),
                );
            }
            ResponseKind::DeleteGroups(resp)
        }
        RequestKind::DescribeConfigs(mut r) => {
            let denied = guard::describe_configs(k, who, &mut r);
            let mut resp = admin::describe_configs(k, r, version);
            guard::describe_configs_denied(&mut resp, denied);
            ResponseKind::DescribeConfigs(resp)
        }
        RequestKind::AlterConfigs(mut r) => {
            let denied = guard::alter_configs(k, who, &mut r);
            let mut resp = rokka_broker::offload(|| admin::alter_configs(k, r));
            guard::alter_configs_denied(&mut resp, denied);
            ResponseKind::AlterConfigs(resp)
        }
        RequestKind::IncrementalAlterConfigs(mut r) => {
            let denied = guard::incremental_alter_configs(k, who, &mut r);
            let mut resp = rokka_broker::offload(|| admin::incremental_alter_configs(k, r));
            guard::incremental_alter_configs_denied(&mut resp, denied);
            ResponseKind::IncrementalAlterConfigs(resp)
        }
        RequestKind::DescribeTopicPartitions(r) => {
            let mut resp = log_dirs::describe_topic_partitions(k, r, |n| {
                who.sees(k, rokka_broker::acl::ResourceType::Topic, n, Op::Describe)
            });
            // No flag in this request: always answered, as Kafka does.
            for t in resp.topics.iter_mut().filter(|t| t.error_code == 0) {
                if let Some(n) = &t.name {
                    t.topic_authorized_operations =
                        who.authorized_operations(k, rokka_broker::acl::ResourceType::Topic, n.0.as_str());
                }
            }
            ResponseKind::DescribeTopicPartitions(resp)
        }
        RequestKind::DescribeLogDirs(r) => match who.may_cluster(k, Op::Describe) {
            true => ResponseKind::DescribeLogDirs(rokka_broker::offload(|| log_dirs::describe_log_dirs(k, r))),
            false => {
                ResponseKind::DescribeLogDirs(DescribeLogDirsResponse::default().with_error_code(guard::CLUSTER_DENIED))
            }
        },
        RequestKind::AlterReplicaLogDirs(r) => match who.may_cluster(k, Op::Alter) {
            true => ResponseKind::AlterReplicaLogDirs(log_dirs::alter_replica_log_dirs(k, r)),
            false => {
                let mut resp = log_dirs::alter_replica_log_dirs(k, AlterReplicaLogDirsRequest::default());
                for d in r.dirs {
                    for t in d.topics {
                        resp.results.push(
                            alter_replica_log_dirs_response::AlterReplicaLogDirTopicResult::default()
                                .with_topic_name(t.name)
                                .with_partitions(
                                    t.partitions
                                        .into_iter()
                                        .map(|p| {
                                            alter_replica_log_dirs_response::AlterReplicaLogDirPartitionResult::default(
                                            )
                                            .with_partition_index(p)
                                            .with_error_code(guard::CLUSTER_DENIED)
                                        })
                                        .collect(),
                                ),
                        );
                    }
                }
                ResponseKind::AlterReplicaLogDirs(resp)
            }
        },
        RequestKind::ElectLeaders(r) => match who.may_cluster(k, Op::Alter) {
            true => ResponseKind::ElectLeaders(replicas::elect_leaders(k, r)),
            false => ResponseKind::ElectLeaders(ElectLeadersResponse::default().with_error_code(guard::CLUSTER_DENIED)),
        },
        RequestKind::AlterPartitionReassignments(r) => match who.may_cluster(k, Op::Alter) {
            true => ResponseKind::AlterPartitionReassignments(replicas::alter_reassignments(k, r)),
            false => ResponseKind::AlterPartitionReassignments(
                AlterPartitionReassignmentsResponse::default().with_error_code(guard::CLUSTER_DENIED),
            ),
        },
        RequestKind::ListPartitionReassignments(r) => match who.may_cluster(k, Op::Describe) {
            true => ResponseKind::ListPartitionReassignments(replicas::list_reassignments(k, r)),
            false => ResponseKind::ListPartitionReassignments(
                ListPartitionReassignmentsResponse::default().with_error_code(guard::CLUSTER_DENIED),
            ),
        },
        RequestKind::DescribeCluster(r) => {
            let ops = r.include_cluster_authorized_operations;
            let mut resp = admin::describe_cluster(k, r, at);
            if ops {
                resp.cluster_authorized_operations = who.cluster_operations(k);
            }
            ResponseKind::DescribeCluster(resp)
        }
        RequestKind::DescribeUserScramCredentials(r) => match who.may_cluster(k, Op::Describe) {
            true => ResponseKind::DescribeUserScramCredentials(scram::describe(k, r)),
            false => ResponseKind::DescribeUserScramCredentials(
                DescribeUserScramCredentialsResponse::default()
                    .with_error_code(guard::CLUSTER_DENIED)
                    .with_error_message(Some(str_bytes("DESCRIBE on the cluster is needed"))),
            ),
        },
        RequestKind::AlterUserScramCredentials(r) => {
            // ALTER on the cluster; with authorization off, over a SASL
            // listener only super users change credentials.
            let allowed = match who.checked(k) {
                true => who.may_cluster(k, Op::Alter),
                false => !at.sasl || k.broker.acls().is_super_user(who.principal()),
            };
            match allowed {
                true => {
                    let resp = rokka_broker::offload(|| scram::alter(k, r));
                    ResponseKind::AlterUserScramCredentials(scram::altered_in_cluster(k, resp).await)
                }
                false => ResponseKind::AlterUserScramCredentials(scram::refused(r)),
            }
        }
        RequestKind::DescribeAcls(r) => ResponseKind::DescribeAcls(acls::describe(k, who, r)),
        RequestKind::CreateAcls(r) => {
            let resp = acls::create(k, who, r);
            ResponseKind::CreateAcls(acls::created_in_cluster(k, resp).await)
        }
        RequestKind::DeleteAcls(r) => {
            let resp = acls::delete(k, who, r);
            ResponseKind::DeleteAcls(acls::deleted_in_cluster(k, resp).await)
        }
        RequestKind::DeleteRecords(mut r) => {
            let denied = guard::delete_records(k, who, &mut r);
            let timeout_ms = r.timeout_ms;
            let mut resp = rokka_broker::offload(|| admin::delete_records(k, r));
            admin::delete_records_replicated(k, &mut resp, timeout_ms).await;
            guard::delete_records_denied(&mut resp, denied);
            ResponseKind::DeleteRecords(resp)
        }
        RequestKind::OffsetDelete(mut r) => match guard::offset_delete(k, who, &mut r) {
            Err(resp) => ResponseKind::OffsetDelete(resp),
            Ok(denied) => {
                let mut resp = admin::offset_delete(k, r);
                guard::offset_delete_denied(&mut resp, denied);
                ResponseKind::OffsetDelete(resp)
            }
        },
        RequestKind::OffsetFetch(mut r) => match guard::offset_fetch(k, who, &mut r, version) {
            Err(resp) => ResponseKind::OffsetFetch(resp),
            Ok(denied) => {
                let mut resp = if version >= 8 && r.groups.is_empty() {
                    OffsetFetchResponse::default()
                } else {
                    offsets::fetch(k, r, version).await
                };
                guard::offset_fetch_denied(k, who, &mut resp, denied);
                ResponseKind::OffsetFetch(resp)
            }
        },
        RequestKind::CreateTopics(mut r) => {
            let denied = guard::create_topics(k, who, &mut r);
            let mut resp = rokka_broker::offload(|| topics::create(k, r, version));
            guard::create_topics_denied(&mut resp, denied);
            ResponseKind::CreateTopics(resp)
        }
        RequestKind::DeleteTopics(mut r) => {
            let denied = guard::delete_topics(k, who, &mut r);
            let mut resp = rokka_broker::offload(|| topics::delete(k, r, version));
            guard::delete_topics_denied(&mut resp, denied);
            ResponseKind::DeleteTopics(resp)
        }
        RequestKind::CreatePartitions(mut r) => {
            let denied = guard::create_partitions(k, who, &mut r);
            let mut resp = rokka_broker::offload(|| topics::create_partitions(k, r));
            guard::create_partitions_denied(&mut resp, denied);
            ResponseKind::CreatePartitions(resp)
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
        return (key == ApiKey::ApiVersions).then(|| ResponseKind::ApiVersions(api_versions::handle(E, 0)));
    }
    Some(match key {
        ApiKey::ApiVersions => ResponseKind::ApiVersions(api_versions::handle(E, version)),
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

/// PRODUCER_FENCED (90, KIP-588) as the versions before it knew it:
/// INVALID_PRODUCER_EPOCH, as Kafka answers InitProducerId < 4 and
/// EndTxn, AddPartitionsToTxn, AddOffsetsToTxn < 2 (older clients take 90
/// for an unknown, fatal error instead of a fenced producer).
fn fenced_as(code: i16, old_version: bool) -> i16 {
    if old_version && code == rokka_broker::kafka_txn::code::PRODUCER_FENCED {
        crate::errors::INVALID_PRODUCER_EPOCH
    } else {
        code
    }
}
