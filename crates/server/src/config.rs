//! The `rokka` configuration: TOML, every key optional with the default shown
//! in `config/rokka.toml`; an unknown or mistyped key is an error naming it.

use std::net::SocketAddr;
use std::path::Path;

use rokka_broker::BrokerConfig;
use rokka_group::GroupConfig;
use rokka_kafka::KafkaConfig;
use rokka_remoting::RocketMqConfig;
use rokka_store::StoreConfig;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub log: LogConfig,
    pub metrics: MetricsConfig,
    pub console: ConsoleConfig,
    pub store: StoreConfig,
    pub broker: BrokerConfig,
    pub group: GroupConfig,
    pub kafka: KafkaConfig,
    pub rocketmq: RocketMqConfig,
    pub grpc: rokka_grpc::GrpcConfig,
    pub cluster: rokka_cluster::ClusterConfig,
    pub security: SecurityConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// A listener without authentication (every one but the Kafka SASL
    /// listeners and an SSL listener with client certificates) on an
    /// address other hosts can reach lets anyone read, write, delete
    /// topics and reset offsets. Binding one refuses to start unless this
    /// is true (then every start warns, naming the listeners).
    pub allow_unauthenticated_non_loopback: bool,
    /// Check every Kafka and RocketMQ request against the one ACL table
    /// (managed with Kafka's CreateAcls/DescribeAcls/DeleteAcls); false:
    /// every client may do everything.
    pub authorization: bool,
    /// Principals (`User:name`; a bare name means `User:name`) allowed
    /// everything, ACLs or not (Kafka `super.users`). Clients that did not
    /// authenticate are `User:ANONYMOUS`.
    pub super_users: Vec<String>,
    /// A resource no ACL names is open to every principal (Kafka
    /// `allow.everyone.if.no.acl.found`).
    pub allow_everyone_if_no_acl_found: bool,
    /// At most this many ACLs (more are refused with POLICY_VIOLATION).
    pub max_acls: u32,
}

impl Default for SecurityConfig {
    fn default() -> Self {
        SecurityConfig {
            allow_unauthenticated_non_loopback: false,
            authorization: false,
            super_users: Vec::new(),
            allow_everyone_if_no_acl_found: false,
            max_acls: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` overrides it.
    pub level: String,
    /// `text` (colours only on a terminal) or `json` (one object per line).
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// The web console (`crate::console`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console. Off unless set; `rokka` run with no config file
    /// (the embedded defaults) serves it on `listen` (loopback).
    pub enabled: bool,
    /// Its address. Without `login`, beyond loopback it needs
    /// `security.allow_unauthenticated_non_loopback`, as every open listener.
    pub listen: SocketAddr,
    /// Each visitor logs in with a user of the shared user table (SCRAM or
    /// PLAIN, as Kafka clients do) and the console acts as that user, so
    /// the ACLs decide what each one sees and may resend. Needs
    /// `kafka.sasl_listen` (the console logs in there for them).
    pub login: bool,
    /// A logged-in session ends after this long without a page.
    pub session_timeout_ms: u64,
    /// Sessions held at once; a login beyond it is refused until one ends.
    pub max_sessions: u32,
    /// Failed logins from one address within `login_failure_window_ms`
    /// after which its logins are refused until the window has passed.
    pub login_max_failures_per_address: u32,
    pub login_failure_window_ms: u64,
    /// With `password`: the console's admin calls log into the Kafka SASL
    /// listener (PLAIN) and sign RocketMQ requests as this user, so the ACLs
    /// decide what it may show and resend ("" = anonymous, plaintext).
    pub user: String,
    pub password: String,
    /// Connections served at once (each page a connection's request); more
    /// wait in the listener's accept queue.
    pub max_connections: u32,
    /// One connection's deadline, its pages' admin calls included; a
    /// connection still open then is closed.
    pub connection_timeout_ms: u64,
    /// Host names (the request's Host header, without its port) the console
    /// answers to besides IP addresses and `localhost`: a page of another
    /// site whose name was pointed at this address (DNS rebinding) is
    /// refused.
    pub allowed_hosts: Vec<String>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: false,
            listen: SocketAddr::from(([127, 0, 0, 1], 9180)),
            login: false,
            session_timeout_ms: 30 * 60 * 1000,
            max_sessions: 1000,
            login_max_failures_per_address: 5,
            login_failure_window_ms: 60_000,
            user: String::new(),
            password: String::new(),
            max_connections: 8,
            connection_timeout_ms: 60_000,
            allowed_hosts: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve Prometheus metrics.
    pub enabled: bool,
    /// Address of the `/metrics` endpoint.
    pub listen: SocketAddr,
    /// How often consumer lag (`rokka_consumer_lag`) is recomputed.
    pub lag_interval_ms: u64,
    /// Most (group, topic, queue) series of `rokka_consumer_lag` exported
    /// (0 = no limit): the largest lags are kept.
    pub max_lag_series: u32,
    /// A counter or histogram series not updated for this long is dropped
    /// from /metrics (0 = never). Labels carry client-chosen names (topics,
    /// groups), so without it every name ever seen stays a series.
    pub idle_timeout_ms: u64,
    /// PEM certificate chain: with `tls_key`, the endpoint serves HTTPS only.
    pub tls_certificate: String,
    /// PEM private key of `tls_certificate`.
    pub tls_key: String,
    /// PEM CA: scrapers must present a certificate it signed (mTLS).
    pub tls_client_ca: String,
    /// Scrape connections served at once; more wait in the accept queue.
    pub max_connections: u32,
    /// One scrape connection's deadline (its TLS handshake included).
    pub connection_timeout_ms: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 9100)),
            lag_interval_ms: 10_000,
            max_lag_series: 10_000,
            idle_timeout_ms: 3_600_000,
            tls_certificate: String::new(),
            tls_key: String::new(),
            tls_client_ca: String::new(),
            max_connections: 16,
            connection_timeout_ms: 30_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: String, message: String },
}

impl Config {
    /// The listeners this configuration opens on a non-loopback address
    /// (any address other hosts may reach, the unspecified one included),
    /// by config key.
    pub fn non_loopback_listeners(&self) -> Vec<(&'static str, SocketAddr)> {
        let mut out = Vec::new();
        let mut check = |on: bool, key: &'static str, addr: SocketAddr| {
            if on && !addr.ip().is_loopback() {
                out.push((key, addr));
            }
        };
        check(self.kafka.enabled, "kafka.listen", self.kafka.listen);
        // gRPC clients may call unsigned (User:ANONYMOUS), as RocketMQ's,
        // unless every one presents a certificate (TLS with a client CA).
        let grpc_certified = !self.grpc.tls_certificate.is_empty() && !self.grpc.tls_client_ca.is_empty();
        check(self.grpc.enabled && !grpc_certified, "grpc.listen", self.grpc.listen);
        if let Some(ssl) = self.kafka.ssl_listen {
            // Encrypted is not authenticated: the same rule, unless its
            // clients authenticate (SASL_SSL, or client certificates).
            let authenticated = self.kafka.ssl_sasl || !self.kafka.ssl_client_ca.is_empty();
            check(self.kafka.enabled && !authenticated, "kafka.ssl_listen", ssl);
        }
        // kafka.sasl_listen authenticates every client: not listed.
        // RocketMQ listeners whose every client presents a certificate
        // (enforcing TLS with a client CA) authenticate them.
        let certified =
            self.rocketmq.tls_mode == rokka_remoting::TlsMode::Enforcing && !self.rocketmq.tls_client_ca.is_empty();
        let rmq = self.rocketmq.enabled && !certified;
        check(
            rmq && self.rocketmq.broker_enabled,
            "rocketmq.broker_listen",
            self.rocketmq.broker_listen,
        );
        check(
            rmq && self.rocketmq.namesrv_enabled,
            "rocketmq.namesrv_listen",
            self.rocketmq.namesrv_listen,
        );
        // With its own login the console's users authenticate.
        check(
            self.console.enabled && !self.console.login,
            "console.listen",
            self.console.listen,
        );
        // A metrics endpoint whose scrapers present certificates is not open.
        check(
            self.metrics.enabled && self.metrics.tls_client_ca.is_empty(),
            "metrics.listen",
            self.metrics.listen,
        );
        // With TLS there, only nodes holding a certificate the cluster CA
        // signed replicate.
        check(
            self.cluster.enabled && !self.cluster.replication_tls(),
            "cluster.replication_listen",
            self.cluster.replication_listen,
        );
        out
    }

    /// Parses TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        cfg.store.validate().map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        for (key, addr) in [
            ("rocketmq.advertised_addr", &cfg.rocketmq.advertised_addr),
            ("grpc.advertised_addr", &cfg.grpc.advertised_addr),
        ] {
            if !addr.is_empty() {
                host_port(addr).map_err(|e| ConfigError::Parse {
                    path: origin.to_string(),
                    message: format!("{key} {addr:?}: {e}"),
                })?;
            }
        }
        cfg.check_ranges().map_err(|message| ConfigError::Parse {
            path: origin.to_string(),
            message,
        })?;
        Ok(cfg)
    }

    /// Values each valid on its own that cannot work: a zero that would
    /// refuse every request of its kind, a lower bound above its upper
    /// bound, an interval a client's 32-bit field cannot carry.
    fn check_ranges(&self) -> Result<(), String> {
        for (key, value) in [
            ("metrics.max_connections", u64::from(self.metrics.max_connections)),
            ("metrics.connection_timeout_ms", self.metrics.connection_timeout_ms),
            ("console.max_connections", u64::from(self.console.max_connections)),
            ("console.connection_timeout_ms", self.console.connection_timeout_ms),
            ("grpc.preface_timeout_ms", self.grpc.preface_timeout_ms),
            ("grpc.request_read_timeout_ms", self.grpc.request_read_timeout_ms),
            ("kafka.max_fetch_wait_ms", self.kafka.max_fetch_wait_ms),
            ("broker.max_partitions", u64::from(self.broker.max_partitions)),
            ("broker.default_partitions", u64::from(self.broker.default_partitions)),
            (
                "rocketmq.max_auto_create_queues",
                u64::from(self.rocketmq.max_auto_create_queues),
            ),
            ("console.max_sessions", u64::from(self.console.max_sessions)),
        ] {
            if value == 0 {
                return Err(format!("{key} must be at least 1"));
            }
        }
        for (low_key, low, high_key, high) in [
            (
                "group.min_session_timeout_ms",
                self.group.min_session_timeout_ms,
                "group.max_session_timeout_ms",
                self.group.max_session_timeout_ms,
            ),
            (
                "grpc.min_invisible_ms",
                self.grpc.min_invisible_ms,
                "grpc.max_invisible_ms",
                self.grpc.max_invisible_ms,
            ),
            (
                "broker.default_partitions",
                u64::from(self.broker.default_partitions),
                "broker.max_partitions",
                u64::from(self.broker.max_partitions),
            ),
        ] {
            if low > high {
                return Err(format!("{low_key} ({low}) must not be above {high_key} ({high})"));
            }
        }
        let s = &self.store;
        if s.disk_refuse_writes_percent != 0
            && s.disk_max_used_percent != 0
            && s.disk_refuse_writes_percent < s.disk_max_used_percent
        {
            return Err(format!(
                "store.disk_refuse_writes_percent ({}) must not be below store.disk_max_used_percent ({}): writes would be refused before retention frees space",
                s.disk_refuse_writes_percent, s.disk_max_used_percent
            ));
        }
        // Member ids are a client id cut to 255 bytes and a 34-byte suffix;
        // a smaller bound would refuse the ids the broker itself hands out.
        let ids = self.kafka.max_id_bytes;
        if ids != 0 && ids < 289 {
            return Err(format!(
                "kafka.max_id_bytes ({ids}) must be 0 (no limit) or at least 289 (a member id the broker makes is up to 289 bytes)"
            ));
        }
        // A KIP-848 member heartbeating no sooner than its session ends is
        // dropped between heartbeats (Kafka refuses this too).
        if self.group.consumer_heartbeat_interval_ms >= self.group.consumer_session_timeout_ms {
            return Err(format!(
                "group.consumer_heartbeat_interval_ms ({}) must be below group.consumer_session_timeout_ms ({})",
                self.group.consumer_heartbeat_interval_ms, self.group.consumer_session_timeout_ms
            ));
        }
        let ms = self.group.consumer_heartbeat_interval_ms;
        if ms == 0 || ms > i32::MAX as u64 {
            return Err(format!(
                "group.consumer_heartbeat_interval_ms ({ms}) must be 1..={} (clients carry it in 32 bits)",
                i32::MAX
            ));
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }
}

/// An advertised address as clients are given it: `host:port`, the host
/// an IPv4 address, a bracketed IPv6 address or a DNS name (what a
/// container or a load balancer is reached by), the port 1–65535.
pub fn host_port(addr: &str) -> Result<String, String> {
    if addr.parse::<SocketAddr>().is_ok_and(|a| a.port() != 0) {
        return Ok(addr.to_string());
    }
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| "expected host:port".to_string())?;
    match port.parse::<u16>() {
        Ok(p) if p != 0 => {}
        _ => return Err(format!("port {port:?} is not 1-65535")),
    }
    // A fully qualified name may end with its root dot.
    let name = host.strip_suffix('.').unwrap_or(host);
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if !name_ok {
        return Err(format!("host {host:?} is neither an IP address nor a DNS name"));
    }
    Ok(addr.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = include_str!("../../../config/rokka.toml");

    #[test]
    fn shipped_file_equals_code_defaults() -> Result<(), ConfigError> {
        assert_eq!(Config::parse(SHIPPED, "config/rokka.toml")?, Config::default());
        Ok(())
    }

    #[test]
    fn shipped_file_lists_every_key() -> Result<(), Box<dyn std::error::Error>> {
        // Every key the code knows appears (uncommented) in the shipped file.
        let defaults = toml::Value::try_from(Config::default())?;
        let shipped: toml::Value = toml::from_str(SHIPPED)?;
        let (toml::Value::Table(d), toml::Value::Table(s)) = (defaults, shipped) else {
            panic!("not tables");
        };
        for (section, keys) in &d {
            let toml::Value::Table(keys) = keys else {
                continue;
            };
            for key in keys.keys() {
                let present = s.get(section).and_then(|t| t.get(key)).is_some();
                assert!(present, "config/rokka.toml lacks [{section}] {key}");
            }
        }
        Ok(())
    }

    #[test]
    fn listeners_beyond_loopback_are_named() -> Result<(), ConfigError> {
        assert!(
            Config::default().non_loopback_listeners().is_empty(),
            "the embedded default stays on loopback"
        );
        let c = Config::parse(
            "[kafka]\nlisten = \"0.0.0.0:9092\"\n[rocketmq]\nbroker_listen = \"[::1]:10911\"\n\
             namesrv_listen = \"10.1.2.3:9876\"\n[metrics]\nenabled = false\nlisten = \"0.0.0.0:9100\"\n\
             [security]\nallow_unauthenticated_non_loopback = true\n",
            "t.toml",
        )?;
        let keys: Vec<&str> = c.non_loopback_listeners().iter().map(|(k, _)| *k).collect();
        assert_eq!(keys, ["kafka.listen", "rocketmq.namesrv_listen"]);
        assert!(c.security.allow_unauthenticated_non_loopback);
        // Listeners whose clients authenticate may face the network; an
        // SSL listener without SASL or client certificates may not.
        let listed = |kafka: &str| -> Result<Vec<&'static str>, ConfigError> {
            let c = Config::parse(&format!("[kafka]\n{kafka}\n"), "t.toml")?;
            Ok(c.non_loopback_listeners().iter().map(|(k, _)| *k).collect())
        };
        assert!(listed("sasl_listen = \"0.0.0.0:9094\"")?.is_empty());
        assert_eq!(listed("ssl_listen = \"0.0.0.0:9093\"")?, ["kafka.ssl_listen"]);
        assert!(listed("ssl_listen = \"0.0.0.0:9093\"\nssl_sasl = true")?.is_empty());
        assert!(listed("ssl_listen = \"0.0.0.0:9093\"\nssl_client_ca = \"ca.pem\"")?.is_empty());
        // /metrics: open unless its scrapers present certificates.
        let metrics = |extra: &str| -> Result<Vec<&'static str>, ConfigError> {
            let c = Config::parse(&format!("[metrics]\nlisten = \"0.0.0.0:9100\"\n{extra}"), "t.toml")?;
            Ok(c.non_loopback_listeners().iter().map(|(k, _)| *k).collect())
        };
        assert_eq!(
            metrics("tls_certificate = \"s.pem\"\ntls_key = \"s.key\"")?,
            ["metrics.listen"]
        );
        assert!(metrics("tls_certificate = \"s.pem\"\ntls_key = \"s.key\"\ntls_client_ca = \"ca.pem\"")?.is_empty());
        // The console: open unless its visitors log in.
        let console = |extra: &str| -> Result<Vec<&'static str>, ConfigError> {
            let c = Config::parse(
                &format!("[console]\nenabled = true\nlisten = \"0.0.0.0:9180\"\n{extra}"),
                "t.toml",
            )?;
            Ok(c.non_loopback_listeners().iter().map(|(k, _)| *k).collect())
        };
        assert_eq!(console("")?, ["console.listen"]);
        assert!(console("login = true")?.is_empty());
        // The replication port: open unless only certified nodes replicate.
        let replication = |extra: &str| -> Result<Vec<&'static str>, ConfigError> {
            let c = Config::parse(
                &format!("[cluster]\nenabled = true\nreplication_listen = \"0.0.0.0:10912\"\n{extra}"),
                "t.toml",
            )?;
            Ok(c.non_loopback_listeners().iter().map(|(k, _)| *k).collect())
        };
        assert_eq!(replication("")?, ["cluster.replication_listen"]);
        assert!(replication(
            "replication_certificate = \"n.pem\"\nreplication_key = \"n.key\"\nreplication_ca = \"ca.pem\""
        )?
        .is_empty());
        Ok(())
    }

    #[test]
    fn empty_file_is_all_defaults() -> Result<(), ConfigError> {
        assert_eq!(Config::parse("", "empty")?, Config::default());
        Ok(())
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::parse("[store]\nflush_intervl_ms = 5\n", "t.toml")
            .map(|_| ())
            .err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("flush_intervl_ms"), "{msg}");
        let err = Config::parse("[nope]\n", "t.toml").map(|_| ()).err();
        assert!(err.map(|e| e.to_string()).unwrap_or_default().contains("nope"));
    }

    #[test]
    fn mistyped_value_is_named() {
        let err = Config::parse("[store]\nflush_interval_ms = \"fast\"\n", "t.toml")
            .map(|_| ())
            .err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("flush_interval_ms") && msg.contains("t.toml"), "{msg}");
        let err = Config::parse("[store]\nflush_mode = \"sometimes\"\n", "t.toml")
            .map(|_| ())
            .err();
        assert!(err.map(|e| e.to_string()).unwrap_or_default().contains("sometimes"));
    }

    #[test]
    fn values_that_would_refuse_or_panic_are_refused_at_load() {
        for (text, key) in [
            // Each of these 0s panicked the first auto-created topic or
            // RocketMQ send (a clamp with its bounds crossed).
            ("[broker]\nmax_partitions = 0\n", "broker.max_partitions"),
            (
                "[rocketmq]\nmax_auto_create_queues = 0\n",
                "rocketmq.max_auto_create_queues",
            ),
            (
                "[broker]\ndefault_partitions = 9\nmax_partitions = 8\n",
                "broker.default_partitions",
            ),
            (
                "[group]\nmin_session_timeout_ms = 9000\nmax_session_timeout_ms = 8000\n",
                "group.min_session_timeout_ms",
            ),
            (
                "[grpc]\nmin_invisible_ms = 9000\nmax_invisible_ms = 8000\n",
                "grpc.min_invisible_ms",
            ),
            (
                "[group]\nconsumer_heartbeat_interval_ms = 3000000000\n",
                "consumer_heartbeat_interval_ms",
            ),
            ("[console]\nmax_sessions = 0\n", "console.max_sessions"),
            ("[grpc]\npreface_timeout_ms = 0\n", "grpc.preface_timeout_ms"),
            ("[grpc]\nrequest_read_timeout_ms = 0\n", "grpc.request_read_timeout_ms"),
            ("[kafka]\nmax_fetch_wait_ms = 0\n", "kafka.max_fetch_wait_ms"),
            (
                "[group]\nconsumer_heartbeat_interval_ms = 45000\nconsumer_session_timeout_ms = 45000\n",
                "consumer_heartbeat_interval_ms",
            ),
            ("[metrics]\nmax_connections = 0\n", "metrics.max_connections"),
            ("[kafka]\nmax_id_bytes = 100\n", "kafka.max_id_bytes"),
            (
                "[store]\ndisk_max_used_percent = 90\ndisk_refuse_writes_percent = 80\n",
                "store.disk_refuse_writes_percent",
            ),
        ] {
            let msg = Config::parse(text, "t.toml")
                .map(|_| ())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(msg.contains(key) && msg.contains("t.toml"), "{text}: {msg:?}");
        }
        // Off (0) on either side is not a crossing.
        assert!(Config::parse(
            "[store]\ndisk_max_used_percent = 90\ndisk_refuse_writes_percent = 0\n",
            "t"
        )
        .is_ok());
    }

    #[test]
    fn invalid_values_are_refused() {
        let err = Config::parse("[store]\ncommitlog_segment_bytes = 1024\n", "t.toml")
            .map(|_| ())
            .err();
        assert!(err
            .map(|e| e.to_string())
            .unwrap_or_default()
            .contains("commitlog_segment_bytes"));
        for (text, key) in [
            ("[grpc]\nadvertised_addr = \"rokka\"\n", "grpc.advertised_addr"),
            (
                "[rocketmq]\nadvertised_addr = \"bad host:10911\"\n",
                "rocketmq.advertised_addr",
            ),
            ("[grpc]\nadvertised_addr = \"rokka:0\"\n", "grpc.advertised_addr"),
            ("[metrics]\nmax_connections = 0\n", "metrics.max_connections"),
            (
                "[console]\nconnection_timeout_ms = 0\n",
                "console.connection_timeout_ms",
            ),
        ] {
            let err = Config::parse(text, "t.toml").map(|_| ()).err();
            assert!(err.map(|e| e.to_string()).unwrap_or_default().contains(key), "{text}");
        }
        // DNS names, IPv4 and bracketed IPv6 are advertised as given.
        for ok in [
            "rokka-0.rokka.svc.cluster.local:8081",
            "rokka.example.:8081",
            "10.0.0.7:8081",
            "[::1]:8081",
        ] {
            assert_eq!(host_port(ok).as_deref(), Ok(ok));
        }
    }
}
