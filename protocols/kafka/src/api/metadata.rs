//! Metadata: one broker (this one) leads every partition; in cluster mode
//! the master of the partition's broker set does, and every live node is
//! listed. Topics named in
//! the request are auto-created when the client allows it and the broker's
//! `auto_create_topics` is on.

use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use rokka_broker::acl::{Operation as Op, ResourceType as Rt};
use rokka_broker::TopicInfo;

use super::str_bytes;
use crate::errors;
use crate::Kafka;

/// A partition's leader, leader epoch, replicas and ISR.
type Leadership = (BrokerId, i32, Vec<BrokerId>, Vec<BrokerId>);

pub fn topic_entry(k: &Kafka, name: &str, info: &TopicInfo, version: i16) -> MetadataResponseTopic {
    let node = BrokerId(k.config.node_id);
    let view = k.broker.cluster_view();
    let ids = |v: &[u32]| v.iter().map(|m| BrokerId(*m as i32)).collect::<Vec<_>>();
    // Cluster mode: a partition's set's master leads it, at the set's
    // epoch; replicas are the set's live members, the ISR its live sync
    // state set. A topic placed over several sets names each partition's.
    let pending = k.broker.cluster_view_pending();
    let leadership = |set: &str| -> Leadership {
        let Some(v) = view.as_deref() else {
            if pending {
                // Cluster mode, no view yet: no leader known
                // (LEADER_NOT_AVAILABLE; clients ask again).
                return (BrokerId(-1), 0, Vec::new(), Vec::new());
            }
            return (node, 0, vec![node], vec![node]);
        };
        let (master, epoch, sss, members) = match v.set_named(set) {
            Some(s) => (s.master, s.epoch, &s.sss, &s.members),
            None if set == v.set => (v.master, v.epoch, &v.sss, &v.members),
            None => return (BrokerId(-1), 0, Vec::new(), Vec::new()),
        };
        let isr: Vec<u32> = sss.iter().copied().filter(|m| members.contains(m)).collect();
        (
            master.map_or(BrokerId(-1), |m| BrokerId(m as i32)),
            epoch as i32,
            ids(members),
            ids(&isr),
        )
    };
    let own = view.as_deref().map(|v| v.set.clone()).unwrap_or_default();
    let mut by_set: std::collections::HashMap<&str, Leadership> = std::collections::HashMap::new();
    let partitions = (0..info.kafka_partitions() as i32)
        .map(|p| {
            let set = info.placement.get(p as usize).map_or(own.as_str(), |r| r.set.as_str());
            let (leader, epoch, replicas, isr) = by_set.entry(set).or_insert_with(|| leadership(set)).clone();
            MetadataResponsePartition::default()
                .with_error_code(if leader.0 < 0 {
                    errors::LEADER_NOT_AVAILABLE
                } else {
                    errors::NONE
                })
                .with_partition_index(p)
                .with_leader_id(leader)
                .with_leader_epoch(if version >= 7 { epoch } else { -1 })
                .with_replica_nodes(replicas)
                .with_isr_nodes(isr)
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(str_bytes(name))))
        .with_topic_id(if version >= 10 {
            uuid::Uuid::from_bytes(info.topic_id)
        } else {
            uuid::Uuid::nil()
        })
        // The broker's own topics (delays, transaction halves, the timer
        // wheel): internal, as Kafka's __consumer_offsets — pattern
        // subscriptions (exclude.internal.topics) and mirroring leave them.
        .with_is_internal(rokka_broker::is_send_forbidden_topic(name))
        .with_partitions(partitions)
}

/// Topics a Metadata request names that this node has not taken from the
/// cluster yet, read from etcd's topic table (cluster mode; empty
/// otherwise, see [`rokka_broker::Broker::look_up_cluster_topic`]): a topic
/// created on another node a moment ago is answered as it is, not as
/// unknown. Kafka's brokers learn new topics asynchronously too, but a
/// consumer group's leader that sees a subscribed topic missing assigns
/// none of it until its next metadata refresh (librdkafka: 5 minutes).
/// Only names the caller may DESCRIBE, each once, at most
/// `kafka.metadata_topic_lookups` per request (and at once over all
/// requests), all within `kafka.metadata_topic_lookup_timeout_ms`.
pub async fn from_cluster(k: &Kafka, r: &MetadataRequest, who: &crate::authz::Caller) -> Learned {
    let mut learned = Learned::new();
    let (Some(list), Some(_)) = (r.topics.as_ref(), k.broker.own_set()) else {
        return learned;
    };
    let budget = k.config.metadata_topic_lookups as usize;
    let within = std::time::Duration::from_millis(k.config.metadata_topic_lookup_timeout_ms.max(1));
    let deadline = std::time::Instant::now() + within;
    let mut asked = std::collections::HashSet::new();
    for t in list {
        let Some(name) = t.name.as_ref().map(|n| n.0.as_str()) else {
            continue;
        };
        if asked.len() >= budget {
            break;
        }
        if k.broker.topics().get(name).is_some()
            || asked.contains(name)
            || (who.checked(k) && !who.may(k, Rt::Topic, name, Op::Describe))
        {
            continue;
        }
        asked.insert(name);
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Some(outcome) = k.broker.look_up_cluster_topic(name, &k.topic_lookups, left).await else {
            continue;
        };
        let result = rokka_broker::LookupMiss::outcome_label(&outcome);
        rokka_broker::hot_metrics::count("rokka_kafka_metadata_topic_lookups_total", "result", result, 1);
        match outcome {
            Ok(info) => {
                learned.insert(name.to_string(), info);
            }
            // No read could start, or the time is up: the rest are not read.
            Err(miss) if miss.ends_request() => break,
            Err(_) => {}
        }
    }
    learned
}

/// Topics read from the cluster's table for one Metadata request.
pub type Learned = std::collections::HashMap<String, TopicInfo>;

pub fn handle(
    k: &Kafka,
    r: MetadataRequest,
    version: i16,
    at: &crate::Endpoint,
    learned: &Learned,
) -> MetadataResponse {
    let broker = k.broker.as_ref();
    // Before v4 there is no flag and creation is always allowed.
    let allow_create = version < 4 || r.allow_auto_topic_creation;
    let topics = match r.topics {
        // v0: an empty list means all topics; v1+: null means all.
        Some(list) if !(version == 0 && list.is_empty()) => {
            // A topic asked for twice is answered once (Kafka reads the
            // list as a set): one small request must not make a response
            // of every partition once per repeat.
            let mut seen = std::collections::HashSet::with_capacity(list.len().min(1024));
            list.into_iter()
                // (By name when it has one, as it is answered by name —
                // else distinct ids would make a name count many times.)
                .filter(|t| {
                    seen.insert(match &t.name {
                        Some(n) => (Some(n.clone()), uuid::Uuid::nil()),
                        None => (None, t.topic_id),
                    })
                })
                .map(|t| {
                    // v10+: a topic may be asked for by id alone (KIP-848
                    // consumers resolve their assignment's topic ids so).
                    if t.name.is_none() && !t.topic_id.is_nil() {
                        let found = broker
                            .topics()
                            .name_of_id(t.topic_id.as_bytes())
                            .and_then(|name| broker.topics().get(&name).map(|info| (name, info)));
                        return match found {
                            Some((name, info)) => topic_entry(k, &name, &info, version),
                            None => MetadataResponseTopic::default()
                                .with_error_code(errors::UNKNOWN_TOPIC_ID)
                                .with_topic_id(t.topic_id),
                        };
                    }
                    let name = t.name.map(|n| n.0.to_string()).unwrap_or_default();
                    // Read from the cluster's table for this request (this
                    // node's table had no such topic): answered as it is there,
                    // never created again here.
                    if let Some(info) = learned.get(&name) {
                        return topic_entry(k, &name, info, version);
                    }
                    // A name Kafka would not make: INVALID_TOPIC_EXCEPTION,
                    // as Kafka answers whether or not it auto-creates
                    // (Topic.validate), and when it would auto-create one
                    // colliding with an existing topic ('.' against '_'),
                    // which its controller refuses. One that exists, made by
                    // RocketMQ with a wider name, is answered as it is.
                    let creating = allow_create && broker.config().auto_create_topics;
                    let refused = |name: &str| match creating {
                        true => super::topics::kafka_name_refused(k, name),
                        // (In cluster mode a RocketMQ-made topic with such a
                        // name may exist on another set, its lookup not
                        // answered in time: unknown for now, retried, not
                        // the fatal invalid-topic answer.)
                        false if broker.own_set().is_some() && rokka_store::validate_topic(name).is_ok() => None,
                        false => super::topics::kafka_name_invalid(name),
                    };
                    if broker.topics().get(&name).is_none() && refused(&name).is_some() {
                        return MetadataResponseTopic::default()
                            .with_error_code(errors::INVALID_TOPIC_EXCEPTION)
                            .with_name(Some(TopicName(str_bytes(&name))));
                    }
                    match rokka_broker::offload(|| broker.topic_or_create(&name, allow_create, None)) {
                        Ok(Some(info)) => topic_entry(k, &name, &info, version),
                        Ok(None) => MetadataResponseTopic::default()
                            .with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION)
                            .with_name(Some(TopicName(str_bytes(&name)))),
                        Err(e) => MetadataResponseTopic::default()
                            .with_error_code(match e {
                                rokka_broker::BrokerError::Store(rokka_store::StoreError::InvalidTopic(_)) => {
                                    errors::INVALID_TOPIC_EXCEPTION
                                }
                                other => errors::code(&other),
                            })
                            .with_name(Some(TopicName(str_bytes(&name)))),
                    }
                })
                .collect()
        }
        _ => broker
            .topics()
            .all()
            .iter()
            .map(|(name, info)| topic_entry(k, name, info, version))
            .collect(),
    };
    let (nodes, controller) = nodes(k, at);
    let brokers = nodes
        .into_iter()
        .map(|n| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(n.id))
                .with_host(n.host)
                .with_port(n.port)
                .with_rack(n.rack)
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id((version >= 2).then(|| str_bytes(&k.config.cluster_id)))
        .with_controller_id(BrokerId(if version >= 1 { controller } else { -1 }))
        .with_topics(topics)
}

/// One broker as Metadata and DescribeCluster list it.
pub(crate) struct Node {
    pub id: i32,
    pub host: kafka_protocol::protocol::StrBytes,
    pub port: i32,
    pub rack: Option<kafka_protocol::protocol::StrBytes>,
}

/// The brokers to list and the controller id: every live node in cluster
/// mode (the set's master as controller), else this one; each at its
/// listener of the kind `at` is (a node without one is not listed).
pub(crate) fn nodes(k: &Kafka, at: &crate::Endpoint) -> (Vec<Node>, i32) {
    match k.broker.cluster_view() {
        Some(v) => (
            v.nodes
                .iter()
                .filter_map(|n| {
                    let (host, port) = n.kafka_at(at.ssl, at.sasl).rsplit_once(':')?;
                    Some(Node {
                        id: n.id as i32,
                        host: str_bytes(host),
                        port: port.parse().ok()?,
                        rack: (!n.rack.is_empty()).then(|| str_bytes(&n.rack)),
                    })
                })
                .collect(),
            v.master.map_or(k.config.node_id, |m| m as i32),
        ),
        None => (
            vec![Node {
                id: k.config.node_id,
                host: str_bytes(&at.host),
                port: at.port,
                rack: None,
            }],
            k.config.node_id,
        ),
    }
}
