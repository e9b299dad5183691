//! DescribeTopicPartitions (KIP-966: Metadata's partitions, paged by a
//! cursor), DescribeLogDirs and AlterReplicaLogDirs. A broker set keeps
//! every partition in one log directory, the store's data directory.

use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::*;

use super::str_bytes;
use crate::errors;
use crate::Kafka;

/// Kafka's LOG_DIR_NOT_FOUND.
const LOG_DIR_NOT_FOUND: i16 = 57;

/// DescribeTopicPartitions. `visible`: whether the caller may describe a
/// topic — one it may not is left out before the page is cut (it takes no
/// room and no cursor names it, as Kafka's handler filters first), and a
/// named one is answered TOPIC_AUTHORIZATION_FAILED after the page (left
/// out, the Java Admin asked again for it until its 60 s timeout).
pub fn describe_topic_partitions(
    k: &Kafka,
    r: DescribeTopicPartitionsRequest,
    visible: impl Fn(&str) -> bool,
) -> DescribeTopicPartitionsResponse {
    let node = BrokerId(k.config.node_id);
    let all = k.broker.topics().all();
    let named = !r.topics.is_empty();
    // The topics asked for (all when none), by name, from the cursor on.
    let mut names: Vec<String> = if named {
        r.topics.iter().map(|t| t.name.0.to_string()).collect()
    } else {
        all.iter().map(|(n, _)| n.clone()).collect()
    };
    names.sort();
    names.dedup();
    let (from_topic, from_partition) = match &r.cursor {
        Some(c) => (c.topic_name.0.to_string(), c.partition_index.max(0)),
        None => (String::new(), 0),
    };
    // From the cursor on, then only what the caller may see (a refused
    // name below the cursor was answered on an earlier page).
    names.retain(|n| *n >= from_topic);
    let mut denied = Vec::new();
    names.retain(|n| {
        let seen = visible(n);
        if !seen && named {
            denied.push(n.clone());
        }
        seen
    });
    // Kafka's limit: the request's, at most 2000 (max.request.partition.size.limit).
    let mut left = if r.response_partition_limit > 0 {
        (r.response_partition_limit as usize).min(2000)
    } else {
        2000
    };
    let by_name: std::collections::HashMap<&str, &rokka_broker::TopicInfo> =
        all.iter().map(|(n, i)| (n.as_str(), i)).collect();
    let mut topics = Vec::new();
    let mut next = None;
    for name in names {
        let Some(info) = by_name.get(name.as_str()).copied() else {
            topics.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION)
                    .with_name(Some(TopicName(str_bytes(&name))))
                    .with_topic_authorized_operations(i32::MIN),
            );
            continue;
        };
        let first = if name == from_topic { from_partition } else { 0 };
        // Leaders, epochs and replicas as Metadata gives them (each
        // partition's broker set in cluster mode).
        let lead = super::metadata::topic_entry(k, &name, info, 12).partitions;
        let mut partitions = Vec::new();
        for p in first..info.kafka_partitions() as i32 {
            if left == 0 {
                next = Some(
                    Cursor::default()
                        .with_topic_name(TopicName(str_bytes(&name)))
                        .with_partition_index(p),
                );
                break;
            }
            left -= 1;
            let (leader, epoch, replicas, isr) = match lead.get(p as usize) {
                Some(m) => (
                    m.leader_id,
                    m.leader_epoch,
                    m.replica_nodes.clone(),
                    m.isr_nodes.clone(),
                ),
                None => (node, 0, vec![node], vec![node]),
            };
            partitions.push(
                DescribeTopicPartitionsResponsePartition::default()
                    .with_partition_index(p)
                    .with_leader_id(leader)
                    .with_leader_epoch(epoch)
                    .with_replica_nodes(replicas)
                    .with_isr_nodes(isr)
                    .with_eligible_leader_replicas(Some(Vec::new()))
                    .with_last_known_elr(Some(Vec::new())),
            );
        }
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(TopicName(str_bytes(&name))))
                .with_topic_id(uuid::Uuid::from_bytes(info.topic_id))
                .with_partitions(partitions)
                .with_topic_authorized_operations(i32::MIN),
        );
        if next.is_some() {
            break;
        }
    }
    topics.extend(denied.into_iter().map(|n| {
        DescribeTopicPartitionsResponseTopic::default()
            .with_error_code(crate::authz::TOPIC_AUTHORIZATION_FAILED)
            .with_name(Some(TopicName(str_bytes(&n))))
            .with_topic_authorized_operations(i32::MIN)
    }));
    DescribeTopicPartitionsResponse::default()
        .with_topics(topics)
        .with_next_cursor(next)
}

/// The store's data directory as the one log directory clients see.
fn log_dir(k: &Kafka) -> String {
    let dir = &k.broker.store().config().data_dir;
    std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.clone())
        .display()
        .to_string()
}

/// Bytes a partition's entries take in the CommitLog: the sum kept from
/// the last request plus the entries appended since (summed whole again
/// when the queue's start moved, or it is another queue of the name).
fn partition_bytes(k: &Kafka, topic: &str, q: u32) -> i64 {
    let Some(cq) = k.broker.store().queue(topic, q) else {
        return 0;
    };
    let Some(first) = cq.find(cq.min_offset()) else {
        return 0;
    };
    let end = cq.entry_count();
    let key = (topic.to_string(), q);
    let phys_at = |i: u64| {
        i.checked_sub(1)
            .and_then(|i| cq.entry(i))
            .map_or(u64::MAX, |e| e.phys_offset)
    };
    let mut sizes = k.log_dir_sizes.lock().unwrap_or_else(|p| p.into_inner());
    let (from, base) = match sizes.get(&key) {
        Some((q, f, e, last, sum))
            if q.upgrade().is_some_and(|q| std::sync::Arc::ptr_eq(&q, &cq))
                && *f == first
                && *e <= end
                && phys_at(*e) == *last =>
        {
            (*e, *sum)
        }
        _ => (first, 0),
    };
    let sum = base
        + (from..end)
            .filter_map(|i| cq.entry(i))
            .map(|e| i64::from(e.size))
            .sum::<i64>();
    sizes.insert(key, (std::sync::Arc::downgrade(&cq), first, end, phys_at(end), sum));
    sum
}

pub fn describe_log_dirs(k: &Kafka, r: DescribeLogDirsRequest) -> DescribeLogDirsResponse {
    let all = k.broker.topics().all();
    {
        // Sizes kept only for topics that still exist.
        let names: std::collections::HashSet<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
        k.log_dir_sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(t, _), _| names.contains(t.as_str()));
    }
    let wanted: Vec<(String, Vec<i32>)> = match r.topics {
        // A topic named in several entries: their partitions together.
        Some(ts) => {
            let mut merged: Vec<(String, Vec<i32>)> = Vec::new();
            let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
            for t in ts {
                let name = t.topic.0.to_string();
                match at.get(&name) {
                    Some(&i) => merged[i].1.extend(t.partitions),
                    None => {
                        at.insert(name.clone(), merged.len());
                        merged.push((name, t.partitions));
                    }
                }
            }
            merged
        }
        None => all
            .iter()
            .map(|(n, i)| (n.clone(), (0..i.kafka_partitions() as i32).collect()))
            .collect(),
    };
    let own = k.broker.own_set();
    let by_name: std::collections::HashMap<&str, &rokka_broker::topics::TopicInfo> =
        all.iter().map(|(n, i)| (n.as_str(), i)).collect();
    // A topic or partition named twice is sized once (each copy walked the
    // partition's entries again).
    let topics = wanted
        .into_iter()
        .filter_map(|(name, parts)| {
            let info = *by_name.get(name.as_str())?;
            let mut seen = std::collections::HashSet::with_capacity(parts.len().min(1024));
            let partitions = parts
                .into_iter()
                .filter(|p| seen.insert(*p))
                // This node's replicas only: another set's partitions are
                // in its nodes' directories.
                .filter_map(|p| match info.locate(p, own) {
                    rokka_broker::Located::Here(q) => Some((p, q)),
                    _ => None,
                })
                .map(|(p, q)| {
                    DescribeLogDirsPartition::default()
                        .with_partition_index(p)
                        .with_partition_size(partition_bytes(k, &name, q))
                        .with_offset_lag(0)
                })
                .collect();
            Some(
                DescribeLogDirsTopic::default()
                    .with_name(TopicName(str_bytes(&name)))
                    .with_partitions(partitions),
            )
        })
        .collect();
    let (total, usable) = rokka_store::sys::disk_space(&k.broker.store().config().data_dir).unwrap_or((0, 0));
    DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
        .with_log_dir(str_bytes(&log_dir(k)))
        .with_topics(topics)
        .with_total_bytes(total as i64)
        .with_usable_bytes(usable as i64)])
}

/// Moving a replica to the directory it is in is a no-op; there is no other.
pub fn alter_replica_log_dirs(k: &Kafka, r: AlterReplicaLogDirsRequest) -> AlterReplicaLogDirsResponse {
    let here = log_dir(k);
    let mut results: Vec<AlterReplicaLogDirTopicResult> = Vec::new();
    for d in r.dirs {
        let same = std::fs::canonicalize(d.path.as_str())
            .map(|p| p.display().to_string() == here)
            .unwrap_or(false);
        for t in d.topics {
            let info = k.broker.topics().get(t.name.0.as_str());
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let known = info.as_ref().is_some_and(|i| i.has_partition(*p));
                    let code = if !known {
                        errors::UNKNOWN_TOPIC_OR_PARTITION
                    } else if same {
                        errors::NONE
                    } else {
                        LOG_DIR_NOT_FOUND
                    };
                    AlterReplicaLogDirPartitionResult::default()
                        .with_partition_index(*p)
                        .with_error_code(code)
                })
                .collect();
            results.push(
                AlterReplicaLogDirTopicResult::default()
                    .with_topic_name(t.name)
                    .with_partitions(parts),
            );
        }
    }
    AlterReplicaLogDirsResponse::default().with_results(results)
}
