//! `[kafka]` configuration (documented in `config/rokka.toml`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Serve the Kafka protocol.
    pub enabled: bool,
    /// Address the Kafka listener binds.
    pub listen: SocketAddr,
    /// Host clients are told to connect to (Metadata, FindCoordinator);
    /// empty = the listen address's IP.
    pub advertised_host: String,
    /// Port clients are told to connect to; 0 = the listen port.
    pub advertised_port: u16,
    /// Largest request frame accepted; a larger one closes the connection.
    pub max_request_bytes: u32,
    /// Cluster id reported in Metadata and DescribeCluster.
    pub cluster_id: String,
    /// This broker's node id.
    pub node_id: i32,
    /// Most open connections on this listener (0 = no limit); more are
    /// closed at accept.
    pub max_connections: u32,
    /// Most open connections from one source address (Kafka
    /// `max.connections.per.ip`; 0 = no limit).
    pub max_connections_per_ip: u32,
    /// A connection that completes no request for this long is closed
    /// (Kafka `connections.max.idle.ms`); a request must also arrive whole
    /// within it.
    pub idle_timeout_ms: u64,
    /// Request bytes held in memory at once over all connections (Kafka
    /// `queued.max.request.bytes`): a connection waits, not reading, until
    /// its next frame fits.
    pub max_inflight_request_bytes: u64,
    /// Most record bytes one Fetch response carries, whatever the client
    /// asks (Kafka `fetch.max.bytes`); at least one batch is always sent.
    pub max_fetch_bytes: u32,
    /// The longest a Fetch waits for `min_bytes` (ms), whatever its
    /// `max_wait_ms` says: the request's bytes are held from the listener's
    /// budget while it waits (clients ask 500 ms; a fetch asking days could
    /// pin the budget).
    pub max_fetch_wait_ms: u64,
    /// Longest metadata string an OffsetCommit may store (Kafka
    /// `offset.metadata.max.bytes`); longer is OFFSET_METADATA_TOO_LARGE.
    pub max_offset_metadata_bytes: u32,
    /// Longest group id or transactional id a request may make the broker
    /// keep (a group, committed offsets, a transaction); longer is
    /// INVALID_GROUP_ID (INVALID_REQUEST for a transactional id); 0 = no
    /// limit.
    pub max_id_bytes: u32,
    /// Incremental fetch sessions kept (Kafka
    /// `max.incremental.fetch.session.cache.slots`; 0 = none: every fetch
    /// is a full one). At the limit the least recently used goes.
    pub max_fetch_sessions: u32,
    /// A fetch session unused for this long is dropped.
    pub fetch_session_idle_ms: u64,
    /// Most partitions one fetch session may hold; a larger fetch goes
    /// without a session.
    pub max_fetch_session_partitions: u32,
    /// Cluster mode: a Metadata request naming a topic this node has not
    /// taken from etcd yet reads etcd's topic table at once; at most this
    /// many such reads run at once (more are answered from the table as it
    /// is).
    pub metadata_topic_lookups: u32,
    /// Such a read gives up after this long (the topic is then unknown).
    pub metadata_topic_lookup_timeout_ms: u64,
    /// Address of the SSL listener (Kafka `listeners = SSL://…`), served
    /// beside the plaintext one; absent = none.
    pub ssl_listen: Option<SocketAddr>,
    /// Port clients of the SSL listener are told to connect to; 0 = its
    /// listen port.
    pub ssl_advertised_port: u16,
    /// PEM file of the SSL listener's certificate chain (leaf first).
    pub ssl_certificate: String,
    /// PEM file of its private key (PKCS#8, PKCS#1 or SEC1).
    pub ssl_key: String,
    /// PEM file of the CAs whose client certificates are accepted; set:
    /// every SSL client must present one (Kafka `ssl.client.auth =
    /// required`); empty: none asked.
    pub ssl_client_ca: String,
    /// A TLS handshake not done within this long closes the connection.
    pub ssl_handshake_timeout_ms: u64,
    /// The SSL listener requires SASL too (Kafka SASL_SSL).
    pub ssl_sasl: bool,
    /// Address of a SASL listener without TLS (Kafka SASL_PLAINTEXT);
    /// absent = none.
    pub sasl_listen: Option<SocketAddr>,
    /// Port clients of the SASL listener are told; 0 = its listen port.
    pub sasl_advertised_port: u16,
    /// SASL mechanisms offered (of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    pub sasl_mechanisms: Vec<String>,
    /// A failed authentication is answered after this long, then the
    /// connection closes (Kafka `connection.failed.authentication.delay.ms`).
    pub sasl_failure_delay_ms: u64,
    /// A SASL connection not authenticated within this long of its start
    /// is closed.
    pub sasl_authentication_timeout_ms: u64,
    /// PLAIN password checks (PBKDF2) running at once over all
    /// connections; more wait.
    pub sasl_max_concurrent_password_checks: u32,
    /// Failed authentications from one address within
    /// `sasl_failure_window_ms` after which its new SASL connections are
    /// closed at once until the window has passed.
    pub sasl_max_failures_per_address: u32,
    pub sasl_failure_window_ms: u64,
    /// Users who may change credentials (AlterUserScramCredentials) over a
    /// SASL listener, until the ACL table exists; on the plaintext
    /// listener (loopback unless opened explicitly) anyone may.
    pub super_users: Vec<String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9092)),
            advertised_host: String::new(),
            advertised_port: 0,
            max_request_bytes: 100 * 1024 * 1024,
            cluster_id: "rokka-cluster".into(),
            node_id: 0,
            max_connections: 10_000,
            max_connections_per_ip: 2_000,
            idle_timeout_ms: 600_000,
            max_fetch_wait_ms: 60_000,
            max_inflight_request_bytes: 256 * 1024 * 1024,
            max_fetch_bytes: 57_671_680,
            max_offset_metadata_bytes: 4096,
            max_id_bytes: 4096,
            max_fetch_sessions: 1000,
            fetch_session_idle_ms: 120_000,
            max_fetch_session_partitions: 10_000,
            metadata_topic_lookups: 4,
            metadata_topic_lookup_timeout_ms: 2_000,
            ssl_listen: None,
            ssl_advertised_port: 0,
            ssl_certificate: String::new(),
            ssl_key: String::new(),
            ssl_client_ca: String::new(),
            ssl_handshake_timeout_ms: 10_000,
            ssl_sasl: false,
            sasl_listen: None,
            sasl_advertised_port: 0,
            sasl_mechanisms: crate::sasl::MECHANISMS.iter().map(|m| m.to_string()).collect(),
            sasl_failure_delay_ms: 100,
            sasl_authentication_timeout_ms: 10_000,
            sasl_max_concurrent_password_checks: 2,
            sasl_max_failures_per_address: 20,
            sasl_failure_window_ms: 60_000,
            super_users: Vec::new(),
        }
    }
}
