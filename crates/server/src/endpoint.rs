//! The Prometheus `/metrics` endpoint on a listener rokka binds itself (so
//! `metrics.listen` may name port 0), and the ports file that reports every
//! address rokka bound.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use rokka_broker::scrape::Collectors;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The connection budget of one of rokka's HTTP servers (`server` names it
/// in the metrics: "metrics", "console"): at most `max` connections served
/// at once, each until its deadline (`timeout` after it was accepted, a TLS
/// handshake included); beyond the budget, new connections wait in the
/// listener's accept queue.
pub struct ConnBudget {
    server: &'static str,
    permits: std::sync::Arc<Semaphore>,
    timeout: Duration,
}

/// A place in the budget for the next connection accepted.
pub struct ConnSlot {
    _permit: OwnedSemaphorePermit,
}

/// An accepted connection holding its place in the budget, counted in
/// `rokka_http_connections` from its accept (a TLS handshake included)
/// until it is dropped, however its task ends.
pub struct Accepted {
    _slot: ConnSlot,
    _open: OpenConn,
}

/// At most this long a request still being served at its connection's
/// deadline may take to finish before the connection is cut (and at most
/// the connection's timeout itself).
const GRACE: Duration = Duration::from_secs(10);

/// `rokka_http_connections` of one server, raised while it lives (lowered
/// however the connection's task ends).
struct OpenConn(metrics::Gauge);

impl OpenConn {
    fn new(server: &'static str) -> OpenConn {
        let g = metrics::gauge!("rokka_http_connections", "server" => server);
        g.increment(1.0);
        OpenConn(g)
    }
}

impl Drop for OpenConn {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

impl ConnBudget {
    /// `max` is at least 1 (the config refuses 0).
    pub fn new(server: &'static str, max: u32, timeout: Duration) -> ConnBudget {
        ConnBudget {
            server,
            permits: std::sync::Arc::new(Semaphore::new(max.max(1) as usize)),
            timeout,
        }
    }

    /// A place for the next connection, waiting while the budget is full
    /// (each time it is found full counted once in
    /// `rokka_http_connection_budget_waits_total`).
    pub async fn acquire(&self) -> ConnSlot {
        let permit = match std::sync::Arc::clone(&self.permits).try_acquire_owned() {
            Ok(p) => p,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                metrics::counter!("rokka_http_connection_budget_waits_total", "server" => self.server).increment(1);
                tracing::debug!(
                    server = self.server,
                    "HTTP connection budget full: new connections wait"
                );
                match std::sync::Arc::clone(&self.permits).acquire_owned().await {
                    Ok(p) => p,
                    // The semaphore is never closed; should it be, wait
                    // for shutdown instead of serving past the budget.
                    Err(_) => std::future::pending().await,
                }
            }
        };
        ConnSlot { _permit: permit }
    }

    /// A connection accepted now in `slot`, and its deadline.
    pub fn accepted(&self, slot: ConnSlot) -> (Accepted, tokio::time::Instant) {
        let conn = Accepted {
            _slot: slot,
            _open: OpenConn::new(self.server),
        };
        (conn, tokio::time::Instant::now() + self.timeout)
    }

    /// Serves HTTP/1 on `io` until the client closes or `deadline`. At the
    /// deadline an idle (keep-alive) connection is closed at once and a
    /// request being served may finish within [`GRACE`] (or the timeout,
    /// if shorter); one that does not
    /// (a client sending its request slowly, or not reading the answer) is
    /// cut and counted in `rokka_http_connections_timed_out_total`.
    pub async fn serve_http<I, S>(&self, conn: Accepted, deadline: tokio::time::Instant, io: I, service: S)
    where
        S: hyper::service::HttpService<Incoming>,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        S::ResBody: 'static,
        <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        I: hyper::rt::Read + hyper::rt::Write + Unpin,
    {
        let http = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
        tokio::pin!(http);
        let cut = tokio::select! {
            _ = http.as_mut() => false,
            _ = tokio::time::sleep_until(deadline) => {
                http.as_mut().graceful_shutdown();
                tokio::time::timeout(GRACE.min(self.timeout), http.as_mut()).await.is_err()
            }
        };
        if cut {
            self.timed_out();
        }
        drop(conn);
    }

    /// Counts a connection cut at its deadline.
    pub fn timed_out(&self) {
        metrics::counter!("rokka_http_connections_timed_out_total", "server" => self.server).increment(1);
        tracing::debug!(server = self.server, "HTTP connection cut at its deadline");
    }
}

/// Serves `GET /metrics` until `shutdown`, and runs the recorder's upkeep
/// (histogram buckets are drained there) every 5 s.
/// With `tls`, every scrape connection is TLS (HTTPS; with a client CA in
/// the acceptor, the scraper must present a certificate it signed).
pub async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    handle: PrometheusHandle,
    collectors: Collectors,
    budget: std::sync::Arc<ConnBudget>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut upkeep = tokio::time::interval(Duration::from_secs(5));
    let mut accept_errors = rokka_broker::limits::AcceptErrors::new("metrics");
    loop {
        // The recorder's upkeep runs while the budget is full too.
        let slot = {
            let next = budget.acquire();
            tokio::pin!(next);
            loop {
                tokio::select! {
                    s = &mut next => break s,
                    _ = upkeep.tick() => handle.run_upkeep(),
                    _ = shutdown.changed() => return,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    accept_errors.accepted();
                    a
                }
                Err(e) => {
                    accept_errors.failed(&e);
                    tokio::time::sleep(rokka_broker::limits::AcceptErrors::PAUSE).await;
                    continue;
                }
            },
            _ = upkeep.tick() => {
                handle.run_upkeep();
                continue;
            }
            _ = shutdown.changed() => return,
        };
        let h = handle.clone();
        let c = collectors.clone();
        let tls = tls.clone();
        let budget = std::sync::Arc::clone(&budget);
        tokio::spawn(async move {
            let (conn, deadline) = budget.accepted(slot);
            let service = hyper::service::service_fn(move |req| answer(req, h.clone(), c.clone()));
            match tls {
                None => budget.serve_http(conn, deadline, TokioIo::new(stream), service).await,
                // One deadline for the handshake and the scrape.
                Some(tls) => match tokio::time::timeout_at(deadline, tls.accept(stream)).await {
                    Ok(Ok(s)) => {
                        metrics::counter!("rokka_metrics_tls_handshakes_total", "result" => "ok").increment(1);
                        budget.serve_http(conn, deadline, TokioIo::new(s), service).await
                    }
                    Ok(Err(e)) => {
                        metrics::counter!("rokka_metrics_tls_handshakes_total", "result" => "failed").increment(1);
                        tracing::debug!(%peer, error = %e, "metrics endpoint: TLS handshake failed");
                    }
                    Err(_) => {
                        metrics::counter!("rokka_metrics_tls_handshakes_total", "result" => "failed").increment(1);
                        budget.timed_out();
                    }
                },
            }
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    handle: PrometheusHandle,
    collectors: Collectors,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut text = handle.render();
            collectors.render(&mut text);
            (StatusCode::OK, text)
        }
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n".to_string(),
        ),
        _ => (StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n".to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if status == StatusCode::OK {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
    }
    Ok(resp)
}

/// Writes `{"kafka": "127.0.0.1:9092", ...}` to `path` atomically (a
/// temporary file renamed over it), so a reader never sees half of it.
pub fn write_ports_file(path: &Path, bound: &BTreeMap<&'static str, SocketAddr>) -> std::io::Result<()> {
    let map: BTreeMap<&str, String> = bound.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let text = serde_json::to_string_pretty(&map).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    const GET: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: rokka\r\nConnection: close\r\n\r\n";

    async fn endpoint(max: u32, timeout: Duration) -> Result<(SocketAddr, watch::Sender<bool>), std::io::Error> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        let (stop, stop_rx) = watch::channel(false);
        let budget = std::sync::Arc::new(ConnBudget::new("metrics", max, timeout));
        tokio::spawn(serve(listener, None, handle, Collectors::default(), budget, stop_rx));
        Ok((addr, stop))
    }

    /// Reads until the peer closes (at most 10 s).
    async fn answer_of(mut s: TcpStream) -> Result<String, Box<dyn std::error::Error>> {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await??;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// A whole scrape on a new connection: the answer's text.
    async fn scrape(addr: SocketAddr) -> Result<String, Box<dyn std::error::Error>> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(GET).await?;
        answer_of(s).await
    }

    #[tokio::test]
    async fn a_scrape_waits_while_the_budget_is_held_and_is_served_after() -> Result<(), Box<dyn std::error::Error>> {
        let (addr, _stop) = endpoint(1, Duration::from_secs(60)).await?;
        // A client that connects and sends nothing holds the one place.
        let idle = TcpStream::connect(addr).await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut scrape = TcpStream::connect(addr).await?;
        scrape.write_all(GET).await?;
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(500), scrape.read(&mut byte)).await;
        assert!(early.is_err(), "answered beyond the budget of one connection");
        drop(idle);
        let text = answer_of(scrape).await?;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn a_kept_alive_connection_is_closed_at_its_deadline_and_a_slow_request_cut_after_its_grace(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (addr, _stop) = endpoint(2, Duration::from_millis(300)).await?;
        // Served, then kept alive and idle: closed at the deadline.
        let mut kept = TcpStream::connect(addr).await?;
        kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: rokka\r\n\r\n").await?;
        let mut head = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(10), kept.read_exact(&mut head)).await??;
        assert_eq!(&head, b"HTTP/1.1 200");
        // A request whose headers never end: cut after the deadline and
        // its grace (here the 300 ms timeout again).
        let mut slow = TcpStream::connect(addr).await?;
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: ro").await?;
        let t = std::time::Instant::now();
        answer_of(kept).await?;
        answer_of(slow).await?;
        assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
        // Both places are free again.
        let (a, b) = tokio::join!(scrape(addr), scrape(addr));
        assert!(a?.starts_with("HTTP/1.1 200") && b?.starts_with("HTTP/1.1 200"));
        Ok(())
    }

    #[tokio::test]
    async fn a_connection_is_closed_at_its_deadline_and_frees_its_place() -> Result<(), Box<dyn std::error::Error>> {
        let (addr, _stop) = endpoint(1, Duration::from_millis(300)).await?;
        let idle = TcpStream::connect(addr).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut scrape = TcpStream::connect(addr).await?;
        scrape.write_all(GET).await?;
        // The idle one is closed by the endpoint (EOF, nothing sent)...
        assert_eq!(answer_of(idle).await?, "");
        // ...and the waiting scrape is then answered.
        let text = answer_of(scrape).await?;
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        Ok(())
    }
}
