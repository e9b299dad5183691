//! Each API's authorization (Kafka's `KafkaApis` checks): what is refused
//! is taken out of the request and answered with the authorization error;
//! the handler serves the rest. Nothing here runs with authorization off.

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rokka_broker::acl::{Operation as Op, ResourceType as Rt};

use crate::authz::{
    split_off, Caller, CLUSTER_AUTHORIZATION_FAILED as CLUSTER, GROUP_AUTHORIZATION_FAILED as GROUP,
    OPERATION_NOT_ATTEMPTED, TOPIC_AUTHORIZATION_FAILED as TOPIC, TRANSACTIONAL_ID_AUTHORIZATION_FAILED as TXN,
};
use crate::Kafka;

/// Produce: WRITE on the transactional id (if any; refused, every
/// partition is answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED) and on each
/// topic. A request carrying transactional batches needs a transactional
/// id it may write, as Kafka's: else anyone allowed to write a topic could
/// put records into another producer's transaction by its producer id.
pub fn produce(k: &Kafka, who: &Caller, r: &mut ProduceRequest) -> (Parts, i16) {
    let txn_ok = match &r.transactional_id {
        Some(t) => who.may(k, Rt::TransactionalId, t.0.as_str(), Op::Write),
        None => !has_transactional_batches(r),
    };
    let denied = split_off(&mut r.topic_data, |t| {
        txn_ok && who.may(k, Rt::Topic, t.name.0.as_str(), Op::Write)
    })
    .into_iter()
    .map(|t| (t.name, t.partition_data.iter().map(|p| p.index).collect()))
    .collect();
    (denied, if txn_ok { TOPIC } else { TXN })
}

/// Whether any record batch of the request is transactional (magic 2,
/// attributes bit 4). Batches are read by their length fields only; a
/// malformed one ends the walk (the handler refuses it).
fn has_transactional_batches(r: &ProduceRequest) -> bool {
    const LENGTH: usize = 8;
    const MAGIC: usize = 16;
    const ATTRIBUTES: usize = 21;
    r.topic_data
        .iter()
        .flat_map(|t| t.partition_data.iter())
        .filter_map(|p| p.records.as_ref())
        .any(|records| {
            let mut b: &[u8] = records;
            while b.len() > ATTRIBUTES + 1 {
                let len = i32::from_be_bytes([b[LENGTH], b[LENGTH + 1], b[LENGTH + 2], b[LENGTH + 3]]);
                if b[MAGIC] >= 2 && b[ATTRIBUTES + 1] & 0x10 != 0 {
                    return true;
                }
                let Some(next) = usize::try_from(len).ok().and_then(|l| l.checked_add(12)) else {
                    return false;
                };
                b = b.get(next..).unwrap_or_default();
            }
            false
        })
}

pub fn produce_denied(resp: &mut ProduceResponse, (denied, code): (Parts, i16)) {
    use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
    push_denied(
        &mut resp.responses,
        denied,
        |n, ps| {
            TopicProduceResponse::default()
                .with_name(n)
                .with_partition_responses(ps)
        },
        |p| {
            PartitionProduceResponse::default()
                .with_index(p)
                .with_error_code(code)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1)
        },
    );
}

/// Fetch: READ on each topic (`names`: the topics as the handler resolved
/// them, None for an unknown topic id, answered by the handler).
pub fn fetch(
    k: &Kafka,
    who: &Caller,
    r: &mut FetchRequest,
    version: i16,
) -> Vec<kafka_protocol::messages::fetch_request::FetchTopic> {
    split_off(&mut r.topics, |t| {
        let name = if version >= 13 {
            k.broker.topics().name_of_id(t.topic_id.as_bytes())
        } else {
            Some(t.topic.0.to_string())
        };
        name.is_none_or(|n| who.may(k, Rt::Topic, &n, Op::Read))
    })
}

/// Metadata: DESCRIBE on each topic named (refused ones answered
/// TOPIC_AUTHORIZATION_FAILED), auto-creation only with CREATE; a request
/// for every topic leaves out the ones the caller may not describe.
pub fn metadata(
    k: &Kafka,
    who: &Caller,
    r: MetadataRequest,
    version: i16,
    at: &crate::Endpoint,
    learned: &super::metadata::Learned,
) -> MetadataResponse {
    use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
    if !who.checked(k) {
        return super::metadata::handle(k, r, version, at, learned);
    }
    let all = match &r.topics {
        None => true,
        Some(list) => version == 0 && list.is_empty(),
    };
    if all {
        let mut resp = super::metadata::handle(k, r, version, at, learned);
        resp.topics.retain(|t| {
            t.name
                .as_ref()
                .is_none_or(|n| who.sees(k, Rt::Topic, n.0.as_str(), Op::Describe))
        });
        return resp;
    }
    let creating = (version < 4 || r.allow_auto_topic_creation) && k.broker.config().auto_create_topics;
    let mut req = r;
    let mut topics = req.topics.take().unwrap_or_default();
    // By id (v10+): resolved to a name for the check; unknown ids are the
    // handler's to answer.
    let name_of = |t: &metadata_request::MetadataRequestTopic| -> Option<String> {
        match &t.name {
            Some(n) => Some(n.0.to_string()),
            None => k.broker.topics().name_of_id(t.topic_id.as_bytes()),
        }
    };
    let denied = split_off(&mut topics, |t| {
        name_of(t).is_none_or(|n| who.may(k, Rt::Topic, &n, Op::Describe))
    });
    // Topics it may describe but not create, that do not exist, where they
    // would be auto-created: TOPIC_AUTHORIZATION_FAILED (Kafka's
    // unauthorizedForCreateTopics), so producers fail at once instead of
    // waiting for a topic that never comes.
    let unknown = if creating {
        split_off(&mut topics, |t| {
            name_of(t).is_none_or(|n| {
                k.broker.topics().get(&n).is_some() || learned.contains_key(&n) || who.may_create_topic(k, &n)
            })
        })
    } else {
        Vec::new()
    };
    req.topics = Some(topics);
    let mut resp = super::metadata::handle(k, req, version, at, learned);
    for (t, code) in denied.into_iter().chain(unknown).map(|t| (t, TOPIC)) {
        resp.topics.push(
            MetadataResponseTopic::default()
                .with_error_code(code)
                .with_name(t.name)
                .with_topic_id(t.topic_id),
        );
    }
    resp
}

/// Topics of a request as (name, partitions): the shape most per-partition
/// answers take.
type Parts = Vec<(TopicName, Vec<i32>)>;

/// Appends to `list` a topic entry (`topic`) for each refused topic, its
/// partitions each answered by `part`.
fn push_denied<T, P>(
    list: &mut Vec<T>,
    denied: Parts,
    topic: impl Fn(TopicName, Vec<P>) -> T,
    part: impl Fn(i32) -> P,
) {
    for (name, parts) in denied {
        list.push(topic(name, parts.into_iter().map(&part).collect()));
    }
}

/// ListOffsets: DESCRIBE on each topic.
pub fn list_offsets(k: &Kafka, who: &Caller, r: &mut ListOffsetsRequest) -> Parts {
    split_off(&mut r.topics, |t| {
        who.may(k, Rt::Topic, t.name.0.as_str(), Op::Describe)
    })
    .into_iter()
    .map(|t| (t.name, t.partitions.iter().map(|p| p.partition_index).collect()))
    .collect()
}

pub fn list_offsets_denied(resp: &mut ListOffsetsResponse, denied: Parts) {
    use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| ListOffsetsTopicResponse::default().with_name(n).with_partitions(ps),
        |p| {
            ListOffsetsPartitionResponse::default()
                .with_partition_index(p)
                .with_error_code(TOPIC)
                .with_timestamp(-1)
                .with_offset(-1)
                .with_leader_epoch(-1)
        },
    );
}

/// OffsetForLeaderEpoch: DESCRIBE on each topic.
pub fn leader_epoch(k: &Kafka, who: &Caller, r: &mut OffsetForLeaderEpochRequest) -> Parts {
    split_off(&mut r.topics, |t| {
        who.may(k, Rt::Topic, t.topic.0.as_str(), Op::Describe)
    })
    .into_iter()
    .map(|t| (t.topic, t.partitions.iter().map(|p| p.partition).collect()))
    .collect()
}

pub fn leader_epoch_denied(resp: &mut OffsetForLeaderEpochResponse, denied: Parts) {
    use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| OffsetForLeaderTopicResult::default().with_topic(n).with_partitions(ps),
        |p| {
            EpochEndOffset::default()
                .with_partition(p)
                .with_error_code(TOPIC)
                .with_leader_epoch(-1)
                .with_end_offset(-1)
        },
    );
}

/// OffsetCommit: READ on the group (else every partition is answered
/// GROUP_AUTHORIZATION_FAILED) and on each topic.
pub fn offset_commit(k: &Kafka, who: &Caller, r: &mut OffsetCommitRequest) -> (Parts, i16) {
    let group_ok = who.may(k, Rt::Group, r.group_id.0.as_str(), Op::Read);
    let denied = split_off(&mut r.topics, |t| {
        group_ok && who.may(k, Rt::Topic, t.name.0.as_str(), Op::Read)
    })
    .into_iter()
    .map(|t| (t.name, t.partitions.iter().map(|p| p.partition_index).collect()))
    .collect();
    (denied, if group_ok { TOPIC } else { GROUP })
}

pub fn offset_commit_denied(resp: &mut OffsetCommitResponse, (denied, code): (Parts, i16)) {
    use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| OffsetCommitResponseTopic::default().with_name(n).with_partitions(ps),
        |p| {
            OffsetCommitResponsePartition::default()
                .with_partition_index(p)
                .with_error_code(code)
        },
    );
}

/// TxnOffsetCommit: WRITE on the transactional id, READ on the group and
/// each topic.
pub fn txn_offset_commit(k: &Kafka, who: &Caller, r: &mut TxnOffsetCommitRequest) -> (Parts, i16) {
    let code = if !who.may(k, Rt::TransactionalId, r.transactional_id.0.as_str(), Op::Write) {
        TXN
    } else if !who.may(k, Rt::Group, r.group_id.0.as_str(), Op::Read) {
        GROUP
    } else {
        TOPIC
    };
    let denied = split_off(&mut r.topics, |t| {
        code == TOPIC && who.may(k, Rt::Topic, t.name.0.as_str(), Op::Read)
    })
    .into_iter()
    .map(|t| (t.name, t.partitions.iter().map(|p| p.partition_index).collect()))
    .collect();
    (denied, code)
}

pub fn txn_offset_commit_denied(resp: &mut TxnOffsetCommitResponse, (denied, code): (Parts, i16)) {
    use kafka_protocol::messages::txn_offset_commit_response::{
        TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
    };
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| TxnOffsetCommitResponseTopic::default().with_name(n).with_partitions(ps),
        |p| {
            TxnOffsetCommitResponsePartition::default()
                .with_partition_index(p)
                .with_error_code(code)
        },
    );
}

/// An OffsetFetch's refused parts: topics (v0–v7), topics per group, and
/// groups (v8+).
pub type FetchDenied = (Parts, Vec<(GroupId, Parts)>, Vec<GroupId>);

/// OffsetFetch: DESCRIBE on the group(s) (v8+: per group); topics the
/// caller may not describe are answered TOPIC_AUTHORIZATION_FAILED, or
/// left out of an all-topics answer. Err: the whole answer.
pub fn offset_fetch(
    k: &Kafka,
    who: &Caller,
    r: &mut OffsetFetchRequest,
    version: i16,
) -> Result<FetchDenied, OffsetFetchResponse> {
    let topic_ok = |n: &str| who.may(k, Rt::Topic, n, Op::Describe);
    if version < 8 {
        if !who.may(k, Rt::Group, r.group_id.0.as_str(), Op::Describe) {
            return Err(OffsetFetchResponse::default().with_error_code(GROUP));
        }
        let denied = match r.topics.as_mut() {
            Some(ts) => split_off(ts, |t| topic_ok(t.name.0.as_str()))
                .into_iter()
                .map(|t| (t.name, t.partition_indexes))
                .collect(),
            None => Vec::new(),
        };
        return Ok((denied, Vec::new(), Vec::new()));
    }
    let denied_groups = split_off(&mut r.groups, |g| {
        who.may(k, Rt::Group, g.group_id.0.as_str(), Op::Describe)
    })
    .into_iter()
    .map(|g| g.group_id)
    .collect();
    let mut per_group = Vec::new();
    for g in r.groups.iter_mut() {
        if let Some(ts) = g.topics.as_mut() {
            let d: Parts = split_off(ts, |t| topic_ok(t.name.0.as_str()))
                .into_iter()
                .map(|t| (t.name, t.partition_indexes))
                .collect();
            if !d.is_empty() {
                per_group.push((g.group_id.clone(), d));
            }
        }
    }
    Ok((Vec::new(), per_group, denied_groups))
}

pub fn offset_fetch_denied(
    k: &Kafka,
    who: &Caller,
    resp: &mut OffsetFetchResponse,
    (denied, per_group, denied_groups): FetchDenied,
) {
    use kafka_protocol::messages::offset_fetch_response::*;
    if !who.checked(k) {
        return;
    }
    // All-topics answers: only what the caller may describe.
    resp.topics
        .retain(|t| who.sees(k, Rt::Topic, t.name.0.as_str(), Op::Describe));
    for g in resp.groups.iter_mut() {
        g.topics
            .retain(|t| who.sees(k, Rt::Topic, t.name.0.as_str(), Op::Describe));
    }
    let part = |p: i32| {
        OffsetFetchResponsePartition::default()
            .with_partition_index(p)
            .with_committed_offset(-1)
            .with_committed_leader_epoch(-1)
            .with_error_code(TOPIC)
    };
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| OffsetFetchResponseTopic::default().with_name(n).with_partitions(ps),
        part,
    );
    for (gid, ds) in per_group {
        if let Some(g) = resp.groups.iter_mut().find(|g| g.group_id == gid) {
            for (name, parts) in ds {
                g.topics.push(
                    OffsetFetchResponseTopics::default().with_name(name).with_partitions(
                        parts
                            .into_iter()
                            .map(|p| {
                                OffsetFetchResponsePartitions::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(-1)
                                    .with_committed_leader_epoch(-1)
                                    .with_error_code(TOPIC)
                            })
                            .collect(),
                    ),
                );
            }
        }
    }
    for gid in denied_groups {
        resp.groups.push(
            OffsetFetchResponseGroup::default()
                .with_group_id(gid)
                .with_error_code(GROUP),
        );
    }
}

/// FindCoordinator: DESCRIBE on the group or the transactional id; Err:
/// the answer for a refused single key (v0–v3).
pub fn find_coordinator(
    k: &Kafka,
    who: &Caller,
    r: &mut FindCoordinatorRequest,
    version: i16,
) -> Result<Vec<StrBytes>, Box<FindCoordinatorResponse>> {
    let (rt, code) = match r.key_type {
        1 => (Rt::TransactionalId, TXN),
        _ => (Rt::Group, GROUP),
    };
    if version < 4 {
        return match who.may(k, rt, r.key.as_str(), Op::Describe) {
            true => Ok(Vec::new()),
            false => Err(Box::new(
                FindCoordinatorResponse::default()
                    .with_error_code(code)
                    .with_node_id(BrokerId(-1))
                    .with_host(StrBytes::from_static_str(""))
                    .with_port(-1),
            )),
        };
    }
    Ok(split_off(&mut r.coordinator_keys, |key| {
        who.may(k, rt, key.as_str(), Op::Describe)
    }))
}

pub fn find_coordinator_denied(resp: &mut FindCoordinatorResponse, denied: Vec<StrBytes>, key_type: i8) {
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    let code = if key_type == 1 { TXN } else { GROUP };
    for key in denied {
        resp.coordinators.push(
            Coordinator::default()
                .with_key(key)
                .with_node_id(BrokerId(-1))
                .with_port(-1)
                .with_error_code(code),
        );
    }
}

/// JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat:
/// READ on the group.
pub fn group_member(k: &Kafka, who: &Caller, group: &GroupId) -> bool {
    who.may(k, Rt::Group, group.0.as_str(), Op::Read)
}

pub const GROUP_DENIED: i16 = GROUP;
pub const TXN_DENIED: i16 = TXN;
pub const CLUSTER_DENIED: i16 = CLUSTER;

/// DescribeGroups: DESCRIBE per group; DeleteGroups: DELETE per group.
pub fn groups(k: &Kafka, who: &Caller, groups: &mut Vec<GroupId>, op: Op) -> Vec<GroupId> {
    split_off(groups, |g| who.may(k, Rt::Group, g.0.as_str(), op))
}

/// ListGroups: every group with DESCRIBE on the cluster, else those the
/// caller may describe.
pub fn list_groups(k: &Kafka, who: &Caller, resp: &mut ListGroupsResponse) {
    if who.sees(k, Rt::Cluster, rokka_broker::acl::CLUSTER_NAME, Op::Describe) {
        return;
    }
    resp.groups
        .retain(|g| who.sees(k, Rt::Group, g.group_id.0.as_str(), Op::Describe));
}

/// CreateTopics: CREATE on the cluster or each topic; DeleteTopics: DELETE
/// on each; CreatePartitions: ALTER on each.
pub fn create_topics(k: &Kafka, who: &Caller, r: &mut CreateTopicsRequest) -> Vec<TopicName> {
    split_off(&mut r.topics, |t| who.may_create_topic(k, t.name.0.as_str()))
        .into_iter()
        .map(|t| t.name)
        .collect()
}

pub fn create_topics_denied(resp: &mut CreateTopicsResponse, denied: Vec<TopicName>) {
    use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
    for name in denied {
        resp.topics.push(
            CreatableTopicResult::default()
                .with_name(name)
                .with_error_code(TOPIC)
                .with_num_partitions(-1)
                .with_replication_factor(-1)
                .with_topic_config_error_code(TOPIC),
        );
    }
}

/// DeleteTopics by name (v0–v5: `topic_names`; v6: `topics`, by name or id).
pub fn delete_topics(
    k: &Kafka,
    who: &Caller,
    r: &mut DeleteTopicsRequest,
) -> Vec<kafka_protocol::messages::delete_topics_request::DeleteTopicState> {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    let mut denied: Vec<DeleteTopicState> =
        split_off(&mut r.topic_names, |n| who.may(k, Rt::Topic, n.0.as_str(), Op::Delete))
            .into_iter()
            .map(|n| DeleteTopicState::default().with_name(Some(n)))
            .collect();
    denied.extend(split_off(&mut r.topics, |t| {
        let name = match &t.name {
            Some(n) => Some(n.0.to_string()),
            None => k.broker.topics().name_of_id(t.topic_id.as_bytes()),
        };
        name.is_none_or(|n| who.may(k, Rt::Topic, &n, Op::Delete))
    }));
    denied
}

pub fn delete_topics_denied(
    resp: &mut DeleteTopicsResponse,
    denied: Vec<kafka_protocol::messages::delete_topics_request::DeleteTopicState>,
) {
    use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
    for t in denied {
        resp.responses.push(
            DeletableTopicResult::default()
                .with_name(t.name)
                .with_topic_id(t.topic_id)
                .with_error_code(TOPIC),
        );
    }
}

pub fn create_partitions(k: &Kafka, who: &Caller, r: &mut CreatePartitionsRequest) -> Vec<TopicName> {
    split_off(&mut r.topics, |t| who.may(k, Rt::Topic, t.name.0.as_str(), Op::Alter))
        .into_iter()
        .map(|t| t.name)
        .collect()
}

pub fn create_partitions_denied(resp: &mut CreatePartitionsResponse, denied: Vec<TopicName>) {
    use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
    for name in denied {
        resp.results.push(
            CreatePartitionsTopicResult::default()
                .with_name(name)
                .with_error_code(TOPIC),
        );
    }
}

/// DeleteRecords: DELETE on each topic.
pub fn delete_records(k: &Kafka, who: &Caller, r: &mut DeleteRecordsRequest) -> Parts {
    split_off(&mut r.topics, |t| who.may(k, Rt::Topic, t.name.0.as_str(), Op::Delete))
        .into_iter()
        .map(|t| (t.name, t.partitions.iter().map(|p| p.partition_index).collect()))
        .collect()
}

pub fn delete_records_denied(resp: &mut DeleteRecordsResponse, denied: Parts) {
    use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| DeleteRecordsTopicResult::default().with_name(n).with_partitions(ps),
        |p| {
            DeleteRecordsPartitionResult::default()
                .with_partition_index(p)
                .with_low_watermark(-1)
                .with_error_code(TOPIC)
        },
    );
}

/// OffsetDelete: DELETE on the group (Err: the whole answer), READ on each
/// topic.
pub fn offset_delete(k: &Kafka, who: &Caller, r: &mut OffsetDeleteRequest) -> Result<Parts, OffsetDeleteResponse> {
    if !who.may(k, Rt::Group, r.group_id.0.as_str(), Op::Delete) {
        return Err(OffsetDeleteResponse::default().with_error_code(GROUP));
    }
    Ok(
        split_off(&mut r.topics, |t| who.may(k, Rt::Topic, t.name.0.as_str(), Op::Read))
            .into_iter()
            .map(|t| (t.name, t.partitions.iter().map(|p| p.partition_index).collect()))
            .collect(),
    )
}

pub fn offset_delete_denied(resp: &mut OffsetDeleteResponse, denied: Parts) {
    use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| OffsetDeleteResponseTopic::default().with_name(n).with_partitions(ps),
        |p| {
            OffsetDeleteResponsePartition::default()
                .with_partition_index(p)
                .with_error_code(TOPIC)
        },
    );
}

/// Config resources: a topic's (type 2) need `op` on the topic, a
/// broker's (4) or broker logger's (8) on the cluster.
fn config_resource_ok(k: &Kafka, who: &Caller, resource_type: i8, name: &str, op: Op) -> bool {
    match resource_type {
        2 => who.may(k, Rt::Topic, name, op),
        _ => who.may_cluster(k, op),
    }
}

fn config_denied_code(resource_type: i8) -> i16 {
    if resource_type == 2 {
        TOPIC
    } else {
        CLUSTER
    }
}

/// Config resources refused `op`, taken out of `items` as (type, name).
fn configs_refused<T>(
    k: &Kafka,
    who: &Caller,
    items: &mut Vec<T>,
    op: Op,
    of: impl Fn(&T) -> (i8, &StrBytes),
) -> Vec<(i8, StrBytes)> {
    split_off(items, |c| {
        let (t, name) = of(c);
        config_resource_ok(k, who, t, name.as_str(), op)
    })
    .iter()
    .map(|c| {
        let (t, name) = of(c);
        (t, name.clone())
    })
    .collect()
}

/// Appends an answer (`make(type, name, error)`) for each refused config
/// resource.
fn push_configs_denied<T>(list: &mut Vec<T>, denied: Vec<(i8, StrBytes)>, make: impl Fn(i8, StrBytes, i16) -> T) {
    list.extend(denied.into_iter().map(|(t, name)| make(t, name, config_denied_code(t))));
}

pub fn describe_configs(k: &Kafka, who: &Caller, r: &mut DescribeConfigsRequest) -> Vec<(i8, StrBytes)> {
    configs_refused(k, who, &mut r.resources, Op::DescribeConfigs, |c| {
        (c.resource_type, &c.resource_name)
    })
}

pub fn describe_configs_denied(resp: &mut DescribeConfigsResponse, denied: Vec<(i8, StrBytes)>) {
    use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
    push_configs_denied(&mut resp.results, denied, |t, name, code| {
        DescribeConfigsResult::default()
            .with_resource_type(t)
            .with_resource_name(name)
            .with_error_code(code)
    });
}

pub fn alter_configs(k: &Kafka, who: &Caller, r: &mut AlterConfigsRequest) -> Vec<(i8, StrBytes)> {
    configs_refused(k, who, &mut r.resources, Op::AlterConfigs, |c| {
        (c.resource_type, &c.resource_name)
    })
}

pub fn alter_configs_denied(resp: &mut AlterConfigsResponse, denied: Vec<(i8, StrBytes)>) {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    push_configs_denied(&mut resp.responses, denied, |t, name, code| {
        AlterConfigsResourceResponse::default()
            .with_resource_type(t)
            .with_resource_name(name)
            .with_error_code(code)
    });
}

pub fn incremental_alter_configs(
    k: &Kafka,
    who: &Caller,
    r: &mut IncrementalAlterConfigsRequest,
) -> Vec<(i8, StrBytes)> {
    configs_refused(k, who, &mut r.resources, Op::AlterConfigs, |c| {
        (c.resource_type, &c.resource_name)
    })
}

pub fn incremental_alter_configs_denied(resp: &mut IncrementalAlterConfigsResponse, denied: Vec<(i8, StrBytes)>) {
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    push_configs_denied(&mut resp.responses, denied, |t, name, code| {
        AlterConfigsResourceResponse::default()
            .with_resource_type(t)
            .with_resource_name(name)
            .with_error_code(code)
    });
}

/// InitProducerId: WRITE on the transactional id, or (idempotent only)
/// IDEMPOTENT_WRITE on the cluster or WRITE on some topic.
pub fn init_producer_id(k: &Kafka, who: &Caller, r: &InitProducerIdRequest) -> Option<i16> {
    match &r.transactional_id {
        Some(t) if !t.0.is_empty() => (!who.may(k, Rt::TransactionalId, t.0.as_str(), Op::Write)).then_some(TXN),
        _ => (!who.may_write_idempotently(k)).then_some(CLUSTER),
    }
}

/// AddPartitionsToTxn (v0–v3, one transaction): WRITE on the
/// transactional id and each topic; anything refused fails the whole
/// request, the rest answered OPERATION_NOT_ATTEMPTED (as Kafka does).
pub fn add_partitions_to_txn(
    k: &Kafka,
    who: &Caller,
    r: &AddPartitionsToTxnRequest,
) -> Option<AddPartitionsToTxnResponse> {
    use kafka_protocol::messages::add_partitions_to_txn_response::*;
    let txn_ok = who.may(
        k,
        Rt::TransactionalId,
        r.v3_and_below_transactional_id.0.as_str(),
        Op::Write,
    );
    let refused: Vec<bool> = r
        .v3_and_below_topics
        .iter()
        .map(|t| !txn_ok || !who.may(k, Rt::Topic, t.name.0.as_str(), Op::Write))
        .collect();
    if txn_ok && !refused.contains(&true) {
        return None;
    }
    let results = r
        .v3_and_below_topics
        .iter()
        .zip(refused)
        .map(|(t, refused)| {
            let code = match (txn_ok, refused) {
                (false, _) => TXN,
                (true, true) => TOPIC,
                (true, false) => OPERATION_NOT_ATTEMPTED,
            };
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(*p)
                                .with_partition_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    Some(AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results))
}

/// AddOffsetsToTxn: WRITE on the transactional id, READ on the group.
pub fn add_offsets_to_txn(k: &Kafka, who: &Caller, r: &AddOffsetsToTxnRequest) -> Option<i16> {
    if !who.may(k, Rt::TransactionalId, r.transactional_id.0.as_str(), Op::Write) {
        return Some(TXN);
    }
    (!who.may(k, Rt::Group, r.group_id.0.as_str(), Op::Read)).then_some(GROUP)
}

/// DescribeTransactions: DESCRIBE per id (refused ones answered
/// TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
pub fn describe_transactions(k: &Kafka, who: &Caller, r: &mut DescribeTransactionsRequest) -> Vec<TransactionalId> {
    split_off(&mut r.transactional_ids, |t| {
        who.may(k, Rt::TransactionalId, t.0.as_str(), Op::Describe)
    })
}

/// DescribeTransactions: denied ids answered TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
/// a described transaction lists only the topics the caller may describe
/// (KafkaApis.handleDescribeTransactionsRequest filters them so).
pub fn describe_transactions_denied(
    k: &Kafka,
    who: &Caller,
    resp: &mut DescribeTransactionsResponse,
    denied: Vec<TransactionalId>,
) {
    use kafka_protocol::messages::describe_transactions_response::TransactionState;
    for st in &mut resp.transaction_states {
        st.topics
            .retain(|t| who.sees(k, Rt::Topic, t.topic.0.as_str(), Op::Describe));
    }
    for t in denied {
        resp.transaction_states.push(
            TransactionState::default()
                .with_transactional_id(t)
                .with_error_code(TXN)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        );
    }
}

/// ListTransactions: only ids the caller may describe.
pub fn list_transactions(k: &Kafka, who: &Caller, resp: &mut ListTransactionsResponse) {
    resp.transaction_states
        .retain(|t| who.sees(k, Rt::TransactionalId, t.transactional_id.0.as_str(), Op::Describe));
}

/// DescribeProducers: READ on each topic.
pub fn describe_producers(k: &Kafka, who: &Caller, r: &mut DescribeProducersRequest) -> Parts {
    split_off(&mut r.topics, |t| who.may(k, Rt::Topic, t.name.0.as_str(), Op::Read))
        .into_iter()
        .map(|t| (t.name, t.partition_indexes))
        .collect()
}

pub fn describe_producers_denied(resp: &mut DescribeProducersResponse, denied: Parts) {
    use kafka_protocol::messages::describe_producers_response::{PartitionResponse, TopicResponse};
    push_denied(
        &mut resp.topics,
        denied,
        |n, ps| TopicResponse::default().with_name(n).with_partitions(ps),
        |p| {
            PartitionResponse::default()
                .with_partition_index(p)
                .with_error_code(TOPIC)
        },
    );
}
