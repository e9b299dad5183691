//! `rokka`: the message gateway binary. With no arguments it serves with the
//! embedded defaults (data under `./data`, listeners on 127.0.0.1).

mod admin;
mod config;
mod console;
mod endpoint;
mod help;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::MetricKindMask;
use rokka_broker::Broker;
use rokka_kafka::Kafka;
use rokka_remoting::{NameServer, RocketMq};
use rokka_store::MessageStore;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

use crate::config::Config;

#[derive(Debug, Parser)]
#[command(name = "rokka", version, about = "Kafka and RocketMQ protocols over one store")]
struct Args {
    /// TOML config file (every key optional; see config/rokka.toml).
    #[arg(short, long, env = "ROKKA_CONFIG")]
    config: Option<PathBuf>,
    /// Overrides `store.data_dir`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Run only the RocketMQ name server (no store, no Kafka, no broker);
    /// brokers register with it through `rocketmq.namesrv_addr`.
    #[arg(long)]
    namesrv_only: bool,
    /// Print the effective configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// Once every listener is bound, write their addresses to this file as
    /// JSON (`{"kafka": "127.0.0.1:9092", ...}`): with port 0 in the config,
    /// the kernel picks free ports and this file tells which.
    #[arg(long)]
    ports_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Tools for a store's data directory.
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
    /// Topics: list, describe, create, delete, add partitions, configs
    /// (through a node's Kafka listener, `--brokers`).
    Topic {
        #[command(flatten)]
        conn: admin::Conn,
        #[command(subcommand)]
        action: admin::TopicAction,
    },
    /// Consumer groups of both protocols: list, describe with lag, reset
    /// offsets, delete.
    Group {
        #[command(flatten)]
        conn: admin::Conn,
        #[command(subcommand)]
        action: admin::GroupAction,
    },
    /// Messages by queue offset, message id, key or time (RocketMQ
    /// remoting, through the name server `--namesrv`).
    Message {
        #[command(flatten)]
        conn: admin::RmqConn,
        #[command(subcommand)]
        action: admin::MessageAction,
    },
    /// A consumer group's dead letters: list, show, resend to the original
    /// topic with a result per message.
    Dlq {
        #[command(flatten)]
        conn: admin::RmqConn,
        #[command(subcommand)]
        action: admin::DlqAction,
    },
    /// `status` asks any node for the brokers it knows; `drain`/`undrain`
    /// act on the cluster the config's `[cluster]` names, through its etcd.
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
}

#[derive(Debug, clap::Subcommand)]
enum ClusterAction {
    /// The brokers, the controller, and the partitions each leads.
    Status {
        #[command(flatten)]
        conn: admin::Conn,
    },
    /// Marks a broker set as draining: new topics and new partitions are
    /// placed on the other sets; nothing already placed moves.
    Drain {
        /// The broker set (`cluster.broker_set` of its nodes).
        set: String,
    },
    /// Lets a drained broker set take new placements again.
    Undrain { set: String },
}

#[derive(Debug, clap::Subcommand)]
enum StoreAction {
    /// Verify a stopped data directory (every CommitLog entry, every
    /// ConsumeQueue entry against its record, queue ends): exit 0 when
    /// sound, 1 with each problem printed, 2 when it cannot be checked.
    Check {
        /// Then open the store (recovering it) and re-append every valid
        /// entry recovery saved in lost+found/ to its topic and queue.
        #[arg(long)]
        reappend_lost_found: bool,
    },
}

/// Buckets for `*_seconds` histograms: 10 µs .. 10 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// How long the listeners may take to finish their connections after a
/// SIGTERM before the store is closed anyway.
const SHUTDOWN_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// `--namesrv-only`: a RocketMQ name server and nothing else — no store,
/// so neither the brokers' listeners nor the gRPC service and the console
/// (which read the store; the embedded defaults turn those on, and
/// `--namesrv-only` without a config failed with "grpc.enabled needs the
/// store").
fn namesrv_only(cfg: &mut Config) {
    cfg.kafka.enabled = false;
    cfg.rocketmq.enabled = true;
    cfg.rocketmq.broker_enabled = false;
    cfg.rocketmq.namesrv_enabled = true;
    cfg.grpc.enabled = false;
    cfg.console.enabled = false;
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Admin commands speak to a running node: no config of their own.
    match &args.command {
        Some(Command::Topic { conn, action }) => return admin::topic(conn, action),
        Some(Command::Group { conn, action }) => return admin::group(conn, action),
        Some(Command::Message { conn, action }) => return admin::message(conn, action),
        Some(Command::Dlq { conn, action }) => return admin::dlq(conn, action),
        Some(Command::Cluster {
            action: ClusterAction::Status { conn },
        }) => return admin::cluster_status(conn),
        _ => {}
    }
    let mut cfg = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("rokka: {e}");
                return ExitCode::from(2);
            }
        },
        None => Config::default(),
    };
    if args.config.is_none() {
        // The embedded defaults serve the console and the RocketMQ 5 gRPC
        // listener too, on loopback: every client family works out of the box.
        cfg.console.enabled = true;
        cfg.grpc.enabled = true;
    }
    if let Some(dir) = args.data_dir {
        cfg.store.data_dir = dir;
    }
    if args.namesrv_only {
        namesrv_only(&mut cfg);
    }
    if cfg.rocketmq.enabled
        && cfg.rocketmq.broker_enabled
        && !cfg.rocketmq.namesrv_enabled
        && cfg.rocketmq.namesrv_addr.trim().is_empty()
    {
        eprintln!(
            "rokka: rocketmq.broker_enabled needs a name server: set rocketmq.namesrv_enabled or rocketmq.namesrv_addr"
        );
        return ExitCode::from(2);
    }
    // A broker on a wildcard address with nothing advertised routes
    // clients to 0.0.0.0 (and puts it in every message id): they would
    // dial themselves. Said loudly at start (not refused: a node whose
    // clients speak Kafka or gRPC only does not need the remoting address,
    // and cluster mode advertises cluster.advertised_host).
    let wildcard_broker = cfg.rocketmq.enabled
        && cfg.rocketmq.broker_enabled
        && cfg.rocketmq.broker_listen.ip().is_unspecified()
        && cfg.rocketmq.advertised_addr.trim().is_empty()
        && (!cfg.cluster.enabled || cfg.cluster.advertised_host.trim().is_empty());
    if wildcard_broker {
        eprintln!(
            "rokka: warning: rocketmq.broker_listen = {} is a wildcard address and rocketmq.advertised_addr is empty: RocketMQ routes and message ids will name it; set rocketmq.advertised_addr to the address clients reach this broker at",
            cfg.rocketmq.broker_listen
        );
    }
    if cfg.cluster.enabled {
        if let Err(e) = cfg.cluster.validate() {
            eprintln!("rokka: {e}");
            return ExitCode::from(2);
        }
        // In cluster mode the node id is the Kafka broker id.
        cfg.kafka.node_id = cfg.cluster.node_id as i32;
    }
    if let Some(Command::Cluster { action }) = &args.command {
        let (set, draining) = match action {
            ClusterAction::Drain { set } => (set, true),
            ClusterAction::Undrain { set } => (set, false),
            ClusterAction::Status { .. } => return ExitCode::from(2),
        };
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("rokka: {e}");
                return ExitCode::from(2);
            }
        };
        return match rt.block_on(rokka_cluster::controller::set_draining(&cfg.cluster, set, draining)) {
            Ok(()) => {
                println!(
                    "broker set {set}: {}",
                    if draining { "draining" } else { "taking placements" }
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rokka: {e}");
                ExitCode::from(1)
            }
        };
    }
    if let Some(Command::Store {
        action: StoreAction::Check { reappend_lost_found },
    }) = &args.command
    {
        return store_check(&cfg, *reappend_lost_found);
    }
    if args.print_config {
        match toml::to_string_pretty(&cfg) {
            Ok(s) => {
                print!("{s}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("rokka: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    // Safe by default: nothing listens beyond this host without the
    // operator saying so, but for listeners whose clients authenticate.
    let open: Vec<String> = cfg
        .non_loopback_listeners()
        .iter()
        .map(|(key, addr)| format!("{key} = {addr}"))
        .collect();
    if !open.is_empty() && !cfg.security.allow_unauthenticated_non_loopback {
        eprintln!(
            "rokka: refusing to start: {} is not a loopback address, and its clients do not authenticate — \
             anyone who reaches it could read, write and delete every topic and reset offsets. Bind 127.0.0.1, \
             use an authenticated Kafka listener (kafka.sasl_listen, or kafka.ssl_listen with ssl_sasl or \
             ssl_client_ca), or set [security] allow_unauthenticated_non_loopback = true to run open on a \
             network you trust.",
            open.join(", ")
        );
        return ExitCode::from(2);
    }
    let filter = EnvFilter::try_from_default_env().or_else(|_| EnvFilter::try_new(&cfg.log.level));
    let filter = match filter {
        Ok(f) => f,
        Err(e) => {
            eprintln!("rokka: invalid log.level {:?}: {e}", cfg.log.level);
            return ExitCode::from(2);
        }
    };
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match cfg.log.format {
        // Colour codes only for a terminal: a file or a collector gets text.
        config::LogFormat::Text => logs.with_ansi(std::io::stdout().is_terminal()).init(),
        config::LogFormat::Json => logs.json().init(),
    }
    if !open.is_empty() {
        tracing::warn!(
            listeners = %open.join(", "),
            "running open: listeners beyond loopback with no authentication (security.allow_unauthenticated_non_loopback)"
        );
    }
    // Connections, segments and queue files are file descriptors: take the
    // hard limit (a soft limit of 1024 is common), as Kafka's scripts ask
    // operators to; the connection budgets then bound what clients use.
    let fd_limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => {
            tracing::info!(limit = n, "open file limit");
            Some(n)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open file limit");
            None
        }
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(cfg, args.ports_file, fd_limit)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "rokka stopped");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    mut cfg: Config,
    ports_file: Option<PathBuf>,
    fd_limit: Option<u64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut listeners = Vec::new();
    let mut bound = BTreeMap::new();
    let collectors = rokka_broker::scrape::Collectors::default();
    if cfg.metrics.enabled {
        let idle =
            (cfg.metrics.idle_timeout_ms > 0).then(|| std::time::Duration::from_millis(cfg.metrics.idle_timeout_ms));
        let handle = PrometheusBuilder::new()
            .idle_timeout(MetricKindMask::COUNTER | MetricKindMask::HISTOGRAM, idle)
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
            .install_recorder()
            .map_err(|e| format!("metrics recorder: {e}"))?;
        rokka_broker::hot_metrics::set_idle_timeout(idle).map_err(|e| format!("metrics epoch thread: {e}"))?;
        help::describe_all();
        let l = TcpListener::bind(cfg.metrics.listen)
            .await
            .map_err(|e| format!("metrics endpoint on {}: {e}", cfg.metrics.listen))?;
        let addr = l.local_addr()?;
        bound.insert("metrics", addr);
        if let Some(n) = fd_limit {
            metrics::gauge!("rokka_fd_limit").set(n as f64);
        }
        metrics::gauge!("rokka_security_open_listeners").set(cfg.non_loopback_listeners().len() as f64);
        let m = &cfg.metrics;
        let tls = match (m.tls_certificate.is_empty(), m.tls_key.is_empty()) {
            (true, true) if m.tls_client_ca.is_empty() => None,
            (false, false) => {
                let ca = (!m.tls_client_ca.is_empty()).then(|| std::path::Path::new(&m.tls_client_ca));
                Some(
                    rokka_broker::tls::acceptor(m.tls_certificate.as_ref(), m.tls_key.as_ref(), ca)
                        .map_err(|e| format!("metrics TLS: {e}"))?,
                )
            }
            _ => return Err("metrics TLS needs both metrics.tls_certificate and metrics.tls_key".into()),
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        tracing::info!(listen = %addr, scheme, "Prometheus metrics at /metrics");
        let budget = endpoint::ConnBudget::new(
            "metrics",
            m.max_connections,
            std::time::Duration::from_millis(m.connection_timeout_ms),
        );
        listeners.push(tokio::spawn(endpoint::serve(
            l,
            tls,
            handle,
            collectors.clone(),
            Arc::new(budget),
            stop_rx.clone(),
        )));
    }
    let rocketmq_broker = cfg.rocketmq.enabled && cfg.rocketmq.broker_enabled;
    // The broker listener is bound before the store opens: every record
    // carries its store host, and RocketMQ offset message ids (which tools
    // look messages up by) must name the address this broker answers on.
    let mut broker_listener = None;
    if rocketmq_broker {
        let l = TcpListener::bind(cfg.rocketmq.broker_listen)
            .await
            .map_err(|e| format!("RocketMQ broker listener on {}: {e}", cfg.rocketmq.broker_listen))?;
        if cfg.store.store_host == rokka_store::StoreConfig::default().store_host {
            // Left at its default: the advertised address, else the bound one.
            let bound = l.local_addr()?;
            // A DNS name is resolved once here: message ids carry an IPv4
            // address (RocketMQ's brokerIP1), which tools connect to.
            cfg.store.store_host = advertised_ip(&cfg.rocketmq.advertised_addr).unwrap_or(bound);
        }
        broker_listener = Some(l);
    }
    let store = if cfg.kafka.enabled || rocketmq_broker {
        let store_cfg = cfg.store.clone();
        Some(Arc::new(
            tokio::task::spawn_blocking(move || MessageStore::open(store_cfg)).await??,
        ))
    } else {
        None
    };
    if let (true, Some(s)) = (cfg.cluster.enabled, &store) {
        // No client write before the controller makes this node master,
        // and nothing read past what the set's high watermark is known to
        // cover: a restarted node's tail may hold writes the set never
        // took (its new master truncates them away).
        s.set_leader(false);
        s.set_high_watermark(Some(0));
    }
    let broker = match &store {
        Some(s) => Some(Arc::new(Broker::new(Arc::clone(s), cfg.broker.clone())?)),
        None => None,
    };
    if let (true, Some(b)) = (cfg.cluster.enabled, &broker) {
        b.await_cluster_view();
    }
    if let Some(broker) = &broker {
        // kafka.super_users (credential changes before the ACL table
        // existed) are super users too.
        let mut super_users = cfg.security.super_users.clone();
        super_users.extend(cfg.kafka.super_users.iter().cloned());
        broker.acls().configure(rokka_broker::acl::AclSettings {
            enabled: cfg.security.authorization,
            super_users,
            allow_everyone_if_no_acl_found: cfg.security.allow_everyone_if_no_acl_found,
            max_acls: cfg.security.max_acls as usize,
        });
        if cfg.security.authorization {
            tracing::info!(
                acls = broker.acls().len(),
                "authorization on: requests are checked against the ACL table"
            );
        }
        listeners.push(tokio::spawn(rokka_broker::schedule::run(
            Arc::clone(broker),
            stop_rx.clone(),
        )));
        listeners.push(tokio::spawn(rokka_broker::compaction::run(
            Arc::clone(broker),
            stop_rx.clone(),
        )));
    }
    if let (true, Some(broker)) = (cfg.metrics.enabled, &broker) {
        collectors.add(Arc::clone(broker) as Arc<dyn rokka_broker::scrape::Collect>);
        let b = Arc::clone(broker);
        let mut sd = stop_rx.clone();
        let every = std::time::Duration::from_millis(cfg.metrics.lag_interval_ms.max(100));
        let max_lag_series = cfg.metrics.max_lag_series as usize;
        listeners.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => rokka_broker::offload(|| b.refresh_lag(max_lag_series)),
                    _ = sd.changed() => return,
                }
            }
        }));
    }
    if let (true, Some(broker)) = (cfg.kafka.enabled, &broker) {
        let listener = TcpListener::bind(cfg.kafka.listen)
            .await
            .map_err(|e| format!("Kafka listener on {}: {e}", cfg.kafka.listen))?;
        let addr = listener.local_addr()?;
        bound.insert("kafka", addr);
        let kafka = Arc::new(Kafka::new(
            Arc::clone(broker),
            cfg.kafka.clone(),
            cfg.group.clone(),
            addr,
        ));
        collectors.add(Arc::clone(&kafka.groups) as Arc<dyn rokka_broker::scrape::Collect>);
        tracing::info!(listen = %addr, advertised = %format!("{}:{}", kafka.advertised_host, kafka.advertised_port), "Kafka listener");
        rokka_kafka::spawn_background(&kafka, &stop_rx);
        // The SSL listener beside it (its certificate read now: a bad file
        // stops the start with the reason).
        if let Some(ssl_listen) = cfg.kafka.ssl_listen {
            let k = &cfg.kafka;
            if k.ssl_certificate.is_empty() || k.ssl_key.is_empty() {
                return Err("kafka.ssl_listen needs kafka.ssl_certificate and kafka.ssl_key".into());
            }
            let ca = (!k.ssl_client_ca.is_empty()).then(|| std::path::Path::new(&k.ssl_client_ca));
            let acceptor = rokka_kafka::tls::acceptor(
                std::path::Path::new(&k.ssl_certificate),
                std::path::Path::new(&k.ssl_key),
                ca,
            )
            .map_err(|e| format!("Kafka SSL listener: {e}"))?;
            let l = TcpListener::bind(ssl_listen)
                .await
                .map_err(|e| format!("Kafka SSL listener on {ssl_listen}: {e}"))?;
            let ssl_addr = l.local_addr()?;
            bound.insert("kafka_ssl", ssl_addr);
            let at = rokka_kafka::Endpoint {
                host: kafka.advertised_host.clone(),
                port: if k.ssl_advertised_port == 0 {
                    i32::from(ssl_addr.port())
                } else {
                    i32::from(k.ssl_advertised_port)
                },
                ssl: true,
                sasl: k.ssl_sasl,
            };
            tracing::info!(listen = %ssl_addr, advertised = %format!("{}:{}", at.host, at.port), client_auth = ca.is_some(), sasl = k.ssl_sasl, "Kafka SSL listener");
            listeners.push(tokio::spawn(rokka_kafka::serve(
                l,
                Arc::clone(&kafka),
                at,
                Some(acceptor),
                stop_rx.clone(),
            )));
        }
        if let Some(bad) = cfg
            .kafka
            .sasl_mechanisms
            .iter()
            .find(|m| !rokka_kafka::sasl::MECHANISMS.contains(&m.as_str()))
        {
            return Err(format!(
                "kafka.sasl_mechanisms: unknown mechanism {bad} (known: {})",
                rokka_kafka::sasl::MECHANISMS.join(", ")
            )
            .into());
        }
        // A SASL listener without TLS (Kafka SASL_PLAINTEXT).
        if let Some(sasl_listen) = cfg.kafka.sasl_listen {
            let l = TcpListener::bind(sasl_listen)
                .await
                .map_err(|e| format!("Kafka SASL listener on {sasl_listen}: {e}"))?;
            let sasl_addr = l.local_addr()?;
            bound.insert("kafka_sasl", sasl_addr);
            let port = match cfg.kafka.sasl_advertised_port {
                0 => i32::from(sasl_addr.port()),
                p => i32::from(p),
            };
            let at = rokka_kafka::Endpoint {
                host: kafka.advertised_host.clone(),
                port,
                ssl: false,
                sasl: true,
            };
            tracing::info!(listen = %sasl_addr, advertised = %format!("{}:{}", at.host, at.port), mechanisms = ?cfg.kafka.sasl_mechanisms, "Kafka SASL listener");
            listeners.push(tokio::spawn(rokka_kafka::serve(
                l,
                Arc::clone(&kafka),
                at,
                None,
                stop_rx.clone(),
            )));
        }
        let at = kafka.plaintext();
        listeners.push(tokio::spawn(rokka_kafka::serve(
            listener,
            kafka,
            at,
            None,
            stop_rx.clone(),
        )));
    }
    if cfg.rocketmq.enabled {
        // TLS on both RocketMQ listeners (RocketMQ's tls.server.mode).
        let rmq_tls = match cfg.rocketmq.tls_mode {
            rokka_remoting::TlsMode::Disabled => None,
            mode => {
                let r = &cfg.rocketmq;
                if r.tls_certificate.is_empty() || r.tls_key.is_empty() {
                    return Err("rocketmq.tls_mode needs rocketmq.tls_certificate and rocketmq.tls_key".into());
                }
                let ca = (!r.tls_client_ca.is_empty()).then(|| std::path::Path::new(&r.tls_client_ca));
                let acceptor = rokka_broker::tls::acceptor(r.tls_certificate.as_ref(), r.tls_key.as_ref(), ca)
                    .map_err(|e| format!("rocketmq TLS: {e}"))?;
                tracing::info!(mode = ?mode, client_certificates = ca.is_some(), "RocketMQ listeners take TLS");
                Some(rokka_remoting::Tls {
                    acceptor,
                    enforcing: mode == rokka_remoting::TlsMode::Enforcing,
                    handshake_timeout: std::time::Duration::from_millis(r.tls_handshake_timeout_ms.max(1)),
                })
            }
        };
        let rmq = match (&broker, broker_listener.take()) {
            (Some(broker), Some(l)) => {
                bound.insert("broker", l.local_addr()?);
                let rmq = Arc::new(RocketMq::new(Arc::clone(broker), cfg.rocketmq.clone(), l.local_addr()?));
                rmq.start_mixed_listener();
                broker.add_txn_check_sink(Arc::clone(&rmq) as Arc<dyn rokka_broker::transaction::TxnCheckSink>);
                tracing::info!(broker = %l.local_addr()?, "RocketMQ broker listener");
                listeners.push(tokio::spawn(rokka_remoting::serve_with(
                    l,
                    Arc::clone(&rmq),
                    rmq_tls.clone(),
                    stop_rx.clone(),
                )));
                let r = Arc::clone(&rmq);
                let mut sd = stop_rx.clone();
                listeners.push(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
                    loop {
                        tokio::select! {
                            _ = tick.tick() => r.expire_clients(),
                            _ = sd.changed() => return,
                        }
                    }
                }));
                Some(rmq)
            }
            _ => None,
        };
        let embedded = cfg.rocketmq.namesrv_addr.trim().is_empty();
        let ns = if cfg.rocketmq.namesrv_enabled {
            let l = TcpListener::bind(cfg.rocketmq.namesrv_listen)
                .await
                .map_err(|e| format!("RocketMQ name server listener on {}: {e}", cfg.rocketmq.namesrv_listen))?;
            bound.insert("namesrv", l.local_addr()?);
            // In cluster mode every node's broker registers with every
            // node's name server over the wire (with its role's broker id).
            let local = rmq.clone().filter(|_| embedded && !cfg.cluster.enabled);
            let mut ns = NameServer::new(cfg.rocketmq.clone(), local);
            if let (Some(b), true) = (&broker, cfg.cluster.enabled) {
                ns = ns.with_cluster(Arc::clone(b));
            }
            let ns = Arc::new(ns);
            tracing::info!(namesrv = %l.local_addr()?, "RocketMQ name server listener");
            listeners.push(tokio::spawn(rokka_remoting::serve_with(
                l,
                Arc::clone(&ns),
                rmq_tls.clone(),
                stop_rx.clone(),
            )));
            let n = Arc::clone(&ns);
            let mut sd = stop_rx.clone();
            listeners.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
                loop {
                    tokio::select! {
                        _ = tick.tick() => n.expire_brokers(),
                        _ = sd.changed() => return,
                    }
                }
            }));
            Some(ns)
        } else {
            None
        };
        if let Some(rmq) = rmq {
            let local_ns = ns.filter(|_| embedded && !cfg.cluster.enabled);
            listeners.push(tokio::spawn(rokka_remoting::registrar::run(
                rmq,
                local_ns,
                stop_rx.clone(),
            )));
        }
    }
    if let Some(broker) = &broker {
        // Transaction checks for every frontend's producers (remoting, gRPC).
        let r = &cfg.rocketmq;
        listeners.push(tokio::spawn(Arc::clone(broker).run_transaction_checks(
            std::time::Duration::from_millis(r.transaction_check_interval_ms),
            r.transaction_timeout_ms as i64,
            r.transaction_check_max,
            r.transaction_checks_per_scan.max(1) as usize,
            stop_rx.clone(),
        )));
    }
    if cfg.grpc.enabled {
        let Some(broker) = &broker else {
            return Err("grpc.enabled needs the store: enable kafka or rocketmq.broker_enabled".into());
        };
        let l = TcpListener::bind(cfg.grpc.listen)
            .await
            .map_err(|e| format!("gRPC listener on {}: {e}", cfg.grpc.listen))?;
        let addr = l.local_addr()?;
        bound.insert("grpc", addr);
        let tls = if cfg.grpc.tls_certificate.is_empty() {
            // Client certificates asked for on a plaintext port would be
            // asked of no one: refused, as for the metrics endpoint.
            if !cfg.grpc.tls_client_ca.is_empty() {
                return Err("grpc.tls_client_ca needs grpc.tls_certificate and grpc.tls_key".into());
            }
            None
        } else {
            let ca = (!cfg.grpc.tls_client_ca.is_empty()).then(|| std::path::Path::new(&cfg.grpc.tls_client_ca));
            let acceptor = rokka_broker::tls::acceptor_for(
                cfg.grpc.tls_certificate.as_ref(),
                cfg.grpc.tls_key.as_ref(),
                ca,
                &[b"h2"],
            )
            .map_err(|e| format!("gRPC TLS: {e}"))?;
            Some(rokka_grpc::Tls {
                acceptor,
                handshake_timeout: std::time::Duration::from_millis(cfg.rocketmq.tls_handshake_timeout_ms.max(1)),
            })
        };
        let advertised = if cfg.grpc.advertised_addr.is_empty() {
            addr.to_string()
        } else {
            config::host_port(&cfg.grpc.advertised_addr)
                .map_err(|e| format!("grpc.advertised_addr {:?}: {e}", cfg.grpc.advertised_addr))?
        };
        let messaging = Arc::new(rokka_grpc::Messaging::new(
            Arc::clone(broker),
            cfg.grpc.clone(),
            cfg.rocketmq.broker_name.clone(),
            advertised,
            u32::from(cfg.rocketmq.access_message_in_memory_max_ratio),
        ));
        broker.add_txn_check_sink(Arc::clone(&messaging) as Arc<dyn rokka_broker::transaction::TxnCheckSink>);
        collectors.add(Arc::clone(&messaging) as Arc<dyn rokka_broker::scrape::Collect>);
        tracing::info!(grpc = %addr, tls = tls.is_some(), "RocketMQ 5 gRPC listener");
        listeners.push(tokio::spawn(rokka_grpc::serve(
            l,
            messaging,
            cfg.grpc.clone(),
            tls,
            stop_rx.clone(),
        )));
    }
    if let (true, Some(store), Some(broker)) = (cfg.cluster.enabled, &store, &broker) {
        let host = |key: &str| {
            bound.get(key).map_or(String::new(), |a: &std::net::SocketAddr| {
                let h = if cfg.cluster.advertised_host.is_empty() {
                    a.ip().to_string()
                } else {
                    cfg.cluster.advertised_host.clone()
                };
                format!("{h}:{}", a.port())
            })
        };
        let me = rokka_broker::cluster_view::NodeInfo {
            id: cfg.cluster.node_id,
            set: cfg.cluster.broker_set.clone(),
            kafka: host("kafka"),
            kafka_ssl: host("kafka_ssl"),
            kafka_sasl: host("kafka_sasl"),
            // RocketMQ 5 clients are routed to each set's master here.
            grpc: if cfg.grpc.advertised_addr.is_empty() {
                host("grpc")
            } else {
                cfg.grpc.advertised_addr.clone()
            },
            broker: host("broker"),
            namesrv: host("namesrv"),
            replication: String::new(),
            rack: cfg.cluster.rack.clone(),
            // Set as it registers.
            has_history: false,
        };
        // Several broker sets: other sets' committed offsets are read and
        // written, and Kafka transactions reach their participants, on
        // those sets' masters over the remoting listener.
        // Producer ids handed out here are this node's alone.
        broker.producers().set_id_salt(me.id);
        let remote = Arc::new(rokka_remoting::remote_offsets::RemotingOffsets::new(
            Arc::clone(broker),
            std::time::Duration::from_millis(cfg.cluster.remote_timeout_ms),
        ));
        broker.set_remote_offsets(Arc::clone(&remote) as Arc<dyn rokka_broker::remote::RemoteOffsets>);
        broker.set_remote_txns(remote);
        let (tasks, addr) = rokka_cluster::start(
            cfg.cluster.clone(),
            Arc::clone(store),
            Arc::clone(broker),
            me,
            stop_rx.clone(),
        )
        .await?;
        bound.insert("replication", addr);
        listeners.extend(tasks);
    }
    if cfg.console.enabled {
        let sasl = !cfg.console.user.is_empty() || cfg.console.login;
        let kafka = bound
            .get(if sasl { "kafka_sasl" } else { "kafka" })
            .map(|a| a.to_string());
        let namesrv = match bound.get("namesrv") {
            Some(a) => a.to_string(),
            None => cfg.rocketmq.namesrv_addr.clone(),
        };
        let Some(kafka) = kafka else {
            return Err(if sasl {
                "console.user and console.login need kafka.sasl_listen (the console logs in there)".into()
            } else {
                "the console needs the Kafka listener (kafka.enabled)".into()
            });
        };
        let l = TcpListener::bind(cfg.console.listen)
            .await
            .map_err(|e| format!("console on {}: {e}", cfg.console.listen))?;
        let addr = l.local_addr()?;
        bound.insert("console", addr);
        let credentials = (!cfg.console.user.is_empty()).then(|| admin::Credentials {
            user: cfg.console.user.clone(),
            password: cfg.console.password.clone(),
        });
        let login = match (cfg.console.login, &broker) {
            (false, _) => None,
            (true, Some(b)) => Some(console::Login::new(&cfg.console, Arc::clone(b))),
            (true, None) => return Err("console.login needs the broker's user table (kafka or rocketmq broker)".into()),
        };
        tracing::info!(listen = %addr, login = cfg.console.login, "web console at http://{addr}/");
        let budget = endpoint::ConnBudget::new(
            "console",
            cfg.console.max_connections,
            std::time::Duration::from_millis(cfg.console.connection_timeout_ms),
        );
        listeners.push(tokio::spawn(console::serve(
            l,
            Arc::new(console::Console::new(
                kafka,
                namesrv,
                credentials,
                login,
                cfg.console.allowed_hosts.clone(),
            )),
            Arc::new(budget),
            stop_rx.clone(),
        )));
    }
    if let Some(path) = &ports_file {
        endpoint::write_ports_file(path, &bound).map_err(|e| format!("ports file {}: {e}", path.display()))?;
    }
    tracing::info!(data_dir = %cfg.store.data_dir.display(), "rokka is up");

    shutdown_signal().await?;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    // Every listener finishes its connections within a bound (a stuck one
    // must not keep the store from its clean close: the next start would
    // recover as after a crash).
    let deadline = tokio::time::Instant::now() + SHUTDOWN_LIMIT;
    for l in listeners {
        let abort = l.abort_handle();
        if tokio::time::timeout_at(deadline, l).await.is_err() {
            tracing::warn!("a listener did not stop within {} s: stopped", SHUTDOWN_LIMIT.as_secs());
            abort.abort();
        }
    }
    if let Some(s) = store {
        tokio::task::spawn_blocking(move || s.close()).await??;
    }
    Ok(())
}

/// `rokka store check`: prints what the check found; exit 0 sound, 1
/// problems, 2 not checkable.
fn store_check(cfg: &Config, reappend: bool) -> ExitCode {
    let dir = &cfg.store.data_dir;
    let max_entry = cfg.store.max_stored_entry();
    let report = match rokka_store::check::check_dir(dir, max_entry) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rokka store check: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "{}: {} segments, {} entries up to CommitLog offset {}; {} queues, {} queue entries; {} clean-log entries; {} lost+found files",
        dir.display(),
        report.segments,
        report.entries,
        report.commitlog_end,
        report.queues,
        report.queue_entries,
        report.clean_entries,
        report.lost_found_files
    );
    for p in &report.problems {
        println!("problem: {p}");
    }
    if report.unlisted > 0 {
        println!("... and {} more problems", report.unlisted);
    }
    let mut code = if report.ok() { 0 } else { 1 };
    if reappend {
        let store = match MessageStore::open(cfg.store.clone()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("rokka store check: cannot open the store to re-append: {e}");
                return ExitCode::from(2);
            }
        };
        match rokka_store::check::reappend_lost_found(&store) {
            Ok(r) => println!(
                "re-appended {} entries from {} lost+found files ({} bytes held no valid entry)",
                r.entries, r.files, r.skipped_bytes
            ),
            Err(e) => {
                eprintln!("rokka store check: re-appending lost+found: {e}");
                code = 2;
            }
        }
        if let Err(e) = store.close() {
            eprintln!("rokka store check: closing the store: {e}");
            code = 2;
        }
    }
    if report.ok() {
        println!("ok");
    }
    ExitCode::from(code)
}

/// The socket address of an advertised `host:port` for message ids: as
/// written if it is an IP address, else the name's first IPv4 address (an
/// unresolvable name: none, and the bound address is used).
fn advertised_ip(addr: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    if addr.is_empty() {
        return None;
    }
    if let Ok(a) = addr.parse() {
        return Some(a);
    }
    match addr.to_socket_addrs() {
        Ok(mut all) => {
            let v4 = all.find(std::net::SocketAddr::is_ipv4);
            if v4.is_none() {
                tracing::warn!(
                    addr,
                    "rocketmq.advertised_addr has no IPv4 address; message ids carry the bound address"
                );
            }
            v4
        }
        Err(e) => {
            tracing::warn!(addr, error = %e, "rocketmq.advertised_addr does not resolve; message ids carry the bound address");
            None
        }
    }
}

async fn shutdown_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    Ok(())
}
