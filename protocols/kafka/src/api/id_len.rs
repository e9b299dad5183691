//! Group ids, member, instance and rack ids, and transactional ids a client names are kept — a group's
//! record, each committed offset's key, a transaction's state — so their
//! length is bounded (`kafka.max_id_bytes`; Kafka allows any string its
//! wire format carries, 32767 bytes). A request that would make the broker
//! keep a longer one is answered with the error Kafka answers for a bad id
//! (INVALID_GROUP_ID; for a transactional id INVALID_REQUEST), counted in
//! `rokka_kafka_ids_refused_total`. Requests that only read (OffsetFetch,
//! DescribeGroups, ...) keep nothing and are answered as for an unknown id.
//! The broker's own groups (`%SCHEDULE%`, `CID_RMQ_SYS_*`: their offsets
//! are its delay-level and transaction-check progress) are refused alike,
//! and DeleteGroups / OffsetDelete refuse them too.

use kafka_protocol::messages::*;

use crate::errors;
use crate::Kafka;

fn too_long(k: &Kafka, id: &str) -> bool {
    k.config.max_id_bytes > 0 && id.len() > k.config.max_id_bytes as usize
}

/// A group id no client may keep state under: too long, or one of the
/// broker's own groups (`%SCHEDULE%`, `CID_RMQ_SYS_*`), whose offsets are
/// its delay-level and transaction-check progress — a Kafka consumer
/// joining or committing as one would move it, whatever the ACLs.
fn bad_group(k: &Kafka, id: &str) -> bool {
    too_long(k, id) || rokka_broker::is_system_group(id)
}

fn refused(kind: &'static str) {
    metrics::counter!("rokka_kafka_ids_refused_total", "id" => kind).increment(1);
}

/// The answer to `req` when it names a group or transactional id longer
/// than `kafka.max_id_bytes` that it would make the broker keep; None to
/// handle it.
pub fn check(k: &Kafka, req: &RequestKind) -> Option<ResponseKind> {
    let g = errors::INVALID_GROUP_ID;
    let resp = match req {
        RequestKind::JoinGroup(r) if bad_group(k, &r.group_id) => {
            ResponseKind::JoinGroup(JoinGroupResponse::default().with_error_code(g).with_generation_id(-1))
        }
        // A member's ids are kept with it (its instance id, and a KIP-848
        // member's own id and rack): bounded as the group's.
        RequestKind::JoinGroup(r)
            if too_long(k, &r.member_id) || r.group_instance_id.as_ref().is_some_and(|i| too_long(k, i)) =>
        {
            ResponseKind::JoinGroup(
                JoinGroupResponse::default()
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_generation_id(-1),
            )
        }
        RequestKind::ConsumerGroupHeartbeat(r) if bad_group(k, &r.group_id) => ResponseKind::ConsumerGroupHeartbeat(
            ConsumerGroupHeartbeatResponse::default()
                .with_error_code(g)
                .with_error_message(Some(crate::api::str_bytes(
                    "the group id is longer than kafka.max_id_bytes or is one of the broker's own",
                ))),
        ),
        RequestKind::ConsumerGroupHeartbeat(r)
            if too_long(k, &r.member_id)
                || r.instance_id.as_ref().is_some_and(|i| too_long(k, i))
                || r.rack_id.as_ref().is_some_and(|i| too_long(k, i)) =>
        {
            ResponseKind::ConsumerGroupHeartbeat(
                ConsumerGroupHeartbeatResponse::default()
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_error_message(Some(crate::api::str_bytes(
                        "a member, instance or rack id is longer than kafka.max_id_bytes",
                    ))),
            )
        }
        RequestKind::OffsetCommit(r) if bad_group(k, &r.group_id) => {
            ResponseKind::OffsetCommit(super::not_coordinator::offset_commit_refused(r, g))
        }
        RequestKind::TxnOffsetCommit(r) if bad_group(k, &r.group_id) || too_long(k, &r.transactional_id) => {
            let code = if bad_group(k, &r.group_id) {
                g
            } else {
                errors::INVALID_REQUEST
            };
            ResponseKind::TxnOffsetCommit(super::not_coordinator::txn_offset_commit_refused(r, code))
        }
        RequestKind::AddOffsetsToTxn(r) if bad_group(k, &r.group_id) || too_long(k, &r.transactional_id) => {
            let code = if bad_group(k, &r.group_id) {
                g
            } else {
                errors::INVALID_REQUEST
            };
            ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default().with_error_code(code))
        }
        RequestKind::InitProducerId(r) if r.transactional_id.as_ref().is_some_and(|t| too_long(k, t)) => {
            ResponseKind::InitProducerId(
                InitProducerIdResponse::default()
                    .with_error_code(errors::INVALID_REQUEST)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            )
        }
        _ => return None,
    };
    refused(match &resp {
        ResponseKind::InitProducerId(_) => "transactional_id",
        ResponseKind::JoinGroup(j) if j.error_code == errors::INVALID_REQUEST => "member_id",
        ResponseKind::ConsumerGroupHeartbeat(h) if h.error_code == errors::INVALID_REQUEST => "member_id",
        _ => "group_id",
    });
    Some(resp)
}
