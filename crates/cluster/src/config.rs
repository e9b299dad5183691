//! `[cluster]` configuration (documented in `config/rokka.toml`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// How a master acknowledges writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationMode {
    /// Kafka `acks=all` and RocketMQ sync sends wait until the sync state
    /// set holds the message (RocketMQ SYNC_MASTER).
    Sync,
    /// They are answered once the master has it (ASYNC_MASTER).
    Async,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Cluster mode on. Off: one node, no etcd (the default).
    pub enabled: bool,
    /// etcd v3 endpoints (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// Cluster name: the etcd key prefix `/rokka/<name>/`.
    pub name: String,
    /// This node's id, unique in the cluster; also its Kafka broker id.
    pub node_id: u32,
    /// The broker set this node belongs to (RocketMQ broker name).
    pub broker_set: String,
    /// Where replicas of this node's set connect when it is master.
    pub replication_listen: SocketAddr,
    /// Most connections the replication listener serves at once (the set's
    /// replicas; more are closed at once).
    pub replication_max_connections: u32,
    /// TLS on the replication stream, both ways authenticated: this node's
    /// certificate chain (PEM; it must name the host other nodes reach it
    /// by, and serve as a TLS server and client), its key, and the CA that
    /// signed every node's certificate. A master takes only replicas whose
    /// certificate that CA signed; a replica talks only to a master whose
    /// certificate it signed. All three or none (plaintext).
    pub replication_certificate: String,
    pub replication_key: String,
    pub replication_ca: String,
    /// Host other nodes use to reach this one (its listeners' ports); the
    /// listen address's host when empty.
    pub advertised_host: String,
    /// Members of the sync state set (master included) a write must reach
    /// before `acks=all` / a sync send is answered; below it such writes
    /// are refused before they are stored (NOT_ENOUGH_REPLICAS; RocketMQ's
    /// IN_SYNC_REPLICAS_NOT_ENOUGH, SYSTEM_ERROR).
    pub min_insync_replicas: u32,
    /// A replica not caught up for this long leaves the sync state set.
    pub replica_lag_max_ms: u64,
    pub replication: ReplicationMode,
    /// How long a waiting write may wait for its replicas.
    pub replication_timeout_ms: u64,
    /// Lease time to live in etcd (whole seconds, at least 2): a master
    /// silent this long is replaced.
    pub lease_ttl_secs: u32,
    /// How long a deleted topic's tombstone stays in etcd (ms): every
    /// node that holds the deleted incarnation drops its queues and
    /// committed offsets when it sees it; a node down longer starts from
    /// etcd's table, which no longer names the topic.
    pub topic_tombstone_ttl_ms: u64,
    /// How often the controller state is read from etcd.
    pub poll_interval_ms: u64,
    /// Elect a node outside the sync state set when none in it is alive
    /// (may lose acknowledged messages). Off by default.
    pub unclean_election: bool,
    /// This node's rack (Kafka `broker.rack`): listed in Metadata, and what
    /// a consumer's `client.rack` is matched against. Empty: none.
    pub rack: String,
    /// Consumers may read from in-sync replicas: a Kafka consumer (Fetch
    /// v11+) whose `client.rack` is a replica's rack and not the master's
    /// is pointed at that replica (KIP-392 `preferred_read_replica`); a
    /// RocketMQ pull more than `replica_read_lag_bytes` behind the log end
    /// is pointed at a replica (`suggestWhichBrokerId`, RocketMQ's
    /// `slaveReadEnable`), and back to the master once caught up. Off by
    /// default, as in both systems.
    pub read_from_replicas: bool,
    /// How far behind the CommitLog's end (bytes) a RocketMQ pull must
    /// start to be sent to a replica (RocketMQ: 40 % of RAM, "not in
    /// memory").
    pub replica_read_lag_bytes: u64,
    /// Several broker sets: how long a Kafka group coordinator waits for
    /// another set's master when it commits or reads an offset of that
    /// set's queue (then the client is told COORDINATOR_NOT_AVAILABLE and
    /// retries).
    pub remote_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            etcd_endpoints: vec!["http://127.0.0.1:2379".into()],
            name: "rokka".into(),
            node_id: 0,
            broker_set: "broker-a".into(),
            replication_listen: SocketAddr::from(([127, 0, 0, 1], 10912)),
            replication_max_connections: 8,
            replication_certificate: String::new(),
            replication_key: String::new(),
            replication_ca: String::new(),
            advertised_host: String::new(),
            min_insync_replicas: 2,
            replica_lag_max_ms: 10_000,
            replication: ReplicationMode::Sync,
            replication_timeout_ms: 10_000,
            lease_ttl_secs: 3,
            poll_interval_ms: 200,
            topic_tombstone_ttl_ms: 7 * 24 * 3600 * 1000,
            unclean_election: false,
            rack: String::new(),
            read_from_replicas: false,
            replica_read_lag_bytes: 1 << 30,
            remote_timeout_ms: 5_000,
        }
    }
}

impl ClusterConfig {
    /// TLS on the replication stream (all three paths set).
    pub fn replication_tls(&self) -> bool {
        !self.replication_certificate.is_empty()
    }

    pub fn validate(&self) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        if self.etcd_endpoints.is_empty() {
            return Err("cluster.etcd_endpoints is empty".into());
        }
        if self.name.is_empty() || self.name.contains('/') {
            return Err(format!("cluster.name {:?} must be non-empty without '/'", self.name));
        }
        if self.broker_set.is_empty() || self.broker_set.contains('/') {
            return Err(format!(
                "cluster.broker_set {:?} must be non-empty without '/'",
                self.broker_set
            ));
        }
        if self.min_insync_replicas == 0 {
            return Err("cluster.min_insync_replicas must be at least 1".into());
        }
        if self.remote_timeout_ms == 0 {
            return Err("cluster.remote_timeout_ms must be at least 1".into());
        }
        let tls = [
            &self.replication_certificate,
            &self.replication_key,
            &self.replication_ca,
        ];
        if tls.iter().any(|p| p.is_empty()) && tls.iter().any(|p| !p.is_empty()) {
            return Err(
                "cluster.replication_certificate, replication_key and replication_ca go together: set all three \
                 (TLS on the replication stream) or none"
                    .into(),
            );
        }
        if self.lease_ttl_secs < 2 {
            return Err("cluster.lease_ttl_secs must be at least 2".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replication_tls_takes_all_three_paths_or_none() {
        let on = |cert: &str, key: &str, ca: &str| ClusterConfig {
            enabled: true,
            replication_certificate: cert.into(),
            replication_key: key.into(),
            replication_ca: ca.into(),
            ..ClusterConfig::default()
        };
        assert!(on("", "", "").validate().is_ok());
        assert!(on("n.pem", "n.key", "ca.pem").validate().is_ok());
        assert!(on("n.pem", "n.key", "ca.pem").replication_tls());
        for half in [on("n.pem", "", ""), on("n.pem", "n.key", ""), on("", "", "ca.pem")] {
            let err = half.validate().err().unwrap_or_default();
            assert!(err.contains("go together"), "{err}");
        }
    }
}
