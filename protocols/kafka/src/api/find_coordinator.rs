//! FindCoordinator: this broker coordinates every group (single node).

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, FindCoordinatorRequest, FindCoordinatorResponse};

use super::str_bytes;
use crate::Kafka;

pub fn handle(k: &Kafka, r: FindCoordinatorRequest, version: i16) -> FindCoordinatorResponse {
    let host = str_bytes(&k.advertised_host);
    let node = BrokerId(k.config.node_id);
    if version >= 4 {
        let coordinators = r
            .coordinator_keys
            .into_iter()
            .map(|key| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(node)
                    .with_host(host.clone())
                    .with_port(k.advertised_port)
            })
            .collect();
        FindCoordinatorResponse::default().with_coordinators(coordinators)
    } else {
        FindCoordinatorResponse::default()
            .with_node_id(node)
            .with_host(host)
            .with_port(k.advertised_port)
    }
}
