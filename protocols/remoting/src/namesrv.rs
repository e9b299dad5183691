//! The name server: a route table fed by REGISTER_BROKER and read by clients
//! (digest §2.11, `RouteInfoManager.java`). Brokers register every
//! `register_interval_ms` and when their topics change; one silent for its
//! `heartbeatTimeoutMillis` (default `broker_timeout_ms`, 120 s) or whose
//! registering connection closes is dropped.
//!
//! Unlike Apache RocketMQ's default (`deleteTopicWithBrokerRegistration =
//! false`), a master's registration is authoritative for its topics: a topic
//! missing from it is gone from that broker's routes (Rokka deletes topics
//! through Kafka's DeleteTopics as well, and the route must follow).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::codes::{request as rq, response as rs};
use crate::command::{RemotingCommand, FLAG_ONEWAY};
use crate::config::RocketMqConfig;
use crate::processor::RocketMq;
use crate::server::{Conn, Service};

/// A topic as a broker registers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConf {
    pub name: String,
    pub read_queues: u32,
    pub write_queues: u32,
    pub perm: u32,
    pub sys_flag: u32,
}

/// One REGISTER_BROKER, decoded (or built by the embedded broker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub cluster: String,
    pub broker_name: String,
    pub broker_addr: String,
    pub broker_id: i64,
    pub ha_addr: String,
    pub timeout_ms: Option<u64>,
    pub data_version: u64,
    pub topics: Vec<TopicConf>,
}

impl Registration {
    /// The REGISTER_BROKER request a broker sends to an external name server.
    pub fn to_command(&self, opaque: i32, version: i32) -> RemotingCommand {
        let mut table = serde_json::Map::new();
        for t in &self.topics {
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
                "dataVersion": {"counter": self.data_version, "stateVersion": 0, "timestamp": 0},
            },
            "filterServerList": [],
        })
        .to_string();
        let mut c = RemotingCommand::request(rq::REGISTER_BROKER, opaque);
        c.version = version;
        c.ext_fields.set("brokerName", self.broker_name.as_str());
        c.ext_fields.set("brokerAddr", self.broker_addr.as_str());
        c.ext_fields.set("clusterName", self.cluster.as_str());
        c.ext_fields.set("haServerAddr", self.ha_addr.as_str());
        c.ext_fields.set("brokerId", self.broker_id.to_string());
        if let Some(t) = self.timeout_ms {
            c.ext_fields.set("heartbeatTimeoutMillis", t.to_string());
        }
        c.ext_fields.set("compressed", "false");
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
            let body: Value = serde_json::from_slice(&cmd.body).map_err(|e| format!("REGISTER_BROKER body: {e}"))?;
            let wrapper = &body["topicConfigSerializeWrapper"];
            data_version = wrapper["dataVersion"]["counter"].as_u64().unwrap_or(0);
            if let Some(table) = wrapper["topicConfigTable"].as_object() {
                for (name, t) in table {
                    let n = |k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0) as u32;
                    topics.push(TopicConf {
                        name: name.clone(),
                        read_queues: n("readQueueNums"),
                        write_queues: n("writeQueueNums"),
                        perm: t.get("perm").and_then(Value::as_u64).unwrap_or(6) as u32,
                        sys_flag: n("topicSysFlag"),
                    });
                }
            }
        }
        Ok(Registration {
            cluster: need("clusterName")?,
            broker_name: need("brokerName")?,
            broker_addr: need("brokerAddr")?,
            broker_id: f("brokerId").and_then(|v| v.parse().ok()).unwrap_or(0),
            ha_addr: f("haServerAddr").unwrap_or_default().to_string(),
            timeout_ms: f("heartbeatTimeoutMillis").and_then(|v| v.parse().ok()),
            data_version,
            topics,
        })
    }
}

#[derive(Debug)]
struct BrokerEntry {
    cluster: String,
    addrs: BTreeMap<i64, String>,
}

#[derive(Debug)]
struct Live {
    last_ms: u64,
    timeout_ms: u64,
    broker_name: String,
    broker_id: i64,
    peer: Option<SocketAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QueueData {
    read: u32,
    write: u32,
    perm: u32,
    sys_flag: u32,
}

/// The route table itself: no I/O, time passed in.
#[derive(Debug, Default)]
pub struct RouteTable {
    brokers: BTreeMap<String, BrokerEntry>,
    clusters: BTreeMap<String, BTreeSet<String>>,
    live: HashMap<String, Live>,
    /// topic → broker name → queues.
    topics: BTreeMap<String, BTreeMap<String, QueueData>>,
}

impl RouteTable {
    /// Applies a registration; true when the routes changed.
    pub fn register(
        &mut self,
        r: &Registration,
        now_ms: u64,
        default_timeout_ms: u64,
        peer: Option<SocketAddr>,
    ) -> bool {
        let entry = self
            .brokers
            .entry(r.broker_name.clone())
            .or_insert_with(|| BrokerEntry {
                cluster: r.cluster.clone(),
                addrs: BTreeMap::new(),
            });
        let mut changed = entry.addrs.insert(r.broker_id, r.broker_addr.clone()).as_ref() != Some(&r.broker_addr);
        entry.cluster = r.cluster.clone();
        self.clusters
            .entry(r.cluster.clone())
            .or_default()
            .insert(r.broker_name.clone());
        self.live.insert(
            r.broker_addr.clone(),
            Live {
                last_ms: now_ms,
                timeout_ms: r.timeout_ms.unwrap_or(default_timeout_ms),
                broker_name: r.broker_name.clone(),
                broker_id: r.broker_id,
                peer,
            },
        );
        if r.broker_id != 0 {
            // Only the master's topic configs make routes.
            return changed;
        }
        let mut listed = BTreeSet::new();
        for t in &r.topics {
            listed.insert(t.name.as_str());
            let q = QueueData {
                read: t.read_queues,
                write: t.write_queues,
                perm: t.perm,
                sys_flag: t.sys_flag,
            };
            let per = self.topics.entry(t.name.clone()).or_default();
            if per.insert(r.broker_name.clone(), q) != Some(q) {
                changed = true;
            }
        }
        self.topics.retain(|name, per| {
            if !listed.contains(name.as_str()) && per.remove(&r.broker_name).is_some() {
                changed = true;
            }
            !per.is_empty()
        });
        changed
    }

    /// Removes one broker address (UNREGISTER_BROKER, expiry, closed channel).
    pub fn unregister(&mut self, broker_name: &str, broker_addr: &str, broker_id: i64) {
        self.live.remove(broker_addr);
        let Some(entry) = self.brokers.get_mut(broker_name) else {
            return;
        };
        if entry.addrs.get(&broker_id).map(String::as_str) == Some(broker_addr) {
            entry.addrs.remove(&broker_id);
        }
        if broker_id == 0 || entry.addrs.is_empty() {
            // Without its master a broker's queues are not writable: drop them
            // (RocketMQ keeps slave-only read routes; Rokka has no slaves).
            self.topics.retain(|_, per| {
                per.remove(broker_name);
                !per.is_empty()
            });
        }
        if entry.addrs.is_empty() {
            let cluster = entry.cluster.clone();
            self.brokers.remove(broker_name);
            if let Some(c) = self.clusters.get_mut(&cluster) {
                c.remove(broker_name);
                if c.is_empty() {
                    self.clusters.remove(&cluster);
                }
            }
        }
    }

    /// Drops brokers silent past their timeout; their addresses.
    pub fn expire(&mut self, now_ms: u64) -> Vec<String> {
        let gone: Vec<(String, String, i64)> = self
            .live
            .iter()
            .filter(|(_, l)| l.last_ms.saturating_add(l.timeout_ms) < now_ms)
            .map(|(a, l)| (a.clone(), l.broker_name.clone(), l.broker_id))
            .collect();
        for (addr, name, id) in &gone {
            self.unregister(name, addr, *id);
        }
        gone.into_iter().map(|(a, _, _)| a).collect()
    }

    /// Drops the brokers that registered over a connection that closed.
    pub fn channel_closed(&mut self, peer: SocketAddr) -> Vec<String> {
        let gone: Vec<(String, String, i64)> = self
            .live
            .iter()
            .filter(|(_, l)| l.peer == Some(peer))
            .map(|(a, l)| (a.clone(), l.broker_name.clone(), l.broker_id))
            .collect();
        for (addr, name, id) in &gone {
            self.unregister(name, addr, *id);
        }
        gone.into_iter().map(|(a, _, _)| a).collect()
    }

    fn broker_data(&self, name: &str) -> Option<Value> {
        let b = self.brokers.get(name)?;
        let addrs: serde_json::Map<String, Value> = b
            .addrs
            .iter()
            .map(|(id, a)| (id.to_string(), Value::from(a.as_str())))
            .collect();
        Some(json!({"cluster": b.cluster, "brokerName": name, "brokerAddrs": addrs, "enableActingMaster": false}))
    }

    /// TopicRouteData of `topic`, if any broker serves it.
    pub fn route(&self, topic: &str) -> Option<Value> {
        let per = self.topics.get(topic)?;
        let queue_datas: Vec<Value> = per
            .iter()
            .map(|(b, q)| {
                json!({"brokerName": b, "perm": q.perm, "readQueueNums": q.read, "writeQueueNums": q.write,
                       "topicSysFlag": q.sys_flag, "topicSynFlag": q.sys_flag})
            })
            .collect();
        let broker_datas: Vec<Value> = per.keys().filter_map(|b| self.broker_data(b)).collect();
        if broker_datas.is_empty() {
            return None;
        }
        Some(json!({"brokerDatas": broker_datas, "filterServerTable": {}, "queueDatas": queue_datas}))
    }

    pub fn cluster_info(&self) -> Value {
        let brokers: serde_json::Map<String, Value> = self
            .brokers
            .keys()
            .filter_map(|n| Some((n.clone(), self.broker_data(n)?)))
            .collect();
        json!({"brokerAddrTable": brokers, "clusterAddrTable": self.clusters})
    }

    /// Topic names, optionally of one cluster's brokers.
    pub fn topic_list(&self, cluster: Option<&str>) -> Vec<String> {
        let members = cluster.map(|c| self.clusters.get(c).cloned().unwrap_or_default());
        self.topics
            .iter()
            .filter(|(_, per)| members.as_ref().is_none_or(|m| per.keys().any(|b| m.contains(b))))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Removes a topic from the routes (DELETE_TOPIC_IN_NAMESRV).
    pub fn delete_topic(&mut self, topic: &str) -> bool {
        self.topics.remove(topic).is_some()
    }

    pub fn broker_count(&self) -> usize {
        self.live.len()
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
}

impl NameServer {
    pub fn new(config: RocketMqConfig, local: Option<Arc<RocketMq>>) -> NameServer {
        NameServer {
            config,
            table: Mutex::new(RouteTable::default()),
            epoch: Instant::now(),
            local,
            local_version: AtomicU64::new(u64::MAX),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn table(&self) -> std::sync::MutexGuard<'_, RouteTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn apply(&self, r: &Registration, peer: Option<SocketAddr>) {
        let now = self.now_ms();
        let mut t = self.table();
        if t.register(r, now, self.config.broker_timeout_ms, peer) {
            tracing::info!(
                broker = r.broker_name,
                addr = r.broker_addr,
                topics = r.topics.len(),
                "broker registered"
            );
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
        for addr in t.expire(now) {
            tracing::warn!(addr, "broker expired: no registration within its heartbeat timeout");
            metrics::counter!("rokka_rocketmq_namesrv_brokers_expired_total").increment(1);
        }
        metrics::gauge!("rokka_rocketmq_namesrv_brokers").set(t.broker_count() as f64);
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

    fn handle(&self, cmd: &RemotingCommand, conn: &Conn) -> RemotingCommand {
        self.register_local(false);
        match cmd.code {
            rq::GET_ROUTEINFO_BY_TOPIC => {
                let topic = cmd.ext_fields.get("topic").unwrap_or_default();
                match self.table().route(topic) {
                    Some(v) => self.json_body(cmd, v),
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
            rq::GET_TOPICS_BY_CLUSTER => {
                let v = self
                    .table()
                    .topic_list(Some(cmd.ext_fields.get("cluster").unwrap_or_default()));
                self.json_body(cmd, json!({"topicList": v}))
            }
            rq::DELETE_TOPIC_IN_NAMESRV => {
                self.table()
                    .delete_topic(cmd.ext_fields.get("topic").unwrap_or_default());
                self.reply(cmd, rs::SUCCESS, None)
            }
            rq::GET_KVLIST_BY_NAMESPACE => self.reply(cmd, rs::QUERY_NOT_FOUND, Some("no KV config".into())),
            rq::REGISTER_BROKER => match Registration::from_command(cmd) {
                Ok(r) => {
                    self.apply(&r, Some(conn.peer));
                    let mut resp = self.reply(cmd, rs::SUCCESS, None);
                    resp.ext_fields.set("haServerAddr", "");
                    resp.ext_fields.set("masterAddr", "");
                    resp
                }
                Err(e) => {
                    tracing::warn!(peer = %conn.peer, error = e, "bad REGISTER_BROKER");
                    self.reply(cmd, rs::SYSTEM_ERROR, Some(e))
                }
            },
            rq::UNREGISTER_BROKER => {
                let f = |k: &str| cmd.ext_fields.get(k).unwrap_or_default().trim().to_string();
                let id = f("brokerId").parse().unwrap_or(0);
                self.table().unregister(&f("brokerName"), &f("brokerAddr"), id);
                tracing::info!(broker = f("brokerName"), addr = f("brokerAddr"), "broker unregistered");
                self.reply(cmd, rs::SUCCESS, None)
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
        metrics::counter!("rokka_rocketmq_requests_total", "code" => cmd.code.to_string()).increment(1);
        let oneway = cmd.flag & FLAG_ONEWAY != 0;
        let resp = self.handle(&cmd, conn);
        metrics::histogram!("rokka_rocketmq_request_seconds", "code" => cmd.code.to_string())
            .record(started.elapsed().as_secs_f64());
        (!oneway).then_some(resp)
    }

    fn max_frame_bytes(&self) -> usize {
        self.config.max_frame_bytes as usize
    }

    fn inline(&self, _cmd: &RemotingCommand) -> bool {
        true
    }

    fn connection_closed(&self, conn: &Conn) {
        for addr in self.table().channel_closed(conn.peer) {
            tracing::info!(addr, "broker's name-server connection closed: unregistered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(name: &str, addr: &str, id: i64, topics: &[(&str, u32)]) -> Registration {
        Registration {
            cluster: "C".into(),
            broker_name: name.into(),
            broker_addr: addr.into(),
            broker_id: id,
            ha_addr: String::new(),
            timeout_ms: None,
            data_version: 1,
            topics: topics
                .iter()
                .map(|(t, n)| TopicConf {
                    name: t.to_string(),
                    read_queues: *n,
                    write_queues: *n,
                    perm: 6,
                    sys_flag: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn registration_round_trips_through_the_wire_form() -> Result<(), String> {
        let mut r = reg("b", "127.0.0.1:1", 0, &[("T", 4), ("U", 2)]);
        r.timeout_ms = Some(5000);
        r.data_version = 7;
        let cmd = r.to_command(1, 479);
        let mut back = Registration::from_command(&cmd)?;
        back.topics.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(back, r);
        let mut bad = cmd.clone();
        bad.body = Bytes::from(format!("{} ", String::from_utf8_lossy(&cmd.body)));
        assert!(Registration::from_command(&bad).is_err(), "CRC must be checked");
        Ok(())
    }

    #[test]
    fn routes_follow_registrations_expiry_and_unregister() {
        let mut t = RouteTable::default();
        assert!(t.register(&reg("a", "h:1", 0, &[("T", 4)]), 0, 120_000, None));
        assert!(t.register(&reg("b", "h:2", 0, &[("T", 2), ("U", 1)]), 0, 120_000, None));
        let route = t.route("T").unwrap_or_default();
        assert_eq!(route["queueDatas"].as_array().map(Vec::len), Some(2));
        assert_eq!(route["brokerDatas"][0]["brokerAddrs"]["0"], "h:1");
        assert_eq!(t.topic_list(Some("C")), vec!["T".to_string(), "U".to_string()]);
        // Same registration again: nothing changed.
        assert!(!t.register(&reg("a", "h:1", 0, &[("T", 4)]), 10, 120_000, None));
        // b drops U from its registration.
        assert!(t.register(&reg("b", "h:2", 0, &[("T", 2)]), 10, 120_000, None));
        assert!(t.route("U").is_none());
        // b goes silent: after 120 s only a serves T.
        t.register(&reg("a", "h:1", 0, &[("T", 4)]), 100_000, 120_000, None);
        assert_eq!(t.expire(120_011), vec!["h:2".to_string()]);
        let route = t.route("T").unwrap_or_default();
        assert_eq!(route["queueDatas"].as_array().map(Vec::len), Some(1));
        assert_eq!(t.cluster_info()["clusterAddrTable"]["C"], json!(["a"]));
        t.unregister("a", "h:1", 0);
        assert!(t.route("T").is_none());
        assert_eq!(t.broker_count(), 0);
    }

    #[test]
    fn a_custom_heartbeat_timeout_and_a_closed_channel_drop_the_broker() {
        let mut t = RouteTable::default();
        let mut r = reg("a", "h:1", 0, &[("T", 4)]);
        r.timeout_ms = Some(1000);
        let peer: SocketAddr = ([127, 0, 0, 1], 5555).into();
        t.register(&r, 0, 120_000, Some(peer));
        assert!(t.expire(900).is_empty());
        assert_eq!(t.expire(1001), vec!["h:1".to_string()]);
        t.register(&r, 2000, 120_000, Some(peer));
        assert_eq!(t.channel_closed(peer), vec!["h:1".to_string()]);
        assert!(t.route("T").is_none());
    }
}
