//! The remoting listener: one task reads frames off a connection and runs
//! each request as its own task (a client multiplexes many long-polling
//! pulls on one connection, so requests must not wait for each other); one
//! task writes responses and server-initiated requests in arrival order.
//! Budgets: connections per listener and per source address, an idle
//! timeout, and requests in flight per connection (a request's permit is
//! held until its answer is written, so a client that never reads stops
//! being read instead of growing the broker), and request bytes over the
//! whole listener (a frame's declared length is reserved before it is read
//! and returned once its answer is written).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rokka_broker::limits::{ByteBudget, ConnLimits, ConnSlot, Reserved};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::codec::{decode, encode};
use crate::command::RemotingCommand;

/// What answers the requests of one port (the broker's or the name server's).
pub trait Service: Send + Sync + 'static {
    /// Handles one request; `None` for oneway requests.
    fn process(&self, cmd: RemotingCommand, conn: &Conn) -> impl Future<Output = Option<RemotingCommand>> + Send;
    /// Largest frame accepted on this port.
    fn max_frame_bytes(&self) -> usize;
    /// This port's connection budgets.
    fn limits(&self) -> &Limits;
    /// A connection closed (its clients or brokers are gone).
    fn connection_closed(&self, conn: &Conn);
    /// Whether `cmd` completes without waiting (then it runs on the reading
    /// task, in order, without a task of its own).
    fn inline(&self, _cmd: &RemotingCommand) -> bool {
        false
    }
}

/// The budgets of one remoting listener (`[rocketmq]` keys).
#[derive(Debug)]
pub struct Limits {
    /// `rokka_connections_*{listener}` label.
    pub listener: &'static str,
    pub conns: Arc<ConnLimits>,
    pub idle: Duration,
    pub max_inflight: usize,
    /// `max_held_pulls_per_connection`: long-polling pulls, counted apart
    /// from `max_inflight`.
    pub max_held_pulls: usize,
    /// Request bytes in memory over the listener.
    pub bytes: ByteBudget,
    /// Answers queued to connections and not yet written, over the listener.
    unwritten: Arc<std::sync::atomic::AtomicUsize>,
    /// Failed signature checks per source address.
    pub auth_failures: Arc<rokka_broker::limits::AuthFailures>,
    /// `max_unwritten_pushes_per_connection`.
    pub max_pushes: usize,
    /// `max_unwritten_bytes_per_connection`.
    pub max_unwritten_bytes: usize,
    /// Bytes of answers and pushes queued and not yet written, over the
    /// listener (`rokka_rocketmq_unwritten_bytes`).
    unwritten_bytes: Arc<std::sync::atomic::AtomicUsize>,
}

impl Limits {
    pub fn new(listener: &'static str, config: &crate::RocketMqConfig) -> Limits {
        Limits {
            listener,
            conns: ConnLimits::new(
                listener,
                config.max_connections as usize,
                config.max_connections_per_ip as usize,
            ),
            idle: Duration::from_millis(config.idle_timeout_ms.max(1)),
            max_inflight: config.max_inflight_requests_per_connection.max(1) as usize,
            max_held_pulls: config.max_held_pulls_per_connection.max(1) as usize,
            bytes: ByteBudget::new(listener, config.max_inflight_request_bytes),
            unwritten: Arc::default(),
            max_pushes: config.max_unwritten_pushes_per_connection.max(1) as usize,
            max_unwritten_bytes: config.max_unwritten_bytes_per_connection.max(1) as usize,
            unwritten_bytes: Arc::default(),
            auth_failures: Arc::new(rokka_broker::limits::AuthFailures::new(
                "rokka_rocketmq_auth_failing_addresses",
                config.auth_max_failures_per_address,
                Duration::from_millis(config.auth_failure_window_ms),
            )),
        }
    }

    /// Answers queued to this listener's connections and not yet written
    /// (`rokka_rocketmq_unwritten_answers`); bounded by the in-flight limit
    /// times the connections.
    pub fn unwritten_answers(&self) -> usize {
        self.unwritten.load(Ordering::Relaxed)
    }
}

/// What a queued command weighs against a connection's unwritten bytes: its
/// body and a header's worth (the body is what grows: pulled messages, the
/// half message of a transaction check).
fn weight(cmd: &RemotingCommand) -> usize {
    cmd.body.len() + 512
}

/// Room taken among a connection's unwritten bytes for an answer being
/// built ([`Conn::claim_room`]); given back on drop.
#[derive(Debug)]
pub struct RoomClaim {
    bytes: usize,
    unwritten: Arc<Unwritten>,
}

impl RoomClaim {
    /// The bytes claimed (0: no room).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for RoomClaim {
    fn drop(&mut self) {
        self.unwritten.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// What a request holds until its answer is written: its place among the
/// connection's requests in flight and its bytes in the listener's budget.
#[derive(Debug)]
pub struct Held {
    _permit: OwnedSemaphorePermit,
    _bytes: Reserved,
}

/// A queued command and, for an answer, what its request holds (released
/// once the answer is written).
type Outbound = (RemotingCommand, Option<Held>, Weighed);

/// A queued command's weight (see [`weight`]) in its connection's and its
/// listener's unwritten bytes and, for an answer, its place among the
/// listener's unwritten answers; given back when dropped — once written,
/// or with the queue of a closed connection (an aborted writer included).
struct Weighed {
    bytes: usize,
    answer: bool,
    counts: Arc<Unwritten>,
}

/// A connection's unwritten bytes, and the listener's unwritten bytes and
/// answers it adds to (the gauges are set from these after each write).
#[derive(Debug)]
struct Unwritten {
    bytes: std::sync::atomic::AtomicUsize,
    listener_bytes: Arc<std::sync::atomic::AtomicUsize>,
    listener_answers: Arc<std::sync::atomic::AtomicUsize>,
    /// The listener's metric label.
    listener: &'static str,
}

impl Unwritten {
    /// Sets the listener's gauges from its counts.
    fn export(&self) {
        let listener = self.listener;
        rokka_broker::hot_metrics::gauge_set(
            "rokka_rocketmq_unwritten_answers",
            "listener",
            listener,
            self.listener_answers.load(Ordering::Relaxed) as f64,
        );
        rokka_broker::hot_metrics::gauge_set(
            "rokka_rocketmq_unwritten_bytes",
            "listener",
            listener,
            self.listener_bytes.load(Ordering::Relaxed) as f64,
        );
    }
}

impl Drop for Weighed {
    fn drop(&mut self) {
        self.counts.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.counts.listener_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        if self.answer {
            self.counts.listener_answers.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A connection's outbound side, for responses and for requests the server
/// sends to the client (NOTIFY_CONSUMER_IDS_CHANGED).
#[derive(Debug, Clone)]
pub struct Conn {
    pub peer: SocketAddr,
    tx: mpsc::UnboundedSender<Outbound>,
    next_opaque: Arc<AtomicI32>,
    /// Server-initiated requests queued to this connection and not yet
    /// written (at most `max_pushes`).
    pushes: Arc<std::sync::atomic::AtomicUsize>,
    max_pushes: usize,
    /// Authorization refusals on this connection (logged once).
    pub denials: Arc<crate::auth::Denials>,
    /// A refused subscription (a mixed group's conflict) was logged for
    /// this connection: its next heartbeats, refused alike, are not.
    pub conflict_logged: Arc<std::sync::atomic::AtomicBool>,
    /// The listener's failed signature checks per address.
    pub auth_failures: Arc<rokka_broker::limits::AuthFailures>,
    /// `User:<subject DN>` of the client certificate a TLS connection
    /// presented (listeners with `rocketmq.tls_client_ca`): the principal of
    /// its requests that carry no AccessKey, as Kafka's SSL principal.
    pub certificate_principal: Option<Arc<str>>,
    /// Bytes queued to this connection and not yet written (see
    /// [`weight`]), and the listener's counts.
    unwritten: Arc<Unwritten>,
    /// `rocketmq.max_unwritten_bytes_per_connection`.
    max_unwritten_bytes: usize,
}

impl Conn {
    /// Queues a server-initiated request (NOTIFY_CONSUMER_IDS_CHANGED,
    /// CHECK_TRANSACTION_STATE, RESET_CONSUMER_CLIENT_OFFSET) for this
    /// connection; false when it is closed, or when
    /// `rocketmq.max_unwritten_pushes_per_connection` are queued already — a client that does not
    /// read its connection is not sent more (dropped, counted in
    /// `rokka_rocketmq_pushes_dropped_total`: each is a hint the broker
    /// repeats or the client recovers from by its own polling).
    pub fn send(&self, cmd: RemotingCommand) -> bool {
        // Past the connection's unwritten bytes too (a transaction check
        // carries its whole half message).
        if self.over_unwritten_bytes() {
            metrics::counter!("rokka_rocketmq_pushes_dropped_total").increment(1);
            return false;
        }
        if self.pushes.fetch_add(1, Ordering::AcqRel) >= self.max_pushes {
            self.pushes.fetch_sub(1, Ordering::AcqRel);
            metrics::counter!("rokka_rocketmq_pushes_dropped_total").increment(1);
            return false;
        }
        let w = self.weigh(&cmd, false);
        if self.tx.send((cmd, None, w)).is_err() {
            self.pushes.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn answer(&self, cmd: RemotingCommand, permit: Held) -> bool {
        let w = self.weigh(&cmd, true);
        if self.tx.send((cmd, Some(permit), w)).is_err() {
            // Closed: the answer is dropped (its counts with it), after the
            // close already set the gauges.
            self.unwritten.export();
            return false;
        }
        true
    }

    /// Counts `cmd` as queued to this connection (see [`Weighed`]).
    fn weigh(&self, cmd: &RemotingCommand, answer: bool) -> Weighed {
        let bytes = weight(cmd);
        let u = &self.unwritten;
        u.bytes.fetch_add(bytes, Ordering::AcqRel);
        u.listener_bytes.fetch_add(bytes, Ordering::Relaxed);
        if answer {
            u.listener_answers.fetch_add(1, Ordering::Relaxed);
        }
        Weighed {
            bytes,
            answer,
            counts: Arc::clone(u),
        }
    }

    /// Takes up to `want` of the room left among the connection's unwritten
    /// bytes for an answer about to be built (a pull reads no more than it
    /// got: 0 when there is none), held until the claim is dropped — so
    /// pulls woken together cannot each see the whole room.
    pub fn claim_room(&self, want: usize) -> RoomClaim {
        let max = self.max_unwritten_bytes;
        let got = self
            .unwritten
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur < max).then(|| cur + want.min(max - cur))
            })
            .map_or(0, |cur| want.min(max - cur));
        RoomClaim {
            bytes: got,
            unwritten: Arc::clone(&self.unwritten),
        }
    }

    fn over_unwritten_bytes(&self) -> bool {
        self.unwritten.bytes.load(Ordering::Acquire) > self.max_unwritten_bytes
    }

    /// An opaque for a server-initiated request.
    pub fn next_opaque(&self) -> i32 {
        self.next_opaque.fetch_add(1, Ordering::Relaxed)
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The bytes a decoded request took on the wire, near enough for the
/// budget (header fields plus body).
fn frame_bytes(cmd: &RemotingCommand) -> usize {
    let fields: usize = cmd.ext_fields.0.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
    8 + 64 + cmd.remark.as_ref().map_or(0, |r| r.len()) + fields + cmd.body.len()
}

/// TLS on a RocketMQ listener, as RocketMQ's `tls.server.mode`:
/// `enforcing` takes TLS connections only; `permissive` takes both on the
/// same port, telling them apart by the first byte (a TLS handshake record
/// starts with 0x16, a remoting frame with its length's high byte).
#[derive(Clone)]
pub struct Tls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub enforcing: bool,
    pub handshake_timeout: std::time::Duration,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("enforcing", &self.enforcing).finish()
    }
}

/// Accepts connections until `shutdown` turns true.
pub async fn serve<S: Service>(listener: TcpListener, rmq: Arc<S>, shutdown: watch::Receiver<bool>) {
    serve_with(listener, rmq, None, shutdown).await
}

/// [`serve`], with TLS when `tls` is given.
pub async fn serve_with<S: Service>(
    listener: TcpListener,
    rmq: Arc<S>,
    tls: Option<Tls>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut accept_errors = rokka_broker::limits::AcceptErrors::new(rmq.limits().listener);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted.inspect(|_| accept_errors.accepted()) {
                Ok((stream, peer)) => match rmq.limits().conns.admit(peer.ip()) {
                    Ok(slot) => {
                        let r = Arc::clone(&rmq);
                        let sd = shutdown.clone();
                        let _ = stream.set_nodelay(true);
                        match tls.clone() {
                            None => {
                                tokio::spawn(async move { run(stream, peer, r, sd, slot).await });
                            }
                            Some(tls) => {
                                tokio::spawn(async move { secured(stream, peer, r, sd, slot, tls).await });
                            }
                        }
                    }
                    // Counted in rokka_connections_refused_total; a log line
                    // per refusal would let a client flood the log.
                    Err(why) => {
                        tracing::debug!(%peer, reason = why.as_str(), "RocketMQ connection refused");
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

/// A connection of a TLS listener: the handshake (within its timeout),
/// or — permissive mode, a plaintext first byte — the plain protocol.
async fn secured<S: Service>(
    stream: TcpStream,
    peer: SocketAddr,
    rmq: Arc<S>,
    shutdown: watch::Receiver<bool>,
    slot: ConnSlot,
    tls: Tls,
) {
    let listener = rmq.limits().listener;
    let count = |result: &'static str| {
        metrics::counter!("rokka_rocketmq_tls_handshakes_total", "listener" => listener, "result" => result)
            .increment(1);
    };
    let mut first = [0u8; 1];
    let is_tls = match tokio::time::timeout(tls.handshake_timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) => first[0] == 0x16,
        _ => {
            count("timeout");
            return;
        }
    };
    if !is_tls {
        if tls.enforcing {
            count("plaintext_refused");
            tracing::debug!(%peer, "plaintext RocketMQ connection on an enforcing TLS listener: closing");
            return;
        }
        count("plaintext");
        return run(stream, peer, rmq, shutdown, slot).await;
    }
    match tokio::time::timeout(tls.handshake_timeout, tls.acceptor.accept(stream)).await {
        Ok(Ok(s)) => {
            count("ok");
            run(s, peer, rmq, shutdown, slot).await
        }
        // Counted; a log line per failed handshake would let anyone flood it.
        Ok(Err(e)) => {
            count("failed");
            tracing::debug!(%peer, error = %e, "RocketMQ TLS handshake failed");
        }
        Err(_) => count("timeout"),
    }
}

/// A connection's two directions: a TCP stream's owned halves (no lock
/// between them), a TLS stream's shared ones.
trait Halves {
    type R: AsyncRead + Unpin + Send + 'static;
    type W: AsyncWrite + Unpin + Send + 'static;
    fn halves(self) -> (Self::R, Self::W);
    /// Who the client certificate names, if one was presented.
    fn certificate_principal(&self) -> Option<Arc<str>> {
        None
    }
}

impl Halves for TcpStream {
    type R = tokio::net::tcp::OwnedReadHalf;
    type W = tokio::net::tcp::OwnedWriteHalf;
    fn halves(self) -> (Self::R, Self::W) {
        self.into_split()
    }
}

impl Halves for tokio_rustls::server::TlsStream<TcpStream> {
    type R = tokio::io::ReadHalf<Self>;
    type W = tokio::io::WriteHalf<Self>;
    fn halves(self) -> (Self::R, Self::W) {
        tokio::io::split(self)
    }
    fn certificate_principal(&self) -> Option<Arc<str>> {
        rokka_broker::tls::peer_principal(self.get_ref().1).map(Arc::from)
    }
}

async fn run<S: Service, T: Halves>(
    stream: T,
    peer: SocketAddr,
    rmq: Arc<S>,
    mut shutdown: watch::Receiver<bool>,
    _slot: ConnSlot,
) {
    metrics::gauge!("rokka_rocketmq_connections").increment(1.0);
    let certificate_principal = stream.certificate_principal();
    let (mut rd, mut wr) = stream.halves();
    let (tx, mut rx) = mpsc::unbounded_channel::<Outbound>();
    let limits = rmq.limits();
    let listener = limits.listener;
    let unwritten = Arc::new(Unwritten {
        bytes: Default::default(),
        listener_bytes: Arc::clone(&limits.unwritten_bytes),
        listener_answers: Arc::clone(&limits.unwritten),
        listener: limits.listener,
    });
    let pushes: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
    let conn = Conn {
        peer,
        tx,
        next_opaque: Arc::new(AtomicI32::new(1)),
        unwritten: Arc::clone(&unwritten),
        pushes: Arc::clone(&pushes),
        max_pushes: limits.max_pushes,
        denials: Arc::default(),
        conflict_logged: Arc::default(),
        auth_failures: Arc::clone(&rmq.limits().auth_failures),
        certificate_principal,
        max_unwritten_bytes: limits.max_unwritten_bytes,
    };
    // Signalled after each write: a reader waiting for the connection's
    // unwritten bytes to go down looks again.
    let drained = Arc::new(tokio::sync::Notify::new());
    let drained_w = Arc::clone(&drained);
    // Set when the writer stops (the connection failed, or its client read
    // nothing for idle_timeout_ms): the reader stops too.
    let writer_gone = Arc::new(tokio::sync::Notify::new());
    // Told by a guard, so a writer that ends any way (a panic included)
    // stops the reader.
    struct Gone(Arc<tokio::sync::Notify>);
    impl Drop for Gone {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }
    let gone = Gone(Arc::clone(&writer_gone));
    let idle = limits.idle;
    let writer = tokio::spawn(async move {
        let mut out = BytesMut::new();
        let mut permits = Vec::new();
        let mut weighed = Vec::new();
        while let Some((cmd, permit, w)) = rx.recv().await {
            encode(&cmd, &mut out);
            let mut pushed = usize::from(permit.is_none());
            permits.extend(permit);
            weighed.push(w);
            // Gather whatever else is already queued into the same write.
            while let Ok((more, permit, w)) = rx.try_recv() {
                encode(&more, &mut out);
                pushed += usize::from(permit.is_none());
                permits.extend(permit);
                weighed.push(w);
            }
            // Taken off the queue: room for more pushes.
            pushes.fetch_sub(pushed, Ordering::AcqRel);
            // (TLS holds what it encrypted until flushed.) A client that
            // takes nothing for idle_timeout_ms (its socket buffer full)
            // would hold these answers' request bytes and in-flight permits
            // for good: the connection is closed. A slow reader that keeps
            // reading is not.
            match rokka_broker::limits::write_with_progress(&mut wr, &[&out], idle).await {
                rokka_broker::limits::Written::All => {}
                rokka_broker::limits::Written::Failed => break,
                rokka_broker::limits::Written::Stalled => {
                    metrics::counter!("rokka_connections_write_stalled_total", "listener" => listener).increment(1);
                    tracing::debug!(%peer, "RocketMQ client read none of its answers within the idle timeout: closing");
                    break;
                }
            }
            out.clear();
            // Written: these requests no longer count against the connection.
            weighed.clear();
            permits.clear();
            drained_w.notify_one();
            unwritten.export();
        }
        // Closed with answers unwritten: they are dropped with the
        // connection (their Weighed give back their counts).
        drop(gone);
    });
    let inflight = Arc::new(Semaphore::new(limits.max_inflight));
    // Long-polling pulls wait apart: a client instance pulls every queue it
    // consumes here over this one connection, each pull held up to its
    // suspend time — counted with the other requests, a consumer of more
    // queues than `max_inflight` stopped its own heartbeats and sends.
    let held_pulls = Arc::new(Semaphore::new(limits.max_held_pulls));
    let max = rmq.max_frame_bytes();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut deadline = tokio::time::Instant::now() + limits.idle;
    // The budget reserved for the frame at the head of `buf`, taken before
    // the rest of it is read.
    let mut head: Option<Reserved> = None;
    'conn: loop {
        loop {
            // Past its unwritten bytes the connection's next request waits,
            // unread, until its client has read some of the answers.
            if conn.over_unwritten_bytes() {
                rokka_broker::hot_metrics::count("rokka_rocketmq_unwritten_bytes_waits_total", "listener", listener, 1);
                // (What a stalled writer holds shows while it waits.)
                conn.unwritten.export();
            }
            while conn.over_unwritten_bytes() {
                tokio::select! {
                    _ = drained.notified() => {}
                    _ = shutdown.changed() => break 'conn,
                    _ = writer_gone.notified() => break 'conn,
                }
            }
            match decode(&mut buf, max) {
                Ok(Some(cmd)) => {
                    deadline = tokio::time::Instant::now() + limits.idle;
                    let bytes = match head.take() {
                        Some(r) => r,
                        // Arrived whole in one read (at most a read buffer's worth).
                        None => tokio::select! {
                            r = limits.bytes.reserve(frame_bytes(&cmd)) => r,
                            _ = shutdown.changed() => break 'conn,
                            _ = writer_gone.notified() => break 'conn,
                        },
                    };
                    if cmd.is_response() {
                        // Answers to our NOTIFY / CHECK requests: nothing to do.
                        continue;
                    }
                    let serialize = match cmd.serialize_type {
                        crate::command::SerializeType::Json => "json",
                        crate::command::SerializeType::RocketMq => "rocketmq",
                    };
                    rokka_broker::hot_metrics::count("rokka_rocketmq_frames_total", "serialize", serialize, 1);
                    // At the in-flight limit, wait (reading nothing) until an
                    // answer has been written.
                    let (budget, waits) = if long_poll(&cmd) {
                        (&held_pulls, "rokka_rocketmq_held_pull_waits_total")
                    } else {
                        (&inflight, "rokka_rocketmq_inflight_waits_total")
                    };
                    let permit = match Arc::clone(budget).try_acquire_owned() {
                        Ok(p) => p,
                        Err(_) => {
                            rokka_broker::hot_metrics::count(waits, "listener", listener, 1);
                            tokio::select! {
                                p = Arc::clone(budget).acquire_owned() => match p {
                                    Ok(p) => p,
                                    Err(_) => break 'conn,
                                },
                                _ = shutdown.changed() => break 'conn,
                                _ = writer_gone.notified() => break 'conn,
                            }
                        }
                    };
                    let held = Held {
                        _permit: permit,
                        _bytes: bytes,
                    };
                    if rmq.inline(&cmd) {
                        if let Some(resp) = rmq.process(cmd, &conn).await {
                            conn.answer(resp, held);
                        }
                        continue;
                    }
                    let r = Arc::clone(&rmq);
                    let c = conn.clone();
                    tokio::spawn(async move {
                        if let Some(resp) = r.process(cmd, &c).await {
                            c.answer(resp, held);
                        }
                    });
                }
                Ok(None) => {
                    // Part of a frame is here: reserve its declared length
                    // before reading the rest (waiting, not reading, while
                    // the listener's budget is spent). decode() has checked
                    // the length against max_frame_bytes.
                    if head.is_none() && buf.len() >= 4 {
                        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                        let wait = limits.bytes.available_kib() * 1024 < len + 4;
                        if wait {
                            rokka_broker::hot_metrics::count(
                                "rokka_inflight_request_bytes_waits_total",
                                "listener",
                                listener,
                                1,
                            );
                        }
                        head = tokio::select! {
                            r = limits.bytes.reserve(len + 4) => Some(r),
                            _ = shutdown.changed() => break 'conn,
                            _ = writer_gone.notified() => break 'conn,
                        };
                    }
                    break;
                }
                Err(e) => {
                    // (Anyone can open connections: counted, logged at most every 10 s.)
                    metrics::counter!("rokka_rocketmq_bad_frames_total").increment(1);
                    static LOG: rokka_broker::limits::LogEvery = rokka_broker::limits::LogEvery::new(10_000);
                    if LOG.ready() {
                        tracing::warn!(%peer, error = %e, "bad RocketMQ frame: closing connection");
                    }
                    break 'conn;
                }
            }
        }
        tokio::select! {
            n = tokio::time::timeout_at(deadline, rd.read_buf(&mut buf)) => match n {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => {}
                Err(_) => {
                    // No whole frame for idle_timeout_ms (nothing sent, or a
                    // frame dribbled byte by byte).
                    metrics::counter!("rokka_connections_idle_closed_total", "listener" => listener).increment(1);
                    tracing::debug!(%peer, "RocketMQ connection idle: closing");
                    break;
                }
            },
            _ = shutdown.changed() => break,
            _ = writer_gone.notified() => break,
        }
    }
    // The writer goes first: once it has dropped the channel's receiver the
    // connection reads as closed (`Conn::is_closed`), which is how the
    // service tells this connection's clients from a new one's.
    writer.abort();
    let _ = writer.await;
    // What it held unwritten is given back: the gauges say so.
    conn.unwritten.export();
    rmq.connection_closed(&conn);
    drop(conn);
    metrics::gauge!("rokka_rocketmq_connections").decrement(1.0);
}

/// A pull that may be held open (long polling: PULL_MESSAGE with the
/// suspend flag), counted in `max_held_pulls_per_connection`.
fn long_poll(cmd: &RemotingCommand) -> bool {
    cmd.code == crate::codes::request::PULL_MESSAGE
        && cmd
            .ext_fields
            .get("sysFlag")
            .and_then(|f| f.trim().parse::<i64>().ok())
            .is_some_and(|f| f & 0x2 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection whose pushes are never taken off its queue (a client
    /// that does not read): past its budget they are dropped;
    /// once the writer takes them, there is room again.
    #[test]
    fn pushes_to_a_connection_that_is_not_read_are_bounded() {
        let (tx, mut rx) = mpsc::unbounded_channel::<Outbound>();
        let conn = Conn {
            peer: SocketAddr::from(([127, 0, 0, 1], 1)),
            tx,
            next_opaque: Arc::new(AtomicI32::new(1)),
            unwritten: Arc::new(Unwritten {
                bytes: Default::default(),
                listener_bytes: Arc::default(),
                listener_answers: Arc::default(),
                listener: "test",
            }),
            pushes: Arc::default(),
            max_pushes: 1024,
            denials: Arc::default(),
            conflict_logged: Arc::default(),
            auth_failures: Arc::new(rokka_broker::limits::AuthFailures::new(
                "test_failing_addresses",
                5,
                Duration::from_secs(1),
            )),
            certificate_principal: None,
            max_unwritten_bytes: 1 << 20,
        };
        let push = || RemotingCommand::request(crate::codes::request::NOTIFY_CONSUMER_IDS_CHANGED, 1);
        for _ in 0..1024 {
            assert!(conn.send(push()));
        }
        assert!(!conn.send(push()));
        // The writer takes one (and says so): one more fits.
        assert!(rx.try_recv().is_ok());
        conn.pushes.fetch_sub(1, Ordering::AcqRel);
        assert!(conn.send(push()));
        assert!(!conn.send(push()));
        // Each queued push weighs on the connection's unwritten bytes until
        // taken and dropped (written, or with the closed connection's queue).
        let u = Arc::clone(&conn.unwritten);
        let queued = u.bytes.load(Ordering::Acquire);
        assert_eq!(queued, 1024 * 512);
        assert_eq!(u.listener_bytes.load(Ordering::Acquire), queued);
        assert_eq!(conn.claim_room(usize::MAX).bytes(), (1 << 20) - queued);
        drop(rx.try_recv());
        assert_eq!(u.bytes.load(Ordering::Acquire), queued - 512);
        drop(rx);
        assert_eq!(u.bytes.load(Ordering::Acquire), 0, "dropped with the queue");
        assert_eq!(u.listener_bytes.load(Ordering::Acquire), 0);
    }
}
