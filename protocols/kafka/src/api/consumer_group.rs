//! KIP-848 consumer groups: ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe over `rokka_group::consumer` (the broker computes
//! assignments; topic ids on the wire, names inside).

use std::collections::HashMap;

use kafka_protocol::messages::consumer_group_describe_response::{
    Assignment as DescribedAssignment, DescribedGroup, Member, TopicPartitions as DescribedTps,
};
use kafka_protocol::messages::consumer_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::*;
use rokka_group::consumer::{HeartbeatRequest, Tp};

use super::str_bytes;
use crate::errors;
use crate::Kafka;

/// Topic names ↔ ids, looked up in the topic table as a request needs
/// them (a heartbeat names a few topics; the table may hold many).
struct Ids<'a> {
    k: &'a Kafka,
    /// (id, partitions) of the names looked up so far.
    seen: std::cell::RefCell<HashMap<String, Option<(uuid::Uuid, u32)>>>,
}

impl<'a> Ids<'a> {
    fn load(k: &'a Kafka) -> Ids<'a> {
        Ids {
            k,
            seen: Default::default(),
        }
    }

    fn by_name(&self, name: &str) -> Option<(uuid::Uuid, u32)> {
        if let Some(hit) = self.seen.borrow().get(name) {
            return *hit;
        }
        let found = self
            .k
            .broker
            .topics()
            .get(name)
            .map(|i| (uuid::Uuid::from_bytes(i.topic_id), i.kafka_partitions()));
        self.seen.borrow_mut().insert(name.to_string(), found);
        found
    }

    fn by_id(&self, id: &uuid::Uuid) -> Option<String> {
        self.k.broker.topics().name_of_id(id.as_bytes())
    }

    fn group(&self, tps: &[Tp]) -> Vec<(uuid::Uuid, String, Vec<i32>)> {
        let mut out: Vec<(uuid::Uuid, String, Vec<i32>)> = Vec::new();
        for (t, p) in tps {
            let Some((id, _)) = self.by_name(t) else { continue };
            match out.iter_mut().find(|(_, n, _)| n == t) {
                Some((_, _, ps)) => ps.push(*p as i32),
                None => out.push((id, t.clone(), vec![*p as i32])),
            }
        }
        out
    }
}

impl rokka_group::consumer::Topics for Ids<'_> {
    fn partitions(&self, topic: &str) -> Option<u32> {
        self.by_name(topic).map(|(_, n)| n)
    }

    fn names(&self) -> Vec<String> {
        self.k.broker.topics().names()
    }

    fn version(&self) -> u64 {
        self.k.broker.topics().version()
    }
}

pub async fn heartbeat(
    k: &Kafka,
    r: ConsumerGroupHeartbeatRequest,
    client_id: &str,
    peer: std::net::SocketAddr,
) -> ConsumerGroupHeartbeatResponse {
    let ids = Ids::load(k);
    let owned = r.topic_partitions.as_ref().map(|tps| {
        tps.iter()
            .filter_map(|t| ids.by_id(&t.topic_id).map(|name| (name, &t.partitions)))
            .flat_map(|(name, ps)| ps.iter().map(move |p| (name.clone(), (*p).max(0) as u32)))
            .collect::<Vec<Tp>>()
    });
    let req = HeartbeatRequest {
        group: r.group_id.to_string(),
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        instance_id: r.instance_id.as_ref().map(|s| s.to_string()),
        rack_id: r.rack_id.as_ref().map(|s| s.to_string()),
        rebalance_timeout_ms: r.rebalance_timeout_ms,
        subscribed_topics: r
            .subscribed_topic_names
            .as_ref()
            .map(|ts| ts.iter().map(|t| t.0.to_string()).collect()),
        subscribed_regex: r.subscribed_topic_regex.as_ref().map(|s| s.to_string()),
        server_assignor: r.server_assignor.as_ref().map(|s| s.to_string()),
        owned,
        client_id: client_id.to_string(),
        client_host: format!("/{}", peer.ip()),
    };
    let now = k.groups.now();
    let group = req.group.clone();
    // RocketMQ clients allocate queues themselves; the consumer protocol
    // has the broker assign them: the two cannot share a group.
    if req.member_epoch == 0 && k.broker.membership().with_group(&group, |m| !m.rocketmq.is_empty()) {
        metrics::counter!("rokka_mixed_group_conflicts_total", "group" => group.clone(), "side" => "kafka")
            .increment(1);
        return ConsumerGroupHeartbeatResponse::default()
            .with_error_code(errors::GROUP_ID_NOT_FOUND)
            .with_error_message(Some(str_bytes(&format!(
                "Group {group} has RocketMQ members; a consumer-protocol (KIP-848) member cannot join it."
            ))))
            .with_member_epoch(0);
    }
    let leaving = req.member_epoch < 0;
    let (mut resp, members_left, changed) = k.groups.with(|c| {
        let before = c.record_changes();
        let r = c.consumer_heartbeat(req, now, &ids);
        let left = c.consumer.groups.get(&group).map_or(0, |g| g.members.len());
        (r, left, c.record_changes() != before)
    });
    // Cluster mode: what the heartbeat changed (a member's new epoch or
    // assignment, a member come or gone) is held by the set's in-sync
    // replicas before the member is told, as Kafka answers after its
    // record is written, so a coordinator taking over knows the epoch the
    // member has. Not confirmed in time: retriable (the member sends its
    // previous epoch again, which is taken).
    if changed && resp.error == errors::NONE {
        if let Err(e) = k.broker.groups_durable(Some(k.groups.commit_timeout)).await {
            tracing::debug!(group, error = e, "consumer group change not replicated");
            resp.error = match k.broker.cluster_view() {
                Some(v) if !v.is_master() => super::not_coordinator::NOT_COORDINATOR,
                _ => errors::COORDINATOR_NOT_AVAILABLE,
            };
            resp.assignment = None;
        }
    }
    if resp.error == errors::NONE && resp.member_epoch > 0 {
        k.broker.membership().add_consumer_protocol_group(&group);
    } else if leaving && members_left == 0 {
        k.broker.membership().remove_consumer_protocol_group(&group);
    }
    if resp.error != errors::NONE {
        metrics::counter!("rokka_kafka_errors_total", "api" => "ConsumerGroupHeartbeat", "code" => crate::errors::label(resp.error))
            .increment(1);
    }
    let assignment = resp.assignment.as_ref().map(|tps| {
        Assignment::default().with_topic_partitions(
            ids.group(tps)
                .into_iter()
                .map(|(id, _, ps)| TopicPartitions::default().with_topic_id(id).with_partitions(ps))
                .collect(),
        )
    });
    ConsumerGroupHeartbeatResponse::default()
        .with_error_code(resp.error)
        .with_error_message(resp.message.as_deref().map(str_bytes))
        .with_member_id((!resp.member_id.is_empty()).then(|| str_bytes(&resp.member_id)))
        .with_member_epoch(resp.member_epoch)
        .with_heartbeat_interval_ms(resp.heartbeat_interval_ms)
        .with_assignment(assignment)
}

pub fn describe(k: &Kafka, r: ConsumerGroupDescribeRequest) -> ConsumerGroupDescribeResponse {
    let ids = Ids::load(k);
    let described = |tps: &[Tp]| {
        DescribedAssignment::default().with_topic_partitions(
            ids.group(tps)
                .into_iter()
                .map(|(id, name, ps)| {
                    DescribedTps::default()
                        .with_topic_id(id)
                        .with_topic_name(TopicName(str_bytes(&name)))
                        .with_partitions(ps)
                })
                .collect(),
        )
    };
    // A group named twice is described once (each copy cloned the group
    // under the coordinator's lock and answered every member again).
    let mut seen = std::collections::HashSet::with_capacity(r.group_ids.len().min(1024));
    let groups = r
        .group_ids
        .into_iter()
        .filter(|gid| seen.insert(gid.clone()))
        .map(|gid| {
            let view = k.groups.with(|c| {
                c.consumer.groups.get(gid.as_str()).map(|g| {
                    let members: Vec<_> = g
                        .members
                        .values()
                        .map(|m| {
                            (
                                m.clone(),
                                g.target
                                    .get(&m.id)
                                    .map(|t| t.iter().cloned().collect::<Vec<Tp>>())
                                    .unwrap_or_default(),
                            )
                        })
                        .collect();
                    (g.state(), g.epoch, g.assignment_epoch, g.assignor.clone(), members)
                })
            });
            match view {
                Some((state, epoch, assignment_epoch, assignor, members)) => DescribedGroup::default()
                    .with_group_id(gid)
                    .with_group_state(str_bytes(state))
                    .with_group_epoch(epoch)
                    .with_assignment_epoch(assignment_epoch)
                    .with_assignor_name(str_bytes(&assignor))
                    .with_authorized_operations(i32::MIN)
                    .with_members(
                        members
                            .into_iter()
                            .map(|(m, target)| {
                                let assigned: Vec<Tp> = m.assigned.iter().cloned().collect();
                                Member::default()
                                    .with_member_id(str_bytes(&m.id))
                                    .with_instance_id(m.instance_id.as_deref().map(str_bytes))
                                    .with_rack_id(m.rack_id.as_deref().map(str_bytes))
                                    // A static member that left: -2, as Kafka's record says.
                                    .with_member_epoch(if m.left { -2 } else { m.epoch })
                                    .with_client_id(str_bytes(&m.client_id))
                                    .with_client_host(str_bytes(&m.client_host))
                                    .with_subscribed_topic_names(
                                        m.subscribed.iter().map(|t| TopicName(str_bytes(t))).collect(),
                                    )
                                    .with_assignment(described(&assigned))
                                    .with_target_assignment(described(&target))
                                    .with_member_type(1)
                            })
                            .collect(),
                    ),
                None => DescribedGroup::default()
                    .with_error_code(errors::GROUP_ID_NOT_FOUND)
                    .with_error_message(Some(str_bytes(&format!("Group {} not found.", gid.as_str()))))
                    .with_group_id(gid)
                    .with_authorized_operations(i32::MIN),
            }
        })
        .collect();
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
