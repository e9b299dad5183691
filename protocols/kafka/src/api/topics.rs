//! CreateTopics / DeleteTopics / CreatePartitions.

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, TopicName,
};
use rokka_broker::{topic_config, BrokerError};

use super::str_bytes;
use crate::errors;
use crate::Kafka;

fn err_code(e: &BrokerError) -> i16 {
    match e {
        BrokerError::Store(rokka_store::StoreError::InvalidTopic(_)) => errors::INVALID_TOPIC_EXCEPTION,
        other => errors::code(other),
    }
}

/// Names given more than once in one request, each answered once with
/// INVALID_REQUEST (and nothing done for it), as Kafka's controller does.
fn duplicated<'a>(names: impl Iterator<Item = &'a str>) -> std::collections::HashSet<String> {
    let mut seen = std::collections::HashSet::new();
    let mut dups = std::collections::HashSet::new();
    for n in names {
        if !seen.insert(n) {
            dups.insert(n.to_string());
        }
    }
    dups
}

pub fn create(k: &Kafka, r: CreateTopicsRequest, version: i16) -> CreateTopicsResponse {
    let broker = k.broker.as_ref();
    let dups = duplicated(r.topics.iter().map(|t| t.name.0.as_str()));
    let mut answered_dups = std::collections::HashSet::new();
    // A validate-only request is held to the topics that could be made,
    // as a real one is by `broker.max_topics` (each answer lists the
    // topic's configs: a request of many names must not make a response
    // of hundreds of times its size).
    let max = broker.config().max_topics;
    let mut room = if max > 0 {
        (max as usize).saturating_sub(broker.topics().count())
    } else {
        usize::MAX
    };
    let topics = r
        .topics
        .into_iter()
        .filter(|t| !dups.contains(t.name.0.as_str()) || answered_dups.insert(t.name.0.to_string()))
        .map(|t| {
            if dups.contains(t.name.0.as_str()) {
                return CreatableTopicResult::default()
                    .with_name(t.name)
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_error_message(Some(str_bytes("Found multiple entries for this topic.")));
            }
            let name = t.name.0.to_string();
            let mut res = CreatableTopicResult::default().with_name(t.name.clone());
            // A topic that exists is TOPIC_ALREADY_EXISTS before anything
            // else is looked at (Kafka's ReplicationControlManager): tools
            // that create-or-find (Kafka Connect's internal topics) count
            // on it whatever replication factor or configs they ask.
            let exists = broker.topics().get(&name).is_some();
            let outcome = if exists {
                Err((errors::TOPIC_ALREADY_EXISTS, format!("Topic '{name}' already exists.")))
            } else if let Some(why) = kafka_name_refused(k, &name) {
                Err((errors::INVALID_TOPIC_EXCEPTION, why))
            } else if rokka_broker::is_system_topic(&name) {
                // The broker's own (delay levels, the timer wheel, half and
                // op records): made by the broker alone, with its configs —
                // one a client made first (retention.ms=1000, say) would
                // lose every delayed and uncommitted message. Apache's
                // updateAndCreateTopic refuses system topics too.
                Err((
                    errors::INVALID_TOPIC_EXCEPTION,
                    format!("Topic '{name}' is the broker's own: it is not created by clients."),
                ))
            } else {
                plan(k, &t)
            };
            let outcome = outcome.and_then(|(partitions, configs)| {
                if version >= 5 {
                    res.num_partitions = partitions as i32;
                    res.replication_factor = match t.replication_factor {
                        -1 => set_size(k) as i16,
                        rf => rf,
                    };
                    res.configs = Some(
                        super::admin::topic_entries(k, &configs, false, false)
                            .into_iter()
                            .map(|e| {
                                CreatableTopicConfigs::default()
                                    .with_name(str_bytes(e.name))
                                    .with_value(Some(str_bytes(&e.value)))
                                    .with_read_only(false)
                                    .with_config_source(e.source as i8)
                            })
                            .collect(),
                    );
                }
                if r.validate_only {
                    match (rokka_store::validate_topic(&name), broker.topics().get(&name)) {
                        (Err(e), _) => Err((errors::INVALID_TOPIC_EXCEPTION, e.to_string())),
                        (_, Some(_)) => Err((errors::TOPIC_ALREADY_EXISTS, format!("Topic '{name}' already exists."))),
                        _ if room == 0 => {
                            let e = rokka_broker::BrokerError::TooManyTopics(max);
                            Err((err_code(&e), e.to_string()))
                        }
                        _ => {
                            room -= 1;
                            Ok(None)
                        }
                    }
                } else {
                    broker
                        .create_topic_with(&name, partitions, configs)
                        .map(Some)
                        .map_err(|e| (err_code(&e), e.to_string()))
                }
            });
            match outcome {
                Ok(Some(info)) if version >= 7 => res.topic_id = uuid::Uuid::from_bytes(info.topic_id),
                Ok(_) => {}
                Err((code, msg)) => {
                    res.error_code = code;
                    res.error_message = Some(str_bytes(&msg));
                    res.num_partitions = -1;
                    res.replication_factor = -1;
                    res.configs = None;
                }
            }
            res
        })
        .collect();
    CreateTopicsResponse::default().with_topics(topics)
}

/// The brokers of this node's set (its own id alone on a single node).
fn set_members(k: &Kafka) -> Vec<i32> {
    match k.broker.cluster_view() {
        Some(v) if !v.members.is_empty() => v.members.iter().map(|m| *m as i32).collect(),
        _ => vec![k.config.node_id],
    }
}

/// How many replicas a partition here has: the set's live members.
fn set_size(k: &Kafka) -> usize {
    set_members(k).len()
}

/// What a CreateTopics entry asks for, checked as Kafka checks it: the
/// partition count (from `num_partitions` or the explicit assignment) and
/// the validated config overrides.
type Plan = (u32, std::collections::BTreeMap<String, String>);

fn plan(k: &Kafka, t: &CreatableTopic) -> Result<Plan, (i16, String)> {
    let broker = k.broker.as_ref();
    let partitions = if !t.assignments.is_empty() {
        if t.num_partitions != -1 || t.replication_factor != -1 {
            return Err((
                errors::INVALID_REQUEST,
                "Both numPartitions or replicationFactor and replicasAssignments were set. Both cannot be used at the same time.".into(),
            ));
        }
        let mut seen: Vec<i32> = t.assignments.iter().map(|a| a.partition_index).collect();
        seen.sort_unstable();
        if seen.iter().enumerate().any(|(i, p)| *p != i as i32) {
            return Err((
                errors::INVALID_REPLICA_ASSIGNMENT,
                "Partitions should be a consecutive 0-based integer sequence".into(),
            ));
        }
        // A partition's replicas are its broker set's members: an
        // assignment may name them (each once), not other brokers.
        let members = set_members(k);
        for a in &t.assignments {
            let ids: Vec<i32> = a.broker_ids.iter().map(|b| b.0).collect();
            let mut distinct = ids.clone();
            distinct.sort_unstable();
            distinct.dedup();
            if ids.is_empty() || distinct.len() != ids.len() || !ids.iter().all(|id| members.contains(id)) {
                return Err((
                    errors::INVALID_REPLICA_ASSIGNMENT,
                    format!(
                        "partition {} is assigned to brokers {ids:?}; this broker set's brokers are {members:?}",
                        a.partition_index
                    ),
                ));
            }
        }
        t.assignments.len() as i32
    } else {
        // Each partition has its broker set's members as replicas: a
        // factor up to their number is what the set gives (Kafka refuses
        // one larger than its live brokers).
        let available = set_size(k);
        if t.replication_factor == 0 || t.replication_factor < -1 || t.replication_factor as i64 > available as i64 {
            return Err((
                errors::INVALID_REPLICATION_FACTOR,
                format!(
                    "Replication factor: {} larger than available brokers: {available}.",
                    t.replication_factor
                ),
            ));
        }
        if t.num_partitions == -1 {
            broker.config().default_partitions as i32
        } else {
            t.num_partitions
        }
    };
    if partitions <= 0 {
        return Err((
            errors::INVALID_PARTITIONS,
            "Number of partitions must be larger than 0.".into(),
        ));
    }
    // Checked here too so validate_only answers what creating would.
    let max = broker.config().max_partitions;
    if partitions as u32 > max {
        return Err((
            errors::INVALID_PARTITIONS,
            format!("at most {max} partitions per topic (broker.max_partitions)"),
        ));
    }
    let configs = topic_config::validate_all(
        t.configs
            .iter()
            .map(|c| (c.name.as_str(), c.value.as_ref().map(|v| v.as_str()))),
    )
    .map_err(|e| (errors::INVALID_CONFIG, e))?;
    Ok((partitions as u32, configs))
}

pub fn delete(k: &Kafka, r: DeleteTopicsRequest, version: i16) -> DeleteTopicsResponse {
    // v6+: a topic is named, or given by its id alone.
    let all = if version >= 6 {
        k.broker.topics().all()
    } else {
        Vec::new()
    };
    // (name, the id asked by): an id is echoed even when unknown, as Kafka
    // answers (the Java Admin matches results by it).
    let names: Vec<(TopicName, Option<uuid::Uuid>)> = if version >= 6 {
        r.topics
            .into_iter()
            .map(|t| match t.name {
                Some(n) => (n, None),
                None => {
                    let id = *t.topic_id.as_bytes();
                    let name = k.broker.topics().name_of_id(&id);
                    // An unknown id stays unnamed and is answered UNKNOWN_TOPIC_ID.
                    (TopicName(str_bytes(&name.unwrap_or_default())), Some(t.topic_id))
                }
            })
            .collect()
    } else {
        r.topic_names.into_iter().map(|n| (n, None)).collect()
    };
    let ids: std::collections::HashMap<&str, [u8; 16]> = all.iter().map(|(n, i)| (n.as_str(), i.topic_id)).collect();
    let dups = duplicated(names.iter().filter(|(n, _)| !n.0.is_empty()).map(|(n, _)| n.0.as_str()));
    let mut answered_dups = std::collections::HashSet::new();
    let responses = names
        .into_iter()
        .filter(|(n, _)| !dups.contains(n.0.as_str()) || answered_dups.insert(n.0.to_string()))
        .map(|(n, asked)| {
            let id = asked.unwrap_or_else(|| {
                ids.get(n.0.as_str())
                    .map_or(uuid::Uuid::nil(), |i| uuid::Uuid::from_bytes(*i))
            });
            let code = if dups.contains(n.0.as_str()) {
                errors::INVALID_REQUEST
            } else if n.0.is_empty() {
                errors::UNKNOWN_TOPIC_ID
            } else if rokka_broker::is_system_topic(n.0.as_str()) {
                // The broker's own topics hold other topics' delayed and
                // uncommitted messages (Apache's deleteTopic refuses them).
                errors::INVALID_TOPIC_EXCEPTION
            } else {
                match k.broker.delete_topic(n.0.as_str()) {
                    Ok(()) => errors::NONE,
                    Err(e) => err_code(&e),
                }
            };
            let name = (!n.0.is_empty()).then_some(n);
            DeletableTopicResult::default()
                .with_name(name)
                .with_topic_id(id)
                .with_error_code(code)
        })
        .collect();
    DeleteTopicsResponse::default().with_responses(responses)
}

/// Why Kafka would refuse to create topic `name` (its Topic.validate:
/// at most 249 characters of `[A-Za-z0-9._-]`, not "." or "..", and no
/// collision with an existing topic once '.' and '_' are taken as one),
/// or None. RocketMQ clients may make other names (`%RETRY%g`, up to 255
/// bytes); through the Kafka API a topic is named as Kafka names one.
pub fn kafka_name_refused(k: &Kafka, name: &str) -> Option<String> {
    if let Some(why) = kafka_name_invalid(name) {
        return Some(why);
    }
    if name.contains('.') || name.contains('_') {
        if let Some(other) = k.broker.topics().colliding(name) {
            return Some(format!("Topic '{name}' collides with existing topic: {other}"));
        }
    }
    None
}

/// Kafka's Topic.isValid alone (no collision check): what its automatic
/// topic creation checks.
pub fn kafka_name_invalid(name: &str) -> Option<String> {
    if name.is_empty() || name == "." || name == ".." {
        return Some(format!("Topic name '{name}' is illegal"));
    }
    if name.len() > 249 {
        return Some(format!(
            "Topic name is illegal, it can't be longer than 249 characters, topic name: {name}"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Some(format!(
            "Topic name '{name}' is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    None
}

pub fn create_partitions(k: &Kafka, r: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let dups = duplicated(r.topics.iter().map(|t| t.name.0.as_str()));
    let mut answered_dups = std::collections::HashSet::new();
    let results = r
        .topics
        .into_iter()
        .filter(|t| !dups.contains(t.name.0.as_str()) || answered_dups.insert(t.name.0.to_string()))
        .map(|t| {
            let max = k.broker.config().max_partitions;
            let name = t.name.0.as_str();
            // The partitions it has now (None: no such topic), looked up once.
            let now = k.broker.topics().get(name).map(|i| i.kafka_partitions());
            let res = if dups.contains(name) {
                Err((errors::INVALID_REQUEST, "Duplicate topic in request.".to_string()))
            } else if rokka_broker::is_system_topic(name) || rokka_broker::is_per_set_topic(name) {
                // The broker's own topics, and a group's retry and
                // dead-letter topics (every broker set holds all of their
                // queues), as CreateTopics and DeleteTopics refuse them.
                Err((
                    errors::INVALID_TOPIC_EXCEPTION,
                    format!("{name} is one of the broker's own topics"),
                ))
            } else if t.count <= 0 {
                Err((errors::INVALID_PARTITIONS, "count must be positive".to_string()))
            } else if now.is_none() {
                // (Existence and the count first, as Kafka checks them
                // before the assignments.)
                Err((errors::UNKNOWN_TOPIC_OR_PARTITION, "unknown topic".to_string()))
            } else if now.is_some_and(|n| t.count as u32 <= n) {
                Err((errors::INVALID_PARTITIONS, "the new count must be larger".to_string()))
            } else if let Some(bad) = t.assignments.as_ref().and_then(|a| {
                // Kafka's createPartitions: one assignment per partition
                // added, each naming brokers that hold it (here: the broker
                // set's members), each once.
                let added = i64::from(t.count) - i64::from(now.unwrap_or(0));
                let members = set_members(k);
                if a.len() as i64 != added {
                    return Some(format!(
                        "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
                        a.len()
                    ));
                }
                a.iter().find_map(|x| {
                    let ids: Vec<i32> = x.broker_ids.iter().map(|b| b.0).collect();
                    let mut distinct = ids.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    (ids.is_empty() || distinct.len() != ids.len() || !ids.iter().all(|id| members.contains(id)))
                        .then(|| format!("assignment {ids:?}; this broker set's brokers are {members:?}"))
                })
            }) {
                Err((errors::INVALID_REPLICA_ASSIGNMENT, bad))
            } else if r.validate_only {
                // What the real request would answer, without doing it
                // (existence and the count are checked above).
                if t.count as u32 > max {
                    Err((
                        errors::INVALID_PARTITIONS,
                        format!("at most {max} partitions (broker.max_partitions)"),
                    ))
                } else {
                    Ok(())
                }
            } else {
                k.broker
                    .add_partitions(name, t.count as u32)
                    .map_err(|e| (err_code(&e), e.to_string()))
            };
            let out = CreatePartitionsTopicResult::default().with_name(t.name);
            match res {
                Ok(()) => out,
                Err((code, msg)) => out.with_error_code(code).with_error_message(Some(str_bytes(&msg))),
            }
        })
        .collect();
    CreatePartitionsResponse::default().with_results(results)
}
