//! OffsetForLeaderEpoch: the end offset of a leader epoch, which consumers
//! use to check their position after a leader change or a restart with a
//! committed leader epoch (KIP-320). On a single node a partition has had
//! one leader epoch, 0, for its whole life (Metadata reports it), so epoch
//! 0 ends at the log end offset, a later one is undefined and an earlier
//! one ends where epoch 0 began — as Kafka's leader-epoch cache answers.
//! In cluster mode the epochs are the broker set's: epoch e of a partition
//! ends at its first offset written at or after the CommitLog position
//! where the next epoch began (the set's epoch history).

use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::{OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse};

use crate::errors;
use crate::Kafka;

/// The only leader epoch a partition has had.
const EPOCH: i32 = 0;

pub fn handle(k: &Kafka, r: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse {
    let store = k.broker.store();
    let epoch = errors::leader_epoch(k);
    let cluster = k.broker.cluster_view().is_some();
    let leads = k.broker.leads_here();
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
                    let q = match super::queue_of(k, info.as_ref(), p.partition) {
                        Ok(q) => q,
                        Err(code) => return out.with_error_code(code),
                    };
                    if let Some(code) = errors::check_leader_epoch(epoch, p.current_leader_epoch) {
                        return out.with_error_code(code);
                    }
                    // The leader answers (Kafka's lastOffsetForLeaderEpoch
                    // with fetchOnlyFromLeader).
                    if !leads {
                        return out.with_error_code(errors::NOT_LEADER_OR_FOLLOWER);
                    }
                    if cluster {
                        let r = cluster_epoch_end(k, &name, q, p.leader_epoch, out);
                        tracing::debug!(
                            topic = name,
                            partition = p.partition,
                            asked = p.leader_epoch,
                            epoch = r.leader_epoch,
                            end = r.end_offset,
                            "leader epoch end"
                        );
                        return r;
                    }
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

/// Cluster mode: the end offset of `epoch` in (topic, queue) from the set's
/// epoch history: the current epoch ends at the log end; an older one at the
/// first offset written at or after the next epoch's start; one newer than
/// the current is undefined (-1); one older than the history ends where the
/// history's first epoch began.
fn cluster_epoch_end(k: &Kafka, topic: &str, q: u32, epoch: i32, out: EpochEndOffset) -> EpochEndOffset {
    let store = k.broker.store();
    let current = errors::leader_epoch(k);
    let end = store.max_offset(topic, q) as i64;
    if epoch < 0 || epoch > current {
        return out;
    }
    if epoch == current {
        return out.with_leader_epoch(current).with_end_offset(end);
    }
    let history = store.epochs();
    // The newest epoch of the history at or below the one asked for.
    // Older than the history (written before this set's first election,
    // e.g. before cluster mode): it ends where the first epoch began, as
    // Kafka answers an epoch older than its leader-epoch cache.
    let Some(i) = history.iter().rposition(|e| e.epoch as i32 <= epoch) else {
        let first = history.first().map_or(0, |h| h.start);
        let offset = store.queue(topic, q).map_or(0, |cq| cq.offset_at_phys(first));
        return out.with_leader_epoch(epoch).with_end_offset(offset as i64);
    };
    let Some(next) = history.get(i + 1) else {
        return out.with_leader_epoch(history[i].epoch as i32).with_end_offset(end);
    };
    let offset = store.queue(topic, q).map_or(0, |cq| cq.offset_at_phys(next.start));
    out.with_leader_epoch(history[i].epoch as i32)
        .with_end_offset(offset as i64)
}
