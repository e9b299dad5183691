//! InitProducerId: a fresh producer id for an idempotent producer (or the
//! same id with a bumped epoch when it re-inits after a sequence error,
//! KIP-360); for a transactional id, the transaction coordinator's producer
//! id and next epoch, fencing earlier incarnations (`rokka_broker::kafka_txn`).

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use crate::Kafka;

pub async fn handle(k: &Kafka, r: InitProducerIdRequest) -> InitProducerIdResponse {
    if let Some(id) = r.transactional_id.as_ref() {
        // Null is an idempotent producer; an empty id is no id (Kafka's
        // coordinator answers it INVALID_REQUEST).
        if id.is_empty() {
            return InitProducerIdResponse::default()
                .with_error_code(crate::errors::INVALID_REQUEST)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
        }
        let expected = (r.producer_id.0 >= 0).then_some((r.producer_id.0, r.producer_epoch));
        return match k
            .broker
            .txn_init_producer_id(id.as_str(), r.transaction_timeout_ms, expected)
            .await
        {
            Ok(init) => InitProducerIdResponse::default()
                .with_producer_id(ProducerId(init.producer_id))
                .with_producer_epoch(init.epoch),
            Err(code) => InitProducerIdResponse::default()
                .with_error_code(code)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        };
    }
    // An idempotent producer bumping its epoch (KIP-360) keeps its id; at
    // the last epoch it gets a new id from epoch 0, as Kafka's (the same
    // id at epoch 0 would be fenced by its own earlier batches).
    let bumped = r.producer_epoch.checked_add(1).filter(|e| *e < i16::MAX);
    let (id, epoch) = match bumped {
        Some(e) if r.producer_id.0 >= 0 && r.producer_epoch >= 0 => (r.producer_id.0, e),
        _ => (k.broker.producers().allocate_id(), 0),
    };
    InitProducerIdResponse::default()
        .with_producer_id(ProducerId(id))
        .with_producer_epoch(epoch)
}
