//! Several broker sets: a Kafka transaction whose partitions (or whose
//! consumer group's offsets) live on other sets than its coordinator's.
//! The coordinator reaches those sets' masters over their RocketMQ broker
//! listener with two Rokka codes, as Kafka's coordinator reaches partition
//! leaders with WriteTxnMarkers:
//!
//! * `ROKKA_TXN_JOIN` (ext `producerId`, `producerEpoch`, `coordinator`;
//!   body: JSON `[[topic, queue], ..]`): the master takes the producer's
//!   transactional batches for those queues until the transaction ends.
//!   A refusal carries the Kafka error code in ext `kafkaError`.
//! * `ROKKA_TXN_END` (ext `producerId`, `producerEpoch`, `commit`): the
//!   master writes the markers and applies or drops the offsets its group
//!   coordinator held for the transaction; SUCCESS once they are durable.
//!
//! Only a master in cluster mode answers either, and only to a peer at the
//! address of one of the cluster's nodes (until the ACL table of the
//! security issue gates cluster actions); the body is bounded by the frame
//! cap and the parts by `broker.max_transactional_ids` (a budget of their
//! own).

use rokka_broker::remote::{RemoteCall, RemoteTxns};
use rokka_broker::Broker;

use crate::codes::{request as rq, response as rs};
use crate::command::RemotingCommand;
use crate::remote_offsets::RemotingOffsets;

/// Ext field of a refusal: the Kafka error code the coordinator relays.
pub const EXT_KAFKA_ERROR: &str = "kafkaError";

impl RemoteTxns for RemotingOffsets {
    fn join<'a>(
        &'a self,
        set: &'a str,
        coordinator: &'a str,
        producer_id: i64,
        epoch: i16,
        partitions: &'a [(String, u32)],
    ) -> RemoteCall<'a, Result<(), i16>> {
        Box::pin(async move {
            let mut cmd = self.command(rq::ROKKA_TXN_JOIN);
            cmd.ext_fields.set("producerId", producer_id.to_string());
            cmd.ext_fields.set("producerEpoch", epoch.to_string());
            cmd.ext_fields.set("coordinator", coordinator);
            cmd.body = serde_json::to_vec(partitions).map_err(|e| e.to_string())?.into();
            let r = self.call(set, cmd).await?;
            if r.code == rs::SUCCESS {
                return Ok(Ok(()));
            }
            match r.ext_fields.get(EXT_KAFKA_ERROR).and_then(|c| c.parse::<i16>().ok()) {
                Some(c) => Ok(Err(c)),
                None => Err(format!(
                    "{set}: ROKKA_TXN_JOIN answered {} {}",
                    r.code,
                    r.remark.unwrap_or_default()
                )),
            }
        })
    }

    fn end<'a>(&'a self, set: &'a str, producer_id: i64, epoch: i16, commit: bool) -> RemoteCall<'a, ()> {
        Box::pin(async move {
            let mut cmd = self.command(rq::ROKKA_TXN_END);
            cmd.ext_fields.set("producerId", producer_id.to_string());
            cmd.ext_fields.set("producerEpoch", epoch.to_string());
            cmd.ext_fields.set("commit", if commit { "true" } else { "false" });
            let r = self.call(set, cmd).await?;
            if r.code == rs::SUCCESS {
                Ok(())
            } else {
                Err(format!(
                    "{set}: ROKKA_TXN_END answered {} {}",
                    r.code,
                    r.remark.unwrap_or_default()
                ))
            }
        })
    }
}

/// Why a participant refused: the remoting code, a remark, and the Kafka
/// error code when there is one to relay.
pub struct Refused {
    pub code: i32,
    pub remark: String,
    pub kafka: Option<i16>,
}

fn refused(code: i32, remark: impl Into<String>) -> Refused {
    Refused {
        code,
        remark: remark.into(),
        kafka: None,
    }
}

/// The producer id and epoch a request names.
fn producer(cmd: &RemotingCommand) -> Result<(i64, i16), Refused> {
    let pid = cmd.ext_fields.get("producerId").and_then(|v| v.parse::<i64>().ok());
    let epoch = cmd.ext_fields.get("producerEpoch").and_then(|v| v.parse::<i16>().ok());
    match (pid, epoch) {
        (Some(p), Some(e)) if p >= 0 && e >= 0 => Ok((p, e)),
        _ => Err(refused(rs::SYSTEM_ERROR, "producerId and producerEpoch are required")),
    }
}

/// Only a cluster-mode master takes part in another set's transaction,
/// only for a call signed with the cluster's secret (whether or not
/// authorization is on: an address alone — any process on a node's host,
/// traffic translated to a node's address — could commit or abort any
/// producer's part), and only from one of the cluster's nodes' addresses.
async fn master(broker: &Broker, cmd: &RemotingCommand, peer: std::net::SocketAddr) -> Result<(), Refused> {
    let Some(v) = broker.cluster_view() else {
        return Err(refused(rs::REQUEST_CODE_NOT_SUPPORTED, "not in cluster mode"));
    };
    if let Err(why) = crate::auth::verify_cluster_call(broker, cmd) {
        metrics::counter!("rokka_cluster_remote_txn_refused_total").increment(1);
        tracing::debug!(%peer, why, "an unsigned transaction call refused");
        return Err(refused(
            rs::NO_PERMISSION,
            format!("a transaction call must be the cluster's own: {why}"),
        ));
    }
    if !v.is_master() || !broker.store().is_leader() {
        return Err(refused(rs::SYSTEM_ERROR, "not the master of its broker set"));
    }
    for n in &v.nodes {
        for addr in [&n.broker, &n.kafka, &n.replication] {
            if addr.is_empty() {
                continue;
            }
            let known = match addr.parse::<std::net::SocketAddr>() {
                Ok(a) => a.ip() == peer.ip(),
                Err(_) => tokio::net::lookup_host(addr.as_str())
                    .await
                    .is_ok_and(|mut found| found.any(|a| a.ip() == peer.ip())),
            };
            if known {
                return Ok(());
            }
        }
    }
    metrics::counter!("rokka_cluster_remote_txn_refused_total").increment(1);
    tracing::debug!(%peer, "a transaction call from outside the cluster refused");
    Err(refused(rs::SYSTEM_ERROR, "not a node of this cluster"))
}

/// ROKKA_TXN_JOIN, participant side: answered once the part is on the
/// set's replicas.
pub async fn join(broker: &Broker, cmd: &RemotingCommand, peer: std::net::SocketAddr) -> Result<(), Refused> {
    master(broker, cmd, peer).await?;
    let (pid, epoch) = producer(cmd)?;
    let coordinator = cmd.ext_fields.get("coordinator").unwrap_or_default();
    if coordinator.is_empty() {
        return Err(refused(rs::SYSTEM_ERROR, "coordinator is required"));
    }
    let partitions: Vec<(String, u32)> =
        serde_json::from_slice(&cmd.body).map_err(|e| refused(rs::SYSTEM_ERROR, format!("partitions: {e}")))?;
    broker
        .txn_participate(coordinator, pid, epoch, &partitions)
        .await
        .map_err(|c| Refused {
            code: rs::SYSTEM_ERROR,
            remark: format!("refused with Kafka error {c}"),
            kafka: Some(c),
        })
}

/// ROKKA_TXN_END, participant side.
pub async fn end(broker: &Broker, cmd: &RemotingCommand, peer: std::net::SocketAddr) -> Result<(), Refused> {
    master(broker, cmd, peer).await?;
    let (pid, epoch) = producer(cmd)?;
    let commit = match cmd.ext_fields.get("commit") {
        Some("true") => true,
        Some("false") => false,
        _ => return Err(refused(rs::SYSTEM_ERROR, "commit must be true or false")),
    };
    broker
        .txn_participant_end(pid, epoch, commit)
        .await
        .map_err(|e| refused(rs::SYSTEM_ERROR, e.to_string()))
}
