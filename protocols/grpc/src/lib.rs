//! The RocketMQ 5 gRPC frontend: `apache.rocketmq.v2.MessagingService`
//! (what Apache's proxy serves on port 8081) over the same store, topics,
//! groups and offsets as the Kafka and remoting listeners. Producers send
//! through it; consumers consume by pop (docs/rocketmq5.md).

pub mod auth;
pub mod budget;
pub mod config;
pub mod message;
pub mod service;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("apache.rocketmq.v2");
}

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tonic::transport::server::Connected;

pub use config::GrpcConfig;
pub use service::{Messaging, Service};

/// One accepted connection (TLS or plain) holding its slot of
/// `grpc.max_connections` (and of its address's
/// `grpc.max_connections_per_ip`) until it closes.
pub struct Conn {
    io: Box<dyn Io>,
    local: SocketAddr,
    peer: SocketAddr,
    principal: Option<Arc<str>>,
    /// Until the client's HTTP/2 connection preface (24 bytes) has
    /// arrived: when the connection is closed if it has not
    /// (`grpc.preface_timeout_ms`; a byte and then silence holds no slot).
    preface_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Bytes read so far while the preface deadline runs.
    preface_read: usize,
    _slot: Slot,
    _limits: rokka_broker::limits::ConnSlot,
}

/// What a call knows of its connection: its addresses, and who the client
/// certificate names (`User:<subject DN>`) when it presented one.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub principal: Option<Arc<str>>,
}

/// The caller's address.
pub fn peer<T>(req: &tonic::Request<T>) -> Option<SocketAddr> {
    req.extensions().get::<ConnInfo>().map(|c| c.peer)
}

/// Who the caller's client certificate names, if it presented one.
pub fn certificate_principal<T>(req: &tonic::Request<T>) -> Option<&str> {
    req.extensions().get::<ConnInfo>().and_then(|c| c.principal.as_deref())
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A connection's place in `rokka_rocketmq5_connections` (its slot in the
/// listener's limits is its `ConnSlot`).
struct Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        metrics::gauge!("rokka_rocketmq5_connections").decrement(1.0);
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            local: self.local,
            peer: self.peer,
            principal: self.principal.clone(),
        }
    }
}

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what every HTTP/2 client sends first.
const H2_PREFACE_LEN: usize = 24;

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.preface_deadline.is_some() {
            match &r {
                Poll::Ready(Ok(())) => {
                    self.preface_read += buf.filled().len() - before;
                    if self.preface_read >= H2_PREFACE_LEN {
                        self.preface_deadline = None;
                    }
                }
                Poll::Pending => {
                    if let Some(d) = self.preface_deadline.as_mut() {
                        if d.as_mut().poll(cx).is_ready() {
                            metrics::counter!("rokka_connections_idle_closed_total", "listener" => "grpc").increment(1);
                            tracing::debug!(peer = %self.peer, "gRPC connection sent no HTTP/2 preface within grpc.preface_timeout_ms: closing");
                            return Poll::Ready(Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "no HTTP/2 preface within grpc.preface_timeout_ms",
                            )));
                        }
                    }
                }
                _ => {}
            }
        }
        r
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// TLS on the gRPC listener: every connection must handshake first.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub handshake_timeout: Duration,
}

/// How long open gRPC connections (streams) may take to finish once the
/// listener stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves the MessagingService on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    messaging: Arc<Messaging>,
    config: GrpcConfig,
    tls: Option<Tls>,
    mut stop: watch::Receiver<bool>,
) {
    let (tx, rx) = mpsc::channel::<io::Result<Conn>>(64);
    let local = listener.local_addr().unwrap_or(config.listen);
    let limits = rokka_broker::limits::ConnLimits::new(
        "grpc",
        config.max_connections.max(1) as usize,
        config.max_connections_per_ip as usize,
    );
    let preface = Duration::from_millis(config.preface_timeout_ms.max(1));
    let mut accept_stop = stop.clone();
    let acceptor = tokio::spawn(async move {
        let mut accept_errors = rokka_broker::limits::AcceptErrors::new("grpc");
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = accept_stop.changed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => {
                    accept_errors.accepted();
                    a
                }
                Err(e) => {
                    // EMFILE and the like: counted, and a pause so the
                    // loop does not spin while descriptors are short.
                    metrics::counter!("rokka_rocketmq5_accept_errors_total").increment(1);
                    accept_errors.failed(&e);
                    tokio::time::sleep(rokka_broker::limits::AcceptErrors::PAUSE).await;
                    continue;
                }
            };
            let admitted = match limits.admit(peer.ip()) {
                Ok(a) => a,
                Err(why) => {
                    metrics::counter!("rokka_rocketmq5_connections_refused_total").increment(1);
                    tracing::debug!(%peer, reason = why.as_str(), "gRPC connection refused");
                    drop(tcp);
                    continue;
                }
            };
            metrics::gauge!("rokka_rocketmq5_connections").increment(1.0);
            let slot = Slot;
            let _ = tcp.set_nodelay(true);
            let tx = tx.clone();
            match &tls {
                None => {
                    let conn = Conn {
                        io: Box::new(tcp),
                        local,
                        peer,
                        principal: None,
                        preface_deadline: Some(Box::pin(tokio::time::sleep(preface))),
                        preface_read: 0,
                        _slot: slot,
                        _limits: admitted,
                    };
                    if tx.send(Ok(conn)).await.is_err() {
                        return;
                    }
                }
                Some(t) => {
                    let t = t.clone();
                    tokio::spawn(async move {
                        match tokio::time::timeout(t.handshake_timeout, t.acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => {
                                metrics::counter!("rokka_rocketmq5_tls_handshakes_total", "result" => "ok")
                                    .increment(1);
                                let principal = rokka_broker::tls::peer_principal(s.get_ref().1).map(Arc::from);
                                let conn = Conn {
                                    io: Box::new(s),
                                    local,
                                    peer,
                                    principal,
                                    preface_deadline: Some(Box::pin(tokio::time::sleep(preface))),
                                    preface_read: 0,
                                    _slot: slot,
                                    _limits: admitted,
                                };
                                let _ = tx.send(Ok(conn)).await;
                            }
                            Ok(Err(e)) => {
                                metrics::counter!("rokka_rocketmq5_tls_handshakes_total", "result" => "failed")
                                    .increment(1);
                                tracing::debug!(%peer, error = %e, "gRPC TLS handshake failed");
                            }
                            Err(_) => {
                                metrics::counter!("rokka_rocketmq5_tls_handshakes_total", "result" => "timeout")
                                    .increment(1);
                            }
                        }
                    });
                }
            }
        }
    });
    // The pop state goes to disk every pop_state_flush_ms while it changes.
    let flusher = {
        let m = Arc::clone(&messaging);
        let every = Duration::from_millis(config.pop_state_flush_ms.max(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let m = Arc::clone(&m);
                let _ = tokio::task::spawn_blocking(move || m.persist_pops()).await;
            }
        })
    };
    // Push consumers' auto-renewed messages are looked at every 5 s (or a
    // quarter of a renewal, if shorter) while their clients live (Apache's
    // proxy: renewSchedulePeriodMillis).
    let renewer = {
        let m = Arc::clone(&messaging);
        let every = Duration::from_millis((config.auto_renew_invisible_ms.max(1000) / 4).min(5000));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let m = Arc::clone(&m);
                let _ = tokio::task::spawn_blocking(move || m.renew_due(rokka_store::now_ms(), None)).await;
            }
        })
    };
    let svc = pb::messaging_service_server::MessagingServiceServer::new(Service(Arc::clone(&messaging)))
        .max_decoding_message_size(config.max_request_bytes.max(1024) as usize);
    let svc = budget::Budgeted::new(
        svc,
        rokka_broker::limits::ByteBudget::new("grpc", config.max_inflight_request_bytes),
        Duration::from_millis(config.request_read_timeout_ms.max(1)),
    );
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    // After the stop, connections get SHUTDOWN_GRACE to finish: tonic's
    // graceful shutdown waits for every connection without a limit, and a
    // client's Telemetry stream stays open as long as it talks (SIGTERM
    // hung until the stream went idle, grpc.idle_timeout_ms, or for ever).
    let mut grace = stop.clone();
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(config.max_concurrent_streams.max(1))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .http2_max_pending_accept_reset_streams(Some(64))
        .tcp_nodelay(true)
        .add_service(svc)
        .serve_with_incoming_shutdown(incoming, {
            let m = Arc::clone(&messaging);
            async move {
                let _ = stop.changed().await;
                m.stop();
            }
        });
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => Some(r),
        _ = async {
            let _ = grace.changed().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => None,
    };
    match result {
        Some(Err(e)) => tracing::error!(error = %e, "gRPC listener stopped"),
        Some(Ok(())) => {}
        // (Their tasks are tonic's own: they end with the runtime; a call
        // still running meets a closed store, which refuses it.)
        None => tracing::info!(
            grace_ms = SHUTDOWN_GRACE.as_millis() as u64,
            "gRPC connections still open at the stop's grace: the listener stops without waiting for them"
        ),
    }
    acceptor.abort();
    flusher.abort();
    renewer.abort();
    // Acks up to the stop are kept: a restart delivers none of them again.
    let _ = tokio::task::spawn_blocking(move || messaging.persist_pops()).await;
}
