//! The RocketMQ name server's route table (digest §2.11,
//! `RouteInfoManager.java`): clusters, brokers and their addresses, topics →
//! queue data per broker, and each broker's liveness. Pure data — no I/O, the
//! clock passed in; `protocols/remoting` serves it on the name-server port and
//! turns REGISTER_BROKER frames into [`Registration`]s.
//!
//! Unlike Apache RocketMQ's default (`deleteTopicWithBrokerRegistration =
//! false`), a master's registration is authoritative for its topics: a topic
//! missing from it is gone from that broker's routes (Rokka deletes topics
//! through Kafka's DeleteTopics as well, and the route must follow).
//!
//! # What liveness is kept for
//!
//! One registration is one [`BrokerKey`]: (cluster, broker name, broker id,
//! address). Its heartbeat time, timeout and registering connection live in
//! the same slot as the address it publishes (broker name → broker id →
//! member), so the address a route shows, the clock that expires it and the
//! connection whose close drops it can never belong to different brokers.
//! RocketMQ keeps liveness by (cluster, address) beside the name → id →
//! address table instead, so a second broker name registered on the same
//! address shares (and overwrites) the first one's liveness: the first one
//! is then never expired, survives its own connection closing, and the
//! second one's expiry or close takes the first one's liveness with it.
//! Here each registration expires, closes and unregisters alone:
//!
//! * a (name, id) slot holds one address: a registration of the same name and
//!   id from another address replaces it (a moved broker), and within one
//!   broker name an address holds one id (RocketMQ's slave → master switch);
//! * [`RouteTable::expire`] and [`RouteTable::channel_closed`] remove exactly
//!   the registrations that went silent or whose connection closed;
//! * [`RouteTable::unregister`] removes a registration only when all four
//!   parts of its key match.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;

use serde_json::{json, Value};

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
    /// Whether `topics` is every topic the broker holds (Rokka's own
    /// registrations say so): then a topic it no longer lists leaves its
    /// routes. An Apache broker also registers single new topics
    /// (registerIncrementBrokerData): those only add, as Apache's name
    /// server keeps routes by default (deleteTopicWithBrokerRegistration
    /// off), and a deleted topic goes with DELETE_TOPIC_IN_NAMESRV.
    pub full: bool,
}

impl Registration {
    /// The key this registration is live, expired and unregistered under.
    pub fn key(&self) -> BrokerKey {
        BrokerKey {
            cluster: self.cluster.clone(),
            broker_name: self.broker_name.clone(),
            broker_id: self.broker_id,
            broker_addr: self.broker_addr.clone(),
        }
    }
}

/// One registration's identity: what UNREGISTER_BROKER names, and what
/// expiry and a closed connection report.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BrokerKey {
    pub cluster: String,
    pub broker_name: String,
    /// 0 for a master, ≥ 1 for a slave.
    pub broker_id: i64,
    pub broker_addr: String,
}

impl fmt::Display for BrokerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}@{}",
            self.cluster, self.broker_name, self.broker_id, self.broker_addr
        )
    }
}

/// One registered broker process: the address published under its broker
/// name and id, and the liveness of that very registration.
#[derive(Debug)]
struct Member {
    addr: String,
    /// Time of the last registration (the heartbeat).
    last_ms: u64,
    /// Silent longer than this and it is dropped (`heartbeatTimeoutMillis`).
    timeout_ms: u64,
    /// The connection it last registered over; `None` for the broker in
    /// this process, which registers without one.
    peer: Option<SocketAddr>,
}

#[derive(Debug)]
struct BrokerEntry {
    cluster: String,
    /// broker id → its registration (0 = master).
    members: BTreeMap<i64, Member>,
    /// Topics its master's last full registration listed.
    listed: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QueueData {
    read: u32,
    write: u32,
    perm: u32,
    sys_flag: u32,
}

/// The route table itself: no I/O, time passed in. Not thread-safe by
/// itself: the name-server port holds it behind one mutex.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// broker name → its cluster and registered members.
    brokers: BTreeMap<String, BrokerEntry>,
    /// cluster → broker names (kept equal to the brokers' own `cluster`).
    clusters: BTreeMap<String, BTreeSet<String>>,
    /// topic → broker name → queues.
    topics: BTreeMap<String, BTreeMap<String, QueueData>>,
    /// Broker names whose write permission an admin wiped
    /// (WIPE_WRITE_PERM_OF_BROKER): their queues are routed read-only,
    /// whatever they register, until ADD_WRITE_PERM_OF_BROKER.
    write_wiped: BTreeSet<String>,
    /// KV configs by namespace (PUT_KV_CONFIG; e.g. ORDER_TOPIC_CONFIG),
    /// at most [`MAX_KV_TOTAL_BYTES`] of names, keys and values in all.
    kv: BTreeMap<String, BTreeMap<String, String>>,
    kv_bytes: usize,
}

/// Bytes of KV configs (namespaces, keys and values) a name server keeps
/// at most: what admins set is a few short entries.
pub const MAX_KV_TOTAL_BYTES: usize = 1 << 20;
/// Longest KV namespace, key or value.
pub const MAX_KV_BYTES: usize = 16 << 10;

/// Apache's PermName.PERM_WRITE.
const PERM_WRITE: u32 = 2;

impl RouteTable {
    /// Applies a registration (and heartbeat); true when the routes changed.
    pub fn register(
        &mut self,
        r: &Registration,
        now_ms: u64,
        default_timeout_ms: u64,
        peer: Option<SocketAddr>,
    ) -> bool {
        let mut changed = false;
        let moved_from = match self.brokers.get(&r.broker_name) {
            Some(e) if e.cluster != r.cluster => Some(e.cluster.clone()),
            _ => None,
        };
        if let Some(old) = moved_from {
            self.leave_cluster(&old, &r.broker_name);
            changed = true;
        }
        self.clusters
            .entry(r.cluster.clone())
            .or_default()
            .insert(r.broker_name.clone());
        let entry = self
            .brokers
            .entry(r.broker_name.clone())
            .or_insert_with(|| BrokerEntry {
                cluster: r.cluster.clone(),
                members: BTreeMap::new(),
                listed: 0,
            });
        if r.broker_id == 0 && r.full {
            entry.listed = r.topics.len();
        }
        entry.cluster = r.cluster.clone();
        // Within one broker name an address holds one id: a slave turned
        // master (or back) leaves its old id.
        let before = entry.members.len();
        let had_master = entry.members.contains_key(&0);
        entry
            .members
            .retain(|id, m| *id == r.broker_id || m.addr != r.broker_addr);
        changed |= entry.members.len() != before;
        let lost_master = had_master && r.broker_id != 0 && !entry.members.contains_key(&0);
        let member = Member {
            addr: r.broker_addr.clone(),
            last_ms: now_ms,
            timeout_ms: r.timeout_ms.unwrap_or(default_timeout_ms),
            peer,
        };
        if let Some(old) = entry.members.insert(r.broker_id, member) {
            changed |= old.addr != r.broker_addr;
        } else {
            changed = true;
        }
        if lost_master {
            changed |= self.drop_topics_of(&r.broker_name);
        }
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
        if r.full {
            self.topics.retain(|name, per| {
                if !listed.contains(name.as_str()) && per.remove(&r.broker_name).is_some() {
                    changed = true;
                }
                !per.is_empty()
            });
        }
        changed
    }

    /// UNREGISTER_BROKER: removes the registration with exactly this key;
    /// false (and nothing changes) when no registration matches all of it.
    pub fn unregister(&mut self, key: &BrokerKey) -> bool {
        let matches = self.brokers.get(&key.broker_name).is_some_and(|e| {
            e.cluster == key.cluster && e.members.get(&key.broker_id).is_some_and(|m| m.addr == key.broker_addr)
        });
        if matches {
            self.remove_member(&key.broker_name, key.broker_id);
        }
        matches
    }

    /// Drops the registrations silent past their own timeout.
    pub fn expire(&mut self, now_ms: u64) -> Vec<BrokerKey> {
        self.remove_where(|m| m.last_ms.saturating_add(m.timeout_ms) < now_ms)
    }

    /// Drops the registrations last made over a connection that closed.
    pub fn channel_closed(&mut self, peer: SocketAddr) -> Vec<BrokerKey> {
        self.remove_where(|m| m.peer == Some(peer))
    }

    fn remove_where(&mut self, gone: impl Fn(&Member) -> bool) -> Vec<BrokerKey> {
        let keys: Vec<BrokerKey> = self
            .brokers
            .iter()
            .flat_map(|(name, e)| {
                e.members.iter().filter(|(_, m)| gone(m)).map(|(id, m)| BrokerKey {
                    cluster: e.cluster.clone(),
                    broker_name: name.clone(),
                    broker_id: *id,
                    broker_addr: m.addr.clone(),
                })
            })
            .collect();
        for k in &keys {
            self.remove_member(&k.broker_name, k.broker_id);
        }
        keys
    }

    /// Removes one (broker name, id) registration and what hangs on it.
    fn remove_member(&mut self, broker_name: &str, broker_id: i64) {
        let Some(entry) = self.brokers.get_mut(broker_name) else {
            return;
        };
        if entry.members.remove(&broker_id).is_none() {
            return;
        }
        let empty = entry.members.is_empty();
        let cluster = entry.cluster.clone();
        if broker_id == 0 || empty {
            // Without its master a broker's queues are not writable: drop them
            // (RocketMQ keeps slave-only read routes; Rokka has no slaves).
            self.drop_topics_of(broker_name);
        }
        if empty {
            self.brokers.remove(broker_name);
            // (Its wipe goes with it: the set holds known brokers only.)
            self.write_wiped.remove(broker_name);
            self.leave_cluster(&cluster, broker_name);
        }
    }

    fn drop_topics_of(&mut self, broker_name: &str) -> bool {
        let mut dropped = false;
        self.topics.retain(|_, per| {
            dropped |= per.remove(broker_name).is_some();
            !per.is_empty()
        });
        dropped
    }

    fn leave_cluster(&mut self, cluster: &str, broker_name: &str) {
        if let Some(c) = self.clusters.get_mut(cluster) {
            c.remove(broker_name);
            if c.is_empty() {
                self.clusters.remove(cluster);
            }
        }
    }

    fn broker_data(&self, name: &str) -> Option<Value> {
        let b = self.brokers.get(name)?;
        let addrs: serde_json::Map<String, Value> = b
            .members
            .iter()
            .map(|(id, m)| (id.to_string(), Value::from(m.addr.as_str())))
            .collect();
        Some(json!({"cluster": b.cluster, "brokerName": name, "brokerAddrs": addrs, "enableActingMaster": false}))
    }

    /// TopicRouteData of `topic`, if any broker serves it.
    pub fn route(&self, topic: &str) -> Option<Value> {
        self.route_with(topic, &[], &BTreeMap::new())
    }

    /// [`RouteTable::route`] where `known` (broker name, queue count) fills
    /// in brokers whose registration does not list the topic yet: in
    /// cluster mode the cluster's topic table says where a new topic's
    /// queues are before every set's master has registered it again. Only
    /// brokers with a master are filled in: a registered one, or else the
    /// one `masters` (cluster name, master address by broker name: the
    /// cluster's own view) names.
    pub fn route_with(
        &self,
        topic: &str,
        known: &[(String, u32)],
        masters: &BTreeMap<String, (String, String)>,
    ) -> Option<Value> {
        let registered = self.topics.get(topic);
        let mut per: BTreeMap<&str, QueueData> = registered
            .into_iter()
            .flatten()
            .map(|(b, q)| (b.as_str(), *q))
            .collect();
        for (b, n) in known {
            let has_master = self.brokers.get(b).is_some_and(|e| e.members.contains_key(&0)) || masters.contains_key(b);
            if *n > 0 && has_master && !per.contains_key(b.as_str()) {
                let q = QueueData {
                    read: *n,
                    write: *n,
                    perm: 6,
                    sys_flag: 0,
                };
                per.insert(b.as_str(), q);
            }
        }
        if per.is_empty() {
            return None;
        }
        let queue_datas: Vec<Value> = per
            .iter()
            .map(|(b, q)| {
                let perm = if self.write_wiped.contains(*b) {
                    q.perm & !PERM_WRITE
                } else {
                    q.perm
                };
                json!({"brokerName": b, "perm": perm, "readQueueNums": q.read, "writeQueueNums": q.write,
                       "topicSysFlag": q.sys_flag, "topicSynFlag": q.sys_flag})
            })
            .collect();
        let broker_datas: Vec<Value> = per
            .keys()
            .filter_map(|b| {
                let registered = self.broker_data(b).filter(|d| d["brokerAddrs"].get("0").is_some());
                registered.or_else(|| {
                    let (cluster, addr) = masters.get(*b)?;
                    Some(json!({"cluster": cluster, "brokerName": b, "brokerAddrs": {"0": addr}, "enableActingMaster": false}))
                })
                .or_else(|| self.broker_data(b))
            })
            .collect();
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

    /// What Apache's name server lists as its "system topics": every
    /// cluster's and every broker's name (GET_SYSTEM_TOPIC_LIST_FROM_NS).
    pub fn system_topic_list(&self) -> Vec<String> {
        let mut out: Vec<String> = self.clusters.keys().cloned().collect();
        out.extend(self.brokers.keys().cloned());
        out.sort();
        out.dedup();
        out
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

    /// [`RouteTable::delete_topic`] of `cluster`'s brokers only (5.x
    /// mqadmin deleteTopic -c; all of them for an empty name), as Apache's
    /// RouteInfoManager.deleteTopic: another cluster holding the topic
    /// keeps its route.
    pub fn delete_topic_in(&mut self, topic: &str, cluster: &str) -> bool {
        if cluster.is_empty() {
            return self.delete_topic(topic);
        }
        let Some(brokers) = self.clusters.get(cluster) else {
            return false;
        };
        let Some(per) = self.topics.get_mut(topic) else {
            return false;
        };
        let before = per.len();
        per.retain(|b, _| !brokers.contains(b));
        let removed = per.len() != before;
        if per.is_empty() {
            self.topics.remove(topic);
        }
        removed
    }

    /// WIPE_WRITE_PERM_OF_BROKER (mqadmin wipeWritePerm, before taking a
    /// broker out): its queues are routed read-only from now on, so
    /// producers move to other brokers while consumers drain it. The
    /// number of its topics that were writable (Apache's wipeTopicCount).
    pub fn wipe_write_perm(&mut self, broker_name: &str) -> usize {
        // Only a broker the table knows (the set stays within its brokers;
        // Apache changes only queue data that exists).
        if !self.brokers.contains_key(broker_name) {
            return 0;
        }
        let was_wiped = !self.write_wiped.insert(broker_name.to_string());
        if was_wiped {
            return 0;
        }
        self.topics_of(broker_name, |q| q.perm & PERM_WRITE != 0)
    }

    /// ADD_WRITE_PERM_OF_BROKER (mqadmin addWritePerm): undoes a wipe; the
    /// number of the broker's topics routed writable again.
    pub fn add_write_perm(&mut self, broker_name: &str) -> usize {
        if !self.write_wiped.remove(broker_name) {
            return 0;
        }
        self.topics_of(broker_name, |q| q.perm & PERM_WRITE != 0)
    }

    fn topics_of(&self, broker_name: &str, pred: impl Fn(&QueueData) -> bool) -> usize {
        self.topics
            .values()
            .filter(|per| per.get(broker_name).is_some_and(&pred))
            .count()
    }

    /// PUT_KV_CONFIG; an error (the response's remark) past the budget.
    pub fn put_kv(&mut self, namespace: &str, key: &str, value: &str) -> Result<(), String> {
        if [namespace, key, value].iter().any(|s| s.len() > MAX_KV_BYTES) {
            return Err(format!("namespace, key and value must be at most {MAX_KV_BYTES} bytes"));
        }
        let old = self.kv.get(namespace).and_then(|m| m.get(key)).map(String::len);
        let (add, remove) = match old {
            Some(old_value) => (value.len(), old_value),
            None => (namespace.len() + key.len() + value.len(), 0),
        };
        if self.kv_bytes - remove + add > MAX_KV_TOTAL_BYTES {
            return Err(format!(
                "the name server's KV configs would pass {MAX_KV_TOTAL_BYTES} bytes"
            ));
        }
        self.kv_bytes = self.kv_bytes - remove + add;
        self.kv
            .entry(namespace.to_string())
            .or_default()
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    /// GET_KV_CONFIG.
    pub fn get_kv(&self, namespace: &str, key: &str) -> Option<&str> {
        self.kv.get(namespace)?.get(key).map(String::as_str)
    }

    /// DELETE_KV_CONFIG; whether it was there.
    pub fn delete_kv(&mut self, namespace: &str, key: &str) -> bool {
        let Some(m) = self.kv.get_mut(namespace) else {
            return false;
        };
        let had = m.remove(key);
        if m.is_empty() {
            self.kv.remove(namespace);
        }
        if let Some(v) = &had {
            self.kv_bytes -= namespace.len() + key.len() + v.len();
        }
        had.is_some()
    }

    /// GET_KVLIST_BY_NAMESPACE: a namespace's entries, if any.
    pub fn kv_list(&self, namespace: &str) -> Option<&BTreeMap<String, String>> {
        self.kv.get(namespace).filter(|m| !m.is_empty())
    }

    /// Whether (broker name, id) is registered.
    pub fn is_registered(&self, broker_name: &str, broker_id: i64) -> bool {
        self.brokers
            .get(broker_name)
            .is_some_and(|e| e.members.contains_key(&broker_id))
    }

    /// Topics the last full registration of `broker_name`'s master listed
    /// (one that lists no more cannot grow the routes).
    pub fn listed_by(&self, broker_name: &str) -> usize {
        self.brokers.get(broker_name).map_or(0, |e| e.listed)
    }

    /// (topic, broker name) route entries held: what the registrations cost.
    pub fn route_entries(&self) -> usize {
        self.topics.values().map(BTreeMap::len).sum()
    }

    /// The route entries of broker `broker_name` (a registration of it
    /// replaces them).
    pub fn route_entries_of(&self, broker_name: &str) -> usize {
        self.topics.values().filter(|b| b.contains_key(broker_name)).count()
    }

    /// Live registrations: (broker name, id) pairs.
    pub fn broker_count(&self) -> usize {
        self.brokers.values().map(|e| e.members.len()).sum()
    }
}

#[cfg(test)]
mod tests;
