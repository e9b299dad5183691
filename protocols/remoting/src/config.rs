//! `[rocketmq]` configuration (documented in `config/rokka.toml`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RocketMqConfig {
    /// Serve the RocketMQ remoting protocol (name server and broker).
    pub enabled: bool,
    /// Name server listen address.
    pub namesrv_listen: SocketAddr,
    /// Broker listen address.
    pub broker_listen: SocketAddr,
    /// Broker address given to clients in routes ("" = the broker listen address).
    pub advertised_addr: String,
    /// Broker name in routes.
    pub broker_name: String,
    /// Cluster name in routes.
    pub cluster_name: String,
    /// Largest frame accepted; a larger one closes the connection.
    pub max_frame_bytes: u32,
    /// Queues of a topic auto-created by a producer, at most (the client asks for 4).
    pub max_auto_create_queues: u32,
    /// A client that sent no heartbeat for this long is dropped.
    pub client_timeout_ms: u64,
    /// Serve the name-server port.
    pub namesrv_enabled: bool,
    /// Serve the broker port (false with `namesrv_enabled` = a name server alone, as `rokka --namesrv-only`).
    pub broker_enabled: bool,
    /// External name servers the broker registers with ("host:port;host:port"); "" = the embedded one.
    pub namesrv_addr: String,
    /// The broker registers every this often (and at once when its topics change).
    pub register_interval_ms: u64,
    /// The name server drops a broker that has not registered for this long
    /// (unless its registration names another `heartbeatTimeoutMillis`).
    pub broker_timeout_ms: u64,
    /// An orderly consumer's queue lock lapses when not renewed for this long.
    pub lock_expiry_ms: u64,
    /// A half (transactional) message unresolved this long is checked with its producer.
    pub transaction_timeout_ms: u64,
    /// How often unresolved half messages are looked for.
    pub transaction_check_interval_ms: u64,
    /// Checks per half message; after the last one it is discarded to TRANS_CHECK_MAX_TIME_TOPIC.
    pub transaction_check_max: u32,
    /// Half messages checked at most per scan (each check holds a copy of
    /// its message); the rest wait for the next scan.
    pub transaction_checks_per_scan: u32,
    /// The `version` this server reports (MQVersion ordinal; ≥ 401 for JSON route bodies).
    pub server_version: i32,
    /// Most open connections on each listener (name server, broker; 0 = no
    /// limit); more are closed at accept.
    pub max_connections: u32,
    /// Most open connections from one source address per listener (0 = no limit).
    pub max_connections_per_ip: u32,
    /// A connection that sends no complete frame for this long is closed
    /// (RocketMQ `serverChannelMaxIdleTimeSeconds`: 120 s; clients heartbeat every 30 s).
    pub idle_timeout_ms: u64,
    /// Requests of one connection being handled or answered but not yet
    /// written back; at the limit the connection is not read until one
    /// answer has gone out (a client that never reads its answers stops
    /// being read, instead of growing the broker).
    pub max_inflight_requests_per_connection: u32,
    /// Long-polling pulls one connection may hold open at once (each
    /// waits for messages up to its suspend time, 15 s by default): not
    /// counted in `max_inflight_requests_per_connection` — a client
    /// instance pulls every queue it consumes on a broker over one
    /// connection, so parked pulls would starve its heartbeats and sends.
    /// At the limit the connection is not read until one is answered.
    pub max_held_pulls_per_connection: u32,
    /// Request bytes held in memory at once over all connections of each
    /// listener (Kafka's `queued.max.request.bytes`; 0 = no limit): before
    /// reading a frame a connection reserves its declared length and waits,
    /// not reading, until it fits; the bytes return once the answer is
    /// written.
    pub max_inflight_request_bytes: u64,
    /// Most message bytes one pull answer carries (RocketMQ
    /// `maxTransferBytesOnMessageInMemory`-like); at least one message.
    pub max_pull_bytes: u32,
    /// Most orderly-consumption queue locks held at once (keys come from
    /// clients; expired locks are dropped first).
    pub max_queue_locks: u32,
    /// After an offset reset (INVOKE_BROKER_TO_RESET_OFFSET), how long a
    /// queue's commits from RocketMQ clients that still hold the old
    /// position are ignored: until a client commits or pulls at the reset
    /// offset, at most this long (0 = no hold).
    pub offset_reset_hold_ms: u64,
    /// Most (group, topic, queue) resets held at once; a reset beyond it is
    /// refused (SYSTEM_BUSY).
    pub max_offset_resets_held: u32,
    /// Most RocketMQ clients (client ids from heartbeats) known at once
    /// (0 = no limit); a heartbeat from a new one beyond it is refused.
    pub max_clients: u32,
    /// Most consumer groups with live members at once (0 = no limit); a
    /// heartbeat naming a new group beyond it is refused for that group.
    pub max_consumer_groups: u32,
    /// Most consumer groups one client is a member of (0 = no limit); a
    /// heartbeat naming a new group beyond it is refused for that group.
    pub max_groups_per_client: u32,
    /// Most bytes of subscriptions (topics and expressions of every live
    /// consumer group) kept at once (0 = no limit): a group whose
    /// heartbeat would take more is refused for that group.
    pub max_subscription_bytes: u64,
    /// Registrations (broker name, id) a name server holds at most; a new
    /// one beyond it is refused.
    pub namesrv_max_brokers: u32,
    /// (topic, broker name) route entries all registrations together may
    /// hold (0 = no limit); a registration that would pass it is refused.
    pub namesrv_max_route_entries: u32,
    /// Requests the broker sends a client (NOTIFY_CONSUMER_IDS_CHANGED,
    /// CHECK_TRANSACTION_STATE, RESET_CONSUMER_CLIENT_OFFSET) queued to one
    /// connection and not yet written at most; more are dropped.
    pub max_unwritten_pushes_per_connection: u32,
    /// Bytes of answers and pushes queued to one connection and not yet
    /// written, at most: past it the connection's next requests are not
    /// read (nor its pulls given more than the room left, one message at
    /// least) until the client has read some.
    pub max_unwritten_bytes_per_connection: u64,
    /// A consumer group with no committed offset on a queue that still
    /// starts at 0 begins at 0 (QUERY_CONSUMER_OFFSET answers 0) while the
    /// queue's first message lies within the newest this-% of physical
    /// memory's worth of CommitLog (RocketMQ `accessMessageInMemoryMaxRatio`).
    pub access_message_in_memory_max_ratio: u8,
    /// Cluster mode: route requests for a topic this node has not taken
    /// from the cluster yet that read etcd at once (more answer from the
    /// registrations alone).
    pub namesrv_route_lookups: u32,
    /// Such a read gives up after this long (the topic is then unknown).
    pub namesrv_route_lookup_timeout_ms: u64,
    /// TLS on the broker and name server listeners, as RocketMQ's
    /// `tls.server.mode`: `disabled`, `permissive` (TLS and plaintext
    /// clients on the same port) or `enforcing` (TLS only).
    pub tls_mode: TlsMode,
    /// PEM certificate chain (leaf first) and key of those listeners.
    pub tls_certificate: String,
    pub tls_key: String,
    /// PEM CAs whose client certificates are required (RocketMQ's
    /// `tls.server.need.client.auth = require`); empty: none asked.
    pub tls_client_ca: String,
    /// A TLS handshake (or a first byte) not done within this long closes
    /// the connection.
    pub tls_handshake_timeout_ms: u64,
    /// Signed requests (AccessKey / Signature) from one address that fail
    /// verification this many times within `auth_failure_window_ms` make
    /// its signed requests refused unchecked until the window has passed.
    pub auth_max_failures_per_address: u32,
    pub auth_failure_window_ms: u64,
}

/// RocketMQ's `tls.server.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    #[default]
    Disabled,
    Permissive,
    Enforcing,
}

impl Default for RocketMqConfig {
    fn default() -> Self {
        RocketMqConfig {
            enabled: true,
            namesrv_listen: SocketAddr::from(([127, 0, 0, 1], 9876)),
            broker_listen: SocketAddr::from(([127, 0, 0, 1], 10911)),
            advertised_addr: String::new(),
            broker_name: "broker-a".into(),
            cluster_name: "DefaultCluster".into(),
            max_frame_bytes: 16 * 1024 * 1024,
            max_auto_create_queues: 8,
            client_timeout_ms: 120_000,
            namesrv_enabled: true,
            broker_enabled: true,
            namesrv_addr: String::new(),
            register_interval_ms: 30_000,
            broker_timeout_ms: 120_000,
            lock_expiry_ms: 60_000,
            transaction_timeout_ms: 6_000,
            transaction_check_interval_ms: 30_000,
            transaction_check_max: 15,
            transaction_checks_per_scan: 2_000,
            server_version: 479,
            max_connections: 10_000,
            max_connections_per_ip: 2_000,
            idle_timeout_ms: 120_000,
            max_inflight_requests_per_connection: 1024,
            max_held_pulls_per_connection: 8192,
            max_inflight_request_bytes: 256 * 1024 * 1024,
            max_pull_bytes: 4 * 1024 * 1024,
            max_queue_locks: 100_000,
            offset_reset_hold_ms: 60_000,
            max_offset_resets_held: 100_000,
            max_clients: 100_000,
            max_consumer_groups: 100_000,
            max_groups_per_client: 1_000,
            max_subscription_bytes: 64 << 20,
            namesrv_max_brokers: 1_024,
            namesrv_max_route_entries: 2_000_000,
            max_unwritten_pushes_per_connection: 1_024,
            max_unwritten_bytes_per_connection: 64 << 20,
            access_message_in_memory_max_ratio: 40,
            namesrv_route_lookups: 4,
            tls_mode: TlsMode::Disabled,
            tls_certificate: String::new(),
            tls_key: String::new(),
            tls_client_ca: String::new(),
            tls_handshake_timeout_ms: 10_000,
            auth_max_failures_per_address: 20,
            auth_failure_window_ms: 60_000,
            namesrv_route_lookup_timeout_ms: 2_000,
        }
    }
}
