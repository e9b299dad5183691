//! OffsetCommit / OffsetFetch on the shared committed-offset table.

use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse, TopicName,
};

use rokka_broker::remote::RemoteOffset;
use rokka_broker::Placed as Place;

use super::str_bytes;
use crate::errors;
use crate::Kafka;

/// Where a committed offset of Kafka partition `p` lives: with its queue.
fn place(k: &Kafka, info: Option<&rokka_broker::TopicInfo>, p: i32) -> Place {
    info.map_or(Place::Unknown, |i| i.placed(p, k.broker.own_set()))
}

/// Counts and times a call to another set's master.
fn remote_done(op: &'static str, started: std::time::Instant, ok: bool) {
    metrics::histogram!("rokka_cluster_remote_offset_seconds", "op" => op).record(started.elapsed().as_secs_f64());
    if !ok {
        metrics::counter!("rokka_cluster_remote_offset_errors_total", "op" => op).increment(1);
    }
}

/// Forwarded commits of one OffsetCommit in flight at once: the forwarder
/// keeps a few connections per node (4), so more would only queue.
const FORWARDS_IN_FLIGHT: usize = 8;

/// A forwarded commit: (topic index, partition index) in the request, the
/// topic, the set whose master holds the queue, the queue, the offset.
type Forward = (usize, usize, String, String, u32, RemoteOffset);

/// Runs `calls` side by side, at most [`FORWARDS_IN_FLIGHT`] at once,
/// handing each result to `done`, which says whether to start more. None
/// starts after `deadline`; those still running then are aborted (their
/// results never reach `done`). Returns how many were aborted so.
async fn side_by_side<T, F>(
    calls: impl IntoIterator<Item = F>,
    deadline: Option<tokio::time::Instant>,
    mut done: impl FnMut(T) -> bool,
) -> usize
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let mut calls = calls.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut more = true;
    loop {
        while more && running.len() < FORWARDS_IN_FLIGHT && deadline.is_none_or(|d| tokio::time::Instant::now() < d) {
            let Some(call) = calls.next() else {
                break;
            };
            running.spawn(call);
        }
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, running.join_next()).await {
                Ok(next) => next,
                Err(_) => break,
            },
            None => running.join_next().await,
        };
        match next {
            Some(Ok(t)) => more &= done(t),
            // Its result never comes: the caller counts it as failed.
            Some(Err(e)) => tracing::warn!(error = %e, "a forwarded offset call did not finish"),
            None => break,
        }
    }
    let aborted = running.len();
    running.abort_all();
    aborted
}

/// Commits `remote` on their sets' masters through `fw`, side by side (at
/// most [`FORWARDS_IN_FLIGHT`] at once), all within `within`; the (topic
/// index, partition index) of those that failed or did not finish in time.
/// A queue named twice is committed once, with its last offset (as a
/// request's last entry for a partition wins here), and both get that
/// outcome. No forward starts after the deadline: one that has not started
/// by then fails without being sent.
async fn forward_commits(
    fw: std::sync::Arc<dyn rokka_broker::remote::RemoteOffsets>,
    within: std::time::Duration,
    group: &str,
    remote: Vec<Forward>,
) -> Vec<(usize, usize)> {
    let deadline = tokio::time::Instant::now() + within;
    let keys: Vec<(usize, usize)> = remote.iter().map(|(ti, pi, ..)| (*ti, *pi)).collect();
    // The entry whose forward stands for each: the last naming its queue.
    let stands_for: Vec<usize> = {
        let mut last = std::collections::HashMap::new();
        for (i, (_, _, name, set, q, _)) in remote.iter().enumerate() {
            last.insert((name.as_str(), set.as_str(), *q), i);
        }
        remote
            .iter()
            .enumerate()
            .map(|(i, (_, _, name, set, q, _))| last.get(&(name.as_str(), set.as_str(), *q)).copied().unwrap_or(i))
            .collect()
    };
    let calls = remote
        .into_iter()
        .enumerate()
        .filter(|(i, _)| stands_for[*i] == *i)
        .map(|(i, (_, _, name, set, q, o))| {
            let (fw, group) = (std::sync::Arc::clone(&fw), group.to_string());
            async move {
                let t = std::time::Instant::now();
                let res = fw.commit(&set, &group, &name, q, o).await;
                remote_done("commit", t, res.is_ok());
                if let Err(e) = &res {
                    tracing::debug!(
                        group,
                        topic = name,
                        set,
                        queue = q,
                        error = e,
                        "offset commit forward failed"
                    );
                }
                (i, res.is_ok())
            }
        });
    // Per entry: committed (Some(true)), failed (Some(false)), no answer.
    let mut outcome: Vec<Option<bool>> = vec![None; keys.len()];
    let aborted = side_by_side(calls, Some(deadline), |(i, ok)| {
        outcome[i] = Some(ok);
        true
    })
    .await;
    if aborted > 0 {
        remote_timed_out(group, aborted);
    }
    keys.into_iter()
        .enumerate()
        .filter(|(i, _)| outcome[stands_for[*i]] != Some(true))
        .map(|(_, k)| k)
        .collect()
}

/// The forwards of one commit still unanswered at `group.commit_timeout_ms`.
fn remote_timed_out(group: &str, n: usize) {
    metrics::counter!("rokka_cluster_remote_offset_errors_total", "op" => "commit_timeout").increment(n as u64);
    tracing::debug!(
        group,
        forwards = n,
        "offset commit forwards not answered within group.commit_timeout_ms"
    );
}

pub async fn commit(k: &Kafka, r: OffsetCommitRequest, version: i16) -> OffsetCommitResponse {
    let group = r.group_id.0.to_string();
    // v0/v1 are not served; from v2 the generation and member are checked.
    let member_check = k.groups.with(|c| {
        let code = c.validate_commit(
            &group,
            r.member_id.as_str(),
            r.group_instance_id.as_ref().map(|s| s.as_str()),
            r.generation_id_or_member_epoch,
        );
        // v9+ (KIP-848 consumers): a member epoch for a group the
        // coordinator does not hold is GROUP_ID_NOT_FOUND, as Kafka's
        // OffsetMetadataManager answers (older versions: ILLEGAL_GENERATION).
        if code == rokka_group::code::ILLEGAL_GENERATION
            && version >= 9
            && c.state(&group).is_none()
            && !c.consumer.groups.contains_key(&group)
        {
            rokka_group::code::GROUP_ID_NOT_FOUND
        } else {
            code
        }
    });
    let offsets = k.broker.store().offsets();
    let offsets_asked: std::collections::HashMap<(String, i32), i64> = if tracing::enabled!(tracing::Level::DEBUG) {
        r.topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| ((t.name.to_string(), p.partition_index), p.committed_offset))
            })
            .collect()
    } else {
        Default::default()
    };
    // Other sets' partitions: (topic index, partition index, set, queue, offset).
    let mut remote: Vec<(usize, usize, String, u32, RemoteOffset)> = Vec::new();
    let mut topics: Vec<OffsetCommitResponseTopic> = Vec::with_capacity(r.topics.len());
    for (ti, t) in r.topics.into_iter().enumerate() {
        let name = t.name.0.to_string();
        let known = k.broker.topics().get(&name);
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for (pi, p) in t.partitions.into_iter().enumerate() {
            let at = place(k, known.as_ref(), p.partition_index);
            let code = if group.is_empty() {
                errors::INVALID_GROUP_ID
            } else if member_check != errors::NONE {
                member_check
            } else if matches!(at, Place::Unknown) || p.committed_offset < 0 {
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
                match at {
                    Place::Here(q) => {
                        let o = p.committed_offset as u64;
                        if offsets.commit_bounded(&group, &name, q, o, meta, p.committed_leader_epoch) {
                            errors::NONE
                        } else {
                            // store.max_committed_offsets: a non-retriable
                            // answer (Kafka gives it when an offset commit
                            // cannot be stored for its size).
                            errors::INVALID_COMMIT_OFFSET_SIZE
                        }
                    }
                    Place::Set(set, q) => {
                        remote.push((
                            ti,
                            pi,
                            set,
                            q,
                            RemoteOffset {
                                offset: p.committed_offset as u64,
                                metadata: meta.to_string(),
                                leader_epoch: p.committed_leader_epoch,
                            },
                        ));
                        errors::NONE
                    }
                    Place::Unknown => errors::UNKNOWN_TOPIC_OR_PARTITION,
                }
            };
            partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code),
            );
        }
        topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    // This set's commits are answered once its in-sync replicas hold them
    // (Kafka writes its offsets topic with acks=all): a commit the client
    // was told of survives a failover. Not confirmed in time: retriable.
    let remote_keys: std::collections::HashSet<(usize, usize)> = remote.iter().map(|(ti, pi, ..)| (*ti, *pi)).collect();
    let local_ok = topics.iter().enumerate().any(|(ti, t)| {
        t.partitions
            .iter()
            .enumerate()
            .any(|(pi, p)| p.error_code == errors::NONE && !remote_keys.contains(&(ti, pi)))
    });
    let local_wait = async {
        if local_ok {
            k.broker.offsets_durable(Some(k.groups.commit_timeout)).await
        } else {
            Ok(())
        }
    };
    // Another set's queue: committed on its master. A failed forward is
    // COORDINATOR_NOT_AVAILABLE (the client retries the commit), never a
    // commit silently lost. The forwards run side by side (at most
    // FORWARDS_IN_FLIGHT at once) and while this set's own commits wait
    // for its replicas, all within group.commit_timeout_ms: one slow
    // master does not hold the answer for its replication timeout per
    // partition.
    let forwards: Vec<Forward> = remote
        .into_iter()
        .map(|(ti, pi, set, q, o)| (ti, pi, topics[ti].name.0.to_string(), set, q, o))
        .collect();
    let remote_wait = async {
        if forwards.is_empty() {
            return Vec::new();
        }
        match k.broker.remote_offsets() {
            Some(fw) => forward_commits(std::sync::Arc::clone(fw), k.groups.commit_timeout, &group, forwards).await,
            None => {
                tracing::debug!(group, "offset commit forward failed: no route to other broker sets");
                forwards.into_iter().map(|(ti, pi, ..)| (ti, pi)).collect()
            }
        }
    };
    let (local, failed) = tokio::join!(local_wait, remote_wait);
    if let Err(e) = local {
        tracing::debug!(group, error = e, "offset commit not replicated");
        for (ti, t) in topics.iter_mut().enumerate() {
            for (pi, p) in t.partitions.iter_mut().enumerate() {
                if p.error_code == errors::NONE && !remote_keys.contains(&(ti, pi)) {
                    p.error_code = errors::COORDINATOR_NOT_AVAILABLE;
                }
            }
        }
    }
    for (ti, pi) in failed {
        topics[ti].partitions[pi].error_code = errors::COORDINATOR_NOT_AVAILABLE;
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        for t in &topics {
            for p in &t.partitions {
                tracing::debug!(
                    group,
                    member = r.member_id.as_str(),
                    generation = r.generation_id_or_member_epoch,
                    topic = t.name.as_str(),
                    partition = p.partition_index,
                    offset = offsets_asked
                        .get(&(t.name.to_string(), p.partition_index))
                        .copied()
                        .unwrap_or(-1),
                    code = p.error_code,
                    "offset commit"
                );
            }
        }
    }
    OffsetCommitResponse::default().with_topics(topics)
}

fn log_fetch(group: &str, topic: &str, partition: i32, c: &Result<Committed, i16>) {
    if let Ok((offset, ..)) = c {
        tracing::debug!(group, topic, partition, offset, "offset fetch");
    }
}

/// A committed offset as OffsetFetch answers it: offset (-1: none),
/// metadata, leader epoch.
type Committed = (i64, Option<String>, i32);

/// What `group` has committed for each of `wanted`'s partitions, in their
/// order: this set's queues from the store, another set's asked of its
/// master — side by side (at most [`FORWARDS_IN_FLIGHT`] at once); once
/// one has failed, no more are asked (they fail too, with
/// COORDINATOR_NOT_AVAILABLE, which the client retries: one failure is the
/// group's error, or the whole response's, anyway).
async fn committed_all(k: &Kafka, group: &str, wanted: &[(String, Vec<i32>)]) -> Vec<Vec<Result<Committed, i16>>> {
    let none = || (-1, Some(String::new()), -1);
    let mut out: Vec<Vec<Result<Committed, i16>>> = Vec::with_capacity(wanted.len());
    let mut remote = Vec::new();
    for (ti, (topic, ps)) in wanted.iter().enumerate() {
        let info = k.broker.topics().get(topic);
        let mut row = Vec::with_capacity(ps.len());
        for (pi, &p) in ps.iter().enumerate() {
            row.push(match place(k, info.as_ref(), p) {
                Place::Here(q) => Ok(match k.broker.store().offsets().get(group, topic, q) {
                    Some(o) => (o.offset as i64, Some(o.metadata), o.leader_epoch),
                    None => none(),
                }),
                Place::Set(set, q) => {
                    remote.push((ti, pi, set, q));
                    Err(errors::COORDINATOR_NOT_AVAILABLE)
                }
                Place::Unknown => Ok(none()),
            });
        }
        out.push(row);
    }
    if remote.is_empty() {
        return out;
    }
    let Some(fw) = k.broker.remote_offsets().cloned() else {
        tracing::debug!(group, "offset fetch forward failed: no route to other broker sets");
        return out;
    };
    let calls = remote.into_iter().map(|(ti, pi, set, q)| {
        let (fw, group, topic) = (std::sync::Arc::clone(&fw), group.to_string(), wanted[ti].0.clone());
        async move {
            let started = std::time::Instant::now();
            let res = fw.fetch(&set, &group, &topic, q).await;
            remote_done("fetch", started, res.is_ok());
            let res = match res {
                Ok(Some(o)) => Some((o.offset as i64, Some(o.metadata), o.leader_epoch)),
                Ok(None) => Some(none()),
                Err(e) => {
                    tracing::debug!(group, topic, set, queue = q, error = e, "offset fetch forward failed");
                    None
                }
            };
            (ti, pi, res)
        }
    });
    // One unanswered read fails the answer (the group's error, or the
    // response's): no more are started then. All within
    // group.commit_timeout_ms: a slow master does not hold the answer for
    // its timeout per round of reads (those not read by then are the
    // retriable error already in their place).
    let deadline = tokio::time::Instant::now() + k.groups.commit_timeout;
    side_by_side(calls, Some(deadline), |(ti, pi, res)| match res {
        Some(c) => {
            out[ti][pi] = Ok(c);
            true
        }
        None => false,
    })
    .await;
    out
}

/// The partitions of `wanted` (by index) whose committed offset is not
/// stable: a transaction holding offsets for them has not completed
/// (KIP-447). Asked for with `require_stable` (librdkafka and the Java
/// consumer under read_committed): answered UNSTABLE_OFFSET_COMMIT, which
/// they retry, rather than the offset before the transaction — a consumer
/// taking over a partition would start from it and process again what the
/// transaction consumed.
fn unstable(k: &Kafka, group: &str, wanted: &[(String, Vec<i32>)]) -> Vec<Vec<bool>> {
    let pending = k.broker.pending_txn_offsets(group);
    wanted
        .iter()
        .map(|(topic, ps)| {
            // This topic's held queues: (set, queue).
            let held: Vec<(Option<&str>, u32)> = pending
                .iter()
                .filter(|(t, _, _)| t == topic)
                .map(|(_, s, q)| (s.as_deref(), *q))
                .collect();
            if held.is_empty() {
                return vec![false; ps.len()];
            }
            let info = k.broker.topics().get(topic);
            ps.iter()
                .map(|&p| match place(k, info.as_ref(), p) {
                    Place::Here(q) => held.contains(&(None, q)),
                    Place::Set(s, q) => held.contains(&(Some(s.as_str()), q)),
                    Place::Unknown => false,
                })
                .collect()
        })
        .collect()
}

/// The other broker sets of the cluster (none with one set or outside
/// cluster mode).
pub(crate) fn other_sets(k: &Kafka) -> Vec<String> {
    let own = k.broker.own_set();
    k.broker
        .cluster_view()
        .map(|v| {
            v.sets
                .iter()
                .filter(|s| Some(s.name.as_str()) != own)
                .map(|s| s.name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// [`unstable`] when the request requires stable offsets, else none.
fn stability(k: &Kafka, require_stable: bool, group: &str, wanted: &[(String, Vec<i32>)]) -> Vec<Vec<bool>> {
    if require_stable {
        let u = unstable(k, group, wanted);
        let n: usize = u.iter().map(|ps| ps.iter().filter(|x| **x).count()).sum();
        if n > 0 {
            metrics::counter!("rokka_kafka_offset_fetch_unstable_total").increment(n as u64);
        }
        u
    } else {
        wanted.iter().map(|(_, ps)| vec![false; ps.len()]).collect()
    }
}

/// (topic, partitions) requested, or every committed one when `None`: this
/// set's queues as their Kafka partitions, and in cluster mode those the
/// group has committed on every other set (asked of their masters; one
/// unreachable: an error code the client retries).
async fn wanted(
    k: &Kafka,
    group: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
) -> Result<Vec<(String, Vec<i32>)>, i16> {
    if let Some(t) = topics {
        // Kafka reads the list as a set: a topic or partition named twice
        // is answered once (each answer repeats the commit's metadata, up
        // to 4 KiB: one small request must not make a huge response).
        let mut out: Vec<(String, Vec<i32>)> = Vec::with_capacity(t.len().min(1024));
        let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for (name, parts) in t {
            let i = *at.entry(name.clone()).or_insert_with(|| {
                out.push((name, Vec::new()));
                out.len() - 1
            });
            out[i].1.extend(parts);
        }
        for (_, ps) in &mut out {
            let mut seen = std::collections::HashSet::with_capacity(ps.len().min(1024));
            ps.retain(|p| seen.insert(*p));
        }
        return Ok(out);
    }
    let own = k.broker.own_set();
    let mut by_topic: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
    let mut add = |set: Option<&str>, t: String, q: u32| {
        let p = match k.broker.topics().get(&t) {
            Some(i) => i.kafka_partition_of(set, q),
            None => (set == own).then_some(q as i32),
        };
        if let Some(p) = p {
            by_topic.entry(t).or_default().push(p);
        }
    };
    for (t, q, _) in k.broker.store().offsets().group_offsets(group) {
        add(own, t, q);
    }
    let others = other_sets(k);
    for set in others {
        let started = std::time::Instant::now();
        let res = match k.broker.remote_offsets() {
            Some(fw) => fw.group_offsets(&set, group).await,
            None => Err("no route to other broker sets".into()),
        };
        remote_done("list", started, res.is_ok());
        match res {
            Ok(list) => {
                for (t, q, _) in list {
                    add(Some(&set), t, q);
                }
            }
            Err(e) => {
                tracing::debug!(group, set, error = e, "listing a group's offsets on another set failed");
                return Err(errors::COORDINATOR_NOT_AVAILABLE);
            }
        }
    }
    Ok(by_topic
        .into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            ps.dedup();
            (t, ps)
        })
        .collect())
}

pub async fn fetch(k: &Kafka, r: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    if version >= 8 {
        let mut groups = Vec::with_capacity(r.groups.len().min(1024));
        // A group named twice is answered once (each copy read — and in
        // cluster mode asked every other set for — all its offsets).
        let mut seen = std::collections::HashSet::with_capacity(r.groups.len().min(1024));
        for g in r.groups {
            let topics_key: Option<Vec<(String, Vec<i32>)>> = g.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes.clone()))
                    .collect()
            });
            if !seen.insert((g.group_id.clone(), topics_key)) {
                continue;
            }
            let group = g.group_id.0.to_string();
            let req = g.topics.map(|ts| {
                ts.into_iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes))
                    .collect()
            });
            let mut topics = Vec::new();
            let (wanted, mut group_error) = match wanted(k, &group, req).await {
                Ok(w) => (w, errors::NONE),
                Err(code) => (Vec::new(), code),
            };
            let found = committed_all(k, &group, &wanted).await;
            let unstable = stability(k, r.require_stable, &group, &wanted);
            for (((t, ps), found), unstable) in wanted.into_iter().zip(found).zip(unstable) {
                let mut partitions = Vec::with_capacity(ps.len());
                for ((p, c), unstable) in ps.into_iter().zip(found).zip(unstable) {
                    log_fetch(&group, &t, p, &c);
                    let (off, meta, epoch, code) = match c {
                        Ok(_) if unstable => (-1, Some(String::new()), -1, errors::UNSTABLE_OFFSET_COMMIT),
                        Ok((o, m, e)) => (o, m, e, errors::NONE),
                        Err(code) => {
                            group_error = code;
                            (-1, Some(String::new()), -1, errors::NONE)
                        }
                    };
                    partitions.push(
                        OffsetFetchResponsePartitions::default()
                            .with_partition_index(p)
                            .with_committed_offset(off)
                            .with_committed_leader_epoch(epoch)
                            .with_metadata(meta.map(|m| str_bytes(&m)))
                            .with_error_code(code),
                    );
                }
                topics.push(
                    OffsetFetchResponseTopics::default()
                        .with_name(TopicName(str_bytes(&t)))
                        .with_partitions(partitions),
                );
            }
            groups.push(
                OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_error_code(group_error)
                    .with_topics(if group_error == errors::NONE {
                        topics
                    } else {
                        Vec::new()
                    }),
            );
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let group = r.group_id.0.to_string();
    let req = r.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let mut topics = Vec::new();
    let (wanted, mut top_error) = match wanted(k, &group, req).await {
        Ok(w) => (w, errors::NONE),
        Err(code) => (Vec::new(), code),
    };
    let found = committed_all(k, &group, &wanted).await;
    let unstable = stability(k, version >= 7 && r.require_stable, &group, &wanted);
    for (((t, ps), found), unstable) in wanted.into_iter().zip(found).zip(unstable) {
        let mut partitions = Vec::with_capacity(ps.len());
        for ((p, c), unstable) in ps.into_iter().zip(found).zip(unstable) {
            log_fetch(&group, &t, p, &c);
            let (off, meta, epoch, code) = match c {
                Ok(_) if unstable => (-1, Some(String::new()), -1, errors::UNSTABLE_OFFSET_COMMIT),
                Ok((o, m, e)) => (o, m, e, errors::NONE),
                Err(code) => {
                    top_error = code;
                    (-1, Some(String::new()), -1, code)
                }
            };
            partitions.push(
                OffsetFetchResponsePartition::default()
                    .with_partition_index(p)
                    .with_committed_offset(off)
                    .with_committed_leader_epoch(epoch)
                    .with_metadata(meta.map(|m| str_bytes(&m)))
                    .with_error_code(code),
            );
        }
        topics.push(
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(str_bytes(&t)))
                .with_partitions(partitions),
        );
    }
    // v2+: a top-level error the client retries (a set unreachable).
    let resp = OffsetFetchResponse::default().with_topics(topics);
    if version >= 2 {
        resp.with_error_code(top_error)
    } else {
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rokka_broker::remote::{RemoteCall, RemoteOffsets};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A master per queue: queue 0 never answers, queue 1 refuses, the
    /// others commit after 20 ms; counts the forwards in flight at once and
    /// keeps each call's (queue, offset).
    #[derive(Debug, Default)]
    struct Masters {
        now: AtomicUsize,
        most: AtomicUsize,
        calls: Mutex<Vec<(u32, u64)>>,
    }

    impl RemoteOffsets for Masters {
        fn commit<'a>(&'a self, _: &'a str, _: &'a str, _: &'a str, queue: u32, o: RemoteOffset) -> RemoteCall<'a, ()> {
            Box::pin(async move {
                self.calls
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((queue, o.offset));
                let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
                self.most.fetch_max(n, Ordering::SeqCst);
                let wait = if queue == 0 { 3_600_000 } else { 20 };
                tokio::time::sleep(Duration::from_millis(wait)).await;
                self.now.fetch_sub(1, Ordering::SeqCst);
                if queue == 1 {
                    Err("refused".into())
                } else {
                    Ok(())
                }
            })
        }

        fn group_offsets<'a>(&'a self, _: &'a str, _: &'a str) -> RemoteCall<'a, Vec<(String, u32, u64)>> {
            Box::pin(async { Ok(Vec::new()) })
        }

        fn delete_group<'a>(&'a self, _: &'a str, _: &'a str) -> RemoteCall<'a, u64> {
            Box::pin(async { Ok(0) })
        }

        /// Queue 0 has 40 committed, queue 1 nothing, queue 2 refuses;
        /// queues from 100 on answer nothing committed after 200 ms.
        fn fetch<'a>(&'a self, _: &'a str, _: &'a str, _: &'a str, queue: u32) -> RemoteCall<'a, Option<RemoteOffset>> {
            Box::pin(async move {
                self.calls.lock().unwrap_or_else(|p| p.into_inner()).push((queue, 0));
                let wait = if queue >= 100 { 200 } else { 20 };
                tokio::time::sleep(Duration::from_millis(wait)).await;
                if queue >= 100 {
                    return Ok(None);
                }
                match queue {
                    0 => Ok(Some(RemoteOffset {
                        offset: 40,
                        metadata: "m".into(),
                        leader_epoch: 3,
                    })),
                    1 => Ok(None),
                    _ => Err("refused".into()),
                }
            })
        }
    }

    impl Masters {
        fn calls(&self) -> Vec<(u32, u64)> {
            let mut c = self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
            c.sort_unstable();
            c
        }
    }

    /// Entries (partition index = position) for `queues`, offset 7 unless
    /// given.
    fn forwards(queues: impl IntoIterator<Item = (u32, u64)>) -> Vec<Forward> {
        queues
            .into_iter()
            .enumerate()
            .map(|(pi, (q, offset))| {
                let o = RemoteOffset {
                    offset,
                    metadata: String::new(),
                    leader_epoch: -1,
                };
                (0, pi, "t".to_string(), "b".to_string(), q, o)
            })
            .collect()
    }

    #[tokio::test]
    async fn forwarded_commits_run_side_by_side_and_end_at_the_commit_timeout() {
        let masters = Arc::new(Masters::default());
        let fw: Arc<dyn RemoteOffsets> = Arc::clone(&masters) as _;
        // 30 forwards, 8 at a time (one after another before).
        let failed = forward_commits(
            Arc::clone(&fw),
            Duration::from_secs(30),
            "g",
            forwards((2..32).map(|q| (q, 7))),
        )
        .await;
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(masters.most.load(Ordering::SeqCst), FORWARDS_IN_FLIGHT);
        // A master that never answers fails its partition at the bound
        // (it waited forever before); a refusal fails its own; the rest
        // are committed.
        let started = std::time::Instant::now();
        let mut failed = forward_commits(
            Arc::clone(&fw),
            Duration::from_millis(300),
            "g",
            forwards((0..12).map(|q| (q, 7))),
        )
        .await;
        failed.sort_unstable();
        assert_eq!(failed, vec![(0, 0), (0, 1)]);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(20),
            "{took:?}"
        );
    }

    #[tokio::test]
    async fn a_queue_named_twice_is_committed_once_with_its_last_offset() {
        let masters = Arc::new(Masters::default());
        let fw: Arc<dyn RemoteOffsets> = Arc::clone(&masters) as _;
        let failed = forward_commits(fw, Duration::from_secs(30), "g", forwards([(5, 10), (6, 3), (5, 20)])).await;
        assert!(failed.is_empty(), "{failed:?}");
        assert_eq!(masters.calls(), vec![(5, 20), (6, 3)]);
    }

    #[tokio::test]
    async fn no_forward_starts_after_the_deadline() {
        let masters = Arc::new(Masters::default());
        let fw: Arc<dyn RemoteOffsets> = Arc::clone(&masters) as _;
        // Eight queues whose masters never answer take every slot; the
        // twelve after them are never sent, and every entry fails.
        let entries = (0..8).map(|_| (0, 7)).chain((2..14).map(|q| (q, 7)));
        let mut entries: Vec<Forward> = forwards(entries);
        // Distinct sets, so the eight are not one queue named eight times.
        for (n, e) in entries.iter_mut().enumerate().take(8) {
            e.3 = format!("set{n}");
        }
        let failed = forward_commits(fw, Duration::from_millis(300), "g", entries).await;
        assert_eq!(failed.len(), 20);
        assert_eq!(masters.calls().len(), FORWARDS_IN_FLIGHT);
    }

    /// A slow master: an OffsetFetch of many of its queues answers within
    /// group.commit_timeout_ms, those not read by then retriable.
    #[tokio::test]
    async fn an_offset_fetch_of_a_slow_masters_queues_ends_at_the_commit_timeout(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use rokka_broker::topics::{QueueRef, TopicTable};
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Arc::new(rokka_broker::Broker::new(store, Default::default())?);
        broker.set_own_set("a");
        // 200 partitions on set b, 200 ms a read, 8 at a time: 5 s.
        let placement = (100..300).map(|queue| QueueRef { set: "b".into(), queue }).collect();
        let info = TopicTable::new_info(200, Default::default(), placement).local_form("a");
        broker.topics().insert_new("slow", info)?;
        broker.set_remote_offsets(Arc::new(Masters::default()) as Arc<dyn RemoteOffsets>);
        let addr: std::net::SocketAddr = "127.0.0.1:9092".parse()?;
        let group = rokka_group::GroupConfig {
            commit_timeout_ms: 500,
            ..Default::default()
        };
        let k = crate::Kafka::new(broker, Default::default(), group, addr);
        let started = std::time::Instant::now();
        let found = committed_all(&k, "g", &[("slow".to_string(), (0..200).collect())]).await;
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "{took:?}");
        let read = found[0].iter().filter(|c| c.is_ok()).count();
        assert!(read > 0 && read < 200, "{read}");
        assert!(found[0]
            .iter()
            .all(|c| c.is_ok() || *c == Err(errors::COORDINATOR_NOT_AVAILABLE)));
        Ok(())
    }

    #[tokio::test]
    async fn an_offset_fetch_reads_this_sets_queues_here_and_the_others_on_their_master(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use rokka_broker::topics::{QueueRef, TopicTable};
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Arc::new(rokka_broker::Broker::new(store, Default::default())?);
        broker.set_own_set("a");
        let q = |set: &str, queue| QueueRef { set: set.into(), queue };
        // Kafka partitions 0..4: a/0, b/0, b/1, b/2.
        let placement = vec![q("a", 0), q("b", 0), q("b", 1), q("b", 2)];
        let info = TopicTable::new_info(4, Default::default(), placement).local_form("a");
        broker.topics().insert_new("t", info)?;
        broker.store().offsets().commit("g", "t", 0, 9, "here");
        let masters = Arc::new(Masters::default());
        broker.set_remote_offsets(Arc::clone(&masters) as Arc<dyn RemoteOffsets>);
        let addr: std::net::SocketAddr = "127.0.0.1:9092".parse()?;
        let k = crate::Kafka::new(broker, Default::default(), Default::default(), addr);
        let found = committed_all(&k, "g", &[("t".to_string(), vec![0, 1, 2, 3, 7])]).await;
        assert_eq!(
            found,
            vec![vec![
                Ok((9, Some("here".to_string()), -1)),
                Ok((40, Some("m".to_string()), 3)),
                Ok((-1, Some(String::new()), -1)),
                Err(errors::COORDINATOR_NOT_AVAILABLE),
                Ok((-1, Some(String::new()), -1)),
            ]]
        );
        assert_eq!(
            masters.calls().len(),
            3,
            "the three queues of set b were asked of its master"
        );
        // Twenty queues whose master refuses: once one has failed no more
        // are asked (the first eight were already under way).
        let placement = (2..22).map(|n| q("b", n)).collect();
        let info = TopicTable::new_info(20, Default::default(), placement).local_form("a");
        k.broker.topics().insert_new("u", info)?;
        let found = committed_all(&k, "g", &[("u".to_string(), (0..20).collect())]).await;
        assert!(
            found[0].iter().all(|c| *c == Err(errors::COORDINATOR_NOT_AVAILABLE)),
            "{found:?}"
        );
        assert_eq!(masters.calls().len(), 3 + FORWARDS_IN_FLIGHT);
        Ok(())
    }
}
