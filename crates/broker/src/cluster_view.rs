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
}

impl ClusterView {
    pub fn node(&self, id: u32) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Whether this node is its set's master.
    pub fn is_master(&self) -> bool {
        self.master == Some(self.self_id)
    }
}
