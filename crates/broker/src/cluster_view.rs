//! What the frontends need to know of cluster mode (crates/cluster keeps
//! it current): the live nodes with their addresses, this set's master,
//! epoch and sync state set. Kafka Metadata and the RocketMQ routes are
//! answered from it; without cluster mode there is none.

use serde::{Deserialize, Serialize};

/// One live node, as it registered in etcd.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: u32,
    /// Its broker set (RocketMQ broker name).
    pub set: String,
    /// Kafka listener, `host:port` as advertised.
    pub kafka: String,
    /// RocketMQ broker listener, `host:port`.
    pub broker: String,
    /// RocketMQ name server listener, `host:port`.
    pub namesrv: String,
    /// Replication listener, `host:port`.
    pub replication: String,
    /// Its rack (Kafka `broker.rack`); empty: none.
    #[serde(default)]
    pub rack: String,
    /// Kafka SSL listener, `host:port` as advertised; empty: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kafka_ssl: String,
    /// Kafka SASL (without TLS) listener, `host:port`; empty: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kafka_sasl: String,
    /// RocketMQ 5 gRPC listener, `host:port` as advertised; empty: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub grpc: String,
    /// Its log has an epoch history (it was a master or followed one): a
    /// set whose state is missing from etcd is not taken by a fresh node
    /// while such a node lives.
    #[serde(default)]
    pub has_history: bool,
}

impl NodeInfo {
    /// Its Kafka listener of the kind a client is on (the SSL one, the
    /// SASL one, or the plaintext one): clients are told of listeners they
    /// can speak to.
    pub fn kafka_at(&self, ssl: bool, sasl: bool) -> &str {
        match (ssl, sasl) {
            (true, _) => &self.kafka_ssl,
            (false, true) => &self.kafka_sasl,
            (false, false) => &self.kafka,
        }
    }
}

/// One broker set as this node last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetView {
    pub name: String,
    /// Its master, if one is elected and alive.
    pub master: Option<u32>,
    /// Its epoch (Kafka leader epoch of its partitions).
    pub epoch: u32,
    /// Its sync state set (Kafka ISR), master included.
    pub sss: Vec<u32>,
    /// Its live nodes.
    pub members: Vec<u32>,
    /// Marked draining: takes no new placements.
    pub draining: bool,
}

/// The cluster as this node last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub cluster: String,
    pub self_id: u32,
    /// This node's broker set.
    pub set: String,
    /// Live nodes, by id.
    pub nodes: Vec<NodeInfo>,
    /// This set's master, if one is elected.
    pub master: Option<u32>,
    /// This set's epoch (Kafka leader epoch).
    pub epoch: u32,
    /// This set's sync state set (Kafka ISR).
    pub sss: Vec<u32>,
    /// Every node of this set that is alive.
    pub members: Vec<u32>,
    /// Consumers may be pointed at in-sync replicas (`cluster.read_from_replicas`).
    pub read_from_replicas: bool,
    /// `cluster.replica_read_lag_bytes`.
    pub replica_read_lag_bytes: u64,
    /// Every broker set with a state in etcd or a live node, by name (this
    /// node's own included).
    pub sets: Vec<SetView>,
}

impl ClusterView {
    pub fn node(&self, id: u32) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The broker set named `name`.
    pub fn set_named(&self, name: &str) -> Option<&SetView> {
        self.sets.iter().find(|s| s.name == name)
    }

    /// Sets that take new topics and partitions: those not draining.
    pub fn placeable_sets(&self) -> Vec<String> {
        self.sets
            .iter()
            .filter(|s| !s.draining)
            .map(|s| s.name.clone())
            .collect()
    }

    /// The broker set that coordinates Kafka group (or transactional id)
    /// `key`: every set by name, picked by a hash of the key (the one set
    /// when there is one).
    pub fn coordinator_set(&self, key: &str) -> Option<&SetView> {
        if self.sets.is_empty() {
            return None;
        }
        let i = crc32fast::hash(key.as_bytes()) as usize % self.sets.len();
        self.sets.get(i)
    }

    /// Whether this node coordinates `key` now (its set's master, and the
    /// set the key hashes to).
    pub fn coordinates(&self, key: &str) -> bool {
        self.is_master() && self.coordinator_set(key).is_none_or(|s| s.name == self.set)
    }

    /// Whether this node is its set's master.
    pub fn is_master(&self) -> bool {
        self.master == Some(self.self_id)
    }

    /// KIP-392, on the master: the in-sync replica a consumer in
    /// `client_rack` should fetch from instead — one in its rack when the
    /// master is not (Kafka's rack-aware selector keeps the leader when it
    /// is in the client's rack). None: fetch from the master.
    pub fn preferred_read_replica(&self, client_rack: &str) -> Option<u32> {
        if !self.read_from_replicas || !self.is_master() || client_rack.is_empty() {
            return None;
        }
        if self.node(self.self_id).is_some_and(|n| n.rack == client_rack) {
            return None;
        }
        self.sss
            .iter()
            .copied()
            .filter(|id| *id != self.self_id && self.members.contains(id))
            .find(|id| {
                self.node(*id)
                    .is_some_and(|n| n.rack == client_rack && !n.kafka.is_empty())
            })
    }

    /// RocketMQ `suggestWhichBrokerId` for a pull whose first message is
    /// `lag_bytes` behind the CommitLog's end: a replica's broker id (node
    /// id + 1; an in-sync one, this node when it is one) while the consumer
    /// is that far behind, else the master's, 0.
    pub fn suggested_broker_id(&self, lag_bytes: Option<u64>) -> u64 {
        let behind = lag_bytes.is_some_and(|l| l > self.replica_read_lag_bytes);
        if !self.read_from_replicas || !behind {
            return 0;
        }
        if !self.is_master() {
            return if self.sss.contains(&self.self_id) {
                u64::from(self.self_id) + 1
            } else {
                0
            };
        }
        self.sss
            .iter()
            .find(|id| **id != self.self_id && self.members.contains(id))
            .map_or(0, |id| u64::from(*id) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(self_id: u32, master: u32) -> ClusterView {
        let node = |id: u32| NodeInfo {
            id,
            set: "a".into(),
            rack: format!("r{id}"),
            kafka: format!("127.0.0.1:{}", 9090 + id),
            ..NodeInfo::default()
        };
        ClusterView {
            self_id,
            set: "a".into(),
            nodes: (1..=3).map(node).collect(),
            master: Some(master),
            epoch: 1,
            sss: vec![1, 2, 3],
            members: vec![1, 2, 3],
            read_from_replicas: true,
            replica_read_lag_bytes: 100,
            ..ClusterView::default()
        }
    }

    #[test]
    fn a_consumer_is_pointed_at_the_in_sync_replica_in_its_rack() {
        let v = view(1, 1);
        assert_eq!(v.preferred_read_replica("r2"), Some(2));
        assert_eq!(v.preferred_read_replica("r1"), None, "the master is in its rack");
        assert_eq!(v.preferred_read_replica("r9"), None);
        assert_eq!(v.preferred_read_replica(""), None);
        let out_of_sync = ClusterView {
            sss: vec![1, 3],
            ..v.clone()
        };
        assert_eq!(out_of_sync.preferred_read_replica("r2"), None);
        let off = ClusterView {
            read_from_replicas: false,
            ..v.clone()
        };
        assert_eq!(off.preferred_read_replica("r2"), None);
        assert_eq!(
            view(2, 1).preferred_read_replica("r3"),
            None,
            "only the master redirects"
        );
    }

    #[test]
    fn a_pull_far_behind_goes_to_a_replica_and_comes_back_when_caught_up() {
        let master = view(1, 1);
        assert_eq!(master.suggested_broker_id(Some(101)), 3, "node 2 is brokerId 3");
        assert_eq!(master.suggested_broker_id(Some(100)), 0);
        assert_eq!(master.suggested_broker_id(None), 0);
        let replica = view(3, 1);
        assert_eq!(replica.suggested_broker_id(Some(500)), 4, "stays on this replica");
        assert_eq!(replica.suggested_broker_id(None), 0, "caught up: back to the master");
        let lagging = ClusterView {
            sss: vec![1, 2],
            ..replica
        };
        assert_eq!(lagging.suggested_broker_id(Some(500)), 0);
        let off = ClusterView {
            read_from_replicas: false,
            ..master
        };
        assert_eq!(off.suggested_broker_id(Some(500)), 0);
    }
}
