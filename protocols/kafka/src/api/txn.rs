//! The transaction APIs a transactional producer uses after InitProducerId
//! (AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn) and the
//! admin ones (DescribeTransactions, ListTransactions), over the broker's
//! transaction coordinator (`rokka_broker::kafka_txn`).

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedState;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::*;
use rokka_broker::kafka_txn::{code, PendingOffset, TxnState as State};

use super::str_bytes;
use crate::errors;
use crate::Kafka;

pub async fn add_partitions(k: &Kafka, r: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse {
    // Partitions as queues: this set's, or another broker set's (whose
    // master joins the transaction before the producer writes there).
    let own = k.broker.own_set();
    let wanted: Vec<(String, rokka_broker::Placed)> = r
        .v3_and_below_topics
        .iter()
        .flat_map(|t| {
            let info = k.broker.topics().get(t.name.0.as_str());
            t.partitions.iter().map(move |p| {
                let at = info
                    .as_ref()
                    .map_or(rokka_broker::Placed::Unknown, |i| i.placed(*p, own));
                (t.name.0.to_string(), at)
            })
        })
        .collect();
    let codes = match k
        .broker
        .txn_add_partitions(
            r.v3_and_below_transactional_id.as_str(),
            r.v3_and_below_producer_id.0,
            r.v3_and_below_producer_epoch,
            &wanted,
        )
        .await
    {
        Ok(codes) => codes,
        Err(e) => vec![e; wanted.len()],
    };
    let mut at = 0;
    let results = r
        .v3_and_below_topics
        .into_iter()
        .map(|t| {
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let c = codes.get(at).copied().unwrap_or(code::INVALID_REQUEST);
                    at += 1;
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(*p)
                        .with_partition_error_code(c)
                })
                .collect();
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name)
                .with_results_by_partition(parts)
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

pub async fn add_offsets(k: &Kafka, r: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse {
    let c = match k
        .broker
        .txn_add_offsets(
            r.transactional_id.as_str(),
            r.producer_id.0,
            r.producer_epoch,
            r.group_id.as_str(),
        )
        .await
    {
        Ok(()) => errors::NONE,
        Err(e) => e,
    };
    AddOffsetsToTxnResponse::default().with_error_code(c)
}

pub async fn offset_commit(k: &Kafka, r: TxnOffsetCommitRequest, version: i16) -> TxnOffsetCommitResponse {
    let group = r.group_id.to_string();
    // v3 (KIP-447): a member of the group commits under its generation.
    let member = if version >= 3 && !r.member_id.is_empty() {
        k.groups.with(|c| {
            c.validate_txn_commit(
                &group,
                r.member_id.as_str(),
                r.group_instance_id.as_ref().map(|s| s.as_str()),
                r.generation_id,
            )
        })
    } else {
        errors::NONE
    };
    let max_meta = k.config.max_offset_metadata_bytes as usize;
    let own = k.broker.own_set();
    let mut pending = Vec::new();
    // Looked up once per answered partition: a map, so a request of many
    // refused partitions is not quadratic.
    let mut bad: std::collections::HashMap<(String, i32), i16> = std::collections::HashMap::new();
    for t in &r.topics {
        let name = t.name.0.to_string();
        let info = k.broker.topics().get(&name);
        for p in &t.partitions {
            let at = info
                .as_ref()
                .map_or(rokka_broker::Placed::Unknown, |i| i.placed(p.partition_index, own));
            let meta = p.committed_metadata.as_ref().map_or("", |m| m.as_str());
            // Another broker set's partition: its offset is committed on
            // that set's master when the transaction commits.
            let (set, queue) = match at {
                rokka_broker::Placed::Here(q) => (None, q),
                rokka_broker::Placed::Set(s, q) => (Some(s), q),
                rokka_broker::Placed::Unknown => {
                    bad.insert((name.clone(), p.partition_index), errors::UNKNOWN_TOPIC_OR_PARTITION);
                    continue;
                }
            };
            if p.committed_offset < 0 {
                bad.insert((name.clone(), p.partition_index), errors::UNKNOWN_TOPIC_OR_PARTITION);
            } else if meta.len() > max_meta {
                bad.insert((name.clone(), p.partition_index), errors::OFFSET_METADATA_TOO_LARGE);
            } else {
                pending.push(PendingOffset {
                    group: group.clone(),
                    topic: name.clone(),
                    partition: queue,
                    offset: p.committed_offset as u64,
                    metadata: meta.to_string(),
                    leader_epoch: p.committed_leader_epoch,
                    set,
                });
            }
        }
    }
    // This node coordinates the group; the transaction may be another
    // set's (its id hashes elsewhere): the offsets are then held here for
    // that coordinator to end, as Kafka's group coordinator holds them
    // until the marker.
    let txn_id = r.transactional_id.as_str();
    let elsewhere = k
        .broker
        .cluster_view()
        .filter(|v| !v.coordinates(txn_id))
        .and_then(|v| v.coordinator_set(txn_id).map(|s| s.name.clone()));
    let all = if member != errors::NONE {
        member
    } else {
        let done = match elsewhere {
            Some(coordinator) => {
                k.broker
                    .txn_participate_offsets(&coordinator, r.producer_id.0, r.producer_epoch, pending)
            }
            None => k
                .broker
                .txn_commit_offsets(txn_id, r.producer_id.0, r.producer_epoch, pending),
        };
        match done {
            // Held offsets are answered once the set's replicas hold them
            // (a new master ends the transaction with them).
            Ok(()) => match k.broker.txns_durable().await {
                Ok(()) => errors::NONE,
                Err(e) => {
                    tracing::debug!(
                        transactional_id = txn_id,
                        error = e,
                        "transactional offsets not replicated"
                    );
                    errors::COORDINATOR_NOT_AVAILABLE
                }
            },
            Err(e) => e,
        }
    };
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let parts = t
                .partitions
                .iter()
                .map(|p| {
                    let c = bad.get(&(name.clone(), p.partition_index)).copied().unwrap_or(all);
                    TxnOffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(c)
                })
                .collect();
            TxnOffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(parts)
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

pub async fn end(k: &Kafka, r: EndTxnRequest) -> EndTxnResponse {
    let c = match k
        .broker
        .txn_end(
            r.transactional_id.as_str(),
            r.producer_id.0,
            r.producer_epoch,
            r.committed,
        )
        .await
    {
        Ok(()) => errors::NONE,
        Err(e) => e,
    };
    EndTxnResponse::default()
        .with_error_code(c)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1)
}

pub fn describe(k: &Kafka, r: DescribeTransactionsRequest) -> DescribeTransactionsResponse {
    let states = r
        .transactional_ids
        .into_iter()
        .map(|id| match k.broker.kafka_txns().get(id.as_str()) {
            Some(m) => {
                let mut topics: Vec<TopicData> = Vec::new();
                let own = k.broker.own_set();
                let here = m.partitions.iter().map(|(t, q)| (own, t, *q));
                let elsewhere = m.remote.iter().map(|(s, t, q)| (Some(s.as_str()), t, *q));
                for (set, t, q) in here.chain(elsewhere) {
                    // Stored as queues of a set; listed as Kafka partitions.
                    let p = k
                        .broker
                        .topics()
                        .get(t)
                        .and_then(|i| i.kafka_partition_of(set, q))
                        .unwrap_or(q as i32);
                    match topics.iter_mut().find(|x| x.topic.0.as_str() == t) {
                        Some(x) => x.partitions.push(p),
                        None => topics.push(
                            TopicData::default()
                                .with_topic(TopicName(str_bytes(t)))
                                .with_partitions(vec![p]),
                        ),
                    }
                }
                TransactionState::default()
                    .with_transactional_id(id)
                    .with_transaction_state(str_bytes(m.state.name()))
                    .with_transaction_timeout_ms(m.timeout_ms as i32)
                    .with_transaction_start_time_ms(m.start_ms)
                    .with_producer_id(ProducerId(m.producer_id))
                    .with_producer_epoch(m.epoch)
                    .with_topics(topics)
            }
            None => TransactionState::default()
                .with_error_code(code::TRANSACTIONAL_ID_NOT_FOUND)
                .with_transactional_id(id)
                .with_transaction_state(str_bytes(""))
                .with_transaction_start_time_ms(-1)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

const STATES: [State; 6] = [
    State::Empty,
    State::Ongoing,
    State::PrepareCommit,
    State::PrepareAbort,
    State::CompleteCommit,
    State::CompleteAbort,
];

pub fn list(k: &Kafka, r: ListTransactionsRequest) -> ListTransactionsResponse {
    let unknown: Vec<_> = r
        .state_filters
        .iter()
        .filter(|f| !STATES.iter().any(|s| s.name() == f.as_str()))
        .cloned()
        .collect();
    let now = rokka_store::now_ms();
    let states = k
        .broker
        .kafka_txns()
        .all()
        .into_iter()
        .filter(|m| r.state_filters.is_empty() || r.state_filters.iter().any(|f| f.as_str() == m.state.name()))
        .filter(|m| r.producer_id_filters.is_empty() || r.producer_id_filters.iter().any(|p| p.0 == m.producer_id))
        // v1: only transactions open longer than duration_filter ms.
        .filter(|m| r.duration_filter < 0 || (m.start_ms >= 0 && now - m.start_ms >= r.duration_filter))
        .map(|m| {
            ListedState::default()
                .with_transactional_id(TransactionalId(str_bytes(&m.id)))
                .with_producer_id(ProducerId(m.producer_id))
                .with_transaction_state(str_bytes(m.state.name()))
        })
        .collect();
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(states)
}

/// DescribeProducers: the idempotent and transactional producers with state
/// on each partition, and the start of their open transaction (what
/// `kafka-transactions.sh find-hanging` looks at).
pub fn describe_producers(k: &Kafka, r: DescribeProducersRequest) -> DescribeProducersResponse {
    use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
    // A partition named twice is described once (each copy scanned the
    // producer table and listed its producers again).
    // A topic named in several entries: their partitions together.
    let mut merged: Vec<kafka_protocol::messages::describe_producers_request::TopicRequest> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for t in r.topics {
        match at.get(t.name.0.as_str()) {
            Some(&i) => merged[i].partition_indexes.extend(t.partition_indexes),
            None => {
                at.insert(t.name.0.to_string(), merged.len());
                merged.push(t);
            }
        }
    }
    // The producer table walked once for every partition asked for.
    let mut wanted: std::collections::HashMap<String, std::collections::HashSet<u32>> = Default::default();
    for t in &merged {
        let info = k.broker.topics().get(t.name.0.as_str());
        for p in &t.partition_indexes {
            if let Ok(q) = super::queue_of(k, info.as_ref(), *p) {
                wanted.entry(t.name.0.to_string()).or_default().insert(q);
            }
        }
    }
    let mut states = k.broker.producers().on_partitions(&wanted);
    let topics = merged
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let info = k.broker.topics().get(&name);
            let mut seen = std::collections::HashSet::with_capacity(t.partition_indexes.len().min(1024));
            let partitions = t
                .partition_indexes
                .into_iter()
                .filter(|p| seen.insert(*p))
                .map(|p| {
                    let q = match super::queue_of(k, info.as_ref(), p) {
                        Ok(q) => q,
                        Err(code) => {
                            return PartitionResponse::default()
                                .with_partition_index(p)
                                .with_error_code(code)
                        }
                    };
                    let active = states
                        .remove(&(name.clone(), q))
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(pid, epoch, last_seq, last_ms)| {
                            let open = k.broker.kafka_txns().open_first_offset(&name, q, pid);
                            ProducerState::default()
                                .with_producer_id(ProducerId(pid))
                                .with_producer_epoch(i32::from(epoch))
                                .with_last_sequence(last_seq)
                                .with_last_timestamp(last_ms as i64)
                                .with_coordinator_epoch(if open.is_some() { 0 } else { -1 })
                                .with_current_txn_start_offset(open.map_or(-1, |o| o as i64))
                        })
                        .collect();
                    PartitionResponse::default()
                        .with_partition_index(p)
                        .with_active_producers(active)
                })
                .collect();
            TopicResponse::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
