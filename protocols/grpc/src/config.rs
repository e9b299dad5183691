//! `[grpc]`: the RocketMQ 5 gRPC listener (Apache's proxy, port 8081).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcConfig {
    /// Serve `apache.rocketmq.v2.MessagingService` (RocketMQ 5 clients).
    pub enabled: bool,
    /// Where (Apache's proxy listens on 8081).
    pub listen: SocketAddr,
    /// The address routes give clients (host:port); empty: the bound one.
    pub advertised_addr: String,
    /// TLS: a PEM certificate chain and key; empty: plaintext (the Python
    /// and Node clients' default). With both set every connection is TLS.
    pub tls_certificate: String,
    pub tls_key: String,
    /// PEM CAs whose client certificates are required; a call without an
    /// `authorization` header is then `User:<subject DN>` (as on Kafka's
    /// SSL listener). Empty: none asked.
    pub tls_client_ca: String,
    /// At most this many client connections at once (more are closed at
    /// accept, counted in `rokka_rocketmq5_connections_refused_total`).
    pub max_connections: u32,
    /// At most this many connections from one address (0 = no limit; more
    /// are closed at accept, `rokka_connections_refused_total{listener="grpc"}`).
    pub max_connections_per_ip: u32,
    /// A connection whose client has not sent its HTTP/2 preface this
    /// long after it connected is closed (ms).
    pub preface_timeout_ms: u64,
    /// At most this many concurrent calls (HTTP/2 streams) per connection.
    pub max_concurrent_streams: u32,
    /// The largest request message (bytes) a client may send; larger ones
    /// are refused by the gRPC layer by their length prefix (OUT_OF_RANGE).
    pub max_request_bytes: u32,
    /// Request bytes held in memory at once over the listener (0 = no
    /// limit): a call whose bytes find no room ends RESOURCE_EXHAUSTED
    /// (`rokka_inflight_request_bytes{listener="grpc"}`).
    pub max_inflight_request_bytes: u64,
    /// A request not received whole this long after its first byte (a
    /// Telemetry message: after the message's first byte) ends
    /// DEADLINE_EXCEEDED, and what it sent is let go (ms).
    pub request_read_timeout_ms: u64,
    /// The largest message body a producer may send (told to producers in
    /// their settings; larger ones are refused MESSAGE_BODY_TOO_LARGE).
    pub max_body_bytes: u32,
    /// User properties one message may carry at most (Apache's proxy
    /// `userPropertyMaxNum`); more: MESSAGE_PROPERTIES_TOO_LARGE (0: no limit).
    pub max_user_properties: u32,
    /// Bytes of a message's user properties, tag and keys together at most
    /// (Apache's `maxUserPropertySize`); more: MESSAGE_PROPERTIES_TOO_LARGE (0: no limit).
    pub max_user_property_bytes: u32,
    /// A message group (FIFO) must be shorter than this many bytes
    /// (Apache's `maxMessageGroupSize`); else ILLEGAL_MESSAGE_GROUP (0: no limit).
    pub max_message_group_bytes: u32,
    /// At most this many messages per ReceiveMessage (larger batch sizes
    /// are lowered to it).
    pub max_receive_batch: u32,
    /// The longest a ReceiveMessage waits for messages (ms); a client asking
    /// longer is held this long.
    pub max_long_polling_ms: u64,
    /// Deliveries of one message to a pop group before it goes to
    /// `%DLQ%<group>` (Apache: the group's retryMaxTimes 16, plus one).
    pub max_delivery_attempts: u32,
    /// The shortest invisible duration a ReceiveMessage may ask for (ms;
    /// Apache's proxy: 10 s). Shorter ones are refused ILLEGAL_INVISIBLE_TIME.
    pub min_invisible_ms: u64,
    /// The longest invisible duration (ms; Apache: 12 h).
    pub max_invisible_ms: u64,
    /// A ReceiveMessage with `auto_renew` (every SDK's push consumer):
    /// its messages are invisible this long (Apache's proxy
    /// defaultInvisibleTimeMills, 60 s) and renewed by as much while their
    /// client is alive (it heartbeats or receives) and they are not acked.
    pub auto_renew_invisible_ms: u64,
    /// The longest a message is kept invisible by renewals (Apache's
    /// renewMaxTimeMillis, 3 h); then it is delivered again.
    pub auto_renew_max_ms: u64,
    /// Groups that consume in order (Apache: a subscription group with
    /// consumeMessageOrderly): a queue hands such a group one batch at a
    /// time, the next only once it is acked (or its invisible time ended
    /// and it is delivered again first); their clients are told `fifo`.
    pub fifo_groups: Vec<String>,
    /// Messages handed out and not yet acked, over every group (more
    /// ReceiveMessage calls answer TOO_MANY_REQUESTS until acks come).
    pub max_in_flight_messages: u64,
    /// (group, topic, queue) pop states at most (each a cursor and its
    /// in-flight messages); past it, idle ones are let go, else receives
    /// on new queues answer TOO_MANY_REQUESTS.
    pub max_pop_queues: u32,
    /// Pop consumers (client ids of Simple/Push consumers, per group)
    /// tracked at most, over every group: a group with live pop consumers
    /// is not shared with queue owners. Past it silent ones are forgotten
    /// first, then new ones are not tracked
    /// (`rokka_rocketmq5_pop_consumers_untracked_total`). 0 = no limit.
    pub max_pop_consumers: u32,
    /// How often the pop state (cursors, in-flight messages and their
    /// handles) is written to `<data_dir>/config/pop-state.json` when it
    /// changed (ms); also at shutdown. After a crash, acks of the last
    /// interval may be lost: those messages come again (at least once).
    pub pop_state_flush_ms: u64,
    /// At most this many Telemetry streams at once (one per client).
    pub max_telemetry_streams: u32,
    /// A Telemetry stream that sends nothing this long is ended (ms).
    /// Clients heartbeat on other calls; on this stream they send their
    /// settings only every 5 minutes (Java, Node.js), so this must stay
    /// above that. Dead peers are found sooner by HTTP/2 pings (30 s).
    pub idle_timeout_ms: u64,
    /// With `security.authorization` on: an address whose signed calls
    /// failed verification this many times within `auth_failure_window_ms`
    /// has its signed calls refused unchecked until the window has passed.
    pub auth_max_failures_per_address: u32,
    pub auth_failure_window_ms: u64,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            enabled: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            advertised_addr: String::new(),
            tls_certificate: String::new(),
            tls_key: String::new(),
            tls_client_ca: String::new(),
            max_connections: 1024,
            max_connections_per_ip: 256,
            preface_timeout_ms: 10_000,
            max_concurrent_streams: 256,
            max_request_bytes: 8 << 20,
            max_inflight_request_bytes: 256 << 20,
            request_read_timeout_ms: 30_000,
            max_body_bytes: 4 << 20,
            max_user_properties: 128,
            max_user_property_bytes: 16 * 1024,
            max_message_group_bytes: 64,
            max_receive_batch: 32,
            max_long_polling_ms: 30_000,
            max_delivery_attempts: 17,
            fifo_groups: Vec::new(),
            min_invisible_ms: 10_000,
            max_invisible_ms: 12 * 3600 * 1000,
            auto_renew_invisible_ms: 60_000,
            auto_renew_max_ms: 3 * 3600 * 1000,
            max_in_flight_messages: 100_000,
            max_pop_queues: 100_000,
            max_pop_consumers: 100_000,
            pop_state_flush_ms: 1000,
            max_telemetry_streams: 1024,
            idle_timeout_ms: 600_000,
            auth_max_failures_per_address: 20,
            auth_failure_window_ms: 60_000,
        }
    }
}
