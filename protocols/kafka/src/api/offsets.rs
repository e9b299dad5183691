//! OffsetCommit / OffsetFetch on the shared committed-offset table.

use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName,
};

use super::str_bytes;
use crate::errors;
use crate::Kafka;

pub fn commit(k: &Kafka, r: OffsetCommitRequest, version: i16) -> OffsetCommitResponse {
    let group = r.group_id.0.to_string();
    // v0/v1 are not served; from v2 the generation and member are checked.
    let _ = version;
    let member_check = k.groups.with(|c| {
        c.validate_commit(
            &group,
            r.member_id.as_str(),
            r.group_instance_id.as_ref().map(|s| s.as_str()),
            r.generation_id_or_member_epoch,
        )
    });
    let offsets = k.broker.store().offsets();
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let known = k.broker.topics().get(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let ok = group.is_empty() || known.as_ref().is_none_or(|i| !i.has_partition(p.partition_index));
                    let code = if group.is_empty() {
                        errors::INVALID_GROUP_ID
                    } else if member_check != errors::NONE {
                        member_check
                    } else if ok || p.committed_offset < 0 {
                        errors::UNKNOWN_TOPIC_OR_PARTITION
                    } else if p
                        .committed_metadata
                        .as_ref()
                        .is_some_and(|m| m.len() > k.config.max_offset_metadata_bytes as usize)
                    {
                        // Kafka offset.metadata.max.bytes: the table is kept
                        // in memory and on disk, so its values are bounded.
                        errors::OFFSET_METADATA_TOO_LARGE
                    } else {
                        let meta = p.committed_metadata.as_ref().map_or("", |m| m.as_str());
                        let (q, o) = (p.partition_index as u32, p.committed_offset as u64);
                        if offsets.commit_bounded(&group, &name, q, o, meta, p.committed_leader_epoch) {
                            errors::NONE
                        } else {
                            // store.max_committed_offsets: a non-retriable
                            // answer (Kafka gives it when an offset commit
                            // cannot be stored for its size).
                            errors::INVALID_COMMIT_OFFSET_SIZE
                        }
                    };
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// (offset, metadata, leader epoch) committed, or (-1, "", -1).
fn committed(k: &Kafka, group: &str, topic: &str, partition: i32) -> (i64, Option<String>, i32) {
    match k.broker.store().offsets().get(group, topic, partition.max(0) as u32) {
        Some(o) if partition >= 0 => (o.offset as i64, Some(o.metadata), o.leader_epoch),
        _ => (-1, Some(String::new()), -1),
    }
}

/// (topic, partitions) requested, or every committed one when `None`.
fn wanted(k: &Kafka, group: &str, topics: Option<Vec<(String, Vec<i32>)>>) -> Vec<(String, Vec<i32>)> {
    match topics {
        Some(t) => t,
        None => {
            let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
            for (t, q, _) in k.broker.store().offsets().group_offsets(group) {
                by_topic.entry(t).or_default().push(q as i32);
            }
            by_topic.into_iter().collect()
        }
    }
}

pub fn fetch(k: &Kafka, r: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    if version >= 8 {
        let groups = r
            .groups
            .into_iter()
            .map(|g| {
                let group = g.group_id.0.to_string();
                let req = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name.0.to_string(), t.partition_indexes))
                        .collect()
                });
                let topics = wanted(k, &group, req)
                    .into_iter()
                    .map(|(t, ps)| {
                        let partitions = ps
                            .into_iter()
                            .map(|p| {
                                let (off, meta, epoch) = committed(k, &group, &t, p);
                                OffsetFetchResponsePartitions::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(off)
                                    .with_committed_leader_epoch(epoch)
                                    .with_metadata(meta.map(|m| str_bytes(&m)))
                            })
                            .collect();
                        OffsetFetchResponseTopics::default()
                            .with_name(TopicName(str_bytes(&t)))
                            .with_partitions(partitions)
                    })
                    .collect();
                OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_topics(topics)
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let group = r.group_id.0.to_string();
    let req = r.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let topics = wanted(k, &group, req)
        .into_iter()
        .map(|(t, ps)| {
            let partitions = ps
                .into_iter()
                .map(|p| {
                    let (off, meta, epoch) = committed(k, &group, &t, p);
                    OffsetFetchResponsePartition::default()
                        .with_partition_index(p)
                        .with_committed_offset(off)
                        .with_committed_leader_epoch(epoch)
                        .with_metadata(meta.map(|m| str_bytes(&m)))
                })
                .collect();
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(str_bytes(&t)))
                .with_partitions(partitions)
        })
        .collect();
    OffsetFetchResponse::default().with_topics(topics)
}
