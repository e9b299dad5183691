//! OffsetForLeaderEpoch: the end offset of a leader epoch, which consumers
//! use to check their position after a leader change or a restart with a
//! committed leader epoch (KIP-320). A Rokka partition has had one leader
//! epoch, 0, for its whole life (Metadata reports it), so epoch 0 ends at
//! the log end offset, a later one is undefined and an earlier one ends
//! where epoch 0 began — as Kafka's leader-epoch cache answers.

use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::errors;
use crate::Kafka;

/// The only leader epoch a partition has had.
const EPOCH: i32 = 0;

pub fn handle(k: &Kafka, r: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse {
    let store = k.broker.store();
    let topics = r
        .topics
        .into_iter()
        .map(|t| {
            let name = t.topic.0.to_string();
            let info = k.broker.topics().get(&name);
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let out = EpochEndOffset::default()
                        .with_partition(p.partition)
                        .with_leader_epoch(-1)
                        .with_end_offset(-1);
                    let known = info.as_ref().is_some_and(|i| i.has_partition(p.partition));
                    if !known {
                        return out.with_error_code(errors::UNKNOWN_TOPIC_OR_PARTITION);
                    }
                    // The client's view of the current epoch: newer than ours
                    // is unknown here (-1: not checked). None is older than
                    // epoch 0, so FENCED_LEADER_EPOCH cannot arise yet; it
                    // will with leader changes (replicated broker sets).
                    if p.current_leader_epoch > EPOCH {
                        return out.with_error_code(errors::UNKNOWN_LEADER_EPOCH);
                    }
                    let q = p.partition as u32;
                    match p.leader_epoch {
                        EPOCH => out
                            .with_leader_epoch(EPOCH)
                            .with_end_offset(store.max_offset(&name, q) as i64),
                        e if e > EPOCH || e == -1 => out,
                        e => out.with_leader_epoch(e).with_end_offset(0),
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
