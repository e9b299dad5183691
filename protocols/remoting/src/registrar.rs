//! The broker's side of the name server: REGISTER_BROKER every
//! `register_interval_ms` and as soon as the topic table changes,
//! UNREGISTER_BROKER at shutdown. With no `namesrv_addr` the broker registers
//! with the name server in its own process by a direct call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::codec::{decode, encode};
use crate::codes::{request as rq, response as rs};
use crate::command::RemotingCommand;
use crate::namesrv::NameServer;
use crate::processor::RocketMq;

/// A kept connection to one name server: it reads a broker whose
/// registering connection closed as gone, so the connection stays open
/// between registrations and is remade after an error.
pub struct NsConn {
    addr: String,
    stream: Option<TcpStream>,
    buf: BytesMut,
    /// Calls in a row that got no answer in time on the kept connection.
    unanswered: u32,
}

/// A kept connection is given up after this many unanswered calls in a row
/// (a peer gone silent without a reset — a blackholed route, a replaced
/// pod — would otherwise hold it until the kernel gives up, minutes).
const MAX_UNANSWERED: u32 = 2;

impl NsConn {
    pub fn new(addr: &str) -> NsConn {
        NsConn {
            addr: addr.to_string(),
            stream: None,
            buf: BytesMut::new(),
            unanswered: 0,
        }
    }

    /// Sends one request and waits for its response. A connection whose
    /// request could not be written whole (or that failed) is closed; one
    /// whose request went out whole is kept even when no answer comes in
    /// time — a late answer is skipped by its opaque, and closing it made
    /// a name server (Rokka's, Apache's onChannelDestroy) drop this
    /// broker's routes at once, for a name server only slow to answer.
    pub async fn call(&mut self, cmd: RemotingCommand, timeout: Duration) -> Result<RemotingCommand, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let addr = self.addr.clone();
        let late = || format!("{addr}: no answer within {timeout:?}");
        let mut s = match self.stream.take() {
            Some(s) => s,
            None => {
                let s = tokio::time::timeout_at(deadline, TcpStream::connect(&self.addr))
                    .await
                    .map_err(|_| late())?
                    .map_err(|e| format!("connect {}: {e}", self.addr))?;
                let _ = s.set_nodelay(true);
                self.buf.clear();
                // The count is the kept connection's: a new one starts
                // with none unanswered.
                self.unanswered = 0;
                s
            }
        };
        let mut out = BytesMut::new();
        encode(&cmd, &mut out);
        tokio::time::timeout_at(deadline, s.write_all(&out))
            .await
            .map_err(|_| late())?
            .map_err(|e| format!("write to {}: {e}", self.addr))?;
        match tokio::time::timeout_at(deadline, read_answer(&self.addr, &mut s, &mut self.buf, cmd.opaque)).await {
            Ok(Ok(r)) => {
                self.unanswered = 0;
                self.stream = Some(s);
                Ok(r)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                // Kept for a late answer, unless the peer has not answered
                // several calls in a row (then the next call reconnects).
                self.unanswered += 1;
                if self.unanswered < MAX_UNANSWERED {
                    self.stream = Some(s);
                } else {
                    self.unanswered = 0;
                }
                Err(late())
            }
        }
    }
}

/// Reads until the answer to `opaque` (earlier, late answers skipped).
/// Cancel-safe: what was read stays in `buf`.
async fn read_answer(
    addr: &str,
    s: &mut TcpStream,
    buf: &mut BytesMut,
    opaque: i32,
) -> Result<RemotingCommand, String> {
    loop {
        while let Some(r) = decode(buf, crate::DEFAULT_MAX_FRAME).map_err(|e| format!("{addr}: {e}"))? {
            if r.is_response() && r.opaque == opaque {
                return Ok(r);
            }
        }
        if s.read_buf(buf).await.map_err(|e| format!("read from {addr}: {e}"))? == 0 {
            return Err(format!("{addr} closed the connection"));
        }
    }
}

/// The `namesrv_addr` list.
pub fn namesrv_addrs(config: &str) -> Vec<String> {
    config
        .split(';')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect()
}

/// Keeps the broker registered until `shutdown`: with every configured
/// name server, and in cluster mode with every live node's.
pub async fn run(rmq: Arc<RocketMq>, embedded: Option<Arc<NameServer>>, mut shutdown: watch::Receiver<bool>) {
    let interval = Duration::from_millis(rmq.config().register_interval_ms.max(1000));
    let version = rmq.config().server_version;
    let mut registered: Option<(u64, Vec<String>)> = None;
    let mut due = Instant::now();
    let mut failing: HashMap<String, bool> = HashMap::new();
    let mut conns: HashMap<String, NsConn> = HashMap::new();
    let mut opaque = 0i32;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => break,
        }
        let v = rmq.topic_version();
        let addrs = rmq.namesrv_targets();
        let now = (v, addrs.clone());
        if Instant::now() < due && registered.as_ref() == Some(&now) {
            continue;
        }
        due = Instant::now() + interval;
        registered = Some(now);
        if let Some(ns) = &embedded {
            ns.register_local(true);
            continue;
        }
        conns.retain(|a, _| addrs.contains(a));
        let reg = rmq.registration();
        for addr in &addrs {
            let conn = conns.entry(addr.clone()).or_insert_with(|| NsConn::new(addr));
            opaque = opaque.wrapping_add(1);
            let mut cmd = crate::namesrv::wire::to_command(&reg, opaque, version);
            // In cluster mode, as the cluster's own call: a name server
            // with authorization on takes registrations from the cluster
            // (or a user with CLUSTER_ACTION) only.
            crate::auth::sign_as_cluster(rmq.broker(), &mut cmd);
            let res = conn.call(cmd, Duration::from_secs(3)).await;
            metrics::counter!("rokka_rocketmq_broker_registrations_total").increment(1);
            let was_failing = failing.get(addr).copied().unwrap_or(false);
            match res {
                Ok(r) if r.code == rs::SUCCESS => {
                    if was_failing {
                        tracing::info!(namesrv = addr, "registered with the name server again");
                    }
                    failing.insert(addr.clone(), false);
                }
                Ok(r) => {
                    if !was_failing {
                        tracing::warn!(namesrv = addr, code = r.code, remark = ?r.remark, "name server refused the registration");
                    }
                    failing.insert(addr.clone(), true);
                    due = due.min(Instant::now() + Duration::from_secs(2));
                }
                Err(e) => {
                    if !was_failing {
                        tracing::warn!(namesrv = addr, error = e, "cannot register with the name server");
                    }
                    failing.insert(addr.clone(), true);
                    due = due.min(Instant::now() + Duration::from_secs(2));
                }
            }
        }
    }
    let reg = rmq.registration();
    for (addr, conn) in conns.iter_mut() {
        let mut c = RemotingCommand::request(rq::UNREGISTER_BROKER, opaque.wrapping_add(1));
        c.version = version;
        c.ext_fields.set("brokerName", reg.broker_name.as_str());
        c.ext_fields.set("brokerAddr", reg.broker_addr.as_str());
        c.ext_fields.set("clusterName", reg.cluster.as_str());
        c.ext_fields.set("brokerId", reg.broker_id.to_string());
        crate::auth::sign_as_cluster(rmq.broker(), &mut c);
        if let Err(e) = conn.call(c, Duration::from_secs(2)).await {
            tracing::warn!(namesrv = addr, error = e, "UNREGISTER_BROKER failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer whose first connection reads and never answers, and whose
    /// later ones answer every request; the connections it accepted.
    async fn peer() -> std::io::Result<(String, Arc<std::sync::atomic::AtomicUsize>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let first = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
                tokio::spawn(async move {
                    let mut buf = BytesMut::new();
                    while s.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {
                        while let Ok(Some(req)) = decode(&mut buf, crate::DEFAULT_MAX_FRAME) {
                            if !first {
                                let mut out = BytesMut::new();
                                encode(&req.response(rs::SUCCESS, 0), &mut out);
                                if s.write_all(&out).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        Ok((addr, accepted))
    }

    #[tokio::test]
    async fn a_call_dropped_midway_leaves_no_connection_behind() -> Result<(), Box<dyn std::error::Error>> {
        let (addr, accepted) = peer().await?;
        let mut conn = NsConn::new(&addr);
        // The caller gives up (drops the call) while it waits for an answer.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(200),
            conn.call(RemotingCommand::request(rq::HEART_BEAT, 1), Duration::from_secs(60)),
        )
        .await;
        assert!(gave_up.is_err(), "the first connection never answers");
        // The next call does not reuse that connection (its answer would
        // never come): a new one answers at once.
        let answer = conn
            .call(RemotingCommand::request(rq::HEART_BEAT, 2), Duration::from_secs(5))
            .await?;
        assert_eq!((answer.opaque, answer.code), (2, rs::SUCCESS));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
        Ok(())
    }

    /// A request written whole but not answered in time keeps its
    /// connection once (closing it made the name server drop this broker's
    /// routes at once): the next call goes on the same one. A second call
    /// unanswered in a row gives it up, and the next call reconnects (to a
    /// peer that answers).
    #[tokio::test]
    async fn an_unanswered_call_keeps_its_connection_once() -> Result<(), Box<dyn std::error::Error>> {
        let (addr, accepted) = peer().await?;
        let mut conn = NsConn::new(&addr);
        let late = conn
            .call(RemotingCommand::request(rq::HEART_BEAT, 1), Duration::from_millis(200))
            .await;
        assert!(late.is_err(), "the first connection never answers");
        assert!(conn.stream.is_some(), "kept");
        let late = conn
            .call(RemotingCommand::request(rq::HEART_BEAT, 2), Duration::from_millis(200))
            .await;
        assert!(late.is_err());
        assert!(conn.stream.is_none(), "given up after two unanswered calls");
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one connection for both"
        );
        let answer = conn
            .call(RemotingCommand::request(rq::HEART_BEAT, 3), Duration::from_secs(5))
            .await?;
        assert_eq!((answer.opaque, answer.code), (3, rs::SUCCESS));
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
        Ok(())
    }

    /// The unanswered count is the kept connection's: after a connection
    /// is dropped (a reset, a read error), a new one's first late answer
    /// keeps it.
    #[tokio::test]
    async fn a_new_connection_starts_with_nothing_unanswered() -> Result<(), Box<dyn std::error::Error>> {
        let (addr, _accepted) = peer().await?;
        let mut conn = NsConn::new(&addr);
        let late = conn
            .call(RemotingCommand::request(rq::HEART_BEAT, 1), Duration::from_millis(200))
            .await;
        assert!(late.is_err() && conn.stream.is_some(), "kept once");
        // Dropped, as a read error drops it; the next peer is slow too
        // (its backlog takes the connection, nothing ever answers).
        conn.stream = None;
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        conn.addr = silent.local_addr()?.to_string();
        let late = conn
            .call(RemotingCommand::request(rq::HEART_BEAT, 2), Duration::from_millis(200))
            .await;
        assert!(late.is_err());
        assert!(conn.stream.is_some(), "a new connection's first late answer keeps it");
        Ok(())
    }
}
