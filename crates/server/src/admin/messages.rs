//! `rokka message get` and `rokka dlq list|show|resend`: over the RocketMQ
//! remoting protocol (name server routes, pulls that commit nothing,
//! queries by key and id, sends), so RocketMQ properties are shown and kept
//! as they are stored.

use std::collections::BTreeMap;
use std::process::ExitCode;

use base64::Engine;
use rokka_store::record::properties;
use rokka_store::MessageView;
use serde_json::{json, Value};

use super::kafka::{AdminError, Result};
use super::remoting::{code, refused, request, BrokerQueues, Remoting, QUERY_NOT_FOUND, SUCCESS};
use super::{Conn, Report, Section};

/// How to reach the RocketMQ side, beside the common options.
#[derive(Debug, clap::Args)]
pub struct RmqConn {
    #[command(flatten)]
    conn: Conn,
    /// RocketMQ name server(s), `;`- or comma-separated.
    #[arg(long, global = true, env = "ROKKA_NAMESRV", default_value = "127.0.0.1:9876")]
    namesrv: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum MessageAction {
    /// Messages by (topic, queue, offset), by message id, by key, or by
    /// store time range; body, key, tags and every property.
    Get {
        #[arg(long)]
        topic: Option<String>,
        /// With --offset: the queue (per broker set; see --broker).
        #[arg(long, default_value_t = 0)]
        queue: u32,
        #[arg(long)]
        offset: Option<i64>,
        /// A message id: the client's (UNIQ_KEY, needs --topic) or the
        /// broker's offset id.
        #[arg(long)]
        id: Option<String>,
        /// Messages whose KEYS hold this key (needs --topic).
        #[arg(long)]
        key: Option<String>,
        /// Messages stored from this time (ms since the epoch; needs --topic).
        #[arg(long)]
        from: Option<i64>,
        /// … until this time (default: now).
        #[arg(long)]
        to: Option<i64>,
        /// At most this many messages (default 1 for --offset, else 32).
        #[arg(long)]
        count: Option<u32>,
        /// The broker (set) name when several serve the topic.
        #[arg(long)]
        broker: Option<String>,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum DlqAction {
    /// A group's dead letters (`%DLQ%<group>`): per queue how many, and
    /// each message with its original topic.
    List {
        group: String,
        /// Rows shown at most (the count above is always complete).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One dead letter in full.
    Show {
        group: String,
        #[arg(long)]
        offset: i64,
        #[arg(long, default_value_t = 0)]
        queue: u32,
        #[arg(long)]
        broker: Option<String>,
    },
    /// Sends dead letters again to their original topic (`RETRY_TOPIC`),
    /// one result line per message and a summary; exit 1 when any failed.
    /// The DLQ keeps them (resending twice sends twice).
    Resend {
        group: String,
        /// DLQ offsets to resend (repeatable, or comma-separated).
        #[arg(long = "offset", value_delimiter = ',')]
        offsets: Vec<i64>,
        /// Every dead letter of the group.
        #[arg(long, conflicts_with = "offsets")]
        all: bool,
        #[arg(long, default_value_t = 0)]
        queue: u32,
        #[arg(long)]
        broker: Option<String>,
    },
}

/// The group the admin tools read with (reads commit nothing).
const ADMIN_GROUP: &str = "rokka-admin";
const COMPRESSED: i32 = 0x1;
const COMPRESSION_TYPE: i32 = 0x7 << 8;
/// Properties a resend drops: where the broker parked the message and
/// transaction state, not what the producer set.
const DROPPED_ON_RESEND: &[&str] = &[
    "RETRY_TOPIC",
    "REAL_TOPIC",
    "REAL_QID",
    "DELAY",
    "MAX_OFFSET",
    "MIN_OFFSET",
    "CONSUME_START_TIME",
    "TRAN_MSG",
    "PGROUP",
    "TRANSACTION_CHECK_TIMES",
    "TIMER_DELIVER_MS",
    "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS",
    "TIMER_OUT_MS",
    "__STARTDELIVERTIME",
    "POP_CK",
];

fn remoting(c: &RmqConn) -> std::result::Result<Remoting, ExitCode> {
    Ok(Remoting::new(&c.namesrv, super::credentials(&c.conn)?))
}

pub fn message(c: &RmqConn, action: &MessageAction) -> ExitCode {
    let mut r = match remoting(c) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let MessageAction::Get {
        topic,
        queue,
        offset,
        id,
        key,
        from,
        to,
        count,
        broker,
    } = action;
    let out = get(
        &mut r,
        topic.as_deref(),
        *queue,
        *offset,
        id.as_deref(),
        key.as_deref(),
        *from,
        *to,
        *count,
        broker.as_deref(),
    );
    super::finish(&c.conn, out)
}

pub fn dlq(c: &RmqConn, action: &DlqAction) -> ExitCode {
    let mut r = match remoting(c) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let out = match action {
        DlqAction::List { group, limit } => dlq_list(&mut r, group, *limit),
        DlqAction::Show {
            group,
            offset,
            queue,
            broker,
        } => dlq_show(&mut r, group, *offset, *queue, broker.as_deref()),
        DlqAction::Resend {
            group,
            offsets,
            all,
            queue,
            broker,
        } => {
            if offsets.is_empty() && !all {
                eprintln!("rokka: say which: --offset N[,M…] or --all");
                return ExitCode::from(2);
            }
            dlq_resend(&mut r, group, offsets, *all, *queue, broker.as_deref())
        }
    };
    // A resend with failures prints its report and exits 1.
    match out {
        Ok((report, failed)) => {
            report.print(c.conn.output);
            if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => super::finish(&c.conn, Err(e)),
    }
}

fn text(b: Option<&[u8]>) -> Value {
    match b {
        Some(v) => json!(String::from_utf8_lossy(v)),
        None => Value::Null,
    }
}

thread_local! {
    /// Most body bytes a message row holds on this thread (see [`preview_bodies`]).
    static BODY_LIMIT: std::cell::Cell<usize> = const { std::cell::Cell::new(64 << 20) };
}

/// While the guard lives, message rows made on this thread hold at most
/// `n` bytes of each body (the console, which runs in the broker: a page of
/// 1000 zlib bodies that each inflate to 64 MiB took gigabytes).
pub struct BodyPreview(usize);

/// See [`BodyPreview`].
pub fn preview_bodies(n: usize) -> BodyPreview {
    BodyPreview(BODY_LIMIT.replace(n))
}

impl Drop for BodyPreview {
    fn drop(&mut self) {
        BODY_LIMIT.set(self.0);
    }
}

/// The body as stored, uncompressed when it was (zlib, RocketMQ 4's and 5's
/// default), at most the thread's body limit, and whether it was cut there;
/// None when compressed otherwise.
fn body(m: &MessageView) -> Option<(Vec<u8>, bool)> {
    let limit = BODY_LIMIT.get();
    if m.sys_flag & COMPRESSED == 0 {
        return Some((m.body[..m.body.len().min(limit)].to_vec(), m.body.len() > limit));
    }
    match (m.sys_flag & COMPRESSION_TYPE) >> 8 {
        0 | 3 => {
            use std::io::Read;
            let mut out = Vec::new();
            // At most the limit (64 MiB by default) out of a hostile body.
            flate2::read::ZlibDecoder::new(&m.body[..])
                .take(limit as u64 + 1)
                .read_to_end(&mut out)
                .ok()?;
            let cut = out.len() > limit;
            out.truncate(limit);
            Some((out, cut))
        }
        _ => None,
    }
}

const MESSAGE_COLUMNS: &[&str] = &[
    "broker",
    "topic",
    "queue",
    "offset",
    "msg_id",
    "offset_msg_id",
    "keys",
    "tags",
    "born_timestamp",
    "store_timestamp",
    "reconsume_times",
    "properties",
    "body",
    "body_encoding",
];

fn message_row(broker: &str, m: &MessageView) -> Vec<Value> {
    let offset_id = rokka_store::msgid::message_id(m.store_host, m.phys_offset);
    let props: serde_json::Map<String, Value> = properties::iter(&m.user_properties())
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), text(Some(v))))
        .collect();
    let limit = BODY_LIMIT.get();
    let (body, encoding) = match body(m) {
        Some((b, cut)) => match String::from_utf8(b) {
            Ok(s) if cut => (json!(s), "utf8, cut"),
            Ok(s) => (json!(s), "utf8"),
            // (A cut may split a character: the text up to it. Bytes that
            // are not UTF-8 before the cut are shown as base64.)
            Err(e) if cut && e.utf8_error().error_len().is_none() => {
                let valid = e.utf8_error().valid_up_to();
                (json!(String::from_utf8_lossy(&e.as_bytes()[..valid])), "utf8, cut")
            }
            Err(e) if cut => (
                json!(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
                "base64, cut",
            ),
            Err(e) => (
                json!(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
                "base64",
            ),
        },
        None if m.body.len() > limit => (
            json!(base64::engine::general_purpose::STANDARD.encode(&m.body[..limit])),
            "compressed-base64, cut",
        ),
        None => (
            json!(base64::engine::general_purpose::STANDARD.encode(&m.body)),
            "compressed-base64",
        ),
    };
    vec![
        json!(broker),
        json!(m.topic_str()),
        json!(m.queue_id),
        json!(m.queue_offset),
        m.property(properties::UNIQ_KEY)
            .map(|v| text(Some(v)))
            .unwrap_or_else(|| json!(offset_id)),
        json!(offset_id),
        text(m.property(properties::KEYS)),
        text(m.property(properties::TAGS)),
        json!(m.born_timestamp),
        json!(m.store_timestamp),
        json!(m.reconsume_times),
        Value::Object(props),
        body,
        json!(encoding),
    ]
}

/// The broker serving `topic` named `want`, or the only one.
fn pick<'a>(route: &'a [BrokerQueues], topic: &str, want: Option<&str>) -> Result<&'a BrokerQueues> {
    match want {
        Some(name) => route
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| AdminError::Refused(format!("broker {name} does not serve {topic}"))),
        None => match route {
            [one] => Ok(one),
            [] => Err(AdminError::Refused(format!("no broker serves {topic}"))),
            many => Err(AdminError::Usage(format!(
                "{topic} is served by {}: name one with --broker",
                many.iter().map(|b| b.name.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}

/// Whether `listed`, a broker address the name server lists (`ip:port`
/// or `host:port`, as the broker advertises itself), is `addr`, the
/// address a message id names: the same text, the same socket address
/// written another way, or a host name that resolves to it (the name
/// server's entries are registered by the brokers, under
/// CLUSTER_ACTION when authorization is on).
fn names(listed: &str, addr: std::net::SocketAddr) -> bool {
    use std::net::ToSocketAddrs;
    if listed == addr.to_string() {
        return true;
    }
    if let Ok(a) = listed.parse::<std::net::SocketAddr>() {
        return a == addr;
    }
    listed
        .to_socket_addrs()
        .is_ok_and(|mut resolved| resolved.any(|a| a == addr))
}

#[allow(clippy::too_many_arguments)]
pub fn get(
    r: &mut Remoting,
    topic: Option<&str>,
    queue: u32,
    offset: Option<i64>,
    id: Option<&str>,
    key: Option<&str>,
    from: Option<i64>,
    to: Option<i64>,
    count: Option<u32>,
    broker: Option<&str>,
) -> Result<Report> {
    let mut sec = Section::new("messages", MESSAGE_COLUMNS);
    let max = count.unwrap_or(if offset.is_some() { 1 } else { 32 }).clamp(1, 1000);
    let need_topic = || topic.ok_or_else(|| AdminError::Usage("name the topic with --topic".into()));
    if let Some(offset) = offset {
        let topic = need_topic()?;
        let route = r.route(topic)?;
        let b = pick(&route, topic, broker)?;
        let mut at = offset;
        // Bounded: each round reads something or moves forward.
        for _ in 0..10_000 {
            if sec.rows.len() as u32 >= max {
                break;
            }
            let (got, next) = r.pull_next(
                &b.addr,
                ADMIN_GROUP,
                topic,
                queue,
                at,
                (max - sec.rows.len() as u32).min(32),
            )?;
            let Some(n) = next_at(&got, next, at) else { break };
            at = n;
            for m in got.iter().filter(|m| m.queue_offset as i64 >= offset) {
                sec.rows.push(message_row(&b.name, m));
            }
        }
    } else if let Some(id) = id {
        // The client's id first (needs the topic), then the broker's.
        if let Some(topic) = topic {
            for b in r.route(topic)? {
                let fields = [
                    ("topic", topic.to_string()),
                    ("key", id.to_string()),
                    ("maxNum", "1".to_string()),
                    ("beginTimestamp", "0".to_string()),
                    ("endTimestamp", i64::MAX.to_string()),
                    ("_UNIQUE_KEY_QUERY", "true".to_string()),
                ];
                let resp = r.call(&b.addr, request(code::QUERY_MESSAGE, &fields))?;
                match resp.code {
                    SUCCESS => {
                        for m in super::remoting::messages(&resp.body)? {
                            sec.rows.push(message_row(&b.name, &m));
                        }
                    }
                    QUERY_NOT_FOUND => {}
                    _ => return Err(refused(&resp, &format!("looking up {id}"))),
                }
            }
        }
        if sec.rows.is_empty() {
            if let Some((host, phys)) = rokka_store::msgid::parse_message_id(id) {
                let addr = host.to_string();
                // The id names an address: only a broker the name server
                // lists is asked (an id is anyone's text: the console's or
                // the CLI's signed request goes to no one else).
                if !r.broker_addrs()?.iter().any(|listed| names(listed, host)) {
                    return Err(AdminError::Refused(format!(
                        "no message with id {id}: it names {addr}, which is no broker the name server lists"
                    )));
                }
                let resp = r.call(
                    &addr,
                    request(code::VIEW_MESSAGE_BY_ID, &[("offset", phys.to_string())]),
                );
                if let Ok(resp) = resp {
                    if resp.code == SUCCESS {
                        for m in super::remoting::messages(&resp.body)? {
                            sec.rows.push(message_row(&addr, &m));
                        }
                    }
                }
            }
        }
        if sec.rows.is_empty() {
            return Err(AdminError::Refused(format!("no message with id {id}")));
        }
    } else if let Some(key) = key {
        let topic = need_topic()?;
        for b in r.route(topic)? {
            let fields = [
                ("topic", topic.to_string()),
                ("key", key.to_string()),
                ("maxNum", max.min(64).to_string()),
                ("beginTimestamp", from.unwrap_or(0).to_string()),
                ("endTimestamp", to.unwrap_or(i64::MAX).to_string()),
            ];
            let resp = r.call(&b.addr, request(code::QUERY_MESSAGE, &fields))?;
            match resp.code {
                SUCCESS => {
                    for m in super::remoting::messages(&resp.body)? {
                        sec.rows.push(message_row(&b.name, &m));
                    }
                }
                QUERY_NOT_FOUND => {}
                _ => return Err(refused(&resp, &format!("looking up key {key}"))),
            }
        }
    } else if let Some(from) = from {
        let topic = need_topic()?;
        let to = to.unwrap_or(i64::MAX);
        'brokers: for b in r.route(topic)? {
            for q in 0..b.read_queues {
                let mut at = r.offset(&b.addr, code::SEARCH_OFFSET_BY_TIMESTAMP, topic, q, Some(from))?;
                let end = r.offset(&b.addr, code::GET_MAX_OFFSET, topic, q, None)?;
                while at < end {
                    let (got, next) = r.pull_next(&b.addr, ADMIN_GROUP, topic, q, at, 32)?;
                    let Some(n) = next_at(&got, next, at) else { break };
                    at = n;
                    for m in &got {
                        if m.store_timestamp > to {
                            break;
                        }
                        if m.store_timestamp >= from {
                            sec.rows.push(message_row(&b.name, m));
                            if sec.rows.len() as u32 >= max {
                                break 'brokers;
                            }
                        }
                    }
                    if got.iter().any(|m| m.store_timestamp > to) {
                        break;
                    }
                }
            }
        }
    } else {
        return Err(AdminError::Usage(
            "say which: --topic T --offset O [--queue Q], --id ID, --topic T --key K, or --topic T --from MS [--to MS]"
                .into(),
        ));
    }
    let n = sec.rows.len();
    Ok(Report {
        sections: vec![sec],
        message: Some(format!("{n} message(s)")),
    })
}

fn dlq_topic(group: &str) -> String {
    format!("%DLQ%{group}")
}

/// The DLQ's route; empty when the group has none yet.
fn dlq_route(r: &mut Remoting, group: &str) -> Result<Vec<BrokerQueues>> {
    match r.route(&dlq_topic(group)) {
        Ok(route) => Ok(route),
        // TOPIC_NOT_EXIST: nothing was ever dead-lettered.
        Err(AdminError::Refused(m)) if m.contains("response code 17") => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

pub fn dlq_list(r: &mut Remoting, group: &str, limit: usize) -> Result<(Report, bool)> {
    let topic = dlq_topic(group);
    let route = dlq_route(r, group)?;
    let mut queues = Section::new("queues", &["broker", "queue", "earliest", "latest", "messages"]);
    let mut rows = Section::new(
        "messages",
        &[
            "broker",
            "queue",
            "offset",
            "msg_id",
            "original_topic",
            "reconsume_times",
            "store_timestamp",
            "body_bytes",
        ],
    );
    let mut total = 0i64;
    for b in &route {
        for q in 0..b.read_queues {
            let lo = r.offset(&b.addr, code::GET_MIN_OFFSET, &topic, q, None)?;
            let hi = r.offset(&b.addr, code::GET_MAX_OFFSET, &topic, q, None)?;
            total += (hi - lo).max(0);
            queues.rows.push(vec![
                json!(b.name),
                json!(q),
                json!(lo),
                json!(hi),
                json!((hi - lo).max(0)),
            ]);
            let mut at = lo;
            while at < hi && rows.rows.len() < limit {
                let got = r.pull(&b.addr, group, &topic, q, at, 32)?;
                let Some(last) = got.last() else {
                    // Listed but unreadable: said, not skipped.
                    rows.rows.push(vec![
                        json!(b.name),
                        json!(q),
                        json!(at),
                        Value::Null,
                        json!("(unreadable)"),
                        Value::Null,
                        Value::Null,
                        Value::Null,
                    ]);
                    at += 1;
                    continue;
                };
                let next = last.queue_offset as i64 + 1;
                for m in got.iter().take(limit - rows.rows.len()) {
                    rows.rows.push(vec![
                        json!(b.name),
                        json!(q),
                        json!(m.queue_offset),
                        m.property(properties::UNIQ_KEY)
                            .map(|v| text(Some(v)))
                            .unwrap_or_else(|| json!(rokka_store::msgid::message_id(m.store_host, m.phys_offset))),
                        text(m.property("RETRY_TOPIC")),
                        json!(m.reconsume_times),
                        json!(m.store_timestamp),
                        json!(m.body.len()),
                    ]);
                }
                at = next;
            }
        }
    }
    let message = if route.is_empty() {
        format!("group {group} has no dead letters ({topic} does not exist)")
    } else if (rows.rows.len() as i64) < total {
        format!("{total} dead letter(s); the first {} shown (--limit)", rows.rows.len())
    } else {
        format!("{total} dead letter(s)")
    };
    Ok((
        Report {
            sections: vec![queues, rows],
            message: Some(message),
        },
        false,
    ))
}

fn dlq_show(r: &mut Remoting, group: &str, offset: i64, queue: u32, broker: Option<&str>) -> Result<(Report, bool)> {
    let topic = dlq_topic(group);
    let route = dlq_route(r, group)?;
    let b = pick(&route, &topic, broker)?;
    let got = r.pull(&b.addr, group, &topic, queue, offset, 1)?;
    let m = got
        .iter()
        .find(|m| m.queue_offset as i64 == offset)
        .ok_or_else(|| AdminError::Refused(format!("no dead letter at {topic}/{queue} offset {offset}")))?;
    let mut sec = Section::new("messages", MESSAGE_COLUMNS);
    sec.rows.push(message_row(&b.name, m));
    Ok((
        Report {
            sections: vec![sec],
            message: None,
        },
        false,
    ))
}

/// The properties a resent message carries: the producer's, minus where
/// the broker parked it, plus ORIGIN_MESSAGE_ID (the dead letter's id).
fn resend_properties(m: &MessageView) -> String {
    let user = m.user_properties();
    let mut pairs: Vec<(String, String)> = properties::iter(&user)
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .filter(|(k, _)| !DROPPED_ON_RESEND.contains(&k.as_str()))
        .collect();
    if !pairs.iter().any(|(k, _)| k == "ORIGIN_MESSAGE_ID") {
        pairs.push((
            "ORIGIN_MESSAGE_ID".into(),
            rokka_store::msgid::message_id(m.store_host, m.phys_offset),
        ));
    }
    properties::encode(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// Whether `group` consumes `topic` on one of `route`'s brokers
/// (QUERY_TOPIC_CONSUME_BY_WHO: subscribed now, or holding offsets).
fn group_consumes(
    r: &mut Remoting,
    route: &[BrokerQueues],
    topic: &str,
    group: &str,
) -> std::result::Result<(), String> {
    if rokka_broker::is_system_topic(topic) {
        return Err(format!(
            "{topic} is one of the broker's own topics: not a resend target"
        ));
    }
    for b in route {
        let fields = [("topic", topic.to_string())];
        let Ok(resp) = r.ok(
            &b.addr,
            code::QUERY_TOPIC_CONSUME_BY_WHO,
            &fields,
            "QUERY_TOPIC_CONSUME_BY_WHO",
        ) else {
            continue;
        };
        let listed = serde_json::from_slice::<Value>(&resp.body)
            .ok()
            .and_then(|v| v.get("groupList").cloned())
            .and_then(|l| l.as_array().cloned())
            .is_some_and(|l| l.iter().any(|g| g.as_str() == Some(group)));
        if listed {
            return Ok(());
        }
    }
    Err(format!(
        "its RETRY_TOPIC names {topic}, which group {group} neither subscribes to nor holds offsets on (a property a client can set): not resent"
    ))
}

pub fn dlq_resend(
    r: &mut Remoting,
    group: &str,
    offsets: &[i64],
    all: bool,
    queue: u32,
    broker: Option<&str>,
) -> Result<(Report, bool)> {
    let topic = dlq_topic(group);
    let route = dlq_route(r, group)?;
    if route.is_empty() {
        return Err(AdminError::Refused(format!(
            "group {group} has no dead letters ({topic} does not exist)"
        )));
    }
    // (broker, queue, offset) to resend, in order.
    let mut wanted: Vec<(BrokerQueues, u32, i64)> = Vec::new();
    if all {
        for b in &route {
            for q in 0..b.read_queues {
                let lo = r.offset(&b.addr, code::GET_MIN_OFFSET, &topic, q, None)?;
                let hi = r.offset(&b.addr, code::GET_MAX_OFFSET, &topic, q, None)?;
                wanted.extend((lo..hi).map(|o| (b.clone(), q, o)));
            }
        }
    } else {
        let b = pick(&route, &topic, broker)?.clone();
        wanted.extend(offsets.iter().map(|o| (b.clone(), queue, *o)));
    }
    let mut results = Section::new(
        "results",
        &["broker", "queue", "offset", "msg_id", "topic", "result", "detail"],
    );
    let mut routes: BTreeMap<String, std::result::Result<Vec<BrokerQueues>, String>> = BTreeMap::new();
    let mut consumers: BTreeMap<String, std::result::Result<(), String>> = BTreeMap::new();
    let mut turn = 0usize;
    let (mut ok, mut failed) = (0usize, 0usize);
    for (b, q, offset) in &wanted {
        let mut row = |msg_id: Value, target: Value, outcome: std::result::Result<String, String>| {
            let (result, detail) = match outcome {
                Ok(d) => {
                    ok += 1;
                    ("resent", d)
                }
                Err(d) => {
                    failed += 1;
                    ("failed", d)
                }
            };
            results.rows.push(vec![
                json!(b.name),
                json!(q),
                json!(offset),
                msg_id,
                target,
                json!(result),
                json!(detail),
            ]);
        };
        let m = match r.pull(&b.addr, group, &topic, *q, *offset, 1) {
            Ok(got) => got.into_iter().find(|m| m.queue_offset as i64 == *offset),
            Err(e) => {
                row(Value::Null, Value::Null, Err(format!("reading it: {e}")));
                continue;
            }
        };
        let Some(m) = m else {
            row(
                Value::Null,
                Value::Null,
                Err("no message at this offset (never written, or removed by retention)".into()),
            );
            continue;
        };
        let id = m
            .property(properties::UNIQ_KEY)
            .map(|v| text(Some(v)))
            .unwrap_or_else(|| json!(rokka_store::msgid::message_id(m.store_host, m.phys_offset)));
        let Some(original) = m
            .property("RETRY_TOPIC")
            .map(|t| String::from_utf8_lossy(t).into_owned())
        else {
            row(
                id,
                Value::Null,
                Err("no RETRY_TOPIC property: its original topic is unknown".into()),
            );
            continue;
        };
        let target = routes
            .entry(original.clone())
            .or_insert_with(|| r.route(&original).map_err(|e| e.to_string()))
            .clone();
        // RETRY_TOPIC is a property a client can set (a send to %DLQ%<group>
        // needs only READ on the group): resent with the operator's rights,
        // a planted one would write where its sender may not. Only a topic
        // the group consumes (subscribed, or holding offsets) is a target.
        if let Ok(t) = &target {
            let consumed = consumers
                .entry(original.clone())
                .or_insert_with(|| group_consumes(r, t, &original, group))
                .clone();
            if let Err(why) = consumed {
                row(id, json!(original), Err(why));
                continue;
            }
        }
        let target = match target {
            Ok(t) if t.iter().any(|b| b.write_queues > 0) => t,
            Ok(_) => {
                row(
                    id,
                    json!(original),
                    Err(format!("no broker takes writes to {original}")),
                );
                continue;
            }
            Err(e) => {
                row(id, json!(original), Err(e));
                continue;
            }
        };
        // Round robin over every writable queue of the topic.
        let slots: Vec<(&BrokerQueues, u32)> = target
            .iter()
            .flat_map(|b| (0..b.write_queues).map(move |q| (b, q)))
            .collect();
        let (tb, tq) = slots[turn % slots.len()];
        turn += 1;
        let fields = [
            ("producerGroup", ADMIN_GROUP.to_string()),
            ("topic", original.clone()),
            ("defaultTopic", "TBW102".to_string()),
            ("defaultTopicQueueNums", "4".to_string()),
            ("queueId", tq.to_string()),
            ("sysFlag", (m.sys_flag & (COMPRESSED | COMPRESSION_TYPE)).to_string()),
            ("bornTimestamp", rokka_store::now_ms().to_string()),
            ("flag", m.flag.to_string()),
            ("properties", resend_properties(&m)),
            ("reconsumeTimes", "0".to_string()),
            ("unitMode", "false".to_string()),
            ("batch", "false".to_string()),
        ];
        let mut cmd = request(code::SEND_MESSAGE, &fields);
        cmd.body = m.body.clone();
        match r.call(&tb.addr, cmd) {
            Ok(resp) if resp.code == SUCCESS => {
                let new_id = resp.ext_fields.get("msgId").unwrap_or_default().to_string();
                row(id, json!(original), Ok(format!("to {}/{tq} as {new_id}", tb.name)));
            }
            Ok(resp) => row(id, json!(original), Err(refused(&resp, "the send").to_string())),
            Err(e) => row(id, json!(original), Err(format!("the send: {e}"))),
        }
    }
    let message = format!("{} dead letter(s): {ok} resent, {failed} failed", wanted.len());
    Ok((
        Report {
            sections: vec![results],
            message: Some(message),
        },
        failed > 0,
    ))
}

/// Where to read on after a read at `at` that returned `got`: past its
/// last message; when it returned none, where the broker says
/// (`nextBeginOffset`: the queue's first for an offset retention passed,
/// past aborted or filtered records), if that is past `at`. None to stop.
fn next_at(got: &[MessageView], next: Option<i64>, at: i64) -> Option<i64> {
    match got.last() {
        Some(last) => Some(last.queue_offset as i64 + 1),
        None => next.filter(|n| *n > at),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message id's address matches the name server's entry for its
    /// broker however the broker advertises itself; any other does not.
    #[test]
    fn an_ids_address_matches_its_brokers_listed_name() {
        let addr: std::net::SocketAddr = "127.0.0.1:10911".parse().expect("addr");
        assert!(names("127.0.0.1:10911", addr));
        assert!(names("localhost:10911", addr));
        assert!(!names("localhost:10912", addr));
        assert!(!names("127.0.0.2:10911", addr));
        let v6: std::net::SocketAddr = "[::1]:10911".parse().expect("addr");
        assert!(names("[0:0:0:0:0:0:0:1]:10911", v6));
    }

    /// A message of topic "T" with `body` and `sys_flag`, zero elsewhere.
    fn view(body: Vec<u8>, sys_flag: i32) -> MessageView {
        MessageView {
            total_size: 0,
            magic: 0,
            body_crc: 0,
            queue_id: 0,
            flag: 0,
            queue_offset: 0,
            phys_offset: 0,
            sys_flag,
            born_timestamp: 0,
            born_host: "127.0.0.1:1".parse().expect("addr"),
            store_timestamp: 0,
            store_host: "127.0.0.1:10911".parse().expect("addr"),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: bytes::Bytes::from(body),
            topic: bytes::Bytes::from_static(b"T"),
            properties: bytes::Bytes::new(),
        }
    }

    #[test]
    fn resends_drop_where_the_broker_parked_it() {
        let props = properties::encode([("RETRY_TOPIC", "orders"), ("KEYS", "k1"), ("REAL_QID", "3"), ("a", "b")]);
        let m = MessageView {
            phys_offset: 42,
            reconsume_times: 3,
            topic: bytes::Bytes::from_static(b"%DLQ%g"),
            properties: bytes::Bytes::from(props.into_bytes()),
            ..view(Vec::new(), 0)
        };
        let out = resend_properties(&m);
        let got: Vec<(String, String)> = properties::iter(out.as_bytes())
            .map(|(k, v)| (String::from_utf8_lossy(k).into(), String::from_utf8_lossy(v).into()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("KEYS".to_string(), "k1".to_string()),
                ("a".into(), "b".into()),
                (
                    "ORIGIN_MESSAGE_ID".into(),
                    rokka_store::msgid::message_id(m.store_host, 42)
                ),
            ]
        );
    }

    /// Under a preview (the console's pages), a row holds at most the
    /// preview's bytes of a body — a zlib body inflating to megabytes too —
    /// and says it was cut; the CLI's rows hold the whole body.
    #[test]
    fn a_body_preview_cuts_plain_and_inflated_bodies() {
        use std::io::Write;
        let big = vec![b'<'; 1 << 20];
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&big).expect("deflate");
        let zipped = z.finish().expect("deflate");
        let body_col = MESSAGE_COLUMNS.iter().position(|c| *c == "body").expect("body column");
        for m in [view(big.clone(), 0), view(zipped, COMPRESSED)] {
            let whole = message_row("b", &m);
            assert_eq!(whole[body_col].as_str().map(str::len), Some(1 << 20));
            let _g = preview_bodies(4096);
            let row = message_row("b", &m);
            assert_eq!(row[body_col].as_str().map(str::len), Some(4096));
            assert_eq!(row[body_col + 1], json!("utf8, cut"));
        }
        assert_eq!(BODY_LIMIT.get(), 64 << 20, "the guard put the limit back");
    }
}
