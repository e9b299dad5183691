//! InitProducerId for idempotent producers (no transactions): a fresh
//! producer id, or the same id with a bumped epoch when a producer re-inits
//! after a sequence error (KIP-360).

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use crate::errors;
use crate::Kafka;

pub fn handle(k: &Kafka, r: InitProducerIdRequest) -> InitProducerIdResponse {
    if r.transactional_id.is_some() {
        // Transactions are not implemented (and not advertised as such).
        return InitProducerIdResponse::default()
            .with_error_code(errors::INVALID_REQUEST)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    let (id, epoch) = if r.producer_id.0 >= 0 && r.producer_epoch >= 0 {
        (r.producer_id.0, r.producer_epoch.checked_add(1).unwrap_or(0))
    } else {
        (k.broker.producers().allocate_id(), 0)
    };
    InitProducerIdResponse::default()
        .with_producer_id(ProducerId(id))
        .with_producer_epoch(epoch)
}
