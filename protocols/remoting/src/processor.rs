//! Request processing for the name server and broker ports: one function per
//! request family; the only place errors become RocketMQ response codes.

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

/// (group, topic, queue id) → (holding client id, last granted at ms).
type QueueLocks = std::collections::HashMap<(String, String, i64), (String, u64)>;

/// The RocketMQ broker: state shared by its connections.
#[derive(Debug)]
pub struct RocketMq {
    broker: Arc<Broker>,
    config: RocketMqConfig,
    advertised: String,
    /// The host in message ids and converted messages.
    store_host: SocketAddr,
    clients: Mutex<Clients>,
    /// Orderly-consumption queue locks: (group, topic, queue) → (client id, taken at ms).
    locks: Mutex<QueueLocks>,
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

/// Tag codes of a TAG expression: `*`/empty = all (None); tokens are split
/// on `||` and trimmed before hashing (some clients send untrimmed codes).
pub fn tag_codes(expr: &str) -> Option<Vec<i32>> {
    let e = expr.trim();
    if e.is_empty() || e == "*" {
        return None;
    }
    Some(
        e.split("||")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| properties::java_string_hash(t.as_bytes()))
            .collect(),
    )
}

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
            store_host,
            clients: Mutex::new(Clients::default()),
            locks: Mutex::new(Default::default()),
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
            .map(|(name, t)| TopicConf {
                name,
                read_queues: t.partitions,
                write_queues: t.partitions,
                perm: 6,
                sys_flag: 0,
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
        Registration {
            cluster: self.config.cluster_name.clone(),
            broker_name,
            broker_addr: self.advertised.clone(),
            broker_id,
            ha_addr,
            timeout_ms: Some(self.config.broker_timeout_ms),
            data_version: version,
            topics,
        }
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
        metrics::counter!("rokka_rocketmq_requests_total", "code" => crate::codes::label(code)).increment(1);
        let oneway = cmd.flag & FLAG_ONEWAY != 0;
        if let Some(remark) = crate::auth::check(&self.broker, conn, &cmd) {
            return (!oneway).then(|| self.reply(&cmd, crate::auth::NO_PERMISSION, Some(remark)));
        }
        let resp = match code {
            rq::HEART_BEAT => self.heartbeat(&cmd, conn),
            rq::UNREGISTER_CLIENT => self.unregister(&cmd),
            rq::GET_CONSUMER_LIST_BY_GROUP => self.consumer_list(&cmd),
            rq::SEND_MESSAGE | rq::SEND_MESSAGE_V2 | rq::SEND_BATCH_MESSAGE => {
                let (mut r, end) = rokka_broker::offload(|| self.send(&cmd, conn));
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
                    if let Err(e) = self.broker.offsets_durable().await {
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
            rq::GET_CONSUME_STATS => self.consume_stats(&cmd),
            rq::LOCK_BATCH_MQ | rq::UNLOCK_BATCH_MQ => self.lock_batch(&cmd),
            // What these append must be durable before the client is told
            // (sync flush): the consumer moves its offset past a sent-back
            // message, the producer forgets a resolved transaction.
            rq::CONSUMER_SEND_MSG_BACK => self.durable_then(rokka_broker::offload(|| self.send_back(&cmd))).await,
            rq::QUERY_MESSAGE => self.query_message(&cmd),
            rq::END_TRANSACTION => {
                self.durable_then(rokka_broker::offload(|| self.end_transaction(&cmd)))
                    .await
            }
            rq::VIEW_MESSAGE_BY_ID => self.view_message(&cmd),
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
        metrics::histogram!("rokka_rocketmq_request_seconds", "code" => crate::codes::label(code))
            .record(started.elapsed().as_secs_f64());
        (!oneway).then_some(resp)
    }

    /// The answer to a transaction participant's request.
    fn txn_reply(&self, req: &RemotingCommand, r: Result<(), crate::remote_txns::Refused>) -> RemotingCommand {
        match r {
            Ok(()) => self.reply(req, rs::SUCCESS, None),
            Err(why) => {
                let mut resp = self.reply(req, why.code, Some(why.remark));
                if let Some(c) = why.kafka {
                    resp.ext_fields.set(crate::remote_txns::EXT_KAFKA_ERROR, c.to_string());
                }
                resp
            }
        }
    }

    fn json_body(&self, req: &RemotingCommand, v: Value) -> RemotingCommand {
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = Bytes::from(v.to_string());
        r
    }

    fn heartbeat(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let hb = match parse_heartbeat(&req.body) {
            Ok(hb) => hb,
            Err(why) => return self.reply(req, rs::SYSTEM_ERROR, Some(why.into())),
        };
        let client_id = hb.client_id;
        let now = self.now_ms();
        let mut changed = Vec::new();
        let mut retry_topics = Vec::new();
        let mut conflict: Option<String> = None;
        let max_clients = self.config.max_clients as usize;
        let max_groups = self.config.max_consumer_groups as usize;
        let mut refused: Option<String> = None;
        {
            let mut c = self.clients();
            if max_clients > 0 && c.clients.len() >= max_clients && !c.clients.contains_key(&client_id) {
                drop(c);
                metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "max_clients").increment(1);
                return self.reply(
                    req,
                    rs::SYSTEM_ERROR,
                    Some(format!("too many clients (rocketmq.max_clients = {max_clients})")),
                );
            }
            let entry = c.clients.entry(client_id.clone()).or_insert_with(|| Client {
                conn: conn.clone(),
                last_seen_ms: now,
                consumer_groups: Default::default(),
                producer_groups: Default::default(),
            });
            entry.conn = conn.clone();
            entry.last_seen_ms = now;
            // Producer groups only label the client; at most as many as
            // one heartbeat names (a later heartbeat replaces them).
            entry.producer_groups = hb.producer_groups.into_iter().collect();
            for cd in hb.consumers {
                let g = cd.group;
                if max_groups > 0 && c.groups.len() >= max_groups && !c.groups.contains_key(&g) {
                    metrics::counter!("rokka_rocketmq_heartbeats_refused_total", "reason" => "max_consumer_groups")
                        .increment(1);
                    refused = Some(format!(
                        "consumer group {g} refused: too many consumer groups (rocketmq.max_consumer_groups = {max_groups})"
                    ));
                    continue;
                }
                if self.broker.membership().is_consumer_protocol_group(&g) {
                    // Kafka KIP-848 members have the broker assign this
                    // group's partitions; a RocketMQ client allocating
                    // queues itself would consume them twice.
                    metrics::counter!("rokka_mixed_group_conflicts_total", "group" => g.clone(), "side" => "rocketmq")
                        .increment(1);
                    let was = c.leave_group(&g, &client_id);
                    if was {
                        changed.push(g.clone());
                    }
                    conflict = Some(format!(
                        "consumer group {g} has Kafka consumer-protocol (KIP-848) members; RocketMQ clients cannot join it"
                    ));
                    continue;
                }
                if let Some(cl) = c.clients.get_mut(&client_id) {
                    cl.consumer_groups.insert(g.clone());
                }
                // A mixed group's members must agree on topics.
                let topics: BTreeSet<String> = cd
                    .subscriptions
                    .iter()
                    .map(|(t, _, _)| t)
                    .filter(|t| !t.starts_with("%RETRY%"))
                    .cloned()
                    .collect();
                let kafka = self.broker.membership().get(&g);
                // (Kafka members' topics are unknown until their first join completes.)
                if !kafka.kafka.is_empty() && !kafka.kafka_topics.is_empty() && topics != kafka.kafka_topics {
                    metrics::counter!("rokka_mixed_group_conflicts_total", "group" => g.clone(), "side" => "rocketmq")
                        .increment(1);
                    let was = c.leave_group(&g, &client_id);
                    if was {
                        changed.push(g.clone());
                    }
                    if conflict.is_none() {
                        tracing::warn!(group = g, client = client_id, rocketmq = ?topics, kafka = ?kafka.kafka_topics,
                            "RocketMQ consumer refused: its subscription differs from the group's Kafka members'");
                    }
                    conflict = Some(format!(
                        "consumer group {g}: subscription {topics:?} conflicts with its Kafka members' {:?}",
                        kafka.kafka_topics
                    ));
                    continue;
                }
                let group = c.groups.entry(g.clone()).or_default();
                group.clustering = cd.clustering;
                let mut subs_changed = false;
                for (topic, expression, expression_type) in cd.subscriptions {
                    let sub = Subscription {
                        expression,
                        expression_type,
                    };
                    if group.subscriptions.get(&topic) != Some(&sub) {
                        group.subscriptions.insert(topic, sub);
                        subs_changed = true;
                    }
                }
                let joined_now = group.members.insert(client_id.clone());
                if group.clustering {
                    retry_topics.push(format!("%RETRY%{g}"));
                }
                if (joined_now || subs_changed) && group.clustering {
                    changed.push(g);
                }
            }
        }
        // As RocketMQ's broker does on a consumer heartbeat: the group's retry
        // topic (one queue) exists from then on, and so is in the routes.
        for t in retry_topics {
            if self.broker.topics().get(&t).is_none() {
                match self.broker.create_topic(&t, 1) {
                    Ok(_) | Err(rokka_broker::BrokerError::TopicExists(_)) => {}
                    Err(e) => tracing::warn!(topic = t, error = %e, "cannot create the retry topic"),
                }
            }
        }
        for g in changed {
            self.notify_ids_changed(&g);
        }
        if let Some(remark) = conflict.or(refused) {
            return self.reply(req, rs::SYSTEM_ERROR, Some(remark));
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields.set("IS_SUPPORT_HEART_BEAT_V2", "false");
        r.ext_fields.set("IS_SUB_CHANGE", "true");
        r
    }

    /// The group's RocketMQ members and topics (clustering groups only).
    fn rocketmq_side(&self, group: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let c = self.clients();
        match c.groups.get(group) {
            Some(g) if g.clustering => (
                g.members.clone(),
                g.subscriptions
                    .keys()
                    .filter(|t| !t.starts_with("%RETRY%"))
                    .cloned()
                    .collect(),
            ),
            _ => (BTreeSet::new(), BTreeSet::new()),
        }
    }

    /// Tells the Kafka side of mixed groups, from now on, about membership
    /// changes here.
    pub fn start_mixed_listener(self: &Arc<Self>) {
        let mut events = self.broker.membership().rocketmq_events();
        let me = Arc::clone(self);
        tokio::spawn(async move {
            while let Some(g) = events.recv().await {
                tracing::info!(group = g, "Kafka members changed: notifying the RocketMQ members");
                me.notify_ids_changed(&g);
            }
        });
    }

    /// Tells every member of `group` to rebalance (oneway, on its own
    /// connection), after reporting the group's RocketMQ side to the shared
    /// membership (which rebalances its Kafka members, if any).
    fn notify_ids_changed(&self, group: &str) {
        let (members, topics) = self.rocketmq_side(group);
        self.broker.membership().set_rocketmq(group, members, topics);
        let conns = self.clients().member_conns(group);
        for c in conns {
            let mut n = RemotingCommand::request(rq::NOTIFY_CONSUMER_IDS_CHANGED, c.next_opaque());
            n.flag = FLAG_ONEWAY;
            n.version = self.config.server_version;
            n.ext_fields.set("consumerGroup", group);
            if c.send(n) {
                metrics::counter!("rokka_rocketmq_consumer_ids_changed_total").increment(1);
            }
        }
    }

    fn unregister(&self, req: &RemotingCommand) -> RemotingCommand {
        let Some(client_id) = req.ext_fields.get("clientID") else {
            return self.reply(req, rs::SYSTEM_ERROR, Some("clientID missing".into()));
        };
        let changed = {
            let mut c = self.clients();
            match req.ext_fields.get("consumerGroup") {
                Some(g) if !g.is_empty() => {
                    let mut changed = Vec::new();
                    if c.leave_group(g, client_id) {
                        changed.push(g.to_string());
                    }
                    if let Some(cl) = c.clients.get_mut(client_id) {
                        cl.consumer_groups.remove(g);
                    }
                    changed
                }
                _ => Vec::new(),
            }
        };
        for g in changed {
            self.notify_ids_changed(&g);
        }
        self.reply(req, rs::SUCCESS, None)
    }

    /// A closed connection drops the clients that used it.
    fn drop_connection(&self, conn: &Conn) {
        let changed = {
            let mut c = self.clients();
            let gone: Vec<String> = c
                .clients
                .iter()
                .filter(|(_, cl)| cl.conn.peer == conn.peer && cl.conn.is_closed())
                .map(|(id, _)| id.clone())
                .collect();
            let mut changed = Vec::new();
            for id in gone {
                changed.extend(c.remove_client(&id));
            }
            changed
        };
        for g in changed {
            self.notify_ids_changed(&g);
        }
    }

    /// Drops clients silent for longer than `client_timeout_ms`.
    pub fn expire_clients(&self) {
        let now = self.now_ms();
        let timeout = self.config.client_timeout_ms;
        let changed = {
            let mut c = self.clients();
            let gone: Vec<String> = c
                .clients
                .iter()
                .filter(|(_, cl)| cl.last_seen_ms + timeout < now)
                .map(|(id, _)| id.clone())
                .collect();
            let mut changed = Vec::new();
            for id in gone {
                tracing::info!(client = id, "RocketMQ client expired");
                changed.extend(c.remove_client(&id));
            }
            metrics::gauge!("rokka_rocketmq_clients").set(c.clients.len() as f64);
            metrics::gauge!("rokka_rocketmq_consumer_groups").set(c.groups.len() as f64);
            changed
        };
        for g in changed {
            self.notify_ids_changed(&g);
        }
    }

    fn consumer_list(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        // A mixed group lists its Kafka members too: RocketMQ clients then
        // leave those members' share of the queues alone.
        let mut ids: BTreeSet<String> = self
            .clients()
            .groups
            .get(group)
            .map(|g| g.members.iter().cloned().collect())
            .unwrap_or_default();
        if !ids.is_empty() {
            ids.extend(self.broker.membership().get(group).kafka);
        }
        if ids.is_empty() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("no consumer for this group, {group}")),
            );
        }
        self.json_body(req, json!({"consumerIdList": ids}))
    }

    /// Stores the messages of a send; the response and the CommitLog end to
    /// be durable before it goes out (0 on error).
    fn send(&self, req: &RemotingCommand, conn: &Conn) -> (RemotingCommand, u64) {
        match self.send_inner(req, conn) {
            Ok(ok) => ok,
            Err(r) => (r, 0),
        }
    }

    fn send_inner(&self, req: &RemotingCommand, conn: &Conn) -> Result<(RemotingCommand, u64), RemotingCommand> {
        let Some(topic) = ext(req, "topic", "b").map(String::from) else {
            return Err(self.reply(req, rs::MESSAGE_ILLEGAL, Some("topic missing".into())));
        };
        let want_queues = ext_i64(req, "defaultTopicQueueNums", "d")
            .unwrap_or(4)
            .clamp(1, i64::from(self.config.max_auto_create_queues)) as u32;
        let info = match self.broker.topic_or_create(&topic, true, Some(want_queues)) {
            Ok(Some(t)) => t,
            Ok(None) => {
                return Err(self.reply(
                    req,
                    rs::TOPIC_NOT_EXIST,
                    Some(format!("topic[{topic}] not exist, apply first please!")),
                ))
            }
            Err(e) => return Err(self.reply(req, rs::MESSAGE_ILLEGAL, Some(e.to_string()))),
        };
        let mut queue = ext_i64(req, "queueId", "e").unwrap_or(-1);
        if queue < 0 {
            queue = i64::from(rand::random::<u32>() % info.partitions.max(1));
        }
        if queue >= i64::from(info.partitions) {
            return Err(self.reply(req, 29, Some(format!("queueId {queue} out of range for {topic}"))));
        }
        let sys_flag = ext_i64(req, "sysFlag", "f").unwrap_or(0) as i32;
        let born = ext_i64(req, "bornTimestamp", "g").unwrap_or_else(rokka_store::now_ms);
        let flag = ext_i64(req, "flag", "h").unwrap_or(0) as i32;
        let props = ext(req, "properties", "i").unwrap_or_default().to_string();
        let reconsume = ext_i64(req, "reconsumeTimes", "j").unwrap_or(0) as i32;
        let batch = req.code == rq::SEND_BATCH_MESSAGE || ext_bool(req, "batch", "m");
        // Owned parts of each message, then borrowed inputs.
        let parts: Vec<(i32, Bytes, String)> = if batch {
            match split_batch(&req.body) {
                Some(p) => p,
                None => return Err(self.reply(req, rs::MESSAGE_ILLEGAL, Some("malformed batch body".into()))),
            }
        } else {
            vec![(flag, req.body.clone(), props)]
        };
        let inputs: Vec<MessageInput<'_>> = parts
            .iter()
            .map(|(f, body, p)| MessageInput {
                topic: &topic,
                queue_id: queue as u32,
                flag: *f,
                body,
                properties: p.as_bytes(),
                sys_flag: if batch { 0 } else { sys_flag },
                born_timestamp: born,
                born_host: conn.peer,
                reconsume_times: reconsume,
                prepared_transaction_offset: 0,
            })
            .collect();
        // A compacted topic keeps the latest message per key: a message
        // without KEYS has nothing to be kept by (Kafka refuses keyless
        // records on compacted topics too).
        if self.broker.store().is_compacted(&topic)
            && parts
                .iter()
                .any(|(_, _, p)| !rokka_broker::convert::has_key(p.as_bytes()))
        {
            metrics::counter!("rokka_rocketmq_messages_refused_total", "reason" => "no_key").increment(1);
            return Err(self.reply(
                req,
                rs::MESSAGE_ILLEGAL,
                Some(format!(
                    "topic {topic} is compacted (cleanup.policy=compact): every message needs KEYS"
                )),
            ));
        }
        // DELAY=n (single sends only, as RocketMQ): through the schedule topic.
        let delay = if batch || topic == rokka_broker::schedule::SCHEDULE_TOPIC {
            None
        } else {
            rokka_broker::schedule::delay_level(parts[0].2.as_bytes())
        };
        // A prepared transaction message waits as a half message.
        let prepared = !batch
            && sys_flag & rokka_store::record::message::sysflag::TRANSACTION_MASK
                == rokka_store::record::message::sysflag::TRANSACTION_PREPARED;
        // Timer messages (TIMER_DELAY_SEC / _MS, TIMER_DELIVER_MS, __STARTDELIVERTIME).
        let timer = if batch || prepared {
            None
        } else {
            rokka_broker::timer::deliver_at(parts[0].2.as_bytes(), rokka_store::now_ms())
                .filter(|due| *due > rokka_store::now_ms())
        };
        let appended = match delay {
            _ if prepared => self.broker.append_half(&inputs[0]).map(|r| vec![r]),
            _ if timer.is_some() => self
                .broker
                .append_timer(&inputs[0], timer.unwrap_or_default())
                .map(|r| vec![r]),
            Some(level) => self.broker.append_delayed(&inputs[0], level).map(|r| vec![r]),
            None => self.broker.append_messages(&inputs),
        };
        let results = match appended {
            Ok(r) => r,
            Err(e) => {
                let code = match &e {
                    rokka_broker::BrokerError::Store(
                        rokka_store::StoreError::MessageTooLarge { .. }
                        | rokka_store::StoreError::PropertiesTooLarge(_),
                    )
                    | rokka_broker::BrokerError::TimerTooFar { .. } => rs::MESSAGE_ILLEGAL,
                    // Not the set's master (cluster mode): the client
                    // retries on another broker after a route refresh.
                    rokka_broker::BrokerError::Store(
                        rokka_store::StoreError::NotLeader | rokka_store::StoreError::ShutDown,
                    ) => rs::SERVICE_NOT_AVAILABLE,
                    _ => rs::SYSTEM_ERROR,
                };
                return Err(self.reply(req, code, Some(e.to_string())));
            }
        };
        metrics::counter!("rokka_rocketmq_messages_in_total", "topic" => topic.clone()).increment(results.len() as u64);
        let bytes: usize = parts.iter().map(|(_, b, p)| b.len() + p.len()).sum();
        metrics::counter!("rokka_rocketmq_bytes_in_total", "topic" => topic.clone()).increment(bytes as u64);
        let host = self.store_host;
        let ids: Vec<String> = results.iter().map(|r| msgid::message_id(host, r.phys_offset)).collect();
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields.set("msgId", ids.join(","));
        r.ext_fields.set("queueId", queue.to_string());
        r.ext_fields
            .set("queueOffset", results.first().map_or(0, |x| x.queue_offset).to_string());
        if let Some(u) = properties::get(parts[0].2.as_bytes(), properties::UNIQ_KEY) {
            r.ext_fields
                .set("transactionId", String::from_utf8_lossy(u).into_owned());
        }
        r.ext_fields.set("MSG_REGION", "DefaultRegion");
        r.ext_fields.set("TRACE_ON", "true");
        let end = results.iter().map(|x| x.end_offset).max().unwrap_or(0);
        Ok((r, end))
    }

    async fn pull(&self, req: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default().to_string();
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default().to_string();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1);
        let offset = ext_i64(req, "queueOffset", "queueOffset").unwrap_or(0).max(0) as u64;
        let max_msgs = ext_i64(req, "maxMsgNums", "maxMsgNums").unwrap_or(32).clamp(1, 1024) as u32;
        let sys_flag = ext_i64(req, "sysFlag", "sysFlag").unwrap_or(0);
        let suspend_ms = ext_i64(req, "suspendTimeoutMillis", "suspendTimeoutMillis")
            .unwrap_or(15_000)
            .clamp(0, 60_000) as u64;
        let Some(info) = self.broker.topics().get(&topic) else {
            return self.reply(req, rs::TOPIC_NOT_EXIST, Some(format!("topic[{topic}] not exist")));
        };
        if queue < 0 || queue >= i64::from(info.partitions) {
            return self.reply(req, 29, Some(format!("queueId {queue} out of range")));
        }
        let q = queue as u32;
        if !self.owns(&group, &topic, q, info.partitions, conn) {
            // A mixed group's queue allocated to another member (a Kafka one,
            // or this client before a rebalance it has not done yet): no
            // messages and no commit. Held a moment so the client does not spin.
            metrics::counter!("rokka_mixed_group_foreign_pulls_total", "group" => group.clone()).increment(1);
            tokio::time::sleep(Duration::from_millis(suspend_ms.min(1000))).await;
            let store = self.broker.store();
            let mut r = self.reply(req, rs::PULL_NOT_FOUND, None);
            r.ext_fields.set("suggestWhichBrokerId", "0");
            r.ext_fields.set("nextBeginOffset", offset.to_string());
            r.ext_fields.set("minOffset", store.min_offset(&topic, q).to_string());
            r.ext_fields.set("maxOffset", store.max_offset(&topic, q).to_string());
            return r;
        }
        // A replica does not take commits (RocketMQ's slave neither): the
        // master's offset table replaces its own.
        let replica = self.broker.cluster_view().is_some_and(|v| !v.is_master());
        if sys_flag & 0x1 != 0 && !replica {
            if let Some(c) = ext_i64(req, "commitOffset", "commitOffset").filter(|c| *c >= 0) {
                // Refused past store.max_committed_offsets (counted); the pull is still served.
                let _ = self
                    .broker
                    .store()
                    .offsets()
                    .commit_bounded(&group, &topic, q, c as u64, "", -1);
            }
        }
        // The filter: from the request when it carries one, else the heartbeat's.
        let expr = if sys_flag & 0x4 != 0 {
            req.ext_fields.get("subscription").unwrap_or("*").to_string()
        } else {
            self.clients()
                .groups
                .get(&group)
                .and_then(|g| g.subscriptions.get(&topic))
                .map_or_else(|| "*".to_string(), |s| s.expression.clone())
        };
        let codes = tag_codes(&expr);
        let deadline = Instant::now() + Duration::from_millis(suspend_ms);
        let mut offset = offset;
        loop {
            let waiter = Arc::new(Notify::new());
            if sys_flag & 0x2 != 0 {
                self.broker.arrivals().register(&topic, q, &waiter);
            }
            let (resp, next) = self.pull_once(req, &topic, q, offset, max_msgs, codes.as_deref());
            let now = Instant::now();
            if resp.code != rs::PULL_NOT_FOUND || sys_flag & 0x2 == 0 || now >= deadline {
                if resp.code == rs::PULL_RETRY_IMMEDIATELY && sys_flag & 0x2 != 0 && now < deadline && next > offset {
                    // Everything scanned was filtered out: keep going from there.
                    offset = next;
                    continue;
                }
                return resp;
            }
            metrics::gauge!("rokka_rocketmq_pulls_held").increment(1.0);
            let _ = tokio::time::timeout(deadline - now, waiter.notified()).await;
            metrics::gauge!("rokka_rocketmq_pulls_held").decrement(1.0);
        }
    }

    /// Whether the client on `conn` may pull `queue` of `topic` for `group`:
    /// always, unless the group is mixed; then only its own share by the
    /// averaging allocation over all member ids (retry topics excepted).
    fn owns(&self, group: &str, topic: &str, queue: u32, partitions: u32, conn: &Conn) -> bool {
        if topic.starts_with("%RETRY%") {
            return true;
        }
        let Some(m) = self.broker.membership().mixed(group) else {
            return true;
        };
        let ids = m.all_ids();
        // The unit list is the whole topic's queues over every broker set,
        // as the clients sort them (one set: this set's queues).
        let (index, units) = match self.broker.topics().get(topic) {
            Some(info) => match info.rocketmq_index(self.broker.own_set(), queue) {
                Some(i) => (i, info.kafka_partitions() as usize),
                None => return false,
            },
            None => (queue as usize, partitions as usize),
        };
        let c = self.clients();
        c.clients
            .iter()
            .filter(|(id, cl)| cl.conn.peer == conn.peer && m.rocketmq.contains(*id))
            .any(|(id, _)| rokka_broker::membership::allocate_averagely(units, &ids, id).contains(&index))
    }

    /// One pull attempt: the response and its nextBeginOffset.
    fn pull_once(
        &self,
        req: &RemotingCommand,
        topic: &str,
        q: u32,
        offset: u64,
        max_msgs: u32,
        codes: Option<&[i32]>,
    ) -> (RemotingCommand, u64) {
        let store = self.broker.store();
        let cap = self.config.max_pull_bytes.max(1) as usize;
        let read = store.read(topic, q, offset, max_msgs, cap);
        let (min, max) = (read.min_offset, read.max_offset);
        // Cluster mode with replica reads: a consumer far behind the log's
        // end is pointed at a replica, and back once caught up.
        let view = self.broker.cluster_view();
        let mut suggest = view.as_ref().map_or(0, |v| {
            let lag = read
                .entries
                .first()
                .map(|e| store.log_end().saturating_sub(e.cq.phys_offset));
            v.suggested_broker_id(lag)
        });
        if !read.entries.is_empty() {
            match view.as_ref().map(|v| v.is_master()) {
                Some(true) if suggest != 0 => {
                    metrics::counter!("rokka_cluster_read_redirects_total", "protocol" => "rocketmq").increment(1)
                }
                Some(false) => {
                    metrics::counter!("rokka_cluster_replica_reads_total", "protocol" => "rocketmq").increment(1)
                }
                _ => {}
            }
        }
        // Kafka transactions: nothing at or past the last stable offset (an
        // open transaction's records may still be aborted) is served, and
        // aborted transactions' records never are (as read_committed).
        let txns = self.broker.kafka_txns();
        let lso = txns.last_stable_offset(topic, q, max);
        let status = match read.status {
            ReadStatus::Found if offset >= lso => ReadStatus::NoNewMessages,
            s => s,
        };
        let (code, next, body) = match status {
            ReadStatus::Found => {
                let mut body = BytesMut::new();
                let mut n = 0;
                let mut next = read.next_offset;
                for e in &read.entries {
                    if e.cq.base_offset >= lso {
                        next = e.cq.base_offset.max(offset);
                        break;
                    }
                    // Kafka batches grow when they cross (decompressed, one
                    // message each): stop once the answer holds the cap
                    // (always at least one entry).
                    if !body.is_empty() && body.len() >= cap {
                        next = e.cq.base_offset.max(offset);
                        break;
                    }
                    if !e.is_kafka_batch() {
                        // A stored RocketMQ message goes out as stored.
                        if codes.is_none_or(|c| c.contains(&(e.cq.tag_code as i32))) {
                            body.put_slice(&e.data);
                            n += 1;
                        }
                        continue;
                    }
                    // A Kafka-produced batch crosses: its records become
                    // messages (docs/mapping.md), filtered by their tag header.
                    let converted = match e.decode() {
                        Ok(Entry::KafkaBatch(b)) if aborted_batch(txns, topic, q, &b) => Ok(Default::default()),
                        Ok(Entry::KafkaBatch(b)) => rokka_broker::convert::kafka_batch_to_rocketmq(
                            &b,
                            offset,
                            codes,
                            self.store_host,
                            self.broker.config().max_batch_decompressed_bytes as usize,
                            &mut body,
                        ),
                        Ok(_) => Err("not a Kafka batch".to_string()),
                        Err(err) => Err(err.to_string()),
                    };
                    match converted {
                        Ok(c) => n += c.messages,
                        Err(err) => {
                            tracing::error!(topic, queue = q, error = err, "Kafka batch not convertible; skipped")
                        }
                    }
                }
                if n == 0 {
                    (rs::PULL_RETRY_IMMEDIATELY, next, Bytes::new())
                } else {
                    metrics::counter!("rokka_rocketmq_messages_out_total", "topic" => topic.to_string()).increment(n);
                    metrics::counter!("rokka_rocketmq_bytes_out_total", "topic" => topic.to_string())
                        .increment(body.len() as u64);
                    (rs::SUCCESS, next, body.freeze())
                }
            }
            ReadStatus::NoNewMessages => (rs::PULL_NOT_FOUND, offset, Bytes::new()),
            ReadStatus::NoSuchQueue if offset == 0 => (rs::PULL_NOT_FOUND, 0, Bytes::new()),
            ReadStatus::NoSuchQueue => (rs::PULL_OFFSET_MOVED, 0, Bytes::new()),
            // A replica does not move a consumer's offset on its own
            // bounds (its retention runs apart from the master's, and it may
            // lag): it sends the consumer back to the master, as a RocketMQ
            // slave does (offsetCheckInSlave off).
            ReadStatus::OffsetMoved | ReadStatus::OffsetOverflow if view.as_ref().is_some_and(|v| !v.is_master()) => {
                suggest = 0;
                (rs::PULL_RETRY_IMMEDIATELY, offset, Bytes::new())
            }
            ReadStatus::OffsetMoved => (rs::PULL_OFFSET_MOVED, min, Bytes::new()),
            ReadStatus::OffsetOverflow => (rs::PULL_OFFSET_MOVED, max, Bytes::new()),
            // A damaged entry is never served: an error, which clients
            // retry after their pull back-off (3 s), not at once.
            ReadStatus::Damaged => (rs::SYSTEM_ERROR, offset, Bytes::new()),
        };
        let mut r = self.reply(req, code, None);
        r.ext_fields.set("suggestWhichBrokerId", suggest.to_string());
        r.ext_fields.set("nextBeginOffset", next.to_string());
        r.ext_fields.set("minOffset", min.to_string());
        r.ext_fields.set("maxOffset", max.to_string());
        r.body = body;
        (r, next)
    }

    fn query_offset(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1).max(0) as u32;
        match self.broker.store().offsets().get(group, topic, queue) {
            Some(o) => {
                let mut r = self.reply(req, rs::SUCCESS, None);
                r.ext_fields.set("offset", o.offset.to_string());
                // What a Kafka commit stored, for a coordinator of another
                // broker set (RocketMQ clients ignore unknown fields).
                if !o.metadata.is_empty() {
                    r.ext_fields.set(crate::remote_offsets::EXT_METADATA, o.metadata);
                }
                if o.leader_epoch >= 0 {
                    r.ext_fields
                        .set(crate::remote_offsets::EXT_LEADER_EPOCH, o.leader_epoch.to_string());
                }
                r
            }
            // Apache RocketMQ's rule (ConsumerManageProcessor): a group with
            // nothing committed starts at 0 when the queue still starts at
            // 0 and its first message is still in memory — how a new group
            // on a young topic reads from the start under the default
            // CONSUME_FROM_LAST_OFFSET — unless the client asked otherwise
            // (setZeroIfNotFound=false; absent counts as true).
            None if req
                .ext_fields
                .get("setZeroIfNotFound")
                .is_none_or(|v| !v.eq_ignore_ascii_case("false"))
                && self.first_message_in_memory(topic, queue) =>
            {
                let mut r = self.reply(req, rs::SUCCESS, None);
                r.ext_fields.set("offset", "0");
                r
            }
            None => self.reply(
                req,
                rs::QUERY_NOT_FOUND,
                Some("Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first".into()),
            ),
        }
    }

    /// Whether `queue` still starts at offset 0 and that first message is
    /// within the newest `access_message_in_memory_max_ratio` % of physical
    /// memory's worth of CommitLog (Apache's `checkInMemByConsumeOffset`).
    fn first_message_in_memory(&self, topic: &str, queue: u32) -> bool {
        let store = self.broker.store();
        if store.min_offset(topic, queue) != 0 {
            return false;
        }
        let Some(first) = store
            .queue(topic, queue)
            .and_then(|cq| cq.find(0).and_then(|i| cq.entry(i)))
        else {
            return false;
        };
        let (_, end, _) = store.commitlog_offsets();
        let memory = rokka_store::sys::total_memory_bytes().unwrap_or(8 << 30) as f64
            * f64::from(self.config.access_message_in_memory_max_ratio.min(100))
            / 100.0;
        (end.saturating_sub(first.phys_offset) as f64) <= memory
    }

    fn update_offset(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(-1);
        let offset = ext_i64(req, "commitOffset", "commitOffset").unwrap_or(-1);
        if group.is_empty() || queue < 0 || offset < 0 {
            return self.reply(req, rs::SYSTEM_ERROR, Some("bad offset update".into()));
        }
        // A Kafka commit forwarded by another broker set's coordinator.
        let metadata = req
            .ext_fields
            .get(crate::remote_offsets::EXT_METADATA)
            .unwrap_or_default();
        if metadata.len() > crate::MAX_FORWARDED_METADATA {
            return self.reply(req, rs::SYSTEM_ERROR, Some("offset metadata too large".into()));
        }
        let leader_epoch = ext_i64(
            req,
            crate::remote_offsets::EXT_LEADER_EPOCH,
            crate::remote_offsets::EXT_LEADER_EPOCH,
        )
        .and_then(|e| i32::try_from(e).ok())
        .unwrap_or(-1);
        let Some(info) = self.broker.topics().get(topic) else {
            return self.reply(req, rs::TOPIC_NOT_EXIST, Some(format!("topic[{topic}] not exist")));
        };
        if queue as u64 >= u64::from(info.partitions) {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!(
                    "queueId[{queue}] is illegal, topic:[{topic}] has {} queues",
                    info.partitions
                )),
            );
        }
        let stored = self.broker.store().offsets().commit_bounded(
            group,
            topic,
            queue as u32,
            offset as u64,
            metadata,
            leader_epoch,
        );
        if !stored {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some("the committed-offset table is full (store.max_committed_offsets)".into()),
            );
        }
        self.reply(req, rs::SUCCESS, None)
    }

    fn offset_queries(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let queue = ext_i64(req, "queueId", "queueId").unwrap_or(0).max(0) as u32;
        let store = self.broker.store();
        let mut r = self.reply(req, rs::SUCCESS, None);
        match req.code {
            rq::GET_MAX_OFFSET => r.ext_fields.set("offset", store.max_offset(topic, queue).to_string()),
            rq::GET_MIN_OFFSET => r.ext_fields.set("offset", store.min_offset(topic, queue).to_string()),
            rq::SEARCH_OFFSET_BY_TIMESTAMP => {
                let ts = ext_i64(req, "timestamp", "timestamp").unwrap_or(0);
                let upper = req
                    .ext_fields
                    .get("boundaryType")
                    .is_some_and(|b| b.eq_ignore_ascii_case("UPPER"));
                let lower = store.offset_by_store_time(topic, queue, ts);
                let off = if upper {
                    // Last offset stored at or before ts.
                    let after = store.offset_by_store_time(topic, queue, ts.saturating_add(1));
                    after.saturating_sub(1).max(store.min_offset(topic, queue))
                } else {
                    lower
                };
                r.ext_fields.set("offset", off.to_string());
            }
            _ => {
                let min = store.min_offset(topic, queue);
                let read = store.read(topic, queue, min, 1, 1);
                let ts = read.entries.first().map_or(0, |e| e.cq.store_timestamp);
                r.ext_fields.set("timestamp", ts.to_string());
            }
        }
        r
    }

    fn create_topic(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let n = ext_i64(req, "writeQueueNums", "writeQueueNums")
            .or_else(|| ext_i64(req, "readQueueNums", "readQueueNums"))
            .unwrap_or(8)
            .max(1) as u32;
        match self.broker.create_topic(topic, n) {
            Ok(_) => self.reply(req, rs::SUCCESS, None),
            Err(rokka_broker::BrokerError::TopicExists(_)) => {
                // Several broker sets: the count is the topic's (every
                // set's queues), as Kafka's partition count is.
                let current = self.broker.topics().get(topic).map_or(n, |t| t.kafka_partitions());
                if n > current {
                    if let Err(e) = self.broker.add_partitions(topic, n) {
                        return self.reply(req, 29, Some(e.to_string()));
                    }
                }
                self.reply(req, rs::SUCCESS, None)
            }
            Err(e) => self.reply(req, 29, Some(e.to_string())),
        }
    }

    /// END_TRANSACTION (usually oneway): 8 commits, 12 rolls back, 0 (unknown)
    /// leaves the half message for a later check.
    fn end_transaction(&self, req: &RemotingCommand) -> RemotingCommand {
        let group = req.ext_fields.get("producerGroup").unwrap_or_default();
        let half_offset = ext_i64(req, "tranStateTableOffset", "tranStateTableOffset").unwrap_or(-1);
        let half_phys = ext_i64(req, "commitLogOffset", "commitLogOffset").unwrap_or(-1);
        let kind = ext_i64(req, "commitOrRollback", "commitOrRollback").unwrap_or(0);
        let commit = match kind {
            8 => true,
            12 => false,
            _ => return self.reply(req, rs::SUCCESS, None),
        };
        if half_offset < 0 || half_phys < 0 {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some("tranStateTableOffset and commitLogOffset are required".into()),
            );
        }
        match self
            .broker
            .end_transaction(group, half_offset as u64, half_phys as u64, commit)
        {
            Ok(_) => self.reply(req, rs::SUCCESS, None),
            Err(e) => {
                tracing::warn!(group, half_offset, error = %e, "END_TRANSACTION refused");
                self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string()))
            }
        }
    }

    /// Sends CHECK_TRANSACTION_STATE for unresolved half messages, every
    /// `transaction_check_interval_ms`, to a live producer of their group.
    pub async fn run_transaction_checks(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let every = Duration::from_millis(self.config.transaction_check_interval_ms.max(100));
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let b = Arc::clone(&self.broker);
            let (timeout, max) = (
                self.config.transaction_timeout_ms as i64,
                self.config.transaction_check_max,
            );
            let Ok(due) = tokio::task::spawn_blocking(move || b.due_checks(rokka_store::now_ms(), timeout, max)).await
            else {
                continue;
            };
            for d in due {
                let conn = {
                    let c = self.clients();
                    c.clients
                        .values()
                        .find(|cl| cl.producer_groups.contains(&d.producer_group) && !cl.conn.is_closed())
                        .map(|cl| cl.conn.clone())
                };
                let Some(conn) = conn else {
                    tracing::debug!(group = d.producer_group, "no live producer to check a transaction with");
                    continue;
                };
                let mut n = RemotingCommand::request(rq::CHECK_TRANSACTION_STATE, conn.next_opaque());
                n.flag = FLAG_ONEWAY;
                n.version = self.config.server_version;
                n.ext_fields.set("topic", d.real_topic.as_str());
                n.ext_fields.set("tranStateTableOffset", d.half_offset.to_string());
                n.ext_fields.set("commitLogOffset", d.half_phys.to_string());
                n.ext_fields.set("msgId", d.transaction_id.as_str());
                n.ext_fields.set("transactionId", d.transaction_id.as_str());
                n.ext_fields
                    .set("offsetMsgId", msgid::message_id(self.store_host, d.half_phys));
                n.ext_fields.set("bname", self.config.broker_name.as_str());
                n.body = d.record;
                if conn.send(n) {
                    metrics::counter!("rokka_rocketmq_transaction_checks_total").increment(1);
                }
            }
        }
    }

    /// QUERY_MESSAGE: messages of `topic` by key (a KEYS token, or the
    /// client's unique id), stored within [beginTimestamp, endTimestamp],
    /// from the IndexFile; QUERY_NOT_FOUND when none.
    fn query_message(&self, req: &RemotingCommand) -> RemotingCommand {
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let key = req.ext_fields.get("key").unwrap_or_default();
        let max = ext_i64(req, "maxNum", "maxNum").unwrap_or(32).clamp(1, 64) as usize;
        let begin = ext_i64(req, "beginTimestamp", "beginTimestamp").unwrap_or(0);
        let end = ext_i64(req, "endTimestamp", "endTimestamp").unwrap_or(i64::MAX);
        let unique = ext_bool(req, "_UNIQUE_KEY_QUERY", "_UNIQUE_KEY_QUERY");
        let found = self
            .broker
            .store()
            .query_by_key(topic, key, if unique { 1 } else { max }, begin, end);
        metrics::counter!("rokka_rocketmq_queries_total", "kind" => if unique { "unique_key" } else { "key" })
            .increment(1);
        if found.is_empty() {
            return self.reply(
                req,
                rs::QUERY_NOT_FOUND,
                Some(format!(
                    "can not find message, maybe time range not correct: {topic} {key}"
                )),
            );
        }
        let mut body = BytesMut::new();
        for rec in &found {
            body.put_slice(rec);
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.ext_fields
            .set("indexLastUpdateTimestamp", rokka_store::now_ms().to_string());
        r.ext_fields.set("indexLastUpdatePhyoffset", "0");
        r.body = body.freeze();
        r
    }

    /// VIEW_MESSAGE_BY_ID: the stored message at a CommitLog offset (the
    /// offset part of a message id); a Kafka batch answers with its first
    /// record, converted.
    fn view_message(&self, req: &RemotingCommand) -> RemotingCommand {
        let phys = ext_i64(req, "offset", "offset").unwrap_or(-1);
        metrics::counter!("rokka_rocketmq_queries_total", "kind" => "id").increment(1);
        let rec = (phys >= 0).then(|| self.broker.store().read_at(phys as u64)).flatten();
        let body = match rec.as_ref().map(rokka_store::decode_entry) {
            Some(Ok(Entry::Message(_))) => rec.unwrap_or_default(),
            Some(Ok(Entry::KafkaBatch(b))) => {
                let mut out = BytesMut::new();
                match rokka_broker::convert::kafka_batch_to_rocketmq(
                    &b,
                    b.queue_offset,
                    None,
                    self.store_host,
                    self.broker.config().max_batch_decompressed_bytes as usize,
                    &mut out,
                ) {
                    Ok(_) if !out.is_empty() => {
                        let first = (u32::from_be_bytes([out[0], out[1], out[2], out[3]]) as usize).min(out.len());
                        out.freeze().slice(..first)
                    }
                    _ => Bytes::new(),
                }
            }
            _ => Bytes::new(),
        };
        if body.is_empty() {
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("can not find message by the offset, {phys}")),
            );
        }
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = body;
        r
    }

    /// CONSUMER_SEND_MSG_BACK: a message the consumer failed goes to
    /// `%RETRY%<group>` with the delay level its reconsume count selects
    /// (3 + times, or the level the consumer asked for), or to `%DLQ%<group>`
    /// once it was reconsumed `maxReconsumeTimes` (default 16) times or the
    /// consumer asked for a negative level. Both are ordinary topics.
    fn send_back(&self, req: &RemotingCommand) -> RemotingCommand {
        use rokka_broker::schedule::{without, DELAY, REAL_QID, REAL_TOPIC};
        let group = req.ext_fields.get("group").unwrap_or_default().to_string();
        let phys = ext_i64(req, "offset", "offset").unwrap_or(-1);
        let delay_level = ext_i64(req, "delayLevel", "delayLevel").unwrap_or(0);
        let max_times = ext_i64(req, "maxReconsumeTimes", "maxReconsumeTimes").unwrap_or(16);
        let origin_id = req.ext_fields.get("originMsgId").unwrap_or_default().to_string();
        if group.is_empty() || phys < 0 {
            return self.reply(req, rs::SYSTEM_ERROR, Some("group and offset are required".into()));
        }
        let Some(m) = self
            .broker
            .store()
            .read_at(phys as u64)
            .and_then(|rec| match rokka_store::decode_entry(&rec) {
                Ok(Entry::Message(m)) => Some(m),
                _ => None,
            })
        else {
            // Kafka-produced records share their batch's offset: the client
            // redelivers those itself (RocketMQ's fallback).
            return self.reply(
                req,
                rs::SYSTEM_ERROR,
                Some(format!("look message by offset failed, {phys}")),
            );
        };
        let user = m.user_properties();
        let origin_topic = m
            .property("RETRY_TOPIC")
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .unwrap_or_else(|| m.topic_str().to_string());
        let mut props = without(&user, &[DELAY, REAL_TOPIC, REAL_QID]);
        let mut add = |k: &str, v: &str| {
            props.extend_from_slice(k.as_bytes());
            props.push(properties::NAME_VALUE_SEPARATOR);
            props.extend_from_slice(v.as_bytes());
            props.push(properties::PROPERTY_SEPARATOR);
        };
        if m.property("RETRY_TOPIC").is_none() {
            add("RETRY_TOPIC", &origin_topic);
        }
        if m.property("ORIGIN_MESSAGE_ID").is_none() && !origin_id.is_empty() {
            add("ORIGIN_MESSAGE_ID", &origin_id);
        }
        let times = m.reconsume_times;
        let dlq = i64::from(times) >= max_times || delay_level < 0;
        let topic = if dlq {
            format!("%DLQ%{group}")
        } else {
            format!("%RETRY%{group}")
        };
        if self.broker.topics().get(&topic).is_none() {
            match self.broker.create_topic(&topic, 1) {
                Ok(_) | Err(rokka_broker::BrokerError::TopicExists(_)) => {}
                Err(e) => return self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string())),
            }
        }
        let input = MessageInput {
            reconsume_times: times + 1,
            ..m.as_input(&topic, 0, &props)
        };
        let res = if dlq {
            metrics::counter!("rokka_rocketmq_dlq_messages_total", "group" => group.clone()).increment(1);
            self.broker.append_messages(std::slice::from_ref(&input)).map(|_| ())
        } else {
            metrics::counter!("rokka_rocketmq_retries_total", "group" => group.clone()).increment(1);
            let level = if delay_level > 0 {
                delay_level as usize
            } else {
                3 + times.max(0) as usize
            };
            self.broker.append_delayed(&input, level).map(|_| ())
        };
        match res {
            Ok(()) => self.reply(req, rs::SUCCESS, None),
            Err(e) => self.reply(req, rs::SYSTEM_ERROR, Some(e.to_string())),
        }
    }

    /// LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (digest §2.8): a queue is granted when
    /// free, already held by the asker, or its holder's lock is older than
    /// `lock_expiry_ms`; granting renews it. Unlock frees the asker's locks.
    fn lock_batch(&self, req: &RemotingCommand) -> RemotingCommand {
        let LockBatch { group, client, queues } = match parse_lock_batch(&req.body) {
            Ok(b) => b,
            Err(why) => return self.reply(req, rs::SYSTEM_ERROR, Some(why.into())),
        };
        let now = self.now_ms();
        let expiry = self.config.lock_expiry_ms;
        let mut granted = Vec::new();
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Keys come from clients: expired locks go before new ones are
        // taken, so the table holds live locks only (and at most
        // max_queue_locks of them).
        if req.code == rq::LOCK_BATCH_MQ {
            let before = locks.len();
            locks.retain(|_, (_, at)| at.saturating_add(expiry) >= now);
            if locks.len() < before {
                tracing::info!(group, expired = before - locks.len(), "expired queue locks released");
            }
        }
        let max_locks = self.config.max_queue_locks as usize;
        for (topic, queue, mq) in queues {
            if req.code == rq::LOCK_BATCH_MQ && locks.len() >= max_locks {
                metrics::counter!("rokka_rocketmq_queue_locks_refused_total").increment(1);
                break;
            }
            let key = (group.clone(), topic, queue);
            if req.code == rq::UNLOCK_BATCH_MQ {
                if locks.get(&key).is_some_and(|(holder, _)| *holder == client) {
                    locks.remove(&key);
                }
                continue;
            }
            let free = match locks.get(&key) {
                None => true,
                Some((holder, at)) => *holder == client || at.saturating_add(expiry) < now,
            };
            if free {
                locks.insert(key, (client.clone(), now));
                granted.push(mq);
            }
        }
        metrics::gauge!("rokka_rocketmq_queue_locks").set(locks.len() as f64);
        drop(locks);
        if req.code == rq::UNLOCK_BATCH_MQ {
            return self.reply(req, rs::SUCCESS, None);
        }
        self.json_body(req, json!({"lockOKMQSet": granted}))
    }

    /// GET_CONSUME_STATS: per queue of this broker, the group's committed
    /// offset and the queue's end (what `mqadmin consumerProgress` shows as
    /// lag). With a topic: every queue of it here (0 where nothing is
    /// committed, as RocketMQ answers); without: every queue the group has
    /// committed here, over its topics.
    fn consume_stats(&self, req: &RemotingCommand) -> RemotingCommand {
        use crate::remote_offsets::{MessageQueue, OffsetWrapper};
        let group = req.ext_fields.get("consumerGroup").unwrap_or_default();
        let topic = req.ext_fields.get("topic").unwrap_or_default();
        let broker_name = match self.broker.cluster_view() {
            Some(c) => c.set.clone(),
            None => self.config.broker_name.clone(),
        };
        let store = self.broker.store();
        let offsets = store.offsets();
        let queues: Vec<(String, u32, u64)> = if topic.is_empty() {
            offsets
                .group_offsets(group)
                .into_iter()
                .map(|(t, q, o)| (t, q, o.offset))
                .collect()
        } else {
            let n = self
                .broker
                .topics()
                .get(topic)
                .map_or(0, |t| match self.broker.own_set() {
                    Some(set) if !t.placement.is_empty() => t.queues_on(set),
                    _ => t.partitions,
                });
            (0..n)
                .map(|q| {
                    (
                        topic.to_string(),
                        q,
                        offsets.get(group, topic, q).map_or(0, |o| o.offset),
                    )
                })
                .collect()
        };
        let table: Vec<(MessageQueue, OffsetWrapper)> = queues
            .into_iter()
            .map(|(t, q, o)| {
                let end = store.max_offset(&t, q);
                (
                    MessageQueue {
                        broker_name: broker_name.clone(),
                        queue_id: q,
                        topic: t,
                    },
                    OffsetWrapper {
                        broker_offset: end,
                        consumer_offset: o,
                        pull_offset: o,
                        last_timestamp: 0,
                    },
                )
            })
            .collect();
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = Bytes::from(crate::remote_offsets::encode_consume_stats(&table));
        r
    }

    fn all_topic_config(&self, req: &RemotingCommand) -> RemotingCommand {
        let mut table = serde_json::Map::new();
        for (name, t) in self.broker.topics().all() {
            table.insert(
                name.clone(),
                json!({"topicName": name, "readQueueNums": t.partitions, "writeQueueNums": t.partitions,
                       "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": false, "attributes": {}}),
            );
        }
        self.json_body(
            req,
            json!({"topicConfigTable": table, "dataVersion": {"counter": 0, "stateVersion": 0, "timestamp": 0}}),
        )
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

    /// Pulls may be held by long polling, sends wait for the flush in
    /// sync mode, and another set's transaction calls wait for markers and
    /// replication; everything else finishes at once.
    fn inline(&self, cmd: &RemotingCommand) -> bool {
        match cmd.code {
            // User changes fsync users.json and, in cluster mode, wait for etcd.
            rq::PULL_MESSAGE
            | rq::LITE_PULL_MESSAGE
            | rq::ROKKA_TXN_JOIN
            | rq::ROKKA_TXN_END
            | rq::AUTH_CREATE_USER
            | rq::AUTH_UPDATE_USER
            | rq::AUTH_DELETE_USER => false,
            rq::SEND_MESSAGE | rq::SEND_MESSAGE_V2 | rq::SEND_BATCH_MESSAGE => {
                self.broker.store().config().flush_mode == rokka_store::FlushMode::Async
            }
            _ => true,
        }
    }
}

/// What the broker reads from a HEART_BEAT body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub client_id: String,
    /// `producerDataSet[].groupName`.
    pub producer_groups: Vec<String>,
    /// `consumerDataSet[]` entries that name their group.
    pub consumers: Vec<HeartbeatConsumer>,
}

/// One `consumerDataSet` entry of a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatConsumer {
    pub group: String,
    /// False for BROADCASTING (by name, or ordinal 0 as C++ clients send it).
    pub clustering: bool,
    /// (topic, expression, expression type) of each subscription naming a
    /// topic; the expression defaults to `*`, the type to `TAG`.
    pub subscriptions: Vec<(String, String, String)>,
}

/// The elements of the array `v[k]` (none when it is missing or not an array).
fn json_list<'a>(v: &'a Value, k: &str) -> impl Iterator<Item = &'a Value> {
    v.get(k).and_then(Value::as_array).into_iter().flatten()
}

/// Parses a HEART_BEAT body; the error is the response's remark.
pub fn parse_heartbeat(body: &[u8]) -> Result<Heartbeat, &'static str> {
    let body = serde_json::from_slice::<Value>(body).map_err(|_| "heartbeat body is not JSON")?;
    let client_id = body
        .get("clientID")
        .and_then(Value::as_str)
        .map(String::from)
        .ok_or("heartbeat without clientID")?;
    let producer_groups = json_list(&body, "producerDataSet")
        .filter_map(|p| p.get("groupName").and_then(Value::as_str).map(String::from))
        .collect();
    let consumers = json_list(&body, "consumerDataSet")
        .filter_map(|cd| {
            let group = cd.get("groupName").and_then(Value::as_str)?.to_string();
            let model = cd.get("messageModel");
            let clustering = !matches!(model, Some(Value::String(s)) if s == "BROADCASTING")
                && !matches!(model, Some(Value::Number(n)) if n.as_i64() == Some(0));
            let subscriptions = json_list(cd, "subscriptionDataSet")
                .filter_map(|s| {
                    let topic = s.get("topic").and_then(Value::as_str)?.to_string();
                    let expression = s.get("subString").and_then(Value::as_str).unwrap_or("*").to_string();
                    let kind = s
                        .get("expressionType")
                        .and_then(Value::as_str)
                        .unwrap_or("TAG")
                        .to_string();
                    Some((topic, expression, kind))
                })
                .collect();
            Some(HeartbeatConsumer {
                group,
                clustering,
                subscriptions,
            })
        })
        .collect();
    Ok(Heartbeat {
        client_id,
        producer_groups,
        consumers,
    })
}

/// A LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body.
#[derive(Debug, Clone, PartialEq)]
pub struct LockBatch {
    pub group: String,
    pub client: String,
    /// (topic, queue id, the queue as sent: echoed back when granted) of
    /// each `mqSet` entry with a numeric queue id.
    pub queues: Vec<(String, i64, Value)>,
}

/// Parses a lock or unlock body; the error is the response's remark.
pub fn parse_lock_batch(body: &[u8]) -> Result<LockBatch, &'static str> {
    let body = serde_json::from_slice::<Value>(body).map_err(|_| "lock body is not JSON")?;
    let group = body["consumerGroup"].as_str().unwrap_or_default().to_string();
    let client = body["clientId"].as_str().unwrap_or_default().to_string();
    if group.is_empty() || client.is_empty() {
        return Err("consumerGroup and clientId are required");
    }
    let queues = body["mqSet"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|mq| {
            let queue = mq["queueId"].as_i64()?;
            Some((mq["topic"].as_str().unwrap_or_default().to_string(), queue, mq.clone()))
        })
        .collect();
    Ok(LockBatch { group, client, queues })
}

/// Splits a SEND_BATCH_MESSAGE body (§4.4) into (flag, body, properties).
pub fn split_batch(body: &[u8]) -> Option<Vec<(i32, Bytes, String)>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    let be32 = |b: &[u8], i: usize| b.get(i..i + 4).map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]]));
    while at < body.len() {
        // A negative TOTALSIZE is refused, not wrapped into a huge length.
        let total = usize::try_from(be32(body, at)?).ok()?;
        let flag = be32(body, at + 12)?;
        let blen = be32(body, at + 16)?;
        if blen < 0 || total < 22 {
            return None;
        }
        let b0 = at + 20;
        let b1 = b0.checked_add(blen as usize)?;
        let msg = Bytes::copy_from_slice(body.get(b0..b1)?);
        let plen = body.get(b1..b1 + 2).map(|x| i16::from_be_bytes([x[0], x[1]]))?;
        if plen < 0 {
            return None;
        }
        let props = body.get(b1 + 2..b1 + 2 + plen as usize)?;
        out.push((flag, msg, String::from_utf8_lossy(props).into_owned()));
        if at.checked_add(total)? > body.len() || total != 22 + blen as usize + plen as usize {
            return None;
        }
        at += total;
    }
    (!out.is_empty()).then_some(out)
}

/// Whether a stored Kafka batch belongs to an aborted Kafka transaction.
fn aborted_batch(
    txns: &rokka_broker::kafka_txn::KafkaTxns,
    topic: &str,
    q: u32,
    b: &rokka_store::record::kafka::KafkaBatchView,
) -> bool {
    match rokka_store::record::kafka::BatchInfo::parse(&b.batch) {
        Ok(info) if info.attributes & 0x10 != 0 => txns.is_aborted(topic, q, info.producer_id, b.queue_offset),
        _ => false,
    }
}

/// The send status for a stored message that could not be made durable:
/// FLUSH_DISK_TIMEOUT (10) for the local disk, SLAVE_NOT_AVAILABLE (11)
/// when too few replicas are in sync, FLUSH_SLAVE_TIMEOUT (12) when they
/// did not acknowledge in time, as a RocketMQ SYNC_MASTER answers.
fn durable_code(e: &rokka_store::StoreError) -> i32 {
    match e {
        rokka_store::StoreError::NotEnoughReplicas | rokka_store::StoreError::NotLeader => rs::SLAVE_NOT_AVAILABLE,
        rokka_store::StoreError::ReplicationTimeout(_) => rs::FLUSH_SLAVE_TIMEOUT,
        _ => rs::FLUSH_DISK_TIMEOUT,
    }
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
                        subscriptions: vec![("t".into(), "A||B".into(), "TAG".into())],
                    },
                    HeartbeatConsumer {
                        group: "h".into(),
                        clustering: true,
                        subscriptions: vec![("u".into(), "*".into(), "SQL92".into())],
                    },
                ],
            })
        );
        assert_eq!(parse_heartbeat(b"{}"), Err("heartbeat without clientID"));
        assert_eq!(parse_heartbeat(b"{"), Err("heartbeat body is not JSON"));
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
