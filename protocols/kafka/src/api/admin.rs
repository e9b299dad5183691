//! DescribeConfigs, DescribeCluster, DeleteRecords, OffsetDelete.

use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::*;

use super::str_bytes;
use crate::errors;
use crate::Kafka;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;

/// (name, value, type) of a topic's effective configuration. Rokka has no
/// per-topic overrides yet, so every value is the store's and read-only.
fn topic_configs(k: &Kafka) -> Vec<(&'static str, String, i8)> {
    let s = k.broker.store().config();
    vec![
        ("cleanup.policy", "delete".into(), TYPE_STRING),
        ("compression.type", "producer".into(), TYPE_STRING),
        ("max.message.bytes", s.max_message_bytes.to_string(), TYPE_INT),
        ("message.timestamp.type", "CreateTime".into(), TYPE_STRING),
        ("min.insync.replicas", "1".into(), TYPE_INT),
        (
            "retention.bytes",
            if s.retention_max_bytes == 0 {
                "-1".into()
            } else {
                s.retention_max_bytes.to_string()
            },
            TYPE_LONG,
        ),
        ("retention.ms", (s.retention_hours * 3_600_000).to_string(), TYPE_LONG),
        ("segment.bytes", s.commitlog_segment_bytes.to_string(), TYPE_INT),
    ]
}

fn broker_configs(k: &Kafka) -> Vec<(&'static str, String, i8)> {
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
        ("log.segment.bytes", s.commitlog_segment_bytes.to_string(), TYPE_INT),
        ("message.max.bytes", s.max_message_bytes.to_string(), TYPE_INT),
        ("num.partitions", b.default_partitions.to_string(), TYPE_INT),
    ]
}

pub fn describe_configs(k: &Kafka, r: DescribeConfigsRequest, version: i16) -> DescribeConfigsResponse {
    let results = r
        .resources
        .into_iter()
        .map(|res| {
            let name = res.resource_name.to_string();
            let mut out = DescribeConfigsResult::default()
                .with_resource_type(res.resource_type)
                .with_resource_name(res.resource_name.clone());
            let (entries, source) = match res.resource_type {
                RESOURCE_TOPIC if k.broker.topics().get(&name).is_some() => (topic_configs(k), SOURCE_DEFAULT),
                RESOURCE_TOPIC => {
                    out.error_code = errors::UNKNOWN_TOPIC_OR_PARTITION;
                    out.error_message = Some(str_bytes(&format!("unknown topic {name}")));
                    return out;
                }
                RESOURCE_BROKER => (broker_configs(k), SOURCE_STATIC_BROKER),
                other => {
                    out.error_code = errors::INVALID_REQUEST;
                    out.error_message = Some(str_bytes(&format!("unsupported resource type {other}")));
                    return out;
                }
            };
            out.configs = entries
                .into_iter()
                .filter(|(n, _, _)| {
                    res.configuration_keys
                        .as_ref()
                        .is_none_or(|keys| keys.iter().any(|key| key.as_str() == *n))
                })
                .map(|(n, v, t)| {
                    let c = DescribeConfigsResourceResult::default()
                        .with_name(str_bytes(n))
                        .with_value(Some(str_bytes(&v)))
                        .with_read_only(true)
                        .with_config_source(source);
                    if version >= 3 {
                        c.with_config_type(t)
                    } else {
                        c
                    }
                })
                .collect();
            out
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

pub fn describe_cluster(k: &Kafka, _r: DescribeClusterRequest) -> DescribeClusterResponse {
    DescribeClusterResponse::default()
        .with_cluster_id(str_bytes(&k.config.cluster_id))
        .with_controller_id(BrokerId(k.config.node_id))
        .with_brokers(vec![DescribeClusterBroker::default()
            .with_broker_id(BrokerId(k.config.node_id))
            .with_host(str_bytes(&k.advertised_host))
            .with_port(k.advertised_port)])
}

pub fn delete_records(k: &Kafka, r: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let store = k.broker.store();
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let info = k.broker.topics().get(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let res = DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index)
                        .with_low_watermark(-1);
                    let known = info
                        .as_ref()
                        .is_some_and(|i| p.partition_index >= 0 && (p.partition_index as u32) < i.partitions);
                    if !known {
                        return res.with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION);
                    }
                    let q = p.partition_index as u32;
                    let hw = store.max_offset(&name, q);
                    // -1 means "up to the high watermark".
                    let target = if p.offset == -1 { hw as i64 } else { p.offset };
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
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
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
    let offsets = k.broker.store().offsets();
    let view = k.groups.with(|c| c.describe(&group));
    if view.is_none() && offsets.group_offsets(&group).is_empty() {
        return OffsetDeleteResponse::default().with_error_code(errors::GROUP_ID_NOT_FOUND);
    }
    let subscribed: Vec<String> = view
        .map(|v| v.members.iter().flat_map(|m| subscribed_topics(&m.metadata)).collect())
        .unwrap_or_default();
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let busy = subscribed.contains(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let code = if busy {
                        errors::GROUP_SUBSCRIBED_TO_TOPIC
                    } else {
                        offsets.delete(&group, &name, p.partition_index.max(0) as u32);
                        errors::NONE
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
