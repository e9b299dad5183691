//! Kafka members of mixed consumer groups (groups that also have RocketMQ
//! clients; `rokka_broker::membership`). The coordinator's members are
//! reported to the shared membership every 100 ms; a change on the RocketMQ
//! side rebalances the Kafka group; and the leader's SyncGroup assignment is
//! replaced by Rokka's: each topic's sorted partitions allocated over all
//! sorted member ids with RocketMQ's averaging strategy, the allocation the
//! RocketMQ clients compute for themselves.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rokka_broker::membership::allocate_averagely;
use tokio::sync::watch;

use crate::Kafka;

/// Topics a member subscribes to, from its ConsumerProtocolSubscription.
pub fn subscribed_topics(metadata: &Bytes) -> BTreeSet<String> {
    let mut b = metadata.clone();
    if b.len() < 2 {
        return BTreeSet::new();
    }
    let version = i16::from_be_bytes([b[0], b[1]]);
    let _ = bytes::Buf::get_i16(&mut b);
    match ConsumerProtocolSubscription::decode(&mut b, version.clamp(0, 3)) {
        Ok(s) => s.topics.iter().map(|t| t.to_string()).collect(),
        Err(_) => BTreeSet::new(),
    }
}

/// A ConsumerProtocolSubscription (version 0) of `topics`.
pub fn encode_subscription(topics: &BTreeSet<String>) -> Bytes {
    let s = ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| StrBytes::from_string(t.clone())).collect());
    let mut out = BytesMut::new();
    out.put_i16(0);
    if s.encode(&mut out, 0).is_err() {
        return Bytes::new();
    }
    out.freeze()
}

/// The share of `member` among the sorted `ids`, per topic, as an assignment.
pub fn share(k: &Kafka, topics: &BTreeSet<String>, ids: &[String], member: &str) -> Bytes {
    let mut parts = BTreeMap::new();
    for t in topics {
        // Cut from the list RocketMQ members cut theirs from: the topic's
        // queues over every broker set in the clients' order.
        let order = k.broker.topics().get(t).map(|i| i.rocketmq_order()).unwrap_or_default();
        let mut mine: Vec<i32> = allocate_averagely(order.len(), ids, member)
            .into_iter()
            .filter_map(|i| order.get(i).copied())
            .collect();
        mine.sort_unstable();
        parts.insert(t.clone(), mine);
    }
    encode_assignment(&parts)
}

/// Whether a Kafka member subscribing to `topics` may join `group`: a group
/// with RocketMQ members needs the same topics (clear error otherwise).
pub fn conflicts(k: &Kafka, group: &str, topics: &BTreeSet<String>) -> bool {
    if k.broker.membership().has_pop_consumers(group, rokka_store::now_ms()) {
        // RocketMQ 5 clients consume this group by pop: a Kafka member
        // owning partitions would get their messages again.
        metrics::counter!("rokka_mixed_group_conflicts_total", "group" => group.to_string(), "side" => "kafka")
            .increment(1);
        if CONFLICT_LOG.ready() {
            tracing::warn!(
                group,
                "Kafka member refused: the group is consumed by pop (RocketMQ 5 gRPC clients)"
            );
        }
        return true;
    }
    let conflict = k.broker.membership().with_group(group, |m| {
        (!m.rocketmq.is_empty() && !topics.is_empty() && *topics != m.rocketmq_topics)
            .then(|| m.rocketmq_topics.clone())
    });
    if let Some(rocketmq_topics) = &conflict {
        metrics::counter!("rokka_mixed_group_conflicts_total", "group" => group.to_string(), "side" => "kafka")
            .increment(1);
        if CONFLICT_LOG.ready() {
            tracing::warn!(
                group,
                kafka = ?topics,
                rocketmq = ?rocketmq_topics,
                "Kafka member refused: its subscription differs from the group's RocketMQ members'"
            );
        }
    }
    conflict.is_some()
}

/// The refusals above, logged at most once a minute (a client's JoinGroup
/// loop would log one each; all are counted).
static CONFLICT_LOG: rokka_broker::limits::LogEvery = rokka_broker::limits::LogEvery::new(60_000);

/// The partitions a ConsumerProtocolAssignment gives, by topic (empty
/// when it cannot be read).
pub fn assigned_partitions(assignment: &Bytes) -> BTreeMap<String, BTreeSet<i32>> {
    let mut out: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    let mut b = assignment.clone();
    if b.len() < 2 {
        return out;
    }
    let version = i16::from_be_bytes([b[0], b[1]]);
    let _ = bytes::Buf::get_i16(&mut b);
    if let Ok(a) = ConsumerProtocolAssignment::decode(&mut b, version.clamp(0, 3)) {
        for tp in a.assigned_partitions {
            out.entry(tp.topic.0.to_string()).or_default().extend(tp.partitions);
        }
    }
    out
}

/// Every partition the members' assignments give, of the topics they
/// subscribe to that exist and within their partitions: what a leader's
/// assignment names is the client's (kept per group, and published to
/// every node in cluster mode).
/// Also whether every subscribed topic assigned is known here (in cluster
/// mode a topic made on another node may be assigned before this node's
/// table has it: its partitions are read again at the next tick).
fn held_partitions(
    k: &Kafka,
    members: &[rokka_group::MemberView],
    subscribed: &BTreeSet<String>,
) -> (BTreeMap<String, BTreeSet<i32>>, bool) {
    let mut out: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    let mut complete = true;
    for m in members {
        for (t, ps) in assigned_partitions(&m.assignment) {
            if !subscribed.contains(&t) {
                continue;
            }
            let Some(n) = k.broker.topics().get(&t).map(|i| i.kafka_partitions() as i32) else {
                complete = false;
                continue;
            };
            out.entry(t)
                .or_default()
                .extend(ps.into_iter().filter(|p| (0..n).contains(p)));
        }
    }
    out.retain(|_, ps| !ps.is_empty());
    (out, complete)
}

/// A ConsumerProtocolAssignment (version 0) of `parts`.
pub fn encode_assignment(parts: &BTreeMap<String, Vec<i32>>) -> Bytes {
    let a = ConsumerProtocolAssignment::default().with_assigned_partitions(
        parts
            .iter()
            .map(|(t, p)| {
                TopicPartition::default()
                    .with_topic(TopicName(StrBytes::from_string(t.clone())))
                    .with_partitions(p.clone())
            })
            .collect(),
    );
    let mut out = BytesMut::new();
    out.put_i16(0);
    if a.encode(&mut out, 0).is_err() {
        return Bytes::new();
    }
    out.freeze()
}

/// Rokka's assignment for the Kafka members of a mixed group, or `None` when
/// the group has no RocketMQ members (the leader's assignment stands).
pub fn assignments(k: &Kafka, group: &str) -> Option<Vec<(String, Bytes)>> {
    let rmq = k.broker.membership().with_group(group, |m| m.rocketmq.clone());
    if rmq.is_empty() {
        return None;
    }
    let view = k.groups.with(|c| c.describe(group))?;
    let kafka: Vec<(String, BTreeSet<String>)> = view
        .members
        .iter()
        .map(|m| (m.member_id.clone(), subscribed_topics(&m.metadata)))
        .collect();
    let ids: Vec<String> = rmq
        .into_iter()
        .chain(kafka.iter().map(|(id, _)| id.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let out = kafka
        .into_iter()
        .map(|(id, topics)| {
            let bytes = share(k, &topics, &ids, &id);
            (id, bytes)
        })
        .collect();
    metrics::counter!("rokka_mixed_group_assignments_total", "group" => group.to_string()).increment(1);
    Some(out)
}

/// Reports the coordinator's members to the shared membership and rebalances
/// groups whose RocketMQ side changed, until `shutdown`.
pub async fn run(k: Arc<Kafka>, mut shutdown: watch::Receiver<bool>) {
    let mut events = k.broker.membership().kafka_events();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    // Per group: member ids and their topics (known once the coordinator has
    // selected the group's protocol; empty while the first join is pending).
    let mut known: HashMap<String, (BTreeSet<String>, BTreeSet<String>, i32)> = HashMap::new();
    // Per group: the generation whose assignments were last published.
    let mut held: HashMap<String, i32> = HashMap::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(g) = events.recv() => {
                let now = k.groups.now();
                tracing::info!(group = g, "RocketMQ members changed: rebalancing the Kafka members");
                k.groups.force_rebalance(&g, now);
                continue;
            }
            _ = shutdown.changed() => return,
        }
        let views: Vec<_> = k.groups.with(|c| {
            c.list()
                .into_iter()
                .filter_map(|(name, _, _)| c.describe(&name))
                .collect()
        });
        let mut seen = BTreeSet::new();
        for v in views {
            let ids: BTreeSet<String> = v.members.iter().map(|m| m.member_id.clone()).collect();
            seen.insert(v.name.clone());
            // Subscriptions are parsed while they are unknown, the members
            // changed or a new generation came (a member changing its
            // subscription rejoins under its own id; a first join pending
            // ends in a new generation); the ids and the generation are
            // cheap to compare every tick. (An Empty group, or one whose
            // subscriptions are not the consumer protocol's, is not parsed
            // and set again every tick.)
            let fresh = known
                .get(&v.name)
                .is_some_and(|(k, _, g)| *k == ids && *g == v.generation);
            if !fresh {
                // A static member back under a new member id keeps its
                // assignment without a rebalance (KIP-345), but RocketMQ
                // members allocate by the sorted ids: in a mixed group the
                // Kafka side is made to rebalance too, or the two sides'
                // shares drift apart (queues read twice or by no one).
                if known
                    .get(&v.name)
                    .is_some_and(|(before, _, g)| *g == v.generation && *before != ids && before.len() == ids.len())
                    && k.broker.membership().with_mixed(&v.name, |_| ()).is_some()
                {
                    tracing::info!(
                        group = v.name,
                        "a static member's id changed in a mixed group: rebalancing"
                    );
                    k.groups.force_rebalance(&v.name, k.groups.now());
                }
                let each: Vec<BTreeSet<String>> = v
                    .members
                    .iter()
                    .map(|m| subscribed_topics(&m.metadata))
                    .filter(|t| !t.is_empty())
                    .collect();
                // (Members subscribing to different topics — legal in
                // Kafka — keep RocketMQ clients out: their union is no one's.)
                let differ = each.windows(2).any(|w| w[0] != w[1]);
                let topics: BTreeSet<String> = each.into_iter().flatten().collect();
                k.broker
                    .membership()
                    .set_kafka_differing(&v.name, ids.clone(), topics.clone(), differ);
                known.insert(v.name.clone(), (ids, topics, v.generation));
            }
            // The partitions the Kafka members hold by their last SyncGroup,
            // read once per generation when it is Stable (while a rebalance
            // completes the assignments are being replaced: the last ones
            // stand): a RocketMQ client joining takes its share only once
            // they have given it up — until their rebalance completes they
            // go on consuming it.
            if v.state == rokka_group::GroupState::Stable && held.get(&v.name) != Some(&v.generation) {
                let subscribed = known.get(&v.name).map(|e| &e.1);
                let (parts, complete) = held_partitions(&k, &v.members, subscribed.unwrap_or(&BTreeSet::new()));
                // (Read again at the next tick while a topic is unknown here.)
                if k.broker.membership().set_kafka_held(&v.name, parts) && complete {
                    held.insert(v.name.clone(), v.generation);
                }
            }
        }
        known.retain(|g, _| {
            let keep = seen.contains(g);
            if !keep {
                k.broker.membership().set_kafka(g, BTreeSet::new(), BTreeSet::new());
            }
            keep
        });
        held.retain(|g, _| seen.contains(g));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An assignment reads back as the partitions it gives.
    #[test]
    fn an_assignment_reads_back_as_its_partitions() {
        let parts = BTreeMap::from([("a".to_string(), vec![2, 0]), ("b".to_string(), vec![5])]);
        let got = assigned_partitions(&encode_assignment(&parts));
        assert_eq!(
            got,
            BTreeMap::from([
                ("a".to_string(), BTreeSet::from([0, 2])),
                ("b".to_string(), BTreeSet::from([5])),
            ])
        );
        assert!(assigned_partitions(&Bytes::from_static(b"\x00")).is_empty());
    }

    /// What the members hold is kept of the topics they subscribe to that
    /// exist, within their partitions: a leader's assignment naming other
    /// topics or partitions is not kept (nor published to every node).
    #[test]
    fn held_partitions_are_the_subscribed_topics_real_partitions() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = std::sync::Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = std::sync::Arc::new(rokka_broker::Broker::new(store, Default::default())?);
        broker.create_topic("a", 3)?;
        broker.create_topic("other", 3)?;
        let k = crate::Kafka::new(
            broker,
            Default::default(),
            Default::default(),
            "127.0.0.1:9092".parse()?,
        );
        let member = |parts: &BTreeMap<String, Vec<i32>>| rokka_group::MemberView {
            member_id: "m".into(),
            instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            metadata: Bytes::new(),
            assignment: encode_assignment(parts),
        };
        let members = [
            member(&BTreeMap::from([("a".to_string(), vec![0, 2, 3, -1, 1 << 30])])),
            member(&BTreeMap::from([
                ("other".to_string(), vec![0]),
                ("ghost".to_string(), vec![0]),
            ])),
        ];
        let subscribed = BTreeSet::from(["a".to_string(), "ghost".to_string()]);
        let (held, complete) = held_partitions(&k, &members, &subscribed);
        assert_eq!(held, BTreeMap::from([("a".to_string(), BTreeSet::from([0, 2]))]));
        assert!(!complete, "ghost is subscribed, assigned and unknown here: read again");
        let (_, complete) = held_partitions(&k, &members[..1], &subscribed);
        assert!(complete);
        Ok(())
    }
}
