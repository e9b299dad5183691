//! The name-server port: serves the route table of `rokka-namesrv`, fed by
//! REGISTER_BROKER (brokers register every `register_interval_ms` and when
//! their topics change; one silent for its `heartbeatTimeoutMillis`, default
//! `broker_timeout_ms`, or whose registering connection closes is dropped).
//! Each registration (cluster, broker name, broker id, address) is live,
//! expires and is dropped on its own (see `rokka-namesrv`): two broker names
//! on one address never share a heartbeat or a connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
pub use rokka_namesrv::{BrokerKey, Registration, RouteTable, TopicConf};
use serde_json::{json, Value};

use crate::codes::{request as rq, response as rs};
use crate::command::{RemotingCommand, FLAG_ONEWAY};
use crate::config::RocketMqConfig;
use crate::processor::RocketMq;
use crate::server::{Conn, Service};

/// Longest cluster, broker or address name a registration may carry.
const MAX_NAME_BYTES: usize = 255;
/// Longest topic: retry topics carry a group's name, pop retry topics a
/// group's and a topic's (`%RETRY%<group>+<topic>`).
const MAX_TOPIC_BYTES: usize = 512;
/// Most topics one registration may list (as `broker.max_topics`).
const MAX_TOPICS_PER_BROKER: usize = 100_000;

/// A REGISTER_BROKER body as brokers send it: typed, so a body of many
/// small objects costs about its own size (a generic JSON value cost ~100
/// times it), and a topic table past [`MAX_TOPICS_PER_BROKER`] is refused
/// while it is read.
mod reg_wire {
    use serde::Deserialize;

    #[derive(Deserialize)]
    pub struct Body {
        #[serde(rename = "topicConfigSerializeWrapper", default)]
        pub wrapper: Option<Wrapper>,
    }

    #[derive(Deserialize, Default)]
    pub struct Wrapper {
        #[serde(rename = "dataVersion", default)]
        pub data_version: Option<DataVersion>,
        #[serde(rename = "topicConfigTable", default)]
        pub table: Table,
    }

    #[derive(Deserialize)]
    pub struct DataVersion {
        pub counter: Option<u64>,
    }

    #[derive(Deserialize)]
    pub struct Topic {
        #[serde(rename = "readQueueNums")]
        pub read_queues: Option<u64>,
        #[serde(rename = "writeQueueNums")]
        pub write_queues: Option<u64>,
        pub perm: Option<u64>,
        #[serde(rename = "topicSysFlag")]
        pub sys_flag: Option<u64>,
    }

    /// The topic table, in the order sent, at most MAX_TOPICS_PER_BROKER + 1
    /// entries (one more is refused after).
    #[derive(Default)]
    pub struct Table(pub Vec<(String, Topic)>);

    impl<'de> Deserialize<'de> for Table {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Table, D::Error> {
            struct V;
            impl<'de> serde::de::Visitor<'de> for V {
                type Value = Table;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a topic table")
                }
                fn visit_unit<E: serde::de::Error>(self) -> Result<Table, E> {
                    Ok(Table::default())
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Table, A::Error> {
                    let mut out = Vec::new();
                    while let Some(entry) = a.next_entry::<String, Topic>()? {
                        if out.len() > super::MAX_TOPICS_PER_BROKER {
                            return Err(serde::de::Error::custom("more topics than a broker may register"));
                        }
                        out.push(entry);
                    }
                    Ok(Table(out))
                }
            }
            d.deserialize_any(V)
        }
    }
}
/// Longest heartbeat timeout a registration may ask for.
const MAX_HEARTBEAT_TIMEOUT_MS: u64 = 3_600_000;

/// REGISTER_BROKER frames ⇄ [`Registration`]s.
pub mod wire {
    use super::*;

    /// Ext field of a registration listing every topic the broker holds
    /// (Rokka's): only such a one removes the topics it no longer lists.
    pub const EXT_FULL: &str = "rokkaFullRegistration";

    /// The REGISTER_BROKER request a broker sends to an external name server.
    pub fn to_command(reg: &Registration, opaque: i32, version: i32) -> RemotingCommand {
        let mut table = serde_json::Map::new();
        for t in &reg.topics {
            table.insert(
                t.name.clone(),
                json!({"topicName": t.name, "readQueueNums": t.read_queues, "writeQueueNums": t.write_queues,
                       "perm": t.perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": t.sys_flag,
                       "order": false, "attributes": {}}),
            );
        }
        let body = json!({
            "topicConfigSerializeWrapper": {
                "topicConfigTable": table,
                "dataVersion": {"counter": reg.data_version, "stateVersion": 0, "timestamp": 0},
            },
            "filterServerList": [],
        })
        .to_string();
        let mut c = RemotingCommand::request(rq::REGISTER_BROKER, opaque);
        c.version = version;
        c.ext_fields.set("brokerName", reg.broker_name.as_str());
        c.ext_fields.set("brokerAddr", reg.broker_addr.as_str());
        c.ext_fields.set("clusterName", reg.cluster.as_str());
        c.ext_fields.set("haServerAddr", reg.ha_addr.as_str());
        c.ext_fields.set("brokerId", reg.broker_id.to_string());
        if let Some(t) = reg.timeout_ms {
            c.ext_fields.set("heartbeatTimeoutMillis", t.to_string());
        }
        c.ext_fields.set("compressed", "false");
        if reg.full {
            c.ext_fields.set(EXT_FULL, "true");
        }
        c.ext_fields.set(
            "bodyCrc32",
            (crc32fast::hash(body.as_bytes()) & 0x7FFF_FFFF).to_string(),
        );
        c.body = Bytes::from(body);
        c
    }

    /// Decodes a REGISTER_BROKER request (plain JSON body only).
    pub fn from_command(cmd: &RemotingCommand) -> Result<Registration, String> {
        let f = |k: &str| cmd.ext_fields.get(k).map(str::trim).filter(|v| !v.is_empty());
        let need = |k: &str| {
            f(k).map(String::from)
                .ok_or_else(|| format!("REGISTER_BROKER without {k}"))
        };
        if f("compressed") == Some("true") {
            return Err("compressed REGISTER_BROKER bodies are not supported; set compressedRegister=false".into());
        }
        let crc = f("bodyCrc32").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        if crc != 0 && crc != i64::from(crc32fast::hash(&cmd.body) & 0x7FFF_FFFF) {
            return Err("REGISTER_BROKER body CRC mismatch".into());
        }
        let mut topics = Vec::new();
        let mut data_version = 0;
        if !cmd.body.is_empty() {
            let body: reg_wire::Body =
                serde_json::from_slice(&cmd.body).map_err(|e| format!("REGISTER_BROKER body: {e}"))?;
            let wrapper = body.wrapper.unwrap_or_default();
            data_version = wrapper.data_version.and_then(|d| d.counter).unwrap_or(0);
            for (name, t) in wrapper.table.0 {
                let n = |v: Option<u64>| v.unwrap_or(0) as u32;
                topics.push(TopicConf {
                    name,
                    read_queues: n(t.read_queues),
                    write_queues: n(t.write_queues),
                    perm: t.perm.unwrap_or(6) as u32,
                    sys_flag: n(t.sys_flag),
                });
            }
        }
        let r = Registration {
            cluster: need("clusterName")?,
            broker_name: need("brokerName")?,
            broker_addr: need("brokerAddr")?,
            broker_id: f("brokerId").and_then(|v| v.parse().ok()).unwrap_or(0),
            ha_addr: f("haServerAddr").unwrap_or_default().to_string(),
            // A broker's own heartbeat timeout, within reason (it holds the
            // registration that long after the broker went silent).
            timeout_ms: f("heartbeatTimeoutMillis")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|t| t.clamp(1_000, MAX_HEARTBEAT_TIMEOUT_MS)),
            data_version,
            topics,
            full: f(EXT_FULL) == Some("true"),
        };
        // What the route table keeps is bounded: names as RocketMQ bounds
        // them, the topics a broker may hold.
        let long = |s: &str| s.len() > MAX_NAME_BYTES;
        if long(&r.cluster) || long(&r.broker_name) || long(&r.broker_addr) || long(&r.ha_addr) {
            return Err("REGISTER_BROKER with a cluster, broker name or address longer than 255 bytes".into());
        }
        if r.topics.len() > MAX_TOPICS_PER_BROKER {
            return Err(format!("REGISTER_BROKER with more than {MAX_TOPICS_PER_BROKER} topics"));
        }
        if r.topics
            .iter()
            .any(|t| t.name.is_empty() || t.name.len() > MAX_TOPIC_BYTES)
        {
            return Err("REGISTER_BROKER with an empty topic name or one longer than 512 bytes".into());
        }
        Ok(r)
    }
}

/// The name-server port's request handler.
#[derive(Debug)]
pub struct NameServer {
    config: RocketMqConfig,
    table: Mutex<RouteTable>,
    epoch: Instant,
    /// The broker in this process when it registers here directly.
    local: Option<Arc<RocketMq>>,
    /// Topic-table version of the local broker's last registration.
    local_version: AtomicU64,
    limits: crate::server::Limits,
    /// Cluster mode: the broker of this node, whose topic table (kept from
    /// the cluster's) completes routes the registrations have not caught
    /// up with yet.
    cluster: Option<Arc<rokka_broker::Broker>>,
    /// Route requests reading the cluster's table at once (a topic not in
    /// this node's table yet); more are answered from the registrations.
    lookups: tokio::sync::Semaphore,
}

impl NameServer {
    pub fn new(config: RocketMqConfig, local: Option<Arc<RocketMq>>) -> NameServer {
        NameServer {
            limits: crate::server::Limits::new("rocketmq_namesrv", &config),
            lookups: tokio::sync::Semaphore::new(config.namesrv_route_lookups as usize),
            config,
            table: Mutex::new(RouteTable::default()),
            epoch: Instant::now(),
            local,
            local_version: AtomicU64::new(u64::MAX),
            cluster: None,
        }
    }

    /// Cluster mode: routes also come from `broker`'s topic table, which
    /// follows the cluster's (a topic created on any node is routed here
    /// as soon as this node or etcd knows it, not only once every set's
    /// master has registered it again).
    pub fn with_cluster(mut self, broker: Arc<rokka_broker::Broker>) -> NameServer {
        self.cluster = Some(broker);
        self
    }

    /// GET_ROUTEINFO_BY_TOPIC's route.
    async fn route(&self, topic: &str) -> Option<Value> {
        let Some(b) = &self.cluster else {
            return self.table().route(topic);
        };
        // Each set's master as the cluster sees it, for a set whose master
        // has not registered here yet (a node just started or elected).
        // Built only for a route that uses it.
        let masters = || -> std::collections::BTreeMap<String, (String, String)> {
            b.cluster_view()
                .map(|v| {
                    v.sets
                        .iter()
                        .filter_map(|s| {
                            let addr = v.node(s.master?)?.broker.clone();
                            (!addr.is_empty()).then(|| (s.name.clone(), (self.config.cluster_name.clone(), addr)))
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        if let Some(known) = b.topic_sets(topic) {
            return self.table().route_with(topic, &known, &masters());
        }
        // Not in this node's table yet: the cluster's table may have it
        // (created elsewhere a moment ago; the registrations may then name
        // only the sets whose master registered it already), else the
        // registrations alone answer.
        let wait = std::time::Duration::from_millis(self.config.namesrv_route_lookup_timeout_ms.max(1));
        let Some(outcome) = b.look_up_cluster_topic(topic, &self.lookups, wait).await else {
            return self.table().route(topic);
        };
        let result = rokka_broker::LookupMiss::outcome_label(&outcome);
        rokka_broker::hot_metrics::count("rokka_rocketmq_namesrv_route_lookups_total", "result", result, 1);
        match (outcome, b.own_set()) {
            (Ok(info), Some(own)) => {
                let known = rokka_broker::TopicInfo::sets_of(&info.placement, own, info.partitions);
                self.table().route_with(topic, &known, &masters())
            }
            _ => self.table().route(topic),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn table(&self) -> std::sync::MutexGuard<'_, RouteTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `r` is a new registration and `namesrv_max_brokers` are
    /// registered already.
    fn full_for(&self, r: &Registration) -> bool {
        let max = self.config.namesrv_max_brokers as usize;
        let t = self.table();
        if max > 0 && t.broker_count() >= max && !t.is_registered(&r.broker_name, r.broker_id) {
            return true;
        }
        // Route entries over all registrations (each may list 100 000
        // topics): what a registration adds beyond what it replaces —
        // counted only when it may add (a periodic registration listing
        // no more than the last one does not: the count walks every topic).
        let most = self.config.namesrv_max_route_entries as usize;
        if most == 0 || (r.full && r.topics.len() <= t.listed_by(&r.broker_name)) {
            return false;
        }
        let replaced = if r.full { t.route_entries_of(&r.broker_name) } else { 0 };
        t.route_entries() - replaced + r.topics.len() > most
    }

    fn apply(&self, r: &Registration, peer: Option<SocketAddr>) {
        let now = self.now_ms();
        let mut t = self.table();
        let changed = t.register(r, now, self.config.broker_timeout_ms, peer);
        if changed {
            tracing::info!(
                broker = r.broker_name,
                addr = r.broker_addr,
                topics = r.topics.len(),
                "broker registered"
            );
            metrics::gauge!("rokka_rocketmq_namesrv_route_entries").set(t.route_entries() as f64);
        }
        metrics::gauge!("rokka_rocketmq_namesrv_brokers").set(t.broker_count() as f64);
    }

    /// The embedded broker's registration (periodic, and whenever its topics
    /// changed before a route is read, so routes never lag the broker).
    pub fn register_local(&self, force: bool) {
        let Some(b) = &self.local else {
            return;
        };
        let v = b.topic_version();
        if force || self.local_version.swap(v, Ordering::AcqRel) != v {
            self.apply(&b.registration(), None);
            metrics::counter!("rokka_rocketmq_broker_registrations_total").increment(1);
        }
    }

    /// Drops silent brokers (called every few seconds).
    pub fn expire_brokers(&self) {
        let now = self.now_ms();
        let mut t = self.table();
        for key in t.expire(now) {
            tracing::warn!(
                cluster = key.cluster,
                broker = key.broker_name,
                id = key.broker_id,
                addr = key.broker_addr,
                "broker expired: no registration within its heartbeat timeout"
            );
            metrics::counter!("rokka_rocketmq_namesrv_brokers_expired_total").increment(1);
        }
        metrics::gauge!("rokka_rocketmq_namesrv_brokers").set(t.broker_count() as f64);
    }

    /// UNREGISTER_BROKER: drops the registration it names, all four parts
    /// (a broker sharing the address under another name or id stays).
    fn unregister(&self, cmd: &RemotingCommand) {
        let f = |k: &str| cmd.ext_fields.get(k).unwrap_or_default().trim().to_string();
        let key = BrokerKey {
            cluster: f("clusterName"),
            broker_name: f("brokerName"),
            broker_id: f("brokerId").parse().unwrap_or(0),
            broker_addr: f("brokerAddr"),
        };
        let mut t = self.table();
        if t.unregister(&key) {
            tracing::info!(%key, "broker unregistered");
        } else {
            // (Counted; not logged above debug: anyone may send these.)
            tracing::debug!(%key, "UNREGISTER_BROKER names no live registration; ignored");
            metrics::counter!("rokka_rocketmq_namesrv_unregisters_ignored_total").increment(1);
        }
        metrics::gauge!("rokka_rocketmq_namesrv_brokers").set(t.broker_count() as f64);
        metrics::gauge!("rokka_rocketmq_namesrv_route_entries").set(t.route_entries() as f64);
    }

    fn reply(&self, req: &RemotingCommand, code: i32, remark: Option<String>) -> RemotingCommand {
        let mut r = req.response(code, self.config.server_version);
        r.remark = remark;
        r
    }

    fn json_body(&self, req: &RemotingCommand, v: Value) -> RemotingCommand {
        let mut r = self.reply(req, rs::SUCCESS, None);
        r.body = Bytes::from(v.to_string());
        r
    }

    /// Why the ACLs of the broker in this process refuse `cmd` (None: they
    /// allow it, authorization is off, or there is no broker here).
    fn refuses(&self, conn: &Conn, cmd: &RemotingCommand) -> Option<String> {
        let broker = self.local.as_ref().map(|l| l.broker()).or(self.cluster.as_ref());
        broker.and_then(|b| crate::auth::check(b, conn, cmd))
    }

    async fn handle(&self, cmd: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        self.register_local(false);
        match cmd.code {
            rq::GET_ROUTEINFO_BY_TOPIC => {
                let topic = cmd.ext_fields.get("topic").unwrap_or_default();
                match self.route(topic).await {
                    Some(v) => {
                        // Only where it changes what an old client reads:
                        // a broker with replicas (a lone "0" reads as id 0
                        // either way).
                        let standard = cmd.version >= STANDARD_JSON_VERSION
                            || cmd.ext_fields.get("acceptStandardJsonOnly") == Some("true")
                            || !has_replicas(&v);
                        let mut r = self.json_body(cmd, v);
                        if !standard {
                            r.body = Bytes::from(fastjson_broker_addrs(&String::from_utf8_lossy(&r.body)));
                        }
                        r
                    }
                    None => self.reply(
                        cmd,
                        rs::TOPIC_NOT_EXIST,
                        Some(format!("No topic route info in name server for the topic: {topic}")),
                    ),
                }
            }
            rq::GET_BROKER_CLUSTER_INFO => {
                let v = self.table().cluster_info();
                self.json_body(cmd, v)
            }
            rq::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => {
                let v = self.table().topic_list(None);
                self.json_body(cmd, json!({"topicList": v}))
            }
            // (No brokerAddr: given one, clients go on to ask the broker
            // for its own system topics, which it does not list.)
            rq::GET_SYSTEM_TOPIC_LIST_FROM_NS => {
                let v = self.table().system_topic_list();
                self.json_body(cmd, json!({"topicList": v}))
            }
            rq::GET_TOPICS_BY_CLUSTER => {
                let v = self
                    .table()
                    .topic_list(Some(cmd.ext_fields.get("cluster").unwrap_or_default()));
                self.json_body(cmd, json!({"topicList": v}))
            }
            rq::DELETE_TOPIC_IN_NAMESRV => {
                if let Some(remark) = self.refuses(conn, cmd) {
                    return self.reply(cmd, crate::auth::NO_PERMISSION, Some(remark));
                }
                self.table().delete_topic_in(
                    cmd.ext_fields.get("topic").unwrap_or_default(),
                    cmd.ext_fields.get("clusterName").unwrap_or_default(),
                );
                self.reply(cmd, rs::SUCCESS, None)
            }
            rq::GET_KVLIST_BY_NAMESPACE => {
                if let Some(remark) = self.refuses(conn, cmd) {
                    return self.reply(cmd, crate::auth::NO_PERMISSION, Some(remark));
                }
                let ns = cmd.ext_fields.get("namespace").unwrap_or_default();
                let table = self.table().kv_list(ns).cloned();
                match table {
                    Some(t) => self.json_body(cmd, json!({ "table": t })),
                    None => self.reply(
                        cmd,
                        rs::QUERY_NOT_FOUND,
                        Some(format!("No config item, Namespace: {ns}")),
                    ),
                }
            }
            rq::GET_KV_CONFIG => {
                if let Some(remark) = self.refuses(conn, cmd) {
                    return self.reply(cmd, crate::auth::NO_PERMISSION, Some(remark));
                }
                let (ns, key) = (
                    cmd.ext_fields.get("namespace").unwrap_or_default(),
                    cmd.ext_fields.get("key").unwrap_or_default(),
                );
                let value = self.table().get_kv(ns, key).map(str::to_string);
                match value {
                    Some(v) => {
                        let mut r = self.reply(cmd, rs::SUCCESS, None);
                        r.ext_fields.set("value", v);
                        r
                    }
                    None => self.reply(
                        cmd,
                        rs::QUERY_NOT_FOUND,
                        Some(format!("No config item, Namespace: {ns} Key: {key}")),
                    ),
                }
            }
            // Admin changes: with authorization on, who may alter the cluster.
            rq::PUT_KV_CONFIG | rq::DELETE_KV_CONFIG | rq::WIPE_WRITE_PERM_OF_BROKER | rq::ADD_WRITE_PERM_OF_BROKER => {
                if let Some(remark) = self.refuses(conn, cmd) {
                    return self.reply(cmd, crate::auth::NO_PERMISSION, Some(remark));
                }
                let f = |k: &str| cmd.ext_fields.get(k).unwrap_or_default();
                let mut t = self.table();
                match cmd.code {
                    rq::PUT_KV_CONFIG => match t.put_kv(f("namespace"), f("key"), f("value")) {
                        Ok(()) => self.reply(cmd, rs::SUCCESS, None),
                        Err(e) => self.reply(cmd, rs::SYSTEM_ERROR, Some(e)),
                    },
                    rq::DELETE_KV_CONFIG => {
                        t.delete_kv(f("namespace"), f("key"));
                        self.reply(cmd, rs::SUCCESS, None)
                    }
                    code => {
                        let name = f("brokerName");
                        let (n, field) = if code == rq::WIPE_WRITE_PERM_OF_BROKER {
                            (t.wipe_write_perm(name), "wipeTopicCount")
                        } else {
                            (t.add_write_perm(name), "addTopicCount")
                        };
                        tracing::info!(broker = name, topics = n, code, "broker write permission changed");
                        let mut r = self.reply(cmd, rs::SUCCESS, None);
                        r.ext_fields.set(field, n.to_string());
                        r
                    }
                }
            }
            // With a broker (and so an ACL table) in this process and
            // authorization on, only who may act as the cluster registers
            // or unregisters a broker (a name server alone, as RocketMQ's,
            // takes any: keep it on a trusted network).
            rq::REGISTER_BROKER | rq::UNREGISTER_BROKER => {
                if let Some(remark) = self.refuses(conn, cmd) {
                    return self.reply(cmd, crate::auth::NO_PERMISSION, Some(remark));
                }
                if cmd.code == rq::UNREGISTER_BROKER {
                    self.unregister(cmd);
                    return self.reply(cmd, rs::SUCCESS, None);
                }
                match wire::from_command(cmd) {
                    Ok(r) if self.full_for(&r) => {
                        metrics::counter!("rokka_rocketmq_namesrv_registrations_refused_total").increment(1);
                        let (max, most) = (self.config.namesrv_max_brokers, self.config.namesrv_max_route_entries);
                        self.reply(
                            cmd,
                            rs::SYSTEM_ERROR,
                            Some(format!(
                                "too many brokers or routes registered (rocketmq.namesrv_max_brokers = {max}, namesrv_max_route_entries = {most})"
                            )),
                        )
                    }
                    Ok(r) => {
                        self.apply(&r, Some(conn.peer));
                        let mut resp = self.reply(cmd, rs::SUCCESS, None);
                        resp.ext_fields.set("haServerAddr", "");
                        resp.ext_fields.set("masterAddr", "");
                        resp
                    }
                    Err(e) => {
                        // (Counted; the remark tells the sender. Not logged
                        // above debug: anyone reaching the port may send these.)
                        tracing::debug!(peer = %conn.peer, error = e, "bad REGISTER_BROKER");
                        metrics::counter!("rokka_rocketmq_namesrv_registrations_malformed_total").increment(1);
                        self.reply(cmd, rs::SYSTEM_ERROR, Some(e))
                    }
                }
            }
            other => self.reply(
                cmd,
                rs::REQUEST_CODE_NOT_SUPPORTED,
                Some(format!(" request type {other} not supported")),
            ),
        }
    }
}

impl Service for NameServer {
    async fn process(&self, cmd: RemotingCommand, conn: &Conn) -> Option<RemotingCommand> {
        let started = Instant::now();
        rokka_broker::hot_metrics::count(
            "rokka_rocketmq_requests_total",
            "code",
            crate::codes::label(cmd.code),
            1,
        );
        let oneway = cmd.flag & FLAG_ONEWAY != 0;
        let resp = self.handle(&cmd, conn).await;
        rokka_broker::hot_metrics::record(
            "rokka_rocketmq_request_seconds",
            "code",
            crate::codes::label(cmd.code),
            started.elapsed().as_secs_f64(),
        );
        (!oneway).then_some(resp)
    }

    fn max_frame_bytes(&self) -> usize {
        self.config.max_frame_bytes as usize
    }

    fn limits(&self) -> &crate::server::Limits {
        &self.limits
    }

    fn inline(&self, _cmd: &RemotingCommand) -> bool {
        true
    }

    fn connection_closed(&self, conn: &Conn) {
        let mut t = self.table();
        let gone = t.channel_closed(conn.peer);
        if gone.is_empty() {
            return;
        }
        for key in &gone {
            tracing::info!(%key, peer = %conn.peer, "broker's name-server connection closed: unregistered");
        }
        metrics::counter!("rokka_rocketmq_namesrv_brokers_closed_total").increment(gone.len() as u64);
        metrics::gauge!("rokka_rocketmq_namesrv_brokers").set(t.broker_count() as f64);
    }
}

/// The first client version (V4_9_4) Apache's name server answers routes
/// to in standard JSON; to earlier ones (and without
/// acceptStandardJsonOnly) it writes fastjson's default form.
const STANDARD_JSON_VERSION: i32 = 401;

/// Whether a route names a broker with more than its master.
fn has_replicas(route: &Value) -> bool {
    route["brokerDatas"].as_array().is_some_and(|b| {
        b.iter()
            .any(|d| d["brokerAddrs"].as_object().is_some_and(|a| a.len() > 1))
    })
}

/// A route in fastjson's default form: `brokerAddrs` keyed by bare numbers
/// (`{0:"host:port"}`), as Apache's name server answers clients before
/// V4_9_4 — rocketmq-client-go up to 2.1.1 reads every quoted key as
/// broker id 0, so a replica's address could pass for the master's.
fn fastjson_broker_addrs(json: &str) -> String {
    const KEY: &str = "\"brokerAddrs\":{";
    let mut out = String::with_capacity(json.len());
    let mut rest = json;
    while let Some(i) = rest.find(KEY) {
        out.push_str(&rest[..i + KEY.len()]);
        rest = &rest[i + KEY.len()..];
        // "<digits>":"<address>" pairs up to the closing brace.
        while let Some(after) = rest.strip_prefix('"') {
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || !after[digits..].starts_with("\":") {
                break;
            }
            out.push_str(&after[..digits]);
            out.push(':');
            rest = &after[digits + 2..];
            // The value: a JSON string (addresses hold no quote, but an
            // escape is stepped over all the same).
            let Some(v) = rest.strip_prefix('"') else { break };
            let mut end = None;
            let mut esc = false;
            for (j, c) in v.char_indices() {
                match c {
                    _ if esc => esc = false,
                    '\\' => esc = true,
                    '"' => {
                        end = Some(j);
                        break;
                    }
                    _ => {}
                }
            }
            let Some(end) = end else { break };
            out.push_str(&rest[..end + 2]);
            rest = &rest[end + 2..];
            match rest.strip_prefix(',') {
                Some(r) => {
                    out.push(',');
                    rest = r;
                }
                None => break,
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_round_trips_through_the_wire_form() -> Result<(), String> {
        let topic = |name: &str, n: u32| TopicConf {
            name: name.into(),
            read_queues: n,
            write_queues: n,
            perm: 6,
            sys_flag: 0,
        };
        let r = Registration {
            cluster: "C".into(),
            broker_name: "b".into(),
            broker_addr: "127.0.0.1:1".into(),
            broker_id: 0,
            ha_addr: String::new(),
            timeout_ms: Some(5000),
            data_version: 7,
            topics: vec![topic("T", 4), topic("U", 2)],
            full: true,
        };
        let cmd = wire::to_command(&r, 1, 479);
        let mut back = wire::from_command(&cmd)?;
        back.topics.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(back, r);
        let mut bad = cmd.clone();
        bad.body = Bytes::from(format!("{} ", String::from_utf8_lossy(&cmd.body)));
        assert!(wire::from_command(&bad).is_err(), "CRC must be checked");
        // What the table would keep is bounded: names, topic names, the
        // heartbeat timeout (clamped).
        for long in [
            Registration {
                broker_name: "b".repeat(256),
                ..r.clone()
            },
            Registration {
                cluster: "c".repeat(256),
                ..r.clone()
            },
            Registration {
                topics: vec![topic(&"t".repeat(513), 1)],
                ..r.clone()
            },
        ] {
            assert!(wire::from_command(&wire::to_command(&long, 1, 479)).is_err());
        }
        let slow = Registration {
            timeout_ms: Some(u64::MAX / 2),
            ..r.clone()
        };
        let back = wire::from_command(&wire::to_command(&slow, 1, 479))?;
        assert_eq!(back.timeout_ms, Some(MAX_HEARTBEAT_TIMEOUT_MS));
        Ok(())
    }

    #[test]
    fn routes_to_old_clients_key_broker_addresses_by_bare_numbers() {
        let v = serde_json::json!({"brokerDatas": [{"brokerAddrs": {"0": "10.0.0.1:10911", "1": "10.0.0.2:10911"},
            "brokerName": "b"}, {"brokerAddrs": {}, "brokerName": "c"}], "queueDatas": []});
        let s = fastjson_broker_addrs(&v.to_string());
        assert!(
            s.contains(r#""brokerAddrs":{0:"10.0.0.1:10911",1:"10.0.0.2:10911"}"#),
            "{s}"
        );
        assert!(s.contains(r#""brokerAddrs":{}"#), "{s}");
        assert!(
            s.contains(r#""brokerName":"b""#) && s.ends_with(r#""queueDatas":[]}"#),
            "{s}"
        );
    }
}
