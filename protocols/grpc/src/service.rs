//! `apache.rocketmq.v2.MessagingService` over the broker: routes, sends
//! and pop consumption. One `Messaging` per node serves every connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rokka_broker::pop::{self, HandleError, Pops, QueuePops, Receipt};
use rokka_broker::Broker;
use rokka_store::record::message::MessageView;
use rokka_store::{Entry, MessageInput, ReadStatus};
use tokio::sync::{mpsc, Notify};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::auth::{Guard, Need};
use crate::message::{self, Handout};
use crate::pb;
use crate::GrpcConfig;
use rokka_broker::acl::{rocketmq_topic, Operation as Op, ResourceType as Rt};

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A ReceiveMessage answer being written. Messages the transport has not
/// taken when it drops the answer (the client reset the call or went away)
/// are made visible again at once, as Apache's proxy nacks what it could
/// not write — not left invisible for their whole invisible time.
struct Answer {
    items: std::collections::VecDeque<pb::ReceiveMessageResponse>,
    m: Arc<Messaging>,
    group: String,
}

impl Stream for Answer {
    type Item = Result<pb::ReceiveMessageResponse, Status>;
    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        std::task::Poll::Ready(self.items.pop_front().map(Ok))
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        let mut released = 0u64;
        for r in self.items.drain(..) {
            let Some(pb::receive_message_response::Content::Message(msg)) = r.content else {
                continue;
            };
            let Some(handle) = msg.system_properties.and_then(|p| p.receipt_handle) else {
                continue;
            };
            let nack = pb::ChangeInvisibleDurationRequest {
                group: Some(resource(&self.group)),
                topic: msg.topic,
                receipt_handle: handle,
                invisible_duration: Some(message::duration(0)),
                ..Default::default()
            };
            if self
                .m
                .change_invisible(nack)
                .status
                .is_some_and(|s| s.code == pb::Code::Ok as i32)
            {
                released += 1;
            }
        }
        if released > 0 {
            metrics::counter!("rokka_rocketmq5_unwritten_messages_released_total").increment(released);
        }
    }
}

/// The node's gRPC service.
#[derive(Debug)]
pub struct Messaging {
    broker: Arc<Broker>,
    config: GrpcConfig,
    /// The broker name routes give (the remoting broker's, so both
    /// protocols name the same set).
    broker_name: String,
    /// Where clients reach this service, as routes give it (from
    /// `host:port`, the host an IP address or a DNS name).
    advertised: pb::Endpoints,
    /// It is a wildcard address (0.0.0.0, ::): routes give the endpoints
    /// the client dialled instead.
    advertised_wildcard: bool,
    /// The store host of message ids made from offsets.
    store_host: SocketAddr,
    pops: Pops,
    /// Where the pop state is kept across restarts.
    pop_state: std::path::PathBuf,
    /// Round robin of queues for sends without a message group.
    next_queue: AtomicU64,
    telemetry_streams: Arc<AtomicU32>,
    /// Rotates which live producer of a topic a transaction check goes to.
    check_turn: std::sync::atomic::AtomicUsize,
    /// Producers with a live Telemetry stream, by client id: the topics
    /// they publish and where to send them commands (transaction checks).
    producers: std::sync::Mutex<HashMap<String, ProducerStream>>,
    /// % of memory within which a new group's first message counts as
    /// young enough to start from offset 0 (rocketmq.access_message_in_memory_max_ratio).
    memory_ratio: u32,
    /// Authentication and ACL checks (security.authorization).
    guard: Guard,
    /// Messages handed out to `auto_renew` receives, kept invisible while
    /// their client lives: (group, topic, queue, offset) → the renewal.
    renewals: std::sync::Mutex<HashMap<(String, String, u32, u64), Renewal>>,
    /// True once the listener stops: Telemetry streams end and waiting
    /// receives answer, so the server's graceful shutdown finishes (a live
    /// client's stream otherwise held it open until it went idle).
    stopping: tokio::sync::watch::Sender<bool>,
}

/// An auto-renewed handout: its client, the delivery its handle names, and
/// until when it may be renewed.
#[derive(Debug, Clone)]
struct Renewal {
    client: String,
    delivery: u64,
    until_ms: i64,
}

/// `host:port` as gRPC endpoints (IPv4, IPv6 or a domain name).
fn endpoints_of(addr: &str) -> pb::Endpoints {
    let (host, port) = match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_start_matches('[').trim_end_matches(']'),
            p.parse().unwrap_or(8081),
        ),
        None => (addr, 8081),
    };
    let scheme = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => pb::AddressScheme::IPv4,
        Ok(std::net::IpAddr::V6(_)) => pb::AddressScheme::IPv6,
        Err(_) => pb::AddressScheme::DomainName,
    };
    pb::Endpoints {
        scheme: scheme as i32,
        addresses: vec![pb::Address {
            host: host.to_string(),
            port,
        }],
    }
}

/// Queues of `topic` on the broker `name` at `endpoints`, from its
/// (readQueueNums, writeQueueNums, perm) as Apache's proxy makes them:
/// queues both read and written first, then those only read or only
/// written; a topic neither readable nor writable has its queues listed
/// with no permission.
fn push_queues(
    out: &mut Vec<pb::MessageQueue>,
    topic: &str,
    name: &str,
    endpoints: pb::Endpoints,
    (read, write, perm): (u32, u32, u32),
) {
    use rokka_broker::topics::{PERM_READ, PERM_WRITE};
    let r = if perm & PERM_READ != 0 { read } else { 0 };
    let w = if perm & PERM_WRITE != 0 { write } else { 0 };
    let n = if r == 0 && w == 0 { read.max(write) } else { r.max(w) };
    out.extend((0..n).map(|id| pb::MessageQueue {
        topic: Some(resource(topic)),
        id: id as i32,
        permission: match (id < r, id < w) {
            (true, true) => pb::Permission::ReadWrite,
            (true, false) => pb::Permission::Read,
            (false, true) => pb::Permission::Write,
            (false, false) => pb::Permission::None,
        } as i32,
        broker: Some(pb::Broker {
            name: name.to_string(),
            id: 0,
            endpoints: Some(endpoints.clone()),
        }),
        accept_message_types: vec![
            pb::MessageType::Normal as i32,
            pb::MessageType::Fifo as i32,
            pb::MessageType::Delay as i32,
            pb::MessageType::Transaction as i32,
        ],
    }));
}

fn ok() -> pb::Status {
    status(pb::Code::Ok, "OK")
}

fn status(code: pb::Code, message: impl Into<String>) -> pb::Status {
    if code != pb::Code::Ok {
        metrics::counter!("rokka_rocketmq5_errors_total", "code" => code.as_str_name()).increment(1);
    }
    pb::Status {
        code: code as i32,
        message: message.into(),
    }
}

/// One status for a call of several entries: theirs when they all agree,
/// else MULTIPLE_RESULTS; BAD_REQUEST when there were none.
fn overall<'a>(mut statuses: impl Iterator<Item = Option<&'a pb::Status>>, none: &str) -> pb::Status {
    let Some(first) = statuses.next() else {
        return status(pb::Code::BadRequest, none);
    };
    if statuses.all(|s| s.map(|s| s.code) == first.map(|s| s.code)) {
        first.cloned().unwrap_or_else(ok)
    } else {
        status(pb::Code::MultipleResults, "the entries had different results")
    }
}

/// The status of a stored append that could not be made durable (sync
/// flush) or replicated (cluster mode), as Apache's proxy names them.
fn not_durable(e: &rokka_store::StoreError) -> pb::Status {
    let code = match e {
        rokka_store::StoreError::NotEnoughReplicas | rokka_store::StoreError::NotLeader => pb::Code::HaNotAvailable,
        rokka_store::StoreError::ReplicationTimeout(_) => pb::Code::SlavePersistenceTimeout,
        _ => pb::Code::MasterPersistenceTimeout,
    };
    status(code, e.to_string())
}

/// A `grpc-timeout` header's value (`<digits><unit>`, unit H M S m u n)
/// in milliseconds.
fn grpc_timeout_ms(v: &str) -> Option<u64> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (n, unit) = v.split_at(v.len() - 1);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => n.saturating_mul(3_600_000),
        "M" => n.saturating_mul(60_000),
        "S" => n.saturating_mul(1000),
        "m" => n,
        "u" => n / 1000,
        "n" => n / 1_000_000,
        _ => return None,
    })
}

/// The earlier of two optional times.
fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn resource(name: &str) -> pb::Resource {
    pb::Resource {
        resource_namespace: String::new(),
        name: name.to_string(),
    }
}

fn name(r: &Option<pb::Resource>) -> &str {
    r.as_ref().map_or("", |r| r.name.as_str())
}

/// A stored entry as the RocketMQ messages it holds from `from` on (a
/// Kafka batch becomes one message per record, as remoting pulls see it),
/// at most `most` of them, and the offset of the record a Kafka batch
/// stopped at when it held more (the caller goes on from there).
fn messages_of(
    broker: &Broker,
    store_host: SocketAddr,
    topic: &str,
    q: u32,
    e: &rokka_store::ReadEntry,
    from: u64,
    most: usize,
) -> (Vec<MessageView>, Option<u64>) {
    if !e.is_kafka_batch() {
        return match e.decode() {
            Ok(Entry::Message(m)) => (vec![m], None),
            _ => (Vec::new(), None),
        };
    }
    let mut buf = BytesMut::new();
    let converted = match e.decode() {
        Ok(Entry::KafkaBatch(b)) if broker.kafka_txns().is_aborted_batch(topic, q, &b) => return (Vec::new(), None),
        // (At most the messages the caller takes, the batch kept decoded
        // for the next receive: converting, or decoding, the rest of a
        // large batch at each receive made draining it quadratic.)
        Ok(Entry::KafkaBatch(b)) => rokka_broker::convert::kafka_batch_to_rocketmq_cached(
            broker.decoded_batches(),
            &b,
            from,
            None,
            store_host,
            broker.config().max_batch_decompressed_bytes as usize,
            (POP_BODY_BYTES, most),
            false,
            &mut buf,
        ),
        Ok(_) => Err("not a Kafka batch".into()),
        Err(err) => Err(err.to_string()),
    };
    let stopped_at = match converted {
        Ok(c) => c.stopped_at,
        Err(err) => {
            tracing::error!(topic, queue = q, error = err, "Kafka batch not convertible; skipped");
            return (Vec::new(), None);
        }
    };
    let mut out = Vec::new();
    let mut all: Bytes = buf.freeze();
    while all.len() >= 4 {
        let n = u32::from_be_bytes([all[0], all[1], all[2], all[3]]) as usize;
        if n < 4 || n > all.len() {
            break;
        }
        let one = all.split_to(n);
        if let Ok(m) = rokka_store::record::message::decode(&one) {
            out.push(m);
        }
    }
    (out, stopped_at)
}

/// A producer's Telemetry stream.
#[derive(Debug)]
struct ProducerStream {
    /// Which stream (a client reconnecting replaces its entry).
    stream: u64,
    topics: Vec<String>,
    tx: mpsc::Sender<Result<pb::TelemetryCommand, Status>>,
}

static STREAMS: AtomicU64 = AtomicU64::new(1);

/// Topics a producer's telemetry settings are kept with at most (they
/// decide which producers a transaction check may go to).
const MAX_PUBLISHING_TOPICS: usize = 1000;

/// The transaction id a producer ends a half message with: where the
/// half message is (its queue offset and CommitLog offset).
fn transaction_id(half_offset: u64, half_phys: u64) -> String {
    format!("tx1_{half_offset:x}_{half_phys:x}")
}

fn parse_transaction_id(s: &str) -> Option<(u64, u64)> {
    let mut it = s.strip_prefix("tx1_")?.split('_');
    let off = u64::from_str_radix(it.next()?, 16).ok()?;
    let phys = u64::from_str_radix(it.next()?, 16).ok()?;
    it.next().is_none().then_some((off, phys))
}

/// Transaction checks to RocketMQ 5 producers: a RecoverOrphanedTransaction
/// command on the Telemetry stream of a live producer of the topic — tried
/// in turn from a rotating start (Apache's ProducerManager): a producer
/// whose stream takes nothing (its channel full) does not hold every check
/// of the topic until the checks run out and the message is discarded.
impl rokka_broker::transaction::TxnCheckSink for Messaging {
    fn check(&self, d: &rokka_broker::transaction::DueCheck) -> bool {
        let Ok(m) = rokka_store::record::message::decode(&d.record) else {
            return false;
        };
        let producers = pop::lock(&self.producers);
        let candidates: Vec<_> = producers
            .values()
            .filter(|p| p.topics.contains(&d.real_topic))
            .collect();
        if candidates.is_empty() {
            return false;
        }
        let start = self.check_turn.fetch_add(1, Ordering::Relaxed) % candidates.len();
        let cmd = pb::TelemetryCommand {
            status: Some(ok()),
            command: Some(pb::telemetry_command::Command::RecoverOrphanedTransactionCommand(
                pb::RecoverOrphanedTransactionCommand {
                    message: Some(message::outgoing(&m, self.store_host, None)),
                    transaction_id: transaction_id(d.half_offset, d.half_phys),
                },
            )),
        };
        candidates[start..]
            .iter()
            .chain(&candidates[..start])
            .any(|p| p.tx.try_send(Ok(cmd.clone())).is_ok())
    }
}

/// One pop over a topic's queues: whose, from which queue, how many.
#[derive(Clone, Copy)]
struct PopAsk<'a> {
    group: &'a str,
    topic: &'a str,
    partitions: u32,
    first: u32,
    batch: usize,
    invisible_ms: i64,
    codes: Option<&'a rokka_broker::convert::TagFilter>,
    /// The receive's attempt id (clients resend it when retrying a receive
    /// that timed out).
    attempt_id: Option<&'a str>,
}

/// What one pop over the queues gave.
struct Popped {
    messages: Vec<pb::Message>,
    /// The earliest time an in-flight message of these queues becomes
    /// visible again (a long poll wakes then).
    next_visible_ms: Option<i64>,
    /// A queue had no room for its pop state (grpc.max_pop_queues).
    refused: bool,
    /// A queue's scan stopped at its budget with messages left to look at
    /// (a tag filter skipping a backlog): the receive looks again at once.
    more: bool,
    /// Body bytes of `messages` (a receive stops adding past
    /// [`POP_BODY_BYTES`]: decompressed bodies can be large).
    bytes: usize,
}

/// Longest receive attempt id remembered for a FIFO queue (the clients
/// send a 36-character UUID).
const MAX_ATTEMPT_ID_BYTES: usize = 128;

/// Body bytes one receive answers with at most (past them it stops, the
/// first message whatever its size).
const POP_BODY_BYTES: usize = 32 << 20;

/// Messages one pop looks at per queue, filtered out or not (Apache reads
/// up to ~16 KiB of ConsumeQueue entries, ~800, per pop): a tag filter
/// skips a backlog of other tags a stretch at a time, not `batch` messages
/// per long poll — and the queue's lock is not held for longer.
const POP_SCAN_MESSAGES: usize = 1024;

impl Messaging {
    pub fn new(
        broker: Arc<Broker>,
        config: GrpcConfig,
        broker_name: String,
        advertised: String,
        memory_ratio: u32,
    ) -> Messaging {
        let store_host = broker.store().config().store_host;
        let pops = Pops::new(config.max_in_flight_messages, config.max_pop_queues as usize);
        broker
            .membership()
            .set_max_pop_consumers(config.max_pop_consumers as usize);
        let pop_state = broker.store().config().data_dir.join("config").join("pop-state.json");
        if let Err(e) = pops.load(&pop_state) {
            // Unreadable: pops start again from the committed offsets
            // (messages in flight then come again).
            tracing::error!(path = %pop_state.display(), error = %e, "pop state not loaded; consumption restarts from committed offsets");
        }
        Messaging {
            guard: Guard::new(&config),
            pop_state,
            pops,
            broker,
            config,
            broker_name,
            advertised_wildcard: advertised.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_unspecified()),
            advertised: endpoints_of(&advertised),
            store_host,
            next_queue: AtomicU64::new(0),
            telemetry_streams: Arc::new(AtomicU32::new(0)),
            check_turn: std::sync::atomic::AtomicUsize::new(0),
            producers: std::sync::Mutex::new(HashMap::new()),
            memory_ratio,
            renewals: std::sync::Mutex::new(HashMap::new()),
            stopping: tokio::sync::watch::channel(false).0,
        }
    }

    /// Records the messages of an `auto_renew` receive for renewal.
    fn note_renewals(&self, group: &str, topic: &str, client: &str, messages: &[pb::Message]) {
        let now = rokka_store::now_ms();
        let until = now.saturating_add(self.config.auto_renew_max_ms as i64);
        let max = self.config.max_in_flight_messages.max(1) as usize;
        let mut r = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
        for m in messages {
            let Some(h) = m
                .system_properties
                .as_ref()
                .and_then(|p| p.receipt_handle.as_deref())
                .and_then(Receipt::decode)
            else {
                continue;
            };
            if r.len() >= max {
                // Bounded as the messages in flight are: one not recorded
                // is just not renewed.
                metrics::counter!("rokka_rocketmq5_renewals_untracked_total").increment(1);
                break;
            }
            r.insert(
                (group.to_string(), topic.to_string(), h.queue, h.offset),
                Renewal {
                    client: client.to_string(),
                    delivery: h.delivery,
                    until_ms: until,
                },
            );
        }
        metrics::gauge!("rokka_rocketmq5_renewed_messages").set(r.len() as f64);
    }

    /// Renews the auto-renewed messages whose invisible time ends within
    /// half a renewal, while their client lives (a heartbeat or receive
    /// within `POP_CONSUMER_RENEW_MS`, 120 s) and within `auto_renew_max_ms`;
    /// forgets those acked, delivered again, or past renewing. A client
    /// that said it is leaving (`released`) has its messages made visible
    /// at once, as Apache's proxy releases an offline client's handles.
    /// Returns how many were renewed.
    pub fn renew_due(&self, now_ms: i64, released: Option<&str>) -> usize {
        let slice = self.config.auto_renew_invisible_ms.max(1000) as i64;
        // A client's termination releases its own renewals only: those
        // alone are copied out (the map may hold every client's).
        let entries: Vec<((String, String, u32, u64), Renewal)> = {
            let r = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
            r.iter()
                .filter(|(_, v)| released.is_none_or(|c| v.client == c))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let mut live: HashMap<String, Vec<String>> = HashMap::new();
        // (key, the delivery it named when looked at): removed only if it
        // still names it (a receive may have recorded a newer one since).
        let mut gone: Vec<((String, String, u32, u64), u64)> = Vec::new();
        let mut renewed = 0;
        for ((group, topic, queue, offset), rn) in entries {
            let key = ((group.clone(), topic.clone(), queue, offset), rn.delivery);
            let Some(st) = self.pops.existing(&group, &topic, queue) else {
                gone.push(key);
                continue;
            };
            let mut st = pop::lock(&st);
            let due = st
                .in_flight
                .get(&offset)
                .filter(|f| f.delivery == rn.delivery)
                .map(|f| f.visible_at_ms);
            let Some(visible_at) = due else {
                gone.push(key);
                continue;
            };
            if released == Some(rn.client.as_str()) {
                self.pops.renew(&mut st, offset, rn.delivery, now_ms);
                gone.push(key);
                continue;
            }
            let alive = live
                .entry(group.clone())
                .or_insert_with(|| {
                    self.broker.membership().pop_consumers_within(
                        &group,
                        now_ms,
                        rokka_broker::membership::POP_CONSUMER_RENEW_MS,
                    )
                })
                .contains(&rn.client);
            if !alive || now_ms >= rn.until_ms {
                // Left to its invisible time: delivered again after it.
                gone.push(key);
                continue;
            }
            if visible_at - now_ms < slice / 2 {
                let next = (now_ms + slice).min(rn.until_ms.max(now_ms));
                if self.pops.renew(&mut st, offset, rn.delivery, next) {
                    renewed += 1;
                }
            }
        }
        let mut r = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
        for (k, delivery) in gone {
            if r.get(&k).is_some_and(|now| now.delivery == delivery) {
                r.remove(&k);
            }
        }
        metrics::gauge!("rokka_rocketmq5_renewed_messages").set(r.len() as f64);
        if renewed > 0 {
            metrics::counter!("rokka_rocketmq5_invisible_renewals_total").increment(renewed as u64);
        }
        renewed
    }

    /// Pops of one group per topic are counted at scrape time (series exist
    /// while the pop state does).
    fn ready_families(&self) -> [rokka_broker::scrape::Family; 2] {
        use rokka_broker::scrape::Family;
        let store = self.broker.store();
        let mut ready = Family::gauge(
            "rokka_rocketmq5_messages_ready",
            "pop groups: messages ready to be received per topic and group (not handed out yet, or back from an ended invisible time)",
        );
        let mut hidden = Family::gauge(
            "rokka_rocketmq5_messages_invisible",
            "pop groups: messages handed out, not acked and still invisible, per topic and group",
        );
        let progress = self.pops.progress(rokka_store::now_ms());
        let pairs: std::collections::BTreeSet<(&str, &str)> =
            progress.keys().map(|(g, t, _)| (g.as_str(), t.as_str())).collect();
        for (group, topic) in pairs {
            let partitions = self.broker.topics().get(topic).map_or(0, |t| t.partitions);
            let (mut r, mut h) = (0u64, 0u64);
            // Every queue of the topic: those not popped yet from where the
            // group would start on them.
            for q in 0..partitions {
                let end = store.max_offset(topic, q);
                match progress.get(&(group.to_string(), topic.to_string(), q)) {
                    Some((cursor, due, invisible)) => {
                        r += end.saturating_sub(*cursor) + due;
                        h += invisible;
                    }
                    None => r += end.saturating_sub(self.start_offset(group, topic, q)),
                }
            }
            ready.push(
                vec![("topic", topic.to_string()), ("group", group.to_string())],
                r as f64,
            );
            hidden.push(
                vec![("topic", topic.to_string()), ("group", group.to_string())],
                h as f64,
            );
        }
        [ready, hidden]
    }

    /// Writes the pop state if it changed (the listener calls this every
    /// `grpc.pop_state_flush_ms` and at shutdown).
    pub fn persist_pops(&self) {
        if let Err(e) = self.pops.persist_if_dirty(&self.pop_state) {
            metrics::counter!("rokka_rocketmq5_pop_state_write_errors_total").increment(1);
            tracing::error!(path = %self.pop_state.display(), error = %e, "pop state not written");
        }
    }

    /// A topic's message queues as routes give them: on a single node all
    /// here; in cluster mode each broker set's queues under the set's name
    /// with its master's gRPC address (a set with no master, or whose
    /// master serves no gRPC, is left out until it has one), as Apache's
    /// proxy routes to each broker's queues.
    /// `dialled`: the endpoints the client's request says it reached this
    /// node at — what a single node listening on a wildcard address (and
    /// no `grpc.advertised_addr`) routes to, as Apache's proxy does.
    fn queues_of(
        &self,
        topic: &str,
        info: &rokka_broker::topics::TopicInfo,
        dialled: Option<&pb::Endpoints>,
    ) -> Vec<pb::MessageQueue> {
        let mut out = Vec::new();
        let Some(view) = self.broker.cluster_view() else {
            let here = match dialled {
                Some(d) if self.advertised_wildcard && !d.addresses.is_empty() => d.clone(),
                _ => self.advertised.clone(),
            };
            push_queues(&mut out, topic, &self.broker_name, here, info.rocketmq_queues());
            return out;
        };
        let sets: Vec<(String, u32)> = if info.placement.is_empty() {
            vec![(view.set.clone(), info.partitions)]
        } else {
            let names: std::collections::BTreeSet<&str> = info.placement.iter().map(|r| r.set.as_str()).collect();
            names.into_iter().map(|s| (s.to_string(), info.queues_on(s))).collect()
        };
        for (set, n) in sets {
            let master = view
                .set_named(&set)
                .and_then(|s| s.master)
                .and_then(|m| view.node(m))
                .map(|node| node.grpc.as_str())
                .filter(|a| !a.is_empty());
            let (read, write, perm) = if info.placement.is_empty() {
                info.rocketmq_queues()
            } else {
                (n, n, info.rocketmq_queues().2)
            };
            match master {
                Some(addr) => push_queues(&mut out, topic, &set, endpoints_of(addr), (read, write, perm)),
                None => metrics::counter!("rokka_rocketmq5_route_sets_missing_total").increment(1),
            }
        }
        out
    }

    /// Where a group with no pop state and nothing committed starts on a
    /// queue: its committed offset, else 0 while the queue's first
    /// message is young (as a new remoting group), else the queue's end.
    fn start_offset(&self, group: &str, topic: &str, q: u32) -> u64 {
        let store = self.broker.store();
        if let Some(c) = store.offsets().get(group, topic, q) {
            return c.offset.max(store.min_offset(topic, q));
        }
        if self.broker.first_message_in_memory(topic, q, self.memory_ratio) {
            0
        } else {
            store.max_offset(topic, q)
        }
    }

    /// Waits until everything appended so far is durable (and replicated
    /// in cluster mode): None, or the status that says it is not.
    async fn durable_now(&self) -> Option<pb::Status> {
        let end = self.broker.store().commitlog_offsets().1;
        self.broker.store().durable(end).await.err().map(|e| not_durable(&e))
    }

    /// Whether the group consumes in order (grpc.fifo_groups).
    /// FIFO delivery: a group of `grpc.fifo_groups`, or one whose config
    /// says consumeMessageOrderly (Apache's proxy's fifo setting).
    fn is_fifo(&self, group: &str) -> bool {
        self.config.fifo_groups.iter().any(|g| g == group) || self.broker.sub_groups().honoured(group).orderly
    }

    /// Deliveries of a message before it goes to the dead letters: the
    /// group's config's retryMaxTimes + 1 where an operator set one (as
    /// Apache's proxy), else `grpc.max_delivery_attempts`.
    fn max_delivery_attempts(&self, group: &str) -> u32 {
        let h = self.broker.sub_groups().honoured(group);
        match h.kept {
            true => (h.retry_max_times.clamp(0, i32::MAX - 1) as u32) + 1,
            false => self.config.max_delivery_attempts.max(1),
        }
    }

    /// Commits the group's lowest unacked offset when it moved.
    /// The state knows what it last committed (a change by anyone else is
    /// followed before the state is used: `follow_reset` at the start of a
    /// receive, an ack, a change of invisible time or a forward to the DLQ),
    /// so an unmoved watermark costs no offset-table lookup.
    fn commit_watermark(&self, group: &str, topic: &str, q: u32, st: &mut QueuePops) {
        let w = st.low_watermark();
        if st.committed == Some(w) {
            return;
        }
        // Refused past store.max_committed_offsets (counted there).
        if self.broker.store().offsets().commit_bounded(group, topic, q, w, "", -1) {
            st.committed = Some(w);
        }
    }

    /// A queue's committed offset changed under the pop state (an offset
    /// reset by the admin CLI, a Kafka admin commit, mqadmin): the group
    /// continues from there, as Apache RocketMQ 5 resets a pop group's
    /// progress; deleted offsets start it over where a new group starts.
    fn follow_reset(&self, group: &str, topic: &str, q: u32, st: &mut QueuePops) {
        let now = self.broker.store().offsets().get(group, topic, q).map(|c| c.offset);
        match (now, st.committed) {
            (Some(c), Some(mine)) if c != mine => {
                tracing::info!(
                    group,
                    topic,
                    queue = q,
                    from = mine,
                    to = c,
                    "pop group follows an offset reset"
                );
                self.pops.rewind(st, c);
            }
            (None, Some(_)) => {
                let start = self.start_offset(group, topic, q);
                self.pops.rewind(st, start);
                st.committed = None;
            }
            (Some(c), None) => st.committed = Some(c),
            _ => {}
        }
    }

    /// Sends a message that was delivered too often to `%DLQ%<group>`.
    fn to_dead_letters(&self, group: &str, m: &MessageView, attempts: u32) -> Result<(), String> {
        let topic = format!("%DLQ%{group}");
        if self.broker.topics().get(&topic).is_none_or(|t| t.partitions == 0) {
            self.broker.ensure_own_topic(&topic, 1).map_err(|e| e.to_string())?;
        }
        let mut props = m.properties.to_vec();
        let mut add = |k: &str, v: &str| {
            props.extend_from_slice(rokka_store::record::properties::encode([(k, v)]).as_bytes());
        };
        if m.property("RETRY_TOPIC").is_none() {
            add("RETRY_TOPIC", m.topic_str());
        }
        if m.property(message::DLQ_ORIGIN_TOPIC).is_none() {
            add(message::DLQ_ORIGIN_TOPIC, m.topic_str());
            let id = m
                .property(rokka_store::record::properties::UNIQ_KEY)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| rokka_store::msgid::message_id(m.store_host, m.phys_offset));
            add(message::DLQ_ORIGIN_MESSAGE_ID, &id);
        }
        let input = MessageInput {
            reconsume_times: attempts as i32,
            ..m.as_input(&topic, 0, &props)
        };
        self.broker
            .append_messages(std::slice::from_ref(&input))
            .map(|_| ())
            .map_err(|e| e.to_string())?;
        metrics::counter!("rokka_rocketmq5_dlq_messages_total", "group" => group.to_string()).increment(1);
        Ok(())
    }

    /// The message at `offset` of a queue, if the store still has it.
    fn message_at(&self, topic: &str, q: u32, offset: u64) -> Option<MessageView> {
        let read = self.broker.store().read(topic, q, offset, 1, 1 << 20);
        read.entries
            .iter()
            .flat_map(|e| messages_of(&self.broker, self.store_host, topic, q, e, offset, 1).0)
            .find(|m| m.queue_offset == offset)
    }

    /// One pass over the topic's queues from `first`: redeliveries due,
    /// then new messages, at most `batch`.
    fn pop_once(&self, ask: &PopAsk<'_>) -> Popped {
        let PopAsk {
            group,
            topic,
            partitions,
            first,
            batch,
            invisible_ms,
            codes,
            attempt_id,
        } = *ask;
        let mut out = Popped {
            messages: Vec::new(),
            next_visible_ms: None,
            refused: false,
            more: false,
            bytes: 0,
        };
        let now = rokka_store::now_ms();
        let store = self.broker.store();
        let cap = 4 << 20;
        let fifo = self.is_fifo(group);
        let handout = |r: Receipt, attempt: u32| Handout {
            receipt_handle: r.encode(),
            attempt,
            invisible_ms,
        };
        for i in 0..partitions {
            let room = batch - out.messages.len();
            if room == 0 || out.bytes >= POP_BODY_BYTES {
                break;
            }
            let q = (first + i) % partitions;
            let Some(st) = self.pops.queue(group, topic, q, || self.start_offset(group, topic, q)) else {
                out.refused = true;
                continue;
            };
            let mut st = pop::lock(&st);
            let taken_before = out.messages.len();
            self.follow_reset(group, topic, q, &mut st);
            // A FIFO group's queue gives out one batch at a time, in
            // order: nothing more while some of it is in flight and
            // invisible (Apache's orderly pop).
            // (Which are due is decided over all of them, not the room
            // left: a receive asking for fewer than are due must not read
            // as some still invisible, and block the queue for good.)
            let mut due = st.due(now, usize::MAX);
            if fifo && st.in_flight.len() > due.len() {
                if attempt_id.is_some() && st.fifo_attempt.as_deref() == attempt_id {
                    // The same attempt again: the client never got the
                    // answer that took this batch (the Java client resends
                    // its attempt id after DEADLINE_EXCEEDED). The batch
                    // again, under new handles, its deliveries not counted
                    // (Apache's ConsumerOrderInfoManager.checkBlock lets
                    // the same attempt through).
                    let offsets: Vec<u64> = st.in_flight.keys().copied().take(room).collect();
                    for off in offsets {
                        if out.bytes >= POP_BODY_BYTES {
                            break;
                        }
                        let Some(m) = self.message_at(topic, q, off) else {
                            self.pops.forget(&mut st, off);
                            continue;
                        };
                        if let Some((r, attempt)) = self.pops.hand_again(&mut st, q, off, now + invisible_ms) {
                            let msg = message::outgoing(&m, self.store_host, Some(&handout(r, attempt)));
                            out.bytes += msg.body.len();
                            out.messages.push(msg);
                        }
                    }
                    metrics::counter!("rokka_rocketmq5_fifo_attempt_retries_total").increment(1);
                    out.next_visible_ms = earliest(out.next_visible_ms, st.next_visible_ms());
                    continue;
                }
                out.next_visible_ms = earliest(out.next_visible_ms, st.next_visible_after(now));
                continue;
            }
            due.truncate(room);
            let redelivering = !due.is_empty();
            // Redeliveries first: messages whose invisible time is over.
            for (off, f) in due {
                if out.bytes >= POP_BODY_BYTES {
                    break;
                }
                let Some(m) = self.message_at(topic, q, off) else {
                    // Gone (retention): nothing to deliver again.
                    self.pops.forget(&mut st, off);
                    continue;
                };
                if f.attempt >= self.max_delivery_attempts(group) {
                    // Creates the topic's files at first: off the async workers.
                    match rokka_broker::offload(|| self.to_dead_letters(group, &m, f.attempt)) {
                        Ok(()) => self.pops.forget(&mut st, off),
                        Err(e) => tracing::error!(
                            group,
                            topic,
                            queue = q,
                            offset = off,
                            error = e,
                            "dead letter write failed"
                        ),
                    }
                    continue;
                }
                let (r, attempt) = self.pops.hand_out(&mut st, q, off, now + invisible_ms, now);
                metrics::counter!("rokka_rocketmq5_messages_redelivered_total", "group" => group.to_string())
                    .increment(1);
                let msg = message::outgoing(&m, self.store_host, Some(&handout(r, attempt)));
                out.bytes += msg.body.len();
                out.messages.push(msg);
            }
            // New messages from the cursor.
            let room = batch - out.messages.len();
            if room > 0 && self.pops.has_room() && !(fifo && redelivering) {
                let min = store.min_offset(topic, q);
                if st.cursor < min {
                    st.cursor = min;
                }
                let max = store.max_offset(topic, q);
                if st.cursor > max {
                    // The queue is shorter than the saved cursor (a crash
                    // lost its unflushed tail): new messages go there.
                    st.cursor = max;
                }
                let lso = self.broker.kafka_txns().last_stable_offset(topic, q, max);
                // Reads from the cursor until the batch is full, the
                // stable end is reached, or the scan budget is spent (a
                // filter may skip many messages for each it takes).
                let mut scanned = 0usize;
                loop {
                    let from = st.cursor;
                    if from >= lso
                        || out.messages.len() >= batch
                        || out.bytes >= POP_BODY_BYTES
                        || !self.pops.has_room()
                    {
                        break;
                    }
                    if scanned >= POP_SCAN_MESSAGES {
                        out.more = true;
                        break;
                    }
                    let want = (batch - out.messages.len()).max(if codes.is_some() { 64 } else { 1 });
                    let read = store.read(topic, q, from, want as u32, cap);
                    if read.status != ReadStatus::Found {
                        break;
                    }
                    let mut next = read.next_offset.min(lso);
                    'entries: for e in &read.entries {
                        let (messages, stopped_at) =
                            messages_of(&self.broker, self.store_host, topic, q, e, from, want);
                        for m in messages {
                            if m.queue_offset >= lso
                                || out.messages.len() >= batch
                                || out.bytes >= POP_BODY_BYTES
                                || !self.pops.has_room()
                            {
                                next = m.queue_offset;
                                break 'entries;
                            }
                            scanned += 1;
                            if codes.is_some_and(|c| !c.matches(&m.properties)) {
                                continue;
                            }
                            let (r, attempt) = self.pops.hand_out(&mut st, q, m.queue_offset, now + invisible_ms, now);
                            let msg = message::outgoing(&m, self.store_host, Some(&handout(r, attempt)));
                            out.bytes += msg.body.len();
                            out.messages.push(msg);
                        }
                        // A Kafka batch converted only in part: the next
                        // read starts at the first record not converted.
                        if let Some(at) = stopped_at {
                            next = at.min(next);
                            break 'entries;
                        }
                    }
                    if next <= st.cursor {
                        break;
                    }
                    st.cursor = next;
                }
            }
            if fifo && out.messages.len() > taken_before {
                st.fifo_attempt = attempt_id.map(str::to_string);
            }
            self.commit_watermark(group, topic, q, &mut st);
            out.next_visible_ms = earliest(out.next_visible_ms, st.next_visible_ms());
        }
        out
    }

    async fn receive(&self, req: pb::ReceiveMessageRequest, client_id: &str) -> Vec<pb::ReceiveMessageResponse> {
        let started = Instant::now();
        let fail = |code: pb::Code, text: String| {
            vec![pb::ReceiveMessageResponse {
                content: Some(pb::receive_message_response::Content::Status(status(code, text))),
            }]
        };
        let group = name(&req.group).to_string();
        // The group's config (mqadmin updateSubGroup): consumption turned
        // off is FORBIDDEN, as Apache's proxy answers the broker's
        // NO_PERMISSION.
        let forbidden = || {
            (!self.broker.sub_groups().honoured(&group).consume_enable).then(|| {
                metrics::counter!("rokka_rocketmq_group_refusals_total", "reason" => "consume_disabled").increment(1);
                fail(
                    pb::Code::Forbidden,
                    format!("subscription group no permission, {group}"),
                )
            })
        };
        let mq = req.message_queue.clone().unwrap_or_default();
        let topic = name(&mq.topic).to_string();
        if group.is_empty() {
            return fail(pb::Code::IllegalConsumerGroup, "consumer group is required".into());
        }
        let Some(info) = self.broker.topics().get(&topic) else {
            return fail(pb::Code::TopicNotFound, format!("topic {topic} not found"));
        };
        if !info.rocketmq_readable() {
            return fail(
                pb::Code::Forbidden,
                format!("the topic[{topic}] pulling message is forbidden"),
            );
        }
        // (Apache's pop checks the topic first.)
        if let Some(refused) = forbidden() {
            return refused;
        }
        // Cluster mode: pop state and the offsets it commits live on the
        // set's master (a replica takes no commits, as remoting's).
        // (Before the first view, too: the role is not known yet.)
        if !self.broker.leads_here() {
            return fail(
                pb::Code::HaNotAvailable,
                "not the broker set's master: pop from the master".into(),
            );
        }
        // A group is consumed by pop or by queue owners (remoting
        // consumers, Kafka members), never both at once: either would
        // deliver the other's messages again.
        let owner = self.broker.membership().with_group(&group, |m| {
            if !m.kafka.is_empty() {
                Some("Kafka")
            } else {
                (!m.rocketmq.is_empty()).then_some("remoting")
            }
        });
        if let Some(owner) = owner {
            metrics::counter!("rokka_mixed_group_conflicts_total", "group" => group.clone(), "side" => "rocketmq5")
                .increment(1);
            return fail(
                pb::Code::PreconditionFailed,
                format!(
                    "consumer group {group} has live {owner} consumers that own its queues; RocketMQ 5 pop consumers can take it over once they are gone"
                ),
            );
        }
        self.broker
            .membership()
            .note_pop_consumer(&group, client_id, rokka_store::now_ms());
        let filter = req.filter_expression.clone().unwrap_or_default();
        if filter.r#type() == pb::FilterType::Sql {
            return fail(
                pb::Code::NotImplemented,
                "SQL92 filters are not supported; use a TAG filter".into(),
            );
        }
        let codes = rokka_broker::convert::TagFilter::new(&filter.expression);
        // auto_renew (push consumers): Apache's proxy's default invisible
        // time, renewed while the client lives (renew_due); else the
        // client's.
        let invisible_ms = if req.auto_renew {
            self.config.auto_renew_invisible_ms.max(1000) as i64
        } else {
            req.invisible_duration.as_ref().map_or(30_000, message::duration_ms)
        };
        if !req.auto_renew
            && (invisible_ms < self.config.min_invisible_ms as i64
                || invisible_ms > self.config.max_invisible_ms as i64)
        {
            return fail(
                pb::Code::IllegalInvisibleTime,
                format!(
                    "invisible duration {invisible_ms} ms is outside [{}, {}] ms",
                    self.config.min_invisible_ms, self.config.max_invisible_ms
                ),
            );
        }
        let batch = (req.batch_size.max(1) as u32).min(self.config.max_receive_batch.max(1)) as usize;
        let poll_ms = req
            .long_polling_timeout
            .as_ref()
            .map_or(0, message::duration_ms)
            .clamp(0, self.config.max_long_polling_ms as i64) as u64;
        let deadline = started + Duration::from_millis(poll_ms);
        let partitions = info.partitions.max(1);
        // Queue -1 (a push consumer's assignment): start anywhere.
        let first = if mq.id < 0 {
            rand::random::<u32>() % partitions
        } else {
            mq.id as u32 % partitions
        };
        let mut stop = self.stopping.subscribe();
        let mut woken = false;
        loop {
            // Consumption turned off while this receive was held: refused
            // now, not served what arrives (Apache checks a woken pop again).
            if let Some(refused) = woken.then(forbidden).flatten() {
                return refused;
            }
            woken = true;
            let waiter = Arc::new(Notify::new());
            for q in 0..partitions {
                self.broker.arrivals().register(&topic, q, &waiter);
            }
            let popped = self.pop_once(&PopAsk {
                group: &group,
                topic: &topic,
                partitions,
                first,
                batch,
                invisible_ms,
                codes: codes.as_ref(),
                // Remembered per FIFO queue: only ids of a sane length
                // (clients send a UUID), so a client cannot park megabytes
                // in every queue's state; a longer one is not retried.
                attempt_id: req
                    .attempt_id
                    .as_deref()
                    .filter(|a| !a.is_empty() && a.len() <= MAX_ATTEMPT_ID_BYTES),
            });
            // The budget is full and nothing was due again: refused at
            // once (the pass above still hands out again, or dead-letters,
            // what has come due: with no room for new messages those are
            // what frees it — refusing before the pass jammed the node for
            // good once consumers held the budget and went away).
            if popped.messages.is_empty() && !self.pops.has_room() {
                metrics::counter!("rokka_rocketmq5_receives_refused_total", "reason" => "in_flight").increment(1);
                return fail(
                    pb::Code::TooManyRequests,
                    "too many messages in flight (grpc.max_in_flight_messages): ack some first".into(),
                );
            }
            let now = Instant::now();
            if !popped.messages.is_empty() || now >= deadline {
                metrics::histogram!("rokka_rocketmq5_await_time_seconds").record(started.elapsed().as_secs_f64());
                if popped.messages.is_empty() && popped.refused {
                    metrics::counter!("rokka_rocketmq5_receives_refused_total", "reason" => "pop_queues").increment(1);
                    return fail(
                        pb::Code::TooManyRequests,
                        "too many pop states (grpc.max_pop_queues)".into(),
                    );
                }
                if popped.messages.is_empty() {
                    return fail(pb::Code::MessageNotFound, "no new message".into());
                }
                let n = popped.messages.len() as u64;
                self.broker.traffic().rocketmq5_received.add(&group, &topic, n);
                if req.auto_renew {
                    self.note_renewals(&group, &topic, client_id, &popped.messages);
                }
                let mut out = vec![pb::ReceiveMessageResponse {
                    content: Some(pb::receive_message_response::Content::Status(ok())),
                }];
                out.extend(popped.messages.into_iter().map(|m| pb::ReceiveMessageResponse {
                    content: Some(pb::receive_message_response::Content::Message(m)),
                }));
                out.push(pb::ReceiveMessageResponse {
                    content: Some(pb::receive_message_response::Content::DeliveryTimestamp(
                        message::timestamp(rokka_store::now_ms()),
                    )),
                });
                return out;
            }
            if popped.more {
                // A filter skipped a stretch of other messages: on at once
                // with the next (Apache wakes the pop again while messages
                // are left), until the long poll's deadline.
                tokio::task::yield_now().await;
                continue;
            }
            let mut wait = deadline - now;
            if let Some(v) = popped.next_visible_ms {
                // Due already and still not handed out (its dead-letter
                // write failed, say): looked at again in a while, not in a
                // busy loop.
                let now_ms = rokka_store::now_ms();
                let until = if v > now_ms { (v - now_ms) as u64 } else { 100 };
                wait = wait.min(Duration::from_millis(until));
            }
            if *stop.borrow() {
                // Stopping: answered now, as at its deadline.
                return fail(pb::Code::MessageNotFound, "no new message".into());
            }
            metrics::gauge!("rokka_rocketmq5_receives_held").increment(1.0);
            tokio::select! {
                _ = tokio::time::timeout(wait, waiter.notified()) => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            metrics::gauge!("rokka_rocketmq5_receives_held").decrement(1.0);
        }
    }

    /// The listener stops: Telemetry streams end and waiting receives are
    /// answered at once.
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Stores the messages of a SendMessage: each one's result, and the
    /// CommitLog end that must be durable before any OK goes out.
    /// `sender`: with authorization on, who sends (a topic is made for the
    /// send only with CREATE, as QueryRoute and Kafka's Metadata make one).
    fn send(
        &self,
        req: pb::SendMessageRequest,
        peer: Option<SocketAddr>,
        sender: Option<&str>,
    ) -> (Vec<pb::SendResultEntry>, u64) {
        let mut entries = Vec::with_capacity(req.messages.len());
        let mut end = 0;
        for m in &req.messages {
            let (e, at) = self.send_one(m, peer, sender);
            entries.push(e);
            end = end.max(at);
        }
        (entries, end)
    }

    fn send_one(&self, m: &pb::Message, peer: Option<SocketAddr>, sender: Option<&str>) -> (pb::SendResultEntry, u64) {
        let refused = |code: pb::Code, text: String| {
            (
                pb::SendResultEntry {
                    status: Some(status(code, text)),
                    ..Default::default()
                },
                0,
            )
        };
        let inc = match message::incoming(m, &message::SendLimits::of(&self.config)) {
            Ok(i) => i,
            Err(message::Refused(code, text)) => {
                metrics::counter!("rokka_rocketmq5_messages_refused_total", "reason" => code.as_str_name())
                    .increment(1);
                return refused(code, text);
            }
        };

        if rokka_broker::is_send_forbidden_topic(&inc.topic) {
            return refused(
                pb::Code::Forbidden,
                format!("Sending message to topic[{}] is forbidden.", inc.topic),
            );
        }
        let may_create = sender.is_none_or(|who| {
            let host = peer.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
            !who.is_empty()
                && self
                    .broker
                    .acls()
                    .allows(who, host, (Rt::Topic, &inc.topic, Op::Create))
        });
        let info = match self.broker.topic_or_create(&inc.topic, may_create, None) {
            Ok(Some(t)) => t,
            Ok(None) => return refused(pb::Code::TopicNotFound, format!("topic {} not found", inc.topic)),
            Err(e) => return refused(pb::Code::IllegalTopic, e.to_string()),
        };
        // An admin's permission and write queue count (updateTopic).
        if !info.rocketmq_writable() {
            return refused(
                pb::Code::Forbidden,
                format!("the topic[{}] sending message is forbidden", inc.topic),
            );
        }
        let partitions = info.rocketmq_queues().1.max(1);
        // A FIFO message group always lands on one queue (by its hash, as
        // Apache's proxy selects); others go round robin.
        let queue = match &inc.message_group {
            Some(g) => rokka_store::record::properties::java_string_hash(g.as_bytes()).unsigned_abs() % partitions,
            None => (self.next_queue.fetch_add(1, Ordering::Relaxed) % u64::from(partitions)) as u32,
        };
        let born_host = match (inc.born_host, peer) {
            (Some(ip), _) => SocketAddr::new(ip, 0),
            (None, Some(p)) => p,
            (None, None) => SocketAddr::from(([0, 0, 0, 0], 0)),
        };
        let input = MessageInput {
            topic: &inc.topic,
            queue_id: queue,
            flag: 0,
            body: &inc.body,
            properties: inc.properties.as_bytes(),
            sys_flag: if inc.transactional {
                rokka_store::record::message::sysflag::TRANSACTION_PREPARED
            } else {
                0
            },
            born_timestamp: inc.born_timestamp_ms,
            born_host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        // Below `cluster.min_insync_replicas`: refused before the append
        // (Apache's IN_SYNC_REPLICAS_NOT_ENOUGH), not stored and then
        // refused — a client's retry would store it twice.
        if self.broker.store().too_few_replicas() {
            return refused(pb::Code::HaNotAvailable, "in-sync replicas not enough".into());
        }
        let now = rokka_store::now_ms();
        // A transactional message with a delivery time waits in the timer
        // wheel once committed: one the wheel cannot take is refused now
        // (Apache's proxy validates every message's delivery time), not
        // accepted and then never committable.
        if let (true, Some(at)) = (inc.transactional, inc.deliver_at_ms) {
            if let Err(e) = self.broker.check_timer_due(at) {
                return refused(pb::Code::IllegalDeliveryTime, e.to_string());
            }
        }
        let appended = match inc.deliver_at_ms {
            // (The transaction / timer state's lock may be held long by a
            // check scan or a due delivery: waited for off the async workers.)
            _ if inc.transactional => rokka_broker::offload(|| self.broker.append_half(&input)),
            Some(at) if at > now => rokka_broker::offload(|| self.broker.append_timer(&input, at)),
            _ => self
                .broker
                .append_messages(std::slice::from_ref(&input))
                .and_then(|mut r| {
                    r.pop()
                        .ok_or_else(|| rokka_broker::BrokerError::Corrupt("nothing appended".into()))
                }),
        };
        match appended {
            Ok(r) => {
                self.broker
                    .traffic()
                    .rocketmq5_sent
                    .record(&inc.topic, 1, inc.body.len() as u64);
                let entry = pb::SendResultEntry {
                    status: Some(ok()),
                    message_id: inc.message_id,
                    transaction_id: if inc.transactional {
                        transaction_id(r.queue_offset, r.phys_offset)
                    } else {
                        String::new()
                    },
                    offset: r.queue_offset as i64,
                    recall_handle: String::new(),
                };
                (entry, r.end_offset)
            }
            Err(e) => {
                let code = match &e {
                    rokka_broker::BrokerError::Store(
                        rokka_store::StoreError::MessageTooLarge { .. }
                        | rokka_store::StoreError::PropertiesTooLarge(_),
                    ) => pb::Code::MessagePropertiesTooLarge,
                    rokka_broker::BrokerError::TimerTooFar { .. } => pb::Code::IllegalDeliveryTime,
                    rokka_broker::BrokerError::Store(
                        rokka_store::StoreError::NotLeader | rokka_store::StoreError::ShutDown,
                    ) => pb::Code::HaNotAvailable,
                    _ => pb::Code::InternalServerError,
                };
                refused(code, e.to_string())
            }
        }
    }

    fn ack(&self, req: pb::AckMessageRequest) -> pb::AckMessageResponse {
        let group = name(&req.group).to_string();
        let topic = name(&req.topic).to_string();
        let mut entries = Vec::with_capacity(req.entries.len());
        let mut touched: HashMap<u32, Arc<std::sync::Mutex<QueuePops>>> = HashMap::new();
        for e in &req.entries {
            let st = match Receipt::decode(&e.receipt_handle) {
                None => Err(HandleError::NotInFlight),
                Some(r) => match self.pops.existing(&group, &topic, r.queue) {
                    None => Err(HandleError::NotInFlight),
                    Some(st) => {
                        let mut locked = pop::lock(&st);
                        // A reset since the handout wins: its handles are
                        // stale, and the ack must not commit past it.
                        if !touched.contains_key(&r.queue) {
                            self.follow_reset(&group, &topic, r.queue, &mut locked);
                        }
                        let res = self.pops.ack(&mut locked, &r);
                        // An ack of an offset handed out before and no
                        // longer in flight (acked already: a client's
                        // retry of an ack whose answer it lost) is OK, as
                        // Apache's ack, which does not look for an earlier
                        // one; the client would throw for a message it did
                        // ack. Offsets never handed out stay refused.
                        let res = match res {
                            Err(HandleError::NotInFlight) if r.offset < locked.cursor => Err(HandleError::Acked),
                            other => other,
                        };
                        drop(locked);
                        if res.is_ok() {
                            // Acked: nothing to renew (its slot in the
                            // renewals' bound is free at once).
                            let mut rn = self.renewals.lock().unwrap_or_else(|p| p.into_inner());
                            let key = (group.clone(), topic.clone(), r.queue, r.offset);
                            if rn.get(&key).is_some_and(|x| x.delivery == r.delivery) {
                                rn.remove(&key);
                            }
                        }
                        touched.insert(r.queue, st);
                        res
                    }
                },
            };
            let s = match st {
                Err(HandleError::Acked) => ok(),
                Ok(f) => {
                    self.broker.traffic().rocketmq5_acked.add(&group, "", 1);
                    let took = (rokka_store::now_ms() - f.first_handed_ms).max(0) as f64 / 1000.0;
                    metrics::histogram!("rokka_rocketmq5_process_time_seconds").record(took);
                    ok()
                }
                Err(HandleError::Stale) => status(
                    pb::Code::InvalidReceiptHandle,
                    "the receipt handle is from an earlier delivery of the message",
                ),
                Err(HandleError::NotInFlight) => status(
                    pb::Code::InvalidReceiptHandle,
                    "no message of this group is in flight under this receipt handle (acked already, or expired and redelivered)",
                ),
            };
            entries.push(pb::AckMessageResultEntry {
                message_id: e.message_id.clone(),
                receipt_handle: e.receipt_handle.clone(),
                status: Some(s),
            });
        }
        let fifo = self.is_fifo(&group);
        for (q, st) in touched {
            self.commit_watermark(&group, &topic, q, &mut pop::lock(&st));
            // A receive waiting on a FIFO queue looks again: an ack may have
            // unblocked it (Apache's ackOrderly notifies the pop's long
            // polling) — else it slept until its poll ended. (Only then:
            // every waiter of the queue, Kafka fetches and remoting pulls
            // too, would read again for each ack.)
            if fifo {
                self.broker.arrivals().wake_now(&topic, q);
            }
        }
        let overall = overall(entries.iter().map(|e| e.status.as_ref()), "no entry to ack");
        pb::AckMessageResponse {
            status: Some(overall),
            entries,
        }
    }

    fn change_invisible(&self, req: pb::ChangeInvisibleDurationRequest) -> pb::ChangeInvisibleDurationResponse {
        let group = name(&req.group).to_string();
        let topic = name(&req.topic).to_string();
        let ms = req.invisible_duration.as_ref().map_or(0, message::duration_ms);
        let fail = |code, text: &str| pb::ChangeInvisibleDurationResponse {
            status: Some(status(code, text)),
            receipt_handle: String::new(),
        };
        if ms < 0 || ms > self.config.max_invisible_ms as i64 {
            return fail(pb::Code::IllegalInvisibleTime, "invisible duration out of range");
        }
        let Some(r) = Receipt::decode(&req.receipt_handle) else {
            return fail(pb::Code::InvalidReceiptHandle, "not a receipt handle of this broker");
        };
        let Some(st) = self.pops.existing(&group, &topic, r.queue) else {
            return fail(
                pb::Code::InvalidReceiptHandle,
                "nothing of this group is in flight there",
            );
        };
        let mut locked = pop::lock(&st);
        self.follow_reset(&group, &topic, r.queue, &mut locked);
        let res = self.pops.change_invisible(&mut locked, &r, rokka_store::now_ms() + ms);
        drop(locked);
        if res.is_ok() {
            // A receive waiting on the queue times its wait by the next
            // message due: a nack (a client's retry backoff, 1 s, 5 s...)
            // may make one due sooner than it counted on.
            self.broker.arrivals().wake_now(&topic, r.queue);
        }
        match res {
            Ok(n) => pb::ChangeInvisibleDurationResponse {
                status: Some(ok()),
                receipt_handle: n.encode(),
            },
            Err(HandleError::Stale) => fail(
                pb::Code::InvalidReceiptHandle,
                "the receipt handle is from an earlier delivery",
            ),
            Err(HandleError::NotInFlight | HandleError::Acked) => {
                fail(pb::Code::InvalidReceiptHandle, "the message is not in flight")
            }
        }
    }

    fn forward_to_dlq(&self, req: pb::ForwardMessageToDeadLetterQueueRequest) -> pb::Status {
        let group = name(&req.group).to_string();
        let topic = name(&req.topic).to_string();
        let Some(r) = Receipt::decode(&req.receipt_handle) else {
            return status(pb::Code::InvalidReceiptHandle, "not a receipt handle of this broker");
        };
        let Some(st) = self.pops.existing(&group, &topic, r.queue) else {
            return status(
                pb::Code::InvalidReceiptHandle,
                "nothing of this group is in flight there",
            );
        };
        let mut st = pop::lock(&st);
        self.follow_reset(&group, &topic, r.queue, &mut st);
        match st.in_flight.get(&r.offset) {
            Some(f) if f.delivery == r.delivery => {}
            _ => {
                return status(
                    pb::Code::InvalidReceiptHandle,
                    "the message is not in flight under this handle",
                )
            }
        }
        let attempts = st.in_flight.get(&r.offset).map_or(1, |f| f.attempt);
        if let Some(m) = self.message_at(&topic, r.queue, r.offset) {
            if let Err(e) = self.to_dead_letters(&group, &m, attempts) {
                return status(pb::Code::InternalServerError, e);
            }
        }
        self.pops.forget(&mut st, r.offset);
        self.commit_watermark(&group, &topic, r.queue, &mut st);
        drop(st);
        // Gone to its dead letters: a FIFO queue it held is free.
        if self.is_fifo(&group) {
            self.broker.arrivals().wake_now(&topic, r.queue);
        }
        ok()
    }

    /// The settings a client receives on its Telemetry stream: its own,
    /// with the server's limits and policies.
    /// A client's settings it may not have: a producer's topics need WRITE
    /// (the stream gets their transaction checks, messages included), a
    /// consumer's group READ.
    fn settings_refused(&self, who: &str, peer: Option<SocketAddr>, s: &pb::Settings) -> Option<pb::Status> {
        let needs: Vec<Need<'_>> = match &s.pub_sub {
            Some(pb::settings::PubSub::Publishing(p)) => {
                p.topics.iter().map(|t| rocketmq_topic(&t.name, Op::Write)).collect()
            }
            Some(pb::settings::PubSub::Subscription(sub)) => {
                vec![(Rt::Group, name(&sub.group), Op::Read)]
            }
            None => Vec::new(),
        };
        self.guard.authorize(&self.broker, who, peer, &needs).err()
    }

    fn server_settings(&self, mut s: pb::Settings) -> pb::Settings {
        match &mut s.pub_sub {
            Some(pb::settings::PubSub::Publishing(p)) => {
                p.max_body_size = self.config.max_body_bytes as i32;
                p.validate_message_type = true;
                s.backoff_policy = Some(pb::RetryPolicy {
                    max_attempts: 3,
                    strategy: Some(pb::retry_policy::Strategy::ExponentialBackoff(pb::ExponentialBackoff {
                        initial: Some(message::duration(10)),
                        max: Some(message::duration(1000)),
                        multiplier: 2.0,
                    })),
                });
            }
            Some(pb::settings::PubSub::Subscription(sub)) => {
                let group = sub.group.as_ref().map_or("", |g| g.name.as_str());
                sub.fifo = Some(self.is_fifo(group));
                sub.receive_batch_size = Some(self.config.max_receive_batch as i32);
                let poll = sub
                    .long_polling_timeout
                    .as_ref()
                    .map_or(20_000, message::duration_ms)
                    .clamp(0, self.config.max_long_polling_ms as i64);
                sub.long_polling_timeout = Some(message::duration(poll));
                // Redelivery back-off of push consumers: the group's
                // groupRetryPolicy where its config sets one (delays bounded
                // by sub_groups::MAX_BACKOFF_MS), else Apache's delay levels
                // from 1 s; attempts as the broker counts them.
                use rokka_broker::sub_groups::Backoff;
                let strategy = match self.broker.sub_groups().backoff(group) {
                    Some(Backoff::Exponential {
                        initial_ms,
                        max_ms,
                        multiplier,
                    }) => pb::retry_policy::Strategy::ExponentialBackoff(pb::ExponentialBackoff {
                        initial: Some(message::duration(initial_ms as i64)),
                        max: Some(message::duration(max_ms as i64)),
                        multiplier,
                    }),
                    custom => {
                        let next = match custom {
                            Some(Backoff::Customized(next)) => next,
                            _ => vec![
                                1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
                                420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
                            ],
                        };
                        pb::retry_policy::Strategy::CustomizedBackoff(pb::CustomizedBackoff {
                            next: next.iter().map(|ms| message::duration(*ms as i64)).collect(),
                        })
                    }
                };
                s.backoff_policy = Some(pb::RetryPolicy {
                    max_attempts: self.max_delivery_attempts(group).min(i32::MAX as u32) as i32,
                    strategy: Some(strategy),
                });
            }
            None => {}
        }
        s.metric = Some(pb::Metric {
            on: false,
            endpoints: None,
        });
        s
    }
}

/// The tonic service: a handle on the shared `Messaging`.
#[derive(Debug, Clone)]
pub struct Service(pub Arc<Messaging>);

/// Drops a producer's registration when its Telemetry stream ends.
struct Unregister {
    m: Arc<Messaging>,
    client_id: String,
    stream: u64,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        let mut p = pop::lock(&self.m.producers);
        if p.get(&self.client_id).is_some_and(|e| e.stream == self.stream) {
            p.remove(&self.client_id);
        }
    }
}

/// Decrements the Telemetry stream count when a stream ends.
struct StreamSlot(Arc<AtomicU32>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!("rokka_rocketmq5_telemetry_streams").decrement(1.0);
    }
}

/// The client id a RocketMQ 5 client sends with every call.
fn client_id<T>(req: &Request<T>) -> String {
    req.metadata()
        .get("x-mq-client-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

fn call(method: &'static str) {
    rokka_broker::hot_metrics::count("rokka_rocketmq5_requests_total", "method", method, 1);
}

/// Answers the call `$resp` with a refusal if its caller may not do
/// `$needs` (security.authorization; docs/security.md).
macro_rules! guard {
    ($svc:expr, $req:expr, $needs:expr, $resp:ident) => {
        if let Some(s) = $svc.0.guard.check(&$svc.0.broker, &$req, $needs) {
            return Ok(Response::new(pb::$resp {
                status: Some(s),
                ..Default::default()
            }));
        }
    };
}

/// READ on a consumer's topic and group (RocketMQ SUB).
fn sub<'a>(topic: &'a str, group: &'a str) -> [Need<'a>; 2] {
    [rocketmq_topic(topic, Op::Read), (Rt::Group, group, Op::Read)]
}

// guard!'s `..Default::default()` is needless for responses of only a status.
#[allow(clippy::needless_update)]
#[tonic::async_trait]
impl pb::messaging_service_server::MessagingService for Service {
    async fn query_route(
        &self,
        req: Request<pb::QueryRouteRequest>,
    ) -> Result<Response<pb::QueryRouteResponse>, Status> {
        call("QueryRoute");
        let m = &self.0;
        let refused = |s| {
            Ok(Response::new(pb::QueryRouteResponse {
                status: Some(s),
                message_queues: Vec::new(),
            }))
        };
        // DESCRIBE to see the topic, CREATE to have it auto-created (as
        // Kafka's Metadata).
        let may_create = match m.guard.who(&m.broker, &req) {
            Err(s) => return refused(s),
            Ok(None) => true,
            Ok(Some(who)) => {
                let topic = name(&req.get_ref().topic);
                if let Err(s) = m.guard.authorize(
                    &m.broker,
                    &who,
                    crate::peer(&req),
                    &[rocketmq_topic(topic, Op::Describe)],
                ) {
                    return refused(s);
                }
                let host = crate::peer(&req).map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
                m.broker.acls().allows(&who, host, (Rt::Topic, topic, Op::Create))
            }
        };
        let req = req.into_inner();
        let topic = name(&req.topic).to_string();
        let resp = match m.broker.topic_or_create(&topic, may_create, None) {
            Ok(Some(info)) => pb::QueryRouteResponse {
                status: Some(ok()),
                message_queues: m.queues_of(&topic, &info, req.endpoints.as_ref()),
            },
            Ok(None) => pb::QueryRouteResponse {
                status: Some(status(pb::Code::TopicNotFound, format!("topic {topic} not found"))),
                message_queues: Vec::new(),
            },
            Err(e) => pb::QueryRouteResponse {
                status: Some(status(pb::Code::IllegalTopic, e.to_string())),
                message_queues: Vec::new(),
            },
        };
        Ok(Response::new(resp))
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Result<Response<pb::HeartbeatResponse>, Status> {
        call("Heartbeat");
        // A consumer's heartbeat makes it a live member of its group.
        let r = req.get_ref();
        if matches!(
            r.client_type(),
            pb::ClientType::SimpleConsumer | pb::ClientType::PushConsumer
        ) {
            guard!(self, req, &[(Rt::Group, name(&r.group), Op::Read)], HeartbeatResponse);
        } else {
            guard!(self, req, &[], HeartbeatResponse);
        }
        let id = client_id(&req);
        let req = req.into_inner();
        let group = name(&req.group);
        let consumer = matches!(
            req.client_type(),
            pb::ClientType::SimpleConsumer | pb::ClientType::PushConsumer
        );
        if consumer && !group.is_empty() && !id.is_empty() {
            self.0
                .broker
                .membership()
                .note_pop_consumer(group, &id, rokka_store::now_ms());
        }
        Ok(Response::new(pb::HeartbeatResponse { status: Some(ok()) }))
    }

    async fn send_message(
        &self,
        req: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        call("SendMessage");
        let m = Arc::clone(&self.0);
        let mut sender = None;
        if m.broker.acls().enabled() {
            let mut topics: Vec<&str> = req.get_ref().messages.iter().map(|m| name(&m.topic)).collect();
            topics.sort_unstable();
            topics.dedup();
            let needs: Vec<Need<'_>> = topics.into_iter().map(|t| rocketmq_topic(t, Op::Write)).collect();
            guard!(self, req, &needs, SendMessageResponse);
            // Who sends, for a topic the send would make (CREATE): a
            // caller not known now (held off since the guard) makes none.
            sender = Some(m.guard.who(&m.broker, &req).ok().flatten().unwrap_or_default());
        }
        let peer = crate::peer(&req);
        let req = req.into_inner();
        // On this task: the store offloads its own steps that may block (a
        // file or segment to make), the broker its topic-table writes.
        let (mut entries, end) = m.send(req, peer, sender.as_deref());
        // Sync flush (and cluster acks): an OK only once the messages are
        // durable; stored but not durable is said so, as Apache's proxy.
        if end > 0 {
            if let Err(e) = m.broker.store().durable(end).await {
                let s = not_durable(&e);
                for entry in entries
                    .iter_mut()
                    .filter(|e| e.status.as_ref().is_some_and(|s| s.code == pb::Code::Ok as i32))
                {
                    entry.status = Some(s.clone());
                }
            }
        }
        let status = overall(entries.iter().map(|e| e.status.as_ref()), "no message to send");
        Ok(Response::new(pb::SendMessageResponse {
            status: Some(status),
            entries,
        }))
    }

    async fn query_assignment(
        &self,
        req: Request<pb::QueryAssignmentRequest>,
    ) -> Result<Response<pb::QueryAssignmentResponse>, Status> {
        call("QueryAssignment");
        let r = req.get_ref();
        guard!(self, req, &sub(name(&r.topic), name(&r.group)), QueryAssignmentResponse);
        let req = req.into_inner();
        let topic = name(&req.topic).to_string();
        let m = &self.0;
        // Pop consumers share every queue: as Apache's proxy in pop mode,
        // each member is assigned one queue per broker with id -1 (the
        // broker pops over all of that broker's queues), and the broker
        // hands each message to one member at a time.
        let resp = match m.broker.topics().get(&topic) {
            Some(info) => {
                let mut seen = std::collections::BTreeSet::new();
                pb::QueryAssignmentResponse {
                    status: Some(ok()),
                    assignments: m
                        .queues_of(&topic, &info, req.endpoints.as_ref())
                        .into_iter()
                        .filter(|q| seen.insert(q.broker.as_ref().map(|b| b.name.clone())))
                        .map(|mut q| {
                            q.id = -1;
                            pb::Assignment { message_queue: Some(q) }
                        })
                        .collect(),
                }
            }
            None => pb::QueryAssignmentResponse {
                status: Some(status(pb::Code::TopicNotFound, format!("topic {topic} not found"))),
                assignments: Vec::new(),
            },
        };
        Ok(Response::new(resp))
    }

    type ReceiveMessageStream = Stream_<pb::ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        req: Request<pb::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, Status> {
        call("ReceiveMessage");
        let r = req.get_ref();
        let topic = r.message_queue.as_ref().map_or("", |q| name(&q.topic));
        if let Some(s) = self.0.guard.check(&self.0.broker, &req, &sub(topic, name(&r.group))) {
            let refused = pb::ReceiveMessageResponse {
                content: Some(pb::receive_message_response::Content::Status(s)),
            };
            return Ok(Response::new(Box::pin(tokio_stream::iter([Ok(refused)]))));
        }
        let client_id = client_id(&req);
        let deadline_ms = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout_ms);
        let mut inner = req.into_inner();
        if inner.long_polling_timeout.is_none() {
            // No long polling time given (the Go SimpleConsumer relies on
            // the call's deadline): the deadline less a second to answer
            // in, as Apache's proxy derives it.
            if let Some(ms) = deadline_ms {
                inner.long_polling_timeout = Some(message::duration(ms.saturating_sub(1000) as i64));
            }
        }
        let group = name(&inner.group).to_string();
        let out = self.0.receive(inner, &client_id).await;
        Ok(Response::new(Box::pin(Answer {
            items: out.into(),
            m: Arc::clone(&self.0),
            group,
        })))
    }

    async fn ack_message(
        &self,
        req: Request<pb::AckMessageRequest>,
    ) -> Result<Response<pb::AckMessageResponse>, Status> {
        call("AckMessage");
        let r = req.get_ref();
        guard!(self, req, &sub(name(&r.topic), name(&r.group)), AckMessageResponse);
        Ok(Response::new(self.0.ack(req.into_inner())))
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        req: Request<pb::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<pb::ForwardMessageToDeadLetterQueueResponse>, Status> {
        call("ForwardMessageToDeadLetterQueue");
        let r = req.get_ref();
        guard!(
            self,
            req,
            &sub(name(&r.topic), name(&r.group)),
            ForwardMessageToDeadLetterQueueResponse
        );
        let m = Arc::clone(&self.0);
        let req = req.into_inner();
        let mut s = rokka_broker::offload(|| m.forward_to_dlq(req));
        if s.code == pb::Code::Ok as i32 {
            if let Some(not) = m.durable_now().await {
                s = not;
            }
        }
        Ok(Response::new(pb::ForwardMessageToDeadLetterQueueResponse {
            status: Some(s),
        }))
    }

    type PullMessageStream = Stream_<pb::PullMessageResponse>;

    async fn pull_message(
        &self,
        req: Request<pb::PullMessageRequest>,
    ) -> Result<Response<Self::PullMessageStream>, Status> {
        call("PullMessage");
        let s = self.0.guard.check(&self.0.broker, &req, &[]).unwrap_or_else(|| {
            status(
                pb::Code::NotImplemented,
                "PullMessage is not served; use ReceiveMessage",
            )
        });
        Ok(Response::new(Box::pin(tokio_stream::iter([Ok(
            pb::PullMessageResponse {
                content: Some(pb::pull_message_response::Content::Status(s)),
            },
        )]))))
    }

    async fn update_offset(
        &self,
        req: Request<pb::UpdateOffsetRequest>,
    ) -> Result<Response<pb::UpdateOffsetResponse>, Status> {
        call("UpdateOffset");
        let r = req.get_ref();
        let topic = r.message_queue.as_ref().map_or("", |q| name(&q.topic));
        guard!(self, req, &sub(topic, name(&r.group)), UpdateOffsetResponse);
        let req = req.into_inner();
        let mq = req.message_queue.unwrap_or_default();
        let (group, topic) = (name(&req.group).to_string(), name(&mq.topic).to_string());
        let partitions = self.0.broker.topics().get(&topic).map(|t| t.partitions);
        let s = if group.is_empty() || topic.is_empty() || mq.id < 0 || req.offset < 0 {
            status(
                pb::Code::BadRequest,
                "group, topic, queue and a non-negative offset are required",
            )
        } else if partitions.is_none() {
            // As the remoting path: offsets only of queues that exist (the
            // committed-offset table is shared, and budgeted).
            status(pb::Code::TopicNotFound, format!("topic {topic} not found"))
        } else if partitions.is_some_and(|n| mq.id as u64 >= u64::from(n)) {
            status(
                pb::Code::BadRequest,
                format!("queue {} out of range for {topic}", mq.id),
            )
        } else if !self.0.broker.leads_here() {
            // Cluster mode: offsets are committed on the set's master (a
            // replica's table is the master's copy; a starting node's role
            // is not known yet), as remoting's UPDATE_CONSUMER_OFFSET.
            status(
                pb::Code::HaNotAvailable,
                "not the broker set's master: commit on the master",
            )
        } else {
            let q = mq.id as u32;
            // Committed first, then the pop state dropped (a receive in
            // between would start again from the old offset; a refused
            // commit leaves the pops alone). Not waited on replicas, as
            // RocketMQ's consumer offsets are persisted asynchronously.
            if self
                .0
                .broker
                .store()
                .offsets()
                .commit_bounded(&group, &topic, q, req.offset as u64, "", -1)
            {
                self.0.pops.reset(&group, &topic, q, req.offset as u64);
                ok()
            } else {
                status(
                    pb::Code::TooManyRequests,
                    "too many committed offsets (store.max_committed_offsets)",
                )
            }
        };
        Ok(Response::new(pb::UpdateOffsetResponse { status: Some(s) }))
    }

    async fn get_offset(&self, req: Request<pb::GetOffsetRequest>) -> Result<Response<pb::GetOffsetResponse>, Status> {
        call("GetOffset");
        let r = req.get_ref();
        let topic = r.message_queue.as_ref().map_or("", |q| name(&q.topic));
        let needs = [
            rocketmq_topic(topic, Op::Describe),
            (Rt::Group, name(&r.group), Op::Describe),
        ];
        guard!(self, req, &needs, GetOffsetResponse);
        let req = req.into_inner();
        let mq = req.message_queue.unwrap_or_default();
        let c = self
            .0
            .broker
            .store()
            .offsets()
            .get(name(&req.group), name(&mq.topic), mq.id.max(0) as u32);
        Ok(Response::new(match c {
            Some(c) => pb::GetOffsetResponse {
                status: Some(ok()),
                offset: c.offset as i64,
            },
            None => pb::GetOffsetResponse {
                status: Some(status(pb::Code::OffsetNotFound, "the group has no offset there")),
                offset: 0,
            },
        }))
    }

    async fn query_offset(
        &self,
        req: Request<pb::QueryOffsetRequest>,
    ) -> Result<Response<pb::QueryOffsetResponse>, Status> {
        call("QueryOffset");
        let topic = req.get_ref().message_queue.as_ref().map_or("", |q| name(&q.topic));
        guard!(self, req, &[rocketmq_topic(topic, Op::Describe)], QueryOffsetResponse);
        let req = req.into_inner();
        let mq = req.message_queue.clone().unwrap_or_default();
        let (topic, q) = (name(&mq.topic).to_string(), mq.id.max(0) as u32);
        if !self.0.broker.leads_here() {
            // A replica's (or a starting node's) queue ends lag or are not
            // known yet: the set's master answers.
            return Ok(Response::new(pb::QueryOffsetResponse {
                status: Some(status(
                    pb::Code::HaNotAvailable,
                    "not the broker set's master: ask the master",
                )),
                offset: 0,
            }));
        }
        let store = self.0.broker.store();
        let offset = match req.query_offset_policy() {
            pb::QueryOffsetPolicy::Beginning => store.min_offset(&topic, q),
            pb::QueryOffsetPolicy::End => store.max_offset(&topic, q),
            pb::QueryOffsetPolicy::Timestamp => {
                let ts = req.timestamp.as_ref().map_or(0, message::timestamp_ms);
                store.offset_by_store_time(&topic, q, ts)
            }
        };
        Ok(Response::new(pb::QueryOffsetResponse {
            status: Some(ok()),
            offset: offset as i64,
        }))
    }

    async fn end_transaction(
        &self,
        req: Request<pb::EndTransactionRequest>,
    ) -> Result<Response<pb::EndTransactionResponse>, Status> {
        call("EndTransaction");
        guard!(
            self,
            req,
            &[rocketmq_topic(name(&req.get_ref().topic), Op::Write)],
            EndTransactionResponse
        );
        let req = req.into_inner();
        let commit = match req.resolution() {
            pb::TransactionResolution::Commit => true,
            pb::TransactionResolution::Rollback => false,
            // Unknown: left for the broker's check.
            pb::TransactionResolution::Unspecified => {
                return Ok(Response::new(pb::EndTransactionResponse { status: Some(ok()) }))
            }
        };
        let Some((off, phys)) = parse_transaction_id(&req.transaction_id) else {
            return Ok(Response::new(pb::EndTransactionResponse {
                status: Some(status(
                    pb::Code::InvalidTransactionId,
                    "not a transaction id of this broker",
                )),
            }));
        };
        let m = Arc::clone(&self.0);
        // The id names a half message; the ACL check above was of the
        // request's topic: they must be one (else WRITE on any topic would
        // end other topics' transactions).
        let bound_for = rokka_broker::offload(|| m.broker.half_message_topic(phys));
        if bound_for.as_deref().is_some_and(|t| t != name(&req.topic)) {
            return Ok(Response::new(pb::EndTransactionResponse {
                status: Some(status(
                    pb::Code::InvalidTransactionId,
                    "the transaction id is not of a message of this topic",
                )),
            }));
        }
        let res = rokka_broker::offload(|| m.broker.end_transaction("", off, phys, commit));
        let s = match res {
            // The committed message (or the rollback's op record) must be
            // durable before the producer forgets the transaction.
            Ok(_) => m.durable_now().await.unwrap_or_else(ok),
            Err(e) => status(pb::Code::InvalidTransactionId, e.to_string()),
        };
        Ok(Response::new(pb::EndTransactionResponse { status: Some(s) }))
    }

    type TelemetryStream = Stream_<pb::TelemetryCommand>;

    async fn telemetry(
        &self,
        req: Request<tonic::Streaming<pb::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, Status> {
        call("Telemetry");
        let m = Arc::clone(&self.0);
        // The stream is authenticated once, at its start; what its settings
        // ask (publishing topics: transaction checks of their messages;
        // a subscription group) is authorized as they come.
        if let Some(s) = crate::auth::client_id_refused(&req) {
            return Err(Status::invalid_argument(s.message));
        }
        let who = m
            .guard
            .who(&m.broker, &req)
            .map_err(|s| Status::unauthenticated(s.message))?;
        let peer = crate::peer(&req);
        let count = &m.telemetry_streams;
        if count.fetch_add(1, Ordering::Relaxed) >= m.config.max_telemetry_streams {
            count.fetch_sub(1, Ordering::Relaxed);
            metrics::counter!("rokka_rocketmq5_telemetry_refused_total").increment(1);
            return Err(Status::resource_exhausted(
                "too many telemetry streams (grpc.max_telemetry_streams)",
            ));
        }
        metrics::gauge!("rokka_rocketmq5_telemetry_streams").increment(1.0);
        let slot = StreamSlot(Arc::clone(count));
        let client_id = req
            .metadata()
            .get("x-mq-client-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let stream = STREAMS.fetch_add(1, Ordering::Relaxed);
        let mut input = req.into_inner();
        let (tx, rx) = mpsc::channel::<Result<pb::TelemetryCommand, Status>>(8);
        let idle = Duration::from_millis(m.config.idle_timeout_ms.max(1000));
        let mut stop = m.stopping.subscribe();
        tokio::spawn(async move {
            let _slot = slot;
            let _gone = Unregister {
                m: Arc::clone(&m),
                client_id: client_id.clone(),
                stream,
            };
            loop {
                let next = tokio::select! {
                    n = tokio::time::timeout(idle, input.message()) => n,
                    // The listener stops: the stream ends (the client
                    // opens a new one wherever it reconnects).
                    _ = stop.wait_for(|s| *s) => return,
                };
                let next = match next {
                    Err(_) => {
                        let _ = tx.send(Err(Status::deadline_exceeded("telemetry stream idle"))).await;
                        return;
                    }
                    // A refusal of the listener's request budget, or a
                    // message not received whole in time: the client is told.
                    Ok(Err(s)) => {
                        let _ = tx.send(Err(s)).await;
                        return;
                    }
                    Ok(Ok(None)) => return,
                    Ok(Ok(Some(cmd))) => cmd,
                };
                let reply = match next.command {
                    Some(pb::telemetry_command::Command::Settings(s)) => {
                        if let Some(refused) = who.as_deref().and_then(|w| m.settings_refused(w, peer, &s)) {
                            pb::TelemetryCommand {
                                status: Some(refused),
                                command: None,
                            }
                        } else {
                            if let (Some(pb::settings::PubSub::Publishing(p)), false) =
                                (&s.pub_sub, client_id.is_empty())
                            {
                                pop::lock(&m.producers).insert(
                                    client_id.clone(),
                                    ProducerStream {
                                        stream,
                                        // What a producer may publish to, as
                                        // kept: topic names (at most 255 bytes),
                                        // at most MAX_PUBLISHING_TOPICS of them.
                                        topics: p
                                            .topics
                                            .iter()
                                            .map(|t| &t.name)
                                            .filter(|n| n.len() <= 255)
                                            .take(MAX_PUBLISHING_TOPICS)
                                            .cloned()
                                            .collect(),
                                        tx: tx.clone(),
                                    },
                                );
                            }
                            pb::TelemetryCommand {
                                status: Some(ok()),
                                command: Some(pb::telemetry_command::Command::Settings(m.server_settings(s))),
                            }
                        }
                    }
                    // Answers to server commands (stack traces, message
                    // verification): nothing asks for them yet.
                    _ => continue,
                };
                // A client that sends settings but never reads the replies
                // fills the stream's buffer: it is closed after the idle
                // timeout, not held (with its slot) until its connection goes.
                match tokio::time::timeout(idle, tx.send(Ok(reply))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return,
                    Err(_) => {
                        metrics::counter!("rokka_rocketmq5_telemetry_unread_closed_total").increment(1);
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn notify_client_termination(
        &self,
        req: Request<pb::NotifyClientTerminationRequest>,
    ) -> Result<Response<pb::NotifyClientTerminationResponse>, Status> {
        call("NotifyClientTermination");
        // READ on the group it leaves (Apache: SUB on a named group): it
        // drops a member and hands the member's messages back.
        let group = name(&req.get_ref().group).to_string();
        let needs: &[Need<'_>] = if group.is_empty() {
            &[]
        } else {
            &[(Rt::Group, &group, Op::Read)]
        };
        guard!(self, req, needs, NotifyClientTerminationResponse);
        let id = client_id(&req);
        let group = group.as_str();
        if !group.is_empty() {
            self.0.broker.membership().forget_pop_consumer(group, &id);
        }
        // Its auto-renewed messages go back to the group at once.
        let m = Arc::clone(&self.0);
        let _ = tokio::task::spawn_blocking(move || m.renew_due(rokka_store::now_ms(), Some(&id))).await;
        Ok(Response::new(pb::NotifyClientTerminationResponse {
            status: Some(ok()),
        }))
    }

    async fn change_invisible_duration(
        &self,
        req: Request<pb::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<pb::ChangeInvisibleDurationResponse>, Status> {
        call("ChangeInvisibleDuration");
        let r = req.get_ref();
        guard!(
            self,
            req,
            &sub(name(&r.topic), name(&r.group)),
            ChangeInvisibleDurationResponse
        );
        Ok(Response::new(self.0.change_invisible(req.into_inner())))
    }

    async fn recall_message(
        &self,
        req: Request<pb::RecallMessageRequest>,
    ) -> Result<Response<pb::RecallMessageResponse>, Status> {
        call("RecallMessage");
        guard!(self, req, &[], RecallMessageResponse);
        Ok(Response::new(pb::RecallMessageResponse {
            status: Some(status(pb::Code::NotImplemented, "recalling messages is not supported")),
            message_id: String::new(),
        }))
    }

    async fn sync_lite_subscription(
        &self,
        req: Request<pb::SyncLiteSubscriptionRequest>,
    ) -> Result<Response<pb::SyncLiteSubscriptionResponse>, Status> {
        call("SyncLiteSubscription");
        guard!(self, req, &[], SyncLiteSubscriptionResponse);
        Ok(Response::new(pb::SyncLiteSubscriptionResponse {
            status: Some(status(pb::Code::NotImplemented, "lite topics are not supported")),
        }))
    }
}

/// RIP-46's ready and in-flight messages per topic and group, read at
/// each scrape.
impl rokka_broker::scrape::Collect for Messaging {
    fn collect(&self, out: &mut Vec<rokka_broker::scrape::Family>) {
        out.extend(self.ready_families());
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::grpc_timeout_ms;

    #[test]
    fn grpc_timeout_headers_are_read_in_every_unit() {
        assert_eq!(grpc_timeout_ms("30S"), Some(30_000));
        assert_eq!(grpc_timeout_ms("2500m"), Some(2500));
        assert_eq!(grpc_timeout_ms("1M"), Some(60_000));
        assert_eq!(grpc_timeout_ms("1H"), Some(3_600_000));
        assert_eq!(grpc_timeout_ms("5000000u"), Some(5000));
        assert_eq!(grpc_timeout_ms("7000000000n"), None, "more than 8 digits");
        assert_eq!(grpc_timeout_ms("70000000n"), Some(70));
        assert_eq!(grpc_timeout_ms("10x"), None);
        assert_eq!(grpc_timeout_ms("S"), None);
    }
}

#[cfg(test)]
mod route_tests {
    use std::sync::Arc;

    use super::*;

    fn node(advertised: &str) -> Result<(tempfile::TempDir, Messaging), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Arc::new(Broker::new(store, rokka_broker::BrokerConfig::default())?);
        broker.create_topic("t", 2)?;
        let m = Messaging::new(broker, GrpcConfig::default(), "broker-a".into(), advertised.into(), 90);
        Ok((dir, m))
    }

    /// A single node on a wildcard address routes clients to the endpoints
    /// they dialled (Apache's proxy), not to 0.0.0.0; an advertised or
    /// bound concrete address is routed to as it is.
    #[test]
    fn a_wildcard_listener_routes_to_the_address_the_client_dialled() -> Result<(), Box<dyn std::error::Error>> {
        let dialled = endpoints_of("broker.example:8081");
        let (_d, m) = node("0.0.0.0:8081")?;
        let info = m.broker.topics().get("t").ok_or("no topic")?;
        let qs = m.queues_of("t", &info, Some(&dialled));
        assert_eq!(qs.len(), 2);
        assert!(qs
            .iter()
            .all(|q| q.broker.as_ref().and_then(|b| b.endpoints.as_ref()) == Some(&dialled)));
        let (_d2, m2) = node("127.0.0.1:8081")?;
        let qs = m2.queues_of("t", &info, Some(&dialled));
        let here = endpoints_of("127.0.0.1:8081");
        assert!(qs
            .iter()
            .all(|q| q.broker.as_ref().and_then(|b| b.endpoints.as_ref()) == Some(&here)));
        // An advertised DNS name (a container's or a load balancer's) is
        // routed to as a domain name.
        let (_d3, m3) = node("rokka.internal:18081")?;
        let qs = m3.queues_of("t", &info, Some(&dialled));
        let named = qs[0]
            .broker
            .as_ref()
            .and_then(|b| b.endpoints.clone())
            .ok_or("no endpoints")?;
        assert_eq!(named.scheme, pb::AddressScheme::DomainName as i32);
        assert_eq!(
            (named.addresses[0].host.as_str(), named.addresses[0].port),
            ("rokka.internal", 18081)
        );
        Ok(())
    }
}

#[cfg(test)]
mod answer_tests {
    use std::sync::Arc;

    use super::*;

    fn receive_req(group: &str) -> pb::ReceiveMessageRequest {
        pb::ReceiveMessageRequest {
            group: Some(resource(group)),
            message_queue: Some(pb::MessageQueue {
                topic: Some(resource("t")),
                id: -1,
                ..Default::default()
            }),
            filter_expression: Some(pb::FilterExpression {
                r#type: pb::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size: 2,
            invisible_duration: Some(message::duration(30_000)),
            long_polling_timeout: Some(message::duration(0)),
            auto_renew: false,
            ..Default::default()
        }
    }

    fn bodies(out: &[pb::ReceiveMessageResponse]) -> Vec<Vec<u8>> {
        out.iter()
            .filter_map(|r| match &r.content {
                Some(pb::receive_message_response::Content::Message(m)) => Some(m.body.to_vec()),
                _ => None,
            })
            .collect()
    }

    /// A Kafka batch of many records is received a few at a time, each
    /// receive converting only what it takes, none skipped: the next goes
    /// on at the first record the last one left.
    #[tokio::test]
    async fn a_kafka_batch_is_received_a_few_records_at_a_time() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Arc::new(Broker::new(store, rokka_broker::BrokerConfig::default())?);
        broker.create_topic("t", 1)?;
        let values: Vec<Vec<u8>> = (0..7).map(|i| format!("k{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        broker.append_kafka_batch("t", 0, &rokka_store::record::kafka::build_test_batch(&refs, 1_000))?;
        let m = Arc::new(Messaging::new(
            broker,
            GrpcConfig::default(),
            "broker-a".into(),
            "127.0.0.1:8081".into(),
            90,
        ));
        let mut got = Vec::new();
        for _ in 0..5 {
            got.extend(bodies(&m.receive(receive_req("g"), "c").await));
        }
        assert_eq!(got, values);
        Ok(())
    }

    /// Messages of an answer the transport did not take before dropping it
    /// (the client reset the call) are visible again at once; those it
    /// took stay invisible for their time.
    #[tokio::test]
    async fn messages_an_answer_did_not_write_are_received_again_at_once() -> Result<(), Box<dyn std::error::Error>> {
        use tokio_stream::StreamExt;
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Arc::new(Broker::new(store, rokka_broker::BrokerConfig::default())?);
        broker.create_topic("t", 1)?;
        let m = Arc::new(Messaging::new(
            broker,
            GrpcConfig::default(),
            "broker-a".into(),
            "127.0.0.1:8081".into(),
            90,
        ));
        let send = pb::SendMessageRequest {
            messages: ["first", "second"]
                .iter()
                .map(|b| pb::Message {
                    topic: Some(resource("t")),
                    body: Bytes::copy_from_slice(b.as_bytes()),
                    system_properties: Some(pb::SystemProperties {
                        message_id: format!("id-{b}"),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        };
        let (results, _) = m.send(send, None, None);
        assert!(
            results
                .iter()
                .all(|r| r.status.as_ref().is_some_and(|s| s.code == pb::Code::Ok as i32)),
            "{results:?}"
        );
        let out = m.receive(receive_req("g"), "c").await;
        assert_eq!(bodies(&out), vec![b"first".to_vec(), b"second".to_vec()]);
        let mut answer = Answer {
            items: out.into(),
            m: Arc::clone(&m),
            group: "g".into(),
        };
        // The transport takes what comes before the first message and the
        // message, then the call is reset.
        loop {
            match answer.next().await {
                Some(Ok(r)) if matches!(r.content, Some(pb::receive_message_response::Content::Message(_))) => break,
                Some(Ok(_)) => {}
                other => return Err(format!("the answer ended early: {other:?}").into()),
            }
        }
        drop(answer);
        let again = m.receive(receive_req("g"), "c").await;
        assert_eq!(
            bodies(&again),
            vec![b"second".to_vec()],
            "only the one not written comes back"
        );
        Ok(())
    }
}
