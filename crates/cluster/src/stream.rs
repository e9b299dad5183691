//! The replication stream: a replica connects to its set's master, says
//! who it is and what it holds (epoch history, log end), is told where to
//! truncate, then fetches CommitLog entries from its end on. Each fetch
//! acknowledges everything below its offset (as a Kafka follower's fetch
//! does); each answer carries the master's epoch and high watermark.
//!
//! Frames: `u32 length | u8 kind | payload`, at most [`MAX_FRAME`] bytes.
//! HELLO and WELCOME are JSON; FETCH is `from u64 | epoch u32 | max u32`;
//! DATA is `hw u64 | epoch u32 | n u32 | n × (u32 length | entry) |
//! u32 length | committed-offset table (JSON; empty when unchanged) |
//! u32 length | Kafka transaction state (log lines; empty when unchanged) |
//! u64 the master's count of transaction-state changes |
//! u32 length | Kafka groups as of their last rebalance (JSON; empty when
//! unchanged) | u64 that groups version (0 when none went) | u32 length |
//! the KIP-848 consumer groups of that version (JSON; empty when none went
//! or there are none)`; a FETCH may end with `u64` the groups version the
//! replica applied. (Each field after the entries was added later: a
//! reader takes what it knows and ignores what follows.)
//!
//! With `cluster.replication_certificate` (and its key and CA) the stream
//! runs over TLS authenticated both ways: the master takes only replicas
//! presenting a certificate the cluster CA signed, and a replica checks
//! that the master's certificate names the address it connected to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rokka_store::replication::{divergence, EpochStart};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use rokka_broker::internal::ClusterSecret;

use crate::{Role, Shared};

/// Largest state table (committed offsets, Kafka transactions) a DATA frame
/// carries; a larger one is not shipped (counted and logged).
const MAX_SNAPSHOT: usize = 256 << 20;
/// Largest DATA frame a replica accepts: entries of about [`FETCH_BYTES`]
/// plus one entry of up to the store's largest, plus the four tables
/// (committed offsets, Kafka transactions, Kafka groups with their consumer
/// groups, queue starts). (A frame comes only from the master the replica
/// chose; it is read as its bytes arrive.)
pub const MAX_FRAME: usize = (64 << 20) + 4 * MAX_SNAPSHOT;
/// Largest frame a master reads before it knows who sent it (HELLO), and
/// any other frame a replica may send (FETCH is 16 bytes).
const MAX_HELLO: usize = 1 << 20;
const MAX_FETCH: usize = 64;
/// Largest WELCOME a replica reads (one that restarts its log names every
/// queue of the master).
const MAX_WELCOME: usize = 64 << 20;
/// How long a TLS handshake on the replication port may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of entries one DATA frame carries at most (about).
const FETCH_BYTES: u32 = 4 << 20;

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const REFUSE: u8 = 3;
const FETCH: u8 = 4;
const DATA: u8 = 5;

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    cluster: String,
    set: String,
    node_id: u32,
    epochs: Vec<EpochStart>,
    end: u64,
    segment_bytes: u64,
    /// When it was sent (ms since the epoch): a proof is good for
    /// [`HELLO_MAX_AGE`] either way.
    #[serde(default)]
    at: i64,
    /// HMAC under the cluster secret of everything above
    /// ([`Hello::content`]): who knows the secret (it is in etcd) is a node
    /// of the cluster; anyone else cannot pass for one, and the master
    /// serves its log to nobody else.
    #[serde(default)]
    proof: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Welcome {
    epoch: u32,
    epochs: Vec<EpochStart>,
    end: u64,
    truncate_to: u64,
    /// Where the master's log starts, when the replica's (cut at
    /// `truncate_to`) ends below it: what lies between is gone from the
    /// master (retention), so the replica drops its log and continues there.
    #[serde(default)]
    restart_at: Option<u64>,
    /// With `restart_at`: per queue ("topic/queue"), the master's queue
    /// offset of its first entry at or past that start (its end when none
    /// is), where the replica's queue continues (offsets never go back).
    #[serde(default)]
    continue_at: std::collections::BTreeMap<String, u64>,
    /// HMAC under the cluster secret of the answer and the HELLO's proof
    /// ([`Welcome::content`]): a replica truncates its log only on its
    /// master's word, not on a stranger's that answered in its place.
    #[serde(default)]
    proof: String,
}

/// How far a HELLO's time may be from the master's clock.
const HELLO_MAX_AGE: u64 = 60_000;

impl Hello {
    fn content(&self) -> Vec<u8> {
        let epochs = serde_json::to_string(&self.epochs).unwrap_or_default();
        format!(
            "rokka-replication-hello\n{}\n{}\n{}\n{}\n{}\n{}\n{epochs}",
            self.cluster, self.set, self.node_id, self.at, self.end, self.segment_bytes
        )
        .into_bytes()
    }
}

impl Welcome {
    fn content(&self, hello_proof: &str) -> Vec<u8> {
        let epochs = serde_json::to_string(&self.epochs).unwrap_or_default();
        format!(
            "rokka-replication-welcome\n{hello_proof}\n{}\n{}\n{}\n{:?}\n{}\n{epochs}",
            self.epoch,
            self.end,
            self.truncate_to,
            self.restart_at,
            serde_json::to_string(&self.continue_at).unwrap_or_default()
        )
        .into_bytes()
    }
}

/// HELLOs remembered (their proofs) at most: past it, new handshakes
/// wait until older proofs expire.
const MAX_HELLOS_SEEN: usize = 4096;

/// Why a HELLO whose proof passed is still refused: a proof seen before
/// (a replay of a captured HELLO, within its lifetime), or too many
/// handshakes within two lifetimes to remember them all.
fn first_use(sh: &Shared, proof: &str) -> Option<&'static str> {
    let mut seen = sh.hellos.lock().unwrap_or_else(|p| p.into_inner());
    let life = Duration::from_millis(2 * HELLO_MAX_AGE);
    seen.retain(|_, at| at.elapsed() <= life);
    if seen.contains_key(proof) {
        return Some("its proof was used before (a replayed HELLO)");
    }
    if seen.len() >= MAX_HELLOS_SEEN {
        return Some("too many handshakes in the last two minutes");
    }
    seen.insert(proof.to_string(), Instant::now());
    None
}

/// Why a HELLO's proof does not pass, if it does not.
fn check_hello(secret: Option<&ClusterSecret>, hello: &Hello) -> Option<&'static str> {
    let Some(secret) = secret else {
        return Some("this node has no cluster secret yet");
    };
    if hello.proof.is_empty() {
        return Some("no proof of the cluster secret (a node older than replication authentication?)");
    }
    if !secret.verify(&hello.content(), &hello.proof) {
        return Some("its proof is not the cluster secret's");
    }
    if rokka_store::now_ms().abs_diff(hello.at) > HELLO_MAX_AGE {
        return Some("its proof is more than a minute from this node's clock");
    }
    None
}

type Res<T> = Result<T, String>;

/// How long a frame of `len` bytes may take to cross: 30 s, and a second
/// more per MiB (a peer that stopped reading — SIGSTOP keeps its kernel
/// acknowledging window probes — or a black-holed link would hold the
/// stream, its connection slot and its buffer for good).
fn frame_deadline(len: usize) -> Duration {
    Duration::from_secs(30 + (len >> 20) as u64)
}

async fn write_frame<S: AsyncWrite + Unpin>(s: &mut S, kind: u8, payload: &[u8]) -> Res<()> {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u32(payload.len() as u32 + 1);
    b.put_u8(kind);
    b.put_slice(payload);
    let write = async {
        s.write_all(&b).await.map_err(|e| format!("write: {e}"))?;
        // Over TLS the last records may still be buffered (a no-op on TCP).
        s.flush().await.map_err(|e| format!("write: {e}"))
    };
    tokio::time::timeout(frame_deadline(b.len()), write)
        .await
        .map_err(|_| format!("write: a {}-byte frame not taken within its deadline", b.len()))?
}

/// A frame whose first bytes must come within `first`; the rest then has
/// the frame's own deadline (its size: a large first DATA frame, every
/// table in it, may take longer than the answer's wait).
async fn read_frame_within<S: AsyncRead + Unpin>(s: &mut S, max: usize, first: Duration) -> Res<(u8, Bytes)> {
    let mut head = [0u8; 1];
    let n = tokio::time::timeout(first, s.read(&mut head))
        .await
        .map_err(|_| format!("nothing within {} s", first.as_secs()))?
        .map_err(|e| format!("read: {e}"))?;
    if n == 0 {
        return Err("read: the peer closed the stream".into());
    }
    let mut rest = [0u8; 3];
    let len_bytes = async {
        s.read_exact(&mut rest).await.map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(u32::from_be_bytes([head[0], rest[0], rest[1], rest[2]]) as usize)
    };
    let len = tokio::time::timeout(frame_deadline(0), len_bytes)
        .await
        .map_err(|_| "read: a frame's length cut short".to_string())??;
    tokio::time::timeout(frame_deadline(len), read_body(s, len, max))
        .await
        .map_err(|_| format!("read: a {len}-byte frame not received within its deadline"))?
}

async fn read_frame<S: AsyncRead + Unpin>(s: &mut S, max: usize) -> Res<(u8, Bytes)> {
    let len = s.read_u32().await.map_err(|e| format!("read: {e}"))? as usize;
    read_body(s, len, max).await
}

async fn read_body<S: AsyncRead + Unpin>(s: &mut S, len: usize, max: usize) -> Res<(u8, Bytes)> {
    if len == 0 || len > max {
        return Err(format!("frame of {len} bytes"));
    }
    // Grown as the bytes arrive: a peer's length alone (up to MAX_FRAME,
    // 832 MiB) does not get memory it never sends.
    let mut b = Vec::with_capacity(len.min(1 << 20));
    let got = AsyncReadExt::take(&mut *s, len as u64)
        .read_to_end(&mut b)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if got < len {
        return Err(format!(
            "read: the peer closed the stream {got} bytes into a {len}-byte frame"
        ));
    }
    let mut b = Bytes::from(b);
    let kind = b.get_u8();
    Ok((kind, b))
}

/// Serves replicas while this node is master (connections are refused
/// otherwise).
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    tls: Option<TlsAcceptor>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let max = shared.cfg.replication_max_connections.max(1) as usize;
    let slots = Arc::new(tokio::sync::Semaphore::new(max));
    // With TLS a connection takes a slot only once its certificate is
    // verified; handshakes in progress have a budget of their own, so
    // peers that never finish one cannot keep the set's replicas out.
    let handshakes = Arc::new(tokio::sync::Semaphore::new(max));
    let mut accept_errors = rokka_broker::limits::AcceptErrors::new("replication");
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok((s, peer)) => {
                accept_errors.accepted();
                let _ = s.set_nodelay(true);
                let sh = Arc::clone(&shared);
                let slots = Arc::clone(&slots);
                match tls.clone() {
                    None => {
                        // A set has a few replicas: the port takes at most
                        // `replication_max_connections` at once, whoever connects.
                        let Some(permit) = slot(&slots, peer) else { continue };
                        tokio::spawn(async move {
                            let served = serve_replica(s, &sh, None).await;
                            ended(peer, served, permit);
                        });
                    }
                    Some(tls) => {
                        let Ok(shaking) = Arc::clone(&handshakes).try_acquire_owned() else {
                            metrics::counter!("rokka_replication_connections_refused_total").increment(1);
                            continue;
                        };
                        tokio::spawn(async move {
                            let s = handshake("master", tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(s))).await;
                            drop(shaking);
                            let s = match s {
                                Ok(s) => s,
                                Err(e) => {
                                    tracing::debug!(%peer, error = e, "replication TLS handshake failed");
                                    return;
                                }
                            };
                            // Who the certificate is for: the node it claims
                            // to be must be registered at one of these.
                            let names = rokka_broker::tls::peer_names(s.get_ref().1);
                            let Some(permit) = slot(&slots, peer) else { return };
                            let served = serve_replica(s, &sh, Some(names)).await;
                            ended(peer, served, permit);
                        });
                    }
                }
            }
            Err(e) => {
                accept_errors.failed(&e);
                tokio::time::sleep(rokka_broker::limits::AcceptErrors::PAUSE).await;
            }
        }
    }
}

/// One of the `replication_max_connections` slots, or None (counted,
/// logged) when all are taken.
fn slot(slots: &Arc<tokio::sync::Semaphore>, peer: std::net::SocketAddr) -> Option<tokio::sync::OwnedSemaphorePermit> {
    match Arc::clone(slots).try_acquire_owned() {
        Ok(permit) => {
            metrics::gauge!("rokka_replication_connections").increment(1.0);
            Some(permit)
        }
        Err(_) => {
            metrics::counter!("rokka_replication_connections_refused_total").increment(1);
            tracing::warn!(%peer, "replication connection refused: replication_max_connections reached");
            None
        }
    }
}

/// A replica connection is over: why (logged), and its slot freed.
fn ended(peer: std::net::SocketAddr, served: Res<()>, permit: tokio::sync::OwnedSemaphorePermit) {
    if let Err(e) = served {
        tracing::info!(%peer, error = e, "replica connection ended");
    }
    metrics::gauge!("rokka_replication_connections").decrement(1.0);
    drop(permit);
}

/// The host of `host:port` (an IPv6 address without its brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A TLS handshake's outcome, counted by side and result
/// (`rokka_replication_tls_handshakes_total`).
async fn handshake<S>(
    side: &'static str,
    h: impl std::future::Future<Output = Result<std::io::Result<S>, tokio::time::error::Elapsed>>,
) -> Res<S> {
    let (result, out) = match h.await {
        Ok(Ok(s)) => ("ok", Ok(s)),
        Ok(Err(e)) => ("failed", Err(format!("TLS handshake: {e}"))),
        Err(_) => ("timeout", Err("TLS handshake timed out".to_string())),
    };
    metrics::counter!("rokka_replication_tls_handshakes_total", "side" => side, "result" => result).increment(1);
    out
}

/// `certified`: over TLS, the names the peer's certificate is for.
async fn serve_replica<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    sh: &Shared,
    certified: Option<Vec<String>>,
) -> Res<()> {
    let (kind, body) = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut s, MAX_HELLO))
        .await
        .map_err(|_| "no HELLO within 5 s".to_string())??;
    if kind != HELLO {
        return Err(format!("expected HELLO, got frame kind {kind}"));
    }
    let hello: Hello = serde_json::from_slice(&body).map_err(|e| format!("bad HELLO: {e}"))?;
    if let Some(why) = check_hello(sh.broker.cluster_secret(), &hello).or_else(|| first_use(sh, &hello.proof)) {
        metrics::counter!("rokka_replication_unauthenticated_total", "side" => "master").increment(1);
        let why = format!("HELLO as node {} refused: {why}", hello.node_id);
        write_frame(&mut s, REFUSE, why.as_bytes()).await?;
        return Err(why);
    }
    let store = &sh.store;
    let Role::Master { epoch } = sh.role() else {
        let why = "not the master".to_string();
        write_frame(&mut s, REFUSE, why.as_bytes()).await?;
        return Err(why);
    };
    let member = sh
        .broker
        .cluster_view()
        .is_some_and(|v| v.members.contains(&hello.node_id) && hello.node_id != v.self_id);
    if !member {
        let why = format!("node {} is not a live member of this set", hello.node_id);
        write_frame(&mut s, REFUSE, why.as_bytes()).await?;
        return Err(why);
    }
    // Over TLS the certificate must be the claimed node's: a certificate
    // of the cluster's CA issued for another host cannot pass for it.
    if let Some(names) = &certified {
        let registered = sh.node_addr(hello.node_id);
        let host = registered.as_deref().map(|a| host_of(a).to_ascii_lowercase());
        if !host.as_ref().is_some_and(|h| names.iter().any(|n| n == h)) {
            metrics::counter!("rokka_replication_tls_handshakes_total", "side" => "master", "result" => "wrong_node")
                .increment(1);
            let why = format!(
                "the certificate is for {names:?}, not node {}'s registered host {}",
                hello.node_id,
                host.as_deref().unwrap_or("(none)")
            );
            write_frame(&mut s, REFUSE, why.as_bytes()).await?;
            return Err(why);
        }
    }
    if hello.cluster != sh.cfg.name || hello.set != sh.cfg.broker_set {
        let why = format!(
            "replica of {}/{} at the master of {}/{}",
            hello.cluster, hello.set, sh.cfg.name, sh.cfg.broker_set
        );
        write_frame(&mut s, REFUSE, why.as_bytes()).await?;
        return Err(why);
    }
    if hello.segment_bytes != store.config().commitlog_segment_bytes {
        let why = format!(
            "store.commitlog_segment_bytes is {} on the replica and {} on the master: they must match",
            hello.segment_bytes,
            store.config().commitlog_segment_bytes
        );
        write_frame(&mut s, REFUSE, why.as_bytes()).await?;
        return Err(why);
    }
    // A replica whose history went past this master's epoch (etcd's state
    // older than the nodes': wiped, or restored from a backup): following
    // would mix two sets of writes under one epoch number. This master
    // steps down; the set elects again past that epoch.
    let their_last = hello.epochs.last().map_or(0, |e| e.epoch);
    if their_last > epoch {
        sh.saw_newer_epoch(their_last);
        let why = format!(
            "node {}'s history reaches epoch {their_last}, past this master's {epoch}: stepping down",
            hello.node_id
        );
        write_frame(&mut s, REFUSE, why.as_bytes()).await?;
        return Err(why);
    }
    let epochs = store.epochs();
    let end = store.log_end();
    let truncate_to = divergence(&epochs, end, &hello.epochs, hello.end);
    // Below the master's first retained segment nothing can be sent: the
    // replica continues at that start.
    let start = store.commitlog_offsets().0;
    let restart_at = (truncate_to < start).then_some(start);
    let mut welcome = Welcome {
        epoch,
        epochs,
        end,
        truncate_to,
        restart_at,
        continue_at: match restart_at {
            Some(s) => store.queue_offsets_at(s),
            None => Default::default(),
        },
        proof: String::new(),
    };
    // check_hello passed: the secret is there.
    if let Some(secret) = sh.broker.cluster_secret() {
        welcome.proof = secret.sign(&welcome.content(&hello.proof));
    }
    let json = serde_json::to_vec(&welcome).map_err(|e| e.to_string())?;
    write_frame(&mut s, WELCOME, &json).await?;
    tracing::info!(
        replica = hello.node_id,
        their_end = hello.end,
        truncate_to,
        restart_at = ?welcome.restart_at,
        "replica connected"
    );
    let replica = hello.node_id;
    // A new stream: what the replica held before (its groups are in
    // memory only) counts again once it says so.
    sh.offsets_acks.forget(replica);
    sh.groups_acks.forget(replica);
    sh.txns_acks.forget(replica);
    sh.starts_acks.forget(replica);
    // Its log's end once it cut (or restarted) as told.
    let their_end = welcome.restart_at.unwrap_or(truncate_to.min(hello.end));
    let stream = sh.replica_connected(replica, their_end);
    let result = fetch_loop(&mut s, sh, replica, stream, epoch).await;
    sh.replica_disconnected(replica, stream);
    result
}

async fn fetch_loop<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    sh: &Shared,
    replica: u32,
    stream: u64,
    epoch: u32,
) -> Res<()> {
    let store = &sh.store;
    // Caught up, as Kafka's leader judges a follower: a fetch from the log
    // end is caught up now; one from at least the end the log had when the
    // previous fetch was answered was caught up then. (Holding all the
    // previous answer carried is not enough: a replica far behind gets a
    // frame's worth at a time, and would count as caught up — able to join
    // the sync state set and be elected — while megabytes behind.)
    let mut answered: Option<(u64, Instant)> = None;
    // Committed offsets (and delay/timer progress, same table) and the
    // Kafka transaction coordinator's state go with the stream.
    let mut offsets = Shipped::new("offsets", Duration::from_millis(200));
    // Transaction state at once: a replica holds its readers back while its
    // copy is older than the master's (below).
    let mut txns = Shipped::new("kafka_transactions", Duration::ZERO);
    // The Kafka groups as of their last rebalance, for a replica taking
    // over as coordinator.
    let mut groups = Shipped::new("kafka_groups", Duration::from_millis(100));
    let mut log_starts = Shipped::new("log_starts", Duration::from_millis(200));
    loop {
        let (kind, mut body) = tokio::time::timeout(Duration::from_secs(30), read_frame(s, MAX_FETCH))
            .await
            .map_err(|_| "replica silent for 30 s".to_string())??;
        if kind != FETCH || body.len() < 16 {
            return Err(format!("expected FETCH, got kind {kind}"));
        }
        let from = body.get_u64();
        let their_epoch = body.get_u32();
        let max = body.get_u32().min(FETCH_BYTES) as usize;
        // The Kafka groups version the replica applied (a replica older
        // than this field: whatever was sent counts as applied).
        let groups_applied = (body.remaining() >= 8).then(|| body.get_u64());
        // The queue starts version it has taken whole (a replica older than
        // this field: whatever was sent counts as taken).
        let starts_applied = (body.remaining() >= 8).then(|| body.get_u64());
        if their_epoch > epoch {
            sh.saw_newer_epoch(their_epoch);
            return Err(format!(
                "replica knows epoch {their_epoch}, this master has {epoch}: stepping down"
            ));
        }
        if sh.role() != (Role::Master { epoch }) {
            return Err("no longer master".into());
        }
        let end_now = store.log_end();
        if from > end_now {
            return Err(format!("replica asks from {from}, past the end {end_now}"));
        }
        let caught_up = match answered {
            _ if from >= end_now => Some(Instant::now()),
            Some((end, at)) if from >= end => Some(at),
            _ => None,
        };
        sh.replica_progress(replica, stream, from, caught_up);
        // It applied the last DATA frame before asking again: it holds
        // the offset table that frame (or an earlier one) carried.
        if let Some(v) = offsets.sent {
            sh.offsets_acks.held(replica, v);
        }
        if let Some(v) = txns.sent {
            sh.txns_acks.held(replica, v);
        }
        if let Some(v) = groups_applied.or(groups.sent) {
            sh.groups_acks.held(replica, v);
        }
        if let Some(v) = starts_applied.or(log_starts.sent) {
            sh.starts_acks.held(replica, v);
        }
        let kafka_groups = sh.broker.replicated_groups();
        // Long poll: answer as soon as something is appended, a table is
        // awaited that this replica does not have yet, or after 200 ms.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        let answer_now = |offsets: &Shipped, groups: &Shipped, starts: &Shipped| {
            store.log_end() > from
                || sh.role() != (Role::Master { epoch })
                || (sh.offsets_acks.awaited() && !offsets.settled(store.offsets().changes()))
                || (sh.starts_acks.awaited() && !starts.settled(store.log_starts_changes()))
                || (sh.txns_acks.awaited() && !txns.settled(sh.broker.kafka_txns().changes()))
                || (sh.groups_acks.awaited() && kafka_groups.is_some_and(|g| !groups.settled(g.changes())))
        };
        while !answer_now(&offsets, &groups, &log_starts) {
            let woken = sh.appended.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Whatever changed between the check and `enable` is seen now.
            if answer_now(&offsets, &groups, &log_starts) {
                break;
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                break;
            }
        }
        // A master deposed during the long poll answers nothing more.
        if sh.role() != (Role::Master { epoch }) {
            return Err("no longer master".into());
        }
        // The log's end as this answer is made: reaching it is being
        // caught up as of now.
        answered = Some((store.log_end(), Instant::now()));
        let entries = if store.log_end() > from {
            store
                .read_log(from, max)
                .map_err(|e| e.to_string())?
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let mut b = BytesMut::with_capacity(16 + entries.iter().map(|e| e.len() + 4).sum::<usize>());
        b.put_u64(sh.high_watermark());
        b.put_u32(epoch);
        b.put_u32(entries.len() as u32);
        for e in &entries {
            b.put_u32(e.len() as u32);
            b.put_slice(e);
        }
        // A commit waiting for its replication: the table goes now.
        if sh.offsets_acks.awaited() {
            offsets.due = Instant::now();
        }
        if sh.groups_acks.awaited() {
            groups.due = Instant::now();
        }
        if sh.starts_acks.awaited() {
            log_starts.due = Instant::now();
        }
        offsets.put(&mut b, store.offsets().changes(), 0, || Ok(store.offsets().snapshot()));
        let t = sh.broker.kafka_txns();
        let txn_changes = t.changes();
        txns.put(&mut b, txn_changes, 0, || t.snapshot().map_err(|e| e.to_string()));
        b.put_u64(txn_changes);
        match kafka_groups {
            Some(g) => {
                let version = g.changes();
                // Encoded off the runtime (once per version: every
                // replica's stream takes the same bytes).
                let snap = match groups.due_for(version) {
                    true => {
                        let g = Arc::clone(g);
                        Some(tokio::task::spawn_blocking(move || g.snapshot()).await)
                    }
                    false => None,
                };
                let (classic, consumer) = match snap {
                    Some(Ok((c, k))) => (Ok(c), k),
                    Some(Err(e)) => (Err(e.to_string()), Bytes::new()),
                    None => (Err("not due".into()), Bytes::new()),
                };
                // One budget for both parts: a version goes whole or not at
                // all (refused as too large, the replica keeps its copy).
                let shipped = groups.put(&mut b, version, consumer.len(), || classic);
                // Which version went, for the replica to say it applied it.
                b.put_u64(if shipped { version } else { 0 });
                // Its consumer groups, with it (an older replica stops
                // reading before them).
                let consumer = if shipped { consumer } else { Bytes::new() };
                b.put_u32(consumer.len() as u32);
                b.put_slice(&consumer);
            }
            None => {
                // No groups, no version, no consumer groups (whole, so
                // what follows is read where it is).
                b.put_u32(0);
                b.put_u64(0);
                b.put_u32(0);
            }
        }
        // Queue starts DeleteRecords raised: a record deleted on the master
        // stays deleted on the replica, and after a failover.
        let starts_changes = store.log_starts_changes();
        log_starts.put(&mut b, starts_changes, 0, || {
            serde_json::to_vec(&store.log_starts().0).map_err(|e| e.to_string())
        });
        // The version of the table this stream sent last, for the replica
        // to say when it has taken it whole.
        b.put_u64(log_starts.sent.unwrap_or(0));
        write_frame(s, DATA, &b).await?;
    }
}

/// One state table shipped whole with DATA frames when it changed: at most
/// every `min_interval`, and no more often than its size takes to send at 50 MB/s
/// (a large table does not crowd out the log); never one larger than
/// [`MAX_SNAPSHOT`] (counted, logged once per stream).
struct Shipped {
    table: &'static str,
    min_interval: Duration,
    sent: Option<u64>,
    due: Instant,
    refused: bool,
    /// The version last refused as too large: not taken again, and no
    /// frame is hurried for it (its waiters time out).
    refused_at: Option<u64>,
}

impl Shipped {
    fn new(table: &'static str, min_interval: Duration) -> Shipped {
        Shipped {
            table,
            min_interval,
            sent: None,
            due: Instant::now(),
            refused: false,
            refused_at: None,
        }
    }

    /// Whether the table as of `changes` went, or cannot go.
    fn settled(&self, changes: u64) -> bool {
        self.sent == Some(changes) || self.refused_at == Some(changes)
    }

    /// Whether the table as of `changes` goes with the next frame.
    fn due_for(&self, changes: u64) -> bool {
        !self.settled(changes) && Instant::now() >= self.due
    }

    /// Appends `u32 length | table` to `b` when due (length 0 otherwise);
    /// whether it went.
    /// `with`: bytes that go in the same frame with the table and count
    /// toward its size (the consumer groups with the classic ones).
    fn put<S: AsRef<[u8]>>(
        &mut self,
        b: &mut BytesMut,
        changes: u64,
        with: usize,
        snapshot: impl FnOnce() -> Res<S>,
    ) -> bool {
        if !self.due_for(changes) {
            b.put_u32(0);
            return false;
        }
        let snap = match snapshot() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(table = self.table, error = e, "cannot take the table to replicate");
                b.put_u32(0);
                return false;
            }
        };
        let snap = snap.as_ref();
        let size = snap.len() + with;
        self.due = Instant::now() + self.min_interval.max(Duration::from_nanos(size as u64 * 20));
        if size > MAX_SNAPSHOT {
            if !self.refused {
                tracing::error!(
                    table = self.table,
                    bytes = snap.len(),
                    max = MAX_SNAPSHOT,
                    "table too large to replicate; replicas keep their older copy"
                );
                self.refused = true;
            }
            metrics::counter!("rokka_replication_tables_refused_total", "table" => self.table).increment(1);
            self.refused_at = Some(changes);
            b.put_u32(0);
            return false;
        }
        b.put_u32(snap.len() as u32);
        b.put_slice(snap);
        metrics::counter!("rokka_replication_tables_shipped_total", "table" => self.table).increment(1);
        self.sent = Some(changes);
        true
    }
}

/// Follows the master while this node is a replica: connects, truncates
/// where told, fetches and appends, until the role changes or the stream
/// breaks (then again, after a short pause).
pub async fn follow(shared: Arc<Shared>, tls: Option<TlsConnector>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        if *stop.borrow() {
            return;
        }
        let target = match shared.role() {
            Role::Replica { master, epoch } => shared.node_addr(master).map(|a| (master, epoch, a)),
            _ => None,
        };
        if let Some((master, epoch, addr)) = target {
            let r = tokio::select! {
                r = follow_once(&shared, tls.as_ref(), master, epoch, &addr) => r,
                _ = stop.changed() => return,
            };
            if let Err(e) = r {
                tracing::info!(master, error = e, "replication from the master stopped");
                metrics::counter!("rokka_replication_reconnects_total").increment(1);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => return,
        }
    }
}

async fn follow_once(sh: &Shared, tls: Option<&TlsConnector>, master: u32, epoch: u32, addr: &str) -> Res<()> {
    let s = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .map_err(|_| format!("connect {addr}: timed out"))?
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    let Some(tls) = tls else {
        return follow_stream(sh, master, epoch, s).await;
    };
    // The master's certificate must name the host its address has.
    let name = ServerName::try_from(host_of(addr).to_string()).map_err(|e| format!("master address {addr}: {e}"))?;
    let s = handshake("replica", tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(name, s))).await?;
    follow_stream(sh, master, epoch, s).await
}

async fn follow_stream<S: AsyncRead + AsyncWrite + Unpin>(sh: &Shared, master: u32, epoch: u32, mut s: S) -> Res<()> {
    let store = &sh.store;
    let secret = sh
        .broker
        .cluster_secret()
        .ok_or_else(|| "this node has no cluster secret yet".to_string())?;
    let mut hello = Hello {
        cluster: sh.cfg.name.clone(),
        set: sh.cfg.broker_set.clone(),
        node_id: sh.cfg.node_id,
        epochs: store.epochs(),
        end: store.log_end(),
        segment_bytes: store.config().commitlog_segment_bytes,
        at: rokka_store::now_ms(),
        proof: String::new(),
    };
    hello.proof = secret.sign(&hello.content());
    let json = serde_json::to_vec(&hello).map_err(|e| e.to_string())?;
    write_frame(&mut s, HELLO, &json).await?;
    // (A WELCOME that restarts this log names every queue of the master.)
    let (kind, body) = read_frame_within(&mut s, MAX_WELCOME, Duration::from_secs(30))
        .await
        .map_err(|e| format!("WELCOME: {e}"))?;
    if kind == REFUSE {
        return Err(format!("refused: {}", String::from_utf8_lossy(&body)));
    }
    if kind != WELCOME {
        return Err(format!("expected WELCOME, got kind {kind}"));
    }
    let mut welcome: Welcome = serde_json::from_slice(&body).map_err(|e| format!("bad WELCOME: {e}"))?;
    if welcome.proof.is_empty() || !secret.verify(&welcome.content(&hello.proof), &welcome.proof) {
        metrics::counter!("rokka_replication_unauthenticated_total", "side" => "replica").increment(1);
        return Err(format!(
            "the WELCOME from {master}'s address is not signed with the cluster secret: not followed"
        ));
    }
    if welcome.epoch < epoch {
        return Err(format!(
            "master {master} is at epoch {}, the set at {epoch}",
            welcome.epoch
        ));
    }
    // A node elected meanwhile applies nothing of this stream (the store
    // refuses it too once the node began its own epoch).
    if sh.role() != (Role::Replica { master, epoch }) {
        return Ok(());
    }
    // Truncation and the epoch history write files (fsync): off the runtime.
    let epochs = Arc::new(welcome.epochs);
    let (st, to, ep) = (Arc::clone(store), welcome.truncate_to, Arc::clone(&epochs));
    let restart_at = welcome.restart_at;
    let continue_at = std::mem::take(&mut welcome.continue_at);
    let (truncated, restarted) = tokio::task::spawn_blocking(move || -> rokka_store::Result<(bool, bool)> {
        let cut = to < st.log_end();
        if cut {
            st.truncate_log(to)?;
        }
        // The master's log starts past this one's end: what lies between
        // is gone there; this log continues at its start.
        let restart = restart_at.filter(|s| *s >= st.log_end());
        if let Some(s) = restart {
            st.restart_log_at(s, &continue_at)?;
        }
        st.adopt_epochs(&ep)?;
        Ok((cut, restart.is_some()))
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("truncate to {to}: {e}"))?;
    if truncated || restarted {
        // Producers' states may name batches the cut removed: rebuilt from
        // the log as it now is.
        sh.broker.producers().clear();
    }
    if truncated {
        metrics::counter!("rokka_replication_truncations_total").increment(1);
    }
    if restarted {
        metrics::counter!("rokka_replication_log_restarts_total").increment(1);
    }
    tracing::info!(
        master,
        epoch = welcome.epoch,
        from = store.log_end(),
        "following the master"
    );
    // The master's transaction-state change count this node's copy is of.
    let mut applied_txn: Option<u64> = None;
    // The master's Kafka groups version this node loaded (0: none yet).
    let groups_applied = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // The master's queue starts this node has not reached yet (their
    // queues still to come, or ending below them).
    let mut starts_pending: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    // The master's version of the last queue-start table it sent, and the
    // version this node has taken whole (every start reached).
    let (mut starts_received, mut starts_applied) = (0u64, 0u64);
    loop {
        if sh.role() != (Role::Replica { master, epoch }) {
            return Ok(());
        }
        let mut f = BytesMut::with_capacity(24);
        f.put_u64(store.log_end());
        f.put_u32(welcome.epoch);
        f.put_u32(FETCH_BYTES);
        f.put_u64(groups_applied.load(std::sync::atomic::Ordering::Acquire));
        f.put_u64(starts_applied);
        write_frame(&mut s, FETCH, &f).await?;
        let (kind, mut body) = read_frame_within(&mut s, MAX_FRAME, Duration::from_secs(10))
            .await
            .map_err(|e| format!("DATA: {e}"))?;
        if kind != DATA || body.len() < 16 {
            return Err(format!("expected DATA, got kind {kind}"));
        }
        let hw = body.get_u64();
        let their_epoch = body.get_u32();
        if their_epoch != welcome.epoch {
            return Err(format!("epoch changed to {their_epoch} mid-stream"));
        }
        // An answer that arrives after this node was elected (or told to
        // follow another master) is not applied: not its entries, not its
        // tables (the offsets table would go back to the old master's).
        if sh.role() != (Role::Replica { master, epoch }) {
            return Ok(());
        }
        let n = body.get_u32() as usize;
        let mut entries = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            if body.remaining() < 4 {
                return Err("DATA truncated".into());
            }
            let len = body.get_u32() as usize;
            if body.remaining() < len {
                return Err("DATA truncated".into());
            }
            entries.push(body.split_to(len));
        }
        if body.remaining() >= 4 {
            let len = body.get_u32() as usize;
            if len > 0 && body.remaining() >= len && store.takes_replica_writes() {
                store
                    .offsets()
                    .replace_with(&body.split_to(len))
                    .map_err(|e| e.to_string())?;
            }
        }
        // The transaction state, applied after the entries it may name,
        // and the master's count of its changes.
        let txns = match body.remaining() >= 4 {
            true => {
                let len = body.get_u32() as usize;
                (len > 0 && body.remaining() >= len).then(|| body.split_to(len))
            }
            false => None,
        };
        let master_txn = (body.remaining() >= 8).then(|| body.get_u64());
        // The master's Kafka groups (last: a master that sends none is
        // older than this field).
        let groups = match body.remaining() >= 4 {
            true => {
                let len = body.get_u32() as usize;
                (len > 0 && body.remaining() >= len).then(|| body.split_to(len))
            }
            false => None,
        };
        // Which version they are (a master older than this field: 0).
        let groups_version = if body.remaining() >= 8 { body.get_u64() } else { 0 };
        // That version's consumer groups (none from an older master).
        let consumer_groups = match body.remaining() >= 4 {
            true => {
                let len = body.get_u32() as usize;
                (len > 0 && body.remaining() >= len).then(|| body.split_to(len))
            }
            false => None,
        };
        // The queue starts DeleteRecords raised (a master older than this
        // field sends none).
        let log_starts = match body.remaining() >= 4 {
            true => {
                let len = body.get_u32() as usize;
                (len > 0 && body.remaining() >= len).then(|| body.split_to(len))
            }
            false => None,
        };
        // Its version (a master older than this field sends none).
        let starts_version = (body.remaining() >= 8).then(|| body.get_u64());
        if let Some(t) = &log_starts {
            // The master's whole table: what is not reached yet is taken
            // again as entries come.
            match serde_json::from_slice(t) {
                Ok(table) => {
                    starts_pending = table;
                    starts_received = starts_version.unwrap_or(starts_received);
                }
                Err(e) => {
                    metrics::counter!("rokka_replication_tables_rejected_total", "table" => "log_starts").increment(1);
                    tracing::warn!(error = %e, "cannot read the master's queue starts");
                }
            }
        }
        if txns.is_some() {
            applied_txn = master_txn;
        }
        let starts_due = !starts_pending.is_empty() && (log_starts.is_some() || !entries.is_empty());
        if !entries.is_empty() || txns.is_some() || groups.is_some() || starts_due {
            let (st, ep, broker) = (Arc::clone(store), Arc::clone(&epochs), Arc::clone(&sh.broker));
            let applied = Arc::clone(&groups_applied);
            let pending = std::mem::take(&mut starts_pending);
            starts_pending = tokio::task::spawn_blocking(move || -> Result<_, String> {
                // Nothing of it once this node began an epoch of its own
                // (elected while this frame waited): not its entries (the
                // store refuses them too), not its tables.
                if !st.takes_replica_writes() {
                    return Ok(pending);
                }
                // Not once this node has taken over: it coordinates the
                // groups itself then.
                if let (Some(snap), Some(g), false) = (groups, broker.replicated_groups(), st.is_leader()) {
                    match g.load(&snap, consumer_groups.as_deref()) {
                        Ok(_) => applied.store(groups_version, std::sync::atomic::Ordering::Release),
                        Err(e) => {
                            // The log and offsets still replicate; the
                            // master is told this version is not held
                            // (its SyncGroups fail over to a rejoin), and a
                            // takeover has the members rejoin.
                            metrics::counter!("rokka_replication_tables_rejected_total", "table" => "kafka_groups")
                                .increment(1);
                            tracing::warn!(error = e, "cannot load the master's Kafka groups");
                        }
                    }
                }
                if !entries.is_empty() {
                    st.append_replicated(&entries).map_err(|e| format!("append: {e}"))?;
                    st.adopt_epochs(&ep).map_err(|e| format!("append: {e}"))?;
                    // Idempotent producers' last batches, kept as the
                    // master keeps them (a failover's retries stay single).
                    // (The Kafka decoder stops at a RocketMQ message's
                    // magic: those are not decoded for this.)
                    for data in &entries {
                        if let Ok(b) = rokka_store::record::kafka::decode(data) {
                            if let Ok(info) = rokka_store::record::kafka::BatchInfo::parse(&b.batch) {
                                broker
                                    .producers()
                                    .observe(b.topic_str(), b.queue_id, &info, b.queue_offset);
                            }
                        }
                    }
                }
                match txns {
                    Some(t) => broker
                        .replace_kafka_txns(&t)
                        .map_err(|e| format!("transaction state: {e}"))?,
                    None => broker.resolve_open_transactions(),
                }
                match starts_due {
                    true => st.adopt_log_starts(&pending).map_err(|e| format!("queue starts: {e}")),
                    false => Ok(pending),
                }
            })
            .await
            .map_err(|e| e.to_string())??;
        }
        if !store.log_starts_waiting(&starts_pending) {
            starts_applied = starts_received;
        }
        let end = store.log_end();
        // While this copy of the transaction state is older than the
        // master's, records just replicated may belong to a transaction it
        // does not know is open: readers here stay where they were.
        let stale = master_txn.is_some_and(|m| applied_txn.is_none_or(|a| a < m));
        let next = hw.min(end);
        let held = store.high_watermark().unwrap_or(0).min(next);
        store.set_high_watermark(Some(if stale { held } else { next }));
        sh.set_replica_lag(hw.saturating_sub(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rokka_broker::cluster_view::ClusterView;
    use rokka_broker::Broker;
    use rokka_store::{MessageInput, MessageStore, StoreConfig};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// Node 1, master of its set at epoch 1 with node 2 a live member,
    /// serving replicas on a loopback port; `mb` MiB of messages stored.
    struct Master {
        sh: Arc<Shared>,
        /// The cluster secret's stored form.
        secret: String,
        addr: std::net::SocketAddr,
        _stop: tokio::sync::watch::Sender<bool>,
        _dir: tempfile::TempDir,
    }

    async fn master(mb: usize) -> std::result::Result<Master, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let broker = Arc::new(Broker::new(Arc::clone(&store), Default::default())?);
        let cfg = crate::ClusterConfig {
            node_id: 1,
            ..Default::default()
        };
        let view = ClusterView {
            cluster: cfg.name.clone(),
            self_id: 1,
            set: cfg.broker_set.clone(),
            members: vec![1, 2],
            ..Default::default()
        };
        let secret = ClusterSecret::generate()?;
        broker.set_cluster_secret(ClusterSecret::from_stored(&secret).ok_or("secret")?);
        let sh = Shared::new(cfg, Arc::clone(&store), broker);
        store.begin_epoch(1)?;
        sh.set_role(Role::Master { epoch: 1 });
        sh.set_sss(vec![1]);
        sh.publish_view(view);
        let body = vec![7u8; 256 << 10];
        for _ in 0..mb * 4 {
            store.append_message(&MessageInput::new("T", 0, &body, b""))?;
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(serve(listener, Arc::clone(&sh), None, rx));
        Ok(Master {
            sh,
            secret,
            addr,
            _stop: stop,
            _dir: dir,
        })
    }

    /// Node 2's HELLO with an empty log (history `epochs`), signed under
    /// `secret` (stored form) as of `at`.
    fn hello(m: &Master, epochs: Vec<EpochStart>, secret: &str, at: i64) -> std::result::Result<Hello, String> {
        let mut h = Hello {
            cluster: m.sh.cfg.name.clone(),
            set: m.sh.cfg.broker_set.clone(),
            node_id: 2,
            epochs,
            end: 0,
            segment_bytes: m.sh.store.config().commitlog_segment_bytes,
            at,
            proof: String::new(),
        };
        h.proof = ClusterSecret::from_stored(secret).ok_or("secret")?.sign(&h.content());
        Ok(h)
    }

    /// Sends `h`: the answer's kind and body.
    async fn greet(m: &Master, h: &Hello) -> std::result::Result<(TcpStream, u8, Bytes), Box<dyn std::error::Error>> {
        let mut s = TcpStream::connect(m.addr).await?;
        write_frame(&mut s, HELLO, &serde_json::to_vec(h)?).await?;
        let (kind, body) = read_frame(&mut s, MAX_HELLO).await?;
        Ok((s, kind, body))
    }

    /// Connects as node 2 with an empty log: the stream, after WELCOME
    /// (signed under the cluster secret, over this HELLO's proof).
    async fn replica(m: &Master) -> std::result::Result<TcpStream, Box<dyn std::error::Error>> {
        let h = hello(m, Vec::new(), &m.secret, rokka_store::now_ms())?;
        let (s, kind, body) = greet(m, &h).await?;
        assert_eq!(kind, WELCOME, "{}", String::from_utf8_lossy(&body));
        let w: Welcome = serde_json::from_slice(&body)?;
        let secret = ClusterSecret::from_stored(&m.secret).ok_or("secret")?;
        assert!(secret.verify(&w.content(&h.proof), &w.proof));
        Ok(s)
    }

    /// Only a node that knows the cluster secret is served: a HELLO with
    /// no proof, one under another secret, one whose fields were changed
    /// after signing, or one a minute old, is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hello_without_the_cluster_secret_is_refused() -> TestResult {
        let m = master(0).await?;
        let now = rokka_store::now_ms();
        let mut unsigned = hello(&m, Vec::new(), &m.secret, now)?;
        unsigned.proof.clear();
        let other = hello(&m, Vec::new(), &ClusterSecret::generate()?, now)?;
        let mut altered = hello(&m, Vec::new(), &m.secret, now)?;
        altered.node_id = 3;
        let stale = hello(&m, Vec::new(), &m.secret, now - 120_000)?;
        for h in [unsigned, other, altered, stale] {
            let (_s, kind, body) = greet(&m, &h).await?;
            assert_eq!(kind, REFUSE, "{h:?}: {}", String::from_utf8_lossy(&body));
        }
        assert!(caught(&m).is_empty());
        replica(&m).await?;
        // A HELLO captured and sent again within its lifetime: refused.
        // (Another time than the HELLO just sent: a HELLO of the same
        // millisecond is the same HELLO.)
        let h = hello(&m, Vec::new(), &m.secret, rokka_store::now_ms() + 7)?;
        let (_first, kind, _) = greet(&m, &h).await?;
        assert_eq!(kind, WELCOME);
        let (_again, kind, body) = greet(&m, &h).await?;
        assert_eq!(kind, REFUSE);
        assert!(String::from_utf8_lossy(&body).contains("replayed"));
        Ok(())
    }

    /// A replica truncates only on its master's word: a WELCOME that is not
    /// signed with the cluster secret (a stranger answering at the master's
    /// address) is not followed, and the log stays whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_does_not_follow_an_unsigned_welcome() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        store.begin_epoch(1)?;
        store.append_message(&MessageInput::new("T", 0, b"kept", b""))?;
        let end = store.log_end();
        let broker = Arc::new(Broker::new(Arc::clone(&store), Default::default())?);
        broker.set_cluster_secret(ClusterSecret::from_stored(&ClusterSecret::generate()?).ok_or("secret")?);
        let cfg = crate::ClusterConfig {
            node_id: 2,
            ..Default::default()
        };
        let sh = Shared::new(cfg, Arc::clone(&store), broker);
        sh.set_role(Role::Replica { master: 1, epoch: 1 });
        let (mine, mut theirs) = tokio::io::duplex(1 << 16);
        let stranger = tokio::spawn(async move {
            let _ = read_frame(&mut theirs, MAX_HELLO).await;
            let w = Welcome {
                epoch: 1,
                epochs: Vec::new(),
                end: 0,
                truncate_to: 0,
                restart_at: None,
                continue_at: Default::default(),
                proof: ClusterSecret::from_stored(&ClusterSecret::generate()?)
                    .ok_or("secret")?
                    .sign(b"anything"),
            };
            write_frame(
                &mut theirs,
                WELCOME,
                &serde_json::to_vec(&w).map_err(|e| e.to_string())?,
            )
            .await?;
            // Held open: the replica ends the stream, not the stranger.
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok::<_, String>(())
        });
        let r = follow_stream(&sh, 1, 1, mine).await;
        assert!(r.as_ref().is_err_and(|e| e.contains("not signed")), "{r:?}");
        assert_eq!(store.log_end(), end);
        stranger.abort();
        Ok(())
    }

    /// One FETCH from `from`: where the next one starts (a BLANK filler
    /// moves it to its segment's end, as a replica's append does).
    async fn fetch(s: &mut TcpStream, from: u64) -> std::result::Result<u64, Box<dyn std::error::Error>> {
        let mut f = BytesMut::new();
        f.put_u64(from);
        f.put_u32(1);
        f.put_u32(FETCH_BYTES);
        write_frame(s, FETCH, &f).await?;
        let (kind, mut body) = read_frame(s, MAX_FRAME).await?;
        assert_eq!(kind, DATA);
        let _hw = body.get_u64();
        let _epoch = body.get_u32();
        let mut at = from;
        for _ in 0..body.get_u32() {
            let len = body.get_u32() as usize;
            let e = body.split_to(len);
            at = match e.len() == 8 && e[4..8] == rokka_store::record::BLANK_MAGIC.to_be_bytes() {
                true => {
                    let size = u64::from(u32::from_be_bytes([e[0], e[1], e[2], e[3]]));
                    at + size
                }
                false => at + e.len() as u64,
            };
        }
        Ok(at)
    }

    /// A replica far behind gets a frame's worth per fetch: holding all of
    /// the previous answer is not being caught up (it would join the sync
    /// state set, and could be elected, megabytes short). It is once it
    /// reaches the end the log had when a fetch was answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_far_behind_is_not_in_sync_until_it_reaches_the_log_end() -> TestResult {
        let m = master(12).await?;
        let end = m.sh.store.log_end();
        let mut s = replica(&m).await?;
        let mut at = fetch(&mut s, 0).await?;
        assert!(at > 0 && at < end / 2, "{at} of {end}");
        at = fetch(&mut s, at).await?;
        assert!(at < end, "{at} of {end}");
        assert!(caught(&m).is_empty(), "in sync at {at} of {end}");
        while at < end {
            at = fetch(&mut s, at).await?;
            if at < end {
                assert!(caught(&m).is_empty(), "in sync at {at} of {end}");
            }
        }
        // The fetch from the end says it holds everything.
        let _ = tokio::time::timeout(Duration::from_secs(2), fetch(&mut s, at)).await;
        assert_eq!(caught(&m), vec![2]);
        Ok(())
    }

    /// A replica that was caught up, went away while the master took
    /// more records, and came back within `replica_lag_max_ms`: it was
    /// caught up recently but lacks what was acknowledged meanwhile, so it
    /// does not join the sync state set (where it could be elected) until
    /// it holds the high watermark again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_back_after_a_short_absence_joins_only_once_it_holds_the_high_watermark() -> TestResult {
        let m = master(1).await?;
        let end = m.sh.store.log_end();
        let mut s = replica(&m).await?;
        let mut at = 0;
        while at < end {
            at = fetch(&mut s, at).await?;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), fetch(&mut s, at)).await;
        assert_eq!(caught(&m), vec![2]);
        drop(s);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let body = vec![7u8; 64 << 10];
        for _ in 0..8 {
            m.sh.store.append_message(&MessageInput::new("T", 0, &body, b""))?;
        }
        m.sh.update_high_watermark();
        let end = m.sh.store.log_end();
        assert_eq!(m.sh.high_watermark(), end);
        let mut s = replica(&m).await?;
        // Its first fetch on the new stream is from where it was.
        let next = fetch(&mut s, at).await?;
        assert!(next > at);
        assert!(caught(&m).is_empty(), "in sync at {at} of {end}");
        let mut at = next;
        while at < end {
            at = fetch(&mut s, at).await?;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), fetch(&mut s, at)).await;
        assert_eq!(caught(&m), vec![2]);
        Ok(())
    }

    /// A member of the named set reconnecting: with a log holding the high
    /// watermark it keeps its grace (from now, having had no entry, as
    /// after an election); with a shorter one (its tail or its disk lost)
    /// it is caught up no more, so the next step takes it out of the set
    /// where it could be elected lacking acknowledged records.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_back_with_a_shorter_log_loses_its_grace() -> TestResult {
        let m = master(1).await?;
        let end = m.sh.store.log_end();
        // Acknowledged up to the end while the master was alone.
        m.sh.update_high_watermark();
        m.sh.set_sss(vec![1, 2]);
        m.sh.set_named(vec![1, 2]);
        assert_eq!(m.sh.high_watermark(), end);
        m.sh.replica_connected(2, end);
        assert_eq!(caught(&m), vec![2]);
        m.sh.replica_connected(2, end / 2);
        assert!(
            caught(&m).is_empty(),
            "a member lacking acknowledged records kept its grace"
        );
        Ok(())
    }

    /// A replica that reconnects while its old stream is still open: the
    /// old stream's end does not mark the new one disconnected (the replica
    /// would stay out of the sync state set, and the high watermark would
    /// count it as holding nothing, for as long as the new stream runs).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_old_stream_ending_leaves_the_new_one_connected() -> TestResult {
        let m = master(1).await?;
        let end = m.sh.store.log_end();
        let mut old = replica(&m).await?;
        let mut at = 0;
        while at < end {
            at = fetch(&mut old, at).await?;
        }
        let mut new = replica(&m).await?;
        let mut at = 0;
        while at < end {
            at = fetch(&mut new, at).await?;
        }
        drop(old);
        // The old stream's task sees the close and ends.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), fetch(&mut new, at)).await;
        assert_eq!(caught(&m), vec![2]);
        // A newer stream that ends at once: the one still open reports
        // again with its next fetch (it takes over).
        drop(replica(&m).await?);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(caught(&m).is_empty());
        let _ = tokio::time::timeout(Duration::from_secs(2), fetch(&mut new, at)).await;
        assert_eq!(caught(&m), vec![2]);
        Ok(())
    }

    /// A replica whose history is past this master's epoch (etcd's state
    /// went back) is refused, and the master knows a newer epoch exists
    /// (it steps down; the set elects past it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_with_a_newer_epoch_is_refused_and_the_master_steps_down() -> TestResult {
        let m = master(0).await?;
        let epochs = vec![EpochStart { epoch: 1, start: 0 }, EpochStart { epoch: 5, start: 0 }];
        let h = hello(&m, epochs, &m.secret, rokka_store::now_ms())?;
        let (_s, kind, body) = greet(&m, &h).await?;
        assert_eq!(kind, REFUSE, "{}", String::from_utf8_lossy(&body));
        assert_eq!(m.sh.newer_epoch(), 5);
        Ok(())
    }

    /// Node 2 following `m` with an empty log of its own (the task runs
    /// until its role changes).
    async fn follower(
        m: &Master,
    ) -> std::result::Result<
        (Arc<Shared>, tokio::task::JoinHandle<Res<()>>, tempfile::TempDir),
        Box<dyn std::error::Error>,
    > {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(MessageStore::open(StoreConfig::for_tests(dir.path()))?);
        let broker = Arc::new(Broker::new(Arc::clone(&store), Default::default())?);
        broker.set_cluster_secret(ClusterSecret::from_stored(&m.secret).ok_or("secret")?);
        let cfg = crate::ClusterConfig {
            node_id: 2,
            ..Default::default()
        };
        let sh = Shared::new(cfg, store, broker);
        sh.set_role(Role::Replica { master: 1, epoch: 1 });
        let s = TcpStream::connect(m.addr).await?;
        let task = {
            let sh = Arc::clone(&sh);
            tokio::spawn(async move { follow_stream(&sh, 1, 1, s).await })
        };
        Ok((sh, task, dir))
    }

    /// The replicas the master counts as caught up.
    fn caught(m: &Master) -> Vec<u32> {
        m.sh.caught_up_replicas().into_iter().map(|c| c.id).collect()
    }

    /// Waits (20 s at most) until `done`.
    async fn until(done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// DeleteRecords on the master reaches the replica: the records stay
    /// deleted there (and so after a failover), also when the queue starts
    /// arrive before the replica has the entries they lie in.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queue_starts_from_delete_records_reach_the_replica() -> TestResult {
        let m = master(8).await?;
        let end = m.sh.store.max_offset("T", 0);
        assert!(end > 20, "{end}");
        // Before the replica holds any of it, past the first frame it is
        // sent: taken once the entries come.
        let first = end - 4;
        assert_eq!(m.sh.store.delete_records("T", 0, first)?, first);
        let version = m.sh.store.log_starts_changes();
        // What the master's DeleteRecords waits for: the replica says it
        // has taken a version only once every start in it is reached.
        let taken = |v: u64| {
            let held = m.sh.starts_acks.held.lock().unwrap_or_else(|p| p.into_inner());
            held.get(&2).is_some_and(|h| *h >= v)
        };
        let (sh, follower, _dir) = follower(&m).await?;
        let log_end = m.sh.store.log_end();
        until(|| taken(version)).await;
        assert!(taken(version), "the replica never said it took the starts");
        assert_eq!(sh.store.min_offset("T", 0), first, "acknowledged before it was taken");
        until(|| sh.store.log_end() >= log_end).await;
        assert_eq!(sh.store.log_end(), log_end);
        // And once it is caught up.
        assert_eq!(m.sh.store.delete_records("T", 0, end - 1)?, end - 1);
        let version = m.sh.store.log_starts_changes();
        until(|| taken(version)).await;
        assert!(taken(version), "the replica never said it took the starts");
        assert_eq!(sh.store.min_offset("T", 0), end - 1, "acknowledged before it was taken");
        assert_eq!(sh.store.log_starts().0.get("T/0"), Some(&(end - 1)));
        // A start of a queue the replica does not hold (its topic deleted
        // there; its own starts of it go with it) does not hold back the
        // others.
        assert!(sh.store.delete_topic("T")?);
        assert_eq!(sh.store.log_starts().0.get("T/0"), None);
        for _ in 0..10 {
            m.sh.store.append_message(&MessageInput::new("V", 0, b"v", b""))?;
        }
        assert_eq!(m.sh.store.delete_records("V", 0, 5)?, 5);
        let version = m.sh.store.log_starts_changes();
        until(|| taken(version)).await;
        assert!(taken(version), "held back by a queue the replica does not hold");
        assert_eq!(sh.store.min_offset("V", 0), 5);
        sh.set_role(Role::Unknown);
        let ended = tokio::time::timeout(Duration::from_secs(5), follower).await?;
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
        Ok(())
    }

    /// A replica whose log ends below the master's first retained segment
    /// (here: a new one, with an empty log) continues at that start and
    /// then holds what the master holds (it would otherwise ask for an
    /// offset the master no longer has, and reconnect forever).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_replica_below_the_masters_start_restarts_there_and_catches_up() -> TestResult {
        let m = master(12).await?;
        let mut segs: Vec<_> = std::fs::read_dir(m._dir.path().join("commitlog"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        segs.sort();
        let old = std::time::SystemTime::now() - Duration::from_secs(100 * 3600);
        for p in &segs[..segs.len() - 1] {
            std::fs::File::options().write(true).open(p)?.set_modified(old)?;
        }
        m.sh.store.checkpoint()?;
        assert!(m.sh.store.run_retention()? > 0);
        let start = m.sh.store.commitlog_offsets().0;
        assert!(start > 0);
        let (sh, follower, _dir) = follower(&m).await?;
        let store = Arc::clone(&sh.store);
        let end = m.sh.store.log_end();
        until(|| store.log_end() >= end).await;
        assert_eq!(store.log_end(), end);
        assert_eq!(store.commitlog_offsets().0, start);
        assert_eq!(store.min_offset("T", 0), m.sh.store.min_offset("T", 0));
        assert_eq!(store.max_offset("T", 0), m.sh.store.max_offset("T", 0));
        sh.set_role(Role::Unknown);
        let ended = tokio::time::timeout(Duration::from_secs(5), follower).await?;
        assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
        Ok(())
    }

    /// A frame's declared length is not memory taken up front: a peer
    /// that declares the largest frame and sends a few bytes ends the read
    /// with an error.
    #[tokio::test]
    async fn a_frame_shorter_than_declared_is_an_error() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            let _ = a.write_all(&(MAX_FRAME as u32).to_be_bytes()).await;
            let _ = a.write_all(&[DATA, 1, 2, 3]).await;
        });
        let r = read_frame(&mut b, MAX_FRAME).await;
        let _ = writer.await;
        assert!(r.as_ref().is_err_and(|e| e.contains("closed")), "{r:?}");
    }

    fn section(b: &BytesMut) -> Option<&[u8]> {
        let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        (len > 0).then(|| &b[4..4 + len])
    }

    #[test]
    fn a_table_goes_once_per_change_and_not_more_often_than_its_size_allows() {
        let mut t = Shipped::new("offsets", Duration::from_millis(200));
        let mut b = BytesMut::new();
        t.put(&mut b, 1, 0, || Ok(b"v1".to_vec()));
        assert_eq!(section(&b), Some(&b"v1"[..]));
        // Unchanged: nothing, even once due.
        t.due = Instant::now();
        let mut b = BytesMut::new();
        t.put(&mut b, 1, 0, || {
            Err::<Vec<u8>, String>("not taken when unchanged".into())
        });
        assert_eq!(section(&b), None);
        // Changed but not yet due: nothing; due: the new table.
        t.due = Instant::now() + Duration::from_secs(60);
        let mut b = BytesMut::new();
        t.put(&mut b, 2, 0, || Ok(b"v2".to_vec()));
        assert_eq!(section(&b), None);
        t.due = Instant::now();
        let mut b = BytesMut::new();
        let before = Instant::now();
        t.put(&mut b, 2, 0, || Ok(vec![7u8; 10 << 20]));
        assert_eq!(section(&b).map(<[u8]>::len), Some(10 << 20));
        // 10 MiB at 50 MB/s: not again for about 0.2 s from when it went
        // (measured from before the put: a loaded machine may take a while
        // to make and copy 10 MiB).
        assert!(t.due >= before + Duration::from_millis(200));
        // A table that cannot be taken is skipped, and tried again.
        t.due = Instant::now();
        let mut b = BytesMut::new();
        t.put(&mut b, 3, 0, || Err::<Vec<u8>, String>("disk".into()));
        assert_eq!(section(&b), None);
        let mut b = BytesMut::new();
        t.put(&mut b, 3, 0, || Ok(b"v3".to_vec()));
        assert_eq!(section(&b), Some(&b"v3"[..]));
        // What goes with it counts toward its size: past the budget together,
        // the version does not go (nor, then, what goes with it).
        t.due = Instant::now();
        let mut b = BytesMut::new();
        assert!(!t.put(&mut b, 4, MAX_SNAPSHOT, || Ok(b"v4".to_vec())));
        assert_eq!(section(&b), None);
    }
}
