//! Request processing for the broker port: the dispatch (`handle`) here,
//! one module per request family beside it (consumers, send, pull,
//! offsets, admin, txn); the only place errors become RocketMQ response
//! codes.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use rokka_broker::Broker;
use rokka_store::record::properties;
use rokka_store::{msgid, Entry, MessageInput, ReadStatus};
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::clients::{Client, Clients, Subscription};
use crate::codes::{request as rq, response as rs};
use crate::command::{RemotingCommand, FLAG_ONEWAY};
use crate::config::RocketMqConfig;
use crate::namesrv::{Registration, TopicConf};
use crate::server::{Conn, Service};

mod admin;
mod consumers;
mod offsets;
mod pull;
mod send;
mod txn;

pub use consumers::{parse_heartbeat, Heartbeat, HeartbeatConsumer};
pub use offsets::{parse_lock_batch, LockBatch};
pub use send::split_batch;

/// (group, topic, queue id) → (holding client id, last granted at ms).
// Ordered by group first: whether a group holds any lock is a range.
type QueueLocks = std::collections::BTreeMap<(String, String, i64), (String, u64)>;

/// (group, topic, queue id) → (the offset it was reset to, held until ms):
/// commits from clients still at the old position are ignored meanwhile.
type ResetHolds = std::collections::HashMap<(String, String, u32), (u64, u64)>;

/// The RocketMQ broker: state shared by its connections.
#[derive(Debug)]
pub struct RocketMq {
    broker: Arc<Broker>,
    config: RocketMqConfig,
    advertised: String,
    /// The address the broker listener is bound to.
    bound: SocketAddr,
    /// The host in message ids and converted messages.
    store_host: SocketAddr,
    clients: Mutex<Clients>,
    /// Orderly-consumption queue locks: (group, topic, queue) → (client id, taken at ms).
    locks: Mutex<QueueLocks>,
    resets: Mutex<ResetHolds>,
    /// `resets.len()`, so that a pull or commit — asked on every one —
    /// takes no lock while no reset is held.
    resets_held: std::sync::atomic::AtomicUsize,
    /// When expired holds were last dropped (ms on `epoch`): at most once
    /// a second, so a hold whose queue is never pulled again does not keep
    /// every pull and commit on the locked path.
    resets_pruned_at: std::sync::atomic::AtomicU64,
    /// Rotates which live producer of a group a transaction check goes to.
    check_turn: std::sync::atomic::AtomicUsize,
    epoch: Instant,
    limits: crate::server::Limits,
}

fn ext<'a>(cmd: &'a RemotingCommand, long: &str, short: &str) -> Option<&'a str> {
    cmd.ext_fields.get(long).or_else(|| cmd.ext_fields.get(short))
}

fn ext_i64(cmd: &RemotingCommand, long: &str, short: &str) -> Option<i64> {
    ext(cmd, long, short).and_then(|v| v.trim().parse().ok())
}

fn ext_bool(cmd: &RemotingCommand, long: &str, short: &str) -> bool {
    matches!(ext(cmd, long, short), Some("true") | Some("1"))
}

pub use rokka_broker::convert::tag_codes;

impl RocketMq {
    pub fn new(broker: Arc<Broker>, config: RocketMqConfig, broker_bound: SocketAddr) -> RocketMq {
        let advertised = if config.advertised_addr.is_empty() {
            broker_bound.to_string()
        } else {
            config.advertised_addr.clone()
        };
        let store_host = advertised.parse().unwrap_or(broker.store().config().store_host);
        RocketMq {
            limits: crate::server::Limits::new("rocketmq_broker", &config),
            broker,
            config,
            advertised,
            bound: broker_bound,
            store_host,
            clients: Mutex::new(Clients::default()),
            locks: Mutex::new(Default::default()),
            resets: Mutex::new(Default::default()),
            resets_held: Default::default(),
            resets_pruned_at: Default::default(),
            check_turn: std::sync::atomic::AtomicUsize::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    pub fn config(&self) -> &RocketMqConfig {
        &self.config
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, Clients> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reply(&self, req: &RemotingCommand, code: i32, remark: Option<String>) -> RemotingCommand {
        let mut r = req.response(code, self.config.server_version);
        r.remark = remark;
        r
    }

    /// Changes of the topic table so far (a new registration is due when it moves).
    pub fn topic_version(&self) -> u64 {
        let v = self.broker.topics().version();
        // Cluster mode: a role or epoch change is a new registration too.
        match self.broker.cluster_view() {
            Some(c) => v
                .wrapping_add(u64::from(c.epoch) << 40)
                .wrapping_add(u64::from(c.is_master()) << 39),
            None => v,
        }
    }

    /// Name servers to register with: the configured ones, and in cluster
    /// mode every live node's.
    pub fn namesrv_targets(&self) -> Vec<String> {
        let mut out = crate::registrar::namesrv_addrs(&self.config.namesrv_addr);
        if let Some(c) = self.broker.cluster_view() {
            for n in &c.nodes {
                if !n.namesrv.is_empty() && !out.contains(&n.namesrv) {
                    out.push(n.namesrv.clone());
                }
            }
        }
        out
    }

    /// This broker's REGISTER_BROKER content: every topic, plus the TBW102
    /// auto-create template when auto-creation is on.
    pub fn registration(&self) -> Registration {
        let version = self.topic_version();
        let mut topics: Vec<TopicConf> = self
            .broker
            .topics()
            .all()
            .into_iter()
            // Several broker sets: a topic with no queue on this set is
            // routed to the sets that hold it.
            .filter(|(_, t)| t.partitions > 0)
            .map(|(name, t)| {
                let (read_queues, write_queues, perm) = t.rocketmq_queues();
                TopicConf {
                    name,
                    read_queues,
                    write_queues,
                    perm,
                    sys_flag: 0,
                }
            })
            .collect();
        if self.broker.config().auto_create_topics {
            topics.push(TopicConf {
                name: "TBW102".into(),
                read_queues: self.config.max_auto_create_queues,
                write_queues: self.config.max_auto_create_queues,
                perm: 7,
                sys_flag: 0,
            });
        }
        // Cluster mode: the set is the broker name; its master registers
        // as brokerId 0, each replica as its node id + 1.
        let (broker_name, broker_id, ha_addr) = match self.broker.cluster_view() {
            Some(c) => {
                let id = if c.is_master() { 0 } else { i64::from(c.self_id) + 1 };
                let ha = c.node(c.self_id).map(|n| n.replication.clone()).unwrap_or_default();
                (c.set.clone(), id, ha)
            }
            None => (self.config.broker_name.clone(), 0, String::new()),
        };
        // The broker's and the cluster's own topics, as every Apache broker
        // registers them (brokerTopicEnable, clusterTopicEnable: tools such
        // as clusterRT send to them). A registration of a single topic is
        // also refused by Apache's name server for a broker not registered
        // yet: a fresh broker listing TBW102 alone never got routes there.
        for (name, queues) in [(&broker_name, 1), (&self.config.cluster_name, 16)] {
            if !name.is_empty() && !topics.iter().any(|t| &t.name == name) {
                topics.push(TopicConf {
                    name: name.clone(),
                    read_queues: queues,
                    write_queues: queues,
                    perm: 7,
                    sys_flag: 0,
                });
            }
        }
        Registration {
            cluster: self.config.cluster_name.clone(),
            broker_name,
            broker_addr: self.advertised.clone(),
            broker_id,
            ha_addr,
            timeout_ms: Some(self.config.broker_timeout_ms),
            data_version: version,
            topics,
            full: true,
        }
    }

    /// A subscription-group change answered once etcd holds it (cluster
    /// mode: every node honours it within a tick), as a user or ACL
    /// change; at once on a single node.
    pub(super) async fn sub_groups_replicated(&self, cmd: &RemotingCommand, r: RemotingCommand) -> RemotingCommand {
        let changes = self.broker.sub_groups().changes();
        if r.code == rs::SUCCESS
            && !changes
                .replicated(changes.last_change(), rokka_broker::watermark::CLUSTER_WAIT)
                .await
        {
            return self.reply(
                cmd,
                rs::SYSTEM_ERROR,
                Some(rokka_broker::watermark::NOT_IN_CLUSTER.into()),
            );
        }
        r
    }

    /// `r` once everything appended so far is durable (sync flush); a
    /// successful answer becomes FLUSH_DISK_TIMEOUT when it is not.
    async fn durable_then(&self, mut r: RemotingCommand) -> RemotingCommand {
        if r.code == rs::SUCCESS {
            let end = self.broker.store().commitlog_offsets().1;
            if let Err(e) = self.broker.store().durable(end).await {
                r.code = durable_code(&e);
                r.remark = Some(e.to_string());
            }
        }
        r
    }

    /// Handles one request; `None` for oneway requests.
    async fn handle(&self, cmd: RemotingCommand, conn: &Conn) -> Option<RemotingCommand> {
        let started = Instant::now();
        let code = cmd.code;
        rokka_broker::hot_metrics::count("rokka_rocketmq_requests_total", "code", crate::codes::label(code), 1);
        let oneway = cmd.flag & FLAG_ONEWAY != 0;
        if let Some(remark) = crate::auth::check(&self.broker, conn, &cmd) {
            return (!oneway).then(|| self.reply(&cmd, crate::auth::NO_PERMISSION, Some(remark)));
        }
        if let Some(remark) = check_names(&cmd) {
            return (!oneway).then(|| self.reply(&cmd, rs::SYSTEM_ERROR, Some(remark)));
        }
        // A committed offset is answered whatever the view (the table does
        // not depend on the read limit); none committed yet is left
        // unanswered until the view comes: older clients take an error as
        // "none" and start from the first offset, a timeout they retry.
        if code == rq::QUERY_CONSUMER_OFFSET && self.broker.cluster_view_pending() && !self.has_committed_offset(&cmd) {
            return None;
        }
        // Cluster mode before the first view: this node's read limit is 0
        // and its role unknown, so queue ends and pulls would answer from
        // an empty view (a consumer told its offset moved would go back to
        // the queue's start). Refused, and retried by clients.
        if self.broker.cluster_view_pending()
            && matches!(
                code,
                rq::PULL_MESSAGE
                    | rq::LITE_PULL_MESSAGE
                    | rq::GET_MAX_OFFSET
                    | rq::GET_MIN_OFFSET
                    | rq::SEARCH_OFFSET_BY_TIMESTAMP
                    | rq::GET_EARLIEST_MSG_STORETIME
                    | rq::UPDATE_CONSUMER_OFFSET
                    | rq::INVOKE_BROKER_TO_RESET_OFFSET
                    | rq::GET_CONSUME_STATS
            )
        {
            return (!oneway).then(|| {
                self.reply(
                    &cmd,
                    rs::SYSTEM_BUSY,
                    Some("cluster state not known yet: try again shortly".into()),
                )
            });
        }
        let resp = match code {
            rq::HEART_BEAT => self.heartbeat(&cmd, conn),
            rq::UNREGISTER_CLIENT => self.unregister(&cmd, conn),
            rq::GET_CONSUMER_LIST_BY_GROUP => self.consumer_list(&cmd),
            rq::SEND_MESSAGE | rq::SEND_MESSAGE_V2 | rq::SEND_BATCH_MESSAGE => {
                // Inline on the connection's task: the store offloads its
                // own steps that may block (a file or segment to make), the
                // broker its topic-table writes; the hand-off on every send
                // cost ~30 % of the broker's CPU (docs/benchmarks.md).
                let (mut r, end) = self.send(&cmd, conn);
                // Sync flush: answer once the messages are on disk; on a
                // flush timeout they are stored but the client is told
                // FLUSH_DISK_TIMEOUT (its SendStatus), as RocketMQ does.
                if r.code == rs::SUCCESS && end > 0 {
                    if let Err(e) = self.broker.store().durable(end).await {
                        r.code = durable_code(&e);
                        r.remark = Some(e.to_string());
                    }
                }
                r
            }
            rq::SEND_REPLY_MESSAGE | rq::SEND_REPLY_MESSAGE_V2 => self.send_reply(&cmd, conn),
            rq::PULL_MESSAGE | rq::LITE_PULL_MESSAGE => self.pull(&cmd, conn).await,
            rq::QUERY_CONSUMER_OFFSET => self.query_offset(&cmd),
            rq::UPDATE_CONSUMER_OFFSET => {
                let mut r = self.update_offset(&cmd);
                // A Kafka commit another set's coordinator forwarded is
                // answered once this set's replicas hold it, as the
                // coordinator answers its own (RocketMQ clients' commits
                // are persisted asynchronously, as RocketMQ does).
                let forwarded = cmd.ext_fields.get(crate::remote_offsets::EXT_LEADER_EPOCH).is_some();
                if r.code == rs::SUCCESS && forwarded {
                    if let Err(e) = self.broker.offsets_durable(None).await {
                        r.code = rs::SYSTEM_ERROR;
                        r.remark = Some(e);
                    }
                }
                r
            }
            rq::GET_MAX_OFFSET
            | rq::GET_MIN_OFFSET
            | rq::SEARCH_OFFSET_BY_TIMESTAMP
            | rq::GET_EARLIEST_MSG_STORETIME => self.offset_queries(&cmd),
            rq::UPDATE_AND_CREATE_TOPIC => rokka_broker::offload(|| self.create_topic(&cmd)),
            rq::GET_ALL_TOPIC_CONFIG => self.all_topic_config(&cmd),
            // (Every group with offsets: built off the async workers.)
            rq::GET_ALL_SUBSCRIPTIONGROUP_CONFIG => rokka_broker::offload(|| self.all_subscription_groups(&cmd)),
            rq::GET_SUBSCRIPTIONGROUP_CONFIG => self.subscription_group(&cmd),
            rq::QUERY_TOPICS_BY_CONSUMER => self.topics_by_consumer(&cmd, conn),
            rq::QUERY_SUBSCRIPTION_BY_CONSUMER => self.subscription_by_consumer(&cmd),
            rq::GET_BROKER_CONFIG => self.broker_config(&cmd),
            rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP => {
                let r = self.update_subscription_group(&cmd);
                self.sub_groups_replicated(&cmd, r).await
            }
            rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST => {
                let r = self.update_subscription_group_list(&cmd);
                self.sub_groups_replicated(&cmd, r).await
            }
            rq::GET_TOPIC_CONFIG => self.topic_config(&cmd),
            rq::DELETE_TOPIC_IN_BROKER => rokka_broker::offload(|| self.delete_topic(&cmd)),
            rq::DELETE_SUBSCRIPTIONGROUP => self.delete_subscription_group(&cmd, conn).await,
            rq::GET_TOPIC_STATS_INFO => self.topic_stats(&cmd),
            rq::GET_CONSUMER_CONNECTION_LIST => self.consumer_connections(&cmd),
            rq::GET_PRODUCER_CONNECTION_LIST => self.producer_connections(&cmd),
            rq::QUERY_TOPIC_CONSUME_BY_WHO => rokka_broker::offload(|| self.consume_by_who(&cmd, conn)),
            rq::GET_BROKER_RUNTIME_INFO => self.runtime_info(&cmd),
            rq::GET_CONSUME_STATS => self.consume_stats(&cmd, conn),
            rq::INVOKE_BROKER_TO_RESET_OFFSET => self.reset_offset(&cmd).await,
            rq::LOCK_BATCH_MQ | rq::UNLOCK_BATCH_MQ => self.lock_batch(&cmd, conn),
            // What these append must be durable before the client is told
            // (sync flush): the consumer moves its offset past a sent-back
            // message, the producer forgets a resolved transaction.
            rq::CONSUMER_SEND_MSG_BACK => {
                self.durable_then(rokka_broker::offload(|| self.send_back(&cmd, conn)))
                    .await
            }
            rq::QUERY_MESSAGE => self.query_message(&cmd),
            rq::END_TRANSACTION => {
                self.durable_then(rokka_broker::offload(|| self.end_transaction(&cmd, conn)))
                    .await
            }
            rq::VIEW_MESSAGE_BY_ID => self.view_message(&cmd, conn),
            rq::AUTH_CREATE_USER
            | rq::AUTH_UPDATE_USER
            | rq::AUTH_DELETE_USER
            | rq::AUTH_GET_USER
            | rq::AUTH_LIST_USERS => {
                let (code, remark, body) = crate::users::handle(&self.broker, &cmd).await;
                let mut r = self.reply(&cmd, code, remark);
                r.body = body;
                r
            }
            rq::ROKKA_TXN_JOIN => {
                let r = crate::remote_txns::join(&self.broker, &cmd, conn.peer).await;
                self.txn_reply(&cmd, r)
            }
            rq::ROKKA_TXN_END => {
                let r = crate::remote_txns::end(&self.broker, &cmd, conn.peer).await;
                self.txn_reply(&cmd, r)
            }
            other => self.reply(
                &cmd,
                rs::REQUEST_CODE_NOT_SUPPORTED,
                Some(format!(" request type {other} not supported")),
            ),
        };
        rokka_broker::hot_metrics::record(
            "rokka_rocketmq_request_seconds",
            "code",
            crate::codes::label(code),
            started.elapsed().as_secs_f64(),
        );
        if resp.code != rs::SUCCESS {
            metrics::counter!(
                "rokka_rocketmq_errors_total",
                "code" => crate::codes::label(code),
                "response" => crate::codes::response_label(resp.code)
            )
            .increment(1);
        }
        (!oneway).then_some(resp)
    }

    /// The broker name clients know this broker by: its set's in cluster
    /// mode, `rocketmq.broker_name` otherwise.
    fn broker_name(&self) -> String {
        match self.broker.cluster_view() {
            Some(c) => c.set.clone(),
            None => self.config.broker_name.clone(),
        }
    }

    fn json_body(&self, req: &RemotingCommand, v: Value) -> RemotingCommand {
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = Bytes::from(v.to_string());
        r
    }
}

impl Service for RocketMq {
    fn process(
        &self,
        cmd: RemotingCommand,
        conn: &Conn,
    ) -> impl std::future::Future<Output = Option<RemotingCommand>> + Send {
        self.handle(cmd, conn)
    }

    fn max_frame_bytes(&self) -> usize {
        self.config.max_frame_bytes as usize
    }

    fn limits(&self) -> &crate::server::Limits {
        &self.limits
    }

    fn connection_closed(&self, conn: &Conn) {
        self.drop_connection(conn);
    }

    /// Pulls may be held by long polling, sends (and send-backs and
    /// transaction ends, which append) wait for the flush in sync mode and
    /// for the set's replicas in cluster mode, and another set's transaction
    /// calls wait for markers and replication; everything else finishes at
    /// once. What may wait runs on a task of its own, so the connection's
    /// other requests (heartbeats, pulls, further sends) are not held up
    /// behind it.
    fn inline(&self, cmd: &RemotingCommand) -> bool {
        match cmd.code {
            // User and subscription-group changes fsync their file and, in
            // cluster mode, wait for etcd: not in the connection's read loop.
            rq::PULL_MESSAGE
            | rq::LITE_PULL_MESSAGE
            | rq::ROKKA_TXN_JOIN
            | rq::ROKKA_TXN_END
            | rq::AUTH_CREATE_USER
            | rq::AUTH_UPDATE_USER
            | rq::AUTH_DELETE_USER
            | rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
            | rq::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST
            | rq::DELETE_SUBSCRIPTIONGROUP => false,
            rq::SEND_MESSAGE
            | rq::SEND_MESSAGE_V2
            | rq::SEND_BATCH_MESSAGE
            | rq::CONSUMER_SEND_MSG_BACK
            | rq::END_TRANSACTION => {
                let store = self.broker.store();
                store.config().flush_mode == rokka_store::FlushMode::Async && !store.waits_for_replicas()
            }
            _ => true,
        }
    }
}

/// The send status for a stored message that could not be made durable:
/// FLUSH_DISK_TIMEOUT (10) for the local disk, SLAVE_NOT_AVAILABLE (11)
/// when too few replicas are in sync, FLUSH_SLAVE_TIMEOUT (12) when they
/// did not acknowledge in time, as a RocketMQ SYNC_MASTER answers. A
/// master that lost its place while waiting answers SERVICE_NOT_AVAILABLE
/// instead: its write may be truncated away by the new master, and clients
/// take 10–12 as stored but retry 14 (a duplicate at worst, RocketMQ's
/// at-least-once).
fn durable_code(e: &rokka_store::StoreError) -> i32 {
    match e {
        rokka_store::StoreError::NotLeader => rs::SERVICE_NOT_AVAILABLE,
        rokka_store::StoreError::NotEnoughReplicas => rs::SLAVE_NOT_AVAILABLE,
        rokka_store::StoreError::ReplicationTimeout(_) => rs::FLUSH_SLAVE_TIMEOUT,
        _ => rs::FLUSH_DISK_TIMEOUT,
    }
}

/// Longest group or client id a request may name (RocketMQ's clients
/// check group names against 255 characters): what a request names the
/// broker may keep (offsets, locks, held resets, per-group state), often
/// once per queue, so a name is bounded before any handler sees it.
pub const MAX_NAME_BYTES: usize = 255;

/// The remark refusing a request whose group or client id is longer than
/// [`MAX_NAME_BYTES`], or whose topic is longer than a topic can be: one
/// pass over its header fields, allocating only to refuse
/// (SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE, in the V2 header, name the
/// producer group `a` and the topic `b`).
fn check_names(cmd: &RemotingCommand) -> Option<String> {
    let v2 = cmd.code == rq::SEND_MESSAGE_V2 || cmd.code == rq::SEND_BATCH_MESSAGE;
    for (key, value) in &cmd.ext_fields.0 {
        let (name, limit) = match key.as_ref() {
            k @ ("consumerGroup" | "group" | "producerGroup" | "clientID" | "clientId") => (k, MAX_NAME_BYTES),
            "a" if v2 => ("producerGroup", MAX_NAME_BYTES),
            "topic" => ("topic", rokka_store::MAX_TOPIC_LEN),
            "b" if v2 => ("topic", rokka_store::MAX_TOPIC_LEN),
            _ => continue,
        };
        if value.len() > limit {
            return Some(format!("{name} is longer than {limit} bytes"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One SEND_BATCH_MESSAGE element (§4.4) with `total` as its TOTALSIZE.
    fn element(total: i32, body: &[u8], props: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        e.extend_from_slice(&total.to_be_bytes());
        e.extend_from_slice(&[0; 8]); // magic code, body CRC
        e.extend_from_slice(&7i32.to_be_bytes()); // flag
        e.extend_from_slice(&(body.len() as i32).to_be_bytes());
        e.extend_from_slice(body);
        e.extend_from_slice(&(props.len() as i16).to_be_bytes());
        e.extend_from_slice(props);
        e
    }

    #[test]
    fn split_batch_refuses_a_negative_total_size() {
        let good = |b: &[u8], p: &[u8]| element((22 + b.len() + p.len()) as i32, b, p);
        let mut body = good(b"one", b"a\x01b\x02");
        body.extend(good(b"two", b""));
        let parts = split_batch(&body).unwrap_or_default();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            (parts[0].0, &parts[0].1[..], parts[0].2.as_str()),
            (7, &b"one"[..], "a\x01b\x02")
        );
        // Found by fuzz/ (rocketmq_frame): TOTALSIZE -1 became usize::MAX
        // and `at + total` overflowed (a panic in debug builds).
        assert_eq!(split_batch(&element(-1, b"", b"")), None);
        let mut body = good(b"one", b"");
        body.extend(element(-22, b"x", b""));
        assert_eq!(split_batch(&body), None);
    }

    #[test]
    fn heartbeat_and_lock_bodies_parse() {
        let hb = br#"{"clientID":"c1","producerDataSet":[{"groupName":"p"},{}],
            "consumerDataSet":[{"groupName":"g","messageModel":"BROADCASTING",
            "subscriptionDataSet":[{"topic":"t","subString":"A||B"},{"subString":"x"}]},
            {"groupName":"h","messageModel":1,"subscriptionDataSet":[{"topic":"u","expressionType":"SQL92"}]},
            {"messageModel":0}]}"#;
        let hb = parse_heartbeat(hb).map_err(String::from);
        assert_eq!(
            hb,
            Ok(Heartbeat {
                client_id: "c1".into(),
                producer_groups: vec!["p".into()],
                consumers: vec![
                    HeartbeatConsumer {
                        group: "g".into(),
                        clustering: false,
                        subscriptions: vec![("t".into(), "A||B".into(), "TAG".into(), 0)],
                    },
                    HeartbeatConsumer {
                        group: "h".into(),
                        clustering: true,
                        subscriptions: vec![("u".into(), "*".into(), "SQL92".into(), 0)],
                    },
                ],
            })
        );
        assert_eq!(parse_heartbeat(b"{}"), Err("heartbeat without clientID"));
        assert!(parse_heartbeat(b"{").is_err_and(|e| e.starts_with("heartbeat body is not JSON")));
        // Lists past their bounds are refused while read (a body of many
        // tiny objects is not built first).
        let many_groups = format!(
            r#"{{"clientID":"c","consumerDataSet":[{}]}}"#,
            vec!["{}"; 1002].join(",")
        );
        assert!(parse_heartbeat(many_groups.as_bytes()).is_err());
        let subs = vec![r#"{"topic":"t"}"#; 1000].join(",");
        let group = format!(r#"{{"groupName":"g","subscriptionDataSet":[{subs}]}}"#);
        let ten = format!(
            r#"{{"clientID":"c","consumerDataSet":[{}]}}"#,
            [group.as_str(); 10].join(",")
        );
        assert!(parse_heartbeat(ten.as_bytes()).is_ok_and(|h| h.consumers.len() == 10));
        let eleven = format!(
            r#"{{"clientID":"c","consumerDataSet":[{}]}}"#,
            [group.as_str(); 11].join(",")
        );
        assert!(
            parse_heartbeat(eleven.as_bytes()).is_err(),
            "10 000 subscriptions in all at most"
        );
        let lock = br#"{"consumerGroup":"g","clientId":"c","mqSet":[{"topic":"t","queueId":3},{"topic":"t"}]}"#;
        let lock = parse_lock_batch(lock).map_err(String::from);
        assert_eq!(
            lock.map(|l| (
                l.group,
                l.client,
                l.queues.into_iter().map(|(t, q, _)| (t, q)).collect::<Vec<_>>()
            )),
            Ok(("g".into(), "c".into(), vec![("t".into(), 3)]))
        );
        assert_eq!(
            parse_lock_batch(br#"{"consumerGroup":"g"}"#).map(|_| ()),
            Err("consumerGroup and clientId are required")
        );
    }
}

#[cfg(test)]
mod reset_hold_tests {
    use super::*;

    #[test]
    fn expired_holds_go_and_take_pulls_off_the_locked_path() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path().join("data"),
        ))?);
        let broker = Arc::new(Broker::new(store, rokka_broker::BrokerConfig::default())?);
        let config = RocketMqConfig {
            offset_reset_hold_ms: 50,
            ..RocketMqConfig::default()
        };
        let rmq = RocketMq::new(broker, config, "127.0.0.1:10911".parse()?);
        assert!(rmq.hold_resets("g", "t", &[(0, 5)]));
        assert_eq!(rmq.resets_held.load(std::sync::atomic::Ordering::Relaxed), 1);
        // A commit of the old position within the hold is stale.
        assert!(rmq.stale_after_reset("g", "t", 0, 9, false));
        // Queue 0 is never pulled again; pulls of another queue, once the
        // hold ran out, drop it.
        std::thread::sleep(std::time::Duration::from_millis(1_100));
        assert!(!rmq.stale_after_reset("g", "t", 1, 3, true));
        assert_eq!(rmq.resets_held.load(std::sync::atomic::Ordering::Relaxed), 0);
        Ok(())
    }
}
