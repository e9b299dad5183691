//! Admin commands (`rokka topic …`, `rokka group …`, `rokka cluster
//! status`): they speak the Kafka protocol to a node's Kafka listener, so
//! they see what every client sees, obey the same ACLs (`--user`), and work
//! against any node of a cluster. RocketMQ topics and groups are the same
//! topics and groups: a RocketMQ consumer group shows here with its members
//! and committed offsets.
//!
//! Output is a table, or JSON (`--output json`): an object with one array of
//! rows per section. Exit codes: 0 done, 1 refused by the broker (unknown
//! topic, not authorized, group still active…), 2 usage or connection.

mod kafka;
mod messages;
mod remoting;

pub use kafka::{AdminError, Client as KafkaClient, Credentials};
pub use messages::{
    dlq, dlq_list, dlq_resend, get as message_get, message, preview_bodies, DlqAction, MessageAction, RmqConn,
};
pub use remoting::Remoting as RemotingClient;

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use kafka_protocol::messages::*;
use kafka_protocol::messages::{
    create_partitions_request::*, create_topics_request::*, delete_topics_request::*, describe_configs_request::*,
    describe_groups_response::*, incremental_alter_configs_request::*, leave_group_request, metadata_response::*,
    offset_commit_request::*, offset_fetch_request::*,
};
use serde_json::{json, Value};

use self::kafka::{check, s, Client, Result};

/// How to reach the cluster (every admin command takes these).
#[derive(Debug, clap::Args)]
pub struct Conn {
    /// Kafka listener(s) of any node, comma-separated; the first that
    /// answers is used.
    #[arg(long, global = true, env = "ROKKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// Log in with SASL PLAIN as this user (a listener with SASL).
    #[arg(long, global = true, env = "ROKKA_ADMIN_USER")]
    user: Option<String>,
    /// The user's password.
    #[arg(long, global = true, env = "ROKKA_ADMIN_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// `table` for people, `json` for scripts.
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Debug, clap::Subcommand)]
pub enum TopicAction {
    /// Every topic: partitions, replication factor.
    List,
    /// A topic's partitions: leader, replicas, in-sync replicas, earliest
    /// and latest offsets.
    Describe { topic: String },
    /// Creates a topic.
    Create {
        topic: String,
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        /// -1: the broker's default.
        #[arg(long, default_value_t = -1)]
        replication_factor: i16,
        /// A topic config, `key=value` (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// Deletes a topic and its messages.
    Delete { topic: String },
    /// Grows a topic to `--total` partitions (existing ones do not move).
    AddPartitions {
        topic: String,
        #[arg(long)]
        total: i32,
    },
    /// Shows a topic's configs; `--set key=value` / `--delete key` change
    /// them first.
    Config {
        topic: String,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum GroupAction {
    /// Every consumer group (Kafka and RocketMQ), with its state.
    List,
    /// A group's members and, per partition, committed offset, end offset
    /// and lag.
    Describe { group: String },
    /// Moves a group's committed offsets. Prints the plan; commits it only
    /// with `--execute`. Refused while the group has members (stop them
    /// first), as Kafka's tool does.
    ResetOffsets {
        group: String,
        /// Topic(s) to reset (repeatable); default: every topic the group
        /// has committed offsets for.
        #[arg(long = "topic")]
        topics: Vec<String>,
        /// Only these partitions (comma-separated).
        #[arg(long, value_delimiter = ',')]
        partitions: Vec<i32>,
        /// To each partition's first offset.
        #[arg(long, group = "to")]
        to_earliest: bool,
        /// To each partition's end (skips everything not yet consumed).
        #[arg(long, group = "to")]
        to_latest: bool,
        /// An offset (clamped to the partition's earliest..latest).
        #[arg(long, group = "to")]
        to_offset: Option<i64>,
        /// The first offset at or after this time (ms since the epoch).
        #[arg(long, group = "to")]
        to_timestamp: Option<i64>,
        /// Moves each committed offset by N (negative: back), clamped.
        #[arg(long, group = "to", allow_hyphen_values = true)]
        shift_by: Option<i64>,
        /// Commit the plan (without it: a dry run).
        #[arg(long)]
        execute: bool,
        /// Reset while members run: Kafka members are removed from the
        /// group (they rejoin and start at the new offsets), RocketMQ
        /// members are told through their brokers (as mqadmin
        /// resetOffsetByTime -f does).
        #[arg(long)]
        force: bool,
        /// RocketMQ name server(s), to reach the brokers of a forced reset's
        /// RocketMQ members.
        #[arg(long, env = "ROKKA_NAMESRV", default_value = "127.0.0.1:9876")]
        namesrv: String,
    },
    /// Deletes a group that has no members, with its committed offsets.
    Delete { group: String },
}

/// Rows under a name; a report is one or more of them.
pub struct Section {
    pub name: &'static str,
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<Value>>,
}

impl Section {
    fn new(name: &'static str, columns: &[&'static str]) -> Section {
        Section {
            name,
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }
}

#[derive(Default)]
pub struct Report {
    pub sections: Vec<Section>,
    /// A closing line for people (in JSON under "message").
    pub message: Option<String>,
}

/// How long a connection attempt to one address may take: an address
/// that drops packets would otherwise hold a command (and a console page)
/// for the kernel's two minutes.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects to `addr` (`host:port`), trying each address it resolves to
/// for at most [`CONNECT_TIMEOUT`].
pub fn connect(addr: &str) -> std::io::Result<std::net::TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match std::net::TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "the address resolves to nothing")))
}

/// `s` for a terminal: control characters (escape sequences a producer
/// put in a body, key or property; newlines that would break a row) shown
/// as escapes, not acted on.
pub fn printable(s: String) -> String {
    if !s.chars().any(char::is_control) {
        return s;
    }
    s.chars()
        .map(|c| match c {
            '\n' => "\\n".to_string(),
            '\r' => "\\r".to_string(),
            '\t' => "\\t".to_string(),
            c if c.is_control() => format!("\\x{:02x}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

impl Report {
    fn print(&self, format: Format) {
        match format {
            Format::Json => {
                let mut o = serde_json::Map::new();
                for sec in &self.sections {
                    let rows = sec
                        .rows
                        .iter()
                        .map(|r| {
                            Value::Object(
                                sec.columns
                                    .iter()
                                    .zip(r)
                                    .map(|(c, v)| (c.to_string(), v.clone()))
                                    .collect(),
                            )
                        })
                        .collect();
                    o.insert(sec.name.to_string(), Value::Array(rows));
                }
                if let Some(m) = &self.message {
                    o.insert("message".into(), Value::String(m.clone()));
                }
                println!("{}", Value::Object(o));
            }
            Format::Table => {
                let many = self.sections.len() > 1;
                for (i, sec) in self.sections.iter().enumerate() {
                    if many {
                        if i > 0 {
                            println!();
                        }
                        println!("{}:", sec.name.to_uppercase());
                    }
                    let cells: Vec<Vec<String>> = sec
                        .rows
                        .iter()
                        .map(|r| r.iter().map(|v| printable(cell(v))).collect())
                        .collect();
                    let mut widths: Vec<usize> = sec.columns.iter().map(|c| c.len()).collect();
                    for r in &cells {
                        for (w, c) in widths.iter_mut().zip(r) {
                            *w = (*w).max(c.chars().count());
                        }
                    }
                    let line = |r: Vec<String>| {
                        let mut out = String::new();
                        for (j, (c, w)) in r.iter().zip(&widths).enumerate() {
                            if j + 1 == r.len() {
                                out.push_str(c);
                            } else {
                                out.push_str(&format!("{c:<w$}  "));
                            }
                        }
                        println!("{}", out.trim_end());
                    };
                    line(sec.columns.iter().map(|c| c.to_uppercase()).collect());
                    for r in cells {
                        line(r);
                    }
                }
                if let Some(m) = &self.message {
                    if !self.sections.is_empty() {
                        println!();
                    }
                    println!("{m}");
                }
            }
        }
    }
}

/// `--user` and `--password`, both or neither (exit 2 otherwise).
fn credentials(conn: &Conn) -> std::result::Result<Option<Credentials>, ExitCode> {
    match (&conn.user, &conn.password) {
        (None, None) => Ok(None),
        (Some(user), Some(password)) => Ok(Some(Credentials {
            user: user.clone(),
            password: password.clone(),
        })),
        _ => {
            eprintln!("rokka: --user and --password go together");
            Err(ExitCode::from(2))
        }
    }
}

fn client(conn: &Conn) -> std::result::Result<Client, ExitCode> {
    Ok(Client::new(&conn.brokers, credentials(conn)?))
}

fn finish(conn: &Conn, r: Result<Report>) -> ExitCode {
    match r {
        Ok(report) => {
            report.print(conn.output);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rokka: {e}");
            match e {
                AdminError::Refused(_) => ExitCode::from(1),
                _ => ExitCode::from(2),
            }
        }
    }
}

pub fn topic(conn: &Conn, action: &TopicAction) -> ExitCode {
    let mut c = match client(conn) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let r = match action {
        TopicAction::List => topic_list(&mut c),
        TopicAction::Describe { topic } => topic_describe(&mut c, topic),
        TopicAction::Create {
            topic,
            partitions,
            replication_factor,
            configs,
        } => topic_create(&mut c, topic, *partitions, *replication_factor, configs),
        TopicAction::Delete { topic } => topic_delete(&mut c, topic),
        TopicAction::AddPartitions { topic, total } => topic_add_partitions(&mut c, topic, *total),
        TopicAction::Config { topic, set, delete } => topic_config(&mut c, topic, set, delete),
    };
    finish(conn, r)
}

pub fn group(conn: &Conn, action: &GroupAction) -> ExitCode {
    let mut c = match client(conn) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let r = match action {
        GroupAction::List => group_list(&mut c),
        GroupAction::Describe { group } => group_describe(&mut c, group),
        GroupAction::ResetOffsets {
            group,
            topics,
            partitions,
            to_earliest,
            to_latest,
            to_offset,
            to_timestamp,
            shift_by,
            execute,
            force,
            namesrv,
        } => {
            let to = if *to_earliest {
                Some(Target::Earliest)
            } else if *to_latest {
                Some(Target::Latest)
            } else if let Some(o) = to_offset {
                Some(Target::Offset(*o))
            } else if let Some(t) = to_timestamp {
                Some(Target::Timestamp(*t))
            } else {
                shift_by.map(Target::Shift)
            };
            match to {
                Some(to) => {
                    let force = match force.then(|| credentials(conn)).transpose() {
                        Ok(creds) => creds.map(|creds| remoting::Remoting::new(namesrv, creds)),
                        Err(code) => return code,
                    };
                    group_reset(&mut c, group, topics, partitions, to, *execute, force)
                }
                None => {
                    eprintln!(
                        "rokka: say where to: --to-earliest, --to-latest, --to-offset N, --to-timestamp MS or --shift-by N"
                    );
                    return ExitCode::from(2);
                }
            }
        }
        GroupAction::Delete { group } => group_delete(&mut c, group),
    };
    finish(conn, r)
}

pub fn cluster_status(conn: &Conn) -> ExitCode {
    let mut c = match client(conn) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let r = cluster_report(&mut c);
    finish(conn, r)
}

/// DescribeCluster, with the partitions each broker leads and holds.
pub fn cluster_report(c: &mut Client) -> Result<Report> {
    let d: DescribeClusterResponse = c.call(
        ApiKey::DescribeCluster,
        1,
        &DescribeClusterRequest::default().with_endpoint_type(1),
    )?;
    check(d.error_code, d.error_message.as_ref(), "DescribeCluster")?;
    let m = c.metadata(None)?;
    let mut leaders: BTreeMap<i32, usize> = BTreeMap::new();
    let mut replicas: BTreeMap<i32, usize> = BTreeMap::new();
    for t in &m.topics {
        for p in &t.partitions {
            *leaders.entry(p.leader_id.0).or_default() += 1;
            for r in &p.replica_nodes {
                *replicas.entry(r.0).or_default() += 1;
            }
        }
    }
    let mut cluster = Section::new("cluster", &["cluster_id", "controller", "brokers", "topics"]);
    cluster.rows.push(vec![
        json!(d.cluster_id.to_string()),
        json!(d.controller_id.0),
        json!(d.brokers.len()),
        json!(m.topics.len()),
    ]);
    let mut brokers = Section::new("brokers", &["id", "host", "port", "rack", "leaders", "replicas"]);
    let mut list: Vec<_> = d.brokers.iter().collect();
    list.sort_by_key(|b| b.broker_id.0);
    for b in list {
        brokers.rows.push(vec![
            json!(b.broker_id.0),
            json!(b.host.to_string()),
            json!(b.port),
            b.rack.as_ref().map(|r| json!(r.to_string())).unwrap_or(Value::Null),
            json!(leaders.get(&b.broker_id.0).copied().unwrap_or(0)),
            json!(replicas.get(&b.broker_id.0).copied().unwrap_or(0)),
        ]);
    }
    Ok(Report {
        sections: vec![cluster, brokers],
        message: None,
    })
}

fn topic_name(t: &MetadataResponseTopic) -> String {
    t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default()
}

pub fn topic_list(c: &mut Client) -> Result<Report> {
    let m = c.metadata(None)?;
    let mut sec = Section::new("topics", &["topic", "partitions", "replication_factor", "internal"]);
    let mut topics: Vec<_> = m.topics.iter().filter(|t| t.error_code == 0).collect();
    topics.sort_by_key(|t| topic_name(t));
    for t in topics {
        let rf = t.partitions.iter().map(|p| p.replica_nodes.len()).max().unwrap_or(0);
        sec.rows.push(vec![
            json!(topic_name(t)),
            json!(t.partitions.len()),
            json!(rf),
            json!(t.is_internal),
        ]);
    }
    Ok(Report {
        sections: vec![sec],
        message: None,
    })
}

/// Every topic with its messages (sum of partition ends) and the rate since
/// the previous call that sampled it (`samples`: the console's memory).
pub fn topic_rates(
    c: &mut Client,
    samples: &std::sync::Mutex<std::collections::HashMap<String, (std::time::Instant, i64)>>,
) -> Result<Report> {
    let m = c.metadata(None)?;
    let mut keys = Vec::new();
    let mut topics: Vec<_> = m.topics.iter().filter(|t| t.error_code == 0).collect();
    topics.sort_by_key(|t| topic_name(t));
    for t in &topics {
        for p in &t.partitions {
            keys.push((topic_name(t), p.partition_index));
        }
    }
    let ends = c.list_offsets(&m, &keys, -1)?;
    let now = std::time::Instant::now();
    let mut sec = Section::new(
        "topics",
        &[
            "topic",
            "partitions",
            "replication_factor",
            "end_offsets",
            "messages_per_s",
        ],
    );
    let mut seen = samples.lock().unwrap_or_else(|e| e.into_inner());
    let names: BTreeSet<String> = topics.iter().map(|t| topic_name(t)).collect();
    // Deleted topics leave the memory.
    seen.retain(|t, _| names.contains(t));
    for t in topics {
        let name = topic_name(t);
        let found: Vec<i64> = t
            .partitions
            .iter()
            .filter_map(|p| ends.get(&(name.clone(), p.partition_index)).copied())
            .collect();
        // A partition whose end could not be read (leaderless in a
        // failover): no total and no rate, and no sample kept (a total
        // without it would read as a drop, then a jump).
        let whole = found.len() == t.partitions.len();
        let sum: i64 = found.iter().sum();
        let rate = match seen.get(&name) {
            Some((at, before)) if whole && now.duration_since(*at).as_secs_f64() >= 0.5 => {
                let r = (sum - before).max(0) as f64 / now.duration_since(*at).as_secs_f64();
                Some((r * 10.0).round() / 10.0)
            }
            _ => None,
        };
        if whole && (rate.is_some() || !seen.contains_key(&name)) {
            seen.insert(name.clone(), (now, sum));
        }
        let sum = whole.then_some(sum);
        let rf = t.partitions.iter().map(|p| p.replica_nodes.len()).max().unwrap_or(0);
        sec.rows.push(vec![
            json!(name),
            json!(t.partitions.len()),
            json!(rf),
            json!(sum),
            json!(rate),
        ]);
    }
    Ok(Report {
        sections: vec![sec],
        message: None,
    })
}

/// Metadata of one topic, refused when it does not exist.
fn one_topic(c: &mut Client, topic: &str) -> Result<(MetadataResponse, Vec<i32>)> {
    let m = c.metadata(Some(&[topic.to_string()]))?;
    let t = m
        .topics
        .iter()
        .find(|t| topic_name(t) == topic)
        .ok_or_else(|| AdminError::Refused(format!("topic {topic}: not in the metadata")))?;
    check(t.error_code, None, &format!("topic {topic}"))?;
    let mut parts: Vec<i32> = t.partitions.iter().map(|p| p.partition_index).collect();
    parts.sort_unstable();
    Ok((m, parts))
}

fn ids(v: &[BrokerId]) -> Value {
    Value::Array(v.iter().map(|b| json!(b.0)).collect())
}

pub fn topic_describe(c: &mut Client, topic: &str) -> Result<Report> {
    let (m, parts) = one_topic(c, topic)?;
    let keys: Vec<(String, i32)> = parts.iter().map(|p| (topic.to_string(), *p)).collect();
    let earliest = c.list_offsets(&m, &keys, -2)?;
    let latest = c.list_offsets(&m, &keys, -1)?;
    let mut sec = Section::new(
        "partitions",
        &[
            "partition",
            "leader",
            "replicas",
            "isr",
            "earliest",
            "latest",
            "messages",
        ],
    );
    let t = m.topics.iter().find(|t| topic_name(t) == topic);
    for p in &parts {
        let meta = t.and_then(|t| t.partitions.iter().find(|x| x.partition_index == *p));
        let key = (topic.to_string(), *p);
        let (e, l) = (earliest.get(&key).copied(), latest.get(&key).copied());
        sec.rows.push(vec![
            json!(p),
            meta.map(|x| json!(x.leader_id.0)).unwrap_or(Value::Null),
            meta.map(|x| ids(&x.replica_nodes)).unwrap_or(Value::Null),
            meta.map(|x| ids(&x.isr_nodes)).unwrap_or(Value::Null),
            json!(e),
            json!(l),
            match (e, l) {
                (Some(e), Some(l)) => json!((l - e).max(0)),
                _ => Value::Null,
            },
        ]);
    }
    Ok(Report {
        sections: vec![sec],
        message: None,
    })
}

/// `key=value` → (key, value).
fn pair(kv: &str) -> Result<(String, String)> {
    match kv.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(AdminError::Usage(format!("{kv:?}: expected key=value"))),
    }
}

fn topic_create(c: &mut Client, topic: &str, partitions: i32, rf: i16, configs: &[String]) -> Result<Report> {
    let mut cfgs = Vec::new();
    for kv in configs {
        let (k, v) = pair(kv)?;
        cfgs.push(CreatableTopicConfig::default().with_name(s(&k)).with_value(Some(s(&v))));
    }
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(TopicName(s(topic)))
            .with_num_partitions(partitions)
            .with_replication_factor(rf)
            .with_configs(cfgs)]);
    let r: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req)?;
    for t in &r.topics {
        check(t.error_code, t.error_message.as_ref(), &format!("creating {topic}"))?;
    }
    Ok(Report {
        sections: Vec::new(),
        message: Some(format!("created topic {topic} with {partitions} partition(s)")),
    })
}

fn topic_delete(c: &mut Client, topic: &str) -> Result<Report> {
    let req = DeleteTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![DeleteTopicState::default().with_name(Some(TopicName(s(topic))))]);
    let r: DeleteTopicsResponse = c.call(ApiKey::DeleteTopics, 6, &req)?;
    for t in &r.responses {
        check(t.error_code, t.error_message.as_ref(), &format!("deleting {topic}"))?;
    }
    Ok(Report {
        sections: Vec::new(),
        message: Some(format!("deleted topic {topic}")),
    })
}

fn topic_add_partitions(c: &mut Client, topic: &str, total: i32) -> Result<Report> {
    let req = CreatePartitionsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(TopicName(s(topic)))
            .with_count(total)
            .with_assignments(None)]);
    let r: CreatePartitionsResponse = c.call(ApiKey::CreatePartitions, 3, &req)?;
    for t in &r.results {
        check(
            t.error_code,
            t.error_message.as_ref(),
            &format!("adding partitions to {topic}"),
        )?;
    }
    Ok(Report {
        sections: Vec::new(),
        message: Some(format!("topic {topic} now has {total} partitions")),
    })
}

/// Kafka's names of a config's source.
fn config_source(source: i8) -> &'static str {
    match source {
        1 => "DYNAMIC_TOPIC_CONFIG",
        2 => "DYNAMIC_BROKER_CONFIG",
        3 => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        4 => "STATIC_BROKER_CONFIG",
        5 => "DEFAULT_CONFIG",
        6 => "DYNAMIC_BROKER_LOGGER_CONFIG",
        _ => "UNKNOWN",
    }
}

const TOPIC_RESOURCE: i8 = 2;

pub fn topic_config(c: &mut Client, topic: &str, set: &[String], delete: &[String]) -> Result<Report> {
    if !set.is_empty() || !delete.is_empty() {
        let mut configs = Vec::new();
        for kv in set {
            let (k, v) = pair(kv)?;
            configs.push(
                AlterableConfig::default()
                    .with_name(s(&k))
                    .with_config_operation(0)
                    .with_value(Some(s(&v))),
            );
        }
        for k in delete {
            configs.push(AlterableConfig::default().with_name(s(k)).with_config_operation(1));
        }
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(TOPIC_RESOURCE)
            .with_resource_name(s(topic))
            .with_configs(configs)]);
        let r: IncrementalAlterConfigsResponse = c.call(ApiKey::IncrementalAlterConfigs, 1, &req)?;
        for x in &r.responses {
            check(
                x.error_code,
                x.error_message.as_ref(),
                &format!("changing configs of {topic}"),
            )?;
        }
    }
    let req = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(TOPIC_RESOURCE)
        .with_resource_name(s(topic))
        .with_configuration_keys(None)]);
    let r: DescribeConfigsResponse = c.call(ApiKey::DescribeConfigs, 4, &req)?;
    let mut sec = Section::new("configs", &["name", "value", "source", "read_only"]);
    for res in &r.results {
        check(
            res.error_code,
            res.error_message.as_ref(),
            &format!("configs of {topic}"),
        )?;
        let mut configs: Vec<_> = res.configs.iter().collect();
        configs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in configs {
            sec.rows.push(vec![
                json!(x.name.to_string()),
                match (&x.value, x.is_sensitive) {
                    (_, true) => json!("(sensitive)"),
                    (Some(v), false) => json!(v.to_string()),
                    (None, false) => Value::Null,
                },
                json!(config_source(x.config_source)),
                json!(x.read_only),
            ]);
        }
    }
    Ok(Report {
        sections: vec![sec],
        message: None,
    })
}

/// Every broker's address (groups are listed per coordinator, as Kafka's
/// ListGroups is answered per broker).
fn all_brokers(c: &mut Client) -> Result<Vec<String>> {
    let m = c.metadata(Some(&[]))?;
    let mut v: Vec<String> = Client::brokers(&m).into_values().collect();
    v.sort();
    v.dedup();
    Ok(v)
}

pub fn group_list(c: &mut Client) -> Result<Report> {
    let mut groups: BTreeMap<String, (String, String)> = BTreeMap::new();
    for addr in all_brokers(c)? {
        let r: ListGroupsResponse = c.call_at(&addr, ApiKey::ListGroups, 4, &ListGroupsRequest::default())?;
        check(r.error_code, None, &format!("listing groups at {addr}"))?;
        for g in r.groups {
            // Nodes that only hold a group's offsets (other broker sets)
            // list it Empty: a state other than Empty wins (the
            // coordinator's, or a replica's copy of its last record).
            let (state, proto) = (g.group_state.to_string(), g.protocol_type.to_string());
            let e = groups
                .entry(g.group_id.0.to_string())
                .or_insert_with(|| (state.clone(), proto.clone()));
            if e.0 == "Empty" && state != "Empty" {
                *e = (state, proto);
            } else if e.1.is_empty() && !proto.is_empty() {
                e.1 = proto;
            }
        }
    }
    let mut sec = Section::new("groups", &["group", "state", "protocol_type"]);
    for (g, (state, proto)) in groups {
        sec.rows.push(vec![json!(g), json!(state), json!(proto)]);
    }
    Ok(Report {
        sections: vec![sec],
        message: None,
    })
}

/// The partitions of a consumer-protocol assignment, in order (the
/// broker's own reading of one).
fn assigned(b: &bytes::Bytes) -> Vec<(String, i32)> {
    rokka_kafka::mixed::assigned_partitions(b)
        .into_iter()
        .flat_map(|(t, ps)| ps.into_iter().map(move |p| (t.clone(), p)))
        .collect()
}

struct GroupView {
    coordinator: String,
    described: DescribedGroup,
    /// A KIP-848 group (described by ConsumerGroupDescribe).
    kip848: bool,
    /// (topic, partition) → committed offset.
    committed: BTreeMap<(String, i32), i64>,
}

fn view(c: &mut Client, group: &str) -> Result<GroupView> {
    let coordinator = c.coordinator(group)?;
    let r: DescribeGroupsResponse = c.call_at(
        &coordinator,
        ApiKey::DescribeGroups,
        5,
        &DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]),
    )?;
    let described = r
        .groups
        .into_iter()
        .next()
        .ok_or_else(|| AdminError::Protocol("DescribeGroups answered no group".into()))?;
    // A KIP-848 group (group.protocol=consumer) is not a classic one:
    // DescribeGroups answers it GROUP_ID_NOT_FOUND (v6+, KIP-1043) or Dead
    // (before v6, as Kafka): described by ConsumerGroupDescribe instead, as
    // Kafka's Admin does.
    let (described, kip848) = match consumer_group(c, &coordinator, group, &described)? {
        Some(d) => (d, true),
        None => {
            check(
                described.error_code,
                described.error_message.as_ref(),
                &format!("group {group}"),
            )?;
            (described, false)
        }
    };
    let req = OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
        .with_group_id(GroupId(s(group)))
        .with_member_id(None)
        .with_member_epoch(-1)
        .with_topics(None)]);
    let r: OffsetFetchResponse = c.call_at(&coordinator, ApiKey::OffsetFetch, 8, &req)?;
    let mut committed = BTreeMap::new();
    for g in r.groups {
        check(g.error_code, None, &format!("offsets of {group}"))?;
        for t in g.topics {
            for p in t.partitions {
                if p.error_code == 0 && p.committed_offset >= 0 {
                    committed.insert((t.name.0.to_string(), p.partition_index), p.committed_offset);
                }
            }
        }
    }
    Ok(GroupView {
        coordinator,
        described,
        kip848,
        committed,
    })
}

/// A KIP-848 group as DescribeGroups would show it (members with their
/// assignments in the consumer protocol's form), when DescribeGroups says
/// it is not a classic group (GROUP_ID_NOT_FOUND, or Dead) and
/// ConsumerGroupDescribe knows it; None otherwise.
/// Kafka's GROUP_ID_NOT_FOUND: what DescribeGroups answers for a KIP-848
/// group.
const GROUP_ID_NOT_FOUND: i16 = kafka_protocol::ResponseError::GroupIdNotFound.code();

fn consumer_group(
    c: &mut Client,
    coordinator: &str,
    group: &str,
    classic: &DescribedGroup,
) -> Result<Option<DescribedGroup>> {
    use kafka_protocol::messages::consumer_group_describe_response as cgd;
    let maybe =
        classic.error_code == GROUP_ID_NOT_FOUND || (classic.error_code == 0 && &*classic.group_state == "Dead");
    if !maybe {
        return Ok(None);
    }
    let req = ConsumerGroupDescribeRequest::default().with_group_ids(vec![GroupId(s(group))]);
    let r: ConsumerGroupDescribeResponse = c.call_at(coordinator, ApiKey::ConsumerGroupDescribe, 0, &req)?;
    let Some(g) = r.groups.into_iter().next().filter(|g| g.error_code == 0) else {
        return Ok(None);
    };
    let mut members = Vec::with_capacity(g.members.len());
    for m in g.members {
        let cgd::Member {
            member_id,
            instance_id,
            client_id,
            client_host,
            assignment,
            ..
        } = m;
        // In the consumer protocol's form, as a classic member's
        // assignment, which `assigned` reads.
        let parts: BTreeMap<String, Vec<i32>> = assignment
            .topic_partitions
            .into_iter()
            .map(|tp| (tp.topic_name.0.to_string(), tp.partitions))
            .collect();
        members.push(
            DescribedGroupMember::default()
                .with_member_id(member_id)
                .with_group_instance_id(instance_id)
                .with_client_id(client_id)
                .with_client_host(client_host)
                .with_member_assignment(rokka_kafka::mixed::encode_assignment(&parts)),
        );
    }
    // The group's RocketMQ clients, which the error answer lists.
    members.extend(classic.members.iter().cloned());
    Ok(Some(
        DescribedGroup::default()
            .with_group_id(g.group_id)
            .with_group_state(g.group_state)
            .with_protocol_type(s("consumer"))
            .with_protocol_data(g.assignor_name)
            .with_members(members),
    ))
}

pub fn group_describe(c: &mut Client, group: &str) -> Result<Report> {
    let v = view(c, group)?;
    let d = &v.described;
    let mut owner: BTreeMap<(String, i32), String> = BTreeMap::new();
    let mut members = Section::new("members", &["member_id", "client_id", "protocol", "host", "partitions"]);
    for m in &d.members {
        let parts = assigned(&m.member_assignment);
        for p in &parts {
            owner.insert(p.clone(), m.client_id.to_string());
        }
        let protocol = member_protocol(d, m);
        members.rows.push(vec![
            json!(m.member_id.to_string()),
            json!(m.client_id.to_string()),
            json!(protocol),
            json!(m.client_host.to_string()),
            Value::Array(parts.iter().map(|(t, p)| json!(format!("{t}:{p}"))).collect()),
        ]);
    }
    // Every partition of the topics the group has offsets for or owns.
    let topics: BTreeSet<String> = v.committed.keys().chain(owner.keys()).map(|(t, _)| t.clone()).collect();
    let mut keys: Vec<(String, i32)> = Vec::new();
    let m = if topics.is_empty() {
        None
    } else {
        let list: Vec<String> = topics.iter().cloned().collect();
        let m = c.metadata(Some(&list))?;
        for t in &m.topics {
            if t.error_code == 0 {
                for p in &t.partitions {
                    keys.push((topic_name(t), p.partition_index));
                }
            }
        }
        keys.sort();
        Some(m)
    };
    let latest = match &m {
        Some(m) => c.list_offsets(m, &keys, -1)?,
        None => Default::default(),
    };
    // Partitions with nothing committed: their lag is what is there to
    // read (end − earliest), not records retention already deleted.
    let uncommitted: Vec<(String, i32)> = keys.iter().filter(|k| !v.committed.contains_key(*k)).cloned().collect();
    // (None could be read: those partitions show no lag, the page the rest.)
    let earliest = match &m {
        Some(m) if !uncommitted.is_empty() => c.list_offsets(m, &uncommitted, -2).unwrap_or_default(),
        _ => Default::default(),
    };
    let mut offsets = Section::new("offsets", &["topic", "partition", "committed", "end", "lag", "owner"]);
    let mut total_lag = 0i64;
    for k in &keys {
        let committed = v.committed.get(k).copied();
        let end = latest.get(k).copied();
        let lag = match (committed, end) {
            (Some(c), Some(e)) => Some((e - c).max(0)),
            (None, Some(e)) => earliest.get(k).map(|lo| (e - lo).max(0)),
            _ => None,
        };
        total_lag += lag.unwrap_or(0);
        offsets.rows.push(vec![
            json!(k.0),
            json!(k.1),
            json!(committed),
            json!(end),
            json!(lag),
            owner.get(k).map(|o| json!(o)).unwrap_or(Value::Null),
        ]);
    }
    let mut head = Section::new(
        "group",
        &[
            "group",
            "state",
            "protocol_type",
            "protocol",
            "members",
            "coordinator",
            "lag",
        ],
    );
    head.rows.push(vec![
        json!(group),
        json!(d.group_state.to_string()),
        json!(d.protocol_type.to_string()),
        json!(d.protocol_data.to_string()),
        json!(d.members.len()),
        json!(v.coordinator),
        json!(total_lag),
    ]);
    Ok(Report {
        sections: vec![head, members, offsets],
        message: None,
    })
}

#[derive(Debug, Clone, Copy)]
enum Target {
    Earliest,
    Latest,
    Offset(i64),
    Timestamp(i64),
    Shift(i64),
}

fn group_reset(
    c: &mut Client,
    group: &str,
    topics: &[String],
    only: &[i32],
    to: Target,
    execute: bool,
    mut force: Option<remoting::Remoting>,
) -> Result<Report> {
    let v = view(c, group)?;
    let d = &v.described;
    // KIP-848 members are not removed by an admin's LeaveGroup (that is
    // classic groups'): stopped by their owners, or their sessions end.
    if v.kip848 && force.is_some() && d.members.iter().any(|m| member_protocol(d, m) == "kafka") {
        return Err(AdminError::Refused(format!(
            "group {group} is a KIP-848 (group.protocol=consumer) group with live Kafka members: --force cannot remove them — stop those consumers first"
        )));
    }
    if !d.members.is_empty() && force.is_none() {
        let who: Vec<String> = d.members.iter().map(|m| m.client_id.to_string()).collect();
        return Err(AdminError::Refused(format!(
            "group {group} is {} with {} member(s) ({}): offsets are reset only while it has none — stop its consumers first, or --force",
            d.group_state,
            d.members.len(),
            who.join(", ")
        )));
    }
    let topics: Vec<String> = if topics.is_empty() {
        let t: BTreeSet<String> = v.committed.keys().map(|(t, _)| t.clone()).collect();
        if t.is_empty() {
            return Err(AdminError::Usage(format!(
                "group {group} has no committed offsets: name the topic(s) with --topic"
            )));
        }
        t.into_iter().collect()
    } else {
        topics.to_vec()
    };
    let m = c.metadata(Some(&topics))?;
    let mut keys = Vec::new();
    for name in &topics {
        let t = m
            .topics
            .iter()
            .find(|t| &topic_name(t) == name)
            .ok_or_else(|| AdminError::Refused(format!("topic {name}: not in the metadata")))?;
        check(t.error_code, None, &format!("topic {name}"))?;
        for p in &t.partitions {
            if only.is_empty() || only.contains(&p.partition_index) {
                keys.push((name.clone(), p.partition_index));
            }
        }
    }
    keys.sort();
    if keys.is_empty() {
        return Err(AdminError::Usage(format!(
            "no partition of {} matches --partitions",
            topics.join(",")
        )));
    }
    let earliest = c.list_offsets(&m, &keys, -2)?;
    let latest = c.list_offsets(&m, &keys, -1)?;
    let at = match to {
        Target::Timestamp(ts) => c.list_offsets(&m, &keys, ts)?,
        _ => Default::default(),
    };
    // Offsets are moved only with every partition's bounds known (a
    // partition left out of a lookup, leaderless in a failover, would be
    // moved to 0).
    let timed = matches!(to, Target::Timestamp(_));
    if let Some(k) = keys
        .iter()
        .find(|k| !earliest.contains_key(*k) || !latest.contains_key(*k) || (timed && !at.contains_key(*k)))
    {
        return Err(AdminError::Protocol(format!(
            "the offsets of {}/{} could not be read (no leader?): nothing reset, try again",
            k.0, k.1
        )));
    }
    let mut plan = Section::new("plan", &["topic", "partition", "current", "new"]);
    let mut commits: BTreeMap<String, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
    for k in &keys {
        let (lo, hi) = (
            earliest.get(k).copied().unwrap_or(0),
            latest.get(k).copied().unwrap_or(0),
        );
        let current = v.committed.get(k).copied();
        let new = match to {
            Target::Earliest => lo,
            Target::Latest => hi,
            Target::Offset(o) => o,
            // No message at or after the time: the end.
            Target::Timestamp(_) => at.get(k).copied().filter(|o| *o >= 0).unwrap_or(hi),
            Target::Shift(n) => current.unwrap_or(lo).saturating_add(n),
        }
        .clamp(lo, hi.max(lo));
        plan.rows.push(vec![json!(k.0), json!(k.1), json!(current), json!(new)]);
        commits.entry(k.0.clone()).or_default().push(
            OffsetCommitRequestPartition::default()
                .with_partition_index(k.1)
                .with_committed_offset(new)
                .with_committed_leader_epoch(-1),
        );
    }
    if !execute {
        return Ok(Report {
            sections: vec![plan],
            message: Some("dry run: nothing committed (add --execute to commit this plan)".into()),
        });
    }
    let live = Section::new("members", &["member_id", "client_id", "protocol", "action"]);
    let mut sections = vec![plan, live];
    // Kafka members removed, by client id: one that rejoins before the
    // commit and is removed again is still one.
    let mut kafka_removed = BTreeSet::new();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let described = if attempt == 1 {
            v.described.clone()
        } else {
            view(c, group)?.described
        };
        if force.is_some() {
            for m in remove_kafka_members(c, &v.coordinator, group, &described)? {
                if kafka_removed.insert(m.client_id.to_string()) {
                    sections[1].rows.push(vec![
                        json!(m.member_id.to_string()),
                        json!(m.client_id.to_string()),
                        json!("kafka"),
                        json!("removed (rejoins at the new offsets)"),
                    ]);
                }
            }
        }
        match commit_offsets(c, &v.coordinator, group, &commits)? {
            None => break,
            // A Kafka member rejoined between its removal and the commit.
            Some(code) if force.is_some() && attempt < 3 && [22, 25, 27].contains(&code) => continue,
            Some(code) => {
                check(code, None, &format!("committing the offsets of {group}"))?;
            }
        }
    }
    let mut told = 0;
    let rocketmq_members: Vec<&DescribedGroupMember> = v
        .described
        .members
        .iter()
        .filter(|m| member_protocol(&v.described, m) == "rocketmq")
        .collect();
    if force.is_some() {
        // Pop consumers keep no position of their own: the broker's pop
        // state follows the committed offsets at their next receive.
        for m in v
            .described
            .members
            .iter()
            .filter(|m| member_protocol(&v.described, m) == "rocketmq-pop")
        {
            sections[1].rows.push(vec![
                json!(m.member_id.to_string()),
                json!(m.client_id.to_string()),
                json!("rocketmq-pop"),
                json!("follows the new offsets at its next receive"),
            ]);
        }
    }
    if let (Some(r), false) = (force.as_mut(), rocketmq_members.is_empty()) {
        for m in &rocketmq_members {
            sections[1].rows.push(vec![
                json!(m.member_id.to_string()),
                json!(m.client_id.to_string()),
                json!("rocketmq"),
                json!("told to move (RESET_CONSUMER_CLIENT_OFFSET)"),
            ]);
        }
        let topics: BTreeSet<&String> = keys.iter().map(|(t, _)| t).collect();
        for t in topics {
            for b in r.route(t)? {
                let resp = r.ok(
                    &b.addr,
                    remoting::code::INVOKE_BROKER_TO_RESET_OFFSET,
                    &[
                        ("topic", t.clone()),
                        ("group", group.to_string()),
                        ("timestamp", "-1".to_string()),
                        ("isForce", "true".to_string()),
                        ("rokkaCommitted", "true".to_string()),
                    ],
                    &format!("telling the RocketMQ consumers of {group} on {} ({})", b.name, b.addr),
                )?;
                told += resp
                    .ext_fields
                    .get("rokkaNotified")
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0);
            }
        }
    }
    if sections[1].rows.is_empty() {
        sections.pop();
    }
    let mut message = format!("committed {} offset(s) for group {group}", keys.len());
    if !kafka_removed.is_empty() {
        message.push_str(&format!(
            "; {} Kafka member(s) removed from the group (they rejoin at the new offsets)",
            kafka_removed.len()
        ));
    }
    if !rocketmq_members.is_empty() {
        message.push_str(&format!(
            "; {told} RocketMQ consumer connection(s) told to move (they resume about 10-30 s later)"
        ));
    }
    Ok(Report {
        sections,
        message: Some(message),
    })
}

/// Which protocol a described member speaks: RocketMQ clients are members
/// under their client id (RocketMQ 5 pop consumers in a group described
/// as `rocketmq-pop`, as they never share one with queue owners); Kafka
/// members' ids are the client id and a suffix the coordinator gave.
fn member_protocol(d: &DescribedGroup, m: &DescribedGroupMember) -> &'static str {
    if m.member_id != m.client_id {
        "kafka"
    } else if d.protocol_data.as_str() == "rocketmq-pop" {
        "rocketmq-pop"
    } else {
        "rocketmq"
    }
}

/// LeaveGroup (v4, KIP-345/KIP-571) for the group's Kafka members; those
/// removed (gone already — their session ended — counts as removed).
fn remove_kafka_members(
    c: &mut Client,
    coordinator: &str,
    group: &str,
    described: &DescribedGroup,
) -> Result<Vec<DescribedGroupMember>> {
    let kafka: Vec<&DescribedGroupMember> = described
        .members
        .iter()
        .filter(|m| member_protocol(described, m) == "kafka")
        .collect();
    if kafka.is_empty() {
        return Ok(Vec::new());
    }
    let req = LeaveGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_members(
            kafka
                .iter()
                .map(|m| {
                    leave_group_request::MemberIdentity::default()
                        .with_member_id(m.member_id.clone())
                        .with_group_instance_id(m.group_instance_id.clone())
                })
                .collect(),
        );
    let r: LeaveGroupResponse = c.call_at(coordinator, ApiKey::LeaveGroup, 4, &req)?;
    check(r.error_code, None, &format!("removing the members of {group}"))?;
    for (m, resp) in kafka.iter().zip(&r.members) {
        if resp.error_code != 0 && resp.error_code != 25 {
            check(
                resp.error_code,
                None,
                &format!("removing member {} of {group}", m.member_id),
            )?;
        }
    }
    Ok(kafka.into_iter().cloned().collect())
}

/// An admin OffsetCommit (no member, generation -1); the first error code.
fn commit_offsets(
    c: &mut Client,
    coordinator: &str,
    group: &str,
    commits: &BTreeMap<String, Vec<OffsetCommitRequestPartition>>,
) -> Result<Option<i16>> {
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_retention_time_ms(-1)
        .with_topics(
            commits
                .iter()
                .map(|(t, parts)| {
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s(t)))
                        .with_partitions(parts.clone())
                })
                .collect(),
        );
    let r: OffsetCommitResponse = c.call_at(coordinator, ApiKey::OffsetCommit, 8, &req)?;
    Ok(r.topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.error_code)
        .find(|e| *e != 0))
}

fn group_delete(c: &mut Client, group: &str) -> Result<Report> {
    let coordinator = c.coordinator(group)?;
    let r: DeleteGroupsResponse = c.call_at(
        &coordinator,
        ApiKey::DeleteGroups,
        2,
        &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s(group))]),
    )?;
    for g in &r.results {
        check(g.error_code, None, &format!("deleting group {group}"))?;
    }
    Ok(Report {
        sections: Vec::new(),
        message: Some(format!("deleted group {group}")),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_cells_show_control_characters_as_escapes() {
        assert_eq!(super::printable("plain é".into()), "plain é");
        assert_eq!(super::printable("a\x1b[2Jb\nc\u{7}".into()), "a\\x1b[2Jb\\nc\\x07");
    }

    use super::kafka::error_name;
    use super::*;
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition;

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(29), "TOPIC_AUTHORIZATION_FAILED");
        assert_eq!(error_name(-999), "error -999");
    }

    #[test]
    fn pairs_need_a_key() {
        assert_eq!(
            pair("retention.ms=100").ok(),
            Some(("retention.ms".into(), "100".into()))
        );
        assert_eq!(pair("a=b=c").ok(), Some(("a".into(), "b=c".into())));
        assert!(pair("=x").is_err());
        assert!(pair("novalue").is_err());
    }

    #[test]
    fn cells_render_lists_and_gaps() {
        assert_eq!(cell(&json!([1, 2])), "1,2");
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&json!("x")), "x");
    }

    #[test]
    fn assignments_decode_or_are_empty() {
        let a = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![TopicPartition::default()
            .with_topic(TopicName(s("t")))
            .with_partitions(vec![0, 2])]);
        let mut b = bytes::BytesMut::new();
        bytes::BufMut::put_i16(&mut b, 1);
        kafka_protocol::protocol::Encodable::encode(&a, &mut b, 1).expect("encodes");
        assert_eq!(assigned(&b.freeze()), vec![("t".to_string(), 0), ("t".to_string(), 2)]);
        assert!(assigned(&bytes::Bytes::from_static(&[0, 1, 0xff])).is_empty());
    }
}
