//! DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, DescribeCluster,
//! DeleteRecords, OffsetDelete.

use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::*;

use rokka_broker::dynamic::{self, Scope};
use rokka_broker::topic_config::{self, Kind, Source};

use super::str_bytes;
use crate::errors;
use crate::Kafka;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const TYPE_BOOLEAN: Kind = Kind::Boolean;
const TYPE_STRING: Kind = Kind::String;
const TYPE_INT: Kind = Kind::Int;

/// One described config.
#[derive(Debug, Clone)]
pub struct ConfigEntry {
    pub name: &'static str,
    pub value: String,
    pub source: Source,
    pub kind: Kind,
    pub read_only: bool,
    /// (name, value, source), most specific first (DescribeConfigs v1+).
    pub synonyms: Vec<(&'static str, String, Source)>,
}

/// Every topic config with its effective value: the topic's override, else
/// Rokka's static setting, else Kafka's default.
pub fn topic_entries(
    k: &Kafka,
    overrides: &std::collections::BTreeMap<String, String>,
    synonyms: bool,
    _documentation: bool,
) -> Vec<ConfigEntry> {
    let store = k.broker.store().config();
    topic_config::SPECS
        .iter()
        .map(|spec| {
            let (dflt, dsource) = k.broker.topic_default(spec.name);
            let (value, source) = match overrides.get(spec.name) {
                Some(v) => (v.clone(), Source::Topic),
                None => (dflt, dsource),
            };
            let mut syn = Vec::new();
            if synonyms {
                if let Some(v) = overrides.get(spec.name) {
                    syn.push((spec.name, v.clone(), Source::Topic));
                }
                if let Some(b) = spec.broker_name {
                    for (v, src) in k.broker.dynamic_configs().chain(b) {
                        syn.push((b, v, src));
                    }
                    let (v, src) = topic_config::default_of(spec.name, store);
                    syn.push((b, v, src));
                }
            }
            ConfigEntry {
                name: spec.name,
                value,
                source,
                kind: spec.kind,
                read_only: false,
                synonyms: syn,
            }
        })
        .collect()
}

fn broker_configs(k: &Kafka) -> Vec<(&'static str, String, Kind)> {
    let s = k.broker.store().config();
    let b = k.broker.config();
    let listener = format!("PLAINTEXT://{}:{}", k.advertised_host, k.advertised_port);
    vec![
        ("advertised.listeners", listener, TYPE_STRING),
        ("listeners", format!("PLAINTEXT://{}", k.config.listen), TYPE_STRING),
        (
            "auto.create.topics.enable",
            b.auto_create_topics.to_string(),
            TYPE_BOOLEAN,
        ),
        ("broker.id", k.config.node_id.to_string(), TYPE_INT),
        ("log.retention.hours", s.retention_hours.to_string(), TYPE_INT),
        ("num.partitions", b.default_partitions.to_string(), TYPE_INT),
    ]
}

/// A BROKER resource's entries: the static settings (read-only), then the
/// broker-level defaults of topic configs with their dynamic values.
fn broker_entries(k: &Kafka, scope: Scope, synonyms: bool) -> Vec<ConfigEntry> {
    let store = k.broker.store().config();
    let mut out = Vec::new();
    if scope == Scope::ThisBroker {
        for (n, v, t) in broker_configs(k) {
            out.push(ConfigEntry {
                name: n,
                value: v.clone(),
                source: Source::StaticBroker,
                kind: t,
                read_only: true,
                synonyms: if synonyms {
                    vec![(n, v, Source::StaticBroker)]
                } else {
                    Vec::new()
                },
            });
        }
    }
    for spec in topic_config::SPECS {
        let Some(key) = spec.broker_name else { continue };
        let mut chain = k.broker.dynamic_configs().chain(key);
        if scope == Scope::ClusterDefault {
            // The cluster default alone (as Kafka describes resource "").
            chain.retain(|(_, src)| *src == Source::DynamicDefaultBroker);
            let Some((v, src)) = chain.into_iter().next() else {
                continue;
            };
            out.push(ConfigEntry {
                name: key,
                value: v.clone(),
                source: src,
                kind: spec.kind,
                read_only: false,
                synonyms: if synonyms { vec![(key, v, src)] } else { Vec::new() },
            });
            continue;
        }
        chain.push(topic_config::default_of(spec.name, store));
        let (value, source) = chain[0].clone();
        out.push(ConfigEntry {
            name: key,
            value,
            source,
            kind: spec.kind,
            read_only: dynamic::spec_of_broker_key(key).is_none(),
            synonyms: if synonyms {
                chain.into_iter().map(|(v, src)| (key, v, src)).collect()
            } else {
                Vec::new()
            },
        });
    }
    out
}

/// The set a BROKER resource name names: "" every broker's default, this
/// node's id this broker.
fn broker_scope(k: &Kafka, name: &str) -> Result<Scope, (i16, String)> {
    if name.is_empty() {
        Ok(Scope::ClusterDefault)
    } else if name == k.config.node_id.to_string() {
        Ok(Scope::ThisBroker)
    } else {
        Err((
            errors::INVALID_REQUEST,
            format!("Broker {name} is not this broker ({})", k.config.node_id),
        ))
    }
}

pub fn describe_configs(k: &Kafka, r: DescribeConfigsRequest, version: i16) -> DescribeConfigsResponse {
    // A resource named twice is described once.
    let mut seen = std::collections::HashSet::with_capacity(r.resources.len().min(1024));
    let results = r
        .resources
        .into_iter()
        .filter(|res| {
            seen.insert((
                res.resource_type,
                res.resource_name.clone(),
                res.configuration_keys.clone(),
            ))
        })
        .map(|res| {
            let name = res.resource_name.to_string();
            let mut out = DescribeConfigsResult::default()
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name.clone());
            let entries = match res.resource_type {
                RESOURCE_TOPIC => match k.broker.topics().get(&name) {
                    Some(info) => topic_entries(k, &info.configs, r.include_synonyms, r.include_documentation),
                    None => {
                        out.error_code = errors::UNKNOWN_TOPIC_OR_PARTITION;
                        out.error_message = Some(str_bytes(&format!("Topic {name} does not exist.")));
                        return out;
                    }
                },
                RESOURCE_BROKER => match broker_scope(k, &name) {
                    Ok(scope) => broker_entries(k, scope, r.include_synonyms),
                    Err((code, msg)) => {
                        out.error_code = code;
                        out.error_message = Some(str_bytes(&msg));
                        return out;
                    }
                },
                other => {
                    out.error_code = errors::INVALID_REQUEST;
                    out.error_message = Some(str_bytes(&format!("unsupported resource type {other}")));
                    return out;
                }
            };
            out.configs = entries
                .into_iter()
                .filter(|e| {
                    // Null or empty: every config (Kafka's ConfigHelper).
                    res.configuration_keys
                        .as_ref()
                        .is_none_or(|keys| keys.is_empty() || keys.iter().any(|key| key.as_str() == e.name))
                })
                .map(|e| {
                    let mut c = DescribeConfigsResourceResult::default()
                        .with_name(str_bytes(e.name))
                        .with_value(Some(str_bytes(&e.value)))
                        .with_read_only(e.read_only)
                        .with_config_source(e.source as i8);
                    if version >= 1 {
                        c.synonyms = e
                            .synonyms
                            .into_iter()
                            .map(|(n, v, src)| {
                                DescribeConfigsSynonym::default()
                                    .with_name(str_bytes(n))
                                    .with_value(Some(str_bytes(&v)))
                                    .with_source(src as i8)
                            })
                            .collect();
                    }
                    if version >= 3 {
                        c.config_type = e.kind as i8;
                    }
                    c
                })
                .collect();
            out
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// What an Alter changes.
#[derive(Debug, Clone)]
enum Target {
    Topic(String),
    Broker(Scope),
}

impl Target {
    /// Checks one (name, value); the value as stored.
    fn validate(&self, key: &str, value: &str) -> Result<String, (i16, String)> {
        match self {
            Target::Topic(_) => topic_config::validate(key, value),
            Target::Broker(_) => dynamic::validate(key, value),
        }
        .map_err(|e| (errors::INVALID_CONFIG, e))
    }

    /// The topic config spec behind `key`.
    fn spec(&self, key: &str) -> Result<&'static topic_config::Spec, (i16, String)> {
        match self {
            Target::Topic(_) => topic_config::spec_of(key)
                .ok_or_else(|| (errors::INVALID_CONFIG, format!("Unknown topic config name: {key}"))),
            Target::Broker(_) => dynamic::spec_of_broker_key(key).ok_or_else(|| {
                (
                    errors::INVALID_REQUEST,
                    format!("Cannot update these configs dynamically: Set({key})"),
                )
            }),
        }
    }
}

/// The resource an Alter names with its current values, or why not.
fn alter_target(
    k: &Kafka,
    resource_type: i8,
    name: &str,
) -> Result<(Target, std::collections::BTreeMap<String, String>), (i16, String)> {
    match resource_type {
        // The broker's own topics keep the broker's configs (a client's
        // retention.ms=1000 on SCHEDULE_TOPIC_XXXX lost every delayed message).
        RESOURCE_TOPIC if rokka_broker::is_system_topic(name) => Err((
            errors::INVALID_TOPIC_EXCEPTION,
            format!("Topic {name} is the broker's own: its configs are not altered by clients."),
        )),
        RESOURCE_TOPIC => k
            .broker
            .topics()
            .get(name)
            .map(|i| (Target::Topic(name.to_string()), i.configs))
            .ok_or((
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("Topic {name} does not exist."),
            )),
        RESOURCE_BROKER => {
            let scope = broker_scope(k, name)?;
            Ok((Target::Broker(scope), k.broker.dynamic_configs().get(scope)))
        }
        other => Err((errors::INVALID_REQUEST, format!("unsupported resource type {other}"))),
    }
}

fn alter_result(
    k: &Kafka,
    validate_only: bool,
    next: Result<(Target, std::collections::BTreeMap<String, String>), (i16, String)>,
) -> (i16, Option<String>) {
    let stored = next.and_then(|(target, configs)| {
        // The resulting overrides as a whole (Kafka's LogConfig.validate of
        // the merged config): each key alone passed, together they may not
        // (min.compaction.lag.ms above max.compaction.lag.ms).
        if let Target::Topic(_) = target {
            topic_config::check_together(&configs).map_err(|e| (errors::INVALID_CONFIG, e))?;
        }
        if validate_only {
            return Ok(());
        }
        match target {
            Target::Topic(name) => k.broker.set_topic_configs(&name, configs),
            Target::Broker(scope) => k.broker.set_dynamic_configs(scope, configs),
        }
        .map_err(|e| (errors::code(&e), e.to_string()))
    });
    match stored {
        Ok(()) => (errors::NONE, None),
        Err((code, msg)) => {
            metrics::counter!("rokka_kafka_errors_total", "api" => "AlterConfigs", "code" => crate::errors::label(code))
                .increment(1);
            (code, Some(msg))
        }
    }
}

/// AlterConfigs: the given set replaces a topic's overrides whole.
pub fn alter_configs(k: &Kafka, r: AlterConfigsRequest) -> AlterConfigsResponse {
    let responses = r
        .resources
        .into_iter()
        .map(|res| {
            let name = res.resource_name.to_string();
            let next = alter_target(k, res.resource_type, &name).and_then(|(target, _)| {
                let mut configs = std::collections::BTreeMap::new();
                for c in &res.configs {
                    let key = c.name.as_str();
                    let Some(value) = c.value.as_ref() else {
                        return Err((
                            errors::INVALID_CONFIG,
                            format!("Null value not supported for configs: {key}"),
                        ));
                    };
                    target.spec(key)?;
                    configs.insert(key.to_string(), target.validate(key, value.as_str())?);
                }
                Ok((target, configs))
            });
            let (code, msg) = alter_result(k, r.validate_only, next);
            alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg.map(|m| str_bytes(&m)))
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name)
        })
        .collect();
    AlterConfigsResponse::default().with_responses(responses)
}

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// IncrementalAlterConfigs: SET, DELETE, and APPEND / SUBTRACT on list
/// configs, applied to a topic's overrides in order.
pub fn incremental_alter_configs(k: &Kafka, r: IncrementalAlterConfigsRequest) -> IncrementalAlterConfigsResponse {
    let responses = r
        .resources
        .into_iter()
        .map(|res| {
            let name = res.resource_name.to_string();
            let next = alter_target(k, res.resource_type, &name).and_then(|(target, mut configs)| {
                // A name given twice is refused whole (Kafka's
                // ConfigAdminManager: "duplicate config keys").
                let mut seen = std::collections::HashSet::new();
                if let Some(c) = res.configs.iter().find(|c| !seen.insert(c.name.as_str())) {
                    return Err((
                        errors::INVALID_REQUEST,
                        format!("Error due to duplicate config keys: {}", c.name.as_str()),
                    ));
                }
                for c in &res.configs {
                    let key = c.name.as_str();
                    // Deleting a name that is not set, known or not, is a
                    // no-op (Kafka answers it NONE).
                    if c.config_operation == OP_DELETE && target.spec(key).is_err() {
                        configs.remove(key);
                        continue;
                    }
                    let spec = target.spec(key)?;
                    let value = c.value.as_ref().map(|v| v.to_string());
                    match c.config_operation {
                        OP_SET => {
                            let v = value
                                .ok_or((errors::INVALID_REQUEST, format!("Null value not supported for: {key}")))?;
                            let v = target.validate(key, &v)?;
                            configs.insert(key.to_string(), v);
                        }
                        OP_DELETE => {
                            configs.remove(key);
                        }
                        OP_APPEND | OP_SUBTRACT => {
                            if spec.kind != topic_config::Kind::List {
                                return Err((
                                    errors::INVALID_CONFIG,
                                    format!("Config value append/subtract is not allowed for config key: {key}"),
                                ));
                            }
                            let current = configs
                                .get(key)
                                .cloned()
                                .unwrap_or_else(|| k.broker.topic_default(spec.name).0);
                            let mut items: Vec<String> = current
                                .split(',')
                                .map(str::trim)
                                .filter(|s| !s.is_empty())
                                .map(String::from)
                                .collect();
                            for v in value
                                .unwrap_or_default()
                                .split(',')
                                .map(str::trim)
                                .filter(|s| !s.is_empty())
                            {
                                if c.config_operation == OP_APPEND {
                                    if !items.iter().any(|i| i == v) {
                                        items.push(v.to_string());
                                    }
                                } else {
                                    items.retain(|i| i != v);
                                }
                            }
                            let v = target.validate(key, &items.join(","))?;
                            configs.insert(key.to_string(), v);
                        }
                        other => return Err((errors::INVALID_REQUEST, format!("unknown config operation {other}"))),
                    }
                }
                Ok((target, configs))
            });
            let (code, msg) = alter_result(k, r.validate_only, next);
            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(msg.map(|m| str_bytes(&m)))
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name)
        })
        .collect();
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

pub fn describe_cluster(k: &Kafka, _r: DescribeClusterRequest, at: &crate::Endpoint) -> DescribeClusterResponse {
    let (nodes, controller) = super::metadata::nodes(k, at);
    DescribeClusterResponse::default()
        .with_cluster_id(str_bytes(&k.config.cluster_id))
        .with_controller_id(BrokerId(controller))
        .with_brokers(
            nodes
                .into_iter()
                .map(|n| {
                    DescribeClusterBroker::default()
                        .with_broker_id(BrokerId(n.id))
                        .with_host(n.host)
                        .with_port(n.port)
                        .with_rack(n.rack)
                })
                .collect(),
        )
}

pub fn delete_records(k: &Kafka, r: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let store = k.broker.store();
    // A partition named twice is one deletion (the last offset given), as
    // Kafka reads the request into a map: each costs a rewrite and fsync of
    // the log starts.
    let mut topic_at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut part_at: std::collections::HashMap<(usize, i32), usize> = std::collections::HashMap::new();
    let mut unique: Vec<(TopicName, Vec<(i32, i64)>)> = Vec::new();
    for t in r.topics {
        let ti = *topic_at.entry(t.name.0.to_string()).or_insert_with(|| {
            unique.push((t.name.clone(), Vec::new()));
            unique.len() - 1
        });
        for p in t.partitions {
            match part_at.entry((ti, p.partition_index)) {
                std::collections::hash_map::Entry::Occupied(at) => unique[ti].1[*at.get()].1 = p.offset,
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(unique[ti].1.len());
                    unique[ti].1.push((p.partition_index, p.offset));
                }
            }
        }
    }
    let topics = unique
        .into_iter()
        .map(|(topic_name, parts)| {
            let name = topic_name.0.to_string();
            let info = k.broker.topics().get(&name);
            // A compacted topic without `delete` in its cleanup.policy
            // keeps its records: POLICY_VIOLATION, as Kafka's
            // Partition.deleteRecordsOnLeader.
            let compact_only = info.is_some() && k.broker.topic_config(&name).is_some_and(|c| c.compact && !c.delete);
            let partitions = parts
                .into_iter()
                .map(|(partition_index, offset)| {
                    let res = DeleteRecordsPartitionResult::default()
                        .with_partition_index(partition_index)
                        .with_low_watermark(-1);
                    if compact_only {
                        return res.with_error_code(errors::POLICY_VIOLATION);
                    }
                    // The broker's own topics hold other topics' pending
                    // delayed and uncommitted messages.
                    if rokka_broker::is_system_topic(&name) {
                        return res.with_error_code(errors::INVALID_TOPIC_EXCEPTION);
                    }
                    if !store.is_leader() {
                        // Cluster mode: the set's master deletes (a replica
                        // would move only its own start).
                        return res.with_error_code(errors::NOT_LEADER_OR_FOLLOWER);
                    }
                    let q = match super::queue_of(k, info.as_ref(), partition_index) {
                        Ok(q) => q,
                        Err(code) => return res.with_error_code(code),
                    };
                    let hw = store.max_offset(&name, q);
                    // -1 means "up to the high watermark".
                    let target = if offset == -1 { hw as i64 } else { offset };
                    if target < 0 || target as u64 > hw {
                        return res.with_error_code(errors::OFFSET_OUT_OF_RANGE);
                    }
                    match store.delete_records(&name, q, target as u64) {
                        Ok(low) => res.with_low_watermark(low as i64),
                        Err(e) => res.with_error_code(errors::store_code(&e)),
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(topic_name)
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}

/// Cluster mode: a DeleteRecords is answered once the set's in-sync
/// replicas have taken the new starts (as Kafka's DelayedDeleteRecords
/// waits for the followers' low watermarks) — a failover right after the
/// answer would otherwise bring the deleted records back. Not confirmed
/// within the request's timeout (or the replication timeout, when
/// shorter): REQUEST_TIMED_OUT for the partitions deleted, which stay
/// deleted on the master and reach the replicas with the stream; this node
/// no longer master: NOT_LEADER_OR_FOLLOWER.
pub async fn delete_records_replicated(k: &Kafka, resp: &mut DeleteRecordsResponse, timeout_ms: i32) {
    let deleted = resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .any(|p| p.error_code == errors::NONE);
    if !deleted {
        return;
    }
    let version = k.broker.store().log_starts_changes();
    let within = std::time::Duration::from_millis(timeout_ms.max(0) as u64);
    if let Err(e) = k.broker.log_starts_durable(version, Some(within)).await {
        let code = match k.broker.store().is_leader() {
            true => errors::REQUEST_TIMED_OUT,
            false => errors::NOT_LEADER_OR_FOLLOWER,
        };
        tracing::info!(error = e, "DeleteRecords not confirmed by the replicas");
        for p in resp.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
            if p.error_code == errors::NONE {
                p.error_code = code;
                p.low_watermark = -1;
            }
        }
    }
}

/// Topics named in a consumer-protocol subscription (version, topic array).
fn subscribed_topics(metadata: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    if metadata.len() < 6 {
        return out;
    }
    let n = i32::from_be_bytes([metadata[2], metadata[3], metadata[4], metadata[5]]);
    let mut at = 6;
    for _ in 0..n.max(0) {
        let Some(len) = metadata.get(at..at + 2).map(|b| i16::from_be_bytes([b[0], b[1]])) else {
            break;
        };
        let end = at + 2 + len.max(0) as usize;
        let Some(t) = metadata.get(at + 2..end) else { break };
        out.push(String::from_utf8_lossy(t).into_owned());
        at = end;
    }
    out
}

pub fn offset_delete(k: &Kafka, r: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let group = r.group_id.0.to_string();
    if rokka_broker::is_system_group(&group) {
        // The broker's own progress (id_len.rs).
        return OffsetDeleteResponse::default().with_error_code(errors::INVALID_GROUP_ID);
    }
    let offsets = k.broker.store().offsets();
    let view = k.groups.with(|c| c.describe(&group));
    // A KIP-848 group's members' subscriptions (Kafka's
    // ModernGroup.isSubscribedToTopic).
    let consumer_subscribed: Option<Vec<String>> = k.groups.with(|c| {
        c.consumer
            .groups
            .get(&group)
            .map(|g| g.members.values().flat_map(|m| m.subscribed.iter().cloned()).collect())
    });
    if view.is_none() && consumer_subscribed.is_none() && offsets.group_offsets(&group).is_empty() {
        return OffsetDeleteResponse::default().with_error_code(errors::GROUP_ID_NOT_FOUND);
    }
    let mut subscribed: Vec<String> = view
        .map(|v| v.members.iter().flat_map(|m| subscribed_topics(&m.metadata)).collect())
        .unwrap_or_default();
    subscribed.extend(consumer_subscribed.unwrap_or_default());
    // RocketMQ members the Kafka coordinator does not hold: their topics
    // are subscribed too (pop consumers name none: every topic is).
    let others = super::groups::other_members(k, &group);
    let every_topic = others.live && others.topics.is_none();
    subscribed.extend(others.topics.unwrap_or_default());
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let busy = every_topic || subscribed.contains(&name);
            let info = k.broker.topics().get(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    // The partition's queue as commits place it (several
                    // broker sets: another set's partition is not a queue
                    // of this one's).
                    let placed = info.as_ref().map(|i| i.placed(p.partition_index, k.broker.own_set()));
                    let code = match placed {
                        None | Some(rokka_broker::Placed::Unknown) => errors::UNKNOWN_TOPIC_OR_PARTITION,
                        Some(_) if busy => errors::GROUP_SUBSCRIBED_TO_TOPIC,
                        Some(rokka_broker::Placed::Here(q)) => {
                            offsets.delete(&group, &name, q);
                            errors::NONE
                        }
                        // Its offset lives with that set's master, which
                        // this request does not reach: said, not pretended.
                        Some(rokka_broker::Placed::Set(..)) => errors::UNKNOWN_SERVER_ERROR,
                    };
                    OffsetDeleteResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect();
            OffsetDeleteResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetDeleteResponse::default().with_topics(topics)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_subscription_topics() {
        let mut m = vec![0, 1, 0, 0, 0, 2];
        for t in ["a", "bc"] {
            m.extend_from_slice(&(t.len() as i16).to_be_bytes());
            m.extend_from_slice(t.as_bytes());
        }
        m.extend_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(super::subscribed_topics(&m), vec!["a".to_string(), "bc".to_string()]);
        assert!(super::subscribed_topics(&[0, 1, 0, 0, 0, 9, 0]).is_empty());
    }
}
