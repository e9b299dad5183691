//! ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments on
//! a broker set of one: every partition's only replica is its leader, the
//! preferred one, so an election is never needed, a reassignment to this
//! broker is a no-op, another is refused, and none is ever in progress.

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::*;

use super::str_bytes;
use crate::errors;
use crate::Kafka;

const ELECTION_NOT_NEEDED: i16 = 84;
const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;

fn known(k: &Kafka, topic: &str, p: i32) -> bool {
    k.broker.topics().get(topic).is_some_and(|i| i.has_partition(p))
}

pub fn elect_leaders(k: &Kafka, r: ElectLeadersRequest) -> ElectLeadersResponse {
    let asked: Vec<(String, Vec<i32>)> = match r.topic_partitions {
        Some(tps) => tps.into_iter().map(|t| (t.topic.0.to_string(), t.partitions)).collect(),
        // All partitions: only those that need an election are answered
        // (Kafka's ReplicationControlManager.electLeaders) — none here,
        // every partition has its set's master as leader; listing them
        // ELECTION_NOT_NEEDED fails the Java Admin's `all()`.
        None => Vec::new(),
    };
    let results = asked
        .into_iter()
        .map(|(topic, parts)| {
            let partition_result = parts
                .into_iter()
                .map(|p| {
                    let (code, msg) = if known(k, &topic, p) {
                        (ELECTION_NOT_NEEDED, "Leader election not needed for topic partition.")
                    } else {
                        (
                            errors::UNKNOWN_TOPIC_OR_PARTITION,
                            "This server does not host this topic-partition.",
                        )
                    };
                    PartitionResult::default()
                        .with_partition_id(p)
                        .with_error_code(code)
                        .with_error_message(Some(str_bytes(msg)))
                })
                .collect();
            ReplicaElectionResult::default()
                .with_topic(TopicName(str_bytes(&topic)))
                .with_partition_result(partition_result)
        })
        .collect();
    ElectLeadersResponse::default().with_replica_election_results(results)
}

pub fn alter_reassignments(k: &Kafka, r: AlterPartitionReassignmentsRequest) -> AlterPartitionReassignmentsResponse {
    let node = k.config.node_id;
    let responses = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let (code, msg) = if !known(k, &name, p.partition_index) {
                        (errors::UNKNOWN_TOPIC_OR_PARTITION, None)
                    } else {
                        match p.replicas {
                            None => (NO_REASSIGNMENT_IN_PROGRESS, None),
                            Some(rs) if rs.len() == 1 && rs[0].0 == node => (errors::NONE, None),
                            Some(rs) => (
                                errors::INVALID_REPLICA_ASSIGNMENT,
                                Some(format!(
                                    "replicas {:?}: this broker set has one broker, {node}",
                                    rs.iter().map(|b| b.0).collect::<Vec<_>>()
                                )),
                            ),
                        }
                    };
                    ReassignablePartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                        .with_error_message(msg.map(|m| str_bytes(&m)))
                })
                .collect();
            ReassignableTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    AlterPartitionReassignmentsResponse::default().with_responses(responses)
}

pub fn list_reassignments(_k: &Kafka, _r: ListPartitionReassignmentsRequest) -> ListPartitionReassignmentsResponse {
    // Nothing is ever being moved.
    ListPartitionReassignmentsResponse::default()
}
