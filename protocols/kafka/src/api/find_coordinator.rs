//! FindCoordinator: this broker coordinates every group (single node);
//! in cluster mode the master of the broker set the group's name hashes to
//! does (the one set's master when there is one).

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};
use kafka_protocol::protocol::StrBytes;

use super::str_bytes;
use crate::Kafka;

/// Every key of the request answered with `err` (v4+: one per key; before,
/// the request's one).
fn refused(r: FindCoordinatorRequest, version: i16, err: i16, message: Option<StrBytes>) -> FindCoordinatorResponse {
    if version >= 4 {
        let coordinators = r
            .coordinator_keys
            .into_iter()
            .map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_error_code(err)
                    .with_error_message(message.clone())
                    .with_node_id(BrokerId(-1))
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    FindCoordinatorResponse::default()
        .with_error_code(err)
        .with_error_message(message)
        .with_node_id(BrokerId(-1))
}

pub fn handle(k: &Kafka, r: FindCoordinatorRequest, version: i16, at: &crate::Endpoint) -> FindCoordinatorResponse {
    // Groups (0) and transactional ids (1) have coordinators; any other
    // key type is INVALID_REQUEST, as Kafka's.
    if !matches!(r.key_type, 0 | 1) {
        let message = Some(str_bytes(&format!("unknown coordinator key type {}", r.key_type)));
        return refused(r, version, crate::errors::INVALID_REQUEST, message);
    }
    let mut host = str_bytes(&at.host);
    let mut node = BrokerId(k.config.node_id);
    let mut port = at.port;
    // Cluster mode: the set's master coordinates its groups; none elected
    // yet is COORDINATOR_NOT_AVAILABLE, which clients retry.
    // Several broker sets: the master of the set the first key hashes to
    // (a batched v4+ request is answered per key below).
    if let Some(v) = k.broker.cluster_view() {
        if version >= 4 && v.sets.len() > 1 {
            let coordinators = r
                .coordinator_keys
                .into_iter()
                .map(|key| match located(&v, key.as_str(), at) {
                    Some((id, h, p)) => Coordinator::default()
                        .with_key(key)
                        .with_node_id(BrokerId(id as i32))
                        .with_host(str_bytes(&h))
                        .with_port(p),
                    None => Coordinator::default()
                        .with_key(key)
                        .with_error_code(crate::errors::COORDINATOR_NOT_AVAILABLE)
                        .with_node_id(BrokerId(-1)),
                })
                .collect();
            return FindCoordinatorResponse::default().with_coordinators(coordinators);
        }
        match located(&v, r.key.as_str(), at) {
            Some((id, h, p)) => {
                node = BrokerId(id as i32);
                host = str_bytes(&h);
                port = p;
            }
            None => return refused(r, version, crate::errors::COORDINATOR_NOT_AVAILABLE, None),
        }
    }
    if version >= 4 {
        let coordinators = r
            .coordinator_keys
            .into_iter()
            .map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(node)
                    .with_host(host.clone())
                    .with_port(port)
            })
            .collect();
        FindCoordinatorResponse::default().with_coordinators(coordinators)
    } else {
        FindCoordinatorResponse::default()
            .with_node_id(node)
            .with_host(host)
            .with_port(port)
    }
}

/// The Kafka address of the master coordinating `key`: its broker set's
/// (by hash with several sets, the one set's otherwise).
fn located(v: &rokka_broker::cluster_view::ClusterView, key: &str, at: &crate::Endpoint) -> Option<(u32, String, i32)> {
    let master = match v.coordinator_set(key) {
        Some(s) => s.master,
        None => v.master,
    };
    let n = master.and_then(|m| v.node(m))?;
    let (h, p) = n.kafka_at(at.ssl, at.sasl).rsplit_once(':')?;
    Some((n.id, h.to_string(), p.parse::<i32>().ok()?))
}
