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

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
