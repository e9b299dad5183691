//! FindCoordinator: this broker coordinates every group (single node);
//! in cluster mode its set's master does.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};

use super::str_bytes;
use crate::Kafka;

pub fn handle(k: &Kafka, r: FindCoordinatorRequest, version: i16) -> FindCoordinatorResponse {
    let mut host = str_bytes(&k.advertised_host);
    let mut node = BrokerId(k.config.node_id);
    let mut port = k.advertised_port;
    // Cluster mode: the set's master coordinates its groups; none elected
    // yet is COORDINATOR_NOT_AVAILABLE, which clients retry.
    if let Some(v) = k.broker.cluster_view() {
        match v.master.and_then(|m| v.node(m)).and_then(|n| {
            let (h, p) = n.kafka.rsplit_once(':')?;
            Some((n.id, h.to_string(), p.parse::<i32>().ok()?))
        }) {
            Some((id, h, p)) => {
                node = BrokerId(id as i32);
                host = str_bytes(&h);
                port = p;
            }
            None => {
                let err = crate::errors::COORDINATOR_NOT_AVAILABLE;
                if version >= 4 {
                    let coordinators = r
                        .coordinator_keys
                        .into_iter()
                        .map(|key| {
                            Coordinator::default()
                                .with_key(key)
                                .with_error_code(err)
                                .with_node_id(BrokerId(-1))
                        })
                        .collect();
                    return FindCoordinatorResponse::default().with_coordinators(coordinators);
                }
                return FindCoordinatorResponse::default()
                    .with_error_code(err)
                    .with_node_id(BrokerId(-1));
            }
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
