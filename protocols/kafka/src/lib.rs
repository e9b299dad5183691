//! The Kafka listener. `conn` owns a socket and its framing; `dispatch`
//! turns a frame into a typed request (kafka-protocol) and calls the handler
//! of its API in `api/`; handlers never see bytes. Errors become Kafka error
//! codes in `errors` only.

pub mod api;
pub mod authz;
pub mod config;
mod conn;
pub mod errors;
pub mod groups;
pub mod mixed;
pub mod sasl;
pub mod sessions;
pub mod tls;
pub mod versions;

use std::sync::Arc;

use rokka_broker::Broker;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::KafkaConfig;
pub use conn::decode_request;

/// What a listener tells its clients to connect to (Metadata,
/// FindCoordinator, DescribeCluster): its own host and port, and in
/// cluster mode every node's listener of the same kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: i32,
    /// The SSL listener (else the plaintext one).
    pub ssl: bool,
    /// Clients authenticate with SASL before any other request.
    pub sasl: bool,
}

/// Shared state of the Kafka frontend.
#[derive(Debug)]
pub struct Kafka {
    pub broker: Arc<Broker>,
    pub config: KafkaConfig,
    /// Host and port put in Metadata and FindCoordinator responses.
    pub advertised_host: String,
    pub advertised_port: i32,
    pub groups: Arc<groups::Groups>,
    /// Connection counts (per listener, per source address).
    pub conns: Arc<rokka_broker::limits::ConnLimits>,
    /// Request bytes in memory over all connections.
    pub inflight: rokka_broker::limits::ByteBudget,
    /// Incremental fetch sessions (KIP-227).
    pub fetch_sessions: sessions::FetchSessions,
    /// SASL authentications running at once (PLAIN's PBKDF2 is costly).
    pub sasl_checks: tokio::sync::Semaphore,
    /// Failed authentications by source address.
    pub sasl_failures: rokka_broker::limits::AuthFailures,
    /// Cluster mode: Metadata's reads of etcd's topic table running now.
    pub topic_lookups: tokio::sync::Semaphore,
    /// DescribeLogDirs' partition sizes as last summed: (queue identity,
    /// first entry, end entry, bytes) by (topic, queue), so a request adds
    /// only the entries appended since (it summed every entry each time).
    pub log_dir_sizes: std::sync::Mutex<std::collections::HashMap<(String, u32), LogDirSize>>,
}

/// A partition's size as DescribeLogDirs last summed it: the queue (held
/// weakly: a queue made again under the name is another), its first and
/// end entry, the last entry's CommitLog offset (a cut and re-append is
/// told by it), and the bytes.
pub type LogDirSize = (
    std::sync::Weak<rokka_store::consume_queue::ConsumeQueue>,
    u64,
    u64,
    u64,
    i64,
);

impl Kafka {
    pub fn new(
        broker: Arc<Broker>,
        config: KafkaConfig,
        group: rokka_group::GroupConfig,
        bound: std::net::SocketAddr,
    ) -> Kafka {
        let advertised_host = if config.advertised_host.is_empty() {
            bound.ip().to_string()
        } else {
            config.advertised_host.clone()
        };
        let advertised_port = if config.advertised_port == 0 {
            i32::from(bound.port())
        } else {
            i32::from(config.advertised_port)
        };
        let conns = rokka_broker::limits::ConnLimits::new(
            "kafka",
            config.max_connections as usize,
            config.max_connections_per_ip as usize,
        );
        let inflight = rokka_broker::limits::ByteBudget::new("kafka", config.max_inflight_request_bytes);
        let fetch_sessions = sessions::FetchSessions::new(
            config.max_fetch_sessions as usize,
            config.max_fetch_session_partitions as usize,
            std::time::Duration::from_millis(config.fetch_session_idle_ms.max(1)),
        );
        let groups = Arc::new(groups::Groups::new(group));
        broker.set_replicated_groups(Arc::clone(&groups) as Arc<dyn rokka_broker::remote::ReplicatedGroups>);
        let sasl_checks = tokio::sync::Semaphore::new(config.sasl_max_concurrent_password_checks.max(1) as usize);
        let sasl_failures = rokka_broker::limits::AuthFailures::new(
            "rokka_kafka_sasl_failing_addresses",
            config.sasl_max_failures_per_address,
            std::time::Duration::from_millis(config.sasl_failure_window_ms),
        );
        let topic_lookups = tokio::sync::Semaphore::new(config.metadata_topic_lookups as usize);
        Kafka {
            log_dir_sizes: Default::default(),
            topic_lookups,
            sasl_failures,
            sasl_checks,
            conns,
            inflight,
            fetch_sessions,
            broker,
            config,
            advertised_host,
            advertised_port,
            groups,
        }
    }
}

impl Kafka {
    /// The plaintext listener's endpoint.
    pub fn plaintext(&self) -> Endpoint {
        Endpoint {
            host: self.advertised_host.clone(),
            port: self.advertised_port,
            ssl: false,
            sasl: false,
        }
    }
}

/// Starts the frontend's background work (group ticker, mixed groups,
/// transaction completion and expiry), once whatever its listeners.
pub fn spawn_background(kafka: &Arc<Kafka>, shutdown: &watch::Receiver<bool>) {
    let offsets: Arc<dyn groups::OffsetsHandle> = kafka.broker.store().clone();
    let broker = Arc::clone(&kafka.broker);
    let consumer_groups = move |live| broker.membership().set_consumer_protocol_groups(live);
    let broker = Arc::clone(&kafka.broker);
    let coordinating = move || broker.cluster_view().is_none_or(|v| v.is_master());
    let broker = Arc::clone(&kafka.broker);
    let elsewhere = move |g: &str| {
        let m = broker.membership();
        !m.get(g).rocketmq.is_empty() || !m.pop_consumers(g, rokka_store::now_ms()).is_empty()
    };
    tokio::spawn(Arc::clone(&kafka.groups).run_ticker(
        offsets,
        consumer_groups,
        coordinating,
        elsewhere,
        shutdown.clone(),
    ));
    tokio::spawn(mixed::run(Arc::clone(kafka), shutdown.clone()));
    tokio::spawn(run_transactions(Arc::clone(&kafka.broker), shutdown.clone()));
}

/// Accepts connections on one listener until `shutdown` turns true; with
/// `tls`, each completes a TLS handshake (within
/// `ssl_handshake_timeout_ms`) before its first request.
pub async fn serve(
    listener: TcpListener,
    kafka: Arc<Kafka>,
    at: Endpoint,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    let at = Arc::new(at);
    let mut accept_errors = rokka_broker::limits::AcceptErrors::new(match (at.ssl, at.sasl) {
        (_, true) => "kafka_sasl",
        (true, false) => "kafka_ssl",
        (false, false) => "kafka",
    });
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted.inspect(|_| accept_errors.accepted()) {
                // An address whose authentications keep failing is held
                // off SASL listeners for a while (counted, not logged).
                Ok((stream, peer)) if at.sasl && kafka.sasl_failures.blocked(peer.ip()) => {
                    metrics::counter!("rokka_kafka_sasl_connections_refused_total").increment(1);
                    drop(stream);
                }
                Ok((stream, peer)) => match kafka.conns.admit(peer.ip()) {
                    Ok(slot) => {
                        let k = Arc::clone(&kafka);
                        let sd = shutdown.clone();
                        let at = Arc::clone(&at);
                        let _ = stream.set_nodelay(true);
                        match tls.clone() {
                            None => {
                                tokio::spawn(async move { conn::run(stream, peer, k, at, sd, slot, None).await });
                            }
                            Some(acceptor) => {
                                tokio::spawn(async move {
                                    let wait = std::time::Duration::from_millis(k.config.ssl_handshake_timeout_ms.max(1));
                                    match tokio::time::timeout(wait, acceptor.accept(stream)).await {
                                        Ok(Ok(s)) => {
                                            metrics::counter!("rokka_kafka_tls_handshakes_total", "result" => "ok").increment(1);
                                            let principal = tls::peer_principal(s.get_ref().1);
                                            conn::run(s, peer, k, at, sd, slot, principal).await
                                        }
                                        // Counted; a log line per failed
                                        // handshake would let anyone flood it.
                                        Ok(Err(e)) => {
                                            metrics::counter!("rokka_kafka_tls_handshakes_total", "result" => "failed").increment(1);
                                            tracing::debug!(%peer, error = %e, "Kafka TLS handshake failed");
                                        }
                                        Err(_) => {
                                            metrics::counter!("rokka_kafka_tls_handshakes_total", "result" => "timeout").increment(1);
                                            tracing::debug!(%peer, "Kafka TLS handshake timed out");
                                        }
                                    }
                                });
                            }
                        }
                    }
                    // Counted in rokka_connections_refused_total; a log line
                    // per refusal would let a client flood the log.
                    Err(why) => {
                        tracing::debug!(%peer, reason = why.as_str(), "Kafka connection refused");
                        drop(stream);
                    }
                },
                Err(e) => {
                    accept_errors.failed(&e);
                    tokio::time::sleep(rokka_broker::limits::AcceptErrors::PAUSE).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
}

/// Completes transactions a crash left prepared, then aborts timed-out
/// ones, forgets expired transactional ids and completes transactions
/// still prepared (another set not reached) every second. In cluster
/// mode only a master does either (a replica's state is its master's
/// copy), and a node that has just become master first completes what the
/// old master left prepared.
async fn run_transactions(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    // The store takes writes only on a master (always on a single node).
    let is_master = |b: &Broker| b.store().is_leader() && b.cluster_view().is_none_or(|v| v.is_master());
    let mut completed = false;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        if !is_master(&broker) {
            completed = false;
        } else if !completed {
            // Once: what is not complete now (another set away) is tried
            // again below, while timeouts and expiry go on.
            if let Err(e) = broker.complete_prepared_transactions(0).await {
                tracing::error!(error = %e, "completing prepared transactions failed; retried every second");
            }
            completed = true;
        } else {
            // Several broker sets: a transaction another set's master did
            // not confirm ending is tried again (its client is answered
            // CONCURRENT_TRANSACTIONS meanwhile).
            if let Err(e) = broker.complete_prepared_transactions(2_000).await {
                tracing::debug!(error = %e, "a prepared transaction is not complete yet");
            }
            broker.txn_expire(rokka_store::now_ms()).await;
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
    }
}
