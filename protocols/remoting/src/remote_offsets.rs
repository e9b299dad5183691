//! Several broker sets: a Kafka group coordinator reads and writes the
//! committed offsets of another set's queues on that set's master, over
//! its RocketMQ broker listener with the codes a RocketMQ consumer uses —
//! so one group has one offset table across sets and protocols. Kafka's
//! commit metadata and leader epoch travel in extra ext fields
//! (`rokkaMetadata`, `rokkaLeaderEpoch`), which RocketMQ peers ignore.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rokka_broker::remote::{RemoteCall, RemoteOffset, RemoteOffsets};
use rokka_broker::Broker;

use crate::codes::{request as rq, response as rs};
use crate::command::RemotingCommand;
use crate::registrar::NsConn;

/// Ext field carrying a forwarded Kafka commit's metadata.
pub const EXT_METADATA: &str = "rokkaMetadata";
/// Ext field carrying a forwarded Kafka commit's leader epoch.
pub const EXT_LEADER_EPOCH: &str = "rokkaLeaderEpoch";

pub struct RemotingOffsets {
    broker: Arc<Broker>,
    /// One kept connection per master address (bounded by the cluster's
    /// nodes: addresses come from their etcd registrations).
    conns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<NsConn>>>>,
    opaque: AtomicI32,
    timeout: Duration,
}

impl std::fmt::Debug for RemotingOffsets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotingOffsets")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RemotingOffsets {
    pub fn new(broker: Arc<Broker>, timeout: Duration) -> RemotingOffsets {
        RemotingOffsets {
            broker,
            conns: Mutex::new(HashMap::new()),
            opaque: AtomicI32::new(1),
            timeout,
        }
    }

    /// The broker listener of `set`'s master, as the cluster view has it.
    fn master_addr(&self, set: &str) -> Result<String, String> {
        let view = self.broker.cluster_view().ok_or("not in cluster mode")?;
        let s = view.set_named(set).ok_or_else(|| format!("unknown broker set {set}"))?;
        let m = s.master.ok_or_else(|| format!("broker set {set} has no master"))?;
        view.node(m)
            .map(|n| n.broker.clone())
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("master {m} of {set} has no broker address"))
    }

    async fn call(&self, set: &str, cmd: RemotingCommand) -> Result<RemotingCommand, String> {
        let addr = self.master_addr(set)?;
        let conn = {
            let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            // Addresses of nodes gone from the view are dropped.
            if let Some(view) = self.broker.cluster_view() {
                conns.retain(|a, _| view.nodes.iter().any(|n| &n.broker == a));
            }
            Arc::clone(
                conns
                    .entry(addr.clone())
                    .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(NsConn::new(&addr)))),
            )
        };
        let mut c = conn.lock().await;
        c.call(cmd, self.timeout).await
    }

    fn request(&self, code: i32, group: &str, topic: &str, queue: u32) -> RemotingCommand {
        let opaque = self.opaque.fetch_add(1, Ordering::Relaxed) & i32::MAX;
        let mut cmd = RemotingCommand::request(code, opaque);
        cmd.ext_fields.set("consumerGroup", group);
        cmd.ext_fields.set("topic", topic);
        cmd.ext_fields.set("queueId", queue.to_string());
        cmd
    }
}

impl RemoteOffsets for RemotingOffsets {
    fn commit<'a>(
        &'a self,
        set: &'a str,
        group: &'a str,
        topic: &'a str,
        queue: u32,
        committed: RemoteOffset,
    ) -> RemoteCall<'a, ()> {
        Box::pin(async move {
            let mut cmd = self.request(rq::UPDATE_CONSUMER_OFFSET, group, topic, queue);
            cmd.ext_fields.set("commitOffset", committed.offset.to_string());
            if !committed.metadata.is_empty() {
                cmd.ext_fields.set(EXT_METADATA, committed.metadata);
            }
            cmd.ext_fields.set(EXT_LEADER_EPOCH, committed.leader_epoch.to_string());
            let r = self.call(set, cmd).await?;
            if r.code == rs::SUCCESS {
                Ok(())
            } else {
                Err(format!(
                    "{set}: UPDATE_CONSUMER_OFFSET answered {} {}",
                    r.code,
                    r.remark.unwrap_or_default()
                ))
            }
        })
    }

    fn fetch<'a>(
        &'a self,
        set: &'a str,
        group: &'a str,
        topic: &'a str,
        queue: u32,
    ) -> RemoteCall<'a, Option<RemoteOffset>> {
        Box::pin(async move {
            let mut cmd = self.request(rq::QUERY_CONSUMER_OFFSET, group, topic, queue);
            // Kafka's answer for nothing committed is "none", not 0.
            cmd.ext_fields.set("setZeroIfNotFound", "false");
            let r = self.call(set, cmd).await?;
            match r.code {
                rs::SUCCESS => {
                    let offset = r
                        .ext_fields
                        .get("offset")
                        .and_then(|o| o.parse::<u64>().ok())
                        .ok_or_else(|| format!("{set}: QUERY_CONSUMER_OFFSET without an offset"))?;
                    Ok(Some(RemoteOffset {
                        offset,
                        metadata: r.ext_fields.get(EXT_METADATA).unwrap_or_default().to_string(),
                        leader_epoch: r
                            .ext_fields
                            .get(EXT_LEADER_EPOCH)
                            .and_then(|e| e.parse().ok())
                            .unwrap_or(-1),
                    }))
                }
                rs::QUERY_NOT_FOUND => Ok(None),
                code => Err(format!(
                    "{set}: QUERY_CONSUMER_OFFSET answered {code} {}",
                    r.remark.unwrap_or_default()
                )),
            }
        })
    }
}
